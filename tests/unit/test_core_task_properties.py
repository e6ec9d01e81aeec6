"""Property tests of the task queues in ``LeaseStore`` against a small reference model
(core/queue.py, issue 12).

Hypothesis generates histories of puts (priorities, attempt budgets, TTLs, required
capabilities), claims (offered capabilities, some waiting), heartbeats, completions,
failures and releases from current *and stale* attempts, cancelled claims, time
moving on, and snapshots restored mid-history. Backoffs are zero so that the model
needs no jitter; delays and jitter have their own unit tests (tests/unit/test_core_tasks.py).

After every step: the store's answer agrees with the model's (who gets which task,
what is refused and why), every task's status and failure count agree, and:
attempt tokens strictly increase per task, at most one completion per task is
accepted, no two live attempts ever hold the same task, and the dead-letter list
holds exactly the tasks that used all their attempts. Derandomized by the profile in
tests/conftest.py.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from raftlease.core import LeaseStore

pytestmark = pytest.mark.timeout(120)

SETTINGS = settings(phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink))

CAPS = ({}, {"gpu": "a"}, {"gpu": "b"}, {"gpu": "a", "role": "p"})
REQUIRES = ({}, {"gpu": "a"}, {"role": "p"})

Entry = dict[str, Any]


@dataclass
class MTask:
    tid: str
    priority: int
    seq: int
    requires: dict[str, str]
    max_attempts: int
    ttl: int
    status: str = "ready"
    failures: int = 0
    aid: str | None = None
    expires_at: int = 0
    #: The live attempt's TTL (the claim's override, or the task's).
    attempt_ttl: int = 0
    completions: int = 0
    tokens: list[int] = field(default_factory=list)


@dataclass
class MClaim:
    aid: str
    caps: dict[str, str]
    deadline: int
    ttl: int | None


def satisfies(caps: dict[str, str], requires: dict[str, str]) -> bool:
    return all(caps.get(k) == v for k, v in requires.items())


class Model:
    """What the queues should do, written the obvious way (lists, linear scans)."""

    def __init__(self) -> None:
        self.now = 0
        self.tasks: dict[str, MTask] = {}
        self.claims: list[MClaim] = []
        self.seq = 0

    def live(self) -> dict[str, MTask]:
        return {t.aid: t for t in self.tasks.values() if t.aid is not None}

    def advance(self, now: int) -> None:
        self.now = max(self.now, now)
        due = sorted(
            (t.expires_at, t.aid, t)
            for t in self.tasks.values()
            if t.aid and t.expires_at <= self.now
        )
        for _, _, task in due:
            task.aid = None
            self.failed(task)
        self.claims = [c for c in self.claims if c.deadline > self.now]

    def failed(self, task: MTask) -> None:
        task.failures += 1
        if task.failures >= task.max_attempts:
            task.status = "dead"
        else:
            self.make_ready(task)

    def make_ready(self, task: MTask) -> None:
        task.status = "ready"
        for claim in list(self.claims):
            if claim.deadline <= self.now:
                self.claims.remove(claim)
                continue
            if satisfies(claim.caps, task.requires):
                self.claims.remove(claim)
                self.start(task, claim.aid, claim.ttl)
                return

    def start(self, task: MTask, aid: str, ttl: int | None) -> None:
        task.status = "claimed"
        task.aid = aid
        task.attempt_ttl = ttl or task.ttl
        task.expires_at = self.now + task.attempt_ttl

    def best(self, caps: dict[str, str]) -> MTask | None:
        ready = [
            t for t in self.tasks.values() if t.status == "ready" and satisfies(caps, t.requires)
        ]
        return min(ready, key=lambda t: (-t.priority, t.seq), default=None)


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    steps: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 45))):
        dt = draw(st.sampled_from([0, 0, 20, 60, 150, 400]))
        kind = draw(
            st.sampled_from(
                [
                    "put",
                    "put",
                    "claim",
                    "claim",
                    "claim",
                    "beat",
                    "complete",
                    "fail",
                    "release",
                    "cancel",
                    "snap",
                ]
            )
        )
        if kind == "put":
            steps.append(
                (
                    kind,
                    dt,
                    draw(st.integers(-1, 1)),
                    draw(st.integers(1, 3)),
                    draw(st.sampled_from([100, 300])),
                    draw(st.integers(0, len(REQUIRES) - 1)),
                )
            )
        elif kind == "claim":
            steps.append(
                (
                    kind,
                    dt,
                    draw(st.integers(0, len(CAPS) - 1)),
                    draw(st.sampled_from([0, 0, 250, 1000])),
                    draw(st.sampled_from([None, 150])),
                )
            )
        elif kind == "snap":
            steps.append((kind, dt))
        else:
            steps.append((kind, dt, draw(st.integers(0, 50))))
    return steps


@SETTINGS
@given(steps=histories())
def test_task_queues_agree_with_the_model(steps: list[tuple[Any, ...]]) -> None:
    store = LeaseStore()
    model = Model()
    ids = itertools.count(1)
    seq = itertools.count(1)
    #: Every attempt id ever handed out (or waiting), with its task id once known.
    aids: list[str] = []
    aid_task: dict[str, str] = {}
    accepted_completions: dict[str, int] = {}
    now = 0

    def mutate(op: str, **fields: Any) -> dict[str, Any]:
        n = next(seq)
        entry: Entry = {"op": op, "now": now, "cid": f"c{n}", "seq": 1, "ack": 1, "queue": "q"}
        entry.update(fields)
        result: dict[str, Any] = store.apply(entry)
        return result

    for step in steps:
        kind, dt = step[0], step[1]
        now += dt
        model.advance(now)
        if kind == "put":
            _, _, priority, max_attempts, ttl, req = step
            tid = f"T{next(ids)}"
            model.seq += 1
            task = MTask(tid, priority, model.seq, dict(REQUIRES[req]), max_attempts, ttl)
            model.tasks[tid] = task
            model.make_ready(task)
            result = mutate(
                "task_put",
                tid=tid,
                payload="{}",
                priority=priority,
                max_attempts=max_attempts,
                ttl=ttl,
                requires=dict(REQUIRES[req]),
                backoff=0,
            )
            assert result["ok"], result
            if task.aid is not None:  # handed to a waiting claim at once
                aid_task[task.aid] = tid
        elif kind == "claim":
            _, _, cap, wait, ttl = step
            aid = f"A{next(ids)}"
            aids.append(aid)
            expected = model.best(CAPS[cap])
            fields: dict[str, Any] = {"aid": aid, "worker": "w", "caps": dict(CAPS[cap])}
            if wait:
                fields["wait"] = wait
            if ttl:
                fields["ttl"] = ttl
            result = mutate("task_claim", **fields)
            assert result["ok"], result
            if expected is not None:
                model.start(expected, aid, ttl)
                assert result["claimed"] and result["tid"] == expected.tid, (result, expected)
                aid_task[aid] = expected.tid
            else:
                assert not result["claimed"], result
                assert bool(result.get("queued")) == bool(wait)
                if wait:
                    model.claims.append(MClaim(aid, dict(CAPS[cap]), model.now + wait, ttl))
        elif kind == "snap":
            store = LeaseStore.from_plain(copy.deepcopy(store.to_plain()))
            assert store.apply({"op": "tick", "now": now})["ok"]
        elif kind == "cancel":
            if not aids:
                continue
            aid = aids[step[2] % len(aids)]
            waiting = next((c for c in model.claims if c.aid == aid), None)
            live = model.live().get(aid)
            result = mutate("task_claim_cancel", aid=aid)
            assert result["ok"], result
            if waiting is not None:
                model.claims.remove(waiting)
                assert result["cancelled"] is True
            elif live is not None:
                live.aid = None
                model.make_ready(live)
                assert result["released"] == live.tid
            else:
                assert result["cancelled"] is False, result
        else:  # beat, complete, fail, release: from current or stale attempts
            known = [a for a in aids if a in aid_task]
            if not known:
                continue
            aid = known[step[2] % len(known)]
            tid = aid_task[aid]
            task = model.tasks[tid]
            current = task.aid == aid
            op = {
                "beat": "task_heartbeat",
                "complete": "task_complete",
                "fail": "task_fail",
                "release": "task_release",
            }[kind]
            extra: dict[str, Any] = {"retry_after": 0} if kind == "fail" else {}
            result = mutate(op, tid=tid, aid=aid, **extra)
            if not current:
                assert not result["ok"] and result["code"] == "STALE_ATTEMPT", (result, kind)
            else:
                assert result["ok"], result
                if kind == "beat":
                    task.expires_at = max(task.expires_at, model.now + task.attempt_ttl)
                    assert result["expires_at"] == task.expires_at, result
                elif kind == "complete":
                    task.aid = None
                    task.status = "completed"
                    task.completions += 1
                    accepted_completions[tid] = accepted_completions.get(tid, 0) + 1
                elif kind == "fail":
                    task.aid = None
                    model.failed(task)
                else:
                    task.aid = None
                    model.make_ready(task)
        # Attempts handed to waiting claims by this step (a release, an expiry...).
        for t in model.tasks.values():
            if t.aid is not None:
                aid_task.setdefault(t.aid, t.tid)
        check(store, model, now, accepted_completions)


def check(store: LeaseStore, model: Model, now: int, completions: dict[str, int]) -> None:
    tasks = store.tasks
    for tid, expected in model.tasks.items():
        got = tasks.tasks[tid]
        assert (got.status, got.failures) == (expected.status, expected.failures), (tid, got)
        current = tasks.current.get(tid)
        assert current == expected.aid, (tid, current, expected.aid)
        if current is not None:
            attempt = tasks.attempts[current]
            assert attempt.expires_at == expected.expires_at, (tid, attempt)
            if not expected.tokens or expected.tokens[-1] != attempt.token:
                expected.tokens.append(attempt.token)
        assert expected.tokens == sorted(set(expected.tokens))  # strictly increasing
        if got.status == "dead":
            assert got.failures >= got.max_attempts
    assert all(n == 1 for n in completions.values())
    # One live attempt per task, and every live attempt's task says so.
    assert len({a.tid for a in tasks.attempts.values()}) == len(tasks.attempts)
    waiting = list(tasks.queues["q"].claimers) if "q" in tasks.queues else []
    assert waiting == [c.aid for c in model.claims]
    dead = [t.tid for t in model.tasks.values() if t.status == "dead"]
    listed = list(tasks.queues["q"].dead) if "q" in tasks.queues else []
    assert sorted(listed) == sorted(dead)
