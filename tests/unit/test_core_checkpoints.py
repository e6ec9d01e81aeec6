"""Task checkpoints in the pure state machine (issue 41; docs/queues.md, "Checkpoints").

A heartbeat may carry a checkpoint (base64 text of at most 8 KiB); the task keeps the
latest one, hands it to every later claim and shows it in ``get`` and the dead-letter
view. Only the current attempt can write one, and it survives a snapshot.
"""

from __future__ import annotations

import base64
import copy

import pytest

from raftlease.core import LeaseStore
from raftlease.limits import MAX_TASK_CHECKPOINT_BYTES, MAX_TASK_CHECKPOINT_TEXT
from tests.unit.test_core_tasks import beat, claim, code, fail, info, ok, put, read, tick

pytestmark = pytest.mark.timeout(60)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def test_the_next_attempt_claims_the_last_checkpoint_of_the_expired_one() -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "T", ttl=1000, backoff=0)))
    first = ok(store.apply(claim(10, "A1")))
    assert "checkpoint" not in first  # nothing saved yet
    ok(store.apply(beat(100, "T", "A1", progress=3, checkpoint=b64(b"step-3"))))
    ok(store.apply(beat(200, "T", "A1", progress=6, checkpoint=b64(b"step-6"))))
    ok(store.apply(beat(300, "T", "A1", progress=7)))  # no checkpoint: the last one stays
    ok(store.apply(tick(2000)))  # the worker died: the attempt expires
    second = ok(store.apply(claim(2100, "A2")))
    assert second["attempt"] == 2
    assert second["checkpoint"] == b64(b"step-6") and second["checkpoint_attempt"] == 1
    seen = info(store, "T", 2100)
    assert seen["checkpoint"] == b64(b"step-6") and seen["checkpoint_attempt"] == 1


def test_a_stale_attempt_cannot_overwrite_the_checkpoint() -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "T", ttl=1000, backoff=0)))
    ok(store.apply(claim(10, "A1")))
    ok(store.apply(tick(2000)))
    ok(store.apply(claim(2100, "A2")))
    ok(store.apply(beat(2200, "T", "A2", checkpoint=b64(b"mine"))))
    assert code(store.apply(beat(2300, "T", "A1", checkpoint=b64(b"zombie")))) == "STALE_ATTEMPT"
    assert info(store, "T", 2300)["checkpoint"] == b64(b"mine")


def test_the_dead_letter_view_shows_the_last_checkpoint() -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "T", max_attempts=1)))
    ok(store.apply(claim(10, "A1")))
    ok(store.apply(beat(20, "T", "A1", checkpoint=b64(b"half"))))
    ok(store.apply(fail(30, "T", "A1")))
    dead = ok(store.apply(read("task_dead", 40)))["dead"]
    assert [d["tid"] for d in dead] == ["T"]
    assert dead[0]["checkpoint"] == b64(b"half") and dead[0]["checkpoint_attempt"] == 1


@pytest.mark.parametrize(
    "bad",
    [
        b64(b"x" * MAX_TASK_CHECKPOINT_BYTES) + "AAAA",  # over the limit
        "\u00e9" * (MAX_TASK_CHECKPOINT_TEXT // 2 + 1),  # over it in UTF-8 bytes
        7,
        None,
        b"raw",
    ],
)
def test_a_bad_checkpoint_is_refused_and_changes_nothing(bad: object) -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "T")))
    ok(store.apply(claim(10, "A1")))
    ok(store.apply(beat(20, "T", "A1", checkpoint=b64(b"good"))))
    before = store.to_plain()
    assert code(store.apply(beat(30, "T", "A1", checkpoint=bad))) == "BAD_REQUEST"
    after = store.to_plain()
    # Only log time and the dedup table (the refused request's answer) moved.
    assert {**after, "now": 0, "sessions": None} == {**before, "now": 0, "sessions": None}


def test_any_text_is_kept_as_it_came() -> None:
    """The clients send base64; the state machine keeps any text (HTTP users may
    write their own), and the clients read text that is not base64 as UTF-8."""
    store = LeaseStore()
    ok(store.apply(put(0, "T")))
    ok(store.apply(claim(10, "A1")))
    ok(store.apply(beat(20, "T", "A1", checkpoint="step 6 of 10")))
    assert info(store, "T", 20)["checkpoint"] == "step 6 of 10"


def test_the_largest_checkpoint_is_accepted() -> None:
    text = b64(b"\xff" * MAX_TASK_CHECKPOINT_BYTES)
    assert len(text) == MAX_TASK_CHECKPOINT_TEXT
    store = LeaseStore()
    ok(store.apply(put(0, "T")))
    ok(store.apply(claim(10, "A1")))
    ok(store.apply(beat(20, "T", "A1", checkpoint=text)))
    assert info(store, "T", 20)["checkpoint"] == text


def test_a_checkpoint_survives_a_snapshot_and_an_older_row_loads_without_one() -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "T", ttl=1000, backoff=0)))
    ok(store.apply(claim(10, "A1")))
    ok(store.apply(beat(20, "T", "A1", checkpoint=b64(b"cp"))))
    plain = store.to_plain()
    assert plain["v"] == 9
    row = plain["tasks"]["tasks"][0]
    assert row[25:27] == [b64(b"cp"), 1]  # then the effect journal (none here)
    restored = LeaseStore.from_plain(copy.deepcopy(plain))
    assert restored.to_plain() == plain
    later = tick(2000)
    assert restored.apply(dict(later)) == store.apply(dict(later))
    again = claim(2100, "A2")
    assert restored.apply(dict(again)) == store.apply(dict(again))
    # A layout 8 row (no checkpoint columns) loads with none.
    old = copy.deepcopy(plain)
    old["v"] = 8
    old["tasks"]["tasks"][0] = row[:25]
    assert "checkpoint" not in info(LeaseStore.from_plain(old), "T", 20)
