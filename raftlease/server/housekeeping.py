"""The leader's housekeeping loops of one node: its ``tick`` and ``reserve`` entries
(log time, expiry, the barrier of a new term, fencing-token reserve), and the heap
trim every node does (server/heap.py).

Threads: the node's event loop; each loop runs until cancelled (the node's stop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..clock import Clock
from ..config import NodeConfig
from ..core import Result
from ..errors import RaftLeaseError
from ..limits import TOKEN_RESERVE_STEP
from ..replication import Replica
from .certs import key_entry, rotation_due
from .heap import HeapTrimmer
from .keepalive import MemoryKeepalives
from .log_clock import LogClock
from .metrics import NodeMetrics

log = logging.getLogger("raftlease.server")  # the node's logger, as before the split

#: The leader proposes a tick at least this often (seconds) to keep log time fresh.
LOG_TIME_REFRESH = 1.0


class Housekeeping:
    """The loops (see the module docstring). Owned by ``NodeServer``, which hands it
    ``replica`` (None while the node starts), ``keepalives`` (the proposer's, None
    before it exists), ``propose`` and ``metrics`` (None without an admin_address)."""

    def __init__(
        self,
        config: NodeConfig,
        clock: Clock,
        log_clock: LogClock,
        *,
        replica: Callable[[], Replica | None],
        keepalives: Callable[[], MemoryKeepalives | None],
        propose: Callable[[dict[str, Any]], Awaitable[Result]],
        metrics: NodeMetrics | None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.log_clock = log_clock
        self._replica = replica
        self._keepalives = keepalives
        self._propose = propose
        self._metrics = metrics
        #: A tick or reserve entry of this loop is in flight (one at a time).
        self._tick_in_flight = False

    async def expiry_loop(self) -> None:
        """The leader's housekeeping entries (``tick``, ``reserve``, ``certkey``), one
        at a time:

        * a ``reserve`` when fewer than half a ``TOKEN_RESERVE_STEP`` of fencing
          tokens are left below the ceiling (core.store);
        * a ``certkey`` when the lease certificate signing key, if there is one, is
          older than ``CERT_KEY_ROTATION_MS`` (server/certs.py);
        * at once after an election: an entry of its own term, the barrier before it
          may serve lease reads;
        * when a lease is due, so expired leases are removed (and waiters woken, and
          memory freed) even when no request touches them; every command also expires
          what is due, so this is for timeliness, not correctness;
        * at least every ``LOG_TIME_REFRESH`` seconds, so log time in the state never
          lags real time by more than that. A new leader continues log time from the
          last applied stamp: without these ticks an idle period before a failover
          would lengthen every lease by its whole length.
        """
        interval = self.config.heartbeat_interval
        last_tick = -1.0
        while True:
            await asyncio.sleep(interval)
            replica = self._replica()
            if replica is None or self._tick_in_flight or not replica.is_leader():
                continue
            try:
                due = replica.store.next_deadline()
            except IndexError:  # raced with the tick thread popping the heap
                continue
            term = replica.term()
            store = replica.store
            if store.term == term and store.ceiling - store.revision < (
                TOKEN_RESERVE_STEP // 2 + store.token_headroom()
            ):
                # Reserve the next step of fencing tokens long before the ceiling
                # (core.store): this entry is synced in either durability mode.
                self._tick_in_flight = True
                try:
                    await self._propose({"op": "reserve"})
                except RaftLeaseError as exc:
                    log.debug("reserve not applied: %s", exc)
                finally:
                    self._tick_in_flight = False
                continue
            now_mono = self.clock.monotonic()
            stamp = self.log_clock.stamp(term, replica.store.now)
            if store.term == term and rotation_due(store.cert_keys, stamp):
                # A new lease certificate signing key (server/certs.py): drawn here,
                # stored through the log; the old one stays for verification.
                self._tick_in_flight = True
                try:
                    await self._propose(key_entry(store.cert_keys))
                except RaftLeaseError as exc:
                    log.debug("certkey not applied: %s", exc)
                finally:
                    self._tick_in_flight = False
                continue
            keep = self._keepalives()
            flush_at = keep.next_flush_at() if keep is not None else None
            needed = (
                replica.store.term < term
                or now_mono - last_tick >= LOG_TIME_REFRESH
                or (due is not None and due <= stamp)
                # Keep-alives answered from memory, due for the log: a tick's flush
                # writes them (server/keepalive.py).
                or (flush_at is not None and flush_at <= stamp)
            )
            if not needed:
                continue
            self._tick_in_flight = True
            last_tick = now_mono
            try:
                await self._propose({"op": "tick"})
            except RaftLeaseError as exc:
                log.debug("tick not applied: %s", exc)
            finally:
                self._tick_in_flight = False

    async def heap_trim_loop(self) -> None:
        """Every ``heap_trim_interval`` seconds, hand the heap's free pages back to the
        kernel (server/heap.py: without it a node that runs for hours keeps growing by
        freed memory the allocator cannot return). On the event loop: a trim takes
        milliseconds at most at a node's size. Off with 0, or where the C library
        has no ``malloc_trim`` (logged once)."""
        interval = self.config.heap_trim_interval
        if interval <= 0:
            return
        trimmer = HeapTrimmer()
        if not trimmer.available:
            log.info("heap trimming off: this C library has no malloc_trim")
            return
        while True:
            await asyncio.sleep(interval)
            trimmer.trim()
            if self._metrics is not None:
                self._metrics.heap_trims.inc()
                self._metrics.heap_trim_seconds.set(trimmer.last_seconds)
            if trimmer.last_seconds > 0.05:  # a heap far larger than a node's should be
                log.warning("heap trim took %.3f s", trimmer.last_seconds)
