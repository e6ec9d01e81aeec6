"""PreVote owns the election timer (raftlease/replication/prevote.py, module docstring).

PySyncObj starts an election in its tick once its deadline has passed. ``before_tick``
and PySyncObj's own check read the clock twice; a deadline due between the two started
an election no pre-vote had won, and a member cut off from every other raised its term
(the chaos suite's ``rejoin`` checker, under load). These tests drive ``PreVote`` with
a stand-in for the few parts of a PySyncObj follower it touches, and PySyncObj's own
check as written in its ``_onTick``, with the clock moved between the two.
"""

from __future__ import annotations

from typing import Any

import pytest
from pysyncobj.syncobj import _RAFT_STATE

from raftlease.replication import prevote as prevote_module
from raftlease.replication.prevote import NEVER, PreVote

pytestmark = pytest.mark.timeout(30)


class _Node:
    def __init__(self, node_id: str) -> None:
        self.id = node_id


class _Sync:
    """A follower of term 5 that is connected (so PySyncObj would run an election)."""

    def __init__(self, deadline: float) -> None:
        self._SyncObj__raftElectionDeadline = deadline
        self._SyncObj__raftState = _RAFT_STATE.FOLLOWER
        self._SyncObj__selfNode = _Node("n1")
        self._SyncObj__otherNodes = {_Node("n2"), _Node("n3")}
        self._SyncObj__raftLeader: Any = None
        self.raftCurrentTerm = 5
        self.elections = 0

    def _SyncObj__connectedToAnyone(self) -> bool:
        return True

    def _SyncObj__getCurrentLogIndex(self) -> int:
        return 10

    def _SyncObj__getCurrentLogTerm(self) -> int:
        return 5

    def _SyncObj__generateRaftTimeout(self) -> float:
        return 1.0

    def pysyncobj_check(self, now: float) -> None:
        """PySyncObj's election start in ``_onTick`` (syncobj.py), as written there."""
        if self._SyncObj__raftElectionDeadline < now and self._SyncObj__connectedToAnyone():
            self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()
            self.raftCurrentTerm += 1
            self.elections += 1


class _Transport:
    def __init__(self, sync: _Sync) -> None:
        self._syncObj = sync
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, node: _Node, message: dict[str, Any]) -> None:
        self.sent.append((node.id, message))

    def _wake_at(self, delay: float) -> None:
        pass


class _Guard:
    promise = 0.4

    def promise_left(self) -> float:
        return 0.0


def _granted_by_n2(pv: PreVote, transport: _Transport) -> None:
    """n2 grants the round PreVote asked first (a majority of three with itself)."""
    ask = transport.sent[0][1]
    pv.on_message(
        _Node("n2"),
        {
            "type": "rl_pre_vote_response",
            "term": ask["term"],
            "round": ask["round"],
            "granted": True,
        },
    )


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr(prevote_module, "raft_clock", lambda: now[0])
    return now


def _make(deadline: float) -> tuple[_Sync, _Transport, PreVote]:
    sync = _Sync(deadline)
    transport = _Transport(sync)
    return sync, transport, PreVote(transport, _Guard())  # type: ignore[arg-type]


def test_a_deadline_due_between_the_two_checks_starts_no_election(clock: list[float]) -> None:
    """The race: before_tick reads 100.0 with the deadline at 100.001; PySyncObj's
    check reads 100.002. The deadline is PreVote's: PySyncObj's stays NEVER."""
    sync, _, pv = _make(deadline=100.001)
    pv.before_tick()
    assert sync._SyncObj__raftElectionDeadline == NEVER and pv.timer == 100.001
    sync.pysyncobj_check(now=100.002)
    assert sync.elections == 0 and sync.raftCurrentTerm == 5
    # A hold's end is the same race: a round is asked at the next tick, then held.
    clock[0] = 100.002
    pv.before_tick()
    assert pv.rounds == 1 and pv.held is not None and pv.timer == pv.held
    sync.pysyncobj_check(now=pv.held + 0.001)
    assert sync.elections == 0


def test_an_election_runs_only_in_the_tick_after_a_majority_granted(clock: list[float]) -> None:
    sync, transport, pv = _make(deadline=99.0)
    pv.before_tick()
    assert pv.rounds == 1
    _granted_by_n2(pv, transport)
    assert pv.won and sync._SyncObj__raftElectionDeadline == NEVER
    sync.pysyncobj_check(now=clock[0])  # the rest of the tick that counted the grant
    assert sync.elections == 0
    pv.before_tick()  # the next tick: due now
    assert sync._SyncObj__raftElectionDeadline == 0.0 and pv.wins == 1
    sync.pysyncobj_check(now=clock[0])
    assert sync.elections == 1 and sync.raftCurrentTerm == 6
    # PySyncObj's new deadline (a candidate's) is taken at the next tick.
    pv.before_tick()
    assert pv.timer == clock[0] + 1.0 and sync._SyncObj__raftElectionDeadline == NEVER


def test_a_deadline_written_between_ticks_is_taken_and_ends_the_rounds(
    clock: list[float],
) -> None:
    """A leader heard (PySyncObj writes now + timeout) cancels a won pre-vote; an
    early election (transport.py) compares with the real deadline, not NEVER."""
    sync, transport, pv = _make(deadline=99.0)
    pv.before_tick()
    _granted_by_n2(pv, transport)
    assert pv.won
    sync._SyncObj__raftElectionDeadline = 101.0  # an append_entries from a leader
    assert pv.deadline() == 101.0
    pv.before_tick()
    assert not pv.won and pv.timer == 101.0 and sync._SyncObj__raftElectionDeadline == NEVER
    assert pv.deadline() == 101.0
    clock[0] = 102.0
    pv.before_tick()
    sync.pysyncobj_check(now=102.0)
    assert sync.elections == 0 and pv.rounds == 2
