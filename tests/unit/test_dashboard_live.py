"""The dashboard's ``/ui/api/live`` payload without a node (server/http/dashboard.py,
issue 42): its budget rows (bounded, from the state; the leader's decision counts) and
the queues' event counters, and that no lease, spend or reservation id reaches it (a
reservation id settles the reservation: a capability)."""

from __future__ import annotations

import asyncio
import itertools
import json
from types import SimpleNamespace
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from raftlease.core import MUTATING_OPS, LeaseStore
from raftlease.server.budget_metrics import MAX_BUDGET_SERIES, BudgetMetrics
from raftlease.server.http.dashboard import LIMITS, MAX_BUDGETS, Dashboard, budget_rows

pytestmark = pytest.mark.timeout(30)


class Log:
    """A store fed entries as a leader stamps them (one client id, term 1), with
    recognisable ids so the test can look for them in the payload."""

    def __init__(self) -> None:
        self.store = LeaseStore()
        self.seq = itertools.count(1)
        self.now = 1000

    def run(self, op: str, **fields: Any) -> dict[str, Any]:
        entry: dict[str, Any] = {"op": op, "now": self.now, "term": 1, **fields}
        if op in MUTATING_OPS:
            seq = next(self.seq)
            entry.update(cid="c", seq=seq, ack=seq)
        result = self.store.apply(entry)
        assert result["ok"] is True, result
        return result


def _live(store: LeaseStore, metrics: BudgetMetrics | None, leader: bool) -> dict[str, Any]:
    replica = SimpleNamespace(store=store, last_applied=lambda: 42, is_leader=lambda: leader)
    node = SimpleNamespace(
        config=SimpleNamespace(node_id="n2"),
        require_replica=lambda: replica,
        metrics=None if metrics is None else SimpleNamespace(budgets=metrics),
    )

    async def run(op: str, fields: dict[str, Any], caller: Any) -> dict[str, Any]:
        assert op == "sessions"
        return {"sessions": []}

    api = SimpleNamespace(node=node, run=run)
    dashboard = Dashboard(cast(Any, api), None)
    return asyncio.run(dashboard._live(cast(Any, None), None))


def test_budget_rows_queue_counters_and_no_ids() -> None:
    log = Log()
    log.run("budget_set", key="llm/tpm", capacity=20, refill=0.5)
    log.run("budget_set", key="gpu/hours", capacity=8, refill=0)
    log.run("budget_spend", key="llm/tpm", amount=6, rid="secret-spend-1")
    log.run("budget_reserve", key="llm/tpm", amount=2, rid="secret-reservation-1", ttl=60_000)
    log.run("budget_spend", key="gpu/hours", amount=8, rid="secret-spend-2")
    waiting = log.run("budget_spend", key="gpu/hours", amount=3, rid="secret-wait-1", wait=60_000)
    assert waiting.get("queued") is True
    log.run("acquire", key="gpu/0", owner="w", ttl=10_000, lid="secret-lease-1")
    log.run("task_put", queue="jobs", tid="t1", payload="{}")
    log.run("task_put", queue="jobs", tid="t2", payload="{}", max_attempts=1)
    log.run("task_claim", queue="jobs", worker="w", aid="secret-attempt-1")
    log.run("task_complete", queue="jobs", tid="t1", aid="secret-attempt-1", result='"ok"')
    log.run("task_claim", queue="jobs", worker="w", aid="secret-attempt-2")
    log.run("task_fail", queue="jobs", tid="t2", aid="secret-attempt-2", error="boom")
    log.now += 2000  # refill in log time: 1 unit at 0.5/s, shown at the last entry's time
    log.run("budget_get", key="llm/tpm")  # a read through the log moves the log time too

    metrics = BudgetMetrics(CollectorRegistry(), lambda: None)
    metrics.observe("budget_spend", {"key": "llm/tpm"}, {"ok": True, "granted": True})
    metrics.observe("budget_spend", {"key": "llm/tpm"}, {"ok": False, "code": "X"})
    gate = {"gate_budget": "llm/tpm"}
    refused = {"ok": False, "code": "QUOTA_EXCEEDED", "detail": {"budget": "llm/tpm"}}
    metrics.observe("task_claim", gate, refused)
    live = _live(log.store, metrics, leader=True)

    assert live["applied_index"] == 42 and live["budget_decisions_leader"] is True
    assert live["limits"] == LIMITS and LIMITS["budgets"] == MAX_BUDGETS
    assert live["budgets_more"] == 0 and "budgets" not in live["truncated"]
    gpu, llm = live["budgets"]  # by key
    assert gpu == {
        "key": "gpu/hours",
        "level": 0.0,
        "capacity": 8,
        "refill_per_s": 0.0,
        "waiting": 1,
        "reservations": 0,
        "decisions": {
            o: 0 for o in ("granted", "queued", "refused", "gate_granted", "gate_refused")
        },
    }
    assert llm["level"] == 20 - 6 - 2 + 1 and llm["capacity"] == 20
    assert llm["refill_per_s"] == 0.5 and llm["reservations"] == 1 and llm["waiting"] == 0
    assert llm["decisions"]["granted"] == 1 and llm["decisions"]["refused"] == 1
    assert llm["decisions"]["gate_refused"] == 1
    (jobs,) = live["queues"]
    assert (jobs["claims"], jobs["completions"], jobs["dead_letters"]) == (2, 1, 1)
    assert jobs["expiries"] == 0 and jobs["retries"] == 0
    text = json.dumps(live)
    assert "secret" not in text  # no spend, reservation, lease or attempt id

    # A follower: the flag says so; without metrics the counts are null, not zeros.
    follower = _live(log.store, None, leader=False)
    assert follower["budget_decisions_leader"] is False
    assert [b["decisions"] for b in follower["budgets"]] == [None, None]


def test_budget_rows_are_bounded_and_count_the_rest() -> None:
    log = Log()
    for i in range(7):
        log.run("budget_set", key=f"b{6 - i}", capacity=5, refill=1)
    rows, more = budget_rows(log.store, None, 3)
    assert [r["key"] for r in rows] == ["b0", "b1", "b2"] and more == 4
    assert budget_rows(log.store, None, 7)[1] == 0


def test_decision_counts_unknown_beyond_the_labelled_budgets() -> None:
    """Past ``MAX_BUDGET_SERIES`` budgets seen, the others are counted together: the
    dashboard shows them as unknown (null), not as a node that decided nothing."""
    metrics = BudgetMetrics(CollectorRegistry(), lambda: None)
    assert metrics.counts("fresh") == dict.fromkeys(
        ("granted", "queued", "refused", "gate_granted", "gate_refused"), 0
    )
    for i in range(MAX_BUDGET_SERIES):
        metrics.observe("budget_spend", {"key": f"k{i}"}, {"ok": True})
    metrics.observe("budget_spend", {"key": "late"}, {"ok": True})
    assert metrics.counts("late") is None
    counted = metrics.counts("k0")
    assert counted is not None and counted["granted"] == 1
