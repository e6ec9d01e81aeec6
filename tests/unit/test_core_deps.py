"""Task dependencies in the pure state machine (issue 41; core/deps.py, docs/queues.md
"Dependencies"): a child is ready only once every parent completed, in the entry of
the last completion (so its claim's token is above every parent's completion
revision); a dead parent kills its waiting children (and theirs) with the reason;
the claim carries the parents' results; snapshots keep the links.
"""

from __future__ import annotations

import copy
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from raftlease.core import LeaseStore
from raftlease.limits import MAX_TASK_PARENTS
from tests.unit.test_core_tasks import claim, code, done, fail, info, mut, ok, put, read, tick

pytestmark = pytest.mark.timeout(60)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "jepsen-style"))


def after(*tids: str) -> list[list[Any]]:
    return [[tid, 1] for tid in tids]


def test_a_child_waits_for_every_parent_and_is_claimed_after_the_last_completion() -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "P1")))
    ok(store.apply(put(0, "P2")))
    child = ok(store.apply(put(0, "C", after=after("P1", "P2"))))
    assert child["status"] == "delayed"
    assert info(store, "C", 0)["waiting_on"] == ["P1", "P2"]
    a1 = ok(store.apply(claim(1, "A1")))
    assert a1["tid"] == "P1"  # the child is not claimable
    a2 = ok(store.apply(claim(1, "A2")))
    assert a2["tid"] == "P2"
    assert ok(store.apply(claim(2, "A3")))["claimed"] is False
    first = ok(store.apply(done(3, "P1", "A1", result='"r1"')))
    assert info(store, "C", 3)["waiting_on"] == ["P2"]
    assert ok(store.apply(claim(4, "A4")))["claimed"] is False
    last = ok(store.apply(done(5, "P2", "A2", result='"r2"')))
    assert info(store, "C", 5)["status"] == "ready"
    got = ok(store.apply(claim(6, "A5")))
    assert got["tid"] == "C" and got["after"] == ["P1", "P2"]
    assert got["parent_results"] == {"P1": '"r1"', "P2": '"r2"'}
    assert got["token"] > max(first["revision"], last["revision"])


def test_a_waiting_claim_is_handed_the_child_in_the_entry_of_the_last_completion() -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "P")))
    ok(store.apply(put(0, "C", after=after("P"))))
    ok(store.apply(claim(1, "A1")))
    assert ok(store.apply(claim(2, "W", wait=60_000)))["queued"] is True
    completion = ok(store.apply(done(3, "P", "A1")))
    status = ok(store.apply(read("task_claim_status", 4, aid="W")))
    assert status["state"] == "claimed" and status["tid"] == "C"
    assert status["token"] > completion["revision"]


def test_a_dead_parent_kills_its_children_and_theirs_with_the_reason() -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "P", max_attempts=1)))
    ok(store.apply(put(0, "Q")))
    ok(store.apply(put(0, "C", after=after("P", "Q"))))
    ok(store.apply(put(0, "G", after=after("C"))))
    ok(store.apply(claim(1, "A1")))
    ok(store.apply(fail(2, "P", "A1", error="OOM")))
    assert info(store, "C", 2)["status"] == "dead"
    assert info(store, "C", 2)["dead_reason"] == "parent P is dead: failed 1 of 1 attempts"
    assert info(store, "G", 2)["dead_reason"].startswith("parent C is dead: parent P is dead")
    dead = [d["tid"] for d in ok(store.apply(read("task_dead", 3)))["dead"]]
    assert dead == ["P", "C", "G"]
    # Q completing later releases nobody; a put after a dead parent is dead at once.
    ok(store.apply(claim(4, "A2")))
    ok(store.apply(done(5, "Q", "A2")))
    assert info(store, "C", 5)["status"] == "dead"
    late = ok(store.apply(put(6, "L", after=after("Q", "P"))))
    assert late["status"] == "dead"
    # A dead child is retried only after its dead parent.
    assert code(store.apply(mut("task_retry", 7, tid="C"))) == "TASK_STATE"
    ok(store.apply(mut("task_retry", 8, tid="P")))
    retried = ok(store.apply(mut("task_retry", 9, tid="C")))
    assert retried["status"] == "delayed"  # P is not completed: C waits again
    assert info(store, "C", 9)["waiting_on"] == ["P"]


