"""Deadlock detection in the pure state machine (issue 40; core/deadlock.py,
docs/design.md §4e): the entry that closes a cycle of agents (each holding a key the
next one waits for) refuses the cycle's youngest waiter with ``DEADLOCK``, naming the
cycle by owners and keys; no other waiter is touched, and a chain without a cycle is
never refused.

``cycles`` (a check written from the definition, not from the code: a brute-force
search of the waits-for graph) is run after every entry of a seeded random workload,
and is shown to catch the planted build without detection
(tests/unit/test_planted_bugs.py)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from raftlease.core import LeaseStore
from raftlease.core.snapshot import ENTRY_FORMAT
from raftlease.limits import MAX_DEADLOCK_REFUSALS

pytestmark = pytest.mark.timeout(60)

Entry = dict[str, Any]


class Agents:
    """Entries of several agents, each with its own client id and sequence."""

    def __init__(self, fv: int = ENTRY_FORMAT) -> None:
        self.seq: dict[str, int] = {}
        self.fv = fv
        self.lids = itertools.count(1)

    def entry(self, op: str, owner: str, now: int, **fields: Any) -> Entry:
        seq = self.seq[owner] = self.seq.get(owner, 0) + 1
        return {
            "op": op,
            "now": now,
            "owner": owner,
            "cid": f"c-{owner}",
            "seq": seq,
            "ack": seq,
            "fv": self.fv,
            **fields,
        }

    def acquire(self, owner: str, key: str, now: int, wait: int = 0, ttl: int = 60_000) -> Entry:
        fields: dict[str, Any] = {"key": key, "ttl": ttl, "lid": f"L{next(self.lids)}"}
        if wait:
            fields["wait"] = wait
        return self.entry("acquire", owner, now, **fields)

    def release(self, owner: str, key: str, lid: str, now: int) -> Entry:
        return self.entry("release", owner, now, key=key, lid=lid)


def cycles(store: LeaseStore) -> list[list[str]]:
    """Every cycle of the waits-for graph, by brute force from the definition: agent a
    -> agent b when a queued acquire of a is on a key b holds (a != b)."""
    edges: dict[str, set[str]] = {}
    for waiter in store.waiting.values():
        for lease in store.holders_of(waiter.key):
            if lease.owner != waiter.owner:
                edges.setdefault(waiter.owner, set()).add(lease.owner)
    found: list[list[str]] = []

    def walk(path: list[str]) -> None:
        for nxt in sorted(edges.get(path[-1], ())):
            if nxt == path[0]:
                found.append(list(path))
            elif nxt not in path and nxt > path[0]:
                walk([*path, nxt])

    for start in sorted(edges):
        walk([start])
    return found


def test_two_agents_crossing_orders_the_second_wait_is_refused() -> None:
    store, a = LeaseStore(), Agents()
    assert store.apply(a.acquire("alice", "A", 1))["ok"]
    assert store.apply(a.acquire("bob", "B", 2))["ok"]
    queued = store.apply(a.acquire("alice", "B", 3, wait=10_000))
    assert queued["queued"] is True
    before = store.to_plain()
    refused = store.apply(a.acquire("bob", "A", 4, wait=10_000))
    assert refused["ok"] is False and refused["code"] == "DEADLOCK"
    cycle = refused["detail"]["cycle"]
    assert cycle == [
        {"owner": "bob", "waits_for": "A", "held_by": "alice"},
        {"owner": "alice", "waits_for": "B", "held_by": "bob"},
    ]
    assert "L" not in str(cycle), "the refusal names no lease id"
    # Nothing changed but log time and the client's dedup record.
    after = store.to_plain()
    for name in ("leases", "waiters", "revision", "queue_order", "lease_sessions"):
        assert after[name] == before[name], name
    assert cycles(store) == []


def test_three_agents_the_entry_that_closes_the_cycle_refuses_exactly_one() -> None:
    store, a = LeaseStore(), Agents()
    for now, (owner, key) in enumerate((("a", "k1"), ("b", "k2"), ("c", "k3")), start=1):
        assert store.apply(a.acquire(owner, key, now))["ok"]
    assert store.apply(a.acquire("a", "k2", 10, wait=10_000))["queued"]
    assert store.apply(a.acquire("b", "k3", 11, wait=10_000))["queued"]
    assert cycles(store) == []
    closing = store.apply(a.acquire("c", "k1", 12, wait=10_000))
    assert closing["code"] == "DEADLOCK"
    owners = [step["owner"] for step in closing["detail"]["cycle"]]
    assert sorted(owners) == ["a", "b", "c"] and owners[0] == "c"
    assert "'c' waits for 'k1' held by 'a'" in closing["message"]
    assert len(store.waiting) == 2 and cycles(store) == []


def test_a_chain_without_a_cycle_is_never_refused() -> None:
    store, a = LeaseStore(), Agents()
    store.apply(a.acquire("a", "k1", 1))
    store.apply(a.acquire("b", "k2", 2))
    assert store.apply(a.acquire("a", "k2", 3, wait=10_000))["queued"]
    assert store.apply(a.acquire("c", "k1", 4, wait=10_000))["queued"]
    # Waiting on a key one holds itself is no edge (several processes, one owner).
    assert store.apply(a.acquire("b", "k2", 5, wait=10_000))["queued"]


def test_a_grant_that_closes_a_cycle_refuses_the_youngest_waiter() -> None:
    """bob waits for A (alice) and for B (held by h); alice waits for B behind bob.
    h releases B: bob is granted B, so alice now waits for bob, who waits for alice.
    The youngest waiter of that cycle (alice's on B) leaves its queue in the same
    entry, and its long-poll learns DEADLOCK."""
    store, a = LeaseStore(), Agents()
    store.apply(a.acquire("alice", "A", 1))
    h = store.apply(a.acquire("h", "B", 2))
    assert store.apply(a.acquire("bob", "A", 3, wait=10_000))["queued"]
    assert store.apply(a.acquire("bob", "B", 4, wait=10_000))["queued"]
    late = store.apply(a.acquire("alice", "B", 5, wait=10_000))
    assert late["queued"] is True
    assert cycles(store) == []
    store.apply(a.release("h", "B", h["lease_id"], 6))
    assert store.holder("B")["owner"] == "bob"
    assert cycles(store) == []
    status = store.lease_status("B", late["lease_id"])
    assert status["state"] == "refused" and status["reason"] == "DEADLOCK"
    assert {"owner": "alice", "waits_for": "B", "held_by": "bob"} in status["cycle"]
    assert [e for e in store.events if e["type"] == "dequeue"] == [
        {"type": "dequeue", "key": "B", "lease_id": late["lease_id"], "reason": "deadlock"}
    ]
    # bob's own wait for A is untouched; the refusal survives a snapshot.
    assert len(store.waiting) == 1
    restored = LeaseStore.from_plain(store.to_plain())
    assert restored.to_plain() == store.to_plain()
    assert restored.lease_status("B", late["lease_id"])["state"] == "refused"
    # Gone once its wait deadline passed.
    assert store.lease_status("B", late["lease_id"], now=5 + 10_000)["state"] == "gone"


def test_entries_of_an_older_format_apply_as_they_did() -> None:
    store, a = LeaseStore(), Agents(fv=5)
    store.apply(a.acquire("alice", "A", 1))
    store.apply(a.acquire("bob", "B", 2))
    store.apply(a.acquire("alice", "B", 3, wait=10_000))
    assert store.apply(a.acquire("bob", "A", 4, wait=10_000))["queued"] is True


def test_refusals_kept_for_long_polls_are_bounded() -> None:
    store = LeaseStore()
    outcome = {"ok": False, "code": "DEADLOCK", "message": "m", "detail": {"cycle": []}}
    for i in range(MAX_DEADLOCK_REFUSALS + 5):
        store.deadlock_refusals.add(f"l{i}", "k", 10**9, outcome, now=0)
    kept = store.deadlock_refusals.by_lease
    assert len(kept) == MAX_DEADLOCK_REFUSALS and "l0" not in kept and "l5" in kept


def run_workload(store: LeaseStore, seed: int, steps: int = 600) -> list[str]:
    """Six agents taking and waiting on five keys in random orders, releasing and
    timing out; after every entry, any cycle left in the waits-for graph is a
    violation (the entry that closed it should have refused a waiter)."""
    rng = random.Random(seed)
    a = Agents()
    held: dict[str, list[tuple[str, str]]] = {}
    violations: list[str] = []
    refused = 0
    for step in range(steps):
        now = 10 * step + 1
        owner = f"ag{rng.randrange(6)}"
        mine = held.setdefault(owner, [])
        if mine and rng.random() < 0.3:
            key, lid = mine.pop(rng.randrange(len(mine)))
            store.apply(a.release(owner, key, lid, now))
        else:
            key = f"k{rng.randrange(5)}"
            entry = a.acquire(owner, key, now, wait=rng.choice([0, 400, 3000]), ttl=5000)
            result = store.apply(entry)
            if result.get("ok"):
                mine.append((key, entry["lid"]))
            elif result.get("code") == "DEADLOCK":
                refused += 1
        left = cycles(store)
        if left:
            violations.append(f"entry {step}: cycle left {left}")
    if refused == 0 and not violations:
        violations.append("the workload closed no cycle: it tests nothing")
    return violations


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_cycle_outlives_the_entry_that_closes_it(seed: int) -> None:
    store = LeaseStore()
    assert run_workload(store, seed) == []
    assert LeaseStore.from_plain(store.to_plain()).to_plain() == store.to_plain()
