"""Guards on PySyncObj's membership changes as raftlease relies on them
(docs/pysyncobj.md, "Membership changes"), and on what we correct at our seam
(replication/membership.py): one change at a time, the lease re-counted over the new
majority, members that carry their client address, the member list on disk."""

from __future__ import annotations

import inspect
import pickle
import time
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.node import TCPNode

from raftlease.clock import AdjustableClock, SystemClock
from raftlease.config import NodeAddress
from raftlease.errors import ConfigError, UnavailableError
from raftlease.replication import LeaseGuard, LeaseTransport
from raftlease.replication.leadership import LEASE_MARGIN
from raftlease.replication.membership import (
    Change,
    DialNode,
    Membership,
    dialled,
    member_node,
    membership_entries,
    node_address,
    read_members_file,
    write_members_file,
)
from raftlease.replication.replica import _StoreConsumer
from raftlease.testing.cluster import free_port_block

pytestmark = pytest.mark.timeout(60)

A = NodeAddress("a", "127.0.0.1:7101", "127.0.0.1:7001")
B = NodeAddress("b", "127.0.0.1:7102", "127.0.0.1:7002")
C = NodeAddress("c", "127.0.0.1:7103", "127.0.0.1:7003")


def test_membership_code_we_rely_on_and_correct_is_unchanged() -> None:
    source = inspect.getsource(SyncObj)
    for fragment in (
        # A change takes effect when the leader appends it (not at commit) ...
        "if changeClusterRequest is None or self.__changeCluster(changeClusterRequest):",
        # ... and when a follower appends it; a truncation reverses it.
        "self.__doChangeCluster(clusterChangeRequest, reverse=True)",
        # A new leader refuses changes until its no-op entry is applied (REQUEST_DENIED).
        "if self.__raftLastApplied < self.__noopIDx:",
        # A replayed add of the node itself is a no-op (compared with ==, PySyncObj #131).
        "if newNode == self.__selfNode or newNode in self.__otherNodes:",
        # A node never removes itself: a leader cannot remove itself.
        "if oldNode == self.__selfNode:\n                return False",
        # Every change of the peer set reaches the transport (our lease recount, the
        # peer check that accepts or refuses a member).
        "self.__transport.addNode(newNode)",
        "self.__transport.dropNode(oldNode)",
        # A snapshot carries the member set and installs it.
        "cluster = self.__otherNodes | {self.__selfNode}",
        "self.__updateClusterConfiguration([node for node in data[3] if node != self.__selfNode])",
        # The entry: type byte MEMBERSHIP then a pickled [kind, id, node].
        "pickle.dumps(['add', node.id, node]), callback, _COMMAND_TYPE.MEMBERSHIP",
        "pickle.dumps(['rem', node.id, node]), callback, _COMMAND_TYPE.MEMBERSHIP",
        # The match index the leader keeps per peer (a new member's catch-up).
        "self.__raftMatchIndex[newNode] = 0",
    ):
        assert fragment in source, f"pysyncobj changed: {fragment!r}"
    # The bug we correct (Membership.begin): the "previous change not committed"
    # guard is only ever reset, never set, so PySyncObj accepts a second change at once.
    assignments = [
        line.strip() for line in source.splitlines() if "self.__changeClusterIDx =" in line
    ]
    assert assignments and all(a == "self.__changeClusterIDx = None" for a in assignments)


class _Transport(LeaseTransport):
    guard = LeaseGuard(SystemClock(), cluster_size=1, promise=0.4, rho=0.01)
    durability = "none"
    plain_peers = True  # no peer ever connects to these in-process nodes


@pytest.fixture
def lone_leader(tmp_path: Path) -> Any:
    """A one-node PySyncObj cluster on our transport, ticked by hand, as leader."""
    addr = f"127.0.0.1:{free_port_block(1)}"
    conf = SyncObjConf(
        autoTick=False,
        appendEntriesUseBatch=False,
        bindAddress=addr,
        dynamicMembershipChange=True,
        connectionRetryTime=1000.0,  # never dial the (absent) new members
        appendEntriesPeriod=0.01,
        raftMinTimeout=0.05,
        raftMaxTimeout=0.1,
        journalFile=str(tmp_path / "raft.journal"),
        fullDumpFile=str(tmp_path / "raft.dump"),
        useFork=False,
    )
    guard = LeaseGuard(SystemClock(), cluster_size=1, promise=0.4, rho=0.01)
    transport = type("T", (_Transport,), {"guard": guard})
    sync = SyncObj(addr, [], conf, consumers=[_StoreConsumer(None)], transportClass=transport)
    deadline = time.monotonic() + 20
    while not (sync._isLeader() and sync.raftLastApplied >= sync.raftCommitIndex >= 2):
        assert time.monotonic() < deadline, "the lone node never led"
        sync.doTick(0.01)
    try:
        yield sync, guard
    finally:
        sync.destroy()
        sync.doTick(0.0)


