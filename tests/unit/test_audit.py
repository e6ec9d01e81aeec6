"""The audit trail (issue 39, docs/audit.md), the pure half: which changes make records
and with whom, the hash chain catching a changed or missing record, retention folding
the oldest into the base, snapshots, and two replicas of one log agreeing. The
integration half (every node, the CLI) is tests/integration/test_audit.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import raftlease.core.audit as audit_module
from raftlease.core import LeaseStore
from raftlease.core.audit import ZERO, verify_chain
from tests.unit.test_core_tasks import claim, done, put
from tests.unit.test_core_tasks import ok as task_ok

pytestmark = pytest.mark.timeout(60)


def acquire(now: int, lid: str, key: str = "k", principal: str = "", **more: Any) -> dict[str, Any]:
    entry = {
        "op": "acquire",
        "now": now,
        "term": 1,
        "key": key,
        "owner": f"o-{lid}",
        "ttl": 1000,
        "lid": lid,
        **more,
    }
    if principal:
        entry["principal"] = principal
    return env(entry)


_SEQ = iter(range(1, 10**9))


def env(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with a dedup envelope of its own (a fresh client id each)."""
    return {**entry, "term": 1, "cid": f"c{next(_SEQ)}", "seq": 1, "ack": 1}


def kinds(store: LeaseStore) -> list[tuple[Any, ...]]:
    """(type, key, token, owner, holder principal, by) of every kept record."""
    return [tuple(r[2:8]) for r in store.audit.records]


def test_lease_changes_are_recorded_with_holder_and_actor() -> None:
    s = LeaseStore()
    assert s.apply(acquire(10, "L1", principal="alice"))["ok"]
    assert s.apply(env({"op": "renew", "now": 20, "key": "k", "lid": "L1", "principal": "alice"}))[
        "ok"
    ]
    assert s.apply(
        env({"op": "release", "now": 30, "key": "k", "lid": "L1", "principal": "alice"})
    )["ok"]
    assert s.apply(acquire(40, "L2", principal="bob"))["ok"]
    assert s.apply(env({"op": "revoke", "now": 50, "key": "k", "principal": "admin"}))["ok"]
    assert s.apply(acquire(60, "L3", principal="carol"))["ok"]
    assert s.apply({"op": "tick", "now": 2000, "term": 1})["ok"]  # L3 expires
    assert kinds(s) == [
        ("grant", "k", 1, "o-L1", "alice", "alice"),
        ("renew", "k", 1, "o-L1", "alice", "alice"),
        ("release", "k", 1, "o-L1", "alice", "alice"),
        ("grant", "k", 4, "o-L2", "bob", "bob"),
        ("revoke", "k", 4, "o-L2", "bob", "admin"),
        ("grant", "k", 6, "o-L3", "carol", "carol"),
        ("expire", "k", 6, "o-L3", "carol", ""),
    ]
    seqs = [r[0] for r in s.audit.records]
    assert seqs == list(range(1, 8))
    assert [r[1] for r in s.audit.records] == [10, 20, 30, 40, 50, 60, 2000]
    assert verify_chain(s.audit.base, list(s.audit.records), s.audit.head) is None


def test_a_refused_request_makes_no_record() -> None:
    s = LeaseStore()
    s.apply(acquire(10, "L1"))
    before = list(s.audit.records)
    refused = s.apply(acquire(11, "L2"))
    assert refused["ok"] is False and refused["code"] == "LEASE_HELD"
    assert list(s.audit.records) == before


def test_task_claims_and_completions_are_recorded_with_the_worker() -> None:
    s = LeaseStore()
    task_ok(s.apply({**put(10, "T1"), "term": 1}))
    task_ok(s.apply({**claim(20, "A1", worker="w7"), "term": 1, "principal": "agent-7"}))
    task_ok(s.apply({**done(30, "T1", "A1"), "term": 1, "principal": "agent-7"}))
    records = [(r[2], r[3], r[5], r[7]) for r in s.audit.records]
    assert records[0][:2] == ("task_put", "queue:q/T1")
    assert ("task_claim", "queue:q/T1", "w7", "agent-7") in records
    assert records[-1] == ("task_complete", "queue:q/T1", "w7", "agent-7")


