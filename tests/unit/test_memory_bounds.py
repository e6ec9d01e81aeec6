"""What a node holds in memory stays bounded under steady load (issue 15, chaos
finding 5): the watch history is capped by an estimate of its bytes as well as by its
length, so a node's RSS levels off instead of growing with every change until 100,000
of them are held (~50 MB of short keys; over 1 GB of 4 KiB keys, owners and values).

The unit half of these tests (no process); the integration half is
tests/integration/test_memory_bounds.py."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Any

import pytest

from raftlease.protocol import FrameDecoder, Request
from raftlease.server.watch import (
    EVENT_OVERHEAD,
    WATCH_HISTORY,
    WATCH_HISTORY_BYTES,
    WatchHub,
    event_bytes,
)


def _event(revision: int, owner: str = "worker-1", value: str | None = None) -> dict[str, Any]:
    """A store event as the state machine hands it to the hub (fresh strings each
    time, as a decoded log entry has them)."""
    return {
        "type": "grant",
        "key": f"jobs/{revision % 97}",
        "owner": f"{owner}-{revision}",
        "token": 10**9 + revision,
        "revision": revision,
        "value": value,
        "units": 1,
        "lid": f"{revision:032x}",  # private: never kept in the history
    }


def _record(hub: WatchHub, first: int, count: int, **fields: Any) -> None:
    loop = asyncio.new_event_loop()  # record only touches it when watches are live
    try:
        for revision in range(first, first + count):
            hub.record([_event(revision, **fields)], loop)
    finally:
        loop.close()


class _Writer:
    """Collects the frames a watch stream writes; closes after the first answer."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.transport = self

    def write(self, data: bytes) -> None:
        self.frames.extend(FrameDecoder().feed(data))

    async def drain(self) -> None:
        return None

    def is_closing(self) -> bool:
        return bool(self.frames)

    def abort(self) -> None:
        return None


def _watch_from(hub: WatchHub, revision: int, current: int) -> dict[str, Any]:
    """The first frame a watch from ``revision`` gets (current store revision
    ``current``)."""

    async def main() -> dict[str, Any]:
        writer = _Writer()
        request = Request(id=7, op="watch", args={"prefix": "", "from_revision": revision})
        await asyncio.wait_for(hub.stream(request, writer, lambda: current), 10)  # type: ignore[arg-type]
        return writer.frames[0]

    return asyncio.run(main())


@pytest.mark.timeout(120)
def test_history_memory_is_bounded_by_bytes_not_only_by_count() -> None:
    """50,000 changes of short strings: the history keeps what its byte budget
    allows, and the memory it holds stays near that budget. Without the byte bound it
    kept all 50,000 (under the 100,000 count), ~25 MB."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        hub = WatchHub()
        _record(hub, 1, 50_000)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    length, size = hub.history_size
    assert length < 50_000 < WATCH_HISTORY, "the count bound alone decided"
    assert size <= WATCH_HISTORY_BYTES
    assert size > WATCH_HISTORY_BYTES - 2 * event_bytes(_event(1)), "the budget was not used"
    # The estimate tracks real memory: at most 1.5x the budget (~0.95x measured).
    assert held < 1.5 * WATCH_HISTORY_BYTES, f"history holds {held / 2**20:.1f} MiB"
    # The newest changes are the ones kept, contiguous.
    revisions = [e["revision"] for e in hub._history]
    assert revisions == list(range(50_001 - length, 50_001))
    assert all("lid" not in e for e in hub._history)


@pytest.mark.timeout(120)
def test_large_fields_shorten_the_history_and_memory_stays_bounded() -> None:
    """Changes with 4 KiB values: far fewer fit, the held memory is still bounded."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        hub = WatchHub(history_bytes=2 * 1024 * 1024)
        _record(hub, 1, 3_000, value="v" * 4096)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    length, size = hub.history_size
    assert size <= 2 * 1024 * 1024
    assert 2 * 1024 * 1024 // (EVENT_OVERHEAD + 4096 + 64) <= length < 600
    assert held < 1.5 * 2 * 1024 * 1024


def test_event_estimate_counts_strings_and_unit_indices() -> None:
    small = {"type": "grant", "key": "k", "owner": "o", "revision": 1, "value": None}
    assert event_bytes(small) == EVENT_OVERHEAD + len("grant") + 2
    pool = {**small, "value": "abc", "unit_indices": [0, 1, 2, 3]}
    assert event_bytes(pool) == event_bytes(small) + 3 + 4 * 8


def test_count_bound_still_applies_and_newest_change_always_stays() -> None:
    hub = WatchHub(history=100)
    _record(hub, 1, 1_000)
    assert hub.history_size[0] == 100
    assert hub._history[0]["revision"] == 901
    tiny = WatchHub(history_bytes=1)  # smaller than one event: the newest stays
    _record(tiny, 1, 10)
    assert [e["revision"] for e in tiny._history] == [10]


def test_a_watch_from_a_dropped_revision_is_compacted_and_a_kept_one_resumes() -> None:
    hub = WatchHub(history_bytes=64 * 1024)
    _record(hub, 1, 2_000)
    length, _ = hub.history_size
    oldest = 2_001 - length
    assert oldest > 1
    refused = _watch_from(hub, 1, 2_000)
    assert refused["ok"] is False and refused["code"] == "COMPACTED"
    assert f"it starts at {oldest}" in refused["message"]
    served = _watch_from(hub, oldest, 2_000)
    assert served["ok"] is True
    events = served["result"]["events"]
    assert [e["revision"] for e in events] == list(range(oldest, 2_001))


def test_a_gap_resets_the_byte_count() -> None:
    hub = WatchHub(history_bytes=64 * 1024)
    _record(hub, 1, 500)
    _record(hub, 10_000, 3)  # revisions jump: the node installed a snapshot
    length, size = hub.history_size
    assert length == 3
    assert size == sum(event_bytes(e) for e in hub._history)
