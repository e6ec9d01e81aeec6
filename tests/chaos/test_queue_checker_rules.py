"""Checks that can fail: each queue checker (jepsen-style/queue_checker.py, issue 12) on
hand-made histories.

Every rule is shown failing on a small bad history, going ``unknown`` (never a pass)
when a field it needs is missing or it had nothing to judge, and passing on a good
history that is otherwise the same. The histories use the event shapes documented in
jepsen-style/README.md (*Queue events*); times are seconds from 0.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

SUITE = Path(__file__).resolve().parents[2] / "jepsen-style"
sys.path.insert(0, str(SUITE))

import checker  # noqa: E402
import queue_checker  # noqa: E402

pytestmark = pytest.mark.timeout(60)

RHO, MARGIN = 0.01, 0.05
Q = "jobs"
Event = dict[str, Any]


def until(send: float, ttl: float) -> float:
    """The worker's own expiry of an attempt claimed (or heartbeated) at ``send``."""
    return send + ttl * (1 - RHO) - MARGIN


class QHist:
    """A hand-made queue history."""

    def __init__(self) -> None:
        self.events: list[Event] = [
            {"type": "meta", "t": 0.0, "rho": RHO, "margin": MARGIN, "queues": {Q: {}}}
        ]
        self.n = 0

    def op(
        self,
        p: str,
        f: str,
        inv: float,
        ret: float | None,
        args: dict[str, Any] | None = None,
        value: dict[str, Any] | None = None,
        type: str = "ok",
        error: str | None = None,
    ) -> str:
        self.n += 1
        op = f"{p}:{self.n}"
        base = {"op": op, "process": p, "f": f, "key": Q}
        self.events.append({**base, "type": "invoke", "t": inv, "value": args or {}})
        if ret is not None:
            done: Event = {**base, "type": type, "t": ret, "value": value or {}}
            if error:
                done["error"] = error
            self.events.append(done)
        return op

    def put(self, task: str | None, t: float, max_attempts: int = 3, **extra: Any) -> str:
        value = {} if task is None else {"task": task}
        args = {"payload": f"payload-{task}-{t}", "max_attempts": max_attempts, **extra}
        return self.op("prod", "q.put", t, t + 0.1, args=args, value=value)

    def claim(
        self,
        p: str,
        task: str,
        t: float,
        token: int,
        attempt: int,
        ttl: float = 2.0,
        drop: tuple[str, ...] = (),
        payload: str | None = None,
    ) -> str:
        value: dict[str, Any] = {
            "task": task,
            "token": token,
            "attempt": attempt,
            "lease_id": f"L{token}",
            "valid_until": until(t, ttl),
        }
        if payload is not None:  # the put's payload id, as the workload records it
            value["payload"] = payload
        for name in drop:
            value.pop(name)
        return self.op(p, "q.claim", t, t + 0.1, args={"worker": p, "lease_ttl": ttl}, value=value)

    def attempt_op(
        self,
        p: str,
        f: str,
        task: str,
        token: int,
        t: float,
        type: str = "ok",
        error: str | None = None,
        **args: Any,
    ) -> str:
        return self.op(
            p, f, t, t + 0.1, args={"task": task, "token": token, **args}, type=type, error=error
        )

    def heartbeat(self, p: str, task: str, token: int, t: float, ttl: float = 2.0) -> str:
        return self.op(
            p,
            "q.heartbeat",
            t,
            t + 0.1,
            args={"task": task, "token": token, "progress": t},
            value={"valid_until": until(t, ttl)},
        )

    def get(
        self, task: str, t: float, type: str = "ok", error: str | None = None, **value: Any
    ) -> str:
        return self.op(
            "final",
            "q.get",
            t,
            t + 0.05,
            args={"task": task, "final": True},
            value=value,
            type=type,
            error=error,
        )

    def dead(self, t: float, tasks: list[dict[str, Any]]) -> str:
        return self.op("final", "q.dead", t, t + 0.05, args={"final": True}, value={"tasks": tasks})

    def check(self) -> dict[str, dict[str, Any]]:
        ops = checker.pair_ops(self.events)
        return queue_checker.check_queues(self.events, ops, checker.Params(rho=RHO, margin=MARGIN))


