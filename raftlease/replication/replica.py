"""One node's Raft replica over PySyncObj (``Replica``).

It replicates opaque entries (msgpack bytes) through one replicated method, applies
them to the ``LeaseStore`` on PySyncObj's tick thread, and reports leader, term and
indexes. Everything PySyncObj-specific (its configuration names, its error codes, its
snapshot hooks) stays here. docs/pysyncobj.md lists what we rely on; each reliance is
guarded by a test in tests/fitness/test_pysyncobj_contract.py.

Threads: PySyncObj runs its own tick thread. ``apply`` and every callback passed to
``propose`` run on that thread and must never block or raise (an exception inside a
replicated method wedges the whole cluster, PySyncObj trap 1). Other methods are safe
to call from any thread: they read single attributes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import msgpack
from pysyncobj import FAIL_REASON, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.syncobj import _COMMAND_TYPE

from .._version import __version__
from ..clock import Clock, SystemClock
from ..config import NodeAddress, NodeConfig
from ..core import LeaseStore, Result
from ..core.snapshot import ENTRY_FORMAT, entry_format
from ..errors import (
    ConfigError,
    InternalError,
    InvalidArgumentError,
    LeaderChangedError,
    NotLeaderError,
    RaftLeaseError,
    UnavailableError,
)
from .compact_journal import compact_journals
from .durable import SyncRecorder, remove_stale_rewrites
from .group_send import GroupSendSyncObj
from .journal import (
    UnusableFiles,
    check_start_files,
    clamp_commit_index,
    repair_journal,
    seal_command,
    trim_torn_tail,
)
from .leadership import LeaseGuard
from .membership import (
    MEMBERS_FILE,
    REMOVED_FILE,
    Change,
    DialNode,
    Membership,
    member_node,
    read_members_file,
    write_removed_file,
)
from .names import names
from .peer_tls import PeerTLS, load_peer_tls
from .snapshot_rows import pack_snapshot, unpack_chunks, unpack_snapshot
from .transport import LeaseTransport

log = logging.getLogger("raftlease.replication")

__all__ = ["DialNode", "Replica", "syncobj_conf"]

#: Exit status of a node that cannot load its snapshot.
SNAPSHOT_LOAD_FAILED = 70
#: Exit status of a node that meets a log entry of a newer format than it applies.
ENTRY_FORMAT_TOO_NEW = 71


#: Called on the tick thread with (result, error); exactly one of them is None.
ProposeCallback = Callable[[Result | None, RaftLeaseError | None], None]
#: Called on the tick thread after each applied entry with (entry, result).
ApplyObserver = Callable[[dict[str, Any], Result], None]
#: Called on the tick thread after a snapshot replaced the state, with its revision
#: (the dump loaded at start, or one the leader installed).
RestoreObserver = Callable[[int], None]


class ApplyTap(Protocol):
    """A test build's view around each applied entry (raftlease/testing/trace.py
    traces the lease changes it makes). Production passes none, so it pays one
    ``None`` test per entry. Both run on the tick thread, inside the replicated
    method; an exception is logged and dropped (never out of the replicated method)."""

    def before(self, store: LeaseStore) -> Any:
        """Just before ``store`` applies an entry; returns what ``after`` compares."""

    def after(self, index: int, store: LeaseStore, before: Any) -> None:
        """Just after ``store`` applied the entry at log ``index``."""


def _fail_reason_error(reason: int) -> RaftLeaseError:
    """Map a PySyncObj FAIL_REASON to our error (definite only where it is certain
    the entry was never appended to a leader's log)."""
    if reason in (FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER):
        return UnavailableError(f"raft: request not proposed ({_REASON_NAMES.get(reason)})")
    if reason == FAIL_REASON.REQUEST_DENIED:
        return UnavailableError("raft: request denied")
    return LeaderChangedError(
        f"raft: leadership changed while the request was in flight ({_REASON_NAMES.get(reason)})"
    )


_REASON_NAMES = {getattr(FAIL_REASON, name): name for name in dir(FAIL_REASON) if name.isupper()}


class _PackedSnapshot:
    """Handed to PySyncObj as this consumer's snapshot data.

    PySyncObj pickles the snapshot in a forked child (``useFork``), so packing happens
    there, off the tick thread, on the child's copy-on-write view of the store.
    ``__reduce__`` turns the object into a plain ``list`` of ``bytes``, the pieces of
    one msgpack map (``snapshot_rows.pack_snapshot``; a loading node frees each piece
    as it reads it): the dump file never holds a pickled object of ours, only bytes.
    """

    def __init__(self, store: LeaseStore) -> None:
        self._store = store

    def __reduce__(self) -> tuple[type[list[bytes]], tuple[list[bytes]]]:
        return (list, (pack_snapshot(self._store.to_plain()),))


class _StoreConsumer(SyncObjConsumer):  # type: ignore[misc]
    """Holds the LeaseStore inside PySyncObj's replicated state. ``store_class``: the
    state machine (a test build injects a broken subclass; production never passes it)."""

    def __init__(
        self,
        observer: ApplyObserver | None,
        store_class: type[LeaseStore] = LeaseStore,
        on_restore: RestoreObserver | None = None,
        tap: ApplyTap | None = None,
        restore_pause: Callable[[], object] | None = None,
    ) -> None:
        super().__init__()
        self.tap = tap
        self.restore_pause = restore_pause
        self.store_class = store_class
        self.store = store_class()
        self.observer = observer
        self.on_restore = on_restore
        #: Seconds the state machine took for the entry applied last (tick thread;
        #: the observer reads it for the metrics).
        self.last_apply_seconds = 0.0

    def _serialize(self) -> _PackedSnapshot:
        return _PackedSnapshot(self.store)

    def _deserialize(self, data: Any) -> None:
        try:
            # The lease rows are unpacked one at a time as the store is built
            # (snapshot_rows.py): never all of them at once beside it. A dump of this
            # build is a list of pieces, each freed once read; an earlier one, bytes.
            pause = self.restore_pause
            if isinstance(data, list):
                if pause is not None:
                    pause()  # before the store grows: what start-up freed goes back
                plain = unpack_chunks(data, pause)
            else:
                plain = unpack_snapshot(data)
            store = self.store_class.from_plain(plain)
        except Exception as exc:
            # PySyncObj would only log this and go on with an empty state machine, and
            # such a node can even win an election and wedge the cluster. A node that
            # cannot load its snapshot must not take part at all: stop the process.
            log.critical(
                "cannot load the snapshot (%s); stopping this node (raftlease %s). If the "
                "snapshot is newer than this build, upgrade the node; if it is corrupt, "
                "restore its data directory, or remove it to resync from the leader "
                "while the other nodes are healthy.",
                exc if isinstance(exc, ValueError) else "corrupt",
                __version__,
                exc_info=True,
            )
            self.halt(SNAPSHOT_LOAD_FAILED)
            return
        self.store = store
        log.info(
            "restored snapshot: %d leases, revision %d, log time %d ms",
            len(self.store.leases),
            self.store.revision,
            self.store.now,
        )
        if self.on_restore is not None:
            try:
                self.on_restore(store.revision)
            except Exception:  # never raise on the tick thread
                log.exception("restore observer raised")

    def halt(self, status: int) -> None:
        """Stop the process at once (tick thread; no exception may leave a replicated
        method). A test replaces it."""
        logging.shutdown()
        os._exit(status)

    @replicated  # type: ignore[untyped-decorator]
    def apply_entry(self, data: bytes) -> Result:
        # Never raise here (PySyncObj trap 1): a raise wedges every node.
        try:
            entry = msgpack.unpackb(data, raw=False, strict_map_key=True)
        except Exception:
            log.error("undecodable log entry of %d bytes skipped", len(data))
            return {"ok": False, "code": "INTERNAL", "message": "undecodable log entry"}
        fv = entry_format(entry)
        if fv is None or fv > ENTRY_FORMAT:
            # Applying it the old way would diverge from the nodes that know it: stop,
            # before applying, on every restart, until this node is upgraded.
            log.critical(
                "log entry format %r is newer than this node understands (up to %d; "
                "raftlease %s): upgrade this node; it stops instead of applying it",
                entry.get("fv") if isinstance(entry, dict) else None,
                ENTRY_FORMAT,
                __version__,
            )
            self.halt(ENTRY_FORMAT_TOO_NEW)
            return {"ok": False, "code": "INTERNAL", "message": "entry format too new"}
        tap, seen = self.tap, None
        if tap is not None:
            try:
                seen = tap.before(self.store)
            except Exception:
                log.exception("apply tap raised")
        started = time.perf_counter()
        try:
            result = self.store.apply(entry)
        except Exception:  # a bug in core: report, never wedge the cluster
            log.exception("state machine raised on entry op=%r", entry.get("op"))
            return {"ok": False, "code": "INTERNAL", "message": "state machine error"}
        self.last_apply_seconds = time.perf_counter() - started
        if tap is not None:
            try:
                # PySyncObj counts the entry applied only after this method returns.
                tap.after(int(self._syncObj.raftLastApplied) + 1, self.store, seen)
            except Exception:
                log.exception("apply tap raised")
        if self.observer is not None:
            try:
                self.observer(entry, result)
            except Exception:
                log.exception("apply observer raised")
        return result


def syncobj_conf(config: NodeConfig) -> SyncObjConf:
    """PySyncObj's configuration for a node (no callbacks). Shared with the
    benchmark's raw-PySyncObj baseline, so both run with the same settings. No
    ``password``: peers are authenticated and encrypted by TLS in our transport
    (peers.py), not by PySyncObj's Fernet framing."""
    me = config.self_node
    return SyncObjConf(
        journalFile=str(config.journal_file),
        # Trap 2: a journal without a dump file comes back empty after compaction.
        fullDumpFile=str(config.dump_file),
        useFork=True,
        # Trap 8: batching makes every write wait for the next heartbeat.
        appendEntriesUseBatch=False,
        appendEntriesPeriod=config.heartbeat_interval,
        raftMinTimeout=config.election_timeout_min,
        raftMaxTimeout=config.election_timeout_max,
        connectionRetryTime=config.connection_retry,
        # Listen on the raft address's host only (PySyncObj binds 0.0.0.0 by
        # default, and its peer protocol is unauthenticated pickle).
        bindAddress=me.raft,
        connectionTimeout=config.connection_timeout,
        leaderFallbackTimeout=config.leader_fallback,
        logCompactionMinEntries=config.compaction_min_entries,
        logCompactionMinTime=config.compaction_min_time,
        # Each node compacts in its own time slot, never two at once, so a crash of
        # the whole cluster cannot catch a majority inside a compaction.
        logCompactionSplit=True,
        # Fail fast with MISSING_LEADER (definite) instead of queueing forever.
        commandsWaitLeader=False,
        # Members are added and removed through the log (membership.py); the leader
        # lease is re-counted over the new majority at each change (transport.py).
        dynamicMembershipChange=True,
    )


class Replica:
    """One node's Raft replica of the lease store."""

    def __init__(
        self,
        config: NodeConfig,
        observer: ApplyObserver | None = None,
        clock: Clock | None = None,
        guard_class: type[LeaseGuard] = LeaseGuard,
        transport_class: type[LeaseTransport] = LeaseTransport,
        store_class: type[LeaseStore] = LeaseStore,
        recorder: SyncRecorder | None = None,
        on_restore: RestoreObserver | None = None,
        apply_tap: ApplyTap | None = None,
        restore_pause: Callable[[], object] | None = None,
    ) -> None:
        """``apply_tap``: a test build's view around each applied entry (``ApplyTap``).
        ``on_restore``: told (tick thread) the revision of each snapshot that
        replaced the state. ``restore_pause``: called (tick thread, must not raise)
        before a snapshot is loaded and every ``snapshot_rows.PAUSE_ROWS`` lease rows
        while it is: the node trims its heap there, which lowers the load's peak.
        ``recorder``: a test build's record of what reached stable storage
        (durable.SyncRecorder). ``guard_class`` (the leader-lease bookkeeping),
        ``transport_class`` (the PySyncObj transport) and ``store_class`` (the state
        machine): a test build injects broken ones through ``raftlease.testing.node``;
        production never passes them."""
        self.config = config
        # The member set: the one this node saw last (members.json, written at each
        # change) over the config file's, so a restarted node comes back with the
        # membership of its log, not of a stale config file.
        members_path = config.data_dir / MEMBERS_FILE
        self.removed_path = config.data_dir / REMOVED_FILE
        #: Log index at which this node was removed from the cluster (None: a member).
        self.removed_at: int | None = None
        if self.removed_path.exists():
            raise ConfigError(
                f"this node was removed from the cluster ({self.removed_path}: "
                f"{self.removed_path.read_text(errors='replace').strip()}); to bring this "
                "host back, empty its data directory (keep its certificate) and add it again "
                "with `raftlease member add` (docs/membership.md)"
            )
        saved = read_members_file(members_path)
        nodes = config.nodes
        if saved is not None and {m.raft for m in saved} != {m.raft for m in nodes}:
            log.warning(
                "members from %s (%s) differ from the config file's (%s): using %s",
                members_path,
                ", ".join(m.id for m in saved),
                ", ".join(m.id for m in nodes),
                MEMBERS_FILE,
            )
        if saved is not None:
            nodes = tuple(m for m in saved if m.raft != config.self_node.raft)
            nodes = (config.self_node, *nodes)
        others = tuple(m for m in nodes if m.raft != config.self_node.raft)
        self.membership = Membership(config.self_node, nodes, members_path)
        self._tick_calls: deque[Callable[[], None]] = deque()
        self.guard = guard_class(
            clock or SystemClock(),
            cluster_size=len(nodes),
            promise=config.election_timeout_min,
            rho=config.clock_drift,
        )
        config.data_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_rewrites(config.journal_file)
        try:
            check_start_files(config.journal_file, config.dump_file)
        except UnusableFiles as exc:
            log.critical(
                "%s; stopping this node (raftlease %s). Restore its data directory from "
                "a backup, or empty it and add it back to resync from the leader while "
                "the other nodes are healthy (docs/disaster-recovery.md).",
                exc,
                __version__,
            )
            logging.shutdown()
            os._exit(SNAPSHOT_LOAD_FAILED)
        trim_torn_tail(config.journal_file, config.dump_file)
        repair_journal(config.journal_file, config.dump_file)
        clamp_commit_index(config.journal_file, config.dump_file, recorder)
        self._consumer = _StoreConsumer(observer, store_class, on_restore, apply_tap, restore_pause)
        self._role = "follower"
        me = config.self_node
        conf = syncobj_conf(config)
        # Mutual TLS with the cluster CA on every peer connection (peer_tls.py); only
        # a test build's plain-peer baseline goes without.
        self.peer_tls: PeerTLS | None = None
        if not transport_class.plain_peers:
            self.peer_tls = self._load_peer_tls()
        conf.onStateChanged = self._on_state_changed
        dial = {p.raft: config.dial[p.id] for p in config.peers if p.id in config.dial}
        peers = [member_node(p, DialNode, dial=dial.get(p.raft, p.raft)) for p in others]
        for p in others:  # start resolving peer names now, off the tick thread (names.py)
            names.ip(dial.get(p.raft, p.raft).rpartition(":")[0].strip("[]"))
        bound = type(
            "BoundLeaseTransport",
            (transport_class,),
            {
                "guard": self.guard,
                "durability": config.durability,
                "recorder": recorder,
                "dial": dial,
                "on_removed": staticmethod(self._on_removed),
                "peer_tls": self.peer_tls,
                "max_peer_frame": config.max_peer_frame,
            },
        )
        # One append_entries per follower per tick, not per command (group_send.py).
        with compact_journals():  # the log is never loaded into a list (compact_journal.py)
            self._sync = GroupSendSyncObj(
                me.raft, peers, conf, consumers=[self._consumer], transportClass=bound
            )
        #: The commit index in the journal found at start: the state this node had is
        #: back once its snapshot is loaded and the log applied up to here.
        self._start_commit = int(self._sync.raftCommitIndex)
        #: Set once (tick thread) when the snapshot and the journal are restored
        #: (``restored``); until then the store is empty or partly replayed.
        self._restored = False
        self._sync.addOnTickCallback(self._on_tick)
        if self.peer_tls is not None:
            log.info(
                "peer TLS: certificate serial %x for %s, valid until %s UTC; %d CA(s), %d revoked",
                self.peer_tls.serial,
                me.id,
                f"{self.peer_tls.not_after:%Y-%m-%d %H:%M}",
                len(self.peer_tls.cas),
                len(self.peer_tls.revoked),
            )

    def _load_peer_tls(self) -> PeerTLS:
        config = self.config
        return load_peer_tls(
            config.node_id,
            config.peer_ca_file,
            config.peer_cert_file,
            config.peer_key_file,
            config.peer_crl_file,
        )

    def reload_peer_tls(self, then: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Read the peer TLS files again (``SIGHUP``): new peer connections use them
        at once, and open ones whose certificate they no longer admit (revoked by the
        revocation list, issued by a CA no longer in the CA file) are closed on the
        tick thread; ``then`` runs there with how many were. Any thread; blocks on the
        file reads. Returns what was loaded (``PeerTLS.describe``). Raises
        ``ConfigError``, changing nothing, if a file is missing or not valid."""
        if self.peer_tls is None:
            return {"plain": True}
        fresh = self._load_peer_tls()
        self.peer_tls = fresh

        def swap() -> None:
            closed = self._sync._SyncObj__transport.reload_tls(fresh)
            if then is not None:
                then(closed)

        self._tick_calls.append(swap)
        self._wake()
        return fresh.describe()

    def _wake(self) -> None:
        """Wake the tick thread for ``_tick_calls`` (it may sleep up to a tick)."""
        notifier = getattr(self._sync, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            with contextlib.suppress(OSError, ValueError):  # stopped
                notifier.notify()

    # ---------------------------------------------------------------- writes

    def propose(self, data: bytes, callback: ProposeCallback) -> None:
        """Append ``data`` (a msgpack-encoded entry) to the Raft log.

        Non-blocking; ``callback`` runs later on the tick thread with the state
        machine's result, or with an error: ``UnavailableError`` (definite: never
        appended) or ``LeaderChangedError`` (outcome unknown).
        """

        def done(result: Any, reason: int) -> None:
            if reason == FAIL_REASON.SUCCESS:
                if isinstance(result, dict):
                    callback(result, None)
                else:
                    callback(None, InternalError(f"unexpected apply result {result!r}"))
            else:
                callback(None, _fail_reason_error(reason))

        # What PySyncObj's ``@replicated`` wrapper does for ``apply_entry(data,
        # callback=done)``, with two changes. The call is pickled with protocol 5,
        # not PySyncObj's protocol 2, which has no bytes type in Python 3: it stores
        # ``data`` as a latin-1 text re-encoded by ``_codecs.encode`` on load, so each
        # byte >= 0x80 (msgpack's headers are mostly such bytes) takes two in the
        # log, the journal and every append (docs/pysyncobj.md, trap 12). And the
        # pickle is sealed with its CRC-32, so a record torn by a power loss is
        # found at start (journal.py, "Sealed commands"). Every reader (PySyncObj's
        # apply, our backup and snapshot readers) loads any protocol and ignores the
        # seal after the pickle's end, so logs and members of every kind mix.
        consumer = self._consumer
        sync = consumer._syncObj  # the SyncObj the consumer is attached to
        owner = id(consumer)
        method = sync._methodToID[(owner, sync._getFuncName((owner, "apply_entry")))]
        sync._applyCommand(seal_command((method, (data,))), done, _COMMAND_TYPE.REGULAR)

    # ----------------------------------------------------------------- state

    @property
    def store(self) -> LeaseStore:
        """The local replica of the state. Read it only from the tick thread, or
        accept that a read from another thread sees some recent applied state."""
        store: LeaseStore = self._consumer.store
        return store

    def last_apply_seconds(self) -> float:
        """How long the state machine took for the last applied entry (tick thread)."""
        return float(self._consumer.last_apply_seconds)

    def durability_status(self) -> dict[str, Any]:
        """The journal's durability mode and sync counters (``syncs``, and
        ``synced_entries`` they covered: with group commit, more than one each)."""
        transport = self._sync._SyncObj__transport
        journal = transport.journal
        return {
            "durability": self.config.durability,
            "journal_syncs": journal.syncs,
            "journal_synced_entries": journal.covered,
        }

    def on_journal_sync(self, callback: Callable[[float], None]) -> None:
        """Call ``callback(seconds)`` on the tick thread after each journal sync (the
        metrics' sync latency histogram); it must not block."""
        self._sync._SyncObj__transport.journal.on_sync = callback

    def election_status(self) -> dict[str, Any]:
        """PreVote rounds this node asked and won (prevote.py); any thread."""
        prevote = self._sync._SyncObj__transport.prevote
        return {"pre_vote_rounds": prevote.rounds, "pre_vote_wins": prevote.wins}

    def snapshot_status(self) -> dict[str, Any]:
        """Snapshots (log compactions) this process wrote, failed, and how long the
        last took (``durable.TimedSerializer``); read from any thread."""
        serializer = self._sync._SyncObj__serializer
        return {
            "snapshots_written": getattr(serializer, "snapshots_written", 0),
            "snapshot_failures": getattr(serializer, "snapshot_failures", 0),
            "last_snapshot_seconds": getattr(serializer, "last_snapshot_seconds", None),
        }

    def is_leader(self) -> bool:
        return bool(self._sync._isLeader())

    def leader_raft_addr(self) -> str | None:
        leader = self._sync._getLeader()
        if leader is None:
            return None
        return str(leader.id)

    def term(self) -> int:
        return int(self._sync.raftCurrentTerm)

    def commit_index(self) -> int:
        return int(self._sync.raftCommitIndex)

    def last_log_index(self) -> int:
        """Index of the last entry in this node's log (committed or not)."""
        last = self._sync._SyncObj__raftLog[-1]
        return int(last[1])

    def last_applied(self) -> int:
        return int(self._sync.raftLastApplied)

    def is_ready(self) -> bool:
        """True once the node has applied the log up to the leader's commit index
        seen at start (PySyncObj's onReady)."""
        return bool(self._sync.isReady())

    def connected_peers(self) -> list[str]:
        """Ids of the peers with a live Raft connection (as PySyncObj sees it)."""
        return [
            m.id
            for m in self.membership.members()
            if m.raft != self.config.self_node.raft and self._sync.isNodeConnected(member_node(m))
        ]

    # ------------------------------------------------------------ membership

    def members(self) -> tuple[NodeAddress, ...]:
        """The member set in this node's log (any thread)."""
        return self.membership.members()

    def match_index(self, raft: str) -> int | None:
        """On the leader: the highest log index known replicated on member ``raft``
        (None if not a peer of this leader). Any thread (one dict read)."""
        match: dict[Any, int] = self._sync._SyncObj__raftMatchIndex
        value = match.get(member_node(NodeAddress(raft, raft, "")))
        return None if value is None else int(value)

    def change_members(
        self,
        kind: str,
        member: NodeAddress,
        callback: Callable[[Change | None, RaftLeaseError | None], None],
        learn: bool = False,
    ) -> None:
        """Propose adding (``kind`` "add") or removing ("remove") ``member``.

        Non-blocking, any thread. ``callback`` runs on the tick thread once: with the
        ``Change`` when the entry committed (the caller then owns the change slot and
        releases it with ``membership.finish``), or with an error: ``NotLeaderError``,
        ``InvalidArgumentError`` (already a member, not a member, the leader itself),
        ``UnavailableError`` (another change in flight, or the new leader has not yet
        committed an entry of its term: definite), ``LeaderChangedError`` (unknown).

        ``learn`` (an add only): claim the change slot and start the learner stage
        instead of appending: the leader streams the log to the new node, which
        counts for nothing (transport.start_learner), and ``callback`` gets the
        ``Change`` at once; then ``commit_learner`` appends it, or ``drop_learner``
        gives it up (both release the slot on failure).

        """
        self._tick_calls.append(lambda: self._start_change(kind, member, callback, learn))

    def learner_match(self, raft: str) -> int | None:
        """On the leader: the highest log index known replicated on learner ``raft``
        (None while it is not connected, or not a learner). Any thread."""
        transport = self._sync._SyncObj__transport
        if not transport.is_learner(raft):
            return None
        return self.match_index(raft)

    def commit_learner(
        self, change: Change, callback: Callable[[Change | None, RaftLeaseError | None], None]
    ) -> None:
        """Append the add of learner ``change`` (non-blocking, any thread; callback
        on the tick thread as for ``change_members``). Refused with ``UnavailableError``
        (definite: nothing was appended; the slot is released) if this node lost its
        leadership, and with it the learner, meanwhile."""

        def run() -> None:
            transport = self._sync._SyncObj__transport
            if not self._sync._isLeader() or not transport.is_learner(change.member.raft):
                transport.stop_learner(change.member.raft)
                self.membership.finish(change)
                callback(None, UnavailableError("leadership changed during the catch-up: retry"))
                return
            self._propose_change(change, callback)

        self._tick_calls.append(run)

    def drop_learner(self, change: Change, then: Callable[[], None] | None = None) -> None:
        """Give up the learner stage of ``change`` and release the change slot
        (non-blocking, any thread); ``then`` runs on the tick thread once it is."""

        def run() -> None:
            self._sync._SyncObj__transport.stop_learner(change.member.raft)
            self.membership.finish(change)
            if then is not None:
                then()

        self._tick_calls.append(run)

    def _start_change(
        self,
        kind: str,
        member: NodeAddress,
        callback: Callable[[Change | None, RaftLeaseError | None], None],
        learn: bool = False,
    ) -> None:
        sync = self._sync
        if not sync._isLeader():
            callback(None, NotLeaderError("not the leader (it changed before the request ran)"))
            return
        members = self.membership.members()
        by_raft = {m.raft: m for m in members}
        by_id = {m.id: m for m in members}
        if kind == "add":
            if member.raft in by_raft or member.id in by_id:
                err = InvalidArgumentError(f"{member.id} ({member.raft}) is already a member")
                callback(None, err)
                return
        else:
            target = by_id.get(member.id) or by_raft.get(member.raft)
            if target is None:
                callback(None, InvalidArgumentError(f"{member.id} is not a member"))
                return
            if target.raft == self.config.self_node.raft:
                # PySyncObj cannot remove its leader (__doChangeCluster refuses self).
                callback(
                    None,
                    InvalidArgumentError(
                        f"{target.id} is the leader and cannot remove itself; stop it so "
                        "another node leads, then remove it through that one"
                    ),
                )
                return
            if len(members) == 1:
                callback(None, InvalidArgumentError("cannot remove the last member"))
                return
            member = target
        log_ = sync._SyncObj__raftLog
        first = int(log_[0][1])
        commit = int(sync.raftCommitIndex)
        tail = [log_[i] for i in range(max(0, commit - first + 1), len(log_))]
        change = Change(kind, member, int(sync.raftCurrentTerm))
        try:
            self.membership.begin(change, tail)
        except RaftLeaseError as exc:
            callback(None, exc)
            return
        if kind == "add" and learn:
            learner = member_node(member)
            self._sync._SyncObj__transport.start_learner(learner)
            callback(change, None)
            return
        self._propose_change(change, callback)

    def _propose_change(
        self, change: Change, callback: Callable[[Change | None, RaftLeaseError | None], None]
    ) -> None:
        """Tick thread: append ``change`` (its slot claimed); ``callback`` as for
        ``change_members``."""
        sync = self._sync
        kind, member = change.kind, change.member

        def done(_: Any, reason: int) -> None:
            if reason == FAIL_REASON.SUCCESS:
                callback(change, None)
                return
            # A learner whose add failed is streamed nothing more (a no-op otherwise).
            self._sync._SyncObj__transport.stop_learner(member.raft)
            self.membership.finish(change)
            if reason == FAIL_REASON.REQUEST_DENIED:
                callback(
                    None,
                    UnavailableError(
                        "raft refused the change (a new leader first commits an entry "
                        "of its term): retry"
                    ),
                )
            else:
                callback(None, _fail_reason_error(reason))

        node = member_node(member)
        try:
            if kind == "add":
                sync.addNodeToCluster(node, callback=done)
            else:
                sync.removeNodeFromCluster(node, callback=done)
        except Exception as exc:  # never let it escape on the tick thread
            self._sync._SyncObj__transport.stop_learner(member.raft)
            self.membership.finish(change)
            callback(None, InternalError(f"membership change failed: {exc}"))

    def _on_removed(self, index: int) -> None:
        """Tick thread: the leader told us our removal committed at ``index``. Serve
        nothing from now on, and refuse to start again on this data directory."""
        if self.removed_at is not None:
            return
        self.removed_at = index
        log.error(
            "this node was removed from the cluster at log index %d; it serves nothing "
            "more: stop it (docs/membership.md)",
            index,
        )
        try:
            write_removed_file(self.removed_path, index)
        except OSError as exc:
            log.error("cannot record the removal in %s: %s", self.removed_path, exc)

    def restored(self) -> bool:
        """True once this node has loaded its snapshot (dump file) and applied its
        journal up to the commit index it found at start: its state is again what it
        had before the restart. Before that the store is empty or partly replayed and
        nothing may be answered from it (a watch would start at revision 0, a read
        would say "no holder"). Any thread (one attribute)."""
        return self._restored

    def _check_restored(self) -> None:
        """Tick thread: PySyncObj loads the dump file in its first tick with a ready
        transport (``__needLoadDumpFile``), then applies the journal's committed
        entries in the same tick; tick callbacks run after both."""
        sync = self._sync
        if getattr(sync, "_SyncObj__needLoadDumpFile", False):
            return
        target = min(self._start_commit, int(sync.raftCommitIndex))
        if int(sync.raftLastApplied) >= target:
            self._restored = True
            log.info(
                "state restored: snapshot loaded, log applied to index %d (revision %d)",
                int(sync.raftLastApplied),
                self.store.revision,
            )

    def _on_tick(self) -> None:
        """Tick thread: run scheduled calls, then take PySyncObj's member set."""
        if not self._restored:
            self._check_restored()
        while self._tick_calls:
            call = self._tick_calls.popleft()
            try:
                call()
            except Exception:
                log.exception("tick-thread call failed")
        # PySyncObj's own set, not the copy ``otherNodes`` makes: refresh copies it
        # itself, and the set changes only on this thread.
        self.membership.refresh(self._sync._SyncObj__otherNodes, self.last_log_index)

    def lease_valid(self) -> bool:
        """True while this node is leader and holds a valid leader lease, so it may
        answer reads from local state (the caller also requires an applied entry of
        this term)."""
        if not self.is_leader():
            return False
        if self.guard.cluster_size == 1:
            return True
        return self.guard.lease_valid(self.term())

    def role(self) -> str:
        if self.removed_at is not None:
            return "removed"
        return "leader" if self.is_leader() else self._role

    def _on_state_changed(self, old: int, new: int) -> None:
        names = {0: "follower", 1: "candidate", 2: "leader"}
        self._role = names.get(new, str(new))
        if new != 2:
            self.guard.stepped_down()
        log.info(
            "raft role %s -> %s (term %s)",
            names.get(old, old),
            self._role,
            self._sync.raftCurrentTerm if hasattr(self, "_sync") else "?",
        )

    def close(self) -> None:
        """Stop the tick thread and close Raft connections (blocks until done)."""
        self._sync.destroy_synchronous()
