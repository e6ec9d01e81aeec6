"""One node's Raft replica over PySyncObj (``Replica``).

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

import logging
import os
from collections.abc import Callable
from typing import Any

import msgpack
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.node import TCPNode

from ..clock import Clock, SystemClock
from ..config import NodeConfig
from ..core import LeaseStore, Result
from ..errors import (
    InternalError,
    LeaderChangedError,
    RaftLeaseError,
    UnavailableError,
)
from .durable import SyncRecorder
from .journal import repair_journal, trim_torn_tail
from .leadership import LeaseGuard
from .peers import load_or_create_secret
from .transport import LeaseTransport

log = logging.getLogger("raftlease.replication")

#: Exit status of a node that cannot load its snapshot.
SNAPSHOT_LOAD_FAILED = 70


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
    """Holds the LeaseStore inside PySyncObj's replicated state. ``store_class``: the
    state machine (a test build injects a broken subclass; production never passes it)."""

    def __init__(
        self, observer: ApplyObserver | None, store_class: type[LeaseStore] = LeaseStore
    ) -> None:
        super().__init__()
        self.store_class = store_class
        self.store = store_class()
        self.observer = observer

    def _serialize(self) -> _PackedSnapshot:
        return _PackedSnapshot(self.store)

    def _deserialize(self, data: Any) -> None:
        try:
            plain = msgpack.unpackb(data, raw=False, strict_map_key=False)
            store = self.store_class.from_plain(plain)
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


def syncobj_conf(config: NodeConfig, password: str | None = None) -> SyncObjConf:
    """PySyncObj's configuration for a node (no callbacks). Shared with the
    benchmark's raw-PySyncObj baseline, so both run with the same settings.
    ``password``: the cluster's peer secret (peers.py); PySyncObj then authenticates
    and encrypts every peer frame."""
    me = config.self_node
    return SyncObjConf(
        password=password,
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
        guard_class: type[LeaseGuard] = LeaseGuard,
        transport_class: type[LeaseTransport] = LeaseTransport,
        store_class: type[LeaseStore] = LeaseStore,
        recorder: SyncRecorder | None = None,
    ) -> None:
        """``recorder``: a test build's record of what reached stable storage
        (durable.SyncRecorder). ``guard_class`` (the leader-lease bookkeeping),
        ``transport_class`` (the PySyncObj transport) and ``store_class`` (the state
        machine): a test build injects broken ones through ``raftlease.testing.node``;
        production never passes them."""
        self.config = config
        self.guard = guard_class(
            clock or SystemClock(),
            cluster_size=len(config.nodes),
            promise=config.election_timeout_min,
            rho=config.clock_drift,
        )
        config.data_dir.mkdir(parents=True, exist_ok=True)
        trim_torn_tail(config.journal_file)
        repair_journal(config.journal_file, config.dump_file)
        self._consumer = _StoreConsumer(observer, store_class)
        self._role = "follower"
        me = config.self_node
        conf = syncobj_conf(config, load_or_create_secret(config.peer_secret_path))
        conf.onStateChanged = self._on_state_changed
        peers = [DialNode(p.raft, config.dial.get(p.id, p.raft)) for p in config.peers]
        self._peers = {peer: p.id for peer, p in zip(peers, config.peers, strict=True)}
        bound = type(
            "BoundLeaseTransport",
            (transport_class,),
            {"guard": self.guard, "durability": config.durability, "recorder": recorder},
        )
        self._sync = SyncObj(me.raft, peers, conf, consumers=[self._consumer], transportClass=bound)

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
