"""Slow and stalled clients on the client port (issue 11): a started frame must arrive
whole within ``frame_timeout``, an idle connection is closed after ``idle_timeout``
(but not one with a watch in flight), and a watcher that does not read is ended with
a definite code, its queue bounded, instead of being buffered without end.

The unit half of these tests (no process); the integration half is
tests/integration/test_client_port_limits.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raftlease.protocol import FrameDecoder, Request
from raftlease.server.watch import WatchHub


class _StuckWriter:
    """A watcher's connection whose reader never reads: drain never returns."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.aborted = False
        self.transport = self

    def write(self, data: bytes) -> None:
        self.frames.extend(FrameDecoder().feed(data))

    async def drain(self) -> None:
        if len(self.frames) > 1:  # the first answer goes out; then the reader stalls
            await asyncio.Event().wait()

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


def test_a_watcher_that_does_not_read_is_dropped_and_its_queue_bounded() -> None:
    async def main() -> None:
        hub = WatchHub(backlog=8, drain_timeout=0.5)
        writer = _StuckWriter()
        request = Request(id=1, op="watch", args={"prefix": "", "from_revision": 0})
        stream = asyncio.create_task(hub.stream(request, writer, lambda: 0))  # type: ignore[arg-type]
        while not hub._watchers:
            await asyncio.sleep(0.01)
        for revision in range(1, 1001):
            event = {"type": "grant", "key": "k", "owner": "o", "token": revision}
            hub._publish([{**event, "revision": revision, "value": "", "units": 1}], False)
        queue = next(iter(hub._watchers.values()))[0]
        assert queue.qsize() <= hub.backlog + 1, "a stalled watcher's queue grew without end"
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(stream, 10)
        assert writer.aborted and not hub._watchers

    asyncio.run(main())


def test_a_slow_watcher_is_told_to_resume() -> None:
    """A watcher that reads, but slower than changes come, gets UNAVAILABLE (which the
    client retries, resuming from its last revision) when its queue is full."""

    async def main() -> None:
        hub = WatchHub(backlog=4, drain_timeout=5.0)
        sent: list[dict[str, Any]] = []

        class Slow(_StuckWriter):
            async def drain(self) -> None:
                await asyncio.sleep(0)

        writer = Slow()
        request = Request(id=1, op="watch", args={"prefix": "", "from_revision": 0})
        stream = asyncio.create_task(hub.stream(request, writer, lambda: 0))  # type: ignore[arg-type]
        while not hub._watchers:
            await asyncio.sleep(0.01)
        for revision in range(1, 50):  # published faster than the stream runs
            event = {"type": "grant", "key": "k", "owner": "o", "token": revision}
            hub._publish([{**event, "revision": revision, "value": "", "units": 1}], False)
        await asyncio.wait_for(stream, 10)
        sent = writer.frames
        assert sent[-1]["ok"] is False and sent[-1]["code"] == "UNAVAILABLE"
        resume = sent[-1]["detail"]["revision"]
        delivered = [e["revision"] for f in sent[1:-1] for e in f["result"]["events"]]
        assert delivered == list(range(1, resume))

    asyncio.run(main())
