"""The only module that imports PySyncObj.

It replicates opaque entries (msgpack bytes) through one replicated method, applies
them to the ``LeaseStore`` on PySyncObj's tick thread, and reports leader, term and
indexes. Everything PySyncObj-specific (its configuration names, its error codes, its
snapshot hooks) stays here. docs/pysyncobj.md lists what we rely on; each reliance is
guarded by a test in tests/test_pysyncobj_contract.py.

Threads: PySyncObj runs its own tick thread. ``apply`` and every callback passed to
``propose`` run on that thread and must never block or raise (an exception inside a
replicated method wedges the whole cluster, PySyncObj trap 1). Other methods are safe
to call from any thread: they read single attributes.
"""

from __future__ import annotations

import gzip
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import msgpack
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.journal import FileJournal
from pysyncobj.node import TCPNode
from pysyncobj.transport import TCPTransport

from .clock import Clock, SystemClock
from .config import NodeConfig
from .core import LeaseStore, Result
from .errors import (
    InternalError,
    LeaderChangedError,
    RaftLeaseError,
    UnavailableError,
)
from .leadership import LeaseGuard

log = logging.getLogger("raftlease.replication")

#: Exit status of a node that cannot load its snapshot.
SNAPSHOT_LOAD_FAILED = 70

#: A follower rejecting every append_entries of the leader for this long is logged.
REJECTING_WARN_AFTER = 5.0

#: Called on the tick thread with (result, error); exactly one of them is None.
ProposeCallback = Callable[[Result | None, RaftLeaseError | None], None]
#: Called on the tick thread after each applied entry with (entry, result).
ApplyObserver = Callable[[dict[str, Any], Result], None]


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
    ``__reduce__`` turns the object into plain ``bytes`` of msgpack: the dump file never
    holds a pickled object of ours, only bytes.
    """

    def __init__(self, store: LeaseStore) -> None:
        self._store = store

    def __reduce__(self) -> tuple[type[bytes], tuple[bytes]]:
        packed: bytes = msgpack.packb(self._store.to_plain(), use_bin_type=True)
        return (bytes, (packed,))


class _StoreConsumer(SyncObjConsumer):  # type: ignore[misc]
    """Holds the LeaseStore inside PySyncObj's replicated state."""

    def __init__(self, observer: ApplyObserver | None) -> None:
        super().__init__()
        self.store = LeaseStore()
        self.observer = observer

    def _serialize(self) -> _PackedSnapshot:
        return _PackedSnapshot(self.store)

    def _deserialize(self, data: Any) -> None:
        try:
            plain = msgpack.unpackb(data, raw=False, strict_map_key=False)
            store = LeaseStore.from_plain(plain)
        except Exception:
            # PySyncObj would only log this and go on with an empty state machine, and
            # such a node can even win an election and wedge the cluster. A node that
            # cannot load its snapshot must not take part at all: stop the process.
            log.critical(
                "cannot load the snapshot (%s); stopping this node. Restore its data "
                "directory, or remove it to resync from the leader while the other "
                "nodes are healthy.",
                "corrupt or from another snapshot version",
                exc_info=True,
            )
            logging.shutdown()
            os._exit(SNAPSHOT_LOAD_FAILED)
        self.store = store
        log.info(
            "restored snapshot: %d leases, revision %d, log time %d ms",
            len(self.store.leases),
            self.store.revision,
            self.store.now,
        )

    @replicated  # type: ignore[untyped-decorator]
    def apply_entry(self, data: bytes) -> Result:
        # Never raise here (PySyncObj trap 1): a raise wedges every node.
        try:
            entry = msgpack.unpackb(data, raw=False, strict_map_key=True)
        except Exception:
            log.error("undecodable log entry of %d bytes skipped", len(data))
            return {"ok": False, "code": "INTERNAL", "message": "undecodable log entry"}
        try:
            result = self.store.apply(entry)
        except Exception:  # a bug in core: report, never wedge the cluster
            log.exception("state machine raised on entry op=%r", entry.get("op"))
            return {"ok": False, "code": "INTERNAL", "message": "state machine error"}
        if self.observer is not None:
            try:
                self.observer(entry, result)
            except Exception:
                log.exception("apply observer raised")
        return result


