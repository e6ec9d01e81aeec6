"""The HTTP/JSON API of one node (docs/http-api.md), served on its ``admin_address``
beside /metrics and /status, under ``/v1/`` (and ``/openapi.json``).

Each resource (``openapi.all_routes()``, from the operations table) runs one protocol
operation. A request becomes the same map a native client sends (POST: the JSON body's
fields; GET: the query parameters, numbers converted by the field table) and goes
through the same ``protocol.parse_request`` and the same ``AuthPolicy`` (the bearer
token in ``Authorization: Bearer ...`` is the native ``auth`` token), then the node's ``handle``
(``node_api.NodeApi``: the only face of the node this package sees).
A node that is not the leader for it forwards the request to the leader over its own
client connection (``http_forward``), with the caller's token.

Retries: a mutating request carries ``Idempotency-Key: <1..128 printable chars>`` and
becomes request 1 of the native client id derived from (principal, key); a retry
with the same key within the dedup window (10 minutes idle) gets the first answer,
the same grant and token, never a second one. Without the header each request gets a
fresh sequence number of this node's own client id.

Errors: ``{"error": {"code", "message", "definite", "detail"?}}`` with the wire code,
HTTP status by ``openapi.STATUS``. Hostile input: bodies above ``max_frame`` (413),
bodies not sent within ``BODY_TIMEOUT`` (408, connection closed), a POST without
``Content-Type: application/json`` (415), undecodable JSON, NaN/Infinity, a JSON value
that is no object, the HTTP layer's own fields in a body (400) all answer
``BAD_REQUEST`` before anything is proposed.

Threads: the node's event loop only. Handlers wait (long-polls, watches, the leader's
answer) without blocking the loop. A client that disconnects during a long-poll is
noticed between poll slices; its queued acquire is withdrawn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import re
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ...errors import (
    BadRequestError,
    BudgetExhaustedError,
    DeadlockError,
    FrameTooLargeError,
    InternalError,
    LeaseHeldError,
    NotLeaderError,
    OverloadedError,
    QuotaExceededError,
    RaftLeaseError,
    SessionExpiredError,
    UnauthenticatedError,
    UnavailableError,
)
from ...protocol import OPS, parse_request
from ..auth import AuthPolicy
from .http_forward import Forwarder, client_context
from .op_schemas import named_task
from .openapi import Route, all_routes, document, op_fields
from .parts import (
    Caller,
    Refusal,
    Sequencer,
    WatchSink,
    bounded_int,
    error_body,
    error_response,
    gone,
    integral_float,
    json_response,
    key_reused,
    reject_constant,
)

if TYPE_CHECKING:
    from .node_api import NodeApi

log = logging.getLogger("raftlease.server.http")

#: A request body must arrive whole within this many seconds.
BODY_TIMEOUT = 10.0
#: Longest slice of a long-poll: between slices the handler checks that its client
#: is still connected (and withdraws a queued acquire if not).
POLL_SLICE = 2.0
#: Long-lived requests (watch streams, acquires and claims waiting with ``wait``) one
#: authenticated principal may hold open on this endpoint, and everyone together
#: (issue 37: 70 watch streams of one principal filled the admin endpoint's 64
#: connections and /readyz and /metrics were dropped). Both stay below the
#: endpoint's connection cap (admin.MAX_CONNECTIONS, 64): probes and short calls
#: always find a connection. Beyond them: 429 QUOTA_EXCEEDED.
MAX_STREAMS_PER_PRINCIPAL = 16
MAX_STREAMS = 40
#: Tries of one request through NOT_LEADER / UNAVAILABLE answers (an election),
#: within its deadline.
MAX_HOPS = 16
#: Fields the HTTP layer sets; a body may not carry them.
RESERVED = frozenset({"id", "op", "cid", "seq", "ack", "token_auth"})
_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,128}")


class HttpApi:
    """The ``/v1/`` resources of one node (see the module docstring)."""

    def __init__(
        self,
        node: NodeApi,
        client_tls: ssl.SSLContext | None = None,
        when_lost: Callable[[web.BaseRequest, Callable[[], None]], Callable[[], None]]
        | None = None,
    ) -> None:
        self.node = node
        #: Call a function when a request's connection is lost; returns the undo
        #: (``AdminEndpoint.when_lost``; None: a stream notices only at its next write).
        self.when_lost = when_lost
        self.routes: dict[tuple[str, str], Route] = {(r.method, r.path): r for r in all_routes()}
        self.paths = frozenset(path for _, path in self.routes)
        self.forwarder = Forwarder(
            client_tls or client_context(node.config), max_frame=node.config.max_frame
        )
        self.sequencer = Sequencer(node.config.node_id)
        self._openapi: bytes | None = None
        self._tasks: set[asyncio.Future[object]] = set()
        #: Open long-lived requests: their caller and how to end them (``revoke``).
        self._streams: dict[object, tuple[Caller, Callable[[], None]]] = {}

    def streams_of(self, name: str | None) -> int:
        """Open long-lived requests of principal ``name`` (None: of everyone)."""
        if name is None:
            return len(self._streams)
        return sum(
            1
            for caller, _ in self._streams.values()
            if caller.principal is not None and caller.principal.name == name
        )

    def _hold(self, caller: Caller, end: Callable[[], None]) -> Callable[[], None]:
        """Count a long-lived request (``end`` ends it) against the stream caps;
        returns what to call when it is over. Raises ``QuotaExceededError``."""
        if len(self._streams) >= MAX_STREAMS:
            raise QuotaExceededError(
                f"{len(self._streams)} long-lived requests (watch streams, waits) are open "
                f"on this endpoint (at most {MAX_STREAMS}); use the client port for more"
            )
        who = caller.principal
        if who is not None and self.streams_of(who.name) >= MAX_STREAMS_PER_PRINCIPAL:
            raise QuotaExceededError(
                f"{who.name} already has {MAX_STREAMS_PER_PRINCIPAL} long-lived requests "
                "(watch streams, waits) open on this endpoint",
                {"principal": who.name},
            )
        token = object()
        self._streams[token] = (caller, end)

        def release() -> None:
            self._streams.pop(token, None)

        return release

    def revoke(self, policy: AuthPolicy) -> int:
        """An auth reload: end every long-lived request whose token the new policy
        no longer admits, or admits as another principal (a removed principal's open
        watch kept streaming). Returns how many were ended. Event loop."""
        ended = 0
        for caller, end in list(self._streams.values()):
            if caller.token is None or caller.principal is None:
                continue
            try:
                still = policy.by_token(caller.token).name == caller.principal.name
            except UnauthenticatedError:
                still = False
            if not still:
                ended += 1
                end()
        return ended

    def owns(self, path: str) -> bool:
        return path == "/openapi.json" or path == "/v1" or path.startswith("/v1/")

    async def close(self) -> None:
        await self.forwarder.close()

    # ----------------------------------------------------------- dispatch

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer one request; never raises (a bug answers 500 INTERNAL)."""
        try:
            return await self._dispatch(request)
        except Refusal as refusal:
            return error_response(refusal.err, refusal.status, refusal.close)
        except RaftLeaseError as exc:
            return error_response(exc)
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception:  # never let a bug take the node down
            log.exception("HTTP API request failed")
            return error_response(InternalError("request handler failed"))

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path == "/openapi.json":
            if request.method not in ("GET", "HEAD"):
                return self._method_not_allowed("GET, HEAD")
            if self._openapi is None:
                self._openapi = json.dumps(document(self.node.limits), indent=1).encode()
            return web.Response(body=self._openapi, content_type="application/json")
        if path not in self.paths:
            return error_response(BadRequestError(f"no resource {path!r}"), 404)
        route = self.routes.get((request.method, path))
        if route is None:
            allowed = sorted(m for m, p in self.routes if p == path)
            return self._method_not_allowed(", ".join(allowed))
        caller = self.caller(request)  # before the body: an unknown token reads none
        fields = await self._fields(request, route)
        for http_name, proto in route.rename:
            if http_name in fields:
                fields[proto] = fields.pop(http_name)
            else:
                fields.pop(proto, None)  # an election is named, not keyed
        if route.op == "watch":
            return await self._watch(request, fields, caller)
        key = request.headers.get("Idempotency-Key")
        if key is not None and not _IDEMPOTENCY_KEY.fullmatch(key):
            raise BadRequestError("Idempotency-Key must be 1 to 128 printable ASCII characters")
        release: Callable[[], None] | None = None
        if route.poll and fields.get("wait"):
            # A wait may last long: it counts against the stream caps, and a reload
            # that revokes its caller cancels it (the wait then withdraws).
            task = asyncio.current_task()
            assert task is not None

            def cancel() -> None:
                task.cancel()

            release = self._hold(caller, cancel)
        try:
            result = await self.run(route.op, fields, caller, key)
            if route.poll == "lease" and result.get("queued"):
                result = await self._await_grant(request, fields, result, caller)
            elif route.poll == "set" and result.get("queued"):
                result = await self._await_set(request, fields, result, caller)
            elif route.poll == "claim" and result.get("queued"):
                result = await self._await_claim(request, fields, result, caller)
            elif route.poll == "budget" and result.get("queued"):
                result = await self._await_spend(request, fields, result, caller)
        except RaftLeaseError as exc:
            for http_name, proto in route.rename:
                # Name the field the caller sent (an election's 'name', not 'key').
                exc.message = exc.message.replace(repr(proto), repr(http_name))
            raise
        finally:
            if release is not None:
                release()
        if route.op == "status" and self.node.auth is not None:
            result = self.node.auth.status_view(caller.principal, result)  # admin: all of it
        if route.tag == "queues":
            # The request fields' names beside the native result's short ones.
            for short, name in (("tid", "task_id"), ("aid", "attempt_id")):
                if short in result:
                    result = {**result, name: result[short]}
            if route.op == "task_get" and isinstance(result.get("task"), dict):
                result = {**result, "task": named_task(result["task"])}
        return json_response(200, result)

    def _method_not_allowed(self, allowed: str) -> web.Response:
        err = BadRequestError(f"method not allowed here; use {allowed}")
        response = json_response(405, error_body(err), {"Allow": allowed})
        return response

    def caller(self, request: web.BaseRequest) -> Caller:
        """The bearer token and its principal; an unknown token is refused at once
        (UNAUTHENTICATED), a missing one only by operations that need one."""
        auth = self.node.auth
        header = request.headers.get("Authorization")
        if header is None:
            return Caller(None, None)
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise UnauthenticatedError("Authorization must be 'Bearer <token>'")
        if auth is None:
            return Caller(None, None)  # auth is off: a token changes nothing
        return Caller(token, auth.by_token(token))

    # ------------------------------------------------------------- input

    async def _fields(self, request: web.BaseRequest, route: Route) -> dict[str, Any]:
        """The request's fields: the JSON body of a POST, or the query of a GET."""
        if route.method == "GET":
            if request.body_exists:
                raise BadRequestError("a GET request has no body; give fields as query parameters")
            return self._query(request, route)
        ctype = request.headers.get("Content-Type", "")
        if ctype.split(";")[0].strip().lower() != "application/json":
            refused = BadRequestError(f"Content-Type must be application/json, not {ctype!r}")
            raise Refusal(refused, 415)
        limit = self.node.config.max_frame
        if request.content_length is not None and request.content_length > limit:
            err = FrameTooLargeError(
                f"body of {request.content_length} bytes exceeds the limit of {limit}"
            )
            raise Refusal(err, close=True)
        try:
            body = await asyncio.wait_for(_read_body(request, limit + 1), BODY_TIMEOUT)
        except TimeoutError:
            late = BadRequestError(f"the body did not arrive within {BODY_TIMEOUT:.0f} s")
            raise Refusal(late, 408, close=True) from None
        if len(body) > limit:
            raise Refusal(
                FrameTooLargeError(f"body exceeds the limit of {limit} bytes"), close=True
            )
        try:
            value = json.loads(
                body,
                parse_constant=reject_constant,
                parse_int=bounded_int,
                parse_float=integral_float,
            )
        except RaftLeaseError:
            raise
        except (ValueError, RecursionError) as exc:
            raise BadRequestError(f"body is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise BadRequestError(f"body must be a JSON object, not {type(value).__name__}")
        reserved = sorted(RESERVED & set(value))
        if reserved:
            raise BadRequestError(f"fields {reserved} are set by the HTTP layer, not the body")
        return value

    def _query(self, request: web.BaseRequest, route: Route) -> dict[str, Any]:
        kinds = {f.name: f.kind for f in op_fields(route.op, self.node.limits)}
        for http_name, proto in route.rename:
            kinds[http_name] = kinds.pop(proto, "key")
        fields: dict[str, Any] = {}
        for name in request.query:
            values = request.query.getall(name)
            if len(values) != 1:
                raise BadRequestError(f"query parameter {name!r} is given {len(values)} times")
            if name in RESERVED:
                raise BadRequestError(f"query parameter {name!r} is set by the HTTP layer")
            text = values[0]
            kind = kinds.get(name)
            # Numbers from text; anything else stays a string, and parse_request then
            # names the field that is not a number.
            if kind == "integer" and re.fullmatch(r"-?[0-9]{1,20}", text):
                fields[name] = int(text)
            elif kind == "number" and re.fullmatch(r"-?[0-9]{1,20}(\.[0-9]{1,9})?", text):
                fields[name] = float(text)
            else:
                fields[name] = text
        return fields

    # ---------------------------------------------------------- execution

    async def run(
        self, op: str, fields: dict[str, Any], caller: Caller, key: str | None = None
    ) -> dict[str, Any]:
        """Validate and execute one operation: here, or forwarded to the leader.
        Raises the operation's ``RaftLeaseError``."""
        message: dict[str, Any] = {**fields, "id": 1, "op": op}
        mutating = OPS.get(op, False)
        seq = 0
        if mutating and key is not None:
            who = caller.principal.name if caller.principal is not None else ""
            digest = hashlib.blake2b(f"{who}\0{key}".encode(), digest_size=16).hexdigest()
            message.update(cid=f"http-key-{digest}", seq=1, ack=1)
        elif mutating:
            seq = self.sequencer.begin()
            message.update(cid=self.sequencer.cid, seq=seq, ack=self.sequencer.ack())
        try:
            try:
                return await self._execute(message, caller)
            except BadRequestError as exc:
                if key is None:
                    raise
                raise key_reused(exc) from None
            except SessionExpiredError:
                if not seq:
                    raise
                # This node's client id was evicted while idle (nothing applied):
                # continue under a fresh one.
                self.sequencer.end(seq)
                self.sequencer = Sequencer(self.node.config.node_id)
                seq = self.sequencer.begin()
                message.update(cid=self.sequencer.cid, seq=seq, ack=self.sequencer.ack())
                return await self._execute(message, caller)
        finally:
            if seq:
                self.sequencer.end(seq)

    async def _execute(self, message: dict[str, Any], caller: Caller) -> dict[str, Any]:
        node = self.node
        request = parse_request(message, node.limits)  # the one validation
        if node.auth is not None:
            node.auth.check(caller.principal, request)
            if caller.principal is not None:
                request = dataclasses.replace(request, principal=caller.principal.name)
        timeout = node.config.request_timeout + float(request.args.get("timeout", 0.0))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        here = node.config.self_node.client
        leader: str | None = here
        last: RaftLeaseError | None = None
        # Through an election: NOT_LEADER and UNAVAILABLE are definite (nothing was
        # applied), so the request is tried again, here or at the leader named, until
        # its deadline; any other answer is final.
        for _ in range(MAX_HOPS):
            try:
                if leader == here:
                    return await node.handle(request)
                return await self.forwarder.call(
                    str(leader), caller.token, message, max(0.1, deadline - loop.time())
                )
            except NotLeaderError as exc:
                last = exc
                named = None if exc.leader is None else str(exc.leader)
                if named is not None and named != leader:
                    leader = named
                    continue  # follow the hint at once
            except OverloadedError:
                raise  # at once, 503 with Retry-After: a retry here would be load too
            except UnavailableError as exc:
                last = exc
            if loop.time() + 0.2 >= deadline:
                break
            await asyncio.sleep(0.2)
            leader = self._known_leader()
        if last is None or isinstance(last, NotLeaderError):
            raise UnavailableError(f"no leader answered before the deadline ({last})")
        raise last

    def _known_leader(self) -> str:
        """The leader's client address as this node knows it (itself when it
        leads or knows none: its own answer then says why)."""
        try:
            self.node.require_leader()
        except NotLeaderError as exc:
            if exc.leader is not None:
                return str(exc.leader)
        except RaftLeaseError:
            pass
        return self.node.config.self_node.client

    # ---------------------------------------------------------- long-polls

    async def _poll(
        self,
        request: web.BaseRequest,
        fields: dict[str, Any],
        op: str,
        args: dict[str, Any],
        caller: Caller,
        *,
        done: tuple[str, ...],
        withdraw: Callable[[], Awaitable[object]],
    ) -> dict[str, Any]:
        """Run the long-poll ``op`` in slices of at most ``POLL_SLICE`` until its
        answer's state is one of ``done``, the client went away or the request's
        ``wait`` passed; the last answer (``{}`` when none). Runs on the event loop.
        When a poll fails or the request is cancelled, ``withdraw()`` runs in a task
        of its own (which that cancellation cannot stop: a queued request must not
        stay queued, nor a grant nobody will receive stay held) and the error is
        raised again."""
        loop = asyncio.get_running_loop()
        until = loop.time() + float(fields.get("wait") or 0.0)
        status: dict[str, Any] = {}
        try:
            while (left := until - loop.time()) > 0 and not gone(request):
                status = await self.run(op, {**args, "timeout": min(left, POLL_SLICE)}, caller)
                if status.get("state") in done:
                    break
        except BaseException:
            self._withdraw_in_background(withdraw)
            raise
        return status

    async def _await_grant(
        self,
        request: web.BaseRequest,
        fields: dict[str, Any],
        queued: dict[str, Any],
        caller: Caller,
    ) -> dict[str, Any]:
        """An acquire with ``wait`` joined the key's queue: poll (in slices) until
        granted (its answer), gone or ``wait`` passed (withdrawn: LEASE_HELD)."""
        key, lid = str(queued["key"]), str(queued["lease_id"])
        status = await self._poll(
            request,
            fields,
            "await_lease",
            {"key": key, "lease_id": lid},
            caller,
            done=("held", "gone", "refused"),
            withdraw=lambda: self._withdraw(key, lid, caller),
        )
        if status.get("state") == "held":
            remaining = (int(status["expires_at"]) - int(status["now"])) / 1000.0
            granted = {**status, "key": key, "lease_id": lid, "remaining": remaining}
            holder = fields.get("holder_key")
            if holder is None:
                return granted
            renewed = await self._certify(
                "renew",
                {"key": key, "lease_id": lid, "holder_key": holder},
                caller,
                lambda: self._withdraw(key, lid, caller),
            )
            if renewed is None:
                return {**granted, "certificate": ""}
            left = (int(renewed["expires_at"]) - int(renewed["now"])) / 1000.0
            return {
                **granted,
                "expires_at": renewed["expires_at"],
                "now": renewed["now"],
                "remaining": left,
                "certificate": str(renewed.get("certificate", "")),
            }
        if status.get("state") == "refused":
            # Out of the queue to break a deadlock (docs/design.md §4e).
            raise DeadlockError(
                str(status.get("message", "deadlock")),
                {"key": key, "cycle": status.get("cycle", [])},
            )
        await self._withdraw(key, lid, caller)
        raise LeaseHeldError(f"{key!r} was not granted within the wait", {"key": key})

    async def _await_set(
        self,
        request: web.BaseRequest,
        fields: dict[str, Any],
        queued: dict[str, Any],
        caller: Caller,
    ) -> dict[str, Any]:
        """An ``acquire_many`` with ``wait`` queued on every key: poll its first key
        (in slices) until the set is granted (the set's answer), refused (DEADLOCK),
        gone or ``wait`` passed (withdrawn: LEASE_HELD). Withdrawing closes the set,
        which also releases it if it was granted meanwhile."""
        lid, keys = str(queued["lease_id"]), [str(k) for k in queued["keys"]]
        status = await self._poll(
            request,
            fields,
            "await_lease",
            {"key": keys[0], "lease_id": f"{lid}/0"},
            caller,
            done=("held", "gone", "refused"),
            withdraw=lambda: self._withdraw_set(lid, caller),
        )
        if status.get("state") == "held":
            granted = {
                "state": "held",
                "lease_id": lid,
                "session": lid,
                "owner": status["owner"],
                "ttl": status["ttl"],
                "expires_at": status["expires_at"],
                "leases": status.get("set", []),
                "now": status["now"],
            }
            holder = fields.get("holder_key")
            if holder is None:
                return granted
            kept = await self._certify(
                "session_keepalive",
                {"session_id": lid, "holder_key": holder},
                caller,
                lambda: self._withdraw_set(lid, caller),
            )
            signed = {
                (str(c.get("key")), c.get("token")): str(c.get("certificate", ""))
                for c in (kept or {}).get("certificates", ())
                if isinstance(c, dict)
            }
            leases = [
                {**one, "certificate": signed.get((str(one.get("key")), one.get("token")), "")}
                if isinstance(one, dict)
                else one
                for one in granted["leases"]
            ]
            if kept is None:
                return {**granted, "leases": leases}
            return {
                **granted,
                "expires_at": kept["expires_at"],
                "now": kept["now"],
                "leases": leases,
            }
        if status.get("state") == "refused":  # out of every queue (docs/design.md §4e)
            raise DeadlockError(
                str(status.get("message", "deadlock")),
                {"key": status.get("key", keys[0]), "cycle": status.get("cycle", [])},
            )
        await self._withdraw_set(lid, caller)
        raise LeaseHeldError("the set was not granted within the wait", {"keys": keys})

    def _withdraw_in_background(self, withdraw: Callable[[], Awaitable[object]]) -> None:
        """Run ``withdraw()`` in a task of its own, which the cancellation of the
        request being withdrawn cannot stop (kept in ``_tasks`` until it ends)."""
        task = asyncio.ensure_future(withdraw())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _certify(
        self,
        op: str,
        args: dict[str, Any],
        caller: Caller,
        withdraw: Callable[[], Awaitable[object]],
    ) -> dict[str, Any] | None:
        """A grant from a queue was made by another request's entry (a release's
        handoff), so no certificate came with it: with the request's ``holder_key``,
        one renewal (``op``: renew, session_keepalive or task_heartbeat) brings it, as
        the native client does (docs/certificates.md). Its answer, or None when it is
        refused (the grant is then answered with ``certificate`` "": the holder holds
        the lease, and a renewal of its own brings the certificate). Runs on the event
        loop. Cancelled (the client went away), it gives the grant back with
        ``withdraw()`` in a task of its own, as ``_poll`` does, and raises again."""
        try:
            return await self.run(op, args, caller)
        except RaftLeaseError as exc:
            log.info("no certificate for a grant after waiting (%s): %s", op, exc.code)
            return None
        except BaseException:
            self._withdraw_in_background(withdraw)
            raise

    async def _withdraw_set(self, lid: str, caller: Caller) -> None:
        """Leave every queue, or release the set if it was granted meanwhile."""
        try:
            await self.run("session_close", {"session_id": lid}, caller)
        except RaftLeaseError as exc:
            log.debug("withdrawing a waiting set: %s", exc.code)

    async def _withdraw(self, key: str, lid: str, caller: Caller) -> None:
        """Leave the queue, or release the lease if it was granted meanwhile."""
        try:
            await self.run("release", {"key": key, "lease_id": lid}, caller)
        except RaftLeaseError as exc:
            log.debug("withdrawing a queued acquire of %r: %s", key, exc.code)

    async def _await_claim(
        self,
        request: web.BaseRequest,
        fields: dict[str, Any],
        queued: dict[str, Any],
        caller: Caller,
    ) -> dict[str, Any]:
        """A claim with ``wait`` is waiting: poll until it is granted (its answer)
        or gone; then cancel what is left of it (in a task of its own when the
        request is cancelled: a claim granted meanwhile is given back)."""
        queue, aid = str(fields.get("queue")), str(queued.get("aid"))
        status = await self._poll(
            request,
            fields,
            "await_claim",
            {"queue": queue, "attempt_id": aid},
            caller,
            done=("claimed", "gone"),
            withdraw=lambda: self._cancel_claim(queue, aid, caller),
        )
        if status.get("state") == "claimed":
            holder = fields.get("holder_key")
            if holder is None:
                return status
            beat = await self._certify(
                "task_heartbeat",
                {
                    "queue": queue,
                    "task_id": status.get("tid"),
                    "attempt_id": aid,
                    "holder_key": holder,
                },
                caller,
                lambda: self._cancel_claim(queue, aid, caller),
            )
            if beat is None:
                return {**status, "certificate": ""}
            return {
                **status,
                "expires_at": beat.get("expires_at", status.get("expires_at")),
                "certificate": str(beat.get("certificate", "")),
            }
        await self._cancel_claim(queue, aid, caller)
        return {"claimed": False, "queue": queue, "state": status.get("state", "gone")}

    async def _cancel_claim(self, queue: str, aid: str, caller: Caller) -> None:
        """Withdraw a waiting claim (or give back a task claimed meanwhile)."""
        try:
            await self.run("task_claim_cancel", {"queue": queue, "attempt_id": aid}, caller)
        except RaftLeaseError as exc:
            log.debug("cancelling a waiting claim on %r: %s", queue, exc.code)

    async def _await_spend(
        self,
        request: web.BaseRequest,
        fields: dict[str, Any],
        queued: dict[str, Any],
        caller: Caller,
    ) -> dict[str, Any]:
        """A spend or reserve with ``wait`` is queued: poll (in slices) until it is
        granted (``granted`` true, with a reservation's id), gone or ``wait`` passed
        (withdrawn: BUDGET_EXHAUSTED). On the way out unless granted it is withdrawn,
        in a task of its own when cancelled (a reservation granted meanwhile is
        handed back; a plain spend granted meanwhile stays spent)."""
        key, rid = str(queued["key"]), str(queued["spend_id"])
        status = await self._poll(
            request,
            fields,
            "await_spend",
            {"key": key, "spend_id": rid},
            caller,
            done=("granted", "gone"),
            withdraw=lambda: self._cancel_spend(key, rid, caller),
        )
        if status.get("state") == "granted":
            return {**status, "granted": True, "key": key, "spend_id": rid}
        cancelled = await self._cancel_spend(key, rid, caller)
        if cancelled.get("granted"):  # granted after the last poll: it stays spent
            granted: dict[str, Any] = {
                f: cancelled[f] for f in ("amount", "granted_at") if f in cancelled
            }
            return {**granted, "state": "granted", "granted": True, "key": key, "spend_id": rid}
        raise BudgetExhaustedError(
            f"budget {key!r} did not grant {queued.get('amount')} within the wait "
            f"({status.get('reason', 'wait over')})",
            {"key": key, "reason": status.get("reason", "expired")},
        )

    async def _cancel_spend(self, key: str, rid: str, caller: Caller) -> dict[str, Any]:
        """Withdraw a queued spend (or hand back a reservation granted meanwhile):
        the cancel's answer (``granted`` when a plain spend was granted before it),
        ``{}`` when it failed."""
        try:
            return await self.run("budget_cancel", {"key": key, "spend_id": rid}, caller)
        except RaftLeaseError as exc:
            log.debug("withdrawing a queued spend of %r: %s", key, exc.code)
            return {}

    # -------------------------------------------------------------- watch

    async def _watch(
        self, request: web.BaseRequest, fields: dict[str, Any], caller: Caller
    ) -> web.StreamResponse:
        """Stream changes as NDJSON (default) or server-sent events (``Accept:
        text/event-stream``; ``Last-Event-ID`` resumes after that revision)."""
        node = self.node
        sse = "text/event-stream" in request.headers.get("Accept", "")
        last_id = request.headers.get("Last-Event-ID")
        if sse and last_id is not None and "from_revision" not in fields:
            if not re.fullmatch(r"[0-9]{1,19}", last_id):
                raise BadRequestError("Last-Event-ID must be a revision")
            fields["from_revision"] = int(last_id) + 1
        parsed = parse_request({**fields, "id": 1, "op": "watch"}, node.limits)
        if node.auth is not None:
            node.auth.check(caller.principal, parsed)
        replica = node.require_replica()  # raises UNAVAILABLE while the node starts
        who = caller.principal.name if caller.principal is not None else None
        node.watches.admit(who)  # QUOTA_EXCEEDED as a plain answer, before streaming
        # The stream caps, and a reload that revokes the caller ends it (end()).
        running: list[asyncio.Future[None]] = []
        ended = [False]

        def end() -> None:
            ended[0] = True
            for future in running:
                future.cancel()

        release = self._hold(caller, end)
        try:
            response = web.StreamResponse(
                headers={
                    "Content-Type": "text/event-stream" if sse else "application/x-ndjson",
                    "Cache-Control": "no-cache",
                }
            )
            await response.prepare(request)
        except BaseException:
            release()
            raise
        sink = WatchSink(request, response, sse)
        stream = asyncio.ensure_future(
            node.watches.stream(parsed, sink, lambda: replica.store.revision, who)  # type: ignore[arg-type]
        )
        running.append(stream)
        if ended[0]:
            stream.cancel()  # revoked while the response was prepared

        # The stream waits for changes and would learn that its client went away only
        # at its next write, which on a quiet prefix never comes: the handler (its
        # watch quota slot, its connection's place under the admin connection cap)
        # would stay until the node stops. So the connection's loss ends it at once,
        # and so does the keep-alive's end (a failed write).
        forget = self.when_lost(request, end) if self.when_lost else lambda: None
        keepalive = asyncio.create_task(sink.keepalive())
        keepalive.add_done_callback(lambda _: end())
        try:
            await stream
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the handler itself is cancelled (the node stops)
        except (ConnectionError, RuntimeError):
            pass
        finally:
            release()
            forget()
            keepalive.cancel()
            stream.cancel()
        return response


async def _read_body(request: web.BaseRequest, most: int) -> bytes:
    """The body, or its first ``most`` bytes if it is longer."""
    chunks: list[bytes] = []
    size = 0
    while size < most:
        chunk = await request.content.read(most - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