def good() -> QHist:
    """t1 completed on its first attempt; t2's first worker crashed (its attempt ran
    out), the second completed it; t3 failed its only attempt (dead-lettered); t4 is
    still ready at the end (no worker left)."""
    h = QHist()
    h.put("t1", 1.0)
    h.put("t2", 1.0)
    h.put("t3", 1.0, max_attempts=1)
    h.put("t4", 1.0)
    h.claim("w1", "t1", 1.2, token=10, attempt=1)
    h.heartbeat("w1", "t1", 10, 1.8)
    h.attempt_op("w1", "q.complete", "t1", 10, 2.0, result={"by": "w1"})
    h.claim("w2", "t2", 1.2, token=11, attempt=1)  # w2 crashes: held to 3.13
    h.events.append({"type": "q.note", "t": 1.5, "what": "crash", "process": "w2", "task": "t2"})
    h.claim("w3", "t2", 3.5, token=20, attempt=2)
    h.attempt_op("w3", "q.complete", "t2", 20, 4.0, result={"by": "w3"})
    h.claim("w1", "t3", 2.5, token=15, attempt=1)
    h.attempt_op("w1", "q.fail", "t3", 15, 2.7, error="boom")
    h.get("t1", 10.0, status="completed", attempts=1, result={"by": "w1"})
    h.get("t2", 10.0, status="completed", attempts=2, result={"by": "w3"})
    h.get("t3", 10.0, status="dead", attempts=1, reason="attempts")
    h.get("t4", 10.0, status="ready", attempts=0, reason="never claimed: workers stopped")
    h.dead(10.2, [{"task": "t3", "attempts": 1, "reason": "attempts"}])
    return h


def verdicts(h: QHist) -> dict[str, Any]:
    return {name: r["valid"] for name, r in h.check().items()}


def kinds(result: dict[str, Any]) -> list[str]:
    return [v["kind"] for v in result["violations"]]


def test_a_good_history_passes_every_queue_checker() -> None:
    results = good().check()
    assert {name: r["valid"] for name, r in results.items()} == dict.fromkeys(
        queue_checker.CHECKERS, True
    )
    assert results["queue_lost_put"]["stats"]["final"] == {"completed": 2, "dead": 1, "ready": 1}
    assert results["queue_one_completion"]["stats"]["completions_accepted"] == 2


def test_the_registry_runs_the_queue_checkers_and_a_violation_fails_the_run() -> None:
    h = good()
    h.claim("w9", "t1", 1.5, token=30, attempt=2)  # t1 handed to w9 while w1 holds it
    out = checker.check(h.events, checker.Params(rho=RHO, margin=MARGIN))
    assert set(queue_checker.CHECKERS) <= set(out["checkers"])
    assert out["checkers"]["queue_exclusive"]["valid"] is False
    assert out["valid"] is False
    assert out["checkers"]["history"]["valid"] is True  # queue ops are known operations


def test_a_lease_only_history_has_no_queue_checkers() -> None:
    events: list[Event] = [{"type": "meta", "t": 0.0, "rho": RHO, "margin": MARGIN}]
    out = checker.check(events)
    assert not set(queue_checker.CHECKERS) & set(out["checkers"])


# ------------------------------------------------------------------ origin


def origin(h: QHist) -> dict[str, Any]:
    return h.check()["queue_origin"]


def unanswered_put(h: QHist, payload: str, t: float, type: str = "info") -> str:
    """A put whose answer never came (``info``), or one refused definitely (``fail``)."""
    args = {"payload": payload, "max_attempts": 3}
    if type == "info":
        return h.op("prod", "q.put", t, None, args=args)
    return h.op("prod", "q.put", t, t + 0.1, args=args, type=type, error="INVALID_ARGUMENT")


def test_origin_a_claimed_task_nobody_put_fails() -> None:
    """The hole issue 37 found: a task no put created, claimed (and completed)."""
    h = good()
    h.claim("w1", "t9", 5.0, token=40, attempt=1, payload="ghost-1")
    h.attempt_op("w1", "q.complete", "t9", 40, 5.3, result={"by": "w1"})
    result = origin(h)
    assert result["valid"] is False
    assert kinds(result) == ["task claimed that no put could have created"]
    # Without a payload to go by, and no put whose outcome is unknown: still nobody's.
    h = good()
    h.claim("w1", "t9", 5.0, token=40, attempt=1)
    assert kinds(origin(h)) == ["task claimed that no put could have created"]
    # An accepted completion of a task no claim and no put shows: the same.
    h = good()
    h.attempt_op("w1", "q.complete", "t8", 41, 5.3, result={"by": "w1"})
    assert kinds(origin(h)) == ["task claimed that no put could have created"]
    # The clean history passes (every claim's task was put, and put first).
    assert origin(good())["valid"] is True
    assert origin(good())["stats"]["from_acknowledged_put"] == 3


