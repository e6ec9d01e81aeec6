"""A follower whose last journal record tore in a power loss (its first and last pages
reached the disk, a page between them did not: a record over several pages, power
lost after the write and before the sync, so never acknowledged) finds it at start by
the command's seal (replication/journal.py, "Sealed commands") and takes the leader's
entry instead. Framing alone would keep it: the leader's entry at that index has the
same term, so Raft's log matching tells the follower it already holds it, and the
follower would apply bytes no other node applied."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest
from pysyncobj.journal import LAST_RECORD_OFFSET_OFFSET, FileJournal

from raftlease.client import Client
from raftlease.replication.backup import read_journal
from raftlease.testing import LocalCluster
from raftlease.testing.cluster import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

Factory = Callable[..., LocalCluster]
Record = tuple[bytes, int, int]
PAGE = 4096


def _tear_in(journal_path: Any, whole: list[Record], torn: Record) -> None:
    """Append ``whole`` and then ``torn`` to a stopped node's journal, with a page in
    the middle of ``torn`` zeroed and the header counting it: what a power loss leaves
    when the header's page and the record's first and last pages were written back
    and one between them was not."""
    command = torn[0]
    j = FileJournal(str(journal_path))
    for record in [*whole, torn]:
        j.add(*record)
    j._destroy()
    data = bytearray(journal_path.read_bytes())
    (end,) = struct.unpack_from("<I", data, LAST_RECORD_OFFSET_OFFSET)
    start = end - (4 + 16 + len(command) + 4)
    hole = -(-(start + 1) // PAGE) * PAGE  # the first page wholly inside the record
    assert hole + PAGE <= end - 4, "the record must hold a whole page"
    data[hole : hole + PAGE] = bytes(PAGE)
    journal_path.write_bytes(bytes(data))


def test_a_follower_refetches_a_record_a_power_loss_tore(cluster_factory: Factory) -> None:
    # Keys and owners at the state machine's caps: one acquire is a record of over
    # two pages, however the leader batches (a batch's size depends on timing).
    cluster = cluster_factory(3, max_key_bytes=4096, max_owner_bytes=4096)
    leader = cluster.leader_id()
    follower = next(n.id for n in cluster.nodes if n.id != leader)
    with cluster.client() as client:
        client.acquire("before", owner="torn", ttl=600)
    cluster.stop_node(follower)

    # The entry the follower will hold torn.
    keys = ["torn/" + "k" * 4000]
    with cluster.client() as client:
        client.acquire(keys[0], owner="torn" + "o" * 4000, ttl=600)
    records = read_journal(cluster.node_dir(leader) / "raft.journal")
    command, index, term = max(records, key=lambda r: len(r[0]))
    assert len(command) > 2 * PAGE
    ours = read_journal(cluster.node_dir(follower) / "raft.journal")
    # The follower wrote the leader's entries after its own up to the big one, and
    # the big one tore.
    between = [r for r in records if ours[-1][1] < r[1] < index]
    _tear_in(cluster.node_dir(follower) / "raft.journal", between, (command, index, term))

    cluster.start_node(follower)
    endpoint = cluster.node(follower).client
    leader_endpoint = cluster.node(leader).client
    with cluster.client() as client:
        # Caught up: the follower applied everything the leader had committed.
        want = client.node_status(leader_endpoint)

        def caught_up() -> dict[str, Any] | None:
            status = client.node_status(endpoint)
            return status if status["applied_index"] >= want["commit_index"] else None

        mine = wait_for(caught_up, 60, "the follower to catch up")
        theirs = client.node_status(leader_endpoint)
        assert (mine["revision"], mine["leases"]) == (theirs["revision"], theirs["leases"])
    with Client([endpoint]) as mine_only:
        for key in keys:
            read = mine_only.read(key, consistency="stale")
            assert read.served_by == follower
            assert read.holder is not None and read.holder.owner.startswith("torn"), key
    log = cluster.log_path(follower).read_text()
    assert "torn record" in log
