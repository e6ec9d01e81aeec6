"""The follower side of AppendEntries, on a real PySyncObj ``SyncObj`` driven by hand.

PySyncObj 0.3.17's follower (a) deletes everything after ``prevLogIdx`` even when the
entries match, so a late or repeated message shortens an acknowledged log (bug B,
docs/pysyncobj.md trap 5), and (b) answers a message beyond its log "next = log end + 1"
even right after telling the leader its last entries conflict, so a pipelining leader
probes the same index forever (bug A, jepsen-style/README.md finding 1).
``LeaseTransport`` (raftlease/replication/transport.py, with ``plan_append_entries`` of
follower_log.py) corrects both
before PySyncObj sees the message. These tests feed one follower the messages a leader
would send (no peer is running: ``autoTick`` is off and nothing connects), read its log
and capture its replies. With ``RAFTLEASE_TEST_RAW_FOLLOWER=1`` they run against
PySyncObj's own handling: 9 of them fail (the others pin behaviour that must not
change, such as rejections and real conflicts).
"""

from __future__ import annotations

import gzip
import logging
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.node import TCPNode
from pysyncobj.transport import TCPTransport

from raftlease.clock import SystemClock
from raftlease.core import LeaseStore
from raftlease.replication import (
    AppendPlan,
    Conflict,
    LeaseGuard,
    LeaseTransport,
    plan_append_entries,
    snapshot_is_behind,
)
from raftlease.replication.replica import _PackedSnapshot, _StoreConsumer
from raftlease.testing import free_port_block

pytestmark = pytest.mark.timeout(30)

Entry = tuple[bytes, int, int]

#: Run the tests against PySyncObj's own follower handling (to see them fail).
RAW = os.environ.get("RAFTLEASE_TEST_RAW_FOLLOWER") == "1"


def entry(index: int, term: int) -> Entry:
    # Command type 1 is PySyncObj's NO_OP: applied without touching any consumer.
    return (b"\x01" + f"{index}/{term}".encode(), index, term)


#: A fresh PySyncObj log starts with its own NO_OP at index 1, term 0.
START: Entry = (b"\x01", 1, 0)


def run(first: int, last: int, term: int) -> list[Entry]:
    return [entry(i, term) for i in range(first, last + 1)]


class _Recording(LeaseTransport):
    """Our transport, recording every message PySyncObj sends (nothing is connected,
    so nothing leaves the process: no peer TLS is needed)."""

    plain_peers = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.sent: list[dict[str, Any]] = []
        super().__init__(*args, **kwargs)

    def send(self, node: Any, message: Any) -> bool:
        ok = bool(super().send(node, message))
        if isinstance(message, dict):
            self.sent.append(dict(message))
        return ok

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        if RAW:
            # PySyncObj's handling alone (our lease bookkeeping is irrelevant here).
            TCPTransport._onMessageReceived(self, node, message)
            return
        super()._onMessageReceived(node, message)


class Follower:
    def __init__(self, data_dir: Path) -> None:
        base = free_port_block(3)
        self.addr = f"127.0.0.1:{base}"
        self.peers = [TCPNode(f"127.0.0.1:{base + 1}"), TCPNode(f"127.0.0.1:{base + 2}")]
        guard = LeaseGuard(SystemClock(), cluster_size=3, promise=0.4, rho=0.01)
        transport = type("T", (_Recording,), {"guard": guard})
        conf = SyncObjConf(
            autoTick=False,
            appendEntriesUseBatch=False,
            bindAddress=self.addr,
            dynamicMembershipChange=False,
            connectionRetryTime=1000.0,  # never dial the (absent) peers
            journalFile=str(data_dir / "raft.journal"),
            fullDumpFile=str(data_dir / "raft.dump"),
            useFork=False,
        )
        self.sync = SyncObj(
            self.addr,
            [p.id for p in self.peers],
            conf,
            consumers=[_StoreConsumer(None)],
            transportClass=transport,
        )
        self.transport: _Recording = self.sync._SyncObj__transport

    def log(self) -> list[Entry]:
        journal = self.sync._SyncObj__raftLog
        return [tuple(journal[i]) for i in range(len(journal))]  # type: ignore[misc]

    def deliver(self, leader: int, message: dict[str, Any]) -> dict[str, Any]:
        """Hand one append_entries from peer ``leader`` to the follower; return its reply."""
        before = len(self.transport.sent)
        self.transport._onMessageReceived(self.peers[leader], dict(message))
        replies = [m for m in self.transport.sent[before:] if m["type"] == "next_node_idx"]
        assert len(replies) <= 1, self.transport.sent[before:]
        self.sync.doTick(0.0)  # apply what is committed
        return replies[0] if replies else {}

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


