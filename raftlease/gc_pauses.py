"""Short garbage-collection pauses in a process that holds many long-lived objects.

CPython's cyclic collector scans every tracked object of its oldest generation in a
full collection, and runs one whenever the objects promoted since the last one pass a
quarter of those that survived it. A process that holds many long-lived objects and
keeps promoting short-lived ones (a leader holding 50,000 lease sessions and leases
while it answers 15,000 keep-alives a second; an agents' process holding 12,500
sessions and their tasks) then stops for a full scan every few seconds. Measured in
the 50,000-agent benchmark on a 2-core machine (docs/performance.md): full collections
of 300-680 ms, 35-58 of them per node in 3.5 minutes and 33-43 per agents' process;
keep-alives waiting behind them made the p99.

``FreezeSurvivors`` moves the survivors of each full collection to the permanent
generation (``gc.freeze()``), so the next full collection scans only what was
promoted since: the long-lived objects are scanned once, not every few seconds.
Reference counting frees objects as always, frozen or not; only *cyclic* garbage
among frozen objects waits: every ``unfreeze_interval`` seconds the next full
collection finds them unfrozen (``gc.unfreeze()``) and scans and collects everything
once, one long pause per interval, so such garbage is bounded by what one interval
makes.

Written for CPython 3.11-3.13's generational collector (a full collection is
generation 2); a collector that reports no generation-2 collections never freezes.
On a later CPython (3.14 made the collector incremental) ``install`` logs a warning
once, so that the helper is not silently doing nothing; ``freezes`` staying at 0 in a
node's status says the same.

Threads: the callback runs on whichever thread triggered the collection, while it
holds the GIL (CPython runs collections under it); ``gc.freeze`` and ``gc.unfreeze``
only move the collector's lists. Nothing blocks; nothing raises.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: The newest CPython whose collector this was measured with (module docstring).
MEASURED_UP_TO = (3, 13)

#: Seconds between two full collections that see every object (the node's default of
#: ``gc_unfreeze_interval``).
DEFAULT_UNFREEZE_INTERVAL = 600.0


_current: FreezeSurvivors | None = None


def current() -> FreezeSurvivors | None:
    """The one installed in this process, if any."""
    return _current


class FreezeSurvivors:
    """Freezes the survivors of each full collection (module docstring); unfreezes
    them every ``unfreeze_interval`` seconds. ``install`` / ``uninstall``; counters
    ``freezes`` and ``unfreezes``; ``clock`` is injectable for tests."""

    def __init__(
        self,
        unfreeze_interval: float = DEFAULT_UNFREEZE_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not unfreeze_interval > 0:
            raise ValueError(f"unfreeze_interval must be positive, got {unfreeze_interval!r}")
        self.unfreeze_interval = unfreeze_interval
        self._clock = clock
        self._next_unfreeze = clock() + unfreeze_interval
        self._lock = threading.Lock()
        self.freezes = 0
        self.unfreezes = 0
        self.installed = False

    def install(self) -> FreezeSurvivors:
        """Start (idempotent); the process's ``current()`` from now on. Returns self."""
        global _current
        with self._lock:
            if not self.installed:
                if sys.version_info[:2] > MEASURED_UP_TO:
                    log.warning(
                        "freezing garbage-collection survivors was measured on CPython up "
                        "to %d.%d, this is %d.%d: its collector may never report the full "
                        "collections this waits for (see status gc_freeze.freezes)",
                        *MEASURED_UP_TO,
                        *sys.version_info[:2],
                    )
                gc.callbacks.append(self._after)
                self.installed = True
                _current = self
        return self

    def uninstall(self) -> None:
        """Stop, and unfreeze what was frozen (the collector sees everything again,
        also what the process froze by itself: ``gc.unfreeze`` has no owner)."""
        global _current
        with self._lock:
            if self.installed:
                gc.callbacks.remove(self._after)
                self.installed = False
                if _current is self:
                    _current = None
                gc.unfreeze()

    def describe(self) -> dict[str, Any]:
        """For a node's status: the interval and the counts. (Not the objects frozen:
        ``gc.get_freeze_count`` walks them all, ~25 ms at 1.4 million.)"""
        return {
            "unfreeze_interval": self.unfreeze_interval,
            "freezes": self.freezes,
            "unfreezes": self.unfreezes,
        }

    def _after(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info.get("generation") != 2:
            return
        now = self._clock()
        if now >= self._next_unfreeze:
            # The next full collection scans everything once: cyclic garbage among
            # the frozen objects is collected then.
            self._next_unfreeze = now + self.unfreeze_interval
            gc.unfreeze()
            self.unfreezes += 1
        else:
            gc.freeze()
            self.freezes += 1
