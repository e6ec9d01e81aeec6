"""The keep-alive's failure classification (raftlease/recipes/keepalive.py
``KeepAliveState``): jeopardy once per episode while still valid, lost when the
cluster says it is gone or when validity ran out, callbacks called once, the renewal
interval and schedule.

The state reads ``time.monotonic`` through its module's ``time``; the tests replace
that name in ``raftlease.recipes.keepalive`` only, with a fake clock (the rest of the
process keeps the real one). Fake times are multiples of 1/8 s, exact in binary.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator

import pytest

from raftlease.errors import (
    ClientExpiredError,
    ConnectionLostError,
    InternalError,
    LeaderChangedError,
    LeaseHeldError,
    LeaseNotFoundError,
    NotLeaderError,
    NotOwnerError,
    RaftLeaseError,
    SessionNotFoundError,
    TimeoutError_,
    UnavailableError,
)
from raftlease.recipes import keepalive
from raftlease.recipes.keepalive import GONE, KeepAliveState

pytestmark = pytest.mark.timeout(30)


class FakeTime:
    """Stands in for the ``time`` module inside ``raftlease.recipes.keepalive``."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeTime]:
    fake = FakeTime()
    monkeypatch.setattr(keepalive, "time", fake)
    yield fake


class Calls:
    def __init__(self) -> None:
        self.jeopardy: list[str] = []
        self.lost: list[str] = []
        self.order: list[str] = []

    def on_jeopardy(self, reason: str) -> None:
        self.jeopardy.append(reason)
        self.order.append("jeopardy")

    def on_lost(self, reason: str) -> None:
        self.lost.append(reason)
        self.order.append("lost")


def make(ttl: float = 3.0, noun: str = "lease") -> tuple[KeepAliveState, Calls]:
    calls = Calls()
    state = KeepAliveState(
        "lock k", ttl, noun=noun, on_lost=calls.on_lost, on_jeopardy=calls.on_jeopardy
    )
    return state, calls


#: Failures that say nothing about whether the cluster still has it.
TRANSIENT: list[RaftLeaseError] = [
    UnavailableError("no leader"),
    TimeoutError_("no answer"),
    ConnectionLostError("reset"),
    LeaderChangedError("election"),
    NotLeaderError("not me"),
    InternalError("bug"),
    ClientExpiredError("idle"),  # the transport recovers under a fresh client id
    LeaseHeldError("held"),
]


# ---------------------------------------------------------- validity, interval


def test_validity_follows_the_last_renewal(clock: FakeTime) -> None:
    state, _ = make()
    assert state.remaining == 0.0 and not state.valid  # never renewed
    state.renewed(clock.now + 2.5)
    assert state.remaining == 2.5 and state.valid
    clock.advance(2.0)
    assert state.remaining == 0.5 and state.valid
    clock.advance(0.5)
    assert state.remaining == 0.0 and not state.valid  # ran out, exactly at valid_until
    clock.advance(1.0)
    assert state.remaining == 0.0  # never negative


@pytest.mark.parametrize(("ttl", "interval"), [(3.0, 1.0), (30.0, 10.0), (0.09, 0.05)])
def test_interval_is_a_third_of_the_ttl_with_a_floor(ttl: float, interval: float) -> None:
    state, _ = make(ttl=ttl)
    assert state.interval() == pytest.approx(interval)


# ------------------------------------------------------------------- jeopardy


@pytest.mark.parametrize("exc", TRANSIENT, ids=lambda e: type(e).__name__)
def test_a_failure_while_valid_is_jeopardy_not_loss(clock: FakeTime, exc: RaftLeaseError) -> None:
    state, calls = make()
    state.renewed(clock.now + 2.875)
    clock.advance(1.0)
    assert state.renew_failed(exc) is False
    assert state.jeopardy and not state.gone and state.lost_reason is None
    assert state.valid and state.remaining == 1.875  # validity is not cut by jeopardy
    assert calls.jeopardy == [str(exc)] and calls.lost == []