def ae(
    term: int, prev: int | None, prev_term: int | None, entries: list[Entry], commit: int
) -> dict[str, Any]:
    return {
        "type": "append_entries",
        "term": term,
        "commit_index": commit,
        "entries": entries,
        "prevLogIdx": prev,
        "prevLogTerm": prev_term,
    }


# ------------------------------------------------------------------ bug B: truncation


def test_stale_duplicate_does_not_shorten_an_acknowledged_log(
    follower: Follower, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="pysyncobj")
    first = ae(1, 1, 0, run(2, 4, 1), commit=1)
    assert follower.deliver(0, first)["success"]
    reply = follower.deliver(0, ae(1, 4, 1, run(5, 6, 1), commit=4))
    assert reply["success"] and reply["next_node_idx"] == 7  # acknowledged through 6
    assert follower.sync.raftLastApplied == 4
    acknowledged = follower.log()

    # The first message again, late (a duplicate, or a resend overtaken by newer ones).
    reply = follower.deliver(0, first)
    assert follower.log() == acknowledged, "a stale message shortened the log"
    # It answers for what that message verified, no more.
    assert reply["success"] and reply["next_node_idx"] == 5
    assert not [r for r in caplog.records if "truncating" in r.getMessage()]


def test_stale_heartbeat_does_not_truncate(follower: Follower) -> None:
    follower.deliver(0, ae(1, 1, 0, run(2, 6, 1), commit=3))
    acknowledged = follower.log()
    reply = follower.deliver(0, ae(1, 2, 1, [], commit=3))
    assert follower.log() == acknowledged
    assert reply["success"] and reply["next_node_idx"] == 3


def test_overlapping_resend_appends_only_the_new_tail(follower: Follower) -> None:
    follower.deliver(0, ae(1, 1, 0, run(2, 6, 1), commit=1))
    reply = follower.deliver(0, ae(1, 3, 1, run(4, 9, 1), commit=5))
    assert follower.log() == [START] + [entry(i, 1) for i in range(2, 10)]
    assert reply["success"] and reply["next_node_idx"] == 10
    assert follower.sync.raftCommitIndex == 5


def test_unverified_tail_is_kept_but_never_committed_then_a_conflict_truncates(
    follower: Follower,
) -> None:
    # A deposed leader (peer 1, term 1) left entries 5 and 6 that were never committed.
    follower.deliver(1, ae(1, 1, 0, run(2, 6, 1), commit=2))
    # The new leader (peer 0, term 2) has 2..4 of term 1 and its own entry 5, already
    # committed. A message verifying 2..4 must not commit our 5 (not the leader's).
    reply = follower.deliver(0, ae(2, 1, 0, run(2, 4, 1), commit=5))
    assert reply["success"] and reply["next_node_idx"] == 5
    assert follower.sync.raftCommitIndex <= 4
    assert [e[1] for e in follower.log()] == [1, 2, 3, 4, 5, 6]
    # A real conflict (index 5, other term) still deletes from there.
    reply = follower.deliver(0, ae(2, 4, 1, [entry(5, 2)], commit=5))
    assert reply["success"] and reply["next_node_idx"] == 6
    assert follower.log() == [START, *run(2, 4, 1), entry(5, 2)]
    assert follower.sync.raftCommitIndex == 5


