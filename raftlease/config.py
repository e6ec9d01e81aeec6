"""Node configuration: frozen, defaulted, cross-validated.

Every check that involves two values names both in its message (hashicorp/raft's
``ValidateConfig`` style). A config comes from keyword arguments, from CLI options or
from a TOML file (see ``cluster/*.toml`` for commented examples).
"""

from __future__ import annotations

import ipaddress
import math
import socket
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .limits import (
    DEFAULT_COMPLETED_TASKS,
    DEFAULT_PRINCIPAL_QUEUES,
    DEFAULT_PRINCIPAL_TASKS,
    MAX_KEY_BYTES,
    MAX_LIST,
    MAX_OWNER_BYTES,
    MAX_TTL_MS,
)

#: Settings that name files; relative paths in a TOML file are taken from its folder,
#: and ``{id}`` in them stands for the node's id (one file can serve every node).
FILE_SETTINGS = (
    "peer_ca_file",
    "peer_cert_file",
    "peer_key_file",
    "peer_crl_file",
    "tls_cert_file",
    "tls_key_file",
    "tls_client_ca_file",
    "auth_file",
)

#: Settings of older builds that no longer exist, and what replaced them.
REMOVED_SETTINGS = {
    "peer_secret_file": "peers authenticate with mutual TLS now: set peer_ca_file, "
    "peer_cert_file and peer_key_file instead (CHANGELOG, 'Upgrading to peer TLS')",
    "peer_keys_dir": "peers authenticate with mutual TLS now: a member's certificate "
    "names it, no public key files are copied (CHANGELOG, 'Upgrading to peer TLS')",
}
#: The longest peer frame by default (``max_peer_frame``; replication/peers.py).
DEFAULT_MAX_PEER_FRAME = 32 << 20

#: Values of ``NodeConfig.durability``.
DURABILITY_MODES = ("fsync", "none")
#: Values of ``NodeConfig.keepalives``.
KEEPALIVE_MODES = ("memory", "log")


