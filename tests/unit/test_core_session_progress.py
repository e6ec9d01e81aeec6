"""Progress-aware leases attached to a lease session, in the pure state machine
(issue 41; docs/design.md §4g, "Attached leases").

A session's keep-alives extend its attached leases, but never a progress-aware one
past its progress deadline; a progress report (``renew`` with ``progress`` on the
attached lease) restarts its clock and extends it up to the session's expiry; without
progress it ends ``stalled`` while the session and its other leases live on. A new
term's blanket extension and an ``extend`` entry's session keep-alives are capped the
same way."""

from __future__ import annotations

import pytest

from raftlease.core import LeaseStore
from tests.unit.test_core_lease_progress import _fresh_seq as _fresh_seq
from tests.unit.test_core_lease_progress import mut, renew, tick

pytestmark = pytest.mark.timeout(60)


def attached(store: LeaseStore, timeout: int = 1500) -> None:
    """Session S (TTL 1000) at log time 0 holding L1 (progress_timeout ``timeout``)
    and L2 (a plain attached lease)."""
    assert store.apply(mut("session_open", "a", 0, sid="S", owner="a", ttl=1000))["ok"]
    got = store.apply(mut("acquire", "a", 0, key="k", owner="a", lid="L1", session="S",
                          progress_timeout=timeout))  # fmt: skip
    assert got["ok"] and got["progress_timeout"] == timeout and got["expires_at"] == 1000
    assert store.apply(mut("acquire", "a", 0, key="j", owner="a", lid="L2", session="S"))["ok"]


def keepalive(store: LeaseStore, now: int) -> None:
    assert store.apply(mut("session_keepalive", "a", now, sid="S"))["ok"]


def test_keepalives_never_extend_an_attached_lease_past_its_progress_deadline() -> None:
    store = LeaseStore()
    attached(store)
    keepalive(store, 600)  # session to 1600; L1 capped at 1500
    assert store.leases["L1"].expires_at == 1500 and store.leases["L2"].expires_at == 1600
    keepalive(store, 1200)
    assert store.leases["L1"].expires_at == 1500
    events = store.apply(tick(1500))
    assert "L1" not in store.leases and "L2" in store.leases and "S" in store.lease_sessions
    assert [e["type"] for e in store.events if e["key"] == "k"][:1] == ["stalled"], events
    assert not store.progress


def test_a_progress_report_restarts_the_clock_up_to_the_session_expiry() -> None:
    store = LeaseStore()
    attached(store)
    keepalive(store, 600)
    got = store.apply(renew("a", "k", 1000, "L1", progress=1))
    assert got["ok"] and got["progress_at"] == 1000 and got["expires_at"] == 1600
    keepalive(store, 1400)  # session to 2400; L1's deadline is now 2500
    assert store.leases["L1"].expires_at == 2400
    for now in (1800, 2200):
        keepalive(store, now)
    assert store.leases["L1"].expires_at == 2500  # capped again without more progress
    assert store.apply(renew("a", "k", 2300, "L1", progress=1))["expires_at"] == 2500
    store.apply(tick(2500))
    assert "L1" not in store.leases and "L2" in store.leases


def test_a_renewal_of_an_attached_lease_without_progress_is_still_refused() -> None:
    store = LeaseStore()
    attached(store)
    assert store.apply(renew("a", "k", 10, "L1"))["code"] == "INVALID_ARGUMENT"
    assert store.apply(renew("a", "j", 10, "L2", progress=3))["code"] == "INVALID_ARGUMENT"
    out = store.apply(renew("a", "k", 10, "L1", progress=3, ttl=5000))
    assert out["code"] == "INVALID_ARGUMENT"
    assert store.progress.leases["L1"][2] is None  # nothing recorded


def test_a_new_term_and_a_logged_keepalive_are_capped_too() -> None:
    store = LeaseStore()
    attached(store)
    store.apply({**tick(900), "term": 2})  # the blanket extension: session to 1900
    assert store.leases["L1"].expires_at == 1500 and store.leases["L2"].expires_at == 1900
    out = store.apply({"op": "extend", "now": 1000, "term": 2, "fv": 6,
                       "sessions": [["S", 2000]]})  # fmt: skip
    assert out["ok"] and store.leases["L1"].expires_at == 1500
    assert store.leases["L2"].expires_at == 2000
    copy = LeaseStore.from_plain(store.to_plain())
    for entry in (tick(1500), mut("session_keepalive", "a", 1600, sid="S")):
        entry = {**entry, "term": 2}
        assert copy.apply(dict(entry)) == store.apply(dict(entry))
    assert copy.to_plain() == store.to_plain() and "L1" not in store.leases