def test_prev_mismatch_and_outside_log_still_reject(follower: Follower) -> None:
    follower.deliver(0, ae(1, 1, 0, run(2, 4, 1), commit=1))
    log = follower.log()
    reply = follower.deliver(0, ae(1, 4, 7, [entry(5, 1)], commit=1))  # term mismatch
    assert not reply["success"] and reply["reset"]
    reply = follower.deliver(0, ae(1, 9, 1, [entry(10, 1)], commit=1))  # beyond the log
    assert not reply["success"] and reply["reset"] and reply["next_node_idx"] <= 5
    assert follower.log() == log


def test_below_the_compacted_start_is_rejected_without_truncation(follower: Follower) -> None:
    follower.deliver(0, ae(1, 1, 0, run(2, 9, 1), commit=9))
    follower.sync._SyncObj__raftLog.deleteEntriesTo(4)  # what log compaction does
    log = follower.log()
    assert log[0][1] == 5
    reply = follower.deliver(0, ae(1, 2, 1, run(3, 9, 1), commit=9))
    assert not reply["success"] and reply["reset"] and reply["next_node_idx"] == 10
    assert follower.log() == log


def test_pipelined_duplicated_and_reordered_delivery_never_shortens_the_log(
    follower: Follower,
) -> None:
    """A leader of one term sends its log in small pipelined batches; every message
    may be delivered late and more than once. The follower's log never shrinks and
    ends up equal to the leader's."""
    rng = random.Random(7)
    leader_log = [START, *run(2, 120, 1)]
    pending: list[dict[str, Any]] = []
    nxt = 2
    longest = 1
    for step in range(400):
        if nxt <= 120 and rng.random() < 0.6:
            batch = leader_log[nxt - 1 : nxt - 1 + rng.randint(1, 6)]
            pending.append(ae(1, nxt - 1, leader_log[nxt - 2][2], batch, commit=max(1, nxt - 5)))
            nxt = batch[-1][1] + 1
        if not pending:
            continue
        message = pending.pop(rng.randrange(len(pending)))
        if rng.random() < 0.3:
            pending.append(message)  # delivered again later
        reply = follower.deliver(0, message)
        if reply["reset"]:
            nxt = min(nxt, reply["next_node_idx"])
        end = follower.log()[-1][1]
        assert end >= longest, f"step {step}: log shortened from {longest} to {end}"
        longest = end
    for message in pending:
        follower.deliver(0, message)
    follower.deliver(0, ae(1, 120, 1, [], commit=120))
    assert follower.log() == leader_log


# ------------------------------------------------------------ bug A: stuck backoff


class ModelLeader:
    """PySyncObj's leader bookkeeping for one follower (syncobj.py: the
    ``next_node_idx`` handler and ``__sendAppendEntries``): it sends from its next
    index to its log end in batches of ``batch`` entries, advancing the next index as
    it sends, and sets the next index to whatever a reset reply says."""

    def __init__(self, log: list[Entry], term: int, commit: int, batch: int) -> None:
        self.log, self.term, self.commit, self.batch = log, term, commit, batch
        self.next = log[-1][1] + 1
        self.match = 0

    def send_pass(self) -> list[dict[str, Any]]:
        out = []
        last = self.log[-1][1]
        while True:
            prev = self.next - 1
            prev_term = self.log[prev - 1][2] if 1 <= prev <= last else None
            entries = self.log[self.next - 1 : self.next - 1 + self.batch]
            out.append(
                ae(self.term, None if prev_term is None else prev, prev_term, entries, self.commit)
            )
            if entries:
                self.next = entries[-1][1] + 1
            if self.next > last:
                return out

    def on_reply(self, reply: dict[str, Any]) -> None:
        if reply["reset"]:
            self.next = reply["next_node_idx"]
        if reply["success"] and self.match < reply["next_node_idx"] - 1:
            self.match = reply["next_node_idx"] - 1
            self.next = reply["next_node_idx"]


