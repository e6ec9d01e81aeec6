"""Pools that say which units you got (issue 14): a grant on a shared key of capacity
2..1024 names the unit indices it holds, chosen by the state machine (the lowest free
ones at grant), reused after release, kept across a transfer and a snapshot, and
assigned deterministically to leases of a snapshot written before indices existed.

* unit tests on the store;
* a derandomized property: under any sequence of acquires (waiting or not),
  releases, transfers and expiries, the indices held on a key are disjoint, each
  lease holds exactly ``units`` of them, all below the capacity; a snapshot (also one
  with the indices stripped) restores to the same indices;
* on a real cluster: ``Lease.unit_indices``, ``Holder.unit_indices``, the pool
  recipe's ``held.unit_indices``, the CLI's JSON, watch events and the HTTP API.

The unit half of these tests (no process); the integration half is
tests/integration/test_pool_units.py.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlease.core import LeaseStore
from raftlease.core.records import MAX_INDEXED_CAPACITY

_seq = itertools.count(1)


def mut(op: str, now: int, cid: str, **fields: Any) -> dict[str, Any]:
    return {"op": op, "now": now, "cid": cid, "seq": next(_seq), "ack": 1, **fields}


def acquire(now: int, lid: str, key: str = "pool", capacity: int = 4, units: int = 1, **kw: Any):
    return mut(
        "acquire",
        now,
        f"c-{lid}",
        key=key,
        lid=lid,
        owner=lid,
        ttl=kw.pop("ttl", 1000),
        capacity=capacity,
        units=units,
        **kw,
    )


def release(now: int, lid: str, key: str = "pool") -> dict[str, Any]:
    return mut("release", now, f"r-{lid}", key=key, lid=lid)


def indices(store: LeaseStore, lid: str) -> tuple[int, ...]:
    return store.leases[lid].slots


@pytest.mark.timeout(30)
def test_lowest_free_units_are_granted_and_reused_after_release() -> None:
    s = LeaseStore()
    assert s.apply(acquire(0, "A", units=2))["unit_indices"] == [0, 1]
    assert s.apply(acquire(1, "B", units=1))["unit_indices"] == [2]
    assert s.apply(release(2, "A"))["ok"]
    # The freed 0 and 1 go first; 3 was never taken.
    assert s.apply(acquire(3, "C", units=1))["unit_indices"] == [0]
    assert s.apply(acquire(4, "D", units=2))["unit_indices"] == [1, 3]
    holder = s.holder("pool")
    assert holder is not None
    assert {h["owner"]: h["unit_indices"] for h in holder["holders"]} == {
        "B": [2],
        "C": [0],
        "D": [1, 3],
    }


@pytest.mark.timeout(30)
def test_a_queued_acquire_gets_the_units_freed_for_it_and_a_transfer_keeps_them() -> None:
    s = LeaseStore()
    s.apply(acquire(0, "A", units=3))
    s.apply(acquire(1, "B", units=1))
    queued = s.apply(acquire(2, "W", units=2, wait=5000))
    assert queued["queued"] is True
    s.apply(release(3, "A"))  # frees 0, 1, 2: W gets the lowest two
    assert indices(s, "W") == (0, 1)
    moved = s.apply(mut("transfer", 4, "t-B", key="pool", lid="B", owner="N", new_lid="B2"))
    assert moved["ok"] and moved["unit_indices"] == [3]


@pytest.mark.timeout(30)
def test_plain_locks_and_huge_capacities_name_no_units() -> None:
    s = LeaseStore()
    assert "unit_indices" not in s.apply(acquire(0, "L", key="lock", capacity=1))
    big = s.apply(acquire(1, "R", key="rw", capacity=MAX_INDEXED_CAPACITY + 1, units=5))
    assert big["ok"] and "unit_indices" not in big
    edge = s.apply(acquire(2, "E", key="edge", capacity=MAX_INDEXED_CAPACITY, units=3))
    assert edge["unit_indices"] == [0, 1, 2]


# ------------------------------------------------------------------ the property

Step = tuple[str, int, int]  # (what, which, how many)


@st.composite
def steps(draw: st.DrawFn) -> list[Step]:
    return draw(
        st.lists(
            st.tuples(
                st.sampled_from(["acquire", "wait", "release", "transfer", "tick"]),
                st.integers(0, 30),
                st.integers(1, 5),
            ),
            max_size=60,
        )
    )


KEYS = {"gpus": 5, "slots": 3}


def check_units(store: LeaseStore) -> None:
    for key, capacity in KEYS.items():
        held: list[int] = []
        for lease in store.holders_of(key):
            assert len(lease.slots) == lease.units, lease
            held.extend(lease.slots)
        assert len(held) == len(set(held)), (key, held)  # disjoint
        assert all(0 <= i < capacity for i in held), (key, held)
        assert len(held) == store.used.get(key, 0)


def strip_indices(plain: dict[str, Any]) -> dict[str, Any]:
    """The snapshot as written before unit indices existed."""
    return {**plain, "leases": [row[:10] for row in plain["leases"]]}


@pytest.mark.timeout(120)
@given(steps())
def test_indices_held_are_disjoint_within_capacity_and_survive_snapshots(
    plan: list[Step],
) -> None:
    s = LeaseStore()
    now = 0
    lids = [f"L{i}" for i in range(31)]
    for what, which, count in plan:
        now += 37
        key = "gpus" if which % 2 else "slots"
        capacity = KEYS[key]
        lid = f"{lids[which]}-{now}"
        if what in ("acquire", "wait"):
            wait = 2000 if what == "wait" else 0
            s.apply(
                acquire(
                    now,
                    lid,
                    key=key,
                    capacity=capacity,
                    units=min(count, capacity),
                    ttl=300 + 100 * count,
                    wait=wait,
                )
            )
        elif what == "release":
            live = sorted(lease.lease_id for lease in s.holders_of(key))
            if live:
                s.apply(release(now, live[which % len(live)], key=key))
        elif what == "transfer":
            # Only leases still live at this entry's time (it expires the others first).
            live = sorted(lease.lease_id for lease in s.holders_of(key) if lease.expires_at > now)
            if live:
                old = live[which % len(live)]
                before = s.leases[old].slots
                r = s.apply(
                    mut("transfer", now, f"t-{lid}", key=key, lid=old, owner="n", new_lid=lid)
                )
                assert r["ok"] and tuple(r["unit_indices"]) == before
        else:
            s.apply({"op": "tick", "now": now + 400 * count})
            now += 400 * count
        check_units(s)
        restored = LeaseStore.from_plain(s.to_plain())
        assert restored.to_plain() == s.to_plain()
        # A snapshot without indices gets the same kind of assignment: valid, and
        # the same on every replica (restoring twice gives the same).
        old_a = LeaseStore.from_plain(strip_indices(s.to_plain()))
        old_b = LeaseStore.from_plain(strip_indices(s.to_plain()))
        check_units(old_a)
        assert old_a.to_plain() == old_b.to_plain()
