"""Unit tests of the pure lease state machine, ``raftlease.core.LeaseStore.apply``."""

from __future__ import annotations

import copy
import math
from typing import Any

import msgpack
import pytest

from raftlease import errors
from raftlease.core import (
    CLIENT_IDLE_MS,
    MAX_PENDING_PER_CLIENT,
    SNAPSHOT_VERSION,
    LeaseRecord,
    LeaseStore,
)
from raftlease.core.dedup import fingerprint, fingerprint_of, remember
from raftlease.limits import (
    MAX_ID_CHARS,
    MAX_KEY_BYTES,
    MAX_LIST,
    MAX_OWNER_BYTES,
    MAX_TTL_MS,
    TOKEN_RESERVE_STEP,
)

pytestmark = pytest.mark.timeout(60)

Entry = dict[str, Any]


# ------------------------------------------------------------------- entry builders


def acquire(
    now: int,
    key: str = "k",
    owner: str = "alice",
    ttl: int = 100,
    lid: str = "L1",
    cid: str = "c1",
    seq: int = 1,
    ack: int = 1,
) -> Entry:
    return {
        "op": "acquire",
        "now": now,
        "key": key,
        "owner": owner,
        "ttl": ttl,
        "lid": lid,
        "cid": cid,
        "seq": seq,
        "ack": ack,
    }


def renew(
    now: int,
    key: str = "k",
    lid: str = "L1",
    cid: str = "c1",
    seq: int = 2,
    ack: int = 1,
    ttl: int | None = None,
) -> Entry:
    entry: Entry = {
        "op": "renew",
        "now": now,
        "key": key,
        "lid": lid,
        "cid": cid,
        "seq": seq,
        "ack": ack,
    }
    if ttl is not None:
        entry["ttl"] = ttl
    return entry


def release(
    now: int, key: str = "k", lid: str = "L1", cid: str = "c1", seq: int = 2, ack: int = 1
) -> Entry:
    return {"op": "release", "now": now, "key": key, "lid": lid, "cid": cid, "seq": seq, "ack": ack}


def holder(now: int, key: str = "k") -> Entry:
    return {"op": "holder", "now": now, "key": key}


def tick(now: int) -> Entry:
    return {"op": "tick", "now": now}


def leases(now: int, **args: Any) -> Entry:
    return {"op": "leases", "now": now, **args}


def ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["ok"] is True, result
    return result


def code(result: dict[str, Any]) -> str:
    assert result["ok"] is False, result
    assert "message" in result
    value = result["code"]
    assert isinstance(value, str)
    assert value in errors.CODES
    return value


def held_by(store: LeaseStore, key: str) -> str | None:
    public = store.holder(key)
    if public is None:
        return None
    assert "lease_id" not in public
    owner = public["owner"]
    assert isinstance(owner, str)
    return owner


def held(store: LeaseStore, key: str) -> LeaseRecord:
    """The one lease on ``key`` (a plain lock)."""
    (lease,) = store.holders_of(key)
    return lease


def roundtrip(store: LeaseStore) -> LeaseStore:
    packed = msgpack.packb(store.to_plain())
    return LeaseStore.from_plain(msgpack.unpackb(packed, strict_map_key=False))


# --------------------------------------------------------------------- acquire


def test_acquire_grants_a_lease() -> None:
    s = LeaseStore()
    r = ok(s.apply(acquire(1000, ttl=250)))
    assert r == {
        "ok": True,
        "key": "k",
        "owner": "alice",
        "token": 1,
        "lease_id": "L1",
        "ttl": 250,
        "expires_at": 1250,
        "now": 1000,
        "revision": 1,
    }
    assert s.now == 1000
    assert s.revision == 1
    assert s.applied == 1
    assert s.holder("k") == {
        "key": "k",
        "owner": "alice",
        "token": 1,
        "ttl": 250,
        "expires_at": 1250,
        "remaining": 250,
    }


def test_acquire_of_held_key_is_lease_held_with_owner_token_remaining() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(1000, ttl=5000)))
    before = s.to_plain()["leases"]
    r = s.apply(acquire(1500, owner="bob", lid="L2", cid="c2"))
    assert code(r) == "LEASE_HELD"
    assert r["detail"] == {"owner": "alice", "token": 1, "remaining": 4.5, "waiting": 0}
    assert s.to_plain()["leases"] == before
    assert s.revision == 1
    # The detail decodes into the library's exception with typed accessors.
    exc = errors.from_wire(r["code"], r["message"], r["detail"])
    assert isinstance(exc, errors.LeaseHeldError)
    assert exc.definite
    assert (exc.owner, exc.token, exc.remaining) == ("alice", 1, 4.5)


def test_same_owner_with_a_new_lease_id_is_also_lease_held() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0)))
    assert code(s.apply(acquire(1, lid="L9", seq=2))) == "LEASE_HELD"


def test_acquire_keys_are_independent() -> None:
    s = LeaseStore()
    a = ok(s.apply(acquire(0, key="a")))
    b = ok(s.apply(acquire(0, key="b", owner="bob", lid="L2", cid="c2")))
    assert (a["token"], b["token"]) == (1, 2)
    assert held_by(s, "a") == "alice"
    assert held_by(s, "b") == "bob"


# ----------------------------------------------------------------------- renew


def test_renew_keeps_token_and_extends_from_the_entry_time() -> None:
    s = LeaseStore()
    granted = ok(s.apply(acquire(1000, ttl=100)))
    r = ok(s.apply(renew(1060)))
    assert r["token"] == granted["token"] == 1
    assert r["expires_at"] == 1160
    assert r["ttl"] == 100
    assert r["now"] == 1060
    assert r["lease_id"] == "L1"
    assert r["revision"] == 2
    # Alive past the original deadline, gone at the new one.
    assert ok(s.apply(holder(1100)))["holder"]["token"] == 1
    assert ok(s.apply(holder(1160)))["holder"] is None


def test_renew_with_a_new_ttl_sticks_for_later_renewals() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, ttl=100)))
    r = ok(s.apply(renew(10, ttl=1000)))
    assert (r["ttl"], r["expires_at"]) == (1000, 1010)
    r = ok(s.apply(renew(500, seq=3)))
    assert (r["ttl"], r["expires_at"]) == (1000, 1500)
    # A shorter ttl shortens the lease too.
    r = ok(s.apply(renew(600, seq=4, ttl=5)))
    assert r["expires_at"] == 605
    assert ok(s.apply(holder(604)))["holder"] is not None
    assert ok(s.apply(holder(605)))["holder"] is None


