"""Python clients: ``AsyncClient`` (asyncio) and ``Client`` (blocking, thread-safe).

Both find the leader themselves from any endpoint, follow ``NOT_LEADER`` redirects,
and retry through elections and dead nodes until the call's deadline. Retrying a
mutating request is safe because every one carries the client's session id and a
sequence number that the state machine deduplicates (Raft dissertation §6.3); a
retried acquire can never grant twice.

Errors: every failure raises a ``RaftLeaseError`` subclass. ``err.definite`` is True
when the request certainly did not take effect (``LeaseHeldError``, ``NotOwnerError``,
a rejected argument...). A ``TimeoutError_`` / ``LeaderChangedError`` after the deadline
means the outcome is unknown: an acquire may have been granted (it then expires after
its TTL unless renewed).

The blocking ``Client`` runs an ``AsyncClient`` on a private event-loop thread; any
number of threads may call it at once and their requests are pipelined on one
connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import random
import secrets
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from .errors import (
    ConnectionLostError,
    InvalidArgumentError,
    LeaderChangedError,
    LeaseHeldError,
    NotLeaderError,
    RaftLeaseError,
    SessionExpiredError,
    TimeoutError_,
    UnavailableError,
    from_wire,
)
from .protocol import DEFAULT_MAX_FRAME, FrameDecoder, encode_frame

if TYPE_CHECKING:
    from .election import AsyncElection, Election
    from .locks import AsyncHeldLock, HeldLock
    from .sessions import AsyncSession, Session

T = TypeVar("T")

log = logging.getLogger("raftlease.client")

DEFAULT_DEADLINE = 15.0
DEFAULT_ATTEMPT_TIMEOUT = 3.0
DEFAULT_CLOCK_DRIFT = 0.01
DEFAULT_MARGIN = 0.05
MAX_BACKOFF = 0.1
#: Capacity of a read/write lock key: a reader takes one unit, a writer all of them.
RW_CAPACITY = 1_000_000


class Attachable(Protocol):
    """A live lease session as seen by a lease attached to it (``AsyncSession`` or
    ``Session``): the lease is valid exactly as long as the session."""

    @property
    def session_id(self) -> str: ...

    @property
    def owner(self) -> str: ...

    @property
    def valid_until(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease this client holds.

    ``valid_until`` is on this process's ``time.monotonic()`` clock: the lease is
    trusted until ``send_time + ttl * (1 - clock_drift) - margin``, counted from when the
    request was first sent, so the client never believes it holds a lease the cluster
    has already expired. ``lease_id`` is the secret that proves ownership for renew and
    release; do not share it. ``token`` is the fencing token to hand to any resource the
    lease protects.
    """

    key: str
    owner: str
    token: int
    ttl: float
    lease_id: str
    valid_until: float
    expires_at_ms: int
    #: Units of the key's capacity it takes (1 for a plain lock).
    units: int = 1
    #: The value it publishes (an elected leader's address), "" for none.
    value: str = ""
    #: The lease session it is attached to; its validity is then the session's.
    session: Attachable | None = field(default=None, compare=False, repr=False)

    @property
    def trusted_until(self) -> float:
        """``valid_until``, or the session's for an attached lease (kept alive by the
        session's keep-alive, not by renewals of its own)."""
        if self.session is not None:
            # The cluster extends an attached lease with every keep-alive of its
            # session, to the session's expiry: the session's window is the lease's.
            return self.session.valid_until
        return self.valid_until

    @property
    def remaining(self) -> float:
        """Seconds this client may still trust the lease (0 when no longer valid)."""
        return max(0.0, self.trusted_until - time.monotonic())

    @property
    def valid(self) -> bool:
        return time.monotonic() < self.trusted_until


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a key, as seen by the cluster at read time. No lease id."""

    key: str
    owner: str
    token: int
    ttl: float
    remaining: float
    units: int = 1
    value: str = ""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change seen by a watch: ``type`` is grant, renew, release, expire,
    transfer (the end of a lease handed to a new owner; its grant follows) or proclaim
    (a holder changed the value it publishes)."""

    type: str
    key: str
    owner: str
    token: int
    revision: int
    value: str = ""
    #: Units of the key's capacity the lease takes (1 for a plain lock).
    units: int = 1


