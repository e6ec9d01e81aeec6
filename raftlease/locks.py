"""Held locks: acquire, keep alive in the background, say loudly when lost, release.

Recipes layer: uses only the public client API (``acquire``/``renew``/``release``).

``with client.lock("gpu-0", owner="agent-a", ttl=10, wait=30) as held:`` (sync, a
daemon thread renews) and ``async with aclient.lock(...) as held:`` (asyncio, a task
renews). Inside, check ``held.valid`` (or ``held.lost``) before each protected action
and hand ``held.token`` to the protected resource: a process can always be paused
between a check and an action, and only the fencing token stops a stale holder.

Renewal runs every ``ttl / 3``. A failed renewal sets ``jeopardy`` (and logs a
warning) while the lease is still valid on the client's clock; once it is not, or the
cluster says the lease is gone, ``lost`` is set and logged as an error, renewal stops,
and exit does not release. ``on_lost`` is called once, from the renewal thread/task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import LeaseNotFoundError, NotOwnerError, RaftLeaseError

if TYPE_CHECKING:
    from .client import AsyncClient, Client, Lease

log = logging.getLogger("raftlease.locks")

LostCallback = Callable[[str], None]


class _HeldState:
    """What both lock flavours share: the current lease and the loss/jeopardy flags."""

    def __init__(
        self,
        key: str,
        *,
        owner: str,
        ttl: float,
        wait: float,
        priority: int,
        on_lost: LostCallback | None,
    ) -> None:
        self.key = key
        self.ttl = ttl
        self._acquire_args: dict[str, Any] = {
            "owner": owner,
            "ttl": ttl,
            "wait": wait,
            "priority": priority,
        }
        self.lease: Lease | None = None
        self.on_lost = on_lost
        self.lost_reason: str | None = None
        self.jeopardy = False

    @property
    def token(self) -> int:
        """The fencing token to hand to the protected resource."""
        if self.lease is None:
            raise RuntimeError("the lock is not held")
        return self.lease.token

    @property
    def valid(self) -> bool:
        """True while the lock is held and its lease valid on this client's clock."""
        return self.lease is not None and self.lost_reason is None and self.lease.valid

    def _renewed(self, lease: Lease) -> None:
        self.lease = lease
        if self.jeopardy:
            log.warning("lock %s out of jeopardy (renewed)", self.key)
        self.jeopardy = False

    def _renew_failed(self, exc: RaftLeaseError) -> bool:
        """Classify a failed renewal; True when the lock is lost."""
        if isinstance(exc, LeaseNotFoundError | NotOwnerError):
            return self._lose(f"the cluster no longer has our lease: {exc}")
        if self.lease is None or not self.lease.valid:
            return self._lose(f"could not renew before the lease ran out: {exc}")
        if not self.jeopardy:
            log.warning(
                "lock %s in jeopardy: renewal failed (%s); %.2f s of validity left",
                self.key,
                exc,
                self.lease.remaining,
            )
        self.jeopardy = True
        return False

    def _lose(self, reason: str) -> bool:
        if self.lost_reason is None:
            self.lost_reason = reason
            log.error("lock %s LOST: %s", self.key, reason)
            if self.on_lost is not None:
                try:
                    self.on_lost(reason)
                except Exception:
                    log.exception("on_lost callback raised")
        return True

    def _interval(self) -> float:
        return max(0.05, self.ttl / 3)


class HeldLock(_HeldState):
    """A lock held through a blocking ``Client``; renewed by a daemon thread."""

    def __init__(
        self,
        client: Client,
        key: str,
        *,
        owner: str,
        ttl: float,
        wait: float = 0.0,
        priority: int = 0,
        on_lost: LostCallback | None = None,
    ) -> None:
        super().__init__(key, owner=owner, ttl=ttl, wait=wait, priority=priority, on_lost=on_lost)
        self._client = client
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> HeldLock:
        self.lease = self._client.acquire(self.key, **self._acquire_args)
        self._thread = threading.Thread(
            target=self._keep_alive, name=f"raftlease-lock-{self.key}", daemon=True
        )
        self._thread.start()
        return self

    def _keep_alive(self) -> None:
        while not self._stop.wait(self._interval()):
            assert self.lease is not None
            try:
                self._renewed(self._client.renew(self.lease, timeout=max(0.1, self._interval())))
            except RaftLeaseError as exc:
                if self._renew_failed(exc):
                    self.lost.set()
                    return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._interval() + 10)
        if self.lease is not None and self.lost_reason is None:
            with contextlib.suppress(RaftLeaseError):
                self._client.release(self.lease, timeout=5.0)


class AsyncHeldLock(_HeldState):
    """A lock held through an ``AsyncClient``; renewed by an asyncio task."""

    def __init__(
        self,
        client: AsyncClient,
        key: str,
        *,
        owner: str,
        ttl: float,
        wait: float = 0.0,
        priority: int = 0,
        on_lost: LostCallback | None = None,
    ) -> None:
        super().__init__(key, owner=owner, ttl=ttl, wait=wait, priority=priority, on_lost=on_lost)
        self._client = client
        self.lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncHeldLock:
        self.lease = await self._client.acquire(self.key, **self._acquire_args)
        self._task = asyncio.create_task(self._keep_alive())
        return self

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self._interval())
            assert self.lease is not None
            try:
                self._renewed(
                    await self._client.renew(self.lease, timeout=max(0.1, self._interval()))
                )
            except RaftLeaseError as exc:
                if self._renew_failed(exc):
                    self.lost.set()
                    return

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.lease is not None and self.lost_reason is None:
            with contextlib.suppress(RaftLeaseError):
                await self._client.release(self.lease, timeout=5.0)
