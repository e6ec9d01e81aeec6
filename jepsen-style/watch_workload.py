"""The chaos suite's watcher (issue 37): one watch stream at a time, every delivered
event recorded, so that ``watch_checker`` can judge what a watch client was told.

``WatchRecorder`` (a thread with its own event loop and ``raftlease.AsyncClient``)
watches ``WatchConfig.prefix`` (``""``: every change) from revision 1, from the
cluster's start, so the first stream sees the first term's revisions and the checker
knows where the terms' jumps can land. Every ``rotate_every`` seconds it closes the
stream and opens a new one from its next revision (``from_revision`` = last delivered
+ 1): a resumption the server serves from its watch history, beside the reconnections
the client makes inside one stream. A stream that ends with an error the client saw
(``COMPACTED``: the serving node no longer has the revision) is recorded so, and the
next one starts where the error says (its ``revision`` + 1), or from the same place.

Recorded as ``watch`` events (the history's ``t`` is CLOCK_MONOTONIC):
``start`` (``stream``, ``process``, ``prefix``, ``from_revision``), ``events``
(``stream``, ``events``: ``[{revision, type, key, owner, token, units}]`` delivered
since the last batch, in order; one batch every ``flush_every`` seconds) and ``end``
(``stream``, ``reason``: ``stopped`` | ``rotate`` | ``limit`` | ``error``, and
``error``: the code). Bounded: at most ``max_streams`` streams and ``max_events``
events a run (then it stops, ``limit``), and it stops with the run's ``stop`` event.

Threads: ``WatchRecorder.run`` runs its own asyncio loop; it only calls ``emit``
(``History.append`` is thread-safe) and reads ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

Event = dict[str, Any]


@dataclass(frozen=True)
class WatchConfig:
    #: The watched prefix: "" (every change is an event, so gaps can be judged).
    prefix: str = ""
    #: Seconds a stream lasts before it is closed and resumed from its next revision.
    rotate_every: float = 20.0
    #: Seconds between the batches of delivered events written to the history.
    flush_every: float = 0.25
    #: Bounds of one run's recording (the history stays a bounded size).
    max_streams: int = 500
    max_events: int = 300_000
    #: Seconds to wait before a new stream after one ended with an error.
    retry_after: float = 0.2

    def meta(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "rotate_every": self.rotate_every,
            "max_streams": self.max_streams,
            "max_events": self.max_events,
        }


class WatchClient(Protocol):
    """What the recorder uses of ``raftlease.AsyncClient``."""

    def watch(self, prefix: str = "", *, from_revision: int = 0) -> AsyncIterator[Any]: ...

    async def close(self) -> None: ...


def row(event: Any) -> dict[str, Any]:
    """The recorded fields of a ``raftlease.WatchEvent``."""
    return {
        "revision": int(event.revision),
        "type": str(event.type),
        "key": str(event.key),
        "owner": str(event.owner),
        "token": int(event.token),
        "units": int(event.units),
    }


class WatchRecorder(threading.Thread):
    """Records watch streams into the history until ``stop`` (or its bounds)."""

    def __init__(
        self,
        name: str,
        make_client: Callable[[], WatchClient],
        emit: Callable[[Event], Any],
        config: WatchConfig,
        stop: threading.Event,
    ) -> None:
        super().__init__(name=f"watch-{name}", daemon=True)
        self.process = name
        self.make_client = make_client
        self.emit = emit
        self.config = config
        self.stop_event = stop
        self.streams = 0
        self.delivered = 0
        self.errors: list[str] = []

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by the harness; a stream without end
            self.errors.append(f"{self.process}: {exc!r}")  # makes the checker unknown

    async def _main(self) -> None:
        cfg = self.config
        client = self.make_client()
        try:
            next_from = 1  # from the cluster's first revision: see the module docstring
            while (
                not self.stop_event.is_set()
                and self.streams < cfg.max_streams
                and self.delivered < cfg.max_events
            ):
                self.streams += 1
                reason, last, error = await self._stream(
                    client, f"{self.process}:{self.streams}", next_from
                )
                if last is not None:
                    next_from = last + 1
                if error is not None:
                    revision = getattr(error, "detail", {}).get("revision")
                    if getattr(error, "code", "") == "COMPACTED" and isinstance(revision, int):
                        # What the serving node has: re-start after it (the changes in
                        # between are lost to this watcher, and to no one else).
                        next_from = revision + 1
                    await asyncio.sleep(cfg.retry_after)
                if reason == "limit":
                    break
        finally:
            with contextlib.suppress(Exception):
                await client.close()

    async def _stream(
        self, client: WatchClient, sid: str, from_revision: int
    ) -> tuple[str, int | None, BaseException | None]:
        """One stream, recorded; returns why it ended, its last delivered revision and
        the error the client saw (if that is why)."""
        cfg = self.config
        self.emit(
            {
                "type": "watch",
                "f": "start",
                "stream": sid,
                "process": self.process,
                "prefix": cfg.prefix,
                "from_revision": from_revision,
            }
        )
        pending: list[dict[str, Any]] = []
        last: list[int] = []

        async def consume() -> None:
            async for event in client.watch(cfg.prefix, from_revision=from_revision):
                pending.append(row(event))
                last[:] = [int(event.revision)]
                self.delivered += 1
                if self.delivered >= cfg.max_events:
                    return

        def flush() -> None:
            if pending:
                self.emit({"type": "watch", "f": "events", "stream": sid, "events": list(pending)})
                pending.clear()

        loop = asyncio.get_running_loop()
        rotate_at = loop.time() + cfg.rotate_every
        task = asyncio.create_task(consume())
        reason, error = "rotate", None
        while True:
            done, _ = await asyncio.wait({task}, timeout=cfg.flush_every)
            flush()
            if done:
                error = task.exception()
                reason = "limit" if error is None else "error"
                break
            if self.stop_event.is_set():
                reason = "stopped"
                break
            if loop.time() >= rotate_at:
                break
        if not task.done():
            # Cancelled inside the client's generator: it closes the stream (finally).
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        flush()
        end: Event = {"type": "watch", "f": "end", "stream": sid, "reason": reason}
        if error is not None:
            end["error"] = getattr(error, "code", type(error).__name__)
            end["message"] = str(error)[:200]
        self.emit(end)
        return reason, (last[0] if last else None), error