class DialNode(TCPNode):  # type: ignore[misc]
    """A peer identified by its raft address but dialled at ``dial`` (for example a
    fault-injecting proxy). PySyncObj identifies nodes by ``address`` (sent on connect,
    compared to decide who dials) and dials ``ip``/``port``: we change only the latter."""

    def __init__(self, address: str, dial: str) -> None:
        super().__init__(address)
        host, _, port = dial.rpartition(":")
        self._dial_host = host.strip("[]")
        self._dial_port = int(port)

    @property
    def ip(self) -> str:
        return str(globalDnsResolver().resolve(self._dial_host))

    @property
    def port(self) -> int:
        return self._dial_port


# ----------------------------------------------------- follower side of AppendEntries
#
# PySyncObj's follower handling of ``append_entries`` (syncobj.py, SyncObj.
# __onMessageReceived) has defects that ``LeaseTransport`` corrects before the message
# reaches it (docs/pysyncobj.md trap 5, jepsen-style/README.md findings 1 and 2; the
# snapshot path is corrected by ``LeaseTransport._snapshot_message``):
#
# B. When ``prevLogIdx`` matches but is below the log end it deletes everything after
#    ``prevLogIdx`` and appends the message's entries, conflict or not. Raft (§5.3)
#    deletes only from the first conflicting entry (same index, other term). With
#    several messages in flight (no batching, 64 KiB per message) a late or repeated
#    message shortens the log below what the follower already acknowledged.
# A. Its rejections are absolute: ``prevLogIdx`` outside the log is answered "reset,
#    next = log end + 1", a term mismatch at ``prevLogIdx`` "reset, next =
#    prevLogIdx", and the leader sets its next index to whichever arrives last. A
#    follower whose last entries conflict with the leader's (a deposed leader's
#    uncommitted tail) answers the first probe "next = P" and the message sent behind
#    it "next = log end + 1", which undoes the step back: the leader probes the same
#    index forever. Only a snapshot (once the leader's compacted log start passes the
#    follower's end) or a change of leader ends it.


class Conflict(NamedTuple):
    """What a follower knows about its log against the leader of ``term``: its entry
    at ``at`` (of term ``our_term``) is not the leader's, so the leader should probe
    from ``hint`` (<= ``at``) while that entry is still there."""

    term: int
    at: int
    our_term: int
    hint: int


class AppendPlan(NamedTuple):
    """How to hand an ``append_entries`` to PySyncObj: ``message`` to pass on (the
    original or a rewrite), ``reply_next`` to put in PySyncObj's reply instead of its
    ``next_node_idx`` (None: leave it), the follower's ``conflict`` knowledge, and
    whether PySyncObj will accept the message (False: it rejects it)."""

    message: dict[str, Any]
    reply_next: int | None
    conflict: Conflict | None
    accepted: bool = True