def test_a_deadline_while_waiting_kills_the_child() -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "P")))
    ok(store.apply(put(0, "C", after=after("P"), deadline=1000)))
    ok(store.apply(tick(1000)))
    assert info(store, "C", 1000)["status"] == "dead"
    ok(store.apply(claim(1001, "A1")))
    ok(store.apply(done(1002, "P", "A1")))
    assert info(store, "C", 1002)["status"] == "dead"


def test_a_child_with_a_delay_waits_for_both() -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "P")))
    ok(store.apply(put(0, "C", after=after("P"), delay=5000)))
    ok(store.apply(claim(1, "A1")))
    ok(store.apply(done(2, "P", "A1")))
    assert info(store, "C", 2)["status"] == "delayed"
    ok(store.apply(tick(5000)))
    assert info(store, "C", 5000)["status"] == "ready"


@pytest.mark.parametrize(
    "bad",
    [
        [],
        [["P", 2]],
        [["P", 1], ["P", 1]],
        [["", 1]],
        [[7, 1]],
        "P",
        [["P", 1]] * 0 + [[f"T{i}", 1] for i in range(MAX_TASK_PARENTS + 1)],
    ],
)
def test_a_bad_after_is_refused_and_changes_nothing(bad: object) -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "P")))
    before = store.to_plain()
    assert code(store.apply(put(1, "C", after=bad))) == "BAD_REQUEST"
    after_ = store.to_plain()
    assert {**after_, "now": 0, "sessions": None} == {**before, "now": 0, "sessions": None}


def test_a_parent_of_another_queue_or_unknown_is_refused() -> None:
    store = LeaseStore()
    ok(store.apply(mut("task_put", 0, queue="other", tid="X", payload="{}")))
    assert code(store.apply(put(1, "C", after=after("X")))) == "TASK_NOT_FOUND"
    assert code(store.apply(put(1, "C", after=after("nope")))) == "TASK_NOT_FOUND"
    assert "C" not in store.tasks.tasks


def dag_events(store: LeaseStore, seed: int, n: int = 100) -> list[dict[str, Any]]:
    """A random DAG of ``n`` tasks (each after up to 3 earlier ones; parents put
    first), worked by claims that crash (expire) 30 % of the time, until every task
    is completed: the events ``queue_checker.check_dependencies`` judges."""
    rng = random.Random(seed)
    now = 0
    events: list[dict[str, Any]] = []
    for i in range(n):
        tid = f"T{i}"
        parents = [f"T{p}" for p in rng.sample(range(i), min(i, rng.randint(0, 3)))]
        extra = {"after": after(*parents)} if parents else {}
        ok(store.apply(put(now, tid, ttl=1000, backoff=0, max_attempts=100, **extra)))
        events.append({"f": "dag.put", "task": tid, "after": parents})
    completed = 0
    aid = 0
    while completed < n:
        now += 10
        aid += 1
        got = ok(store.apply(claim(now, f"A{aid}")))
        if not got["claimed"]:
            now += 1000
            ok(store.apply(tick(now)))  # crashed attempts expire
            continue
        events.append({"f": "dag.claim", "task": got["tid"], "token": got["token"]})
        if rng.random() < 0.3:
            continue  # the worker crashes: no completion, the attempt expires
        result = store.apply(done(now, got["tid"], f"A{aid}"))
        if result["ok"]:
            completed += 1
            events.append({"f": "dag.complete", "task": got["tid"], "revision": result["revision"]})
    return events


def test_a_100_task_random_dag_under_crashes_respects_every_edge() -> None:
    from queue_checker import check_dependencies

    for seed in range(3):
        verdict = check_dependencies(dag_events(LeaseStore(), seed))
        assert verdict["valid"] is True, verdict
        assert verdict["stats"]["completed"] == 100
        assert verdict["stats"]["claims"] > 100  # some attempts crashed


def test_the_links_survive_a_snapshot() -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "P")))
    ok(store.apply(put(0, "C", after=after("P"))))
    plain = store.to_plain()
    row = next(r for r in plain["tasks"]["tasks"] if r[0] == "C")
    assert row[28:] == [["P"], ["P"]]
    restored = LeaseStore.from_plain(copy.deepcopy(plain))
    assert restored.to_plain() == plain
    for entry in (claim(1, "A1"), done(2, "P", "A1"), claim(3, "A2")):
        assert restored.apply(copy.deepcopy(entry)) == store.apply(copy.deepcopy(entry))