def _deposed_leader_tail(follower: Follower) -> list[Entry]:
    """The follower holds 2..6 of term 1 (committed) and 7..9 of term 3, written by a
    deposed leader (peer 1) and never committed. Returns the new leader's log: the
    same 2..6, then 7..40 of term 2 and 41..60 of term 4."""
    follower.deliver(1, ae(1, 1, 0, run(2, 6, 1), commit=6))
    follower.deliver(1, ae(3, 6, 1, run(7, 9, 3), commit=6))
    return [START, *run(2, 6, 1), *run(7, 40, 2), *run(41, 60, 4)]


@pytest.mark.parametrize("passes_per_round", [1, 2])
def test_follower_with_a_deposed_leaders_tail_converges_under_pipelining(
    follower: Follower, passes_per_round: int
) -> None:
    """After a partition heals, the new leader (term 4) probes the old leader's log.
    With more than one message in flight per round trip (batches, or a second send
    before the replies arrive), PySyncObj's "prevLogIdx beyond my log: next = end + 1"
    rejection of a later message undid the step back asked for by the first, and the
    follower never took the leader's log (match index 0 for good)."""
    leader_log = _deposed_leader_tail(follower)
    leader = ModelLeader(leader_log, term=4, commit=50, batch=16)
    for _ in range(30):
        replies = []
        for _ in range(passes_per_round):
            replies += [follower.deliver(0, m) for m in leader.send_pass()]
        for reply in replies:
            leader.on_reply(reply)
        if follower.log() == leader_log:
            break
    assert follower.log() == leader_log, f"stuck: next={leader.next} match={leader.match}"
    assert leader.match == 60


def test_follower_longer_than_the_leader_converges(follower: Follower) -> None:
    """The deposed leader's tail reaches past the new leader's log end: PySyncObj's
    leader then sends ``prevLogIdx`` None and the follower answered "next = end + 1"
    again and again."""
    follower.deliver(1, ae(1, 1, 0, run(2, 6, 1), commit=6))
    follower.deliver(1, ae(3, 6, 1, run(7, 30, 3), commit=6))
    leader_log = [START, *run(2, 6, 1), *run(7, 12, 4)]
    leader = ModelLeader(leader_log, term=4, commit=12, batch=16)
    leader.next = 31  # what the follower's first "reset, next = 31" reply sets
    for _ in range(30):
        for reply in [follower.deliver(0, m) for m in leader.send_pass()]:
            leader.on_reply(reply)
        if leader.match == 12:
            break
    assert leader.match == 12, f"stuck: next={leader.next}"
    assert follower.log()[: len(leader_log)] == leader_log


# --------------------------------------------------------------- the snapshot path


def dump_until(index: int, term: int) -> bytes:
    """A leader's dump file as PySyncObj writes it: gzip(pickle((data, last entry,
    entry before, cluster))), with an empty lease store as our consumer's data."""
    data = [{}, _PackedSnapshot(LeaseStore())]
    payload = (data, entry(index, term), entry(index - 1, term), set())
    return gzip.compress(pysyncobj_pickle.dumps(payload))


def snapshot_messages(term: int, dump: bytes, commit: int) -> list[dict[str, Any]]:
    """The chunks PySyncObj's leader sends for a dump file: data, then an empty last."""
    return [
        {"type": "append_entries", "term": term, "commit_index": commit, "serialized": chunk}
        for chunk in ((dump, True, False), (b"", False, True))
    ]


def test_snapshot_path_commits_nothing_unverified(follower: Follower) -> None:
    """A deposed leader's uncommitted tail (7..9, term 3) must not be committed by a
    message of the snapshot path, which verifies nothing (PySyncObj committed
    min(leader commit, log end), applying the tail and answering its proposals)."""
    _deposed_leader_tail(follower)
    assert follower.sync.raftCommitIndex == 6
    heartbeat = {"type": "append_entries", "term": 4, "commit_index": 50, "serialized": None}
    follower.deliver(0, heartbeat)
    follower.deliver(0, snapshot_messages(4, dump_until(20, 2), commit=50)[0])
    assert follower.sync.raftCommitIndex == 6 and follower.sync.raftLastApplied == 6


