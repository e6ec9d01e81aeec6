"""Budget metrics (server/budget_metrics.py): the scrape-time gauges per budget,
capped at ``MAX_BUDGET_SERIES``, and the leader's decision counters."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from raftlease.core import LeaseStore
from raftlease.replication import Replica
from raftlease.server.budget_metrics import MAX_BUDGET_SERIES, BudgetMetrics

pytestmark = pytest.mark.timeout(30)


def _store(count: int) -> LeaseStore:
    store = LeaseStore()
    for i in range(count):
        entry = {"op": "budget_set", "key": f"b{i:03}", "capacity": 10, "refill": 2.5}
        store.apply({**entry, "now": 1000, "term": 1, "cid": "c", "seq": i + 1, "ack": i + 1})
    return store


def _scrape(registry: CollectorRegistry) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_each_budget_has_its_gauges_up_to_the_cap() -> None:
    store = _store(MAX_BUDGET_SERIES + 5)
    spend = {"op": "budget_spend", "key": "b000", "amount": 4, "rid": "r1", "now": 1000}
    assert store.apply({**spend, "term": 1, "cid": "c", "seq": 999, "ack": 999})["granted"]
    registry = CollectorRegistry()
    BudgetMetrics(registry, lambda: cast(Replica, SimpleNamespace(store=store)))
    got = _scrape(registry)
    assert got["raftlease_budgets"] == MAX_BUDGET_SERIES + 5
    assert got['raftlease_budget_level{budget="b000"}'] == 6.0
    assert got['raftlease_budget_capacity{budget="b001"}'] == 10.0
    assert got['raftlease_budget_refill_per_second{budget="b001"}'] == 2.5
    assert got['raftlease_budget_waiting{budget="b000"}'] == 0.0
    assert sum(1 for name in got if name.startswith("raftlease_budget_level{")) == (
        MAX_BUDGET_SERIES
    )


def test_no_replica_no_budget_series() -> None:
    registry = CollectorRegistry()
    BudgetMetrics(registry, lambda: None)
    assert not [n for n in _scrape(registry) if n.startswith("raftlease_budget")]


def test_the_leader_counts_decisions_and_caps_the_budgets_it_labels() -> None:
    registry = CollectorRegistry()
    metrics = BudgetMetrics(registry, lambda: None)
    ok: dict[str, Any] = {"ok": True, "granted": True}
    metrics.observe("budget_spend", {"key": "a"}, ok)
    metrics.observe("budget_reserve", {"key": "a"}, {"ok": True, "queued": True})
    metrics.observe("budget_spend", {"key": "a"}, {"ok": False, "code": "BUDGET_EXHAUSTED"})
    gate = {"gate_budget": "a", "gate_cost": 1}
    metrics.observe("acquire", gate, {"ok": True})
    metrics.observe("task_claim", gate, {"ok": True, "claimed": False})  # nothing drawn
    refused = {"ok": False, "code": "QUOTA_EXCEEDED", "detail": {"budget": "a"}}
    metrics.observe("task_claim", gate, refused)
    metrics.observe("acquire", gate, {"ok": False, "code": "LEASE_HELD"})  # not the budget
    metrics.observe("acquire", {}, {"ok": True})  # not gated
    for i in range(MAX_BUDGET_SERIES + 3):
        metrics.observe("budget_spend", {"key": f"k{i}"}, ok)
    got = _scrape(registry)
    counter = "raftlease_budget_decisions_total"
    for outcome, n in (
        ("granted", 1),
        ("queued", 1),
        ("refused", 1),
        ("gate_granted", 1),
        ("gate_refused", 1),
    ):
        assert got[f'{counter}{{budget="a",outcome="{outcome}"}}'] == n
    labelled = {n for n in got if n.startswith(counter + "{")}
    assert len({n.split('"')[1] for n in labelled}) == MAX_BUDGET_SERIES + 1  # + other
    assert got[f'{counter}{{budget="",outcome="granted"}}'] == 4
