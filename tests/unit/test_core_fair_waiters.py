"""Fair shares between tenants waiting on a key (docs/design.md §4d): weighted
stride scheduling over the wait queue of a lock, semaphore or pool, decided in the
state machine. Pure: no cluster, no clock."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from typing import Any

import pytest

from raftlease.core import LeaseStore
from raftlease.core.snapshot import SNAPSHOT_VERSION

pytestmark = pytest.mark.timeout(120)

Entry = dict[str, Any]

_seq = itertools.count(1)


def acquire(
    now: int,
    lid: str,
    *,
    key: str = "k",
    capacity: int = 1,
    units: int = 1,
    wait: int = 10**9,
    priority: int = 0,
    tenant: str | None = None,
    weight: int | None = None,
) -> Entry:
    """An acquire entry that waits (by default as long as a test runs)."""
    entry: Entry = {
        "op": "acquire",
        "now": now,
        "cid": f"c-{lid}",
        "seq": next(_seq),
        "ack": 1,
        "key": key,
        "lid": lid,
        "owner": lid,
        "ttl": 10**9,
        "wait": wait,
        "priority": priority,
    }
    if capacity != 1:
        entry["capacity"] = capacity
    if units != 1:
        entry["units"] = units
    if tenant is not None:
        entry["fairness_key"] = tenant
    if weight is not None:
        entry["weight"] = weight
    return entry


def release(now: int, lid: str, key: str = "k") -> Entry:
    """Release a lease, or cancel a queued acquire."""
    return {"op": "release", "now": now, "cid": f"r-{lid}", "seq": next(_seq), "ack": 1,
            "key": key, "lid": lid}  # fmt: skip


def grants(store: LeaseStore) -> list[str]:
    return [e["lease_id"] for e in store.events if e["type"] == "grant"]


def backlogged_shares(capacity: int, weights: dict[str, int], total: int) -> Counter[str]:
    """Each tenant keeps ``capacity + 3`` acquires outstanding on ``k`` (1 unit
    each), so both stay backlogged; the oldest grant is released at each step and
    its tenant queues another. Returns
    the grants per tenant among the first ``total``."""
    store = LeaseStore()
    now = 1
    ids = itertools.count()
    owner: dict[str, str] = {}
    for tenant, weight in weights.items():
        for _ in range(capacity + 3):
            lid = f"{tenant}{next(ids)}"
            owner[lid] = tenant
            store.apply(acquire(now, lid, capacity=capacity, tenant=tenant, weight=weight))
    held = list(store.leases)
    counts: Counter[str] = Counter()
    while sum(counts.values()) < total:
        now += 1
        done = held.pop(0)
        tenant = owner[done]
        store.apply(release(now, done))
        new = grants(store)
        held.extend(new)
        counts.update(owner[lid] for lid in new)
        lid = f"{tenant}{next(ids)}"
        owner[lid] = tenant
        result = store.apply(acquire(now, lid, capacity=capacity, tenant=tenant))
        if not result.get("queued"):
            held.append(lid)
            counts[tenant] += 1
        # Never more units granted than the capacity.
        assert sum(lease.units for lease in store.leases.values()) <= capacity
    return counts


@pytest.mark.parametrize("capacity", [1, 4])
def test_weights_3_to_1_share_2000_grants_75_25(capacity: int) -> None:
    counts = backlogged_shares(capacity, {"a": 3, "b": 1}, 2000)
    total = sum(counts.values())
    assert abs(counts["a"] / total - 0.75) <= 0.05, counts
    assert abs(counts["b"] / total - 0.25) <= 0.05, counts


def test_equal_weights_alternate_and_ties_go_by_name() -> None:
    store = LeaseStore()
    store.apply(acquire(1, "h"))  # holds the lock
    for i in range(3):
        store.apply(acquire(2, f"b{i}", tenant="b"))
        store.apply(acquire(2, f"a{i}", tenant="a"))
    order = []
    holder = "h"
    for now in range(3, 9):
        store.apply(release(now, holder))
        (holder,) = grants(store)
        order.append(holder)
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_priority_orders_waiters_within_a_tenant_only() -> None:
    store = LeaseStore()
    store.apply(acquire(1, "h"))
    store.apply(acquire(2, "a-low", tenant="a"))
    store.apply(acquire(2, "a-high", tenant="a", priority=9))
    store.apply(acquire(2, "b-top", tenant="b", priority=100))
    order = []
    holder = "h"
    for now in range(3, 6):
        store.apply(release(now, holder))
        (holder,) = grants(store)
        order.append(holder)
    # "a" has the turn first (tie by name): its best-ranked waiter; then "b".
    assert order == ["a-high", "b-top", "a-low"]


def test_head_of_line_per_key_a_big_waiter_is_not_starved() -> None:
    """The chosen tenant's head waits for its units; nobody is granted past it."""
    store = LeaseStore()
    store.apply(acquire(1, "h1", capacity=4, units=2))
    store.apply(acquire(1, "h2", capacity=4, units=2))
    store.apply(acquire(2, "a-big", capacity=4, units=4, tenant="a"))
    store.apply(acquire(2, "b-small", capacity=4, units=1, tenant="b"))
    store.apply(release(3, "h1"))
    assert grants(store) == []  # "a"'s turn: 2 units free are not enough for 4
    store.apply(release(4, "h2"))
    assert grants(store) == ["a-big"]
    store.apply(release(5, "a-big"))
    assert grants(store) == ["b-small"]


