"""A member that was down while members were added learns the new member set from
the leader (issue 37, docs/membership.md "A member that missed a change"): the
cluster elects whenever a majority of the current configuration is up."""

from __future__ import annotations

import json

import pytest

from raftlease.config import NodeAddress
from raftlease.testing import LocalCluster
from raftlease.testing.cluster import port_free, wait_for
from tests.integration.test_cluster import raw_request
from tests.integration.test_membership import add, all_agree, members, new_node_that_dials

pytestmark = pytest.mark.integration

FIVE = ["n1", "n2", "n3", "n4", "n5"]


def new_node_below(cluster: LocalCluster, node_id: str, member: str) -> NodeAddress:
    """A node to add whose raft address is below ``member``'s (the same number of
    digits, so below as a string too, which is how PySyncObj compares them)."""
    ceiling = int(next(n for n in cluster.nodes if n.id == member).raft.rpartition(":")[2])
    digits = len(str(ceiling))
    taken = {int(n.raft.rpartition(":")[2]) for n in cluster.nodes}
    taken |= {int(n.client.rpartition(":")[2]) for n in cluster.nodes}
    base = next(
        p
        for p in range(ceiling - 101, 1024, -1)
        if len(str(p + 100)) == digits
        and not {p, p + 100} & taken
        and port_free(p)
        and port_free(p + 100)
    )
    return cluster.new_node(node_id, client_port=base)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["above", "below"])
def test_a_member_down_during_two_adds_learns_them_and_the_cluster_elects(
    cluster: LocalCluster, where: str
) -> None:
    original = cluster.nodes
    cluster.stop_node("n3")
    cluster.wait_for_leader(60)
    # above: n4 and n5 dial n3 (the greater address dials), which has never heard of
    # them. below: n3 should dial them and cannot know them; they dial it themselves
    # once it has been silent for a while (transport.py, _dial_silent_members).
    for node_id in ("n4", "n5"):
        if where == "above":
            new = new_node_that_dials(cluster, node_id)
        else:
            new = new_node_below(cluster, node_id, "n3")
        cluster.start_node(node_id)
        assert add(cluster, new)["caught_up"] is True
    wait_for(lambda: members(cluster) == FIVE, 30, "five members in the leader's log")
    saved = json.loads((cluster.node_dir("n3") / "members.json").read_text())
    assert [m["id"] for m in saved["members"]] == ["n1", "n2", "n3"]

    # n1 and n2 gone: n3, n4, n5 are three of the five members, a majority.
    cluster.kill_node("n1")
    cluster.kill_node("n2")
    # n3 comes back from its data directory (members.json: n1, n2, n3) and a config
    # file that was never edited either.
    current = cluster.nodes
    cluster.nodes = original
    cluster.start_node("n3")
    cluster.nodes = current
    leader = cluster.wait_for_leader(90)
    assert leader["node"] in ("n3", "n4", "n5")
    n3 = cluster.node("n3").client
    wait_for(lambda: members(cluster, n3) == FIVE, 60, "n3 with the five-member set")
    wait_for(
        lambda: (
            [
                m["id"]
                for m in json.loads((cluster.node_dir("n3") / "members.json").read_text())[
                    "members"
                ]
            ]
            == FIVE
        ),
        30,
        "n3's members.json with the five members",
    )

    # It accepted them on their certificates, before its log told it who they were.
    assert "member of a newer configuration" in cluster.log_path("n3").read_text(errors="replace")
    if where == "below":  # and it was they that dialled it
        dialled = [cluster.log_path(n).read_text(errors="replace") for n in ("n4", "n5")]
        assert any("has not connected for" in text for text in dialled)

    # n3 takes part: a write acknowledged with n1 and n2 down needs it (3 of 5) and
    # is on its applied state.
    with cluster.client() as c:
        grant = c.acquire("converge/after", owner="w", ttl=60.0)
    stale = {"id": 2, "op": "holder", "key": "converge/after", "consistency": "stale"}
    wait_for(
        lambda: (raw_request(n3, stale)["result"].get("holder") or {}).get("token") == grant.token,
        30,
        "the grant on n3's applied state",
    )

    # n1 and n2 come back: all five agree on the members and the leader.
    cluster.start_node("n1")
    cluster.start_node("n2")
    wait_for(lambda: all_agree(cluster, FIVE), 60, "five members agreed")
