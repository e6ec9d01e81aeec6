"""The task queues' metrics without a node: the counters and the oldest-ready index
the state machine keeps (``TaskState.totals``, ``QueueState.tally``, ``oldest_ready``),
and their families (server/metrics.py ``queue_families``): bounded labels however many
queues clients create, ``_other`` sums (docs/operations.md, "Task queues")."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from raftlease.core import LeaseStore
from raftlease.core.task_records import QueueState
from raftlease.server.metrics import queue_families
from tests.unit.test_core_tasks import claim, done, fail, ok, put, tick

pytestmark = pytest.mark.timeout(60)


def samples(families: list[GaugeMetricFamily | CounterMetricFamily]) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def test_many_queue_names_add_no_series() -> None:
    """A hostile client's queues: 100,000 of them (built directly: the state after as
    many puts into as many queues) give the same families and series as a handful,
    the deepest ``shown`` by name and the rest summed into ``queue="_other"``."""
    s = LeaseStore()
    tq = s.tasks
    for i in range(100_000):
        tq.queues[f"q{i}"] = QueueState(f"q{i}", counts={"ready": 1}, depth=1)
    tq.queues["deep"] = QueueState("deep", counts={"ready": 7, "dead": 2}, depth=9)
    tq.by_state = {"ready": 100_007, "dead": 2}
    families = list(queue_families(tq, 0, 3))
    names = {f.name for f in families}
    assert len(families) == 3 + 2 * 5 and len(names) == len(families)
    got = samples(families)
    queues = {k.split("queue=")[1].split(",")[0].rstrip("}") for k in got if "queue=" in k}
    assert len(queues) == 4 and {"deep", "_other"} <= queues, queues
    assert got["raftlease_queue_tasks{queue=deep,state=ready}"] == 7
    assert got["raftlease_queue_tasks{queue=deep,state=dead}"] == 2
    assert got["raftlease_queue_tasks{queue=_other,state=ready}"] == 100_007 - 7 - 2
    assert len(got) < 80


def test_values_come_from_the_state_and_a_queue_named_other_keeps_its_own_label() -> None:
    s = LeaseStore()
    for name in ("_other", "b", "c"):
        ok(s.apply({**put(0, f"t-{name}"), "queue": name}))
    ok(s.apply({**put(0, "t2-b"), "queue": "b"}))
    ok(s.apply({**claim(500, "a1"), "queue": "b"}))
    got: dict[str, Any] = samples(list(queue_families(s.tasks, 2500, 2)))
    assert got["raftlease_queue_tasks{queue=b,state=claimed}"] == 1
    assert got["raftlease_queue_tasks{queue=b,state=ready}"] == 1
    assert got["raftlease_queue_claims_total{queue=b}"] == 1
    assert got["raftlease_queue_oldest_ready_age_seconds{queue=b}"] == 2.5
    # "_other" (one task) and "c" (one task) tie; whichever is shown, the real
    # "_other" queue is never mistaken for the sum.
    assert got["raftlease_queue_tasks{queue=_other,state=ready}"] == 1
    shown = "_other_" if "raftlease_queue_tasks{queue=_other_,state=ready}" in got else "c"
    assert got[f"raftlease_queue_tasks{{queue={shown},state=ready}}"] == 1
    assert got["raftlease_task_claims_total{}"] == 1
    assert "raftlease_queue_oldest_ready_age_seconds{queue=_other}" not in got


def test_the_counters_follow_claims_completions_expiries_retries_and_dead_letters() -> None:
    """What the metrics read: per queue (``tally``, ``claims_total``), all queues
    (``totals``, kept in the snapshot), depths by state, and the oldest ready task."""
    s = LeaseStore()
    tq = s.tasks
    ok(s.apply(put(0, "ok", priority=3)))
    ok(s.apply(put(0, "dies", priority=2, max_attempts=1)))
    ok(s.apply(put(0, "slow", priority=1, max_attempts=2, backoff=10_000)))
    ok(s.apply(put(0, "idle", priority=0)))
    a = ok(s.apply(claim(10, "a1")))
    ok(s.apply(done(20, "ok", a["aid"])))
    b = ok(s.apply(claim(30, "a2")))
    ok(s.apply(fail(40, "dies", b["aid"])))
    ok(s.apply(claim(50, "a3", ttl=100)))  # "slow", expires at 150
    ok(s.apply(tick(150)))
    queue = tq.queues["q"]
    assert queue.claims_total == 3
    assert queue.tally == {"completions": 1, "dead_letters": 1, "expiries": 1, "retries": 1}
    assert tq.totals == {
        "claims": 3,
        "completions": 1,
        "expiries": 1,
        "retries": 1,
        "dead_letters": 1,
    }
    assert tq.by_state == {"ready": 1, "delayed": 1, "claimed": 0, "dead": 1, "completed": 1}
    assert queue.depth == 3
    assert tq.oldest_ready(queue) == 0  # "idle", ready since its put at 0
    # The expired one comes back after its backoff (at least 5 s: half is fixed).
    ok(s.apply(tick(150 + 10_000)))
    assert tq.oldest_ready(queue) == 0 and list(queue.ready_since) == ["idle", "slow"]
    # A retry of the dead letter counts, and it is ready since the retry.
    retry = {**put(10_200, "dies"), "op": "task_retry"}
    retry.pop("payload")
    ok(s.apply(retry))
    assert queue.tally["retries"] == 2 and queue.ready_since["dies"] == 10_200
    # Claims take them by rank (strict priority here: no stamp); the oldest stays.
    assert ok(s.apply(claim(10_300, "a4")))["tid"] == "dies"
    assert ok(s.apply(claim(10_300, "a5")))["tid"] == "slow"
    assert list(queue.ready_since) == ["idle"]
    restored = LeaseStore.from_plain(copy.deepcopy(s.to_plain()))
    rq = restored.tasks
    assert rq.totals == tq.totals
    # (A state counted down to 0 keeps its key live; a restore counts only what is.)
    assert {k: v for k, v in rq.by_state.items() if v} == {
        k: v for k, v in tq.by_state.items() if v
    }
    assert rq.queues["q"].tally == queue.tally and rq.queues["q"].depth == queue.depth
    assert rq.queues["q"].ready_since == queue.ready_since


def test_a_layout_5_snapshot_restores_with_zero_tallies() -> None:
    """A snapshot of the build before the counters (layout 5: queue rows without
    tallies, no totals) loads; the all-queues claims start from the claims the queues
    still count, the other counters from 0."""
    s = LeaseStore()
    ok(s.apply(put(0, "lo", priority=0)))
    ok(s.apply(put(0, "gone", priority=9)))
    ok(s.apply(claim(0, "a1")))  # takes "gone": one claim counted
    plain = s.to_plain()
    plain["v"] = 5
    tasks = plain["tasks"]
    tasks.pop("totals")
    tasks["queues"] = [row[:3] for row in tasks["queues"]]
    tasks["tasks"] = [row[:23] for row in tasks["tasks"]]
    old = LeaseStore.from_plain(plain)
    assert old.tasks.totals == {
        "claims": 1,
        "completions": 0,
        "expiries": 0,
        "retries": 0,
        "dead_letters": 0,
    }
    assert old.tasks.queues["q"].tally == {} and old.tasks.queues["q"].claims_total == 1
