"""What the etcd and ZooKeeper anchors share: detection, server processes started
and stopped by pid, the timed load loop with one client object per thread, and the
entry a measured variant records (the same shape as raftlease's, so the report reads
both the same way).

Imports no raftlease. Everything blocks the calling thread; the load loops run their
own threads and join them with a bound.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Generic, TypeVar

from ..cluster import CpuProbe
from ..context import MAX_ERRORS, Context, progress
from ..measure import Run, median_cpu, percentile, spread

#: The client deadline of the failover workload (issue 16), seconds.
FAILOVER_DEADLINE = 0.25

C = TypeVar("C")


class AnchorError(Exception):
    """An anchor call failed (HTTP error, refused txn, timeout, lost connection):
    counted as an error by the load loops, like a RaftLeaseError for raftlease."""


# ------------------------------------------------------------------ ports


def free_ports(n: int, low: int = 20000, high: int = 32000) -> list[int]:
    """``n`` distinct TCP ports below 32768 that nothing listens on now (bind test on
    127.0.0.1; a port can still be taken before the server binds it, which the
    start-up wait then reports)."""
    ports: list[int] = []
    # Start at a point that depends on the pid, so two runs at once do not collide.
    start = low + (os.getpid() * 37) % (high - low)
    candidate = start
    while len(ports) < n:
        candidate = low + (candidate - low + 1) % (high - low)
        if candidate == start:
            raise RuntimeError("no free ports below 32768")
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                continue
        ports.append(candidate)
    return ports


# ------------------------------------------------------------------ processes


@dataclass
class ServerProc:
    """One server process of an anchor cluster."""

    name: str
    argv: list[str]
    log: Path
    cwd: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    _log_file: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def start(self) -> None:
        """Start the process (output appended to ``log``); returns at once."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        if self._log_file is not None:  # restarted after a kill
            self._log_file.close()
        self._log_file = self.log.open("ab")
        self.proc = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            # Its own process group: a Ctrl-C of the bench does not reach it first,
            # the bench stops it by pid in its clean-up.
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL this process (by pid) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM by pid, then SIGKILL after ``grace`` seconds; closes the log."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


class AnchorCluster:
    """Three server processes of one anchor on 127.0.0.1; subclasses build their
    command lines and know how to find the leader. A context manager: leaving it
    stops every process by pid (also on an exception or KeyboardInterrupt)."""

    name = "anchor"

    def __init__(self, base: Path, size: int = 3) -> None:
        self.base = base
        self.size = size
        self.servers: dict[str, ServerProc] = {}

    def __enter__(self) -> AnchorCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()

    def pids(self) -> dict[str, int]:
        return {name: s.pid for name, s in self.servers.items() if s.alive()}

    def start(self, timeout: float = 60.0) -> None:
        """Start every server and wait until the cluster serves (bounded)."""
        for server in self.servers.values():
            server.start()
        self.wait_ready(timeout)

    def start_node(self, name: str, timeout: float = 60.0) -> None:
        """Start one (killed) server again and wait until the cluster serves."""
        self.servers[name].start()
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            dead = [n for n, s in self.servers.items() if s.proc is not None and not s.alive()]
            if dead:
                raise RuntimeError(f"{self.name}: {', '.join(dead)} exited; see {self.base}")
            try:
                if self.leader() is not None and self.all_serving():
                    return
            except Exception as exc:  # not up yet: any error means "try again"
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.1)
        raise RuntimeError(f"{self.name}: not serving after {timeout:.0f} s ({last})")

    def leader(self) -> str | None:
        """The name of the current leader (None if none is known)."""
        raise NotImplementedError

    def all_serving(self) -> bool:
        """Every live server answers."""
        raise NotImplementedError

    def kill_node(self, name: str) -> None:
        self.servers[name].kill()


# ------------------------------------------------------------------ load loop


class Driver(Generic[C]):
    """One anchor's client operations; ``connect`` makes one client object (called
    once per load thread), ``close`` ends it. Every operation raises AnchorError on
    a failed call."""

    def connect(self) -> C:
        raise NotImplementedError

    def close(self, client: C) -> None:
        raise NotImplementedError


#: A timed call: op(client, i) with i counting this thread's calls; returns False
#: when this thread's pool is used up.
Op = Callable[[Any, int], bool]
#: Untimed set-up of a thread before its timed calls (e.g. creating keys to release).
Setup = Callable[[Any, int], None]


