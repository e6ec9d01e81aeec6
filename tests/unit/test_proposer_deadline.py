"""``Proposer.propose``'s own deadline (one timer per log entry, set when the entry is
proposed, not ``asyncio.wait_for`` nor a timer per request): a proposal with no
outcome in time fails with TimeoutError_ and says the outcome is unknown, every
request of a batch alike; an outcome that comes later is dropped; cancelling the
caller cancels the request; an outcome in time cancels the timer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from raftlease.clock import SystemClock
from raftlease.errors import TimeoutError_
from raftlease.server.log_clock import LogClock
from raftlease.server.proposer import Proposer

pytestmark = pytest.mark.timeout(30)

Done = Callable[[Any, Any], None]


class HeldReplica:
    """A replica stand-in that keeps each proposal's callback until the test settles
    it (the event-loop logic under test, not Raft: integration tests cover that)."""

    def __init__(self) -> None:
        self.store = SimpleNamespace(now=0, term=1)
        self.held: list[Done] = []

    def term(self) -> int:
        return 1

    def propose(self, data: bytes, on_done: Done) -> None:
        self.held.append(on_done)


def proposer(timeout: float) -> tuple[Proposer, HeldReplica]:
    replica = HeldReplica()
    loop = asyncio.get_running_loop()
    made = Proposer(loop, lambda: replica, LogClock(SystemClock()), timeout)  # type: ignore[arg-type, return-value]
    return made, replica


async def until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not check():
            await asyncio.sleep(0.001)


def test_no_outcome_in_time_is_a_timeout_and_a_late_outcome_is_dropped() -> None:
    async def main() -> None:
        made, replica = proposer(0.05)
        with pytest.raises(TimeoutError_, match="outcome is unknown"):
            await made.propose({"op": "acquire", "key": "k"})
        assert len(replica.held) == 1
        replica.held[0]({"ok": True}, None)  # late: nobody waits, nothing raised
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())


def test_an_outcome_in_time_is_returned_and_its_timer_cancelled() -> None:
    async def main() -> None:
        made, replica = proposer(5.0)
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(made.propose({"op": "acquire", "key": "k"}))
        await until(lambda: len(replica.held) == 1)
        replica.held[0]({"ok": True, "token": 7}, None)
        assert await task == {"ok": True, "token": 7}
        # the request's deadline timer is cancelled, not left to fire in 5 s
        live = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        assert not live, live

    asyncio.run(main())


def test_cancelling_the_caller_cancels_the_request() -> None:
    async def main() -> None:
        made, replica = proposer(5.0)
        task = asyncio.create_task(made.propose({"op": "acquire", "key": "k"}))
        await until(lambda: len(replica.held) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        replica.held[0]({"ok": True}, None)  # its outcome later: dropped
        await asyncio.sleep(0)

    asyncio.run(main())


def test_requests_batched_into_one_entry_share_one_deadline() -> None:
    async def main() -> None:
        made, replica = proposer(0.1)
        loop = asyncio.get_running_loop()
        tasks = [
            asyncio.create_task(made.propose({"op": "acquire", "key": f"k{i}"})) for i in range(3)
        ]
        await until(lambda: len(replica.held) == 1)  # one batch entry for the three
        live = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        assert len(live) == 1, live
        for task in tasks:
            with pytest.raises(TimeoutError_, match="outcome is unknown"):
                await task
        replica.held[0]({"ok": True, "results": [{"ok": True}] * 3}, None)  # late: dropped
        await asyncio.sleep(0)

    asyncio.run(main())
