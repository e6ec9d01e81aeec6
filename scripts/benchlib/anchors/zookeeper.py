"""ZooKeeper (Debian ``zookeeper`` 3.8 + a JRE) as an anchor: a 3-server ensemble on
127.0.0.1 driven through kazoo (pure Python; 2-3 threads per session).

The mapping of the workloads: acquire = ``create(key, ephemeral)``; renew =
``setData(key, version)`` (a log write); release = ``delete(key)``; read holder =
``get`` (served by the connected server); handoff = kazoo's ``Lock`` recipe.
Settings are the sample zoo.cfg's (tickTime 2000, initLimit 10, syncLimit 5) with
``forceSync=yes`` (fsync of the transaction log before every ack), ``-Xmx1000m``.

A ``ZkClient`` is one kazoo session used by one load thread; every call blocks for
at most its timeout and raises AnchorError on failure.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
from pathlib import Path
from typing import Any

from .common import AnchorCluster, AnchorError, Driver, ServerProc, free_ports

#: Where Debian puts ZooKeeper's jar (its manifest names the other jars).
CLASSPATH = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
JAR = Path("/usr/share/java/zookeeper.jar")
#: The JVM (a name on PATH).
JAVA = "java"


def installed() -> str | None:
    """None if a ZooKeeper ensemble and kazoo can run here, else why not."""
    if shutil.which(JAVA) is None:
        return f"{JAVA} not found on PATH (Debian: apt-get install default-jre-headless)"
    if not JAR.exists():
        return f"{JAR} not found (Debian: apt-get install zookeeper)"
    try:
        import kazoo  # type: ignore[import-untyped, import-not-found, unused-ignore]  # noqa: F401
    except ImportError:
        return "kazoo not installed (pip install -e '.[bench]')"
    return None


def config(data_dir: Path, client_port: int, quorum: list[tuple[int, int]]) -> str:
    """zoo.cfg of one server; ``quorum`` = (peer port, election port) per server."""
    lines = [
        "tickTime=2000",
        "initLimit=10",
        "syncLimit=5",
        f"dataDir={data_dir}",
        f"clientPort={client_port}",
        "clientPortAddress=127.0.0.1",
        "forceSync=yes",
        # srvr tells the bench which server leads; the admin HTTP server would
        # take port 8080 on every server.
        "4lw.commands.whitelist=srvr,ruok",
        "admin.enableServer=false",
        "maxClientCnxns=0",
    ]
    lines += [f"server.{i}=127.0.0.1:{p}:{e}" for i, (p, e) in enumerate(quorum, 1)]
    return "\n".join(lines) + "\n"


def command(cfg: Path, log_dir: Path) -> list[str]:
    return [
        JAVA,
        "-Xmx1000m",
        f"-Dzookeeper.log.dir={log_dir}",
        "-Dzookeeper.root.logger=INFO,CONSOLE",
        "-cp",
        CLASSPATH,
        MAIN_CLASS,
        str(cfg),
    ]


def parse_srvr(text: str) -> str | None:
    """The ``Mode:`` of a srvr reply (leader, follower, standalone), or None."""
    for line in text.splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


def four_letter(port: int, word: str = "srvr", timeout: float = 1.0) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(word.encode())
        chunks = []
        while True:
            data = s.recv(4096)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


class ZkCluster(AnchorCluster):
    """Three ZooKeeper servers; data dirs (with ``myid``) and configs under ``base``."""

    name = "zookeeper"

    def __init__(self, base: Path, size: int = 3) -> None:
        super().__init__(base, size)
        ports = free_ports(3 * size)
        self.client_ports = ports[:size]
        quorum = [(ports[size + i], ports[2 * size + i]) for i in range(size)]
        self._port_of: dict[str, int] = {}
        for i in range(size):
            name = f"zk{i + 1}"
            data = base / name
            data.mkdir(parents=True, exist_ok=True)
            (data / "myid").write_text(f"{i + 1}\n")
            cfg = base / f"{name}.cfg"
            cfg.write_text(config(data, self.client_ports[i], quorum))
            self.servers[name] = ServerProc(name, command(cfg, base), base / f"{name}.log", base)
            self._port_of[name] = self.client_ports[i]

    def mode(self, name: str) -> str | None:
        return parse_srvr(four_letter(self._port_of[name]))

    def leader(self) -> str | None:
        for name, server in self.servers.items():
            if server.alive():
                with contextlib.suppress(OSError):
                    if self.mode(name) == "leader":
                        return name
        return None

    def all_serving(self) -> bool:
        return all(
            self.mode(n) in ("leader", "follower") for n, s in self.servers.items() if s.alive()
        )

    def hosts_leader_first(self) -> str:
        """The kazoo hosts string with the leader first (kazoo connects to the first
        when not randomizing)."""
        leader = self.leader()
        names = sorted(self._port_of, key=lambda n: n != leader)
        return ",".join(f"127.0.0.1:{self._port_of[n]}" for n in names)


class ZkClient:
    """One kazoo session (its own connection and threads)."""

    def __init__(self, hosts: str, timeout: float = 5.0) -> None:
        from kazoo.client import KazooClient  # type: ignore[import-untyped, import-not-found, unused-ignore]

        self.timeout = timeout
        # kazoo logs every dropped connection as a warning; a failover drops them on
        # purpose (the failures are counted as errors instead).
        quiet = logging.getLogger("benchlib.kazoo")
        quiet.setLevel(logging.ERROR)
        self.kazoo = KazooClient(hosts=hosts, timeout=10.0, randomize_hosts=False, logger=quiet)
        self.kazoo.start(timeout=30)
        self.versions: dict[str, int] = {}
        #: Keys this client created for renew/reads, and to release (set by run.py).
        self.pool: list[str] = []
        self.release_pool: list[str] = []
        self._locks: dict[str, Any] = {}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.kazoo.stop()
        with contextlib.suppress(Exception):
            self.kazoo.close()

    def _wait(self, async_result: Any, what: str) -> Any:
        # get(timeout): the call's deadline; kazoo raises its handler's timeout
        # exception or a KazooException (ConnectionLoss, NodeExists, ...).
        try:
            return async_result.get(timeout=self.timeout)
        except Exception as exc:
            raise AnchorError(f"zookeeper {what}: {type(exc).__name__}: {exc}") from exc

    def ensure(self, path: str) -> None:
        try:
            self.kazoo.ensure_path(path)
        except Exception as exc:
            raise AnchorError(f"zookeeper ensure {path}: {exc}") from exc

    def acquire(self, path: str, owner: str = "bench-agent") -> None:
        self._wait(self.kazoo.create_async(path, owner.encode(), ephemeral=True), "create")
        self.versions[path] = 0

    def renew(self, path: str) -> None:
        stat = self._wait(
            self.kazoo.set_async(path, b"renewed", self.versions.get(path, -1)), "setData"
        )
        self.versions[path] = int(stat.version)

    def release(self, path: str) -> None:
        self._wait(self.kazoo.delete_async(path), "delete")
        self.versions.pop(path, None)

    def lock_unlock(self, path: str) -> None:
        """kazoo's Lock recipe (sequential ephemeral child, watch of the
        predecessor): acquire within the timeout, then release."""
        lock = self._locks.get(path)
        if lock is None:
            lock = self._locks[path] = self.kazoo.Lock(path, "bench")
        try:
            if not lock.acquire(timeout=max(self.timeout, 30.0)):
                raise AnchorError(f"zookeeper lock {path}: not acquired in time")
            lock.release()
        except AnchorError:
            raise
        except Exception as exc:
            raise AnchorError(f"zookeeper lock {path}: {type(exc).__name__}: {exc}") from exc

    def read(self, path: str) -> bytes:
        data, _stat = self._wait(self.kazoo.get_async(path), "get")
        return bytes(data)


class ZkDriver(Driver[ZkClient]):
    """Clients connect to the leader first, as raftlease's and etcd's do."""

    def __init__(self, cluster: ZkCluster, timeout: float = 5.0) -> None:
        self.cluster = cluster
        self.timeout = timeout

    def connect(self) -> ZkClient:
        return ZkClient(self.cluster.hosts_leader_first(), self.timeout)

    def close(self, client: ZkClient) -> None:
        client.close()
