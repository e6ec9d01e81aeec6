"""The blocking client's direct lane: a call's first try made on the calling thread.

A blocking ``Client`` call normally hops to the client's event-loop thread and back
(``LoopPortal``): measured here, the two hops cost more client CPU than the request
itself (about 120 of the 270 µs a 1-thread renew spent in the client process, and a
wake-up of each thread on the way). The lane is one blocking socket to the node the
transport targets. A calling thread takes a free lane from the client's ``LanePool``
(made on demand, up to the client's ``lanes``; when none is free and the limit is
reached it takes the portal as before), sends its request and reads the answer on
its own thread. Only a plain success ends there: anything else (an error answer, a
redirect, a lost connection, no answer in time) is handed to ``Transport.call`` on
the event loop with the try's outcome, its client id, sequence number and deadline
(``transport.Resume``), which goes on exactly as if it had made that try itself. So
retries, redirects, deduplication and every error stay in one place (transport.py).

The lane runs ``AsyncClient`` coroutines inline on the calling thread
(``run_inline``): while a lane is active on a thread (``active``) ``AsyncClient.call``
returns the lane's answer without awaiting anything, so the coroutine finishes in
one step. Only methods whose coroutines await nothing but ``call`` take this path
(``Client._direct``).

Threads: a ``DirectLane`` is used by one calling thread at a time (``LanePool.take``
and ``give``, under the pool's lock); its socket is never touched by the event loop;
``close`` may come from any thread (``Client.close``) and wakes a call blocked on the
socket. Blocking: a try (connect, TLS handshake, token, request and answer together)
blocks the calling thread up to the call's attempt timeout
(``Transport.attempt_timeout``, capped by its deadline); a hand-over then blocks up
to the deadline. Cancellation: none, as for every blocking ``Client`` call; a
``KeyboardInterrupt`` during a try closes the lane's socket (the stream's state is
unknown) and propagates, with the request's outcome unknown.
"""

from __future__ import annotations

import contextlib
import itertools
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ..errors import (
    ConnectionLostError,
    InternalError,
    RaftLeaseError,
    TimeoutError_,
    UnavailableError,
    from_response,
)
from ..protocol import DEFAULT_MAX_FRAME, FrameDecoder, encode_frame
from .transport import Outcome, Resume, Transport

T = TypeVar("T")

_ACTIVE = threading.local()


def active(client: object) -> DirectLane | None:
    """The lane a call of ``client`` on this thread must use, or None (the loop)."""
    if getattr(_ACTIVE, "client", None) is client:
        lane: DirectLane | None = _ACTIVE.lane
        return lane
    return None


