"""The replication seam, unit level.

* ``apply_command`` suppression (raftlease/replication/transport.py): PySyncObj
  forwards a proposal dequeued by a node that is not the leader to the leader it knows,
  as ``apply_command``. That entry was stamped with this node's (stale) log time and
  term, so ``LeaseTransport.send`` never forwards it and answers it at once with
  ``REQUEST_DENIED``, which ``Replica`` maps to a definite ``UnavailableError`` (the
  client retries at the leader). Driven on a real ``SyncObj`` with ``autoTick`` off,
  as tests/unit/test_follower_log.py does: nothing connects, every message to the wire is
  recorded.
* ``syncobj_conf`` (raftlease/replication/replica.py): each PySyncObj setting safety
  depends on, with why.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.node import TCPNode
from pysyncobj.transport import TCPTransport

from raftlease.clock import SystemClock
from raftlease.config import NodeConfig, local_cluster
from raftlease.errors import RaftLeaseError, UnavailableError
from raftlease.replication import LeaseGuard, LeaseTransport, replica, syncobj_conf
from raftlease.replication.replica import Replica, _StoreConsumer
from raftlease.testing import free_port_block
from raftlease.testing.certs import ClusterCerts

pytestmark = pytest.mark.timeout(30)


class _Wire(TCPTransport):  # type: ignore[misc]
    """PySyncObj's TCP transport, recording what reaches it to be sent. Below
    ``LeaseTransport`` in the MRO, so it sees exactly what our seam lets through."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.wire: list[dict[str, Any]] = []
        super().__init__(*args, **kwargs)

    def send(self, node: Any, message: Any) -> bool:
        if isinstance(message, dict):
            self.wire.append(dict(message))
        return bool(super().send(node, message))


class _Seam(LeaseTransport, _Wire):
    """MRO: _Seam -> LeaseTransport -> _Wire -> TCPTransport."""


class Follower:
    """A follower ``SyncObj`` with a ``Replica``'s store consumer, ticked by hand."""

    def __init__(self, data_dir: Path) -> None:
        base = free_port_block(3)
        self.addr = f"127.0.0.1:{base}"
        self.peers = [TCPNode(f"127.0.0.1:{base + 1}"), TCPNode(f"127.0.0.1:{base + 2}")]
        guard = LeaseGuard(SystemClock(), cluster_size=3, promise=0.4, rho=0.01)
        conf = SyncObjConf(
            autoTick=False,
            appendEntriesUseBatch=False,
            commandsWaitLeader=False,
            bindAddress=self.addr,
            dynamicMembershipChange=False,
            connectionRetryTime=1000.0,  # never dial the (absent) peers
            journalFile=str(data_dir / "raft.journal"),
            fullDumpFile=str(data_dir / "raft.dump"),
            useFork=False,
        )
        self.consumer = _StoreConsumer(None)
        self.sync = SyncObj(
            self.addr,
            [p.id for p in self.peers],
            conf,
            consumers=[self.consumer],
            transportClass=type(
                "T",
                (_Seam,),
                {"guard": guard, "peer_tls": ClusterCerts(data_dir / "certs").peer_tls("f")},
            ),
        )
        self.transport: _Seam = self.sync._SyncObj__transport

    def hear_leader(self, peer: int, term: int = 1) -> None:
        """A heartbeat of leader ``peer``: from then on this node knows that leader."""
        self.transport._onMessageReceived(
            self.peers[peer],
            {
                "type": "append_entries",
                "term": term,
                "commit_index": 1,
                "entries": [],
                "prevLogIdx": 1,
                "prevLogTerm": 0,
            },
        )
        self.sync.doTick(0.0)
        leader = self.sync._getLeader()
        assert leader is not None and leader.id == self.peers[peer].id
        assert not self.sync._isLeader()

    def close(self) -> None:
        self.sync.destroy()
        self.sync.doTick(0.0)


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[Follower]:
    f = Follower(tmp_path)
    try:
        yield f
    finally:
        f.close()


def _entry() -> bytes:
    packed: bytes = msgpack.packb(
        {
            "op": "acquire",
            "now": 10,
            "term": 1,
            "cid": "c",
            "seq": 1,
            "ack": 1,
            "key": "k",
            "owner": "o",
            "ttl": 1000,
            "lid": "lid-1",
        }
    )
    return packed