def test_jeopardy_is_reported_once_per_episode(
    clock: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="raftlease.keepalive")
    state, calls = make()
    state.renewed(clock.now + 2.875)
    for _ in range(3):
        clock.advance(0.5)
        assert state.renew_failed(UnavailableError("no leader")) is False
    assert len(calls.jeopardy) == 1
    assert len([r for r in caplog.records if "in jeopardy" in r.getMessage()]) == 1
    # A success ends the episode (logged); the next failure starts a new one.
    state.renewed(clock.now + 2.875)
    assert not state.jeopardy
    assert any("out of jeopardy" in r.getMessage() for r in caplog.records)
    clock.advance(1.0)
    assert state.renew_failed(TimeoutError_("slow")) is False
    assert len(calls.jeopardy) == 2 and calls.lost == []


def test_a_failure_just_before_running_out_is_still_jeopardy(clock: FakeTime) -> None:
    state, calls = make()
    state.renewed(clock.now + 2.0)
    clock.advance(1.875)
    assert state.renew_failed(UnavailableError("x")) is False
    assert state.jeopardy and state.lost_reason is None and calls.lost == []


# ----------------------------------------------------------------------- loss


@pytest.mark.parametrize("exc_class", GONE, ids=lambda c: c.__name__)
def test_gone_is_lost_at_once_even_while_valid(
    clock: FakeTime, exc_class: type[RaftLeaseError]
) -> None:
    """The cluster saying it no longer has the lease (or session) ends it now: the
    holder must stop protected work although its own validity has time left."""
    state, calls = make(noun="session")
    state.renewed(clock.now + 2.875)
    clock.advance(0.5)
    assert state.renew_failed(exc_class("gone")) is True
    assert state.gone
    assert state.lost_reason is not None and "no longer has our session" in state.lost_reason
    assert state.remaining == 0.0 and not state.valid and state.valid_until == 0.0
    assert calls.lost == [state.lost_reason] and calls.jeopardy == []


def test_gone_covers_exactly_the_three_not_found_answers() -> None:
    assert set(GONE) == {LeaseNotFoundError, NotOwnerError, SessionNotFoundError}


def test_a_failure_after_validity_ran_out_is_lost_but_not_gone(clock: FakeTime) -> None:
    state, calls = make()
    state.renewed(clock.now + 2.0)
    clock.advance(2.0)  # exactly at valid_until: no longer trusted
    assert state.renew_failed(UnavailableError("no leader")) is True
    assert not state.gone  # we could not reach it; the cluster did not say it is gone
    assert state.lost_reason is not None and "ran out" in state.lost_reason
    assert state.valid_until == 0.0 and not state.valid
    assert calls.lost == [state.lost_reason] and calls.jeopardy == []


def test_jeopardy_then_lost_each_called_once_in_order(clock: FakeTime) -> None:
    state, calls = make()
    state.renewed(clock.now + 2.875)
    for _ in range(6):
        clock.advance(1.0)
        lost = state.renew_failed(ConnectionLostError("reset"))
    assert lost is True
    assert calls.order == ["jeopardy", "lost"]
    # Nothing more is reported once lost: the first reason stands.
    reason = state.lost_reason
    assert state.renew_failed(LeaseNotFoundError("gone")) is True
    assert state.lose("closed by hand") is True
    assert calls.order == ["jeopardy", "lost"] and state.lost_reason == reason


def test_lose_is_idempotent(clock: FakeTime) -> None:
    state, calls = make()
    state.renewed(clock.now + 3.0)
    assert state.lose("first") is True
    assert state.lose("second") is True
    assert calls.lost == ["first"] and state.lost_reason == "first"
    assert state.remaining == 0.0