def test_origin_a_put_whose_outcome_is_unknown_may_have_created_the_task() -> None:
    h = good()
    unanswered_put(h, "qp1-7", 4.0)
    h.claim("w1", "t7", 5.0, token=40, attempt=1, payload="qp1-7")
    result = origin(h)
    assert result["valid"] is True, result
    assert result["stats"]["from_unanswered_put"] == 1
    # But not a put refused definitely: it created nothing.
    h = good()
    unanswered_put(h, "qp1-7", 4.0, type="fail")
    h.claim("w1", "t7", 5.0, token=40, attempt=1, payload="qp1-7")
    assert kinds(origin(h)) == ["task claimed that no put could have created"]
    # Nor one invoked after the task was handed out.
    h = good()
    h.claim("w1", "t7", 5.0, token=40, attempt=1, payload="qp1-7")
    unanswered_put(h, "qp1-7", 5.5)
    assert kinds(origin(h)) == ["task claimed that no put could have created"]
    # One put creates one task: its payload on two task ids is a violation.
    h = good()
    unanswered_put(h, "qp1-7", 4.0)
    h.claim("w1", "t7", 5.0, token=40, attempt=1, payload="qp1-7")
    h.claim("w2", "t8", 5.0, token=41, attempt=1, payload="qp1-7")
    assert kinds(origin(h)) == ["one put's payload on two tasks"]
    # No payload recorded, and a put on the queue whose outcome is unknown: the history
    # cannot tie the task to it, nor rule it out.
    h = good()
    unanswered_put(h, "qp1-7", 4.0)
    h.claim("w1", "t7", 5.0, token=40, attempt=1)
    assert origin(h)["valid"] == "unknown"


def test_origin_a_task_that_is_not_what_its_put_was_answered_with_fails() -> None:
    # The payload of the put answered with t1, on another task id: one put, two tasks.
    h = good()
    h.claim("w1", "t7", 5.0, token=40, attempt=1, payload="payload-t1-1.0")
    assert kinds(origin(h)) == ["task carries the payload of a put answered with another task id"]
    # t4 handed out with a payload t4's put did not send (t3's).
    h = good()
    h.claim("w9", "t4", 5.0, token=40, attempt=1, payload="payload-t3-1.0")
    assert "claimed task's payload is not its put's" in kinds(origin(h))
    # A put answered with t5, invoked only after t5 had been handed out.
    h = good()
    h.claim("w1", "t5", 5.0, token=40, attempt=1)
    h.put("t5", 6.0)
    assert kinds(origin(h)) == ["task handed out before any put of it was invoked"]
    # Nothing handed out at all: nothing to judge, never a pass.
    h = QHist()
    h.put("t1", 1.0)
    assert origin(h)["valid"] == "unknown"


# -------------------------------------------------------------- lost puts


def test_an_acknowledged_put_the_cluster_forgot_is_lost() -> None:
    h = good()
    h.put("t5", 2.0)
    h.get("t5", 10.0, type="fail", error="TASK_NOT_FOUND")
    result = h.check()["queue_lost_put"]
    assert result["valid"] is False
    assert kinds(result) == ["acknowledged put lost: the cluster no longer knows it"]


def test_two_payloads_answered_with_one_task_id_is_a_lost_put() -> None:
    h = good()
    h.put("t1", 1.5)  # another payload, the same id: one of the two is gone
    assert kinds(h.check()["queue_lost_put"]) == [
        "puts of different payloads answered with one task id"
    ]


@pytest.mark.parametrize(
    "breakage",
    ["no final read", "pending without reason", "unknown status", "put without id", "no answer"],
)
def test_lost_put_is_unknown_when_it_cannot_see_the_end(breakage: str) -> None:
    h = good()
    if breakage == "no final read":
        h.put("t5", 2.0)
    elif breakage == "pending without reason":
        h.put("t5", 2.0)
        h.get("t5", 10.0, status="delayed", attempts=1)
    elif breakage == "unknown status":
        h.put("t5", 2.0)
        h.get("t5", 10.0, status="somewhere", attempts=1, reason="?")
    elif breakage == "put without id":
        h.put(None, 2.0)
    else:
        h.put("t5", 2.0)
        h.get("t5", 10.0, type="info")
    assert h.check()["queue_lost_put"]["valid"] == "unknown"


