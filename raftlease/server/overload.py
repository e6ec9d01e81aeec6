"""Admission control: how far the node's event loop runs behind, and the requests a
node past its capacity refuses.

Past its capacity a node's event loop falls behind: every answer waits behind a
longer turn of work. A leader that then goes on admitting new lease sessions ends in
a collapse, not a slowdown (docs/performance.md, "50,000 agents"): at the step from
32,000 to 34,000 agents on two cores the opening burst delayed keep-alives for
seconds, the leader was deposed and 15,571 live sessions were lost. So the node
measures its loop's lag (a timer every ``SAMPLE_INTERVAL``: how late it fires) and,
while the median of the last ``WINDOW`` seconds of samples is above ``overload_lag``,
refuses the requests that bring load of their own (``SHED_OPS``: opening a lease
session) with ``OVERLOADED`` (definite, retryable after ``RETRY_AFTER`` seconds),
and serves everything else: the keep-alives, releases, acquires and reads of the
sessions it has. It admits them again once the median is below half the limit.

The median of a time window, not one sample: a garbage collection or a journal sync
that holds the loop once is not overload; a loop behind on every turn is. The
window is counted in seconds, not samples, because a loop that is behind takes
fewer samples (but at least ``MIN_SAMPLES``: one late sample after the process was
paused whole is no overload either).

Threads: the event loop only. Nothing here blocks or raises.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections import deque

log = logging.getLogger("raftlease.server")

#: Seconds between two lag samples.
SAMPLE_INTERVAL = 0.05
#: Seconds of samples the median is taken over.
WINDOW = 1.0
#: The median is of at least this many samples, older ones too: one late sample after a
#: pause of the whole process (SIGSTOP, a VM migration) is not overload, while a loop
#: behind by half a second on every turn still takes three samples in 1.5 s.
MIN_SAMPLES = 3
#: Seconds an ``OVERLOADED`` answer asks the client to wait before it tries again.
RETRY_AFTER = 1.0
#: Requests refused while the node is overloaded: each would add lasting load of its
#: own (a session's keep-alives for as long as it lives). Work of the sessions the
#: node has, and their ends, are always served.
SHED_OPS = frozenset({"session_open"})


class LoopLag:
    """The event loop's lag and whether the node is overloaded. ``run`` samples it
    (a task for the node's lifetime; cancel it to stop); ``add`` takes one sample
    (``run`` calls it; tests give samples by hand). ``limit`` is ``overload_lag``
    (seconds; 0: never overloaded); each change of state is logged. Event loop
    only."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        #: (loop time, lag) of the last ``WINDOW`` seconds.
        self._samples: deque[tuple[float, float]] = deque()
        #: The median lag of the window (seconds), as of the last sample.
        self.lag = 0.0
        self.overloaded = False
        #: Requests refused while overloaded, since the start.
        self.refused = 0

    def add(self, now: float, lag: float) -> None:
        """One sample: at loop time ``now`` the timer fired ``lag`` seconds late."""
        samples = self._samples
        samples.append((now, max(0.0, lag)))
        while len(samples) > MIN_SAMPLES and samples[0][0] < now - WINDOW:
            samples.popleft()
        self.lag = statistics.median(sample for _, sample in samples)
        if self.limit <= 0:
            return
        # Hysteresis: in above the limit, out below half of it, so that a node at the
        # edge does not flap between admitting and refusing on every sample.
        if self.lag < self.limit / 2 if self.overloaded else self.lag > self.limit:
            self.overloaded = not self.overloaded
            if self.overloaded:
                log.warning(
                    "overloaded: the event loop runs %.0f ms behind (median of the last "
                    "%.1f s; overload_lag %.0f ms): refusing new lease sessions (OVERLOADED) "
                    "until it is below %.0f ms",
                    self.lag * 1000,
                    WINDOW,
                    self.limit * 1000,
                    self.limit * 500,
                )
            else:
                log.warning(
                    "no longer overloaded: the event loop runs %.0f ms behind; admitting "
                    "new lease sessions again (%d refused so far)",
                    self.lag * 1000,
                    self.refused,
                )

    def refuses(self, op: str) -> bool:
        """Whether a request ``op`` is refused now (and counts it when it is)."""
        if self.overloaded and op in SHED_OPS:
            self.refused += 1
            return True
        return False

    async def run(self) -> None:
        """Sample the running loop's lag every ``SAMPLE_INTERVAL`` until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + SAMPLE_INTERVAL
            await asyncio.sleep(SAMPLE_INTERVAL)
            now = loop.time()
            self.add(now, now - due)
