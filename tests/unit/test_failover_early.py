"""Failover when the leader's process dies: its kernel closes its connections at once,
and a follower that sees its leader's connection close runs for election when its
vote promise ends (plus a small random spread), not at its full random election
timeout (issue 16: failover). Never earlier than the promise: the old leader's lease
relies on it (docs/design.md).

Timing is not asserted (2 noisy cores): the tests check which path the election
took, through the node's ``early_elections`` counter in ``status``, and the pure
delay rule. The failover figures are in the benchmark (``scripts/bench --only
failover``).

The unit half of these tests (no process); the integration half is
tests/integration/test_failover_early.py.
"""

from __future__ import annotations

import random

import pytest

from raftlease.replication import transport
from raftlease.replication.transport import (
    EARLY_FIRST,
    EARLY_JITTER,
    EARLY_SLOT,
    early_election_delay,
    election_rank,
)

pytestmark = pytest.mark.timeout(120)


def test_the_delay_never_ends_before_the_promise() -> None:
    rng = random.Random(16)
    for _ in range(2_000):
        promise = rng.uniform(0.05, 5.0)
        left = rng.choice([0.0, rng.uniform(0.0, promise)])
        rank = rng.randrange(0, 5)
        delay = early_election_delay(left, promise, rank)
        start = left + (EARLY_FIRST + rank * EARLY_SLOT) * promise
        assert left + EARLY_FIRST * promise <= start <= delay <= start + EARLY_JITTER * promise


def test_each_rank_runs_only_after_the_one_before_it_had_its_slot() -> None:
    """The next follower's earliest moment is a slot, less the jitter, after the
    latest of the one before: two followers never run at the same moment (which split
    the vote when the spread was one random draw for all)."""
    assert EARLY_SLOT - EARLY_JITTER >= 1 / 8  # 50 ms with the default 0.4 s promise
    rng = random.Random(17)
    for _ in range(500):
        promise = rng.uniform(0.05, 5.0)
        left = rng.uniform(0.0, promise)
        for rank in range(4):
            latest = max(early_election_delay(left, promise, rank) for _ in range(50))
            earliest = min(early_election_delay(left, promise, rank + 1) for _ in range(50))
            assert earliest - latest >= (EARLY_SLOT - EARLY_JITTER) * promise - 1e-9


def test_the_survivors_agree_on_their_order() -> None:
    members = ["127.0.0.1:7003", "127.0.0.1:7001", "127.0.0.1:7002"]
    gone = "127.0.0.1:7002"
    survivors = [m for m in members if m != gone]
    # Each survivor's view: the other members, itself not among them (PySyncObj's
    # otherNodes), the gone leader still listed.
    ranks = {me: election_rank(me, [m for m in members if m != me], gone) for me in survivors}
    assert ranks == {"127.0.0.1:7001": 0, "127.0.0.1:7003": 1}
    # Five members, the first gone: the rest run in id order.
    five = [f"10.0.0.{i}:1" for i in range(1, 6)]
    assert [election_rank(me, five, five[0]) for me in five[1:]] == [0, 1, 2, 3]


class _Node:
    def __init__(self, node_id: str) -> None:
        self.id = node_id


class _Sync:
    """The few parts of a PySyncObj follower that ``_leader_gone`` reads."""

    def __init__(self, leader: _Node, others: list[_Node], deadline: float) -> None:
        self.leader = leader
        self.otherNodes = set(others)
        self._SyncObj__raftElectionDeadline = deadline

    def _getLeader(self) -> _Node:
        return self.leader

    def _isLeader(self) -> bool:
        return False


class _Guard:
    promise = 0.4
    early_elections = 0

    def promise_left(self) -> float:
        return 0.3


