"""Membership changes on real node processes (docs/membership.md): add, remove and
replace members while the cluster serves; one change at a time; the peer layer accepts
a new member only after its change and refuses a removed one; a new member catches up
through a snapshot; a restarted node comes back with the membership of its log."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import pytest

from raftlease.config import NodeAddress
from raftlease.errors import InvalidArgumentError, NotLeaderError, RaftLeaseError
from raftlease.testing import LocalCluster
from raftlease.testing.cluster import PORT_RANGE, port_free, wait_for
from tests.integration.test_cluster import raw_request

pytestmark = pytest.mark.integration


def call(cluster: LocalCluster, op: str, args: dict[str, Any], timeout: float = 40.0) -> Any:
    with cluster.client(attempt_timeout=timeout) as c:
        return c.call(op, args, mutating=False, timeout=timeout)


def members(cluster: LocalCluster, endpoint: str | None = None) -> list[str]:
    """Member ids as one node (default: the leader) has them in its log."""
    addr = endpoint or cluster.wait_for_leader()["client"]
    answer = raw_request(addr, {"id": 1, "op": "member_list"})
    assert answer["ok"], answer
    return [m["id"] for m in answer["result"]["members"]]


def add(cluster: LocalCluster, node: NodeAddress, catch_up: float = 30.0) -> dict[str, Any]:
    args = {"member_id": node.id, "raft": node.raft, "client": node.client, "timeout": catch_up}
    result: dict[str, Any] = call(cluster, "member_add", args)
    return result


def remove(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    result: dict[str, Any] = call(cluster, "member_remove", {"member_id": node_id})
    return result


def new_node_that_dials(cluster: LocalCluster, node_id: str) -> NodeAddress:
    """A node to add whose raft address is above every member's: PySyncObj's greater
    address dials, so it is the one that connects, and is refused until it is added."""
    top = max(int(n.raft.rpartition(":")[2]) for n in cluster.nodes)
    # Within this process's ports (PORT_RANGE: a pytest-xdist worker's own slice).
    high = PORT_RANGE[1] - 100
    base = next(p for p in range(top + 1, high) if port_free(p) and port_free(p + 100))
    return cluster.new_node(node_id, client_port=base)


def all_agree(cluster: LocalCluster, expected: list[str]) -> bool:
    """Every running member lists ``expected`` and agrees on one leader."""
    views = [members(cluster, n.client) for n in cluster.nodes if cluster.is_running(n.id)]
    return all(v == expected for v in views) and cluster.leader() is not None


@pytest.mark.timeout(180)
def test_add_then_remove_a_member_while_serving(cluster: LocalCluster) -> None:
    with cluster.client() as c:
        before = c.acquire("m/before", owner="a", ttl=60.0)
    new = new_node_that_dials(cluster, "n4")
    cluster.start_node("n4")
    # Not a member yet: the others refuse its connections, so it never hears a leader.
    wait_for(
        lambda: (
            "names no member"
            in "".join(cluster.log_path(n).read_text(errors="replace") for n in ("n1", "n2", "n3"))
        ),
        30,
        "the old members refusing the not-yet-added node",
    )
    status = raw_request(new.client, {"id": 1, "op": "status"})["result"]
    assert status["role"] != "leader" and status["leader"] is None

    result = add(cluster, new)
    assert result["kind"] == "add" and result["caught_up"] is True
    assert result["members"] == ["n1", "n2", "n3", "n4"]
    wait_for(lambda: all_agree(cluster, ["n1", "n2", "n3", "n4"]), 30, "four members agreed")
    # The new member has the state (the grant made before it joined): it applies what
    # it replicated once a heartbeat tells it the commit index.
    stale = {"id": 2, "op": "holder", "key": "m/before", "consistency": "stale"}
    wait_for(
        lambda: (
            (raw_request(new.client, stale)["result"].get("holder") or {}).get("token")
            == before.token
        ),
        30,
        "the grant on the new member",
    )
    # The member list is on disk in every member's data directory.
    saved = json.loads((cluster.node_dir("n4") / "members.json").read_text())
    assert [m["id"] for m in saved["members"]] == ["n1", "n2", "n3", "n4"]

    # Remove a follower (not the leader) while writes go on.
    leader = cluster.leader_id()
    victim = next(n.id for n in cluster.nodes if n.id not in (leader, "n4"))
    removed = remove(cluster, victim)
    assert removed["kind"] == "remove" and victim not in removed["members"]
    cluster.forget_node(victim)
    expected = sorted({"n1", "n2", "n3", "n4"} - {victim})
    wait_for(lambda: all_agree(cluster, expected), 30, "three members agreed")
    with cluster.client() as c:
        after = c.acquire("m/after", owner="b", ttl=60.0)
        assert after.token > before.token
        held = c.holder("m/before")
        assert held is not None and held.token == before.token


@pytest.mark.timeout(180)
def test_one_change_at_a_time_and_definite_refusals(cluster: LocalCluster) -> None:
    leader = cluster.wait_for_leader()
    # A member that is already one, an unknown one, the leader itself: definite, no change.
    n1 = cluster.node("n1")
    for op, args, text in [
        ("member_add", {"member_id": "n1", "raft": n1.raft, "client": n1.client}, "already"),
        ("member_remove", {"member_id": "n9"}, "not a member"),
        ("member_remove", {"member_id": leader["node"]}, "cannot remove itself"),
    ]:
        with pytest.raises(InvalidArgumentError, match=text):
            call(cluster, op, args, timeout=10)
    # Hostile input: a bad address, a missing field, a bad id.
    for args in [
        {"member_id": "n5", "raft": "nowhere", "client": "127.0.0.1:1"},
        {"member_id": "n5", "raft": "127.0.0.1:1"},
        {"member_id": "n 5\n", "raft": "127.0.0.1:1", "client": "127.0.0.1:2"},
    ]:
        answer = raw_request(leader["client"], {"id": 3, "op": "member_add", **args})
        assert not answer["ok"] and answer["definite"] is True
        assert answer["code"] in ("INVALID_ARGUMENT", "BAD_REQUEST")
    # A follower answers NOT_LEADER with the leader's address.
    follower = next(n for n in cluster.nodes if n.client != leader["client"])
    answer = raw_request(follower.client, {"id": 4, "op": "member_remove", "member_id": "n1"})
    assert answer["code"] == NotLeaderError.code and answer["detail"]["leader"] == leader["client"]
    assert members(cluster) == ["n1", "n2", "n3"]

    # While an add waits for a member that never starts (it cannot catch up), a second
    # change is refused with a clear, definite error.
    ghost = cluster.new_node("n5")
    results: list[Any] = []
    adder = threading.Thread(target=lambda: results.append(add(cluster, ghost, catch_up=8.0)))
    adder.start()
    try:
        wait_for(
            lambda: raw_request(leader["client"], {"id": 5, "op": "member_list"})["result"][
                "pending"
            ],
            20,
            "the add in flight",
        )
        answer = raw_request(
            leader["client"], {"id": 6, "op": "member_remove", "member_id": follower.id}
        )
        assert not answer["ok"] and answer["code"] == "UNAVAILABLE" and answer["definite"]
        assert "one change at a time" in answer["message"]
    finally:
        adder.join(60)
    # It never caught up as a learner (test_membership_learner.py): nothing changed.
    assert results and results[0]["caught_up"] is False and results[0]["added"] is False
    assert members(cluster) == ["n1", "n2", "n3"]
    cluster.forget_node("n5")
    wait_for(lambda: all_agree(cluster, ["n1", "n2", "n3"]), 30, "still three members")


@pytest.mark.timeout(240)
def test_replace_the_leader_and_restart_with_the_new_membership(
    cluster: LocalCluster,
) -> None:
    with cluster.client() as c:
        for i in range(20):
            c.acquire(f"r/{i}", owner="w", ttl=120.0)
    old_leader = cluster.leader_id()
    original = cluster.nodes
    new = cluster.new_node("n4")
    cluster.start_node("n4")
    assert add(cluster, new)["caught_up"] is True
    # The leader cannot remove itself: stop it, another node leads, remove it there.
    cluster.stop_node(old_leader)
    cluster.wait_for_leader(60, exclude=old_leader)
    wait_for(lambda: _try(lambda: remove(cluster, old_leader)), 60, "removing the old leader")
    cluster.forget_node(old_leader)
    expected = sorted({"n1", "n2", "n3", "n4"} - {old_leader})
    wait_for(lambda: all_agree(cluster, expected), 30, "the new membership agreed")

    # Every node restarts from a config file that still lists the old leader and not
    # n4 (an operator who never edited them): they come back with the log's members.
    current = cluster.nodes
    for node_id in [n.id for n in current]:
        cluster.stop_node(node_id)
    for node_id in [n.id for n in current]:
        cluster.nodes = original + ((new,) if node_id == "n4" else ())
        cluster.start_node(node_id)  # writes the stale config
    cluster.nodes = current
    text = cluster.config_path(expected[0]).read_text()
    assert old_leader in text and "n4" not in text
    wait_for(lambda: all_agree(cluster, expected), 60, "the log's membership after restart")
    with cluster.client() as c:
        held = c.holder("r/7")
        assert held is not None and held.owner == "w"
        c.acquire("r/after-restart", owner="w", ttl=30.0)


def _try(fn: Any) -> bool:
    try:
        fn()
    except RaftLeaseError:
        return False
    return True


@pytest.mark.timeout(180)
def test_a_new_member_catches_up_from_the_leaders_snapshot(
    cluster_factory: Any,
) -> None:
    """The leader compacted its log, so it sends the new member its dump (PySyncObj's
    ``serialized`` append_entries path) before the entries after it; the add answers
    ``caught_up`` only once the new member's match index reached the change."""
    cluster = cluster_factory(3, compaction_min_entries=20, compaction_min_time=2.0)
    with cluster.client() as c:
        tokens = [c.acquire(f"s/{i}", owner="w", ttl=120.0).token for i in range(60)]
    leader = cluster.leader_id()
    wait_for(
        lambda: (cluster.node_dir(leader) / "raft.dump").exists(), 30, "the leader's compaction"
    )
    new = cluster.new_node("n4")
    cluster.start_node("n4")
    result = add(cluster, new)
    assert result["caught_up"] is True and result["match_index"] >= 60
    log_text = cluster.log_path("n4").read_text(errors="replace")
    assert "restored snapshot" in log_text, log_text[-3000:]
    stale = {"id": 1, "op": "holder", "key": "s/59", "consistency": "stale"}
    wait_for(
        lambda: (
            (raw_request(new.client, stale)["result"].get("holder") or {}).get("token")
            == tokens[-1]
        ),
        30,
        "the last grant on the new member",
    )


