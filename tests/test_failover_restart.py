"""The early election after restarts too (issue 37).

A follower whose connection to its leader closes runs in its rank's slot when its
vote promise ends (``LeaseTransport._leader_gone``). A node restarted a moment ago
restores its state from its own journal and counts as caught up before the first
heartbeat names the leader: it knew no leader, ignored the close, waited its random
timeout, and could split the vote with the survivors running in their slots (one
failover of three took 1.0 s). Now a node that has heard no leader since its start
takes the close of a member whose connection was up as its leader's.
"""

from __future__ import annotations

from typing import Any

import pytest

from raftlease.replication import transport
from raftlease.replication.transport import EARLY_FIRST, EARLY_JITTER
from raftlease.testing import LocalCluster, wait_for


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


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_failover_right_after_a_follower_restart_takes_one_term(cluster: LocalCluster) -> None:
    """Restart a follower, wait until it has caught up (its applied index reaches the
    leader's commit index, which it may do from its own journal before it hears the
    leader), kill the leader: the next one is elected, in one term as a rule. Three
    times, a different follower each time where possible. Terms are asserted, not
    times, and loosely: a split vote stays possible on a loaded machine (the early
    election narrows the race, it does not remove it), so one of three may take more
    terms; the mechanism itself is pinned by the two tests above."""
    terms = []
    for attempt in range(3):
        old = cluster.wait_for_leader()
        followers = sorted(n.id for n in cluster.nodes if n.id != old["node"])
        restarted = followers[attempt % len(followers)]
        commit = int(cluster.node_status(old["node"])["commit_index"])
        cluster.kill_node(restarted)
        cluster.start_node(restarted)

        def caught_up(node_id: str = restarted, commit: int = commit) -> bool:
            try:
                status = cluster.node_status(node_id, timeout=0.5)
            except Exception:
                return False
            return bool(status.get("restored")) and int(status["applied_index"]) >= commit

        wait_for(caught_up, 30, f"the restarted {restarted} to catch up")
        cluster.kill_node(old["node"])
        new = cluster.wait_for_leader(timeout=30, exclude=old["node"])
        terms.append(int(new["term"]) - int(old["term"]))
        cluster.start_node(old["node"])
        wait_for(
            lambda node_id=old["node"]: cluster.node_status(node_id).get("leader") is not None,
            30,
            "the old leader to follow",
        )
    assert all(t >= 1 for t in terms), terms
    assert terms.count(1) >= 2, f"failovers after a restart split the vote: {terms}"
