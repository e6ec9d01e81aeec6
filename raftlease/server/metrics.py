"""The metrics of one node, in one module (docs/operations.md lists each with its meaning).

Two kinds, as the Prometheus client guidelines advise:

* **Read at scrape time** (``NodeCollector``): everything that is already state in the
  node or its replica (leases, lease sessions, waiters, Raft term and indexes, the
  leader lease, the clock-rate estimates of peers, connections, snapshot file, journal
  syncs). Nothing is kept up to date on the hot path for them.
* **Counted where the event happens** (``NodeMetrics``): request latencies and error
  codes (event loop, after each answer), lease events and applied batch sizes (the
  tick thread, in the apply observer: the same on every node, since they follow from
  applied entries), the commit latency of proposals (the tick thread, in the proposal
  callback), reads by how they were served (event loop), leader changes seen (sampled
  by ``watch_leader`` on the event loop).

Every metric lives in a per-node ``CollectorRegistry`` (never the process-global one:
a test process may hold several nodes). Labels are bounded: an operation from the
protocol's table, an error code from the registry, a lease event type, a peer id from
the membership, a task queue among the ``metrics_max_queues`` deepest (the rest summed
as ``queue="_other"``); never a key, an owner, a lease id or a principal.

Extension point: another part of the node (task queues, for one) registers its own
collector with ``NodeMetrics.register(collector)``; a collector is any object with a
``collect()`` that yields metric families read from state at scrape time.

Threads: ``observe_*`` methods are safe from any thread (prometheus-client's values
take a lock); ``NodeCollector.collect`` runs on the event loop while the tick thread
may apply entries, so it reads only sizes and scalars, which are atomic in CPython.
Nothing here blocks or raises on the hot path.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import importlib.metadata
import os
import platform
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Protocol

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .._version import __version__
from ..config import NodeConfig
from ..core.task_records import COMPLETED, QueueState
from ..core.task_state import TaskState
from ..errors import CODES
from ..protocol import OPS
from ..replication import Replica
from .budget_metrics import BudgetMetrics

#: Journal sync buckets (seconds): a page-cache sync takes tens of microseconds, an SSD's
#: fdatasync a few hundred, a spinning disk's or a busy cloud volume's tens of ms.
SYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

#: Request latency buckets (seconds): a lease read answered from memory takes well
#: under a millisecond, a write one fsynced Raft round trip, a long-poll up to its wait.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

#: Apply time of one log entry (seconds): tens of microseconds for one request.
APPLY_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.1)

#: Requests per replicated log entry (server/proposer.py caps a batch at 64).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)

#: Lease events of the state machine (core/store.py) that have a counter of their own.
LEASE_EVENT_COUNTERS = {
    "grant": (
        "raftlease_lease_grants",
        "Leases granted (applied grants, queued handoffs included).",
    ),
    "renew": (
        "raftlease_lease_renewals",
        "Lease renewals applied (one answered from the leader's memory counts when its "
        "extend entry is applied, once for all renewals of that lease before it).",
    ),
    "release": ("raftlease_lease_releases", "Leases released by their holder."),
    "expire": ("raftlease_lease_expiries", "Leases that expired (their TTL or session ran out)."),
}

#: The label value for an operation outside the protocol's table (a hostile request).
OTHER_OP = "other"

#: The label value summing the task queues not shown one by one (beyond
#: ``metrics_max_queues``). A queue name may be any string, so a queue may be named
#: "_other" too: it is then shown under a name with a suffix (``QueueCollector``).
OTHER_QUEUE = "_other"

#: Task states in ``raftlease_queue_tasks{state}``.
TASK_STATES = ("ready", "delayed", "claimed", "dead", COMPLETED)

#: Counters of the task queues' events (``TaskState.totals`` and ``QueueState.tally``):
#: key -> (per-queue family, all-queues family, what it counts).
QUEUE_COUNTERS = {
    "claims": (
        "raftlease_queue_claims",
        "raftlease_task_claims",
        "attempts started (claims granted, a waiting claim's included)",
    ),
    "completions": (
        "raftlease_queue_completions",
        "raftlease_task_completions",
        "completions accepted",
    ),
    "expiries": (
        "raftlease_queue_expiries",
        "raftlease_task_expiries",
        "attempts that timed out (no heartbeat within the TTL, no progress within "
        "progress_timeout, or their lease session ended)",
    ),
    "retries": (
        "raftlease_queue_retries",
        "raftlease_task_retries",
        "tasks scheduled for another attempt (after a failed or timed-out attempt with "
        "attempts left, or a dead letter's retry)",
    ),
    "dead_letters": (
        "raftlease_queue_dead_letters",
        "raftlease_task_dead_letters",
        "tasks moved to the dead-letter list (attempts used up, or deadline passed)",
    ),
}


def _pysyncobj_version() -> str:
    try:
        return importlib.metadata.version("pysyncobj")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class ExtraCollector(Protocol):
    """What ``NodeMetrics.register`` accepts: prometheus-client's collector protocol."""

    def collect(self) -> Iterable[Any]: ...