def test_renew_uses_log_time_when_the_entry_stamp_is_older() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(1000, ttl=100)))
    ok(s.apply(tick(1050)))
    r = ok(s.apply(renew(900)))  # a stale stamp must not shorten the lease
    assert r["now"] == 1050
    assert r["expires_at"] == 1150


def test_renew_with_a_strangers_lease_id_is_not_owner() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, ttl=1000)))
    leases_before = s.to_plain()["leases"]
    r = s.apply(renew(10, lid="L-stranger", cid="c2", seq=1))
    assert code(r) == "NOT_OWNER"
    assert r["detail"] == {"owner": "alice", "token": 1}
    assert "L1" not in repr(r)
    assert s.to_plain()["leases"] == leases_before
    assert s.revision == 1


def test_renew_after_expiry_or_release_or_never_is_lease_not_found() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, ttl=100)))
    assert code(s.apply(renew(100))) == "LEASE_NOT_FOUND"  # exactly at expires_at
    ok(s.apply(acquire(200, key="k2", lid="L2", seq=3)))
    ok(s.apply(release(210, key="k2", lid="L2", seq=4)))
    assert code(s.apply(renew(220, key="k2", lid="L2", seq=5))) == "LEASE_NOT_FOUND"
    assert code(s.apply(renew(230, key="never", lid="L3", seq=6))) == "LEASE_NOT_FOUND"
    assert s.leases == {}


# --------------------------------------------------------------------- release


def test_release_frees_the_key() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, ttl=1000)))
    r = ok(s.apply(release(10)))
    assert r == {"ok": True, "key": "k", "token": 1, "revision": 2}
    assert ok(s.apply(holder(11)))["holder"] is None
    g = ok(s.apply(acquire(12, owner="bob", lid="L2", cid="c2")))
    assert g["token"] == 3


def test_release_with_a_strangers_lease_id_is_not_owner() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, ttl=1000)))
    r = s.apply(release(10, lid="nope", cid="c2", seq=1))
    assert code(r) == "NOT_OWNER"
    assert r["detail"]["owner"] == "alice"
    assert s.holder("k") is not None


def test_release_twice_is_lease_not_found() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, ttl=1000)))
    ok(s.apply(release(10)))
    assert code(s.apply(release(20, seq=3))) == "LEASE_NOT_FOUND"
    exc = errors.from_wire("LEASE_NOT_FOUND", "gone")
    assert isinstance(exc, errors.LeaseNotFoundError)


# ---------------------------------------------------------------------- expiry


def test_expiry_is_exactly_at_expires_at() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(1000, ttl=100)))
    assert ok(s.apply(holder(1099)))["holder"]["remaining"] == 1
    assert s.leases
    assert ok(s.apply(holder(1100)))["holder"] is None
    assert s.leases == {}
    assert s.expired_total == 1
    assert s.revision == 2
    g = ok(s.apply(acquire(1100, owner="bob", lid="L2", cid="c2")))
    assert g["token"] == 3


def test_expiry_happens_on_any_entry_even_tick() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, key="a", ttl=10)))
    ok(s.apply(acquire(0, key="b", ttl=20, lid="L2", seq=2)))
    ok(s.apply(acquire(0, key="c", ttl=30, lid="L3", seq=3)))
    assert s.next_deadline() == 10
    r = ok(s.apply(tick(25)))
    assert r == {"ok": True, "now": 25}
    assert sorted(s.holders) == ["c"]
    assert s.expired_total == 2
    assert s.revision == 5
    assert s.next_deadline() == 30


def test_holder_method_hides_expired_lease_between_entries() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, ttl=10)))
    s.now = 10  # as if log time had reached the deadline without an entry yet
    assert s.holder("k") is None
    assert s.list_leases() == []


def test_lease_not_found_after_expiry() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, ttl=10)))
    assert code(s.apply(release(50))) == "LEASE_NOT_FOUND"


def test_many_renewals_rebuild_the_deadline_heap_and_expiry_still_works() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, ttl=1000)))
    for i in range(200):
        ok(s.apply(renew(i, seq=2 + i, ack=2 + i)))
    assert len(s._deadlines) <= 65
    assert s.next_deadline() is not None
    assert held(s, "k").expires_at == 199 + 1000
    assert ok(s.apply(holder(1198)))["holder"] is not None
    assert ok(s.apply(holder(1199)))["holder"] is None
    assert s.expired_total == 1


# ------------------------------------------------------------------------ time


def test_log_time_never_goes_backwards() -> None:
    s = LeaseStore()
    assert ok(s.apply(tick(1000)))["now"] == 1000
    assert ok(s.apply(tick(500)))["now"] == 1000
    assert s.now == 1000
    r = ok(s.apply(acquire(400, ttl=50)))
    assert r["now"] == 1000
    assert r["expires_at"] == 1050
    assert held(s, "k").granted_at == 1000
    assert ok(s.apply(holder(0)))["now"] == 1000
    assert ok(s.apply(tick(1001)))["now"] == 1001


def test_an_entry_from_an_older_term_is_refused_and_changes_nothing() -> None:
    s = LeaseStore()
    ok(s.apply({**tick(100), "term": 3}))
    before = s.to_plain()
    for stale in (tick(5000), acquire(5000), holder(5000), leases(5000)):
        r = s.apply({**stale, "term": 2})
        assert code(r) == "NOT_LEADER"
        assert s.to_plain() == before
    assert code(s.apply(acquire(5000))) == "NOT_LEADER"  # no term at all is term 0
    # Not cached in the session: the client's retry at the new leader is applied.
    assert ok(s.apply({**acquire(150), "term": 3}))["expires_at"] == 250
    assert ok(s.apply({**tick(200), "term": 3}))["now"] == 200
    assert ok(s.apply({**tick(300), "term": 4}))["now"] == 300
    assert s.term == 4
    assert isinstance(errors.from_wire("NOT_LEADER", ""), errors.NotLeaderError)


# -------------------------------------------------------------------- fencing


