"""Held locks: acquire, keep alive in the background, say loudly when lost, release.

Recipes layer: uses only the client protocols of ``raftlease.models``
(``acquire``/``renew``/``release``).

``with client.lock("gpu-0", owner="agent-a", ttl=10, wait=30) as held:`` (sync, a
daemon thread renews) and ``async with aclient.lock(...) as held:`` (asyncio, a task
renews). Inside, check ``held.valid`` (or ``held.lost``) before each protected action
and hand ``held.token`` to the protected resource: a process can always be paused
between a check and an action, and only the fencing token stops a stale holder.

Renewal runs every ``ttl / 3``. A failed renewal sets ``jeopardy`` (and logs a
warning) while the lease is still valid on the client's clock; once it is not, or the
cluster says the lease is gone, ``lost`` is set and logged as an error, renewal stops,
and exit does not release. ``on_lost`` is called once, from the renewal thread/task.
``on_yield_requested(lease)`` is called (from the same thread/task) once per
``request_yield`` the holder learns of in a renewal answer: checkpoint and leave the
block before ``lease.yield_deadline_ms``, when the cluster ends the lease itself.
With ``progress_timeout=`` (an ``acquire`` option) call ``held.progress(figure)`` as
work advances: a holder whose figure stops rising loses the lock (ends ``stalled``).

The same holders serve shared keys (``capacity``/``units``: semaphores, read/write
locks, pools; see ``Client.semaphore``, ``read_lock``, ``write_lock``, ``pool``) and
leases attached to a lease session (``session=``): those are not renewed one by one;
the session's keep-alive keeps them, and they are lost when the session is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import InvalidArgumentError, RaftLeaseError
from ..models import AsyncLeaseClient, Lease, LeaseClient
from .keepalive import KeepAliveState, LostCallback

log = logging.getLogger(__name__)

#: Called (from the renewal thread or task) with the lease whose holder is asked to
#: yield (``Lease.yield_deadline_ms``, ``Lease.yield_by``), once per request.
YieldCallback = Callable[[Lease], None]


class _WithLost(Protocol):
    """A lease session as a lock attached to it sees it: its ``lost`` event."""

    lost: Any


class _HeldState(KeepAliveState):
    """What both lock flavours share: the acquire arguments and the current lease."""

    def __init__(
        self,
        key: str,
        on_lost: LostCallback | None,
        acquire: dict[str, Any],
        on_yield_requested: YieldCallback | None = None,
    ) -> None:
        if acquire.get("session") is not None and on_lost is not None:
            raise InvalidArgumentError(
                "a lock attached to a session is lost exactly when its session is: give "
                "on_lost to the session"
            )
        super().__init__(f"lock {key}", acquire.get("ttl") or 0.0, noun="lease", on_lost=on_lost)
        self.key = key
        #: Keyword arguments of ``acquire`` (owner, ttl or session, wait, capacity...).
        self._acquire_args = acquire
        self.lease: Lease | None = None
        self._on_yield = on_yield_requested
        #: The yield deadline already reported (``on_yield_requested`` once per request).
        self._yield_seen: int | None = None
        #: The last figure given to ``progress`` (sent with every renewal from then on).
        self._progress: float | None = None

    def progress(self, figure: float) -> None:
        """Report progress (higher is further) on a lock acquired with
        ``progress_timeout``: the next renewal carries it (docs/design.md §4g), so a
        holder that stops calling this with higher figures loses the lock (``stalled``)
        about ``progress_timeout`` after the last higher one reached the cluster. Any
        thread; never blocks."""
        self._progress = figure

    @property
    def attached(self) -> bool:
        return self._acquire_args.get("session") is not None

    @property
    def token(self) -> int:
        """The fencing token to hand to the protected resource."""
        if self.lease is None:
            raise RuntimeError("the lock is not held")
        return self.lease.token

    @property
    def unit_indices(self) -> tuple[int, ...]:
        """The pool units it holds (``Lease.unit_indices``): with a GPU pool,
        ``CUDA_VISIBLE_DEVICES=",".join(map(str, held.unit_indices))``."""
        if self.lease is None:
            raise RuntimeError("the lock is not held")
        return self.lease.unit_indices

    @property
    def valid(self) -> bool:
        """True while the lock is held and its lease valid on this client's clock."""
        return self.lease is not None and self.lost_reason is None and self.lease.valid

    @property
    def remaining(self) -> float:
        if self.lease is None or self.lost_reason is not None:
            return 0.0
        return self.lease.remaining

    @property
    def yield_requested(self) -> bool:
        """Someone asked this holder to yield (``request_yield``): checkpoint and
        leave the block before ``lease.yield_deadline_ms`` (log time), when the
        cluster ends the lease itself."""
        return self.lease is not None and self.lease.yield_deadline_ms is not None

    def _held(self, lease: Lease) -> None:
        self.lease = lease
        self.renewed(lease.trusted_until)
        deadline = lease.yield_deadline_ms
        if deadline is not None and deadline != self._yield_seen:
            # Learnt from this keep-alive answer: tell the holder once per request.
            self._yield_seen = deadline
            log.warning(
                "%s: %r asks this holder to yield by log time %d ms",
                self.what, lease.yield_by, deadline,
            )  # fmt: skip
            if self._on_yield is not None:
                try:
                    self._on_yield(lease)
                except Exception:  # a callback's bug must not stop the renewals
                    log.exception("%s: on_yield_requested raised", self.what)


