"""Keep-alives answered from the leader's memory, written into the log later.

A renewal of a plain lease (``renew`` without a new TTL) and a lease session's
keep-alive (``session_keepalive`` without a new TTL) need not be a log write of their
own: the leader answers them from its state while its leader lease is valid (as it
answers lease reads), remembers the new expiry here, and writes what it remembered
into the log in one ``extend`` entry (core/store.py), batched across every lease and
session, before log time could reach the expiry the log still holds: a quarter of a
TTL before it, or at the latest in the same flush as the entry that would move log time
past it (``proposer.Proposer``). A new leader knows nothing of this memory: the first
entry of its term extends every live lease and session by its TTL (core/store.py), so a
lease outlives a dead holder by at most one TTL per leader change and never ends
before a time its holder was told. docs/design.md ("Keep-alives from memory") gives
the argument.

Threads: every method runs on the event loop (the proposer's flush and the request
handler); nothing here blocks.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from ..core.checks import MAX_EXTEND, MAX_EXTEND_CIDS
from ..core.dedup import CLIENT_IDLE_MS

#: A promise is due for the log this fraction (1/n) of its TTL before the expiry the log
#: holds. The smaller, the fewer writes (each write carries the newest promise; with
#: keep-alives every ttl/3, half a TTL wrote about every one of them, a quarter about
#: every other), but while one is due and unwritten the leader reads through the log:
#: a quarter of a TTL is far above a commit's latency.
FLUSH_AHEAD = 4

#: Client ids heard from only by keep-alives from memory are written (kept from the dedup
#: table's idle eviction) at the latest this long after the first of them (log-time
#: ms), however long the TTLs: well within ``CLIENT_IDLE_MS``.
CID_FLUSH_MS = CLIENT_IDLE_MS // 4
#: Client ids held for the next write at most; at this many they are due at once, and
#: beyond twice it new ones are not kept (their client, if evicted, takes a new id).
CID_CAP = 5 * MAX_EXTEND_CIDS

#: ``lagging`` is asked this far ahead (log-time ms) of the stamp the leader takes for
#: the check: the read that follows takes its own, slightly later, stamp.
LAG_SLACK_MS = 250

#: Kinds of what is kept alive.
LEASE = "lease"
SESSION = "session"


@dataclass
class Extension:
    """What one ``extend`` entry carries: ``[id, until]`` pairs and client ids."""

    leases: list[list[object]] = field(default_factory=list)
    sessions: list[list[object]] = field(default_factory=list)
    cids: list[str] = field(default_factory=list)
    #: The earliest expiry the log holds for what this entry extends (log-time ms):
    #: until the entry is applied, local state may read that as gone from then on.
    logged: int = 2**62

    def entry(self) -> dict[str, object]:
        return {"op": "extend", "leases": self.leases, "sessions": self.sessions, "cids": self.cids}

    def size(self) -> int:
        return len(self.leases) + len(self.sessions) + len(self.cids)


class MemoryKeepalives:
    """The leader's keep-alives not yet in the log, for one term.

    ``record`` remembers one; ``take_due(now)`` hands over (and forgets) every one whose
    flush time has come, as ``extend`` entries; ``lagging(now)`` says whether some
    expiry the log holds could already be behind log time ``now`` (then a read from
    local state would miss a renewal: the node reads through the log instead)."""

    def __init__(self) -> None:
        self.term = -1
        #: (kind, id) -> (the expiry promised, the expiry the log holds, the TTL), ms.
        self._pending: dict[tuple[str, str], tuple[int, int, int]] = {}
        #: (flush at, logged expiry, kind, id): one per pending item, by when it is due.
        self._due: list[tuple[int, int, str, str]] = []
        #: (logged expiry, kind, id), by logged expiry: what ``lagging`` looks at. Lazy:
        #: an item written since stays until it comes to the top.
        self._expiry: list[tuple[int, str, str]] = []
        self._cids: set[str] = set()
        #: Log time of the first client id held since the last write (None: none held).
        self._cids_since: int | None = None
        #: ``extend`` entries proposed and not applied yet: id -> the earliest expiry
        #: the log holds for what they extend.
        self._in_flight: dict[int, int] = {}
        self._next_flight = 0
        #: Keep-alives answered from memory since the node started (status, metrics).
        self.answered = 0
        #: Pairs written into the log by ``extend`` entries since the node started.
        self.written = 0

    def __len__(self) -> int:
        return len(self._pending)

    def reset(self, term: int) -> None:
        """Forget everything if ``term`` is not the one remembered for: a new term's
        first entry already extended every lease (core/store.py)."""
        if term != self.term:
            self.term = term
            self._pending.clear()
            self._due.clear()
            self._expiry.clear()
            self._cids.clear()
            self._cids_since = None
            self._in_flight.clear()

    def record(
        self,
        kind: str,
        ident: str,
        until: int,
        logged: int,
        ttl_ms: int,
        cid: str | None,
        now: int = 0,
    ) -> None:
        """Remember that ``ident`` was promised to live until ``until`` at log time
        ``now``; the log says ``logged`` with TTL ``ttl_ms``. It is due for the log
        ``1 / FLUSH_AHEAD`` of a TTL before ``logged``. ``cid``: the client that asked,
        if the dedup table knows it (only those can be kept from eviction).

        A log write since the last record may have lowered the logged expiry (a renewal
        with a shorter TTL): the item is then due by the new one, and the promise is
        the new answer (the client's own later request replaced the older promise,
        exactly as the log replaces it)."""
        key = (kind, ident)
        previous = self._pending.get(key)
        if previous is None or logged < previous[1] or ttl_ms != previous[2]:
            low, promise = logged, until
            if previous is not None:
                low = min(logged, previous[1])
                if ttl_ms == previous[2]:
                    promise = max(until, previous[0])
            self._pending[key] = (promise, low, ttl_ms)
            heapq.heappush(self._due, (low - ttl_ms // FLUSH_AHEAD, low, kind, ident))
            self._push_expiry(low, kind, ident)
        elif until > previous[0]:
            self._pending[key] = (until, previous[1], ttl_ms)
        if cid is not None and len(self._cids) < 2 * CID_CAP:
            if self._cids_since is None:
                self._cids_since = now
            self._cids.add(cid)
        self.answered += 1

    def next_flush_at(self) -> int | None:
        """Log time when the earliest pending keep-alive (or the client ids held) is due
        for the log."""
        at = self._due[0][0] if self._due else None
        since = self._cids_since
        if since is not None:
            cids_at = since if len(self._cids) >= CID_CAP else since + CID_FLUSH_MS
            at = cids_at if at is None else min(at, cids_at)
        return at

    def lagging(self, now: int) -> bool:
        """Could the log hold an expiry at or before ``now`` that memory extended?
        True for a promise not written yet, or proposed in an ``extend`` entry not yet
        applied, whose logged expiry is at or before ``now``. (Not merely one due for
        the log: with thousands of sessions one is nearly always due for the next
        flush, and reads would then always go through the log.)"""
        expiry, pending = self._expiry, self._pending
        while expiry:
            logged, kind, ident = expiry[0]
            item = pending.get((kind, ident))
            if item is not None and item[1] == logged:
                if logged <= now:
                    return True
                break
            heapq.heappop(expiry)  # written since, or renewed again and re-pushed
        return any(logged <= now for logged in self._in_flight.values())

    def _push_expiry(self, logged: int, kind: str, ident: str) -> None:
        expiry = self._expiry
        heapq.heappush(expiry, (logged, kind, ident))
        if len(expiry) > 64 and len(expiry) > 4 * len(self._pending):
            # Written items left behind dominate: keep only the pending ones.
            self._expiry = [(lg, k, i) for (k, i), (_, lg, _) in self._pending.items()]
            self._expiry.append((logged, kind, ident))
            heapq.heapify(self._expiry)

    def proposed(self, ext: Extension) -> int:
        """``ext`` was proposed: until ``landed`` (its id), reads check its expiry."""
        self._next_flight += 1
        self._in_flight[self._next_flight] = ext.logged
        return self._next_flight

    def landed(self, flight: int) -> None:
        """The ``extend`` entry ``flight`` was applied here (or failed: then this node
        no longer leads, and the next term's first entry extends everything)."""
        self._in_flight.pop(flight, None)

    def take_due(self, now: int) -> list[Extension]:
        """Every keep-alive due for the log at log time ``now``, as ``extend`` entries
        of at most ``MAX_EXTEND`` pairs each (and the client ids heard from, once the
        first one is due), forgotten here once handed over. Empty when none is due."""
        due = self._due
        at = self.next_flush_at()
        if at is None or at > now:
            return []
        out = [Extension()]
        while due and due[0][0] <= now:
            _, logged, kind, ident = heapq.heappop(due)
            item = self._pending.pop((kind, ident), None)
            if item is None:
                continue
            until = item[0]
            if out[-1].size() >= MAX_EXTEND:
                out.append(Extension())
            ext = out[-1]
            (ext.leases if kind == LEASE else ext.sessions).append([ident, until])
            ext.logged = min(ext.logged, logged)
        # The client ids in entries of their own (an id may be up to 128 bytes: with
        # 600 pairs the entry would outgrow the proposer's batch size).
        cids = sorted(self._cids)
        self._cids.clear()
        self._cids_since = None
        for start in range(0, len(cids), MAX_EXTEND_CIDS):
            out.append(Extension(cids=cids[start : start + MAX_EXTEND_CIDS]))
        out = [ext for ext in out if ext.size()]
        self.written += sum(len(e.leases) + len(e.sessions) for e in out)
        return out

    def give_back(self, extensions: list[Extension]) -> None:
        """Remember again what ``take_due`` handed over but could not be proposed
        (due at once: the next flush writes it first)."""
        for ext in extensions:
            for kind, pairs in ((LEASE, ext.leases), (SESSION, ext.sessions)):
                for ident, until in pairs:
                    key = (kind, str(ident))
                    assert isinstance(until, int)
                    previous = self._pending.get(key)
                    if previous is None:
                        heapq.heappush(self._due, (0, ext.logged, kind, str(ident)))
                        self._push_expiry(ext.logged, kind, str(ident))
                        # The TTL is not known here; -1 makes the next record refresh it.
                        self._pending[key] = (until, ext.logged, -1)
                    else:
                        low = min(ext.logged, previous[1])
                        self._pending[key] = (max(until, previous[0]), low, previous[2])
            if ext.cids and self._cids_since is None:
                self._cids_since = 0  # due at once
            self._cids.update(ext.cids)
            self.written -= len(ext.leases) + len(ext.sessions)
