"""The HTTP admin endpoint of one node (``admin_address``; docs/operations.md).

Routes (GET, or HEAD):

* ``/metrics``: the Prometheus text format, written by prometheus-client from the
  node's own registry (``metrics.NodeMetrics``);
* ``/livez``: 200 while the process serves (the event loop answers);
* ``/readyz``: 200 when this node knows a leader (and, on a follower, heard from it
  within ``max_silence``, twice the maximum election timeout: PySyncObj keeps a cut-off
  follower's last leader forever), has applied an entry of the current term, has caught
  up with the log it found at start, and has at most ``READY_MAX_APPLY_LAG`` committed
  entries not yet applied; 503 with a JSON reason otherwise;
* ``/status``: the JSON of ``raftlease status`` for this node.

Also mounted here: the HTTP/JSON API (``/v1/``, http_api.py) and the live view
(``/ui/``, dashboard.py), whose data routes need the same admin token as ``/status``.
All are routes of one ``aiohttp.web.Application`` (``AdminEndpoint.application``).

Hostile input has definite answers, each the HTTP API's error object in JSON
(``parts.refusal``): an unknown path 404, another method 405, any request body 413; a
URL over 8 KiB 414, a header over 8 KiB or more than 64 headers 431, a bad request line
or header byte 400 (aiohttp's parser refuses them; ``_AdminRequestHandler`` answers and
logs them at INFO, where aiohttp logged an ERROR traceback) or a closed connection; a
new connection that has not sent a whole request within ``REQUEST_TIMEOUT`` seconds (a
slow or stalled client) is closed, and a keep-alive connection whose next request is not
whole within ``KEEPALIVE_TIMEOUT``; beyond ``MAX_CONNECTIONS`` open connections, a new
one takes the place of the oldest connection still waiting for a whole request from the
peer address that has the most such connections (so one peer holding idle sockets cannot
lock out health probes), and is closed at once only when every open connection is in a
request (a stream).

Protection follows the client port (config.py, docs/security.md): with
``tls_cert_file`` the endpoint serves HTTPS with the client port's certificate; with an
``auth_file``, ``/metrics`` and ``/status`` need a bearer token (``Authorization: Bearer
...``) of a principal with the ``admin`` permission (401 without a known token, 403
without the permission). ``/livez`` and ``/readyz`` stay open for load balancers and
probes (they reveal no more than ``ping``). Protected mode: an ``admin_address`` beyond
loopback needs both TLS and an auth file, or ``insecure = true``.

Threads: everything runs on the node's event loop; handlers never block (the status
and metrics are read from memory, a file stat at most).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ...config import is_loopback, parse_addr
from ...errors import RaftLeaseError
from ...replication import Replica
from ..auth import AuthPolicy
from ..metrics import NodeMetrics
from .cors import ALLOW_HEADERS, ALLOW_METHODS, PREFLIGHT_MAX_AGE, MemberOrigins
from .dashboard import Dashboard
from .parts import error_body, error_response, json_response, refusal

if TYPE_CHECKING:
    from .http_api import HttpApi

log = logging.getLogger("raftlease.server.admin")

#: /readyz fails when more committed entries than this wait to be applied.
READY_MAX_APPLY_LAG = 1000
#: A connection must deliver a whole request within this many seconds.
REQUEST_TIMEOUT = 10.0
#: An idle keep-alive connection is closed after this many seconds.
KEEPALIVE_TIMEOUT = 15.0
#: Open admin connections beyond which new ones are closed at once.
MAX_CONNECTIONS = 64
#: Request line and each header: at most this many bytes; at most MAX_HEADERS headers.
MAX_LINE = 8190
MAX_HEADERS = 64

ROUTES = ("/metrics", "/livez", "/readyz", "/status")
#: Routes that need an admin token when the endpoint is secured.
PROTECTED = frozenset({"/metrics", "/status"})


def readiness(replica: Replica | None, max_silence: float) -> tuple[bool, str]:
    """(ready, reason): the /readyz rule (see the module docstring)."""
    if replica is None:
        return False, "the node is starting or waiting out an unclean stop"
    if replica.leader_raft_addr() is None:
        return False, "no leader is known to this node"
    if not replica.is_leader():
        heard = replica.guard.heard_ago()
        if heard is None or heard > max_silence:
            return False, (
                f"not heard from the leader for {heard} s (limit {max_silence} s)"
                if heard is not None
                else "never heard from the leader"
            )
    term = replica.term()
    if replica.store.term != term:
        return False, f"no entry of the current term {term} applied yet"
    if not replica.restored():
        return False, "still loading its snapshot and journal"
    if not replica.is_ready():
        return False, "still catching up with the log it found at start"
    lag = replica.commit_index() - replica.last_applied()
    if lag > READY_MAX_APPLY_LAG:
        return False, f"{lag} committed entries not applied (limit {READY_MAX_APPLY_LAG})"
    return True, "ready"


class _Refuse(asyncio.Protocol):
    """An admin connection over ``MAX_CONNECTIONS``: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        log.debug("admin connection refused: %d connections open", MAX_CONNECTIONS)
        assert isinstance(transport, asyncio.Transport)
        transport.abort()


