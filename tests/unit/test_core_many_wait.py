"""``acquire_many`` with ``wait`` in the pure state machine (issue 40; docs/design.md
§4c): a waiting set is one waiter on every key, granted whole in one entry when every
key is free for it, never in part; it holds its place at the head of each key (so
single-key acquires do not starve it, nor it them: arrival order per key); it leaves
every queue together (deadline, cancel, deadlock); and the deadlock detector sees it.

``check`` runs after every entry of seeded random workloads of sets and single keys
that wait: at most one holder per key, every set held whole or not at all, tokens
growing per key, no cycle of waits left (brute force, from the definition: holders
and waiting sets queued ahead), and a snapshot taken at a random point replays to the
same state."""

from __future__ import annotations

import random
from typing import Any

import pytest

from raftlease.core import LeaseStore
from raftlease.core.snapshot import ENTRY_FORMAT
from raftlease.core.store import many_lease_id

pytestmark = pytest.mark.timeout(60)

Entry = dict[str, Any]


class Agents:
    def __init__(self) -> None:
        self.seq: dict[str, int] = {}
        self.ids = 0

    def entry(self, op: str, agent: str, now: int, **fields: Any) -> Entry:
        seq = self.seq[agent] = self.seq.get(agent, 0) + 1
        return {"op": op, "now": now, "cid": f"c-{agent}", "seq": seq, "ack": seq,
                "fv": ENTRY_FORMAT, **fields}  # fmt: skip

    def lid(self) -> str:
        self.ids += 1
        return f"L{self.ids}"

    def many(self, owner: str, keys: list[str], now: int, wait: int = 0, **extra: Any) -> Entry:
        fields = {"keys": [[k, 1] for k in keys], "owner": owner, "ttl": 60_000,
                  "lid": self.lid(), **extra}  # fmt: skip
        if wait:
            fields["wait"] = wait
        return self.entry("acquire_many", owner, now, **fields)

    def one(self, owner: str, key: str, now: int, wait: int = 0) -> Entry:
        fields: dict[str, Any] = {"key": key, "owner": owner, "ttl": 60_000, "lid": self.lid()}
        if wait:
            fields["wait"] = wait
        return self.entry("acquire", owner, now, **fields)

    def close(self, owner: str, lid: str, now: int) -> Entry:
        return self.entry("session_close", owner, now, sid=lid)

    def release(self, owner: str, key: str, lid: str, now: int) -> Entry:
        return self.entry("release", owner, now, key=key, lid=lid)


def owner_of(store: LeaseStore, key: str) -> str | None:
    held = store.holder(key)
    return None if held is None else str(held["owner"])


def test_crossing_sets_wait_and_the_second_is_granted_whole_when_the_first_ends() -> None:
    store, a = LeaseStore(), Agents()
    first = store.apply(a.many("x", ["A", "B"], 1))
    assert first["ok"]
    second = store.apply(a.many("y", ["B", "A"], 2, wait=10_000))
    assert second["queued"] is True and second["keys"] == ["B", "A"]
    assert owner_of(store, "A") == owner_of(store, "B") == "x"
    store.apply(a.close("x", first["lease_id"], 3))
    grants = [e for e in store.events if e["type"] == "grant"]
    assert [(e["key"], e["owner"]) for e in grants] == [("B", "y"), ("A", "y")]
    status = store.lease_status("B", many_lease_id(second["lease_id"], 0))
    assert status["state"] == "held"
    assert sorted(one["key"] for one in status["set"]) == ["A", "B"]
    assert store.lease_sessions[second["lease_id"]].owner == "y"
    assert store.waiting == {} and store.waiting_sets == {}


def test_a_waiting_set_holds_its_place_and_single_acquires_queue_behind_it() -> None:
    """A is free, B held: the set waits and keeps A (a single acquire of A is refused
    without wait, queues behind it with wait). When B frees, the set takes both; when
    it ends, the single waiter gets A: arrival order per key, nobody starves."""
    store, a = LeaseStore(), Agents()
    holder = store.apply(a.one("h", "B", 1))
    queued = store.apply(a.many("s", ["A", "B"], 2, wait=10_000))
    assert queued["queued"] and queued["busy"] == ["B"]
    assert owner_of(store, "A") is None
    assert store.apply(a.one("p", "A", 3))["code"] == "LEASE_HELD"  # promised to the set
    later = store.apply(a.one("q", "A", 4, wait=10_000))
    assert later["queued"] and later["position"] == 2
    store.apply(a.release("h", "B", holder["lease_id"], 5))
    assert owner_of(store, "A") == owner_of(store, "B") == "s"
    store.apply(a.close("s", queued["lease_id"], 6))
    assert owner_of(store, "A") == "q" and owner_of(store, "B") is None


