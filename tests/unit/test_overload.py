"""Admission control's decisions (server/overload.py) and the client's pause after an
``OVERLOADED`` answer (client/transport.py); the whole path on a real cluster is
tests/integration/test_overload.py."""

from __future__ import annotations

import asyncio

import pytest

from raftlease.client.transport import overload_pause
from raftlease.errors import (
    CODES,
    BudgetExhaustedError,
    OverloadedError,
    UnavailableError,
    from_wire,
)
from raftlease.server.http.parts import error_response
from raftlease.server.overload import SAMPLE_INTERVAL, SHED_OPS, WINDOW, LoopLag

pytestmark = pytest.mark.timeout(30)


def feed(lag: LoopLag, start: float, seconds: float, value: float) -> float:
    """Samples of ``value`` every SAMPLE_INTERVAL for ``seconds``; the end time."""
    now = start
    while now < start + seconds:
        now += SAMPLE_INTERVAL
        lag.add(now, value)
    return now


def test_a_loop_behind_on_every_turn_is_overloaded_and_recovers_below_half_the_limit() -> None:
    lag = LoopLag(0.2)
    now = feed(lag, 0.0, 2.0, 0.001)
    assert not lag.overloaded and lag.lag == 0.001
    now = feed(lag, now, 2.0, 0.3)
    assert lag.overloaded and lag.lag == 0.3
    assert lag.refuses("session_open") and lag.refused == 1
    # Between half the limit and the limit: still overloaded (no flapping at the edge).
    now = feed(lag, now, 2.0, 0.15)
    assert lag.overloaded
    now = feed(lag, now, 2.0, 0.05)
    assert not lag.overloaded and not lag.refuses("session_open")


def test_one_long_pause_is_not_overload() -> None:
    lag = LoopLag(0.2)
    now = feed(lag, 0.0, 2.0, 0.001)
    lag.add(now + 0.5, 0.5)  # one garbage collection or sync held the loop once
    assert not lag.overloaded
    now = feed(lag, now + 0.5, 2.0, 0.001)
    # A whole process paused (SIGSTOP) and resumed: one very late sample, then none
    # late. Not overload either: the median takes the last three at least.
    lag.add(now + 10.0, 9.0)
    assert not lag.overloaded and lag.lag == 0.001
    feed(lag, now + 10.0, 2.0, 0.001)
    assert not lag.overloaded


def test_a_loop_behind_by_more_than_the_sample_interval_is_seen_in_a_second() -> None:
    # The window is in seconds: a loop behind takes fewer samples, all of them late.
    lag = LoopLag(0.2)
    now = feed(lag, 0.0, 2.0, 0.001)
    lag.add(now + 0.5, 0.5)
    assert not lag.overloaded
    lag.add(now + 1.0, 0.5)
    assert lag.overloaded and lag.lag == 0.5


def test_only_new_sessions_are_shed_and_a_limit_of_zero_sheds_nothing() -> None:
    lag = LoopLag(0.1)
    feed(lag, 0.0, WINDOW * 2, 1.0)
    assert lag.overloaded
    for op in ("session_keepalive", "session_close", "acquire", "release", "renew", "get"):
        assert not lag.refuses(op), op
    assert frozenset({"session_open"}) == SHED_OPS and lag.refuses("session_open")
    off = LoopLag(0)
    feed(off, 0.0, WINDOW * 2, 5.0)
    assert off.lag == 5.0 and not off.overloaded and not off.refuses("session_open")


def test_the_sampler_measures_a_blocked_loop() -> None:
    async def run() -> LoopLag:
        lag = LoopLag(0.05)
        task = asyncio.create_task(lag.run())
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.5
        while loop.time() < end:
            await asyncio.sleep(0)
            busy = loop.time() + 0.1
            while loop.time() < busy:  # a turn that holds the loop 0.1 s
                pass
        task.cancel()
        return lag

    lag = asyncio.run(run())
    assert lag.overloaded and lag.lag > 0.05


def test_overloaded_is_a_definite_unavailable_with_its_retry_after() -> None:
    err = from_wire("OVERLOADED", "busy", {"retry_after": 1.0, "lag": 0.4})
    assert isinstance(err, OverloadedError) and isinstance(err, UnavailableError)
    assert err.definite and err.retry_after == 1.0 and "OVERLOADED" in CODES


def test_the_client_pauses_as_asked_jittered_or_gives_up_without_time_for_it() -> None:
    assert overload_pause(1.0, 10.0, 0.0) == 0.5
    assert overload_pause(1.0, 10.0, 0.999) == pytest.approx(1.499)
    assert overload_pause(2.0, 10.0, 0.5) == 2.0
    assert overload_pause(None, 10.0, 0.5) == 1.0  # no retry_after: 1 s
    assert overload_pause(-3.0, 10.0, 0.5) == 1.0  # nonsense from a node: 1 s
    # Less than retry_after would be left after the pause: the refusal now.
    assert overload_pause(1.0, 1.4, 0.5) is None
    assert overload_pause(1.0, 2.0, 0.5) == 1.0


def test_http_error_answers_say_when_to_come_back() -> None:
    overloaded = error_response(OverloadedError("busy", {"retry_after": 1.0, "lag": 0.3}))
    assert overloaded.status == 503 and overloaded.headers["Retry-After"] == "1"
    # Whole seconds, rounded up; none without a finite number of them.
    later = error_response(BudgetExhaustedError("empty", {"retry_after": 2.2}))
    assert later.status == 429 and later.headers["Retry-After"] == "3"
    for value in (None, float("inf"), True, "soon"):
        answer = error_response(BudgetExhaustedError("empty", {"retry_after": value}))
        assert "Retry-After" not in answer.headers, value