def parser_refusal(exc: HttpProcessingError) -> tuple[int, str]:
    """(status, message) for a request aiohttp's parser refused: 414 for a request
    line (the URL) over ``MAX_LINE`` bytes, 431 for a header line over it or more
    than ``MAX_HEADERS`` headers, else 400 with the parser's reason."""
    if isinstance(exc, LineTooLong):
        line = exc.args[0] if exc.args else b""
        head = line.decode("latin-1") if isinstance(line, (bytes, bytearray)) else str(line)
        # aiohttp passes the offending line's first 100 bytes: the URL (or the whole
        # request line) starts with a slash, a method or a scheme; a header does not.
        first = head.split(" ", 1)[0]
        if head.startswith("/") or "://" in head[:16] or (first.isupper() and " " in head):
            return 414, f"the request line is over {MAX_LINE} bytes"
        return 431, f"a header line is over {MAX_LINE} bytes"
    text = str(getattr(exc, "message", "") or exc)
    if "too many headers" in text.lower():
        return 431, f"more than {MAX_HEADERS} headers"
    status = exc.code if 400 <= exc.code < 500 else 400
    return status, "malformed HTTP request: " + " ".join(text.split())[:200]


class _AdminRequestHandler(RequestHandler):
    """aiohttp's connection handler, answering its parser's refusals (a too long
    URL, bad header bytes, a bad request line) with the port's one JSON error
    object and logging them at INFO without a traceback: they are the client's
    fault, and aiohttp's own ``handle_error`` logged each at ERROR with one
    (operations.md alerts on ERROR). Anything else keeps aiohttp's logging and is
    answered 500 in the same shape."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp's: a response is under way
            if not isinstance(exc, HttpProcessingError):
                self.log_exception("admin request from %s failed", request.remote, exc_info=exc)
            raise ConnectionError("response already started; cannot send the error")
        if not isinstance(exc, HttpProcessingError):
            if status >= 500 and exc is not None:
                self.log_exception("admin request from %s failed", request.remote, exc_info=exc)
            code = "TIMEOUT" if status == 504 else "INTERNAL"
            body = {"error": {"code": code, "message": "internal error", "definite": False}}
            response = json_response(status, body)
            response.force_close()
            return response
        status, reason = parser_refusal(exc)
        log.info("admin request from %s refused (%d): %s", request.remote, status, reason)
        return refusal(status, reason, close=True)


class _AdminServer(web.Server):
    """The server of the port's ``web.Application`` (``AdminEndpoint.start``):
    aiohttp's with a connection cap and a deadline for each request to arrive whole
    (aiohttp has none for slow headers)."""

    def __init__(self, handler: Any, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.timers: dict[RequestHandler, asyncio.TimerHandle] = {}
        #: Called when a connection is lost (``AdminEndpoint.when_lost``).
        self.lost: dict[RequestHandler, list[Callable[[], None]]] = {}

    def __call__(self) -> Any:
        # At the cap with no idle connection to make room (every one is in a request),
        # the accepted connection gets a protocol that only closes it: refused before
        # aiohttp's RequestHandler exists. (Aborting a RequestHandler's transport from
        # its connection_made left aiohttp's request task to fail on a dropped
        # manager: an ERROR traceback in the log for every refused connection.)
        if len(self._connections) >= MAX_CONNECTIONS and not self.timers:
            return _Refuse()
        return _AdminRequestHandler(self, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if len(self._connections) > MAX_CONNECTIONS and not self._evict_idle(handler):
            # Nothing idle to replace (accepted in a burst, before the others counted):
            # close it once aiohttp's request task has started (see __call__).
            self._loop.call_soon(transport.abort)
            return
        self.arm(handler, transport)

    def _evict_idle(self, newcomer: RequestHandler) -> bool:
        """Close the oldest connection waiting for a whole request (armed) of the peer
        host holding the most such connections; False if there is none."""
        by_host: dict[str, list[RequestHandler]] = {}
        for handler in self.timers:  # in arming order: oldest first
            transport = self._connections.get(handler)
            if handler is newcomer or transport is None:
                continue
            peer = transport.get_extra_info("peername")
            by_host.setdefault(str(peer[0]) if peer else "", []).append(handler)
        if not by_host:
            return False
        victim = max(by_host.values(), key=len)[0]
        log.debug("admin connections at the cap: closed an idle one to make room")
        self.disarm(victim)
        transport = self._connections.get(victim)
        if transport is not None:
            transport.abort()
        return True

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self.disarm(handler)
        for callback in self.lost.pop(handler, ()):
            callback()
        super().connection_lost(handler, exc)

    def arm(
        self,
        handler: RequestHandler,
        transport: asyncio.Transport | None = None,
        timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        """Close the connection unless a whole request arrives within ``timeout``."""
        self.disarm(handler)
        transport = transport or handler.transport
        if transport is None or transport.is_closing():
            return

        def expire() -> None:
            self.timers.pop(handler, None)
            # Debug only: scanners and idle keep-alive scrapers would fill the log.
            log.debug("admin connection closed: no whole request within %.0f s", timeout)
            transport.abort()

        self.timers[handler] = self._loop.call_later(timeout, expire)

    def disarm(self, handler: RequestHandler) -> None:
        timer = self.timers.pop(handler, None)
        if timer is not None:
            timer.cancel()


class AdminEndpoint:
    """Serves the admin routes for one node on its event loop.

    ``status``: the node's status dict (raises ``RaftLeaseError`` while it cannot
    answer); ``replica``: the replica or None; ``auth``: tokens for /metrics and
    /status; ``tls``: serve HTTPS; ``max_silence``: seconds a follower may go without
    hearing from its leader and stay ready (see the module docstring)."""

    def __init__(
        self,
        address: str,
        metrics: NodeMetrics,
        status: Callable[[], dict[str, Any]],
        replica: Callable[[], Replica | None],
        auth: AuthPolicy | None = None,
        tls: ssl.SSLContext | None = None,
        max_silence: float = 2.0,
    ) -> None:
        self.address = address
        self.max_silence = max_silence
        self.metrics = metrics
        self.status = status
        self.replica = replica
        self.auth = auth
        self.tls = tls
        self._server: _AdminServer | None = None
        self._listener: asyncio.base_events.Server | None = None
        #: The HTTP/JSON API (http_api.HttpApi), mounted by the node: /v1/, /openapi.json.
        self.api: HttpApi | None = None
        #: The live view (dashboard.py): /ui/ and its data routes, over ``api``.
        self.dashboard: Dashboard | None = None
        #: The other members' admin origins, which may read this endpoint (cors.py).
        self.origins: MemberOrigins | None = None
        self._learner: asyncio.Task[None] | None = None

    @property
    def connections(self) -> int:
        return len(self._server.connections) if self._server is not None else 0

    def when_lost(
        self, request: web.BaseRequest, callback: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``callback`` (on the event loop) once ``request``'s connection is lost,
        at once if it already is; returns a function that cancels that. For streams
        that would otherwise learn of a vanished client only at their next write:
        aiohttp does not cancel a handler when its client goes (and its connection
        counts against ``MAX_CONNECTIONS`` until the handler returns). Event loop only."""
        server, handler = self._server, request.protocol
        if server is None or request.transport is None or request.transport.is_closing():
            callback()
            return lambda: None
        callbacks = server.lost.setdefault(handler, [])
        callbacks.append(callback)

        def forget() -> None:
            with contextlib.suppress(ValueError):
                callbacks.remove(callback)
            if not callbacks and server.lost.get(handler) is callbacks:
                del server.lost[handler]

        return forget

    async def start(self) -> None:
        """Bind and serve the routes of ``application()`` (``api`` and ``dashboard``
        as mounted by then). Raises ``OSError`` if the address cannot be bound."""
        host, port = parse_addr(self.address, "admin_address")
        loop = asyncio.get_running_loop()
        app = self.application()
        # What web.AppRunner does before it serves an application (its _make_server),
        # with our server class in place of aiohttp's: the connection cap, the
        # request deadlines and the parser-error answers live in the server and its
        # protocol (_AdminServer, _AdminRequestHandler), which AppRunner does not let
        # one replace. The application has no startup or cleanup hooks.
        app._set_loop(loop)
        app.freeze()
        self._server = _AdminServer(
            app._handle,
            request_factory=app._make_request,
            keepalive_timeout=KEEPALIVE_TIMEOUT,
            max_line_size=MAX_LINE,
            max_field_size=MAX_LINE,
            max_headers=MAX_HEADERS,
            access_log=None,
            lingering_time=1.0,
        )
        self._listener = await loop.create_server(
            self._server, host, port, ssl=self.tls, reuse_address=True, backlog=64
        )
        if self.origins is not None:
            self._learner = loop.create_task(self.origins.run())
        log.info(
            "admin endpoint on %s://%s (metrics, livez, readyz, status)",
            "https" if self.tls else "http",
            self.address,
        )

    async def close(self) -> None:
        if self._learner is not None:
            self._learner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._learner
        if self.api is not None:
            await self.api.close()
        if self._listener is not None:
            self._listener.close()
        if self._server is not None:
            self._server.pre_shutdown()
            await self._server.shutdown(1.0)
        if self._listener is not None:
            await self._listener.wait_closed()

    # ------------------------------------------------------------ requests

    def application(self) -> web.Application:
        """The port's routes on aiohttp's router: the admin routes (GET and HEAD),
        every HTTP API route by its method and path (http_api.py's table, from the
        operations table) and ``/openapi.json``, the live view's ``/``, ``/ui`` and
        ``/ui/...`` (dashboard.py routes within). The router answers an unknown path
        404 and another method 405 (with ``Allow``); ``_frame`` turns both, and any
        bug, into the one JSON error object."""
        app = web.Application(middlewares=[self._frame], handler_args=None)
        app.on_response_prepare.append(self._cors_headers)
        router = app.router
        for path in ROUTES:
            router.add_get(path, self._admin)  # HEAD too
        api = self.api
        if api is not None:
            if self.origins is None:
                self.origins = MemberOrigins(api, "https" if self.tls else "http")
            router.add_get("/openapi.json", api.handle)
            for method, path in sorted(api.routes):
                router.add_route(method, path, api.handle)
            for path in ("/", "/ui", "/ui/{rest:.*}"):
                router.add_route("*", path, self._dashboard)
        return app

    @web.middleware
    async def _frame(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """Around every request: its connection's timers (no deadline while a handler
        runs: a stream may last long; the idle deadline again after it), the Host
        check (421), the router's refusals as the JSON error object, a bug as 500."""
        server = self._server
        protocol = request.protocol
        if server is not None:
            server.disarm(protocol)
        try:
            if not self._host_allowed(request):
                return refusal(
                    421,
                    "misdirected request: this endpoint answers only requests "
                    "addressed to a loopback name (Host header) while no auth file is set",
                )
            if request.method == "OPTIONS" and self._cross_origin_allowed(request):
                return self._preflight(request)
            return await handler(request)
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(exc.allowed_methods))
            return refusal(
                405,
                f"{request.method} is not allowed on {request.path}; use {allowed}",
                {"Allow": allowed},
            )
        except web.HTTPNotFound:
            mounted = ["/v1/", "/openapi.json", "/ui/"] if self.api is not None else []
            return refusal(404, f"no resource {request.path!r}", routes=[*ROUTES, *mounted])
        except web.HTTPException as exc:  # another answer of aiohttp's own (none today)
            return refusal(exc.status, exc.reason)
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception:  # never let a bug take the node down
            log.exception("admin request failed")
            body = {"error": {"code": "INTERNAL", "message": "internal error", "definite": False}}
            return json_response(500, body)
        finally:
            # Between requests of a keep-alive connection: idle (or the next request
            # arriving) for up to KEEPALIVE_TIMEOUT.
            if server is not None:
                server.arm(protocol, timeout=KEEPALIVE_TIMEOUT)

    def _cross_origin_allowed(self, request: web.BaseRequest) -> bool:
        """Whether the request's ``Origin`` is another member's admin origin (cors.py)."""
        origin = request.headers.get("Origin")
        return origin is not None and self.origins is not None and self.origins.allowed(origin)

    def _preflight(self, request: web.BaseRequest) -> web.StreamResponse:
        """A CORS preflight from an allowed origin (``_cross_origin_allowed``); any
        other ``OPTIONS`` goes to the router as before (405, 404)."""
        if "Access-Control-Request-Method" not in request.headers:
            return refusal(405, f"OPTIONS is not allowed on {request.path}")
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Methods": ALLOW_METHODS,
                "Access-Control-Allow-Headers": ALLOW_HEADERS,
                "Access-Control-Max-Age": PREFLIGHT_MAX_AGE,
            },
        )

    async def _cors_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        """Before any answer's headers leave (streams too): ``Vary: Origin`` on an
        answer to a request with an ``Origin``, and ``Access-Control-Allow-Origin``
        naming that origin when it is another member's admin origin. Nothing else."""
        origin = request.headers.get("Origin")
        if origin is None:
            return
        vary = response.headers.get("Vary")
        if vary is None:
            response.headers["Vary"] = "Origin"
        elif "origin" not in vary.lower():
            response.headers["Vary"] = vary + ", Origin"
        if self._cross_origin_allowed(request):
            response.headers["Access-Control-Allow-Origin"] = origin

    async def _dashboard(self, request: web.Request) -> web.StreamResponse:
        if self.dashboard is None:
            assert self.api is not None  # routed only with the API mounted
            self.dashboard = Dashboard(self.api, self.auth, self.origins)
        return await self.dashboard.handle(request)

    def _host_allowed(self, request: web.BaseRequest) -> bool:
        """Without an auth file, a loopback endpoint is protected only by being on
        loopback. A web page can get past that by DNS rebinding (its own name made to
        resolve to 127.0.0.1: the browser then sends it same-origin requests, the HTTP
        API included, under that name). So such an endpoint answers only requests whose
        Host header names a loopback address or localhost (or has none: not a
        browser's). With an auth file the token is the protection, and an endpoint
        beyond loopback is reached under names this node cannot know."""
        if self.auth is not None or not is_loopback(parse_addr(self.address)[0]):
            return True
        if request.path in ("/livez", "/readyz"):
            return True  # open to any probe (they tell no more than ping)
        host = request.headers.get("Host")
        if host is None:
            return True
        name = host.strip()
        if name.startswith("["):  # [::1]:port
            name = name[1 : name.find("]")] if "]" in name else name
        elif name.count(":") == 1:
            name = name.rpartition(":")[0]
        return is_loopback(name.rstrip(".").lower())

    async def _admin(self, request: web.Request) -> web.StreamResponse:
        """``/livez``, ``/readyz``, ``/status``, ``/metrics`` (GET or HEAD)."""
        path = request.path
        if request.body_exists:
            return refusal(413, "admin requests have no body")
        if path in PROTECTED and self.auth is not None:
            denied = self._check_token(request)
            if denied is not None:
                return denied
        if path == "/livez":
            return json_response(200, {"live": True})
        if path == "/readyz":
            ready, reason = readiness(self.replica(), self.max_silence)
            return json_response(200 if ready else 503, {"ready": ready, "reason": reason})
        if path == "/status":
            try:
                return json_response(200, self.status())
            except RaftLeaseError as exc:
                return error_response(exc, 503)
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _check_token(self, request: web.BaseRequest) -> web.StreamResponse | None:
        assert self.auth is not None
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        try:
            if scheme.lower() != "bearer" or not token:
                principal = None
            else:
                principal = self.auth.by_token(token.strip())
            self.auth.check_admin(principal, f"read {request.path}")
        except RaftLeaseError as exc:
            status = 401 if exc.code == "UNAUTHENTICATED" else 403
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
            return json_response(status, error_body(exc), headers)
        return None
