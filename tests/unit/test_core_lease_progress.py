"""Progress-aware plain leases in the pure state machine (issue 41; core/progress.py,
docs/design.md §4g): a lease acquired with ``progress_timeout`` is extended by a
renewal only up to ``progress_at + progress_timeout``; a renewal with a higher
``progress`` moves ``progress_at`` to its log time; at the progress deadline the lease
ends as ``stalled`` (an event, the next waiter granted in that entry), decided in log
time. The records live and die with their lease and survive a snapshot."""

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
    return mut("acquire", who, now, key=key, owner=who, ttl=1000, lid=lid, **extra)


def renew(who: str, key: str, now: int, lid: str, **extra: Any) -> Entry:
    return mut("renew", who, now, key=key, lid=lid, **extra)


def tick(now: int) -> Entry:
    return {"op": "tick", "now": now, "fv": ENTRY_FORMAT}


@pytest.fixture(autouse=True)
def _fresh_seq() -> None:
    _SEQ.clear()


def test_renewals_without_progress_end_the_lease_as_stalled_at_the_progress_deadline() -> None:
    store = LeaseStore()
    held = store.apply(acquire("a", "k", 0, "L1", progress_timeout=2500))
    assert held["progress_timeout"] == 2500 and held["progress_at"] == 0
    assert held["expires_at"] == 1000  # the TTL is shorter than the timeout
    store.apply(acquire("b", "k", 1, "L2", wait=60_000))  # waits behind it
    for now in (700, 1400):
        assert store.apply(renew("a", "k", now, "L1"))["expires_at"] == now + 1000
    capped = store.apply(renew("a", "k", 2000, "L1"))
    assert capped["expires_at"] == 2500  # never past progress_at + progress_timeout
    store.apply(tick(2499))
    assert store.holder("k")["owner"] == "a"
    store.apply(tick(2500))
    kinds = [(e["type"], e["key"]) for e in store.events if "key" in e]
    assert kinds == [("stalled", "k"), ("grant", "k")]  # one entry, next waiter granted
    assert store.holder("k")["owner"] == "b"
    assert store.fence("k", held["token"])["current"] is False
    assert store.progress.leases == {}
    gone = store.apply(renew("a", "k", 2600, "L1", progress=5))
    assert gone["ok"] is False  # a stalled holder's renewal is refused


def test_only_a_higher_progress_restarts_the_clock_and_a_progressing_holder_keeps_it() -> None:
    store = LeaseStore()
    store.apply(acquire("a", "k", 0, "L1", progress_timeout=2000))
    now, figure = 0, 0
    for _ in range(10):  # 10 s of log time, far past the timeout
        now += 700
        figure += 1
        out = store.apply(renew("a", "k", now, "L1", progress=figure))
        assert out["ok"] and out["progress_at"] == now and out["progress"] == figure
    same = store.apply(renew("a", "k", now + 700, "L1", progress=figure))  # not higher
    assert same["progress_at"] == now and same["expires_at"] == now + 1700
    lower = store.apply(renew("a", "k", now + 1400, "L1", progress=figure - 5))
    assert lower["progress_at"] == now and lower["expires_at"] == now + 2000
    store.apply(tick(now + 2000))
    assert store.holder("k") is None
    assert [e["type"] for e in store.events if "key" in e] == ["stalled"]


def test_a_queued_acquire_starts_its_clock_when_granted_and_leaves_nothing_if_not() -> None:
    store = LeaseStore()
    store.apply(acquire("a", "k", 0, "L1"))
    queued = store.apply(acquire("b", "k", 10, "L2", wait=60_000, progress_timeout=1500))
    assert queued["queued"] and store.progress.pending == {"L2": 1500}
    copy = LeaseStore.from_plain(store.to_plain())
    assert copy.progress.pending == {"L2": 1500}
    store.apply(acquire("c", "k", 20, "L3", wait=100, progress_timeout=1500))
    store.apply(tick(120))  # its wait ran out: dequeued, its pending timeout forgotten
    assert store.progress.pending == {"L2": 1500}
    store.apply(mut("release", "a", 800, key="k", lid="L1"))
    assert store.holder("k")["owner"] == "b" and store.progress.pending == {}
    assert store.progress.leases["L2"] == [1500, 800, None]
    assert store.leases["L2"].expires_at == 1800  # ttl 1000
    store.apply(renew("b", "k", 1500, "L2"))
    assert store.leases["L2"].expires_at == 2300  # capped at 800 + 1500
    store.apply(tick(2300))
    assert [e["type"] for e in store.events if "key" in e] == ["stalled"]


