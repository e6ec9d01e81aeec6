"""Leased task queues in the pure state machine (core/queue.py, issue 12).

(tests/unit/test_core_queue.py is about the *acquire* wait queue; this file is about tasks.)
Every test drives ``LeaseStore.apply`` with hand-made entries, as the leader would
propose them: log time, the leader-drawn task and attempt ids and the entry seed are
all in the entry.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from raftlease import errors
from raftlease.core import LeaseStore
from raftlease.core.queue import MAX_PAYLOAD_BYTES, MAX_RESULT_BYTES

pytestmark = pytest.mark.timeout(60)

Entry = dict[str, Any]
_seq = itertools.count(1)


def mut(op: str, now: int, **fields: Any) -> Entry:
    """A mutating task entry with a fresh (cid, seq) (one client id per entry, so no
    dedup table grows across a test)."""
    seq = next(_seq)
    return {"op": op, "now": now, "cid": f"c{seq}", "seq": 1, "ack": 1, "queue": "q", **fields}


def put(now: int, tid: str, payload: str = "{}", **fields: Any) -> Entry:
    return mut("task_put", now, tid=tid, payload=payload, **fields)


def claim(now: int, aid: str, worker: str = "w1", **fields: Any) -> Entry:
    return mut("task_claim", now, aid=aid, worker=worker, **fields)


def done(now: int, tid: str, aid: str, result: str = '"ok"', **fields: Any) -> Entry:
    return mut("task_complete", now, tid=tid, aid=aid, result=result, **fields)


def fail(now: int, tid: str, aid: str, error: str = "boom", **fields: Any) -> Entry:
    return mut("task_fail", now, tid=tid, aid=aid, error=error, **fields)


def beat(now: int, tid: str, aid: str, **fields: Any) -> Entry:
    return mut("task_heartbeat", now, tid=tid, aid=aid, **fields)


def read(op: str, now: int, **fields: Any) -> Entry:
    return {"op": op, "now": now, "queue": "q", **fields}


def tick(now: int) -> Entry:
    return {"op": "tick", "now": now}


def ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["ok"] is True, result
    return result


def code(result: dict[str, Any]) -> str:
    assert result["ok"] is False, result
    assert result["code"] in errors.CODES, result
    return str(result["code"])


def info(store: LeaseStore, tid: str, now: int) -> dict[str, Any]:
    task: dict[str, Any] = ok(store.apply(read("task_get", now, tid=tid)))["task"]
    return task


def stats(store: LeaseStore, now: int) -> dict[str, Any]:
    out: dict[str, Any] = ok(store.apply(read("task_stats", now)))["stats"]
    return out


def test_put_claim_complete_and_exactly_one_completion() -> None:
    s = LeaseStore()
    ok(s.apply(put(100, "T1", '{"env": "cartpole"}')))
    got = ok(s.apply(claim(110, "A1", ttl=5000)))
    assert got["claimed"] and got["tid"] == "T1" and got["payload"] == '{"env": "cartpole"}'
    assert got["attempt"] == 1 and got["token"] == s.revision
    assert got["expires_at"] == 110 + 5000
    assert ok(s.apply(done(120, "T1", "A1", '{"reward": 1}')))["token"] == got["token"]
    # Exactly one completion: a second (another request, same attempt) is refused.
    assert code(s.apply(done(130, "T1", "A1", '"again"'))) == "STALE_ATTEMPT"
    task = info(s, "T1", 140)
    assert task["status"] == "completed" and task["result"] == '{"reward": 1}'
    assert [row[5] for row in task["history"]] == ["completed"]
    assert "aid" not in task and "A1" not in repr(task)  # reads never reveal attempt ids


def test_highest_priority_first_then_fifo() -> None:
    s = LeaseStore()
    for tid, prio in (("a", 0), ("b", 5), ("c", 0), ("d", 5), ("e", -1)):
        ok(s.apply(put(100, tid, priority=prio)))
    order = [ok(s.apply(claim(200, f"A{i}")))["tid"] for i in range(5)]
    assert order == ["b", "d", "a", "c", "e"]
    assert ok(s.apply(claim(200, "A9")))["claimed"] is False


def test_a_delayed_task_is_claimable_only_once_its_time_comes() -> None:
    s = LeaseStore()
    ok(s.apply(put(100, "T", delay=1000)))
    assert stats(s, 100)["delayed"] == 1
    assert ok(s.apply(claim(1099, "A1")))["claimed"] is False
    assert ok(s.apply(claim(1100, "A2")))["tid"] == "T"


def test_a_repeat_put_with_the_same_dedup_key_returns_the_first_id() -> None:
    s = LeaseStore()
    first = ok(s.apply(put(100, "T1", dedup_key="cartpole-7")))
    again = ok(s.apply(put(200, "T2", dedup_key="cartpole-7")))
    assert again["tid"] == first["tid"] == "T1" and again["duplicate"] is True
    assert stats(s, 200)["ready"] == 1


def test_a_retried_put_is_answered_from_the_dedup_table_despite_a_new_task_id() -> None:
    s = LeaseStore()
    entry = put(100, "T1")
    first = ok(s.apply(dict(entry)))
    # The client retried after a timeout; the leader drew a fresh task id for it.
    retry = {**entry, "tid": "T-other", "now": 200}
    assert s.apply(retry) == first
    assert stats(s, 200)["ready"] == 1


def test_an_expired_attempt_is_retried_with_jittered_backoff_and_a_higher_token() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T", max_attempts=3, backoff=1000, ttl=500)))
    first = ok(s.apply(claim(10, "A1")))
    ok(s.apply({**tick(510), "seed": 12345}))  # the attempt expired at 510
    task = info(s, "T", 510)
    assert task["status"] == "delayed" and task["failures"] == 1
    # Equal jitter: between half the backoff and the whole of it.
    assert 510 + 500 <= task["ready_at"] <= 510 + 1000
    assert task["history"][0][5] == "expired"
    assert ok(s.apply(claim(task["ready_at"] - 1, "A2")))["claimed"] is False
    second = ok(s.apply(claim(task["ready_at"], "A3")))
    assert second["attempt"] == 2 and second["token"] > first["token"]
    # The zombie's completion is refused; the current attempt's is accepted.
    stale = s.apply(done(task["ready_at"] + 1, "T", "A1"))
    assert code(stale) == "STALE_ATTEMPT"
    assert stale["detail"]["current_token"] == second["token"]
    ok(s.apply(done(task["ready_at"] + 2, "T", "A3")))


def test_the_jitter_comes_from_the_entry_seed_deterministically() -> None:
    def ready_at(seed: int) -> int:
        s = LeaseStore()
        ok(s.apply(put(0, "T", backoff=10_000, ttl=100)))
        ok(s.apply(claim(0, "A1")))
        ok(s.apply({**tick(100), "seed": seed}))
        return int(info(s, "T", 100)["ready_at"])

    assert ready_at(1) == ready_at(1)
    assert len({ready_at(seed) for seed in range(8)}) > 1


def test_backoff_doubles_and_max_attempts_dead_letters_with_every_error() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T", max_attempts=3, backoff=1000)))
    now = 0
    delays = []
    for n in range(3):
        got = ok(s.apply(claim(now, f"A{n}")))
        assert got["tid"] == "T"
        result = ok(s.apply(fail(now + 1, "T", f"A{n}", error=f"err-{n}")))
        if n < 2:
            assert result["status"] == "delayed"
            delays.append(result["ready_at"] - (now + 1))
            now = result["ready_at"]
        else:
            assert result["status"] == "dead"
    assert 500 <= delays[0] <= 1000 and 1000 <= delays[1] <= 2000
    dead = ok(s.apply(read("task_dead", now + 10)))["dead"]
    assert [d["tid"] for d in dead] == ["T"]
    assert [row[6] for row in dead[0]["history"]] == ["err-0", "err-1", "err-2"]
    assert dead[0]["dead_reason"].startswith("failed 3 of 3")
    assert stats(s, now + 10)["dead"] == 1


def test_retry_and_purge_of_a_dead_task() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T", max_attempts=1, dedup_key="k")))
    ok(s.apply(claim(0, "A1")))
    ok(s.apply(fail(1, "T", "A1")))
    assert code(s.apply(mut("task_purge", 2, tid="nope"))) == "TASK_NOT_FOUND"
    ok(s.apply(mut("task_retry", 2, tid="T")))
    assert info(s, "T", 2)["status"] == "ready"
    assert code(s.apply(mut("task_retry", 3, tid="T"))) == "TASK_STATE"  # not dead
    assert code(s.apply(mut("task_purge", 3, tid="T"))) == "INVALID_ARGUMENT"  # not dead
    ok(s.apply(claim(3, "A2")))
    ok(s.apply(fail(4, "T", "A2")))
    ok(s.apply(mut("task_purge", 5, tid="T")))
    assert code(s.apply(read("task_get", 5, tid="T"))) == "TASK_NOT_FOUND"
    assert ok(s.apply(put(6, "T2", dedup_key="k")))["tid"] == "T2"  # the key is free again


def test_release_gives_the_task_back_without_counting_an_attempt() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T", max_attempts=1)))
    ok(s.apply(put(0, "U", max_attempts=1)))
    ok(s.apply(claim(0, "A1")))
    ok(s.apply(mut("task_release", 1, tid="T", aid="A1")))
    task = info(s, "T", 1)
    assert task["status"] == "ready" and task["failures"] == 0
    # It keeps its place: claimed before the later put.
    again = ok(s.apply(claim(2, "A2")))
    assert again["tid"] == "T" and again["attempt"] == 2
    assert code(s.apply(mut("task_release", 3, tid="T", aid="A1"))) == "STALE_ATTEMPT"


def test_heartbeats_extend_and_progress_aware_expiry_stops_a_stuck_worker() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T", ttl=1000, progress_timeout=3000, max_attempts=5)))
    ok(s.apply(claim(0, "A1")))
    beat1 = ok(s.apply(beat(500, "T", "A1", progress=1)))
    assert beat1["expires_at"] == 1500 and not beat1["stalled"]
    # Heartbeats without progress: extended only up to last progress + timeout.
    assert ok(s.apply(beat(1400, "T", "A1", progress=1)))["expires_at"] == 2400
    assert ok(s.apply(beat(2300, "T", "A1")))["expires_at"] == 3300
    capped = ok(s.apply(beat(3200, "T", "A1", progress=0.5)))  # not an advance
    assert capped["expires_at"] == 3500  # 500 (last progress) + 3000
    stuck = ok(s.apply(beat(3499, "T", "A1")))
    assert stuck["expires_at"] == 3500
    ok(s.apply(tick(3500)))
    task = info(s, "T", 3500)
    assert task["status"] in ("delayed", "ready") and task["history"][-1][5] == "stalled"
    # A worker that makes progress keeps its task.
    s2 = LeaseStore()
    ok(s2.apply(put(0, "T", ttl=1000, progress_timeout=1500)))
    ok(s2.apply(claim(0, "A1")))
    for step, now in enumerate(range(500, 10_000, 500), start=1):
        assert ok(s2.apply(beat(now, "T", "A1", progress=step)))["expires_at"] == now + 1000
    ok(s2.apply(done(10_000, "T", "A1")))


def test_a_heartbeat_never_shortens_an_attempt() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T", ttl=10_000)))
    ok(s.apply(claim(0, "A1")))
    assert ok(s.apply(beat(1, "T", "A1")))["expires_at"] == 10_001
    s2 = LeaseStore()
    ok(s2.apply(put(0, "T", ttl=1000, progress_timeout=500)))
    assert ok(s2.apply(claim(0, "A1")))["expires_at"] == 500
    assert ok(s2.apply(beat(400, "T", "A1")))["expires_at"] == 500


def test_capability_routing_serves_the_first_waiting_claim_that_can_take_it() -> None:
    s = LeaseStore()
    # Two generic workers wait first, then one with a GPU.
    assert ok(s.apply(claim(0, "G1", worker="cpu-1", wait=60_000)))["queued"]
    assert ok(s.apply(claim(0, "G2", worker="cpu-2", wait=60_000)))["queued"]
    assert ok(s.apply(claim(0, "X1", worker="gpu-1", wait=60_000, caps={"gpu": "a100", "x": "y"})))[
        "queued"
    ]
    # A task only the GPU worker can take goes to it, past the two generic claims.
    ok(s.apply(put(10, "GPU", requires={"gpu": "a100"})))
    granted = [e for e in s.events if e["type"] == "task_claim"]
    assert [(e["owner"], e["lease_id"]) for e in granted] == [("gpu-1", "X1")]
    status = ok(s.apply(read("task_claim_status", 11, aid="X1")))
    assert status["state"] == "claimed" and status["tid"] == "GPU"
    # A generic task goes to the first generic claim, in arrival order.
    ok(s.apply(put(12, "CPU")))
    assert ok(s.apply(read("task_claim_status", 13, aid="G1")))["tid"] == "CPU"
    assert ok(s.apply(read("task_claim_status", 13, aid="G2")))["state"] == "waiting"
    # A claim offering no GPU never gets the GPU task.
    ok(s.apply(put(14, "GPU2", requires={"gpu": "a100"})))
    assert ok(s.apply(claim(15, "C3", worker="cpu-3")))["claimed"] is False
    assert ok(s.apply(claim(15, "X2", worker="gpu-2", caps={"gpu": "a100"})))["tid"] == "GPU2"


def test_a_waiting_claim_leaves_at_its_deadline_and_can_be_cancelled() -> None:
    s = LeaseStore()
    ok(s.apply(claim(0, "W1", wait=1000)))
    ok(s.apply(claim(0, "W2", wait=5000)))
    ok(s.apply(tick(1000)))
    assert any(e["type"] == "task_claim_gone" and e["lease_id"] == "W1" for e in s.events)
    assert ok(s.apply(read("task_claim_status", 1000, aid="W1")))["state"] == "gone"
    assert ok(s.apply(mut("task_claim_cancel", 1001, aid="W2")))["cancelled"] is True
    ok(s.apply(put(1002, "T")))
    assert stats(s, 1002)["ready"] == 1  # nobody was waiting any more


def test_cancelling_a_claim_granted_meanwhile_gives_the_task_back() -> None:
    s = LeaseStore()
    ok(s.apply(claim(0, "W1", wait=1000)))
    ok(s.apply(put(1, "T")))
    assert info(s, "T", 1)["status"] == "claimed"
    result = ok(s.apply(mut("task_claim_cancel", 2, aid="W1")))
    assert result["released"] == "T"
    task = info(s, "T", 2)
    assert task["status"] == "ready" and task["failures"] == 0


def test_a_deadline_dead_letters_the_task_and_ends_its_attempt() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T", deadline=1000, ttl=60_000)))
    ok(s.apply(claim(10, "A1")))
    ok(s.apply(tick(1000)))
    task = info(s, "T", 1000)
    assert task["status"] == "dead" and task["dead_reason"] == "deadline passed"
    assert code(s.apply(done(1001, "T", "A1"))) == "STALE_ATTEMPT"


def test_finished_tasks_are_dropped_after_their_retention() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T", retention=1000, dedup_key="k")))
    ok(s.apply(claim(0, "A1")))
    ok(s.apply(done(10, "T", "A1")))
    assert info(s, "T", 1009)["status"] == "completed"
    ok(s.apply(tick(1010)))
    assert code(s.apply(read("task_get", 1010, tid="T"))) == "TASK_NOT_FOUND"
    assert s.tasks.tasks == {} and s.tasks.queues == {}  # nothing left behind
    assert ok(s.apply(put(1011, "T2", dedup_key="k")))["tid"] == "T2"


def test_a_claim_attached_to_a_lease_session_ends_with_it() -> None:
    s = LeaseStore()
    ok(s.apply(mut("session_open", 0, sid="S", owner="w", ttl=1000)))
    ok(s.apply(put(0, "T", ttl=60_000, max_attempts=2)))
    got = ok(s.apply(claim(0, "A1", session="S")))
    assert got["expires_at"] == 1000 and got["session"] == "S"
    ok(s.apply(mut("session_keepalive", 900, sid="S")))
    assert info(s, "T", 900)["expires_at"] == 1900
    ok(s.apply(claim(900, "W2", session="S", wait=60_000)))  # a waiting claim too
    ok(s.apply(tick(1900)))  # the session expired: its attempt failed, its claim left
    task = info(s, "T", 1900)
    assert task["status"] in ("delayed", "ready") and task["history"][-1][5] == "session"
    assert ok(s.apply(read("task_claim_status", 1900, aid="W2")))["state"] == "gone"
    assert code(s.apply(claim(1901, "A3", session="S"))) == "SESSION_NOT_FOUND"


def test_a_keepalive_that_shortens_the_session_shortens_its_attempts() -> None:
    """A keep-alive may lower the session's TTL. The attached attempt ends with the
    session, so its heartbeat and claim status must say the new, earlier expiry, not
    the old one: a worker told "valid until 10000" would go on working after its task
    went to another worker at 110."""
    s = LeaseStore()
    ok(s.apply(mut("session_open", 0, sid="S", owner="w", ttl=10_000)))
    ok(s.apply(put(0, "T", ttl=60_000, backoff=0)))
    assert ok(s.apply(claim(0, "A1", session="S")))["expires_at"] == 10_000
    assert ok(s.apply(mut("session_keepalive", 10, sid="S", ttl=100)))["expires_at"] == 110
    hb = ok(s.apply(beat(20, "T", "A1")))
    assert (hb["expires_at"], hb["ttl"]) == (110, 100)
    status = ok(s.apply(read("task_claim_status", 30, aid="A1")))
    assert (status["state"], status["expires_at"], status["ttl"]) == ("claimed", 110, 100)
    ok(s.apply(claim(50, "B1", worker="w2", wait=60_000, ttl=60_000)))
    ok(s.apply(tick(110)))  # the session ended: the task went to w2
    assert [(a.aid, a.worker) for a in s.tasks.attempts.values()] == [("B1", "w2")]
    assert info(s, "T", 110)["history"][-1][5] == "session"


def test_a_task_id_used_again_never_meets_its_old_ready_item() -> None:
    """A purged task's item can stay in its ready heap (items are dropped lazily). A
    later put under the same id, in another queue and needing a capability, must not
    be claimed through that item by a worker of the first queue without it."""
    s = LeaseStore()
    ok(s.apply(put(0, "T", payload='"old"', queue="q1", deadline=100)))
    ok(s.apply(put(0, "K", queue="q1", delay=10**6)))  # keeps q1 (and its heap) alive
    ok(s.apply(tick(100)))  # T is dead; its ready item stays in q1's heap
    ok(s.apply(mut("task_purge", 101, queue="q1", tid="T")))
    ok(s.apply(put(102, "T", payload='"gpu-only"', queue="q2", requires={"gpu": "a100"})))
    got = ok(s.apply(claim(103, "A", queue="q1")))
    assert got["claimed"] is False, got
    task = ok(s.apply(read("task_get", 103, queue="q2", tid="T")))["task"]
    assert task["status"] == "ready"


def test_the_queue_quota_refuses_a_put_unchanged() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T1", quota=2)))
    ok(s.apply(put(0, "T2", quota=2)))
    before = s.to_plain()
    refused = s.apply(put(0, "T3", quota=2))
    assert code(refused) == "QUOTA_EXCEEDED"
    after = s.to_plain()
    # The dedup table answered (a definite refusal is cached for the retry); the rest
    # of the state is exactly as before.
    assert {k: v for k, v in after.items() if k not in ("sessions", "applied")} == {
        k: v for k, v in before.items() if k not in ("sessions", "applied")
    }


@pytest.mark.parametrize(
    "entry",
    [
        put(0, "T", payload="x" * (MAX_PAYLOAD_BYTES + 1)),
        put(0, "T", payload={"not": "a string"}),  # type: ignore[arg-type]
        put(0, "T", priority=10**6),
        put(0, "T", priority=True),
        put(0, "T", ttl=0),
        put(0, "T", ttl=10**15),
        put(0, "T", delay=-1),
        put(0, "T", delay=10**15),
        put(0, "T", max_attempts=0),
        put(0, "T", max_attempts=10**6),
        put(0, "T", requires={"gpu": 1}),
        put(0, "T", requires={f"k{i}": "v" for i in range(100)}),
        put(0, "T", dedup_key=""),
        {**put(0, "T"), "queue": ""},
        {**put(0, "T"), "queue": "q" * 1000},
        {**put(0, "T"), "tid": ""},
        claim(0, "A", worker=""),
        claim(0, "A", wait=-5),
        claim(0, "A", caps=["gpu"]),
        claim(0, "A", session="S", ttl=1000),
        done(0, "T", "A", result="r" * (MAX_RESULT_BYTES + 1)),
        fail(0, "T", "A", error="e" * 5000),
        beat(0, "T", "A", progress=float("nan")),
        beat(0, "T", "A", progress="3"),
        read("task_dead", 0, limit=0),
    ],
)
def test_malformed_task_entries_are_refused_and_change_nothing(entry: Entry) -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "Z")))
    before = s.to_plain()
    assert code(s.apply(copy.deepcopy(entry))) == "BAD_REQUEST"
    assert s.to_plain() == before


def test_unknown_queue_task_and_forged_attempt_ids() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T")))
    ok(s.apply(claim(0, "A1")))
    assert code(s.apply(done(1, "nope", "A1"))) == "TASK_NOT_FOUND"
    assert code(s.apply({**done(1, "T", "A1"), "queue": "other"})) == "TASK_NOT_FOUND"
    assert code(s.apply(done(1, "T", "forged"))) == "STALE_ATTEMPT"
    assert code(s.apply(beat(1, "T", "forged"))) == "STALE_ATTEMPT"
    assert code(s.apply(read("task_get", 1, tid="nope"))) == "TASK_NOT_FOUND"
    assert stats(s, 1)["claimed"] == 1
    empty = ok(s.apply({**read("task_stats", 1), "queue": "never-used"}))["stats"]
    assert empty["ready"] == 0 and empty["oldest_ready_age"] is None
    # A leader-drawn id that is already in use is a bug or forged: refused unchanged.
    assert code(s.apply(put(2, "T"))) == "BAD_REQUEST"
    assert code(s.apply(claim(2, "A1"))) == "BAD_REQUEST"


def test_attempts_are_bound_to_the_principal_that_claimed() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T", principal="alice")))
    ok(s.apply(claim(0, "A1", principal="bob")))
    assert code(s.apply(done(1, "T", "A1", principal="mallory"))) == "PERMISSION_DENIED"
    assert code(s.apply(done(1, "T", "A1"))) == "PERMISSION_DENIED"
    ok(s.apply(done(1, "T", "A1", principal="bob")))


def test_task_events_have_one_revision_each_and_the_watch_fields() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T")))
    event = s.events[-1]
    assert event["type"] == "task_put" and event["key"] == "queue:q/T"
    assert event["revision"] == s.revision and event["value"] == "ready"
    got = ok(s.apply(claim(1, "A1", worker="w9")))
    (event,) = s.events
    assert (event["type"], event["owner"], event["token"], event["units"]) == (
        "task_claim",
        "w9",
        got["token"],
        1,
    )
    ok(s.apply(done(2, "T", "A1")))
    assert [e["type"] for e in s.events] == ["task_complete"]
    assert s.events[0]["value"] == "completed"


def test_stats_count_every_state() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "R1")))
    ok(s.apply(put(0, "R2", priority=-5)))
    ok(s.apply(put(0, "D", delay=10_000)))
    ok(s.apply(put(0, "X", max_attempts=1, priority=10)))
    ok(s.apply(claim(0, "A1")))  # X
    ok(s.apply(fail(1, "X", "A1")))
    ok(s.apply(claim(2, "A2")))  # R1
    ok(s.apply(claim(2, "W", wait=1000, caps={"gpu": "h100"})))  # waits: R2 needs none...
    got = stats(s, 100)
    assert got["ready"] == 0 and got["claimed"] == 2  # ...so the waiting claim took R2
    assert (got["delayed"], got["dead"], got["waiting_claims"]) == (1, 1, 0)
    assert got["attempts"] == 3


def test_a_snapshot_taken_mid_flight_goes_on_exactly_as_the_live_store() -> None:
    s = LeaseStore()
    ok(s.apply(mut("session_open", 0, sid="S", owner="w", ttl=5000)))
    ok(s.apply(put(0, "T1", priority=2, dedup_key="d1", requires={"gpu": "a"})))
    ok(s.apply(put(0, "T2", delay=500, deadline=100_000)))
    ok(s.apply(put(0, "T3", max_attempts=1)))
    ok(s.apply(put(0, "T4", retention=10_000)))
    ok(s.apply(claim(1, "A3")))  # T3
    ok(s.apply(fail(2, "T3", "A3", error="x")))  # dead
    ok(s.apply(claim(3, "A4", ttl=700)))  # T4
    ok(s.apply(done(4, "T4", "A4")))
    ok(s.apply(claim(5, "A5")))  # T1 needs a GPU: T2 is still delayed, so nothing
    ok(s.apply(claim(6, "W1", wait=10_000, session="S", caps={"gpu": "b"})))
    ok(s.apply(claim(6, "W2", wait=10_000)))
    restored = LeaseStore.from_plain(copy.deepcopy(s.to_plain()))
    assert restored.to_plain() == s.to_plain()
    later = [
        beat(100, "T2", "A5", progress=1),
        {**tick(600), "seed": 7},
        put(700, "T5", requires={"gpu": "b"}),
        mut("session_keepalive", 800, sid="S"),
        {**tick(40_000), "seed": 9},
        mut("task_retry", 40_001, tid="T3"),
        claim(40_002, "A9", caps={"gpu": "a"}),
        read("task_stats", 40_003),
        read("task_dead", 40_003),
    ]
    for entry in later:
        assert restored.apply(copy.deepcopy(entry)) == s.apply(copy.deepcopy(entry)), entry
        assert restored.events == s.events
        assert restored.to_plain() == s.to_plain()