def test_a_set_never_shows_part_of_itself_while_it_waits() -> None:
    store, a = LeaseStore(), Agents()
    store.apply(a.one("h", "C", 1))
    store.apply(a.many("s", ["A", "B", "C"], 2, wait=10_000))
    assert [owner_of(store, k) for k in "ABC"] == [None, None, "h"]
    assert store.list_leases("", 100) and all(x["owner"] == "h" for x in store.list_leases("", 100))


def test_a_set_leaves_every_queue_at_its_deadline_and_those_behind_move_on() -> None:
    store, a = LeaseStore(), Agents()
    store.apply(a.one("h", "B", 1))
    store.apply(a.many("s", ["A", "B"], 2, wait=100))
    store.apply(a.one("q", "A", 3, wait=10_000))
    store.apply({"op": "tick", "now": 102, "fv": ENTRY_FORMAT})
    assert store.waiting_sets == {}
    assert owner_of(store, "A") == "q"
    assert sorted(e["key"] for e in store.events if e["type"] == "dequeue") == ["A", "B"]


def test_a_waiting_set_is_withdrawn_whole_by_closing_it_or_releasing_one_key() -> None:
    store, a = LeaseStore(), Agents()
    store.apply(a.one("h", "B", 1))
    queued = store.apply(a.many("s", ["A", "B"], 2, wait=10_000))
    closed = store.apply(a.close("s", queued["lease_id"], 3))
    assert closed["ok"] and closed["cancelled"] is True and store.waiting == {}
    again = store.apply(a.many("s", ["A", "B"], 4, wait=10_000))
    gone = store.apply(a.release("s", "A", many_lease_id(again["lease_id"], 0), 5))
    assert gone["cancelled"] is True and store.waiting == {} and store.queues == {}
    forged = store.apply(a.many("s", ["A", "B"], 6, wait=10_000))
    other = {**a.close("m", forged["lease_id"], 7), "principal": "mallory"}
    assert store.apply(other)["code"] == "PERMISSION_DENIED"


def test_a_set_that_would_close_a_cycle_is_refused_deadlock() -> None:
    """x holds C; y holds A and waits for C; x asks for {A, B}: x would wait for y,
    who waits for x."""
    store, a = LeaseStore(), Agents()
    store.apply(a.one("x", "C", 1))
    store.apply(a.one("y", "A", 2))
    assert store.apply(a.one("y", "C", 3, wait=10_000))["queued"]
    refused = store.apply(a.many("x", ["A", "B"], 4, wait=10_000))
    assert refused["code"] == "DEADLOCK" and store.waiting_sets == {}
    assert {"owner": "x", "waits_for": "A", "held_by": "y"} in refused["detail"]["cycle"]


def test_waiting_behind_a_set_that_waits_for_you_is_a_deadlock() -> None:
    """The set of s keeps A (free) while it waits for B, held by y; y then asks for A:
    y would wait behind s, who waits for y."""
    store, a = LeaseStore(), Agents()
    store.apply(a.one("y", "B", 1))
    assert store.apply(a.many("s", ["A", "B"], 2, wait=10_000))["queued"]
    refused = store.apply(a.one("y", "A", 3, wait=10_000))
    assert refused["code"] == "DEADLOCK"
    assert {"owner": "y", "waits_for": "A", "queued_behind": "s"} in refused["detail"]["cycle"]


def test_a_grant_that_closes_a_cycle_refuses_a_whole_waiting_set() -> None:
    store, a = LeaseStore(), Agents()
    store.apply(a.one("x", "A", 1))
    h = store.apply(a.one("h", "B", 2))
    assert store.apply(a.one("y", "A", 3, wait=10_000))["queued"]  # y waits for x
    assert store.apply(a.one("y", "B", 4, wait=10_000))["queued"]  # y waits for B
    late = store.apply(a.many("x", ["B", "C"], 5, wait=10_000))  # x waits for B too
    assert late["queued"]
    store.apply(a.release("h", "B", h["lease_id"], 6))  # y gets B: x -> y -> x
    assert owner_of(store, "B") == "y" and store.waiting_sets == {}
    for index, key in enumerate(["B", "C"]):
        status = store.lease_status(key, many_lease_id(late["lease_id"], index))
        assert status["state"] == "refused" and status["reason"] == "DEADLOCK"


