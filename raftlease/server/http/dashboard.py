"""The live view of one node (docs/usage.md "Live view"): a static page at ``/ui/`` and the
small JSON routes it reads, on the node's admin endpoint beside ``/v1/``.

Routes (GET or HEAD):

* ``/`` and ``/ui``: a redirect to ``/ui/``;
* ``/ui/``, ``/ui/app.js``, ``/ui/app.css``: the page, shipped in the package
  (``raftlease/server/http/ui/``, no build step, nothing from another origin). They carry
  no data, so they are open; a strict Content-Security-Policy allows only this
  origin's script and style, and ``fetch`` of this origin and of the other members'
  admin origins (cors.py: the page's ``connect-src``, computed when it is served);
* ``/ui/api/state``: one load of everything the page shows: ``leases`` (live
  holders; each with its key's ``capacity`` and, when attached to a lease session,
  ``session_ref``), ``waiters`` (the queue of each key that has one), ``sessions``,
  ``queues`` (depths) and ``revision``, the revision the page then watches from; each
  list stops at its cap (``LIMITS``, sent as ``limits``), and ``truncated`` names the
  lists that had more (``leases``, ``waiter_keys``, ``sessions``, ``queues``);
* ``/ui/api/live``: the same without ``leases`` (the page refreshes it every few
  seconds: enqueues, session keep-alives and queue depths are not watch events). Each
  session carries ``ref``, a label that names it on this page only (a keyed hash of its
  id with a secret of this process: never the id, a capability), and ``keys``, the keys
  held through it (null when this node does not know the session yet), from this node's
  own state. Each queue carries its depths and its claims, completions, expiries,
  retries and dead letters since it was created (``raftlease_queue_*_total``). It also
  carries ``budgets`` (the first ``MAX_BUDGETS`` by key, ``budgets_more`` the count
  of the rest): each budget's level, capacity, refill per second, waiting spends and
  open reservations from this node's state, and ``decisions``, the grants and
  refusals this node made as leader (``BudgetMetrics.counts``; null when not known one
  by one), with ``budget_decisions_leader`` saying whether this node leads now;
* ``/ui/api/key?key=K&key=...``: the holders and waiters of up to ``MAX_KEYS_ASKED``
  keys (the page asks after grants and other changes: events carry no TTL);
* ``/ui/api/queue?queue=Q``: one queue's task view: its open tasks (ready, delayed,
  claimed; the first ``MAX_TASKS`` in put order) with attempt number, worker,
  heartbeat age, progress and last error, from this node's state, and its dead letters
  (the ``task_dead`` read, through the log);
* ``/ui/api/health``: this node's ``role``, ``term``, ``leader`` (the id of the leader it
  knows, or null) and ``heard_from_leader_ago``, from memory (no forwarding, so it
  answers at once even when the node is cut off). The page asks it and ``/readyz``
  (admin.py: the readiness verdict and reason) every second and shows its data as
  stale unless both answered recently, ready, with a leader;
* ``/ui/api/cluster``: the status of every member (role, term, applied index, lease
  reads, drift), this node's from memory and the others' over their client ports
  (the open ``status`` operation). Each also carries ``readiness`` (``ready``,
  ``reason``) from what its status reports (a leader known, heard from it within
  ``max_silence``, caught up; the rest of the ``/readyz`` rule, e.g. the apply lag,
  only that node's ``/readyz`` knows: the page shows its own node's from there), and
  ``dashboard``, the URL of its ``/ui/`` when its status names an admin endpoint
  (``admin``; a wildcard host such as ``0.0.0.0`` is replaced by its client
  address's host, the scheme is this endpoint's): the page links there when its own
  node goes stale, and moves its reads to that origin by itself (app.js, cors.py).

The page itself follows ``/v1/watch`` (NDJSON, http_api.py) for changes, and retries a
dead letter with ``POST /v1/queues/retry`` (``task_retry``, JSON only, so a cross-site
form cannot send it without a CORS preflight, which this port grants only to the other
members' admin origins, cors.py).

Reads run as the HTTP API runs them (``HttpApi.run``): through ``parse_request``,
the permission check and, where this node cannot answer, forwarded to the leader;
linearizable, so remaining times are the leader's. The periodic ``/ui/api/live``
reads the wait queues, queue depths and budgets from this node's own state instead, labelled with
its applied index: one request per key every 2 s would load the leader for nothing
(waiters are shown by position, not by time left), and ``task_stats`` costs a log entry
per queue.

Security: with an ``auth_file``, every ``/ui/api/`` route needs a bearer token of a
principal with ``admin`` (as ``/status``): 401 without a known token, 403 without the
permission. Nothing returned carries a lease, session or attempt id, nor a budget's
spend or reservation id (a reservation id settles it: a capability); the reads used
never reveal them, a session is named by ``ref`` and a budget by counts only.

Threads: the node's event loop only; handlers wait on reads without blocking it.
Raises nothing: errors are JSON answers (``http_api.error_response``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import hmac
import importlib.resources
import logging
import secrets
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ...core.budget import SCALE
from ...errors import BadRequestError, RaftLeaseError, UnavailableError
from ..metrics import QUEUE_COUNTERS
from .cors import admin_origin
from .parts import error_response, json_response, refusal

if TYPE_CHECKING:
    from ...core.budget import Budget
    from ...replication import Replica
    from ..auth import AuthPolicy
    from ..budget_metrics import BudgetMetrics
    from .cors import MemberOrigins
    from .http_api import HttpApi

log = logging.getLogger("raftlease.server.dashboard")

#: Static files of the page: name -> content type.
STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
#: Most keys whose waiters one answer lists, and waiters per key.
MAX_WAITER_KEYS = 200
MAX_WAITERS = 100
#: Most keys one /ui/api/key request may ask about.
MAX_KEYS_ASKED = 50
#: Most leases and sessions one answer lists.
MAX_LEASES = 5000
MAX_SESSIONS = 1000
MAX_QUEUES = 200
#: Most budgets one answer lists (the first by key; ``budgets_more`` counts the rest).
#: Budgets are defined by operators, so few; the cap keeps a page bounded anyway.
MAX_BUDGETS = 50
#: The caps above by the names ``truncated`` uses (the page shows them).
LIMITS = {
    "leases": MAX_LEASES,
    "waiter_keys": MAX_WAITER_KEYS,
    "sessions": MAX_SESSIONS,
    "queues": MAX_QUEUES,
    "budgets": MAX_BUDGETS,
}
#: Most open tasks and dead letters one queue view lists, and keys per session.
MAX_TASKS = 200
MAX_DEAD = 100
MAX_SESSION_KEYS = 100
#: Seconds another member has to answer ``status``.
PEER_STATUS_TIMEOUT = 1.5
#: Only this origin (``connect-src`` widened per page to the members' admin origins,
#: ``Dashboard._page_policy``): the page runs no inline script, and keys rendered as text
#: could not run one even if a bug put them in markup.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _load_static() -> dict[str, bytes]:
    root = importlib.resources.files("raftlease.server.http") / "ui"
    return {name: (root / name).read_bytes() for name in STATIC}


class Dashboard:
    """The ``/ui/`` routes (see the module docstring), over one node's ``HttpApi``."""

    def __init__(
        self, api: HttpApi, auth: AuthPolicy | None, origins: MemberOrigins | None = None
    ) -> None:
        self.api = api
        #: The other members' admin origins (cors.py): the page may read them.
        self.origins = origins
        self.node = api.node
        self.auth = auth
        self._static: dict[str, bytes] | None = None
        #: Keys the session labels (``session_ref``): a label names a session on this
        #: node's page and reveals nothing of its id.
        self._ref_secret = secrets.token_bytes(16)

    @staticmethod
    def owns(path: str) -> bool:
        return path in ("/", "/ui") or path.startswith("/ui/")

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer one request; never raises (a bug answers 500)."""
        try:
            return await self._dispatch(request)
        except RaftLeaseError as exc:
            return error_response(exc)
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception:  # never let a bug take the node down
            log.exception("dashboard request failed")
            body = {"error": {"code": "INTERNAL", "message": "internal error", "definite": False}}
            return json_response(500, body)

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if request.method not in ("GET", "HEAD"):
            return refusal(405, "method not allowed here; use GET", {"Allow": "GET, HEAD"})
        if request.body_exists:
            raise BadRequestError("dashboard requests have no body")
        if path in ("/", "/ui"):
            return web.Response(status=302, headers={"Location": "/ui/"})
        name = path[len("/ui/") :] or "index.html"
        if name in STATIC:
            if self._static is None:
                self._static = _load_static()
            headers = {"Content-Type": STATIC[name], **SECURITY_HEADERS}
            if name == "index.html" and self.origins is not None:
                headers["Content-Security-Policy"] = await self._page_policy()
            return web.Response(body=self._static[name], headers=headers)
        routes = {
            "api/state": self._state,
            "api/live": self._live,
            "api/key": self._key,
            "api/queue": self._queue,
            "api/cluster": self._cluster,
            "api/health": self._health,
        }
        route = routes.get(name)
        if route is None:
            return refusal(404, f"no page {path!r}")
        caller = self.api.caller(request)  # an unknown token: UNAUTHENTICATED
        if self.auth is not None:
            self.auth.check_admin(caller.principal, f"read {path}")
        body = await route(request, caller)
        return json_response(200, body, {"Cache-Control": "no-store"})

    async def _page_policy(self) -> str:
        """The page's Content-Security-Policy: ``connect-src`` widened from ``'self'``
        to the other members' admin origins (cors.py), the origins it may move its reads
        to. Those not learned yet are asked first (briefly: the page loads anyway)."""
        assert self.origins is not None
        if self.origins.missing():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.origins.refresh(), PEER_STATUS_TIMEOUT + 0.5)
        policy = SECURITY_HEADERS["Content-Security-Policy"]
        others = self.origins.origins()
        if not others:
            return policy
        return policy.replace("connect-src 'self'", "connect-src 'self' " + " ".join(others))

    # ------------------------------------------------------------ reads

    async def _read(self, op: str, fields: dict[str, Any], caller: Any) -> dict[str, Any]:
        return await self.api.run(op, {**fields, "consistency": "linearizable"}, caller)

    async def _state(self, request: web.BaseRequest, caller: Any) -> dict[str, Any]:
        # The revision first: the leases read after it are at least as new, so the
        # page, watching from revision + 1, may see a change twice but never miss one.
        revision = self.node.require_replica().store.revision
        # One more than shown: whether the list was cut at its cap (``truncated``).
        leases = await self._read("leases", {"prefix": "", "limit": MAX_LEASES + 1}, caller)
        listed = leases.get("leases", [])
        self._annotate(listed)
        live = await self._live(request, caller)
        truncated = (["leases"] if len(listed) > MAX_LEASES else []) + live["truncated"]
        return {
            **live,
            "revision": revision,
            "leases": listed[:MAX_LEASES],
            "truncated": truncated,
        }

    async def _live(self, request: web.BaseRequest, caller: Any) -> dict[str, Any]:
        store = self.node.require_replica().store
        every_key = sorted(list(store.queues))  # list(): one step, GIL-safe
        waiters: dict[str, list[dict[str, Any]]] = {}
        for key in every_key[:MAX_WAITER_KEYS]:
            # list_waiters copies the queue first: safe while the tick thread applies.
            answer = store.list_waiters(key, MAX_WAITERS)
            if answer["waiters"]:
                waiters[key] = answer["waiters"]
        sessions = await self._read("sessions", {"limit": MAX_SESSIONS + 1}, caller)
        listed = sessions.get("sessions", [])
        self._session_keys(listed[:MAX_SESSIONS])
        queues, more_queues = self._queues()
        replica = self.node.require_replica()
        metrics = getattr(self.node, "metrics", None)  # None without an admin address
        budgets, more_budgets = budget_rows(store, getattr(metrics, "budgets", None), MAX_BUDGETS)
        # Which lists stop at their cap (``LIMITS``): the page says so rather than let
        # an operator take the first 1000 sessions for all of them.
        cut = {
            "waiter_keys": len(every_key) > MAX_WAITER_KEYS,
            "sessions": len(listed) > MAX_SESSIONS,
            "queues": more_queues,
            "budgets": more_budgets > 0,
        }
        return {
            "node": self.node.config.node_id,
            "applied_index": replica.last_applied(),
            "waiters": waiters,
            "sessions": listed[:MAX_SESSIONS],
            "queues": queues,
            "budgets": budgets,
            "budgets_more": more_budgets,
            # The decision counters are the leader's (budget_metrics.py): the page says
            # so when this node does not lead, rather than show its counts as the total.
            "budget_decisions_leader": replica.is_leader(),
            "limits": LIMITS,
            "truncated": [name for name, more in cut.items() if more],
        }

    def _queues(self) -> tuple[list[dict[str, Any]], bool]:
        """Depth of each queue from this node's state (the first ``MAX_QUEUES`` by
        name), how long its oldest ready task has waited, its event counters (the
        ``raftlease_queue_*_total`` metrics' values: claims, completions, expiries,
        retries, dead letters) and whether there are more queues: copies of small dicts
        and single look-ups (one step each under the GIL), safe while the tick thread
        applies."""
        store = self.node.require_replica().store
        tasks, now = store.tasks, store.now
        queues = tasks.queues
        out = []
        names = sorted(list(queues))
        for name in names[:MAX_QUEUES]:
            queue = queues.get(name)
            if queue is None:
                continue
            counts = dict(queue.counts)
            tally = dict(queue.tally)
            since = tasks.oldest_ready(queue)
            # The same values as metrics.queue_families: claims are counted apart.
            totals = {
                key: queue.claims_total if key == "claims" else tally.get(key, 0)
                for key in QUEUE_COUNTERS
            }
            out.append(
                {
                    "queue": name,
                    "ready": counts.get("ready", 0),
                    "delayed": counts.get("delayed", 0),
                    "claimed": counts.get("claimed", 0),
                    "dead": counts.get("dead", 0),
                    "waiting_claims": len(queue.claimers),
                    # Log-time ms the longest-waiting ready task has been ready (the
                    # raftlease_queue_oldest_ready_age_seconds gauge), None without one.
                    "oldest_ready_ms": None if since is None else max(0, now - since),
                    **totals,
                }
            )
        return out, len(names) > MAX_QUEUES

    async def _key(self, request: web.BaseRequest, caller: Any) -> dict[str, Any]:
        keys = request.query.getall("key", [])
        if not 0 < len(keys) <= MAX_KEYS_ASKED:
            raise BadRequestError(f"give 1 to {MAX_KEYS_ASKED} 'key' query parameters")
        answers = await asyncio.gather(*(self._one_key(key, caller) for key in keys))
        return {"keys": list(answers)}

    async def _one_key(self, key: str, caller: Any) -> dict[str, Any]:
        holder = await self._read("holder", {"key": key}, caller)
        waiters = await self._read("waiters", {"key": key, "limit": MAX_WAITERS}, caller)
        current = holder.get("holder")
        holders: list[dict[str, Any]] = []
        if current is not None:
            holders = list(current.get("holders") or [current])
        self._annotate(holders)
        return {
            "key": key,
            "holders": holders,
            "capacity": waiters.get("capacity", 1),
            "waiters": waiters.get("waiters", []),
        }

    # ------------------------------------------------- shared keys, sessions

    def _ref(self, session_id: str) -> str:
        """The page's label of a lease session: a keyed hash of its id (the id is a
        capability; the label, with this process's secret, tells nothing of it)."""
        digest = hmac.new(self._ref_secret, session_id.encode(), hashlib.sha256)
        return "s-" + digest.hexdigest()[:8]

    def _session_of_leases(self) -> dict[tuple[str, int], str]:
        """(key, token) -> the label of the lease session it is attached to, from this
        node's state (copies first: safe while the tick thread applies)."""
        store = self.node.require_replica().store
        out: dict[tuple[str, int], str] = {}
        for session in list(store.lease_sessions.values()):
            ref = self._ref(session.session_id)
            for lease_id in list(session.leases):
                lease = store.leases.get(lease_id)
                if lease is not None:
                    out[(lease.key, lease.token)] = ref
        return out

    def _annotate(self, holders: list[dict[str, Any]]) -> None:
        """Add each holder's key ``capacity`` (this node's state: the lease list has
        none, and a reader of a read/write lock looks like a lock's holder without it)
        and, when it is attached to a lease session, that session's ``session_ref``."""
        store = self.node.require_replica().store
        refs = self._session_of_leases() if any(h.get("in_session") for h in holders) else {}
        for h in holders:
            capacity = h.get("capacity") or store.capacity.get(h.get("key", ""), 1)
            h["capacity"] = capacity
            ref = refs.get((h.get("key", ""), h.get("token", 0)))
            if ref is not None:
                h["session_ref"] = ref

    def _session_keys(self, listed: list[dict[str, Any]]) -> None:
        """Give each listed session (the leader's answer: no id) its ``ref`` and
        ``keys`` (held through it) from this node's state: matched by owner and TTL,
        soonest expiry first (the order both lists have); one this node does not know
        yet gets ``keys`` null."""
        store = self.node.require_replica().store
        local = sorted(
            list(store.lease_sessions.values()), key=lambda s: (s.expires_at, s.owner, s.ttl_ms)
        )
        by_owner: dict[tuple[str, int], collections.deque[Any]] = {}
        for session in local:
            by_owner.setdefault((session.owner, session.ttl_ms), collections.deque()).append(
                session
            )
        for item in listed:
            same = by_owner.get((item.get("owner", ""), item.get("ttl", 0)))
            if not same:
                item["ref"] = None
                item["keys"] = None
                continue
            match = same.popleft()
            keys = []
            for lease_id in list(match.leases)[:MAX_SESSION_KEYS]:
                lease = store.leases.get(lease_id)
                if lease is not None:
                    keys.append(lease.key)
            item["ref"] = self._ref(match.session_id)
            item["keys"] = sorted(set(keys))

    # ----------------------------------------------------------- queue view

    async def _queue(self, request: web.BaseRequest, caller: Any) -> dict[str, Any]:
        name = request.query.get("queue", "")
        if not name:
            raise BadRequestError("give a 'queue' query parameter")
        store = self.node.require_replica().store
        tasks = store.tasks
        now = store.now
        open_tasks = [
            t
            for t in list(tasks.tasks.values())
            if t.queue == name and t.status in ("ready", "delayed", "claimed")
        ]
        open_tasks.sort(key=lambda t: t.seq)
        out = []
        for task in open_tasks[:MAX_TASKS]:
            info = tasks.task_info(name, task.tid, now)
            if info is None:
                continue
            out.append(_task_row(info, tasks.attempts.get(tasks.current.get(task.tid, "")), now))
        # Dead letters through the log (a linearizable read: the page asks on a click).
        dead = await self._read("task_dead", {"queue": name, "limit": MAX_DEAD}, caller)
        return {
            "queue": name,
            "node": self.node.config.node_id,
            "applied_index": self.node.require_replica().last_applied(),
            "tasks": out,
            "more_tasks": max(0, len(open_tasks) - MAX_TASKS),
            "dead": [_task_row(d, None, now) for d in dead.get("dead", [])],
            "limits": {"tasks": MAX_TASKS, "dead": MAX_DEAD},
        }

    def _max_silence(self) -> float:
        """The ``/readyz`` limit on a follower's silence (the admin endpoint's)."""
        admin = getattr(self.node, "admin", None)
        silence = getattr(admin, "max_silence", None)
        if isinstance(silence, int | float):
            return float(silence)
        return 2 * self.node.config.election_timeout_max

    def _replica(self) -> Replica | None:
        try:
            return self.node.require_replica()
        except UnavailableError:
            return None

    async def _health(self, request: web.BaseRequest, caller: Any) -> dict[str, Any]:
        node = self.node
        answer: dict[str, Any] = {
            "node": node.config.node_id,
            "role": None,
            "term": None,
            "leader": None,
            "heard_from_leader_ago": None,
        }
        replica = self._replica()
        if replica is None:
            return answer
        leader = replica.leader_raft_addr()
        leader_id = None
        if leader is not None:
            leader_id = next((m.id for m in replica.membership.members() if m.raft == leader), None)
        answer.update(
            role=replica.role(),
            term=replica.term(),
            leader=leader_id,
            heard_from_leader_ago=None if replica.is_leader() else replica.guard.heard_ago(),
        )
        return answer

    async def _cluster(self, request: web.BaseRequest, caller: Any) -> dict[str, Any]:
        node = self.node
        me = node.config.self_node
        scheme = "https" if request.secure else "http"
        max_silence = self._max_silence()

        async def one(member: Any) -> dict[str, Any]:
            if member.client == me.client:
                status = {"reachable": True, **node.status()}
                status["readiness"] = _status_readiness(status, max_silence)
                status["dashboard"] = _dashboard_url(status, scheme)
                return status
            try:
                status = await self.api.forwarder.call(
                    member.client, None, {"id": 1, "op": "status"}, PEER_STATUS_TIMEOUT
                )
            except (RaftLeaseError, OSError, TimeoutError) as exc:
                return {
                    "reachable": False,
                    "node": member.id,
                    "client": member.client,
                    "error": str(exc),
                }
            if self.origins is not None and isinstance(status, dict):
                self.origins.learn(member.id, member.client, status)
            status = {"reachable": True, **status}
            status["readiness"] = _status_readiness(status, max_silence)
            status["dashboard"] = _dashboard_url(status, scheme)
            return status

        try:
            members = list(node.require_replica().membership.members())
        except UnavailableError:
            members = [me]
        nodes = await asyncio.gather(*(one(m) for m in members))
        return {"nodes": [_public_status(s) for s in nodes], "served_by": node.config.node_id}


