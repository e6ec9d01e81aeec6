"""The two time limits of a client connection, on one timer per connection.

* ``frame_timeout``: a request frame that has started must arrive whole within it (a
  slow or stalled sender must not hold a buffer for ever).
* ``idle_timeout``: a connection with nothing in flight (no request being answered, no
  watch, no long-poll) and nothing received for that long is closed.
* A connection that has sent nothing at all since it was accepted is closed after
  ``min(frame_timeout, idle_timeout)`` (counted as ``idle_timeout``). Before, it
  waited for ``idle_timeout`` (15 min by default) like a client between requests:
  ``frame_timeout`` only ran once a frame had started, so a connection that never
  sent a byte held its slot, and a stranger could hold hundreds (issue 37). Every
  client sends its first request (or ``auth``) as soon as it connects.

One ``TimerHandle`` per connection, re-armed only when it fires or when a frame starts
(its limit is shorter), instead of one armed and cancelled around every read: that
cost more than the read on the request path. The idle clock starts when the
connection last became quiet: data received, or its last request in flight
answered. (Before this module, the read that followed a request was made with no
limit while that request was in flight, and so stayed without one after it was
answered: a connection that had sent one request was never closed as idle.)

Threads: the event loop's only. Nothing here blocks or raises.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

log = logging.getLogger("raftlease.server")


class ConnectionTimer:
    """Closes a connection (``close(limit, reason)``: ``limit`` is ``frame_timeout``
    or ``idle_timeout``, ``reason`` a sentence for the log) when a started frame is
    late or when it has been quiet for ``idle_timeout``. ``busy`` is the
    connection's set of requests in flight (read when the timer fires). Call
    ``active`` when data arrives or a request in flight ends, ``frame`` with the
    bytes of a partial frame buffered (0 once none is) and whether a frame
    completed, and ``stop`` when the connection ends."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        frame_timeout: float,
        idle_timeout: float,
        busy: Collection[object],
        close: Callable[[str, str], None],
    ) -> None:
        self._loop = loop
        self._frame_timeout = frame_timeout
        self._idle_timeout = idle_timeout
        self._busy = busy
        self._close = close
        self.quiet_since = loop.time()
        #: Whether anything at all was received (before that, the first-byte deadline).
        self.heard = False
        self.frame_started: float | None = None
        self.frame_bytes = 0
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0
        self._arm(self.quiet_since + self._first_timeout())

    def active(self, _: object = None) -> None:
        """Data arrived, or a request in flight ended (also a task's done callback)."""
        self.quiet_since = self._loop.time()
        self.heard = True

    def _first_timeout(self) -> float:
        return min(self._frame_timeout, self._idle_timeout)

    def frame(self, pending: int, completed: bool = False) -> None:
        """``pending`` bytes of a request frame are buffered (0: no partial frame);
        ``completed``: the data just received finished at least one frame. The
        deadline runs from when the partial frame was first seen: a frame completed
        means the partial one after it is new (its first bytes came in this data),
        so a client pipelining requests whose every send ends inside a frame is
        never closed while frames keep completing."""
        if not pending:
            self.frame_started, self.frame_bytes = None, 0
            return
        self.frame_bytes = pending
        if completed:
            self.frame_started = None
        if self.frame_started is None:
            self.frame_started = started = self._loop.time()
            if started + self._frame_timeout < self._at:
                self._arm(started + self._frame_timeout)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._at = when
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        now = self._loop.time()
        deadlines: list[float] = []
        if self.frame_started is not None:
            ends = self.frame_started + self._frame_timeout
            if ends <= now:
                self._close(
                    "frame_timeout",
                    f"a request frame ({self.frame_bytes} bytes so far) took over "
                    f"{self._frame_timeout:g} s",
                )
                return
            deadlines.append(ends)
        elif not self._busy:
            limit = self._idle_timeout if self.heard else self._first_timeout()
            ends = self.quiet_since + limit
            if ends <= now:
                silent = "idle" if self.heard else "sent nothing"
                self._close("idle_timeout", f"{silent} for {limit:g} s")
                return
            deadlines.append(ends)
        # Busy: look again one idle period from now (the last request to end moves
        # quiet_since, which the next look reads).
        self._arm(min(deadlines, default=now + self._idle_timeout))
