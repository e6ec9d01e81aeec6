"""The lease store's state and its reads (what a read through the log, a leader-lease
read and a stale read all answer from). Mutations live in ``store.LeaseStore``."""

from __future__ import annotations

import heapq
from typing import Any, TypeVar

from ..limits import MAX_AUDIT_REFUSALS
from .audit import AuditTrail
from .budget import Budgets
from .certkeys import CertKeys
from .deadlock import Refusals, WaitIndex
from .dedup import ClientTable
from .lease_effects import LeaseEffects
from .preempt import Preemption
from .progress import LeaseProgress
from .queue import TaskQueues
from .records import MAX_INDEXED_CAPACITY, KeyShares, LeaseRecord, LeaseSession, Result, Waiter

T = TypeVar("T", str, int)

#: ``StoreState.share`` forgets its objects when it holds this many (the leases keep
#: theirs): bounded memory whatever the number of distinct owners.
SHARED_MAX = 4096

#: Log time (ms) the lease expiry heap looks ahead: it holds the leases due before
#: ``StoreState._horizon`` (at most this far past the log time it was last rebuilt
#: at); the others are found by a scan of every lease when log time reaches it.
DEADLINE_HORIZON_MS = 60_000


class StoreState:
    """The replicated lease state. Single-threaded writes (``LeaseStore.apply``);
    the read methods are also safe from another thread while ``apply`` runs (a
    leader-lease read): they copy before they iterate and copy what they return.

    A key has a *capacity* (1 for a plain lock; N for a semaphore or a pool of N
    units; ``RW_CAPACITY`` for a read/write lock, where a reader takes one unit and a
    writer all of them) and any number of holders whose units fit in it. Every holder
    has its own lease id and fencing token.
    """

    #: ``DEADLINE_HORIZON_MS`` (a test sets another on a store: outcomes never depend
    #: on it, only the heap's size does).
    deadline_horizon_ms: int = DEADLINE_HORIZON_MS

    def __init__(self) -> None:
        self.now: int = 0
        self.term: int = 0
        self.revision: int = 0
        #: No fencing token above this is handed out; a leader raises it through the
        #: log (``reserve``, and a jump at each new term) ahead of need, so a token is
        #: never reused after a restart that lost the log's unsynced tail.
        self.ceiling: int = 0
        #: Live leases by lease id.
        self.leases: dict[str, LeaseRecord] = {}
        #: key -> its live leases: the lease itself while it has one (most keys: a
        #: lock), else a dict by lease id in grant (token) order. A lone holder costs
        #: no dict of its own (about 200 B a key, a quarter of a plain lease's
        #: footprint). Read through ``holders_of``, ``newest_holder``; written through
        #: ``_add_holder``, ``_remove_holder``.
        self.holders: dict[str, LeaseRecord | dict[str, LeaseRecord]] = {}
        #: key -> capacity, for keys of capacity > 1 while they have holders or
        #: waiters (absent: 1, ``capacity_of``), and their units in use. A key of
        #: capacity 1 has neither entry: it uses one unit while it has a holder
        #: (``units_used``), two map entries a lock does without.
        self.capacity: dict[str, int] = {}
        self.used: dict[str, int] = {}
        # (expires_at, lease_id) of every live lease due before ``_horizon`` (log
        # time), in a heap; entries go stale on renew/release and are skipped when
        # popped. Leases due later have no entry (72 B a lease they do without, most
        # of a long-TTL lease's share of the heap): when log time reaches the horizon
        # the heap is rebuilt from ``leases`` for the next ``DEADLINE_HORIZON_MS``
        # (``_rebuild_deadlines``), before anything is expired, so a lease is always
        # in the heap by the time it is due and leases expire exactly when and in
        # the order they would with every lease in the heap. Rebuilt on restore.
        self._deadlines: list[tuple[int, str]] = []
        self._horizon: int = 0
        #: The dedup table: client id -> its unacknowledged results (``dedup``).
        self.clients = ClientTable()
        #: Lease sessions by id, and their expiry times as (expires_at, id) in a heap.
        self.lease_sessions: dict[str, LeaseSession] = {}
        self._session_deadlines: list[tuple[int, str]] = []
        self.applied: int = 0
        self.expired_total: int = 0
        # Wait queues: key -> waiters sorted by rank; lease id -> waiter; and the
        # waiters' deadlines as (deadline, lease_id) in a heap (stale entries skipped).
        self.queues: dict[str, list[Waiter]] = {}
        self.waiting: dict[str, Waiter] = {}
        self._wait_deadlines: list[tuple[int, str]] = []
        self.queue_order: int = 0
        #: key -> its wait queue's fair shares (docs/design.md §4d): only while the
        #: queue has a waiter that named a fairness key or weight; without it the
        #: queue is served in rank order alone, exactly as before fair shares.
        self.fair: dict[str, KeyShares] = {}
        #: principal -> its live leases plus queued acquires, and its lease sessions
        #: (for quotas; authenticated principals only). Rebuilt on restore.
        self.held_by: dict[str, int] = {}
        self.sessions_by: dict[str, int] = {}
        #: principal -> its queued acquires alone (the waiter quota). Rebuilt on restore.
        self.waiting_by: dict[str, int] = {}
        #: Deadlock detection (core/deadlock.py): agent -> its queued acquires (derived
        #: from the queues, rebuilt on restore), and the queued acquires refused
        #: ``DEADLOCK`` after they queued, kept for their long-polls (snapshotted).
        self.wait_index = WaitIndex()
        #: Waiting sets of keys (``acquire_many`` with ``wait``): the set's lease id ->
        #: how many keys it waits for (one waiter each, ``<id>/<index>``). Derived from
        #: the waiters (their ``group``), rebuilt on restore.
        self.waiting_sets: dict[str, int] = {}
        self.deadlock_refusals = Refusals()
        #: Cooperative preemption (core/preempt.py): grant priorities, yield requests.
        self.preempt = Preemption()
        #: Progress-aware plain leases (core/progress.py, docs/design.md §4g).
        self.progress = LeaseProgress()
        #: The effect journals of lease keys (core/lease_effects.py, §4h).
        self.lease_effects = LeaseEffects()
        # Not state: set per request by ``apply`` (format 6 entries detect deadlocks)
        # and the grants of that request to check for cycles (core/deadlock.py).
        self._detect: bool = False
        self._grants_to_check: list[str] = []
        #: What the last ``apply`` changed, for the server (wake long-polls, watches).
        #: Not part of the state: rebuilt by every apply, never snapshotted.
        self.events: list[dict[str, Any]] = []
        #: Bumped before and after every ``apply`` (odd while one runs): lets a read on
        #: another thread know it saw no half-applied entry. Not state, never
        #: snapshotted.
        self.apply_seq: int = 0
        #: Leased task queues (core/queue.py).
        self.tasks = TaskQueues()
        #: Shared budgets (core/budget.py).
        self.budgets = Budgets()
        #: Lease certificate signing keys (core/certkeys.py, docs/certificates.md).
        self.cert_keys = CertKeys()
        #: Who owned what (core/audit.py, docs/audit.md), and the principal of the
        #: entry being applied ("" for the leader's own entries).
        self.audit = AuditTrail()
        self.audit_actor = ""
        #: Refusals the state machine decided (core/audit.py ``REFUSAL_CODES``), in a
        #: bounded ring of their own: a flood of them never evicts ``audit`` records.
        self.audit_refusals = AuditTrail(MAX_AUDIT_REFUSALS)
        #: Memory, not state (never snapshotted; no answer depends on it): one object
        #: per distinct owner, principal and TTL among recent grants, shared by their
        #: leases (``share``).
        self._shared: dict[str | int, str | int] = {}
        #: Memory too: the expiry the last lease granted got (``expiry``).
        self._last_expiry = -1

    def _count(self, table: dict[str, int], principal: str, delta: int) -> None:
        if principal:
            left = table.get(principal, 0) + delta
            if left > 0:
                table[principal] = left
            else:
                table.pop(principal, None)

    def _push_deadline(self, expires_at: int, lease_id: str) -> None:
        """A live lease's (new) expiry: into the heap if due before the horizon."""
        if expires_at < self._horizon:
            heapq.heappush(self._deadlines, (expires_at, lease_id))

    def _rebuild_deadlines(self) -> None:
        """The expiry heap anew from ``leases``: those due before log time plus
        ``DEADLINE_HORIZON_MS`` (the new horizon). O(live leases)."""
        horizon = self.now + self.deadline_horizon_ms
        self._horizon = horizon
        self._deadlines = [
            (r.expires_at, r.lease_id) for r in self.leases.values() if r.expires_at < horizon
        ]
        heapq.heapify(self._deadlines)

    def token_headroom(self) -> int:
        """An upper bound on how many revisions one request can create from this
        state: every live lease renewed and removed, every waiter granted, a few more
        for the request itself."""
        return 3 * (len(self.leases) + len(self.waiting)) + 8 + self.tasks.headroom()

    @property
    def sessions(self) -> ClientTable:
        """Deprecated name of ``clients`` (the dedup table, not lease sessions)."""
        return self.clients

    def share(self, value: T) -> T:
        """``value``, or an equal object an earlier lease already holds: an agent's
        leases then share one copy of its name (about 60 B a lease) and a workload's
        one TTL one int. Not ``sys.intern``: interned strings are immortal on CPython
        3.12, and owner names come from clients. Called by the apply thread only."""
        found = self._shared.get(value)
        if found is not None and type(found) is type(value):
            return found
        if len(self._shared) >= SHARED_MAX:
            self._shared.clear()
        self._shared[value] = value
        return value

    def expiry(self, at: int) -> int:
        """``at``, or the equal int the last lease granted got: leases granted in one
        millisecond with one TTL then share one (32 B a lease; they share their
        ``granted_at``, log time, already). Called by the apply thread only."""
        last = self._last_expiry
        if at == last:
            return last
        self._last_expiry = at
        return at

    # ------------------------------------------------------------------ holders

    def holders_of(self, key: str) -> list[LeaseRecord]:
        """The live leases on ``key``, oldest grant first (a copy). Safe from another
        thread while ``apply`` runs: one read of the map, and ``list`` copies a
        shared key's dict in one step under the GIL."""
        held = self.holders.get(key)
        if held is None:
            return []
        if isinstance(held, LeaseRecord):
            return [held]
        return list(held.values())

    def newest_holder(self, key: str) -> LeaseRecord | None:
        """The most recent grant among the live leases on ``key`` (None: no holder).
        Apply thread only: ``reversed`` walks a shared key's dict, which ``apply`` may
        change under another thread (use ``holders_of`` there)."""
        held = self.holders.get(key)
        if held is None or isinstance(held, LeaseRecord):
            return held
        return next(reversed(held.values()))

    def capacity_of(self, key: str) -> int:
        """The capacity of ``key`` while it has holders or waiters (else 1)."""
        return self.capacity.get(key, 1)

    def known_capacity(self, key: str) -> int | None:
        """The capacity ``key`` is in use with; None when nothing holds or waits on
        it (the next acquire fixes it)."""
        capacity = self.capacity.get(key)
        if capacity is None and (key in self.holders or key in self.queues):
            return 1
        return capacity

    def units_used(self, key: str) -> int:
        """Units of ``key`` its live leases take."""
        used = self.used.get(key)
        if used is not None:
            return used
        return 1 if key in self.holders else 0

    def _add_holder(self, lease: LeaseRecord) -> None:
        """Count ``lease`` among its key's holders (newest). The key's capacity is
        already recorded when it is above 1."""
        key = lease.key
        held = self.holders.get(key)
        if held is None:
            self.holders[key] = lease
        elif isinstance(held, LeaseRecord):
            # A new dict, assigned in one step: a reader on another thread sees the
            # lone holder or both, never a half-built map.
            self.holders[key] = {held.lease_id: held, lease.lease_id: lease}
        else:
            held[lease.lease_id] = lease
        if key in self.capacity:
            self.used[key] = self.used.get(key, 0) + lease.units

    def _remove_holder(self, lease: LeaseRecord) -> None:
        """Take ``lease`` out of its key's holders (it must be one). The capacity and
        ``used`` entries stay until the queue is served (``_grant_next``)."""
        key = lease.key
        held = self.holders[key]
        if isinstance(held, LeaseRecord):
            del self.holders[key]
        else:
            del held[lease.lease_id]
            if len(held) == 1:
                self.holders[key] = next(iter(held.values()))
        if key in self.used:
            self.used[key] -= lease.units

    # ------------------------------------------------------------------ reads

    def _lease_result(self, lease: LeaseRecord) -> Result:
        result: Result = {
            "ok": True,
            "key": lease.key,
            "owner": lease.owner,
            "token": lease.token,
            "lease_id": lease.lease_id,
            "ttl": lease.ttl_ms,
            "expires_at": lease.expires_at,
            "now": self.now,
            "revision": self.revision,
        }
        asked = self.preempt.request_of(lease.lease_id)
        if asked is not None:  # the holder learns it from this answer (§4f)
            result["yield_requested"] = asked
        tracked = self.progress.info(lease.lease_id)
        if tracked is not None:  # a progress-aware lease (§4g)
            result.update(tracked)
        return self._extras(lease, result)

    def renewal_answer(self, lease: LeaseRecord, until: int, now: int) -> dict[str, Any]:
        """What a ``renew`` answers, for a renewal the leader answered from memory
        (server/keepalive.py): the lease as a renewal at log time ``now`` to ``until``
        would leave it (no ``ok``, as the node's answers carry none)."""
        out = self._lease_result(lease)
        del out["ok"]
        out["expires_at"] = until
        out["now"] = now
        return out

    @staticmethod
    def _extras(lease: LeaseRecord, out: dict[str, Any], grantee: bool = True) -> dict[str, Any]:
        """Fields shown only when they differ from a plain lock's. The lease session's
        id is a capability (it keeps alive and ends every attached lease): only the
        grantee's answer names it; a read says ``in_session``."""
        if lease.units != 1:
            out["units"] = lease.units
        if lease.slots:
            out["unit_indices"] = list(lease.slots)
        if lease.value:
            out["value"] = lease.value
        if lease.session:
            if grantee:
                out["session"] = lease.session
            else:
                out["in_session"] = True
        return out

    def free_slots(self, key: str, units: int) -> tuple[int, ...]:
        """The ``units`` lowest unit indices of ``key`` that no live lease holds, for a
        shared key of capacity 2..``MAX_INDEXED_CAPACITY`` (else ``()``). Called
        before a grant, when the units are known to fit."""
        capacity = self.capacity_of(key)
        if not 1 < capacity <= MAX_INDEXED_CAPACITY:
            return ()
        taken = {i for lease in self.holders_of(key) for i in lease.slots}
        free = [i for i in range(capacity) if i not in taken]
        return tuple(free[:units])

    def _live(self, key: str, at: int) -> list[LeaseRecord]:
        """The live leases on ``key`` at log time ``at``, oldest grant first. Safe
        from another thread while ``apply`` runs (``holders_of`` copies)."""
        return [lease for lease in self.holders_of(key) if lease.expires_at > at]

    def holder(self, key: str, now: int | None = None) -> dict[str, Any] | None:
        """Who holds ``key`` at log time ``now`` (default: the last applied log time);
        never reveals a lease id. For a shared key (capacity > 1) the answer is the
        newest holder plus ``capacity``, ``used`` and every live holder in ``holders``.

        Safe to call from another thread while ``apply`` runs (a leader-lease read):
        it copies before it iterates and copies what it returns.
        """
        at = self.now if now is None else now
        live = self._live(key, at)
        if not live:
            return None
        out = self._public(live[-1], at)
        capacity = self.capacity_of(key)
        if capacity > 1:
            out["capacity"] = capacity
            out["used"] = sum(lease.units for lease in live)
            out["holders"] = [self._public(lease, at) for lease in live]
        return out

    def list_leases(
        self, prefix: str = "", limit: int = 1000, now: int | None = None
    ) -> list[dict[str, Any]]:
        """Live leases at log time ``now`` whose key starts with ``prefix``, sorted by
        key (and by grant within a key), at most ``limit``. Thread-safe in the same
        way as ``holder``: ``sorted`` copies the keys in one step."""
        at = self.now if now is None else now
        out: list[dict[str, Any]] = []
        for key in sorted(self.holders):
            if not key.startswith(prefix):
                continue
            for lease in self._live(key, at):
                out.append(self._public(lease, at))
                if len(out) >= limit:
                    return out
        return out

    def fence(self, key: str, token: int, now: int | None = None) -> dict[str, Any]:
        """Is ``token`` the fencing token of a current holder of ``key``?
        ``holder_token`` is the newest holder's token (None when nobody holds it)."""
        live = self._live(key, self.now if now is None else now)
        return {
            "key": key,
            "current": any(lease.token == token for lease in live),
            "holder_token": live[-1].token if live else None,
        }

    def lease_status(self, key: str, lease_id: str, now: int | None = None) -> dict[str, Any]:
        """State of one lease or queued acquire, for whoever knows its id: ``held``
        (with the lease), ``waiting`` (with its queue position) or ``gone``."""
        at = self.now if now is None else now
        lease = self.leases.get(lease_id)
        if lease is not None and lease.key == key and lease.expires_at > at:
            held = {"state": "held", **self._lease_result(lease), "now": at}
            session = self.lease_sessions.get(lease.session) if lease.session else None
            if session is not None and lease_id.startswith(f"{lease.session}/"):
                # One key of a set (``acquire_many``): the grantee learns all of them
                # (lease ids derived from the set's, which it knows).
                members = [self.leases.get(lid) for lid in list(session.leases)]
                held["set"] = [self._set_member(one) for one in members if one is not None]
            return held
        waiter = self.waiting.get(lease_id)
        if waiter is not None and waiter.key == key and waiter.deadline > at:
            queue = list(self.queues.get(key, ()))
            position = next((i for i, w in enumerate(queue) if w is waiter), len(queue)) + 1
            return {"state": "waiting", "position": position, "deadline": waiter.deadline}
        refused = self.deadlock_refusals.status(key, lease_id, at)
        if refused is not None:  # left its queue to break a deadlock (core/deadlock.py)
            return refused
        return {"state": "gone"}

    @staticmethod
    def _set_member(lease: LeaseRecord) -> dict[str, Any]:
        one: dict[str, Any] = {
            "key": lease.key,
            "token": lease.token,
            "lease_id": lease.lease_id,
            "units": lease.units,
        }
        if lease.slots:
            one["unit_indices"] = list(lease.slots)
        return one

    def list_waiters(self, key: str, limit: int = 1000, now: int | None = None) -> dict[str, Any]:
        """The wait queue of ``key`` in grant order (position 1 is next), at most
        ``limit``: owner, units, priority, the wait left (ms) and whether it is attached
        to a lease session. Never a lease id or session id (capabilities). Safe from
        another thread while ``apply`` runs (``list`` copies the queue in one step)."""
        at = self.now if now is None else now
        queue = [w for w in list(self.queues.get(key, ())) if w.deadline > at]
        out = []
        for position, waiter in enumerate(queue[:limit], start=1):
            item: dict[str, Any] = {
                "position": position,
                "owner": waiter.owner,
                "units": waiter.units,
                "priority": waiter.priority,
                "wait_left": waiter.deadline - at,
            }
            if waiter.session:
                item["in_session"] = True
            out.append(item)
        return {
            "key": key,
            "capacity": self.capacity_of(key),
            "used": sum(lease.units for lease in self._live(key, at)),
            "waiting": len(queue),
            "waiters": out,
        }

    def list_sessions(self, limit: int = 1000, now: int | None = None) -> list[dict[str, Any]]:
        """Live lease sessions, soonest expiry first (then owner), at most ``limit``:
        owner, ttl, remaining (ms), attached leases and queued acquires. Never the
        session id, which keeps alive and ends everything attached (docs/security.md).
        Thread-safe like ``holder``."""
        at = self.now if now is None else now
        live = [s for s in list(self.lease_sessions.values()) if s.expires_at > at]
        live.sort(key=lambda s: (s.expires_at, s.owner, s.ttl_ms))
        return [
            {
                "owner": s.owner,
                "ttl": s.ttl_ms,
                "remaining": s.expires_at - at,
                "leases": len(s.leases),
                "waiters": len(s.waiters),
            }
            for s in live[:limit]
        ]

    def _public(self, lease: LeaseRecord, now: int) -> dict[str, Any]:
        public = {
            "key": lease.key,
            "owner": lease.owner,
            "token": lease.token,
            "ttl": lease.ttl_ms,
            "expires_at": lease.expires_at,
            "remaining": lease.expires_at - now,
        }
        return self._extras(lease, public, grantee=False)

    def next_deadline(self) -> int | None:
        """Earliest log time at which some lease or lease session may expire (a hint
        for the leader)."""
        heads = [h[0][0] for h in (self._deadlines, self._session_deadlines) if h]
        if self.leases:
            heads.append(self._horizon)  # leases due later are not in the heap yet
        tasks = self.tasks.next_deadline()  # attempts, delayed tasks, waiting claims
        if tasks is not None:
            heads.append(tasks)
        budgets = self.budgets.next_deadline()  # waits, reservations, refills due
        if budgets is not None:
            heads.append(budgets)
        yields = self.preempt.next_deadline()  # yield requests' deadlines
        if yields is not None:
            heads.append(yields)
        return min(heads) if heads else None
