"""Unit tests of the leader lease, vote promise and drift monitor (no network)."""

from __future__ import annotations

import random

import pytest

from raftlease.replication.leadership import LEASE_MARGIN, DriftMonitor, LeaseGuard

pytestmark = pytest.mark.timeout(30)


class FakeClock:
    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def monotonic(self) -> float:
        return self.now


def feed(
    monitor: DriftMonitor,
    rate: float,
    seconds: float,
    jitter: float = 0.0,
    offset: float = 5.0,
    seed: int = 1,
) -> None:
    """Remote clock runs at 1.0; local at ``rate``; messages every 50 ms with random
    delays up to ``jitter``."""
    rng = random.Random(seed)
    t = 0.0
    while t < seconds:
        delay = rng.random() * jitter
        monitor.sample("peer", remote=t, local=offset + (t + delay) * rate)
        t += 0.05


def test_drift_beyond_bound_raises_alarm() -> None:
    monitor = DriftMonitor(rho=0.01)
    feed(monitor, rate=1.05, seconds=8, jitter=0.02)
    assert monitor.alarm
    assert monitor.snapshot()["peer"]["rate_error"] == pytest.approx(0.05, abs=0.01)


@pytest.mark.parametrize("rate", [0.95, 1.02])
def test_slow_or_fast_both_alarm(rate: float) -> None:
    monitor = DriftMonitor(rho=0.01)
    feed(monitor, rate=rate, seconds=9, jitter=0.01)
    assert monitor.alarm


def test_drift_inside_bound_with_noisy_delays_does_not_alarm() -> None:
    monitor = DriftMonitor(rho=0.01)
    feed(monitor, rate=1.003, seconds=20, jitter=0.03)
    assert not monitor.alarm
    assert abs(monitor.snapshot()["peer"]["rate_error"]) < 0.01


def test_alarm_clears_when_drift_returns_in_bound() -> None:
    monitor = DriftMonitor(rho=0.01)
    feed(monitor, rate=1.05, seconds=8)
    assert monitor.alarm
    # Continue from where the skewed clock got to, now at the same rate.
    base = 5.0 + 8 * 1.05
    rng = random.Random(3)
    t = 8.0
    while t < 22.0:
        monitor.sample("peer", remote=t, local=base + (t - 8.0) + rng.random() * 0.005)
        t += 0.05
    assert not monitor.alarm


def test_clock_jump_raises_alarm() -> None:
    monitor = DriftMonitor(rho=0.01)
    t = 0.0
    while t < 9:
        jump = 0.5 if t > 5 else 0.0
        monitor.sample("peer", remote=t, local=t + jump)
        t += 0.05
    assert monitor.alarm


def test_follower_refuses_votes_within_promise_and_after_start() -> None:
    clock = FakeClock()
    guard = LeaseGuard(clock, cluster_size=3, promise=0.4, rho=0.01)
    assert guard.refuse_vote(), "a node refuses votes for S after its own start"
    clock.now += 0.41
    assert not guard.refuse_vote()
    guard.on_append_entries("L", term=2, current_term=2, stamp=50.0)
    clock.now += 0.39
    assert guard.refuse_vote()
    clock.now += 0.02
    assert not guard.refuse_vote()
    # A stale-term append_entries does not renew the promise.
    guard.on_append_entries("old", term=1, current_term=2, stamp=51.0)
    assert not guard.refuse_vote()


def test_planted_bug_skips_the_promise() -> None:
    from raftlease.testing.node import PromiselessGuard

    clock = FakeClock()
    guard = PromiselessGuard(clock, cluster_size=3, promise=0.4, rho=0.01)
    honest = LeaseGuard(clock, cluster_size=3, promise=0.4, rho=0.01)
    assert honest.refuse_vote(), "the honest guard refuses right after its start"
    assert not guard.refuse_vote()


def test_leader_lease_runs_from_majority_echo_send_time() -> None:
    clock = FakeClock()
    guard = LeaseGuard(clock, cluster_size=3, promise=0.4, rho=0.01)
    sent = guard.stamp_outgoing(term=5)
    assert not guard.lease_valid(5), "no lease before any echo"
    clock.now += 0.1  # the echo arrives later; the lease still counts from sending
    guard.on_reply("F1", echo_term=5, echo=sent, sender_clock=1.0)
    assert guard.lease_valid(5)
    assert guard.lease_until == pytest.approx(sent + 0.4 * 0.99 - LEASE_MARGIN)
    assert not guard.lease_valid(6), "a lease is only for the term it was earned in"
    clock.now = guard.lease_until
    assert not guard.lease_valid(5), "the lease lapses exactly at its end"


def test_five_nodes_need_two_follower_echoes() -> None:
    clock = FakeClock()
    guard = LeaseGuard(clock, cluster_size=5, promise=0.4, rho=0.01)
    first = guard.stamp_outgoing(term=1)
    clock.now += 0.05
    second = guard.stamp_outgoing(term=1)
    guard.on_reply("F1", 1, second, None)
    assert not guard.lease_valid(1)
    guard.on_reply("F2", 1, first, None)
    # Majority-th newest: the older of the two echoes.
    assert guard.lease_until == pytest.approx(first + 0.4 * 0.99 - LEASE_MARGIN)


def test_echoes_of_other_terms_or_before_leadership_are_ignored() -> None:
    clock = FakeClock()
    guard = LeaseGuard(clock, cluster_size=3, promise=0.4, rho=0.01)
    old = clock.now
    clock.now += 1
    guard.stamp_outgoing(term=3)
    guard.on_reply("F1", echo_term=2, echo=clock.now, sender_clock=None)
    assert not guard.lease_valid(3)
    guard.on_reply("F1", echo_term=3, echo=old, sender_clock=None)
    assert not guard.lease_valid(3), "a stamp from before this leadership began"
    guard.on_reply("F1", echo_term=3, echo="junk", sender_clock=None)
    assert not guard.lease_valid(3)


def test_step_down_and_drift_alarm_end_the_lease() -> None:
    clock = FakeClock()
    guard = LeaseGuard(clock, cluster_size=3, promise=0.4, rho=0.01)
    guard.on_reply("F1", 7, guard.stamp_outgoing(7), None)
    assert guard.lease_valid(7)
    guard.stepped_down()
    assert not guard.lease_valid(7)
    guard.on_reply("F1", 8, guard.stamp_outgoing(8), None)
    assert guard.lease_valid(8)
    feed(guard.drift, rate=1.1, seconds=8)
    assert not guard.lease_valid(8)
