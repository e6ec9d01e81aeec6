"""Quotas of queued acquires and watches (issue 11), on real node processes.

Queued acquires per principal are replicated: the leader stamps
``max_waiters_per_principal`` into each acquire entry and the state machine decides
(core/store.py), so every replica agrees. Watches are node-local (not replicated):
``max_watches_per_principal`` and ``max_watches_per_node`` are counted by each node's
WatchHub. Every refusal is ``QUOTA_EXCEEDED`` (definite) with the state unchanged.

The unit half of these tests (no process); the integration half is
tests/integration/test_security_quotas.py.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from raftlease.core import LeaseStore


def _acquire(n: int, principal: str, key: str, wait: int = 60_000) -> dict[str, Any]:
    """An acquire entry as the leader stamps it (quotas included)."""
    return {
        "op": "acquire",
        "now": 1_000 + n,
        "key": key,
        "owner": principal,
        "ttl": 30_000,
        "wait": wait,
        "lid": f"L{n}",
        "cid": f"c-{principal}",
        "seq": n,
        "ack": 1,
        "principal": principal,
        "quota": 100,
        "wait_quota": 2,
    }


@pytest.mark.timeout(30)
def test_state_machine_decides_the_waiter_quota_and_rebuilds_it_on_restore() -> None:
    store = LeaseStore()
    for n, key in enumerate(["a", "b"], start=1):
        assert store.apply(_acquire(n, "holder", key))["ok"]  # granted: no waiter slot
    assert store.apply(_acquire(3, "p", "a"))["queued"]
    assert store.apply(_acquire(4, "p", "b"))["queued"]
    before = store.to_plain()
    refused = store.apply(_acquire(5, "p", "a"))
    assert refused["code"] == "QUOTA_EXCEEDED" and refused["detail"] == {"quota": 2}
    after = store.to_plain()
    # Only the dedup record and the applied index and log time moved: no waiter, no lease.
    moved = ("sessions", "applied", "now")
    assert {k: v for k, v in after.items() if k not in moved} == {
        k: v for k, v in before.items() if k not in moved
    }
    # A restored replica counts the same waiters and refuses the same entry.
    packed = msgpack.packb(store.to_plain())
    restored = LeaseStore.from_plain(msgpack.unpackb(packed, strict_map_key=False))
    assert restored.waiting_by == store.waiting_by == {"p": 2}
    assert restored.apply(_acquire(6, "p", "b"))["code"] == "QUOTA_EXCEEDED"
    # A bad stamped quota is refused before anything changes.
    bad = _acquire(7, "q", "a") | {"wait_quota": 0}
    assert store.apply(bad)["code"] == "BAD_REQUEST"


# ------------------------------------------------------------ shapes (issue 11)


def _shared(n: int, principal: str, key: str, capacity: int, shaper: bool) -> dict[str, Any]:
    entry = _acquire(n, principal, key, wait=0) | {"capacity": capacity, "units": 1}
    if not shaper:
        entry["shaper"] = False  # what the leader stamps for a principal without shape
    return entry


@pytest.mark.timeout(30)
def test_state_machine_lets_only_a_shaper_fix_a_shared_keys_capacity() -> None:
    store = LeaseStore()
    # A plain lock (capacity 1) needs no shape permission.
    assert store.apply(_shared(1, "p", "lock", 1, shaper=False))["ok"]
    before = store.to_plain()
    refused = store.apply(_shared(2, "p", "pool", 8, shaper=False))
    assert refused["code"] == "PERMISSION_DENIED" and refused["detail"] == {"key": "pool"}
    # (and the audit refusal ring, which records it: docs/audit.md "Refusals")
    moved = ("sessions", "applied", "now", "audit_refusals")
    after = store.to_plain()
    assert after["audit_refusals"]["records"][-1][2:8] == ["permission_denied", "pool", 0, "",
                                                           "", "p"]  # fmt: skip
    assert {k: v for k, v in after.items() if k not in moved} == {
        k: v for k, v in before.items() if k not in moved
    }
    assert "pool" not in store.capacity
    # Once a shaper fixed the shape, anyone with write joins it with that capacity.
    assert store.apply(_shared(3, "ops", "pool", 8, shaper=True))["ok"]
    assert store.apply(_shared(4, "p", "pool", 8, shaper=False))["ok"]
    assert store.apply(_shared(5, "p", "pool", 4, shaper=False))["code"] == "CAPACITY_MISMATCH"
    # A stamped flag other than false is malformed.
    assert store.apply(_shared(6, "p", "x", 2, shaper=True) | {"shaper": True})["code"] == (
        "BAD_REQUEST"
    )
