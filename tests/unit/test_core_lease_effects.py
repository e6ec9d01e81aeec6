"""The effect journal on plain leases in the pure state machine (issue 41;
core/lease_effects.py, docs/design.md §4h).

One journal per lease key, shared by its successive holders and fenced by the key's
live lease: the next holder sees an effect ``in_progress`` by the earlier token (with
the idempotency key) or ``committed`` (with the result); an ended lease may neither
begin nor commit (``LEASE_NOT_FOUND`` / ``NOT_OWNER``, definite); caps per key and in
all; a journal is dropped one retention period after its key's last lease ended; it
survives a snapshot, and a restored replica goes on as the live one.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from raftlease import errors
from raftlease.core import LeaseStore
from raftlease.core import lease_effects as lease_effects_module
from raftlease.limits import LEASE_EFFECT_RETENTION_MS, MAX_EFFECT_KEY_BYTES, MAX_KEY_EFFECTS

pytestmark = pytest.mark.timeout(60)

_seq = itertools.count(1)
HOUR = LEASE_EFFECT_RETENTION_MS


def mut(op: str, now: int, key: str = "k", **fields: Any) -> dict[str, Any]:
    seq = next(_seq)
    return {"op": op, "now": now, "cid": f"c{seq}", "seq": 1, "ack": 1, "key": key, **fields}


def acquire(now: int, lid: str, key: str = "k", ttl: int = 1000, **f: Any) -> dict[str, Any]:
    return mut("acquire", now, key, lid=lid, owner=lid, ttl=ttl, **f)


def begin(now: int, lid: str, effect: str = "charge", key: str = "k", **f: Any) -> dict[str, Any]:
    return mut("lease_effect_begin", now, key, lid=lid, effect=effect, **f)


def commit(now: int, lid: str, effect: str = "charge", key: str = "k", **f: Any) -> dict[str, Any]:
    return mut("lease_effect_commit", now, key, lid=lid, effect=effect, **f)


def ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["ok"] is True, result
    return result


def code(result: dict[str, Any]) -> str:
    assert result["ok"] is False, result
    assert result["code"] in errors.CODES, result
    return str(result["code"])


def handed_over(store: LeaseStore) -> tuple[int, int]:
    """A holds k (T1) and begins ``charge`` with an idempotency key; A's lease expires
    and B takes k (T2): the two tokens."""
    first = ok(store.apply(acquire(0, "A")))["token"]
    ok(store.apply(begin(10, "A", ikey="idem-17")))
    second = ok(store.apply(acquire(2000, "B")))["token"]
    return first, second


def test_the_next_holder_sees_the_intent_in_progress_then_the_commit() -> None:
    store = LeaseStore()
    first, second = handed_over(store)
    seen = ok(store.apply(begin(2010, "B", ikey="other")))
    assert seen == {"ok": True, "state": "in_progress", "effect": "charge", "key": "idem-17",
                    "token": second, "prior_token": first}  # fmt: skip
    done = ok(store.apply(commit(2020, "B", result='"receipt"')))
    assert done == {"ok": True, "effect": "charge", "already": False, "token": second,
                    "result": '"receipt"'}  # fmt: skip
    ok(store.apply(mut("release", 2030, lid="B")))
    third = ok(store.apply(acquire(2040, "C")))["token"]
    again = ok(store.apply(begin(2050, "C")))
    assert again["state"] == "committed" and again["result"] == '"receipt"'
    assert again["token"] == second and third > second
    # A second commit keeps the first result.
    assert ok(store.apply(commit(2060, "C", result='"x"'))) == {
        "ok": True, "effect": "charge", "already": True, "token": second, "result": '"receipt"'
    }  # fmt: skip


def test_the_default_idempotency_key_is_the_lease_key_and_effect() -> None:
    store = LeaseStore()
    ok(store.apply(acquire(0, "A", key="order-17")))
    assert ok(store.apply(begin(10, "A", key="order-17")))["key"] == "order-17:charge"


def test_a_long_default_idempotency_key_is_cut_to_its_limit_in_bytes() -> None:
    """A key of multi-byte characters: the derived key keeps at most
    MAX_EFFECT_KEY_BYTES UTF-8 bytes (not characters), cut at a character boundary."""
    store = LeaseStore()
    name = "任" * 300  # 3 bytes each
    ok(store.apply(acquire(0, "A", key=name[:200])))
    derived = ok(store.apply(begin(10, "A", key=name[:200])))["key"]
    assert derived == "任" * (MAX_EFFECT_KEY_BYTES // 3)
    assert len(derived.encode()) <= MAX_EFFECT_KEY_BYTES


def test_an_ended_lease_may_neither_begin_nor_commit() -> None:
    """The fence: a zombie holder's calls are refused, definitely, and change nothing."""
    store = LeaseStore()
    handed_over(store)
    before = store.lease_effects.to_plain()
    refused = store.apply(commit(2010, "A", result='"late"'))
    assert code(refused) == "NOT_OWNER" and refused["detail"]["token"] > 1
    assert code(store.apply(begin(2020, "A", effect="mail"))) == "NOT_OWNER"
    assert store.lease_effects.to_plain() == before
    ok(store.apply(mut("release", 2030, lid="B")))
    # No live lease on the key at all: LEASE_NOT_FOUND.
    assert code(store.apply(commit(2040, "B"))) == "LEASE_NOT_FOUND"
    assert code(store.apply(begin(2050, "A"))) == "LEASE_NOT_FOUND"
    assert store.lease_effects.journals["k"]["charge"][1] == "begun"


