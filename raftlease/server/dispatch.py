"""From a validated request to a log entry, on the leader, and its result back.

What the leader adds before it proposes: the fencing of auth-file shapes, the quotas
the state machine decides with (``max_leases_per_principal``, ``max_waiters_*``,
``max_sessions_per_principal``, ``max_queue_tasks``, ``max_tasks_per_principal``,
``max_queues_per_principal``, ``max_completed_tasks``), the budget gate of the auth
file (``gate_budget``, ``gate_cost`` on acquires and claims), the
principal and the client id, and the randomness (lease, session, task, attempt and
spend ids: drawn here, never in the state machine). A ``renew`` or ``session_keepalive``
may be answered from the leader's memory instead (``keepalive_in_memory``;
server/keepalive.py, docs/design.md "Keep-alives from memory").

Threads: the node's event loop only; nothing here blocks.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from ..config import NodeConfig
from ..core import LeaseStore, Result
from ..core.certkeys import HOLDER_KEY_OPS
from ..errors import CapacityMismatchError, OverloadedError, error_class
from ..limits import MAX_SESSION_LEASES
from ..protocol import Request
from ..replication import Replica
from .auth import AuthPolicy
from .certs import (
    CERTIFIED_OPS,
    MULTI_CERTIFIED_OPS,
    TASK_CERTIFIED_OPS,
    CertSigner,
    check_holder_key,
)
from .keepalive import LEASE, SESSION, MemoryKeepalives
from .log_clock import LogClock
from .metrics import NodeMetrics
from .overload import RETRY_AFTER, LoopLag
from .proposer import Proposer


def draw_task_ids(config: NodeConfig, op: str, entry: dict[str, Any]) -> None:
    """A put's task id, a claim's attempt id (a capability: only the claimer receives
    it). A put also carries the queue's task quota (``max_queue_tasks``) and, when it
    names a principal (authenticated), that principal's quotas (``tasks_quota``:
    ``max_tasks_per_principal``, ``queues_quota``: ``max_queues_per_principal``); a
    completion carries the count bound on retained completed tasks
    (``max_completed_tasks``), and a put the aging step of its queue's order
    (``task_priority_aging``, in ms; docs/queues.md), and a claim the waiter bounds
    (``waiters_total``, ``wait_quota``). The state machine decides them all. Raises
    nothing."""
    if op == "task_put":
        entry["tid"] = secrets.token_hex(12)
        entry["quota"] = min(config.max_queue_tasks, 2**31)
        # Always stamped (a client's value never survives): the order of claims must
        # not depend on a replica's own config.
        entry["aging"] = round(config.task_priority_aging * 1000)
        # Stamped here, not read from config by the state machine: every replica must
        # decide with the same numbers, whatever its own config file says.
        if entry.get("principal"):
            entry["tasks_quota"] = min(config.max_tasks_per_principal, 2**31)
            entry["queues_quota"] = min(config.max_queues_per_principal, 2**31)
        else:
            # Unauthenticated puts are not counted (as leases); never a client's value.
            entry.pop("tasks_quota", None)
            entry.pop("queues_quota", None)
    elif op == "task_claim":
        entry["aid"] = secrets.token_hex(16)
        # A claim that waits is a waiter like a queued acquire: the same bounds
        # (``max_waiters_total`` for everyone's waiting claims,
        # ``max_waiters_per_principal`` for an authenticated principal's), decided in
        # the state machine only when it would wait. Never a client's value.
        entry["waiters_total"] = min(config.max_waiters_total, 2**31)
        if entry.get("principal"):
            entry["wait_quota"] = min(config.max_waiters_per_principal, 2**31)
        else:
            entry.pop("wait_quota", None)
    elif op == "task_complete":
        entry["max_completed"] = min(config.max_completed_tasks, 2**31)


class Dispatcher:
    """The leader's path from a validated write to its result: a keep-alive answered
    from memory, or the entry (see the module docstring) proposed and its result
    turned into an answer or the error it names. Owned by ``NodeServer``, which hands
    it ``auth`` (the policy in force, None without an auth file), ``replica`` and
    ``proposer`` (None while the node starts), ``require_leader``,
    ``lease_read_allowed`` (reads.py), ``propose``, ``metrics`` (None without an
    admin_address) and ``overload`` (the admission control, server/overload.py: a
    new lease session is refused ``OVERLOADED`` while the node is past its
    capacity). Event loop only."""

    def __init__(
        self,
        config: NodeConfig,
        log_clock: LogClock,
        *,
        auth: Callable[[], AuthPolicy | None],
        replica: Callable[[], Replica | None],
        proposer: Callable[[], Proposer | None],
        require_leader: Callable[[], None],
        lease_read_allowed: Callable[[], bool],
        propose: Callable[[dict[str, Any]], Awaitable[Result]],
        metrics: NodeMetrics | None,
        overload: LoopLag | None = None,
    ) -> None:
        self.config = config
        self.log_clock = log_clock
        self._auth = auth
        self._replica = replica
        self._proposer = proposer
        self._require_leader = require_leader
        self._lease_read_allowed = lease_read_allowed
        self._propose = propose
        self._metrics = metrics
        self._overload = overload
        #: Lease certificates for requests that name a holder key (server/certs.py).
        self.signer = CertSigner(
            config,
            log_clock,
            replica=replica,
            lease_read_allowed=lease_read_allowed,
            propose=propose,
        )

    async def write(self, request: Request, consistency: str | None) -> dict[str, Any]:
        """Execute a request through the log on the leader (a read with
        ``consistency`` too, labelled ``log``). Raises ``NotLeaderError``, the error
        the state machine's result names, or the proposer's."""
        auth = self._auth()
        # A lease certificate's holder key (docs/certificates.md): part of the entry,
        # bound to the lease at the grant; a renewal naming another is refused
        # HOLDER_KEY_MISMATCH by the state machine (the signer signs only the bound key).
        holder = request.args.get("holder_key") if request.op in CERTIFIED_OPS else None
        if holder is not None:
            check_holder_key(holder)
        if request.op in ("renew", "session_keepalive") and self.config.keepalives == "memory":
            answer = self.keepalive_in_memory(request)
            if answer is not None:
                if self._metrics is not None:
                    self._metrics.keepalives_from_memory.inc()
                return self._certified(request, holder, answer, from_memory=True)
        self._require_leader()
        over = self._overload
        if over is not None and over.refuses(request.op):
            # Admission control (server/overload.py): past its capacity the leader takes
            # no new session, so that the ones it has keep being served. Definite.
            raise OverloadedError(
                f"the leader is overloaded (its event loop runs {over.lag * 1000:.0f} ms "
                f"behind, overload_lag {over.limit * 1000:.0f} ms): no new lease session "
                f"now; retry after {RETRY_AFTER:g} s",
                {"retry_after": RETRY_AFTER, "lag": round(over.lag, 3)},
            )
        if holder:
            await self.signer.ensure_key()
        entry: dict[str, Any] = {k: v for k, v in request.args.items() if k != "consistency"}
        if request.op not in HOLDER_KEY_OPS:
            # Only a grant, transfer or renewal binds or checks one; a session's
            # keep-alive names it only to be answered with certificates.
            entry.pop("holder_key", None)
        entry["op"] = request.op
        if request.op in ("acquire", "acquire_many"):
            # Everyone's queued acquires together, with or without authentication
            # (core/store.py decides, only when this acquire would queue; a waiting
            # set counts one per key).
            entry["waiters_total"] = self.config.max_waiters_total
        if request.principal:
            # Bound to the lease or session it makes, and part of the dedup
            # fingerprint: nobody else can use it or read its cached answer.
            entry["principal"] = request.principal
            if request.op == "acquire":
                entry["quota"] = self.config.max_leases_per_principal
                # Queued acquires of this principal (core/store.py decides).
                entry["wait_quota"] = self.config.max_waiters_per_principal
                # Whether it may fix a shared key's capacity is known here; whether
                # this acquire would fix it, only in the state machine (core/store.py).
                capacity, key = request.args.get("capacity", 1), request.args["key"]
                # A shape pinned in the auth file (auth.py) is checked here, by the
                # leader, before anything is proposed: every surface's acquire ends up
                # here, on whichever node leads. The pinned capacity needs no shape.
                pinned = auth.pinned_capacity(key) if auth else None
                if pinned is not None and capacity != pinned:
                    raise CapacityMismatchError(
                        f"{key!r} is pinned to capacity {pinned} by the auth file, not {capacity}",
                        {"key": key, "capacity": pinned, "pinned": True},
                    )
                shaper = auth.principals.get(request.principal) if auth else None
                if (
                    capacity > 1
                    and pinned is None
                    and (shaper is None or not shaper.may_shape(key))
                ):
                    entry["shaper"] = False
            elif request.op == "acquire_many":
                # The set counts as that many leases and as one lease session, and a
                # waiting set as that many queued acquires.
                entry["quota"] = self.config.max_leases_per_principal
                entry["session_quota"] = self.config.max_sessions_per_principal
                entry["wait_quota"] = self.config.max_waiters_per_principal
                capacity = request.args.get("capacity", 1)
                shaper = auth.principals.get(request.principal) if auth else None
                for key, _units in request.args["keys"]:
                    pinned = auth.pinned_capacity(key) if auth else None
                    if pinned is not None and capacity != pinned:
                        raise CapacityMismatchError(
                            f"{key!r} is pinned to capacity {pinned} by the auth file, "
                            f"not {capacity}",
                            {"key": key, "capacity": pinned, "pinned": True},
                        )
                    if (
                        capacity > 1
                        and pinned is None
                        and (shaper is None or not shaper.may_shape(key))
                    ):
                        entry["shaper"] = False
            elif request.op == "session_open":
                entry["quota"] = self.config.max_sessions_per_principal
            elif request.op == "request_yield" and auth is not None:
                # An admin on the key asks every holder, whatever its priority (§4f).
                who = auth.principals.get(request.principal)
                if who is not None and who.allows("admin", str(request.args["key"])):
                    entry["override"] = True
        # A budget gate from the auth file (docs/budgets.md, "Budget gates"): stamped
        # here, decided in the state machine with the grant. Never a client's value.
        entry.pop("gate_budget", None)
        entry.pop("gate_cost", None)
        gate = None
        if request.principal and auth is not None and request.op in ("acquire", "task_claim"):
            who = auth.principals.get(request.principal)
            gate = who.gate(request.op) if who is not None else None
        if gate is not None:
            entry["gate_budget"], entry["gate_cost"] = gate
        if request.cid is not None:
            entry["cid"] = request.cid
            entry["seq"] = request.seq
            entry["ack"] = request.ack
        # Randomness is drawn here, never inside the state machine.
        if request.op in ("acquire", "acquire_many"):
            entry["lid"] = secrets.token_hex(16)
        elif request.op == "transfer":
            entry["new_lid"] = secrets.token_hex(16)
        elif request.op == "session_open":
            entry["sid"] = secrets.token_hex(16)
        elif request.op in ("budget_spend", "budget_reserve"):
            # A spend id: names a queued spend (its long-poll, its withdrawal) and a
            # reservation (its settle), like a lease id; only the spender receives it.
            entry["rid"] = secrets.token_hex(16)
        else:
            draw_task_ids(self.config, request.op, entry)  # task and attempt ids, queue quota
        result = await self._propose(entry)
        if self._metrics is not None:
            self._metrics.budgets.observe(request.op, entry, result)  # budget decisions
        if not result.get("ok"):
            code = str(result.get("code", "INTERNAL"))
            raise error_class(code)(str(result.get("message", code)), result.get("detail"))
        # The result object may be the one cached in the state machine's session
        # table (on the leader the callback gets it by reference): never mutate it.
        out = {k: v for k, v in result.items() if k != "ok"}
        if consistency is not None:
            out["consistency"] = "log"
            out["served_by"] = self.config.node_id
        return self._certified(request, holder, out)

    def _certified(
        self,
        request: Request,
        holder: str | None,
        answer: dict[str, Any],
        from_memory: bool = False,
    ) -> dict[str, Any]:
        """``answer`` with its lease certificate when the request named a holder key
        and the signer could sign one (server/certs.py); ``answer`` as it is otherwise."""
        if not holder:
            return answer
        if request.op in TASK_CERTIFIED_OPS:
            aid = str(answer.get("aid") or request.args.get("aid", ""))
            text = self.signer.sign_attempt(request.op, holder, aid, answer)
            return answer if text is None else {**answer, "certificate": text}
        if request.op in MULTI_CERTIFIED_OPS:
            signed = self.signer.sign_each(request.op, holder, answer, from_memory)
            if not signed:
                return answer
            if request.op == "session_keepalive":
                return {
                    **answer,
                    "certificates": [
                        {
                            "key": one["key"],
                            "token": one["token"],
                            "certificate": one["certificate"],
                        }
                        for one in signed
                    ],
                }
            # acquire_many: each key's own entry of the answer carries its certificate
            # (new maps: the answer may be the one cached in the dedup table).
            by_lid = {one["lease_id"]: one["certificate"] for one in signed}
            return {
                **answer,
                "leases": [
                    {**one, "certificate": by_lid[one["lease_id"]]}
                    if one.get("lease_id") in by_lid
                    else one
                    for one in answer.get("leases", ())
                ],
            }
        certificate = self.signer.sign(
            request.op, holder, request.principal or "", answer, from_memory
        )
        if certificate is None:
            return answer
        return {**answer, "certificate": certificate}

    def keepalive_in_memory(self, request: Request) -> dict[str, Any] | None:
        """A ``renew`` of a plain lease or a ``session_keepalive``, neither changing the
        TTL, answered by the leader from memory (server/keepalive.py): the answer a log
        write would give, or None when it must go through the log instead (not the
        leader, no valid leader lease, a new TTL, a lease in a session, a
        progress-aware lease or a renewal carrying ``progress``, or anything but the
        plain success: the log then gives the exact error).

        Event loop; never blocks. Safe for the same reason as a lease read: while its
        leader lease is valid no other node can lead, and its state holds every
        acknowledged write (docs/design.md, "Keep-alives from memory")."""
        context = self._memory_context(request)
        if context is None:
            return None
        store, keep, now, cid = context
        args = request.args
        principal = request.principal or ""
        if request.op == "renew":
            lease = store.leases.get(args["lid"])
            if (
                lease is None
                or lease.key != args["key"]
                or lease.principal != principal
                or lease.session
                or args.get("ttl", lease.ttl_ms) != lease.ttl_ms
                or lease.expires_at <= now
                # Progress-aware (docs/design.md §4g): progress counts only once it is
                # in the log, and the stall is decided there: every renewal is logged.
                or "progress" in args
                or store.progress.tracked(lease.lease_id)
                # A holder key other than the one bound at the grant (or one for a
                # lease granted without one): the log refuses it HOLDER_KEY_MISMATCH
                # and changes nothing.
                or ("holder_key" in args and bytes.fromhex(str(args["holder_key"])) != lease.holder)
            ):
                return None
            until = now + lease.ttl_ms
            keep.record(LEASE, lease.lease_id, until, lease.expires_at, lease.ttl_ms, cid, now)
            return store.renewal_answer(lease, until, now)
        return _session_from_memory(store, keep, now, args["sid"], principal, args.get("ttl"), cid)

    def _memory_context(
        self, request: Request
    ) -> tuple[LeaseStore, MemoryKeepalives, int, str | None] | None:
        """What a keep-alive answered from memory needs: the store, the leader's
        promises (reset when the term changed), the log time to answer at and the
        request's client id if the dedup table knows it; or None when this node may not
        answer from memory (not the leader, no valid leader lease). Event loop."""
        replica = self._replica()
        proposer = self._proposer()
        if replica is None or proposer is None or not replica.is_leader():
            return None
        if not self._lease_read_allowed():
            return None
        store = replica.store
        term = replica.term()
        keep = proposer.keepalives
        keep.reset(term)
        # Only a client id the dedup table holds can be kept from its eviction; a
        # made-up one must not take room in the leader's memory.
        cid = request.cid if request.cid is not None and request.cid in store.clients else None
        return store, keep, self.log_clock.stamp(term, store.now), cid

    async def _memory_context_within(
        self, request: Request, wait: float
    ) -> tuple[LeaseStore, MemoryKeepalives, int, str | None] | None:
        """``_memory_context`` once it is there, checked every ``MEMORY_POLL`` seconds
        for at most ``wait``; None if it is not. Raises ``NotLeaderError`` /
        ``UnavailableError`` if this node stops leading meanwhile. Event loop."""
        loop = asyncio.get_running_loop()
        until = loop.time() + wait
        while loop.time() < until:
            await asyncio.sleep(MEMORY_POLL)
            self._require_leader()
            context = self._memory_context(request)
            if context is not None:
                return context
        return None

    async def keepalive_many(self, request: Request) -> dict[str, Any]:
        """``session_keepalive_many``: a keep-alive for each of several lease sessions
        (client/keepalive_batch.py sends them), each answered from the leader's memory
        exactly as ``keepalive_in_memory`` answers one ``session_keepalive``; a session
        it cannot answer so (unknown, another principal's, expired, keep-alives through
        the log, no valid leader lease) is answered ``{"session_id": ..., "single":
        true}``: its sender keeps it alive with its own ``session_keepalive``, which
        gives the exact answer or error through the log. Nothing here is refused per
        session and nothing is written: one place decides a keep-alive's errors.

        A leader that may not answer from memory yet (a new leader before its leader
        lease and read barrier, or one whose promises lag the log) waits for it up to
        ``MEMORY_WAIT`` seconds before it answers every session ``single``: right
        after an election, answering a cluster's worth of sessions ``single`` at once
        sent each through the log, a write per session, and that storm starved the new
        leader's heartbeats until the next election (docs/performance.md).

        Event loop; waits at most ``MEMORY_WAIT`` (cancellable). Raises
        ``NotLeaderError`` / ``UnavailableError`` on a node that does not lead, also
        one that lost the lead while it waited (the client goes to the leader with all
        of them)."""
        self._require_leader()
        sids = [str(pair[0]) for pair in request.args["session_ids"]]
        if self.config.keepalives != "memory":
            # Said, so that the client stops batching (client/keepalive_batch.py): each
            # keep-alive would cost it two requests.
            return {
                "sessions": [{"session_id": sid, "single": True} for sid in sids],
                "keepalives": "log",
            }
        context = self._memory_context(request)
        if context is None:
            context = await self._memory_context_within(request, MEMORY_WAIT)
        if context is None:
            return {"sessions": [{"session_id": sid, "single": True} for sid in sids]}
        store, keep, now, cid = context
        principal = request.principal or ""
        answers: list[dict[str, Any]] = []
        answered = 0
        # Each answer walks its session's attached leases (yield requests); one batch
        # walks at most as many as one session may carry, past the first answered.
        walked = 0
        for sid in sids:
            session = store.lease_sessions.get(sid)
            attached = len(session.leases) if session is not None else 0
            if walked and walked + attached > MAX_BATCH_ATTACHED:
                answers.append({"session_id": sid, "single": True})
                continue
            answer = _session_from_memory(store, keep, now, sid, principal, None, cid)
            if answer is None:
                answers.append({"session_id": sid, "single": True})
            else:
                answers.append(answer)
                answered += 1
                walked += attached
        if answered and self._metrics is not None:
            self._metrics.keepalives_from_memory.inc(answered)
        return {"sessions": answers}


#: Seconds a ``session_keepalive_many`` waits for its leader to be able to answer from
#: memory (a new leader's lease and read barrier take a heartbeat round and a commit)
#: before it answers every session ``single``; and how often it looks. A third of the
#: 3 s a client's attempt waits, so an answer always comes back within it.
MEMORY_WAIT = 1.0
MEMORY_POLL = 0.01

#: Attached leases one ``session_keepalive_many`` answer may walk, past its first
#: session: as many as one session may carry, so a batch costs at most about two single
#: keep-alives' worth of walking; the sessions past it come back ``single``.
MAX_BATCH_ATTACHED = MAX_SESSION_LEASES


def _session_from_memory(
    store: LeaseStore,
    keep: MemoryKeepalives,
    now: int,
    sid: str,
    principal: str,
    ttl: int | None,
    cid: str | None,
) -> dict[str, Any] | None:
    """One lease session's keep-alive answered from the leader's memory at log time
    ``now`` (recorded in ``keep`` for the next ``extend`` entry), or None when the log
    must decide it: no such session, another principal's, a new TTL, or expired."""
    session = store.lease_sessions.get(sid)
    if (
        session is None
        or session.principal != principal
        or (ttl is not None and ttl != session.ttl_ms)
        or session.expires_at <= now
    ):
        return None
    until = now + session.ttl_ms
    keep.record(SESSION, session.session_id, until, session.expires_at, session.ttl_ms, cid, now)
    return store.keepalive_answer(session, until, now)