@dataclass
class Threads:
    """N load threads, each with its own client object, kept across repetitions
    (connected once; the warm-up and repetitions reuse them)."""

    driver: Driver[Any]
    n: int
    clients: list[Any] = field(default_factory=list)

    def __enter__(self) -> Threads:
        self.clients = [self.driver.connect() for _ in range(self.n)]
        return self

    def __exit__(self, *exc: object) -> None:
        for c in self.clients:
            with contextlib.suppress(Exception):
                self.driver.close(c)

    def run(self, op: Op, duration: float, setup: Setup | None = None) -> Run:
        """Each thread runs ``setup(client, w)`` (untimed), then all call ``op``
        until ``duration`` has passed or their pool is used up. Blocks until every
        thread ended (joined with a bound). Re-raises the first exception of a
        set-up; an op's AnchorError counts as an error and the loop goes on."""
        latencies: list[list[float]] = [[] for _ in range(self.n)]
        errors = [0] * self.n
        ready = threading.Barrier(self.n + 1)
        go = threading.Event()
        stop_at = [0.0]
        failures: list[BaseException] = []

        def worker(w: int) -> None:
            client = self.clients[w]
            mine = latencies[w]
            try:
                if setup is not None:
                    setup(client, w)
            except Exception as exc:  # re-raised on the calling thread below
                failures.append(exc)
            finally:
                # Always reach the barrier: a failed set-up must not hang the others.
                ready.wait(600)
            go.wait(600)
            i = 0
            while time.perf_counter() < stop_at[0] and errors[w] < MAX_ERRORS:
                t0 = time.perf_counter()
                try:
                    if not op(client, i):
                        return
                except AnchorError:
                    errors[w] += 1
                    continue
                finally:
                    i += 1
                mine.append(time.perf_counter() - t0)

        threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(self.n)]
        for t in threads:
            t.start()
        ready.wait(600)
        start = time.perf_counter()
        stop_at[0] = start + duration
        go.set()
        for t in threads:
            t.join(timeout=duration + 60)
        elapsed = time.perf_counter() - start
        if failures:
            raise failures[0]
        merged = [x for lat in latencies for x in lat]
        run = Run(len(merged), sum(errors), elapsed, merged)
        run.extra = {"per_thread": [len(lat) for lat in latencies]}
        return run


def measure_anchor(
    ctx: Context,
    cluster: AnchorCluster,
    group: str,
    mode: str,
    threads: Threads,
    op: Op,
    setup: Setup | None = None,
) -> dict[str, Any]:
    """Warm up, then ``repeat`` timed repetitions of ``op`` on ``threads``; the
    entry has the fields of raftlease's (ops_per_s spread, p50/p99, CPU per process
    and per op). Blocks for the whole measurement. The CPU window excludes the
    untimed set-up only approximately: it is sampled around the whole run, so a
    workload with a set-up (release) reports CPU per op from a separate figure."""
    p = ctx.profile
    probe = CpuProbe(cluster.pids())
    threads.run(op, p.warmup, setup)
    runs: list[Run] = []
    for rep in range(p.repeat):
        waited = probe.settle(p.settle) if p.settle > 0 else 0.0
        before = probe.sample()
        run = threads.run(op, p.duration, setup)
        run.cpu = CpuProbe.delta(before, probe.sample())
        run.settle_wait = waited
        runs.append(run)
        progress(
            f"{cluster.name} {group} [{mode}]: rep {rep + 1}/{p.repeat}: {run.rate:,.0f}/s "
            f"p50 {percentile(run.latencies, 0.5) * 1000:.2f} ms "
            f"p99 {percentile(run.latencies, 0.99) * 1000:.2f} ms"
            + (f" errors {run.errors}" if run.errors else "")
        )
    return entry_of(runs, mode, cpu_valid=setup is None)


def entry_of(runs: list[Run], mode: str, cpu_valid: bool = True) -> dict[str, Any]:
    """The recorded entry of measured repetitions (pure; tested)."""
    rates = [r.rate for r in runs]
    cpu = median_cpu([r.cpu for r in runs])
    med_ops = statistics.median(r.ops for r in runs) if runs else 0
    server_cpu = sum(v for k, v in cpu.items() if k not in ("client", "others"))
    entry: dict[str, Any] = {
        "mode": mode,
        "ops_per_s": spread(rates),
        "p50_ms": statistics.median(percentile(r.latencies, 0.5) * 1000 for r in runs)
        if runs
        else 0.0,
        "p99_ms": statistics.median(percentile(r.latencies, 0.99) * 1000 for r in runs)
        if runs
        else 0.0,
        "ops": sum(r.ops for r in runs),
        "errors": sum(r.errors for r in runs),
        "cpu_s": cpu,
        "primary": {"name": "ops_per_s", "value": statistics.median(rates) if rates else 0.0},
    }
    shares = [r.extra["per_thread"] for r in runs if r.extra.get("per_thread")]
    if shares and len(shares[0]) > 1:
        # Jain's index of the calls per thread (1 = equal), median over repetitions:
        # the fairness of the handoff recipes.
        entry["jain_index"] = statistics.median(jain(s) for s in shares)
    if cpu_valid and med_ops:
        entry["cpu_us_per_op"] = {
            "client": cpu.get("client", 0.0) / med_ops * 1e6,
            "servers": server_cpu / med_ops * 1e6,
        }
    return entry


def jain(counts: list[int]) -> float:
    """Jain's fairness index of ``counts`` (1 = equal; 0.0 when all are 0)."""
    total = sum(counts)
    squares = sum(c * c for c in counts)
    return total * total / (len(counts) * squares) if squares else 0.0


def split(total: int, n: int) -> list[int]:
    """``total`` items shared out over ``n`` threads as evenly as possible."""
    base, extra = divmod(total, n)
    return [base + (1 if w < extra else 0) for w in range(n)]


@contextlib.contextmanager
def timed_section(label: str) -> Iterator[None]:
    t0 = time.monotonic()
    yield
    progress(f"{label} in {time.monotonic() - t0:.1f} s")
