"""``GroupSendSyncObj`` (replication/group_send.py): the commands one tick appends go
to each follower in one ``append_entries``, not one message per command; the commit
index is not broadcast on its own; and every entry still arrives, in order, on every
node.

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_group_send.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.syncobj import monotonicTime
from pysyncobj.transport import TCPTransport

from raftlease.replication.group_send import GroupSendSyncObj
from raftlease.testing import free_port_block
from tests.unit.test_group_send import Log

pytestmark = pytest.mark.timeout(60)

COMMANDS = 12


class CountingTransport(TCPTransport):  # type: ignore[misc]
    """Counts the ``append_entries`` messages carrying entries, per destination."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.appends: list[tuple[str, int]] = []

    def send(self, node: Any, message: Any) -> bool:
        if isinstance(message, dict) and message.get("type") == "append_entries":
            entries = message.get("entries") or []
            if entries:
                self.appends.append((str(node.address), len(entries)))
        result: bool = super().send(node, message)
        return result


def tick_all(nodes: list[Any], until: Any, what: str, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not until():
        assert time.monotonic() < deadline, f"not reached within {limit} s: {what}"
        for node in nodes:
            node.doTick(0.002)


@pytest.fixture(params=[GroupSendSyncObj, SyncObj], ids=["grouped", "pysyncobj"])
def cluster(request: pytest.FixtureRequest) -> Iterator[tuple[list[Any], list[Log]]]:
    base = free_port_block(3)
    addrs = [f"127.0.0.1:{base + i}" for i in range(3)]
    logs = [Log() for _ in addrs]
    nodes = []
    for i, addr in enumerate(addrs):
        conf = SyncObjConf(
            autoTick=False,
            appendEntriesUseBatch=False,  # what syncobj_conf sets (trap 8)
            raftMinTimeout=0.4,
            raftMaxTimeout=0.8,
            connectionRetryTime=0.2,
            bindAddress=addr,
            commandsWaitLeader=False,
        )
        others = [a for a in addrs if a != addr]
        nodes.append(
            request.param(addr, others, conf, consumers=[logs[i]], transportClass=CountingTransport)
        )
    try:
        yield nodes, logs
    finally:
        for node in nodes:
            node.destroy()


def test_one_tick_sends_one_append_per_follower(cluster: tuple[list[Any], list[Log]]) -> None:
    nodes, logs = cluster

    def leader() -> Any:
        found = [n for n in nodes if n._isLeader()]
        return found[0] if found else None

    tick_all(nodes, lambda: leader() is not None and all(n.isReady() for n in nodes), "a leader")
    chief = leader()
    # Settle: the leader's no-op is on every node and nothing is in flight.
    tick_all(nodes, lambda: len({n.raftLastApplied for n in nodes}) == 1, "all applied")
    transport = chief._SyncObj__transport
    transport.appends.clear()
    index = chief._SyncObj__getCurrentLogIndex()
    owner = logs[nodes.index(chief)]
    for i in range(COMMANDS):
        owner.add(i, callback=lambda result, error: None)
    chief.doTick(0.0)  # appends all twelve in one _checkCommandsToApply
    assert chief._SyncObj__getCurrentLogIndex() == index + COMMANDS
    sent = list(transport.appends)
    followers = {str(n.selfNode.address) for n in nodes if n is not chief}
    if isinstance(chief, GroupSendSyncObj):
        assert sorted(sent) == sorted((f, COMMANDS) for f in followers), sent
    else:  # PySyncObj alone: one message per command per follower
        assert len(sent) == COMMANDS * len(followers), sent
    assert not chief._SyncObj__conf.appendEntriesUseBatch  # restored after the tick

    # The commit: PySyncObj tells the followers at once (an append_entries of no
    # entries right after the leader applies); ours leaves it to the next append or
    # heartbeat. Count the leader's sends that were neither (no heartbeat due).
    broadcasts = []
    send_all = chief._SyncObj__sendAppendEntries

    def counting_send_all() -> None:
        if monotonicTime() <= chief._SyncObj__newAppendEntriesTime:
            broadcasts.append(chief.raftCommitIndex)
        send_all()

    chief._SyncObj__sendAppendEntries = counting_send_all
    tick_all(nodes, lambda: chief.raftLastApplied >= index + COMMANDS, "the leader applied")
    if isinstance(chief, GroupSendSyncObj):
        assert broadcasts == []
    else:
        assert broadcasts, "PySyncObj broadcast the commit index"
    tick_all(nodes, lambda: all(len(log.items) == COMMANDS for log in logs), "all applied")
    assert all(log.items == list(range(COMMANDS)) for log in logs)