@pytest.mark.timeout(120)
def test_a_removed_member_is_told_stops_serving_and_refuses_to_restart(
    cluster: LocalCluster,
) -> None:
    """The leader tells a removed member once its removal committed (over the peer
    connection it keeps for that): the node then answers everything but status and
    ping with a definite UNAVAILABLE, its peers refuse it, and it refuses to start
    again on that data directory."""
    leader = cluster.leader_id()
    victim = next(n for n in cluster.nodes if n.id != leader)
    remove(cluster, victim.id)
    remaining = [n for n in cluster.nodes if n.id != victim.id]
    with cluster.client() as c:
        c.acquire("after/removal", owner="w", ttl=30.0)

    def status() -> dict[str, Any]:
        result: dict[str, Any] = raw_request(victim.client, {"id": 1, "op": "status"})["result"]
        return result

    wait_for(lambda: status()["role"] == "removed", 30, "the removed node told")
    # Its peers closed its connections and refuse new ones: it is connected to none.
    wait_for(lambda: status()["connected_peers"] == [], 30, "the removed node cut off")
    acquire = {"id": 2, "op": "acquire", "key": "x", "owner": "o", "ttl": 5.0}
    acquire.update(cid="c1", seq=1, ack=1)
    stale = {"id": 3, "op": "holder", "key": "after/removal", "consistency": "stale"}
    watch = {"id": 6, "op": "watch", "prefix": ""}
    for message in (acquire, stale, {"id": 4, "op": "member_list"}, watch):
        answer = raw_request(victim.client, message)
        assert not answer["ok"] and answer["definite"] is True, answer
        assert answer["code"] == "UNAVAILABLE" and "removed from the cluster" in answer["message"]
    statuses = [raw_request(n.client, {"id": 5, "op": "status"})["result"] for n in remaining]
    assert sum(s["role"] == "leader" for s in statuses) == 1
    assert all(victim.id not in members(cluster, n.client) for n in remaining)
    # Restarted on the same data directory, it refuses to start, saying what to do.
    cluster.stop_node(victim.id)
    proc = cluster.start_node(victim.id)
    assert proc.wait(timeout=60) == 2
    text = cluster.log_path(victim.id).read_text(errors="replace")
    assert "this node was removed from the cluster" in text and "member add" in text


