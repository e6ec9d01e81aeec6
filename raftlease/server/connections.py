"""The client port of one node: its connections, their frames and their state.

Each connection is read by one task (``ClientPort.serve``); each complete frame is
answered in a task of its own (many requests in flight on one connection, responses
carry the request id), through ``protocol.parse_request`` and the ``AuthPolicy``, then
the node's ``handle`` (or the watch hub for a ``watch``). Per connection: its
principal (from a client certificate or an ``auth`` request), its source address, its
frame and idle deadlines (conn_timer.py), its ``auth_timeout`` timer and its
long-polls (cancelled when it closes). Per node: the connection limits
(``max_connections``, ``max_connections_per_address``, ``max_connections_per_principal``,
``max_unauthenticated_connections``) and the auth policy in force (``auth``, replaced by
a reload, tls_reload.py).

Threads: the node's event loop only; nothing here blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..config import NodeConfig
from ..errors import (
    FrameTooLargeError,
    InternalError,
    QuotaExceededError,
    RaftLeaseError,
)
from ..protocol import (
    FrameBatcher,
    FrameDecoder,
    Limits,
    ProtocolError,
    Request,
    encode_frame,
    error_response,
    ok_response,
    parse_request,
    request_id,
)
from .auth import AuthPolicy, Principal
from .conn_timer import ConnectionTimer
from .metrics import NodeMetrics
from .output_gate import BULK_OPS, OutputGate
from .reads import LONG_POLL_OPS
from .watch import WatchHub

log = logging.getLogger("raftlease.server")  # the node's logger, as before the split

#: Requests in flight on one connection before the server stops reading from it.
MAX_INFLIGHT_PER_CONNECTION = 1024

#: A control operation: the raw decoded request -> its result (raises RaftLeaseError).
ControlOp = Callable[[dict[str, Any]], dict[str, Any]]


class ClientPort:
    """The connections of one node's client port (see the module docstring). Owned by
    ``NodeServer``, which hands it what a request needs: ``handle`` (execute one
    validated request), ``refuse_if_removed`` (raise once this node is removed from
    the cluster), ``revision`` (the store's revision, for a watch; raises while the
    node starts), ``control_ops`` (a test build's extra operations; empty in
    production) and ``metrics`` (None without an admin_address)."""

    def __init__(
        self,
        config: NodeConfig,
        limits: Limits,
        auth: AuthPolicy | None,
        *,
        watches: WatchHub,
        handle: Callable[[Request], Awaitable[dict[str, Any]]],
        refuse_if_removed: Callable[[], None],
        revision: Callable[[], int],
        control_ops: Mapping[str, ControlOp],
        metrics: NodeMetrics | None,
    ) -> None:
        self.config = config
        #: Who may do what on the client port (auth_file); None: no authentication.
        self.auth = auth
        self._limits = limits
        self._watches = watches
        self._handle = handle
        self._refuse_if_removed = refuse_if_removed
        self._revision = revision
        self._control_ops = control_ops
        self._metrics = metrics
        #: Open client connections (``max_connections``).
        self.count = 0
        self._principal_connections: dict[str, int] = {}
        #: Open client connections and their principal cells (an auth reload checks
        #: them), in accept order.
        self.live: dict[asyncio.StreamWriter, list[Principal | None]] = {}
        #: Each open connection's source address (max_connections_per_address), and
        #: the auth_timeout timers of those not authenticated yet (event loop).
        self._hosts: dict[asyncio.StreamWriter, str] = {}
        self._auth_timers: dict[asyncio.StreamWriter, asyncio.TimerHandle] = {}

    def unauthenticated(self) -> int:
        """Open connections not authenticated (all of them without an auth file)."""
        return sum(1 for who in self.live.values() if who[0] is None)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection, from accept to close (``asyncio.start_server``'s
        callback). Never raises: a reset or a TLS error ends the connection."""
        if self.count >= self.config.max_connections:
            self.count_closed("max_connections")
            writer.close()
            return
        self.count += 1
        decoder = FrameDecoder(self.config.max_frame)
        slots = asyncio.Semaphore(MAX_INFLIGHT_PER_CONNECTION)
        tasks: set[asyncio.Task[None]] = set()
        # Long-polls in flight: cancelled when the connection closes, so their quota
        # slots are freed then, not at their timeout (nobody reads their answer).
        polls: set[asyncio.Task[None]] = set()

        def close(limit: str, reason: str) -> None:
            log.info("client connection closed: %s", reason)
            self.count_closed(limit)
            writer.transport.abort()  # the pending read then sees the end

        deadlines = ConnectionTimer(
            asyncio.get_running_loop(),
            self.config.frame_timeout,
            self.config.idle_timeout,
            tasks,
            close,
        )
        # Unsent answers past max_conn_output: stop reading, answer nothing new.
        gate = OutputGate(writer, self.config.max_conn_output, close)

        def send(data: bytes) -> None:
            if not writer.is_closing():  # a closed transport would count and warn
                writer.write(data)

        # The answers finished in one loop turn leave in one write (protocol.py).
        out = FrameBatcher(send, asyncio.get_running_loop().call_soon)
        # The connection's principal (auth.py): from its client certificate, or set
        # by an auth request. A one-item list the request tasks share.
        who: list[Principal | None] = [None]
        self.live[writer] = who  # an auth reload re-checks it
        peer = writer.get_extra_info("peername")
        self._hosts[writer] = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        try:
            try:
                self._adopt(who, self._certificate_principal(writer))
                if who[0] is None:
                    self._admit_unauthenticated(writer)
            except QuotaExceededError as exc:
                writer.write(encode_frame(error_response(None, exc)))
                return
            self._arm_auth_deadline(writer, who)
            while True:
                await gate.room()  # a peer that does not read is not read either
                data = await reader.read(1 << 16)
                if not data:
                    break
                deadlines.active()
                frames: list[dict[str, Any]] = []
                broken: RaftLeaseError | None = None
                try:
                    frames.extend(decoder.feed(data))
                except (FrameTooLargeError, ProtocolError) as exc:
                    broken = exc  # the frames before the broken one are still answered
                deadlines.frame(decoder.pending, completed=bool(frames))
                # Several requests in one read: their answers are batched (a busy,
                # multiplexing client); one alone is answered with a write of its own.
                out.batching = len(frames) > 1
                for message in frames:
                    await slots.acquire()
                    task = asyncio.create_task(self._answer(message, writer, out, slots, who, gate))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    task.add_done_callback(deadlines.active)
                    op = message.get("op")
                    if isinstance(op, str) and op in LONG_POLL_OPS:  # a list op: no hash
                        polls.add(task)
                        task.add_done_callback(polls.discard)
                if broken is not None:
                    # The stream cannot be resynchronised: finish what came before,
                    # answer once with id None, then close.
                    await asyncio.gather(*tasks, return_exceptions=True)
                    out.write(encode_frame(error_response(None, broken)))  # after the answers
                    out.flush()
                    break
        except (OSError, asyncio.IncompleteReadError):
            # OSError: a reset, and TLS errors (ssl.SSLError), e.g. a client's data
            # after the close_notify of a connection the node is closing (an auth
            # reload): the connection is over either way.
            pass
        except asyncio.CancelledError:
            # Only the loop's shutdown cancels a connection's handler (the node stops
            # with clients connected). Ending normally: on CPython 3.11 the stream's
            # done-callback calls task.exception() on a cancelled handler, which
            # logs the CancelledError as an ERROR with a traceback (gh-113538).
            pass
        finally:
            deadlines.stop()
            out.flush()
            for task in list(polls):
                task.cancel()
            self.count -= 1
            self.live.pop(writer, None)
            self._hosts.pop(writer, None)
            timer = self._auth_timers.pop(writer, None)
            if timer is not None:
                timer.cancel()
            self._adopt(who, None)
            self._watches.end_for(writer)  # frees their watch quota slots now
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()

    def _admit_unauthenticated(self, writer: asyncio.StreamWriter) -> None:
        """A new connection that is not authenticated (no client certificate; without
        an auth file, every connection). Raises ``QuotaExceededError`` (the caller
        answers it and closes) when its address already has
        ``max_connections_per_address`` such connections; with an auth file also when
        ``max_unauthenticated_connections`` are open and no other address holds more
        of them than this one. If one does, its oldest unauthenticated connection is
        closed to make room: a stranger's flood from one address cannot keep other
        addresses' clients from connecting and authenticating."""
        config = self.config
        host = self._hosts.get(writer, "?")
        others = [w for w, who in self.live.items() if who[0] is None and w is not writer]
        by_host: dict[str, int] = {}
        for other in others:
            name = self._hosts.get(other, "?")
            by_host[name] = by_host.get(name, 0) + 1
        mine = by_host.get(host, 0)
        if mine >= config.max_connections_per_address:
            log.info("client connection from %s refused: max_connections_per_address", host)
            self.count_closed("max_connections_per_address")
            raise QuotaExceededError(
                f"{mine} connections from {host} have not authenticated "
                f"(max_connections_per_address is {config.max_connections_per_address})"
            )
        if self.auth is None or len(others) < config.max_unauthenticated_connections:
            return
        heaviest = max(by_host, key=lambda name: by_host[name])
        if by_host[heaviest] <= mine:
            log.info("client connection from %s refused: max_unauthenticated_connections", host)
            self.count_closed("max_unauthenticated_connections")
            raise QuotaExceededError(
                f"{len(others)} connections have not authenticated "
                f"(max_unauthenticated_connections is {config.max_unauthenticated_connections})"
            )
        # _live keeps accept order: the first of the heaviest address is its oldest.
        victim = next(w for w in others if self._hosts.get(w) == heaviest)
        log.info(
            "unauthenticated client connection from %s closed to admit one from %s "
            "(max_unauthenticated_connections)",
            heaviest,
            host,
        )
        self.live.pop(victim, None)  # counted no more, though its task ends later
        victim.transport.abort()
        self.count_closed("evicted")

    def count_closed(self, limit: str) -> None:
        """Count a connection refused or closed by a connection limit (metrics)."""
        if self._metrics is not None:
            self._metrics.connections_closed.labels(limit).inc()

    def _arm_auth_deadline(self, writer: asyncio.StreamWriter, who: list[Principal | None]) -> None:
        """With an auth file: close the connection if it is still not authenticated
        ``auth_timeout`` from now (a failed ``auth`` does not move a deadline already
        set). Event loop."""
        if self.auth is None or who[0] is not None or writer in self._auth_timers:
            return
        loop = asyncio.get_running_loop()
        self._auth_timers[writer] = loop.call_later(
            self.config.auth_timeout, self._auth_deadline_passed, writer, who
        )

    def _auth_deadline_passed(
        self, writer: asyncio.StreamWriter, who: list[Principal | None]
    ) -> None:
        self._auth_timers.pop(writer, None)
        if who[0] is None and writer in self.live:
            log.info(
                "client connection from %s closed: not authenticated within %.0f s",
                self._hosts.get(writer, "?"),
                self.config.auth_timeout,
            )
            writer.transport.abort()
            self.count_closed("auth_timeout")

    def _certificate_principal(self, writer: asyncio.StreamWriter) -> Principal | None:
        """The principal a verified client certificate names (its common name)."""
        if self.auth is None:
            return None
        cert = writer.get_extra_info("peercert")
        if not cert:
            return None
        for rdn in cert.get("subject", ()):
            for name, value in rdn:
                if name == "commonName":
                    return self.auth.by_certificate(str(value))
        return None

    async def _answer(
        self,
        message: dict[str, Any],
        writer: asyncio.StreamWriter,
        out: FrameBatcher,
        slots: asyncio.Semaphore,
        who: list[Principal | None],
        gate: OutputGate,
    ) -> None:
        metrics = self._metrics
        started = time.perf_counter() if metrics is not None else 0.0
        code: str | None = None
        try:
            rid = request_id(message)
            try:
                op = message.get("op")
                # Test builds only (ServerHooks.control_ops is empty in production); an
                # op that is no string (a list, a map) is left to the protocol's answer.
                control = self._control_ops.get(op) if isinstance(op, str) else None
                if control is not None and rid is not None:
                    if self.auth is not None:
                        self.auth.check_admin(who[0], str(op))
                    response = ok_response(rid, control(message))
                else:
                    request = parse_request(message, self._limits)
                    if request.op == "auth":
                        try:
                            response = ok_response(request.id, self._authenticate(request, who))
                        finally:
                            # Unauthenticated again (a refused token): a deadline anew.
                            self._arm_auth_deadline(writer, who)
                        out.write(encode_frame(response))
                        await writer.drain()
                        return
                    if self.auth is not None:
                        self.auth.check(who[0], request)
                        if who[0] is not None:
                            request = dataclasses.replace(request, principal=who[0].name)
                    if request.op == "watch":
                        self._refuse_if_removed()
                        # UNAVAILABLE (definite, retried) until the node's state is
                        # restored: a watch accepted at revision 0 on a node still
                        # loading its snapshot would skip the history it covers.
                        self._revision()
                        with contextlib.suppress(ConnectionError):  # watcher gone or dropped
                            await self._watches.stream(
                                request,
                                writer,
                                self._revision,
                                request.principal,
                            )
                        return
                    if request.op in BULK_OPS:
                        # A list answer is built only when there is room for it, one
                        # at a time, and written before the next is built.
                        async with gate.bulk:
                            await gate.room()
                            response = ok_response(request.id, await self._handle(request))
                            out.write(encode_frame(response))
                            out.flush()  # in the transport now: the gate counts it
                            return
                    if request.op not in LONG_POLL_OPS:
                        await gate.room()
                    result = await self._handle(request)
                    if request.op == "status" and self.auth is not None:
                        result = self.auth.status_view(who[0], result)  # admin: all of it
                    response = ok_response(request.id, result)
            except RaftLeaseError as exc:
                response = error_response(rid, exc)
                code = exc.code
            except ConnectionError:
                raise  # the connection is gone (or closed by its output bound)
            except Exception:  # never let a bug take the node down
                log.exception("request handler failed")
                response = error_response(rid, InternalError("request handler failed"))
                code = "INTERNAL"
            if not writer.is_closing():
                out.write(encode_frame(response))
                await writer.drain()
        except (ConnectionError, RuntimeError):
            pass
        finally:
            slots.release()
            if metrics is not None:
                metrics.observe_request(message.get("op"), time.perf_counter() - started, code)

    def _authenticate(self, request: Request, who: list[Principal | None]) -> dict[str, Any]:
        """An ``auth`` request: the token's principal becomes the connection's.
        Raises ``UnauthenticatedError`` (the connection's principal is then cleared)."""
        if self.auth is None:
            return {"principal": None, "auth": "off"}
        try:
            principal = self.auth.by_token(request.args["token"])
        except RaftLeaseError:
            self._adopt(who, None)
            log.warning("client authentication failed (unknown token)")
            raise
        self._adopt(who, principal)
        return {"principal": principal.name}

    def _adopt(self, who: list[Principal | None], principal: Principal | None) -> None:
        """Make ``principal`` the connection's, counting connections per principal.
        Raises ``QuotaExceededError`` (the connection is then unauthenticated) when
        the principal already has ``max_connections_per_principal``."""
        counts = self._principal_connections
        old = who[0]
        if old is not None:
            counts[old.name] -= 1
            if counts[old.name] <= 0:
                del counts[old.name]
        who[0] = None
        if principal is None:
            return
        limit = self.config.max_connections_per_principal
        if counts.get(principal.name, 0) >= limit:
            raise QuotaExceededError(
                f"{principal.name} already has {limit} connections to this node"
            )
        counts[principal.name] = counts.get(principal.name, 0) + 1
        who[0] = principal

    def close_untrusted(self, trusted: Callable[[bytes], bool]) -> int:
        """After a reload removed a client CA: close every open client connection
        whose certificate no CA in the new file issued (its principal could not
        connect again). Returns how many were closed."""
        closed = 0
        for writer in list(self.live):
            ssl_object = writer.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
            if der and not trusted(der):
                closed += 1
                writer.close()
        return closed

    def adopt_policy(self, policy: AuthPolicy) -> int:
        """An auth reload: ``policy`` is in force from now on, and every open
        connection is checked against it (``_recheck``); those it no longer admits are
        closed. Returns how many were closed."""
        self.auth = policy
        closed = 0
        for writer, who in list(self.live.items()):
            if not self._recheck(who, writer):
                closed += 1
                writer.close()
        return closed

    def _recheck(self, who: list[Principal | None], writer: asyncio.StreamWriter) -> bool:
        """After an auth reload: give the connection its principal as the new policy
        has it. False (and the connection unauthenticated) if the principal is gone or
        its token was replaced and no client certificate names it."""
        old = who[0]
        if old is None or self.auth is None:
            return True
        new = self.auth.principals.get(old.name)
        by_cert = self._certificate_principal(writer)
        if new is not None and (
            new.token_sha256 == old.token_sha256 or (by_cert is not None and by_cert is new)
        ):
            who[0] = new  # same name: the connection count stays
            return True
        self._adopt(who, None)
        return False