def test_lost_put_is_unknown_with_nothing_put() -> None:
    h = QHist()
    h.dead(10.0, [])
    assert h.check()["queue_lost_put"]["valid"] == "unknown"


# --------------------------------------------------------- one completion


def purged(h: QHist, task: str, read_at: float, status: str = "completed") -> QHist:
    """The soak janitor's steps for ``task``: a read that finds it ``status``, then an
    acknowledged purge; the final read finds nothing."""
    h.events = [e for e in h.events if not (e.get("f") == "q.get" and f"'{task}'" in str(e))]
    h.op(
        "qj",
        "q.get",
        read_at,
        read_at + 0.05,
        args={"task": task, "final": False},
        value={"status": status, "attempts": 1},
    )
    h.op("qj", "q.purge", read_at + 0.1, read_at + 0.15, args={"task": task})
    h.get(task, 10.0, type="fail", error="TASK_NOT_FOUND")
    return h


def test_a_task_purged_after_it_was_read_finished_is_not_lost() -> None:
    results = purged(purged(good(), "t1", 5.0), "t3", 5.0, status="dead").check()
    assert {name: r["valid"] for name, r in results.items()} == dict.fromkeys(
        queue_checker.CHECKERS, True
    ), {k: (v["violations"], v["unknown"]) for k, v in results.items()}
    assert results["queue_lost_put"]["stats"]["final"] == {
        "completed": 1,
        "purged": 2,
        "ready": 1,
    }


def test_a_purge_excuses_nothing_without_a_read_that_saw_the_task_finished() -> None:
    # t4 was pending: a purge of it (had the cluster taken it) loses an acknowledged put.
    h = good()
    h.events = [e for e in h.events if not (e.get("f") == "q.get" and "'t4'" in str(e))]
    h.op("qj", "q.get", 5.0, 5.05, args={"task": "t4", "final": False}, value={"status": "ready"})
    h.op("qj", "q.purge", 5.1, 5.15, args={"task": "t4"})
    h.get("t4", 10.0, type="fail", error="TASK_NOT_FOUND")
    assert kinds(h.check()["queue_lost_put"]) == [
        "acknowledged put lost: the cluster no longer knows it"
    ]
    # A read that answered only after the purge was invoked is no evidence either.
    h = good()
    h.events = [e for e in h.events if not (e.get("f") == "q.get" and "'t1'" in str(e))]
    h.op("qj", "q.purge", 5.0, 5.3, args={"task": "t1"})
    h.op(
        "qj", "q.get", 4.9, 5.2, args={"task": "t1", "final": False}, value={"status": "completed"}
    )
    h.get("t1", 10.0, type="fail", error="TASK_NOT_FOUND")
    assert h.check()["queue_lost_put"]["valid"] is False


def test_a_definitely_refused_purge_excuses_nothing() -> None:
    h = purged(good(), "t1", 5.0)
    for e in h.events:
        if e.get("f") == "q.purge" and e["type"] == "ok":
            e.update(type="fail", error="INVALID_ARGUMENT")
    assert h.check()["queue_lost_put"]["valid"] is False


def test_an_acknowledged_purge_undone_fails() -> None:
    h = purged(good(), "t1", 5.0)
    h.events = [
        e
        for e in h.events
        if not (e.get("f") == "q.get" and e.get("process") == "final" and "'t1'" in str(e))
    ]
    h.get("t1", 10.0, status="completed", attempts=1, result={"by": "w1"})
    assert kinds(h.check()["queue_lost_put"]) == [
        "acknowledged purge undone: the final read finds the task"
    ]


def test_a_purge_without_a_task_id_is_unknown() -> None:
    h = good()
    h.op("qj", "q.purge", 5.0, 5.1, args={})
    assert h.check()["queue_lost_put"]["valid"] == "unknown"


def test_two_accepted_completions_of_one_task_fail() -> None:
    h = good()
    h.attempt_op("w1", "q.complete", "t1", 10, 2.5, result={"by": "w1"})
    assert "two completions accepted for one task" in kinds(h.check()["queue_one_completion"])