def test_a_changed_or_missing_record_breaks_the_chain() -> None:
    s = LeaseStore()
    for i in range(5):
        s.apply(acquire(10 + i, f"L{i}", key=f"k{i}"))
    records = [list(r) for r in s.audit.records]
    assert verify_chain(ZERO, records, s.audit.head) is None
    changed = copy.deepcopy(records)
    changed[2][4] += 1  # a token
    assert verify_chain(ZERO, changed, s.audit.head) is not None
    renamed = copy.deepcopy(records)
    renamed[3][5] = "mallory"
    assert verify_chain(ZERO, renamed, s.audit.head) is not None
    assert verify_chain(ZERO, records[:2] + records[3:], s.audit.head) == 2  # one dropped
    assert verify_chain(ZERO, records[:-1], s.audit.head) == 4  # the newest dropped


def test_retention_keeps_the_newest_and_folds_the_rest_into_the_base(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(audit_module, "MAX_AUDIT_RECORDS", 3)
    s = LeaseStore()
    for i in range(5):
        s.apply(acquire(10 + i, f"L{i}", key=f"k{i}"))
    assert [r[0] for r in s.audit.records] == [3, 4, 5]
    assert s.audit.base != ZERO and s.audit.seq == 6
    assert verify_chain(s.audit.base, list(s.audit.records), s.audit.head) is None
    # The same history unbounded ends at the same head: trimming never changes it.
    monkeypatch.setattr(audit_module, "MAX_AUDIT_RECORDS", 100)
    full = LeaseStore()
    for i in range(5):
        full.apply(acquire(10 + i, f"L{i}", key=f"k{i}"))
    assert full.audit.head == s.audit.head


def test_the_trail_survives_a_snapshot_and_replicas_agree() -> None:
    entries = [acquire(10 + i, f"L{i}", key=f"k{i % 2}", principal="p") for i in range(6)]
    entries.append({"op": "tick", "now": 5000, "term": 1})
    a, b = LeaseStore(), LeaseStore()
    for entry in entries[:4]:
        a.apply(copy.deepcopy(entry))
        b.apply(copy.deepcopy(entry))
    restored = LeaseStore.from_plain(copy.deepcopy(b.to_plain()))
    for entry in entries[4:]:
        a.apply(copy.deepcopy(entry))
        restored.apply(copy.deepcopy(entry))
    assert restored.to_plain()["audit"] == a.to_plain()["audit"]
    assert restored.audit.head == a.audit.head


def test_a_restored_trail_keeps_the_snapshot_s_rows_not_copies() -> None:
    """A restart holds the unpacked snapshot and the store being built from it at the
    same time: a copy of each audit row beside the snapshot's own was ~2 MiB of a
    restart's peak with a full trail (docs/performance.md)."""
    s = LeaseStore()
    for i in range(6):
        assert s.apply(acquire(10 + i, f"L{i}", key=f"k{i}", principal="p"))["ok"]
    plain = copy.deepcopy(s.to_plain())
    restored = LeaseStore.from_plain(plain)
    rows = plain["audit"]["records"]
    assert len(rows) == len(restored.audit.records) >= 6
    assert all(kept is row for kept, row in zip(restored.audit.records, rows, strict=True))
    assert restored.audit.head == s.audit.head


def test_a_snapshot_with_a_tampered_record_does_not_carry_its_stored_head() -> None:
    """Restoring recomputes the chain from the records: the stored head is not
    trusted, so a changed record shows as a new head (nodes disagree: visible)."""
    s = LeaseStore()
    for i in range(3):
        s.apply(acquire(10 + i, f"L{i}", key=f"k{i}"))
    plain = copy.deepcopy(s.to_plain())
    plain["audit"]["records"][1][5] = "mallory"
    assert LeaseStore.from_plain(plain).audit.head != s.audit.head


def test_select_filters_by_key_principal_and_since() -> None:
    s = LeaseStore()
    s.apply(acquire(10, "L1", key="a", principal="alice"))
    s.apply(acquire(11, "L2", key="b", principal="bob"))
    s.apply(env({"op": "revoke", "now": 12, "key": "a", "principal": "admin"}))
    assert [r[0] for r in s.audit.select(key="a")] == [1, 3]
    assert [r[0] for r in s.audit.select(principal="admin")] == [3]
    assert [r[0] for r in s.audit.select(principal="alice")] == [1, 3]
    assert [r[0] for r in s.audit.select(since=2)] == [2, 3]
    assert [r[0] for r in s.audit.select(limit=1)] == [1]


# ------------------------------------------------------------------ refusals


def refusals(store: LeaseStore) -> list[tuple[Any, ...]]:
    """(type, key, token, owner, holder principal, by) of every kept refusal record."""
    return [tuple(r[2:8]) for r in store.audit_refusals.records]


def _refusing_log() -> list[dict[str, Any]]:
    """alice holds k; bob renews and releases it under a lease id not his (NOT_OWNER);
    a task's first attempt completes after it was given up (STALE_ATTEMPT)."""
    return [
        acquire(10, "L1", principal="alice", ttl=10**6),
        env({"op": "renew", "now": 20, "key": "k", "lid": "L9", "principal": "bob"}),
        env({"op": "release", "now": 30, "key": "k", "lid": "L9", "principal": "bob"}),
        {**put(40, "T1"), "term": 1},
        {**claim(50, "A1", worker="w7"), "term": 1, "principal": "agent-7"},
        {**claim(40000, "A2", worker="w8"), "term": 1, "principal": "agent-8"},
        {**done(40010, "T1", "A1"), "term": 1, "principal": "agent-7"},
    ]


def test_refusals_are_recorded_in_their_own_ring_and_change_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NOT_OWNER and STALE_ATTEMPT decided by the state machine are recorded with the
    requester; with the ring hooked out, the same log gives the same state (the hook
    touches nothing but the ring); a retry of a refused request records nothing."""
    s = LeaseStore()
    answers = [s.apply(copy.deepcopy(e)) for e in _refusing_log()]
    assert [a.get("code") for a in answers] == [
        None, "NOT_OWNER", "NOT_OWNER", None, None, None, "STALE_ATTEMPT"
    ]  # fmt: skip
    token = answers[0]["token"]
    assert refusals(s) == [
        ("not_owner", "k", token, "o-L1", "", "bob"),
        ("not_owner", "k", token, "o-L1", "", "bob"),
        ("stale_attempt", "queue:q/T1", answers[5].get("token", 0), "", "", "agent-7"),
    ]
    assert all(r[2] not in ("not_owner", "stale_attempt") for r in s.audit.records)
    # The same refused entry again (a client's retry): answered from the dedup
    # table, no second record.
    again = {**_refusing_log()[1], "cid": "retry", "now": 40020}
    assert s.apply(copy.deepcopy(again))["code"] == "NOT_OWNER"
    assert s.apply(copy.deepcopy(again))["code"] == "NOT_OWNER"
    assert len(s.audit_refusals.records) == 4  # the first of "retry" only

    log = _refusing_log()
    quiet = LeaseStore()
    monkeypatch.setattr(LeaseStore, "_audit_refusal", lambda *_: None)
    for e in log:
        quiet.apply(copy.deepcopy(e))
    monkeypatch.undo()
    loud = LeaseStore()
    for e in log:
        loud.apply(copy.deepcopy(e))
    assert len(loud.audit_refusals.records) == 3
    assert "audit_refusals" not in quiet.to_plain()
    assert {**loud.to_plain(), "audit_refusals": None} == {
        **quiet.to_plain(),
        "audit_refusals": None,
    }


def test_a_flood_of_refusals_never_evicts_ownership_history() -> None:
    """The ring keeps the newest MAX_AUDIT_REFUSALS; the ownership trail is untouched,
    and a snapshot carries the ring (its chain recomputed) and replicas agree."""
    from raftlease.limits import MAX_AUDIT_REFUSALS

    s = LeaseStore()
    s.apply(acquire(10, "L1", principal="alice", ttl=10**7))
    trail = [list(r) for r in s.audit.records]
    for i in range(MAX_AUDIT_REFUSALS + 50):
        refused = s.apply(
            env({"op": "release", "now": 20 + i, "key": "k", "lid": "Lx", "principal": "eve"})
        )
        assert refused["code"] == "NOT_OWNER"
    ring = s.audit_refusals
    assert len(ring.records) == MAX_AUDIT_REFUSALS and ring.seq == MAX_AUDIT_REFUSALS + 51
    assert ring.records[0][0] == 51
    assert verify_chain(ring.base, [list(r) for r in ring.records], ring.head) is None
    assert [list(r) for r in s.audit.records] == trail
    restored = LeaseStore.from_plain(copy.deepcopy(s.to_plain()))
    assert restored.audit_refusals.head == ring.head
    assert restored.to_plain() == s.to_plain()
