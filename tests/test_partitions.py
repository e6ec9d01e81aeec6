"""Partitions between real node processes through the chaos suite's TCP proxy: the vote
promise under a partial partition, and a node that inflated its term rejoining."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlease import Client
from raftlease.config import local_cluster
from raftlease.testing import LocalCluster, free_port_block, wait_for

from .conftest import FAST_SETTINGS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jepsen-style"))
from proxy import DROP, ProxyNet

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


class Proxied:
    def __init__(self, cluster: LocalCluster, proxies: ProxyNet) -> None:
        self.cluster = cluster
        self.proxies = proxies

    def status(self, node_id: str) -> dict[str, Any]:
        addr = self.cluster.node(node_id).client
        with Client([addr]) as c:
            return c.node_status(addr, timeout=2.0)


def _proxied(request: pytest.FixtureRequest, **settings: Any) -> Iterator[Proxied]:
    base = free_port_block(3)
    nodes = local_cluster(3, base)
    proxies = ProxyNet(nodes, [base + 200 + i for i in range(3)]).start()
    cluster = LocalCluster(
        3,
        client_port=base,
        settings={**FAST_SETTINGS, **settings},
        node_settings=proxies.dial_settings(),
    )
    try:
        cluster.start()
        yield Proxied(cluster, proxies)
    finally:
        if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
            print(cluster.logs())
        cluster.close()
        proxies.stop()


@pytest.fixture
def proxied(request: pytest.FixtureRequest) -> Iterator[Proxied]:
    yield from _proxied(request)


def test_partial_partition_keeps_the_leader_thanks_to_the_vote_promise(
    proxied: Proxied,
) -> None:
    """Cut the leader from one follower only. That follower times out and campaigns; the
    other follower, still hearing from the leader, refuses its votes. Without the
    promise it would elect it while the old leader still serves lease reads."""
    cluster = proxied.cluster
    leader = cluster.leader_id()
    cut, bridge = [n.id for n in cluster.nodes if n.id != leader]
    with cluster.client() as c:
        lease = c.acquire("partial/k", owner="agent", ttl=30.0)
    proxied.proxies.block([(leader, cut), (cut, leader)], mode=DROP)
    try:
        deadline = time.monotonic() + 5.0
        cut_terms = []
        with cluster.client() as c:
            while time.monotonic() < deadline:
                for node in (cut, bridge):
                    assert proxied.status(node)["role"] != "leader", (
                        f"{node} became leader while {leader} still led"
                    )
                cut_terms.append(proxied.status(cut)["term"])
                read = c.read("partial/k")
                assert read.holder is not None and read.holder.token == lease.token
        assert max(cut_terms) > proxied.status(leader)["term"], "the cut node never ran"
        assert proxied.status(bridge)["votes_refused"] > 0
    finally:
        proxied.proxies.heal()
    # After the heal the cut node rejoins (its higher term forces one election).
    cluster.wait_for_leader(timeout=30)
    with cluster.client() as c:
        assert c.holder("partial/k") is not None


def test_node_with_inflated_term_rejoins_after_heal(proxied: Proxied) -> None:
    cluster = proxied.cluster
    leader = cluster.leader_id()
    start_term = proxied.status(leader)["term"]
    # Cut a follower off from everyone while its connections stay up: it keeps
    # starting elections and raising its term. PySyncObj campaigns only while it counts
    # a connection as up, which through the proxy depends on who dials whom (the
    # greater address dials), so try the followers that dial first, then the other.
    followers = sorted((n for n in cluster.nodes if n.id != leader), key=lambda n: n.raft)
    victim = None
    for candidate in reversed(followers):
        others = [n.id for n in cluster.nodes if n.id != candidate.id]
        proxied.proxies.block(
            [(candidate.id, o) for o in others] + [(o, candidate.id) for o in others], mode=DROP
        )
        try:
            wait_for(
                lambda c=candidate.id: proxied.status(c)["term"] >= start_term + 3,
                timeout=15,
                what=f"{candidate.id} to inflate its term",
            )
        except TimeoutError:
            proxied.proxies.heal()
            continue
        victim = candidate.id
        break
    assert victim is not None, "no isolated follower ever campaigned"
    try:
        with cluster.client() as c:
            lease = c.acquire("inflate/k", owner="agent", ttl=30.0, timeout=20)
    finally:
        proxied.proxies.heal()

    def rejoined() -> bool:
        leader_now = cluster.leader()
        if leader_now is None:
            return False
        status = proxied.status(victim)
        return (
            status["role"] == "follower"
            and status["leader"] == leader_now["client"]
            and status["applied_index"] >= leader_now["commit_index"] - 1
        )

    wait_for(rejoined, timeout=40, what="the inflated node to follow the leader again")
    with Client([cluster.node(victim).client]) as c:
        read = c.read("inflate/k", consistency="stale")
        assert read.holder is not None and read.holder.token == lease.token
