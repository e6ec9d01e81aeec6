"""Failover when the leader's process dies: its kernel closes its connections at once,
and a follower that sees its leader's connection close runs for election when its
vote promise ends (plus a small random spread), not at its full random election
timeout (issue 16: failover). Never earlier than the promise: the old leader's lease
relies on it (docs/design.md).

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_failover_early.py.
"""

from __future__ import annotations

import time

import pytest

from raftlease.testing import LocalCluster, wait_for
from raftlease.testing.cluster import TEST_SETTINGS

pytestmark = pytest.mark.timeout(120)


def restart_and_follow(cluster: LocalCluster, node_id: str) -> None:
    """Start the killed ``node_id`` again and wait until it follows a leader."""
    cluster.start_node(node_id)
    wait_for(
        lambda: cluster.node_status(node_id).get("leader") is not None or None,
        30,
        f"the restarted {node_id} to follow the new leader",
    )


def early(cluster: LocalCluster, survivors: list[str]) -> dict[str, int]:
    return {n: int(cluster.node_status(n)["early_elections"]) for n in survivors}


@pytest.mark.integration
def test_a_killed_leader_is_replaced_by_an_election_at_the_promise_end(
    cluster: LocalCluster,
) -> None:
    # A follower brings its election forward only if the early deadline is before the
    # one it already has: one that drew a short random timeout right after a heartbeat
    # (or whose tick thread handles the close late on a loaded machine) keeps its own.
    # So up to three kills, and at least one must take the early path.
    moved: list[tuple[dict[str, int], dict[str, int]]] = []
    for attempt in range(3):
        old = cluster.wait_for_leader()
        survivors = [n.id for n in cluster.nodes if n.id != old["node"]]
        # Compared before and after, not against zero: a connection that closed while
        # the cluster formed may already have counted.
        before = early(cluster, survivors)
        cluster.kill_node(old["node"])  # SIGKILL: the kernel closes the leader's sockets
        new = cluster.wait_for_leader(timeout=30, exclude=old["node"])
        assert new["term"] > old["term"]
        after = early(cluster, survivors)
        moved.append((before, after))
        with cluster.client() as c:  # and the new leader serves writes
            assert c.acquire(f"failover/k{attempt}", owner="agent-1", ttl=5.0).token > 0
        if sum(after.values()) > sum(before.values()):
            return
        restart_and_follow(cluster, str(old["node"]))
    pytest.fail(f"no follower brought its election forward in 3 kills: {moved}")


@pytest.mark.integration
def test_followers_silent_to_each_other_past_the_connection_timeout_elect_in_one_term(
    cluster: LocalCluster,
) -> None:
    """Two followers send each other nothing while their leader lives. PySyncObj
    closes a connection at its next send when nothing was read on it for
    ``connection_timeout``: the first vote request of the election after the leader
    dies closed the followers' connection and was lost, and the second survivor ran
    in the same term (a split vote: 2 terms, 1.2-1.8 s in the benchmark). Now only
    silence while an answer is awaited closes a peer connection (peers.py).

    The wait is the input (a cluster that has run longer than the timeout), not a
    guess. Up to three kills: on a loaded machine the second survivor may still hold
    its vote promise when the request comes (then 2 terms for another reason)."""
    timeout = float({**TEST_SETTINGS, **cluster.settings}.get("connection_timeout", 3.0))
    terms = []
    for _ in range(3):
        old = cluster.wait_for_leader()
        time.sleep(timeout + 1.0)
        cluster.kill_node(old["node"])
        new = cluster.wait_for_leader(timeout=30, exclude=old["node"])
        terms.append(int(new["term"]) - int(old["term"]))
        if terms[-1] == 1:
            return
        restart_and_follow(cluster, str(old["node"]))
    pytest.fail(f"every failover after the followers' silence took more than one term: {terms}")


@pytest.mark.integration
def test_a_paused_leader_closes_nothing_and_brings_no_election_forward(
    cluster: LocalCluster,
) -> None:
    old = cluster.wait_for_leader()
    survivors = [n.id for n in cluster.nodes if n.id != old["node"]]
    before = early(cluster, survivors)
    cluster.pause_node(old["node"])  # SIGSTOP: its connections stay open
    try:
        cluster.wait_for_leader(timeout=30, exclude=old["node"])
        assert early(cluster, survivors) == before
    finally:
        cluster.resume_node(old["node"])
    # The old leader rejoins as a follower (its term is behind).
    wait_for(
        lambda: cluster.node_status(old["node"]).get("role") == "follower" or None,
        30,
        "the resumed leader to follow",
    )