#: Status fields the page shows (nothing else leaves: paths, durability details).
_STATUS_FIELDS = (
    "reachable",
    "node",
    "client",
    "role",
    "term",
    "commit_index",
    "applied_index",
    "leader",
    "ready",
    "revision",
    "leases",
    "lease_sessions",
    "lease_reads",
    "lease_remaining",
    "drift_alarm",
    "drift",
    "clock_rate",
    "heard_from_leader_ago",
    "loop_lag_ms",
    "overloaded",
    "readiness",
    "dashboard",
    "error",
)


def _status_readiness(status: dict[str, Any], max_silence: float) -> dict[str, Any]:
    """A member's readiness as far as its ``status`` tells: the parts of the
    ``/readyz`` rule it reports (a leader known; on a follower, heard from it within
    ``max_silence``, when shown; caught up with its log)."""
    if not status.get("leader"):
        return {"ready": False, "reason": "no leader is known to this node"}
    heard = status.get("heard_from_leader_ago")
    if status.get("role") != "leader" and isinstance(heard, int | float) and heard > max_silence:
        return {
            "ready": False,
            "reason": f"not heard from the leader for {heard} s (limit {max_silence} s)",
        }
    if status.get("ready") is False:
        return {"ready": False, "reason": "still catching up with its log"}
    return {"ready": True, "reason": "ready (from its status)"}


