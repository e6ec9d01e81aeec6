"""Partitions between real node processes through the chaos suite's TCP proxy: the vote
promise under a partial partition, leader stickiness under a one-way cut, PreVote, and
a node that inflated its term anyway (a build without PreVote) rejoining. (A member cut
off from every other and healed: tests/integration/test_planted_bugs.py, with and without
PreVote.)"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlease import Client
from raftlease.config import local_cluster
from raftlease.errors import RaftLeaseError
from raftlease.testing import LocalCluster, free_port_block, wait_for
from tests.conftest import FAST_SETTINGS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "jepsen-style"))
from proxy import DROP, PASS, ProxyNet

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


class Proxied:
    def __init__(self, cluster: LocalCluster, proxies: ProxyNet) -> None:
        self.cluster = cluster
        self.proxies = proxies

    def status(self, node_id: str) -> dict[str, Any]:
        addr = self.cluster.node(node_id).client
        with Client([addr]) as c:
            return c.node_status(addr, timeout=2.0)


def _proxied(
    request: pytest.FixtureRequest,
    node_hooks: dict[str, dict[str, Any]] | None = None,
    **settings: Any,
) -> Iterator[Proxied]:
    base = free_port_block(3)
    nodes = local_cluster(3, base)
    proxies = ProxyNet(nodes, [base + 200 + i for i in range(3)]).start()
    cluster = LocalCluster(
        3,
        client_port=base,
        settings={**FAST_SETTINGS, **settings},
        node_settings=proxies.dial_settings(),
        node_hooks=node_hooks,
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


@pytest.fixture
def proxied_steady(request: pytest.FixtureRequest) -> Iterator[Proxied]:
    """For tests that assert who leads while a follower is cut off: a 1 s vote promise
    (the leader lease counts from it, and the other follower's refusals last it) so
    that one heartbeat delayed on a busy machine neither ends the leader's majority
    nor frees that follower's vote; peer connections never time out during the test,
    so a one-way cut leaves each pair the link it had."""
    yield from _proxied(
        request,
        election_timeout_min=1.0,
        election_timeout_max=2.0,
        leader_fallback=2.0,
        connection_timeout=60.0,
    )


def test_partial_partition_keeps_the_leader_thanks_to_the_vote_promise(
    proxied_steady: Proxied,
) -> None:
    """Cut the leader from one follower only. That follower times out and asks for
    pre-votes; the other follower, still hearing from the leader, refuses them, so
    the cut one never raises its term. Without the promise it would elect it while
    the old leader still serves lease reads."""
    proxied = proxied_steady
    cluster = proxied.cluster
    leader = cluster.leader_id()
    cut, bridge = [n.id for n in cluster.nodes if n.id != leader]
    with cluster.client() as c:
        lease = c.acquire("partial/k", owner="agent", ttl=30.0)
    term = proxied.status(leader)["term"]
    rounds = proxied.status(cut)["pre_vote_rounds"]
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
        assert proxied.status(cut)["pre_vote_rounds"] > rounds, "the cut node never asked"
        assert max(cut_terms) == term, f"the cut node raised its term: {cut_terms}"
        assert proxied.status(bridge)["votes_refused"] > 0
    finally:
        proxied.proxies.heal()
    # After the heal the cut node follows the same leader in the same term.
    wait_for(
        lambda: proxied.status(cut)["leader"] == cluster.node(leader).client,
        timeout=30,
        what="the cut node to follow the leader again",
    )
    assert (proxied.status(leader)["role"], proxied.status(leader)["term"]) == ("leader", term)
    with cluster.client() as c:
        assert c.holder("partial/k") is not None


def test_leader_a_majority_acknowledges_is_not_deposed_by_a_follower_that_cannot_hear_it(
    proxied_steady: Proxied,
) -> None:
    """Leader stickiness (prevote.py). Only the leader's messages to one follower are
    dropped: that follower hears nothing, times out and asks for pre-votes, and its
    requests do reach the leader. The leader refuses them while the other follower
    acknowledges it, and the other follower refuses them under its vote promise, so
    the cut follower never raises its term. After the heal it follows the same leader
    in the same term."""
    p = proxied_steady
    cluster = p.cluster
    leader = cluster.leader_id()
    cut, bridge = [n.id for n in cluster.nodes if n.id != leader]
    term = p.status(leader)["term"]
    with cluster.client() as c:
        lease = c.acquire("sticky/k", owner="agent", ttl=60.0)
    towards_leader = p.proxies.link(cut, leader).flow(cut, leader)
    sent_before = towards_leader.forwarded_bytes
    p.proxies.block([(leader, cut)], mode=DROP)  # one way: cut -> leader still passes
    try:
        deadline = time.monotonic() + 8.0
        cut_terms = []
        while time.monotonic() < deadline:
            status = p.status(leader)
            assert (status["role"], status["term"]) == ("leader", term), (
                f"{leader} lost leadership or its term: {status['role']} in {status['term']}"
            )
            status = p.status(bridge)
            assert (status["role"], status["term"]) == ("follower", term), status
            cut_terms.append(p.status(cut)["term"])
        # The cut follower asked for pre-votes, its messages (pre-vote requests: it
        # heard no append_entries to answer) reached the leader, and it raised no term.
        assert p.status(cut)["pre_vote_rounds"] > 0
        assert max(cut_terms) == term, f"the cut follower raised its term: {cut_terms}"
        assert towards_leader.forwarded_bytes > sent_before, "no pre-vote reached the leader"
    finally:
        p.proxies.heal()

    def converged() -> bool:
        agreed = cluster.leader()
        if agreed is None:
            return False
        statuses = [p.status(n.id) for n in cluster.nodes]
        return (
            agreed["node"] == leader
            and {s["term"] for s in statuses} == {term}
            and all(s["applied_index"] >= agreed["commit_index"] for s in statuses)
        )

    wait_for(converged, timeout=30, what="the same leader, its term, every node caught up")
    with cluster.client() as c:
        holder = c.holder("sticky/k")
        assert holder is not None and holder.token == lease.token
        c.release(lease)


def test_a_survivor_refused_under_the_others_promise_asks_again_when_it_ends(
    proxied: Proxied,
) -> None:
    """The first survivor (rank 0) stops hearing the leader most of a vote promise
    before the second does (the leader's messages to it are dropped), then the
    leader dies. The first asks for pre-votes while the second's promise still
    holds: the second refuses (counted in ``votes_refused``), saying when its promise
    ends, changes no term, and the first asks again then: the cluster elects in the
    next term. (Before PreVote the second dropped a real vote request and took its
    term afterwards; before that, both ran in one term and split the vote.)"""
    p = proxied
    cluster = p.cluster
    promise = float(FAST_SETTINGS["election_timeout_min"])
    old = cluster.wait_for_leader()
    leader = str(old["node"])
    first, second = (
        n.id for n in sorted((n for n in cluster.nodes if n.id != leader), key=lambda n: n.raft)
    )
    refused = int(p.status(second)["votes_refused"])
    rounds = int(p.status(first)["pre_vote_rounds"])
    p.proxies.block([(leader, first)], mode=DROP)
    time.sleep(promise * 0.8)  # the fault's length: first hears nothing more meanwhile
    cluster.kill_node(leader)
    p.proxies.heal()
    new = cluster.wait_for_leader(timeout=30, exclude=leader)
    with cluster.client() as c:
        assert c.acquire("survivor/k", owner="agent-1", ttl=5.0).token > 0
    assert int(p.status(second)["votes_refused"]) > refused, "the second never refused"
    assert int(p.status(first)["pre_vote_rounds"]) - rounds >= 2 or new["node"] == second
    # Exactly old + 1 when nothing else intervenes; a loaded machine can let both win
    # a pre-vote and split the real vote once: liveness, not safety.
    assert old["term"] + 1 <= new["term"] <= old["term"] + 2, (old, new)


@pytest.fixture
def proxied_eager(request: pytest.FixtureRequest) -> Iterator[Proxied]:
    """Every node a build without PreVote (planted bug ``skip_pre_vote``): a node cut
    off raises its term as plain Raft does."""
    hooks = {"planted_bug": "skip_pre_vote"}
    yield from _proxied(request, node_hooks={f"n{i}": hooks for i in (1, 2, 3)})


def test_node_with_inflated_term_rejoins_after_heal(proxied_eager: Proxied) -> None:
    """A node whose term grew while it was cut off (a build without PreVote, or one
    that won a pre-vote and was then cut off) still rejoins: the leader learns the
    higher term from its answer to the leader's stale append_entries and the cluster
    elects again."""
    proxied = proxied_eager
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


def _raft_log(cluster: LocalCluster, node_id: str) -> tuple[int, int]:
    """(last log index, commit index) from the node's status on its client port (not
    through the proxy; PySyncObj's own utility ``status`` on the Raft port is refused,
    docs/security.md)."""
    with Client([cluster.node(node_id).client]) as c:
        status = c.node_status(cluster.node(node_id).client, timeout=1.0)
    return int(status["last_log_index"]), int(status["commit_index"])


@pytest.fixture
def proxied_no_compaction(request: pytest.FixtureRequest) -> Iterator[Proxied]:
    # No log compaction: a snapshot must not be what repairs the deposed leader's log.
    yield from _proxied(request, compaction_min_time=3600.0, compaction_min_entries=1_000_000)


@pytest.mark.timeout(120)
def test_deposed_leader_takes_the_new_leaders_log_after_heal(
    proxied_no_compaction: Proxied,
) -> None:
    """Finding 1 of jepsen-style/README.md. A leader cut off from the others appends
    proposals in its own term that never commit. Once a leader elected with a longer
    log probes it (its next index starts past that tail) while busy with writes
    (several append_entries in flight per round trip), PySyncObj's follower answered
    the message behind each probe "next = log end + 1", undoing the step back: the old
    leader never took the new log (match index 0) until a snapshot or a change of
    leader, and with it a majority could be stuck."""
    p = proxied_no_compaction
    cluster = p.cluster
    ids = [n.id for n in cluster.nodes]
    old = cluster.leader_id()
    p.proxies.partition([[old], [n for n in ids if n != old]])
    with Client([cluster.node(old).client], deadline=0.4, attempt_timeout=0.2) as c:
        for i in range(4):
            with contextlib.suppress(RaftLeaseError, TimeoutError, OSError):
                c.acquire(f"deposed/{i}", owner="cut-off", ttl=5.0, timeout=0.3)
    tail_end, old_commit = _raft_log(cluster, old)
    assert tail_end > old_commit, "the cut-off leader appended nothing uncommitted"

    def sole_leader(among: list[str]) -> str | None:
        roles = {n: p.status(n)["role"] for n in among}
        leaders = [n for n, role in roles.items() if role == "leader"]
        return leaders[0] if len(leaders) == 1 else None

    stop = threading.Event()
    written = [0]

    def load(name: str) -> None:
        deadline = time.monotonic() + 60
        with Client([cluster.node(n).client for n in ids], deadline=3.0) as c:
            i = 0
            while not stop.is_set() and time.monotonic() < deadline:
                with contextlib.suppress(RaftLeaseError, TimeoutError, OSError):
                    c.acquire(f"load/{name}/{i}", owner=name, ttl=30.0)
                    written[0] += 1
                i += 1

    writers = [threading.Thread(target=load, args=(f"w{k}",), daemon=True) for k in range(4)]
    for w in writers:
        w.start()
    try:
        first = wait_for(
            lambda: sole_leader([n for n in ids if n != old]), timeout=20, what="a leader"
        )
        # Far enough that the leader's first probe spans several 64 KiB messages.
        wait_for(
            lambda: _raft_log(cluster, first)[1] > tail_end + 1000,
            timeout=40,
            what="the majority to commit well past the old leader's tail",
        )
        # Cut that leader off and let the old one back in: the remaining node wins the
        # election (its log is newer) with a next index past the old leader's tail.
        second = next(n for n in ids if n not in (old, first))
        p.proxies.set_flows(
            [(first, n, DROP, 0.0) for n in (old, second)]
            + [(n, first, DROP, 0.0) for n in (old, second)]
            + [(old, second, PASS, 0.0), (second, old, PASS, 0.0)]
        )
        p.proxies.reset(old)  # that stream lost bytes while it was cut
        wait_for(lambda: sole_leader([second]), timeout=20, what=f"{second} to lead")
        p.proxies.heal()
        target = _raft_log(cluster, second)[1]
        wait_for(
            lambda: _raft_log(cluster, old)[1] >= target,
            timeout=10,
            what=f"the deposed leader {old} to commit the leader's log up to {target}",
        )
        done = written[0]
        wait_for(lambda: written[0] > done + 20, timeout=10, what="writes after the heal")
    finally:
        stop.set()
        for w in writers:
            w.join(timeout=10)