def plan_append_entries(
    log: Sequence[Any], commit_index: int, message: dict[str, Any], conflict: Conflict | None
) -> AppendPlan:
    """Plan a follower's handling of a current-term ``append_entries`` that carries
    ``prevLogIdx``, so that PySyncObj's own code does what Raft §5.3 says.

    ``log`` is PySyncObj's log (entries ``(command, index, term)``, contiguous, from
    the compacted log start), ``commit_index`` the follower's. Pure: it reads ``log``
    and returns the plan. Cases, with what PySyncObj does with the plan:

    - ``prevLogIdx`` in the log with the same term (accepted): entries already in the
      log with the same term are dropped from the message and ``prevLogIdx`` moves
      past them, so PySyncObj deletes only from a real conflict. A message that adds
      nothing is passed with ``prevLogIdx`` = log end (nothing deleted) and its reply
      is set back to what the message verified (end of its entries + 1), its
      ``commit_index`` capped there (Raft: min(leaderCommit, last new entry)).
    - term mismatch at ``prevLogIdx``: rejected as before, but the reply asks the
      leader to probe from the first entry of our conflicting term (never at or below
      our commit index), and the conflict is remembered.
    - ``prevLogIdx`` outside the log, or None (the leader has no entry there: our log
      is longer than its): rejected as before; the reply is log end + 1, lowered to
      what the leader can hold (its commit index + 1) when ``prevLogIdx`` is None,
      and to a remembered conflict's hint while that conflict stands, so a rejection
      of a message sent behind a probe no longer undoes the step back (bug A).
    """
    first, last = log[0][1], log[-1][1]

    def term_at(index: int) -> int:
        return int(log[index - first][2])

    term = message["term"]
    if (
        conflict is not None
        and conflict.term == term
        and first <= conflict.at <= last
        and term_at(conflict.at) == conflict.our_term
    ):
        standing: Conflict | None = conflict
    else:
        standing = None
    prev = message.get("prevLogIdx")
    if not isinstance(prev, int) or prev < first or prev > last:
        # PySyncObj: rejected, "reset, next = last + 1".
        nxt = last + 1
        if prev is None:
            leader_commit = message.get("commit_index")
            held = max(commit_index, leader_commit if isinstance(leader_commit, int) else 0)
            nxt = min(nxt, max(held + 1, first + 1))
        if standing is not None:
            nxt = min(nxt, standing.hint)
        return AppendPlan(message, nxt if nxt != last + 1 else None, standing, False)
    if term_at(prev) != message.get("prevLogTerm"):
        # PySyncObj: rejected, "reset, next = prev". Probe from the first entry of our
        # term there instead (bounded by what is certainly the leader's: committed
        # entries and the compacted start), and remember it.
        our_term = term_at(prev)
        floor = max(commit_index + 1, first + 1)
        hint = prev
        while hint > floor and term_at(hint - 1) == our_term:
            hint -= 1
        hint = min(prev, max(hint, floor))
        if standing is not None:
            hint = min(hint, standing.hint)
        conflict = Conflict(term, prev, our_term, hint)
        return AppendPlan(message, hint if hint != prev else None, conflict, False)
    if "transmission" in message:
        return AppendPlan(message, None, standing)  # one large entry: left to PySyncObj
    entries = message.get("entries") or []
    if any(
        not isinstance(e, tuple | list) or len(e) != 3 or e[1] != prev + 1 + i
        for i, e in enumerate(entries)
    ):
        return AppendPlan(message, None, standing)  # not the shape we know: untouched
    skip = 0
    while (
        skip < len(entries)
        and entries[skip][1] <= last
        and term_at(entries[skip][1]) == entries[skip][2]
    ):
        skip += 1
    if skip < len(entries):
        # New entries from entries[skip]: appended at the log end, or replacing ours
        # from a real conflict (PySyncObj deletes from there).
        if skip == 0:
            return AppendPlan(message, None, standing)
        at = prev + skip
        rewritten = dict(message, prevLogIdx=at, prevLogTerm=term_at(at), entries=entries[skip:])
        return AppendPlan(rewritten, None, standing)
    end = prev + len(entries)  # every entry is already ours: nothing to delete
    if end == last and not entries:
        return AppendPlan(message, None, standing)
    rewritten = dict(message, prevLogIdx=last, prevLogTerm=term_at(last), entries=[])
    leader_commit = message.get("commit_index")
    if end < last and isinstance(leader_commit, int) and leader_commit > end:
        rewritten["commit_index"] = end
    return AppendPlan(rewritten, end + 1 if end < last else None, standing)


def snapshot_is_behind(log: Sequence[Any], dump: bytes) -> bool:
    """True if a snapshot received from the leader (PySyncObj's gzip+pickle dump: data,
    last entry, the entry before, cluster) ends inside ``log``, at an entry of the same
    term, before the log end. PySyncObj would install it anyway and clear the log
    (``__loadDumpFile(clearJournal=True)``), dropping entries the follower may already
    have acknowledged; Raft (§7) keeps the entries that follow it. Undecodable: False
    (PySyncObj handles it as before)."""
    try:
        entry = pysyncobj_pickle.loads(gzip.decompress(dump))[1]
        index, term = int(entry[1]), int(entry[2])
    except Exception:
        return False
    first, last = log[0][1], log[-1][1]
    if index >= last:
        return False
    if index < first:
        return True  # older than our own compacted (committed) start
    return bool(log[index - first][2] == term)


