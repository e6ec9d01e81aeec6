"""The lease expiry heap holds only the leases due within ``DEADLINE_HORIZON_MS`` of
log time (core/state.py): the leases due later cost no heap entry until log time gets
near them. What expires, when and in which order must not depend on it: the same log
applied to stores with a horizon of 1 ms, the default, and one past every deadline
gives the same results, events and state after every entry."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

from raftlease.core import LeaseStore
from raftlease.core.state import DEADLINE_HORIZON_MS

Entry = dict[str, Any]
TTLS = (500, 5_000, DEADLINE_HORIZON_MS - 1, DEADLINE_HORIZON_MS, DEADLINE_HORIZON_MS + 1, 200_000)


def log(seed: int, steps: int) -> list[Entry]:
    """Acquires, renewals (some with a new TTL), releases, reads and ticks over 30 keys,
    log time moving forward by up to 40 s an entry, often not at all (ties: leases due
    at the same log time, expired in lease-id order)."""
    rng = random.Random(seed)
    now, out = 1_000, []
    lids: dict[str, str] = {}  # key -> the lease id last acquired on it
    for seq, step in enumerate(range(steps), start=1):
        if rng.random() < 0.4:
            now += rng.choice((0, 1, 499, 500, 5_000, 20_000, 40_000))
        key = f"k{rng.randrange(30)}"
        roll = rng.random()
        # A client of its own per request (a long silence would evict one client).
        base = {"now": now, "cid": f"c{seq}", "seq": 1, "ack": 1}
        if roll < 0.45:
            lid = f"L{step:05d}-{rng.randrange(1000):03d}"
            lids[key] = lid
            out.append(
                {
                    **base,
                    "op": "acquire",
                    "key": key,
                    "owner": "o",
                    "ttl": rng.choice(TTLS),
                    "lid": lid,
                }
            )
        elif roll < 0.7 and key in lids:
            entry = {**base, "op": "renew", "key": key, "lid": lids[key]}
            if rng.random() < 0.5:
                entry["ttl"] = rng.choice(TTLS)
            out.append(entry)
        elif roll < 0.8 and key in lids:
            out.append({**base, "op": "release", "key": key, "lid": lids[key]})
        elif roll < 0.9:
            out.append({"op": "holder", "now": now, "key": key})
        else:
            out.append({"op": "tick", "now": now})
    return out


def stores() -> list[LeaseStore]:
    made = []
    for horizon in (1, DEADLINE_HORIZON_MS, 10**15):
        store = LeaseStore()
        store.deadline_horizon_ms = horizon
        made.append(store)
    return made


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(6))
def test_expiry_does_not_depend_on_the_horizon(seed: int) -> None:
    group = stores()
    for i, entry in enumerate(log(seed, 1500)):
        results = [store.apply(dict(entry)) for store in group]
        events = [list(store.events) for store in group]
        assert results[0] == results[1] == results[2], (i, entry)
        assert events[0] == events[1] == events[2], (i, entry)
        if i % 500 == 499:
            planes = [store.to_plain() for store in group]
            assert planes[0] == planes[1] == planes[2]
            # A restore rebuilds the heap for its own horizon: still the same outcomes.
            restored = []
            for store, plain in zip(group, planes, strict=True):
                copy = LeaseStore.from_plain(
                    msgpack.unpackb(msgpack.packb(plain), strict_map_key=False)
                )
                copy.deadline_horizon_ms = store.deadline_horizon_ms
                copy._rebuild_deadlines()
                restored.append(copy)
            group = restored
    assert group[0].expired_total == group[1].expired_total == group[2].expired_total > 0
    # The default horizon leaves the long leases out of the heap.
    assert len(group[1]._deadlines) <= len(group[2]._deadlines)


@pytest.mark.timeout(60)
def test_a_long_lease_leaves_the_heap_empty_until_log_time_nears_it() -> None:
    store = LeaseStore()
    ttl = 10 * DEADLINE_HORIZON_MS
    for i in range(100):
        entry = {
            "op": "acquire",
            "now": 1_000,
            "key": f"k{i}",
            "owner": "o",
            "ttl": ttl,
            "lid": f"L{i:03d}",
            "cid": "c1",
            "seq": i + 1,
            "ack": i + 1,
        }
        assert store.apply(entry)["ok"]
    assert store._deadlines == []
    due = store.next_deadline()
    assert due is not None and due <= 1_000 + DEADLINE_HORIZON_MS
    # Log time walks towards the deadline one horizon at a time: nothing expires early.
    now = 1_000
    while now < 1_000 + ttl - 1:
        now = min(now + DEADLINE_HORIZON_MS // 2, 1_000 + ttl - 1)
        store.apply({"op": "tick", "now": now})
        assert len(store.leases) == 100
    store.apply({"op": "tick", "now": 1_000 + ttl})
    assert not store.leases and store.expired_total == 100