def test_the_early_deadline_is_set_on_pysyncobjs_own_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PySyncObj compares its election deadline with its own clock
    (``pysyncobj.monotonic``: CLOCK_MONOTONIC_RAW), which drifts from
    ``time.monotonic()`` with uptime (NTP slews only the latter; 0.26 s after 3 h
    on the CI VM kind). A deadline set on the wrong clock fired that much late.
    The raft clock is moved 1,000 s away here, so the wrong one cannot pass."""
    import pysyncobj.syncobj
    from pysyncobj.monotonic import monotonic as pysyncobj_clock

    assert pysyncobj.syncobj.monotonicTime is pysyncobj_clock  # what PySyncObj compares with
    assert transport.raft_clock is pysyncobj_clock  # and what the transport sets it on
    monkeypatch.setattr(transport, "raft_clock", lambda: 1_000_000.0)
    leader, me, other = _Node("127.0.0.1:7002"), _Node("127.0.0.1:7001"), _Node("127.0.0.1:7003")
    sync = _Sync(leader, [leader, other], deadline=2_000_000.0)
    t = transport.LeaseTransport.__new__(transport.LeaseTransport)
    t._syncObj = sync
    t._selfNode = me
    t.guard = _Guard()  # type: ignore[assignment]
    woken: list[float] = []
    t._wake_at = woken.append  # type: ignore[method-assign]
    t._leader_gone(leader)
    delay = sync._SyncObj__raftElectionDeadline - 1_000_000.0
    assert 0.3 + EARLY_FIRST * 0.4 <= delay <= 0.3 + (EARLY_FIRST + EARLY_JITTER) * 0.4  # rank 0
    assert woken == [pytest.approx(delay)]
    assert t.guard.early_elections == 1


@pytest.mark.integration
class _ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


class _Voter:
    """The parts of a PySyncObj follower that ``_adopt_dropped_term`` reads and sets."""

    def __init__(self, term: int) -> None:
        self.raftCurrentTerm = term
        self.voted_for: object = "someone"
        self.state: object = None
        self._SyncObj__raftLeader: object = _Node("127.0.0.1:7002")
        self.leader = False

    def _isLeader(self) -> bool:
        return self.leader

    def _SyncObj__setCurrentTerm(self, term: int, voted_for: object) -> None:
        self.raftCurrentTerm, self.voted_for = term, voted_for

    def _SyncObj__setState(self, state: object) -> None:
        self.state = state


def _voter_transport(term: int) -> tuple[transport.LeaseTransport, _Voter, _ManualClock]:
    from raftlease.replication.leadership import LeaseGuard

    clock = _ManualClock()
    guard = LeaseGuard(clock, cluster_size=3, promise=0.4, rho=0.01)
    clock.now += 10.0  # started long ago: only the last heartbeat holds the promise
    guard.last_heard = clock.now  # the dead leader's last message
    t = transport.LeaseTransport.__new__(transport.LeaseTransport)
    voter = _Voter(term)
    t._syncObj = voter
    t.guard = guard
    t._dropped_vote = (0, 0.0)
    t.pre_vote = False  # type: ignore[misc]  # these fakes have no PySyncObj election state
    return t, voter, clock


def test_a_vote_request_dropped_under_the_promise_lends_its_term_once_it_ends() -> None:
    """The first survivor's request reached this one while its promise still held
    (dropped, so the old leader's lease stays sound). Once the promise ends, this
    node takes that term, with no vote in it, so that its own election, at its
    rank's slot, is one term above the first survivor's instead of the same term (a
    split vote: both would wait a full random election timeout)."""
    from pysyncobj.syncobj import _RAFT_STATE

    t, voter, clock = _voter_transport(term=5)
    clock.now += 0.3  # promise (0.4 s) still holds
    assert t.guard.refuse_vote()
    t._note_dropped_vote(6)
    t._note_dropped_vote(True)  # hostile or broken terms are ignored
    t._note_dropped_vote("9")
    t._adopt_dropped_term()
    assert voter.raftCurrentTerm == 5, "taken while the promise held"
    clock.now += 0.11  # the promise has ended
    t._adopt_dropped_term()
    assert (voter.raftCurrentTerm, voter.voted_for) == (6, None)
    assert voter.state == _RAFT_STATE.FOLLOWER and voter._SyncObj__raftLeader is None
    voter.voted_for = "me"  # its own election in term 7 votes; nothing is taken again
    t._adopt_dropped_term()
    assert (voter.raftCurrentTerm, voter.voted_for) == (6, "me")


@pytest.mark.parametrize("case", ["stale", "not higher", "leader"])
def test_a_dropped_vote_request_is_not_taken_when_it_is_no_news(case: str) -> None:
    """Not from an old dropped request (over twice the promise ago), not a term at or
    below ours, and never by a leader."""
    t, voter, clock = _voter_transport(term=5)
    clock.now += 0.3
    t._note_dropped_vote(5 if case == "not higher" else 6)
    voter.leader = case == "leader"
    clock.now += 0.9 if case == "stale" else 0.2
    t._adopt_dropped_term()
    assert (voter.raftCurrentTerm, voter.voted_for) == (5, "someone")


def test_the_dropped_term_is_taken_before_the_tick_that_may_run_for_election(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PySyncObj's tick starts an election as its first step and runs the on-tick
    callbacks only at its end. A survivor whose election wake-up was the first tick
    after its promise ended ran in the dropped term itself (both candidates in one
    term: a split vote, 1.4 s in a bench run) when the term was taken in a callback:
    it is taken before the tick (``before_tick``)."""
    from pysyncobj import SyncObj

    from raftlease.replication.group_send import GroupSendSyncObj

    t, voter, clock = _voter_transport(term=5)
    clock.now += 0.3
    t._note_dropped_vote(6)
    clock.now += 0.11  # the promise has ended; no tick ran since
    seen: list[int] = []
    monkeypatch.setattr(
        SyncObj, "_onTick", lambda self, wait=0.0: seen.append(voter.raftCurrentTerm)
    )
    node = GroupSendSyncObj.__new__(GroupSendSyncObj)
    node._SyncObj__transport = t
    node._onTick(0.0)
    assert seen == [6], "PySyncObj's tick (and its election check) saw the old term"


class _Idle:
    """``BoundedTcpConnection``'s timeout check on a connection without a socket."""

    def __init__(self, last_read_ago: float, awaiting_ago: float | None) -> None:
        from pysyncobj.monotonic import monotonic

        from raftlease.replication.peers import BoundedTcpConnection

        self.conn = BoundedTcpConnection.__new__(BoundedTcpConnection)
        now = monotonic()
        self.conn._TcpConnection__timeout = 3.0
        self.conn._TcpConnection__lastReadTime = now - last_read_ago
        if awaiting_ago is not None:
            self.conn._rl_awaiting = now - awaiting_ago
        self.closed = False
        self.conn.disconnect = self.close  # type: ignore[method-assign]

    def close(self) -> None:
        self.closed = True

    def check(self) -> bool:
        self.conn._TcpConnection__processConnectionTimeout()
        return self.closed


@pytest.mark.parametrize(
    ("last_read_ago", "awaiting_ago", "closed"),
    [
        (100.0, None, False),  # two followers, silent for long: kept
        (100.0, 1.0, False),  # a vote request just sent on it: its answer may come
        (100.0, 4.0, True),  # sent 4 s ago, nothing heard since: a dead peer
        (1.0, 4.0, False),  # heard from within the timeout
    ],
)
def test_only_silence_while_an_answer_is_awaited_closes_a_peer_connection(
    last_read_ago: float, awaiting_ago: float | None, closed: bool
) -> None:
    assert _Idle(last_read_ago, awaiting_ago).check() is closed