def test_a_raising_callback_is_logged_not_raised(
    clock: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(reason: str) -> None:
        raise RuntimeError("user callback bug")

    state = KeepAliveState("lock k", 3.0, noun="lease", on_lost=boom, on_jeopardy=boom)
    state.renewed(clock.now + 2.875)
    assert state.renew_failed(UnavailableError("x")) is False
    assert state.renew_failed(NotOwnerError("taken")) is True
    assert state.lost_reason is not None and state.gone
    assert len([r for r in caplog.records if "callback raised" in r.getMessage()]) == 2


# -------------------------------------------------------------- the schedule


class FakeStop:
    """A ``threading.Event`` stand-in for ``keep_alive_thread``: ``wait(t)`` moves the
    fake clock by ``t`` and reports "stopped" after ``tries`` waits."""

    def __init__(self, clock: FakeTime, tries: int) -> None:
        self.clock = clock
        self.tries = tries
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        self.clock.advance(timeout)
        return len(self.waits) > self.tries


def test_thread_schedule_counts_from_each_tries_send(clock: FakeTime) -> None:
    """Tries start every ``interval`` counted from the previous try's send, so a slow
    renewal does not push the schedule later (the next try would then come too late
    to renew before validity runs out); each try is bounded by the interval."""
    state, calls = make(ttl=3.0)
    start = clock.now
    sends: list[float] = []
    timeouts: list[float] = []

    def renew(timeout: float) -> None:
        sends.append(clock.now - start)
        timeouts.append(timeout)
        clock.advance(0.375)  # a slow answer
        state.renewed(clock.now + 2.5)

    stop, lost = FakeStop(clock, tries=4), threading.Event()
    state.keep_alive_thread(renew, stop, lost)  # type: ignore[arg-type]
    assert sends == [1.0, 2.0, 3.0, 4.0]
    assert timeouts == [1.0] * 4
    assert not lost.is_set() and calls.order == []


def test_thread_retries_through_failures_until_it_runs_out(clock: FakeTime) -> None:
    state, calls = make(ttl=3.0)
    state.renewed(clock.now + 2.875)
    start = clock.now
    sends: list[float] = []

    def renew(timeout: float) -> None:
        sends.append(clock.now - start)
        raise UnavailableError("no leader")

    stop, lost = FakeStop(clock, tries=100), threading.Event()
    state.keep_alive_thread(renew, stop, lost)  # type: ignore[arg-type]
    assert sends == [1.0, 2.0, 3.0]  # jeopardy at 1 and 2, ran out at 3
    assert lost.is_set() and calls.order == ["jeopardy", "lost"] and not state.gone


def test_thread_stops_at_once_when_the_cluster_says_gone(clock: FakeTime) -> None:
    state, calls = make(ttl=3.0)
    state.renewed(clock.now + 2.875)
    tries = 0

    def renew(timeout: float) -> None:
        nonlocal tries
        tries += 1
        if tries == 2:
            raise LeaseNotFoundError("expired")
        state.renewed(clock.now + 2.875)

    stop, lost = FakeStop(clock, tries=100), threading.Event()
    state.keep_alive_thread(renew, stop, lost)  # type: ignore[arg-type]
    assert tries == 2 and len(stop.waits) == 2
    assert lost.is_set() and state.gone and calls.order == ["lost"]


def test_task_renews_each_interval_and_sets_lost_when_gone() -> None:
    """The asyncio loop, on the real clock (a short TTL; nothing about timing is
    asserted): renew is called with the interval as its timeout until it is gone."""
    state, calls = make(ttl=0.3)
    timeouts: list[float] = []

    async def scenario() -> bool:
        loop = asyncio.get_running_loop()
        state.renewed(loop.time() + 60.0)  # keep it valid whatever the machine's load

        async def renew(timeout: float) -> None:
            timeouts.append(timeout)
            if len(timeouts) == 2:
                raise UnavailableError("no leader")
            if len(timeouts) == 4:
                raise SessionNotFoundError("gone")

        lost = asyncio.Event()
        await asyncio.wait_for(state.keep_alive_task(renew, lost), 20)
        return lost.is_set()

    assert asyncio.run(scenario()) is True
    assert timeouts == [0.1] * 4
    assert calls.order == ["jeopardy", "lost"] and state.gone


def test_task_stops_when_cancelled() -> None:
    state, calls = make(ttl=0.3)

    async def scenario() -> int:
        state.renewed(asyncio.get_running_loop().time() + 60.0)
        count = 0
        twice = asyncio.Event()

        async def renew(timeout: float) -> None:
            nonlocal count
            count += 1
            if count == 2:
                twice.set()

        lost = asyncio.Event()
        task = asyncio.create_task(state.keep_alive_task(renew, lost))
        await asyncio.wait_for(twice.wait(), 20)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not lost.is_set()
        return count

    assert asyncio.run(scenario()) == 2
    assert calls.order == []
