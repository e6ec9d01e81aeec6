"""Proposing entries: requests made in one event-loop turn go to Raft together, as
one ``batch`` log entry, stamped with log time and term.

Threads: ``propose`` and ``_flush`` run on the event loop; the replica's callbacks run
on PySyncObj's tick thread and hop back with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack

from ..core import Result
from ..core.snapshot import ENTRY_FORMAT
from ..errors import InternalError, RaftLeaseError, TimeoutError_, UnavailableError
from ..replication import Replica
from .keepalive import Extension, MemoryKeepalives
from .log_clock import LogClock

log = logging.getLogger("raftlease.server")

#: Most requests replicated together in one batch log entry.
MAX_BATCH_ENTRIES = 64


#: Most bytes of strings in one batch entry. PySyncObj sends a log entry of 64 KiB or
#: more (``appendEntriesBatchSizeBytes``) through its ``transmission`` path, which our
#: follower-side correction of ``append_entries`` does not cover (docs/pysyncobj.md
#: trap 5); batches stay well below it. A single request is far smaller (its key,
#: owner and value are capped at a few KiB).
MAX_BATCH_BYTES = 32 * 1024


class Proposer:
    """Replicates entries for one node (the leader; a follower's proposals fail).

    ``replica`` returns the node's replica (None while starting or stopping)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        replica: Callable[[], Replica | None],
        log_clock: LogClock,
        request_timeout: float,
    ) -> None:
        self._loop = loop
        self._replica = replica
        self.log_clock = log_clock
        self.request_timeout = request_timeout
        # Proposals waiting for the end of this event-loop turn (see ``propose``).
        self._pending: list[tuple[dict[str, Any], asyncio.Future[Result]]] = []
        self._flush_scheduled = False
        #: Called on the tick thread with the seconds from proposing an entry to its
        #: result (metrics.NodeMetrics.observe_commit); None: not measured.
        self.on_commit: Callable[[float], None] | None = None
        #: Keep-alives the leader answered from memory (server/keepalive.py): each
        #: flush first writes those due, so no entry moves log time past an expiry
        #: the log holds for a lease or session renewed only in memory.
        self.keepalives = MemoryKeepalives()

    def due_keepalives(self, keep: MemoryKeepalives, now: int) -> list[Any]:
        """The keep-alives answered from memory that this flush must write first
        (``MemoryKeepalives.take_due``). A test build overrides it to plant a bug
        (``ServerHooks.proposer_class``); production code has no switch for it."""
        return keep.take_due(now)

    async def propose(self, entry: dict[str, Any]) -> Result:
        """Replicate ``entry`` and return its result.

        Entries proposed in the same turn of the event loop are stamped together and
        replicated as one ``batch`` log entry (up to ``MAX_BATCH_ENTRIES``): PySyncObj's
        cost is per log entry (a pickled, compressed message to every follower, twice),
        so under concurrent load batching multiplies throughput; a lone request is
        proposed as itself, with no added wait.
        """
        loop = self._loop
        future: asyncio.Future[Result] = loop.create_future()
        self._pending.append((entry, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        # The deadline is one timer per log entry, set by the flush in this turn of
        # the loop (not asyncio.wait_for, which adds a second future and two callbacks
        # per request, nor a timer per request). Cancelling the awaiting task cancels
        # ``future``; its result, if it comes later, is dropped (``_settle``).
        return await future

    def _flush(self) -> None:
        """Event loop: propose what accumulated, stamped with log time and term."""
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        replica = self._replica()
        loop = self._loop
        if replica is None:
            for _, future in pending:
                if not future.done():
                    future.set_exception(UnavailableError("node is stopping"))
            return
        term = replica.term()
        now = self.log_clock.stamp(term, replica.store.now)
        keep = self.keepalives
        keep.reset(term)
        extensions = self.due_keepalives(keep, now)
        if extensions and not self._propose_extensions(replica, extensions, term, now):
            # Not even queued (PySyncObj's command queue is full): nothing after them
            # may go either, or it could move log time past what they extend.
            keep.give_back(extensions)
            for _, future in pending:
                if not future.done():
                    future.set_exception(UnavailableError("the Raft command queue is full"))
            return
        # The first entries of a term move the fencing-token ceiling (core.store), as
        # does a reserve: they reach stable storage in either durability mode.
        new_term = replica.store.term < term
        for chunk in split_batches(pending, lambda item: _text_bytes(item[0])):
            # The entry's randomness, drawn here like its time stamp: the source of
            # the task queues' backoff jitter (core/queue.py).
            seed = secrets.randbits(32)
            stamp = {"term": term, "now": now, "seed": seed, "fv": ENTRY_FORMAT}
            if len(chunk) == 1:
                body: dict[str, Any] = {**chunk[0][0], **stamp}
            else:
                body = {"op": "batch", **stamp, "entries": [entry for entry, _ in chunk]}
            if new_term or any(entry.get("op") == "reserve" for entry, _ in chunk):
                body["durable"] = True  # replication.durable.DURABLE_MARK
            futures = [future for _, future in chunk]
            started = time.perf_counter() if self.on_commit is not None else 0.0
            timer = loop.call_later(self.request_timeout, _expire, futures, self.request_timeout)

            def on_done(
                result: Result | None,
                err: RaftLeaseError | None,
                futures: list[asyncio.Future[Result]] = futures,
                started: float = started,
                on_commit: Callable[[float], None] | None = self.on_commit,
                timer: asyncio.TimerHandle = timer,
            ) -> None:
                if on_commit is not None and err is None:
                    on_commit(time.perf_counter() - started)
                # Tick thread: hop to the event loop.
                with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                    loop.call_soon_threadsafe(_settle, futures, result, err, timer)

            replica.propose(msgpack.packb(body, use_bin_type=True), on_done)

    def _propose_extensions(
        self, replica: Replica, extensions: list[Extension], term: int, now: int
    ) -> bool:
        """Propose one ``extend`` entry per item of ``extensions``, ahead of the flush's
        requests. False when one could not even be queued (PySyncObj answers a full
        command queue at once, on this thread); an entry that fails later (leadership
        lost) needs nothing: the next leader's first entry extends every lease."""
        refused: list[RaftLeaseError] = []
        keep, loop = self.keepalives, self._loop
        for ext in extensions:
            flight = keep.proposed(ext)

            def on_done(
                result: Result | None, err: RaftLeaseError | None, flight: int = flight
            ) -> None:
                # Tick thread, once applied here (or failed). Until the event loop
                # hears of it, reads of what it extends go through the log.
                if err is not None:
                    refused.append(err)
                    log.debug("keep-alives not written: %s", err)
                with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                    loop.call_soon_threadsafe(keep.landed, flight)

            body = {**ext.entry(), "term": term, "now": now, "fv": ENTRY_FORMAT}
            replica.propose(msgpack.packb(body, use_bin_type=True), on_done)
            if refused:
                return False
        return True


def _text_bytes(entry: dict[str, Any]) -> int:
    """A cheap upper bound of an entry's packed size: its strings (4 bytes a character
    unless ASCII, a constant-time check) plus 16 bytes per field (msgpack's field
    names here are short, its numbers at most 9 bytes)."""
    text = sum(len(v) if v.isascii() else 4 * len(v) for v in entry.values() if isinstance(v, str))
    return text + 16 * len(entry)


T = TypeVar("T")


def split_batches(
    items: list[T],
    size: Callable[[T], int],
    max_entries: int = MAX_BATCH_ENTRIES,
    max_bytes: int = MAX_BATCH_BYTES,
) -> list[list[T]]:
    """Consecutive chunks of ``items``, in order, each of at most ``max_entries`` items
    and ``max_bytes`` (by ``size``); an item larger than ``max_bytes`` goes alone."""
    chunks: list[list[T]] = []
    current: list[T] = []
    used = 0
    for item in items:
        n = size(item)
        if current and (len(current) >= max_entries or used + n > max_bytes):
            chunks.append(current)
            current, used = [], 0
        current.append(item)
        used += n
    if current:
        chunks.append(current)
    return chunks


def _expire(futures: list[asyncio.Future[Result]], timeout: float) -> None:
    """Event loop: ``propose``'s deadline passed before the entry's outcome came."""
    for future in futures:
        if not future.done():
            future.set_exception(
                TimeoutError_(f"no commit within {timeout} s; the outcome is unknown")
            )


def _settle(
    futures: list[asyncio.Future[Result]],
    result: Result | None,
    err: RaftLeaseError | None,
    timer: asyncio.TimerHandle | None = None,
) -> None:
    """Event loop: hand a (batch) entry's outcome to the requests it carried, and
    cancel their deadline (``timer``)."""
    if timer is not None:
        timer.cancel()
    if err is None and result is not None and len(futures) > 1:
        results = result.get("results")
        if result.get("ok") and isinstance(results, list) and len(results) == len(futures):
            for future, one in zip(futures, results, strict=True):
                if not future.done():
                    future.set_result(one)
            return
        err = InternalError(f"batch not applied: {result.get('message', result)}")
    for future in futures:
        if future.done():
            continue
        if err is not None:
            future.set_exception(err)
        else:
            assert result is not None
            future.set_result(result)