def _dashboard_url(status: dict[str, Any], scheme: str) -> str | None:
    """The URL of a member's ``/ui/`` from the admin address its status names (None
    without one); a wildcard host is replaced by its client address's host."""
    origin = admin_origin(status, scheme)
    return None if origin is None else origin + "/ui/"


def budget_rows(
    store: Any, metrics: BudgetMetrics | None, limit: int = MAX_BUDGETS
) -> tuple[list[dict[str, Any]], int]:
    """The dashboard's budget rows from ``store`` (a ``LeaseStore``): the first
    ``limit`` budgets by key, each with its level at the last applied entry's log time
    (as ``budget_get`` computes it), capacity, refill per second, waiting spends and
    open reservations (counts only: a spend or reservation id is a capability and never
    leaves), and ``decisions`` (``BudgetMetrics.counts``, null without metrics or when
    not known one by one); and how many budgets are not listed.

    Threads: the event loop while the tick thread applies: it copies the dict of
    budgets and reads scalars and sizes (one step each under the GIL; a level read
    while its budget changes may be one entry old). Never blocks or raises."""
    budgets: dict[str, Budget] = dict(store.budgets.budgets)  # the tick thread may add one
    now = store.now
    keys = sorted(budgets)
    rows = []
    for key in keys[:limit]:
        budget = budgets[key]
        rows.append(
            {
                "key": key,
                "level": budget.level_at(now) / SCALE,
                "capacity": budget.capacity,
                "refill_per_s": budget.rate / 1000,
                "waiting": len(budget.waiters),
                "reservations": len(budget.reservations),
                "decisions": None if metrics is None else metrics.counts(key),
            }
        )
    return rows, max(0, len(keys) - limit)