@pytest.mark.timeout(120)
def test_a_node_refuses_to_start_on_a_snapshot_newer_than_it_understands(
    cluster_factory: Any,
) -> None:
    """Rolling upgrades: a node given a snapshot of a newer layout (as a newer build's
    leader would send it, or left in its data directory by a newer build) stops with a
    message naming both versions, instead of running with a state it cannot read."""
    import gzip

    import msgpack
    from pysyncobj import pickle as pysyncobj_pickle

    from raftlease.core.snapshot import SNAPSHOT_VERSION
    from raftlease.replication.replica import SNAPSHOT_LOAD_FAILED
    from raftlease.replication.snapshot_rows import pack_snapshot

    cluster = cluster_factory(1, compaction_min_entries=5, compaction_min_time=1.0)
    with cluster.client() as c:
        for i in range(20):
            c.acquire(f"u/{i}", owner="w", ttl=120.0)
    dump = cluster.node_dir("n1") / "raft.dump"
    wait_for(dump.exists, 30, "a snapshot")
    cluster.stop_node("n1")
    with gzip.open(dump, "rb") as f:
        data, last, before_last, members = pysyncobj_pickle.load(f)
    # This build writes the map in pieces (replication/snapshot_rows.py).
    plain = msgpack.unpackb(b"".join(data[1]), raw=False, strict_map_key=False)
    assert plain["v"] == SNAPSHOT_VERSION
    newer = pack_snapshot({**plain, "v": SNAPSHOT_VERSION + 1})
    with gzip.open(dump, "wb") as f:
        pysyncobj_pickle.dump(([data[0], newer], last, before_last, members), f)
    proc = cluster.start_node("n1")
    assert proc.wait(timeout=60) == SNAPSHOT_LOAD_FAILED
    text = cluster.log_path("n1").read_text(errors="replace")
    assert f"snapshot version {SNAPSHOT_VERSION + 1} is newer than this build" in text