def _kinds(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m.get("type")) for m in messages]


# ------------------------------------------------------- apply_command suppression


def test_a_proposal_on_a_follower_is_denied_at_once_not_forwarded(follower: Follower) -> None:
    follower.hear_leader(0)
    before = len(follower.transport.wire)
    answers: list[tuple[Any, Any]] = []
    follower.consumer.apply_entry(_entry(), callback=lambda r, e: answers.append((r, e)))
    follower.sync.doTick(0.0)  # PySyncObj dequeues it and would forward it here
    assert "apply_command" not in _kinds(follower.transport.wire[before:]), "forwarded"
    # Answered in that very tick, through PySyncObj's own reply path.
    assert answers == [(None, FAIL_REASON.REQUEST_DENIED)]
    # And nothing was applied here.
    assert follower.sync.raftLastApplied <= 1
    assert follower.consumer.store.holder("k") is None


def test_replica_maps_the_refusal_to_a_definite_unavailable(follower: Follower) -> None:
    """Through ``Replica.propose`` (its one collaborator, the store consumer, is the
    follower's): the callback gets ``UnavailableError``, definite, so the server
    answers at once and the client retries at the leader without an unknown outcome."""
    follower.hear_leader(1)
    r = object.__new__(Replica)  # no SyncObj of its own: propose uses only the consumer
    r._consumer = follower.consumer
    answers: list[tuple[Any, RaftLeaseError | None]] = []
    r.propose(_entry(), lambda result, err: answers.append((result, err)))
    follower.sync.doTick(0.0)
    assert len(answers) == 1
    result, err = answers[0]
    assert result is None
    assert isinstance(err, UnavailableError) and err.definite, err
    assert "apply_command" not in _kinds(follower.transport.wire)


def test_send_refuses_apply_command_with_or_without_a_request_id(follower: Follower) -> None:
    follower.hear_leader(0)
    leader = follower.peers[0]
    # An unknown request id: PySyncObj's reply path finds no callback and does nothing.
    assert follower.transport.send(leader, {"type": "apply_command", "command": b"x"}) is False
    assert (
        follower.transport.send(
            leader, {"type": "apply_command", "command": b"x", "request_id": 999}
        )
        is False
    )
    assert "apply_command" not in _kinds(follower.transport.wire)
    # Control: the recorder does see what the seam lets through.
    follower.transport.send(leader, {"type": "status_probe", "term": 1})
    assert _kinds(follower.transport.wire)[-1] == "status_probe"


# ------------------------------------------------------------------ syncobj_conf


def _config(tmp_path: Path) -> NodeConfig:
    return NodeConfig.create(
        node_id="n2",
        nodes=local_cluster(3, client_port=7001),
        data_dir=tmp_path / "n2",
        # Not the defaults, so a setting taken from somewhere else shows.
        leader_fallback=2.5,
        heartbeat_interval=0.04,
        election_timeout_min=0.5,
        election_timeout_max=1.2,
        connection_retry=0.7,
        connection_timeout=4.0,
        compaction_min_entries=1234,
        compaction_min_time=45.0,
    )


def test_syncobj_conf_sets_what_safety_depends_on(tmp_path: Path) -> None:
    config = _config(tmp_path)
    conf = syncobj_conf(config)
    # A durable Raft log (term, vote, entries): without it a restarted node could vote
    # twice in a term or forget acknowledged grants.
    assert conf.journalFile == str(config.journal_file) == str(tmp_path / "n2" / "raft.journal")
    # Trap 2: a journal without a dump file comes back empty after log compaction.
    assert conf.fullDumpFile == str(config.dump_file) == str(tmp_path / "n2" / "raft.dump")
    # Trap 6: snapshots are pickled in a forked child, off the tick thread (a stalled
    # tick thread misses heartbeats; _PackedSnapshot packs in the child).
    assert conf.useFork is True
    # Trap 8: batching makes every write wait for the next heartbeat.
    assert conf.appendEntriesUseBatch is False
    # No leader known: fail at once with MISSING_LEADER (definite), rather than queue
    # a proposal stamped with this node's log time to be appended or forwarded later.
    assert conf.commandsWaitLeader is False
    # Listen on the raft address's host only: PySyncObj binds 0.0.0.0 otherwise, and
    # its peer protocol is unauthenticated pickle.
    assert conf.bindAddress == config.self_node.raft == "127.0.0.1:7102"
    # Trap 10: each node compacts in its own slot, so a crash of the whole cluster
    # cannot catch a majority inside a compaction (which can drop a journal's tail).
    assert conf.logCompactionSplit is True
    # Membership changes go through the log (replication/membership.py); the leader
    # lease is re-counted over the new majority at each one (LeaseGuard.reconfigure).
    assert conf.dynamicMembershipChange is True
    # A leader cut off from a majority steps down after leader_fallback (validated
    # against the election timeout), not after PySyncObj's default 30 s.
    assert conf.leaderFallbackTimeout == 2.5 != SyncObjConf().leaderFallbackTimeout
    # The timers come from the config too (configuration.md relates them).
    assert conf.appendEntriesPeriod == 0.04
    assert (conf.raftMinTimeout, conf.raftMaxTimeout) == (0.5, 1.2)
    assert conf.connectionRetryTime == 0.7 and conf.connectionTimeout == 4.0
    assert (conf.logCompactionMinEntries, conf.logCompactionMinTime) == (1234, 45.0)
    # The callbacks are the Replica's to set; syncobj_conf sets none.
    assert conf.onStateChanged is None