@dataclass(frozen=True, slots=True)
class Read:
    """A read of one key and how it was served.

    ``consistency`` is what the server actually did: ``"lease"`` (leader memory under a
    valid leader lease), ``"log"`` (through the Raft log) or ``"stale"``. For stale reads
    ``applied_index`` is the serving node's applied Raft index and ``age`` how many
    seconds old its view may be (None if it never heard from a leader).
    """

    holder: Holder | None
    consistency: str
    served_by: str
    applied_index: int | None = None
    age: float | None = None
    #: Every live holder (for a shared key; the one holder of a plain lock).
    holders: tuple[Holder, ...] = ()
    #: The key's capacity and units in use (1 and 0 or 1 for a plain lock).
    capacity: int = 1
    used: int = 0
    #: The store revision the answer reflects (exact for reads through the log).
    revision: int | None = None


CONSISTENCY_MODES = ("linearizable", "log", "stale")


def _check_consistency(mode: str) -> None:
    if mode not in CONSISTENCY_MODES:
        raise InvalidArgumentError(f"consistency {mode!r} is not one of {list(CONSISTENCY_MODES)}")


def _holder(data: dict[str, Any]) -> Holder:
    return Holder(
        key=data["key"],
        owner=data["owner"],
        token=int(data["token"]),
        ttl=data["ttl"] / 1000.0,
        remaining=max(0.0, data["remaining"] / 1000.0),
        units=int(data.get("units", 1)),
        value=str(data.get("value", "")),
    )


class _Connection:
    """One TCP connection with many requests in flight, matched by id."""

    def __init__(self, addr: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.addr = addr
        self._reader = reader
        self._writer = writer
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._streams: dict[int, asyncio.Queue[dict[str, Any] | RaftLeaseError]] = {}
        self._ids = itertools.count(1)
        self._decoder = FrameDecoder(DEFAULT_MAX_FRAME * 16)
        self.closed = False
        self._task = asyncio.create_task(self._read_loop())

    @classmethod
    async def open(cls, addr: str, timeout: float) -> _Connection:
        host, _, port = addr.rpartition(":")
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port)), timeout
        )
        return cls(addr, reader, writer)

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self._reader.read(1 << 16)
                if not data:
                    break
                for frame in self._decoder.feed(data):
                    rid = frame.get("id")
                    stream = self._streams.get(rid)  # type: ignore[arg-type]
                    if stream is not None:
                        stream.put_nowait(frame)
                        continue
                    if rid is None and not frame.get("ok", True):
                        # The server rejected the stream itself (e.g. an oversized
                        # frame) and closes it: every request on it gets that error.
                        self._fail_all(
                            from_wire(
                                str(frame.get("code")),
                                str(frame.get("message")),
                                frame.get("detail"),
                            )
                        )
                        return
                    future = self._pending.pop(rid, None)  # type: ignore[arg-type]
                    if future is not None and not future.done():
                        future.set_result(frame)
        except (ConnectionError, RaftLeaseError, OSError):
            pass
        finally:
            self._fail_all()

    def _fail_all(self, error: RaftLeaseError | None = None) -> None:
        self.closed = True
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.put_nowait(error or ConnectionLostError(f"connection to {self.addr} lost"))
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(
                    error or ConnectionLostError(f"connection to {self.addr} lost")
                )
        with contextlib.suppress(Exception):
            self._writer.close()

    async def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.closed:
            raise ConnectionLostError(f"connection to {self.addr} is closed")
        rid = next(self._ids)
        message["id"] = rid
        frame = encode_frame(message)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            self._writer.write(frame)
            await self._writer.drain()
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise TimeoutError_(f"no answer from {self.addr} within {timeout:.2f} s") from None
        except (ConnectionError, OSError) as exc:
            self._fail_all()
            raise ConnectionLostError(f"connection to {self.addr} lost: {exc}") from None
        finally:
            self._pending.pop(rid, None)

    def open_stream(
        self, message: dict[str, Any]
    ) -> tuple[int, asyncio.Queue[dict[str, Any] | RaftLeaseError]]:
        """Send a request whose answers keep coming (a watch); they arrive in the
        returned queue, an error instance when the connection ends."""
        if self.closed:
            raise ConnectionLostError(f"connection to {self.addr} is closed")
        rid = next(self._ids)
        message["id"] = rid
        queue: asyncio.Queue[dict[str, Any] | RaftLeaseError] = asyncio.Queue()
        self._streams[rid] = queue
        self._writer.write(encode_frame(message))
        return rid, queue

    def close_stream(self, rid: int) -> None:
        self._streams.pop(rid, None)

    async def close(self) -> None:
        self._task.cancel()
        self._fail_all()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