def test_a_lease_without_progress_timeout_ignores_progress_and_expires_as_before() -> None:
    store = LeaseStore()
    store.apply(acquire("a", "k", 0, "L1"))
    out = store.apply(renew("a", "k", 500, "L1", progress=3))
    assert out["expires_at"] == 1500 and "progress_timeout" not in out
    store.apply(tick(1500))
    assert [e["type"] for e in store.events if "key" in e] == ["expire"]


def test_a_new_term_never_extends_past_the_progress_deadline() -> None:
    store = LeaseStore()
    store.apply(acquire("a", "k", 0, "L1", progress_timeout=1200))
    store.apply(renew("a", "k", 900, "L1"))  # expires at 1200 (capped)
    # The first entry of a new term extends every lease by its TTL: not this one's
    # past its progress deadline; nor does an ``extend`` naming it.
    store.apply({**tick(1000), "term": 2})
    assert store.leases["L1"].expires_at == 1200
    store.apply({"op": "extend", "now": 1100, "fv": ENTRY_FORMAT, "term": 2,
                 "leases": [["L1", 2100]]})  # fmt: skip
    assert store.leases["L1"].expires_at == 1200
    store.apply({**tick(1200), "term": 2})
    assert "L1" not in store.leases


def test_hostile_fields_get_a_definite_error_and_change_nothing() -> None:
    store = LeaseStore()
    for bad in (
        {"progress_timeout": 0},
        {"progress_timeout": "1"},
        {"progress_timeout": True},
    ):
        out = store.apply(acquire("a", "k", 1, "L1", **bad))
        assert out["ok"] is False and out["code"] == "BAD_REQUEST", (bad, out)
    # An attached lease may be progress-aware (test_core_session_progress.py), but not
    # on a session that does not exist.
    attached = mut("acquire", "a", 1, key="k", owner="a", lid="L1", session="S",
                   progress_timeout=1000)  # fmt: skip
    assert store.apply(attached)["ok"] is False
    assert store.leases == {} and not store.progress
    store.apply(acquire("z", "k", 2, "L1", progress_timeout=1000))  # a new client
    for progress in (float("nan"), float("inf"), "3", True, 2**63):
        out = store.apply(renew("z", "k", 3, "L1", progress=progress))
        assert out["ok"] is False and out["code"] == "BAD_REQUEST", (progress, out)
    assert store.progress.leases["L1"] == [1000, 2, None]


def test_records_survive_a_snapshot_and_end_with_their_lease() -> None:
    store = LeaseStore()
    store.apply(acquire("a", "k", 0, "L1", progress_timeout=3000))
    store.apply(renew("a", "k", 400, "L1", progress=1.5))
    store.apply(acquire("a", "j", 1, "J1", progress_timeout=3000))
    store.apply(mut("release", "a", 2, key="j", lid="J1"))
    assert list(store.progress.leases) == ["L1"]
    older = store.to_plain()
    older.pop("lease_progress")  # a snapshot of a build before progress-aware leases
    assert LeaseStore.from_plain(older).progress.leases == {}
    copy = LeaseStore.from_plain(store.to_plain())
    assert copy.to_plain() == store.to_plain()
    entries = [renew("a", "k", now, "L1") for now in (1300, 2200, 3100)]  # no progress
    for s in (store, copy):
        for entry in entries:
            s.apply(dict(entry))
        assert s.leases["L1"].expires_at == 3400
        s.apply(tick(3400))
        assert s.holder("k") is None and s.progress.leases == {}
        assert [e["type"] for e in s.events if "key" in e] == ["stalled"]
    assert copy.to_plain() == store.to_plain()
    assert "lease_progress" not in store.to_plain()  # written only when used
