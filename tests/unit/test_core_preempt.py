"""Cooperative preemption in the pure state machine (issue 40; core/preempt.py,
docs/design.md §4f): ``request_yield`` asks the holders granted below the asker's
priority (every holder with ``override``, an admin's); the holder sees the request in
its keep-alive answers; at the deadline (log time) the lease ends unless released,
and the next waiter is granted in that same entry with a new token; the old token is
then fenced. Requests live and die with their lease and survive a snapshot."""

from __future__ import annotations

from typing import Any

import pytest

from raftlease.core import LeaseStore
from raftlease.core.snapshot import ENTRY_FORMAT

pytestmark = pytest.mark.timeout(60)

Entry = dict[str, Any]
_SEQ: dict[str, int] = {}


def mut(op: str, who: str, now: int, **fields: Any) -> Entry:
    seq = _SEQ[who] = _SEQ.get(who, 0) + 1
    return {"op": op, "now": now, "cid": f"c-{who}", "seq": seq, "ack": seq,
            "fv": ENTRY_FORMAT, **fields}  # fmt: skip


def acquire(who: str, key: str, now: int, lid: str, **extra: Any) -> Entry:
    return mut("acquire", who, now, key=key, owner=who, ttl=60_000, lid=lid, **extra)


def ask(who: str, key: str, now: int, deadline: int, **extra: Any) -> Entry:
    return mut("request_yield", who, now, key=key, owner=who, deadline=deadline, **extra)


@pytest.fixture(autouse=True)
def _fresh_seq() -> None:
    _SEQ.clear()


def test_an_ignored_request_ends_the_lease_at_the_deadline_and_grants_the_next() -> None:
    store = LeaseStore()
    held = store.apply(acquire("low", "gpu", 1, "L1"))
    assert store.apply(acquire("high", "gpu", 2, "L2", wait=100_000, priority=5))["queued"]
    asked = store.apply(ask("high", "gpu", 3, 1000, priority=5))
    assert asked["ok"] and asked["asked"] == 1 and asked["deadline"] == 1003
    renewed = store.apply(mut("renew", "low", 500, key="gpu", lid="L1"))
    assert renewed["yield_requested"] == {"deadline": 1003, "by": "high"}
    store.apply({"op": "tick", "now": 1002, "fv": ENTRY_FORMAT})
    assert store.holder("gpu")["owner"] == "low"  # not before the deadline
    store.apply({"op": "tick", "now": 1003, "fv": ENTRY_FORMAT})
    kinds = [(e["type"], e["key"]) for e in store.events if "key" in e]
    assert kinds == [("preempt", "gpu"), ("grant", "gpu")]  # one entry
    now_held = store.holder("gpu")
    assert now_held["owner"] == "high" and now_held["token"] > held["token"]
    assert store.fence("gpu", held["token"])["current"] is False
    assert store.preempt.requests == {} and "L1" not in store.preempt.priorities


def test_a_holder_that_releases_in_time_is_not_preempted_and_requests_end_with_it() -> None:
    store = LeaseStore()
    store.apply(acquire("low", "k", 1, "L1"))
    store.apply(ask("op", "k", 2, 1000, override=True))
    store.apply(mut("release", "low", 10, key="k", lid="L1"))
    assert store.preempt.requests == {}
    store.apply(acquire("other", "k", 11, "L3"))
    store.apply({"op": "tick", "now": 5000, "fv": ENTRY_FORMAT})
    assert store.holder("k")["owner"] == "other"


def test_only_holders_below_the_askers_priority_are_asked() -> None:
    store = LeaseStore()
    store.apply(acquire("h", "k", 1, "L1"))
    store.apply(acquire("w", "k", 2, "L2", wait=100_000, priority=7))
    store.apply(mut("release", "h", 3, key="k", lid="L1"))  # w granted at priority 7
    refused = store.apply(ask("x", "k", 4, 1000, priority=7))
    assert refused["code"] == "PERMISSION_DENIED" and store.preempt.requests == {}
    assert store.apply(ask("x", "k", 5, 1000, priority=8))["asked"] == 1
    assert store.apply(ask("y", "nobody", 6, 1000, priority=8))["code"] == "LEASE_NOT_FOUND"


def test_a_second_request_keeps_the_earlier_deadline_and_survives_a_snapshot() -> None:
    store = LeaseStore()
    store.apply(acquire("h", "k", 1, "L1", wait=0))
    store.apply(ask("a", "k", 2, 5000, override=True))
    again = store.apply(ask("b", "k", 3, 9000, override=True))
    assert again["deadline"] == 5002 and store.preempt.requests["L1"] == (5002, "a")
    copy = LeaseStore.from_plain(store.to_plain())
    assert copy.to_plain() == store.to_plain()
    for s in (store, copy):
        s.apply({"op": "tick", "now": 5002, "fv": ENTRY_FORMAT})
        assert s.holder("k") is None
    assert copy.to_plain() == store.to_plain()


def test_a_session_keepalive_answer_names_the_attached_leases_asked_to_yield() -> None:
    store = LeaseStore()
    store.apply(mut("session_open", "h", 1, owner="h", ttl=10_000, sid="S"))
    store.apply(mut("acquire", "h", 2, key="k", owner="h", session="S", lid="L1"))
    store.apply(ask("op", "k", 3, 4000, override=True))
    kept = store.apply(mut("session_keepalive", "h", 4, sid="S"))
    assert kept["yield_requested"] == [{"key": "k", "token": kept["yield_requested"][0]["token"],
                                        "deadline": 4003, "by": "op"}]  # fmt: skip


def test_asking_to_yield_needs_preempt_or_admin_on_the_key_and_a_priority_in_the_role() -> None:
    """The node's check (server/auth.py): never across principals without the
    permission; ``write`` alone is not enough."""
    from raftlease.errors import PermissionDeniedError
    from raftlease.protocol import Limits, parse_request
    from raftlease.server.auth import AuthPolicy, Principal, Role

    def request(priority: int = 0) -> Any:
        message = {"id": 1, "cid": "c", "seq": 1, "ack": 1, "op": "request_yield",
                   "key": "gpu/0", "deadline": 5, "priority": priority}  # fmt: skip
        return parse_request(message, Limits())

    writer = Role("writer", (("gpu/", frozenset({"read", "write"})),), 10)
    preempter = Role("preempter", (("gpu/", frozenset({"preempt"})),), 5)
    admin = Role("ops", (("", frozenset({"admin"})),))
    policy = AuthPolicy(
        {
            "w": Principal("w", (writer,)),
            "p": Principal("p", (preempter,)),
            "a": Principal("a", (admin,)),
        }
    )
    with pytest.raises(PermissionDeniedError, match="preempt or admin"):
        policy.check(policy.principals["w"], request(1))
    policy.check(policy.principals["p"], request(5))
    with pytest.raises(PermissionDeniedError, match="priority up to 5"):
        policy.check(policy.principals["p"], request(6))
    policy.check(policy.principals["a"], request())
