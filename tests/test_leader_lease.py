"""Leader-local lease reads on real clusters: modes, pauses and clock drift."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from raftlease import Client, InvalidArgumentError
from raftlease.testing import LocalCluster, wait_for

from .test_cluster import raw_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def hooked(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    """A cluster whose nodes accept the test-only clock control."""
    return cluster_factory(hooks={"clock_control": True})


def set_rate(addr: str, rate: float) -> None:
    response = raw_request(addr, {"id": 1, "op": "test_clock", "rate": rate})
    assert response["ok"], response


def node_status(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    with Client([cluster.node(node_id).client]) as c:
        return c.node_status(cluster.node(node_id).client)


def lease_reads_on(cluster: LocalCluster, node_id: str) -> bool:
    return bool(node_status(cluster, node_id).get("lease_reads"))


def test_read_modes_report_how_they_were_served(shared: LocalCluster) -> None:
    leader = shared.wait_for_leader()
    with shared.client() as c:
        lease = c.acquire("modes/a", owner="agent", ttl=10.0)
        wait_for(lambda: lease_reads_on(shared, leader["node"]), 10, "leader lease")
        read = c.read("modes/a")
        assert read.consistency == "lease" and read.served_by == leader["node"]
        assert read.holder is not None and read.holder.token == lease.token
        log_read = c.read("modes/a", consistency="log")
        assert log_read.consistency == "log"
        assert log_read.holder is not None and log_read.holder.token == lease.token
        assert [h.key for h in c.leases("modes/", consistency="linearizable")] == ["modes/a"]
        c.release(lease)
        assert c.holder("modes/a") is None, "a lease read must see the release"
    follower = next(n for n in shared.nodes if n.id != leader["node"])
    with Client([follower.client]) as c:
        stale = c.read("modes/a", consistency="stale")
        assert stale.consistency == "stale" and stale.served_by == follower.id
        assert stale.applied_index is not None and stale.applied_index > 0
        assert stale.age is not None and stale.age >= 0
    with shared.client() as c, pytest.raises(InvalidArgumentError, match="consistency"):
        c.holder("modes/a", consistency="eventual")


@pytest.fixture
def slow_fallback(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    """PySyncObj's own step-down (leader_fallback) set long, so that only the leader
    lease stands between a deposed leader and a stale read."""
    return cluster_factory(leader_fallback=15.0)


def test_paused_leader_never_returns_the_old_holder(slow_fallback: LocalCluster) -> None:
    """A leader stopped (SIGSTOP) loses its lease; after a new leader grants the key to
    someone else, the old leader, resumed, never answers with the old holder, although
    it still believes it leads until it hears the new term."""
    cluster = slow_fallback
    with cluster.client() as c:
        old = c.acquire("pause/k", owner="old-owner", ttl=1.0)
    old_leader = cluster.leader_id()
    old_addr = cluster.node(old_leader).client
    wait_for(lambda: lease_reads_on(cluster, old_leader), 10, "old leader's lease")
    cluster.pause_node(old_leader)
    try:
        others = [n.client for n in cluster.nodes if n.id != old_leader]
        with Client(others) as c:
            new = wait_for(
                lambda: _try_acquire(c, "pause/k", "new-owner"),
                timeout=30,
                what="the new leader to grant the key after the old lease expired",
            )
            assert new.token > old.token
    finally:
        cluster.resume_node(old_leader)
    # Right after resuming, hammer the old leader with reads in every linearizable
    # mode: each answer is the new holder, or a refusal; never the old holder.
    answers = []
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        for mode in ("linearizable", "log"):
            response = raw_request(
                old_addr, {"id": 1, "op": "holder", "key": "pause/k", "consistency": mode}
            )
            answers.append(response)
            if response["ok"]:
                holder = response["result"]["holder"]
                assert holder is not None and holder["owner"] == "new-owner", response
    assert answers


def _try_acquire(c: Client, key: str, owner: str) -> Any:
    from raftlease import LeaseHeldError

    try:
        return c.acquire(key, owner=owner, ttl=10.0, timeout=5)
    except LeaseHeldError:
        return None


@pytest.mark.parametrize("who", ["leader", "follower"])
def test_drift_beyond_bound_stops_lease_reads_until_back_in_bound(
    hooked: LocalCluster, who: str
) -> None:
    leader = hooked.leader_id()
    target = leader if who == "leader" else next(n.id for n in hooked.nodes if n.id != leader)
    wait_for(lambda: lease_reads_on(hooked, leader), 10, "leader lease")
    set_rate(hooked.node(target).client, 1.05)  # 5 % fast; the bound is 1 %
    wait_for(
        lambda: node_status(hooked, leader)["drift_alarm"],
        timeout=20,
        what="the leader to detect the skewed clock",
    )
    status = node_status(hooked, leader)
    assert status["lease_reads"] is False
    with hooked.client() as c:
        read = c.read("drift/k")
        assert read.consistency == "log", "reads fall back to the log under a drift alarm"
    set_rate(hooked.node(target).client, 1.0)
    wait_for(
        lambda: lease_reads_on(hooked, leader),
        timeout=30,
        what="lease reads to resume once the drift is back in bound",
    )


def test_drift_inside_bound_keeps_lease_reads(hooked: LocalCluster) -> None:
    leader = hooked.leader_id()
    follower = next(n.id for n in hooked.nodes if n.id != leader)
    wait_for(lambda: lease_reads_on(hooked, leader), 10, "leader lease")
    set_rate(hooked.node(follower).client, 1.003)  # inside the 1 % bound
    # Over several drift windows, the leader keeps serving lease reads.
    deadline = time.monotonic() + 8.0
    served = []
    with hooked.client() as c:
        while time.monotonic() < deadline:
            served.append(c.read("drift/in").consistency)
    status = node_status(hooked, leader)
    assert status["drift_alarm"] is False, status["drift"]
    # Allow the odd log read around a heartbeat hiccup on a loaded machine.
    assert served.count("lease") >= 0.9 * len(served), served
