"""The anchors phase of ``scripts/bench``: for each requested anchor that is
installed, a 3-server cluster on 127.0.0.1 (data under DIR/anchors/<name>), a JVM /
cache warm-up, then the raftlease workloads with the same thread counts, warm-up and
repetitions: acquire, renew, release, holder reads (1 and N threads), contended
handoff (``handoff_clients`` clients, one lock), failover (SIGKILL of the leader ->
next successful acquire, 0.25 s client deadline).

Results go to result["anchors"]: ``requested``, ``skipped`` {name: reason} and
``systems`` {name: {version, settings, workloads}}. ``anchors`` blocks for the whole
phase on the main thread; every cluster is stopped by pid when its part ends, also
on an error, a timeout (BenchTimeout) or Ctrl-C. A failure of one workload is
recorded and the next one runs.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from ..context import BenchTimeout, Context, fmt, isolated, progress
from ..measure import spread
from . import etcd, zookeeper
from .common import (
    FAILOVER_DEADLINE,
    AnchorCluster,
    AnchorError,
    Driver,
    Threads,
    measure_anchor,
    split,
)

#: Keys per load thread for renew (ZooKeeper) and the holder reads.
POOL_PER_THREAD = 20
#: Seconds of mixed load before the first measurement (the JVM needs ~10 s).
WARMUP_FULL = 10.0

METHOD = (
    "etcd {etcd_version} and ZooKeeper {zk_version} from Debian, 3 servers each on "
    "127.0.0.1 with default settings (etcd: WAL fsync; ZooKeeper: sample zoo.cfg, "
    "forceSync=yes, -Xmx1000m), driven from the bench process like raftlease: the same "
    "thread counts, warm-up and repetitions, one client object per thread (raftlease's "
    "N threads share one Client), clients connected to the leader first. {warmup:g} s "
    "of mixed load per anchor before its first measurement. etcd over its v3 "
    "HTTP/JSON gateway (one keep-alive connection per client): acquire = Txn(If "
    "create_revision == 0 Then Put with the client's session lease), renew = "
    "LeaseKeepAlive (no log write), release = DeleteRange, holder = Range "
    "linearizable / serializable, handoff = the concurrency.Mutex recipe (own key, "
    "watch of the predecessor's delete). ZooKeeper via kazoo {kazoo_version}: acquire = "
    "create(ephemeral), renew = setData(version), release = delete, holder = get, "
    "handoff = kazoo's Lock recipe. Failover: one client with a {deadline} s call "
    "deadline loops acquire/release; the leader is SIGKILLed between two calls; the "
    "figure is the time to the next successful acquire."
)


def skip_reason(name: str) -> str | None:
    """Why ``name`` cannot run on this machine (None: it can)."""
    return etcd.installed() if name == "etcd" else zookeeper.installed()


def version(name: str) -> str:
    try:
        if name == "etcd":
            out = subprocess.run(
                [etcd.ETCD, "--version"], capture_output=True, text=True, timeout=20
            ).stdout
            return out.split("\n")[0].replace("etcd Version:", "").strip() or "?"
        jar = sorted(zookeeper.JAR.parent.glob("zookeeper-3*.jar"))
        return jar[0].stem.removeprefix("zookeeper-") if jar else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


#: The groups the anchors measure: with ``--only`` naming none of them, the phase is
#: not run (starting etcd and ZooKeeper would measure nothing).
ANCHOR_GROUPS = ("acquire", "renew", "release", "holder", "handoff", "failover")


def anchors(ctx: Context, names: list[str]) -> None:
    """The whole phase (see the module docstring)."""
    section: dict[str, Any] = {"requested": names, "skipped": {}, "systems": {}}
    # What the raftlease side of the comparison ran with (its main cluster: defaults).
    import dataclasses

    from raftlease.config import NodeConfig

    section["raftlease_durability"] = next(
        (f.default for f in dataclasses.fields(NodeConfig) if f.name == "durability"), "?"
    )
    ctx.result["anchors"] = section
    versions: dict[str, str] = {}
    for name in names:
        reason = skip_reason(name)
        if reason is not None:
            section["skipped"][name] = reason
            progress(f"anchors: SKIPPED {name}: {reason}")
            continue
        versions[name] = version(name)
        system: dict[str, Any] = {"version": versions[name], "workloads": {}}
        section["systems"][name] = system
        try:
            run_one(ctx, name, system)
        except (BenchTimeout, KeyboardInterrupt):
            raise
        except Exception as exc:
            system["error"] = f"{type(exc).__name__}: {exc}"
            progress(f"anchors: {name} FAILED: {system['error']}")
    kazoo_version = "?"
    try:
        import importlib.metadata

        kazoo_version = importlib.metadata.version("kazoo")
    except Exception:  # not installed: ZooKeeper was skipped, the text says "?"
        pass
    ctx.method(
        "anchors",
        METHOD.format(
            etcd_version=versions.get("etcd", "(skipped)"),
            zk_version=versions.get("zookeeper", "(skipped)"),
            kazoo_version=kazoo_version,
            warmup=WARMUP_FULL if ctx.profile.name == "full" else ctx.profile.warmup,
            deadline=FAILOVER_DEADLINE,
        ),
    )


def run_one(ctx: Context, name: str, system: dict[str, Any]) -> None:
    """One anchor: its cluster, warm-up and workloads; the cluster is stopped (by
    pid) when this returns or raises."""
    base = ctx.out.resolve() / "anchors" / name
    # A data dir of an earlier run would make the members rejoin their old cluster.
    shutil.rmtree(base, ignore_errors=True)
    driver: Driver[Any]
    cluster: AnchorCluster = etcd.EtcdCluster(base) if name == "etcd" else zookeeper.ZkCluster(base)
    progress(f"anchors: starting a 3-server {name} cluster in {base}")
    try:
        with cluster:
            cluster.start(timeout=120)
            system["pids"] = cluster.pids()
            if isinstance(cluster, etcd.EtcdCluster):
                driver = etcd.EtcdDriver(cluster)
            else:
                assert isinstance(cluster, zookeeper.ZkCluster)
                driver = zookeeper.ZkDriver(cluster)
            Workloads(ctx, name, cluster, driver, system["workloads"]).run()
    finally:
        # The last pid of each server (a restarted one has a new pid), all stopped.
        system["pids_stopped"] = {n: s.pid for n, s in cluster.servers.items()}


class Workloads:
    """The workloads of one anchor on its running cluster (main thread)."""

    def __init__(
        self,
        ctx: Context,
        name: str,
        cluster: AnchorCluster,
        driver: Driver[Any],
        out: dict[str, Any],
    ) -> None:
        self.ctx = ctx
        self.name = name
        self.cluster = cluster
        self.driver = driver
        self.out = out
        self.is_etcd = name == "etcd"
        #: The N-thread clients, which also create the 1-thread release pool.
        self.helper: Threads | None = None

    def wanted(self, group: str) -> bool:
        return self.ctx.only is None or group in self.ctx.only

    def key(self, prefix: str) -> str:
        key = self.ctx.key(f"{self.name}-{prefix}")
        return key if self.is_etcd else "/" + key

    def guarded(self, group: str, fn: Callable[[], None]) -> None:
        isolated(self.out, f"anchors: {self.name} ", group, fn)

    def run(self) -> None:
        p = self.ctx.profile
        if not self.is_etcd:
            # Parents of the znodes (ZooKeeper has no implicit directories).
            c = self.driver.connect()
            try:
                for prefix in ("acq", "renew", "rel", "read", "warm", "fo"):
                    c.ensure(self.key(prefix).rsplit("/", 1)[0])
            finally:
                self.driver.close(c)
        modes = [("1 thread", 1), (f"{p.threads} threads", p.threads)]
        with Threads(self.driver, 1) as one, Threads(self.driver, p.threads) as many:
            pools = {1: one, p.threads: many}
            self.helper = many
            for threads in pools.values():
                self.fill_pools(threads)
            self.warm_up(many)
            for group, fn in self.groups():
                if not self.wanted(group.split(" ")[0]):
                    continue
                for mode, n in modes:
                    self.guarded(group, self._measure(group, mode, pools[n], fn))
        if self.wanted("handoff"):
            self.guarded("handoff", self.handoff)
        if self.wanted("failover"):
            self.guarded("failover", self.failover)

    # ------------------------------------------------------------ throughput

    def fill_pools(self, threads: Threads) -> None:
        """Each client's own keys (renew on ZooKeeper, holder reads) and, on etcd,
        leases to keep alive."""
        for c in threads.clients:
            c.pool = []
            for _ in range(POOL_PER_THREAD):
                key = self.key("read")
                c.acquire(key)
                c.pool.append(key)
            c.leases = [c.grant() for _ in range(POOL_PER_THREAD)] if self.is_etcd else []

    def warm_up(self, threads: Threads) -> None:
        """Mixed load (acquire + read) before the first measurement."""
        seconds = WARMUP_FULL if self.ctx.profile.name == "full" else self.ctx.profile.warmup

        def op(c: Any, i: int) -> bool:
            c.acquire(self.key("warm"))
            if self.is_etcd:
                c.read(c.pool[i % len(c.pool)], False)
            else:
                c.read(c.pool[i % len(c.pool)])
            return True

        run = threads.run(op, seconds)
        progress(
            f"anchors: {self.name} warm-up {seconds:.0f} s: {run.ops} ops, {run.errors} errors"
        )

    def groups(self) -> list[tuple[str, Callable[[Any, int], bool]]]:
        def acquire(c: Any, i: int) -> bool:
            c.acquire(self.key("acq"))
            return True

        def renew(c: Any, i: int) -> bool:
            if self.is_etcd:
                c.keepalive(c.leases[i % len(c.leases)])
            else:
                c.renew(c.pool[i % len(c.pool)])
            return True

        def release(c: Any, i: int) -> bool:
            if i >= len(c.release_pool):
                return False
            c.release(c.release_pool[i])
            return True

        def read_lin(c: Any, i: int) -> bool:
            c.read(c.pool[i % len(c.pool)], False)
            return True

        def read_ser(c: Any, i: int) -> bool:
            c.read(c.pool[i % len(c.pool)], True)
            return True

        def read_get(c: Any, i: int) -> bool:
            c.read(c.pool[i % len(c.pool)])
            return True

        out: list[tuple[str, Callable[[Any, int], bool]]] = [
            ("acquire", acquire),
            ("renew", renew),
            ("release", release),
        ]
        if self.is_etcd:
            out += [("holder linearizable", read_lin), ("holder serializable", read_ser)]
        else:
            out += [("holder get", read_get)]
        return out

    def _measure(
        self, group: str, mode: str, threads: Threads, op: Callable[[Any, int], bool]
    ) -> Callable[[], None]:
        def go() -> None:
            setup = self.release_setup(mode, threads.n) if group == "release" else None
            entry = measure_anchor(self.ctx, self.cluster, group, mode, threads, op, setup)
            self.out.setdefault(group, {})[mode] = entry

        return go

    def release_setup(self, mode: str, n: int) -> Callable[[Any, int], None]:
        """Before each repetition each thread acquires its own keys to release: 1.5x
        what acquire did in this mode over a repetition (untimed; with one thread the
        N-thread clients create them)."""
        p = self.ctx.profile
        try:
            rate = float(self.out["acquire"][mode]["ops_per_s"]["max"])
        except (KeyError, TypeError):
            rate = 3000.0
        total = max(200, int(rate * max(p.duration, p.warmup) * 1.5) + 100)
        shares = split(total, n)

        helper = self.helper if n == 1 else None

        def setup(c: Any, w: int) -> None:
            c.release_pool = []
            if helper is not None:
                # One thread would take longer to create its keys than to release
                # them: the N-thread clients create them (a key is deleted by anyone).
                c.release_pool = self.create_keys(helper, total)
                return
            for _ in range(shares[w]):
                key = self.key("rel")
                try:
                    c.acquire(key)
                except AnchorError:
                    continue
                c.release_pool.append(key)

        return setup

    def create_keys(self, threads: Threads, total: int) -> list[str]:
        """Acquire ``total`` fresh keys on ``threads`` (blocks); the keys made."""
        made: list[str] = []
        per = split(total, threads.n)[-1]  # the smallest share: at most ``total``

        def create(c: Any, i: int) -> bool:
            if i >= per:
                return False
            key = self.key("rel")
            c.acquire(key)
            made.append(key)  # list.append is atomic under the GIL
            return True

        threads.run(create, 600.0)
        return made

    # ------------------------------------------------------------ handoff

    def handoff(self) -> None:
        """``handoff_clients`` clients, each on its own thread and client object,
        loop lock-then-unlock on one lock (the systems' own queueing recipes)."""
        p = self.ctx.profile
        n = p.handoff_clients
        lock = self.key("handoff")

        def op(c: Any, i: int) -> bool:
            if self.is_etcd:
                mine = c.lock(lock)
                c.release(mine)
            else:
                c.lock_unlock(lock)
            return True

        mode = f"{n} clients, queued (recipe)"
        with Threads(self.driver, n) as threads:
            entry = measure_anchor(self.ctx, self.cluster, "handoff", mode, threads, op)
        self.out.setdefault("handoff", {})[mode] = entry

    # ------------------------------------------------------------ failover

    def failover(self) -> None:
        p = self.ctx.profile
        reps: list[dict[str, Any]] = []
        progress(f"anchors: {self.name} failover: {p.failover_reps} SIGKILLs of the leader")
        for rep in range(p.failover_reps):
            r = self.failover_once()
            reps.append(r)
            times = [x["time_to_success_s"] for x in reps]
            self.out["failover"] = {
                "SIGKILL leader": {
                    "mode": "SIGKILL leader",
                    "time_to_success_s": spread(times),
                    "deadline_s": FAILOVER_DEADLINE,
                    "reps": reps,
                    "primary": {"name": "time_to_success_s", "value": statistics.median(times)},
                }
            }
            progress(
                f"anchors: {self.name} failover rep {rep + 1}/{p.failover_reps}: killed "
                f"{r['killed']}, next acquire after {fmt(r['time_to_success_s'], '.3f')} s"
            )
            self.cluster.start_node(r["killed"], timeout=120)
            time.sleep(0.5)

    def failover_once(self) -> dict[str, Any]:
        leader = self.cluster.leader()
        if leader is None:
            raise AnchorError(f"{self.name}: no leader before the kill")
        driver: Driver[Any]
        if isinstance(self.cluster, etcd.EtcdCluster):
            driver = etcd.EtcdDriver(self.cluster, FAILOVER_DEADLINE)
        else:
            assert isinstance(self.cluster, zookeeper.ZkCluster)
            driver = zookeeper.ZkDriver(self.cluster, FAILOVER_DEADLINE)
        client: Any = driver.connect()
        successes: list[float] = []
        errors: list[str] = []
        stop, hold, held, go = (threading.Event() for _ in range(4))

        def loop() -> None:
            while not stop.is_set():
                if hold.is_set() and not go.is_set():
                    held.set()
                    go.wait(30)
                try:
                    key = self.key("fo")
                    client.acquire(key, "fo-agent")
                    successes.append(time.monotonic())
                    client.release(key)
                except AnchorError as exc:
                    errors.append(str(exc).split(":")[0])
                    if self.is_etcd:
                        client.next_endpoint()  # as clientv3 does on a dead endpoint

        worker = threading.Thread(target=loop, daemon=True)
        worker.start()
        t_kill = 0.0
        try:
            _wait(lambda: len(successes) > 20, 20, "acquires before the kill")
            hold.set()
            _wait(held.is_set, 20, "the client loop to pause")
            t_kill = time.monotonic()
            self.cluster.kill_node(leader)
            go.set()
            _wait(lambda: any(t > t_kill for t in successes), 60, "an acquire after the kill")
        finally:
            stop.set()
            go.set()
            worker.join(timeout=20)
            driver.close(client)
        first = next(t for t in successes if t > t_kill)
        kinds: dict[str, int] = {}
        for e in errors:
            kinds[e] = kinds.get(e, 0) + 1
        return {
            "killed": leader,
            "time_to_success_s": first - t_kill,
            "client_errors": kinds,
        }


def _wait(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AnchorError(f"timed out waiting for {what}")
        time.sleep(0.005)
