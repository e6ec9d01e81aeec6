"""Guards on what raftlease relies on in PySyncObj 0.3.17 (docs/pysyncobj.md).

An upgrade that changes any of these must fail here, loudly, before it can change
behaviour in production.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path
from typing import Any

import msgpack
import pysyncobj
import pytest
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConsumer
from pysyncobj.journal import FileJournal
from pysyncobj.version import VERSION

from raftlease.core import LeaseStore
from raftlease.replication import repair_journal
from raftlease.replication.replica import _fail_reason_error, _StoreConsumer

pytestmark = pytest.mark.timeout(30)


def test_pinned_version() -> None:
    assert VERSION == "0.3.17", "pysyncobj changed: re-check docs/pysyncobj.md and this file"


def test_apis_we_call_exist() -> None:
    for name in (
        "_isLeader",
        "_getLeader",
        "isReady",
        "destroy_synchronous",
        "raftCurrentTerm",
        "raftCommitIndex",
        "raftLastApplied",
        "hasQuorum",
    ):
        assert hasattr(SyncObj, name), name
    assert hasattr(SyncObjConsumer, "_serialize") and hasattr(SyncObjConsumer, "_deserialize")
    assert hasattr(pysyncobj, "replicated")


def test_fail_reasons_map_to_definite_and_indefinite_errors() -> None:
    definite = {FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER, FAIL_REASON.REQUEST_DENIED}
    indefinite = {
        FAIL_REASON.NOT_LEADER,
        FAIL_REASON.LEADER_CHANGED,
        FAIL_REASON.DISCARDED,
        FAIL_REASON.UNKNOWN_OUTCOME,
    }
    for reason in definite:
        assert _fail_reason_error(reason).definite is True, reason
    for reason in indefinite:
        assert _fail_reason_error(reason).definite is False, reason


def _acquire_entry(now: int = 10) -> bytes:
    entry: dict[str, Any] = {
        "op": "acquire",
        "now": now,
        "term": 1,
        "cid": "c",
        "seq": 1,
        "ack": 1,
        "key": "k",
        "owner": "o",
        "ttl": 1000,
        "lid": "lid-1",
    }
    packed: bytes = msgpack.packb(entry)
    return packed


def test_apply_never_raises_even_if_the_state_machine_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # PySyncObj trap 1: an exception inside a replicated method wedges every node.
    consumer = _StoreConsumer(observer=None)

    def boom(entry: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(consumer.store, "apply", boom)
    result = consumer.apply_entry(_acquire_entry(), _doApply=True)
    assert result["ok"] is False and result["code"] == "INTERNAL"
    garbage = consumer.apply_entry(b"\xc1not msgpack", _doApply=True)
    assert garbage["ok"] is False and garbage["code"] == "INTERNAL"


def test_snapshot_is_msgpack_bytes_not_a_pickled_object() -> None:
    consumer = _StoreConsumer(observer=None)
    assert consumer.apply_entry(_acquire_entry(), _doApply=True)["ok"] is True
    data = pickle.loads(pickle.dumps(consumer._serialize()))
    # A plain list of bytes: the pieces of one msgpack map (replication/snapshot_rows.py).
    assert type(data) is list and data and all(type(piece) is bytes for piece in data)
    assert b"raftlease" not in pickle.dumps(consumer._serialize())
    restored = _StoreConsumer(observer=None)
    restored._deserialize(data)
    assert restored.store.to_plain() == consumer.store.to_plain()
    assert isinstance(restored.store, LeaseStore)


def _write_dump(
    path: Path, before_last: tuple[bytes, int, int], last: tuple[bytes, int, int]
) -> None:
    """A dump in PySyncObj's format: gzip(pickle((data, last, before_last, cluster)))."""
    from pysyncobj import pickle as pysyncobj_pickle

    with gzip.open(path, "wb") as f:
        pysyncobj_pickle.dump((None, last, before_last, set()), f)


def test_repair_keeps_entries_after_a_snapshot_newer_than_the_journal_head(
    tmp_path: Path,
) -> None:
    journal_path, dump_path = tmp_path / "raft.journal", tmp_path / "raft.dump"
    journal = FileJournal(str(journal_path))
    entries = [(b"cmd%d" % i, i, 1) for i in range(1, 11)]
    for entry in entries:
        journal.add(*entry)
    journal._destroy()
    # The snapshot covers up to entry 6; the journal was not yet truncated (a crash
    # between PySyncObj's two compaction steps).
    _write_dump(dump_path, entries[4], entries[5])
    assert repair_journal(journal_path, dump_path) == 4
    repaired = FileJournal(str(journal_path))
    try:
        assert [repaired[i] for i in range(len(repaired))] == entries[4:]
    finally:
        repaired._destroy()
    # Consistent now: a second repair changes nothing.
    assert repair_journal(journal_path, dump_path) == 0


