"""Value types every layer above the protocol shares, and the client protocols the
recipes are typed against (ARCHITECTURE §1: recipes use only these, never a client's
internals).

* ``Lease``, ``Holder``, ``WatchEvent``, ``Read``, ``Leader``: what the client returns;
* ``Attachable``: a live lease session as a lease attached to it sees it;
* ``AsyncLeaseClient``: the asyncio client API the recipes use (``AsyncClient``);
* ``BlockingPortal``: runs a coroutine, or iterates an async iterator, on a blocking
  client's event-loop thread from any other thread;
* ``LeaseClient``: the blocking client API the recipes use (``Client``), with its
  ``aio`` client and its ``portal``.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


def default_owner() -> str:
    """``hostname:pid``: the owner label used when none is given. An owner is a label
    for people and logs (who holds this?), not a credential: renewing or releasing
    needs the lease id (and, with auth, the same principal), never the owner name."""
    return f"{socket.gethostname()}:{os.getpid()}"


#: How a lease can end, as the store's events and watches name it (``LeaseStore._end_lease``;
#: tests/chaos/test_trace_checker.py checks the store passes no other kind): released,
#: expired, revoked by an admin, transferred, ended at a yield deadline (``preempt``,
#: request_yield) or without progress (``stalled``, progress_timeout).
LEASE_END_KINDS = frozenset({"release", "expire", "revoke", "transfer", "preempt", "stalled"})

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


class HolderSigner(Protocol):
    """A holder's key pair as the client uses it (``raftlease.verify.HolderKey``):
    only the public half ever leaves the process."""

    def public_hex(self) -> str: ...

    def prove(self, certificate: str, challenge: bytes, message: bytes = b"") -> str: ...


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
    #: The units it holds on a pool or semaphore (capacity 2 to 1024): their indices,
    #: the lowest free at grant (a GPU pool's device numbers); () otherwise.
    unit_indices: tuple[int, ...] = ()
    #: Someone asked this holder to yield (``request_yield``, docs/usage.md): the log
    #: time (ms, comparable with ``expires_at_ms``) at which the cluster ends the lease
    #: itself unless it is released first, as of the last answer; None if nobody asked.
    yield_deadline_ms: int | None = None
    #: Who asked (the asker's label), "" if nobody did.
    yield_by: str = ""
    #: The lease certificate (docs/certificates.md) when acquired with a holder key
    #: and the answering leader could sign one; "" otherwise. Renewals replace it.
    certificate: str = field(default="", compare=False, repr=False)
    #: The holder key it was acquired with (``raftlease.verify.HolderKey``), if any.
    holder_key: HolderSigner | None = field(default=None, compare=False, repr=False)
    #: A progress-aware lease (``progress_timeout``): until when (``time.monotonic()``)
    #: its progress deadline, as of the last answer, lets this client trust it; None
    #: otherwise. It bounds an attached lease's validity below its session's (the
    #: session's keep-alives never keep it past the deadline: docs/design.md §4g).
    progress_until: float | None = None

    def prove(self, challenge: bytes, message: bytes = b"") -> str:
        """A proof of possession of the holder key for one request to a resource:
        ``(certificate, proof)`` is what the resource's ``raftlease.verify.Verifier``
        checks. Raises ``ValueError`` without a holder key or a certificate."""
        if self.holder_key is None or not self.certificate:
            raise ValueError("this lease has no certificate (acquire it with holder_key=)")
        return self.holder_key.prove(self.certificate, challenge, message)

    @property
    def trusted_until(self) -> float:
        """``valid_until``, or the session's for an attached lease (kept alive by the
        session's keep-alive, not by renewals of its own)."""
        if self.session is not None:
            # The cluster extends an attached lease with every keep-alive of its
            # session, to the session's expiry: the session's window is the lease's,
            # up to a progress-aware lease's deadline (only a progress report moves it).
            until = self.session.valid_until
            return until if self.progress_until is None else min(until, self.progress_until)
        return self.valid_until

    @property
    def remaining(self) -> float:
        """Seconds this client may still trust the lease (0 when no longer valid)."""
        return max(0.0, self.trusted_until - time.monotonic())

    @property
    def valid(self) -> bool:
        return time.monotonic() < self.trusted_until


