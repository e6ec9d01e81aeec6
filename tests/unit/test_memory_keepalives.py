"""Keep-alives answered from the leader's memory (server/keepalive.py) and written
into the log later by ``extend`` entries (core/store.py); a new term's first entry
extends every lease and session by its TTL.

Unit tests of the pending set and of the state machine's two rules; a property test
that drives the real store with a simulated leader (the proposer's flush rule, leader
changes that forget memory) and checks that no lease ever ends before a time its
holder was promised; and integration tests on a real cluster. The planted builds
that break each rule are caught in tests/integration/test_planted_bugs.py
(``test_a_keepalive_from_memory_holds_until_valid_until``).

The unit half of these tests (no process); the integration half is
tests/integration/test_memory_keepalives.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from raftlease.core import LeaseStore
from raftlease.core.checks import MAX_EXTEND, MAX_EXTEND_CIDS
from raftlease.core.dedup import CLIENT_IDLE_MS
from raftlease.server.keepalive import (
    CID_CAP,
    CID_FLUSH_MS,
    LEASE,
    SESSION,
    MemoryKeepalives,
)

pytestmark = pytest.mark.timeout(120)

FV = 2  # the entry format that carries keep-alives from memory


def entry(op: str, now: int, term: int = 1, fv: int = FV, **fields: Any) -> dict[str, Any]:
    out = {"op": op, "now": now, "term": term, **fields}
    if fv > 1:
        out["fv"] = fv
    return out


class Writer:
    """Mutating entries of one client (cid, seq, ack)."""

    def __init__(self, cid: str = "c1") -> None:
        self.cid, self.seq = cid, 0

    def __call__(self, op: str, now: int, term: int = 1, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return entry(op, now, term, cid=self.cid, seq=self.seq, ack=self.seq, **fields)


def acquire(store: LeaseStore, w: Writer, key: str, lid: str, now: int, ttl: int = 1000) -> None:
    result = store.apply(w("acquire", now, key=key, owner="o", ttl=ttl, lid=lid))
    assert result["ok"], result


# ----------------------------------------------------------- the pending set


def test_a_keepalive_is_due_a_quarter_ttl_before_its_logged_expiry() -> None:
    keep = MemoryKeepalives()
    keep.reset(3)
    keep.record(LEASE, "l1", until=1500, logged=1000, ttl_ms=1000, cid="c1")
    keep.record(LEASE, "l1", until=1700, logged=1000, ttl_ms=1000, cid="c1")  # later
    keep.record(SESSION, "s1", until=2000, logged=1800, ttl_ms=400, cid="c2")
    assert len(keep) == 2 and keep.answered == 3
    assert keep.next_flush_at() == 750
    # Due for the log is not yet a risk for reads: that starts at the logged expiry.
    assert not keep.lagging(999) and keep.lagging(1000)
    assert keep.take_due(749) == []
    ext, ids = keep.take_due(750)
    # The latest promise, and every client heard from (kept from idle eviction), in an
    # entry of its own.
    assert ext.leases == [["l1", 1700]] and ext.sessions == [] and ext.cids == []
    assert ids.cids == ["c1", "c2"] and ids.leases == ids.sessions == []
    assert len(keep) == 1 and keep.written == 1
    (ext,) = keep.take_due(1700)
    assert ext.sessions == [["s1", 2000]] and ext.cids == []
    assert len(keep) == 0 and keep.next_flush_at() is None


def test_an_extend_entry_in_flight_keeps_reads_off_local_state_past_its_expiry() -> None:
    """Handed over is not applied: until the ``extend`` entry lands, local state still
    holds the old expiry, and a read at or past it would see the lease gone."""
    keep = MemoryKeepalives()
    keep.reset(1)
    keep.record(LEASE, "l1", until=1500, logged=1000, ttl_ms=1000, cid=None)
    (ext,) = keep.take_due(750)
    assert ext.logged == 1000
    flight = keep.proposed(ext)
    assert not keep.lagging(999)  # the log's expiry is not reached yet: reads are fine
    assert keep.lagging(1000)  # from it on, only the log (behind the entry) is right
    keep.landed(flight)
    assert not keep.lagging(1000)


def test_a_written_promise_no_longer_counts_and_a_renewed_one_keeps_its_logged_expiry() -> None:
    keep = MemoryKeepalives()
    keep.reset(1)
    keep.record(LEASE, "l1", until=1500, logged=1000, ttl_ms=1000, cid=None)
    keep.record(LEASE, "l2", until=1600, logged=1100, ttl_ms=1000, cid=None)
    keep.record(LEASE, "l1", until=1700, logged=1000, ttl_ms=1000, cid=None)
    assert keep.lagging(1000)
    (ext,) = keep.take_due(750)  # l1 only: l2 is due at 850
    keep.landed(keep.proposed(ext))
    assert not keep.lagging(1099) and keep.lagging(1100)  # l2's logged expiry
    for i in range(300):  # written items do not pile up in the expiry heap
        keep.record(LEASE, f"x{i}", until=5000, logged=4000, ttl_ms=1000, cid=None)
        keep.landed(keep.proposed(keep.take_due(3750)[0]))
    assert len(keep._expiry) <= 4 * len(keep) + 65


def test_a_shorter_ttl_logged_since_makes_the_promise_due_by_the_new_expiry() -> None:
    """A log renewal with a shorter TTL lowers the logged expiry: a keep-alive from
    memory after it must be written before that one, with its own (new) promise."""
    keep = MemoryKeepalives()
    keep.reset(1)
    keep.record(LEASE, "l1", until=70_000, logged=60_000, ttl_ms=60_000, cid=None)
    # The log renewed it at 20,000 with a TTL of 5 s: logged 25,000.
    keep.record(LEASE, "l1", until=27_000, logged=25_000, ttl_ms=5_000, cid=None)
    assert keep.lagging(25_000) and keep.next_flush_at() == 25_000 - 5_000 // 4
    (ext,) = keep.take_due(23_750)
    assert ext.leases == [["l1", 27_000]] and ext.logged == 25_000


def test_client_ids_are_written_within_the_idle_limit_and_bounded() -> None:
    keep = MemoryKeepalives()
    keep.reset(1)
    keep.record(LEASE, "l1", until=10**7, logged=10**7 - 1, ttl_ms=3_600_000, cid="c1", now=5)
    # The lease is due in about 45 minutes; its client must be kept well before the
    # dedup table's 10 minutes of idleness.
    assert keep.next_flush_at() == 5 + CID_FLUSH_MS < CLIENT_IDLE_MS
    (ids,) = keep.take_due(5 + CID_FLUSH_MS)
    assert ids.cids == ["c1"] and len(keep) == 1  # the promise itself is not due yet
    for i in range(3 * CID_CAP):
        keep.record(LEASE, f"l{i}", until=10**7, logged=10**7 - 1, ttl_ms=3_600_000, cid=f"c{i}")
    assert len(keep._cids) == 2 * CID_CAP  # bounded; and due at once
    assert keep.next_flush_at() == 0


def test_a_new_term_forgets_what_memory_held() -> None:
    keep = MemoryKeepalives()
    keep.reset(1)
    keep.record(LEASE, "l1", 1500, 1000, 1000, None)
    keep.reset(1)
    assert len(keep) == 1
    keep.reset(2)  # the new term's first entry extended every lease instead
    assert len(keep) == 0 and keep.take_due(10**9) == []


def test_what_is_due_at_once_is_split_into_entries_of_bounded_size() -> None:
    keep = MemoryKeepalives()
    keep.reset(1)
    for i in range(MAX_EXTEND * 2 + 5):
        keep.record(LEASE, f"l{i}", 2000, 1000, 1000, f"c{i}")
    entries = keep.take_due(750)
    assert [len(e.leases) for e in entries if e.leases] == [MAX_EXTEND, MAX_EXTEND, 5]
    id_entries = [e for e in entries if e.cids]
    assert sum(len(e.cids) for e in id_entries) == MAX_EXTEND * 2 + 5
    assert all(len(e.cids) <= MAX_EXTEND_CIDS and not e.leases for e in id_entries)
    assert all(e.size() <= MAX_EXTEND for e in entries)


def test_what_could_not_be_proposed_is_due_again_first() -> None:
    keep = MemoryKeepalives()
    keep.reset(1)
    keep.record(LEASE, "l1", 2000, 1000, 1000, "c1")
    taken = keep.take_due(750)
    keep.give_back(taken)
    assert keep.written == 0 and keep.next_flush_at() == 0 and keep.lagging(1000)
    again, ids = keep.take_due(0)
    assert again.leases == [["l1", 2000]] and ids.cids == ["c1"]


# ------------------------------------------------------ the state machine's rules


def test_an_extend_entry_extends_without_moving_log_time() -> None:
    store, w = LeaseStore(), Writer()
    acquire(store, w, "k", "l1", now=0, ttl=1000)
    store.apply(entry("tick", 900))
    revision = store.revision
    # Stamped past the logged expiry (1000): the extension is applied first and log
    # time does not move, so the lease lives on.
    result = store.apply(entry("extend", 1200, leases=[["l1", 1900]], cids=["c1"]))
    assert result == {"ok": True, "now": 900, "extended": 1}
    assert store.now == 900 and store.leases["l1"].expires_at == 1900
    assert store.revision == revision + 1 and store.events[0]["type"] == "renew"
    # Kept from idle eviction, at applied log time (the table stays in last_seen order).
    assert store.clients["c1"].last_seen == 900
    store.apply(entry("tick", 1899))
    assert "l1" in store.leases
    store.apply(entry("tick", 1900))
    assert "l1" not in store.leases


def test_an_extend_entry_changes_nothing_it_should_not() -> None:
    store, w = LeaseStore(), Writer()
    acquire(store, w, "k", "l1", now=0, ttl=1000)
    before = store.to_plain()
    # Not later than the logged expiry; more than a TTL past the entry's time; a
    # lease that does not exist; a session that does not exist.
    for leases, sessions in (
        ([["l1", 1000]], []),
        ([["nope", 1500]], []),
        ([], [["nope", 1500]]),
    ):
        result = store.apply(entry("extend", 1000, leases=leases, sessions=sessions))
        assert result["ok"] and result["extended"] == 0
    after = store.to_plain()
    assert after["leases"] == before["leases"] and after["revision"] == before["revision"]
    # More than the TTL past the entry's time (promised under a TTL shortened since):
    # cut to the TTL from the entry's time.
    assert store.apply(entry("extend", 1000, leases=[["l1", 2500]]))["extended"] == 1
    assert store.leases["l1"].expires_at == 2000
    for bad in ({"leases": "l1"}, {"leases": [["l1"]]}, {"cids": [3]}, {"sessions": [[1, 2]]}):
        assert store.apply(entry("extend", 1000, **bad))["code"] == "BAD_REQUEST"


def test_a_session_extended_from_memory_extends_its_leases() -> None:
    store, w = LeaseStore(), Writer()
    opened = store.apply(w("session_open", 0, sid="s1", owner="o", ttl=1000))
    assert opened["ok"]
    got = store.apply(w("acquire", 0, key="k", owner="o", lid="l1", session="s1"))
    assert got["ok"], got
    store.apply(entry("extend", 900, sessions=[["s1", 1800]]))
    assert store.lease_sessions["s1"].expires_at == 1800
    assert store.leases["l1"].expires_at == 1800
    store.apply(entry("tick", 1799))
    assert "s1" in store.lease_sessions and "l1" in store.leases
    store.apply(entry("tick", 1800))
    assert "s1" not in store.lease_sessions and "l1" not in store.leases


def test_a_new_terms_first_entry_extends_every_lease_and_session() -> None:
    store, w = LeaseStore(), Writer()
    acquire(store, w, "k", "l1", now=0, ttl=1000)
    store.apply(w("session_open", 0, sid="s1", owner="o", ttl=500))
    store.apply(w("acquire", 0, key="j", owner="o", lid="l2", session="s1"))
    revision = store.revision
    # The same term change without the extension (format 1): what the new epoch alone
    # does to the revision and the events.
    twin = LeaseStore.from_plain(store.to_plain())
    twin.apply({"op": "tick", "now": 400, "term": 2})
    # Term 2 begins at log time 400 (before anything is due, so the twin expires nothing
    # either): every lease and session lives at least its TTL from then (no revision:
    # nothing a watcher sees).
    store.apply(entry("tick", 400, term=2))
    assert store.leases["l1"].expires_at == 1400
    assert store.lease_sessions["s1"].expires_at == 900
    assert store.leases["l2"].expires_at == 900
    assert store.revision >= revision  # the new epoch may jump it; no change per lease
    assert store.revision == twin.revision and store.events == twin.events
    # Even one whose logged expiry the entry's own time passes (a deposed leader
    # could have renewed it from memory).
    store.apply(entry("tick", 1900, term=3))
    assert store.leases["l1"].expires_at == 2900


def test_entries_of_format_one_keep_their_meaning() -> None:
    """A log written before keep-alives from memory replays as it applied then."""
    store, w = LeaseStore(), Writer()
    store.apply({**w("acquire", 0, key="k", owner="o", ttl=1000, lid="l1")})
    store.apply({"op": "tick", "now": 1000, "term": 2})  # no fv: format 1
    assert "l1" not in store.leases


# ---------------------------------------------- property: no promise is broken


@st.composite
def schedules(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    """(action, lease index, milliseconds of time that pass first)."""
    actions = st.sampled_from(
        ["renew", "renew", "renew", "tick", "leader_change", "release", "retime"]
    )
    return draw(
        st.lists(
            st.tuples(
                actions, st.integers(0, 2), st.integers(0, 700) | st.sampled_from([0, 20, 90])
            ),
            min_size=1,
            max_size=40,
        )
    )


@settings(max_examples=300)
@given(schedules(), st.sampled_from([300, 1000]))
# A keep-alive from memory after a log renewal shortened the TTL (review finding): it
# must be written before the new, earlier logged expiry.
@example([("renew", 0, 100), ("retime", 0, 0), ("renew", 0, 50), ("tick", 0, 160)], 1000)
def test_no_lease_ends_before_a_time_its_holder_was_promised(
    schedule: list[tuple[str, int, int]], ttl: int
) -> None:
    """A simulated leader over the real store: renewals answered from memory (the
    node's rule: only a live lease, ``until = now + ttl``), every entry preceded by the
    ``extend`` entries due at its stamp (the proposer's rule), leader changes that
    forget memory and start a term with a later stamp. Whenever the store ends a
    lease by expiry at log time T, no promise made for it may reach past T."""
    store, w = LeaseStore(), Writer()
    term, clock = 1, 0
    keep = MemoryKeepalives()
    promised: dict[str, int] = {}
    for i in range(3):
        acquire(store, w, f"k{i}", f"l{i}", now=0, ttl=ttl)
        promised[f"l{i}"] = ttl

    def propose(e: dict[str, Any]) -> dict[str, Any]:
        keep.reset(term)
        for ext in keep.take_due(clock):
            assert store.apply({**ext.entry(), "now": clock, "term": term, "fv": FV})["ok"]
        result = store.apply({**e, "now": clock, "term": term, "fv": FV})
        for event in store.events:
            if event["type"] == "expire":
                gone = event["lease_id"]
                assert promised[gone] <= store.now, (gone, promised[gone], store.now)
        return result

    for action, index, elapsed in schedule:
        clock += elapsed
        lid = f"l{index}"
        lease = store.leases.get(lid)
        if action == "renew":
            keep.reset(term)
            # The node's check: live at the time it would stamp (the log may not have
            # expired it yet; then the request goes through the log instead).
            if lease is not None and lease.expires_at > clock:
                until = clock + lease.ttl_ms
                keep.record(LEASE, lid, until, lease.expires_at, lease.ttl_ms, w.cid)
                promised[lid] = max(promised[lid], until)
        elif action == "tick":
            propose({"op": "tick"})
        elif action == "leader_change":
            term += 1  # the new leader knows nothing of the old one's memory
            clock += 50
            propose({"op": "tick"})
        elif action == "release" and lease is not None:
            w.seq += 1
            release = {"op": "release", "key": lease.key, "lid": lid}
            propose({**release, "cid": w.cid, "seq": w.seq, "ack": w.seq})
        elif action == "retime" and lease is not None and lease.expires_at > clock:
            # A renewal with a new TTL goes through the log: its answer replaces every
            # promise before it (the holder asked for it), shorter or longer.
            w.seq += 1
            new_ttl = 200 if lease.ttl_ms != 200 else 900
            renew = {"op": "renew", "key": lease.key, "lid": lid, "ttl": new_ttl}
            result = propose({**renew, "cid": w.cid, "seq": w.seq, "ack": w.seq})
            if result.get("ok"):
                promised[lid] = result["expires_at"]
    clock += 10 * ttl
    propose({"op": "tick"})
    assert store.leases == {}
