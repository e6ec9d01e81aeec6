"""The learner stage of ``member add`` (docs/membership.md, "Add a node"): the leader
streams the log to the joining node, which counts for no commit, vote or leader lease,
and appends the change only once the node has caught up; meanwhile one change at a
time still holds. On real node processes, plus the transport's rule for a learner's
messages checked in process.

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_membership_learner.py.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from raftlease.config import NodeAddress
from raftlease.testing import LocalCluster
from raftlease.testing.cluster import PORT_RANGE, port_free, wait_for
from tests.integration.test_cluster import raw_request
from tests.integration.test_membership import _cli, add, all_agree, members, new_node_that_dials


def new_node_dialled_by_the_leader(cluster: LocalCluster, node_id: str) -> NodeAddress:
    """A node to add whose raft address is below every member's: the leader dials it
    (PySyncObj's greater address dials)."""
    low = min(int(n.raft.rpartition(":")[2]) for n in cluster.nodes) - 100
    base = next(p for p in range(PORT_RANGE[0], low) if port_free(p) and port_free(p + 100))
    return cluster.new_node(node_id, client_port=base)


def _pending(addr: str) -> Any:
    return raw_request(addr, {"id": 1, "op": "member_list"})["result"]["pending"]


def _acquire_within(cluster: LocalCluster, key: str, seconds: float) -> str:
    """A write that must commit within ``seconds`` (wide: the machine is shared);
    returns its token."""
    started = time.monotonic()
    with cluster.client(attempt_timeout=seconds) as c:
        grant = c.acquire(key, owner="w", ttl=120.0)
    assert time.monotonic() - started < seconds
    return str(grant.token)


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("dialler", ["new node dials", "leader dials"])
def test_writes_go_on_with_an_old_member_down_while_a_new_one_catches_up(
    cluster_factory: Any, dialler: str
) -> None:
    """A 3-node cluster with a compacted, large state grows to 4. While the new node is
    a learner (before its change), one old follower is stopped: writes still commit on
    the two old members left (without the learner stage the new, empty node would
    count from the change on and those writes would need it). A second change is
    refused while the learner stage holds the slot. The new node then catches up
    through the leader's snapshot, the add commits, and writes go on with 3 of 4."""
    cluster = cluster_factory(3, compaction_min_entries=50, compaction_min_time=1.0)
    owner_pad = "x" * 240
    with cluster.client(attempt_timeout=30.0) as c:
        tokens = [
            c.acquire(f"big/{i:04d}", owner=f"{owner_pad}{i}", ttl=600.0).token for i in range(1000)
        ]
    leader_id = cluster.leader_id()
    leader = cluster.node(leader_id)
    wait_for(
        lambda: (cluster.node_dir(leader_id) / "raft.dump").exists(), 60, "the leader's compaction"
    )
    if dialler == "new node dials":
        new = new_node_that_dials(cluster, "n4")
    else:
        new = new_node_dialled_by_the_leader(cluster, "n4")
    results: list[Any] = []

    def adding() -> None:
        try:
            results.append(add(cluster, new, catch_up=120.0))
        except Exception as exc:
            results.append(exc)

    adder = threading.Thread(target=adding)
    adder.start()
    try:
        # The learner stage holds the change slot; nothing is in the log yet.
        pending = wait_for(lambda: _pending(leader.client), 30, "the add in its learner stage")
        assert pending == {"kind": "add", "member": "n4"}
        assert members(cluster, leader.client) == ["n1", "n2", "n3"]
        answer = raw_request(
            leader.client, {"id": 2, "op": "member_remove", "member_id": leader_id}
        )
        assert not answer["ok"] and answer["definite"] is True
        follower = next(n.id for n in cluster.nodes if n.id not in (leader_id, "n4"))
        answer = raw_request(leader.client, {"id": 3, "op": "member_remove", "member_id": follower})
        assert not answer["ok"] and answer["code"] == "UNAVAILABLE" and answer["definite"]
        assert "one change at a time" in answer["message"]

        # One old member down during the catch-up: writes still commit (2 of 3).
        cluster.stop_node(follower)
        for i in range(5):
            _acquire_within(cluster, f"during/{i}", 20.0)
        # The new node starts (empty) and is streamed the snapshot, then the entries,
        # while writes go on.
        cluster.start_node("n4")
        i = 0
        while adder.is_alive() and i < 200:
            _acquire_within(cluster, f"catching/{i}", 20.0)
            i += 1
    finally:
        adder.join(180)
    assert results, "the add did not answer"
    result = results[0]
    assert isinstance(result, dict), result
    assert result["kind"] == "add" and result["caught_up"] is True
    assert result["members"] == ["n1", "n2", "n3", "n4"]
    assert result["learner"]["match_index"] >= result["learner"]["commit_index"] - 64
    log_text = cluster.log_path("n4").read_text(errors="replace")
    assert "restored snapshot" in log_text, log_text[-3000:]
    leader_log = cluster.log_path(leader_id).read_text(errors="replace")
    assert f"learner {new.raft} connected" in leader_log
    assert "membership: learner n4 caught up" in leader_log
    # 3 of 4 with one old member down: the leader, the other old member, the new one.
    for j in range(3):
        _acquire_within(cluster, f"after/{j}", 20.0)
    # The new member holds the state made before it joined.
    stale = {"id": 4, "op": "holder", "key": "big/0999", "consistency": "stale"}
    wait_for(
        lambda: (
            (raw_request(new.client, stale)["result"].get("holder") or {}).get("token")
            == tokens[-1]
        ),
        30,
        "the state on the new member",
    )
    cluster.start_node(follower)
    wait_for(lambda: all_agree(cluster, ["n1", "n2", "n3", "n4"]), 60, "four members agreed")


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_learner_that_never_catches_up_changes_nothing(cluster: LocalCluster) -> None:
    """An add whose node never starts ends its learner stage at the deadline with
    ``added: false``, and the member set and change slot are as before."""
    leader = cluster.wait_for_leader()
    ghost = cluster.new_node("n5")
    result = add(cluster, ghost, catch_up=3.0)
    assert result["added"] is False and result["caught_up"] is False
    assert result["learner"]["match_index"] is None
    assert result["members"] == ["n1", "n2", "n3"]
    assert members(cluster) == ["n1", "n2", "n3"]
    assert _pending(leader["client"]) is None
    # The CLI exits 1 (nothing changed), and replace keeps the member it would remove.
    flags = ("--raft", ghost.raft, "--client", ghost.client, "--catch-up", "2s")
    added = _cli(cluster, "add", "n5", *flags)
    assert added.returncode == 1, added.stdout + added.stderr
    answer = json.loads(added.stdout)
    assert answer["ok"] is False and answer["added"] is False
    follower = next(n.id for n in cluster.nodes if n.client != leader["client"])
    replaced = _cli(cluster, "replace", follower, "n5", *flags)
    assert replaced.returncode == 1 and "not removing" in replaced.stderr, replaced.stderr
    assert members(cluster) == ["n1", "n2", "n3"]
    assert _pending(leader["client"]) is None
    cluster.forget_node("n5")
    with cluster.client() as c:
        c.acquire("still/writes", owner="w", ttl=30.0)