def test_fencing_tokens_strictly_increase_per_key_across_grant_release_expire() -> None:
    s = LeaseStore()
    tokens: list[int] = []
    tokens.append(ok(s.apply(acquire(0, ttl=100, lid="A", seq=1, ack=1)))["token"])
    ok(s.apply(renew(10, lid="A", seq=2, ack=2)))
    ok(s.apply(release(20, lid="A", seq=3, ack=3)))
    tokens.append(ok(s.apply(acquire(30, ttl=10, lid="B", seq=4, ack=4)))["token"])
    ok(s.apply(tick(40)))  # B expires
    tokens.append(ok(s.apply(acquire(41, ttl=10, lid="C", seq=5, ack=5)))["token"])
    ok(s.apply(acquire(42, key="other", lid="D", seq=6, ack=6)))
    ok(s.apply(release(43, lid="C", seq=7, ack=7)))
    tokens.append(ok(s.apply(acquire(44, ttl=10, lid="E", seq=8, ack=8)))["token"])
    assert tokens == [1, 4, 6, 9]


# ----------------------------------------------------------------------- reads


def test_reads_never_reveal_the_lease_id() -> None:
    s = LeaseStore()
    secret = "secret-lease-id-1234"
    ok(s.apply(acquire(0, ttl=1000, lid=secret)))
    results = [
        s.apply(holder(1)),
        s.apply(leases(2)),
        s.apply(leases(3, prefix="k", limit=1)),
        s.apply(acquire(4, owner="bob", lid="other", cid="c2")),  # LEASE_HELD
        s.apply(renew(5, lid="other", cid="c2", seq=2)),  # NOT_OWNER
        s.apply(release(6, lid="other", cid="c2", seq=3)),  # NOT_OWNER
    ]
    for r in results:
        assert secret not in repr(r), r
        assert "lease_id" not in repr(r), r
    assert held_by(s, "k") == "alice"


def test_holder_of_unknown_key_is_none() -> None:
    s = LeaseStore()
    assert s.apply(holder(7, key="nobody")) == {"ok": True, "holder": None, "now": 7, "revision": 0}


def test_leases_filters_by_prefix_sorts_and_limits() -> None:
    s = LeaseStore()
    for i, key in enumerate(["b/2", "a/1", "b/1", "c", "b/3"]):
        ok(s.apply(acquire(0, key=key, ttl=100 + i, lid=f"L{i}", seq=i + 1)))
    r = ok(s.apply(leases(10)))
    assert [x["key"] for x in r["leases"]] == ["a/1", "b/1", "b/2", "b/3", "c"]
    r = ok(s.apply(leases(10, prefix="b/")))
    assert [x["key"] for x in r["leases"]] == ["b/1", "b/2", "b/3"]
    r = ok(s.apply(leases(10, prefix="b/", limit=2)))
    assert [x["key"] for x in r["leases"]] == ["b/1", "b/2"]
    assert r["leases"][0] == {
        "key": "b/1",
        "owner": "alice",
        "token": 3,
        "ttl": 102,
        "expires_at": 102,
        "remaining": 92,
    }
    assert ok(s.apply(leases(10, prefix="zzz")))["leases"] == []


def test_reads_and_ticks_do_not_change_revision_or_sessions() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, ttl=1000)))
    before = s.to_plain()
    ok(s.apply(holder(5)))
    ok(s.apply(leases(6)))
    ok(s.apply(tick(7)))
    after = s.to_plain()
    assert after["revision"] == before["revision"]
    assert after["sessions"] == before["sessions"]
    assert after["leases"] == before["leases"]
    assert after["applied"] == before["applied"] + 3
    assert after["now"] == 7


# -------------------------------------------------------------------- sessions


def test_duplicate_seq_returns_the_identical_first_result_and_does_not_grant_twice() -> None:
    s = LeaseStore()
    first = ok(s.apply(acquire(0, ttl=1000)))
    plain = s.to_plain()
    again = s.apply(acquire(5, ttl=1000))
    assert again is first
    assert again == first
    # A retry carrying another lease id (say, a re-proposal) still gets the first result.
    third = s.apply(acquire(6, ttl=1000, lid="L-retry"))
    assert third is first
    after = s.to_plain()
    assert after["revision"] == plain["revision"] == 1
    assert after["leases"] == plain["leases"]
    assert held(s, "k").lease_id == "L1"


def test_duplicate_of_a_failed_request_returns_the_cached_failure() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, ttl=10, cid="holder")))
    held = s.apply(acquire(1, owner="bob", lid="L2", cid="c2"))
    assert code(held) == "LEASE_HELD"
    ok(s.apply(tick(100)))  # the key is free now
    assert s.apply(acquire(101, owner="bob", lid="L2", cid="c2")) is held
    assert s.leases == {}


def test_duplicate_release_and_renew_are_not_applied_twice() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, ttl=100)))
    r1 = ok(s.apply(renew(10, seq=2)))
    r2 = s.apply(renew(50, seq=2))
    assert r2 is r1
    assert held(s, "k").expires_at == 110
    rel = ok(s.apply(release(60, seq=3)))
    assert s.apply(release(61, seq=3)) is rel
    assert s.revision == 3


def test_ack_drops_cached_results() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, key="a", seq=1, ack=1)))
    ok(s.apply(acquire(0, key="b", lid="L2", seq=2, ack=1)))
    ok(s.apply(acquire(0, key="c", lid="L3", seq=3, ack=1)))
    assert sorted(s.clients["c1"].results) == [1, 2, 3]
    ok(s.apply(acquire(1, key="d", lid="L4", seq=4, ack=3)))
    assert sorted(s.clients["c1"].results) == [3, 4]
    # An acknowledged seq is gone for good: a late retry is refused, not re-applied.
    r = s.apply(acquire(2, key="a", seq=1, ack=3))
    assert code(r) == "BAD_REQUEST"
    assert s.revision == 4


