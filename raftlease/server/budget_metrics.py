"""Shared budgets in ``/metrics`` (docs/budgets.md, "Metrics"; docs/operations.md).

Two kinds, as in server/metrics.py:

* **Read at scrape time** (``BudgetCollector``): each budget's level, capacity,
  waiting spends and open reservations, from the replica's state machine, so every
  node answers them (the value of its last applied entry; the level at that entry's
  log time, without the refill since). The total number of budgets is always given.
* **Counted on the leader** (``BudgetMetrics.observe``): the decisions of spends,
  reserves and budget-gated acquires and claims, from the results the leader's
  dispatcher receives. Only the leader that proposed an entry sees its result, so
  these counters restart from zero on each node and sum over leaders; a follower's
  stay at zero. Grants from a budget's queue (a waiting spend served later) are the
  ``budget_grant`` type of ``raftlease_store_events`` (counted on every node).

Cardinality: budget keys are defined by operators (``budget_set`` needs ``admin`` on
``budget:<key>``), and at most ``MAX_BUDGET_SERIES`` of them get a series: the first
in key order at scrape time, and the first seen for the counters; the others count
under the label ``BUDGET_OTHER`` (and ``raftlease_budgets`` gives the total). A
budget key is the only key label of the node's metrics.

Threads: ``observe`` on the event loop (after each proposal's result);
``BudgetCollector.collect`` on the event loop while the tick thread applies: it copies
the dict of budgets before reading it and reads only scalars and sizes. Nothing here
blocks or raises on the hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core.budget import SCALE
from ..replication import Replica

#: Most budgets with series of their own (gauges and counters each).
MAX_BUDGET_SERIES = 50
#: The label of the budgets beyond ``MAX_BUDGET_SERIES`` (a budget key is never empty,
#: so it cannot be mistaken for one).
BUDGET_OTHER = ""

#: Decisions counted, by outcome: a spend or reserve ``granted`` at once, ``queued``,
#: or ``refused`` (any code); a gated acquire or claim that drew (``gate_granted``) or
#: was refused by its budget (``gate_refused``: ``QUOTA_EXCEEDED`` or
#: ``BUDGET_NOT_FOUND`` naming it).
OUTCOMES = ("granted", "queued", "refused", "gate_granted", "gate_refused")


class BudgetCollector(Collector):
    """Per-budget gauges read from the replica's state at scrape time."""

    def __init__(self, replica: Callable[[], Replica | None]) -> None:
        self._replica = replica

    def collect(self) -> Iterator[GaugeMetricFamily]:
        replica = self._replica()
        if replica is None:
            return
        budgets = dict(replica.store.budgets.budgets)  # the tick thread may add one
        total = GaugeMetricFamily("raftlease_budgets", "Budgets defined (all of them).")
        total.add_metric([], len(budgets))
        yield total
        families = {
            name: GaugeMetricFamily(name, doc, labels=["budget"])
            for name, doc in (
                (
                    "raftlease_budget_level",
                    "A budget's level in units at the last applied entry (negative: debt).",
                ),
                ("raftlease_budget_capacity", "A budget's capacity in units."),
                ("raftlease_budget_refill_per_second", "A budget's refill in units per second."),
                ("raftlease_budget_waiting", "Spends and reserves waiting in a budget's queue."),
                ("raftlease_budget_reservations", "A budget's open reservations."),
            )
        }
        for key in sorted(budgets)[:MAX_BUDGET_SERIES]:
            budget = budgets[key]
            values = (
                budget.level / SCALE,
                budget.capacity,
                budget.rate / 1000,
                len(budget.waiters),
                len(budget.reservations),
            )
            for family, value in zip(families.values(), values, strict=True):
                family.add_metric([key], value)
        yield from families.values()


class BudgetMetrics:
    """The leader's budget decision counters and the scrape-time collector, in the
    node's registry (``NodeMetrics.budgets``)."""

    def __init__(self, registry: CollectorRegistry, replica: Callable[[], Replica | None]) -> None:
        self.decisions = Counter(
            "raftlease_budget_decisions",
            "Budget decisions this node made as leader, by budget (the first "
            f'{MAX_BUDGET_SERIES} seen; others under budget="") and outcome (granted, '
            "queued, refused: spends and reserves; gate_granted, gate_refused: "
            "budget-gated acquires and claims). Leader only: they restart on each node.",
            ["budget", "outcome"],
            registry=registry,
        )
        self._seen: set[str] = set()
        #: The same counts as plain ints by budget (the first ``MAX_BUDGET_SERIES`` seen)
        #: for the dashboard: reading them back from a prometheus Counter needs its
        #: private fields.
        self._counts: dict[str, dict[str, int]] = {}
        registry.register(BudgetCollector(replica))

    def counts(self, key: str) -> dict[str, int] | None:
        """The decisions this node made as leader for budget ``key``, by outcome
        (``OUTCOMES``, zeros included), or None when they are counted under
        ``BUDGET_OTHER`` (more than ``MAX_BUDGET_SERIES`` budgets seen), so not known
        one by one. Event loop (as ``observe``); never blocks or raises."""
        counted = self._counts.get(key)
        if counted is None and len(self._seen) >= MAX_BUDGET_SERIES:
            return None
        return {outcome: (counted or {}).get(outcome, 0) for outcome in OUTCOMES}

    def observe(self, op: str, entry: dict[str, Any], result: dict[str, Any]) -> None:
        """Event loop, after the result of a proposed entry arrives (the leader's
        dispatcher). Counts a spend's or reserve's decision, and a gated acquire's or
        claim's draw or budget refusal; ignores everything else. Never raises."""
        if op in ("budget_spend", "budget_reserve"):
            key = entry.get("key")
            if result.get("ok"):
                outcome = "queued" if result.get("queued") else "granted"
            else:
                outcome = "refused"
        elif op in ("acquire", "task_claim") and "gate_budget" in entry:
            key = entry["gate_budget"]
            detail = result.get("detail") or {}
            if result.get("ok"):
                granted = op == "acquire" or result.get("claimed") is True
                if not granted:
                    return  # nothing to claim: nothing drawn, no budget decision
                outcome = "gate_granted"
            elif result.get("code") in ("QUOTA_EXCEEDED", "BUDGET_NOT_FOUND") and (
                detail.get("budget") == key
            ):
                outcome = "gate_refused"
            else:
                return  # refused for another reason (a held key): the budget not asked
        else:
            return
        if not isinstance(key, str):
            return
        if key not in self._seen:
            if len(self._seen) >= MAX_BUDGET_SERIES:
                key = BUDGET_OTHER
            else:
                self._seen.add(key)
        self.decisions.labels(key, outcome).inc()
        if key != BUDGET_OTHER:
            per_key = self._counts.setdefault(key, {})
            per_key[outcome] = per_key.get(outcome, 0) + 1
