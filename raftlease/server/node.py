"""The asyncio TCP front of one node.

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
import dataclasses
import logging
import os
import secrets
import signal
import socket
import ssl
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..clock import Clock, SystemClock
from ..config import NodeConfig, bind_probe, parse_addr
from ..core import LeaseStore, Result
from ..core.snapshot import ENTRY_FORMAT, SNAPSHOT_VERSION
from ..errors import (
    CapacityMismatchError,
    ConfigError,
    FrameTooLargeError,
    InternalError,
    NotLeaderError,
    QuotaExceededError,
    RaftLeaseError,
    UnavailableError,
    error_class,
)
from ..limits import TOKEN_RESERVE_STEP
from ..protocol import (
    FrameDecoder,
    Limits,
    ProtocolError,
    Request,
    encode_frame,
    error_response,
    ok_response,
    parse_request,
    request_id,
)
from ..replication import LeaseGuard, LeaseTransport, Replica, SyncRecorder
from . import membership_ops
from .auth import AuthPolicy, Principal, load_auth
from .backup import SnapshotExports
from .conn_timer import ConnectionTimer
from .dispatch import draw_task_ids
from .heap import HeapTrimmer
from .keepalive import LEASE, SESSION
from .launcher import watch_launcher
from .log_clock import LogClock
from .metrics import NodeMetrics, NodeView
from .proposer import Proposer
from .reads import LONG_POLL_OPS, PollSlots, Reads
from .restart import LastStop, mark_running, mark_stopped
from .tls_reload import LiveTLS, RefusalLog
from .watch import WatchHub

if TYPE_CHECKING:
    from .http.admin import AdminEndpoint

log = logging.getLogger("raftlease.server")

#: The leader proposes a tick at least this often (seconds) to keep log time fresh.
LOG_TIME_REFRESH = 1.0

#: Requests in flight on one connection before the server stops reading from it.
MAX_INFLIGHT_PER_CONNECTION = 1024

#: A control operation: the raw decoded request -> its result (raises RaftLeaseError).
ControlOp = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class ServerHooks:
    """What a test build injects into a node (``raftlease.testing.node``). A production
    ``raftlease node`` never builds one: it has no planted bug, no clock control and
    no operation outside the protocol's table.

    ``clock``: the node's clock (an adjustable one for clock faults); ``log_clock_rate``:
    how fast the leader's log time runs against it (1.0 is correct); ``guard_class``:
    the leader-lease bookkeeping; ``control_ops``: extra operations by name, handled
    before protocol validation (each validates its own fields); ``lease_read_barrier``:
    lease reads wait for an applied entry of the leader's own term (True is correct);
    ``transport_class``, ``store_class``: the replica's PySyncObj transport and state
    machine; ``recorder``: keeps what reached stable storage, for a simulated power
    loss; ``durability``: overrides the config's mode; ``restart_wait``: the wait after
    an unclean stop with ``durability = "none"`` (False only in a planted bug);
    ``keepalive_flush``: keep-alives answered from memory are written into the log
    (False only in a planted bug).
    """

    clock: Clock | None = None
    log_clock_rate: float = 1.0
    guard_class: type[LeaseGuard] = LeaseGuard
    control_ops: Mapping[str, ControlOp] = field(default_factory=dict)
    lease_read_barrier: bool = True
    transport_class: type[LeaseTransport] = LeaseTransport
    store_class: type[LeaseStore] = LeaseStore
    recorder: SyncRecorder | None = None
    durability: str | None = None
    restart_wait: bool = True
    keepalive_flush: bool = True


#: Seconds a starting node waits for the host names of its own addresses to resolve.
OWN_NAME_WAIT = 60.0


def _log_peer_cutoff(closed: int) -> None:
    """Tick thread, after a peer TLS reload: how many peer connections it closed."""
    if closed:
        log.warning("peer TLS reload closed %d peer connection(s) it no longer admits", closed)


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
        self.log_clock = LogClock(self.clock, rate=self.hooks.log_clock_rate)
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
        self._connections = 0
        self._tick_in_flight = False
        #: The long-poll quota (per principal and per node; server/reads.py).
        self.polls = PollSlots(config.max_long_polls_per_principal, config.max_long_polls_per_node)
        #: Reads answered from memory and the long-polls (server/reads.py).
        self.reads = Reads(
            config,
            self.log_clock,
            replica=lambda: self.replica,
            keepalives=lambda: self.proposer.keepalives if self.proposer is not None else None,
            require_leader=self.require_leader,
            require_replica=self.require_replica,
            propose=self.propose,
            read_barrier=self.hooks.lease_read_barrier,
        )
        self.requests_total = 0
        #: How the previous run ended, and until when (monotonic) this node stays out
        #: of the cluster after an unclean stop with durability "none".
        self.last_stop = LastStop.CLEAN
        self.recovering_until: float | None = None
        #: Who may do what on the client port (auth_file); None: no authentication.
        self._principal_connections: dict[str, int] = {}
        #: Open client connections and their principal cells (an auth reload checks
        #: them), and the TLS contexts a reload loads new files into (event loop).
        self._live: dict[asyncio.StreamWriter, list[Principal | None]] = {}
        self._live_tls: list[LiveTLS] = []
        #: Each open connection's source address (max_connections_per_address), and
        #: the auth_timeout timers of those not authenticated yet (event loop).
        self._hosts: dict[asyncio.StreamWriter, str] = {}
        self._auth_timers: dict[asyncio.StreamWriter, asyncio.TimerHandle] = {}
        self.auth: AuthPolicy | None = (
            load_auth(Path(config.auth_file)) if config.auth_file else None
        )
        #: Metrics and the HTTP admin endpoint (server/http/admin.py), only with an
        #: admin_address: without one the request path counts nothing.
        self.metrics: NodeMetrics | None = None
        self.admin: AdminEndpoint | None = None
        if config.admin_address:
            self.metrics = NodeMetrics(
                NodeView(
                    config,
                    replica=lambda: self.replica,
                    connections=lambda: self._connections,
                    lease_reads=self.reads.lease_read_allowed,
                    admin_connections=lambda: self.admin.connections if self.admin else 0,
                )
            )

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
        client_tls = self._tls_context()
        if client_tls is not None:
            # A reload replaces the context its new handshakes use (tls_reload.py).
            self._live_tls.append(LiveTLS(client_tls, self.config.tls_client_ca_file))
        try:
            server = await asyncio.start_server(
                self._serve_connection,
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
        self.proposer = Proposer(
            self._loop, lambda: self.replica, self.log_clock, self.config.request_timeout
        )
        self.proposer.write_keepalives = self.hooks.keepalive_flush
        watchers: list[asyncio.Task[None]] = []
        if self.metrics is not None:
            # Bound before Raft too (a taken port fails the start), and serving while
            # the node waits out an unclean stop: /livez answers, /readyz says why not.
            # Imported here: aiohttp loads only on a node with an admin_address (off,
            # and free, unless configured).
            from .http.admin import AdminEndpoint

            self.proposer.on_commit = self.metrics.observe_commit
            admin_tls = self._tls_context()
            if admin_tls is not None:
                self._live_tls.append(LiveTLS(admin_tls, self.config.tls_client_ca_file))
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
            self._loop.add_signal_handler(signal.SIGHUP, self.reload_security)
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
        )
        log.info(
            "node %s serving clients on %s, raft on %s, data in %s",
            self.config.node_id,
            self.config.self_node.client,
            self.config.self_node.raft,
            self.config.data_dir,
        )
        expiry = asyncio.create_task(self._expiry_loop())
        heap = asyncio.create_task(self._heap_loop())
        try:
            await self._stopping.wait()
        finally:
            expiry.cancel()
            heap.cancel()
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

    def reload_security(self) -> bool:
        """``SIGHUP`` (event loop): read the auth file, the client-port TLS files and
        the peer TLS files again. A file that fails to load is refused with an
        error log line and what was in force stays so. With a new auth file every
        open connection is checked against it: one whose principal is gone, or that
        authenticated with a token the file no longer holds (and has no client
        certificate naming it), is closed; the others get their principal's new
        roles. New TLS files serve new handshakes (existing TLS connections keep
        theirs). New peer TLS files serve new peer connections, and an open peer
        connection whose certificate they no longer admit (revoked, its CA gone) is
        closed at once. Never raises; returns whether everything was applied."""
        ok = True
        if self.config.auth_file:
            try:
                policy = load_auth(Path(self.config.auth_file))
            except ConfigError as exc:
                log.error("reload refused: %s; the previous auth policy stays in force", exc)
                ok = False
            else:
                self.auth = policy
                if self.admin is not None:
                    self.admin.auth = policy
                    if self.admin.dashboard is not None:
                        self.admin.dashboard.auth = policy
                closed = 0
                for writer, who in list(self._live.items()):
                    if not self._recheck(who, writer):
                        closed += 1
                        writer.close()
                log.info(
                    "reloaded the auth file: %d principals, %d pinned shapes; %d "
                    "connections closed",
                    len(policy.principals),
                    len(policy.shape_keys) + len(policy.shape_prefixes),
                    closed,
                )
        if self._live_tls:
            try:
                # Fresh contexts from the files, all built before any is used: all or
                # nothing. (OpenSSL cannot remove a CA from a live context.)
                fresh = [self._tls_context() for _ in self._live_tls]
            except ConfigError as exc:
                log.error("reload refused: %s; the previous TLS files stay in force", exc)
                ok = False
            else:
                removed = False
                for live, context in zip(self._live_tls, fresh, strict=True):
                    assert context is not None  # _live_tls is only filled with TLS on
                    removed |= live.replace(context, self.config.tls_client_ca_file)
                closed = self._close_untrusted() if removed else 0
                log.info("reloaded the client-port TLS files; %d connections closed", closed)
        if self.replica is not None:  # before it exists, it reads the files when made
            # New certificates, CAs or revocations (docs/security.md, "Rotating peer
            # certificates"): all files or none; the cut-off runs on the tick thread.
            try:
                loaded = self.replica.reload_peer_tls(_log_peer_cutoff)
            except ConfigError as exc:
                log.error("reload refused: %s; the previous peer TLS files stay in force", exc)
                ok = False
            else:
                log.info(
                    "reloaded the peer TLS files: certificate serial %s valid until %s, "
                    "%s CA(s), %s revoked",
                    loaded.get("serial"),
                    loaded.get("not_after"),
                    loaded.get("cas"),
                    loaded.get("revoked"),
                )
        return ok

    def _close_untrusted(self) -> int:
        """After a reload removed a client CA: close every open client connection
        whose certificate no CA in the new file issued (its principal could not
        connect again). Returns how many were closed."""
        closed = 0
        for writer in list(self._live):
            ssl_object = writer.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
            if der and not self._live_tls[0].trusted(der):
                closed += 1
                writer.close()
        return closed

    def reload_op(self) -> dict[str, Any]:
        """The ``reload`` operation (admin): what ``SIGHUP`` does, on this node, and
        whether every file was taken (``errors``: why not). Event loop; never raises.
        A connection the new auth file no longer admits is closed, the caller's too."""
        refusals = RefusalLog()
        log.addHandler(refusals)
        try:
            reloaded = self.reload_security()
        finally:
            log.removeHandler(refusals)
        return {"node": self.config.node_id, "reloaded": reloaded, "errors": refusals.messages}

    def _recheck(self, who: list[Principal | None], writer: asyncio.StreamWriter) -> bool:
        """After an auth reload: give the connection its principal as the new policy
        has it. False (and the connection unauthenticated) if the principal is gone or
        its token was replaced and no client certificate names it."""
        old = who[0]
        if old is None or self.auth is None:
            return True
        new = self.auth.principals.get(old.name)
        by_cert = self._certificate_principal(writer)
        if new is not None and (
            new.token_sha256 == old.token_sha256 or (by_cert is not None and by_cert is new)
        ):
            who[0] = new  # same name: the connection count stays
            return True
        self._adopt(who, None)
        return False

    def _tls_context(self) -> ssl.SSLContext | None:
        """TLS for the client port (tls_cert_file); with tls_client_ca_file, client
        certificates it signed are verified (optional: a token also authenticates).
        Raises ``ConfigError`` if a file cannot be loaded."""
        config = self.config
        if not config.tls_cert_file:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
            if config.tls_client_ca_file:
                context.load_verify_locations(config.tls_client_ca_file)
                context.verify_mode = ssl.CERT_OPTIONAL
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the client-port TLS files: {exc}") from None
        return context

    def restart_wait(self) -> float:
        """Seconds a node stays out of the cluster after a machine crash with
        durability "none": every lease it may have forgotten has then expired at its
        holder (longest TTL, stretched by the clock-drift bound, plus an election)."""
        config = self.config
        return config.max_ttl * (1 + config.clock_drift) + config.election_timeout_max

    async def _wait_out_unclean_stop(self) -> bool:
        """After a machine crash with durability "none", wait ``restart_wait()``
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
        if not self.hooks.restart_wait:
            log.warning("PLANTED BUG: joining at once after a machine crash with durability none")
            return True
        wait = self.restart_wait()
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

    # --------------------------------------------------------- connections

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self._connections >= self.config.max_connections:
            self._count_closed("max_connections")
            writer.close()
            return
        self._connections += 1
        decoder = FrameDecoder(self.config.max_frame)
        slots = asyncio.Semaphore(MAX_INFLIGHT_PER_CONNECTION)
        tasks: set[asyncio.Task[None]] = set()
        # Long-polls in flight: cancelled when the connection closes, so their quota
        # slots are freed then, not at their timeout (nobody reads their answer).
        polls: set[asyncio.Task[None]] = set()

        def close(limit: str, reason: str) -> None:
            log.info("client connection closed: %s", reason)
            self._count_closed(limit)
            writer.transport.abort()  # the pending read then sees the end

        deadlines = ConnectionTimer(
            asyncio.get_running_loop(),
            self.config.frame_timeout,
            self.config.idle_timeout,
            tasks,
            close,
        )
        # The connection's principal (auth.py): from its client certificate, or set
        # by an auth request. A one-item list the request tasks share.
        who: list[Principal | None] = [None]
        self._live[writer] = who  # an auth reload re-checks it
        peer = writer.get_extra_info("peername")
        self._hosts[writer] = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        try:
            try:
                self._adopt(who, self._certificate_principal(writer))
                if who[0] is None:
                    self._admit_unauthenticated(writer)
            except QuotaExceededError as exc:
                writer.write(encode_frame(error_response(None, exc)))
                return
            self._arm_auth_deadline(writer, who)
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                deadlines.active()
                frames: list[dict[str, Any]] = []
                broken: RaftLeaseError | None = None
                try:
                    frames.extend(decoder.feed(data))
                except (FrameTooLargeError, ProtocolError) as exc:
                    broken = exc  # the frames before the broken one are still answered
                deadlines.frame(decoder.pending, completed=bool(frames))
                for message in frames:
                    await slots.acquire()
                    task = asyncio.create_task(self._answer(message, writer, slots, who))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    task.add_done_callback(deadlines.active)
                    op = message.get("op")
                    if isinstance(op, str) and op in LONG_POLL_OPS:  # a list op: no hash
                        polls.add(task)
                        task.add_done_callback(polls.discard)
                if broken is not None:
                    # The stream cannot be resynchronised: finish what came before,
                    # answer once with id None, then close.
                    await asyncio.gather(*tasks, return_exceptions=True)
                    writer.write(encode_frame(error_response(None, broken)))
                    break
        except (OSError, asyncio.IncompleteReadError):
            # OSError: a reset, and TLS errors (ssl.SSLError), e.g. a client's data
            # after the close_notify of a connection the node is closing (an auth
            # reload): the connection is over either way.
            pass
        except asyncio.CancelledError:
            # Only the loop's shutdown cancels a connection's handler (the node stops
            # with clients connected). Ending normally: on CPython 3.11 the stream's
            # done-callback calls task.exception() on a cancelled handler, which
            # logs the CancelledError as an ERROR with a traceback (gh-113538).
            pass
        finally:
            deadlines.stop()
            for task in list(polls):
                task.cancel()
            self._connections -= 1
            self._live.pop(writer, None)
            self._hosts.pop(writer, None)
            timer = self._auth_timers.pop(writer, None)
            if timer is not None:
                timer.cancel()
            self._adopt(who, None)
            self.watches.end_for(writer)  # frees their watch quota slots now
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()

    def _admit_unauthenticated(self, writer: asyncio.StreamWriter) -> None:
        """A new connection that is not authenticated (no client certificate; without
        an auth file, every connection). Raises ``QuotaExceededError`` (the caller
        answers it and closes) when its address already has
        ``max_connections_per_address`` such connections; with an auth file also when
        ``max_unauthenticated_connections`` are open and no other address holds more
        of them than this one. If one does, its oldest unauthenticated connection is
        closed to make room: a stranger's flood from one address cannot keep other
        addresses' clients from connecting and authenticating."""
        config = self.config
        host = self._hosts.get(writer, "?")
        others = [w for w, who in self._live.items() if who[0] is None and w is not writer]
        by_host: dict[str, int] = {}
        for other in others:
            name = self._hosts.get(other, "?")
            by_host[name] = by_host.get(name, 0) + 1
        mine = by_host.get(host, 0)
        if mine >= config.max_connections_per_address:
            log.info("client connection from %s refused: max_connections_per_address", host)
            self._count_closed("max_connections_per_address")
            raise QuotaExceededError(
                f"{mine} connections from {host} have not authenticated "
                f"(max_connections_per_address is {config.max_connections_per_address})"
            )
        if self.auth is None or len(others) < config.max_unauthenticated_connections:
            return
        heaviest = max(by_host, key=lambda name: by_host[name])
        if by_host[heaviest] <= mine:
            log.info("client connection from %s refused: max_unauthenticated_connections", host)
            self._count_closed("max_unauthenticated_connections")
            raise QuotaExceededError(
                f"{len(others)} connections have not authenticated "
                f"(max_unauthenticated_connections is {config.max_unauthenticated_connections})"
            )
        # _live keeps accept order: the first of the heaviest address is its oldest.
        victim = next(w for w in others if self._hosts.get(w) == heaviest)
        log.info(
            "unauthenticated client connection from %s closed to admit one from %s "
            "(max_unauthenticated_connections)",
            heaviest,
            host,
        )
        self._live.pop(victim, None)  # counted no more, though its task ends later
        victim.transport.abort()
        self._count_closed("evicted")

    def _count_closed(self, limit: str) -> None:
        """Count a connection refused or closed by a connection limit (metrics)."""
        if self.metrics is not None:
            self.metrics.connections_closed.labels(limit).inc()

    def _arm_auth_deadline(self, writer: asyncio.StreamWriter, who: list[Principal | None]) -> None:
        """With an auth file: close the connection if it is still not authenticated
        ``auth_timeout`` from now (a failed ``auth`` does not move a deadline already
        set). Event loop."""
        if self.auth is None or who[0] is not None or writer in self._auth_timers:
            return
        loop = asyncio.get_running_loop()
        self._auth_timers[writer] = loop.call_later(
            self.config.auth_timeout, self._auth_deadline_passed, writer, who
        )

    def _auth_deadline_passed(
        self, writer: asyncio.StreamWriter, who: list[Principal | None]
    ) -> None:
        self._auth_timers.pop(writer, None)
        if who[0] is None and writer in self._live:
            log.info(
                "client connection from %s closed: not authenticated within %.0f s",
                self._hosts.get(writer, "?"),
                self.config.auth_timeout,
            )
            writer.transport.abort()
            self._count_closed("auth_timeout")

    def _certificate_principal(self, writer: asyncio.StreamWriter) -> Principal | None:
        """The principal a verified client certificate names (its common name)."""
        if self.auth is None:
            return None
        cert = writer.get_extra_info("peercert")
        if not cert:
            return None
        for rdn in cert.get("subject", ()):
            for name, value in rdn:
                if name == "commonName":
                    return self.auth.by_certificate(str(value))
        return None

    async def _answer(
        self,
        message: dict[str, Any],
        writer: asyncio.StreamWriter,
        slots: asyncio.Semaphore,
        who: list[Principal | None],
    ) -> None:
        metrics = self.metrics
        started = time.perf_counter() if metrics is not None else 0.0
        code: str | None = None
        try:
            rid = request_id(message)
            try:
                op = message.get("op")
                # Test builds only (ServerHooks.control_ops is empty in production); an
                # op that is no string (a list, a map) is left to the protocol's answer.
                control = self.hooks.control_ops.get(op) if isinstance(op, str) else None
                if control is not None and rid is not None:
                    if self.auth is not None:
                        self.auth.check_admin(who[0], str(op))
                    response = ok_response(rid, control(message))
                else:
                    request = parse_request(message, self.limits)
                    if request.op == "auth":
                        try:
                            response = ok_response(request.id, self._authenticate(request, who))
                        finally:
                            # Unauthenticated again (a refused token): a deadline anew.
                            self._arm_auth_deadline(writer, who)
                        writer.write(encode_frame(response))
                        await writer.drain()
                        return
                    if self.auth is not None:
                        self.auth.check(who[0], request)
                        if who[0] is not None:
                            request = dataclasses.replace(request, principal=who[0].name)
                    if request.op == "watch":
                        self._refuse_if_removed()
                        with contextlib.suppress(ConnectionError):  # watcher gone or dropped
                            await self.watches.stream(
                                request,
                                writer,
                                lambda: self.require_replica().store.revision,
                                request.principal,
                            )
                        return
                    response = ok_response(request.id, await self.handle(request))
            except RaftLeaseError as exc:
                response = error_response(rid, exc)
                code = exc.code
            except Exception:  # never let a bug take the node down
                log.exception("request handler failed")
                response = error_response(rid, InternalError("request handler failed"))
                code = "INTERNAL"
            if not writer.is_closing():
                writer.write(encode_frame(response))
                await writer.drain()
        except (ConnectionError, RuntimeError):
            pass
        finally:
            slots.release()
            if metrics is not None:
                metrics.observe_request(message.get("op"), time.perf_counter() - started, code)

    def _authenticate(self, request: Request, who: list[Principal | None]) -> dict[str, Any]:
        """An ``auth`` request: the token's principal becomes the connection's.
        Raises ``UnauthenticatedError`` (the connection's principal is then cleared)."""
        if self.auth is None:
            return {"principal": None, "auth": "off"}
        try:
            principal = self.auth.by_token(request.args["token"])
        except RaftLeaseError:
            self._adopt(who, None)
            log.warning("client authentication failed (unknown token)")
            raise
        self._adopt(who, principal)
        return {"principal": principal.name}

    def _adopt(self, who: list[Principal | None], principal: Principal | None) -> None:
        """Make ``principal`` the connection's, counting connections per principal.
        Raises ``QuotaExceededError`` (the connection is then unauthenticated) when
        the principal already has ``max_connections_per_principal``."""
        counts = self._principal_connections
        old = who[0]
        if old is not None:
            counts[old.name] -= 1
            if counts[old.name] <= 0:
                del counts[old.name]
        who[0] = None
        if principal is None:
            return
        limit = self.config.max_connections_per_principal
        if counts.get(principal.name, 0) >= limit:
            raise QuotaExceededError(
                f"{principal.name} already has {limit} connections to this node"
            )
        counts[principal.name] = counts.get(principal.name, 0) + 1
        who[0] = principal

    # ------------------------------------------------------------ requests

    async def handle(self, request: Request) -> dict[str, Any]:
        """Execute one validated request; raises a ``RaftLeaseError`` on failure."""
        self.requests_total += 1
        if request.op == "ping":
            return {"node": self.config.node_id, "version": __version__}
        if request.op == "status":
            return self.status()
        if request.op == "reload":
            return self.reload_op()  # this node's files, not the cluster's state
        self._refuse_if_removed()
        if request.op == "await_lease":
            with self.polls.hold(request.principal):  # QUOTA_EXCEEDED when full
                return await self.reads.await_lease(request)
        if request.op in ("await_claim", "await_task"):
            with self.polls.hold(request.principal):
                return await self.reads.await_task(request)
        if request.op == "snapshot":
            return await self._snapshot(request)
        if request.op == "member_list":
            return membership_ops.member_list(self.require_replica(), self.config.self_node.raft)
        if request.op in ("member_add", "member_remove"):
            self.require_leader()
            timeout = max(self.config.request_timeout, 10.0)
            return await membership_ops.change_members(self.require_replica(), request, timeout)
        consistency = request.args.get("consistency")
        metrics = self.metrics
        if consistency == "stale":
            if metrics is not None:
                metrics.observe_read("stale")
            return self.reads.local_read(request, "stale")
        if consistency == "linearizable" and self.reads.lease_read_allowed():
            if metrics is not None:
                metrics.observe_read("lease")
            return self.reads.local_read(request, "lease")
        if consistency is not None and metrics is not None:
            metrics.observe_read("log")
        if request.op in ("renew", "session_keepalive") and self.config.keepalives == "memory":
            answer = self._keepalive_in_memory(request)
            if answer is not None:
                if metrics is not None:
                    metrics.keepalives_from_memory.inc()
                return answer
        self.require_leader()
        entry: dict[str, Any] = {k: v for k, v in request.args.items() if k != "consistency"}
        entry["op"] = request.op
        if request.op == "acquire":
            # Everyone's queued acquires together, with or without authentication
            # (core/store.py decides, only when this acquire would queue).
            entry["waiters_total"] = self.config.max_waiters_total
        if request.principal:
            # Bound to the lease or session it makes, and part of the dedup
            # fingerprint: nobody else can use it or read its cached answer.
            entry["principal"] = request.principal
            if request.op == "acquire":
                entry["quota"] = self.config.max_leases_per_principal
                # Queued acquires of this principal (core/store.py decides).
                entry["wait_quota"] = self.config.max_waiters_per_principal
                # Whether it may fix a shared key's capacity is known here; whether
                # this acquire would fix it, only in the state machine (core/store.py).
                capacity, key = request.args.get("capacity", 1), request.args["key"]
                # A shape pinned in the auth file (auth.py) is checked here, by the
                # leader, before anything is proposed: every surface's acquire ends up
                # here, on whichever node leads. The pinned capacity needs no shape.
                pinned = self.auth.pinned_capacity(key) if self.auth else None
                if pinned is not None and capacity != pinned:
                    raise CapacityMismatchError(
                        f"{key!r} is pinned to capacity {pinned} by the auth file, not {capacity}",
                        {"key": key, "capacity": pinned, "pinned": True},
                    )
                shaper = self.auth.principals.get(request.principal) if self.auth else None
                if (
                    capacity > 1
                    and pinned is None
                    and (shaper is None or not shaper.may_shape(key))
                ):
                    entry["shaper"] = False
            elif request.op == "session_open":
                entry["quota"] = self.config.max_sessions_per_principal
        if request.cid is not None:
            entry["cid"] = request.cid
            entry["seq"] = request.seq
            entry["ack"] = request.ack
        # Randomness is drawn here, never inside the state machine.
        if request.op == "acquire":
            entry["lid"] = secrets.token_hex(16)
        elif request.op == "transfer":
            entry["new_lid"] = secrets.token_hex(16)
        elif request.op == "session_open":
            entry["sid"] = secrets.token_hex(16)
        else:
            draw_task_ids(self.config, request.op, entry)  # task and attempt ids, queue quota
        result = await self.propose(entry)
        if not result.get("ok"):
            code = str(result.get("code", "INTERNAL"))
            raise error_class(code)(str(result.get("message", code)), result.get("detail"))
        # The result object may be the one cached in the state machine's session
        # table (on the leader the callback gets it by reference): never mutate it.
        out = {k: v for k, v in result.items() if k != "ok"}
        if consistency is not None:
            out["consistency"] = "log"
            out["served_by"] = self.config.node_id
        return out

    def _keepalive_in_memory(self, request: Request) -> dict[str, Any] | None:
        """A ``renew`` of a plain lease or a ``session_keepalive``, neither changing the
        TTL, answered by the leader from memory (server/keepalive.py): the answer a log
        write would give, or None when it must go through the log instead (not the
        leader, no valid leader lease, a new TTL, a lease in a session, or anything
        but the plain success: the log then gives the exact error).

        Event loop; never blocks. Safe for the same reason as a lease read: while its
        leader lease is valid no other node can lead, and its state holds every
        acknowledged write (docs/design.md, "Keep-alives from memory")."""
        replica = self.replica
        proposer = self.proposer
        if replica is None or proposer is None or not replica.is_leader():
            return None
        if not self.reads.lease_read_allowed():
            return None
        store = replica.store
        term = replica.term()
        keep = proposer.keepalives
        keep.reset(term)
        now = self.log_clock.stamp(term, store.now)
        args = request.args
        principal = request.principal or ""

        def known() -> str | None:
            # Only a client id the dedup table holds can be kept from its eviction; a
            # made-up one must not take room in the leader's memory.
            cid = request.cid
            return cid if cid is not None and cid in store.clients else None

        if request.op == "renew":
            lease = store.leases.get(args["lid"])
            if (
                lease is None
                or lease.key != args["key"]
                or lease.principal != principal
                or lease.session
                or args.get("ttl", lease.ttl_ms) != lease.ttl_ms
                or lease.expires_at <= now
            ):
                return None
            until = now + lease.ttl_ms
            keep.record(LEASE, lease.lease_id, until, lease.expires_at, lease.ttl_ms, known(), now)
            return store.renewal_answer(lease, until, now)
        session = store.lease_sessions.get(args["sid"])
        if (
            session is None
            or session.principal != principal
            or args.get("ttl", session.ttl_ms) != session.ttl_ms
            or session.expires_at <= now
        ):
            return None
        until = now + session.ttl_ms
        keep.record(
            SESSION, session.session_id, until, session.expires_at, session.ttl_ms, known(), now
        )
        return store.keepalive_answer(session, until, now)

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

    async def propose(self, entry: dict[str, Any]) -> Result:
        """Replicate ``entry`` (batched with others of this event-loop turn, see
        ``proposer.Proposer``) and return its result."""
        if self.proposer is None:
            raise UnavailableError("node is starting")
        return await self.proposer.propose(entry)

    def status(self) -> dict[str, Any]:
        if self.replica is None and self.recovering_until is not None:
            return self._recovering_status()
        replica = self.require_replica()
        leader = replica.leader_raft_addr()
        store = replica.store
        return {
            "node": self.config.node_id,
            "client": self.config.self_node.client,
            "raft": self.config.self_node.raft,
            "role": replica.role(),
            "term": replica.term(),
            "commit_index": replica.commit_index(),
            "applied_index": replica.last_applied(),
            "last_log_index": replica.last_log_index(),
            "leader": replica.membership.client_for_raft(leader) if leader else None,
            "ready": replica.is_ready(),
            "log_time": store.now,
            "revision": store.revision,
            "leases": len(store.leases),
            # Client ids in the dedup table; "sessions" is their old name, kept for
            # compatibility (lease sessions are "lease_sessions").
            "clients": len(store.clients),
            "sessions": len(store.clients),
            "lease_sessions": len(store.lease_sessions),
            # Long-polls parked on this node now (max_long_polls_per_node), and client
            # connections not authenticated (all of them without an auth file).
            "long_polls": self.polls.total,
            "unauthenticated_connections": sum(1 for who in self._live.values() if who[0] is None),
            "version": __version__,
            # What this build applies (docs/membership.md, "Rolling upgrades").
            "formats": {"entry": ENTRY_FORMAT, "snapshot": SNAPSHOT_VERSION},
            "connected_peers": replica.connected_peers(),
            "lease_reads": self.reads.lease_read_allowed(),
            "keepalives": self.config.keepalives,
            **self._keepalive_counts(),
            "clock_rate": getattr(self.clock, "rate", 1.0),
            "token_ceiling": store.ceiling,
            "client_tls": bool(self.config.tls_cert_file),
            "client_auth": self.auth is not None,
            "insecure": self.config.insecure,
            # This member's peer certificate (serial, expiry) and the CA and
            # revocation counts in force: what a SIGHUP reload took.
            "peer_tls": replica.peer_tls.describe() if replica.peer_tls else None,
            "last_stop": self.last_stop.value,
            **replica.durability_status(),
            **replica.election_status(),
            **replica.guard.snapshot(),
        }

    def _keepalive_counts(self) -> dict[str, int]:
        """Keep-alives answered from memory since start, pairs of them written by
        ``extend`` entries, and those not written yet (server/keepalive.py)."""
        keep = self.proposer.keepalives if self.proposer is not None else None
        if keep is None:
            return {"keepalives_in_memory": 0, "keepalives_written": 0, "keepalives_pending": 0}
        return {
            "keepalives_in_memory": keep.answered,
            "keepalives_written": keep.written,
            "keepalives_pending": len(keep),
        }

    def _recovering_status(self) -> dict[str, Any]:
        assert self.recovering_until is not None
        return {
            "node": self.config.node_id,
            "client": self.config.self_node.client,
            "raft": self.config.self_node.raft,
            "role": "recovering",
            "ready": False,
            "leader": None,
            "version": __version__,
            "durability": self.config.durability,
            "last_stop": self.last_stop.value,
            "recovering_for": max(0.0, self.recovering_until - self.clock.monotonic()),
        }

    def require_replica(self) -> Replica:
        """The replica; raises ``UnavailableError`` while the node starts or waits
        out an unclean stop (saying for how long)."""
        if self.replica is None:
            if self.recovering_until is not None:
                left = max(0.0, self.recovering_until - self.clock.monotonic())
                raise UnavailableError(
                    f"node restarted after a machine crash with durability none; it "
                    f"rejoins the cluster in {left:.1f} s"
                )
            raise UnavailableError("node is starting")
        return self.replica

    # -------------------------------------------------------------- expiry

    async def _expiry_loop(self) -> None:
        """The leader's housekeeping entries (``tick``, ``reserve``), one at a time:

        * a ``reserve`` when fewer than half a ``TOKEN_RESERVE_STEP`` of fencing
          tokens are left below the ceiling (core.store);
        * at once after an election: an entry of its own term, the barrier before it
          may serve lease reads;
        * when a lease is due, so expired leases are removed (and waiters woken, and
          memory freed) even when no request touches them; every command also expires
          what is due, so this is for timeliness, not correctness;
        * at least every ``LOG_TIME_REFRESH`` seconds, so log time in the state never
          lags real time by more than that. A new leader continues log time from the
          last applied stamp: without these ticks an idle period before a failover
          would lengthen every lease by its whole length.
        """
        interval = self.config.heartbeat_interval
        last_tick = -1.0
        while True:
            await asyncio.sleep(interval)
            replica = self.replica
            if replica is None or self._tick_in_flight or not replica.is_leader():
                continue
            try:
                due = replica.store.next_deadline()
            except IndexError:  # raced with the tick thread popping the heap
                continue
            term = replica.term()
            store = replica.store
            if store.term == term and store.ceiling - store.revision < (
                TOKEN_RESERVE_STEP // 2 + store.token_headroom()
            ):
                # Reserve the next step of fencing tokens long before the ceiling
                # (core.store): this entry is synced in either durability mode.
                self._tick_in_flight = True
                try:
                    await self.propose({"op": "reserve"})
                except RaftLeaseError as exc:
                    log.debug("reserve not applied: %s", exc)
                finally:
                    self._tick_in_flight = False
                continue
            now_mono = self.clock.monotonic()
            stamp = self.log_clock.stamp(term, replica.store.now)
            flush_at = self.proposer.keepalives.next_flush_at() if self.proposer else None
            needed = (
                replica.store.term < term
                or now_mono - last_tick >= LOG_TIME_REFRESH
                or (due is not None and due <= stamp)
                # Keep-alives answered from memory, due for the log: a tick's flush
                # writes them (server/keepalive.py).
                or (flush_at is not None and flush_at <= stamp)
            )
            if not needed:
                continue
            self._tick_in_flight = True
            last_tick = now_mono
            try:
                await self.propose({"op": "tick"})
            except RaftLeaseError as exc:
                log.debug("tick not applied: %s", exc)
            finally:
                self._tick_in_flight = False

    async def _heap_loop(self) -> None:
        """Every ``heap_trim_interval`` seconds, hand the heap's free pages back to the
        kernel (server/heap.py: without it a node that runs for hours keeps growing by
        freed memory the allocator cannot return). On the event loop: a trim takes
        milliseconds at most at a node's size. Off with 0, or where the C library
        has no ``malloc_trim`` (logged once)."""
        interval = self.config.heap_trim_interval
        if interval <= 0:
            return
        trimmer = HeapTrimmer()
        if not trimmer.available:
            log.info("heap trimming off: this C library has no malloc_trim")
            return
        while True:
            await asyncio.sleep(interval)
            trimmer.trim()
            if self.metrics is not None:
                self.metrics.heap_trims.inc()
                self.metrics.heap_trim_seconds.set(trimmer.last_seconds)
            if trimmer.last_seconds > 0.05:  # a heap far larger than a node's should be
                log.warning("heap trim took %.3f s", trimmer.last_seconds)


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
    asyncio.run(NodeServer(config, hooks, parent_pid).run())
