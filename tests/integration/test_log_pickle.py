"""Peer messages are pickled with protocol 4 (replication/peers.py, ``PICKLE_PROTOCOL``)
and log commands are sealed protocol-5 pickles (replication/journal.py, "Sealed
commands"), not PySyncObj's protocol 2, which stores bytes as latin-1 text (every byte
>= 0x80 takes two). A node still loads a journal written by earlier versions
(protocol-2 and unsealed protocol-4 commands), and one holding every kind.

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_log_pickle.py.
"""

from __future__ import annotations

import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest
from pysyncobj.journal import FileJournal

from raftlease.replication.backup import entry_bytes, read_journal
from raftlease.replication.durable import DURABLE_MARK
from raftlease.replication.journal import COMMAND_SEAL, SEALED_PROTOCOL, command_intact
from raftlease.testing import LocalCluster

pytestmark = pytest.mark.timeout(120)

Factory = Callable[..., LocalCluster]
REGULAR = 0  # PySyncObj's _COMMAND_TYPE.REGULAR


def _protocols(journal: Path) -> list[int]:
    """The pickle protocol of every regular command in ``journal``, in log order."""
    out = []
    for command, _index, _term in read_journal(journal):
        if command[0] == REGULAR:
            assert command[1] == 0x80, "a regular command is not a pickle"
            out.append(command[2])
    return out


def _rewrite_unsealed(journal: Path, protocol: int) -> int:
    """Re-pickle every regular command of a stopped node's journal with ``protocol``
    and no seal, as earlier raftlease versions wrote them (2, then 4): returns how
    many were rewritten."""
    records = read_journal(journal)
    fresh = journal.with_name("rewritten.journal")
    j = FileJournal(str(fresh))
    rewritten = 0
    for command, index, term in records:
        if command[0] == REGULAR:
            command = bytes([REGULAR]) + pickle.dumps(pickle.loads(command[1:]), protocol)
            rewritten += 1
        j.add(command, index, term)
    j.flush()
    j._destroy()
    shutil.move(str(fresh), str(journal))  # the node's own .meta file is kept
    Path(str(fresh) + ".meta").unlink(missing_ok=True)
    return rewritten


@pytest.mark.integration
def test_log_commands_hold_the_entry_verbatim_and_old_journals_still_load(
    cluster_factory: Factory,
) -> None:
    cluster = cluster_factory(1)
    journal = cluster.node_dir("n1") / "raft.journal"
    with cluster.client() as client:
        tokens = {k: client.acquire(k, owner=f"o-{k}", ttl=600).token for k in ("a", "b", "c")}
    cluster.stop_node("n1")

    # Written by this version: sealed protocol-5 pickles, the msgpack entry verbatim
    # in the command (so DURABLE_MARK, searched for in the command bytes, is found
    # as it is).
    assert set(_protocols(journal)) == {SEALED_PROTOCOL}
    marked = 0
    for command, _index, _term in read_journal(journal):
        entry = entry_bytes(command)
        if entry is not None:
            assert entry in command
            assert command[-8:-4] == COMMAND_SEAL and command_intact(command)
            marked += DURABLE_MARK in command
            assert msgpack.unpackb(entry)  # a whole entry
    assert marked >= 1  # the term's first entry moves the token ceiling

    # As the version before wrote it: unsealed protocol 4; it loads and grows.
    assert _rewrite_unsealed(journal, 4) >= 3
    assert set(_protocols(journal)) == {4}
    cluster.start_node("n1")
    cluster.wait_for_leader()
    with cluster.client() as client:
        tokens["c2"] = client.acquire("c2", owner="o-c2", ttl=600).token
    cluster.stop_node("n1")

    # As earlier versions wrote it: every regular command in protocol 2.
    assert _rewrite_unsealed(journal, 2) >= 4
    assert set(_protocols(journal)) == {2}
    cluster.start_node("n1")
    cluster.wait_for_leader()
    with cluster.client() as client:
        for key, token in tokens.items():
            holder = client.holder(key)
            assert holder is not None and holder.owner == f"o-{key}" and holder.token == token
        tokens["d"] = client.acquire("d", owner="o-d", ttl=600).token
    assert tokens["d"] > max(v for k, v in tokens.items() if k != "d")
    cluster.stop_node("n1")

    # Both kinds in one journal, and it loads again.
    kinds = _protocols(journal)
    assert kinds[0] == 2 and kinds[-1] == SEALED_PROTOCOL
    cluster.start_node("n1")
    cluster.wait_for_leader()
    with cluster.client() as client:
        for key, token in tokens.items():
            holder = client.holder(key)
            assert holder is not None and holder.token == token
