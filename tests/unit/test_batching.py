"""The server's batching of concurrent proposals: chunks keep request order, hold at
most ``MAX_BATCH_ENTRIES`` requests, and stay below PySyncObj's 64 KiB single-entry
threshold (above it PySyncObj uses its ``transmission`` path, which our follower-side
correction of ``append_entries`` does not cover)."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

from raftlease.server.proposer import MAX_BATCH_BYTES, MAX_BATCH_ENTRIES, _text_bytes, split_batches

pytestmark = pytest.mark.timeout(60)

#: PySyncObj's ``appendEntriesBatchSizeBytes`` default, which we do not change.
TRANSMISSION_THRESHOLD = 2**16


def test_chunks_keep_order_and_respect_both_limits() -> None:
    items = list(range(200))
    chunks = split_batches(items, lambda i: 1)
    assert [len(c) for c in chunks] == [64, 64, 64, 8]
    assert [i for c in chunks for i in c] == items
    sized = split_batches(items[:10], lambda i: 400, max_bytes=1000)
    assert [len(c) for c in sized] == [2, 2, 2, 2, 2]
    huge = split_batches([1, 2, 3], lambda i: 5000 if i == 2 else 10, max_bytes=1000)
    assert huge == [[1], [2], [3]]  # an oversized item goes alone, order kept
    assert split_batches([], lambda i: 1) == []


def random_request(rng: random.Random, seq: int) -> dict[str, Any]:
    def text(limit: int) -> str:
        alphabet = "abc" if rng.random() < 0.5 else "aé漢𝄞"
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, limit)))

    entry: dict[str, Any] = {
        "op": "acquire",
        "key": text(512),
        "owner": text(256),
        "ttl": rng.randrange(500, 3_600_000),
        "lid": "f" * 32,
        "cid": "c" * 32,
        "seq": seq,
        "ack": seq,
        "wait": rng.randrange(0, 3_600_000),
        "priority": rng.randrange(-1000, 1000),
        "capacity": rng.randrange(1, 1_000_000),
        "units": 1,
    }
    if rng.random() < 0.7:
        entry["value"] = text(4096)
    return entry


@pytest.mark.parametrize("seed", range(5))
def test_every_batch_entry_stays_below_the_transmission_threshold(seed: int) -> None:
    rng = random.Random(seed)
    pending = [random_request(rng, i + 1) for i in range(400)]
    chunks = split_batches(pending, _text_bytes)
    assert [e for c in chunks for e in c] == pending
    assert len(chunks) > 400 / MAX_BATCH_ENTRIES  # the byte limit did split them
    for chunk in chunks:
        assert sum(_text_bytes(e) for e in chunk) <= MAX_BATCH_BYTES or len(chunk) == 1
        body = {"op": "batch", "term": 2**40, "now": 2**50, "entries": chunk}
        size = len(msgpack.packb(body, use_bin_type=True))
        # PySyncObj adds a few bytes (its method id) around our command bytes.
        assert size + 64 < TRANSMISSION_THRESHOLD, size
        for entry in chunk:
            assert len(msgpack.packb(entry, use_bin_type=True)) <= _text_bytes(entry)
