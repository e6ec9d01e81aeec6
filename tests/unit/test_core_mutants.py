"""Behaviour of the state machine that the other core tests left unpinned: each test here
was written against a mutant that survived ``scripts/mutate`` (CONTRIBUTING.md, "Mutation
testing"), and is named for the behaviour it pins.

Exact values are asserted on purpose. The limits, defaults and orderings below are part
of the replicated behaviour: a log replayed by a build with another limit or another
tie-break gives other results, tokens or snapshots, and a request the protocol accepts
(``protocol.py``: seq, ack and token up to 2**62, priority -1000..1000) must not be
refused by the core. The values the documentation states (10 minutes idle, 4096 pending
results, docs/design.md) are written out here as literals rather than imported, so that a
change of the constant fails a test instead of moving the test with it.

Pure unit tests of ``LeaseStore``: no node process, no clock, no randomness.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from raftlease.core import LeaseStore
from raftlease.core.snapshot import entry_format
from raftlease.limits import MAX_SESSION_LEASES, TOKEN_RESERVE_STEP

pytestmark = pytest.mark.timeout(60)

Entry = dict[str, Any]

_fresh = itertools.count(1)


# ------------------------------------------------------------------ entry builders


def mut(op: str, now: int, *, cid: str = "", seq: int = 1, ack: int = 1, **fields: Any) -> Entry:
    """A mutating entry; by default from a fresh client id (so no dedup interplay)."""
    return {
        "op": op,
        "now": now,
        "cid": cid or f"c{next(_fresh)}",
        "seq": seq,
        "ack": ack,
        **fields,
    }


def acquire(
    now: int, lid: str, key: str = "k", owner: str = "alice", ttl: int = 1000, **fields: Any
) -> Entry:
    """An acquire; ``session=`` replaces the TTL (an attached lease has none)."""
    if "session" not in fields:
        fields["ttl"] = ttl
    return mut("acquire", now, key=key, lid=lid, owner=owner, **fields)


def release(now: int, lid: str, key: str = "k", **fields: Any) -> Entry:
    return mut("release", now, key=key, lid=lid, **fields)


def session_open(now: int, sid: str, ttl: int, **fields: Any) -> Entry:
    return mut("session_open", now, sid=sid, owner="svc", ttl=ttl, **fields)


def tick(now: int, **fields: Any) -> Entry:
    return {"op": "tick", "now": now, **fields}


def ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result.get("ok") is True, result
    return result


def refused(result: dict[str, Any], code: str, field: str | None = None) -> None:
    """``result`` is the refusal ``code``, whose message names ``field`` when given."""
    assert result.get("ok") is False, result
    assert result["code"] == code, result
    if field is not None:
        assert f"'{field}'" in result["message"], result


def unchanged_by(s: LeaseStore, entry: Entry, code: str, field: str) -> None:
    """Applying ``entry`` is refused with ``code`` naming ``field``; the state is as before."""
    before = copy.deepcopy(s.to_plain())
    refused(s.apply(entry), code, field)
    assert s.to_plain() == before


# ------------------------------------------------------------------ field limits


def test_a_batch_holds_at_most_4096_requests() -> None:
    s = LeaseStore()
    result = ok(s.apply({"op": "batch", "now": 5, "entries": [{"op": "tick"}] * 4096}))
    assert result["results"] == [{"ok": True, "now": 5}] * 4096
    assert s.applied == 4096
    before = copy.deepcopy(s.to_plain())
    refused(s.apply({"op": "batch", "now": 6, "entries": [{"op": "tick"}] * 4097}), "BAD_REQUEST")
    assert s.to_plain() == before


def test_priority_ranges_from_minus_1000_to_1000() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "A", key="a", priority=1000)))
    ok(s.apply(acquire(0, "B", key="b", priority=-1000)))
    unchanged_by(s, acquire(0, "C", key="c", priority=1001), "BAD_REQUEST", "priority")
    unchanged_by(s, acquire(0, "D", key="d", priority=-1001), "BAD_REQUEST", "priority")


def test_seq_and_ack_may_be_2_to_the_62_and_no_more() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", key="a", cid="c", seq=1)))
    # The client acknowledges everything before its last possible request.
    ok(s.apply(acquire(1, "L2", key="b", cid="c", seq=2**62, ack=2**62)))
    unchanged_by(
        s, acquire(2, "L3", key="x", cid="c", seq=2**62, ack=2**62 + 1), "BAD_REQUEST", "ack"
    )
    unchanged_by(
        s, acquire(2, "L3", key="x", cid="c", seq=2**62 + 1, ack=2**62), "BAD_REQUEST", "seq"
    )


def test_term_may_be_2_to_the_62_and_no_more() -> None:
    s = LeaseStore()
    assert ok(s.apply(tick(1, term=2**62)))["now"] == 1
    assert s.term == 2**62
    unchanged_by(s, tick(2, term=2**62 + 1), "BAD_REQUEST", "term")


def test_an_entry_or_batch_without_a_term_is_stamped_term_zero() -> None:
    s = LeaseStore()
    ok(s.apply(tick(1)))
    assert s.term == 0
    result = ok(s.apply({"op": "batch", "now": 2, "entries": [acquire(0, "L1")]}))
    assert result["results"][0]["ok"] is True
    assert result["results"][0]["token"] == 1
    assert s.term == 0
    # Still term 0: an entry stamped term 0 explicitly is not from a deposed leader.
    ok(s.apply(tick(3, term=0)))
    assert s.now == 3


def test_a_fence_check_through_the_log_validates_its_token() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1")))
    fence = {"op": "fence", "now": 1, "key": "k"}
    assert ok(s.apply({**fence, "token": 1})) == {
        "ok": True,
        "key": "k",
        "current": True,
        "holder_token": 1,
        "now": 1,
    }
    assert ok(s.apply({**fence, "token": 0}))["current"] is False
    assert ok(s.apply({**fence, "token": 2**62}))["current"] is False
    for bad in (-1, 2**62 + 1, True, None):
        unchanged_by(s, {**fence, "token": bad}, "BAD_REQUEST", "token")
    unchanged_by(s, fence, "BAD_REQUEST", "token")


def test_a_lease_status_read_through_the_log_needs_a_lease_id() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", ttl=1000)))
    status = {"op": "lease_status", "now": 10, "key": "k"}
    result = ok(s.apply({**status, "lid": "L1"}))
    assert (result["state"], result["lease_id"], result["expires_at"]) == ("held", "L1", 1000)
    assert ok(s.apply({**status, "lid": "nobody"})) == {"ok": True, "state": "gone", "now": 10}
    unchanged_by(s, status, "BAD_REQUEST", "lid")
    unchanged_by(s, {**status, "lid": ""}, "BAD_REQUEST", "lid")


def test_capacity_zero_is_refused_as_a_bad_capacity() -> None:
    s = LeaseStore()
    unchanged_by(s, acquire(0, "L1", capacity=0), "BAD_REQUEST", "capacity")
    unchanged_by(s, acquire(0, "L1", capacity=0, units=0), "BAD_REQUEST", "capacity")


def test_transfer_with_a_ttl_gives_the_new_lease_that_ttl() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", ttl=1000)))
    moved = ok(s.apply(mut("transfer", 10, key="k", lid="L1", new_lid="L2", owner="bob", ttl=1)))
    assert (moved["owner"], moved["ttl"], moved["expires_at"], moved["token"]) == ("bob", 1, 11, 3)
    ok(s.apply(acquire(20, "L3", ttl=1000)))
    for bad in (0, -1, True):
        unchanged_by(
            s,
            mut("transfer", 30, key="k", lid="L3", new_lid="L4", owner="bob", ttl=bad),
            "BAD_REQUEST",
            "ttl",
        )


def test_a_session_ttl_is_required_on_open_and_at_least_one_millisecond() -> None:
    s = LeaseStore()
    no_ttl = mut("session_open", 0, sid="S0", owner="svc")
    unchanged_by(s, no_ttl, "BAD_REQUEST", "ttl")
    unchanged_by(s, session_open(0, "S0", ttl=0), "BAD_REQUEST", "ttl")
    opened = ok(s.apply(session_open(0, "S1", ttl=1)))
    assert (opened["ttl"], opened["expires_at"]) == (1, 1)
    ok(s.apply(session_open(0, "S2", ttl=100)))
    kept = ok(s.apply(mut("session_keepalive", 10, sid="S2", ttl=1)))
    assert (kept["ttl"], kept["expires_at"]) == (1, 11)
    unchanged_by(s, mut("session_keepalive", 10, sid="S2", ttl=0), "BAD_REQUEST", "ttl")


@pytest.mark.parametrize("stamp", ["quota", "wait_quota", "waiters_total"])
def test_a_leader_stamped_quota_ranges_from_1_to_2_to_the_31(stamp: str) -> None:
    s = LeaseStore()
    # Validated even where it does not bite (no principal, nothing queued).
    ok(s.apply(acquire(0, "L1", key="a", **{stamp: 1})))
    ok(s.apply(acquire(0, "L2", key="b", **{stamp: 2**31})))
    for bad in (0, 2**31 + 1, True, "1"):
        unchanged_by(s, acquire(0, "L3", key="c", **{stamp: bad}), "BAD_REQUEST", stamp)


def test_an_extend_entry_carries_at_most_600_leases_600_sessions_and_200_client_ids() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", ttl=1000)))
    ok(s.apply(session_open(0, "S1", ttl=1000)))
    leases = [["L1", 1500]] + [[f"gone{i}", 1500] for i in range(599)]
    sessions = [["S1", 1500]] + [[f"gone{i}", 1500] for i in range(599)]
    cids = [f"c{i}" for i in range(200)]
    extend = {"op": "extend", "now": 600}
    for field, items in (("leases", leases), ("sessions", sessions), ("cids", cids)):
        unchanged_by(s, {**extend, field: [*items, items[-1]]}, "BAD_REQUEST", field)
    result = ok(s.apply({**extend, "leases": leases, "sessions": sessions, "cids": cids}))
    # Log time does not move (the leader may split what is due over several entries).
    assert result == {"ok": True, "now": 0, "extended": 2}
    assert s.leases["L1"].expires_at == 1500
    assert s.lease_sessions["S1"].expires_at == 1500


def test_an_extend_pair_is_an_id_then_a_time_from_0_to_2_to_the_62() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", ttl=1000)))
    extend = {"op": "extend", "now": 10}
    assert ok(s.apply({**extend, "leases": [["L1", 0]]}))["extended"] == 0
    assert ok(s.apply({**extend, "leases": [["L1", 2**62]]}))["extended"] == 1
    for bad in ([["L1", -1]], [["L1", 2**62 + 1]], [[1500, "L1"]], [["L1", 1500, 1]], [["", 5]]):
        unchanged_by(s, {**extend, "leases": bad}, "BAD_REQUEST", "leases")


def test_an_entry_declares_format_1_by_default_and_a_positive_integer_otherwise() -> None:
    assert entry_format({"op": "tick"}) == 1
    assert entry_format({"op": "tick", "fv": 1}) == 1
    assert entry_format({"op": "tick", "fv": 2}) == 2
    assert entry_format("not a map") == 1
    for bad in (0, -1, True, 1.0, "1", None):
        assert entry_format({"op": "tick", "fv": bad}) is None, bad


# ------------------------------------------------------------------ quotas


def test_a_principal_holds_at_most_its_quota_of_leases_and_queued_acquires() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", key="a", principal="p", quota=2)))
    ok(s.apply(acquire(0, "L2", key="b", owner="bob", principal="q")))
    # A queued acquire counts like a lease.
    assert ok(s.apply(acquire(0, "W1", key="b", principal="p", quota=2, wait=100)))["queued"]
    refused(s.apply(acquire(0, "L3", key="c", principal="p", quota=2)), "QUOTA_EXCEEDED")
    assert s.held_by == {"p": 2, "q": 1}
    ok(s.apply(acquire(0, "L3", key="c", principal="p", quota=3)))
    ok(s.apply(release(1, "L1", key="a", principal="p")))
    ok(s.apply(acquire(1, "L4", key="d", principal="p", quota=3)))
    # Without a principal (no auth) there is nothing to count.
    ok(s.apply(acquire(1, "L5", key="e", quota=1)))
    ok(s.apply(acquire(1, "L6", key="f", quota=1)))
    assert s.held_by == {"p": 3, "q": 1}


def test_a_principal_queues_at_most_its_wait_quota_of_acquires() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", owner="bob", principal="q")))
    assert ok(s.apply(acquire(0, "W1", principal="p", wait=100, wait_quota=1)))["queued"]
    refused(s.apply(acquire(0, "W2", principal="p", wait=100, wait_quota=1)), "QUOTA_EXCEEDED")
    # A grant needs no waiter slot.
    ok(s.apply(acquire(0, "L2", key="free", principal="p", wait=100, wait_quota=1)))
    assert s.waiting_by == {"p": 1}


def test_at_most_waiters_total_acquires_are_queued_on_the_cluster() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", owner="bob")))
    ok(s.apply(acquire(0, "W1", wait=100, waiters_total=2)))
    ok(s.apply(acquire(0, "W2", wait=100, waiters_total=2)))
    refused(s.apply(acquire(0, "W3", wait=100, waiters_total=2)), "QUOTA_EXCEEDED")
    ok(s.apply(acquire(0, "W3", wait=100, waiters_total=3)))


def test_a_restored_store_counts_each_principals_lease_sessions_against_its_quota() -> None:
    s = LeaseStore()
    ok(s.apply(session_open(0, "S1", ttl=1000, principal="p", quota=2)))
    ok(s.apply(session_open(0, "S2", ttl=1000, principal="p", quota=2)))
    restored = LeaseStore.from_plain(copy.deepcopy(s.to_plain()))
    for store in (s, restored):
        assert store.sessions_by == {"p": 2}
        refused(
            store.apply(session_open(1, "S3", ttl=1000, principal="p", quota=2)), "QUOTA_EXCEEDED"
        )
        ok(store.apply(session_open(1, "S3", ttl=1000, principal="p", quota=3)))


def test_an_expired_lease_session_frees_one_place_of_its_principals_quota() -> None:
    s = LeaseStore()
    ok(s.apply(session_open(0, "S1", ttl=100, principal="p", quota=2)))
    ok(s.apply(session_open(0, "S2", ttl=1000, principal="p", quota=2)))
    ok(s.apply(tick(100)))
    assert "S1" not in s.lease_sessions and s.sessions_by == {"p": 1}
    ok(s.apply(session_open(100, "S3", ttl=1000, principal="p", quota=2)))
    refused(s.apply(session_open(100, "S4", ttl=1000, principal="p", quota=2)), "QUOTA_EXCEEDED")


def test_a_principal_is_counted_through_queueing_grant_and_cancel() -> None:
    s = LeaseStore()
    # A first lease, a first queued acquire and a first lease session each fit a quota
    # of 1 (nothing is counted yet).
    ok(s.apply(acquire(0, "P0", key="own", principal="p", quota=1)))
    ok(s.apply(session_open(0, "S1", ttl=10_000, principal="p", quota=1)))
    ok(s.apply(acquire(0, "Q0", key="k", owner="bob", principal="q")))
    assert ok(s.apply(acquire(0, "W1", principal="p", wait=1000, wait_quota=1)))["queued"]
    ok(s.apply(acquire(0, "W2", principal="p", wait=1000)))
    ok(s.apply(acquire(0, "W3", principal="p", wait=1000)))
    assert (s.held_by, s.waiting_by) == ({"p": 4, "q": 1}, {"p": 3})
    # Bob releases: W1 is granted (still held, no longer waiting).
    ok(s.apply(release(1, "Q0", principal="q")))
    assert "W1" in s.leases
    assert (s.held_by, s.waiting_by) == ({"p": 4}, {"p": 2})
    # W2 is withdrawn (a release of a queued acquire).
    assert ok(s.apply(release(2, "W2", principal="p")))["cancelled"] is True
    assert (s.held_by, s.waiting_by) == ({"p": 3}, {"p": 1})


# ------------------------------------------------------------------ shared objects


def test_leases_of_one_owner_share_one_copy_of_its_name_principal_and_ttl() -> None:
    s = LeaseStore()
    names = ["".join(["ali", "ce"]) for _ in range(2)]
    assert names[0] is not names[1]
    ok(s.apply(acquire(0, "L1", key="a", owner=names[0], principal="".join(["p", "1"]))))
    ok(s.apply(acquire(0, "L2", key="b", owner=names[1], principal="".join(["p", "1"]))))
    one, two = s.leases["L1"], s.leases["L2"]
    assert one.owner is two.owner and one.principal is two.principal
    assert one.ttl_ms is two.ttl_ms


def test_the_shared_copies_are_at_most_4096_objects() -> None:
    s = LeaseStore()
    for i in range(5000):
        s.share(f"owner-{i}")
        assert len(s._shared) <= 4096, i
    # Rebuilding sooner would only share less (memory): only the bound is pinned.
    assert len(s._shared) > 800


# ------------------------------------------------------------------ the dedup table


def test_a_client_id_is_forgotten_after_exactly_ten_minutes_idle() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", ttl=10, cid="idle", seq=1)))
    ok(s.apply(tick(599_999)))
    assert "idle" in s.clients
    # 10 minutes of log time (docs/design.md, "Eviction"): forgotten, so a request that
    # acknowledges an earlier one is answered as from an expired client id.
    ok(s.apply(tick(600_000)))
    assert "idle" not in s.clients
    refused(s.apply(acquire(600_001, "L2", cid="idle", seq=2, ack=2)), "SESSION_EXPIRED")


def test_a_client_may_have_4096_unacknowledged_results_and_no_more() -> None:
    s = LeaseStore()
    for seq in range(1, 4097):
        # Refusals are results too: each is kept until acknowledged.
        refused(s.apply(release(1, "nothing", cid="busy", seq=seq)), "LEASE_NOT_FOUND")
    assert len(s.clients["busy"].results) == 4096
    refused(s.apply(release(2, "nothing", cid="busy", seq=4097)), "TOO_MANY_PENDING")
    # A retry of a kept one is still answered; acknowledging one makes room for one.
    refused(s.apply(release(3, "nothing", cid="busy", seq=4096)), "LEASE_NOT_FOUND")
    refused(s.apply(release(4, "nothing", cid="busy", seq=4097, ack=2)), "LEASE_NOT_FOUND")


def test_a_client_id_kept_by_an_extend_at_its_own_last_seen_time_keeps_its_place() -> None:
    """The dedup table lists client ids in the order they were last heard from, ties in
    the order they came (the snapshot lists them so): a keep-alive that does not make a
    client later leaves it where it is."""
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", key="a", cid="first")))
    ok(s.apply(acquire(0, "L2", key="b", cid="second")))
    ok(s.apply({"op": "extend", "now": 0, "cids": ["first"]}))
    assert [row[0] for row in s.to_plain()["sessions"]] == ["first", "second"]
    ok(s.apply(tick(5)))
    ok(s.apply({"op": "extend", "now": 5, "cids": ["first"]}))
    assert [row[0] for row in s.to_plain()["sessions"]] == ["second", "first"]
    assert s.clients["first"].last_seen == 5


# ------------------------------------------------------------------ reads


def test_a_two_unit_key_reports_its_capacity_used_units_and_holders() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", owner="a", capacity=2, ttl=1000)))
    ok(s.apply(acquire(10, "L2", owner="b", capacity=2, ttl=1000)))
    assert s.holder("k", now=100) == {
        "key": "k",
        "owner": "b",
        "token": 2,
        "ttl": 1000,
        "expires_at": 1010,
        "remaining": 910,
        "unit_indices": [1],
        "capacity": 2,
        "used": 2,
        "holders": [
            {
                "key": "k",
                "owner": "a",
                "token": 1,
                "ttl": 1000,
                "expires_at": 1000,
                "remaining": 900,
                "unit_indices": [0],
            },
            {
                "key": "k",
                "owner": "b",
                "token": 2,
                "ttl": 1000,
                "expires_at": 1010,
                "remaining": 910,
                "unit_indices": [1],
            },
        ],
    }
    full = s.apply(acquire(100, "L3", owner="c", capacity=2))
    refused(full, "LEASE_HELD")
    assert full["detail"] == {
        "waiting": 0,
        "owner": "b",
        "token": 2,
        "remaining": 0.91,
        "capacity": 2,
        "used": 2,
    }
    assert full["message"] == "'k': 2 of 2 units are taken"
    # A lease id that is not among the holders is not found (no holder is named).
    stranger = s.apply(mut("renew", 100, key="k", lid="L-x"))
    refused(stranger, "LEASE_NOT_FOUND")
    assert "detail" not in stranger


def test_an_acquire_refused_on_a_plain_key_names_its_holder() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", owner="alice", ttl=1000)))
    result = s.apply(acquire(10, "L2", owner="bob"))
    refused(result, "LEASE_HELD")
    assert result["message"] == "'k' is held by 'alice'"


def test_a_leases_read_without_a_limit_lists_the_first_1000() -> None:
    s = LeaseStore()
    for i in range(1001):
        ok(s.apply(acquire(0, f"L{i}", key=f"k{i:04d}", ttl=1000)))
    listed = ok(s.apply({"op": "leases", "now": 1}))["leases"]
    assert [lease["key"] for lease in listed] == [f"k{i:04d}" for i in range(1000)]
    assert [lease["key"] for lease in s.list_leases()] == [f"k{i:04d}" for i in range(1000)]
    assert len(s.list_leases(limit=1001)) == 1001


def test_a_waiters_read_without_a_limit_lists_the_first_1000() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "H", ttl=10_000)))
    for i in range(1001):
        ok(s.apply(acquire(0, f"W{i}", owner=f"o{i:04d}", wait=10_000)))
    listed = ok(s.apply({"op": "waiters", "now": 1, "key": "k"}))
    assert listed["waiting"] == 1001
    assert [w["owner"] for w in listed["waiters"]] == [f"o{i:04d}" for i in range(1000)]
    assert len(s.list_waiters("k")["waiters"]) == 1000


def test_a_lease_is_gone_at_its_expiry_instant_between_entries() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", ttl=1000)))
    assert s.lease_status("k", "L1", now=999)["state"] == "held"
    assert s.lease_status("k", "L1", now=1000) == {"state": "gone"}


def test_a_queued_acquire_is_gone_at_its_deadline_between_entries() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", ttl=5000)))
    queued = ok(s.apply(acquire(100, "W1", owner="bob", wait=400)))
    assert (queued["queued"], queued["deadline"]) == (True, 500)
    assert s.lease_status("k", "W1", now=499) == {
        "state": "waiting",
        "position": 1,
        "deadline": 500,
    }
    assert s.lease_status("k", "W1", now=500) == {"state": "gone"}


# ------------------------------------------------------------------ queueing


def test_a_wait_of_one_millisecond_queues_until_the_next_millisecond() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", ttl=5000)))
    queued = ok(s.apply(acquire(100, "W1", owner="bob", wait=1)))
    assert (queued["queued"], queued["position"], queued["deadline"]) == (True, 1, 101)
    ok(s.apply(tick(101)))
    assert s.events == [{"type": "dequeue", "key": "k", "lease_id": "W1", "reason": "deadline"}]
    assert s.waiting == {}


def test_an_acquire_without_a_priority_ranks_as_priority_zero() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "H", ttl=1000)))
    ok(s.apply(acquire(1, "A", wait=5000)))  # no priority field
    ok(s.apply(acquire(2, "B", wait=5000, priority=0)))
    ok(s.apply(acquire(3, "C", wait=5000)))
    assert [w.lease_id for w in s.queues["k"]] == ["A", "B", "C"]
    # First come, first served within priority 0, whether stated or not.
    granted = []
    for lid in ("H", "A", "B"):
        ok(s.apply(release(10, lid)))
        granted += [e["lease_id"] for e in s.events if e["type"] == "grant"]
    assert granted == ["A", "B", "C"]


def test_an_acquire_that_fits_does_not_overtake_a_higher_priority_head() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "H", capacity=3, units=1, ttl=5000)))
    # The head wants all three units (it waits for H); behind it, a low-priority one.
    ok(s.apply(acquire(1, "W-high", capacity=3, units=3, wait=5000, priority=5)))
    ok(s.apply(acquire(2, "W-low", capacity=3, units=3, wait=5000, priority=0)))
    # One unit is free, but this acquire is outranked by the head (5 > 3): it must not
    # take the unit the head is waiting for, whatever ranks at the back of the queue.
    result = s.apply(acquire(3, "X", capacity=3, units=1, priority=3))
    refused(result, "LEASE_HELD")
    assert result["detail"]["waiting"] == 2
    assert "X" not in s.leases
    # Outranking the head, it is granted at once.
    ok(s.apply(acquire(4, "Y", capacity=3, units=1, priority=6)))


def test_transfer_to_the_id_of_a_queued_acquire_is_refused_unchanged() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "L1", ttl=5000)))
    ok(s.apply(acquire(1, "W1", owner="bob", wait=5000)))
    entry = mut("transfer", 2, key="k", lid="L1", new_lid="W1", owner="carol")
    before = copy.deepcopy(s.to_plain())
    result = s.apply(entry)
    refused(result, "BAD_REQUEST")
    assert result["message"] == "lease id already in use"
    assert s.to_plain() == before


def test_a_replayed_acquire_whose_answer_the_replay_evicts_is_refused_unchanged() -> None:
    """The lease-id guard lets a replay of an answered request through (its answer is
    replayed from the dedup table). An entry that replays an acquire after its
    client's record went idle evicts that record itself, before the acquire runs, so
    there is no answer to replay: the guard must refuse it, or the acquire would be
    granted again with the id of a live lease (a second token, a semaphore unit
    leaked for good)."""
    idle = 10 * 60 * 1000  # the dedup table forgets a client idle this long (design.md)
    s = LeaseStore()
    entry = acquire(0, "L1", key="sem", capacity=3, ttl=10 * idle, cid="c", seq=1)
    first = ok(s.apply(dict(entry)))
    before = copy.deepcopy(s.to_plain())
    result = s.apply({**entry, "now": idle})
    refused(result, "BAD_REQUEST")
    assert result["message"] == "lease id already in use"
    after = s.to_plain()  # log time moved (and the idle record left): nothing else
    for part in ("revision", "leases", "waiters", "capacity"):
        assert after[part] == before[part], part
    assert [(h.lease_id, h.token) for h in s.holders_of("sem")] == [("L1", first["token"])]
    assert s.units_used("sem") == 1
    # While the record lives, the replay is answered from it, as before; once the
    # lease has ended too, its id is free and the request is applied as new.
    s2 = LeaseStore()
    first = ok(s2.apply(dict(entry)))
    assert s2.apply({**entry, "now": idle - 1}) == first
    s3 = LeaseStore()
    ok(s3.apply({**entry, "ttl": 1000}))
    again = ok(s3.apply({**entry, "ttl": 1000, "now": idle}))
    assert again["lease_id"] == "L1" and again["token"] > first["token"]
    assert [h.lease_id for h in s3.holders_of("sem")] == ["L1"]


@pytest.mark.parametrize("fv", ["2", None, [2], 2.5, True, 0, -1])
def test_an_entry_format_that_is_not_a_positive_integer_is_refused_unchanged(fv: Any) -> None:
    """``apply`` never raises: a malformed entry format (``fv``, read when a new term
    starts) is refused, alone or in a batch, and nothing moves."""
    s = LeaseStore()
    ok(s.apply(tick(1, term=1)))
    before = copy.deepcopy(s.to_plain())
    refused(s.apply(tick(2, term=2, fv=fv)), "BAD_REQUEST")
    batch = s.apply({"op": "batch", "now": 3, "term": 3, "fv": fv, "entries": [{"op": "tick"}]})
    refused(batch["results"][0], "BAD_REQUEST")
    assert s.to_plain() == before


def test_an_entry_format_from_1_to_2_to_the_31_is_accepted() -> None:
    s = LeaseStore()
    ok(s.apply(tick(1, term=1, fv=1)))
    ok(s.apply(tick(2, term=2, fv=2**31)))
    assert (s.now, s.term) == (2, 2)
    unchanged_by(s, tick(3, term=3, fv=2**31 + 1), "BAD_REQUEST", "fv")


def test_an_entry_is_applied_when_its_tokens_reach_the_reserved_ceiling_exactly() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, "A", key="a", term=1)))
    # Every token the entry could hand out is at most the ceiling: applied.
    s.ceiling = s.revision + s.token_headroom()
    assert ok(s.apply(acquire(1, "B", key="b", term=1)))["token"] == s.revision
    s.ceiling = s.revision + s.token_headroom() - 1
    refused(s.apply(acquire(2, "C", key="c", term=1)), "UNAVAILABLE")


def test_a_lease_session_carries_at_most_its_cap_of_leases_and_waiters_together() -> None:
    # The cap is imported: it lives in raftlease/limits.py, outside the mutated core.
    s = LeaseStore()
    ok(s.apply(session_open(0, "S", ttl=60_000)))
    ok(s.apply(acquire(0, "H", key="busy", ttl=60_000)))
    ok(s.apply(acquire(0, "W", key="busy", session="S", wait=60_000)))  # one waiter
    for i in range(MAX_SESSION_LEASES - 1):  # and leases up to the cap
        entry = acquire(0, f"L{i}", key=f"k{i}", session="S", cid="c", seq=i + 1, ack=i + 1)
        assert s.apply(entry)["ok"] is True
    session = s.lease_sessions["S"]
    assert len(session.leases) + len(session.waiters) == MAX_SESSION_LEASES == 10_000
    over = acquire(0, "over", key="k-over", session="S", cid="c", seq=10_000, ack=10_000)
    before = copy.deepcopy(s.to_plain())
    refused(s.apply(over), "INVALID_ARGUMENT")
    # A refusal: nothing granted or queued (only the client's cached answer is new).
    after = s.to_plain()
    for part in ("revision", "leases", "waiters", "lease_sessions", "capacity"):
        assert after[part] == before[part], part
    assert "over" not in s.leases


@pytest.mark.parametrize("count", [1, 20])
def test_stale_expiry_entries_stay_within_64_or_4_per_live_lease(count: int) -> None:
    """Each renewal leaves a stale entry in the expiry heap; the heap is rebuilt when it
    holds more than 64 entries and more than 4 per live lease, so after any entry of
    one renewal it holds at most max(64, 4 x leases) + 1."""
    s = LeaseStore()
    for i in range(count):
        ok(s.apply(acquire(0, f"L{i}", key=f"k{i}", ttl=100_000)))
    bound = max(64, 4 * count) + 1
    largest = 0
    for n in range(500):
        lid = f"L{n % count}"
        ok(s.apply(mut("renew", 1 + n, key=f"k{n % count}", lid=lid)))
        largest = max(largest, len(s._deadlines))
        assert largest <= bound, n
    # Rebuilding sooner would be as correct (memory only): only the bound is pinned.
    assert len(s.leases) == count
    assert all(lease.expires_at > 100_000 for lease in s.leases.values())


# ------------------------------------------------------------------ order of effects


def test_a_waiter_is_granted_when_the_waiter_ahead_of_it_leaves_not_one_behind_it() -> None:
    """Two lease sessions end in one entry. Each ends in turn (its queued acquires
    leave, then its leases end), and a waiter blocked by the head of its queue is
    granted when that head leaves: not earlier, when a waiter behind it leaves. The
    tokens (revisions) follow that order."""
    s = LeaseStore()
    ok(s.apply(session_open(0, "a", ttl=1000)))
    ok(s.apply(session_open(0, "b", ttl=1000)))
    ok(s.apply(acquire(0, "H", capacity=2, units=1, ttl=10_000)))  # token 1
    ok(s.apply(acquire(0, "W1", capacity=2, units=2, session="b", wait=5000)))  # the head
    ok(s.apply(acquire(0, "X", capacity=2, units=1, ttl=10_000, wait=5000)))  # fits; blocked
    ok(s.apply(acquire(0, "W2", capacity=2, units=1, session="a", wait=5000)))  # behind X
    ok(s.apply(acquire(0, "L", key="o", session="a")))  # token 2
    assert [w.lease_id for w in s.queues["k"]] == ["W1", "X", "W2"]
    ok(s.apply(tick(1000)))  # both sessions expire; "a" ends first (id order)
    assert [(e["type"], e.get("lease_id"), e.get("token")) for e in s.events] == [
        ("dequeue", "W2", None),
        ("expire", "L", 2),
        ("session_end", None, None),
        ("dequeue", "W1", None),
        ("grant", "X", 4),
        ("session_end", None, None),
    ]
    assert s.leases["X"].token == 4
    assert s.queues == {}


# ------------------------------------------------------------------ the snapshot layout


def test_a_fresh_store_snapshots_as_log_time_zero_term_zero_and_nothing_else() -> None:
    assert LeaseStore().to_plain() == {
        "v": 9,
        "now": 0,
        "term": 0,
        "revision": 0,
        "ceiling": 0,
        "applied": 0,
        "expired_total": 0,
        "capacity": [],
        "leases": [],
        "lease_sessions": [],
        "queue_order": 0,
        "waiters": [],
        "sessions": [],
        "tasks": EMPTY_TASKS_V6,
        "budgets": {"budgets": [], "outcomes": []},
        "fair": [],
        "deadlock_refusals": [],
        "preempt": {"priorities": [], "requests": []},
        "cert_keys": [],
        "audit": {"base": "00" * 32, "head": "00" * 32, "seq": 1, "records": []},
    }


def _golden_store() -> LeaseStore:
    s = LeaseStore()
    ok(s.apply(session_open(100, "S", ttl=5000, cid="c1", seq=1, term=2)))
    ok(s.apply(acquire(200, "L1", owner="alice", ttl=1000, cid="c1", seq=2, ack=2, term=2)))
    ok(s.apply(acquire(300, "W1", owner="bob", ttl=800, wait=500, priority=2, cid="c2", term=2)))
    ok(s.apply(acquire(300, "W2", owner="dan", ttl=700, wait=900, cid="c2", seq=2, term=2)))
    pool = acquire(300, "P1", key="pool", owner="carol", capacity=3, units=2, session="S")
    ok(s.apply({**pool, "value": "v", "cid": "c3", "term": 2}))
    return s


#: The plain form of ``_golden_store()`` in layout version 3: what a node writes to
#: disk and sends to a follower. Restoring it must give back exactly this store.
GOLDEN_V3: dict[str, Any] = {
    "v": 3,
    "now": 300,
    "term": 2,
    "revision": 2,
    "applied": 5,
    "expired_total": 0,
    "capacity": [["k", 1], ["pool", 3]],
    "leases": [
        ["k", "L1", "alice", 1, 1000, 200, 1200, 1, "", ""],
        ["pool", "P1", "carol", 2, 5000, 300, 5100, 2, "v", "S"],
    ],
    "lease_sessions": [["S", "svc", 5000, 5100]],
    "queue_order": 2,
    "waiters": [
        ["k", "W1", "bob", 800, 2, 1, 800, 1, "", ""],
        ["k", "W2", "dan", 700, 0, 2, 1200, 1, "", ""],
    ],
    "sessions": [
        [
            "c1",
            200,
            2,
            [
                [
                    2,
                    {
                        "ok": True,
                        "key": "k",
                        "owner": "alice",
                        "token": 1,
                        "lease_id": "L1",
                        "ttl": 1000,
                        "expires_at": 1200,
                        "now": 200,
                        "revision": 1,
                    },
                ]
            ],
        ],
        [
            "c2",
            300,
            1,
            [
                [
                    1,
                    {
                        "ok": True,
                        "queued": True,
                        "key": "k",
                        "owner": "bob",
                        "lease_id": "W1",
                        "position": 1,
                        "deadline": 800,
                        "now": 300,
                    },
                ],
                [
                    2,
                    {
                        "ok": True,
                        "queued": True,
                        "key": "k",
                        "owner": "dan",
                        "lease_id": "W2",
                        "position": 2,
                        "deadline": 1200,
                        "now": 300,
                    },
                ],
            ],
        ],
        [
            "c3",
            300,
            1,
            [
                [
                    1,
                    {
                        "ok": True,
                        "key": "pool",
                        "owner": "carol",
                        "token": 2,
                        "lease_id": "P1",
                        "ttl": 5000,
                        "expires_at": 5100,
                        "now": 300,
                        "revision": 2,
                        "units": 2,
                        "value": "v",
                        "session": "S",
                    },
                ]
            ],
        ],
    ],
}


#: Layout 4 adds the fencing-token ceiling: the first entry (term 2) reserved one
#: step above its headroom (no leases yet: 8).
#: And each dedup answer keeps the fingerprint of the request it answered.
GOLDEN_FINGERPRINTS = {
    ("c1", 2): "4e9d1cdca864cd0b3adbea06781fd013",
    ("c2", 1): "a9f934a4f6df3e134860880ef2631f8f",
    ("c2", 2): "68c44b8e7105d1d0208cdb2fd9dc4a4b",
    ("c3", 1): "eccf4048600adc4934e47cd93d9c56c7",
}
GOLDEN_V4 = {
    **GOLDEN_V3,
    "v": 4,
    "ceiling": 8 + TOKEN_RESERVE_STEP,
    "sessions": [
        [cid, seen, acked, [[seq, res, GOLDEN_FINGERPRINTS[cid, seq]] for seq, res in results]]
        for cid, seen, acked, results in GOLDEN_V3["sessions"]
    ],
}


#: Layout 5 adds the task queues (core/queue.py); a store without tasks has these.
EMPTY_TASKS: dict[str, Any] = {
    "order": 0,
    "queues": [],
    "tasks": [],
    "attempts": [],
    "claims": [],
    "dead": [],
    "by_session": [],
}
#: Layout 5 rows of pool leases may carry a 12th field: the unit indices they hold
#: (principal "" before it). A snapshot written before them restores with the lowest
#: free indices, oldest grant first; its cached answers stay as they were.
POOL_ROW = ["pool", "P1", "carol", 2, 5000, 300, 5100, 2, "v", "S", "", [0, 1]]
RESTORED_V5 = {
    **GOLDEN_V4,
    "v": 5,
    "tasks": EMPTY_TASKS,
    "leases": [GOLDEN_V4["leases"][0], POOL_ROW],
}
GOLDEN_V5 = {
    **RESTORED_V5,
    # The live store's cached answer to the pool acquire names the units too.
    "sessions": [
        [
            cid,
            seen,
            acked,
            [
                [seq, {**res, "unit_indices": [0, 1]} if res.get("key") == "pool" else res, fp]
                for seq, res, fp in results
            ],
        ]
        for cid, seen, acked, results in GOLDEN_V4["sessions"]
    ],
}


#: Layout 6 adds the shared budgets (core/budget.py) and the task queues' counters (the
#: metrics'): no budgets and all counters 0 in a store without them. A layout 5 snapshot
#: restores with none and with the counters at 0.
EMPTY_BUDGETS: dict[str, Any] = {"budgets": [], "outcomes": []}
EMPTY_TASKS_V6: dict[str, Any] = {
    **EMPTY_TASKS,
    "totals": [
        ["claims", 0],
        ["completions", 0],
        ["dead_letters", 0],
        ["expiries", 0],
        ["retries", 0],
    ],
}
RESTORED_V6 = {**RESTORED_V5, "v": 6, "tasks": EMPTY_TASKS_V6, "budgets": EMPTY_BUDGETS}
GOLDEN_V6 = {**GOLDEN_V5, "v": 6, "tasks": EMPTY_TASKS_V6, "budgets": EMPTY_BUDGETS}
#: Layout 7 adds fair shares (a task's fairness key, a queue's virtual time and
#: tenants): the golden store has no tasks, so only the version differs
#: (tests/unit/test_core_fair.py has the golden rows of queues and tasks).
RESTORED_V7 = {**RESTORED_V6, "v": 7}
GOLDEN_V7 = {**GOLDEN_V6, "v": 7}
#: Layout 8 adds the fair shares of wait queues (``fair``; a waiter's fairness key ends
#: its row): the golden store's waiters name none, so only the version and an empty
#: ``fair`` differ (tests/unit/test_core_fair_waiters.py has rows with fair shares).
RESTORED_V8 = {**RESTORED_V7, "v": 8, "fair": []}
GOLDEN_V8 = {**GOLDEN_V7, "v": 8, "fair": []}
#: Layout 9 adds the deadlock refusals kept for long-polls and the preemption tables
#: (grant priorities, yield requests), the lease certificate signing keys
#: (``cert_keys``, core/certkeys.py) and the audit trail (``audit``, core/audit.py):
#: the golden store has none of the first three, and a snapshot of an older layout
#: restores with an empty trail.
EMPTY_AUDIT = {"base": "00" * 32, "head": "00" * 32, "seq": 1, "records": []}
_V9 = {
    "deadlock_refusals": [],
    "preempt": {"priorities": [], "requests": []},
    "cert_keys": [],
    "audit": EMPTY_AUDIT,
}
RESTORED_V9 = {**RESTORED_V8, "v": 9, **_V9}
GOLDEN_V9 = {**GOLDEN_V8, "v": 9, **_V9}
#: The golden store's own trail: its two grants, each with the revision it made.
GOLDEN_AUDIT = {
    "base": "00" * 32,
    "head": "a080031037d1e8bcc33fecafc8f3ed6bc55a27351a6a4bae15890c2578799971",
    "seq": 3,
    "records": [
        [1, 200, "grant", "k", 1, "alice", "", "", 1],
        [2, 300, "grant", "pool", 2, "carol", "", "", 2],
    ],
}


def test_the_snapshot_layout_is_version_9_field_for_field() -> None:
    assert _golden_store().to_plain() == {**GOLDEN_V9, "audit": GOLDEN_AUDIT}
    restored = LeaseStore.from_plain(copy.deepcopy({**GOLDEN_V9, "audit": GOLDEN_AUDIT}))
    assert restored.to_plain()["audit"] == GOLDEN_AUDIT


def test_a_version_8_snapshot_restores_to_the_same_store() -> None:
    assert LeaseStore.from_plain(copy.deepcopy(GOLDEN_V8)).to_plain() == GOLDEN_V9


def test_a_version_7_snapshot_restores_to_the_same_store() -> None:
    assert LeaseStore.from_plain(copy.deepcopy(GOLDEN_V7)).to_plain() == GOLDEN_V9


def test_a_version_6_snapshot_restores_to_the_same_store() -> None:
    assert LeaseStore.from_plain(copy.deepcopy(GOLDEN_V6)).to_plain() == GOLDEN_V9


def test_a_version_5_snapshot_restores_with_no_budgets_and_zero_tallies() -> None:
    assert LeaseStore.from_plain(copy.deepcopy(GOLDEN_V5)).to_plain() == GOLDEN_V9


def test_a_version_4_snapshot_restores_to_the_same_store() -> None:
    restored = LeaseStore.from_plain(copy.deepcopy(GOLDEN_V4))
    assert restored.to_plain() == RESTORED_V9
    assert restored.leases["P1"].slots == (0, 1)
    # And it goes on exactly as the store that wrote it: the next waiter is order 3.
    live = _golden_store()
    later = acquire(400, "W3", owner="eve", wait=100, cid="c4", term=2)
    assert restored.apply(dict(later)) == live.apply(dict(later))
    # Identical but for the old cached answer to the pool acquire (no unit indices).
    # (and the trail: the live store's records its history, the restored one's only
    # what came after the restore)
    assert {**restored.to_plain(), "sessions": None, "audit": None} == {
        **live.to_plain(),
        "sessions": None,
        "audit": None,
    }
    assert restored.queues["k"][-1].order == 3


def test_a_version_3_snapshot_gets_a_ceiling_one_step_above_its_revision() -> None:
    restored = LeaseStore.from_plain(copy.deepcopy(GOLDEN_V3))
    assert restored.to_plain() == {
        **GOLDEN_V3,
        "v": 9,
        "fair": [],
        **_V9,
        "tasks": EMPTY_TASKS_V6,
        "budgets": EMPTY_BUDGETS,
        "leases": RESTORED_V5["leases"],
        "ceiling": GOLDEN_V3["revision"] + TOKEN_RESERVE_STEP,
        # Answers from before fingerprints have none: returned to any retry, as before.
        "sessions": [
            [cid, seen, acked, [[seq, res, ""] for seq, res in results]]
            for cid, seen, acked, results in GOLDEN_V3["sessions"]
        ],
    }
    # Tokens go on from the revision within the term; a new term jumps past the ceiling.
    live = _golden_store()
    later = acquire(400, "W3", owner="eve", wait=100, cid="c4", term=2)
    assert restored.apply(dict(later)) == live.apply(dict(later))
    jump = restored.apply(acquire(500, "N1", key="new", owner="f", cid="c5", term=3))
    assert jump["token"] == GOLDEN_V3["revision"] + TOKEN_RESERVE_STEP + 1


# ------------------------------------------------------------------ task queues


def task_mut(op: str, now: int, **fields: Any) -> Entry:
    """A mutating entry on queue "q" (from a fresh client id)."""
    return mut(op, now, **{"queue": "q", **fields})


def put(now: int, tid: str, **fields: Any) -> Entry:
    return task_mut("task_put", now, tid=tid, **{"payload": "{}", **fields})


def claim(now: int, aid: str, **fields: Any) -> Entry:
    return task_mut("task_claim", now, aid=aid, worker="w", **fields)


def task_fail(now: int, tid: str, aid: str, **fields: Any) -> Entry:
    return task_mut("task_fail", now, tid=tid, aid=aid, **{"error": "boom", **fields})


def task_get(s: LeaseStore, now: int, tid: str) -> dict[str, Any]:
    task: dict[str, Any] = ok(s.apply({"op": "task_get", "now": now, "queue": "q", "tid": tid}))[
        "task"
    ]
    return task


def test_a_retried_dead_task_gets_all_its_attempts_again() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T", max_attempts=2)))
    ok(s.apply(claim(0, "A1")))
    assert ok(s.apply(task_fail(1, "T", "A1", retry_after=0)))["status"] == "ready"
    ok(s.apply(claim(1, "A2")))
    assert ok(s.apply(task_fail(2, "T", "A2", retry_after=0)))["status"] == "dead"
    ok(s.apply(task_mut("task_retry", 3, tid="T")))
    assert task_get(s, 3, "T")["failures"] == 0
    ok(s.apply(claim(3, "A3")))
    assert ok(s.apply(task_fail(4, "T", "A3", retry_after=0)))["status"] == "ready"
    assert task_get(s, 4, "T")["failures"] == 1
    ok(s.apply(claim(4, "A4")))
    assert ok(s.apply(task_fail(5, "T", "A4", retry_after=0)))["status"] == "dead"
    assert task_get(s, 5, "T")["dead_reason"] == "failed 2 of 2 attempts"


def test_a_waiting_claim_is_gone_at_its_deadline_even_for_a_task_ready_that_instant() -> None:
    s = LeaseStore()
    assert ok(s.apply(claim(0, "A1", wait=100)))["deadline"] == 100
    assert ok(s.apply(claim(0, "A2", wait=101)))["deadline"] == 101
    ok(s.apply(put(0, "T", delay=100)))
    ok(s.apply(tick(100)))
    # The delayed task became ready at 100, when A1's wait was over: A2 gets it.
    assert {"type": "task_claim_gone", "lease_id": "A1", "reason": "deadline"} in s.events
    assert task_get(s, 100, "T")["status"] == "claimed"
    assert s.tasks.current["T"] == "A2"
    assert "A1" not in s.tasks.claims


@pytest.mark.parametrize("count", [1, 20])
def test_stale_ready_items_stay_within_64_or_4_per_ready_task(count: int) -> None:
    """A ready task that dies (its deadline passed) leaves a stale item in its ready
    heap; a push rebuilds the heap when it holds more than 64 items and more than 4 per
    ready task, so after any entry it holds at most max(64, 4 x ready tasks)."""
    s = LeaseStore()
    for i in range(count):
        ok(s.apply(put(0, f"live{i}")))
    largest = 0
    for n in range(300):
        ok(s.apply(put(2 * n, f"dies{n}", deadline=1)))
        heap = s.tasks.queues["q"].tenants[""].ready[()]
        largest = max(largest, len(heap))
        assert largest <= max(64, 4 * (count + 1)), n
        ok(s.apply(tick(2 * n + 1)))
        assert task_get(s, 2 * n + 1, f"dies{n}")["status"] == "dead"
        ok(s.apply(task_mut("task_purge", 2 * n + 1, tid=f"dies{n}")))
    # Rebuilding sooner would be as correct (memory only): only the bound is pinned.
    assert largest > 60
    assert sorted(t.tid for t in s.tasks.tasks.values()) == sorted(f"live{i}" for i in range(count))


def test_a_full_task_history_forgets_its_oldest_row_when_none_was_a_release() -> None:
    """A task keeps the newest 200 attempts (2 x the most attempts a task may have)."""
    s = LeaseStore()
    ok(s.apply(put(0, "T", max_attempts=1)))
    for n in range(1, 202):
        ok(s.apply(claim(n, f"A{n}")))
        assert ok(s.apply(task_fail(n, "T", f"A{n}")))["status"] == "dead"
        ok(s.apply(task_mut("task_retry", n, tid="T")))
    history = task_get(s, 202, "T")["history"]
    assert [row[0] for row in history] == list(range(2, 202))
    assert {row[5] for row in history} == {"failed"}


def test_a_task_failed_with_a_retry_after_of_1_ms_is_ready_1_ms_later() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T")))
    ok(s.apply(claim(0, "A1")))
    failed = ok(s.apply(task_fail(10, "T", "A1", retry_after=1)))
    assert (failed["status"], failed["ready_at"]) == ("delayed", 11)
    assert ok(s.apply(claim(10, "A2")))["claimed"] is False
    ok(s.apply(tick(11)))
    assert task_get(s, 11, "T")["status"] == "ready"
    assert ok(s.apply(claim(11, "A3")))["tid"] == "T"


@pytest.mark.parametrize("count", [1, 40])
def test_stale_completed_items_stay_within_64_or_2_per_completed_task(count: int) -> None:
    """A purged completed task leaves a stale item in the heap the count bound picks its
    victims from; a completion rebuilds it when it holds more than 64 items and more
    than 2 per completed task, so after any entry it holds at most max(64, 2 x
    completed tasks)."""
    s = LeaseStore()
    for i in range(count):
        ok(s.apply(put(0, f"kept{i}")))
        ok(s.apply(claim(0, f"K{i}")))
        ok(s.apply(task_mut("task_complete", 0, tid=f"kept{i}", aid=f"K{i}", result="1")))
    largest = 0
    for n in range(1, 300):
        ok(s.apply(put(n, f"T{n}")))
        ok(s.apply(claim(n, f"A{n}")))
        ok(s.apply(task_mut("task_complete", n, tid=f"T{n}", aid=f"A{n}", result="1")))
        largest = max(largest, len(s.tasks._completed))
        assert largest <= max(64, 2 * (count + 1)), n
        ok(s.apply(task_mut("task_purge", n, tid=f"T{n}")))
    # Rebuilding sooner would be as correct (memory only): only the bound is pinned.
    assert largest > 60
    assert s.tasks.completed == count


def test_a_task_without_a_backoff_backs_off_as_with_1000_ms() -> None:
    runs = []
    for fields in ({}, {"backoff": 1000}):
        s = LeaseStore()
        ok(s.apply(put(0, "T", max_attempts=3, **fields)))
        ok(s.apply(claim(0, "A1")))
        first = ok(s.apply(task_fail(10, "T", "A1")))
        ok(s.apply(tick(first["ready_at"])))
        ok(s.apply(claim(first["ready_at"], "A2")))
        second = ok(s.apply(task_fail(first["ready_at"], "T", "A2")))
        runs.append((first, second))
    assert runs[0] == runs[1]
    # Equal jitter: half of the backoff fixed, half drawn; doubled after each failure
    # (the second's fixed half tells 1000 ms from any other default).
    first, second = runs[0]
    assert first["status"] == "delayed" and 510 <= first["ready_at"] <= 1010
    assert first["ready_at"] + 1000 <= second["ready_at"] <= first["ready_at"] + 2000


def test_a_completed_task_without_a_retention_is_kept_exactly_one_hour() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T")))
    ok(s.apply(claim(0, "A1")))
    ok(s.apply(task_mut("task_complete", 10, tid="T", aid="A1", result="1")))
    ok(s.apply(tick(3_600_009)))
    assert task_get(s, 3_600_009, "T")["status"] == "completed"
    ok(s.apply(tick(3_600_010)))
    gone = s.apply({"op": "task_get", "now": 3_600_010, "queue": "q", "tid": "T"})
    refused(gone, "TASK_NOT_FOUND")


def test_a_claim_without_a_ttl_holds_its_task_30_seconds() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T")))
    assert ok(s.apply(claim(5, "A1")))["expires_at"] == 30_005
    ok(s.apply(tick(30_004)))
    assert task_get(s, 30_004, "T")["status"] == "claimed"
    ok(s.apply(tick(30_005)))
    assert task_get(s, 30_005, "T")["status"] != "claimed"


def test_a_queue_holds_at_most_10000_waiting_claims() -> None:
    s = LeaseStore()
    for i in range(10_000):
        ok(s.apply(claim(0, f"A{i}", wait=1000)))
    refused(s.apply(claim(0, "A-last", wait=1000)), "QUOTA_EXCEEDED")
    # Per queue: another queue still takes one.
    assert ok(s.apply(claim(0, "B", queue="other", wait=1000)))["queued"] is True


def test_a_task_payload_result_and_error_may_be_16_kib_16_kib_and_2_kib() -> None:
    s = LeaseStore()
    unchanged_by(s, put(0, "T", payload="x" * (16 * 1024 + 1)), "BAD_REQUEST", "payload")
    ok(s.apply(put(0, "T", payload="x" * (16 * 1024))))
    ok(s.apply(put(0, "U", payload="é" * (8 * 1024))))  # bytes, not characters
    ok(s.apply(claim(0, "A1")))
    ok(s.apply(claim(0, "B1")))
    too_long = task_mut("task_complete", 1, tid="T", aid="A1", result="x" * (16 * 1024 + 1))
    unchanged_by(s, too_long, "BAD_REQUEST", "result")
    ok(s.apply(task_mut("task_complete", 1, tid="T", aid="A1", result="x" * (16 * 1024))))
    unchanged_by(s, task_fail(2, "U", "B1", error="x" * 2049), "BAD_REQUEST", "error")
    ok(s.apply(task_mut("task_fail", 2, tid="U", aid="B1", error="x" * 2048)))


def test_a_claim_is_gone_at_its_expiry_or_deadline_instant_between_entries() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T")))
    assert ok(s.apply(claim(0, "A1", ttl=1000)))["expires_at"] == 1000
    assert s.tasks.claim_status("q", "A1", now=999)["state"] == "claimed"
    assert s.tasks.claim_status("q", "A1", now=1000) == {"state": "gone"}
    assert ok(s.apply(claim(0, "A2", wait=500)))["deadline"] == 500
    assert s.tasks.claim_status("q", "A2", now=499) == {"state": "waiting", "deadline": 500}
    assert s.tasks.claim_status("q", "A2", now=500) == {"state": "gone"}


def test_task_stats_count_zero_for_what_a_queue_never_had() -> None:
    s = LeaseStore()
    zeros = {
        "ready": 0,
        "delayed": 0,
        "claimed": 0,
        "dead": 0,
        "completed": 0,
        "waiting_claims": 0,
        "attempts": 0,
    }
    stats = {"op": "task_stats", "queue": "q"}
    empty = {**zeros, "queue": "q", "oldest_ready_age": None}
    assert ok(s.apply({**stats, "now": 0}))["stats"] == empty
    ok(s.apply(put(1, "T")))
    ok(s.apply(put(3, "U")))
    assert ok(s.apply({**stats, "now": 5}))["stats"] == {
        **zeros,
        "queue": "q",
        "ready": 2,
        "oldest_ready_age": 4,
    }


def test_a_heartbeats_progress_is_a_finite_number_within_2_to_the_62() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T")))
    ok(s.apply(claim(0, "A1")))
    for good in (2**62, -(2**62), 0.5):
        ok(s.apply(task_mut("task_heartbeat", 1, tid="T", aid="A1", progress=good)))
    for bad in (2**62 + 1, -(2**62) - 1, float("inf"), float("nan"), True, "1"):
        beat = task_mut("task_heartbeat", 1, tid="T", aid="A1", progress=bad)
        unchanged_by(s, beat, "BAD_REQUEST", "progress")


@pytest.mark.parametrize("count", [1, 20])
def test_stale_attempt_expiries_stay_within_64_or_4_per_attempt(count: int) -> None:
    """Each heartbeat leaves a stale item in the attempts' expiry heap; an entry rebuilds
    it (before its own change) when it holds more than 64 items and more than 4 per live
    attempt, so after any entry of one heartbeat it holds at most max(64, 4 x attempts)
    + 1."""
    s = LeaseStore()
    for i in range(count):
        ok(s.apply(put(0, f"T{i}")))
        ok(s.apply(claim(0, f"A{i}", ttl=100_000)))
    largest = 0
    for n in range(500):
        i = n % count
        ok(s.apply(task_mut("task_heartbeat", 1 + n, tid=f"T{i}", aid=f"A{i}")))
        largest = max(largest, len(s.tasks._expiries))
        assert largest <= max(64, 4 * count) + 1, n
    # Rebuilding sooner would be as correct (memory only): only the bound is pinned.
    assert largest > 60
    assert len(s.tasks.attempts) == count
