"""Leader lease, vote promise and clock-drift monitor (Raft dissertation §6.4.1).

Pure bookkeeping driven by an injected ``Clock``; the PySyncObj transport in
``transport.py`` feeds it the stamps it puts on and reads off Raft messages. All
methods are called on PySyncObj's tick thread except the ``*_valid``/``snapshot``
readers, which read a few floats and are safe from any thread.

The rule (docs/leader-lease.md has the argument):

* A follower that accepted an ``append_entries`` of the current leader at time ``r``
  (its own clock) refuses every ``request_vote`` until ``r + S``; it also refuses for
  ``S`` after its own start, having forgotten any promise it made before a crash.
  ``S = election_timeout_min``.
* The leader stamps each ``append_entries`` with its clock at *sending*. A follower
  echoes the stamp of the last one it accepted in its reply. The leader's lease ends at
  ``(majority-th newest echoed stamp of its term) + S * (1 - rho) - margin``; the leader
  itself counts as the newest.
* A node whose clock rate differs from a peer's by more than ``rho`` (estimated from
  the same stamps) raises a drift alarm; the leader stops serving lease reads while any
  alarm is raised.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..clock import Clock

log = logging.getLogger("raftlease.leadership")

#: Safety margin subtracted from the leader lease (seconds).
LEASE_MARGIN = 0.01
#: A shift of the one-way offset larger than this (seconds) counts as a clock jump.
JUMP_THRESHOLD = 0.1


@dataclass
class _PeerDrift:
    """Minimum one-way offsets (local receive - remote send) per time bucket."""

    buckets: deque[tuple[float, float]] = field(default_factory=deque)  # (local t, min offset)
    current_start: float = -1.0
    current_min: float = float("inf")
    current_at: float = 0.0
    rate: float | None = None
    alarm: bool = False
    strikes: int = 0


class DriftMonitor:
    """Estimates each peer's clock rate relative to ours from one-way time stamps.

    Each sample is (remote clock at send, local clock at receipt). Their difference is
    the clock offset plus a non-negative delay; the minimum per bucket filters the delay
    out, and the slope of bucket minima over local time is the relative rate error.
    ``|slope| > rho`` raises the alarm for that peer; it clears when the slope over the
    window is back in bound. A clock jump shows as a slope spike for one window.
    """

    def __init__(
        self, rho: float, bucket: float = 1.0, window: int = 10, min_buckets: int = 5
    ) -> None:
        self.rho = rho
        self.bucket = bucket
        self.window = window
        self.min_buckets = min_buckets
        self._peers: dict[str, _PeerDrift] = {}
        self._lock = threading.Lock()

    def sample(self, peer: str, remote: float, local: float) -> None:
        with self._lock:
            state = self._peers.setdefault(peer, _PeerDrift())
            offset = local - remote
            if state.current_start < 0:
                state.current_start = local
            if local - state.current_start >= self.bucket:
                if state.current_min != float("inf"):
                    state.buckets.append((state.current_at, state.current_min))
                    while len(state.buckets) > self.window:
                        state.buckets.popleft()
                    self._evaluate(peer, state)
                state.current_start = local
                state.current_min = float("inf")
            if offset < state.current_min:
                state.current_min = offset
                state.current_at = local

    def _evaluate(self, peer: str, state: _PeerDrift) -> None:
        points = list(state.buckets)
        if len(points) < self.min_buckets:
            return
        # Theil-Sen: the median of pairwise slopes, robust to a few buckets whose
        # minimum a long scheduling stall inflated (a least-squares fit was not:
        # 1.1-1.3 % false alarms on a loaded 2-core machine).
        slopes = sorted(
            (o2 - o1) / (t2 - t1)
            for i, (t1, o1) in enumerate(points)
            for t2, o2 in points[i + 1 :]
            if t2 > t1
        )
        if not slopes:
            return
        slope = slopes[len(slopes) // 2]
        # offset = local - remote grows at (local_rate - remote_rate) per local second.
        state.rate = slope
        # A jump is a level shift, which the median slope ignores: compare the newest
        # bucket with the median of the earlier ones.
        earlier = sorted(o for _, o in points[:-1])
        step = abs(points[-1][1] - earlier[len(earlier) // 2])
        beyond = abs(slope) > self.rho or step > JUMP_THRESHOLD
        # Raise only after two evaluations in a row beyond the bound (a single stalled
        # bucket is not a clock fault); clear at once.
        state.strikes = state.strikes + 1 if beyond else 0
        alarm = state.strikes >= 2
        if alarm != state.alarm:
            state.alarm = alarm
            if alarm:
                log.error(
                    "clock drift alarm: peer %s rate differs by %.4f (bound %.4f), offset "
                    "stepped by %.3f s (bound %.3f s); lease reads disabled",
                    peer,
                    slope,
                    self.rho,
                    step,
                    JUMP_THRESHOLD,
                )
            else:
                log.warning("clock drift back in bound for peer %s (%.4f)", peer, slope)

    @property
    def alarm(self) -> bool:
        return any(p.alarm for p in self._peers.values())

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                peer: {"rate_error": p.rate, "alarm": p.alarm, "buckets": len(p.buckets)}
                for peer, p in self._peers.items()
            }


class LeaseGuard:
    """Vote promise on followers, leader lease on the leader, drift alarm on both."""

    def __init__(self, clock: Clock, cluster_size: int, promise: float, rho: float) -> None:
        self.clock = clock
        self.cluster_size = cluster_size
        self.promise = promise
        self.rho = rho
        self.drift = DriftMonitor(rho)
        self.started = clock.monotonic()
        # Follower side.
        self.last_heard = float("-inf")
        self.heard_term = -1
        self._echo: dict[str, tuple[int, float]] = {}  # leader id -> (term, stamp)
        # Leader side.
        self.leader_term = -1
        self.leader_since = float("inf")
        self._acks: dict[str, float] = {}  # follower id -> newest echoed stamp this term
        self.lease_until = float("-inf")
        self.votes_refused = 0
        #: Elections brought forward to the promise's end because the connection to
        #: the leader closed (transport.LeaseTransport._leader_gone).
        self.early_elections = 0

    # ------------------------------------------------------------- follower

    def on_append_entries(self, sender: str, term: int, current_term: int, stamp: Any) -> None:
        """A follower received ``append_entries``; ``current_term`` is its own term."""
        if term < current_term:
            return
        now = self.clock.monotonic()
        self.last_heard = now
        self.heard_term = term
        if isinstance(stamp, float | int):
            self._echo[sender] = (term, float(stamp))
            self.drift.sample(sender, float(stamp), now)

    def heard_ago(self) -> float | None:
        """Seconds since this node accepted a message from a leader (None: never)."""
        if self.last_heard == float("-inf"):
            return None
        return round(self.clock.monotonic() - self.last_heard, 3)

    def staleness(self, is_leader: bool) -> float | None:
        """How old this node's view may be, in seconds: 0 for a leader whose lease is
        valid, time since its lease lapsed for a leader without one, time since it last
        heard from a leader for a follower (None if it never has)."""
        now = self.clock.monotonic()
        if is_leader:
            if now < self.lease_until:
                return 0.0
            if self.lease_until == float("-inf"):
                return None
            return round(now - self.lease_until, 3)
        return self.heard_ago()

    def echo_for(self, leader: str) -> tuple[int, float] | None:
        """(term, stamp) to echo in a reply to ``leader``."""
        return self._echo.get(leader)

    def promise_left(self) -> float:
        """Seconds until this node's vote promise ends (0 once it has): what an
        election brought forward must still wait. Any thread; never blocks."""
        now = self.clock.monotonic()
        return max(0.0, self.promise - (now - self.last_heard), self.promise - (now - self.started))

    def refuse_vote(self) -> bool:
        """True while this node promised not to vote (heard from a leader within S,
        or started less than S ago)."""
        now = self.clock.monotonic()
        refuse = now - self.last_heard < self.promise or now - self.started < self.promise
        if refuse:
            self.votes_refused += 1
        return refuse

    # --------------------------------------------------------------- leader

    def stamp_outgoing(self, term: int) -> float:
        """Clock stamp for an ``append_entries`` the leader sends in ``term``."""
        now = self.clock.monotonic()
        if term != self.leader_term:
            self.leader_term = term
            self.leader_since = now
            self._acks.clear()
            self.lease_until = float("-inf")
        return now

    def on_reply(self, sender: str, echo_term: Any, echo: Any, sender_clock: Any) -> None:
        """The leader received a reply carrying the echo of one of its stamps."""
        now = self.clock.monotonic()
        if isinstance(sender_clock, float | int):
            self.drift.sample(sender, float(sender_clock), now)
        if echo_term != self.leader_term or not isinstance(echo, float | int):
            return
        echo = float(echo)
        if echo < self.leader_since or echo <= self._acks.get(sender, float("-inf")):
            return
        self._acks[sender] = echo
        needed = self.cluster_size // 2  # followers needed besides the leader itself
        if needed == 0:
            self.lease_until = now + self.promise * (1 - self.rho) - LEASE_MARGIN
            return
        newest = sorted(self._acks.values(), reverse=True)
        if len(newest) >= needed:
            base = newest[needed - 1]
            self.lease_until = max(
                self.lease_until, base + self.promise * (1 - self.rho) - LEASE_MARGIN
            )

    def reconfigure(self, cluster_size: int) -> None:
        """The member set changed (tick thread, at the moment PySyncObj applies the
        change, before any later reply is handled). The leader drops its lease and
        counts it again only from echoes of stamps it sends from now on, over a
        majority of the new set of ``cluster_size`` members (docs/leader-lease.md,
        "Membership changes"): an echo from a removed member, or a majority of the
        old set, never extends it."""
        self.cluster_size = cluster_size
        self._acks.clear()
        self.lease_until = float("-inf")
        if self.leader_term != -1:
            self.leader_since = self.clock.monotonic()

    def has_quorum(self) -> bool:
        """The leader heard from a majority within the lease window (drift alarms
        aside): it keeps leading rather than yield to a candidate."""
        return self.clock.monotonic() < self.lease_until

    def stepped_down(self) -> None:
        self.leader_term = -1
        self.leader_since = float("inf")
        self._acks.clear()
        self.lease_until = float("-inf")

    def lease_valid(self, term: int) -> bool:
        """True while the leader of ``term`` may serve reads locally."""
        return (
            term == self.leader_term
            and self.clock.monotonic() < self.lease_until
            and not self.drift.alarm
        )

    def snapshot(self) -> dict[str, Any]:
        now = self.clock.monotonic()
        return {
            "lease_remaining": max(0.0, self.lease_until - now) if self.lease_until > now else 0.0,
            "heard_from_leader_ago": self.heard_ago(),
            "drift_alarm": self.drift.alarm,
            "drift": self.drift.snapshot(),
            "votes_refused": self.votes_refused,
            "early_elections": self.early_elections,
        }
