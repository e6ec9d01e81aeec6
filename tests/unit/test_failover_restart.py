"""The early election after restarts too (issue 37).

A follower whose connection to its leader closes runs in its rank's slot when its
vote promise ends (``LeaseTransport._leader_gone``). A node restarted a moment ago
restores its state from its own journal and counts as caught up before the first
heartbeat names the leader: it knew no leader, ignored the close, waited its random
timeout, and could split the vote with the survivors running in their slots (one
failover of three took 1.0 s). Now a node that has heard no leader since its start
takes the close of a member whose connection was up as its leader's.

The unit half of these tests (no process); the integration half is
tests/integration/test_failover_restart.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from raftlease.replication import transport
from raftlease.replication.transport import EARLY_FIRST, EARLY_JITTER


class _Node:
    def __init__(self, node_id: str) -> None:
        self.id = node_id


class _Sync:
    def __init__(self, others: list[_Node], deadline: float) -> None:
        self.otherNodes = set(others)
        self._SyncObj__raftElectionDeadline = deadline

    def _getLeader(self) -> None:
        return None  # restarted: no heartbeat has named the leader yet

    def _isLeader(self) -> bool:
        return False


class _Guard:
    promise = 0.4
    early_elections = 0

    def __init__(self, heard: float | None) -> None:
        self.heard = heard

    def promise_left(self) -> float:
        return 0.1

    def heard_ago(self) -> float | None:
        return self.heard


def _transport(heard: float | None, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, _Sync]:
    monkeypatch.setattr(transport, "raft_clock", lambda: 1_000.0)
    gone, me, other = _Node("127.0.0.1:7002"), _Node("127.0.0.1:7001"), _Node("127.0.0.1:7003")
    sync = _Sync([gone, other], deadline=2_000.0)
    t = transport.LeaseTransport.__new__(transport.LeaseTransport)
    t._syncObj = sync
    t._selfNode = me
    t.guard = _Guard(heard)
    t._wake_at = lambda delay: None
    return t, sync


def test_a_node_that_heard_no_leader_yet_takes_a_close_as_its_leaders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    t, sync = _transport(None, monkeypatch)
    t._leader_gone(_Node("127.0.0.1:7002"), True)
    delay = sync._SyncObj__raftElectionDeadline - 1_000.0
    assert 0.1 + EARLY_FIRST * 0.4 <= delay <= 0.1 + (EARLY_FIRST + EARLY_JITTER) * 0.4  # rank 0
    assert t.guard.early_elections == 1


@pytest.mark.parametrize(("heard", "was_up"), [(None, False), (0.2, True)])
def test_a_failed_dial_or_a_node_that_lost_its_leader_keeps_its_deadline(
    heard: float | None, was_up: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dial that failed is no news of a leader; a node that heard a leader and now
    knows none (it already ran, or gave a vote) keeps PySyncObj's rule."""
    t, sync = _transport(heard, monkeypatch)
    t._leader_gone(_Node("127.0.0.1:7002"), was_up)
    assert sync._SyncObj__raftElectionDeadline == 2_000.0
    assert t.guard.early_elections == 0