class LeaseTransport(TCPTransport):  # type: ignore[misc]
    """PySyncObj's TCP transport plus the leader-lease protocol (see leadership.py).

    Outgoing ``append_entries`` carry the leader's clock at sending (``rl_s``); replies
    (``next_node_idx``) echo the stamp of the last accepted ``append_entries`` of the
    current leader (``rl_et``, ``rl_e``) and carry the follower's clock (``rl_t``).
    ``request_vote`` is dropped, in both directions, while this node's vote promise
    holds, and by a leader while a majority acknowledges it (so a node that cannot
    hear the leader cannot depose it). A node whose term grew while it was cut off
    answers the leader's stale-term ``append_entries`` with a term notice after the
    heal, the leader steps down and the cluster re-elects (liveness).
    ``apply_command`` (PySyncObj forwarding a proposal to the leader) is never sent.
    On a follower, a current-term ``append_entries`` is corrected before PySyncObj
    handles it (``plan_append_entries``, ``_snapshot_message``: no truncation without
    a conflict, rejections that keep the leader's step back, no commit or snapshot
    install the message does not justify).
    Runs on the tick thread. ``guard`` is bound by ``Replica`` through a subclass.
    """

    guard: LeaseGuard
    _bumped: dict[str, float]
    #: Follower side: see plan_append_entries.
    _conflict: Conflict | None
    _reply_next: int | None
    _snapshot_in: bytearray | None
    _rejecting: tuple[float, float] | None  # (since, last warned)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._bumped = {}
        self._conflict = None
        self._reply_next = None
        self._snapshot_in = None
        self._rejecting = None
        super().__init__(*args, **kwargs)

    def send(self, node: Any, message: Any) -> bool:
        if isinstance(message, dict):
            kind = message.get("type")
            if kind == "append_entries":
                message["rl_s"] = self.guard.stamp_outgoing(message["term"])
            elif kind == "next_node_idx":
                if self._reply_next is not None:
                    # PySyncObj's reply to the append_entries being handled (plan).
                    message["next_node_idx"] = self._reply_next
                    self._reply_next = None
                echo = self.guard.echo_for(node.id)
                if echo is not None:
                    message["rl_et"], message["rl_e"] = echo
                message["rl_t"] = self.guard.clock.monotonic()
            elif kind == "request_vote" and self.guard.refuse_vote():
                return False  # our own promise also forbids running for election
            elif kind == "apply_command":
                # PySyncObj forwards a proposal to the leader when this node lost
                # leadership between our check and the tick thread. Never forward: the
                # entry was stamped with our (now stale) log time. Fail it at once,
                # definitely (it was not sent), through PySyncObj's own reply path.
                request_id = message.get("request_id")
                if request_id is not None:
                    super()._onMessageReceived(
                        node,
                        {
                            "type": "apply_command_response",
                            "request_id": request_id,
                            "error": FAIL_REASON.REQUEST_DENIED,
                        },
                    )
                return False
        return bool(super().send(node, message))

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        if isinstance(message, dict):
            kind = message.get("type")
            sync = self._syncObj
            if kind == "request_vote":
                if message.get("rl_bump"):
                    pass  # "your term is stale": always let PySyncObj see it
                elif sync._isLeader():
                    # Leader stickiness (CheckQuorum): while a majority acknowledges
                    # us, a candidate that cannot hear us must not depose us.
                    if self.guard.has_quorum():
                        return
                elif self.guard.refuse_vote():
                    return
            elif kind == "append_entries":
                term = message.get("term")
                if isinstance(term, int):
                    if term < sync.raftCurrentTerm:
                        self._tell_stale_leader(node, sync.raftCurrentTerm)
                    self.guard.on_append_entries(
                        node.id, term, sync.raftCurrentTerm, message.get("rl_s")
                    )
                    if (
                        term >= sync.raftCurrentTerm
                        and "prevLogIdx" in message
                        and message.get("transmission") in (None, "finish")
                    ):
                        plan = plan_append_entries(
                            sync._SyncObj__raftLog, sync.raftCommitIndex, message, self._conflict
                        )
                        self._conflict = plan.conflict
                        self._reply_next = plan.reply_next
                        self._note_rejection(node, term, plan)
                        try:
                            super()._onMessageReceived(node, plan.message)
                        finally:
                            self._reply_next = None
                        return
                    if term >= sync.raftCurrentTerm and "prevLogIdx" not in message:
                        message = self._snapshot_message(sync, message)
            elif kind == "next_node_idx" and sync._isLeader():
                self.guard.on_reply(
                    node.id, message.get("rl_et"), message.get("rl_e"), message.get("rl_t")
                )
        super()._onMessageReceived(node, message)

    def _note_rejection(self, node: Any, term: int, plan: AppendPlan) -> None:
        """Warn while this follower keeps rejecting the leader's log (finding 1 of
        jepsen-style/README.md was a follower stuck this way for tens of seconds)."""
        now = self.guard.clock.monotonic()
        if plan.accepted:
            if self._rejecting is not None and now - self._rejecting[0] >= REJECTING_WARN_AFTER:
                log.warning("taking the leader's log again after %.1f s", now - self._rejecting[0])
            self._rejecting = None
            return
        if self._rejecting is None:
            self._rejecting = (now, now)
        elif now - self._rejecting[1] >= REJECTING_WARN_AFTER:
            self._rejecting = (self._rejecting[0], now)
            log_ = self._syncObj._SyncObj__raftLog
            log.warning(
                "rejecting leader %s's log (term %d) for %.1f s: its prevLogIdx %s, our log "
                "%d..%d (last term %d), answering next %s",
                node.id,
                term,
                now - self._rejecting[0],
                plan.message.get("prevLogIdx"),
                log_[0][1],
                log_[-1][1],
                log_[-1][2],
                plan.reply_next,
            )

    def _snapshot_message(self, sync: Any, message: dict[str, Any]) -> dict[str, Any]:
        """An ``append_entries`` of the snapshot path (no ``prevLogIdx``: a chunk of
        the leader's dump, or ``serialized`` None while it has none ready).

        PySyncObj sets the follower's commit index to min(leader's, own log end) after
        any such message, though it verified none of the follower's entries: a deposed
        leader whose uncommitted tail the new leader cannot probe (it is behind the
        leader's compacted log start) would apply that tail, and answer its own
        clients' proposals in it with success. Such a message therefore commits
        nothing here (the installed snapshot itself is committed; later entries are
        committed by the messages that verify them).

        A dump that ends inside our log at an entry of the same term (a repeat sent
        after a stale rejection) is not installed (``snapshot_is_behind``): the
        message goes on with ``serialized`` None, and the leader, which already moved
        its next index past the dump, verifies our log with its next message."""
        out = dict(message)
        leader_commit = message.get("commit_index")
        if isinstance(leader_commit, int) and leader_commit > sync.raftCommitIndex:
            out["commit_index"] = sync.raftCommitIndex
        chunk = message.get("serialized")
        if isinstance(chunk, tuple | list) and len(chunk) == 3:
            data, is_first, is_last = chunk
            if is_first:
                self._snapshot_in = bytearray()
            if self._snapshot_in is not None and isinstance(data, bytes | bytearray):
                self._snapshot_in += data
            if is_last:
                received, self._snapshot_in = self._snapshot_in, None
                if received is not None and snapshot_is_behind(
                    sync._SyncObj__raftLog, bytes(received)
                ):
                    log.info("snapshot from the leader ends inside our log: not installed")
                    out["serialized"] = None
        return out

    def _tell_stale_leader(self, node: Any, term: int) -> None:
        """Answer an ``append_entries`` of an older term (PySyncObj ignores it
        silently) with our term, so a leader that cannot otherwise learn it steps down.
        This is how a node whose term grew while it was cut off rejoins: leaders and
        followers drop its vote requests, but not this notice. It carries an empty log
        position, so it never wins a vote. At most one per peer per heartbeat."""
        now = self.guard.clock.monotonic()
        if now - self._bumped.get(node.id, float("-inf")) < self.guard.promise / 4:
            return
        self._bumped[node.id] = now
        super().send(
            node,
            {
                "type": "request_vote",
                "term": term,
                "last_log_index": 0,
                "last_log_term": 0,
                "rl_bump": True,
            },
        )