def test_a_completion_from_a_stale_attempt_accepted_fails() -> None:
    """The zombie: w2's attempt (token 11) was replaced by w3's (token 20, granted at
    3.6); w2 wakes at 5.0 and its completion is accepted."""
    h = good()
    h.attempt_op("w2", "q.complete", "t2", 11, 5.0, result={"by": "w2"})
    result = h.check()["queue_one_completion"]
    assert result["valid"] is False
    assert "q.complete accepted from a stale attempt" in kinds(result)


def test_a_stale_completion_refused_passes_and_is_counted() -> None:
    h = good()
    h.attempt_op(
        "w2", "q.complete", "t2", 11, 5.0, type="fail", error="STALE_ATTEMPT", result={"by": "w2"}
    )
    result = h.check()["queue_one_completion"]
    assert result["valid"] is True
    assert result["stats"]["stale_refused"] == 1


@pytest.mark.parametrize("f", ["q.heartbeat", "q.fail"])
def test_a_heartbeat_or_failure_from_a_stale_attempt_accepted_fails(f: str) -> None:
    h = good()
    if f == "q.heartbeat":
        h.heartbeat("w2", "t2", 11, 5.0)
    else:
        h.attempt_op("w2", "q.fail", "t2", 11, 5.0, error="late")
    assert f"{f} accepted from a stale attempt" in kinds(h.check()["queue_one_completion"])


def test_a_final_result_that_is_not_the_accepted_one_fails() -> None:
    h = good()
    h.events = [e for e in h.events if not (e.get("f") == "q.get" and "t2" in str(e))]
    h.get("t2", 10.0, status="completed", attempts=2, result={"by": "w2"})
    assert kinds(h.check()["queue_one_completion"]) == [
        "final result is not the accepted completion's"
    ]


def test_an_accepted_completion_lost_fails() -> None:
    h = good()
    h.events = [e for e in h.events if not (e.get("f") == "q.get" and "t1" in str(e))]
    h.get("t1", 10.0, status="ready", attempts=1, reason="backoff")
    assert "accepted completion lost" in kinds(h.check()["queue_one_completion"])


def test_one_completion_is_unknown_without_a_result_or_a_final_read() -> None:
    h = good()
    h.events = [e for e in h.events if not (e.get("f") == "q.get" and "t1" in str(e))]
    assert h.check()["queue_one_completion"]["valid"] == "unknown"
    h = good()
    h.attempt_op("w3", "q.complete", "t4", 99, 6.0)  # no result in the invocation
    assert h.check()["queue_one_completion"]["valid"] == "unknown"


# ---------------------------------------------------------------- exclusive


def test_two_workers_holding_one_task_at_once_fail() -> None:
    h = good()
    h.claim("w9", "t1", 1.5, token=30, attempt=2)
    result = h.check()["queue_exclusive"]
    assert result["valid"] is False
    assert result["violations"][0]["holders"] == [
        {"process": "w1", "token": 10},
        {"process": "w9", "token": 30},
    ]


def test_a_heartbeat_extends_the_holding_window() -> None:
    """w1 claims t4 at 1.0 (own expiry 2.93) and heartbeats at 2.5 (to 4.43); a claim
    by w9 at 4.0 overlaps the extension, one at 4.5 does not."""
    h = good()
    h.claim("w1", "t4", 1.0, token=40, attempt=1)
    h.heartbeat("w1", "t4", 40, 2.5)
    h.claim("w9", "t4", 4.5, token=41, attempt=2)
    assert h.check()["queue_exclusive"]["valid"] is True
    h.claim("w8", "t4", 4.0, token=42, attempt=3)
    assert h.check()["queue_exclusive"]["valid"] is False


def test_a_release_ends_the_holding_window() -> None:
    h = good()
    h.claim("w1", "t4", 1.0, token=40, attempt=1)
    h.attempt_op("w1", "q.release", "t4", 40, 1.5)
    h.claim("w9", "t4", 1.7, token=41, attempt=1)
    assert h.check()["queue_exclusive"]["valid"] is True


@pytest.mark.parametrize("drop", ["valid_until", "token", "attempt"])
def test_a_claim_without_its_window_or_token_is_unknown(drop: str) -> None:
    h = good()
    h.claim("w9", "t4", 6.0, token=50, attempt=1, drop=(drop,))
    assert h.check()["queue_exclusive"]["valid"] == "unknown"
    assert h.check()["queue_tokens"]["valid"] == "unknown"