@dataclass(frozen=True)
class NodeView:
    """How the collector reads a node (callables, so this module never imports the
    server it observes): the replica (None while starting or recovering), the number
    of open client connections, whether lease reads are allowed now."""

    config: NodeConfig
    replica: Callable[[], Replica | None]
    connections: Callable[[], int]
    lease_reads: Callable[[], bool]
    admin_connections: Callable[[], int] = lambda: 0
    #: The event loop's lag (seconds, median of the last second) and whether the node
    #: refuses new lease sessions for it (server/overload.py).
    loop_lag: Callable[[], tuple[float, bool]] = lambda: (0.0, False)


class NodeMetrics:
    """The metrics of one node and the registry that exposes them."""

    def __init__(self, view: NodeView) -> None:
        # No ``*_created`` series beside every counter and histogram: Prometheus needs
        # none of them, and a scrape would carry one per label set. (A process-wide
        # switch of prometheus-client; a node process has no other metrics.)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.view = view
        self.registry = CollectorRegistry(auto_describe=False)
        registry = self.registry
        self.request_seconds = Histogram(
            "raftlease_request_duration_seconds",
            "Time from a request's arrival to its answer being written, by operation "
            "(watch streams are not timed).",
            ["op"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.request_errors = Counter(
            "raftlease_request_errors",
            "Requests answered with an error (refusals included), by operation and code.",
            ["op", "code"],
            registry=registry,
        )
        self.connections_closed = Counter(
            "raftlease_client_connections_closed",
            "Client connections refused or closed by a connection limit, by the limit "
            "(max_connections, max_connections_per_address, max_unauthenticated_connections, "
            "evicted: closed to admit another address's, auth_timeout, frame_timeout, "
            "idle_timeout, max_conn_output: its answers stayed unread).",
            ["limit"],
            registry=registry,
        )
        self.heap_trims = Counter(
            "raftlease_heap_trims",
            "Returns of free heap pages to the kernel (glibc malloc_trim, every "
            "heap_trim_interval seconds).",
            registry=registry,
        )
        # Shared budgets (server/budget_metrics.py): their own module and block.
        self.budgets = BudgetMetrics(registry, view.replica)
        self.keepalives_from_memory = Counter(
            "raftlease_keepalives_from_memory",
            "Lease renewals and session keep-alives this node answered from its memory as "
            "leader (keepalives = memory); they reach the log later, in extend entries.",
            registry=registry,
        )
        self.heap_trim_seconds = Gauge(
            "raftlease_heap_trim_seconds",
            "How long the last heap trim held the allocator (seconds).",
            registry=registry,
        )
        self.lease_events = {
            kind: Counter(name, help_text, registry=registry)
            for kind, (name, help_text) in LEASE_EVENT_COUNTERS.items()
        }
        self.store_events = Counter(
            "raftlease_store_events",
            "Every event of applied entries (grant, renew, release, expire, transfer, "
            "proclaim, dequeue, session_end, jump), by type.",
            ["type"],
            registry=registry,
        )
        self.batch_size = Histogram(
            "raftlease_apply_batch_requests",
            "Requests carried by each applied log entry (one batch entry carries the "
            "requests of one event-loop turn of the leader).",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.apply_seconds = Histogram(
            "raftlease_apply_duration_seconds",
            "Time the state machine took to apply one log entry (a batch entry applies "
            "all its requests).",
            buckets=APPLY_BUCKETS,
            registry=registry,
        )
        self.commit_seconds = Histogram(
            "raftlease_proposal_commit_seconds",
            "On the leader: from handing an entry to Raft to its result (replication to "
            "a majority, journal sync, apply).",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.reads = Counter(
            "raftlease_reads",
            "Reads by how they were served: lease (leader's memory under its leader "
            "lease), stale (any node's local state), log (a read entry through Raft).",
            ["served"],
            registry=registry,
        )
        self.journal_sync_seconds = Histogram(
            "raftlease_journal_sync_duration_seconds",
            "Time one journal sync (fdatasync, and msync where needed) took: the disk's "
            "share of every write's latency (etcd's wal_fsync_duration_seconds).",
            buckets=SYNC_BUCKETS,
            registry=registry,
        )
        build = Gauge(
            "raftlease_build_info",
            "Always 1; the labels say which raftlease, Python and PySyncObj this node runs.",
            ["version", "python", "pysyncobj"],
            registry=registry,
        )
        build.labels(__version__, platform.python_version(), _pysyncobj_version()).set(1)
        # The client library's standard collectors (process_*: CPU, memory, open file
        # descriptors, start time; python_*: the interpreter and its garbage collector),
        # in this registry too: the process-global one is never exposed.
        for standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            registry.register(standard)
        self.leader_changes = Counter(
            "raftlease_leader_changes_seen",
            "Times this node saw the leader change (sampled every heartbeat interval).",
            registry=registry,
        )
        registry.register(NodeCollector(view))
        # Children resolved once: labels() takes a lock and a dict lookup per call.
        self._latency: dict[str, Any] = {}
        self._reads = {kind: self.reads.labels(kind) for kind in ("lease", "stale", "log")}
        self._events: dict[str, Any] = {}

    def register(self, collector: ExtraCollector) -> None:
        """Add a collector read at scrape time (the extension point for task queues)."""
        self.registry.register(collector)

    # ----------------------------------------------------------- events

    def observe_request(self, op: object, seconds: float, code: str | None) -> None:
        """Event loop, after each answer. ``code``: the error code, None on success."""
        name = op if isinstance(op, str) and op in OPS else OTHER_OP
        if name != "watch":
            child = self._latency.get(name)
            if child is None:
                child = self._latency[name] = self.request_seconds.labels(name)
            child.observe(seconds)
        if code is not None:
            self.request_errors.labels(name, code if code in CODES else "INTERNAL").inc()

    def observe_read(self, served: str) -> None:
        """Event loop: a read served ``lease``, ``stale`` or ``log``."""
        self._reads[served].inc()

    def observe_applied(
        self, entry: dict[str, Any], events: list[dict[str, Any]], seconds: float
    ) -> None:
        """Tick thread, after each applied entry; ``seconds``: its apply time."""
        self.apply_seconds.observe(seconds)
        inner = entry.get("entries")
        self.batch_size.observe(len(inner) if isinstance(inner, list) else 1)
        for event in events:
            kind = str(event.get("type"))
            counter = self.lease_events.get(kind)
            if counter is not None:
                counter.inc()
            child = self._events.get(kind)
            if child is None:  # a few kinds, from core/store.py's fixed set
                child = self._events[kind] = self.store_events.labels(kind)
            child.inc()

    def observe_commit(self, seconds: float) -> None:
        """Tick thread, when a proposal's result arrives on the leader."""
        self.commit_seconds.observe(seconds)

    async def watch_leader(self, interval: float) -> None:
        """Event loop task: count leader changes this node sees (a new leader id, not
        its absence during an election). Runs until cancelled."""
        last: str | None = None
        while True:
            await asyncio.sleep(interval)
            replica = self.view.replica()
            if replica is None:
                continue
            leader = replica.leader_raft_addr()
            if leader is not None and leader != last:
                if last is not None:
                    self.leader_changes.inc()
                last = leader


def _gauge(name: str, doc: str, value: float, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels) or None)
    if not list(labels):
        family.add_metric([], value)
    return family


def queue_families(
    tasks: TaskState, now: int, shown: int
) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The task queues' families, read from the replicated state (the same on every
    node that has applied the same log; nothing here is counted by the leader alone).

    Bounded cardinality: the ``shown`` queues with the most open tasks (ready, delayed,
    claimed, dead: ``QueueState.depth``) get their own ``queue`` label; every other queue
    is summed into ``queue="_other"`` (gauges only: a sum over a changing set of queues
    is not a counter; the all-queues counters ``raftlease_task_*_total`` cover them). So
    a client that creates a million queue names adds no series, only one pass over the
    queues per scrape (heapq.nlargest with a C key: 80-120 ms of the event loop per
    million queues, measured on 2 cores).

    Called on the event loop while the tick thread applies entries: it reads sizes,
    scalars and single dict items (atomic in CPython), and a list copy of the queues
    (``list(dict.values())`` holds the GIL throughout). Raises nothing."""
    queues = list(tasks.queues.values())
    top: list[QueueState] = heapq.nlargest(shown, queues, key=attrgetter("depth"))
    tasks_fam = GaugeMetricFamily(
        "raftlease_queue_tasks",
        "Tasks of a task queue by state (ready, delayed: waiting for a delay or backoff, "
        "claimed: in flight, dead: dead-lettered, completed: retained results); "
        'queue="_other" sums the queues beyond metrics_max_queues.',
        labels=["queue", "state"],
    )
    waiting = GaugeMetricFamily(
        "raftlease_queue_waiting_claims",
        "Claims waiting in a task queue for a task they can take.",
        labels=["queue"],
    )
    oldest = GaugeMetricFamily(
        "raftlease_queue_oldest_ready_age_seconds",
        "Log-time seconds since the ready task that has waited longest became ready "
        "(put, delay or backoff over, released, retried); absent without ready tasks.",
        labels=["queue"],
    )
    counters = {
        key: CounterMetricFamily(
            name, f"Per task queue: {doc} (since the queue was created).", labels=["queue"]
        )
        for key, (name, _, doc) in QUEUE_COUNTERS.items()
    }
    for queue in sorted(top, key=attrgetter("name")):
        label = queue.name if queue.name != OTHER_QUEUE else OTHER_QUEUE + "_"
        counts = queue.counts
        for state in TASK_STATES:
            tasks_fam.add_metric([label, state], counts.get(state, 0))
        waiting.add_metric([label], len(queue.claimers))
        since = tasks.oldest_ready(queue)
        if since is not None:
            oldest.add_metric([label], max(0, now - since) / 1000)
        tally = queue.tally
        for key, family in counters.items():
            value = queue.claims_total if key == "claims" else tally.get(key, 0)
            family.add_metric([label], value)
    if len(queues) > len(top):
        # The rest: the totals minus the queues shown (O(1) more per shown queue).
        by_state = dict(tasks.by_state)
        # (No oldest age for "_other": it would take a pass over every other queue.)
        other_claims = len(tasks.claims)
        for queue in top:
            for state in TASK_STATES:
                by_state[state] = by_state.get(state, 0) - queue.counts.get(state, 0)
            other_claims -= len(queue.claimers)
        for state in TASK_STATES:
            tasks_fam.add_metric([OTHER_QUEUE, state], max(0, by_state.get(state, 0)))
        waiting.add_metric([OTHER_QUEUE], max(0, other_claims))
    yield tasks_fam
    yield waiting
    yield oldest
    yield from counters.values()
    totals = tasks.totals
    for key, (_, name, doc) in QUEUE_COUNTERS.items():
        total = CounterMetricFamily(
            name,
            f"All task queues: {doc}, since the cluster began (kept across restarts "
            "and snapshots).",
        )
        total.add_metric([], totals.get(key, 0))
        yield total


class NodeCollector(Collector):
    """Reads the node's state at scrape time (event loop)."""

    def __init__(self, view: NodeView) -> None:
        self.view = view

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        view = self.view
        config = view.config
        yield _gauge("raftlease_client_connections", "Open client connections.", view.connections())
        yield _gauge(
            "raftlease_admin_connections",
            "Open connections to the admin endpoint.",
            view.admin_connections(),
        )
        lag, overloaded = view.loop_lag()
        yield _gauge(
            "raftlease_event_loop_lag_seconds",
            "How late the node's event loop runs: the median, over the last second, of "
            "how late a 50 ms timer fired (server/overload.py).",
            lag,
        )
        yield _gauge(
            "raftlease_overloaded",
            "1 while the event loop lag is above overload_lag and the node refuses new "
            "lease sessions (OVERLOADED); 0 otherwise.",
            1 if overloaded else 0,
        )
        replica = view.replica()
        yield _gauge(
            "raftlease_node_up",
            "1 once the node has joined Raft; 0 while it starts or waits out an unclean stop.",
            0 if replica is None else 1,
        )
        if replica is None:
            return
        yield from self._store(replica)
        yield from queue_families(replica.store.tasks, replica.store.now, config.metrics_max_queues)
        yield from self._raft(replica, config)
        yield from self._leadership(replica)
        yield from self._files(replica, config)

    def _store(self, replica: Replica) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        store = replica.store
        yield _gauge("raftlease_leases_live", "Leases held now.", len(store.leases))
        yield _gauge(
            "raftlease_lease_sessions_live", "Lease sessions open now.", len(store.lease_sessions)
        )
        yield _gauge(
            "raftlease_waiters_queued", "Acquires waiting in key queues.", len(store.waiting)
        )
        yield _gauge("raftlease_keys_held", "Keys with at least one holder.", len(store.holders))
        yield _gauge(
            "raftlease_clients",
            "Client ids in the dedup table (idempotent retries).",
            len(store.clients),
        )
        yield _gauge(
            "raftlease_revision", "The store's revision (the last fencing token).", store.revision
        )
        yield _gauge(
            "raftlease_token_ceiling", "Fencing tokens reserved up to (durable).", store.ceiling
        )
        yield _gauge(
            "raftlease_log_time_seconds", "Log time of the last applied entry.", store.now / 1000
        )
        expired = CounterMetricFamily(
            "raftlease_store_expired",
            "Leases expired since the cluster began (from the state machine: the same on "
            "every node, kept across restarts and snapshots).",
        )
        expired.add_metric([], store.expired_total)
        yield expired

    def _raft(
        self, replica: Replica, config: NodeConfig
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        term = replica.term()
        commit = replica.commit_index()
        applied = replica.last_applied()
        yield _gauge("raftlease_raft_term", "This node's current Raft term.", term)
        yield _gauge("raftlease_raft_commit_index", "Highest log index known committed.", commit)
        yield _gauge("raftlease_raft_applied_index", "Highest log index applied.", applied)
        yield _gauge(
            "raftlease_raft_last_log_index",
            "Index of the last entry in the log.",
            replica.last_log_index(),
        )
        yield _gauge(
            "raftlease_raft_apply_lag_entries",
            "Committed entries not yet applied (commit index minus applied index).",
            max(0, commit - applied),
        )
        yield _gauge(
            "raftlease_raft_is_leader",
            "1 while this node is the leader.",
            1 if replica.is_leader() else 0,
        )
        yield _gauge(
            "raftlease_raft_has_leader",
            "1 while this node knows a leader.",
            0 if replica.leader_raft_addr() is None else 1,
        )
        yield _gauge(
            "raftlease_raft_peers_connected",
            "Peers with a live Raft connection.",
            len(replica.connected_peers()),
        )
        yield _gauge(
            "raftlease_raft_members",
            "Members in the configuration (as the log has changed it).",
            len(replica.members()),
        )
        yield _gauge(
            "raftlease_raft_current_term_applied",
            "1 once this node has applied an entry of its current term.",
            1 if replica.store.term == term else 0,
        )

    def _leadership(self, replica: Replica) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        guard = replica.guard.snapshot()
        yield _gauge(
            "raftlease_leader_lease_remaining_seconds",
            "On the leader: how long its leader lease still allows local reads (0 otherwise).",
            float(guard.get("lease_remaining") or 0.0),
        )
        yield _gauge(
            "raftlease_lease_reads_allowed",
            "1 while this node may answer linearizable reads from memory.",
            1 if self.view.lease_reads() else 0,
        )
        heard = guard.get("heard_from_leader_ago")
        if heard is not None:
            yield _gauge(
                "raftlease_heard_from_leader_seconds",
                "On a follower: seconds since the last append from the leader.",
                float(heard),
            )
        yield _gauge(
            "raftlease_clock_drift_alarm",
            "1 while some peer's clock rate differs from ours by more than clock_drift.",
            1 if guard.get("drift_alarm") else 0,
        )
        drift = GaugeMetricFamily(
            "raftlease_peer_clock_rate_error",
            "Measured clock-rate difference of a peer against this node (0.01 = 1 %).",
            labels=["peer"],
        )
        alarms = GaugeMetricFamily(
            "raftlease_peer_clock_drift_alarm",
            "1 while this peer's measured rate error exceeds clock_drift.",
            labels=["peer"],
        )
        for peer, state in sorted((guard.get("drift") or {}).items()):
            rate = state.get("rate_error")
            if rate is not None:
                drift.add_metric([str(peer)], float(rate))
            alarms.add_metric([str(peer)], 1 if state.get("alarm") else 0)
        yield drift
        yield alarms
        refused = CounterMetricFamily(
            "raftlease_votes_refused",
            "Vote requests refused under the vote promise (a leader was heard recently).",
        )
        refused.add_metric([], float(guard.get("votes_refused") or 0))
        yield refused
        early = CounterMetricFamily(
            "raftlease_early_elections",
            "Elections brought forward to the vote promise's end because the connection "
            "to the leader closed (its process died).",
        )
        early.add_metric([], float(guard.get("early_elections") or 0))
        yield early

    def _files(
        self, replica: Replica, config: NodeConfig
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with contextlib.suppress(OSError):  # no snapshot written yet
            st = os.stat(config.dump_file)
            yield _gauge(
                "raftlease_snapshot_size_bytes",
                "Size of the last snapshot (dump) file.",
                st.st_size,
            )
            yield _gauge(
                "raftlease_snapshot_last_write_timestamp_seconds",
                "When the last snapshot file was written (Unix time).",
                st.st_mtime,
            )
        snapshots = replica.snapshot_status()
        written = CounterMetricFamily(
            "raftlease_snapshots", "Snapshots (log compactions) this process wrote."
        )
        written.add_metric([], float(snapshots["snapshots_written"]))
        yield written
        failed = CounterMetricFamily(
            "raftlease_snapshot_failures",
            "Snapshot writes that failed (the child exited non-zero).",
        )
        failed.add_metric([], float(snapshots["snapshot_failures"]))
        yield failed
        if snapshots["last_snapshot_seconds"] is not None:
            yield _gauge(
                "raftlease_snapshot_last_duration_seconds",
                "How long the last snapshot took, from the fork to the child's exit as "
                "the tick thread saw it (at most one tick late).",
                float(snapshots["last_snapshot_seconds"]),
            )
        durability = replica.durability_status()
        syncs = CounterMetricFamily(
            "raftlease_journal_syncs", "Journal fsyncs (group commits) since start."
        )
        syncs.add_metric([], float(durability.get("journal_syncs") or 0))
        yield syncs
        covered = CounterMetricFamily(
            "raftlease_journal_synced_entries", "Log entries covered by those fsyncs."
        )
        covered.add_metric([], float(durability.get("journal_synced_entries") or 0))
        yield covered
