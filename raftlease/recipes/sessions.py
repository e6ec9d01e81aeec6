"""Lease sessions: one keep-alive for any number of leases.

Recipes layer over the ``session_open`` / ``session_keepalive`` / ``session_close``
operations. A session lives in the replicated state with its own TTL; leases (and
queued acquires) attached to it have no TTL of their own: each keep-alive extends them
all in one log entry, and when the session expires (its holder died, hung or lost the
network for longer than the TTL) or is closed, the state machine releases every
attached lease and drops every attached queued acquire, in that same entry.

    async with aclient.session(owner="agent-7", ttl=10) as session:
        gpu = await session.acquire("gpu/3", wait=30)
        part = await session.acquire("partition/17")
        ...            # check session.valid / session.lost before protected work

    with client.session(owner="agent-7", ttl=10) as session:   # blocking flavour
        with session.lock("planner", wait=5) as held: ...

The keep-alive runs every ``ttl / 3`` (an asyncio task; for the blocking ``Client``, a
task on the client's own event-loop thread). Jeopardy and loss are reported as for
held locks (``raftlease.recipes.keepalive``): ``jeopardy`` while keep-alives fail but the
session is still valid on this client's clock, ``lost`` (an ``asyncio.Event`` or a
``threading.Event``) once the cluster says it is gone or validity ran out; the
callbacks ``on_jeopardy`` / ``on_lost`` are called once per episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..errors import InvalidArgumentError, RaftLeaseError
from ..models import AsyncLeaseClient, HolderSigner, Lease, LeaseClient, default_owner
from .keepalive import KeepAliveState, LostCallback
from .locks import AsyncHeldLock, HeldLock

#: Called with the attached leases whose holder is asked to yield (``request_yield``):
#: ``[{"key", "token", "deadline", "by", "now"}, ...]`` (``now``: the keep-alive
#: answer's log time, ms, like ``deadline``), each request once. ``AsyncSession``:
#: from its keep-alive task; ``Session``: on a thread of its own.
YieldListCallback = Callable[[list[dict[str, Any]]], None]


class AsyncSession(KeepAliveState):
    """A lease session kept alive by an asyncio task. Open it with ``async with`` (or
    ``await open()`` / ``await close()``)."""

    def __init__(
        self,
        client: AsyncLeaseClient,
        *,
        owner: str | None = None,
        ttl: float,
        on_lost: LostCallback | None = None,
        on_jeopardy: LostCallback | None = None,
        on_yield_requested: YieldListCallback | None = None,
        holder_key: HolderSigner | None = None,
    ) -> None:
        """``holder_key``: the lease certificate key (docs/certificates.md) its
        ``acquire`` and ``lock`` bind by default and its keep-alives ask fresh
        certificates for (``certified``)."""
        if owner is None:
            owner = default_owner()  # a label, not a credential
        if not owner:
            raise InvalidArgumentError("a session needs an owner")
        super().__init__(
            "session (not open)", ttl, noun="session", on_lost=on_lost, on_jeopardy=on_jeopardy
        )
        self._client = client
        self._owner = owner
        self._id: str | None = None
        self.lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Cancels our registration with the client's ``on_close`` (while open).
        self._unregister: Callable[[], None] | None = None
        self._on_yield = on_yield_requested
        #: (token, deadline) of the yield requests already reported.
        self._yields_told: set[tuple[int, int]] = set()
        self._holder_key = holder_key
        #: (key, token) -> the certificate the latest keep-alive brought (replaced by
        #: each answer: at most MAX_CERTIFICATES_PER_ANSWER, 64, entries).
        self._certificates: dict[tuple[str, int], str] = {}

    @property
    def owner(self) -> str:
        return self._owner

    @property
    def session_id(self) -> str:
        if self._id is None:
            raise RuntimeError("the session is not open")
        return self._id

    async def open(self, *, timeout: float | None = None) -> AsyncSession:
        if self._id is not None:
            raise RuntimeError("the session is already open")
        sent = time.monotonic()
        result = await self._client.call(
            "session_open", {"owner": self._owner, "ttl": self.ttl}, mutating=True, timeout=timeout
        )
        self._id = str(result["session_id"])
        self.what = f"session {self._id[:8]} ({self._owner})"
        self.renewed(self._client.valid_until(sent, result["ttl"] / 1000.0))
        self._task = asyncio.create_task(
            self.keep_alive_task(lambda timeout: self.keepalive(timeout=timeout), self.lost)
        )
        # Closing the client stops our keep-alive (the session then expires).
        self._unregister = self._client.on_close(self.stop_keepalive)
        return self

    async def keepalive(self, *, timeout: float | None = None) -> None:
        """One keep-alive now (the background task sends them every ``ttl / 3``)."""
        sent = time.monotonic()
        if self._holder_key is None:
            # Batched with the client's other sessions' keep-alives when it can be.
            result = await self._client.session_keepalive(self.session_id, timeout=timeout)
        else:
            args: dict[str, Any] = {
                "session_id": self.session_id,
                "holder_key": self._holder_key.public_hex(),
            }
            result = await self._client.call(
                "session_keepalive", args, mutating=True, timeout=timeout
            )
        self.renewed(self._client.valid_until(sent, result["ttl"] / 1000.0))
        if self._holder_key is not None:
            # Kept only from the latest answer: an older certificate is never newer.
            fresh = {
                (str(one.get("key")), int(one.get("token", 0))): str(one.get("certificate", ""))
                for one in result.get("certificates", ())
                if isinstance(one, dict)
            }
            if fresh:
                self._certificates = fresh
        asked = [a for a in result.get("yield_requested", ()) if isinstance(a, dict)]
        new = [a for a in asked if (int(a["token"]), int(a["deadline"])) not in self._yields_told]
        if new:
            # Someone asks the holder of attached leases to yield (request_yield):
            # reported once per request, from this keep-alive's answer.
            self._yields_told.update((int(a["token"]), int(a["deadline"])) for a in new)
            if self._on_yield is not None:
                # With the answer's log time, so the deadline reads as time left.
                self._on_yield([{**a, "now": result.get("now")} for a in new])

    async def stop_keepalive(self) -> None:
        """Stop the background keep-alive (the session then expires after its TTL,
        unless ``keepalive`` is called). ``close`` does this first."""
        if self._unregister is not None:
            self._unregister()
            self._unregister = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def close(self, *, timeout: float = 5.0) -> None:
        """Stop the keep-alive and close the session on the cluster: every attached
        lease is released at once (best effort: if the cluster cannot be reached, the
        session and its leases expire after the TTL)."""
        await self.stop_keepalive()
        if self._id is not None and not self.gone and self.lost_reason != "closed":
            # Also after a loss on our side (keep-alives failed until validity ran
            # out): the cluster may still hold the session and its leases.
            with contextlib.suppress(RaftLeaseError):
                await self._client.call(
                    "session_close", {"session_id": self._id}, mutating=True, timeout=timeout
                )
        if self.lost_reason is None:
            self.lost_reason = "closed"  # deliberately: not reported as a loss
        self.valid_until = 0.0
        self.lost.set()

    async def __aenter__(self) -> AsyncSession:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def certified(self, lease: Lease) -> Lease:
        """``lease`` (attached to this session) with the certificate the latest
        keep-alive brought for it, or unchanged if none did (no ``holder_key``, the
        lease bound to another key, or no keep-alive since its grant). Never blocks."""
        fresh = self._certificates.get((lease.key, lease.token))
        return replace(lease, certificate=fresh) if fresh else lease

    async def acquire(self, key: str, **options: Any) -> Lease:
        """``client.acquire(key, session=self, ...)``: the lease lives as long as the
        session. Options as for ``AsyncClient.acquire`` (wait, capacity, value...);
        ``holder_key`` defaults to the session's. With ``progress_timeout`` the
        session's keep-alives never keep it past its progress deadline: report progress
        with ``progress`` (docs/design.md §4g)."""
        if self._holder_key is not None:
            options.setdefault("holder_key", self._holder_key)
        return await self._client.acquire(key, session=self, **options)

    async def progress(
        self, lease: Lease, progress: float, *, timeout: float | None = None
    ) -> Lease:
        """Report ``progress`` (higher is further) for a progress-aware lease of this
        session: one log write (a ``renew`` carrying ``progress``); a higher figure
        than the last restarts its progress clock. Returns the lease with its new
        ``progress_until`` (its ``remaining`` is bounded by it). Raises
        ``LeaseNotFoundError`` once it ended (stalled), ``InvalidArgumentError`` for a
        lease without ``progress_timeout``; cancelling leaves the outcome unknown."""
        return await self._client.renew(lease, progress=progress, timeout=timeout)

    def lock(self, key: str, **options: Any) -> AsyncHeldLock:
        """``async with session.lock(key, wait=...) as held:``, released on exit,
        kept alive by this session (``holder_key`` defaults to the session's)."""
        if self._holder_key is not None:
            options.setdefault("holder_key", self._holder_key)
        return AsyncHeldLock(self._client, key, session=self, **options)


class Session:
    """A lease session for the blocking ``Client``: the same as ``AsyncSession``, run
    on the client's event-loop thread; ``lost`` is a ``threading.Event``."""

    def __init__(
        self,
        client: LeaseClient,
        *,
        owner: str | None = None,
        ttl: float,
        on_lost: LostCallback | None = None,
        on_jeopardy: LostCallback | None = None,
        on_yield_requested: YieldListCallback | None = None,
        holder_key: HolderSigner | None = None,
    ) -> None:
        self._client = client
        self._holder_key = holder_key
        self.lost = threading.Event()

        # The keep-alive runs on the client's event-loop thread, where a blocking
        # client call would deadlock: user callbacks run on a thread of their own.
        def lost(reason: str) -> None:
            self.lost.set()
            _in_thread(on_lost, reason)

        def jeopardy(reason: str) -> None:
            _in_thread(on_jeopardy, reason)

        def asked(requests: list[dict[str, Any]]) -> None:
            if on_yield_requested is not None:
                threading.Thread(
                    target=on_yield_requested,
                    args=(requests,),
                    name="raftlease-session-callback",
                    daemon=True,
                ).start()

        async def make() -> AsyncSession:
            return AsyncSession(
                client.aio,
                owner=owner,
                ttl=ttl,
                on_lost=lost,
                on_jeopardy=jeopardy,
                on_yield_requested=asked,
                holder_key=holder_key,
            )

        self._async = client.portal.run(make())

    owner = property(lambda self: self._async.owner)
    session_id = property(lambda self: self._async.session_id)
    valid_until = property(lambda self: self._async.valid_until)
    valid = property(lambda self: self._async.valid)
    remaining = property(lambda self: self._async.remaining)
    jeopardy = property(lambda self: self._async.jeopardy)
    lost_reason = property(lambda self: self._async.lost_reason)
    ttl = property(lambda self: self._async.ttl)

    def open(self, *, timeout: float | None = None) -> Session:
        self._client.portal.run(self._async.open(timeout=timeout))
        return self

    def keepalive(self, *, timeout: float | None = None) -> None:
        self._client.portal.run(self._async.keepalive(timeout=timeout))

    def stop_keepalive(self) -> None:
        """As ``AsyncSession.stop_keepalive``: stop the background keep-alive (the
        session then expires after its TTL unless ``keepalive`` is called). Blocks until
        the keep-alive task has ended."""
        self._client.portal.run(self._async.stop_keepalive())

    def close(self, *, timeout: float = 5.0) -> None:
        self._client.portal.run(self._async.close(timeout=timeout))
        self.lost.set()

    def __enter__(self) -> Session:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def certified(self, lease: Lease) -> Lease:
        """As ``AsyncSession.certified``."""
        return self._async.certified(lease)

    def acquire(self, key: str, **options: Any) -> Lease:
        if self._holder_key is not None:
            options.setdefault("holder_key", self._holder_key)
        return self._client.acquire(key, session=self._async, **options)

    def progress(self, lease: Lease, progress: float, *, timeout: float | None = None) -> Lease:
        """As ``AsyncSession.progress``; blocks up to the call's deadline."""
        return self._client.renew(lease, progress=progress, timeout=timeout)

    def lock(self, key: str, **options: Any) -> HeldLock:
        if self._holder_key is not None:
            options.setdefault("holder_key", self._holder_key)
        return HeldLock(self._client, key, session=self, **options)


def _in_thread(callback: LostCallback | None, reason: str) -> None:
    if callback is not None:
        threading.Thread(
            target=callback, args=(reason,), name="raftlease-session-callback", daemon=True
        ).start()