def test_pysyncobj_takes_a_second_change_at_once_and_applies_changes_at_append(
    lone_leader: Any,
) -> None:
    sync, guard = lone_leader
    results: list[Any] = []
    sync.addNodeToCluster(member_node(B), callback=lambda r, e: results.append(e))
    sync.addNodeToCluster(member_node(C), callback=lambda r, e: results.append(e))
    for _ in range(5):
        sync.doTick(0.01)
    # Both appended (neither refused): PySyncObj does not serialise changes.
    assert {n.id for n in sync.otherNodes} == {B.raft, C.raft}
    # In effect before commit: the majority is now 2 of 3, and the absent new members
    # cannot commit anything, so no callback has come.
    assert results == []
    assert sync.raftCommitIndex < sync._SyncObj__raftLog[-1][1]
    # The transport saw each change: the lease guard counts 3 members now.
    assert guard.cluster_size == 3
    # What our one-change-at-a-time check reads: two uncommitted membership entries.
    log_ = sync._SyncObj__raftLog
    tail = [log_[i] for i in range(len(log_)) if log_[i][1] > sync.raftCommitIndex]
    assert membership_entries(tail) == [("add", B.raft), ("add", C.raft)]
    # The nodes in the entries carry the member's id and client address.
    nodes = {n.id: node_address(n, {}) for n in sync.otherNodes}
    assert nodes[B.raft] == B and nodes[C.raft] == C


def test_our_check_refuses_a_second_change_and_a_stale_uncommitted_one() -> None:
    membership = Membership(A, [A, B], Path("/nonexistent/members.json"))
    first = Change("add", C, term=3)
    membership.begin(first, [])
    with pytest.raises(UnavailableError, match="one change at a time") as info:
        membership.begin(Change("remove", B, term=3), [])
    assert info.value.definite and info.value.detail == {"pending": {"kind": "add", "member": "c"}}
    membership.finish(first)
    # An uncommitted change in the leader's log (a previous leader's) also blocks.
    entry = (b"\x02" + pickle.dumps(["rem", B.raft, member_node(B)]), 9, 3)
    with pytest.raises(UnavailableError, match="uncommitted membership change"):
        membership.begin(Change("add", C, term=4), [(b"\x00regular", 8, 3), entry])
    membership.begin(Change("add", C, term=4), [(b"\x00regular", 8, 3)])


def test_members_carry_their_addresses_and_are_dialled_at_our_own_address() -> None:
    node = member_node(B, DialNode, dial="127.0.0.1:9999")
    copy = pickle.loads(pickle.dumps(node))  # as in a change entry or a snapshot
    assert copy == TCPNode(B.raft) and node_address(copy, {}) == B
    assert copy.dial_target == "127.0.0.1:9999"
    # Another member's dial address (from its snapshot) is never used here.
    mine = dialled(copy, {})
    assert mine.dial_target == B.raft and node_address(mine, {}) == B
    assert dialled(copy, {B.raft: "127.0.0.1:8888"}).port == 8888
    # A plain PySyncObj node: what this node knew of it, else the address alone.
    assert node_address(TCPNode(C.raft), {C.raft: C}) == C
    assert node_address(TCPNode(C.raft), {}) == NodeAddress(C.raft, C.raft, "")


def test_member_list_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "members.json"
    assert read_members_file(path) is None
    membership = Membership(A, [A, B, C], path)
    assert membership.refresh([member_node(B), member_node(C)], 5) is False
    assert read_members_file(path) == (A, B, C)  # written once at start
    assert membership.refresh([member_node(B)], 9) is True
    assert read_members_file(path) == (A, B) and membership.members() == (A, B)
    assert membership.client_for_raft(B.raft) == B.client
    assert membership.client_for_raft(C.raft) == C.client  # a former member, still known
    for bad in ("", "{}", '{"members": []}', '{"members": [{"id": "x"}]}', "[1]"):
        path.write_text(bad)
        with pytest.raises(ConfigError):
            read_members_file(path)
    write_members_file(path, [A], 1)
    assert read_members_file(path) == (A,)