def test_a_new_acquire_on_its_tenants_turn_is_granted_and_charged() -> None:
    store = LeaseStore()
    store.apply(acquire(1, "h1", capacity=3, units=1))
    store.apply(acquire(1, "h2", capacity=3, units=1))
    store.apply(acquire(2, "b-big", capacity=3, units=3, tenant="b"))
    # "a" has no waiter: its turn starts at the virtual time, and "a" < "b".
    result = store.apply(acquire(3, "a-small", capacity=3, units=1, tenant="a"))
    assert result["ok"] and not result.get("queued"), result
    # Charged: "b" has the next turn now, so another "a" acquire queues.
    result = store.apply(acquire(4, "a-next", capacity=3, units=1, tenant="a"))
    assert result.get("queued"), result


def test_fair_state_is_forgotten_when_nobody_waits_and_capped_per_key() -> None:
    store = LeaseStore()
    store.apply(acquire(1, "h"))
    store.apply(acquire(2, "w", tenant="t", weight=5))
    assert store.fair["k"].tenants["t"].weight == 5
    store.apply(release(3, "w"))  # cancelled: the queue is empty
    assert "k" not in store.fair
    assert store.to_plain()["fair"] == []


def test_layout_7_snapshot_loads_without_fair_shares() -> None:
    store = LeaseStore()
    store.apply(acquire(1, "h"))
    store.apply(acquire(2, "w1"))
    plain = store.to_plain()
    assert plain["v"] == SNAPSHOT_VERSION == 9
    old = {
        k: v
        for k, v in plain.items()
        if k not in ("fair", "deadlock_refusals", "preempt", "cert_keys", "audit")
    }
    old["v"] = 7
    restored = LeaseStore.from_plain(old)
    # Layout 7 had no audit trail: the restored one starts empty (test_audit.py).
    assert {**restored.to_plain(), "audit": None} == {**plain, "audit": None}


# ------------------------------------------------------------------ random histories


def random_history(rng: random.Random, fair: bool, steps: int = 400) -> list[Entry]:
    """Acquires (waiting or not) on two keys, releases and cancels of them, time
    moving so that waits run out; fairness keys and weights when ``fair``."""
    entries: list[Entry] = []
    lids: list[tuple[str, str]] = []
    now = 1
    caps = {"k": 1, "p": 5}
    for i in range(steps):
        now += rng.choice((0, 1, 1, 5, 40))
        if lids and rng.random() < 0.45:
            key, lid = lids.pop(rng.randrange(len(lids)))
            entries.append(release(now, lid, key))
            continue
        key = rng.choice(("k", "p"))
        lid = f"L{i}"
        lids.append((key, lid))
        extra: dict[str, Any] = {}
        if fair and rng.random() < 0.8:
            extra["tenant"] = rng.choice("abcd")
            if rng.random() < 0.3:
                extra["weight"] = rng.randint(1, 5)
        entries.append(
            acquire(
                now,
                lid,
                key=key,
                capacity=caps[key],
                units=rng.randint(1, caps[key]),
                wait=rng.choice((0, 50, 200, 10**6)),
                priority=rng.choice((0, 0, 1, 5)),
                **extra,
            )
        )
    return entries