def test_repair_leaves_consistent_or_unrelated_journals_alone(tmp_path: Path) -> None:
    journal_path, dump_path = tmp_path / "raft.journal", tmp_path / "raft.dump"
    assert repair_journal(journal_path, dump_path) == 0  # nothing there yet
    journal = FileJournal(str(journal_path))
    entries = [(b"c%d" % i, i, 2) for i in range(1, 5)]
    for entry in entries:
        journal.add(*entry)
    journal._destroy()
    _write_dump(dump_path, (b"x", 40, 2), (b"y", 41, 2))  # newer than every entry
    assert repair_journal(journal_path, dump_path) == 0
    check = FileJournal(str(journal_path))
    try:
        assert len(check) == 4
    finally:
        check._destroy()


def test_follower_code_that_lease_transport_corrects_is_unchanged() -> None:
    """``LeaseTransport`` rewrites ``append_entries`` before PySyncObj's follower code
    (``plan_append_entries``, ``_snapshot_message``; tests/unit/test_follower_log.py) and
    reads the private ``_SyncObj__raftLog``. Its corrections assume exactly this code:
    an upgrade that changes it must re-check them (docs/pysyncobj.md trap 5)."""
    import inspect

    source = inspect.getsource(SyncObj)
    for fragment in (
        # deletes everything after a matching prevLogIdx, conflict or not (bug B)
        "self.__deleteEntriesFrom(prevLogIdx + 1)",
        # prevLogIdx outside the log: "reset, next = log end + 1" (bug A)
        "self.__sendNextNodeIdx(node, success=False, reset=True)",
        # term mismatch: "reset, next = prevLogIdx"
        "self.__sendNextNodeIdx(node, nextNodeIdx = prevLogIdx, success = False, reset=True)",
        # the leader takes any reset at its word
        "self.__raftNextIndex[node] = nextNodeIdx",
        # commit after any current-term append_entries, the snapshot path included
        "self.__raftCommitIndex = min(leaderCommitIndex, self.__getCurrentLogIndex())",
        # a received snapshot always replaces the whole log
        "self.__loadDumpFile(clearJournal=True)",
        "self.__raftLog = createJournal(",
    ):
        assert fragment in source, f"pysyncobj changed: {fragment!r}"


def test_internals_the_durable_journal_relies_on_are_unchanged() -> None:
    """``replication.durable`` replaces PySyncObj's journal and serializer objects from
    inside ``SyncObj.__init__`` (our transport's constructor) and counts on where
    PySyncObj acknowledges and commits (docs/pysyncobj.md, "Durability")."""
    import inspect

    from pysyncobj import journal, serializer, transport

    source = inspect.getsource(SyncObj)
    init = inspect.getsource(SyncObj.__init__)
    # The journal and the serializer exist before the transport is built, and the
    # tick thread starts only after it: the swap happens before any tick.
    assert init.index("self.__raftLog = createJournal(") < init.index("transportClass(self")
    assert init.index("self.__serializer = Serializer(") < init.index("transportClass(self")
    assert init.index("transportClass(self") < init.index("self.__thread = None")
    for fragment in (
        # a follower appends, then answers (our send hook syncs before the answer)
        "self.__raftLog.add(*entry)",
        "self.__sendNextNodeIdx(node, nextNodeIdx=nextNodeIdx, success=True)",
        # a leader's commit index moves through setRaftCommitIndex before applying
        "self.__raftLog.setRaftCommitIndex(self.__raftCommitIndex)",
        # compaction cuts the journal after the dump is written; on-tick callbacks run
        # at the end of each tick, before the poll
        "self.__deleteEntriesTo(serializeID)",
        "for callback in self.__onTickCallbacks:",
    ):
        assert fragment in source, f"pysyncobj changed: {fragment!r}"
    tick = inspect.getsource(SyncObj._onTick)
    assert tick.index("self.__applyLogEntries()\n\n        if self.__raftState") < tick.index(
        "for callback in self.__onTickCallbacks:"
    )
    assert tick.index("commitIdx = self.__raftCommitIndex") < tick.index(
        "needSendAppendEntries = self.__applyLogEntries()"
    )
    # compact_journal.compact_journals swaps the module's createJournal while a
    # SyncObj is constructed: the constructor must still load its journal through it.
    from pysyncobj import syncobj as syncobj_module

    assert "self.__raftLog = createJournal(self.__conf.journalFile)" in inspect.getsource(
        SyncObj.__init__
    )
    assert syncobj_module.createJournal is journal.createJournal
    # The names durable.py reaches into.
    fj = inspect.getsource(journal.FileJournal)
    for name in ("self.__journalFile", "self.__currentOffset", "self.__metaStorer"):
        assert name in fj
    assert "self.__f = open(" in inspect.getsource(journal.ResizableFile)
    # PreallocatedFile allocates exactly what this growth rule asks for, then resizes
    # the map itself (size() is the file's size).
    write = inspect.getsource(journal.ResizableFile.write)
    for fragment in (
        "while offset + size > self.__mm.size():",
        "newSize = max(int(currSize * self.__resizeFactor), offset + size)",
    ):
        assert fragment in write, f"pysyncobj changed: {fragment!r}"
    ser = inspect.getsource(serializer.Serializer)
    for name in ("self.__fileName", "self.__useFork", "self.__pid", "self.__currentID"):
        assert name in ser
    assert "self.__incomingTransmissionFile" in ser
    # The last chunk of a transmitted snapshot is empty (DurableSerializer syncs the
    # received file when it arrives).
    assert "isLast = size == 0" in ser
    assert "addOnTickCallback" in dir(SyncObj)
    assert "self._syncObj = syncObj" in inspect.getsource(transport.TCPTransport.__init__)