def _cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "raftlease", "member", *args]
    cmd += ["--endpoints", ",".join(cluster.endpoints), "--json"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(180)
def test_the_member_commands(cluster: LocalCluster) -> None:
    """``raftlease member list|add|remove|replace`` as an operator runs them."""
    listed = _cli(cluster, "list")
    assert listed.returncode == 0, listed.stderr
    assert [m["id"] for m in json.loads(listed.stdout)["members"]] == ["n1", "n2", "n3"]
    new = new_node_that_dials(cluster, "n4")
    cluster.start_node("n4")
    added = _cli(cluster, "add", "n4", "--raft", new.raft, "--client", new.client)
    assert added.returncode == 0, added.stdout + added.stderr
    assert json.loads(added.stdout)["caught_up"] is True
    # A definite refusal exits 1 and says why.
    again = _cli(cluster, "add", "n4", "--raft", new.raft, "--client", new.client)
    assert again.returncode == 1 and json.loads(again.stdout)["code"] == "INVALID_ARGUMENT"
    # Replace a follower: add n5, wait for it, remove the old one.
    leader = cluster.leader_id()
    old = next(n.id for n in cluster.nodes if n.id not in (leader, "n4"))
    n5 = new_node_that_dials(cluster, "n5")
    cluster.start_node("n5")
    replaced = _cli(cluster, "replace", old, "n5", "--raft", n5.raft, "--client", n5.client)
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    result = json.loads(replaced.stdout)
    assert result["added"]["caught_up"] is True and result["removed"]["member"] == old
    cluster.forget_node(old)
    expected = sorted({"n1", "n2", "n3", "n4", "n5"} - {old})
    wait_for(lambda: all_agree(cluster, expected), 30, "the replaced membership agreed")
    listed = _cli(cluster, "list")
    assert [m["id"] for m in json.loads(listed.stdout)["members"]] == expected


@pytest.mark.timeout(120)
def test_member_operations_need_the_admin_permission(cluster_factory: Any, tmp_path: Any) -> None:
    from raftlease import Client, PermissionDeniedError, UnauthenticatedError
    from tests.integration.test_client_security import AGENT_TOKEN, secured

    cluster, bundle = secured(cluster_factory, tmp_path)
    ca = str(bundle.ca_file)
    ops = [("member_list", {}), ("member_remove", {"member_id": "n3"})]
    ops.append(("member_add", {"member_id": "n9", "raft": "127.0.0.1:1", "client": "127.0.0.1:2"}))
    with Client(cluster.endpoints, tls=ca, token=AGENT_TOKEN) as agent:
        for op, args in ops:
            with pytest.raises(PermissionDeniedError, match="admin only"):
                agent.call(op, args, mutating=False, timeout=10)
    with Client(cluster.endpoints, tls=ca) as anonymous:
        for op, args in ops:
            with pytest.raises(UnauthenticatedError):
                anonymous.call(op, args, mutating=False, timeout=10)
    with Client(cluster.endpoints, tls=ca, token=bundle.admin_token) as admin:
        listed = admin.call("member_list", {}, mutating=False, timeout=10)
        assert [m["id"] for m in listed["members"]] == ["n1", "n2", "n3"]
        with pytest.raises(InvalidArgumentError, match="not a member"):
            admin.call("member_remove", {"member_id": "n9"}, mutating=False, timeout=10)