def _task_row(info: dict[str, Any], attempt: Any, now: int) -> dict[str, Any]:
    """One task as the queue view shows it (``task_info``'s fields, never an attempt
    id): its attempt number, worker, heartbeat age and progress while claimed, and the
    last error its history records."""
    history = info.get("history") or []
    errors = [row for row in history if len(row) > 6 and row[6]]
    last = errors[-1] if errors else None
    row: dict[str, Any] = {
        "task_id": info.get("tid"),
        "status": info.get("status"),
        "priority": info.get("priority"),
        "attempts": info.get("attempts"),
        "max_attempts": info.get("max_attempts"),
        "failures": info.get("failures"),
        "age": now - info["created_at"] if isinstance(info.get("created_at"), int) else None,
        "worker": info.get("worker"),
        "progress": info.get("progress"),
        "last_error": None if last is None else {"attempt": last[0], "error": last[6]},
        "dead_reason": info.get("dead_reason"),
    }
    if attempt is not None:
        row["attempt"] = attempt.number
        # The last heartbeat (or the claim): an attempt without a session is extended
        # to a heartbeat's time + its TTL; one in a session lives by the session.
        row["heartbeat_age"] = (
            None if attempt.session else max(0, now - (attempt.expires_at - attempt.ttl_ms))
        )
        row["progress_age"] = now - attempt.progress_at if attempt.progress is not None else None
        row["expires_in"] = attempt.expires_at - now
    if info.get("status") == "delayed":
        row["ready_in"] = max(0, int(info.get("ready_at", now)) - now)
    return row


def _public_status(status: dict[str, Any]) -> dict[str, Any]:
    return {k: status[k] for k in _STATUS_FIELDS if k in status}
