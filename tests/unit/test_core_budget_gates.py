"""Budget gates in the state machine (issue 42, docs/budgets.md "Budget gates"): an
acquire or a task claim the leader stamped with ``gate_budget``/``gate_cost`` (from the
auth file) is granted only with its cost drawn from that budget in the same entry, and
refused definitely (``QUOTA_EXCEEDED`` or ``BUDGET_NOT_FOUND``, nothing changed)
otherwise. Gated requests never queue."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from raftlease.core import MUTATING_OPS, LeaseStore

pytestmark = pytest.mark.timeout(60)

GATE = {"gate_budget": "llm", "gate_cost": 3}


class Log:
    """A store fed entries as a leader would stamp them (one client id, term 1)."""

    def __init__(self) -> None:
        self.store = LeaseStore()
        self.seq = itertools.count(1)
        self.ids = itertools.count(1)
        self.now = 1000

    def run(self, op: str, at: int | None = None, **fields: Any) -> dict[str, Any]:
        if at is not None:
            self.now = at
        entry: dict[str, Any] = {"op": op, "now": self.now, "term": 1, **fields}
        if op in MUTATING_OPS:
            seq = next(self.seq)
            entry.update(cid="c", seq=seq, ack=seq)
        n = next(self.ids)
        entry.setdefault(
            {"acquire": "lid", "task_put": "tid", "task_claim": "aid"}.get(op, "_"), f"i{n}"
        )
        entry.pop("_", None)
        return self.store.apply(entry)

    def level(self) -> float:
        return float(self.run("budget_get", key="llm")["budget"]["level"])

    def acquire(self, key: str, **fields: Any) -> dict[str, Any]:
        return self.run("acquire", key=key, owner="w", ttl=10_000, **fields)

    def claim(self, **fields: Any) -> dict[str, Any]:
        return self.run("task_claim", queue="q", worker="w", **fields)


def gated(capacity: int = 10, refill: float = 1.0) -> Log:
    log = Log()
    assert log.run("budget_set", key="llm", capacity=capacity, refill=refill)["ok"]
    return log


def test_a_gated_acquire_draws_its_cost_with_the_grant() -> None:
    log = gated(10)
    got = log.acquire("k1", **GATE)
    assert got["ok"] and log.level() == 7.0
    assert log.acquire("k2", **GATE)["ok"] and log.acquire("k3", **GATE)["ok"]
    assert log.level() == 1.0


def test_a_gated_acquire_the_budget_does_not_cover_is_refused_unchanged() -> None:
    log = gated(10, 2.0)
    for key in ("k1", "k2", "k3"):
        assert log.acquire(key, **GATE)["ok"]
    before = log.store.to_plain()
    refused = log.acquire("k4", **GATE)
    assert refused["code"] == "QUOTA_EXCEEDED"
    detail = refused["detail"]
    assert detail["budget"] == "llm" and detail["cost"] == 3 and detail["level"] == 1.0
    assert detail["retry_after"] == 1.0  # 2 units short at 2 per second
    assert "k4" not in {lease.key for lease in log.store.leases.values()}
    after = log.store.to_plain()
    # Only the dedup table (the cached answer) and the applied count moved.
    moved = {"sessions", "applied"}
    assert {k: v for k, v in after.items() if k not in moved} == {
        k: v for k, v in before.items() if k not in moved
    }
    # A second later (log time) the refill covers it.
    assert log.acquire("k4", at=log.now + 1000, **GATE)["ok"]
    assert log.level() == 0.0


def test_a_gated_acquire_on_a_held_key_draws_nothing_and_does_not_queue() -> None:
    log = gated(10)
    assert log.acquire("k")["ok"]  # ungated: draws nothing
    assert log.level() == 10.0
    held = log.acquire("k", wait=60_000, **GATE)
    assert held["code"] == "LEASE_HELD" and held["detail"]["gated"] is True
    assert log.level() == 10.0 and not log.store.waiting


def test_a_gate_on_a_missing_budget_or_a_cost_above_capacity_is_refused() -> None:
    log = Log()
    assert log.acquire("k", **GATE)["code"] == "BUDGET_NOT_FOUND"
    log = gated(2)
    refused = log.acquire("k", **GATE)
    assert refused["code"] == "QUOTA_EXCEEDED" and refused["detail"]["retry_after"] is None
    assert not log.store.leases


def test_spends_waiting_on_the_budget_are_not_overtaken_by_a_gated_grant() -> None:
    log = gated(10, 1.0)
    assert log.run("budget_spend", key="llm", amount=9, rid="s1")["granted"]
    assert log.run("budget_spend", key="llm", amount=5, rid="s2", wait=60_000)["queued"]
    log.now += 2000  # level 3: covers the gate's 3, but a spend for 5 waits first
    refused = log.acquire("k", **GATE)
    assert refused["code"] == "QUOTA_EXCEEDED" and refused["detail"]["waiting"] == 1


def test_a_gated_claim_draws_with_the_task_and_is_refused_without_budget() -> None:
    log = gated(5)
    for _ in range(3):
        assert log.run("task_put", queue="q", payload="x", quota=100)["ok"]
    got = log.claim(**GATE)
    assert got["ok"] and got["claimed"] is True and log.level() == 2.0
    refused = log.claim(**GATE)
    assert refused["code"] == "QUOTA_EXCEEDED" and refused["detail"]["budget"] == "llm"
    assert log.level() == 2.0
    stats = log.run("task_stats", queue="q")
    assert stats["ok"]
    assert log.claim()["claimed"] is True  # ungated: no draw
    assert log.level() == 2.0


def test_a_gated_claim_on_an_empty_queue_draws_nothing_and_does_not_wait() -> None:
    log = gated(5)
    got = log.claim(wait=60_000, **GATE)
    assert got["ok"] and got["claimed"] is False and not got.get("queued")
    assert log.level() == 5.0


@pytest.mark.parametrize(
    "fields",
    [
        {"gate_budget": "llm"},
        {"gate_cost": 3},
        {"gate_budget": "", "gate_cost": 3},
        {"gate_budget": 7, "gate_cost": 3},
        {"gate_budget": "x" * 5000, "gate_cost": 3},
        {"gate_budget": "llm", "gate_cost": 0},
        {"gate_budget": "llm", "gate_cost": -1},
        {"gate_budget": "llm", "gate_cost": 1.5},
        {"gate_budget": "llm", "gate_cost": True},
        {"gate_budget": "llm", "gate_cost": 10**13},
    ],
)
def test_a_malformed_gate_is_refused_and_changes_nothing(fields: dict[str, Any]) -> None:
    log = gated(10)
    before = log.store.to_plain()
    assert log.acquire("k", **fields)["code"] == "BAD_REQUEST"
    assert log.claim(**fields)["code"] == "BAD_REQUEST"
    assert log.run("budget_spend", key="llm", amount=1, rid="s", **GATE)["code"] == "BAD_REQUEST"
    assert log.store.to_plain() == before