def test_a_heartbeat_without_valid_until_is_unknown() -> None:
    h = good()
    h.op("w1", "q.heartbeat", 1.5, 1.6, args={"task": "t1", "token": 10}, value={})
    assert h.check()["queue_exclusive"]["valid"] == "unknown"


def test_exclusive_is_unknown_with_no_attempt() -> None:
    h = QHist()
    h.put("t1", 1.0)
    assert h.check()["queue_exclusive"]["valid"] == "unknown"


# ------------------------------------------------------------------- tokens


def test_a_later_attempt_with_a_lower_token_fails() -> None:
    h = good()
    h.claim("w9", "t4", 5.0, token=60, attempt=1)
    h.claim("w8", "t4", 8.0, token=59, attempt=2)
    assert kinds(h.check()["queue_tokens"]) == ["attempt token did not increase"]


def test_a_later_attempt_with_a_lower_attempt_number_fails() -> None:
    h = good()
    h.claim("w9", "t4", 5.0, token=60, attempt=2)
    h.claim("w8", "t4", 8.0, token=61, attempt=2)
    assert kinds(h.check()["queue_tokens"]) == ["attempt number did not increase"]


def test_one_token_for_two_attempts_fails_across_tasks() -> None:
    h = good()
    h.claim("w9", "t4", 5.0, token=20, attempt=1)  # t2's attempt had token 20
    assert kinds(h.check()["queue_tokens"]) == ["one token handed to two attempts"]


def test_concurrent_claims_need_no_order() -> None:
    """Two claims of one task whose calls overlap: either may be the later (the
    exclusivity rule judges whether both were held)."""
    h = QHist()
    h.put("t1", 0.5)
    h.op(
        "w1",
        "q.claim",
        1.0,
        1.5,
        args={"worker": "w1"},
        value={"task": "t1", "token": 9, "attempt": 2, "lease_id": "a", "valid_until": 1.1},
    )
    h.op(
        "w2",
        "q.claim",
        1.05,
        1.3,
        args={"worker": "w2"},
        value={"task": "t1", "token": 7, "attempt": 1, "lease_id": "b", "valid_until": 1.1},
    )
    assert h.check()["queue_tokens"]["valid"] is True


# -------------------------------------------------------------- dead letters


def test_a_task_dead_lettered_before_its_last_attempt_fails() -> None:
    h = good()
    h.dead(10.4, [{"task": "t4", "attempts": 0, "reason": "attempts"}])
    assert "dead-lettered before using all its attempts" in kinds(h.check()["queue_dead_letter"])


def test_a_dead_letter_with_more_attempts_than_the_history_shows_fails() -> None:
    h = good()
    h.put("t6", 1.0, max_attempts=2)
    h.claim("w5", "t6", 6.0, token=70, attempt=1)
    h.dead(10.4, [{"task": "t6", "attempts": 2, "reason": "attempts"}])
    assert kinds(h.check()["queue_dead_letter"]) == [
        "dead-letter entry counts attempts the history cannot account for"
    ]


def test_an_unanswered_claim_may_be_the_missing_attempt() -> None:
    h = good()
    h.put("t6", 1.0, max_attempts=2)
    h.claim("w5", "t6", 6.0, token=70, attempt=1)
    h.op("w6", "q.claim", 7.0, None, args={"worker": "w6"})  # no answer: maybe attempt 2
    h.dead(10.4, [{"task": "t6", "attempts": 2, "reason": "attempts"}])
    assert h.check()["queue_dead_letter"]["valid"] is True


def test_an_empty_claim_that_waited_may_be_the_missing_attempt() -> None:
    """A claim granted as its wait ran out is given back by the client (a release) and
    answered "nothing": that attempt counts in the task's ``attempts`` (seen in a
    smoke run, issue 37). One that did not wait was never queued, so it accounts for
    nothing."""
    h = good()
    h.put("t6", 1.0, max_attempts=2)
    h.claim("w5", "t6", 6.0, token=70, attempt=1)
    h.op("w6", "q.claim", 7.0, 8.0, args={"worker": "w6", "wait": 1.0}, value={"task": None})
    h.dead(10.4, [{"task": "t6", "attempts": 2, "reason": "attempts"}])
    assert h.check()["queue_dead_letter"]["valid"] is True
    h = good()
    h.put("t6", 1.0, max_attempts=2)
    h.claim("w5", "t6", 6.0, token=70, attempt=1)
    h.op("w6", "q.claim", 7.0, 7.1, args={"worker": "w6", "wait": 0}, value={"task": None})
    h.dead(10.4, [{"task": "t6", "attempts": 2, "reason": "attempts"}])
    assert kinds(h.check()["queue_dead_letter"]) == [
        "dead-letter entry counts attempts the history cannot account for"
    ]


