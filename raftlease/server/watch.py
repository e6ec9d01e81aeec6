"""The watch hub of one node: recent changes for watches to resume from, and the
live subscribers. Any node serves watches: every replica applies the same log, so it
produces the same events with the same revisions, in the same order.

Threads: ``record`` runs on PySyncObj's tick thread (after each applied entry); the
rest on the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from typing import Any

from ..errors import CompactedError, UnavailableError
from ..models import LEASE_END_KINDS
from ..protocol import Request, encode_frame, error_response, ok_response
from .slots import Slots

#: Changes each node keeps for watches to resume from: at most this many, and at most
#: ``WATCH_HISTORY_BYTES`` of them (whichever bound is reached first).
WATCH_HISTORY = 100_000
#: Estimated bytes of history each node keeps (``event_bytes``). A count alone did not
#: bound memory: 100,000 changes of short keys held ~50 MB per node (more than the
#: rest of the node), and of 4 KiB keys, owners and values over 1 GB; under the soak's
#: load a node's RSS grew by the history for ~30 minutes before the count capped it
#: (jepsen-style/README.md, finding 5). 4 MiB is ~8,000 changes of short keys.
WATCH_HISTORY_BYTES = 4 * 1024 * 1024
#: What one history event costs besides the bytes of its key, owner and value:
#: measured ~500 B on CPython 3.11 (a dict of 7-8 fields, two ints, three small
#: strings' headers, the deque slot) for an event of short strings.
EVENT_OVERHEAD = 400
#: Batches of changes queued for one watch before it is ended as too slow (it then
#: resumes from its last revision, from the history, on a fresh stream).
MAX_WATCH_BACKLOG = 1024
#: Seconds a write to a watcher may wait for it to read before its connection is
#: dropped (its client resumes from its last revision on a new connection).
WATCH_DRAIN_TIMEOUT = 30.0
#: Default watch quotas (node-local: watches are not replicated). The node passes
#: its config's ``max_watches_per_principal`` and ``max_watches_per_node``.
MAX_WATCHES_PER_PRINCIPAL = 256
MAX_WATCHES_PER_NODE = 4096
#: Put on a watch's queue instead of more changes once it is full.
_BEHIND = "behind"
#: Put on a watch's queue when its connection has closed (``end_for``).
_CLOSED = "closed"


#: The fields of a store event a watch may see (never a lease id).
PUBLIC_FIELDS = ("type", "key", "owner", "token", "revision", "value", "units")
#: Public fields only some events have (a pool lease's unit indices; ``handoff``).
OPTIONAL_FIELDS = ("unit_indices", "handoff")
#: Events that end a lease; one is a ``handoff`` when the same log entry grants the
#: key to another owner after it (``mark_handoffs``).
ENDS = LEASE_END_KINDS


def mark_handoffs(events: list[dict[str, Any]]) -> None:
    """Mark ``handoff: True`` on each end of a lease (``ENDS``) that the same log
    entry follows with a grant of the same key: the key passed from one holder to
    the next in one step, and no reader of the log ever saw it free. A watcher (an
    election observer) then knows a ``None`` between the two would be a vacancy that
    never existed. ``events``: one applied entry's, in order; changed in place."""
    granted_after: set[str] = set()
    for event in reversed(events):
        kind = event.get("type")
        if kind == "grant":
            granted_after.add(event["key"])
        elif kind in ENDS and event.get("key") in granted_after:
            event["handoff"] = True


def event_bytes(event: dict[str, Any]) -> int:
    """The history's estimate of what ``event`` (public fields) holds in memory:
    ``EVENT_OVERHEAD`` plus the lengths of its strings and 8 bytes per unit index."""
    size = EVENT_OVERHEAD + len(event.get("unit_indices") or ()) * 8
    for name in ("key", "owner", "value", "type"):
        field = event.get(name)
        if isinstance(field, str | bytes):
            size += len(field)
    return size