def test_a_commit_needs_a_begin_by_this_lease() -> None:
    store = LeaseStore()
    ok(store.apply(acquire(0, "A")))
    assert code(store.apply(commit(10, "A", effect="never"))) == "INVALID_ARGUMENT"
    handed = LeaseStore()
    handed_over(handed)
    # B holds the key but has not taken the intent over (no begin): refused.
    refused = handed.apply(commit(2010, "B"))
    assert code(refused) == "INVALID_ARGUMENT" and refused["detail"]["begun_by"] == 1


def test_a_shared_key_has_no_journal() -> None:
    store = LeaseStore()
    ok(store.apply(acquire(0, "A", key="pool", capacity=4)))
    assert code(store.apply(begin(10, "A", key="pool"))) == "INVALID_ARGUMENT"
    assert not store.lease_effects


def test_a_session_attached_lease_is_fenced_like_any() -> None:
    store = LeaseStore()
    ok(store.apply(mut("session_open", 0, sid="S", owner="o", ttl=1000)))
    token = ok(store.apply(mut("acquire", 0, lid="A", owner="o", session="S")))["token"]
    assert ok(store.apply(begin(10, "A")))["token"] == token


def test_the_journal_of_a_key_is_capped() -> None:
    store = LeaseStore()
    ok(store.apply(acquire(0, "A", ttl=100_000)))
    for i in range(MAX_KEY_EFFECTS):
        ok(store.apply(begin(10 + i, "A", effect=f"e{i}")))
    refused = store.apply(begin(100, "A", effect="one-more"))
    assert code(refused) == "QUOTA_EXCEEDED"
    assert refused["detail"] == {"quota": MAX_KEY_EFFECTS, "setting": "max_key_effects"}
    # A known effect is still answered (it adds no row).
    assert ok(store.apply(begin(110, "A", effect="e0")))["state"] == "in_progress"
    assert store.lease_effects.rows == MAX_KEY_EFFECTS


def test_all_journals_together_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease_effects_module, "MAX_LEASE_EFFECTS", 3)
    store = LeaseStore()
    for i in range(3):
        ok(store.apply(acquire(0, f"L{i}", key=f"k{i}", ttl=3 * HOUR)))
        ok(store.apply(begin(1, f"L{i}", key=f"k{i}")))
    ok(store.apply(acquire(2, "L3", key="k3", ttl=3 * HOUR)))
    refused = store.apply(begin(3, "L3", key="k3"))
    assert code(refused) == "QUOTA_EXCEEDED"
    assert refused["detail"] == {"quota": 3, "setting": "max_lease_effects"}
    assert "k3" not in store.lease_effects.journals
    assert code(store.apply(begin(3, "L0", key="k0", effect="second"))) == "QUOTA_EXCEEDED"
    # Space comes back when a journal is dropped (its key idle for the retention).
    ok(store.apply(mut("release", 4, key="k0", lid="L0")))
    ok(store.apply({"op": "tick", "now": 4 + HOUR}))
    assert store.lease_effects.rows == 2
    ok(store.apply(begin(5 + HOUR, "L3", key="k3")))