class _Session:
    """A client session for deduplicated retries (Raft dissertation §6.3): a random id,
    a sequence number per mutating request, and the requests still awaiting an answer
    (every seq below the smallest of them is acknowledged to the cluster)."""

    def __init__(self) -> None:
        self.cid = secrets.token_hex(16)
        self._seq = itertools.count(1)
        self._outstanding: set[int] = set()
        self._heap: list[int] = []  # outstanding seqs, ended ones removed lazily

    def begin(self) -> int:
        seq = next(self._seq)
        self._outstanding.add(seq)
        heapq.heappush(self._heap, seq)
        return seq

    def end(self, seq: int) -> None:
        self._outstanding.discard(seq)

    def ack(self) -> int:
        heap = self._heap
        while heap[0] not in self._outstanding:
            heapq.heappop(heap)
        return heap[0]


L = TypeVar("L")


class _SharedKeyLocks(Generic[L]):
    """Held locks on shared keys, for both clients (``L``: the lock type their
    ``lock`` returns): each is ``lock`` with a capacity and units."""

    def lock(self, key: str, **options: Any) -> L:
        raise NotImplementedError

    def semaphore(self, key: str, *, limit: int, **options: Any) -> L:
        """One of ``limit`` slots of ``key`` (every user gives the same ``limit``)."""
        return self.lock(key, capacity=limit, units=1, **options)

    def pool(self, key: str, *, capacity: int, units: int, **options: Any) -> L:
        """``units`` of a pool of ``capacity`` units (a job taking 2 of 8 GPUs)."""
        return self.lock(key, capacity=capacity, units=units, **options)

    def read_lock(self, key: str, **options: Any) -> L:
        """Shared with other readers; waits behind a queued writer (no starvation)."""
        return self.lock(key, capacity=RW_CAPACITY, units=1, **options)

    def write_lock(self, key: str, **options: Any) -> L:
        """Exclusive: no reader and no other writer while held."""
        return self.lock(key, capacity=RW_CAPACITY, units=RW_CAPACITY, **options)


