"""The lease certificate holder key is bound to the lease at its grant (issue 39, the
security fix; docs/certificates.md "Which key a certificate binds"): an acquire's
``holder_key`` is stored with the lease (or its queued acquire, then bound at the grant
from the queue), a renewal naming another key, or naming one for a lease granted
without one, is refused ``HOLDER_KEY_MISMATCH`` and changes nothing, and the keys
survive a snapshot. Pure unit tests of ``LeaseStore``; the real-cluster half is in
tests/integration/test_certificates.py."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from raftlease.core import LeaseStore

pytestmark = pytest.mark.timeout(60)

Entry = dict[str, Any]

KEY_A = "a1" * 32
KEY_B = "b2" * 32

_cids = itertools.count(1)


def mut(op: str, now: int, **fields: Any) -> Entry:
    return {"op": op, "now": now, "cid": f"c{next(_cids)}", "seq": 1, "ack": 1, **fields}


def acquire(now: int, lid: str, key: str = "k", **fields: Any) -> Entry:
    return mut("acquire", now, key=key, lid=lid, owner="agent", ttl=1000, **fields)


def renew(now: int, lid: str, key: str = "k", **fields: Any) -> Entry:
    return mut("renew", now, key=key, lid=lid, **fields)


def observable(store: LeaseStore) -> Any:
    """The state a renewal could change (the dedup table records every answer, every
    entry moves log time and the applied count, and a refusal is recorded in the audit
    refusal ring: test_a_mismatch_is_recorded_as_a_refusal)."""
    plain = store.to_plain()
    skip = ("sessions", "now", "applied", "audit_refusals")
    return {k: v for k, v in plain.items() if k not in skip}


def test_a_mismatch_is_recorded_as_a_refusal() -> None:
    """docs/audit.md "Refusals": the refused renewal is in the refusal ring, with the
    key and the requester (the lease's own principal: another one is refused
    PERMISSION_DENIED first); the ownership trail has no record of it."""
    store = LeaseStore()
    store.apply(acquire(10, "L1", holder_key=KEY_A, principal="alice"))
    trail = list(store.audit.records)
    refused = store.apply(renew(20, "L1", holder_key=KEY_B, principal="alice"))
    assert refused["code"] == "HOLDER_KEY_MISMATCH"
    (record,) = store.audit_refusals.records
    assert (record[2], record[3], record[7]) == ("holder_key_mismatch", "k", "alice")
    assert list(store.audit.records) == trail


def test_the_key_named_at_the_grant_is_stored_and_only_it_renews_with_a_key() -> None:
    store = LeaseStore()
    assert store.apply(acquire(10, "L1", holder_key=KEY_A))["ok"]
    assert store.leases["L1"].holder == bytes.fromhex(KEY_A)
    assert store.apply(renew(20, "L1", holder_key=KEY_A))["expires_at"] == 1020
    before = observable(store)
    refused = store.apply(renew(30, "L1", holder_key=KEY_B))
    assert refused["ok"] is False and refused["code"] == "HOLDER_KEY_MISMATCH"
    # Nothing changed: not the expiry, not the revision, not the bound key.
    assert observable(store) == before
    assert store.leases["L1"].holder == bytes.fromhex(KEY_A)
    # With a new TTL too (a renewal that would change the lease): refused unchanged.
    assert store.apply(renew(31, "L1", holder_key=KEY_B, ttl=9000))["code"] == (
        "HOLDER_KEY_MISMATCH"
    )
    assert observable(store) == before
    # A renewal naming no key renews as before (its answer gets no certificate).
    assert store.apply(renew(40, "L1"))["expires_at"] == 1040


def test_a_key_named_for_a_lease_granted_without_one_is_refused() -> None:
    store = LeaseStore()
    assert store.apply(acquire(10, "L1"))["ok"]
    assert store.leases["L1"].holder is None
    before = observable(store)
    refused = store.apply(renew(20, "L1", holder_key=KEY_A))
    assert refused["code"] == "HOLDER_KEY_MISMATCH"
    assert observable(store) == before
    assert store.apply(renew(30, "L1"))["ok"]


def test_a_queued_acquire_keeps_its_key_and_the_grant_from_the_queue_binds_it() -> None:
    store = LeaseStore()
    store.apply(acquire(10, "L1", holder_key=KEY_A))
    queued = store.apply(acquire(11, "L2", holder_key=KEY_B, wait=5000))
    assert queued["queued"] is True
    assert store.waiting["L2"].holder == bytes.fromhex(KEY_B)
    # Through a snapshot while it waits: the waiter keeps its key.
    restored = LeaseStore.from_plain(copy.deepcopy(store.to_plain()))
    assert restored.waiting["L2"].holder == bytes.fromhex(KEY_B)
    # The same entries on both (a replica that lived through it, one restored).
    entries = [
        mut("release", 20, key="k", lid="L1"),
        renew(21, "L2", holder_key=KEY_A),
        renew(22, "L2", holder_key=KEY_B),
    ]
    for s in (store, restored):
        s.apply(copy.deepcopy(entries[0]))
        assert s.leases["L2"].holder == bytes.fromhex(KEY_B)
        assert s.apply(copy.deepcopy(entries[1]))["code"] == "HOLDER_KEY_MISMATCH"
        assert s.apply(copy.deepcopy(entries[2]))["ok"]
    assert store.to_plain() == restored.to_plain()


def test_holder_keys_survive_a_snapshot_and_a_snapshot_without_them_loads() -> None:
    store = LeaseStore()
    plain = store.to_plain()
    assert "holder_keys" not in plain  # written only when a key is bound
    store.apply(acquire(10, "L1", holder_key=KEY_A))
    store.apply(acquire(11, "L2", key="other"))
    plain = store.to_plain()
    assert plain["holder_keys"] == [["L1", KEY_A]]
    again = LeaseStore.from_plain(copy.deepcopy(plain))
    assert again.to_plain() == plain
    assert again.leases["L1"].holder == bytes.fromhex(KEY_A)
    assert again.leases["L2"].holder is None
    # An older layout 9 (before the fix) has no holder_keys: nothing is bound.
    older = {k: v for k, v in plain.items() if k != "holder_keys"}
    assert LeaseStore.from_plain(older).leases["L1"].holder is None


@pytest.mark.parametrize(
    "entry",
    [
        acquire(10, "L1", holder_key="A1" * 32),  # upper case
        acquire(10, "L1", holder_key="a1" * 31),  # too short
        acquire(10, "L1", holder_key=5),
        acquire(10, "L1", holder_key=None),
        mut("release", 10, key="k", lid="L1", holder_key=KEY_A),  # not for a release
    ],
)
def test_a_malformed_holder_key_entry_is_refused_unchanged(entry: Entry) -> None:
    store = LeaseStore()
    before = store.to_plain()
    result = store.apply(entry)
    assert result["ok"] is False and result["code"] == "BAD_REQUEST"
    assert "holder_key" in result["message"]
    assert {k: v for k, v in store.to_plain().items() if k != "now"} == {
        k: v for k, v in before.items() if k != "now"
    }


def test_a_transfer_binds_the_new_holders_key_never_the_old_ones() -> None:
    store = LeaseStore()
    store.apply(acquire(10, "L1", holder_key=KEY_A))
    moved = store.apply(
        mut("transfer", 20, key="k", lid="L1", owner="b", new_lid="L2", holder_key=KEY_B)
    )
    assert moved["ok"] and store.leases["L2"].holder == bytes.fromhex(KEY_B)
    assert store.apply(renew(21, "L2", holder_key=KEY_A))["code"] == "HOLDER_KEY_MISMATCH"
    # Without a key the new lease has none (the old holder's is not carried over).
    store.apply(mut("transfer", 30, key="k", lid="L2", owner="c", new_lid="L3"))
    assert store.leases["L3"].holder is None
    assert store.apply(renew(31, "L3", holder_key=KEY_B))["code"] == "HOLDER_KEY_MISMATCH"


def test_a_set_binds_its_key_to_every_lease_also_when_granted_from_the_queue() -> None:
    store = LeaseStore()
    got = store.apply(
        mut(
            "acquire_many",
            10,
            lid="S1",
            owner="a",
            ttl=1000,
            keys=[["x", 1], ["y", 1]],
            holder_key=KEY_A,
        )
    )
    assert [store.leases[one["lease_id"]].holder for one in got["leases"]] == [
        bytes.fromhex(KEY_A)
    ] * 2
    queued = store.apply(
        mut(
            "acquire_many",
            11,
            lid="S2",
            owner="b",
            ttl=1000,
            wait=5000,
            keys=[["x", 1], ["y", 1]],
            holder_key=KEY_B,
        )
    )
    assert queued["queued"] is True
    restored = LeaseStore.from_plain(copy.deepcopy(store.to_plain()))
    close = mut("session_close", 20, sid="S1")
    for s in (store, restored):
        assert s.apply(copy.deepcopy(close))["ok"]
        assert {s.leases[f"S2/{i}"].holder for i in (0, 1)} == {bytes.fromhex(KEY_B)}
    assert store.to_plain() == restored.to_plain()


def task_entry(op: str, now: int, **fields: Any) -> Entry:
    return mut(op, now, queue="q", **fields)


def test_a_task_claim_binds_its_key_to_the_attempt_and_heartbeats_check_it() -> None:
    store = LeaseStore()
    assert store.apply(task_entry("task_put", 10, tid="T1", payload="{}", quota=100))["ok"]
    claimed = store.apply(task_entry("task_claim", 11, aid="A1", worker="w", holder_key=KEY_A))
    assert claimed["claimed"] is True
    assert store.tasks.attempts["A1"].holder == bytes.fromhex(KEY_A)
    before = observable(store)
    refused = store.apply(task_entry("task_heartbeat", 20, tid="T1", aid="A1", holder_key=KEY_B))
    assert refused["code"] == "HOLDER_KEY_MISMATCH"
    assert observable(store) == before
    assert store.apply(task_entry("task_heartbeat", 21, tid="T1", aid="A1", holder_key=KEY_A))["ok"]
    assert store.apply(task_entry("task_heartbeat", 22, tid="T1", aid="A1"))["ok"]
    # A waiting claim keeps its key (also through a snapshot) and binds it when handed
    # a task.
    assert store.apply(
        task_entry("task_claim", 23, aid="A2", worker="w", wait=5000, holder_key=KEY_B)
    )["queued"]
    plain = store.to_plain()
    assert plain["attempt_holder_keys"] == [["A1", KEY_A], ["A2", KEY_B]]
    restored = LeaseStore.from_plain(copy.deepcopy(plain))
    assert restored.to_plain() == plain
    put = task_entry("task_put", 30, tid="T2", payload="{}", quota=100)
    for s in (store, restored):
        s.apply(copy.deepcopy(put))
        assert s.tasks.attempts["A2"].holder == bytes.fromhex(KEY_B)
    assert store.to_plain() == restored.to_plain()
    older = {k: v for k, v in plain.items() if k != "attempt_holder_keys"}
    assert LeaseStore.from_plain(older).tasks.attempts["A1"].holder is None
