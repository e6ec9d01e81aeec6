"""The asyncio TCP front of one node: ``NodeServer`` wires the collaborators it owns
(``ClientPort`` the client port, ``Dispatcher`` a write to its log entry, ``Reads``
reads from memory and the long-polls, ``NodeStatus``, ``SecurityReload``,
``Housekeeping`` the leader's ticks, the watch hub, metrics and the HTTP front) and
keeps the lifecycle (bind, join Raft, stop) and the routing of a validated request.

Threads: the event loop runs in the main thread; PySyncObj's tick thread applies
entries and fires proposal callbacks, which hop back to the loop with
``call_soon_threadsafe``. Many requests may be in flight on one connection (each frame
is handled in its own task; responses carry the request id), and many proposals are
in flight in Raft at once: nothing waits synchronously on the log.

Only the leader proposes. It stamps each entry with log time (``LogClock``) and its
term, draws the lease id for a grant, and for reads proposes a read entry (a read
through the log is linearizable). A follower answers ``NOT_LEADER`` with the leader's
client address, so the client redirects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..clock import Clock, SystemClock
from ..config import NodeConfig, bind_probe, parse_addr
from ..core import LeaseStore, Result
from ..errors import ConfigError, NotLeaderError, UnavailableError
from ..gc_pauses import FreezeSurvivors
from ..protocol import Limits, Request
from ..replication import ApplyTap, LeaseGuard, LeaseTransport, Replica, SyncRecorder
from . import membership_ops
from .audit import audit_answer
from .auth import AuthPolicy, load_auth
from .backup import SnapshotExports
from .connections import ClientPort, ControlOp
from .dispatch import Dispatcher
from .heap import HeapTrimmer, fix_mmap_threshold
from .housekeeping import LOG_TIME_REFRESH, Housekeeping
from .keepalive import MemoryKeepalives
from .launcher import watch_launcher
from .log_clock import LogClock
from .logs import set_log_node
from .metrics import NodeMetrics, NodeView
from .overload import LoopLag
from .proposer import Proposer
from .reads import PollSlots, Reads
from .restart import LastStop, mark_running, mark_stopped
from .status import NodeStatus
from .tls_reload import SecurityReload
from .watch import WatchHub

if TYPE_CHECKING:
    from .http.admin import AdminEndpoint

log = logging.getLogger("raftlease.server")

#: LOG_TIME_REFRESH: here too, where it was before the split.
__all__ = ["LOG_TIME_REFRESH", "NodeServer", "ServerHooks", "private_data_dir", "run_node"]


def unclean_stop_wait(config: NodeConfig) -> float:
    """Seconds a node stays out of the cluster after a machine crash with durability
    "none": every lease it may have forgotten has then expired at its holder (longest
    TTL, stretched by the clock-drift bound, plus an election)."""
    return config.max_ttl * (1 + config.clock_drift) + config.election_timeout_max


@dataclass(frozen=True)
class ServerHooks:
    """What a test build injects into a node (``raftlease.testing.node``). A production
    ``raftlease node`` never builds one: it has no planted bug, no clock control and
    no operation outside the protocol's table.

    ``clock``: the node's clock (an adjustable one for clock faults); ``log_clock_rate``:
    how fast the leader's log time runs against it (1.0 is correct); ``log_clock_class``:
    the log clock (a test build's traces its stamps, testing/trace.py); ``guard_class``:
    the leader-lease bookkeeping; ``control_ops``: extra operations by name, handled
    before protocol validation (each validates its own fields); ``reads_class``: the
    reads answered from memory, with their read barrier; ``proposer_class``: the
    batching proposer, which writes keep-alives answered from memory first;
    ``transport_class``, ``store_class``: the replica's PySyncObj transport and state
    machine; ``recorder``: keeps what reached stable storage, for a simulated power
    loss; ``durability``: overrides the config's mode; ``restart_wait``: the seconds a node
    stays out of the cluster after a machine crash with ``durability = "none"``
    (``unclean_stop_wait``); ``apply_tap``: a view around each applied entry (a
    test build's trace of lease changes, testing/trace.py). Planted bugs are
    injected doubles of these (a subclass, a function); production code has no
    switch for any of them.
    """

    clock: Clock | None = None
    log_clock_rate: float = 1.0
    log_clock_class: type[LogClock] = LogClock
    guard_class: type[LeaseGuard] = LeaseGuard
    control_ops: Mapping[str, ControlOp] = field(default_factory=dict)
    reads_class: type[Reads] = Reads
    proposer_class: type[Proposer] = Proposer
    transport_class: type[LeaseTransport] = LeaseTransport
    store_class: type[LeaseStore] = LeaseStore
    recorder: SyncRecorder | None = None
    durability: str | None = None
    restart_wait: Callable[[NodeConfig], float] = unclean_stop_wait
    apply_tap: ApplyTap | None = None


#: Seconds a starting node waits for the host names of its own addresses to resolve.
OWN_NAME_WAIT = 60.0


class NodeServer:
    """Serves clients for one node. ``run()`` blocks until ``stop()``, a signal, or
    (with ``parent_pid``) the end of the process that launched it."""

    def __init__(
        self, config: NodeConfig, hooks: ServerHooks | None = None, parent_pid: int | None = None
    ) -> None:
        self.hooks = hooks or ServerHooks()
        #: Stop (as on SIGTERM) once this process is gone (server/launcher.py); None:
        #: never (a production node without --parent-pid).
        self.parent_pid = parent_pid
        if self.hooks.durability is not None:
            config = config.with_changes(durability=self.hooks.durability)
        self.config = config
        self.clock: Clock = self.hooks.clock or SystemClock()
        self.log_clock = self.hooks.log_clock_class(self.clock, rate=self.hooks.log_clock_rate)
        self.limits = Limits(
            max_key_bytes=config.max_key_bytes,
            max_owner_bytes=config.max_owner_bytes,
            min_ttl=config.min_ttl,
            max_ttl=config.max_ttl,
            max_list=config.max_list,
        )
        self.replica: Replica | None = None
        self.proposer: Proposer | None = None
        self.watches = WatchHub(
            max_per_principal=config.max_watches_per_principal,
            max_per_node=config.max_watches_per_node,
        )
        #: ``raftlease snapshot save``: the leader's exports (backup.py).
        self.snapshots = SnapshotExports(config.data_dir, config.node_id)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        #: The long-poll quota (per principal and per node; server/reads.py).
        self.polls = PollSlots(config.max_long_polls_per_principal, config.max_long_polls_per_node)
        #: Reads answered from memory and the long-polls (server/reads.py).
        self.reads = self.hooks.reads_class(
            config,
            self.log_clock,
            replica=lambda: self.replica,
            keepalives=self._keepalives,
            require_leader=self.require_leader,
            require_replica=self.require_replica,
            propose=self.propose,
        )
        self.requests_total = 0
        #: Admission control: the event loop's lag, and the new lease sessions refused
        #: while it is above overload_lag (server/overload.py).
        self.overload = LoopLag(config.overload_lag)
        #: How the previous run ended, and until when (monotonic) this node stays out
        #: of the cluster after an unclean stop with durability "none".
        self.last_stop = LastStop.CLEAN
        self.recovering_until: float | None = None
        #: Metrics and the HTTP admin endpoint (server/http/admin.py), only with an
        #: admin_address: without one the request path counts nothing.
        self.metrics: NodeMetrics | None = None
        self.admin: AdminEndpoint | None = None
        if config.admin_address:
            self.metrics = NodeMetrics(
                NodeView(
                    config,
                    replica=lambda: self.replica,
                    connections=lambda: self.port.count,
                    lease_reads=self.reads.lease_read_allowed,
                    admin_connections=lambda: self.admin.connections if self.admin else 0,
                    loop_lag=lambda: (self.overload.lag, self.overload.overloaded),
                )
            )
        #: The client port: connections, frames, authentication (server/connections.py).
        self.port = ClientPort(
            config,
            self.limits,
            load_auth(Path(config.auth_file)) if config.auth_file else None,
            watches=self.watches,
            handle=self.handle,
            refuse_if_removed=self._refuse_if_removed,
            revision=lambda: self.require_replica().store.revision,
            control_ops=self.hooks.control_ops,
            metrics=self.metrics,
        )
        #: A validated write to its log entry and back (server/dispatch.py).
        self.dispatch = Dispatcher(
            config,
            self.log_clock,
            auth=lambda: self.port.auth,
            replica=lambda: self.replica,
            proposer=lambda: self.proposer,
            require_leader=self.require_leader,
            lease_read_allowed=self.reads.lease_read_allowed,
            propose=self.propose,
            metrics=self.metrics,
            overload=self.overload,
        )
        #: SIGHUP and the reload operation (server/tls_reload.py).
        self.security = SecurityReload(
            config, self.port, replica=lambda: self.replica, on_auth=self._admin_auth
        )
        self._status = NodeStatus(
            config,
            self.clock,
            replica=lambda: self.replica,
            require_replica=self.started_replica,
            long_polls=lambda: self.polls.total,
            unauthenticated=self.port.unauthenticated,
            lease_reads=self.reads.lease_read_allowed,
            keepalives=self._keepalives,
            auth=lambda: self.port.auth,
            last_stop=lambda: self.last_stop,
            recovering_until=lambda: self.recovering_until,
            overload=self.overload,
        )
        #: The leader's tick and reserve entries, the heap trim (server/housekeeping.py).
        self.housekeeping = Housekeeping(
            config,
            self.clock,
            self.log_clock,
            replica=lambda: self.replica,
            keepalives=self._keepalives,
            propose=self.propose,
            metrics=self.metrics,
        )

    @property
    def auth(self) -> AuthPolicy | None:
        """Who may do what on the client port and the HTTP API (auth_file; a reload
        replaces it); None: no authentication."""
        return self.port.auth

    def _admin_auth(self, policy: AuthPolicy) -> None:
        """An auth reload: the admin endpoint and the dashboard take the new policy."""
        if self.admin is not None:
            self.admin.auth = policy
            if self.admin.dashboard is not None:
                self.admin.dashboard.auth = policy
            if self.admin.api is not None:
                # Its open watch streams and waits end if their token is revoked.
                ended = self.admin.api.revoke(policy)
                if ended:
                    log.info("auth reload ended %d HTTP streams and waits", ended)

    def _keepalives(self) -> MemoryKeepalives | None:
        """The keep-alives answered from memory (the proposer's; None before it exists)."""
        return self.proposer.keepalives if self.proposer is not None else None

    def status(self) -> dict[str, Any]:
        """This node's status (server/status.py); raises ``UnavailableError`` while it
        starts."""
        return self._status.status()

    # ----------------------------------------------------------- lifecycle

    async def _wait_for_own_names(self) -> None:
        """Wait until the host names of this node's own addresses resolve, for up to
        ``OWN_NAME_WAIT`` s: in Kubernetes a pod's DNS name (a headless service's
        record) appears a moment after the pod starts, and binding would fail. IP
        addresses need no wait. Logs what it waits for every 5 s. Raises
        ``ConfigError`` naming the address if a name still does not resolve."""
        loop = asyncio.get_running_loop()
        addresses = [("client", self.config.self_node.client), ("raft", self.config.self_node.raft)]
        if self.config.admin_address:
            addresses.append(("admin", self.config.admin_address))
        deadline = time.monotonic() + OWN_NAME_WAIT
        for what, address in addresses:
            host, port = parse_addr(address, f"{what} address")
            told = float("-inf")
            while True:
                try:
                    await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                    break
                except (OSError, UnicodeError) as exc:
                    now = time.monotonic()
                    if now >= deadline:
                        raise ConfigError(
                            f"the {what} address {address} does not resolve ({exc}) after "
                            f"{OWN_NAME_WAIT:.0f} s"
                        ) from None
                    if now - told >= 5.0:
                        told = now
                        log.warning(
                            "waiting for the %s address %s to resolve (%s)", what, address, exc
                        )
                    await asyncio.sleep(0.5)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        await self._wait_for_own_names()
        host, port = parse_addr(self.config.self_node.client, "client address")
        # Bind the client port first: if it is taken, fail before joining Raft.
        # A reload replaces the context its new handshakes use (tls_reload.py).
        client_tls = self.security.listener_context()
        try:
            server = await asyncio.start_server(
                self.port.serve,
                host,
                port,
                reuse_address=True,
                limit=1 << 16,
                ssl=client_tls,
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on the client address {self.config.self_node.client}: {exc}"
            ) from None
        try:
            # PySyncObj retries a failed bind on every tick without a word: the node
            # would sit in term 0, a follower with no peers, for good. (A port taken
            # between this probe and PySyncObj's bind is that silent case again.)
            bind_probe(self.config.self_node.raft, "raft address")
        except OSError as exc:
            server.close()
            raise ConfigError(
                f"cannot listen on the raft address {self.config.self_node.raft}: {exc}"
            ) from None
        if self.config.insecure:
            log.warning(
                "INSECURE: clients on %s are %s (insecure = true)",
                self.config.self_node.client,
                "not authenticated" if self.auth is None else "not encrypted",
            )
        self.proposer = self.hooks.proposer_class(
            self._loop, lambda: self.replica, self.log_clock, self.config.request_timeout
        )
        watchers: list[asyncio.Task[None]] = []
        if self.metrics is not None:
            # Bound before Raft too (a taken port fails the start), and serving while
            # the node waits out an unclean stop: /livez answers, /readyz says why not.
            # Imported here: aiohttp loads only on a node with an admin_address (off,
            # and free, unless configured).
            from .http.admin import AdminEndpoint

            self.proposer.on_commit = self.metrics.observe_commit
            admin_tls = self.security.listener_context()
            self.admin = AdminEndpoint(
                self.config.admin_address,
                self.metrics,
                self.status,
                lambda: self.replica,
                auth=self.auth,
                tls=admin_tls,
                max_silence=2 * self.config.election_timeout_max,
            )
            from .http.http_api import HttpApi

            # /v1/ and /openapi.json (docs/http-api.md)
            self.admin.api = HttpApi(self, when_lost=self.admin.when_lost)
            try:
                await self.admin.start()
            except OSError as exc:
                server.close()
                raise ConfigError(
                    f"cannot listen on admin_address {self.config.admin_address}: {exc}"
                ) from None
            interval = self.config.heartbeat_interval
            watchers.append(asyncio.create_task(self.metrics.watch_leader(interval)))
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                self._loop.add_signal_handler(sig, self.stop)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            # Rotation without restart (docs/security.md): the auth file, TLS files.
            self._loop.add_signal_handler(signal.SIGHUP, self.security.reload)
        if self.parent_pid is not None:
            # From here on, as the signal handlers: a launcher gone (SIGKILL) leaves
            # no orphan, also while the node waits out an unclean stop.
            watchers.append(asyncio.create_task(watch_launcher(self.parent_pid, self.stop)))
        private_data_dir(self.config.data_dir)
        self.snapshots.clean_leftovers()
        self.last_stop = mark_running(self.config.data_dir)
        if not await self._wait_out_unclean_stop():
            for task in watchers:
                task.cancel()
            if self.admin is not None:
                await self.admin.close()
            server.close()
            await server.wait_closed()
            mark_stopped(self.config.data_dir)
            return
        self.replica = Replica(
            self.config,
            observer=self._on_applied,
            clock=self.clock,
            guard_class=self.hooks.guard_class,
            transport_class=self.hooks.transport_class,
            store_class=self.hooks.store_class,
            recorder=self.hooks.recorder,
            on_restore=self._on_restored,
            apply_tap=self.hooks.apply_tap,
            # The heap's free pages back to the kernel while a snapshot is loaded: its
            # maps' former tables are freed as they grow (server/heap.py).
            restore_pause=HeapTrimmer().trim if self.config.heap_trim_interval > 0 else None,
        )
        if self.metrics is not None:
            self.replica.on_journal_sync(self.metrics.journal_sync_seconds.observe)
        log.info(
            "node %s serving clients on %s, raft on %s, data in %s",
            self.config.node_id,
            self.config.self_node.client,
            self.config.self_node.raft,
            self.config.data_dir,
        )
        expiry = asyncio.create_task(self.housekeeping.expiry_loop())
        heap = asyncio.create_task(self.housekeeping.heap_trim_loop())
        lag = asyncio.create_task(self.overload.run())
        try:
            await self._stopping.wait()
        finally:
            expiry.cancel()
            heap.cancel()
            lag.cancel()
            for task in watchers:
                task.cancel()
            if self.admin is not None:
                await self.admin.close()
            server.close()
            await server.wait_closed()
            self.snapshots.drop()
            replica = self.replica
            await self._loop.run_in_executor(None, replica.close)
            mark_stopped(self.config.data_dir)
            log.info("node %s stopped", self.config.node_id)

    async def _wait_out_unclean_stop(self) -> bool:
        """After a machine crash with durability "none", wait ``unclean_stop_wait``
        before joining Raft (status says so meanwhile). False if stopped while
        waiting."""
        assert self._stopping is not None
        if self.last_stop is LastStop.CLEAN:
            return True
        if self.last_stop is LastStop.PROCESS_CRASH or self.config.durability == "fsync":
            log.info(
                "previous run did not stop cleanly (%s); nothing was lost: durability %s",
                self.last_stop.value,
                self.config.durability,
            )
            return True
        wait = self.hooks.restart_wait(self.config)
        self.recovering_until = self.clock.monotonic() + wait
        log.warning(
            "node %s restarted after a machine crash (power loss or kernel crash) with "
            "durability none: its journal may have lost acknowledged grants. It stays "
            "out of the cluster for %.1f s (max_ttl x (1 + clock_drift) + "
            "election_timeout_max), until every lease it may have forgotten has expired.",
            self.config.node_id,
            wait,
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), wait)
        self.recovering_until = None
        if self._stopping.is_set():
            return False
        log.warning("node %s: restart wait over; joining the cluster", self.config.node_id)
        return True

    def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    # ------------------------------------------------------------ requests

    async def handle(self, request: Request) -> dict[str, Any]:
        """Execute one validated request; raises a ``RaftLeaseError`` on failure."""
        self.requests_total += 1
        if request.op == "ping":
            return {"node": self.config.node_id, "version": __version__}
        if request.op == "status":
            return self.status()
        if request.op == "audit":
            # This node's own copy (docs/audit.md): every replica holds the same
            # records for the same applied index; compare nodes with it.
            replica = self.require_replica()
            return audit_answer(replica, request.args, self.config.node_id)
        if request.op == "reload":
            return self.security.reload_op()  # this node's files, not the cluster's state
        self._refuse_if_removed()
        if request.op == "await_lease":
            with self.polls.hold(request.principal):  # QUOTA_EXCEEDED when full
                return await self.reads.await_lease(request)
        if request.op in ("await_claim", "await_task"):
            with self.polls.hold(request.principal):
                return await self.reads.await_task(request)
        if request.op == "await_spend":
            with self.polls.hold(request.principal):
                return await self.reads.await_spend(request)
        if request.op == "snapshot":
            return await self._snapshot(request)
        if request.op == "member_list":
            # The member set (members.json, then the log's), not the store: answered
            # while the state is still being restored, as before the start-up gate.
            return membership_ops.member_list(self.started_replica(), self.config.self_node.raft)
        if request.op in ("member_add", "member_remove"):
            self.require_leader()
            timeout = max(self.config.request_timeout, 10.0)
            return await membership_ops.change_members(self.require_replica(), request, timeout)
        if request.op == "session_keepalive_many":
            # From the leader's memory only, never a log entry (server/dispatch.py).
            return await self.dispatch.keepalive_many(request)
        consistency = request.args.get("consistency")
        metrics = self.metrics
        if consistency == "stale":
            if metrics is not None:
                metrics.observe_read("stale")
            stale = self.reads.local_read(request, "stale")
            assert stale is not None  # a stale read raises rather than answer None
            return stale
        if consistency == "linearizable" and self.reads.lease_read_allowed():
            answer = self.reads.local_read(request, "lease")
            if answer is not None:
                if metrics is not None:
                    metrics.observe_read("lease")
                return answer
            # It overlapped entries being applied every time: through the log.
        if consistency is not None and metrics is not None:
            metrics.observe_read("log")
        return await self.dispatch.write(request, consistency)

    def _refuse_if_removed(self) -> None:
        """docs/membership.md: a node told of its removal serves nothing but status
        and ping. Raises ``UnavailableError`` (definite)."""
        if self.replica is not None and self.replica.removed_at is not None:
            raise UnavailableError(
                f"this node was removed from the cluster (at log index "
                f"{self.replica.removed_at}): ask the other members"
            )

    def require_leader(self) -> None:
        """Return if this node leads; raise ``NotLeaderError`` naming the leader's
        client address (from the member set in the log), or ``UnavailableError``
        when none is known or the node is starting."""
        replica = self.require_replica()
        if replica.is_leader():
            return
        leader = replica.leader_raft_addr()
        # From the member set in the log: the leader may have joined after our config.
        client_addr = replica.membership.client_for_raft(leader) if leader else None
        if client_addr is None:
            raise UnavailableError("no leader is known to this node; election in progress?")
        raise NotLeaderError(
            f"not the leader; the leader is {client_addr}", {"leader": client_addr}
        )

    async def _snapshot(self, request: Request) -> dict[str, Any]:
        """``snapshot``: with no id, take a consistent snapshot of the state on the
        leader (backup.SnapshotExports: a barrier through the log, then a fork between
        two applied entries); with an id, a chunk of its body from ``offset``."""
        sid = request.args.get("snapshot")
        if sid is not None:
            return await self.snapshots.read(str(sid), int(request.args["offset"]))
        self.require_leader()
        replica = self.require_replica()
        return await self.snapshots.start(self.propose, lambda: replica.store, replica.term)

    def _on_applied(self, entry: dict[str, Any], result: Result) -> None:
        """Tick thread, after each applied entry: record its changes in the watch
        history, and hop to the event loop only when someone listens (a watch, or a
        long-poll whose queued acquire was granted or left the queue)."""
        replica = self.replica
        loop = self._loop
        if replica is None or loop is None:
            return
        # Inside the replicated method: PySyncObj counts the entry applied after it.
        self.snapshots.on_applied(replica.last_applied() + 1)
        events = replica.store.events
        if self.metrics is not None:
            self.metrics.observe_applied(entry, events, replica.last_apply_seconds())
        if not events:
            return
        self.watches.record(events, loop)
        self.reads.wake(events, loop)  # acquires granted, claims granted, tasks finished

    def _on_restored(self, revision: int) -> None:
        """Tick thread: a snapshot replaced the state (the dump at start, or one the
        leader installed): the watch history restarts at its revision, and live
        watches end with ``COMPACTED`` rather than miss the changes it covers. And the
        heap is trimmed (when trimming is on) on the event loop a second later, once
        PySyncObj has dropped the loaded dump: loading a snapshot frees its bytes and
        the unpacking's buffers, ~30 MiB with 100,000 leases, which the allocator
        would otherwise keep until the next periodic trim."""
        loop = self._loop
        if loop is not None:
            self.watches.restored(revision, loop)
        if self.config.heap_trim_interval > 0:
            if loop is None:
                HeapTrimmer().trim()
            else:
                with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                    loop.call_soon_threadsafe(loop.call_later, 1.0, HeapTrimmer().trim)

    async def propose(self, entry: dict[str, Any]) -> Result:
        """Replicate ``entry`` (batched with others of this event-loop turn, see
        ``proposer.Proposer``) and return its result."""
        if self.proposer is None:
            raise UnavailableError("node is starting")
        return await self.proposer.propose(entry)

    def require_replica(self) -> Replica:
        """The replica, once its state is restored; raises ``UnavailableError``
        (definite, retried by the clients) while the node starts, waits out an unclean
        stop (saying for how long), or has not yet loaded its snapshot and replayed
        its journal (``Replica.restored``): a watch, a stale or lease read, a
        long-poll, the dashboard and the HTTP API answer nothing from a state that is
        not yet the one the node had."""
        replica = self.started_replica()
        if not replica.restored():
            raise UnavailableError(
                "node is starting: its snapshot and journal are not restored yet; retry"
            )
        return replica

    def started_replica(self) -> Replica:
        """The replica, restored or not (``status``); raises ``UnavailableError``
        while the node starts or waits out an unclean stop (saying for how long)."""
        if self.replica is None:
            if self.recovering_until is not None:
                left = max(0.0, self.recovering_until - self.clock.monotonic())
                raise UnavailableError(
                    f"node restarted after a machine crash with durability none; it "
                    f"rejoins the cluster in {left:.1f} s"
                )
            raise UnavailableError("node is starting")
        return self.replica


def private_data_dir(data_dir: Path) -> None:
    """Make the node's files private: the journal and snapshot hold every lease id in
    clear. The process's umask becomes 077 (files 0600, directories 0700: the node
    process writes only its own files) and the data directory is made 0700."""
    os.umask(0o077)
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = stat.S_IMODE(data_dir.stat().st_mode)
    if mode & 0o077:
        log.warning("data directory %s was mode %o; made it 0700", data_dir, mode)
        data_dir.chmod(0o700)
    for path in data_dir.iterdir():  # files an older version wrote 0644
        if path.is_file() and stat.S_IMODE(path.stat().st_mode) & 0o077:
            path.chmod(0o600)


def run_node(
    config: NodeConfig, hooks: ServerHooks | None = None, parent_pid: int | None = None
) -> None:
    """Run one node until SIGINT/SIGTERM (blocking), or until process ``parent_pid``
    is gone (``LocalCluster``'s nodes; server/launcher.py). ``hooks``: test builds
    only. Raises ``ConfigError`` for a port it cannot bind or a file it cannot load."""
    set_log_node(config.node_id)
    # Before the snapshot is loaded: its buffers go back to the kernel when freed.
    if not fix_mmap_threshold():
        log.info("mmap threshold left to the C library (no mallopt)")
    if config.gc_unfreeze_interval > 0:
        # Full collections scan only what was promoted since the last one (gc_pauses.py).
        FreezeSurvivors(config.gc_unfreeze_interval).install()
    if config.switch_interval > 0:
        # The tick thread (heartbeats) gets the GIL back from a busy event loop within
        # this, not Python's 5 ms per turn: beside 15,000 keep-alives a second, the
        # default let a leader go unheard long enough for elections (performance.md).
        sys.setswitchinterval(config.switch_interval)
    asyncio.run(NodeServer(config, hooks, parent_pid).run())