def test_a_late_duplicate_of_an_acknowledged_request_is_never_applied() -> None:
    """A copy of seq 1 (sent with ack 1) reaches the log after the client moved on
    to ack 2: its cached result is gone, yet it must not be applied again."""
    s = LeaseStore()
    first = ok(s.apply(acquire(0, ttl=10, seq=1, ack=1)))
    ok(s.apply(acquire(1, key="k2", ttl=10, lid="L2", seq=2, ack=2)))
    ok(s.apply(tick(20)))  # the first lease expired: a re-apply would grant again
    late = s.apply(acquire(21, ttl=10, seq=1, ack=1))
    assert code(late) == "BAD_REQUEST"
    assert s.leases == {}
    assert first["token"] == 1
    assert s.revision == 4  # two grants, two expiries


def test_seq_below_ack_is_bad_request_and_applies_nothing() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, key="a", seq=1, ack=1)))
    before = s.to_plain()
    r = s.apply(acquire(1, key="z", lid="L9", seq=3, ack=4))
    assert code(r) == "BAD_REQUEST"
    after = s.to_plain()
    assert after["revision"] == before["revision"]
    assert after["leases"] == before["leases"]
    assert "z" not in s.holders


def test_unknown_session_with_ack_above_one_is_session_expired() -> None:
    s = LeaseStore()
    r = s.apply(acquire(0, cid="ghost", seq=5, ack=3))
    assert code(r) == "SESSION_EXPIRED"
    assert s.leases == {}
    assert s.revision == 0
    assert "ghost" not in s.clients
    assert isinstance(errors.from_wire(r["code"], r["message"]), errors.SessionExpiredError)


def test_idle_session_is_evicted_after_session_idle_ms_of_log_time() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(1000, ttl=10, cid="old", seq=1, ack=1)))
    ok(s.apply(acquire(2000, key="k2", ttl=10, lid="L2", cid="young", seq=1, ack=1)))
    ok(s.apply(tick(1000 + CLIENT_IDLE_MS - 1)))
    assert list(s.clients) == ["old", "young"]
    ok(s.apply(tick(1000 + CLIENT_IDLE_MS)))
    assert list(s.clients) == ["young"]
    # Its retry can no longer be deduplicated, so it is refused.
    r = s.apply(acquire(1000 + CLIENT_IDLE_MS + 1, key="x", lid="L3", cid="old", seq=2, ack=2))
    assert code(r) == "SESSION_EXPIRED"
    ok(s.apply(tick(2000 + CLIENT_IDLE_MS)))
    assert list(s.clients) == []


def test_activity_keeps_a_session_alive_and_reorders_eviction() -> None:
    s = LeaseStore()
    ok(s.apply(acquire(0, ttl=10, cid="a", seq=1)))
    ok(s.apply(acquire(0, key="k2", ttl=10, lid="L2", cid="b", seq=1)))
    assert code(s.apply(release(CLIENT_IDLE_MS - 1, key="gone", cid="a", seq=2, ack=2))) == (
        "LEASE_NOT_FOUND"
    )
    assert list(s.clients) == ["b", "a"]
    ok(s.apply(tick(CLIENT_IDLE_MS)))
    assert list(s.clients) == ["a"]
    assert s.clients["a"].last_seen == CLIENT_IDLE_MS - 1
    ok(s.apply(tick(2 * CLIENT_IDLE_MS - 1)))
    assert list(s.clients) == []


def test_evicted_session_with_ack_one_starts_afresh() -> None:
    """Known limit: with ``ack == 1`` an evicted client looks like a new one, so a
    retry of an old, never-acknowledged request is applied again. Clients must not
    retry past CLIENT_IDLE_MS."""
    s = LeaseStore()
    first = ok(s.apply(acquire(0, ttl=10)))
    ok(s.apply(tick(CLIENT_IDLE_MS)))
    assert s.clients == {}
    second = ok(s.apply(acquire(CLIENT_IDLE_MS + 1, ttl=10)))
    assert second["token"] > first["token"]


def test_too_many_pending_at_the_session_cap() -> None:
    s = LeaseStore()
    for seq in range(1, MAX_PENDING_PER_CLIENT + 1):
        r = s.apply(release(seq, key="missing", seq=seq, ack=1))
        assert code(r) == "LEASE_NOT_FOUND"
    assert len(s.clients["c1"].results) == MAX_PENDING_PER_CLIENT
    revision = s.revision
    r = s.apply(acquire(10_000, seq=MAX_PENDING_PER_CLIENT + 1, ack=1))
    assert code(r) == "TOO_MANY_PENDING"
    assert s.leases == {}
    assert s.revision == revision
    assert len(s.clients["c1"].results) == MAX_PENDING_PER_CLIENT
    # A retry of a cached seq is still answered from the cache.
    assert code(s.apply(release(10_001, key="missing", seq=7, ack=1))) == "LEASE_NOT_FOUND"
    # Acknowledging frees room.
    r = s.apply(acquire(10_002, seq=MAX_PENDING_PER_CLIENT + 1, ack=2))
    assert ok(r)["token"] == revision + 1
    assert isinstance(errors.from_wire("TOO_MANY_PENDING", ""), errors.TooManyPendingError)


def test_sessions_are_per_client() -> None:
    s = LeaseStore()
    a = ok(s.apply(acquire(0, key="a", cid="x", seq=1)))
    b = ok(s.apply(acquire(0, key="b", lid="L2", cid="y", seq=1)))
    assert a["key"] == "a" and b["key"] == "b"
    assert a["token"] != b["token"]


# ------------------------------------------------------------------- malformed

_VALID_ACQUIRE = acquire(100, key="m", lid="LM", cid="cm", seq=1)
_VALID_RENEW = renew(100, key="k", lid="L1", cid="c1", seq=9, ack=1)
_VALID_RELEASE = release(100, key="k", lid="L1", cid="c1", seq=9, ack=1)


def _with(entry: Entry, **changes: Any) -> Entry:
    out = dict(entry)
    out.update(changes)
    return out


def _without(entry: Entry, field: str) -> Entry:
    out = dict(entry)
    del out[field]
    return out