class WatchHub:
    """History and subscribers of one node's watches."""

    def __init__(
        self,
        history: int = WATCH_HISTORY,
        history_bytes: int = WATCH_HISTORY_BYTES,
        backlog: int = MAX_WATCH_BACKLOG,
        drain_timeout: float = WATCH_DRAIN_TIMEOUT,
        max_per_principal: int = MAX_WATCHES_PER_PRINCIPAL,
        max_per_node: int = MAX_WATCHES_PER_NODE,
    ) -> None:
        """``history``/``history_bytes``: most changes / estimated bytes of them kept
        for watches to resume from (the oldest go first; a watch from an older
        revision gets ``COMPACTED``); ``backlog``: batches queued per watch before it
        is ended as too slow;
        ``drain_timeout``: how long one write may wait for the watcher to read before
        the connection is dropped; ``max_per_principal``/``max_per_node``: live
        watches one authenticated principal / everyone may have on this node."""
        self.backlog = backlog
        self.drain_timeout = drain_timeout
        #: The watch quotas (event loop only): live watches in all and by principal.
        self.slots = Slots("watches", "max_watches", max_per_principal, max_per_node)
        # Recent changes (public fields only) and the live subscribers. The tick
        # thread alone changes the history and its byte count; readers on the event
        # loop copy it (a deque copy is one C call under the GIL).
        self.history_limit = history
        self.history_bytes = history_bytes
        self._history: collections.deque[dict[str, Any]] = collections.deque()
        self._history_size = 0
        self._watchers: dict[
            object, tuple[asyncio.Queue[list[dict[str, Any]] | str | None], str]
        ] = {}
        #: The writer each live watch streams to (to end them when it closes).
        self._writers: dict[object, object] = {}
        #: The last revision recorded (a change, or a token-ceiling jump).
        self._last: int | None = None

    def record(self, events: list[dict[str, Any]], loop: asyncio.AbstractEventLoop) -> None:
        """Tick thread: add an applied entry's changes to the history and hand them to
        the live watches on the event loop (only if there are any)."""
        # A "jump" (the first entry of a term moving the revision to the fencing-token
        # ceiling, core.store) changes no key: it only moves the expected revision.
        jumps = [e["revision"] for e in events if e.get("type") == "jump"]
        public = [
            {k: e[k] for k in PUBLIC_FIELDS} | {k: e[k] for k in OPTIONAL_FIELDS if k in e}
            for e in events
            if "revision" in e and e.get("type") != "jump"
        ]
        mark_handoffs(public)
        last = jumps[-1] if jumps else self._last
        if not public:
            self._last = last
            return
        gap = False
        history = self._history
        # Revisions are contiguous otherwise (every change adds one): a gap means this
        # node skipped history (it installed a snapshot). The history restarts there.
        if last is not None and public[0]["revision"] != last + 1:
            history.clear()
            self._history_size = 0
            gap = True
        self._last = public[-1]["revision"]
        history.extend(public)  # deque appends are atomic; readers copy first
        self._history_size += sum(event_bytes(e) for e in public)
        # Drop the oldest beyond either bound; the newest change always stays (a
        # watch from the current revision needs no history).
        while len(history) > 1 and (
            len(history) > self.history_limit or self._history_size > self.history_bytes
        ):
            self._history_size -= event_bytes(history.popleft())
        if self._watchers:
            with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                loop.call_soon_threadsafe(self._publish, public, gap)

    def restored(self, revision: int, loop: asyncio.AbstractEventLoop) -> None:
        """Tick thread: a snapshot at ``revision`` replaced the state (the dump at
        start, or one the leader installed). The history restarts after it: a watch
        from an older revision gets ``COMPACTED`` (``_stream``: the revision is the
        store's, the history is empty), and live watches end with ``COMPACTED``
        rather than miss the changes the snapshot covers."""
        self._history.clear()
        self._history_size = 0
        self._last = revision
        if self._watchers:
            with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                loop.call_soon_threadsafe(self._publish, [], True)

    def _publish(self, events: list[dict[str, Any]], gap: bool) -> None:
        """Event loop: feed live watches; after a history gap they end with
        ``COMPACTED`` rather than silently miss events."""
        for queue, prefix in self._watchers.values():
            if gap:
                queue.put_nowait(None)
                continue
            matching = [e for e in events if e["key"].startswith(prefix)]
            if not matching:
                continue
            if queue.qsize() >= self.backlog:
                if queue.qsize() == self.backlog:
                    queue.put_nowait(_BEHIND)  # once: the stream ends when it gets there
                continue
            queue.put_nowait(matching)

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        """Wait until the watcher has read what was written, at most
        ``drain_timeout``; then drop its connection (raises ConnectionResetError)."""
        try:
            await asyncio.wait_for(writer.drain(), self.drain_timeout)
        except TimeoutError:
            writer.transport.abort()
            raise ConnectionResetError("watcher did not read for too long") from None

    def end_for(self, writer: object) -> None:
        """Event loop: the connection behind ``writer`` closed; end its watches now
        (a watch otherwise notices only on its next write), so their quota slots
        are free at once."""
        for token, owner in list(self._writers.items()):
            if owner is writer and token in self._watchers:
                self._watchers[token][0].put_nowait(_CLOSED)

    @property
    def live(self) -> int:
        """Watches streaming on this node now."""
        return len(self._watchers)

    @property
    def history_size(self) -> tuple[int, int]:
        """The history's length and estimated bytes now (any thread; a moment's
        view, the tick thread may be adding to it)."""
        return len(self._history), self._history_size

    def admit(self, principal: str | None) -> None:
        """Raise ``QuotaExceededError`` (definite: nothing subscribed) if one more
        watch would exceed this node's total or ``principal``'s share. Event loop."""
        self.slots.admit(principal)

    async def stream(
        self,
        request: Request,
        writer: asyncio.StreamWriter,
        revision: Callable[[], int],
        principal: str | None = None,
    ) -> None:
        """Stream changes under a prefix, from ``from_revision`` (0: from now), as
        frames that all carry the request's id, until the connection closes.
        ``revision`` returns the node's applied store revision. Counts toward the
        watch quotas of ``principal`` and of the node while it runs; raises
        ``QuotaExceededError`` before writing anything if they are reached."""
        with self.slots.hold(principal):
            await self._stream(request, writer, revision)

    async def _stream(
        self, request: Request, writer: asyncio.StreamWriter, revision: Callable[[], int]
    ) -> None:
        """``stream``'s work, once the watch holds its quota slot."""
        prefix: str = request.args["prefix"]
        start: int = request.args["from_revision"]
        # Subscribe before copying the history: an event the tick thread records in
        # between then reaches us twice (copy and queue) instead of never; revisions
        # already sent are skipped below.
        queue: asyncio.Queue[list[dict[str, Any]] | str | None] = asyncio.Queue()
        token = object()
        self._watchers[token] = (queue, prefix)
        self._writers[token] = writer
        try:
            history = list(self._history)  # a copy: the tick thread appends to it
            current = max(revision(), history[-1]["revision"] if history else 0)
            oldest = history[0]["revision"] if history else current + 1
            if start == 0:
                start = current + 1
            if start < oldest and start <= current:
                err = CompactedError(
                    f"revision {start} is not in this node's watch history (it starts at "
                    f"{oldest}); re-read and watch from {current + 1}",
                    {"revision": current},
                )
                writer.write(encode_frame(error_response(request.id, err)))
                await self._drain(writer)
                return
            backlog = [e for e in history if e["revision"] >= start and e["key"].startswith(prefix)]
            writer.write(
                encode_frame(ok_response(request.id, {"events": backlog, "revision": current}))
            )
            await self._drain(writer)
            next_rev = max(start, history[-1]["revision"] + 1 if history else start)
            while not writer.is_closing():
                events = await queue.get()
                if events is None:
                    err = CompactedError("this node skipped history; resume elsewhere", {})
                    writer.write(encode_frame(error_response(request.id, err)))
                    await self._drain(writer)
                    return
                if events == _CLOSED:
                    return
                if isinstance(events, str):
                    # A watcher that reads slower than changes come: end the stream
                    # rather than buffer without end. The client resumes from its last
                    # revision (UNAVAILABLE is retried), served from the history.
                    behind = UnavailableError(
                        f"watch fell {self.backlog} batches behind; resume from "
                        f"revision {next_rev}",
                        {"revision": next_rev},
                    )
                    writer.write(encode_frame(error_response(request.id, behind)))
                    await self._drain(writer)
                    return
                fresh = [e for e in events if e["revision"] >= next_rev]
                if fresh:
                    next_rev = fresh[-1]["revision"] + 1
                    writer.write(encode_frame(ok_response(request.id, {"events": fresh})))
                    await self._drain(writer)
        finally:
            self._watchers.pop(token, None)
            self._writers.pop(token, None)