class AsyncClient(_SharedKeyLocks["AsyncHeldLock"]):
    """asyncio client. Create it inside a running loop; use ``async with`` or
    ``await close()``. All methods are coroutines; cancellation of a call leaves the
    outcome unknown, exactly like a timeout.

    ``deadline``: total seconds a call may take, retries included (per call override:
    ``timeout=``). ``clock_drift`` and ``margin`` shape ``Lease.valid_until``.
    """

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        *,
        deadline: float = DEFAULT_DEADLINE,
        attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT,
        clock_drift: float = DEFAULT_CLOCK_DRIFT,
        margin: float = DEFAULT_MARGIN,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
        if not endpoints:
            raise InvalidArgumentError("at least one endpoint is required")
        self.endpoints = list(endpoints)
        self.deadline = deadline
        self.attempt_timeout = attempt_timeout
        self.clock_drift = clock_drift
        self.margin = margin
        self._session = _Session()
        self._target: str = self.endpoints[0]
        self._conns: dict[str, _Connection] = {}
        self._connect_lock = asyncio.Lock()
        self._rotation = itertools.cycle(self.endpoints)
        #: Open lease sessions, whose keep-alive tasks stop when the client closes.
        self._sessions: weakref.WeakSet[AsyncSession] = weakref.WeakSet()

    @property
    def client_id(self) -> str:
        """The id of the client session that deduplicates retries."""
        return self._session.cid

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections. Open lease sessions stop their keep-alives (they are
        not closed on the cluster: their leases expire after the session TTL); close
        sessions first to release their leases at once."""
        for session in list(self._sessions):
            await session.stop_keepalive()
        conns, self._conns = self._conns, {}
        for conn in conns.values():
            await conn.close()

    # ------------------------------------------------------------ plumbing

    async def _connection(self, addr: str, timeout: float) -> _Connection:
        async with self._connect_lock:
            conn = self._conns.get(addr)
            if conn is None or conn.closed:
                try:
                    conn = await _Connection.open(addr, timeout)
                except (OSError, TimeoutError) as exc:
                    raise ConnectionLostError(f"cannot connect to {addr}: {exc}") from None
                self._conns[addr] = conn
            return conn

    def _next_endpoint(self) -> str:
        return next(self._rotation)

    async def call(
        self, op: str, args: dict[str, Any], *, mutating: bool, timeout: float | None = None
    ) -> dict[str, Any]:
        """Send one request, retrying until the deadline. Returns the result map."""
        deadline = time.monotonic() + (self.deadline if timeout is None else timeout)
        # Refuse a request the server would reject as an oversized frame (it would
        # close the connection every pipelined request shares) before sending it.
        if sum(len(v) for v in args.values() if isinstance(v, str)) > 4096:
            size = len(encode_frame({"op": op, **args}))
            if size > DEFAULT_MAX_FRAME:
                raise InvalidArgumentError(
                    f"request of {size} bytes exceeds the frame limit of {DEFAULT_MAX_FRAME}"
                )
        session = self._session if mutating else None
        seq = session.begin() if session is not None else 0
        backoff = 0.02
        last: RaftLeaseError | None = None
        maybe_applied = False
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                target = self._target
                message: dict[str, Any] = {"op": op, **args}
                if session is not None:
                    message.update(cid=session.cid, seq=seq, ack=session.ack())
                attempt = min(remaining, self.attempt_timeout)
                try:
                    conn = await self._connection(target, attempt)
                except ConnectionLostError as exc:  # never sent: nothing can have applied
                    last = exc
                    self._target = self._next_endpoint()
                else:
                    try:
                        response = await conn.request(message, attempt)
                    except (ConnectionLostError, TimeoutError_) as exc:
                        # The request may have reached the node: outcome unknown.
                        maybe_applied = True
                        last = exc
                        self._target = self._next_endpoint()
                    else:
                        if response.get("ok"):
                            result: dict[str, Any] = response.get("result") or {}
                            return result
                        last = from_wire(
                            str(response.get("code")),
                            str(response.get("message")),
                            response.get("detail"),
                        )
                        if isinstance(last, NotLeaderError) and last.leader not in (None, target):
                            self._target = str(last.leader)
                            continue  # redirect at once
                        if isinstance(last, SessionExpiredError) and session is not None:
                            # Our session was evicted while idle: nothing of this
                            # request can have applied (applying refreshes a session).
                            # Continue under a fresh session.
                            session.end(seq)
                            session = self._renew_session(session)
                            seq = session.begin()
                            continue
                        if last.definite and not isinstance(
                            last, NotLeaderError | UnavailableError
                        ):
                            raise last
                        # Not the leader, unavailable, or indefinite (commit timeout,
                        # leader change: maybe a deposed leader that cannot commit):
                        # retry, deduplicated by the session, on the next endpoint.
                        maybe_applied = maybe_applied or not last.definite
                        self._target = self._next_endpoint()
                await asyncio.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
                # Capped low: while a leader is being elected the next try should come
                # soon after it is (failover time is election + this backoff).
                backoff = min(backoff * 2, MAX_BACKOFF) * (0.75 + random.random() / 2)
        finally:
            if session is not None:
                session.end(seq)
        if maybe_applied or last is None:
            cls: type[RaftLeaseError] = (
                LeaderChangedError if isinstance(last, LeaderChangedError) else TimeoutError_
            )
            raise cls(f"{op} did not complete before its deadline; outcome unknown (last: {last})")
        raise UnavailableError(f"{op} failed before its deadline: {last}")

    def _renew_session(self, expired: _Session) -> _Session:
        if self._session is expired:
            self._session = _Session()
            log.warning(
                "client session %s expired on the cluster; continuing as %s",
                expired.cid,
                self._session.cid,
            )
        return self._session

    # ----------------------------------------------------------------- API

    def _lease(
        self,
        result: dict[str, Any],
        sent: float,
        remaining: float | None = None,
        session: Attachable | None = None,
    ) -> Lease:
        """``remaining``: log-time seconds left when the server answered (default: what
        the result says, ``expires_at - now``: the full TTL for a lease granted or
        renewed by the request sent at ``sent``, less for a lease attached to a session
        that was last kept alive before it)."""
        ttl = result["ttl"] / 1000.0
        if remaining is None and isinstance(result.get("now"), int):
            remaining = (int(result["expires_at"]) - int(result["now"])) / 1000.0
        window = ttl if remaining is None else min(ttl, remaining)
        return Lease(
            key=result["key"],
            owner=result["owner"],
            token=int(result["token"]),
            ttl=ttl,
            lease_id=result["lease_id"],
            valid_until=self.valid_until(sent, window),
            expires_at_ms=int(result["expires_at"]),
            units=int(result.get("units", 1)),
            value=str(result.get("value", "")),
            session=session,
        )

    def valid_until(self, sent: float, seconds: float) -> float:
        """Until when (``time.monotonic()``) this client trusts something the cluster
        keeps for ``seconds`` of log time from a request first sent at ``sent``."""
        return sent + seconds * (1 - self.clock_drift) - self.margin

    async def acquire(
        self,
        key: str,
        *,
        owner: str | None = None,
        ttl: float | None = None,
        wait: float = 0.0,
        priority: int = 0,
        capacity: int = 1,
        units: int = 1,
        value: str | None = None,
        session: Attachable | None = None,
        timeout: float | None = None,
    ) -> Lease:
        """Take ``key`` for ``owner`` for ``ttl`` seconds, or for as long as the lease
        ``session`` lives (then ``owner`` defaults to the session's and ``ttl`` must
        not be given: the session's keep-alive keeps the lease).

        With ``wait=0`` (default) raises ``LeaseHeldError`` (definite) at once if the
        key is taken. With ``wait > 0`` the request joins the key's queue in the
        replicated state (higher ``priority`` first, first come first served within a
        priority; nobody overtakes the head) and the call blocks until it is granted,
        in the same log entry that frees the units, or until ``wait`` seconds pass:
        then the queued request is withdrawn and ``LeaseHeldError`` is raised.
        Cancelling the call withdraws it too (best effort).

        Shared keys: ``capacity`` is the key's size (a semaphore of N slots, a pool of
        N units; every user of the key must give the same, else
        ``CapacityMismatchError``), ``units`` how many this lease takes. ``value`` is
        published with the lease (see ``election``). An acquire attached to a session
        that ends while it waits raises ``SessionNotFoundError``.
        """
        if session is not None:
            if ttl is not None:
                raise InvalidArgumentError("give ttl or session, not both")
            owner = owner or session.owner
        elif ttl is None:
            raise InvalidArgumentError("ttl is required (or attach the lease to a session)")
        if not owner:
            raise InvalidArgumentError("owner is required")
        sent = time.monotonic()
        args: dict[str, Any] = {"key": key, "owner": owner}
        if session is not None:
            args["session"] = session.session_id
        else:
            args["ttl"] = ttl
        if wait > 0:
            args["wait"] = wait
            if priority:
                args["priority"] = priority
        if capacity != 1 or units != 1:
            args.update(capacity=capacity, units=units)
        if value is not None:
            args["value"] = value
        result = await self.call("acquire", args, mutating=True, timeout=timeout)
        if not result.get("queued"):
            return self._lease(result, sent, session=session)
        return await self._await_grant(key, result["lease_id"], sent + wait, session)

    async def _await_grant(
        self, key: str, lease_id: str, until: float, session: Attachable | None
    ) -> Lease:
        """Long-poll the leader until our queued acquire is granted or gone."""
        try:
            while (left := until - time.monotonic()) > 0:
                sent = time.monotonic()
                # The server holds the poll at most half an attempt, so a poll that
                # simply waits is never mistaken for a dead node.
                hold = min(left, self.attempt_timeout / 2)
                status = await self.call(
                    "await_lease",
                    {"key": key, "lease_id": lease_id, "timeout": hold},
                    mutating=False,
                    timeout=hold + self.attempt_timeout,
                )
                if status["state"] == "held":
                    remaining = (status["expires_at"] - status["now"]) / 1000.0
                    return self._lease(status, sent, remaining=remaining, session=session)
                if status["state"] == "gone":
                    if session is not None:
                        # Dropped at its deadline, or because its session ended? A
                        # keep-alive of the session tells (SessionNotFoundError).
                        await self.call(
                            "session_keepalive",
                            {"session_id": session.session_id},
                            mutating=True,
                            timeout=self.attempt_timeout,
                        )
                    break
        except BaseException:
            await self._withdraw(key, lease_id)
            raise
        await self._withdraw(key, lease_id)
        raise LeaseHeldError(f"{key!r} was not granted within the wait", {"key": key})

    async def _withdraw(self, key: str, lease_id: str) -> None:
        """Leave the queue, or release the lease if it was granted meanwhile."""
        with contextlib.suppress(RaftLeaseError):
            await self.call(
                "release", {"key": key, "lease_id": lease_id}, mutating=True, timeout=5.0
            )

    async def transfer(
        self, lease: Lease, *, owner: str, ttl: float | None = None, timeout: float | None = None
    ) -> Lease:
        """Hand ``lease`` to ``owner`` atomically: the returned lease (new lease id, new
        fencing token) starts in the same log entry that ends ours, so no third party
        can take the key in between. Give the returned lease to the new owner."""
        sent = time.monotonic()
        args: dict[str, Any] = {"key": lease.key, "lease_id": lease.lease_id, "owner": owner}
        if ttl is not None:
            args["ttl"] = ttl
        result = await self.call("transfer", args, mutating=True, timeout=timeout)
        return self._lease(result, sent)

    async def proclaim(self, lease: Lease, value: str, *, timeout: float | None = None) -> Lease:
        """Publish a new ``value`` with a held lease (an elected leader's new address);
        watchers see a ``proclaim`` event. The fencing token stays the same."""
        result = await self.call(
            "proclaim",
            {"key": lease.key, "lease_id": lease.lease_id, "value": value},
            mutating=True,
            timeout=timeout,
        )
        return replace(lease, value=str(result.get("value", "")))

    async def fence(
        self,
        key: str,
        token: int,
        *,
        consistency: str = "linearizable",
        timeout: float | None = None,
    ) -> bool:
        """Is ``token`` the fencing token of the current holder of ``key``?"""
        _check_consistency(consistency)
        result = await self.call(
            "fence",
            {"key": key, "token": token, "consistency": consistency},
            mutating=False,
            timeout=timeout,
        )
        return bool(result.get("current"))

    def lock(self, key: str, **options: Any) -> AsyncHeldLock:
        """``async with client.lock(key, owner=..., ttl=...) as held:`` acquires (waiting
        up to ``wait``), renews in the background every ``ttl / 3``, and releases on
        exit. Options: those of ``acquire`` (``session=`` attaches it to a lease
        session instead of renewing it) and ``on_lost``. See ``raftlease.locks``."""
        from .locks import AsyncHeldLock

        return AsyncHeldLock(self, key, **options)

    def session(
        self,
        *,
        owner: str,
        ttl: float,
        on_lost: Callable[[str], None] | None = None,
        on_jeopardy: Callable[[str], None] | None = None,
    ) -> AsyncSession:
        """A lease session: ``async with client.session(owner=..., ttl=10) as s:``.
        Leases acquired with ``session=s`` (or ``s.acquire``/``s.lock``) are kept
        alive by its one keep-alive and released when it ends. See
        ``raftlease.sessions``."""
        from .sessions import AsyncSession

        return AsyncSession(self, owner=owner, ttl=ttl, on_lost=on_lost, on_jeopardy=on_jeopardy)

    def election(self, name: str) -> AsyncElection:
        """Leader election on key ``name``: campaign, leader, observe, proclaim,
        resign. See ``raftlease.election``."""
        from .election import AsyncElection

        return AsyncElection(self, name)

    async def renew(
        self, lease: Lease, *, ttl: float | None = None, timeout: float | None = None
    ) -> Lease:
        """Extend ``lease`` by its TTL (or a new ``ttl``) from now. Raises
        ``LeaseNotFoundError`` if it already expired, ``NotOwnerError`` if the key is
        held under another lease."""
        sent = time.monotonic()
        args: dict[str, Any] = {"key": lease.key, "lease_id": lease.lease_id}
        if ttl is not None:
            args["ttl"] = ttl
        result = await self.call("renew", args, mutating=True, timeout=timeout)
        renewed = self._lease(result, sent)
        return replace(
            lease,
            ttl=renewed.ttl,
            valid_until=renewed.valid_until,
            expires_at_ms=renewed.expires_at_ms,
        )

    async def release(self, lease: Lease, *, timeout: float | None = None) -> None:
        """Give ``lease`` up. Raises ``LeaseNotFoundError`` if it had already expired."""
        await self.call(
            "release",
            {"key": lease.key, "lease_id": lease.lease_id},
            mutating=True,
            timeout=timeout,
        )

    async def read(
        self, key: str, *, consistency: str = "linearizable", timeout: float | None = None
    ) -> Read:
        """Who holds ``key``, with how the answer was served (see ``Read``).

        ``consistency``: ``"linearizable"`` (default; the leader answers from memory
        while it holds a valid leader lease, otherwise through the log), ``"log"``
        (always through the Raft log), or ``"stale"`` (whichever node the client is
        connected to answers at once from its own state; may be out of date, and says
        how old it may be).
        """
        _check_consistency(consistency)
        result = await self.call(
            "holder", {"key": key, "consistency": consistency}, mutating=False, timeout=timeout
        )
        data = result.get("holder")
        holder = _holder(data) if data else None
        if data and "holders" in data:
            holders = tuple(_holder(item) for item in data["holders"])
        else:
            holders = (holder,) if holder is not None else ()
        return Read(
            holder=holder,
            consistency=str(result.get("consistency", "log")),
            served_by=str(result.get("served_by", "")),
            applied_index=result.get("applied_index"),
            age=result.get("age"),
            holders=holders,
            capacity=int(data.get("capacity", 1)) if data else 1,
            used=int(data.get("used", 1)) if data else 0,
            revision=result.get("revision"),
        )

    async def holder(
        self, key: str, *, consistency: str = "linearizable", timeout: float | None = None
    ) -> Holder | None:
        """Who holds ``key`` now, or None. See ``read`` for ``consistency``."""
        return (await self.read(key, consistency=consistency, timeout=timeout)).holder

    async def leases(
        self,
        prefix: str = "",
        *,
        limit: int = 1000,
        consistency: str = "linearizable",
        timeout: float | None = None,
    ) -> list[Holder]:
        """Live leases whose key starts with ``prefix``, sorted by key."""
        _check_consistency(consistency)
        result = await self.call(
            "leases",
            {"prefix": prefix, "limit": limit, "consistency": consistency},
            mutating=False,
            timeout=timeout,
        )
        return [_holder(item) for item in result.get("leases", [])]

    async def watch(
        self, prefix: str = "", *, from_revision: int = 0
    ) -> AsyncGenerator[WatchEvent, None]:
        """Changes to keys under ``prefix``, in order: an async iterator of
        ``WatchEvent`` (grant, renew, release, expire, transfer), each with its
        revision. ``from_revision=0`` starts from now; otherwise from that revision.

        On a dropped connection or a dead node it reconnects to another endpoint and
        resumes after the last revision it yielded, so no event is missed or repeated.
        Raises ``CompactedError`` if the serving node no longer has the revision
        (re-read the state, then watch from ``err.detail['revision'] + 1``).
        """
        next_rev = from_revision
        target = self._target
        failures = 0
        while True:
            message = {"op": "watch", "prefix": prefix, "from_revision": next_rev}
            try:
                conn = await self._connection(target, self.attempt_timeout)
                rid, queue = conn.open_stream(message)
            except ConnectionLostError:
                failures += 1
                target = self._next_endpoint()
                await asyncio.sleep(min(0.5, 0.02 * 2**failures))
                continue
            try:
                while True:
                    frame = await queue.get()
                    if isinstance(frame, RaftLeaseError):
                        raise frame
                    if not frame.get("ok"):
                        raise from_wire(
                            str(frame.get("code")), str(frame.get("message")), frame.get("detail")
                        )
                    failures = 0
                    if next_rev == 0 and "revision" in frame.get("result", {}):
                        next_rev = int(frame["result"]["revision"]) + 1
                    for event in frame.get("result", {}).get("events", []):
                        if event["revision"] < next_rev:
                            continue  # already yielded before a reconnect
                        next_rev = event["revision"] + 1
                        yield WatchEvent(
                            type=event["type"],
                            key=event["key"],
                            owner=event["owner"],
                            token=int(event["token"]),
                            revision=int(event["revision"]),
                            value=str(event.get("value", "")),
                            units=int(event.get("units", 1)),
                        )
            except (ConnectionLostError, UnavailableError):
                failures += 1
                target = self._next_endpoint()
                await asyncio.sleep(min(0.5, 0.02 * 2**failures))
            finally:
                conn.close_stream(rid)

    async def node_status(self, endpoint: str, *, timeout: float = 2.0) -> dict[str, Any]:
        """The status of one node (no redirect, no retry)."""
        conn = await self._connection(endpoint, timeout)
        response = await conn.request({"op": "status"}, timeout)
        if not response.get("ok"):
            raise from_wire(str(response.get("code")), str(response.get("message")))
        status: dict[str, Any] = response["result"]
        return status

    async def cluster_status(self, *, timeout: float = 2.0) -> list[dict[str, Any]]:
        """Status of every endpoint; unreachable ones are reported, not raised."""

        async def one(endpoint: str) -> dict[str, Any]:
            try:
                status = await self.node_status(endpoint, timeout=timeout)
                status["reachable"] = True
                return status
            except RaftLeaseError as exc:
                return {"client": endpoint, "reachable": False, "error": str(exc)}

        return list(await asyncio.gather(*(one(e) for e in self.endpoints)))


class Client(_SharedKeyLocks["HeldLock"]):
    """Blocking, thread-safe client with the same methods as ``AsyncClient``.

    Use as a context manager, or call ``close()``. Calls block the calling thread up to
    their deadline; they may be made from many threads at once.
    """

    def __init__(self, endpoints: Sequence[str] | str, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="raftlease-client", daemon=True
        )
        self._thread.start()
        self._closed = False

        async def make() -> AsyncClient:
            return AsyncClient(endpoints, **options)

        self._async = self._run(make())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise UnavailableError("client is closed")
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                "a blocking Client call from the client's own event-loop thread would "
                "deadlock (callbacks of this client run there? hand the work to a thread)"
            )
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def client_id(self) -> str:
        return self._async.client_id

    @property
    def endpoints(self) -> list[str]:
        return self._async.endpoints

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._run(self._async.close())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def acquire(
        self,
        key: str,
        *,
        owner: str | None = None,
        ttl: float | None = None,
        wait: float = 0.0,
        priority: int = 0,
        capacity: int = 1,
        units: int = 1,
        value: str | None = None,
        session: Attachable | None = None,
        timeout: float | None = None,
    ) -> Lease:
        return self._run(
            self._async.acquire(
                key,
                owner=owner,
                ttl=ttl,
                wait=wait,
                priority=priority,
                capacity=capacity,
                units=units,
                value=value,
                session=session,
                timeout=timeout,
            )
        )

    def proclaim(self, lease: Lease, value: str, *, timeout: float | None = None) -> Lease:
        return self._run(self._async.proclaim(lease, value, timeout=timeout))

    def transfer(
        self, lease: Lease, *, owner: str, ttl: float | None = None, timeout: float | None = None
    ) -> Lease:
        return self._run(self._async.transfer(lease, owner=owner, ttl=ttl, timeout=timeout))

    def fence(
        self,
        key: str,
        token: int,
        *,
        consistency: str = "linearizable",
        timeout: float | None = None,
    ) -> bool:
        return self._run(self._async.fence(key, token, consistency=consistency, timeout=timeout))

    def lock(self, key: str, **options: Any) -> HeldLock:
        """``with client.lock(key, owner=..., ttl=..., wait=...) as held:`` acquires,
        renews from a daemon thread every ``ttl / 3``, releases on exit; ``held.token``
        is the fencing token, ``held.lost`` an Event set if the lease is lost.
        Options: those of ``acquire`` (``session=`` attaches it) and ``on_lost``."""
        from .locks import HeldLock

        return HeldLock(self, key, **options)

    def session(
        self,
        *,
        owner: str,
        ttl: float,
        on_lost: Callable[[str], None] | None = None,
        on_jeopardy: Callable[[str], None] | None = None,
    ) -> Session:
        """``with client.session(owner=..., ttl=10) as s:`` (see ``AsyncClient.session``)."""
        from .sessions import Session

        return Session(self, owner=owner, ttl=ttl, on_lost=on_lost, on_jeopardy=on_jeopardy)

    def election(self, name: str) -> Election:
        from .election import Election

        return Election(self, name)

    def renew(
        self, lease: Lease, *, ttl: float | None = None, timeout: float | None = None
    ) -> Lease:
        return self._run(self._async.renew(lease, ttl=ttl, timeout=timeout))

    def release(self, lease: Lease, *, timeout: float | None = None) -> None:
        self._run(self._async.release(lease, timeout=timeout))

    def read(
        self, key: str, *, consistency: str = "linearizable", timeout: float | None = None
    ) -> Read:
        return self._run(self._async.read(key, consistency=consistency, timeout=timeout))

    def holder(
        self, key: str, *, consistency: str = "linearizable", timeout: float | None = None
    ) -> Holder | None:
        return self._run(self._async.holder(key, consistency=consistency, timeout=timeout))

    def leases(
        self,
        prefix: str = "",
        *,
        limit: int = 1000,
        consistency: str = "linearizable",
        timeout: float | None = None,
    ) -> list[Holder]:
        return self._run(
            self._async.leases(prefix, limit=limit, consistency=consistency, timeout=timeout)
        )

    def call(
        self, op: str, args: dict[str, Any], *, mutating: bool, timeout: float | None = None
    ) -> dict[str, Any]:
        """Low-level: send any operation (used by tests and tools)."""
        return self._run(self._async.call(op, args, mutating=mutating, timeout=timeout))

    def node_status(self, endpoint: str, *, timeout: float = 2.0) -> dict[str, Any]:
        return self._run(self._async.node_status(endpoint, timeout=timeout))

    def watch(self, prefix: str = "", *, from_revision: int = 0) -> Iterator[WatchEvent]:
        """Blocking iterator over ``AsyncClient.watch``; stop by breaking out of it."""
        return self._iterate(self._async.watch(prefix, from_revision=from_revision))

    def _iterate(self, agen: AsyncGenerator[T, None]) -> Iterator[T]:
        """A blocking iterator over an async generator run on the client's loop;
        breaking out of it (or closing it) closes the generator there."""

        async def step() -> T:
            return await agen.__anext__()

        try:
            while True:
                try:
                    yield self._run(step())
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:
                self._run(agen.aclose())

    def cluster_status(self, *, timeout: float = 2.0) -> list[dict[str, Any]]:
        return self._run(self._async.cluster_status(timeout=timeout))