MALFORMED: list[Any] = [
    # not a map
    pytest.param(None, id="none"),
    pytest.param([], id="list"),
    pytest.param(["acquire"], id="list-op"),
    pytest.param("acquire", id="str"),
    pytest.param(b"\x81\xa2op\xa4tick", id="bytes"),
    pytest.param(42, id="int"),
    pytest.param(("op", "tick"), id="tuple"),
    # operation
    pytest.param({"now": 1}, id="op-missing"),
    pytest.param({"op": "steal", "now": 1}, id="op-unknown"),
    pytest.param({"op": "ACQUIRE", "now": 1}, id="op-case"),
    pytest.param({"op": "status", "now": 1}, id="op-not-replicated"),
    pytest.param({"op": None, "now": 1}, id="op-none"),
    pytest.param({"op": 1, "now": 1}, id="op-int"),
    pytest.param({"op": b"tick", "now": 1}, id="op-bytes"),
    pytest.param({"op": ["tick"], "now": 1}, id="op-unhashable-list"),
    pytest.param({"op": {"tick": 1}, "now": 1}, id="op-unhashable-map"),
    # now
    pytest.param({"op": "tick"}, id="now-missing"),
    pytest.param({"op": "tick", "now": None}, id="now-none"),
    pytest.param({"op": "tick", "now": -1}, id="now-negative"),
    pytest.param({"op": "tick", "now": 1.5}, id="now-float"),
    pytest.param({"op": "tick", "now": 2.0}, id="now-integral-float"),
    pytest.param({"op": "tick", "now": math.nan}, id="now-nan"),
    pytest.param({"op": "tick", "now": "5"}, id="now-str"),
    pytest.param({"op": "tick", "now": True}, id="now-bool"),
    pytest.param({"op": "tick", "now": 2**62 + 1}, id="now-huge"),
    pytest.param(_without(_VALID_ACQUIRE, "now"), id="acquire-now-missing"),
    pytest.param(_with(_VALID_ACQUIRE, now=False), id="acquire-now-bool"),
    # term
    pytest.param({"op": "tick", "now": 1, "term": -1}, id="term-negative"),
    pytest.param({"op": "tick", "now": 1, "term": True}, id="term-bool"),
    pytest.param({"op": "tick", "now": 1, "term": "1"}, id="term-str"),
    # ttl
    pytest.param(_without(_VALID_ACQUIRE, "ttl"), id="ttl-missing"),
    pytest.param(_with(_VALID_ACQUIRE, ttl=None), id="ttl-none"),
    pytest.param(_with(_VALID_ACQUIRE, ttl=True), id="ttl-bool"),
    pytest.param(_with(_VALID_ACQUIRE, ttl=1.5), id="ttl-float"),
    pytest.param(_with(_VALID_ACQUIRE, ttl=100.0), id="ttl-integral-float"),
    pytest.param(_with(_VALID_ACQUIRE, ttl=math.nan), id="ttl-nan"),
    pytest.param(_with(_VALID_ACQUIRE, ttl=math.inf), id="ttl-inf"),
    pytest.param(_with(_VALID_ACQUIRE, ttl=0), id="ttl-zero"),
    pytest.param(_with(_VALID_ACQUIRE, ttl=-5), id="ttl-negative"),
    pytest.param(_with(_VALID_ACQUIRE, ttl=MAX_TTL_MS + 1), id="ttl-too-big"),
    pytest.param(_with(_VALID_ACQUIRE, ttl="100"), id="ttl-str"),
    pytest.param(_with(_VALID_RENEW, ttl=0), id="renew-ttl-zero"),
    pytest.param(_with(_VALID_RENEW, ttl=-1), id="renew-ttl-negative"),
    pytest.param(_with(_VALID_RENEW, ttl=True), id="renew-ttl-bool"),
    pytest.param(_with(_VALID_RENEW, ttl=2.5), id="renew-ttl-float"),
    pytest.param(_with(_VALID_RENEW, ttl=math.nan), id="renew-ttl-nan"),
    pytest.param(_with(_VALID_RENEW, ttl=MAX_TTL_MS + 1), id="renew-ttl-too-big"),
    # key
    pytest.param(_without(_VALID_ACQUIRE, "key"), id="key-missing"),
    pytest.param(_with(_VALID_ACQUIRE, key=""), id="key-empty"),
    pytest.param(_with(_VALID_ACQUIRE, key=None), id="key-none"),
    pytest.param(_with(_VALID_ACQUIRE, key=7), id="key-int"),
    pytest.param(_with(_VALID_ACQUIRE, key=b"k"), id="key-bytes"),
    pytest.param(_with(_VALID_ACQUIRE, key="k" * (MAX_KEY_BYTES + 1)), id="key-huge"),
    pytest.param(_with(_VALID_ACQUIRE, key="é" * (MAX_KEY_BYTES // 2 + 1)), id="key-huge-utf8"),
    pytest.param(_with(_VALID_ACQUIRE, key="\ud800"), id="key-lone-surrogate"),
    pytest.param(_with(_VALID_RENEW, key=""), id="renew-key-empty"),
    pytest.param(_with(_VALID_RELEASE, key=["k"]), id="release-key-list"),
    pytest.param(holder(1, key=""), id="holder-key-empty"),
    pytest.param({"op": "holder", "now": 1}, id="holder-key-missing"),
    pytest.param(holder(1, key="x" * (MAX_KEY_BYTES + 1)), id="holder-key-huge"),
    pytest.param(_with(holder(1), key=3), id="holder-key-int"),
    pytest.param(_with(holder(1), key="\udfff"), id="holder-key-lone-surrogate"),
    # owner
    pytest.param(_without(_VALID_ACQUIRE, "owner"), id="owner-missing"),
    pytest.param(_with(_VALID_ACQUIRE, owner=""), id="owner-empty"),
    pytest.param(_with(_VALID_ACQUIRE, owner=1), id="owner-int"),
    pytest.param(_with(_VALID_ACQUIRE, owner="o" * (MAX_OWNER_BYTES + 1)), id="owner-huge"),
    pytest.param(_with(_VALID_ACQUIRE, owner="\ud83d"), id="owner-lone-surrogate"),
    # lease id
    pytest.param(_without(_VALID_ACQUIRE, "lid"), id="acquire-lid-missing"),
    pytest.param(_without(_VALID_RENEW, "lid"), id="renew-lid-missing"),
    pytest.param(_without(_VALID_RELEASE, "lid"), id="release-lid-missing"),
    pytest.param(_with(_VALID_RELEASE, lid=""), id="lid-empty"),
    pytest.param(_with(_VALID_RELEASE, lid=5), id="lid-int"),
    pytest.param(_with(_VALID_RELEASE, lid="x" * (MAX_ID_CHARS + 1)), id="lid-huge"),
    # session fields
    pytest.param(_without(_VALID_ACQUIRE, "cid"), id="cid-missing"),
    pytest.param(_with(_VALID_ACQUIRE, cid=""), id="cid-empty"),
    pytest.param(_with(_VALID_ACQUIRE, cid=1), id="cid-int"),
    pytest.param(_with(_VALID_ACQUIRE, cid="c" * (MAX_ID_CHARS + 1)), id="cid-huge"),
    pytest.param(_without(_VALID_RENEW, "seq"), id="seq-missing"),
    pytest.param(_with(_VALID_ACQUIRE, seq=0), id="seq-zero"),
    pytest.param(_with(_VALID_ACQUIRE, seq=-1), id="seq-negative"),
    pytest.param(_with(_VALID_ACQUIRE, seq=True), id="seq-bool"),
    pytest.param(_with(_VALID_ACQUIRE, seq=1.0), id="seq-float"),
    pytest.param(_with(_VALID_ACQUIRE, seq="1"), id="seq-str"),
    pytest.param(_with(_VALID_ACQUIRE, seq=2**62 + 1), id="seq-huge"),
    pytest.param(_without(_VALID_RELEASE, "ack"), id="ack-missing"),
    pytest.param(_with(_VALID_ACQUIRE, ack=0), id="ack-zero"),
    pytest.param(_with(_VALID_ACQUIRE, ack=True), id="ack-bool"),
    pytest.param(_with(_VALID_ACQUIRE, ack=None), id="ack-none"),
    # leases arguments
    pytest.param(leases(1, prefix=5), id="prefix-int"),
    pytest.param(leases(1, prefix=None), id="prefix-none"),
    pytest.param(leases(1, prefix=b"k"), id="prefix-bytes"),
    pytest.param(leases(1, prefix="p" * (MAX_KEY_BYTES + 1)), id="prefix-huge"),
    pytest.param(leases(1, prefix="\ud800"), id="prefix-lone-surrogate"),
    pytest.param(leases(1, limit=0), id="limit-zero"),
    pytest.param(leases(1, limit=-3), id="limit-negative"),
    pytest.param(leases(1, limit=MAX_LIST + 1), id="limit-too-big"),
    pytest.param(leases(1, limit="10"), id="limit-str"),
    pytest.param(leases(1, limit=1.5), id="limit-float"),
    pytest.param(leases(1, limit=True), id="limit-bool"),
    pytest.param(leases(1, limit=None), id="limit-none"),
]


def _busy_store() -> LeaseStore:
    """A store with leases, a session with cached results and a non-zero clock."""
    s = LeaseStore()
    ok(s.apply(acquire(10, ttl=1000)))
    ok(s.apply(acquire(20, key="k2", owner="bob", lid="L2", cid="c2", ttl=50)))
    assert code(s.apply(acquire(30, owner="carol", lid="L3", cid="c3"))) == "LEASE_HELD"
    ok(s.apply(renew(40)))
    return s


@pytest.mark.parametrize("entry", MALFORMED)
def test_malformed_entry_is_bad_request_and_changes_nothing(entry: Any) -> None:
    s = _busy_store()
    before = copy.deepcopy(s.to_plain())
    snapshot = copy.deepcopy(entry)
    result = s.apply(entry)  # must not raise
    assert code(result) == "BAD_REQUEST", result
    assert set(result) <= {"ok", "code", "message", "detail"}
    assert s.to_plain() == before
    assert repr(entry) == repr(snapshot)  # the entry itself is not mutated
    # The store still works afterwards.
    assert ok(s.apply(holder(50)))["holder"]["owner"] == "alice"


def test_malformed_entry_on_an_empty_store_changes_nothing() -> None:
    for param in MALFORMED:
        (entry,) = param.values
        s = LeaseStore()
        before = s.to_plain()
        assert code(s.apply(entry)) == "BAD_REQUEST"
        assert s.to_plain() == before


def test_optional_fields_may_be_absent() -> None:
    s = LeaseStore()
    assert ok(s.apply({"op": "leases", "now": 1}))["leases"] == []
    ok(s.apply(acquire(2, ttl=10)))
    r = ok(s.apply(_with(renew(3), ttl=None)))
    assert r["ttl"] == 10
    assert ok(s.apply({"op": "tick", "now": 4, "extra": {"ignored": [1, 2]}}))["now"] == 4


def test_limits_at_the_boundary_are_accepted() -> None:
    s = LeaseStore()
    big_key = "k" * MAX_KEY_BYTES
    big_owner = "o" * MAX_OWNER_BYTES
    r = ok(
        s.apply(acquire(0, key=big_key, owner=big_owner, ttl=MAX_TTL_MS, lid="x" * MAX_ID_CHARS))
    )
    assert r["expires_at"] == MAX_TTL_MS
    ok(s.apply(acquire(0, key="k1", ttl=1, lid="L2", cid="c" * MAX_ID_CHARS, seq=2**62)))
    assert ok(s.apply(leases(0, prefix="k" * MAX_KEY_BYTES, limit=MAX_LIST)))["leases"]
    assert ok(s.apply(tick(2**62)))["now"] == 2**62


# ------------------------------------------------------------------- snapshots


def test_snapshot_round_trip_through_msgpack() -> None:
    s = _busy_store()
    ok(s.apply(release(45, key="k2", lid="L2", cid="c2", seq=2)))
    ok(s.apply(acquire(46, key="k3", ttl=7, lid="L4", cid="c4", seq=1)))
    ok(s.apply({**tick(47), "term": 2}))
    plain = s.to_plain()
    assert plain["v"] == SNAPSHOT_VERSION
    assert plain["sessions"] and plain["leases"]
    restored = roundtrip(s)
    assert restored.to_plain() == plain
    assert restored.next_deadline() == min(lease.expires_at for lease in s.leases.values())

    # Both stores answer the rest of the log identically, including cached retries.
    rest = [
        acquire(48, owner="carol", lid="L3", cid="c3"),  # cached LEASE_HELD
        renew(49, seq=2),  # cached renew
        tick(53),  # k3 expires
        acquire(54, key="k3", owner="dave", lid="L5", cid="c5"),
        release(55, seq=3),
        holder(56, key="k3"),
        leases(57),
        {**tick(58), "term": 1},  # a deposed leader's entry
    ]
    results = [s.apply(entry if "term" in entry else {**entry, "term": 2}) for entry in rest]
    again = [restored.apply(entry if "term" in entry else {**entry, "term": 2}) for entry in rest]
    assert again == results
    assert [r.get("code", "OK") for r in results] == [
        "LEASE_HELD",
        "OK",
        "OK",
        "OK",
        "OK",
        "OK",
        "OK",
        "NOT_LEADER",
    ]
    assert restored.to_plain() == s.to_plain()


def test_snapshot_of_an_empty_store_round_trips() -> None:
    s = LeaseStore()
    assert roundtrip(s).to_plain() == s.to_plain()


@pytest.mark.parametrize("version", [SNAPSHOT_VERSION + 1, 0, None, "1", "missing"])
def test_snapshot_with_another_version_is_refused(version: Any) -> None:
    plain = _busy_store().to_plain()
    if version == "missing":
        del plain["v"]
    else:
        plain["v"] = version
    with pytest.raises(ValueError, match="snapshot version"):
        LeaseStore.from_plain(plain)


def test_version_2_snapshot_is_upgraded() -> None:
    """A snapshot written before shared keys and lease sessions (layout 2: seven
    fields per lease and waiter, no capacities, no lease sessions) still loads, and
    the store then behaves exactly like one that applied the same log."""
    s = _busy_store()
    ok(s.apply(acquire(46, key="q", ttl=50, lid="Q1", cid="cq", seq=1)))
    queued = {**acquire(47, key="q", ttl=50, lid="Q2", cid="cq2", seq=1), "wait": 100}
    assert ok(s.apply(queued))["queued"]
    plain = s.to_plain()
    old = {k: v for k, v in plain.items() if k not in ("capacity", "lease_sessions")}
    old["v"] = 2
    old["leases"] = [lease[:7] for lease in plain["leases"]]
    old["waiters"] = [waiter[:7] for waiter in plain["waiters"]]
    upgraded = LeaseStore.from_plain(msgpack.unpackb(msgpack.packb(old), strict_map_key=False))
    assert upgraded.to_plain() == plain
    rest = [release(48, key="q", lid="Q1", cid="cq", seq=2), tick(200)]
    assert [upgraded.apply(e) for e in rest] == [s.apply(e) for e in rest]
    assert upgraded.to_plain() == s.to_plain()


def test_a_token_is_never_reused_after_the_log_loses_its_tail() -> None:
    """A power loss with durability none can drop every entry after the last one that
    was synced, which always includes the entry that set the ceiling (it is marked
    durable). A new term's first entry jumps past that ceiling, so no token handed
    out in the lost tail comes back."""
    s = LeaseStore()
    ok(s.apply({**acquire(0, key="first", lid="F", cid="c0"), "term": 1}))
    durable = LeaseStore.from_plain(s.to_plain())  # what survives the power loss
    lost = [
        ok(s.apply({**acquire(i, key=f"k{i}", lid=f"L{i}", cid="c1", seq=i), "term": 1}))["token"]
        for i in range(1, 50)
    ]
    assert max(lost) <= s.ceiling == durable.ceiling
    after = ok(durable.apply({**acquire(60, key="k1", lid="N1", cid="c2"), "term": 2}))
    assert after["token"] > max(lost)


def test_an_entry_that_could_pass_the_ceiling_is_refused_unchanged() -> None:
    s = LeaseStore()
    ok(s.apply({**acquire(0, key="a", lid="A", cid="c0"), "term": 1}))
    s.ceiling = s.revision + s.token_headroom() - 1  # the leader's reserve is late
    before = s.to_plain()
    r = s.apply({**acquire(1, key="b", lid="B", cid="c1"), "term": 1})
    assert r["ok"] is False and r["code"] == "UNAVAILABLE"
    assert s.to_plain() == before
    reserved = ok(s.apply({"op": "reserve", "now": 2, "term": 1}))
    assert reserved["ceiling"] == s.ceiling > before["ceiling"] + TOKEN_RESERVE_STEP - 1
    ok(s.apply({**acquire(3, key="b", lid="B", cid="c1"), "term": 1}))


def test_a_cached_answer_goes_only_to_the_same_request() -> None:
    """The dedup table keeps a fingerprint of each answered request: a retry (same
    fields; the leader draws a fresh lease id) gets the first answer; another request
    under the same (cid, seq) is refused unchanged and never sees that answer."""
    s = LeaseStore()
    first = ok(s.apply(acquire(0, key="k", lid="L1", cid="victim", seq=1)))
    retry = s.apply(acquire(1, key="k", lid="L-fresh", cid="victim", seq=1))
    assert retry == first
    before = s.to_plain()
    for forged in (
        acquire(2, key="other", lid="L2", cid="victim", seq=1),
        acquire(2, key="k", owner="mallory", lid="L3", cid="victim", seq=1),
        {**acquire(2, key="k", lid="L4", cid="victim", seq=1), "ack": 2, "ttl": 99},
    ):
        r = s.apply(forged)
        assert r["ok"] is False and r["code"] == "BAD_REQUEST", r
        assert "L1" not in repr(r)
        assert s.to_plain() == before


def test_a_fingerprint_kept_undigested_is_the_digest_of_the_request_answered() -> None:
    """Nearly every answer is acknowledged without ever being compared, so a request of
    plain scalars is kept and digested only when asked (a retry, a snapshot): the same
    digest as at apply time, whatever the caller does with its dict afterwards, and the
    same in a snapshot taken at any time. A request holding a container is digested at
    once (the state machine may keep that container and change it)."""
    s = LeaseStore()
    entry = acquire(0, key="k", lid="L1", cid="c", seq=1)
    expected = fingerprint("acquire", dict(entry))
    ok(s.apply(entry))
    record = s.clients["c"]
    assert isinstance(record.fingerprints[1], tuple), "digested on the request path"
    entry["key"] = "changed"  # the caller's dict is not what is kept
    assert s.to_plain()["sessions"] == [["c", 0, 1, [[1, record.results[1], expected]]]]
    kept: object = record.fingerprints[1]
    assert kept == expected  # digested once, then kept as the digest
    assert fingerprint_of(record, 1) == expected
    assert fingerprint_of(record, 2) is None

    listed = {"op": "task_put", "queue": "q", "payload": [1, 2], "cid": "c", "seq": 2}
    remember(record, 2, "task_put", listed)
    assert record.fingerprints[2] == fingerprint("task_put", listed)


# ----------------------------------------------- revoke, waiters, sessions (issue 13)


def revoke(now: int, key: str = "k", seq: int = 1, cid: str = "admin", **args: Any) -> Entry:
    return {"op": "revoke", "now": now, "key": key, "cid": cid, "seq": seq, "ack": 1, **args}


def queued(now: int, lid: str, owner: str, wait: int = 5000, **args: Any) -> Entry:
    return {**acquire(now, owner=owner, lid=lid, cid=f"c-{lid}"), "wait": wait, **args}


def test_revoke_ends_the_lease_and_grants_the_next_waiter_in_the_same_entry() -> None:
    store = LeaseStore()
    first = ok(store.apply(acquire(10, owner="alice", lid="A")))
    ok(store.apply(queued(11, "B", "bob")))
    result = ok(store.apply(revoke(12)))
    assert result["revoked"] == 1 and result["tokens"] == [first["token"]]
    kinds = [e["type"] for e in store.events]
    assert kinds == ["revoke", "grant"]
    assert store.events[0]["token"] == first["token"]
    assert held_by(store, "k") == "bob" and held(store, "k").token > first["token"]
    # The revoked holder learns it at its next renewal, definitely.
    assert code(store.apply(renew(13, lid="A", cid="c-A", seq=2))) == "NOT_OWNER"


def test_revoke_one_lease_of_a_shared_key_by_lease_id_or_token() -> None:
    store = LeaseStore()
    tokens = {}
    for lid in ("A", "B", "C"):
        entry = {**acquire(10, owner=lid.lower(), lid=lid, cid=f"c-{lid}"), "capacity": 3}
        tokens[lid] = ok(store.apply(entry))["token"]
    assert ok(store.apply(revoke(11, lid="B")))["tokens"] == [tokens["B"]]
    assert ok(store.apply(revoke(12, seq=2, token=tokens["C"])))["tokens"] == [tokens["C"]]
    assert [lease.lease_id for lease in store.holders_of("k")] == ["A"]
    assert ok(store.apply(revoke(13, seq=3)))["tokens"] == [tokens["A"]]
    assert "k" not in store.holders and "k" not in store.capacity


def test_revoke_of_nothing_or_a_forged_lease_id_is_lease_not_found_and_changes_nothing() -> None:
    store = LeaseStore()
    ok(store.apply(acquire(10, lid="A")))
    before = (store.revision, dict(store.leases))
    assert code(store.apply(revoke(11, key="nobody"))) == "LEASE_NOT_FOUND"
    assert code(store.apply(revoke(12, seq=2, lid="forged"))) == "LEASE_NOT_FOUND"
    assert code(store.apply(revoke(13, seq=3, token=999_999))) == "LEASE_NOT_FOUND"
    assert (store.revision, dict(store.leases)) == before and store.events == []


@pytest.mark.parametrize(
    ("change", "text"),
    [
        ({"key": 5}, "'key'"),
        ({"key": ""}, "'key'"),
        ({"lid": 7}, "'lid'"),
        ({"token": True}, "'token'"),
        ({"token": 0}, "'token'"),
        ({"lid": "A", "token": 3}, "not both"),
    ],
)
def test_malformed_revoke_is_bad_request_and_changes_nothing(
    change: dict[str, Any], text: str
) -> None:
    store = LeaseStore()
    ok(store.apply(acquire(10, lid="A")))
    applied = store.applied
    result = store.apply({**revoke(11), **change})
    assert code(result) == "BAD_REQUEST" and text in result["message"]
    assert store.applied == applied and "A" in store.leases


def test_a_retried_revoke_is_answered_again_not_applied_twice() -> None:
    store = LeaseStore()
    ok(store.apply(acquire(10, lid="A")))
    ok(store.apply(queued(11, "B", "bob")))
    first = ok(store.apply(revoke(12)))
    assert ok(store.apply(revoke(13))) == first  # same (cid, seq): bob keeps the key
    assert held_by(store, "k") == "bob"


def test_revoking_an_attached_lease_leaves_its_session_alive() -> None:
    store = LeaseStore()
    session = {"op": "session_open", "now": 10, "sid": "S", "owner": "w", "ttl": 1000}
    ok(store.apply({**session, "cid": "cs", "seq": 1, "ack": 1}))
    entry = {k: v for k, v in acquire(11, lid="A", cid="cs", seq=2).items() if k != "ttl"}
    ok(store.apply({**entry, "session": "S"}))
    ok(store.apply(revoke(12)))
    assert store.lease_sessions["S"].leases == {} and "k" not in store.holders


def test_waiters_and_sessions_reads_show_no_capability() -> None:
    store = LeaseStore()
    ok(store.apply(acquire(10, owner="alice", lid="A")))
    ok(store.apply(queued(11, "B", "bob", wait=4000)))
    ok(store.apply(queued(12, "C", "carol", wait=4000, priority=5)))
    open_ = {"op": "session_open", "now": 13, "sid": "SID", "owner": "dave", "ttl": 900}
    ok(store.apply({**open_, "cid": "cs", "seq": 1, "ack": 1}))
    result = ok(store.apply({"op": "waiters", "now": 14, "key": "k"}))
    assert result["waiting"] == 2 and result["used"] == 1 and result["capacity"] == 1
    assert [(w["position"], w["owner"], w["priority"]) for w in result["waiters"]] == [
        (1, "carol", 5),
        (2, "bob", 0),
    ]
    assert result["waiters"][1]["wait_left"] == 11 + 4000 - 14
    sessions = ok(store.apply({"op": "sessions", "now": 15}))["sessions"]
    assert sessions == [{"owner": "dave", "ttl": 900, "remaining": 898, "leases": 0, "waiters": 0}]
    text = repr(result) + repr(sessions)
    assert "SID" not in text and "'B'" not in text and "'C'" not in text
    assert ok(store.apply({"op": "waiters", "now": 16, "key": "free"}))["waiters"] == []
