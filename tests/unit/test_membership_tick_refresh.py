"""``Membership.refresh`` runs on every tick of PySyncObj's thread (Replica._on_tick).
It used to rebuild the member set from the node objects each time (3-5 % of the
GIL-held samples of every node under a 1-thread acquire load, scripts/profile_acquire);
now a tick with the same node objects as the last one skips that. These tests check
that the shortcut never hides a change: over seeded random sequences of node sets
(the same objects, copies, new objects for the same address with another id, adds
and removals) it returns and keeps exactly what the full rebuild does."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.node import TCPNode

from raftlease.config import NodeAddress
from raftlease.replication import membership as membership_module
from raftlease.replication.membership import Membership, member_node

ME = NodeAddress("n1", "127.0.0.1:20001", "127.0.0.1:21001")
PEERS = [NodeAddress(f"n{i}", f"127.0.0.1:2000{i}", f"127.0.0.1:2100{i}") for i in range(2, 7)]


def full_rebuild(nodes: list[Any], known: dict[str, NodeAddress]) -> tuple[NodeAddress, ...]:
    """What refresh computes without the shortcut (its own code, with ``_known``)."""
    members = [membership_module.node_address(n, known) for n in nodes]
    return tuple(sorted({m.raft: m for m in (*members, ME)}.values(), key=lambda m: m.id))


@pytest.mark.timeout(60)
def test_a_tick_with_the_same_node_objects_rebuilds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = Membership(ME, [ME, *PEERS[:2]], tmp_path / "members.json")
    nodes = {member_node(p) for p in PEERS[:2]}
    assert m.refresh(set(nodes), 1) is False  # the configured set; saved once
    assert (tmp_path / "members.json").exists()
    calls = []
    real = membership_module.node_address
    monkeypatch.setattr(
        membership_module, "node_address", lambda n, k: calls.append(n) or real(n, k)
    )
    for _ in range(100):
        assert m.refresh(set(nodes), 1) is False  # PySyncObj hands a copy each tick
    assert calls == []
    # A new object for a known address (a host replaced under its address): rebuilt.
    replaced = member_node(NodeAddress("n9", PEERS[0].raft, "127.0.0.1:21009"))
    others = {n for n in nodes if str(n.id) != PEERS[0].raft}
    assert m.refresh({replaced, *others}, 2) is True
    assert [x.id for x in m.members()] == ["n1", "n3", "n9"]
    assert len(calls) == 2


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", range(5))
def test_refresh_keeps_what_the_full_rebuild_gives(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    m = Membership(ME, [ME, *PEERS[:2]], tmp_path / "members.json")
    pool = [member_node(p) for p in PEERS] + [TCPNode(p.raft) for p in PEERS]
    current = [pool[0], pool[1]]
    expected = m.members()
    for step in range(300):
        roll = rng.random()
        if roll < 0.5:
            pass  # the same objects again
        elif roll < 0.7:
            current = [rng.choice(pool), *current[1:]]  # maybe another object, same or not
        elif roll < 0.85 and len(current) < 4:
            current = [*current, rng.choice(pool)]
        elif len(current) > 1:
            current = current[:-1]
        # PySyncObj's set: one node per address (its Node compares by address).
        by_address = {str(n.id): n for n in current}
        nodes = list(by_address.values())
        rng.shuffle(nodes)
        wanted = full_rebuild(nodes, dict(m._known))
        changed = m.refresh(set(nodes), step)
        assert changed == (wanted != expected), f"seed {seed} step {step}"
        assert m.members() == wanted
        expected = wanted