def test_internals_the_peer_checks_rely_on_are_unchanged() -> None:
    """``replication.peers.BoundedTcpConnection`` mirrors PySyncObj's read and send paths and
    ``LeaseTransport`` wraps its first-frame handling (docs/pysyncobj.md)."""
    import inspect

    from pysyncobj import tcp_connection, transport

    conn = inspect.getsource(tcp_connection.TcpConnection)
    for fragment in (
        "def __processRead(self):",
        "incoming = self.__socket.recv(self.__recvBufferSize)",
        "self.__readBuffer += incoming",
        "def __processParseMessage(self):",
        "l = struct.unpack('i', self.__readBuffer[:4])[0]",
        "data = self.encryptor.decrypt(data)",
        "message = pickle.loads(zlib.decompress(data))",
        "randKey, message = message",
        # BoundedTcpConnection.send mirrors PySyncObj's send (only the framing of
        # small messages differs, peers.zlib_frame)
        "def send(self, message):",
        "message = (self.sendRandKey, message)",
        "data = zlib.compress(pickle.dumps(message), 3)",
        "data = struct.pack('i', len(data)) + data",
        "self.__writeBuffer += data",
        "self.__trySendBuffer()",
    ):
        assert fragment in conn, f"pysyncobj changed: {fragment!r}"
    tr = inspect.getsource(transport.TCPTransport)
    for fragment in (
        "def _onIncomingMessageReceived(self, conn, message):",
        "if self._syncObj.encryptor and not conn.sendRandKey:",
        "if isinstance(message, list) and self._onUtilityMessage(conn, message):",
        "def _onNewIncomingConnection(self, conn):",
        "conn = TcpConnection(",
        "self._connections[node] = conn",
    ):
        assert fragment in tr, f"pysyncobj changed: {fragment!r}"
    syncobj = inspect.getsource(SyncObj.__init__)
    assert "self.__encryptor = getEncryptor(self.__conf.password)" in syncobj
    # PeerCipher replaces the encryptor: these are the calls PySyncObj makes on it.
    assert "self.encryptor.encrypt_at_time(data, int(monotonicTime()))" in conn
    assert "dataTimestamp = self.encryptor.extract_timestamp(data)" in conn
    assert "conn.encryptor = self._syncObj.encryptor" in tr
    assert "return self.__encryptor" in inspect.getsource(SyncObj)


def test_every_private_name_we_reach_into_still_exists() -> None:
    """Every ``_Class__name`` of PySyncObj's that raftlease's code touches is still an
    attribute or method of that class's source (an upgrade that renames one would
    otherwise surface as an AttributeError on the tick thread, or, for an attribute we
    assign, as a silently ignored new attribute)."""
    import inspect
    import re

    from pysyncobj import fast_queue, journal, serializer, tcp_connection, tcp_server

    classes: dict[str, Any] = {
        "SyncObj": SyncObj,
        "TcpConnection": tcp_connection.TcpConnection,
        "TcpServer": tcp_server.TcpServer,
        "FastQueue": fast_queue.FastQueue,
        "FileJournal": journal.FileJournal,
        "ResizableFile": journal.ResizableFile,
        "Serializer": serializer.Serializer,
    }
    package = Path(__file__).resolve().parents[2] / "raftlease"
    used: set[tuple[str, str]] = set()
    for path in package.rglob("*.py"):
        used.update(re.findall(r"\b_([A-Z][A-Za-z]*)__([a-zA-Z]\w*)", path.read_text()))
    assert ("SyncObj", "otherNodes") in used  # the scan sees what it must
    for owner, name in sorted(used):
        assert owner in classes, f"raftlease reaches into an unchecked class: _{owner}__{name}"
        source = inspect.getsource(classes[owner])
        assert f"self.__{name}" in source or f"def __{name}(" in source, (
            f"pysyncobj changed: {owner}.__{name} is gone"
        )


