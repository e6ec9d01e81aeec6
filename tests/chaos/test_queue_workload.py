"""The chaos suite's queue workload (jepsen-style/queue_workload.py) against an in-process
queue, then the queue checkers on what it recorded.

No cluster: ``FakeQueue`` keeps tasks with the semantics of issue 12 on this process's
monotonic clock (attempt expiry, progress-aware expiry, retries, dead letters, stale
attempts refused). It shows the workload's history is complete enough for every queue
checker to decide (all ``True`` on the honest fake) and that the checkers catch the
bugs the planted node builds have (a completion accepted from a stale attempt; a task
handed to two workers) in what this workload records. The real runs are in
tests/chaos/test_chaos.py.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SUITE = Path(__file__).resolve().parents[2] / "jepsen-style"
sys.path.insert(0, str(SUITE))

import checker  # noqa: E402
import queue_checker  # noqa: E402
from queue_workload import (  # noqa: E402
    Janitor,
    Producer,
    QueueConfig,
    QueueWorker,
    final_reads_on,
)
from workload import History  # noqa: E402

from raftlease.errors import RaftLeaseError  # noqa: E402

pytestmark = pytest.mark.timeout(300)


class Stale(RaftLeaseError):
    code = "STALE_ATTEMPT"
    definite = True


class NotFound(RaftLeaseError):
    code = "TASK_NOT_FOUND"
    definite = True


class Pending(RaftLeaseError):
    code = "INVALID_ARGUMENT"
    definite = True


class FakeTask:
    def __init__(self, queue: FakeQueue, tid: str, aid: int, token: int, number: int) -> None:
        self.queue, self.tid, self.aid, self.token, self.attempt = queue, tid, aid, token, number
        self.lease_id = f"aid-{aid}"
        self.payload = queue.tasks[tid]["payload"]

    def heartbeat(self, progress: Any = None) -> None:
        self.queue.attempt_op(self, "heartbeat", progress)

    def complete(self, result: Any = None) -> None:
        self.queue.attempt_op(self, "complete", result)

    def fail(self, error: str = "") -> None:
        self.queue.attempt_op(self, "fail", error)

    def release(self) -> None:
        self.queue.attempt_op(self, "release", None)


class FakeQueue:
    """Issue 12's task semantics in one process (one lock; log time = monotonic).
    ``bug``: ``stale_completion`` accepts any attempt's call while its task is
    claimed; ``double_grant`` hands a claimed task out again; ``purge_pending`` purges
    a pending task too (the newest one) with every purge; ``phantom`` hands out, at
    every fifth claim, a task nobody put."""

    def __init__(self, bug: str = "") -> None:
        self.lock = threading.Lock()
        self.bug = bug
        self.tasks: dict[str, dict[str, Any]] = {}
        self.revision = 0
        self.aids = 0
        self.puts = 0
        self.claims = 0

    def queue(self, name: str) -> FakeQueue:
        return self

    def _tick(self, now: float) -> None:
        for task in self.tasks.values():
            if task["status"] == "claimed" and now >= task["expires"]:
                self._failed(task, now)
            if task["status"] in ("ready", "delayed") and task["deadline"] <= now:
                task.update(status="dead", dead_reason="deadline passed")
            if task["status"] == "delayed" and task["ready_at"] <= now:
                task["status"] = "ready"

    def _failed(self, task: dict[str, Any], now: float) -> None:
        task["failures"] += 1
        task["current"] = None
        if task["failures"] >= task["max_attempts"]:
            task.update(status="dead", dead_reason=f"failed {task['failures']} attempts")
        else:
            task.update(status="delayed", ready_at=now + 0.05)

    def put(self, payload: Any, **options: Any) -> str:
        with self.lock:
            now = time.monotonic()
            self.puts += 1
            tid = f"t{self.puts}"  # never reused, even after a purge
            delay = float(options.get("delay", 0.0))
            self.tasks[tid] = {
                "payload": payload,
                "status": "delayed" if delay else "ready",
                "ready_at": now + delay,
                "deadline": now + float(options.get("deadline") or 1e9),
                "max_attempts": options["max_attempts"],
                "pt": options.get("progress_timeout"),
                "attempts": 0,
                "failures": 0,
                "current": None,
                "expires": 0.0,
                "result": None,
                "dead_reason": "",
            }
            return tid

    def claim(self, worker: str, wait: float, lease_ttl: float) -> FakeTask | None:
        end = time.monotonic() + wait
        while True:
            with self.lock:
                now = time.monotonic()
                self._tick(now)
                self.claims += 1
                if self.bug == "phantom" and self.claims % 5 == 0:
                    # A task that appears from nowhere (no put), ready to be handed out.
                    self.puts += 1
                    tid = f"ghost{self.puts}"
                    self.tasks[tid] = {
                        "payload": {"id": f"ghost-{self.puts}", "n": 0, "pt": None},
                        "status": "ready",
                        "ready_at": now,
                        "deadline": now + 1e9,
                        "max_attempts": 3,
                        "pt": None,
                        "attempts": 0,
                        "failures": 0,
                        "current": None,
                        "expires": 0.0,
                        "result": None,
                        "dead_reason": "",
                    }
                    # Handed out first, so the claim below takes it.
                    self.tasks = {tid: self.tasks.pop(tid), **self.tasks}
                statuses = ("ready", "claimed") if self.bug == "double_grant" else ("ready",)
                for tid, task in self.tasks.items():
                    if task["status"] in statuses:
                        ttl = min(lease_ttl, task["pt"] or lease_ttl)
                        self.revision += 1
                        self.aids += 1
                        task.update(
                            status="claimed",
                            token=self.revision,
                            current=self.aids,
                            expires=now + ttl,
                            attempts=task["attempts"] + 1,
                            ttl=ttl,
                        )
                        return FakeTask(self, tid, self.aids, self.revision, task["attempts"])
            if time.monotonic() >= end:
                return None
            time.sleep(0.01)

    def attempt_op(self, attempt: FakeTask, op: str, arg: Any) -> None:
        with self.lock:
            now = time.monotonic()
            self._tick(now)
            task = self.tasks[attempt.tid]
            current = task["current"] == attempt.aid
            if self.bug == "stale_completion" and task["status"] == "claimed":
                current = True
            if not current:
                raise Stale("not the current attempt")
            if op == "heartbeat":
                if not task["pt"]:
                    task["expires"] = max(task["expires"], now + task["ttl"])
            elif op == "complete":
                task.update(status="completed", result=arg, current=None)
            elif op == "fail":
                self._failed(task, now)
            else:
                task.update(status="ready", current=None)

    def get(self, tid: str) -> dict[str, Any]:
        with self.lock:
            self._tick(time.monotonic())
            if tid not in self.tasks:
                raise NotFound(tid)
            task = self.tasks[tid]
            return {**task, "tid": tid}

    def purge(self, tid: str) -> None:
        with self.lock:
            self._tick(time.monotonic())
            if tid not in self.tasks:
                raise NotFound(tid)
            if self.tasks[tid]["status"] not in ("completed", "dead"):
                raise Pending(tid)
            del self.tasks[tid]
            if self.bug == "purge_pending":
                pending = [t for t, v in self.tasks.items() if v["status"] in ("ready", "delayed")]
                if pending:
                    del self.tasks[pending[-1]]

    def dead(self, limit: int = 100) -> list[dict[str, Any]]:
        with self.lock:
            self._tick(time.monotonic())
            return [{**t, "tid": tid} for tid, t in self.tasks.items() if t["status"] == "dead"]


def run_workload(
    fake: FakeQueue, seconds: float = 3.0, seed: int = 1, purge_after: float = 0.0
) -> list[dict[str, Any]]:
    """Producer + three workers against ``fake`` for ``seconds`` (and the janitor, with
    ``purge_after``), then the final reads; stalls and failures more often than in a
    chaos run, so a short run has them."""
    config = QueueConfig(
        purge_after=purge_after,
        purge_every=0.05,
        put_every=(0.01, 0.03),
        p_stall=0.2,
        p_fail=0.15,
        work=(0.01, 0.1),
        claim_wait=0.2,
        lease_ttls=(0.3, 0.5),
        progress_timeout=0.3,
        stall_extra=0.3,
    )
    history = History()
    history.append(
        {
            "type": "meta",
            "t": time.monotonic(),
            "rho": 0.01,
            "margin": 0.05,
            "queues": config.meta(),
        }
    )
    stop = threading.Event()
    acknowledged: list[str] = []
    actors: list[Any] = [Producer("qp1", fake, history.append, config, seed, acknowledged)]  # type: ignore[arg-type]
    actors += [
        QueueWorker(f"qw{i}", fake, history.append, config, seed + i)  # type: ignore[arg-type]
        for i in range(3)
    ]
    if purge_after:
        actors.append(Janitor(fake, history.append, config, acknowledged))  # type: ignore[arg-type]
    threads = [threading.Thread(target=a.run, args=(stop,), daemon=True) for a in actors]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(timeout=20)
    final_reads_on(fake, history, config, acknowledged, budget=10)
    return history.snapshot()


def results(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    ops = checker.pair_ops(events)
    return queue_checker.check_queues(events, ops, checker.Params(rho=0.01, margin=0.05))


#: A run is threads against wall time: on a loaded machine a short one may miss the
#: stall, the dead letter or the late completion a check needs. Each test runs again
#: (longer, another seed) until the run has them, up to this many times; what must hold
#: (every checker valid on the honest queue) is asserted on every run.
TRIES = 4


def _runs(
    bug: str = "", purge_after: float = 0.0
) -> Iterator[tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]]:
    for attempt in range(TRIES):
        events = run_workload(
            FakeQueue(bug=bug),
            seconds=3.0 + 2.0 * attempt,
            seed=1 + attempt,
            purge_after=purge_after,
        )
        yield events, results(events)


def _volume(events: list[dict[str, Any]], out: dict[str, dict[str, Any]]) -> list[str]:
    """What an honest run lacks for the test to mean something (empty: nothing)."""
    notes = queue_checker.queue_stats(events, queue_checker.queue_ops(checker.pair_ops(events)))
    final = out["queue_lost_put"]["stats"]["final"]
    wanted = {
        "a stall": notes["notes"].get("stall", 0) > 0,
        "a stuck worker": notes["notes"].get("stuck", 0) > 0,
        "20 completions": final.get("completed", 0) > 20,
        "a dead letter": final.get("dead", 0) > 0,
        "a deadline dead letter": out["queue_dead_letter"]["stats"]["by_reason"].get("deadline", 0)
        > 0,
        "a stale call refused": out["queue_one_completion"]["stats"]["stale_refused"] > 0,
    }
    return [what for what, ok in wanted.items() if not ok]


def test_the_workload_against_an_honest_queue_passes_every_queue_checker() -> None:
    missing: list[str] = []
    for events, out in _runs():
        assert {k: v["valid"] for k, v in out.items()} == dict.fromkeys(
            queue_checker.CHECKERS, True
        ), {k: (v["violations"][:3], v["unknown"][:3]) for k, v in out.items()}
        # The whole registry agrees: queue ops are well-formed history for checker.check.
        assert checker.check(events)["checkers"]["history"]["valid"] is True
        missing = _volume(events, out)
        if not missing:
            return
    pytest.fail(f"{TRIES} honest runs and still no {', '.join(missing)}")


def test_a_queue_accepting_stale_completions_is_caught() -> None:
    stale = {
        "q.complete accepted from a stale attempt",
        "q.heartbeat accepted from a stale attempt",
        "q.fail accepted from a stale attempt",
    }
    for _events, out in _runs("stale_completion"):
        verdict = out["queue_one_completion"]
        if verdict["valid"] is False and stale & {v["kind"] for v in verdict["violations"]}:
            return
    pytest.fail(f"a queue accepting stale completions was not caught in {TRIES} runs")


def test_a_queue_granting_one_task_twice_is_caught() -> None:
    for _events, out in _runs("double_grant"):
        if out["queue_exclusive"]["valid"] is False:
            return
    pytest.fail(f"a queue granting one task twice was not caught in {TRIES} runs")


def test_a_queue_handing_out_a_task_nobody_put_is_caught() -> None:
    """issue 37: before ``queue_origin`` this history passed every queue checker."""
    for _events, out in _runs("phantom"):
        verdict = out["queue_origin"]
        if verdict["valid"] is False and "task claimed that no put could have created" in {
            v["kind"] for v in verdict["violations"]
        }:
            return
    pytest.fail(f"a queue handing out unput tasks was not caught in {TRIES} runs")


def test_the_soak_janitor_purges_finished_tasks_and_every_checker_still_decides() -> None:
    """With the janitor (the soak profile's), finished tasks go while the run goes on;
    the checkers stay valid and count them as purged, not lost."""
    for _events, out in _runs(purge_after=0.3):
        assert {k: v["valid"] for k, v in out.items()} == dict.fromkeys(
            queue_checker.CHECKERS, True
        ), {k: (v["violations"][:3], v["unknown"][:3]) for k, v in out.items()}
        final = out["queue_lost_put"]["stats"]["final"]
        if final.get("purged", 0) > 10 and final.get("completed", 0) + final.get("dead", 0) > 0:
            return
    pytest.fail(f"{TRIES} runs with the janitor and never 10 purged plus a finished task left")


def test_a_purge_that_takes_a_pending_task_is_caught() -> None:
    """A purge excuses only the task it was asked for, once seen finished: a cluster
    that purges a pending task with it has lost an acknowledged put."""
    for _events, out in _runs("purge_pending", purge_after=0.3):
        if out["queue_lost_put"]["valid"] is False:
            return
    pytest.fail(f"a purge taking a pending task was not caught in {TRIES} runs")