class HeldLock(_HeldState):
    """A lock held through a blocking ``Client``; renewed by a daemon thread (or by
    its lease session's keep-alive when ``session`` is given)."""

    def __init__(
        self,
        client: LeaseClient,
        key: str,
        *,
        on_lost: LostCallback | None = None,
        on_yield_requested: YieldCallback | None = None,
        **acquire: Any,
    ) -> None:
        """``acquire``: keyword arguments of ``Client.acquire``."""
        super().__init__(key, on_lost, acquire, on_yield_requested)
        self._client = client
        session: _WithLost | None = acquire.get("session")
        #: Set when the lock is lost (for an attached lock: when its session is).
        self.lost = session.lost if session is not None else threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> HeldLock:
        self._held(self._client.acquire(self.key, **self._acquire_args))
        if not self.attached:
            self._thread = threading.Thread(
                target=self.keep_alive_thread,
                args=(self._renew, self._stop, self.lost),
                name=f"raftlease-lock-{self.key}",
                daemon=True,
            )
            self._thread.start()
        return self

    def _renew(self, timeout: float) -> None:
        assert self.lease is not None
        self._held(self._client.renew(self.lease, timeout=timeout, progress=self._progress))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval() + 10)
        if self.lease is not None and self.lost_reason is None and not self.lost.is_set():
            with contextlib.suppress(RaftLeaseError):
                self._client.release(self.lease, timeout=5.0)


class AsyncHeldLock(_HeldState):
    """A lock held through an ``AsyncClient``; renewed by an asyncio task (or by its
    lease session's keep-alive when ``session`` is given)."""

    def __init__(
        self,
        client: AsyncLeaseClient,
        key: str,
        *,
        on_lost: LostCallback | None = None,
        on_yield_requested: YieldCallback | None = None,
        **acquire: Any,
    ) -> None:
        """``acquire``: keyword arguments of ``AsyncClient.acquire``."""
        super().__init__(key, on_lost, acquire, on_yield_requested)
        self._client = client
        session: _WithLost | None = acquire.get("session")
        #: Set when the lock is lost (for an attached lock: when its session is).
        self.lost = session.lost if session is not None else asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncHeldLock:
        self._held(await self._client.acquire(self.key, **self._acquire_args))
        if not self.attached:
            self._task = asyncio.create_task(self.keep_alive_task(self._renew, self.lost))
        return self

    async def _renew(self, timeout: float) -> None:
        assert self.lease is not None
        self._held(await self._client.renew(self.lease, timeout=timeout, progress=self._progress))

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.lease is not None and self.lost_reason is None and not self.lost.is_set():
            with contextlib.suppress(RaftLeaseError):
                await self._client.release(self.lease, timeout=5.0)