def is_loopback(host: str) -> bool:
    """Is ``host`` a loopback address (or the name localhost)?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def bind_probe(address: str, what: str = "address") -> None:
    """Bind (and close at once) a TCP socket on ``address`` with ``SO_REUSEADDR``, as
    PySyncObj and asyncio bind their listeners: whether a listener could take it now.
    Raises ``OSError`` if not (taken, not ours), ``ConfigError`` if malformed."""
    host, port = parse_addr(address, what)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


def parse_addr(addr: str, what: str = "address") -> tuple[str, int]:
    """Split ``"host:port"``; raises ``ConfigError`` naming ``what`` when malformed."""
    if not isinstance(addr, str) or ":" not in addr:
        raise ConfigError(f"{what} {addr!r} must look like host:port")
    host, _, port_text = addr.rpartition(":")
    host = host.strip("[]")
    if not host:
        raise ConfigError(f"{what} {addr!r} has no host")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{what} {addr!r} has a non-numeric port") from None
    if not 0 < port < 65536:
        raise ConfigError(f"{what} {addr!r} has port {port} outside 1..65535")
    return host, port


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """One member of the cluster: its id, Raft address and client address."""

    id: str
    raft: str
    client: str


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Configuration of one node. Build with ``NodeConfig.create`` or ``load_toml``;
    both validate. Times are seconds."""

    node_id: str
    nodes: tuple[NodeAddress, ...]
    data_dir: Path
    # Raft timers (PySyncObj): see docs/configuration.md for how they relate.
    election_timeout_min: float = 0.4
    election_timeout_max: float = 1.0
    heartbeat_interval: float = 0.05
    connection_retry: float = 0.5
    connection_timeout: float = 3.0
    leader_fallback: float = 1.0
    # Leases.
    min_ttl: float = 0.5
    max_ttl: float = 3600.0
    clock_drift: float = 0.01
    # Request limits.
    max_frame: int = 1 << 20
    max_key_bytes: int = 512
    max_owner_bytes: int = 256
    max_list: int = 10_000
    max_connections: int = 1024
    # Unsent answers one client connection may have queued before the node stops
    # reading it (server/output_gate.py): a peer that does not read cannot grow the
    # node's memory.
    max_conn_output: int = 8 << 20
    request_timeout: float = 5.0
    # A started request frame must arrive whole within frame_timeout; a connection
    # with nothing in flight and nothing received for idle_timeout is closed.
    frame_timeout: float = 10.0
    idle_timeout: float = 900.0
    # Snapshot (log compaction) after this many entries or seconds.
    compaction_min_entries: int = 50_000
    compaction_min_time: float = 30.0
    # "fsync": no entry is acknowledged before it is on stable storage (group commit);
    # "none": the journal is left to the kernel's writeback (docs/configuration.md).
    durability: str = "fsync"
    # "memory": the leader answers renewals and session keep-alives from memory and
    # writes them into the log in batches later; "log": each one is a log write
    # (docs/configuration.md, docs/design.md "Keep-alives from memory").
    keepalives: str = "memory"
    # Seconds between returns of the node's free heap pages to the kernel (glibc's
    # malloc_trim, server/heap.py); 0 turns it off.
    heap_trim_interval: float = 30.0
    # The survivors of each full garbage collection are frozen (gc.freeze), so the
    # next one scans only newer objects, and unfrozen every this many seconds so that
    # cyclic garbage among them is collected (gc_pauses.py); 0: CPython's default.
    gc_unfreeze_interval: float = 600.0
    # Seconds a thread may hold the GIL while another waits for it
    # (sys.setswitchinterval; Python's default 5 ms): the raft tick thread, which sends
    # heartbeats, waits up to this long for each turn beside a busy event loop; 0 leaves
    # Python's default (docs/configuration.md).
    switch_interval: float = 0.001
    # Admission control (server/overload.py): while the event loop runs more than
    # this many seconds behind (median of the last second), the leader refuses new
    # lease sessions with OVERLOADED so the sessions it has keep being served; 0: off.
    overload_lag: float = 0.2
    # Mutual TLS between members (docs/security.md, "Peers"): the cluster CA, this
    # node's certificate (it names the node: urn:raftlease:member:<id>) and key, and
    # optionally a revocation list. Required; SIGHUP reads them again.
    peer_ca_file: str = ""
    peer_cert_file: str = ""
    peer_key_file: str = ""
    peer_crl_file: str = ""
    # The longest peer frame (bytes): a peer sending a longer one is disconnected
    # as soon as its length is read.
    max_peer_frame: int = DEFAULT_MAX_PEER_FRAME
    # Clients (docs/security.md): TLS on the client port, client certificates signed
    # by tls_client_ca_file, tokens and roles from auth_file. A node refuses to serve
    # clients on a non-loopback address without TLS and an auth file unless insecure.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    auth_file: str = ""
    insecure: bool = False
    # The HTTP admin endpoint (/metrics, /livez, /readyz, /status; docs/operations.md):
    # "host:port", "" for none. HTTPS with tls_cert_file, an admin token for /metrics
    # and /status with auth_file; beyond loopback only with both, or insecure.
    admin_address: str = ""
    # Quotas per authenticated principal (with auth_file).
    max_leases_per_principal: int = 10_000
    max_sessions_per_principal: int = 1_000
    max_connections_per_principal: int = 256
    # Queued acquires of one principal (they count toward max_leases_per_principal
    # too); stamped into acquire entries and decided by the state machine.
    max_waiters_per_principal: int = 1_000
    # Live watches on one node (node-local: watches are not replicated).
    max_watches_per_principal: int = 256
    max_watches_per_node: int = 4_096
    # Long-polls (await_lease, await_claim, await_task) parked on one node at once:
    # of one authenticated principal, and from everyone (node-local, like watches).
    max_long_polls_per_principal: int = 1_000
    max_long_polls_per_node: int = 4_096
    # Queued acquires from everyone, on every key together; stamped into acquire
    # entries and decided by the state machine (replicated, like the waiter quota).
    max_waiters_total: int = 100_000
    # Connections that have not authenticated (docs/security.md, "Client port
    # limits"): with auth_file at most max_unauthenticated_connections at once, each
    # closed unless it authenticates within auth_timeout; from one source address at
    # most max_connections_per_address of them (without auth_file: every connection).
    max_unauthenticated_connections: int = 64
    auth_timeout: float = 10.0
    max_connections_per_address: int = 256
    # Tasks one task queue may hold that are not completed (docs/queues.md).
    max_queue_tasks: int = 250_000
    # Completed tasks the cluster retains, across all queues: stamped into each
    # completion; beyond it the oldest completed task is dropped (docs/queues.md).
    max_completed_tasks: int = DEFAULT_COMPLETED_TASKS
    # Tasks one authenticated principal put that are not completed (ready, delayed,
    # claimed or dead: a dead task is kept until purged or retried, so it holds memory
    # too), and distinct queues it holds them in. Stamped into each authenticated put
    # and decided by the state machine (docs/security.md); completed tasks are bounded
    # by max_completed_tasks instead.
    max_tasks_per_principal: int = DEFAULT_PRINCIPAL_TASKS
    max_queues_per_principal: int = DEFAULT_PRINCIPAL_QUEUES
    # Priority aging of task queues: seconds of waiting (ready) worth one priority
    # level; 0 is strict priority. Stamped into each put by the leader (docs/queues.md).
    task_priority_aging: float = 10.0
    # Task queues /metrics shows one by one (the deepest); the rest are summed as
    # queue="_other", so queue names a client invents cannot grow a scrape.
    metrics_max_queues: int = 20
    # Where to dial a peer instead of its raft address (node id -> host:port), e.g. a
    # fault-injecting proxy. The peer keeps its identity (its raft address).
    dial: dict[str, str] = field(default_factory=dict)

    # ---------------------------------------------------------------- derived

    @property
    def self_node(self) -> NodeAddress:
        for node in self.nodes:
            if node.id == self.node_id:
                return node
        raise ConfigError(f"node_id {self.node_id!r} is not among nodes")  # pragma: no cover

    @property
    def peers(self) -> tuple[NodeAddress, ...]:
        return tuple(n for n in self.nodes if n.id != self.node_id)

    @property
    def journal_file(self) -> Path:
        return self.data_dir / "raft.journal"

    @property
    def dump_file(self) -> Path:
        return self.data_dir / "raft.dump"

    def client_addr_for_raft(self, raft_addr: str) -> str | None:
        for node in self.nodes:
            if node.raft == raft_addr:
                return node.client
        return None

    # ------------------------------------------------------------- building

    @classmethod
    def create(cls, **values: Any) -> NodeConfig:
        """Build and validate. ``nodes`` may be ``NodeAddress`` objects or dicts with
        ``id``, ``raft`` and ``client``."""
        known = {f.name for f in fields(cls)}
        removed = sorted(set(values) & set(REMOVED_SETTINGS))
        if removed:
            raise ConfigError(
                "; ".join(f"{name} was removed: {REMOVED_SETTINGS[name]}" for name in removed)
            )
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown configuration keys: {', '.join(unknown)}")
        nodes = []
        for raw in values.get("nodes", ()):
            if isinstance(raw, NodeAddress):
                nodes.append(raw)
            elif isinstance(raw, dict) and set(raw) == {"id", "raft", "client"}:
                nodes.append(NodeAddress(str(raw["id"]), str(raw["raft"]), str(raw["client"])))
            else:
                raise ConfigError(f"each node needs exactly id, raft and client; got {raw!r}")
        values["nodes"] = tuple(nodes)
        if "data_dir" in values:
            values["data_dir"] = Path(values["data_dir"])
        for name in ("node_id", "data_dir"):
            if name not in values:
                raise ConfigError(f"missing required setting {name!r}")
        node_id = values["node_id"]
        for name in FILE_SETTINGS:
            value = values.get(name)
            if isinstance(value, str) and isinstance(node_id, str):
                values[name] = value.replace("{id}", node_id)
        config = cls(**values)
        config.validate()
        return config

    def with_changes(self, **changes: Any) -> NodeConfig:
        config = replace(self, **changes)
        config.validate()
        return config

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the values in conflict."""
        if not self.nodes:
            raise ConfigError("nodes: at least one node is required")
        ids = [n.id for n in self.nodes]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"node ids must be unique, got {ids}")
        addrs = [n.raft for n in self.nodes] + [n.client for n in self.nodes]
        if len(set(addrs)) != len(addrs):
            raise ConfigError(f"every raft and client address must be distinct, got {addrs}")
        for node in self.nodes:
            parse_addr(node.raft, f"raft address of node {node.id!r}")
            parse_addr(node.client, f"client address of node {node.id!r}")
        if self.node_id not in ids:
            raise ConfigError(f"node_id {self.node_id!r} is not among the node ids {ids}")
        if not isinstance(self.dial, dict):
            raise ConfigError(f"dial must be a table of node id -> host:port, got {self.dial!r}")
        for peer_id, addr in self.dial.items():
            if peer_id not in ids or peer_id == self.node_id:
                raise ConfigError(
                    f"dial names {peer_id!r}, which is not a peer of {self.node_id!r}"
                )
            parse_addr(addr, f"dial address for {peer_id!r}")
        for name in (
            "election_timeout_min",
            "election_timeout_max",
            "heartbeat_interval",
            "connection_retry",
            "connection_timeout",
            "leader_fallback",
            "min_ttl",
            "max_ttl",
            "request_timeout",
            "compaction_min_time",
            "frame_timeout",
            "idle_timeout",
            "auth_timeout",
        ):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        for name in (
            "max_frame",
            "max_key_bytes",
            "max_owner_bytes",
            "max_list",
            "max_connections",
            "max_conn_output",
            "compaction_min_entries",
            "max_leases_per_principal",
            "max_sessions_per_principal",
            "max_connections_per_principal",
            "max_waiters_per_principal",
            "max_watches_per_principal",
            "max_watches_per_node",
            "max_long_polls_per_principal",
            "max_long_polls_per_node",
            "max_waiters_total",
            "max_unauthenticated_connections",
            "max_connections_per_address",
            "max_queue_tasks",
            "max_completed_tasks",
            "max_tasks_per_principal",
            "max_queues_per_principal",
            "max_peer_frame",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        trim = self.heap_trim_interval
        if not _is_number(trim) or not math.isfinite(trim) or trim < 0:
            raise ConfigError(
                f"heap_trim_interval must be 0 (off) or a positive number of seconds, got {trim!r}"
            )
        unfreeze = self.gc_unfreeze_interval
        if not _is_number(unfreeze) or not math.isfinite(unfreeze) or unfreeze < 0:
            raise ConfigError(
                "gc_unfreeze_interval must be 0 (off) or a positive number of seconds, "
                f"got {unfreeze!r}"
            )
        switch = self.switch_interval
        if (
            not _is_number(switch)
            or not math.isfinite(switch)
            or not (switch == 0 or 0.0001 <= switch <= 0.1)
        ):
            raise ConfigError(
                "switch_interval must be 0 (Python's default) or a number of seconds from "
                f"0.0001 to 0.1, got {switch!r}"
            )
        lag = self.overload_lag
        if not _is_number(lag) or not math.isfinite(lag) or not (lag == 0 or 0.01 <= lag <= 60):
            raise ConfigError(
                f"overload_lag must be 0 (off) or a number of seconds from 0.01 to 60, got {lag!r}"
            )
        aging = self.task_priority_aging
        if not _is_number(aging) or not math.isfinite(aging) or not 0 <= aging <= 86400:
            raise ConfigError(
                "task_priority_aging must be 0 (strict priority) or a number of seconds "
                f"up to 86400, got {aging!r}"
            )
        shown = self.metrics_max_queues
        if not isinstance(shown, int) or isinstance(shown, bool) or not 0 <= shown <= 1000:
            raise ConfigError(
                f"metrics_max_queues must be an integer from 0 to 1000, got {shown!r}"
            )
        for name in FILE_SETTINGS:
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name} must be a path, got {getattr(self, name)!r}")
        if not isinstance(self.insecure, bool):
            raise ConfigError(f"insecure must be true or false, got {self.insecure!r}")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError("tls_cert_file and tls_key_file go together: give both or neither")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ConfigError(
                "tls_client_ca_file needs tls_cert_file (client certificates need TLS)"
            )
        host, _ = parse_addr(self.self_node.client, "client address")
        secured = bool(self.tls_cert_file and self.auth_file)
        if not is_loopback(host) and not secured and not self.insecure:
            raise ConfigError(
                f"protected mode: the client address {self.self_node.client} is not "
                "loopback, and clients would be neither encrypted nor authenticated. "
                "Set tls_cert_file, tls_key_file and auth_file (docs/security.md), or "
                "insecure = true to accept the risk."
            )
        if not isinstance(self.admin_address, str):
            raise ConfigError(
                f"admin_address must be host:port or empty, got {self.admin_address!r}"
            )
        if self.admin_address:
            admin_host, _ = parse_addr(self.admin_address, "admin_address")
            if self.admin_address in addrs:
                raise ConfigError(
                    f"admin_address {self.admin_address} is also a raft or client address"
                )
            if not is_loopback(admin_host) and not secured and not self.insecure:
                raise ConfigError(
                    f"protected mode: admin_address {self.admin_address} is not loopback, "
                    "and its metrics and status would be neither encrypted nor "
                    "authenticated. Set tls_cert_file, tls_key_file and auth_file (it then "
                    "serves HTTPS and wants an admin token), or insecure = true "
                    "(docs/operations.md)."
                )
        if self.durability not in DURABILITY_MODES:
            raise ConfigError(
                f"durability must be one of {', '.join(DURABILITY_MODES)}, got {self.durability!r}"
            )
        if self.keepalives not in KEEPALIVE_MODES:
            raise ConfigError(
                f"keepalives must be one of {', '.join(KEEPALIVE_MODES)}, got {self.keepalives!r}"
            )
        if self.compaction_min_entries < 2:
            raise ConfigError(
                f"compaction_min_entries must be at least 2, got {self.compaction_min_entries}"
            )
        # The server's limits must sit inside the state machine's hard caps, or the
        # state machine would reject requests the server accepted.
        for name, cap in (
            ("max_key_bytes", MAX_KEY_BYTES),
            ("max_owner_bytes", MAX_OWNER_BYTES),
            ("max_list", MAX_LIST),
        ):
            if getattr(self, name) > cap:
                raise ConfigError(f"{name} ({getattr(self, name)}) exceeds the hard cap of {cap}")
        if not _is_number(self.clock_drift):
            raise ConfigError(f"clock_drift must be a number, got {self.clock_drift!r}")
        if self.election_timeout_min >= self.election_timeout_max:
            raise ConfigError(
                f"election_timeout_min ({self.election_timeout_min}) must be below "
                f"election_timeout_max ({self.election_timeout_max})"
            )
        if self.heartbeat_interval * 3 >= self.election_timeout_min:
            raise ConfigError(
                f"heartbeat_interval ({self.heartbeat_interval}) must be less than a third of "
                f"election_timeout_min ({self.election_timeout_min}) or followers time out "
                "between heartbeats"
            )
        if self.connection_timeout <= self.election_timeout_max:
            raise ConfigError(
                f"connection_timeout ({self.connection_timeout}) must exceed "
                f"election_timeout_max ({self.election_timeout_max})"
            )
        if self.leader_fallback < self.election_timeout_max:
            raise ConfigError(
                f"leader_fallback ({self.leader_fallback}) must be at least "
                f"election_timeout_max ({self.election_timeout_max})"
            )
        if not 0 <= self.clock_drift < 0.5:
            raise ConfigError(f"clock_drift must be in [0, 0.5), got {self.clock_drift!r}")
        if self.min_ttl > self.max_ttl:
            raise ConfigError(f"min_ttl ({self.min_ttl}) must not exceed max_ttl ({self.max_ttl})")
        # The client trusts a lease for ttl * (1 - clock_drift) - margin; the smallest
        # TTL must leave a positive window (margin: one heartbeat).
        if self.min_ttl * (1 - self.clock_drift) <= self.heartbeat_interval:
            raise ConfigError(
                f"min_ttl ({self.min_ttl}) is too short for clock_drift ({self.clock_drift}) "
                f"and heartbeat_interval ({self.heartbeat_interval}): a client could never "
                "trust such a lease"
            )
        # The leader lease lasts election_timeout_min * (1 - clock_drift) minus a 10 ms
        # margin from a heartbeat's send time; it must outlast a heartbeat interval or
        # lease reads would never be possible.
        if self.election_timeout_min * (1 - self.clock_drift) - 0.01 <= self.heartbeat_interval:
            raise ConfigError(
                f"election_timeout_min ({self.election_timeout_min}) with clock_drift "
                f"({self.clock_drift}) leaves no leader lease beyond heartbeat_interval "
                f"({self.heartbeat_interval})"
            )
        if self.max_ttl * 1000 > MAX_TTL_MS:
            raise ConfigError(f"max_ttl ({self.max_ttl}) exceeds one year")
        if self.max_frame < 1024:
            raise ConfigError(f"max_frame ({self.max_frame}) must be at least 1024 bytes")
        # One log entry is at most a client frame plus its stamps, and PySyncObj
        # sends an entry larger than its 64 KiB batch alone: a peer frame must hold it.
        if self.max_peer_frame < 2 * self.max_frame + (1 << 16):
            raise ConfigError(
                f"max_peer_frame ({self.max_peer_frame}) must be at least twice max_frame "
                f"({self.max_frame}) plus 64 KiB, or a large entry could never be replicated"
            )
        if self.peer_crl_file and not self.peer_ca_file:
            raise ConfigError("peer_crl_file needs peer_ca_file (the CA whose list it is)")


def load_toml(path: str | Path, **overrides: Any) -> NodeConfig:
    """Read a node config from TOML. Top-level keys are ``NodeConfig`` fields;
    ``[[nodes]]`` tables list the members. ``overrides`` (e.g. from CLI options)
    replace file values. Relative ``data_dir`` is taken relative to the file."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8 text: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    raw.update({k: v for k, v in overrides.items() if v is not None})
    if "data_dir" in raw and not Path(raw["data_dir"]).is_absolute():
        raw["data_dir"] = path.parent / raw["data_dir"]
    for name in FILE_SETTINGS:
        value = raw.get(name)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            raw[name] = str(path.parent / value)
    return NodeConfig.create(**raw)


def local_cluster(
    count: int = 3,
    client_port: int = 7001,
    raft_port: int | None = None,
    host: str = "127.0.0.1",
) -> tuple[NodeAddress, ...]:
    """Addresses of a local cluster: client ports ``client_port..+count-1`` and Raft
    ports 100 above them (or from ``raft_port``)."""
    if count < 1:
        raise ConfigError(f"a cluster needs at least one node, got {count}")
    raft_base = raft_port if raft_port is not None else client_port + 100
    if raft_base < client_port + count and raft_base + count > client_port:
        raise ConfigError(
            f"raft ports {raft_base}.. overlap client ports "
            f"{client_port}..{client_port + count - 1}"
        )
    return tuple(
        NodeAddress(f"n{i + 1}", f"{host}:{raft_base + i}", f"{host}:{client_port + i}")
        for i in range(count)
    )