def run_inline(client: object, lane: DirectLane, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` (a coroutine of ``client`` that awaits only its ``call``) to its
    end on this thread with ``lane`` active. Raises what it raises;
    ``InternalError`` if it awaited anything else (a bug: it is closed then)."""
    _ACTIVE.client, _ACTIVE.lane = client, lane
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        _ACTIVE.client = _ACTIVE.lane = None
    coro.close()
    raise InternalError("a direct-lane call awaited the event loop")


def _readable(sock: socket.socket) -> bool:
    """Whether anything waits on a connection with nothing in flight. Only the node's
    close (EOF, e.g. its ``idle_timeout``) or a refusal of the stream can: a late
    answer never does, since a try given up on closes its connection. Either way the
    connection must not carry the next request, or a write the node never read would
    be handed over as maybe applied. ``poll``, not ``select``: any fd number."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    if not hasattr(select, "poll"):  # Windows
        return bool(select.select([sock], [], [], 0)[0])
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class DirectLane:
    """One blocking connection for first tries made on a calling thread (module doc).

    ``resume`` continues a call on the event loop from a try's outcome (the blocking
    client's portal running ``Transport.call``)."""

    def __init__(
        self,
        transport: Transport,
        resume: Callable[[Coroutine[Any, Any, Any]], Any],
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self._transport = transport
        self._on_refused = on_refused
        self._tls = transport.tls
        self._token = transport.token
        self._resume = resume
        self._sock: socket.socket | None = None
        self._addr = ""
        self._decoder = FrameDecoder(DEFAULT_MAX_FRAME * 16)
        self._ids = itertools.count(1)
        self._closed = False

    def close(self) -> None:
        """Close the lane for good (any thread, also while a call holds it): a call
        blocked on the socket wakes with a lost connection (its try is handed on as
        "maybe applied"), and no new connection is made."""
        self._closed = True
        self._drop(shutdown=True)

    def _drop(self, shutdown: bool = False) -> None:
        """Forget and close the socket. ``shutdown`` first: a thread blocked in
        ``recv`` on it is woken (close alone does not wake it on Linux)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            if shutdown:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def call(
        self, op: str, args: dict[str, Any], *, mutating: bool, timeout: float | None
    ) -> dict[str, Any]:
        """``Transport.call``, its first try made here (calling thread, lane taken).
        Raises what ``Transport.call`` raises; if the client is closed before a try
        that may have applied is settled, that try's own indefinite error."""
        transport = self._transport
        deadline = time.monotonic() + (transport.deadline if timeout is None else timeout)
        transport.check_size(op, args)
        ids = transport.sequencer if mutating else None
        seq = 0
        try:
            # Begun inside the try: a seq never ended would pin the client's ack.
            seq = ids.begin() if ids is not None else 0
            target = transport.target  # one read of a str the loop replaces whole
            attempt = min(deadline - time.monotonic(), transport.attempt_timeout)
            if attempt <= 0:  # as Transport.call: no time, no try
                raise TimeoutError_(
                    f"{op} did not complete before its deadline; outcome unknown (last: None)"
                )
            message: dict[str, Any] = {"op": op, **args}
            if ids is not None:
                message.update(cid=ids.cid, seq=seq, ack=ids.ack())
            outcome = self._try(target, message, attempt)
            if outcome.response.get("ok"):
                result: dict[str, Any] = outcome.response.get("result") or {}
                return result
            try:
                resumed: dict[str, Any] = self._resume(
                    transport.call(
                        op,
                        args,
                        mutating=mutating,
                        resume=Resume(deadline, ids, seq, target, outcome),
                    )
                )
            except UnavailableError:
                # After a try that may have applied, Transport.call never raises
                # UnavailableError (it ends in TimeoutError_ or LeaderChangedError):
                # this is the closed client's portal. "Not applied" would be a lie.
                maybe = outcome.unknown()
                if maybe is not None:
                    raise maybe from None
                raise
            return resumed
        finally:
            if ids is not None and seq:
                ids.end(seq)  # Transport.call ends it too on a resume: idempotent

    def _try(self, target: str, message: dict[str, Any], timeout: float) -> Outcome:
        """One try within ``timeout`` in all (connecting, authenticating, the
        request)."""
        ends = time.monotonic() + timeout
        try:
            self._connect(target, timeout)
        except ConnectionLostError as exc:
            return Outcome(target, unsent=exc)
        except RaftLeaseError as exc:
            return self._refused(target, exc)
        left = ends - time.monotonic()
        if left <= 0:
            self._drop()
            return Outcome(
                target, unsent=ConnectionLostError(f"connecting to {target} took the whole try")
            )
        try:
            return Outcome(target, response=self._request(message, left))
        except (ConnectionLostError, TimeoutError_) as exc:
            self._drop()  # a late answer must not be read as the next request's
            return Outcome(target, lost=exc)
        except RaftLeaseError as exc:
            return self._refused(target, exc)

    def _refused(self, target: str, exc: RaftLeaseError) -> Outcome:
        """The node refused the lane's connection itself (an answer with id None): a
        connection quota, checked before the node reads anything, or a token it does
        not accept. A node sends such a refusal only before reading a request or
        after answering every request read before it (server/node.py), so this
        request did not apply: it is handed on as unsent and ``refused``, so the
        loop tries the same node at once on the client's own connection, which may
        well carry it, or meets the same refusal and raises it, as before the lane
        existed. The pool is told (``on_refused``): it makes no lane tries to that
        node for a while."""
        if self._on_refused is not None:
            self._on_refused(target)
        return Outcome(
            target, unsent=ConnectionLostError(f"{target} refused the lane: {exc}"), refused=True
        )

    def _connect(self, addr: str, timeout: float) -> None:
        """A connection to ``addr``, authenticated when the client has a token.
        Raises ``ConnectionLostError`` if it cannot connect (nothing sent) or the
        lane was closed, or the node's refusal of the token (as ``Connection.open``)."""
        if self._sock is not None and self._addr == addr and not _readable(self._sock):
            return
        self._drop()
        if self._closed:
            raise ConnectionLostError("the client is closed")
        ends = time.monotonic() + timeout
        host, _, port = addr.rpartition(":")
        host = host.strip("[]")
        try:
            sock = socket.create_connection((host, int(port)), timeout=max(timeout, 0.001))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as asyncio does
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=host)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise ConnectionLostError(f"cannot connect to {addr}: {exc}") from None
        self._sock, self._addr = sock, addr
        if self._closed:  # closed while connecting: this socket must not outlive it
            self._drop()
            raise ConnectionLostError("the client is closed")
        self._decoder = FrameDecoder(DEFAULT_MAX_FRAME * 16)
        if self._token is not None:
            try:
                answer = self._request(
                    {"op": "auth", "token": self._token}, ends - time.monotonic()
                )
            except TimeoutError_ as exc:
                self._drop()
                raise ConnectionLostError(f"cannot connect to {addr}: {exc}") from None
            except BaseException:
                self._drop()
                raise
            if not answer.get("ok"):
                self._drop()
                raise from_response(answer)

    def _request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send ``message`` and read frames until its answer. Raises
        ``TimeoutError_`` (no answer within ``timeout``), ``ConnectionLostError``, or
        the error the node closed the stream with (as ``Connection``)."""
        sock = self._sock
        if sock is None:  # the lane was closed from another thread meanwhile
            raise ConnectionLostError(f"connection to {self._addr} closed (client closed)")
        rid = next(self._ids)
        message["id"] = rid
        ends = time.monotonic() + timeout
        try:
            sock.settimeout(max(timeout, 0.001))
            sock.sendall(encode_frame(message))
            while True:
                data = sock.recv(1 << 16)
                if not data:
                    raise ConnectionLostError(f"connection to {self._addr} lost")
                for frame in self._decoder.feed(data):
                    if frame.get("id") == rid:
                        return frame
                    if frame.get("id") is None and not frame.get("ok", True):
                        self._drop()  # the node refused the stream itself and closes it
                        raise from_response(frame)
                    # else: an answer to nothing in flight here; not ours
                sock.settimeout(max(ends - time.monotonic(), 0.001))
        except TimeoutError:  # socket.timeout
            raise TimeoutError_(f"no answer from {self._addr} within {timeout:.2f} s") from None
        except RaftLeaseError as exc:
            if isinstance(exc, ConnectionLostError | TimeoutError_):
                raise
            if self._sock is None:
                raise  # the node's own refusal, connection closed above
            self._drop()  # a malformed frame from the node
            raise ConnectionLostError(f"connection to {self._addr} lost: {exc}") from None
        except OSError as exc:
            raise ConnectionLostError(f"connection to {self._addr} lost: {exc}") from None
        except BaseException:
            self._drop()  # interrupted mid-request: the stream's state is unknown
            raise


#: Seconds a client makes no lane tries to a node after it refused a lane's
#: connection (a connection quota, ``max_connections_per_address``): meanwhile every
#: call to that node takes the client's own connection, which the node accepted,
#: instead of paying a refused connect each time. Calls to other nodes (after a
#: leader change) still take lanes: the quota is each node's own.
LANE_REST = 5.0


class LanePool:
    """The blocking client's lanes: a free one for each calling thread, made on
    demand up to ``limit`` (each holds a connection to a node of its own), the most
    recently used first (its connection is the warmest). ``take`` returns None when
    all ``limit`` lanes are busy, the pool is closed or the node the call would try
    first (the transport's current target) refused a lane less than ``LANE_REST``
    seconds ago: the call takes the portal.

    ``resume`` continues a call on the event loop (the portal's ``run``); the lanes
    look it up at each hand-over, so replacing it (a test counting hops) reaches
    every lane. Threads: any; each method holds the pool's lock briefly, never while
    connecting or waiting."""

    def __init__(
        self,
        transport: Transport,
        resume: Callable[[Coroutine[Any, Any, Any]], Any],
        limit: int,
    ) -> None:
        self.transport = transport
        self.resume = resume
        self.limit = limit
        self._idle: list[DirectLane] = []
        self._lanes: list[DirectLane] = []
        self._lock = threading.Lock()
        self._closed = False
        # Node -> time.monotonic() before which no lane tries it (a refusal).
        self._rest_until: dict[str, float] = {}

    @property
    def size(self) -> int:
        """How many lanes were made."""
        return len(self._lanes)

    def take(self) -> DirectLane | None:
        """A lane for this thread alone until ``give``, or None (use the portal)."""
        with self._lock:
            if self._closed:
                return None
            if time.monotonic() < self._rest_until.get(self.transport.target, 0.0):
                return None
            if self._idle:
                return self._idle.pop()
            if len(self._lanes) >= self.limit:
                return None
            lane = DirectLane(self.transport, self._resume, self._refused)
            self._lanes.append(lane)
            return lane

    def give(self, lane: DirectLane) -> None:
        with self._lock:
            self._idle.append(lane)

    def _resume(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.resume(coro)

    def _refused(self, target: str) -> None:
        """``target`` refused a lane's connection (any lane's thread): no lane tries
        to it for ``LANE_REST`` seconds."""
        now = time.monotonic()
        with self._lock:
            # Ended rests go first: a node's redirects can name any address, so the
            # map must not keep one entry per address ever refused.
            rests = {t: until for t, until in self._rest_until.items() if until > now}
            rests[target] = now + LANE_REST
            self._rest_until = rests

    def close(self) -> None:
        """Close every lane (any thread): calls waiting on one are woken (see
        ``DirectLane.close``), later calls take the portal (which, closed, refuses)."""
        with self._lock:
            self._closed = True
            lanes = list(self._lanes)
        for lane in lanes:
            lane.close()