def test_retention_starts_when_the_last_lease_ends_and_a_new_holder_keeps_it() -> None:
    store = LeaseStore()
    ok(store.apply(acquire(0, "A")))
    ok(store.apply(begin(10, "A")))
    ok(store.apply(mut("release", 20, lid="A")))  # the key's last lease ended at 20
    ok(store.apply({"op": "tick", "now": 20 + HOUR - 1}))
    assert "k" in store.lease_effects.journals
    ok(store.apply(acquire(20 + HOUR - 1, "B", ttl=3 * HOUR)))  # held again in time
    ok(store.apply({"op": "tick", "now": 20 + 2 * HOUR}))
    assert "k" in store.lease_effects.journals  # kept while held
    assert ok(store.apply(begin(20 + 2 * HOUR, "B")))["state"] == "in_progress"
    ended = 20 + HOUR - 1 + 3 * HOUR  # B expires: the retention starts again
    ok(store.apply({"op": "tick", "now": ended + HOUR - 1}))
    assert "k" in store.lease_effects.journals
    ok(store.apply({"op": "tick", "now": ended + HOUR}))
    assert not store.lease_effects and store.lease_effects.rows == 0
    # A later holder starts a new journal: the effect is new again (documented).
    ok(store.apply(acquire(ended + HOUR, "C")))
    assert ok(store.apply(begin(ended + HOUR + 1, "C")))["state"] == "new"


def test_the_drop_heap_stays_bounded_under_many_short_leases() -> None:
    store = LeaseStore()
    ok(store.apply(acquire(0, "L0")))
    ok(store.apply(begin(1, "L0")))
    for i in range(1, 500):
        ok(store.apply(mut("release", 2 * i, lid=f"L{i - 1}")))
        ok(store.apply(acquire(2 * i + 1, f"L{i}")))
    assert len(store.lease_effects._drops) <= 64 + 1


def test_malformed_lease_effect_entries_change_nothing() -> None:
    store = LeaseStore()
    ok(store.apply(acquire(0, "A")))
    before = store.to_plain()
    for bad in (
        begin(10, "A", effect=""),
        begin(10, "A", effect=5),
        begin(10, "A", effect="e" * 300),
        begin(10, "A", ikey=""),
        begin(10, "A", ikey=["x"]),
        commit(10, "A", result=7),
        commit(10, "A", result="r" * 2000),
        mut("lease_effect_begin", 10, effect="e"),  # no lease id
    ):
        assert code(store.apply(bad)) == "BAD_REQUEST", bad
    assert store.to_plain() == before


def test_the_journal_survives_a_snapshot_and_goes_on_as_the_live_store() -> None:
    store = LeaseStore()
    handed_over(store)
    ok(store.apply(begin(2010, "B", effect="mail")))
    ok(store.apply(commit(2020, "B", effect="mail", result='"sent"')))
    ok(store.apply(mut("release", 2030, lid="B")))
    plain = store.to_plain()
    assert plain["lease_effects"]["idle"] == [["k", 2030 + HOUR]]
    restored = LeaseStore.from_plain(copy.deepcopy(plain))
    assert restored.to_plain() == plain
    rest = [acquire(2040, "C"), begin(2050, "C"), commit(2060, "C", result='"r"'),
            mut("release", 2070, lid="C"), {"op": "tick", "now": 2070 + HOUR}]  # fmt: skip
    for entry in rest:
        assert store.apply(copy.deepcopy(entry)) == restored.apply(copy.deepcopy(entry))
    assert restored.to_plain() == store.to_plain()
    assert "lease_effects" not in store.to_plain()  # dropped: the layout without it


def test_a_snapshot_without_lease_effects_loads_with_none() -> None:
    store = LeaseStore()
    ok(store.apply(acquire(0, "A")))
    plain = store.to_plain()
    assert "lease_effects" not in plain
    assert not LeaseStore.from_plain(plain).lease_effects
