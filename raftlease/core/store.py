"""The lease state machine: pure, deterministic, no I/O.

``LeaseStore.apply(entry)`` is the only way state changes. An entry is a plain dict
(decoded from the msgpack bytes in the Raft log) carrying an operation, its arguments,
the leader's time stamp ``now`` (integer milliseconds of *log time*) and, for mutating
operations, the client id fields ``cid``/``seq``/``ack``.

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
  No revision passes ``ceiling``: the first entry of each new term jumps the revision
  to the ceiling and moves the ceiling ``TOKEN_RESERVE_STEP`` ahead; a ``reserve``
  entry moves it ahead within a term; any other entry that could pass it is refused
  (``UNAVAILABLE``) unchanged. The leader proposes both kinds with ``durable`` set,
  so they reach stable storage even with ``durability = "none"``, and a token is
  never handed out twice after a restart that lost the log's tail (docs/design.md).
* Renew and release require the ``lease_id`` that only the grantee received; reads
  never reveal it. Lease ids are drawn by the leader and carried in the entry.
* Client ids (Raft dissertation §6.3): a mutating entry carries ``(cid, seq, ack)``;
  results of requests the client has not acknowledged (``seq >= ack``) are kept in the
  dedup table (``dedup.ClientTable``) and returned again for a retried ``seq``, so a
  retry never applies twice.
* Outcomes are values. ``apply`` never raises on any input: malformed entries get a
  ``BAD_REQUEST`` result and leave the state unchanged.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable
from typing import Any, ClassVar

from ..limits import MAX_QUEUE_TENANTS, MAX_SESSION_LEASES, TOKEN_RESERVE_STEP
from . import snapshot
from .audit import REFUSAL_CODES
from .budget import BUDGET_MUTATING_OPS, BUDGET_OPS, BUDGET_READ_OPS, check_budget_args
from .certkeys import check_certkey, check_holder_key_field, holder_key_of
from .checks import (
    ALL_OPS,
    MAX_BATCH,
    MUTATING_OPS,
    TASK_MUTATING_OPS,
    TASK_OPS,
    TASK_READ_OPS,
    check_args,
    valid_int,
)
from .deadlock import Agent, agent_of, find_path, refusal, youngest
from .deadlock import Wait as WaitEdge
from .dedup import fingerprint, fingerprint_of, remember
from .lease_effects import LEASE_EFFECT_OPS, check_lease_effect_args
from .queue import check_queue_args
from .records import (
    ClientRecord,
    KeyShares,
    LeaseRecord,
    LeaseSession,
    Result,
    Share,
    Waiter,
    error,
    waiter_refusal,
)
from .state import StoreState
from .task_records import FAIR_SCALE


def many_lease_id(lid: str, index: int) -> str:
    """The lease id of key ``index`` (0-based, in request order) of the set ``lid``
    taken by ``acquire_many``: derived, so the entry carries one drawn id."""
    return f"{lid}/{index}"


def _not_yours(what: str, name: str) -> Result:
    """Another principal's lease, queued acquire or lease session: its id alone is not
    enough (docs/security.md)."""
    return error("PERMISSION_DENIED", f"the {what} on {name!r} belongs to another principal")


class LeaseStore(StoreState):
    """The lease state machine. Single-threaded: the caller serializes ``apply``.

    Acquires that do not fit queue in ``(-priority, arrival)`` order, and nobody
    overtakes the head of the queue: a request that would fit is still queued behind
    an earlier one that does not (so a waiting writer is never starved by a stream of
    readers).
    """

    # ------------------------------------------------------------------ apply

    def apply(self, entry: Any) -> Result:
        """Apply one log entry and return its result. Never raises.

        A ``batch`` entry (``{"op": "batch", "now", "term", "entries": [...]}``) carries
        several requests the leader proposed together; each is applied in order with
        the batch's time stamp and term, exactly as if it were its own entry, and the
        result is ``{"ok": True, "results": [...]}`` in the same order.
        """
        self.events = []
        # Odd while an entry is being applied (a seqlock): a read on another thread
        # (a leader-lease read) that saw it odd, or changed, may have seen part of one
        # entry (part of a set of keys) and reads again or through the log instead.
        self.apply_seq += 1
        try:
            if isinstance(entry, dict) and entry.get("op") == "batch":
                return self._apply_batch(entry)
            return self._apply_entry(entry)
        finally:
            self.apply_seq += 1

    def _apply_batch(self, batch: dict[str, Any]) -> Result:
        entries = batch.get("entries")
        if not isinstance(entries, list) or not 0 < len(entries) <= MAX_BATCH:
            return error("BAD_REQUEST", f"'entries' must be a list of 1 to {MAX_BATCH} entries")
        stamp = {"now": batch.get("now"), "term": batch.get("term", 0)}
        if "fv" in batch:  # the entry format: what a new term's first entry means
            stamp["fv"] = batch["fv"]
        if "seed" in batch:  # the leader's random draw for this entry (core/queue.py)
            stamp["seed"] = batch["seed"]
        results = []
        for sub in entries:
            if not isinstance(sub, dict) or sub.get("op") == "batch":
                results.append(error("BAD_REQUEST", "a batch holds request maps only"))
            else:
                results.append(self._apply_entry({**sub, **stamp}))
        return {"ok": True, "results": results}

    def _apply_entry(self, entry: Any) -> Result:
        """One request (an entry, or one of a batch's), then the deadlock checks of
        the grants it made (core/deadlock.py): in this same entry, before anyone
        reads the state after it."""
        self._grants_to_check = []
        # Format 6 and later detect deadlocks; an older entry is replayed as written.
        self._detect = isinstance(entry, dict) and valid_int(entry.get("fv", 1), 6, 2**31)
        result = self._apply_one(entry)
        if self._grants_to_check:
            self._resolve_deadlocks()
        return result

    def _apply_one(self, entry: Any) -> Result:
        if not isinstance(entry, dict):
            return error("BAD_REQUEST", "entry must be a map")
        op = entry.get("op")
        if not isinstance(op, str) or op not in ALL_OPS:  # an unhashable op must not raise
            return error("BAD_REQUEST", f"unknown operation {op!r}")
        now: int = entry.get("now")  # type: ignore[assignment]
        if not valid_int(now, 0, 2**62):
            return error("BAD_REQUEST", "entry time stamp 'now' must be a non-negative integer")
        term = entry.get("term", 0)
        if not valid_int(term, 0, 2**62):
            return error("BAD_REQUEST", "entry 'term' must be a non-negative integer")
        if not valid_int(entry.get("fv", 1), 1, 2**31):
            return error("BAD_REQUEST", "entry format 'fv' must be a positive integer")
        problem = check_args(op, entry)
        if problem is None and op in TASK_OPS:
            problem = check_queue_args(op, entry)
        if problem is None and op in BUDGET_OPS:
            problem = check_budget_args(op, entry)
        if problem is None and op == "certkey":
            problem = check_certkey(entry)
        if problem is None and op in LEASE_EFFECT_OPS:
            problem = check_lease_effect_args(op, entry)

        if problem is None:
            problem = check_holder_key_field(op, entry)
        if problem is not None:
            return error("BAD_REQUEST", problem)

        actor = entry.get("principal", "")
        # Whose request this is, for the audit trail (a leader's own entry: "").
        self.audit_actor = actor if isinstance(actor, str) else ""
        if term < self.term:
            # Stamped by a leader deposed since: its time stamp and its view are
            # stale, and applying a grant at our last log time could let the lease
            # expire early. Refuse it unchanged; the client retries at the leader.
            return error(
                "NOT_LEADER",
                f"entry stamped in term {term} by a deposed leader (term is {self.term})",
            )
        if op in MUTATING_OPS and self._forged_retry(op, entry):
            # Checked before anything moves: not even the client's ack is taken.
            return error(
                "BAD_REQUEST",
                "request (cid, seq) was already answered for a different request; not applied",
            )
        reused = self._reused_id(op, entry)
        if reused is not None and not self.clients.answered(entry["cid"], entry["seq"]):
            # Checked before anything moves, so a refused entry changes nothing (not
            # log time, not ``applied``, not the client's dedup table): a retry of the
            # same request carries a fresh id drawn by the leader and must not find a
            # cached refusal. A retry of a request already answered is replayed from
            # the dedup table below (its id is in use: by its own lease).
            return error("BAD_REQUEST", reused)
        if term > self.term and entry.get("fv", 1) >= 2:
            # The first entry of a new leader's term (format 2 and later): leaders
            # answer keep-alives from memory and write them into the log later
            # (``extend``), so a deposed leader may have promised any live lease or
            # session up to one TTL past its logged expiry. Extend them all by their
            # TTL from this entry's time, before it expires anything (docs/design.md).
            self._extend_all(max(self.now, now))
        if term > self.term or self.ceiling == 0:
            self._new_epoch()
        elif op != "reserve" and self.revision + self.token_headroom() > self.ceiling:
            # The leader reserves long before this (at half a step); reaching it means
            # its reserve entry is late. Refused unchanged; the client retries.
            return error(
                "UNAVAILABLE",
                f"fencing tokens are reserved up to {self.ceiling}; waiting for the "
                "leader to reserve more",
            )
        self.applied += 1
        self.term = term
        if op == "reserve":
            self.ceiling = max(self.ceiling, self.revision + self.token_headroom())
            self.ceiling += TOKEN_RESERVE_STEP
        # Drawn by the leader, stamped like ``now``: the backoff jitter's source.
        seed = entry.get("seed", 0)
        self.tasks.seed = seed if valid_int(seed, 0, 2**64) else 0
        if op == "extend":
            # Applied without moving log time: the leader may split what is due into
            # several entries before the one that moves time past their old expiry.
            return self._leader_extend(entry, max(self.now, now))
        self._advance(now)

        if op == "tick":
            return {"ok": True, "now": self.now}
        if op == "certkey":
            return self.cert_keys.apply(entry, self.now)
        if op == "reserve":
            return {"ok": True, "now": self.now, "ceiling": self.ceiling}
        if op == "holder":
            holder = self.holder(entry["key"])
            return {"ok": True, "holder": holder, "now": self.now, "revision": self.revision}
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
        if op == "waiters":
            waiters = self.list_waiters(entry["key"], entry.get("limit", 1000))
            return {"ok": True, **waiters, "now": self.now}
        if op == "sessions":
            return {"ok": True, "sessions": self.list_sessions(entry.get("limit", 1000))}
        if op in TASK_READ_OPS:
            return self.tasks.read(self, entry)
        if op in BUDGET_READ_OPS:
            return self.budgets.read(entry, self.now)
        return self._apply_mutation(op, entry)

    def _new_epoch(self) -> None:
        """The first entry of a new term: move past every token the previous terms
        could have handed out, and reserve the next step (the entry carries
        ``durable``, so the new ceiling is on stable storage before it is used)."""
        if self.ceiling > self.revision:
            self.revision = self.ceiling
            # Not a change to any key: tells the watch history the gap is expected.
            self.events.append({"type": "jump", "revision": self.revision})
        self.ceiling = self.revision + self.token_headroom() + TOKEN_RESERVE_STEP

    def _reused_id(self, op: str, entry: dict[str, Any]) -> str | None:
        """The leader draws fresh lease and session ids; one already known here (live,
        queued, or due to expire in this very entry) is a bug or forged."""
        if op == "acquire" and (entry["lid"] in self.leases or entry["lid"] in self.waiting):
            return "lease id already in use"
        if op == "acquire_many":
            lid = entry["lid"]
            if lid in self.leases or lid in self.waiting or lid in self.lease_sessions:
                return "lease id already in use"
            derived = [many_lease_id(lid, i) for i in range(len(entry["keys"]))]
            if any(one in self.leases or one in self.waiting for one in derived):
                return "lease id already in use"
        if op == "transfer" and (
            entry["new_lid"] in self.leases or entry["new_lid"] in self.waiting
        ):
            return "lease id already in use"
        if op == "session_open" and entry["sid"] in self.lease_sessions:
            return "session id already in use"
        if op in TASK_MUTATING_OPS:
            return self.tasks.reused_id(op, entry)
        if op in BUDGET_MUTATING_OPS:
            return self.budgets.reused_id(op, entry)
        return None

    def _advance(self, now: int) -> None:
        """Move log time forward and expire what is due, in a deterministic order:
        lease sessions first (with everything attached), then leases, then waiters
        whose deadline passed."""
        if now > self.now:
            self.now = now
        ends = self._session_deadlines
        due: list[LeaseSession] = []
        while ends and ends[0][0] <= self.now:
            expires_at, sid = heapq.heappop(ends)
            session = self.lease_sessions.get(sid)
            if session is not None and session.expires_at == expires_at:
                # Every session due now is gone before any of them frees units, so
                # none of their waiters can be granted on the way.
                del self.lease_sessions[sid]
                self._count(self.sessions_by, session.principal, -1)
                due.append(session)
        for session in due:
            self._end_session(session, "expire")
        if self.now >= self._horizon:
            self._rebuild_deadlines()  # the leases due from the old horizon on
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= self.now:
            expires_at, lease_id = heapq.heappop(deadlines)
            lease = self.leases.get(lease_id)
            if lease is not None and lease.expires_at == expires_at:
                self.expired_total += 1
                # A progress-aware lease whose holder reported no progress within its
                # progress_timeout ends as ``stalled`` (§4g), in log time like any expiry.
                if self.progress.stalled(lease_id, self.now):
                    self._end_lease(lease, "stalled")
                else:
                    self._end_lease(lease, "expire")
        for lease_id in self.preempt.due(self.now):
            # A yield request's deadline passed and the holder did not release: the
            # cluster ends the lease itself, and its key's next waiter is granted in
            # this same entry (a new lease id and a new token).
            lease = self.leases.get(lease_id)
            if lease is not None:
                self._end_lease(lease, "preempt")
        waits = self._wait_deadlines
        while waits and waits[0][0] <= self.now:
            deadline, lease_id = heapq.heappop(waits)
            waiter = self.waiting.get(lease_id)
            if waiter is not None and waiter.deadline == deadline:
                self._dequeue(waiter, "deadline")
        self.tasks.advance(self)  # task attempts, deadlines, delays, claims, retention
        # Budgets: reservations and waits due, waiting heads the refill now covers.
        self.events.extend(self.budgets.advance(self.now))
        # Lease effect journals whose retention after their key's last lease ran out.
        self.lease_effects.advance(self.now, lambda key: self.newest_holder(key) is not None)
        # Stale heap entries (from renewals) accumulate; rebuild when they dominate.
        if len(deadlines) > 64 and len(deadlines) > 4 * len(self.leases):
            self._rebuild_deadlines()
        self.clients.evict_idle(self.now)

    def _extend_all(self, base: int) -> None:
        """A new term begins at log time ``base``: every live lease and lease session
        is extended to at least ``base`` + its TTL (attached leases and task attempts
        with their session). No revision and no event: nothing a watcher could act on
        changed, only how long a lease may outlive a dead holder (one TTL at most per
        leader change, never less than it was promised)."""
        for lease in self.leases.values():
            until = base + lease.ttl_ms
            cap = self.progress.cap(lease.lease_id)  # never past a progress deadline
            if cap is not None and cap < until:
                until = cap
            if not lease.session and until > lease.expires_at:
                lease.expires_at = until
        for session in self.lease_sessions.values():
            until = base + session.ttl_ms
            if until > session.expires_at:
                session.expires_at = until
                for lease_id in session.leases:
                    lease = self.leases[lease_id]
                    cap = self.progress.cap(lease_id)  # never past a progress deadline
                    if cap is None or cap >= until:
                        lease.expires_at = until
                    elif cap > lease.expires_at:
                        lease.expires_at = cap
                self.tasks.session_kept(self, session)
        self._rebuild_deadlines()
        self._session_deadlines = [(s.expires_at, sid) for sid, s in self.lease_sessions.items()]
        heapq.heapify(self._session_deadlines)

    def _leader_extend(self, entry: dict[str, Any], base: int) -> Result:
        """``extend``: the keep-alives the leader answered from memory (``[id, until]``
        pairs for leases and lease sessions), and the client ids that sent them (kept
        from idle eviction). An ``until`` is at most the TTL past this entry's time
        (the leader's time when it answered is earlier; a longer one, promised under
        a TTL shortened since, is cut to it); one that is not later than the logged
        expiry, or whose lease or session is gone, changes nothing."""
        extended = 0
        for lease_id, promised in entry.get("leases", []):
            lease = self.leases.get(lease_id)
            if lease is None or lease.session:
                continue
            # Never more than the TTL past this entry's time: a promise made under a TTL
            # the holder has shortened since is cut to the new one (never below a
            # promise made under it, which is at most ``base + ttl``).
            until = min(promised, base + lease.ttl_ms)
            cap = self.progress.cap(lease_id)  # never promised from memory (§4g)
            if cap is not None and cap < until:
                until = cap
            if until <= lease.expires_at:
                continue
            self._extend(lease, until)
            extended += 1
        for sid, promised in entry.get("sessions", []):
            session = self.lease_sessions.get(sid)
            if session is None:
                continue
            until = min(promised, base + session.ttl_ms)
            if until <= session.expires_at:
                continue
            self._keep_session(session, until)
            extended += 1
        for cid in entry.get("cids", []):
            # At applied log time, not ``base``: the dedup table stays ordered by
            # ``last_seen`` (a later leader may stamp below ``base``).
            self.clients.touch(cid, self.now)
        return {"ok": True, "now": self.now, "extended": extended}

    def _apply_mutation(self, op: str, entry: dict[str, Any]) -> Result:
        record = self.clients.admit(entry["cid"], entry["seq"], entry["ack"], self.now)
        if not isinstance(record, ClientRecord):
            return record  # refused by the dedup table: the refusal is the answer
        seq: int = entry["seq"]
        cached = record.results.get(seq)
        if cached is not None:
            # A retry (``_forged_retry`` refused any other request): answered again,
            # never applied twice.
            return cached
        reused = self._reused_id(op, entry)
        if reused is not None:
            # ``_apply_one`` let a known id through because the request was answered,
            # but this entry's own time step evicted the client's record (idle) and
            # with it the answer to replay, while the id is still in use: applying it
            # afresh would hand a live lease's id out twice. (An id whose lease ended
            # in that step is free again, and the request is applied as new.)
            return error("BAD_REQUEST", reused)
        result = self._MUTATIONS[op](self, entry)
        record.results[seq] = result
        remember(record, seq, op, entry)
        if not result.get("ok", True) and result.get("code") in REFUSAL_CODES:
            # After the dedup table took the answer: a retry is answered from it
            # above and records nothing again. The ring is bounded on its own.
            self._audit_refusal(op, entry, result)
        return result

    def _audit_refusal(self, op: str, entry: dict[str, Any], result: Result) -> None:
        """One refusal record (docs/audit.md "Refusals"): the type is the code in lower
        case, ``key`` the key (a task's ``queue:<name>/<tid>``), ``token`` and ``owner``
        the current holder's when the answer names them, ``by`` the requester. Touches
        only ``audit_refusals``: the refusal changes nothing else."""
        detail = result.get("detail") or {}
        key = entry.get("key")
        keys = entry.get("keys")
        if not isinstance(key, str) and isinstance(keys, (list, dict)):
            key = ",".join(str(k) for k in keys)  # acquire_many: its (at most 16) keys
        elif not isinstance(key, str):
            queue, tid = entry.get("queue"), entry.get("tid")
            key = f"queue:{queue}/{tid}" if isinstance(queue, str) and tid else ""
        token = detail.get("token", detail.get("current_token", 0))
        owner = detail.get("owner", "")
        self.audit_refusals.add(
            self.now,
            str(result["code"]).lower(),
            key,
            token if isinstance(token, int) else 0,
            owner if isinstance(owner, str) else "",
            "",
            self.audit_actor,
            self.revision,
        )

    def _forged_retry(self, op: str, entry: dict[str, Any]) -> bool:
        """Is ``entry`` another request under a ``(cid, seq)`` already answered? (A
        forged or buggy client: the cached answer, a lease id perhaps, is not its to
        see.)"""
        record = self.clients.get(entry["cid"])
        if record is None or entry["seq"] not in record.results:
            return False
        known = fingerprint_of(record, entry["seq"])
        return known is not None and known != fingerprint(op, entry)

    def _acquire(self, entry: dict[str, Any]) -> Result:
        key: str = entry["key"]
        lease_id: str = entry["lid"]
        capacity: int = entry.get("capacity", 1)
        units: int = entry.get("units", 1)
        known = self.known_capacity(key)
        if known is not None and known != capacity:
            return error(
                "CAPACITY_MISMATCH",
                f"{key!r} is in use with capacity {known}, not {capacity}",
                capacity=known,
            )
        if known is None and capacity > 1 and entry.get("shaper") is False:
            # The first acquire fixes a shared key's shape: only principals with the
            # shape permission may (docs/security.md), or anyone could squat a pool.
            return error(
                "PERMISSION_DENIED",
                f"{entry.get('principal', '')} may not fix the capacity of {key!r} "
                f"(needs the shape permission on it); it has no holder or waiter yet",
                key=key,
            )
        sid: str = entry.get("session", "")
        session = self.lease_sessions.get(sid) if sid else None
        principal: str = entry.get("principal", "")
        if sid:
            if session is None:
                return error("SESSION_NOT_FOUND", f"lease session {sid!r} does not exist")
            if session.principal != principal:
                return _not_yours("lease session", sid)
            if len(session.leases) + len(session.waiters) >= MAX_SESSION_LEASES:
                return error(
                    "INVALID_ARGUMENT",
                    f"lease session {sid!r} already carries {MAX_SESSION_LEASES} leases",
                )
        quota = entry.get("quota")
        if principal and quota is not None and self.held_by.get(principal, 0) >= quota:
            return error(
                "QUOTA_EXCEEDED",
                f"{principal} holds or waits for {self.held_by[principal]} leases; its quota "
                f"is {quota}",
            )
        ttl: int = session.ttl_ms if session is not None else entry["ttl"]
        value: str = entry.get("value", "")
        # The certificate holder key is bound to the lease (or its queued acquire)
        # here, at the grant: a renewal may never name another (``_renew``).
        holder = holder_key_of(entry)
        queue = self.queues.get(key)
        priority: int = entry.get("priority", 0)
        tenant: str = entry.get("fairness_key", "")
        fair = "fairness_key" in entry or "weight" in entry
        if queue and (fair or key in self.fair):
            # Fair shares in play: granted now only if it would be the next chosen
            # (its tenant's turn and its tenant's head) and fits (§4d).
            first = self._would_be_next(key, queue, tenant, priority)
        else:
            first = not queue or priority > queue[0].priority
        if first and self.units_used(key) + units <= capacity:
            # Nobody waits ahead of it (the queue is empty, or it outranks the head)
            # and the units fit: granted now, if its budget gate (if any) covers the
            # cost, drawn in this same entry (never a grant without its draw).
            refusal = self.budgets.gate_refusal(entry, self.now)
            if refusal is not None:
                return refusal
            self.budgets.gate_draw(entry)
            self._fix_capacity(key, capacity)
            shares = self.fair.get(key)
            if queue and shares is not None:
                # It overtakes waiting tenants on its tenant's turn: charged as a
                # grant from the queue (an empty queue has nobody to be fair to).
                share = shares.tenants.get(tenant) or Share()
                if "weight" in entry:
                    share.weight = entry["weight"]
                shares.tenants[tenant] = share
                self._charge(shares, tenant)
            lease = self._grant(
                key, lease_id, entry["owner"], ttl, units, value, sid, principal, holder=holder
            )
            self.preempt.granted(lease_id, priority)
            self._start_progress(lease, entry.get("progress_timeout"))
            return self._lease_result(lease)
        wait: int = entry.get("wait", 0)
        if wait <= 0:
            return self._held_error(key, capacity, queue)
        if "gate_budget" in entry:
            # A gated acquire does not queue: its draw must be in the entry that
            # grants it, and a later grant from the queue could find the budget
            # empty (docs/budgets.md, "Budget gates"). Refused as without ``wait``.
            held = self._held_error(key, capacity, queue)
            held["detail"] = {**held.get("detail", {}), "gated": True}
            return held
        # Checked only when it would queue: a grant needs no waiter slot. The total
        # is derived from the wait queues, so a restored snapshot counts the same.
        refusal = waiter_refusal(
            entry, "queued acquires", self.waiting_by.get(principal, 0), len(self.waiting)
        )
        if refusal is not None:
            return refusal
        shares = self.fair.get(key)
        if (
            shares is not None
            and tenant not in shares.tenants
            and len(shares.tenants) >= MAX_QUEUE_TENANTS
        ):
            return error(
                "QUOTA_EXCEEDED",
                f"{key!r} already has {len(shares.tenants)} fairness keys waiting; at most "
                f"{MAX_QUEUE_TENANTS}",
                quota=MAX_QUEUE_TENANTS,
            )
        if self._detect:
            # The last check: a refusal here leaves everything as it was.
            deadlock = self._closes_cycle(principal, entry["owner"], [key], priority, lease_id)
            if deadlock is not None:
                return deadlock
        self._fix_capacity(key, capacity)
        if fair and shares is None:
            # The first waiter with a fairness key or weight: those queued before it
            # are the default tenant's (weight 1, at the virtual time 0).
            shares = self.fair[key] = KeyShares()
            if queue:
                self._join(shares, "").waiting = len(queue)
        if shares is not None:
            share = self._join(shares, tenant)
            share.waiting += 1
            if "weight" in entry:
                # The latest queued acquire that names a weight sets its tenant's.
                share.weight = entry["weight"]
        self.queue_order += 1
        waiter = Waiter(
            key=key,
            lease_id=lease_id,
            owner=entry["owner"],
            ttl_ms=ttl,
            priority=priority,
            order=self.queue_order,
            deadline=self.now + wait,
            units=units,
            value=value,
            session=sid,
            principal=principal,
            tenant=tenant,
            holder=holder,
        )
        queue = self.queues.setdefault(key, [])
        position = bisect.bisect_right([w.rank() for w in queue], waiter.rank())
        queue.insert(position, waiter)
        self.waiting[lease_id] = waiter
        self.wait_index.add(waiter)
        if "progress_timeout" in entry:  # its clock starts when it is granted (§4g)
            self.progress.pending[lease_id] = entry["progress_timeout"]
        self._count(self.held_by, principal, 1)
        self._count(self.waiting_by, principal, 1)
        if session is not None:
            session.waiters[lease_id] = None
        heapq.heappush(self._wait_deadlines, (waiter.deadline, lease_id))
        return {
            "ok": True,
            "queued": True,
            "key": key,
            "owner": waiter.owner,
            "lease_id": lease_id,
            "position": position + 1,
            "deadline": waiter.deadline,
            "now": self.now,
        }

    def _acquire_many(self, entry: dict[str, Any]) -> Result:
        """Take every key of ``keys`` (``[key, units]`` pairs) or none, in this entry.

        Each key is checked exactly as a single acquire that does not wait: the
        capacity it is in use with, who may fix a shared key's shape, and whether it
        is free for this request (no queue ahead of it, or it outranks the head, and
        its units fit). Every check runs before anything changes, so a refusal leaves
        the state as it was and a grant takes all keys in this one entry: no read or
        watch between two entries sees part of the set.

        The set lives as a lease session whose id is the set's lease id ``lid``: one
        keep-alive (``session_keepalive``) for every key, one release of all of them
        (``session_close``), and one expiry that ends all of them in one entry. Each
        key gets its own lease (id ``lid/<index>``, returned to the grantee only) and
        its own fencing token, one revision apart in the order the keys were given;
        releasing one key with its own lease id is allowed and ends that key alone.
        Without ``wait`` a busy set is refused; with it, it queues as one waiter on
        every key (``_queue_set``; docs/usage.md, "Several keys at once")."""
        lid: str = entry["lid"]
        items: list[list[Any]] = entry["keys"]
        capacity: int = entry.get("capacity", 1)
        principal: str = entry.get("principal", "")
        priority: int = entry.get("priority", 0)
        quota = entry.get("quota")
        held = self.held_by.get(principal, 0)
        if principal and quota is not None and held + len(items) > quota:
            return error(
                "QUOTA_EXCEEDED",
                f"{principal} holds or waits for {held} leases; {len(items)} more would pass "
                f"its quota of {quota}",
            )
        session_quota = entry.get("session_quota")
        sessions = self.sessions_by.get(principal, 0)
        if principal and session_quota is not None and sessions >= session_quota:
            return error(
                "QUOTA_EXCEEDED",
                f"{principal} has {sessions} lease sessions (a set of keys is one); its "
                f"quota is {session_quota}",
            )
        if self.revision + self.token_headroom() + len(items) > self.ceiling:
            # One revision per key on top of the headroom every request has.
            return error(
                "UNAVAILABLE",
                f"fencing tokens are reserved up to {self.ceiling}; waiting for the "
                "leader to reserve more",
            )
        busy: list[str] = []
        for key, units in items:
            known = self.known_capacity(key)
            if known is not None and known != capacity:
                return error(
                    "CAPACITY_MISMATCH",
                    f"{key!r} is in use with capacity {known}, not {capacity}",
                    capacity=known,
                    key=key,
                )
            if known is None and capacity > 1 and entry.get("shaper") is False:
                return error(
                    "PERMISSION_DENIED",
                    f"{principal} may not fix the capacity of {key!r} (needs the shape "
                    "permission on it); it has no holder or waiter yet",
                    key=key,
                )
            queue = self.queues.get(key)
            first = not queue or priority > queue[0].priority
            if not (first and self.units_used(key) + units <= capacity):
                busy.append(key)
        if busy and entry.get("wait", 0) > 0:
            return self._queue_set(entry, items, busy)
        if busy:
            # All or nothing: one busy key refuses the set, and nothing was taken.
            return error(
                "LEASE_HELD",
                f"{len(busy)} of the {len(items)} keys are held or promised to queued "
                f"acquires: {', '.join(repr(k) for k in busy)}; none was taken",
                keys=busy,
            )
        for key, _units in items:
            self._fix_capacity(key, capacity)
        session = self._grant_set(
            lid, entry["owner"], entry["ttl"], principal, items, priority, holder_key_of(entry)
        )
        return {
            "ok": True,
            "lease_id": lid,
            "session": lid,
            "owner": session.owner,
            "ttl": session.ttl_ms,
            "expires_at": session.expires_at,
            "leases": [
                self._extras(
                    self.leases[lease_id], self._set_member(self.leases[lease_id]), grantee=False
                )
                for lease_id in session.leases
            ],
            "now": self.now,
            "revision": self.revision,
        }

    def _grant_set(
        self,
        lid: str,
        owner: str,
        ttl: int,
        principal: str,
        items: list[list[Any]],
        priority: int = 0,
        holder: bytes | None = None,
    ) -> LeaseSession:
        """Grant every key of a set (``[key, units]`` pairs, capacities fixed, every
        key free for it) in this entry: its lease session ``lid``, then one lease per
        key (``lid/<index>``), tokens one revision apart in the order given; each
        bound to the certificate ``holder`` key the set's acquire named (or none)."""
        session = LeaseSession(
            session_id=lid,
            owner=owner,
            ttl_ms=ttl,
            expires_at=self.now + ttl,
            leases={},
            waiters={},
            principal=principal,
        )
        self.lease_sessions[lid] = session
        self._count(self.sessions_by, principal, 1)
        heapq.heappush(self._session_deadlines, (session.expires_at, lid))
        for index, (key, units) in enumerate(items):
            self._grant(
                key, many_lease_id(lid, index), owner, ttl, units, "", lid, principal, holder=holder
            )
            self.preempt.granted(many_lease_id(lid, index), priority)
        return session

    def _queue_set(self, entry: dict[str, Any], items: list[list[Any]], busy: list[str]) -> Result:
        """An ``acquire_many`` with ``wait`` that is not free now: one waiter on every
        key of the set (``lid/<index>``, one queue order for all, so two sets are in
        the same order on every key they share), granted together, in one entry,
        when each is the next on its key and its units fit (``_grant_set_if_ready``).
        Until then each holds its place: once at the head of a key, nobody behind it
        there is granted (no starvation of a set by single-key acquires; they are
        served in arrival order per key, docs/design.md §4c). Refused (nothing
        changed) by the waiter quotas or ``DEADLOCK``."""
        lid: str = entry["lid"]
        owner: str = entry["owner"]
        principal: str = entry.get("principal", "")
        priority: int = entry.get("priority", 0)
        capacity: int = entry.get("capacity", 1)
        count = len(items)
        refusal = waiter_refusal(
            entry, "queued acquires", self.waiting_by.get(principal, 0), len(self.waiting), count
        )
        if refusal is not None:
            return refusal
        if self._detect:
            keys = [key for key, _units in items]
            deadlock = self._closes_cycle(principal, owner, keys, priority, lid, True)
            if deadlock is not None:
                return deadlock
        order = self.queue_order = self.queue_order + 1
        deadline = self.now + entry["wait"]
        positions: list[int] = []
        for index, (key, units) in enumerate(items):
            self._fix_capacity(key, capacity)
            shares = self.fair.get(key)
            if shares is not None:  # a set waits in the key's default tenant
                self._join(shares, "").waiting += 1
            waiter = Waiter(
                key=key,
                lease_id=many_lease_id(lid, index),
                owner=owner,
                ttl_ms=entry["ttl"],
                priority=priority,
                order=order,
                deadline=deadline,
                units=units,
                principal=principal,
                group=lid,
                holder=holder_key_of(entry),  # bound at the set's grant
            )
            queue = self.queues.setdefault(key, [])
            position = bisect.bisect_right([w.rank() for w in queue], waiter.rank())
            queue.insert(position, waiter)
            positions.append(position + 1)
            self.waiting[waiter.lease_id] = waiter
            self.wait_index.add(waiter)
            self._count(self.held_by, principal, 1)
            self._count(self.waiting_by, principal, 1)
            heapq.heappush(self._wait_deadlines, (deadline, waiter.lease_id))
        self.waiting_sets[lid] = count
        return {
            "ok": True,
            "queued": True,
            "lease_id": lid,
            "owner": owner,
            "keys": [key for key, _units in items],
            "positions": positions,
            "busy": busy,
            "deadline": deadline,
            "now": self.now,
        }

    def _set_waiters(self, lid: str) -> list[Waiter]:
        """The waiters of the waiting set ``lid`` still queued, in key order."""
        count = self.waiting_sets.get(lid, 0)
        found = (self.waiting.get(many_lease_id(lid, index)) for index in range(count))
        return [waiter for waiter in found if waiter is not None]

    def _grant_set_if_ready(self, lid: str) -> bool:
        """Grant the waiting set ``lid`` if every one of its waiters is the next on its
        key (``_next_waiter``), within its wait, and its units fit: all its keys in
        this entry, and the queues of its other keys are served on (their head
        left). False (nothing changed) if not."""
        count = self.waiting_sets.get(lid, 0)
        members = self._set_waiters(lid)
        if not members or len(members) != count:
            return False
        for waiter in members:
            queue = self.queues.get(waiter.key)
            if not queue or self._next_waiter(waiter.key, queue) is not waiter:
                return False
            if waiter.deadline <= self.now:
                return False
            if self.units_used(waiter.key) + waiter.units > self.capacity_of(waiter.key):
                return False
        del self.waiting_sets[lid]
        for waiter in members:
            self.queues[waiter.key].remove(waiter)
            shares = self.fair.get(waiter.key)
            if shares is not None:
                self._charge(shares, waiter.tenant)
                self._leave(shares, waiter.tenant)
            del self.waiting[waiter.lease_id]
            self.wait_index.remove(waiter)
            self._count(self.held_by, waiter.principal, -1)
            self._count(self.waiting_by, waiter.principal, -1)
        first = members[0]
        items = [[waiter.key, waiter.units] for waiter in members]
        self._grant_set(
            lid, first.owner, first.ttl_ms, first.principal, items, first.priority, first.holder
        )
        for waiter in members:
            # Its place at the head of each key is free: those behind may fit now.
            self._grant_next(waiter.key)
        return True

    def _fix_capacity(self, key: str, capacity: int) -> None:
        """Record the capacity of a key about to get a holder or waiter: above 1
        only (absent means 1), with its units in use from 0."""
        if capacity != 1 and key not in self.capacity:
            self.capacity[key] = capacity
            self.used[key] = self.units_used(key)

    def _held_error(self, key: str, capacity: int, queue: list[Waiter] | None) -> Result:
        newest = self.newest_holder(key)
        detail: dict[str, Any] = {"waiting": len(queue or ())}
        if newest is not None:
            detail.update(
                owner=newest.owner,
                token=newest.token,
                remaining=(newest.expires_at - self.now) / 1000.0,
            )
        if capacity > 1:
            detail.update(capacity=capacity, used=self.units_used(key))
            why = f"{self.units_used(key)} of {capacity} units are taken"
            if queue:
                why += f" and {len(queue)} acquire(s) wait ahead"
            return error("LEASE_HELD", f"{key!r}: {why}", **detail)
        if newest is None:  # free, but earlier acquires are queued: no overtaking
            return error("LEASE_HELD", f"{key!r} is promised to queued acquires", **detail)
        return error("LEASE_HELD", f"{key!r} is held by {newest.owner!r}", **detail)

    def _grant(
        self,
        key: str,
        lease_id: str,
        owner: str,
        ttl: int,
        units: int = 1,
        value: str = "",
        sid: str = "",
        principal: str = "",
        slots: tuple[int, ...] | None = None,
        holder: bytes | None = None,
    ) -> LeaseRecord:
        """``slots``: the unit indices to hold (a transfer keeps them); default the
        lowest free ones (``free_slots``). ``holder``: the certificate holder key
        bound to the lease (``LeaseRecord.holder``)."""
        if slots is None:
            slots = self.free_slots(key, units)
        self.revision += 1
        session = self.lease_sessions.get(sid) if sid else None
        if session is not None:
            ttl = session.ttl_ms  # a queued acquire's TTL is its session's, as of now
        lease = LeaseRecord(
            key=key,
            lease_id=lease_id,
            owner=self.share(owner),
            token=self.revision,
            ttl_ms=self.share(ttl),
            granted_at=self.now,
            expires_at=self.expiry(self.now + ttl) if session is None else session.expires_at,
            units=units,
            value=value,
            session=sid if session is not None else "",
            principal=self.share(principal),
            slots=slots,
            holder=holder,
        )
        self.leases[lease_id] = lease
        self._add_holder(lease)
        if session is not None:
            session.leases[lease_id] = None
        self._push_deadline(lease.expires_at, lease_id)
        self._count(self.held_by, principal, 1)
        self._event("grant", lease)
        if self._detect and self.queues.get(key):
            # Others wait for this key: each now waits for this holder too, which
            # may close a cycle through it (checked at the end of the entry).
            self._grants_to_check.append(lease_id)
        return lease

    def _start_progress(self, lease: LeaseRecord, timeout_ms: int | None) -> None:
        """A lease just granted: if it (or its queued acquire) asked for a
        ``progress_timeout``, its progress clock starts now and its expiry is capped at
        ``now + timeout`` (docs/design.md §4g)."""
        timeout = self.progress.granted(lease.lease_id, timeout_ms, self.now)
        if timeout is not None and self.now + timeout < lease.expires_at:
            lease.expires_at = self.now + timeout
            self._push_deadline(lease.expires_at, lease.lease_id)

    def _end_lease(self, lease: LeaseRecord, kind: str, grant_next: bool = True) -> None:
        """Remove a live lease (released, expired, transferred, its session ended),
        record the change, and hand freed units to the queue."""
        key = lease.key
        del self.leases[lease.lease_id]
        self.preempt.forget(lease.lease_id)
        self.progress.forget(lease.lease_id)
        self._count(self.held_by, lease.principal, -1)
        self._remove_holder(lease)
        if lease.session:
            session = self.lease_sessions.get(lease.session)
            if session is not None:
                session.leases.pop(lease.lease_id, None)
        if key in self.lease_effects.journals and self.newest_holder(key) is None:
            # Its effect journal's retention starts (§4h) when the lease ended: its
            # expiry time for an expiry applied later; a grant below keeps it.
            self.lease_effects.ended(key, min(self.now, lease.expires_at))
        self.revision += 1
        self._event(kind, lease)
        if grant_next:
            self._grant_next(key)

    def _grant_next(self, key: str) -> None:
        """Units on ``key`` were freed (or the queue's head left): grant waiters from
        the head of the queue while they fit, in this entry. Then forget the key's
        capacity if nothing holds or waits on it."""
        queue = self.queues.get(key)
        capacity = self.capacity_of(key)
        while queue:
            # The next turn: the queue's head, or with fair shares the head of the
            # tenant with the smallest pass. Head-of-line per key: if its units do
            # not fit, nobody else is granted until they do (no starvation).
            waiter = self._next_waiter(key, queue)
            session = self.lease_sessions.get(waiter.session) if waiter.session else None
            if waiter.session and session is None:
                # Its session ended in this entry: never grant it.
                self._dequeue(waiter, "session", grant_next=False)
                continue
            if waiter.deadline <= self.now:
                # Its deadline passed in this same entry, before its turn in
                # ``_advance``: never grant it.
                self._dequeue(waiter, "deadline", grant_next=False)
                continue
            if waiter.group:
                # One key of a waiting set: granted with all the others or not at all;
                # until then it keeps the head (head-of-line, as a waiter whose units
                # do not fit).
                if not self._grant_set_if_ready(waiter.group):
                    break
                continue
            if self.units_used(key) + waiter.units > capacity:
                break
            queue.remove(waiter)
            shares = self.fair.get(key)
            if shares is not None:
                self._charge(shares, waiter.tenant)
                self._leave(shares, waiter.tenant)
            del self.waiting[waiter.lease_id]
            self.wait_index.remove(waiter)
            self._count(self.held_by, waiter.principal, -1)
            self._count(self.waiting_by, waiter.principal, -1)
            if session is not None:
                session.waiters.pop(waiter.lease_id, None)
            self._grant(
                key,
                waiter.lease_id,
                waiter.owner,
                waiter.ttl_ms,
                waiter.units,
                waiter.value,
                waiter.session,
                waiter.principal,
                holder=waiter.holder,  # the key its acquire named, bound at this grant
            )
            self.preempt.granted(waiter.lease_id, waiter.priority)
            if self.progress.pending:
                self._start_progress(self.leases[waiter.lease_id], None)
        if not queue:
            self.queues.pop(key, None)
            # Nobody waits: nobody to be fair to; the next backlog starts afresh.
            self.fair.pop(key, None)
            if key not in self.holders:
                self.capacity.pop(key, None)
                self.used.pop(key, None)

    # ------------------------------------------------------ deadlocks (§4e)

    def _closes_cycle(
        self,
        principal: str,
        owner: str,
        keys: list[str],
        priority: int,
        lease_id: str,
        is_set: bool = False,
    ) -> Result | None:
        """Would an acquire of ``owner`` (of ``principal``) queued on ``keys`` (one key,
        or a set's) at ``priority`` close a cycle in the waits-for graph: a path from
        a holder of one of its keys, or a waiting set queued ahead of it there, back
        to its agent, or (a set) to an agent queued behind it? The ``DEADLOCK``
        refusal naming the cycle if so (it would be the cycle's youngest waiter),
        else None. Changes nothing."""
        agent = (principal, owner)
        order = self.queue_order + 1
        rank = (-priority, order)
        starts: dict[Agent, WaitEdge] = {}  # agent -> the new acquire's edge to it
        behind: dict[Agent, WaitEdge] = {}  # (a set) agent queued behind -> its edge
        for key in keys:
            for lease in sorted(self.holders_of(key), key=lambda held: held.token):
                if agent_of(lease) != agent:
                    edge = WaitEdge(owner, key, lease.owner, order, lease_id)
                    starts.setdefault(agent_of(lease), edge)
            for waiter in self.queues.get(key, ()):
                other = agent_of(waiter)
                if other == agent:
                    continue
                if waiter.rank() <= rank:  # ahead of it (it queues after equal ranks)
                    if waiter.group:
                        edge = WaitEdge(owner, key, waiter.owner, order, lease_id, True)
                        starts.setdefault(other, edge)
                elif is_set:
                    behind.setdefault(other, WaitEdge.of(waiter, owner, True))
        if not starts:
            return None
        both = [one for one in starts if one in behind]
        if both:
            cycle = [starts[both[0]], behind[both[0]]]
        else:
            found = find_path(self, list(starts), {agent, *behind})
            if found is None:
                return None
            path, start, goal = found
            cycle = [starts[start], *path]
            if goal != agent:
                cycle.append(behind[goal])
        return refusal(cycle, cycle[0])

    def _resolve_deadlocks(self) -> None:
        """After an entry: for each lease it granted on a key others still wait for,
        refuse the youngest waiter of every cycle through the new holder (it leaves
        its queue, reason ``deadlock``; its long-poll answers ``DEADLOCK``). A
        refusal may grant others (its queue's next), which are checked in turn: each
        round removes a waiter, so this ends."""
        pending = self._grants_to_check
        index = 0
        while index < len(pending):
            lease = self.leases.get(pending[index])
            index += 1
            while lease is not None and lease.lease_id in self.leases:
                holder = agent_of(lease)
                queue = self.queues.get(lease.key) or []
                goals = {agent_of(w) for w in queue} - {holder}
                found = find_path(self, [holder], goals) if goals else None
                if found is None:
                    break
                path, _, reached = found
                waiter = min((w for w in queue if agent_of(w) == reached), key=lambda w: w.order)
                closing = WaitEdge(
                    waiter.owner, lease.key, lease.owner, waiter.order, waiter.lease_id
                )
                cycle = [closing, *path]
                refused = youngest(cycle)
                victim = self.waiting[refused.lease_id]
                outcome = refusal(cycle, refused)
                # A waiting set leaves whole: each of its keys' long-polls learns it.
                for one in self._set_waiters(victim.group) if victim.group else [victim]:
                    self.deadlock_refusals.add(
                        one.lease_id, one.key, one.deadline, outcome, self.now
                    )
                self._dequeue(victim, "deadlock")
        self._grants_to_check = []

    # ------------------------------------------------------------ fair shares (§4d)

    @staticmethod
    def _join(shares: KeyShares, tenant: str) -> Share:
        """``tenant``'s share on a key (a new one: weight 1, pass 0, which counts
        as the virtual time: a tenant backlogged again starts at ``max(its pass,
        the virtual time)``)."""
        share = shares.tenants.get(tenant)
        if share is None:
            share = shares.tenants[tenant] = Share()
        return share

    @staticmethod
    def _start(shares: KeyShares, tenant: str) -> tuple[int, str]:
        """Where ``tenant``'s next turn starts, and its name (ties by name)."""
        share = shares.tenants.get(tenant)
        return (max(share.vpass if share is not None else 0, shares.vtime), tenant)

    def _next_waiter(self, key: str, queue: list[Waiter]) -> Waiter:
        """Whose turn it is on ``key``'s non-empty queue: its head (rank order)
        without fair shares; with them, the head (rank order) of the backlogged
        tenant with the smallest ``(max(pass, virtual time), name)``."""
        shares = self.fair.get(key)
        if shares is None:
            return queue[0]
        heads: dict[str, Waiter] = {}
        for waiter in queue:  # sorted by rank: a tenant's first is its head
            heads.setdefault(waiter.tenant, waiter)
        return heads[min(heads, key=lambda tenant: self._start(shares, tenant))]

    def _would_be_next(self, key: str, queue: list[Waiter], tenant: str, priority: int) -> bool:
        """Would an acquire of ``tenant`` at ``priority`` be next on ``key``'s
        non-empty queue if it queued? Its tenant's head only if it outranks the
        tenant's head (equal priority queues behind), and its tenant's turn."""
        shares = self.fair.get(key) or KeyShares()
        heads: dict[str, Waiter] = {}
        for waiter in queue:
            heads.setdefault(waiter.tenant, waiter)
        own = heads.get(tenant)
        if own is not None and priority <= own.priority:
            return False
        if key not in self.fair:
            # Only default-tenant waiters so far, all tied at the virtual time 0:
            # "" wins the tie by name over any named tenant (and it outranks "'s head).
            return tenant == ""
        turns = {name: self._start(shares, name) for name in heads}
        turns[tenant] = self._start(shares, tenant)
        return min(turns.values())[1] == tenant

    @staticmethod
    def _charge(shares: KeyShares, tenant: str) -> None:
        """``tenant`` is granted on its turn: the virtual time moves to the turn's
        start and its pass to start + ``FAIR_SCALE // weight``. Idle tenants whose
        pass the virtual time caught up with are forgotten (they would start at it)."""
        share = shares.tenants[tenant]
        start = max(share.vpass, shares.vtime)
        shares.vtime = start
        share.vpass = start + FAIR_SCALE // share.weight
        for name in [n for n, s in shares.tenants.items() if not s.waiting]:
            if shares.tenants[name].vpass <= shares.vtime:
                del shares.tenants[name]

    @staticmethod
    def _leave(shares: KeyShares, tenant: str) -> None:
        """One of ``tenant``'s waiters left the queue (granted or dequeued)."""
        share = shares.tenants.get(tenant)
        if share is None:
            return
        share.waiting -= 1
        if not share.waiting and share.vpass <= shares.vtime:
            del shares.tenants[tenant]

    def _dequeue(self, waiter: Waiter, reason: str, grant_next: bool = True) -> None:
        queue = self.queues.get(waiter.key, [])
        shares = self.fair.get(waiter.key)
        # The head: whose turn it is (with fair shares, the chosen tenant's head).
        head = bool(queue) and self._next_waiter(waiter.key, queue) is waiter
        queue.remove(waiter)
        if shares is not None:
            self._leave(shares, waiter.tenant)
            if not queue:
                self.fair.pop(waiter.key, None)
        del self.waiting[waiter.lease_id]
        self.wait_index.remove(waiter)
        self.progress.forget(waiter.lease_id)
        self._count(self.held_by, waiter.principal, -1)
        self._count(self.waiting_by, waiter.principal, -1)
        if waiter.session:
            session = self.lease_sessions.get(waiter.session)
            if session is not None:
                session.waiters.pop(waiter.lease_id, None)
        self.events.append(
            {"type": "dequeue", "key": waiter.key, "lease_id": waiter.lease_id, "reason": reason}
        )
        count = self.waiting_sets.pop(waiter.group, 0) if waiter.group else 0
        for index in range(count):
            # One key of a waiting set left (its deadline, a cancel, a deadlock): the
            # whole set leaves, every key in this entry, and those keys' queues move on.
            other = self.waiting.get(many_lease_id(waiter.group, index))
            if other is not None:
                self._dequeue(other, reason)
        if grant_next and (head or not queue):
            # The head left: those behind it may fit now (a reader behind a writer
            # whose deadline passed), and a key with nothing left is forgotten.
            self._grant_next(waiter.key)

    def _event(self, kind: str, lease: LeaseRecord) -> None:
        self.audit.add(
            self.now,
            kind,
            lease.key,
            lease.token,
            lease.owner,
            lease.principal,
            self.audit_actor,
            self.revision,
        )
        event = {
            "type": kind,
            "key": lease.key,
            "owner": lease.owner,
            "token": lease.token,
            "revision": self.revision,
            "lease_id": lease.lease_id,
            "value": lease.value,
            "units": lease.units,
        }
        if lease.slots:  # a pool lease: which units it holds (watchers, the live view)
            event["unit_indices"] = list(lease.slots)
        self.events.append(event)

    def _owned(self, entry: dict[str, Any]) -> LeaseRecord | Result:
        key: str = entry["key"]
        lease = self.leases.get(entry["lid"])
        if lease is not None and lease.key == key:
            if lease.principal != entry.get("principal", ""):
                return _not_yours("lease", key)
            return lease
        newest = self.newest_holder(key)
        if newest is None:
            return error("LEASE_NOT_FOUND", f"no live lease on {key!r} (expired or released)")
        if self.capacity_of(key) > 1:
            return error(
                "LEASE_NOT_FOUND",
                f"the lease is not among the holders of {key!r} (expired or released)",
            )
        return error(
            "NOT_OWNER",
            f"{key!r} is held under another lease (owner {newest.owner!r})",
            owner=newest.owner,
            token=newest.token,
        )

    def _renew(self, entry: dict[str, Any]) -> Result:
        lease = self._owned(entry)
        if not isinstance(lease, LeaseRecord):
            return lease
        if lease.session:
            if self.progress.tracked(lease.lease_id) and "progress" in entry:
                return self._attached_progress(lease, entry)
            return error(
                "INVALID_ARGUMENT",
                f"the lease is attached to lease session {lease.session!r} and lives as "
                "long as it: keep the session alive instead",
            )
        if "holder_key" in entry and holder_key_of(entry) != lease.holder:
            # Checked before anything changes: the certificate binds the key named at
            # the grant, never one a later renewal names (whoever has the lease id
            # would otherwise get a valid certificate for a key of its own).
            return error(
                "HOLDER_KEY_MISMATCH",
                "this renewal names another holder key than the one bound to the lease at its grant"
                if lease.holder is not None
                else "this renewal names a holder key; the lease was granted without one",
                key=lease.key,
            )
        ttl = entry.get("ttl")
        if ttl is not None:
            lease.ttl_ms = ttl
        until = self.now + lease.ttl_ms
        if self.progress.tracked(lease.lease_id):
            # Progress-aware (§4g): a higher ``progress`` restarts its clock; the lease
            # is never extended past its progress deadline, nor shortened.
            self.progress.report(lease.lease_id, entry.get("progress"), self.now)
            cap = self.progress.cap(lease.lease_id)
            if cap is not None and cap < until:
                until = cap
            if until <= lease.expires_at:
                return self._lease_result(lease)
        self._extend(lease, until)
        return self._lease_result(lease)

    def _attached_progress(self, lease: LeaseRecord, entry: dict[str, Any]) -> Result:
        """A progress report for a progress-aware lease attached to a session
        (``session.progress``, §4g): a higher figure restarts its clock, and the lease
        is extended up to its session's expiry, never past its progress deadline;
        the session's keep-alives do the rest. A new TTL is not for an attached lease."""
        if entry.get("ttl") is not None:
            return error(
                "INVALID_ARGUMENT",
                "an attached lease takes its session's TTL: report progress without 'ttl'",
            )
        self.progress.report(lease.lease_id, entry["progress"], self.now)
        session = self.lease_sessions[lease.session]
        cap = self.progress.cap(lease.lease_id)
        until = session.expires_at if cap is None else min(session.expires_at, cap)
        if until > lease.expires_at:
            self._extend(lease, until)
        return self._lease_result(lease)

    def _extend(self, lease: LeaseRecord, expires_at: int) -> None:
        lease.expires_at = expires_at
        self.revision += 1
        self._push_deadline(expires_at, lease.lease_id)
        self._event("renew", lease)

    def _release(self, entry: dict[str, Any]) -> Result:
        waiter = self.waiting.get(entry["lid"])
        if waiter is not None and waiter.key == entry["key"]:
            if waiter.principal != entry.get("principal", ""):
                return _not_yours("queued acquire", waiter.key)
            self._dequeue(waiter, "cancelled")
            return {"ok": True, "key": waiter.key, "cancelled": True}
        lease = self._owned(entry)
        if not isinstance(lease, LeaseRecord):
            return lease
        self._end_lease(lease, "release")
        return {"ok": True, "key": lease.key, "token": lease.token, "revision": self.revision}

    def _transfer(self, entry: dict[str, Any]) -> Result:
        """Hand a held lease to ``owner`` atomically: the old lease ends and the new one
        (new lease id, new token, same units and value, not attached to any session)
        starts in the same entry; waiters keep their place. The new lease is bound to
        the new holder's certificate key the transfer names (``holder_key``), or to
        none: never the old holder's."""
        lease = self._owned(entry)
        if not isinstance(lease, LeaseRecord):
            return lease
        standing = self.preempt.priority_of(lease.lease_id)
        self._end_lease(lease, "transfer", grant_next=False)
        ttl = entry.get("ttl") or lease.ttl_ms
        new = self._grant(
            lease.key,
            entry["new_lid"],
            entry["owner"],
            ttl,
            lease.units,
            lease.value,
            principal=lease.principal,
            slots=lease.slots,
            holder=holder_key_of(entry),
        )
        # The new holder keeps the old one's standing against preemption.
        self.preempt.granted(new.lease_id, standing)
        return self._lease_result(new)

    def _proclaim(self, entry: dict[str, Any]) -> Result:
        """Change the value a held lease publishes (an elected leader's new address);
        watchers see a ``proclaim`` event. The token stays."""
        lease = self._owned(entry)
        if not isinstance(lease, LeaseRecord):
            return lease
        lease.value = entry["value"]
        self.revision += 1
        self._event("proclaim", lease)
        return self._lease_result(lease)

    def _revoke(self, entry: dict[str, Any]) -> Result:
        """An operator ends the leases on a key: every one, or the one whose lease id
        (``lid``) or fencing token (``token``) is given; each gets a ``revoke`` event,
        then the queue is served once, in this entry (the next waiter is granted).
        Attached leases leave their session, which lives on. Not bound to the lease's
        principal: the node lets only ``admin`` principals send it."""
        key: str = entry["key"]
        holders = self.holders_of(key)
        if "lid" in entry:
            holders = [lease for lease in holders if lease.lease_id == entry["lid"]]
        elif "token" in entry:
            holders = [lease for lease in holders if lease.token == entry["token"]]
        if not holders:
            which = "such lease" if "lid" in entry or "token" in entry else "live lease"
            return error("LEASE_NOT_FOUND", f"{key!r} has no {which} to revoke")
        for lease in holders:
            self._end_lease(lease, "revoke", grant_next=False)
        self._grant_next(key)
        return {
            "ok": True,
            "key": key,
            "revoked": len(holders),
            "tokens": [lease.token for lease in holders],
            "revision": self.revision,
        }

    def _request_yield(self, entry: dict[str, Any]) -> Result:
        """Ask the holders of ``key`` to yield by ``deadline`` ms of log time from now
        (cooperative preemption, docs/design.md §4f): those granted at a priority
        below the asker's ``priority``, or every holder when the leader stamped
        ``override`` (an admin). Each learns it in its next keep-alive answer; at the
        deadline ``_advance`` ends the lease unless it was released. A second
        request keeps the earlier deadline. ``PERMISSION_DENIED`` when no holder is
        below the asker's priority, ``LEASE_NOT_FOUND`` when nobody holds the key;
        both change nothing. Who may ask is the node's check (the ``preempt``
        permission, or ``admin``, on the key)."""
        key: str = entry["key"]
        holders = sorted(self.holders_of(key), key=lambda lease: lease.token)
        if not holders:
            return error("LEASE_NOT_FOUND", f"nobody holds {key!r}", key=key)
        priority: int = entry.get("priority", 0)
        if not entry.get("override"):
            holders = [h for h in holders if self.preempt.priority_of(h.lease_id) < priority]
        if not holders:
            return error(
                "PERMISSION_DENIED",
                f"every holder of {key!r} was granted at priority {priority} or above; "
                "asking one to yield needs a higher priority (or admin)",
                key=key,
            )
        deadline = self.now + entry["deadline"]
        by: str = entry.get("owner", "") or entry.get("principal", "")
        # A holder asked before keeps the earlier deadline: the answer says which holds.
        deadline = min([self.preempt.ask(lease.lease_id, deadline, by) for lease in holders])
        self.revision += 1
        self.events.append(
            {"type": "yield_requested", "key": key, "deadline": deadline, "by": by,
             "tokens": [lease.token for lease in holders], "revision": self.revision}
        )  # fmt: skip
        return {
            "ok": True,
            "key": key,
            "asked": len(holders),
            "tokens": [lease.token for lease in holders],
            "deadline": deadline,
            "revision": self.revision,
        }

    def _session_open(self, entry: dict[str, Any]) -> Result:
        sid: str = entry["sid"]
        principal: str = entry.get("principal", "")
        quota = entry.get("quota")
        if principal and quota is not None and self.sessions_by.get(principal, 0) >= quota:
            return error(
                "QUOTA_EXCEEDED",
                f"{principal} has {self.sessions_by[principal]} lease sessions; its quota "
                f"is {quota}",
            )
        session = LeaseSession(
            session_id=sid,
            owner=entry["owner"],
            ttl_ms=entry["ttl"],
            expires_at=self.now + entry["ttl"],
            leases={},
            waiters={},
            principal=principal,
        )
        self.lease_sessions[sid] = session
        self._count(self.sessions_by, principal, 1)
        heapq.heappush(self._session_deadlines, (session.expires_at, sid))
        return self._session_result(session)

    def _session_keepalive(self, entry: dict[str, Any]) -> Result:
        """Extend a lease session, and with it every attached lease, by its TTL."""
        session = self.lease_sessions.get(entry["sid"])
        if session is None:
            return self._no_session(entry["sid"])
        if session.principal != entry.get("principal", ""):
            return _not_yours("lease session", entry["sid"])
        if entry.get("ttl") is not None:
            session.ttl_ms = entry["ttl"]
        self._keep_session(session, self.now + session.ttl_ms)
        return self._session_result(session)

    def _keep_session(self, session: LeaseSession, until: int) -> None:
        """Extend ``session`` to ``until``, and with it every attached lease (a renew
        event each) and task attempt: a keep-alive, logged or written from memory."""
        session.expires_at = until
        heapq.heappush(self._session_deadlines, (until, session.session_id))
        for lease_id in session.leases:
            lease = self.leases[lease_id]
            lease.ttl_ms = session.ttl_ms
            cap = self.progress.cap(lease_id)
            if cap is None:
                self._extend(lease, until)
            elif min(until, cap) > lease.expires_at:
                # Progress-aware (§4g): never kept past its progress deadline.
                self._extend(lease, min(until, cap))
        self.tasks.session_kept(self, session)  # and its task attempts

    def _session_close(self, entry: dict[str, Any]) -> Result:
        session = self.lease_sessions.get(entry["sid"])
        if session is None and entry["sid"] in self.waiting_sets:
            # A waiting set of keys (not granted yet): it leaves every queue.
            members = self._set_waiters(entry["sid"])
            if members[0].principal != entry.get("principal", ""):
                return _not_yours("waiting set of keys", entry["sid"])
            self._dequeue(members[0], "cancelled")
            return {"ok": True, "session_id": entry["sid"], "released": 0, "cancelled": True}
        if session is None:
            return self._no_session(entry["sid"])
        if session.principal != entry.get("principal", ""):
            return _not_yours("lease session", entry["sid"])
        released = len(session.leases)
        del self.lease_sessions[session.session_id]
        self._count(self.sessions_by, session.principal, -1)
        self._end_session(session, "release")
        return {"ok": True, "session_id": session.session_id, "released": released}

    def _end_session(self, session: LeaseSession, kind: str) -> None:
        """The session expired or was closed, and the caller already removed it from
        ``lease_sessions`` (so none of its waiters can be granted on the way): its
        queued acquires leave their queues and its leases end (``kind``: expire or
        release), in attach order."""
        for lease_id in list(session.waiters):
            # Gone already if an earlier step skipped it (it was next in a queue
            # whose head left, and its session was already gone).
            waiter = self.waiting.get(lease_id)
            if waiter is not None:
                self._dequeue(waiter, "session")
        for lease_id in list(session.leases):
            if kind == "expire":
                self.expired_total += 1
            self._end_lease(self.leases[lease_id], kind)
        self.tasks.session_ended(self, session.session_id)  # its claims and attempts
        self.events.append({"type": "session_end", "session_id": session.session_id})

    @staticmethod
    def _no_session(sid: str) -> Result:
        return error(
            "SESSION_NOT_FOUND",
            f"lease session {sid!r} does not exist (it expired or was closed; "
            "everything attached to it was released)",
        )

    def _session_result(self, session: LeaseSession) -> Result:
        out: Result = {
            "ok": True,
            "session_id": session.session_id,
            "ttl": session.ttl_ms,
            "expires_at": session.expires_at,
            "leases": len(session.leases),
            "now": self.now,
        }
        asked = []
        for lease_id in list(session.leases):
            request = self.preempt.request_of(lease_id)
            lease = self.leases.get(lease_id)
            if request is not None and lease is not None:
                asked.append({"key": lease.key, "token": lease.token, **request})
        if asked:  # the holder learns it from this keep-alive answer (§4f)
            out["yield_requested"] = asked
        return out

    def keepalive_answer(self, session: LeaseSession, until: int, now: int) -> dict[str, Any]:
        """What a ``session_keepalive`` answers, for one the leader answered from memory
        (server/keepalive.py): as a keep-alive at log time ``now`` to ``until`` would
        (no ``ok``, as the node's answers carry none)."""
        out = self._session_result(session)
        del out["ok"]
        out["expires_at"] = until
        out["now"] = now
        return out

    def _lease_effect(self, entry: dict[str, Any]) -> Result:
        """``lease_effect_begin`` / ``lease_effect_commit`` (core/lease_effects.py,
        §4h): fenced by the key's current live lease."""
        lease = self._effect_lease(entry)
        if not isinstance(lease, LeaseRecord):
            return lease  # LEASE_NOT_FOUND, NOT_OWNER, PERMISSION_DENIED: definite
        if self.capacity_of(lease.key) > 1:
            return error(
                "INVALID_ARGUMENT",
                f"{lease.key!r} is a shared key (capacity {self.capacity_of(lease.key)}): "
                "the effect journal is for keys of one holder at a time",
            )
        if entry["op"] == "lease_effect_begin":
            return self.lease_effects.begin(lease.key, lease.token, entry)
        return self.lease_effects.commit(lease.key, lease.token, entry)

    def _effect_lease(self, entry: dict[str, Any]) -> LeaseRecord | Result:
        """The fence of a lease effect: the caller's lease must be the key's live one
        (``_owned``). A method so a planted build can skip it."""
        return self._owned(entry)

    def _task(self, entry: dict[str, Any]) -> Result:
        """A ``task_*`` mutation (core/queue.py)."""
        return self.tasks.mutate(self, entry)

    def _budget(self, entry: dict[str, Any]) -> Result:
        """A ``budget_*`` mutation (core/budget.py): its events join this entry's."""
        result, events = self.budgets.mutate(entry, self.now)
        self.events.extend(events)
        return result

    _MUTATIONS: ClassVar[dict[str, Callable[[LeaseStore, dict[str, Any]], Result]]] = {
        "acquire": _acquire,
        "acquire_many": _acquire_many,
        "renew": _renew,
        "release": _release,
        "transfer": _transfer,
        "proclaim": _proclaim,
        "revoke": _revoke,
        "request_yield": _request_yield,
        "session_open": _session_open,
        "session_keepalive": _session_keepalive,
        "session_close": _session_close,
        "lease_effect_begin": _lease_effect,
        "lease_effect_commit": _lease_effect,
        **dict.fromkeys(TASK_MUTATING_OPS, _task),
        **dict.fromkeys(BUDGET_MUTATING_OPS, _budget),
    }

    # -------------------------------------------------------------- snapshots

    def to_plain(self) -> dict[str, Any]:
        """Plain data (msgpack-able) describing the whole state (``snapshot``)."""
        return snapshot.to_plain(self)

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> LeaseStore:
        """Rebuild a store from ``to_plain`` output (this layout version or version 2,
        which it upgrades). Raises ``ValueError`` on any other version."""
        store = cls()
        snapshot.restore(store, data)
        return store