def test_a_change_drops_the_leader_lease_until_a_new_majority_echoes() -> None:
    clock = AdjustableClock()
    guard = LeaseGuard(clock, cluster_size=3, promise=0.4, rho=0.01)
    sent = guard.stamp_outgoing(term=2)
    guard.on_reply("b", 2, sent, None)
    assert guard.lease_valid(2)  # 2 of 3
    # Add a fourth member: the lease is gone at once, even though a majority of the
    # old set had echoed.
    guard.reconfigure(4)
    assert not guard.lease_valid(2) and guard.cluster_size == 4
    # Echoes of stamps sent before the change never count again.
    guard.on_reply("c", 2, sent, None)
    assert not guard.lease_valid(2)
    # After the change: one echo is not a majority of 4 (needs 2 besides the leader).
    after = guard.stamp_outgoing(term=2)
    guard.on_reply("b", 2, after, None)
    assert not guard.lease_valid(2)
    guard.on_reply("d", 2, after, None)
    assert guard.lease_valid(2)
    assert guard.lease_until == pytest.approx(after + 0.4 * (1 - 0.01) - LEASE_MARGIN)
    # A follower keeps its vote promise through a change (it is its own clock's).
    follower = LeaseGuard(clock, cluster_size=3, promise=0.4, rho=0.01)
    follower.on_append_entries("a", 2, 2, clock.monotonic())
    follower.reconfigure(2)
    assert follower.refuse_vote()


def test_a_follower_replaying_an_old_removal_of_its_leader_keeps_it(tmp_path: Path) -> None:
    """A fresh member replays the log: ``rem L``, later ``add L`` (a host replaced under
    the same address), with ``L`` its leader now. PySyncObj would drop ``L``'s
    connection at the removal and refuse it ever after (our peer check too), so the
    follower could never read the entry that adds ``L`` back (seen in the chaos suite:
    a replacement stuck at that index). LeaseTransport keeps the leader's connection
    until it stops leading us."""
    base = free_port_block(3)
    addr = f"127.0.0.1:{base}"
    peers = [
        NodeAddress("p1", f"127.0.0.1:{base + 1}", "127.0.0.1:1"),
        NodeAddress("p2", f"127.0.0.1:{base + 2}", "127.0.0.1:2"),
    ]
    conf = SyncObjConf(
        autoTick=False,
        appendEntriesUseBatch=False,
        bindAddress=addr,
        dynamicMembershipChange=True,
        connectionRetryTime=1000.0,
        journalFile=str(tmp_path / "raft.journal"),
        fullDumpFile=str(tmp_path / "raft.dump"),
        useFork=False,
    )
    guard = LeaseGuard(SystemClock(), cluster_size=3, promise=0.4, rho=0.01)
    transport_class = type("T", (_Transport,), {"guard": guard})
    sync = SyncObj(
        addr,
        [member_node(p) for p in peers],
        conf,
        consumers=[_StoreConsumer(None)],
        transportClass=transport_class,
    )
    transport = sync._SyncObj__transport
    p1 = transport._nodeAddrToNode[peers[0].raft]
    try:
        rem = (b"\x02" + pickle.dumps(["rem", p1.id, member_node(peers[0])]), 2, 1)
        add = (b"\x02" + pickle.dumps(["add", p1.id, member_node(peers[0])]), 3, 1)

        def append(entries: list[Any], prev: int) -> None:
            message = {
                "type": "append_entries",
                "term": 1,
                "commit_index": 1,
                "entries": entries,
                "prevLogIdx": prev,
                "prevLogTerm": 0 if prev == 1 else 1,
            }
            transport._onMessageReceived(p1, message)
            sync.doTick(0.0)

        append([rem], 1)
        assert p1 not in sync.otherNodes  # PySyncObj applied the removal at append
        assert peers[0].raft in transport._nodeAddrToNode  # we still take its frames
        assert guard.cluster_size == 2
        append([add], 2)
        assert p1 in sync.otherNodes and not transport._kept and guard.cluster_size == 3
        # A real removal (the leader is someone else) still drops the node.
        append([(b"\x02" + pickle.dumps(["rem", p1.id, member_node(peers[0])]), 4, 1)], 3)
        assert peers[0].raft in transport._nodeAddrToNode and transport._kept
        sync._SyncObj__raftLeader = transport._nodeAddrToNode[peers[1].raft]
        transport._settle_kept()
        assert peers[0].raft not in transport._nodeAddrToNode and not transport._kept
    finally:
        sync.destroy()
        sync.doTick(0.0)


# ----------------------------------------------------------- rolling upgrades


def _halting_consumer() -> tuple[_StoreConsumer, list[int]]:
    consumer = _StoreConsumer(None)
    halts: list[int] = []

    def halt(status: int) -> None:
        halts.append(status)

    consumer.halt = halt  # type: ignore[method-assign]
    return consumer, halts