class RankOrderModel:
    """The grant rule before fair shares, written out on its own: a queue in
    ``(-priority, arrival)`` order; a new acquire is granted if the queue is empty
    or it outranks the head, and its units fit; freed units go to the head while it
    fits; a waiter leaves at its deadline or when cancelled."""

    def __init__(self) -> None:
        self.queues: dict[str, list[tuple[int, int, str, int, int]]] = {}
        self.held: dict[str, tuple[str, int]] = {}
        self.caps: dict[str, int] = {}
        self.order = 0
        self.granted: list[str] = []

    def used(self, key: str) -> int:
        return sum(u for k, u in self.held.values() if k == key)

    def expire(self, now: int) -> None:
        for key, queue in self.queues.items():
            queue[:] = [w for w in queue if w[4] > now]
            self.serve(key)

    def serve(self, key: str) -> None:
        queue = self.queues.get(key, [])
        while queue and self.used(key) + queue[0][3] <= self.caps[key]:
            _, _, lid, units, _ = queue.pop(0)
            self.held[lid] = (key, units)
            self.granted.append(lid)

    def apply(self, entry: Entry) -> None:
        now = entry["now"]
        self.expire(now)
        key, lid = entry["key"], entry["lid"]
        if entry["op"] == "release":
            if lid in self.held:
                del self.held[lid]
            else:
                self.queues[key] = [w for w in self.queues.get(key, []) if w[2] != lid]
            self.serve(key)
            return
        self.caps[key] = entry.get("capacity", 1)
        units = entry.get("units", 1)
        queue = self.queues.setdefault(key, [])
        first = not queue or entry["priority"] > -queue[0][0]
        if first and self.used(key) + units <= self.caps[key]:
            self.held[lid] = (key, units)
            self.granted.append(lid)
        elif entry["wait"] > 0:
            self.order += 1
            waiter = (-entry["priority"], self.order, lid, units, now + entry["wait"])
            queue.append(waiter)
            queue.sort()


@pytest.mark.parametrize("seed", range(25))
def test_without_fairness_keys_grants_are_in_the_old_order(seed: int) -> None:
    """Property: with no fairness key and no weight the grant order is the rank
    order's exactly (an independent model of the rule before fair shares), and the
    same with every acquire in one named tenant."""
    history = random_history(random.Random(seed), fair=False)
    model = RankOrderModel()
    plain, one_tenant = LeaseStore(), LeaseStore()
    got: list[str] = []
    got_tenant: list[str] = []
    for entry in history:
        model.apply(entry)
        plain.apply(entry)
        got += grants(plain)
        named = {**entry, "fairness_key": "t"} if entry["op"] == "acquire" else entry
        one_tenant.apply(named)
        got_tenant += grants(one_tenant)
        assert not plain.fair
    assert got == model.granted
    assert got_tenant == model.granted


@pytest.mark.parametrize("seed", range(25))
def test_random_fair_histories_keep_capacity_tokens_and_replay_from_a_snapshot(
    seed: int,
) -> None:
    """Units never exceed the capacity, tokens grow, the fair-share bookkeeping
    matches the queue, and a replica restored from a snapshot at any point decides
    exactly as the one that lived through it."""
    rng = random.Random(1000 + seed)
    history = random_history(rng, fair=True)
    cut = rng.randrange(len(history))
    live = LeaseStore()
    restored: LeaseStore | None = None
    tokens: list[int] = []
    for i, entry in enumerate(history):
        result = live.apply(entry)
        tokens += [e["token"] for e in live.events if e["type"] == "grant"]
        for key, capacity in (("k", 1), ("p", 5)):
            used = sum(x.units for x in live.leases.values() if x.key == key)
            assert used <= capacity
        for key, shares in live.fair.items():  # the tenants' counts are the queue's
            waiting = Counter(w.tenant for w in live.queues[key])
            assert {n: t.waiting for n, t in shares.tenants.items() if t.waiting} == waiting
        if restored is not None:
            assert restored.apply(entry) == result
        if i == cut:
            restored = LeaseStore.from_plain(live.to_plain())
    assert tokens == sorted(set(tokens))
    assert restored is not None
    assert restored.to_plain() == live.to_plain()
