"""Validity, jeopardy and loss of something kept alive in the background (a held
lock's lease, a lease session), shared by ``locks`` and ``sessions``.

Recipes layer: no I/O of its own. The owner calls ``renewed(valid_until)`` after each
successful renewal and ``renew_failed(exc)`` after each failed one:

* a failure while the thing is still valid on this client's clock sets ``jeopardy``
  (logged as a warning, ``on_jeopardy`` called once per episode): stop starting new
  work that would outlive ``remaining``;
* the cluster saying it is gone (``LeaseNotFoundError``, ``NotOwnerError``,
  ``SessionNotFoundError``), or a failure after validity ran out, sets ``lost``
  (logged as an error, ``on_lost`` called once): stop protected work now.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable

from ..errors import LeaseNotFoundError, NotOwnerError, RaftLeaseError, SessionNotFoundError

log = logging.getLogger("raftlease.keepalive")

LostCallback = Callable[[str], None]

#: Errors meaning the cluster no longer has the lease or session at all.
GONE = (LeaseNotFoundError, NotOwnerError, SessionNotFoundError)


class KeepAliveState:
    """``what`` names the thing in logs ("lock gpu-0", "session 3f2a...")."""

    def __init__(
        self,
        what: str,
        ttl: float,
        *,
        noun: str,
        on_lost: LostCallback | None = None,
        on_jeopardy: LostCallback | None = None,
    ) -> None:
        self.what = what
        #: What the cluster keeps for us, in messages: "lease" or "session".
        self.noun = noun
        self.ttl = ttl
        self.on_lost = on_lost
        self.on_jeopardy = on_jeopardy
        self.valid_until = 0.0
        self.lost_reason: str | None = None
        self.jeopardy = False
        #: The cluster said it no longer has it (as opposed to: we could not reach it).
        self.gone = False

    @property
    def remaining(self) -> float:
        """Seconds this client may still trust it (0 once lost or run out)."""
        if self.lost_reason is not None:
            return 0.0
        return max(0.0, self.valid_until - time.monotonic())

    @property
    def valid(self) -> bool:
        return self.remaining > 0

    def interval(self) -> float:
        """Renew every third of the TTL, counted from the previous try's send, each
        try bounded by the same: after a success the next try starts a third of the
        TTL later and a failed one is retried a third later still, both before the
        validity (a little under one TTL from the success's send) runs out."""
        return max(0.05, self.ttl / 3)

    async def keep_alive_task(
        self, renew: Callable[[float], Awaitable[None]], lost: asyncio.Event
    ) -> None:
        """The renewal loop as an asyncio task: ``renew(timeout)`` once per
        ``interval()`` counted from the previous try's send, until lost (then
        ``lost`` is set). Cancel the task to stop it."""
        loop = asyncio.get_running_loop()
        next_try = loop.time() + self.interval()
        while True:
            await asyncio.sleep(max(0.0, next_try - loop.time()))
            next_try = loop.time() + self.interval()  # counted from this try's send
            try:
                await renew(max(0.1, self.interval()))
            except RaftLeaseError as exc:
                if self.renew_failed(exc):
                    lost.set()
                    return

    def keep_alive_thread(
        self, renew: Callable[[float], None], stop: threading.Event, lost: threading.Event
    ) -> None:
        """The same loop for a thread; returns when ``stop`` is set or when lost."""
        next_try = time.monotonic() + self.interval()
        while not stop.wait(max(0.0, next_try - time.monotonic())):
            next_try = time.monotonic() + self.interval()  # counted from this try's send
            try:
                renew(max(0.1, self.interval()))
            except RaftLeaseError as exc:
                if self.renew_failed(exc):
                    lost.set()
                    return

    def renewed(self, valid_until: float) -> None:
        self.valid_until = valid_until
        if self.jeopardy:
            log.warning("%s out of jeopardy (renewed)", self.what)
        self.jeopardy = False

    def renew_failed(self, exc: RaftLeaseError) -> bool:
        """Classify a failed renewal; True when it is lost (stop renewing)."""
        if isinstance(exc, GONE):
            self.gone = True
            return self.lose(f"the cluster no longer has our {self.noun}: {exc}")
        if time.monotonic() >= self.valid_until:
            return self.lose(f"could not renew before it ran out: {exc}")
        if not self.jeopardy:
            self.jeopardy = True
            log.warning(
                "%s in jeopardy: renewal failed (%s); %.2f s of validity left",
                self.what,
                exc,
                self.remaining,
            )
            self._call(self.on_jeopardy, str(exc))
        return False

    def lose(self, reason: str) -> bool:
        if self.lost_reason is None:
            self.lost_reason = reason
            self.valid_until = 0.0  # leases attached to a session read this
            log.error("%s LOST: %s", self.what, reason)
            self._call(self.on_lost, reason)
        return True

    @staticmethod
    def _call(callback: LostCallback | None, reason: str) -> None:
        if callback is not None:
            try:
                callback(reason)
            except Exception:
                log.exception("keep-alive callback raised")