def repair_journal(journal_path: Path, dump_path: Path) -> int:
    """Make a journal consistent with a newer snapshot, before PySyncObj loads them.

    PySyncObj compacts by (1) writing the snapshot in a forked child, then, a tick
    later, (2) rewriting the journal to start at the snapshot's last two entries. A
    crash between the two leaves a journal whose head is older than the snapshot, and
    PySyncObj's loader then *clears the whole journal*, dropping every entry after the
    snapshot: acknowledged grants lost (reproduced with a SIGKILL of all nodes right
    after a burst of writes). Here, when the journal holds the snapshot's two entries
    further in, we drop what precedes them (atomically: a new file renamed over the
    old), so the loader keeps the tail. Returns how many entries were dropped.
    """
    if not journal_path.exists() or not dump_path.exists():
        return 0
    try:
        with gzip.open(dump_path, "rb") as f:
            dump = pysyncobj_pickle.load(f)
        before_last, last = dump[2], dump[1]
    except Exception:
        log.exception("cannot read snapshot %s; leaving the journal alone", dump_path)
        return 0
    journal = FileJournal(str(journal_path))
    try:
        entries = [journal[i] for i in range(len(journal))]
    finally:
        journal._destroy()
    if len(entries) >= 2 and entries[0] == before_last and entries[1] == last:
        return 0
    for k in range(len(entries) - 1):
        if entries[k] == before_last and entries[k + 1] == last:
            break
    else:
        return 0  # the loader's own handling applies (snapshot newer than all entries)
    tmp = journal_path.with_name(journal_path.name + ".repair")
    tmp.unlink(missing_ok=True)
    fresh = FileJournal(str(tmp))
    try:
        for command, idx, term in entries[k:]:
            fresh.add(command, idx, term)
    finally:
        fresh._destroy()
    os.replace(tmp, journal_path)
    log.warning(
        "journal head was older than the snapshot (crash during log compaction): "
        "dropped %d entries before it, kept %d after",
        k,
        len(entries) - k,
    )
    return k