def test_deadline_dead_letters() -> None:
    h = good()
    h.put("t7", 1.0, deadline=5.0)
    h.dead(10.4, [{"task": "t7", "attempts": 0, "reason": "deadline"}])
    assert h.check()["queue_dead_letter"]["valid"] is True
    early = good()
    early.put("t7", 1.0, deadline=5.0)
    early.dead(3.0, [{"task": "t7", "attempts": 0, "reason": "deadline"}])
    assert kinds(early.check()["queue_dead_letter"]) == [
        "dead-lettered for its deadline before the deadline"
    ]
    none = good()
    none.dead(10.4, [{"task": "t4", "attempts": 0, "reason": "deadline"}])
    assert kinds(none.check()["queue_dead_letter"]) == [
        "dead-lettered for a deadline its put did not have"
    ]


def test_a_dead_letter_nobody_put_or_already_completed_fails() -> None:
    h = good()
    h.dead(10.4, [{"task": "ghost", "attempts": 3, "reason": "attempts"}])
    assert kinds(h.check()["queue_dead_letter"]) == ["dead-letter list holds a task nobody put"]
    done = good()
    done.dead(10.4, [{"task": "t1", "attempts": 1, "reason": "deadline"}])
    assert "completed task in the dead-letter list" in kinds(done.check()["queue_dead_letter"])


def test_a_dead_letter_of_an_unanswered_put_is_judged_by_its_payload() -> None:
    """A put whose answer was lost has no task id in the history; the dead-letter
    entry's payload (the workload records it) finds the put, so the entry is judged,
    not ``unknown``."""

    def lost_put(used: int) -> QHist:
        h = good()
        h.op("prod", "q.put", 2.0, 2.5, args={"payload": "p-lost", "max_attempts": 2}, type="info")
        h.claim("w1", "t9", 3.0, token=40, attempt=1)
        h.attempt_op("w1", "q.fail", "t9", 40, 3.2, error="boom")
        h.claim("w2", "t9", 4.0, token=41, attempt=2)
        h.attempt_op("w2", "q.fail", "t9", 41, 4.2, error="boom")
        h.get("t9", 10.0, status="dead", attempts=used, reason="attempts", payload="p-lost")
        row = {"task": "t9", "attempts": used, "reason": "attempts", "payload": "p-lost"}
        h.events = [e for e in h.events if e.get("f") != "q.dead"]
        h.dead(10.2, [{"task": "t3", "attempts": 1, "reason": "attempts"}, row])
        return h

    assert lost_put(2).check()["queue_dead_letter"]["valid"] is True
    assert (
        kinds(lost_put(1).check()["queue_dead_letter"])
        == ["dead-lettered before using all its attempts"] * 2
    )  # the list's entry and the final read's
    # Without the payload the entry cannot be matched to a put: unknown, never a pass.
    h = lost_put(2)
    for e in h.events:
        for row in (e.get("value") or {}).get("tasks") or []:
            row.pop("payload", None)
    h.events = [e for e in h.events if not (e.get("f") == "q.get" and "'t9'" in str(e))]
    assert h.check()["queue_dead_letter"]["valid"] == "unknown"


def test_dead_letters_are_unknown_without_a_final_list_or_a_reason() -> None:
    h = good()
    h.events = [e for e in h.events if e.get("f") != "q.dead"]
    assert h.check()["queue_dead_letter"]["valid"] == "unknown"
    bad = good()
    bad.dead(10.4, [{"task": "t3", "attempts": 1}])
    assert bad.check()["queue_dead_letter"]["valid"] == "unknown"
    also = good()
    also.dead(10.4, [{"attempts": 1, "reason": "attempts"}])
    assert also.check()["queue_dead_letter"]["valid"] == "unknown"
