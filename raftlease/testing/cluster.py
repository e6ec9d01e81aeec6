"""Run a real local cluster of node processes: for tests, ``raftlease up``, the
benchmark and the chaos suite (hashicorp/raft's ``MakeCluster`` idea, with real
processes on 127.0.0.1 instead of in-memory transports).

Each node runs as ``python -m raftlease node --config <data>/<id>/node.toml
--parent-pid <this process>`` with its stderr in ``<data>/<id>/node.log``; with
``hooks`` (a planted bug, clock control) it runs the test build instead, ``python -m
raftlease.testing.node`` (the production node has no way to enable them). Either stops
by itself about a second after this process is gone, however it ended (SIGKILL
included; ``raftlease.server.launcher``). Nothing here sleeps to guess: waits poll a
condition until a deadline and raise ``TimeoutError`` naming what did not happen.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ..client import Client
from ..config import NodeAddress, bind_probe, local_cluster
from ..errors import RaftLeaseError
from ..server.auth import token_digest
from .certs import ClusterCerts
from .hooks import hook_arguments
from .power import PAGE, cut_to_synced

T = TypeVar("T")

#: Node settings for test clusters: short timers, but not tight ones (tight timers
#: cause needless elections on a loaded 2-core machine, PySyncObj trap 9).
TEST_SETTINGS: dict[str, Any] = {
    "election_timeout_min": 0.4,
    "election_timeout_max": 0.9,
    "heartbeat_interval": 0.05,
    "connection_retry": 0.3,
    "request_timeout": 3.0,
    "min_ttl": 0.2,
}

#: All the ports test clusters may use: below the ephemeral range (32768+) so that
#: outgoing connections' source ports never collide with a node's listening port.
FULL_PORT_RANGE = (20000, 32000)


def worker_port_range(
    full: tuple[int, int] = FULL_PORT_RANGE, environ: Mapping[str, str] = os.environ
) -> tuple[int, int]:
    """This process's share of ``full``. Under pytest-xdist (scripts/test runs two
    workers) each worker gets its own slice, by ``PYTEST_XDIST_WORKER`` (gw0, gw1, ...)
    and ``PYTEST_XDIST_WORKER_COUNT``: a port is probed free and bound only seconds
    later, so two workers drawing from one range could both pick the same free block.
    Processes a test starts inherit the variables and stay in its slice too (the chaos
    harness, jepsen-style/run.py). Outside xdist: the whole range."""
    worker, count = (
        environ.get("PYTEST_XDIST_WORKER", ""),
        environ.get("PYTEST_XDIST_WORKER_COUNT", ""),
    )
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return full
    index, workers = int(worker[2:]), int(count)
    if not 0 <= index < workers:
        return full
    low, high = full
    size = (high - low) // workers
    return (low + index * size, low + (index + 1) * size)


#: The ports this process's test clusters are drawn from (``worker_port_range``).
PORT_RANGE = worker_port_range()


def wait_for(
    condition: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.05,
) -> T:
    """Poll ``condition`` until it returns a truthy value; return that value.
    Raises ``TimeoutError(what)`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except (RaftLeaseError, OSError) as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc})" if last_exc else ""
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}{detail}")
        time.sleep(interval)


def port_free(port: int) -> bool:
    """True if ``port`` on 127.0.0.1 can be bound now (``config.bind_probe``)."""
    try:
        bind_probe(f"127.0.0.1:{port}")
    except OSError:
        return False
    return True


def free_port_block(count: int, seed: int | None = None) -> int:
    """A base port such that ``base .. base+count-1``, ``base+100 ..`` (raft) and
    ``base+200 ..`` (the admin ports ``raftlease up`` picks) are free."""
    low, high = PORT_RANGE
    start = (seed if seed is not None else os.getpid() * 7 + int(time.time() * 1000)) % (
        high - low - 300
    )
    for offset in range(0, high - low - 300, 10):
        base = low + (start + offset) % (high - low - 300)
        ports = [base + step + i for step in (0, 100, 200) for i in range(count)]
        if all(port_free(p) for p in ports):
            return base
    raise RuntimeError(f"no free block of {count} ports in {PORT_RANGE}")


class LocalCluster:
    """A cluster of ``count`` node processes on 127.0.0.1.

    ``settings`` are extra ``NodeConfig`` fields written into every node's TOML.
    Peer TLS is set up unless ``settings`` name their own ``peer_cert_file``: a CA
    and one member certificate per node in ``<data_dir>/certs`` (``ClusterCerts``),
    issued when a node's config is first written (a node added later gets one too).
    ``hooks`` starts every node as the test build with these test hooks
    (``raftlease.testing.hooks``: ``{"clock_control": True}``, ``{"planted_bug":
    "fast_log_clock"}``); ``node_hooks`` does so per node id.
    Use as a context manager (stops and, if it made it, removes the data directory).
    """

    def __init__(
        self,
        count: int = 3,
        *,
        client_port: int | None = None,
        data_dir: str | Path | None = None,
        settings: dict[str, Any] | None = None,
        node_settings: dict[str, dict[str, Any]] | None = None,
        python: str = sys.executable,
        quiet: bool = True,
        hooks: dict[str, Any] | None = None,
        node_hooks: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.count = count
        base = client_port if client_port is not None else free_port_block(count)
        self.nodes: tuple[NodeAddress, ...] = local_cluster(count, base)
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="raftlease-"))
        self.settings = dict(settings or {})
        # Per-node overrides of ``settings`` (e.g. ``dial`` through a proxy).
        self.node_settings = {k: dict(v) for k, v in (node_settings or {}).items()}
        self.python = python
        self.quiet = quiet
        self.hooks = dict(hooks or {})
        self.node_hooks = {k: dict(v) for k, v in (node_hooks or {}).items()}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.certs = ClusterCerts(self.data_dir / "certs")

    # ------------------------------------------------------------- layout

    @property
    def endpoints(self) -> list[str]:
        return [n.client for n in self.nodes]

    def node(self, node_id: str) -> NodeAddress:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(node_id)

    def node_dir(self, node_id: str) -> Path:
        return self.data_dir / node_id

    def config_path(self, node_id: str) -> Path:
        return self.node_dir(node_id) / "node.toml"

    def log_path(self, node_id: str) -> Path:
        return self.node_dir(node_id) / "node.log"

    def write_config(self, node_id: str) -> Path:
        lines = [f'node_id = "{node_id}"', 'data_dir = "."']
        settings = {**self.settings, **self.node_settings.get(node_id, {})}
        hooks = {**self.hooks, **self.node_hooks.get(node_id, {})}
        if "peer_cert_file" not in settings and not hooks.get("plain_peers"):
            settings.update(self.certs.settings(node_id))
        for key, value in sorted(settings.items()):
            lines.append(f"{key} = {_toml_value(value)}")
        for node in self.nodes:
            lines += [
                "",
                "[[nodes]]",
                f'id = "{node.id}"',
                f'raft = "{node.raft}"',
                f'client = "{node.client}"',
            ]
        path = self.config_path(node_id)
        # The node's data directory: private, as the node would make it anyway.
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_text("\n".join(lines) + "\n")
        return path

    # ---------------------------------------------------------- processes

    def start(self, wait: bool = True, timeout: float = 30.0) -> LocalCluster:
        """Start every node; with ``wait``, return once a leader is agreed on and every
        node still running answers (and agrees on it)."""
        for node in self.nodes:
            self.start_node(node.id)
        if wait:
            deadline = time.monotonic() + timeout
            self.wait_for_leader(timeout)
            # A leader needs only a majority: on a loaded machine the last node may not
            # listen yet (a test that asked it at once was refused its connection).
            wait_for(
                self._every_running_node_answers,
                max(deadline - time.monotonic(), 5.0),
                "every running node answering, with the agreed leader",
            )
        return self

    def _every_running_node_answers(self) -> bool:
        reachable = {s.get("client") for s in self.statuses() if s.get("reachable")}
        running = [n.client for n in self.nodes if self.is_running(n.id)]
        return all(c in reachable for c in running) and self.leader() is not None

    def start_node(self, node_id: str) -> subprocess.Popen[bytes]:
        if node_id in self.procs and self.procs[node_id].poll() is None:
            raise RuntimeError(f"node {node_id} is already running")
        config = self.write_config(node_id)
        log = open(self.log_path(node_id), "ab")  # noqa: SIM115 - owned by the child
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        hooks = {**self.hooks, **self.node_hooks.get(node_id, {})}
        if hooks:
            command = [self.python, "-m", "raftlease.testing.node", "--config", str(config)]
            command += hook_arguments(hooks)
        else:
            command = [self.python, "-m", "raftlease", "node", "--config", str(config)]
        # The node stops by itself once this process is gone: a launcher killed with
        # SIGKILL (raftlease up, a pytest timeout) leaves no orphan (server/launcher.py).
        command += ["--parent-pid", str(os.getpid())]
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        log.close()
        self.procs[node_id] = proc
        return proc

    # ---------------------------------------------------------- membership

    def new_node(self, node_id: str | None = None, client_port: int | None = None) -> NodeAddress:
        """Addresses for a node to add (free ports, client and raft 100 apart), made
        part of this cluster's layout so that its config, and every config written from
        now on, lists it beside the current members (docs/membership.md). It is not a
        member until ``raftlease member add`` commits; start it with ``start_node``.
        ``client_port``: its client port (raft 100 above), instead of a free block."""
        taken = {n.id for n in self.nodes}
        if node_id is None:
            node_id = next(f"n{i}" for i in range(1, 1000) if f"n{i}" not in taken)
        if node_id in taken:
            raise ValueError(f"{node_id} is already in this cluster")
        base = client_port if client_port is not None else free_port_block(1)
        node = NodeAddress(node_id, f"127.0.0.1:{base + 100}", f"127.0.0.1:{base}")
        self.nodes = (*self.nodes, node)
        return node

    def forget_node(self, node_id: str) -> None:
        """Take a removed member out of this cluster's layout (its process, if still
        running, is stopped; its data directory and log stay for inspection)."""
        if self.is_running(node_id):
            self.stop_node(node_id)
        self.nodes = tuple(n for n in self.nodes if n.id != node_id)

    def pid(self, node_id: str) -> int:
        return self.procs[node_id].pid

    def is_running(self, node_id: str) -> bool:
        proc = self.procs.get(node_id)
        return proc is not None and proc.poll() is None

    def kill_node(self, node_id: str) -> None:
        """SIGKILL the node and reap it."""
        proc = self.procs[node_id]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_node(self, node_id: str, timeout: float = 10.0) -> int:
        """SIGTERM the node and wait for a clean exit; returns the exit code."""
        proc = self.procs[node_id]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
                raise RuntimeError(f"node {node_id} did not stop within {timeout} s") from None
        return int(proc.returncode)

    def power_loss(
        self,
        node_ids: list[str] | None = None,
        writeback: random.Random | None = None,
        unit: int = PAGE,
    ) -> dict[str, Any]:
        """A simulated power loss of ``node_ids`` (default: every node): SIGKILL each,
        then cut its files back to what reached stable storage (``power.cut_to_synced``;
        the nodes must run with the ``record_synced`` hook), keeping with
        ``writeback`` a random half of the journal pages (or with ``unit=SECTOR``
        sectors) written since the last sync (torn writes). They stay stopped; start
        them with ``start_node``. Returns what was cut, per node."""
        ids = node_ids if node_ids is not None else [n.id for n in self.nodes]
        for node_id in ids:
            self.kill_node(node_id)
        return {node_id: cut_to_synced(self.node_dir(node_id), writeback, unit) for node_id in ids}

    def pause_node(self, node_id: str) -> None:
        os.kill(self.pid(node_id), signal.SIGSTOP)

    def resume_node(self, node_id: str) -> None:
        os.kill(self.pid(node_id), signal.SIGCONT)

    def restart_node(self, node_id: str) -> None:
        self.stop_node(node_id)
        self.start_node(node_id)

    def stop(self) -> None:
        """Stop every node this cluster started (SIGCONT first, in case paused)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ queries

    @property
    def client_options(self) -> dict[str, Any]:
        """What a client of this cluster needs: TLS (trusting the CA of
        ``tls_client_ca_file``, which signs the nodes' certificates in
        ``testing.certs.secure_bundle``) when the nodes serve it."""
        if not self.settings.get("tls_cert_file"):
            return {}
        return {"tls": self.settings.get("tls_client_ca_file") or True}

    def client(self, **options: Any) -> Client:
        return Client(self.endpoints, **{**self.client_options, **options})

    @property
    def status_options(self) -> dict[str, Any]:
        """``client_options`` plus, on a cluster made from ``certs.secure_bundle``, its
        admin token (``admin.token`` beside the auth file): with an auth file a node
        shows all of its status only to an admin (docs/security.md), and the harness
        reads terms and indexes from it."""
        options = dict(self.client_options)
        auth_file = self.settings.get("auth_file")
        if auth_file:
            token_file = Path(str(auth_file)).with_name("admin.token")
            if token_file.is_file():
                token = token_file.read_text().strip()
                # Only the bundle's own auth file knows that token: a cluster with an
                # auth file of its own beside a bundle (the bench's secure cluster)
                # keeps its clients' token, which still sees the leader fields.
                if token_digest(token) in Path(str(auth_file)).read_text():
                    options["token"] = token
        return options

    def node_status(self, node_id: str, timeout: float = 2.0) -> dict[str, Any]:
        """``node_id``'s own status, asked over its client port (``statuses`` asks
        every node and reports the unreachable ones instead). Raises
        ``RaftLeaseError`` if it does not answer within ``timeout``."""
        addr = self.node(node_id).client
        with Client([addr], **self.status_options) as c:
            return c.node_status(addr, timeout=timeout)

    def statuses(self, timeout: float = 1.0) -> list[dict[str, Any]]:
        with Client(self.endpoints, **self.status_options) as c:
            return c.cluster_status(timeout=timeout)

    def leader(self, timeout: float = 1.0) -> dict[str, Any] | None:
        """The status of the node that is leader and that every reachable running
        node agrees on, or None."""
        statuses = [s for s in self.statuses(timeout) if s.get("reachable")]
        leaders = [s for s in statuses if s.get("role") == "leader"]
        if len(leaders) != 1:
            return None
        leader = leaders[0]
        if any(s.get("leader") != leader["client"] for s in statuses):
            return None
        return leader

    def wait_for_leader(self, timeout: float = 30.0, exclude: str | None = None) -> dict[str, Any]:
        """Wait until one leader is agreed on (and is not ``exclude``); returns its status."""

        def check() -> dict[str, Any] | None:
            leader = self.leader()
            if leader is None or leader["node"] == exclude:
                return None
            return leader

        return wait_for(check, timeout, "an agreed leader")

    def leader_id(self, timeout: float = 30.0) -> str:
        return str(self.wait_for_leader(timeout)["node"])

    def logs(self, tail: int = 80) -> str:
        out = []
        for node_id in dict.fromkeys([n.id for n in self.nodes] + list(self.procs)):
            path = self.log_path(node_id)
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-tail:]
                out.append(f"----- {node_id} ({path}) -----")
                out.extend(lines)
        return "\n".join(out)


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        items = ", ".join(f'"{k}" = {_toml_value(v)}' for k, v in sorted(value.items()))
        return "{ " + items + " }"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


@contextlib.contextmanager
def running_cluster(count: int = 3, **options: Any) -> Iterator[LocalCluster]:
    """``with running_cluster(3) as cluster:`` starts, waits for a leader, cleans up."""
    cluster = LocalCluster(count, **options)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