def syncobj_conf(config: NodeConfig) -> SyncObjConf:
    """PySyncObj's configuration for a node (no callbacks). Shared with the
    benchmark's raw-PySyncObj baseline, so both run with the same settings."""
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
        dynamicMembershipChange=False,
    )


class Replica:
    """One node's Raft replica of the lease store."""

    def __init__(
        self,
        config: NodeConfig,
        observer: ApplyObserver | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.guard = LeaseGuard(
            clock or SystemClock(),
            cluster_size=len(config.nodes),
            promise=config.election_timeout_min,
            rho=config.clock_drift,
            planted=config.planted_bug,
        )
        config.data_dir.mkdir(parents=True, exist_ok=True)
        repair_journal(config.journal_file, config.dump_file)
        self._consumer = _StoreConsumer(observer)
        self._role = "follower"
        me = config.self_node
        conf = syncobj_conf(config)
        conf.onStateChanged = self._on_state_changed
        peers = [DialNode(p.raft, config.dial.get(p.id, p.raft)) for p in config.peers]
        self._peers = {peer: p.id for peer, p in zip(peers, config.peers, strict=True)}
        transport_class = type("BoundLeaseTransport", (LeaseTransport,), {"guard": self.guard})
        self._sync = SyncObj(
            me.raft, peers, conf, consumers=[self._consumer], transportClass=transport_class
        )

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

        self._consumer.apply_entry(data, callback=done)

    # ----------------------------------------------------------------- state

    @property
    def store(self) -> LeaseStore:
        """The local replica of the state. Read it only from the tick thread, or
        accept that a read from another thread sees some recent applied state."""
        store: LeaseStore = self._consumer.store
        return store

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

    def last_applied(self) -> int:
        return int(self._sync.raftLastApplied)

    def is_ready(self) -> bool:
        """True once the node has applied the log up to the leader's commit index
        seen at start (PySyncObj's onReady)."""
        return bool(self._sync.isReady())

    def connected_peers(self) -> list[str]:
        """Ids of the peers with a live Raft connection (as PySyncObj sees it)."""
        return [pid for peer, pid in self._peers.items() if self._sync.isNodeConnected(peer)]

    def lease_valid(self) -> bool:
        """True while this node is leader and holds a valid leader lease, so it may
        answer reads from local state (the caller also requires an applied entry of
        this term)."""
        if not self.is_leader():
            return False
        if len(self.config.nodes) == 1:
            return True
        return self.guard.lease_valid(self.term())

    def role(self) -> str:
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