# ------------------------------------------------------------------ random histories


def cycles(store: LeaseStore) -> list[list[str]]:
    """Cycles of the waits-for graph from its definition: a waiter waits for the
    holders of its key and for the waiting sets queued ahead of it there."""
    edges: dict[str, set[str]] = {}
    for queue in store.queues.values():
        for position, waiter in enumerate(queue):
            targets = {lease.owner for lease in store.holders_of(waiter.key)}
            targets |= {w.owner for w in queue[:position] if w.group}
            edges.setdefault(waiter.owner, set()).update(targets - {waiter.owner})
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


def check(store: LeaseStore, sizes: dict[str, int]) -> list[str]:
    problems = []
    for key in store.holders:
        if len(store.holders_of(key)) > 1:
            problems.append(f"{key} has two holders")
    for lid, size in sizes.items():
        session = store.lease_sessions.get(lid)
        if session is not None and len(session.leases) not in (0, size):
            problems.append(f"set {lid} holds {len(session.leases)} of {size} keys")
    last: dict[str, int] = store.__dict__.setdefault("_last_tokens", {})
    for event in store.events:
        if event["type"] == "grant":
            if event["token"] <= last.get(event["key"], 0):
                problems.append(f"token of {event['key']} went back")
            last[event["key"]] = event["token"]
    if cycles(store):
        problems.append(f"cycle left: {cycles(store)}")
    return problems


def run_workload(seed: int, steps: int = 500) -> tuple[list[str], dict[str, int]]:
    rng = random.Random(seed)
    store, a = LeaseStore(), Agents()
    keys = [f"k{i}" for i in range(6)]
    sizes: dict[str, int] = {}
    held: dict[str, list[tuple[str, str]]] = {}
    problems: list[str] = []
    counts = {"set_granted_from_queue": 0, "deadlock": 0}
    snap_at = rng.randrange(100, steps - 100)
    copy: LeaseStore | None = None
    entries: list[Entry] = []
    for step in range(steps):
        now = 10 * step + 1
        owner = f"ag{rng.randrange(6)}"
        mine = held.setdefault(owner, [])
        roll = rng.random()
        if mine and roll < 0.35:
            kind, lid = mine.pop(rng.randrange(len(mine)))
            entry = a.close(owner, lid, now) if kind == "set" else a.release(owner, kind, lid, now)
        elif roll < 0.7:
            chosen = rng.sample(keys, rng.randint(1, 3))
            entry = a.many(owner, chosen, now, wait=rng.choice([0, 300, 2000]))
            sizes[entry["lid"]] = len(chosen)
        else:
            entry = a.one(owner, rng.choice(keys), now, wait=rng.choice([0, 300, 2000]))
        result = store.apply(entry)
        entries.append(entry)
        if result.get("code") == "DEADLOCK":
            counts["deadlock"] += 1
        if result.get("ok") and entry["op"] == "acquire_many":
            mine.append(("set", entry["lid"]))
        elif result.get("ok") and entry["op"] == "acquire":
            mine.append((entry["key"], entry["lid"]))
        for event in store.events:
            if (
                event["type"] == "grant"
                and "/" in event["lease_id"]
                and entry["op"] != "acquire_many"
            ):
                counts["set_granted_from_queue"] += 1
        problems += [f"step {step}: {p}" for p in check(store, sizes)]
        if step == snap_at:
            copy = LeaseStore.from_plain(store.to_plain())
        elif copy is not None:
            copy.apply(entry)
    assert copy is not None
    if copy.to_plain() != store.to_plain():
        problems.append("the replica restored from a snapshot diverged")
    return problems, counts


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_sets_and_singles_that_wait_keep_every_rule(seed: int) -> None:
    problems, counts = run_workload(seed)
    assert problems == []
    assert counts["set_granted_from_queue"] > 0 and counts["deadlock"] > 0, counts
