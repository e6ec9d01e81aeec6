"""The lease state machine: pure, deterministic, no I/O.

``LeaseStore.apply(entry)`` is the only way state changes. An entry is a plain dict
(decoded from the msgpack bytes in the Raft log) carrying an operation, its arguments,
the leader's time stamp ``now`` (integer milliseconds of *log time*) and, for mutating
operations, the client session fields ``cid``/``seq``/``ack``.

Rules this module keeps (docs/design.md explains why):

* Time comes only from entries: ``now = max(self.now, entry["now"])``; log time never
  goes backwards. Each entry also carries the Raft ``term`` of the leader that stamped
  it; an entry stamped in an older term than one already applied (a deposed leader's
  request that reached the log late) is refused with ``NOT_LEADER`` and changes
  nothing: its stamp is stale, and granting at our last log time instead could let
  the lease expire before its holder stops trusting it. Nothing here reads a clock,
  draws a random number, or does I/O; a test walks this module's AST to keep it so.
* Expiry is deterministic: every entry first advances log time, then removes every
  lease with ``expires_at <= now`` in ``(expires_at, lease_id)`` order.
* A store-wide ``revision`` grows by one on every change; a grant's fencing token is
  the revision it created, so tokens strictly increase per key (and store-wide).
* Renew and release require the ``lease_id`` that only the grantee received; reads
  never reveal it. Lease ids are drawn by the leader and carried in the entry.
* Client sessions (Raft dissertation §6.3): a mutating entry carries ``(cid, seq, ack)``;
  results of requests the client has not acknowledged (``seq >= ack``) are kept and
  returned again for a retried ``seq``, so a retry never applies twice.
* Outcomes are values. ``apply`` never raises on any input: malformed entries get a
  ``BAD_REQUEST`` result and leave the state unchanged.
"""

from __future__ import annotations

import bisect
import heapq
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

# Hard structural caps (the server enforces tighter, configurable limits first).
from .limits import MAX_ID_CHARS, MAX_KEY_BYTES, MAX_LIST, MAX_OWNER_BYTES, MAX_TTL_MS

#: Bump when the snapshot layout changes; ``restore`` refuses other versions.
SNAPSHOT_VERSION = 2

#: A session with no request for this long (log time) is forgotten.
SESSION_IDLE_MS = 10 * 60 * 1000
#: Most unacknowledged results kept per client session.
MAX_PENDING_PER_SESSION = 4096
Result = dict[str, Any]

#: Most requests one batch entry may carry.
MAX_BATCH = 4096

MUTATING_OPS = frozenset({"acquire", "renew", "release", "transfer"})
READ_OPS = frozenset({"holder", "leases", "fence", "lease_status"})
#: Waiter priorities accepted (higher is served first, FIFO within a priority).
MAX_PRIORITY = 1000
ALL_OPS = MUTATING_OPS | READ_OPS | {"tick"}


@dataclass(slots=True)
class LeaseRecord:
    """One live lease. ``expires_at`` and ``granted_at`` are log-time milliseconds."""

    key: str
    lease_id: str
    owner: str
    token: int
    ttl_ms: int
    granted_at: int
    expires_at: int

    def to_plain(self) -> list[Any]:
        return [
            self.key,
            self.lease_id,
            self.owner,
            self.token,
            self.ttl_ms,
            self.granted_at,
            self.expires_at,
        ]


@dataclass(slots=True)
class Waiter:
    """A queued acquire: granted, in the same log entry, when the key frees up and it
    is first in ``(-priority, order)``; leaves the queue at ``deadline`` (log time)."""

    key: str
    lease_id: str
    owner: str
    ttl_ms: int
    priority: int
    order: int
    deadline: int

    def rank(self) -> tuple[int, int]:
        return (-self.priority, self.order)

    def to_plain(self) -> list[Any]:
        return [
            self.key,
            self.lease_id,
            self.owner,
            self.ttl_ms,
            self.priority,
            self.order,
            self.deadline,
        ]


@dataclass(slots=True)
class ClientSession:
    last_seen: int
    results: dict[int, Result]
    #: Highest ``ack`` the client has sent: every seq below it was acknowledged, so a
    #: late duplicate of one (a retry overtaken by later requests) is never applied.
    acked: int = 1