def test_syncobj_conf_passes_only_names_pysyncobj_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SyncObjConf`` reads its keyword arguments with ``kwargs.get`` and silently
    ignores any other: a misspelt setting would leave PySyncObj's default in force."""
    passed: dict[str, Any] = {}

    def recording(**kwargs: Any) -> SyncObjConf:
        passed.update(kwargs)
        return SyncObjConf(**kwargs)

    monkeypatch.setattr(replica, "SyncObjConf", recording)
    syncobj_conf(_config(tmp_path))
    known = set(vars(SyncObjConf()))
    assert passed, "syncobj_conf did not build its SyncObjConf through the module name"
    assert set(passed) <= known, sorted(set(passed) - known)


# ------------------------------------------------------------ listener recovery


def test_an_unbound_raft_listener_binds_again(follower: Follower) -> None:
    """PySyncObj unbinds its listener for good when accept fails (EMFILE when the
    process runs out of file descriptors): a restarted peer could never reconnect.
    Our transport binds it again on the next tick."""
    import socket

    from pysyncobj.tcp_server import SERVER_STATE

    follower.sync.doTick(0.0)
    server = follower.transport._server
    assert server._TcpServer__state == SERVER_STATE.BINDED
    server.unbind()  # what PySyncObj does after an accept error
    host, _, port = follower.addr.rpartition(":")
    with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=1):
        pass
    follower.sync.doTick(0.0)
    assert server._TcpServer__state == SERVER_STATE.BINDED
    with socket.create_connection((host, int(port)), timeout=2):
        pass


def test_strangers_cannot_hold_every_peer_slot(follower: Follower) -> None:
    """Connections that never name a member are capped, so they cannot use up the
    node's file descriptors (and each is dropped by the connection timeout)."""
    import socket

    from raftlease.replication.transport import MAX_UNIDENTIFIED_PEERS

    follower.sync.doTick(0.0)
    host, _, port = follower.addr.rpartition(":")
    socks = []
    try:
        for _ in range(MAX_UNIDENTIFIED_PEERS + 10):
            socks.append(socket.create_connection((host, int(port)), timeout=2))
            follower.sync.doTick(0.01)  # the listener accepts on the tick thread
            assert len(follower.transport._unknownConnections) <= MAX_UNIDENTIFIED_PEERS
        assert len(follower.transport._unknownConnections) == MAX_UNIDENTIFIED_PEERS
    finally:
        for sock in socks:
            sock.close()


def test_a_stranger_that_never_speaks_is_dropped_after_the_connection_timeout(
    follower: Follower,
) -> None:
    import socket
    import time

    follower.sync.doTick(0.0)
    host, _, port = follower.addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=2) as silent:
        follower.sync.doTick(0.01)
        assert len(follower.transport._unknownConnections) == 1
        timeout = follower.sync.conf.connectionTimeout
        deadline = time.monotonic() + timeout + 10
        while follower.transport._unknownConnections and time.monotonic() < deadline:
            follower.sync.doTick(0.05)
        assert not follower.transport._unknownConnections
        silent.settimeout(2)
        assert silent.recv(1) == b""  # closed by the node