def test_the_connection_timeout_the_peer_connection_replaces_is_unchanged() -> None:
    """``BoundedTcpConnection`` replaces ``TcpConnection.__processConnectionTimeout``
    (only silence while an answer is awaited is a dead peer): PySyncObj must still
    call it where it did (each send, each socket event before reading) and keep the
    attributes it reads."""
    import inspect

    from pysyncobj.tcp_connection import TcpConnection

    source = inspect.getsource(TcpConnection)
    for fragment in (
        "def __trySendBuffer(self):\n        self.__processConnectionTimeout()",
        "    def __processConnection(self, descr, eventType):",
        "if monotonicTime() - self.__lastReadTime > self.__timeout:",
        "self.__timeout = timeout",
    ):
        assert fragment in source, f"pysyncobj changed: {fragment!r}"
    events = inspect.getsource(TcpConnection._TcpConnection__processConnection)
    assert events.index("self.__processConnectionTimeout()") < events.index(
        "self.__tryReadBuffer()"
    )


def test_the_replicated_call_the_replica_pickles_itself_is_unchanged() -> None:
    """``Replica.propose`` builds the command PySyncObj's ``@replicated`` wrapper
    would, ``(method id, (data,))`` with the REGULAR type byte, through the same
    private calls, pickled with protocol 5 instead of 2 and sealed (journal.py);
    PySyncObj's apply must still load any protocol, ignore the seal after the pickle's
    end, and call the method by that id."""
    import inspect

    from pysyncobj.syncobj import _COMMAND_TYPE, replicated

    wrapper = inspect.getsource(replicated)
    for fragment in (
        "funcName = self._syncObj._getFuncName((consumerId, func.__name__))",
        "funcID = self._syncObj._methodToID[(consumerId, funcName)]",
        "cmd = (funcID, args)",
        "applier(pickle.dumps(cmd), callback, _COMMAND_TYPE.REGULAR)",
    ):
        assert fragment in wrapper, f"pysyncobj changed: {fragment!r}"
    source = inspect.getsource(SyncObj)
    for fragment in (
        "def _applyCommand(self, command, callback, commandType = None):",
        "command = pickle.loads(command[1:])",
        "funcID, args = command",
        "return self._idToMethod[funcID](*args, **kwargs)",
    ):
        assert fragment in source, f"pysyncobj changed: {fragment!r}"
    assert _COMMAND_TYPE.REGULAR == 0
    assert pysyncobj.pickle.loads(pickle.dumps((7, (b"\xa7x",)), 4)) == (7, (b"\xa7x",))
    from raftlease.replication.journal import seal_command

    assert pysyncobj.pickle.loads(seal_command((7, (b"\xa7x",)))) == (7, (b"\xa7x",))
    # Commands PySyncObj pickles itself (membership, version, its own wrapper) are
    # protocol 2: journal.command_intact takes them as unsealed only as such.
    assert pysyncobj.pickle.dumps(["add", "n4"])[:2] == b"\x80\x02"


def test_a_tick_loads_the_dump_then_applies_the_log_then_runs_tick_callbacks() -> None:
    """``Replica.restored`` (the start-up gate of issue 37) is checked in a tick
    callback: by then the same tick has loaded the dump file (``__needLoadDumpFile``
    cleared) and applied the journal's committed entries. It relies on this order in
    ``SyncObj._onTick`` and on the flag starting True."""
    import inspect

    tick = inspect.getsource(SyncObj._onTick)
    load = tick.index("self.__loadDumpFile(clearJournal=False)")
    cleared = tick.index("self.__needLoadDumpFile = False")
    apply = tick.index("needSendAppendEntries = self.__applyLogEntries()")
    callbacks = tick.index("for callback in self.__onTickCallbacks:")
    assert load < cleared < apply < callbacks
    assert "self.__needLoadDumpFile = True" in inspect.getsource(SyncObj.__init__)