@dataclass(frozen=True, slots=True)
class LeaseSet:
    """Several keys this client holds together, taken by ``acquire_many`` in one log
    entry (all or none).

    The set lives as one lease session whose id is ``lease_id`` (a secret, like a
    lease id): ``renew_many`` keeps every key alive in one request, ``release_many``
    ends every key in one log entry, and if neither comes in time all keys expire in
    the same entry. ``leases`` holds one ``Lease`` per key, in the order asked, each
    with its own fencing token and lease id (``release`` of one of them ends that key
    alone). ``valid_until`` is on this process's ``time.monotonic()`` clock, computed
    like a lease's."""

    lease_id: str
    owner: str
    ttl: float
    valid_until: float
    expires_at_ms: int
    leases: tuple[Lease, ...]

    @property
    def tokens(self) -> dict[str, int]:
        """Each key's fencing token."""
        return {lease.key: lease.token for lease in self.leases}

    @property
    def keys(self) -> list[str]:
        return [lease.key for lease in self.leases]

    @property
    def remaining(self) -> float:
        """Seconds this client may still trust the set (0 when no longer valid)."""
        return max(0.0, self.valid_until - time.monotonic())

    @property
    def valid(self) -> bool:
        return time.monotonic() < self.valid_until


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
    #: The unit indices this holder holds on a pool (see ``Lease.unit_indices``).
    unit_indices: tuple[int, ...] = ()


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
    #: The unit indices a pool lease holds (see ``Lease.unit_indices``).
    unit_indices: tuple[int, ...] = ()
    #: On an end (release, expire, revoke, transfer): the same log entry grants the
    #: key to the next holder (its ``grant`` follows): the key was never free.
    handoff: bool = False


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


@dataclass(frozen=True, slots=True)
class Leader:
    """Who leads an election: the owner, the value it published, its fencing token,
    and the revision of the change that made it so."""

    owner: str
    value: str
    token: int
    revision: int | None = None


@dataclass(frozen=True, slots=True)
class Queued:
    """An acquire waiting in a key's queue, as ``waiters()`` shows it: its place (1 is
    granted next), who asks, for how many units at what priority, how long it will
    still wait (seconds), and whether a lease session carries it. No lease id."""

    key: str
    position: int
    owner: str
    units: int
    priority: int
    wait_left: float
    in_session: bool = False


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A live lease session, as ``sessions()`` shows it. No session id: that is a
    capability (it keeps alive and ends everything attached)."""

    owner: str
    ttl: float
    remaining: float
    leases: int
    waiters: int


class AsyncLeaseClient(Protocol):
    """The asyncio client API recipes are written against (``AsyncClient`` has it)."""

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
    ) -> Lease: ...

    async def renew(
        self,
        lease: Lease,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        progress: float | None = None,
    ) -> Lease: ...

    async def release(self, lease: Lease, *, timeout: float | None = None) -> None: ...

    async def proclaim(
        self, lease: Lease, value: str, *, timeout: float | None = None
    ) -> Lease: ...

    async def read(
        self, key: str, *, consistency: str = "linearizable", timeout: float | None = None
    ) -> Read: ...

    def watch(self, prefix: str = "", *, from_revision: int = 0) -> AsyncIterator[WatchEvent]: ...

    async def session_keepalive(
        self, session_id: str, *, timeout: float | None = None
    ) -> dict[str, Any]: ...

    async def call(
        self, op: str, args: dict[str, Any], *, mutating: bool, timeout: float | None = None
    ) -> dict[str, Any]: ...

    def valid_until(self, sent: float, seconds: float) -> float:
        """Until when (``time.monotonic()``) the client trusts something the cluster
        keeps for ``seconds`` of log time from a request first sent at ``sent``."""
        ...

    def on_close(self, callback: Callable[[], Awaitable[None]]) -> Callable[[], None]:
        """Run ``callback`` (on the client's loop) when the client closes; returns a
        function that cancels the registration."""
        ...


class BlockingPortal(Protocol):
    """Hands work to a blocking client's event-loop thread (blocks the caller)."""

    def run(self, coro: Coroutine[Any, Any, T]) -> T: ...

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]: ...


class LeaseClient(Protocol):
    """The blocking client API recipes are written against (``Client`` has it)."""

    @property
    def aio(self) -> AsyncLeaseClient: ...

    @property
    def portal(self) -> BlockingPortal: ...

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
    ) -> Lease: ...

    def renew(
        self,
        lease: Lease,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        progress: float | None = None,
    ) -> Lease: ...

    def release(self, lease: Lease, *, timeout: float | None = None) -> None: ...
