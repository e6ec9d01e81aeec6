"""The client connection's two time limits on one timer (server/conn_timer.py), on a
real event loop with short limits: when it closes, why, and that requests in flight,
new data and a finished frame keep a connection open."""

from __future__ import annotations

import asyncio

import pytest

from raftlease.server.conn_timer import ConnectionTimer

pytestmark = pytest.mark.timeout(30)


class Closed:
    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.limits: list[str] = []
        self.event = asyncio.Event()

    def __call__(self, limit: str, reason: str) -> None:
        self.limits.append(limit)
        self.reasons.append(reason)
        self.event.set()


async def closed(c: Closed, within: float = 10.0) -> str:
    """``limit: reason`` of the first close."""
    await asyncio.wait_for(c.event.wait(), within)
    return f"{c.limits[0]}: {c.reasons[0]}"


def test_a_quiet_connection_is_closed_after_idle_timeout() -> None:
    async def main() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        c = Closed()
        started = loop.time()
        timer = ConnectionTimer(loop, 5.0, 0.2, set(), c)
        timer.active()  # it sent something (a connection that never did: below)
        try:
            return await closed(c), loop.time() - started
        finally:
            timer.stop()

    reason, took = asyncio.run(main())
    assert reason == "idle_timeout: idle for 0.2 s"
    assert took >= 0.2


def test_a_connection_that_never_sends_is_closed_at_the_frame_deadline() -> None:
    """Issue 37: one that never sent a byte stayed open for idle_timeout (15 min by
    default); it is closed after min(frame_timeout, idle_timeout), as idle."""

    async def main() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        c = Closed()
        started = loop.time()
        timer = ConnectionTimer(loop, 0.2, 600.0, set(), c)
        try:
            return await closed(c), loop.time() - started
        finally:
            timer.stop()

    reason, took = asyncio.run(main())
    assert reason == "idle_timeout: sent nothing for 0.2 s"
    assert 0.2 <= took < 5


def test_once_it_has_sent_something_only_idle_timeout_applies() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        c = Closed()
        timer = ConnectionTimer(loop, 0.1, 600.0, set(), c)
        timer.active()
        try:
            await asyncio.sleep(0.5)  # five frame deadlines: the input, not a guess
            return list(c.reasons)
        finally:
            timer.stop()

    assert asyncio.run(main()) == []


def test_a_request_in_flight_keeps_it_open_and_the_idle_clock_starts_when_it_ends() -> None:
    async def main() -> tuple[list[str], float, float]:
        loop = asyncio.get_running_loop()
        c = Closed()
        busy: set[object] = {"request"}
        timer = ConnectionTimer(loop, 5.0, 0.1, busy, c)
        try:
            await asyncio.sleep(0.5)  # five idle periods with a request in flight
            still_open = list(c.reasons)
            busy.clear()
            ended = loop.time()
            timer.active()
            await closed(c)
            return still_open, ended, loop.time()
        finally:
            timer.stop()

    still_open, ended, closed_at = asyncio.run(main())
    assert still_open == []
    assert closed_at - ended >= 0.1


def test_data_received_moves_the_idle_clock() -> None:
    async def main() -> tuple[list[str], str]:
        loop = asyncio.get_running_loop()
        c = Closed()
        timer = ConnectionTimer(loop, 5.0, 0.3, set(), c)
        try:
            for _ in range(6):  # 0.6 s of traffic every 0.1 s: never 0.3 s quiet
                await asyncio.sleep(0.1)
                timer.active()
            while_talking = list(c.reasons)
            return while_talking, await closed(c)
        finally:
            timer.stop()

    while_talking, reason = asyncio.run(main())
    assert while_talking == []
    assert reason == "idle_timeout: idle for 0.3 s"


def test_a_partial_frame_is_closed_at_the_frame_deadline_even_with_requests_in_flight() -> None:
    async def main() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        c = Closed()
        timer = ConnectionTimer(loop, 0.2, 600.0, {"request"}, c)
        try:
            started = loop.time()
            timer.frame(7)  # earlier than the armed idle look: re-armed
            return await closed(c), loop.time() - started
        finally:
            timer.stop()

    reason, took = asyncio.run(main())
    assert reason == "frame_timeout: a request frame (7 bytes so far) took over 0.2 s"
    assert 0.2 <= took < 5.0


def test_a_frame_that_completes_in_time_is_not_closed() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        c = Closed()
        timer = ConnectionTimer(loop, 0.2, 600.0, {"request"}, c)
        try:
            timer.frame(7)
            timer.frame(0)  # whole before its deadline
            await asyncio.sleep(0.5)
            return c.reasons
        finally:
            timer.stop()

    assert asyncio.run(main()) == []


def test_stop_cancels_the_timer() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        c = Closed()
        timer = ConnectionTimer(loop, 0.1, 0.1, set(), c)
        timer.stop()
        await asyncio.sleep(0.3)
        return c.reasons

    assert asyncio.run(main()) == []


def test_a_new_partial_frame_after_a_completed_one_gets_its_own_deadline() -> None:
    """A pipelining client whose every send ends inside a frame: frames keep
    completing, so no one frame is late, however long the stream of partial ones."""

    async def main() -> tuple[list[str], str]:
        loop = asyncio.get_running_loop()
        c = Closed()
        timer = ConnectionTimer(loop, 0.3, 600.0, set(), c)
        try:
            timer.frame(7)
            for _ in range(8):  # 0.8 s of partial frames, each completed within 0.1 s
                await asyncio.sleep(0.1)
                timer.frame(7, completed=True)
            while_progressing = list(c.reasons)
            return while_progressing, await closed(c)  # then one stalls
        finally:
            timer.stop()

    while_progressing, reason = asyncio.run(main())
    assert while_progressing == []
    assert reason == "frame_timeout: a request frame (7 bytes so far) took over 0.3 s"