def test_snapshot_installs_on_a_follower_behind_it(follower: Follower) -> None:
    _deposed_leader_tail(follower)
    replies = [follower.deliver(0, m) for m in snapshot_messages(4, dump_until(20, 2), 50)]
    assert replies[-1]["success"] and replies[-1]["next_node_idx"] == 21
    assert follower.log() == [entry(19, 2), entry(20, 2)]
    assert follower.sync.raftLastApplied == 20
    reply = follower.deliver(0, ae(4, 20, 2, run(21, 22, 4), commit=22))
    assert reply["success"] and follower.sync.raftCommitIndex == 22


def test_pysyncobj_holds_a_loaded_snapshot_s_pieces_only_through_their_list(
    follower: Follower,
) -> None:
    """The pieces are freed as the store is built only if nothing but the list the
    consumer empties holds them: PySyncObj's loader (``__loadDumpFile``) keeps the
    list in its tuple, not the pieces (replication/snapshot_rows.py)."""
    consumer = follower.sync._SyncObj__consumers[0]
    load = consumer._deserialize
    counts: list[list[int]] = []

    def counting(data: Any) -> None:
        # One reference from the list, one for getrefcount's argument.
        counts.append([sys.getrefcount(data[i]) for i in range(len(data))])
        load(data)

    consumer._deserialize = counting
    for message in snapshot_messages(4, dump_until(20, 2), 50):
        follower.deliver(0, message)
    assert counts and all(count == 2 for count in counts[0]), counts
    assert follower.sync.raftLastApplied == 20


def test_repeated_snapshot_does_not_shorten_the_log(follower: Follower) -> None:
    """A dump that ends inside the follower's log at a matching entry (sent again after
    a stale rejection) is not installed over the longer log."""
    follower.deliver(0, ae(1, 1, 0, run(2, 20, 1), commit=20))
    log = follower.log()
    for message in snapshot_messages(1, dump_until(10, 1), commit=20):
        follower.deliver(0, message)
    assert follower.log() == log, "a repeated snapshot cleared the log"
    assert follower.sync.raftLastApplied == 20


def test_snapshot_is_behind_reads_the_dump_header() -> None:
    log = [entry(5, 1), *run(6, 12, 2)]
    assert snapshot_is_behind(log, dump_until(9, 2))
    assert snapshot_is_behind(log, dump_until(3, 1))  # older than our compacted start
    assert not snapshot_is_behind(log, dump_until(9, 3))  # conflicts: install
    assert not snapshot_is_behind(log, dump_until(12, 2))  # not behind our end
    assert not snapshot_is_behind(log, dump_until(30, 2))
    assert not snapshot_is_behind(log, b"not a dump")


# ------------------------------------------------------------- the plan by itself


def test_plan_leaves_an_append_at_the_log_end_alone() -> None:
    log = [START, *run(2, 5, 1)]
    message = ae(1, 5, 1, run(6, 7, 1), commit=5)
    assert plan_append_entries(log, 5, message, None) == AppendPlan(message, None, None)


def test_plan_conflict_hint_stops_at_the_commit_index() -> None:
    log = [START, *run(2, 9, 3)]
    plan = plan_append_entries(log, 6, ae(4, 9, 2, [], commit=20), None)
    assert plan.reply_next == 7 and plan.conflict == Conflict(4, 9, 3, 7)
    # A rejection behind it answers the hint, not the log end.
    behind = plan_append_entries(log, 6, ae(4, 25, 4, [], commit=20), plan.conflict)
    assert behind.reply_next == 7
    # Another leader's term: the hint no longer applies.
    other = plan_append_entries(log, 6, ae(5, 25, 5, [], commit=20), plan.conflict)
    assert other.reply_next is None and other.conflict is None