def test_an_entry_of_a_newer_format_stops_the_node_before_it_applies() -> None:
    import msgpack

    from raftlease.core.snapshot import ENTRY_FORMAT
    from raftlease.replication.replica import ENTRY_FORMAT_TOO_NEW

    consumer, halts = _halting_consumer()
    acquire = {
        "op": "acquire",
        "key": "k",
        "owner": "o",
        "ttl": 5000,
        "lid": "l1",
        "now": 1,
        "term": 1,
        "cid": "c",
        "seq": 1,
        "ack": 1,
    }
    # No "fv" (every entry written so far) and fv 1 apply as before.
    assert consumer.apply_entry(msgpack.packb(acquire), _doApply=True)["ok"] is True
    again = {**acquire, "key": "k2", "lid": "l2", "seq": 2, "fv": ENTRY_FORMAT}
    assert consumer.apply_entry(msgpack.packb(again), _doApply=True)["ok"] is True
    before = consumer.store.to_plain()
    for fv in (ENTRY_FORMAT + 1, "2", 0, True):
        newer = {**acquire, "key": "k3", "lid": "l3", "seq": 3, "fv": fv}
        result = consumer.apply_entry(msgpack.packb(newer), _doApply=True)
        assert result["ok"] is False and halts[-1] == ENTRY_FORMAT_TOO_NEW
        assert consumer.store.to_plain() == before  # nothing applied
    assert len(halts) == 4


def test_a_snapshot_of_a_newer_layout_stops_the_node_with_a_clear_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import msgpack

    from raftlease.core.snapshot import SNAPSHOT_VERSION
    from raftlease.replication.replica import SNAPSHOT_LOAD_FAILED

    consumer, halts = _halting_consumer()
    plain = consumer.store.to_plain()
    newer = msgpack.packb({**plain, "v": SNAPSHOT_VERSION + 1}, use_bin_type=True)
    consumer._deserialize(newer)
    assert halts == [SNAPSHOT_LOAD_FAILED]
    assert f"snapshot version {SNAPSHOT_VERSION + 1} is newer" in caplog.text
    assert "upgrade" in caplog.text
    # The layout this build writes still loads.
    consumer._deserialize(msgpack.packb(plain, use_bin_type=True))
    assert halts == [SNAPSHOT_LOAD_FAILED]


# ------------------------------------------------------------ the wire operations


def test_member_operations_validate_every_field() -> None:
    import math

    from raftlease.errors import BadRequestError, InvalidArgumentError
    from raftlease.protocol import Limits, parse_request

    limits = Limits()
    good = {"id": 1, "op": "member_add", "member_id": "n4", "raft": B.raft, "client": B.client}
    request = parse_request(good, limits)
    assert request.args == {
        "member_id": "n4",
        "raft": B.raft,
        "client": B.client,
        "timeout": 30.0,
    }
    assert parse_request({**good, "timeout": 2.5}, limits).args["timeout"] == 2.5
    remove = parse_request({"id": 2, "op": "member_remove", "member_id": B.raft}, limits)
    assert remove.args == {"member_id": B.raft}
    assert parse_request({"id": 3, "op": "member_list"}, limits).args == {}
    bad: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"member_id": None}, BadRequestError),
        ({"member_id": 4}, BadRequestError),
        ({"member_id": ""}, InvalidArgumentError),
        ({"member_id": "x" * 65}, InvalidArgumentError),
        ({"member_id": "n 4"}, InvalidArgumentError),
        ({"member_id": "n4\x1b[2J"}, InvalidArgumentError),
        ({"raft": "127.0.0.1"}, InvalidArgumentError),
        ({"raft": ":7100"}, InvalidArgumentError),
        ({"raft": "h:0"}, InvalidArgumentError),
        ({"raft": "h:70000"}, InvalidArgumentError),
        ({"raft": "h:-1"}, InvalidArgumentError),
        ({"client": ["h", 1]}, BadRequestError),
        ({"client": B.raft}, InvalidArgumentError),  # the same address twice
        ({"timeout": True}, BadRequestError),
        ({"timeout": "5"}, BadRequestError),
        ({"timeout": -1}, InvalidArgumentError),
        ({"timeout": math.nan}, InvalidArgumentError),
        ({"timeout": 601}, InvalidArgumentError),
        # The peer key of the handshake that mutual TLS replaced: refused, not ignored.
        ({"peer_key": "ab" * 32}, InvalidArgumentError),
    ]
    for change, exc in bad:
        with pytest.raises(exc):
            parse_request({**good, **change}, limits)
    missing = {k: v for k, v in good.items() if k != "client"}
    with pytest.raises(BadRequestError, match="client"):
        parse_request(missing, limits)