def error(code: str, message: str, **detail: Any) -> Result:
    """A domain outcome that is not a success (see ``raftlease.errors`` for codes)."""
    result: Result = {"ok": False, "code": code, "message": message}
    if detail:
        result["detail"] = detail
    return result


def _utf8_size(value: str) -> int:
    """Encoded size of ``value``; a string UTF-8 cannot encode (a lone surrogate) counts
    as oversized, so it is rejected instead of raising ``UnicodeEncodeError``."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return 2**63


def _valid_str(value: Any, max_bytes: int) -> bool:
    return isinstance(value, str) and len(value) > 0 and _utf8_size(value) <= max_bytes


def _valid_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


class LeaseStore:
    """The replicated lease state. Single-threaded: the caller serializes ``apply``."""

    def __init__(self) -> None:
        self.now: int = 0
        self.term: int = 0
        self.revision: int = 0
        self.leases: dict[str, LeaseRecord] = {}
        # (expires_at, lease_id, key); entries go stale on renew/release and are
        # skipped when popped. Rebuilt from ``leases`` on restore.
        self._deadlines: list[tuple[int, str, str]] = []
        # Ordered by last_seen (oldest first) so idle sessions are evicted in order.
        self.sessions: OrderedDict[str, ClientSession] = OrderedDict()
        self.applied: int = 0
        self.expired_total: int = 0
        # Wait queues: key -> waiters sorted by rank; lease id -> waiter; and the
        # waiters' deadlines as (deadline, lease_id) in a heap (stale entries skipped).
        self.queues: dict[str, list[Waiter]] = {}
        self.waiting: dict[str, Waiter] = {}
        self._wait_deadlines: list[tuple[int, str]] = []
        self.queue_order: int = 0
        #: What the last ``apply`` changed, for the server (wake long-polls, watches).
        #: Not part of the state: rebuilt by every apply, never snapshotted.
        self.events: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ apply

    def apply(self, entry: Any) -> Result:
        """Apply one log entry and return its result. Never raises.

        A ``batch`` entry (``{"op": "batch", "now", "term", "entries": [...]}``) carries
        several requests the leader proposed together; each is applied in order with
        the batch's time stamp and term, exactly as if it were its own entry, and the
        result is ``{"ok": True, "results": [...]}`` in the same order.
        """
        self.events = []
        if isinstance(entry, dict) and entry.get("op") == "batch":
            return self._apply_batch(entry)
        return self._apply_one(entry)

    def _apply_batch(self, batch: dict[str, Any]) -> Result:
        entries = batch.get("entries")
        if not isinstance(entries, list) or not 0 < len(entries) <= MAX_BATCH:
            return error("BAD_REQUEST", f"'entries' must be a list of 1 to {MAX_BATCH} entries")
        stamp = {"now": batch.get("now"), "term": batch.get("term", 0)}
        results = []
        for sub in entries:
            if not isinstance(sub, dict) or sub.get("op") == "batch":
                results.append(error("BAD_REQUEST", "a batch holds request maps only"))
            else:
                results.append(self._apply_one({**sub, **stamp}))
        return {"ok": True, "results": results}

    def _apply_one(self, entry: Any) -> Result:
        if not isinstance(entry, dict):
            return error("BAD_REQUEST", "entry must be a map")
        op = entry.get("op")
        if not isinstance(op, str) or op not in ALL_OPS:  # an unhashable op must not raise
            return error("BAD_REQUEST", f"unknown operation {op!r}")
        now: int = entry.get("now")  # type: ignore[assignment]
        if not _valid_int(now, 0, 2**62):
            return error("BAD_REQUEST", "entry time stamp 'now' must be a non-negative integer")
        term = entry.get("term", 0)
        if not _valid_int(term, 0, 2**62):
            return error("BAD_REQUEST", "entry 'term' must be a non-negative integer")
        problem = self._check_args(op, entry)
        if problem is not None:
            return error("BAD_REQUEST", problem)

        if term < self.term:
            # Stamped by a leader deposed since: its time stamp and its view are
            # stale, and applying a grant at our last log time could let the lease
            # expire early. Refuse it unchanged; the client retries at the leader.
            return error(
                "NOT_LEADER",
                f"entry stamped in term {term} by a deposed leader (term is {self.term})",
            )
        self.applied += 1
        self.term = term
        self._advance(now)

        if op == "tick":
            return {"ok": True, "now": self.now}
        if op == "holder":
            return {"ok": True, "holder": self.holder(entry["key"]), "now": self.now}
        if op == "fence":
            return {"ok": True, **self.fence(entry["key"], entry["token"]), "now": self.now}
        if op == "lease_status":
            return {"ok": True, **self.lease_status(entry["key"], entry["lid"]), "now": self.now}
        if op == "leases":
            return {
                "ok": True,
                "leases": self.list_leases(entry.get("prefix", ""), entry.get("limit", 1000)),
                "now": self.now,
            }
        return self._apply_mutation(op, entry)

    def _check_args(self, op: str, entry: dict[str, Any]) -> str | None:
        if op in MUTATING_OPS:
            if not _valid_str(entry.get("cid"), MAX_ID_CHARS):
                return "'cid' must be a non-empty string"
            if not _valid_int(entry.get("seq"), 1, 2**62):
                return "'seq' must be a positive integer"
            if not _valid_int(entry.get("ack"), 1, 2**62):
                return "'ack' must be a positive integer"
            if not _valid_str(entry.get("key"), MAX_KEY_BYTES):
                return "'key' must be a non-empty string"
            if not _valid_str(entry.get("lid"), MAX_ID_CHARS):
                return "'lid' must be a non-empty string"
        if op in ("acquire", "transfer") and not _valid_str(entry.get("owner"), MAX_OWNER_BYTES):
            return "'owner' must be a non-empty string"
        if op == "acquire":
            if not _valid_int(entry.get("ttl"), 1, MAX_TTL_MS):
                return "'ttl' must be a positive integer of milliseconds"
            if not _valid_int(entry.get("wait", 0), 0, MAX_TTL_MS):
                return "'wait' must be a non-negative integer of milliseconds"
            if not _valid_int(entry.get("priority", 0), -MAX_PRIORITY, MAX_PRIORITY):
                return f"'priority' must be an integer from {-MAX_PRIORITY} to {MAX_PRIORITY}"
        elif op == "transfer":
            if not _valid_str(entry.get("new_lid"), MAX_ID_CHARS):
                return "'new_lid' must be a non-empty string"
            ttl = entry.get("ttl")
            if ttl is not None and not _valid_int(ttl, 1, MAX_TTL_MS):
                return "'ttl' must be a positive integer of milliseconds or absent"
        elif op in ("fence", "lease_status"):
            if not _valid_str(entry.get("key"), MAX_KEY_BYTES):
                return "'key' must be a non-empty string"
            if op == "fence" and not _valid_int(entry.get("token"), 0, 2**62):
                return "'token' must be a non-negative integer"
            if op == "lease_status" and not _valid_str(entry.get("lid"), MAX_ID_CHARS):
                return "'lid' must be a non-empty string"
        elif op == "renew":
            ttl = entry.get("ttl")
            if ttl is not None and not _valid_int(ttl, 1, MAX_TTL_MS):
                return "'ttl' must be a positive integer of milliseconds or absent"
        elif op == "holder":
            if not _valid_str(entry.get("key"), MAX_KEY_BYTES):
                return "'key' must be a non-empty string"
        elif op == "leases":
            prefix = entry.get("prefix", "")
            if not isinstance(prefix, str) or _utf8_size(prefix) > MAX_KEY_BYTES:
                return "'prefix' must be a string"
            if not _valid_int(entry.get("limit", 1000), 1, MAX_LIST):
                return "'limit' must be an integer from 1 to 100000"
        return None

    def _advance(self, now: int) -> None:
        """Move log time forward and expire what is due, in a deterministic order."""
        if now > self.now:
            self.now = now
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= self.now:
            expires_at, lease_id, key = heapq.heappop(deadlines)
            lease = self.leases.get(key)
            if lease is not None and lease.lease_id == lease_id and lease.expires_at == expires_at:
                del self.leases[key]
                self.revision += 1
                self.expired_total += 1
                self._event("expire", lease)
                self._grant_next(key)
        waits = self._wait_deadlines
        while waits and waits[0][0] <= self.now:
            deadline, lease_id = heapq.heappop(waits)
            waiter = self.waiting.get(lease_id)
            if waiter is not None and waiter.deadline == deadline:
                self._dequeue(waiter, "deadline")
        # Stale heap entries (from renewals) accumulate; rebuild when they dominate.
        if len(deadlines) > 64 and len(deadlines) > 4 * len(self.leases):
            self._rebuild_deadlines()
        sessions = self.sessions
        while sessions:
            cid, session = next(iter(sessions.items()))
            if session.last_seen + SESSION_IDLE_MS > self.now:
                break
            del sessions[cid]

    def _rebuild_deadlines(self) -> None:
        self._deadlines = [(r.expires_at, r.lease_id, r.key) for r in self.leases.values()]
        heapq.heapify(self._deadlines)

    def _apply_mutation(self, op: str, entry: dict[str, Any]) -> Result:
        cid: str = entry["cid"]
        seq: int = entry["seq"]
        ack: int = entry["ack"]
        session = self.sessions.get(cid)
        if session is None:
            if ack > 1:
                return error(
                    "SESSION_EXPIRED",
                    "client session is unknown (evicted after inactivity); request not applied",
                )
            session = ClientSession(last_seen=self.now, results={})
            self.sessions[cid] = session
        else:
            session.last_seen = self.now
            self.sessions.move_to_end(cid)
        if ack > session.acked:
            session.acked = ack
            for done in [s for s in session.results if s < ack]:
                del session.results[done]
        if seq < session.acked:
            return error(
                "BAD_REQUEST",
                f"seq {seq} was already acknowledged by the client (ack {session.acked}); "
                "a late duplicate is never applied",
            )
        cached = session.results.get(seq)
        if cached is not None:
            return cached
        if len(session.results) >= MAX_PENDING_PER_SESSION:
            return error(
                "TOO_MANY_PENDING",
                f"client has {len(session.results)} unacknowledged requests",
            )
        if op == "acquire":
            result = self._acquire(entry)
        elif op == "renew":
            result = self._renew(entry)
        elif op == "transfer":
            result = self._transfer(entry)
        else:
            result = self._release(entry)
        session.results[seq] = result
        return result

    # ------------------------------------------------------------- operations

    def _acquire(self, entry: dict[str, Any]) -> Result:
        key: str = entry["key"]
        current = self.leases.get(key)
        lease_id: str = entry["lid"]
        if lease_id in self.waiting or (current is not None and current.lease_id == lease_id):
            # The leader draws fresh ids; a reused one is a bug or forged, never applied.
            return error("BAD_REQUEST", "lease id already in use")
        if current is None:
            # A free key has no queue: a waiter is granted the moment a key frees up.
            return self._lease_result(self._grant(key, entry["lid"], entry["owner"], entry["ttl"]))
        wait: int = entry.get("wait", 0)
        if wait <= 0:
            return error(
                "LEASE_HELD",
                f"{key!r} is held by {current.owner!r}",
                owner=current.owner,
                token=current.token,
                remaining=(current.expires_at - self.now) / 1000.0,
                waiting=len(self.queues.get(key, ())),
            )
        self.queue_order += 1
        waiter = Waiter(
            key=key,
            lease_id=entry["lid"],
            owner=entry["owner"],
            ttl_ms=entry["ttl"],
            priority=entry.get("priority", 0),
            order=self.queue_order,
            deadline=self.now + wait,
        )
        queue = self.queues.setdefault(key, [])
        position = bisect.bisect_right([w.rank() for w in queue], waiter.rank())
        queue.insert(position, waiter)
        self.waiting[waiter.lease_id] = waiter
        heapq.heappush(self._wait_deadlines, (waiter.deadline, waiter.lease_id))
        return {
            "ok": True,
            "queued": True,
            "key": key,
            "owner": waiter.owner,
            "lease_id": waiter.lease_id,
            "position": position + 1,
            "deadline": waiter.deadline,
            "now": self.now,
        }

    def _grant(self, key: str, lease_id: str, owner: str, ttl: int) -> LeaseRecord:
        self.revision += 1
        lease = LeaseRecord(
            key=key,
            lease_id=lease_id,
            owner=owner,
            token=self.revision,
            ttl_ms=ttl,
            granted_at=self.now,
            expires_at=self.now + ttl,
        )
        self.leases[key] = lease
        heapq.heappush(self._deadlines, (lease.expires_at, lease.lease_id, key))
        self._event("grant", lease)
        return lease

    def _grant_next(self, key: str) -> None:
        """The key just became free: hand it to the first waiter, in this entry."""
        queue = self.queues.get(key)
        if not queue:
            return
        waiter = queue.pop(0)
        if not queue:
            del self.queues[key]
        del self.waiting[waiter.lease_id]
        self._grant(key, waiter.lease_id, waiter.owner, waiter.ttl_ms)

    def _dequeue(self, waiter: Waiter, reason: str) -> None:
        queue = self.queues.get(waiter.key, [])
        queue.remove(waiter)
        if not queue:
            self.queues.pop(waiter.key, None)
        del self.waiting[waiter.lease_id]
        self.events.append(
            {"type": "dequeue", "key": waiter.key, "lease_id": waiter.lease_id, "reason": reason}
        )

    def _event(self, kind: str, lease: LeaseRecord) -> None:
        self.events.append(
            {
                "type": kind,
                "key": lease.key,
                "owner": lease.owner,
                "token": lease.token,
                "revision": self.revision,
                "lease_id": lease.lease_id,
            }
        )

    def _owned(self, entry: dict[str, Any]) -> LeaseRecord | Result:
        key: str = entry["key"]
        lease = self.leases.get(key)
        if lease is None:
            return error("LEASE_NOT_FOUND", f"no live lease on {key!r} (expired or released)")
        if lease.lease_id != entry["lid"]:
            return error(
                "NOT_OWNER",
                f"{key!r} is held under another lease (owner {lease.owner!r})",
                owner=lease.owner,
                token=lease.token,
            )
        return lease

    def _renew(self, entry: dict[str, Any]) -> Result:
        lease = self._owned(entry)
        if not isinstance(lease, LeaseRecord):
            return lease
        ttl = entry.get("ttl")
        if ttl is not None:
            lease.ttl_ms = ttl
        lease.expires_at = self.now + lease.ttl_ms
        self.revision += 1
        heapq.heappush(self._deadlines, (lease.expires_at, lease.lease_id, lease.key))
        self._event("renew", lease)
        return self._lease_result(lease)

    def _release(self, entry: dict[str, Any]) -> Result:
        waiter = self.waiting.get(entry["lid"])
        if waiter is not None and waiter.key == entry["key"]:
            self._dequeue(waiter, "cancelled")
            return {"ok": True, "key": waiter.key, "cancelled": True}
        lease = self._owned(entry)
        if not isinstance(lease, LeaseRecord):
            return lease
        del self.leases[lease.key]
        self.revision += 1
        self._event("release", lease)
        self._grant_next(lease.key)
        return {"ok": True, "key": lease.key, "token": lease.token, "revision": self.revision}

    def _transfer(self, entry: dict[str, Any]) -> Result:
        """Hand a held lease to ``owner`` atomically: the old lease ends and the new one
        (new lease id, new token) starts in the same entry; waiters keep their place."""
        lease = self._owned(entry)
        if not isinstance(lease, LeaseRecord):
            return lease
        del self.leases[lease.key]
        self.revision += 1
        self._event("transfer", lease)
        ttl = entry.get("ttl") or lease.ttl_ms
        return self._lease_result(self._grant(lease.key, entry["new_lid"], entry["owner"], ttl))

    def _lease_result(self, lease: LeaseRecord) -> Result:
        return {
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

    # ------------------------------------------------------------------ reads

    def holder(self, key: str, now: int | None = None) -> dict[str, Any] | None:
        """Who holds ``key`` at log time ``now`` (default: the last applied log time);
        never reveals the lease id.

        Safe to call from another thread while ``apply`` runs (a leader-lease read):
        it does single dict look-ups only and copies what it returns.
        """
        at = self.now if now is None else now
        lease = self.leases.get(key)
        if lease is None or lease.expires_at <= at:
            return None
        return self._public(lease, at)

    def list_leases(
        self, prefix: str = "", limit: int = 1000, now: int | None = None
    ) -> list[dict[str, Any]]:
        """Live leases at log time ``now`` whose key starts with ``prefix``, sorted by
        key, at most ``limit``. Thread-safe in the same way as ``holder``: ``sorted``
        over the dict runs without releasing the GIL, and vanished keys are skipped."""
        at = self.now if now is None else now
        out: list[dict[str, Any]] = []
        for key in sorted(self.leases):
            if not key.startswith(prefix):
                continue
            lease = self.leases.get(key)
            if lease is not None and lease.expires_at > at:
                out.append(self._public(lease, at))
                if len(out) >= limit:
                    break
        return out

    def fence(self, key: str, token: int, now: int | None = None) -> dict[str, Any]:
        """Is ``token`` the current holder's fencing token on ``key``?"""
        holder = self.holder(key, now)
        current = holder["token"] if holder is not None else None
        return {"key": key, "current": current == token, "holder_token": current}

    def lease_status(self, key: str, lease_id: str, now: int | None = None) -> dict[str, Any]:
        """State of one lease or queued acquire, for whoever knows its id: ``held``
        (with the lease), ``waiting`` (with its queue position) or ``gone``."""
        at = self.now if now is None else now
        lease = self.leases.get(key)
        if lease is not None and lease.lease_id == lease_id and lease.expires_at > at:
            return {"state": "held", **self._lease_result(lease), "now": at}
        waiter = self.waiting.get(lease_id)
        if waiter is not None and waiter.key == key and waiter.deadline > at:
            queue = list(self.queues.get(key, ()))
            position = next((i for i, w in enumerate(queue) if w is waiter), len(queue)) + 1
            return {"state": "waiting", "position": position, "deadline": waiter.deadline}
        return {"state": "gone"}

    @staticmethod
    def _public(lease: LeaseRecord, now: int) -> dict[str, Any]:
        return {
            "key": lease.key,
            "owner": lease.owner,
            "token": lease.token,
            "ttl": lease.ttl_ms,
            "expires_at": lease.expires_at,
            "remaining": lease.expires_at - now,
        }

    def next_deadline(self) -> int | None:
        """Earliest log time at which some lease may expire (a hint for the leader)."""
        deadlines = self._deadlines
        return deadlines[0][0] if deadlines else None

    # -------------------------------------------------------------- snapshots

    def to_plain(self) -> dict[str, Any]:
        """Plain data (msgpack-able) describing the whole state."""
        return {
            "v": SNAPSHOT_VERSION,
            "now": self.now,
            "term": self.term,
            "revision": self.revision,
            "applied": self.applied,
            "expired_total": self.expired_total,
            "leases": [lease.to_plain() for lease in self.leases.values()],
            "queue_order": self.queue_order,
            "waiters": [w.to_plain() for q in self.queues.values() for w in q],
            "sessions": [
                [cid, s.last_seen, s.acked, [[seq, res] for seq, res in s.results.items()]]
                for cid, s in self.sessions.items()
            ],
        }

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> LeaseStore:
        """Rebuild a store from ``to_plain`` output. Raises ``ValueError`` if the
        snapshot has another layout version."""
        if data.get("v") != SNAPSHOT_VERSION:
            raise ValueError(f"snapshot version {data.get('v')!r} is not {SNAPSHOT_VERSION}")
        store = cls()
        store.now = data["now"]
        store.term = data["term"]
        store.revision = data["revision"]
        store.applied = data["applied"]
        store.expired_total = data["expired_total"]
        for key, lease_id, owner, token, ttl_ms, granted_at, expires_at in data["leases"]:
            store.leases[key] = LeaseRecord(
                key, lease_id, owner, token, ttl_ms, granted_at, expires_at
            )
        for cid, last_seen, acked, results in data["sessions"]:
            store.sessions[cid] = ClientSession(
                last_seen, {seq: res for seq, res in results}, acked
            )
        store.queue_order = data["queue_order"]
        for plain in data["waiters"]:
            waiter = Waiter(*plain)
            store.queues.setdefault(waiter.key, []).append(waiter)
            store.waiting[waiter.lease_id] = waiter
        store._wait_deadlines = [(w.deadline, w.lease_id) for w in store.waiting.values()]
        heapq.heapify(store._wait_deadlines)
        store._rebuild_deadlines()
        return store
