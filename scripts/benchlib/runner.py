"""One whole benchmark run: the order of the phases, failure isolation between
workload groups, the time limit and signals, targets, and the output files.

``run`` blocks for the whole run on the main thread (signal handlers need it). It
expects ``context.freeze_raftlease`` to have run before this module was imported.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from raftlease.client import Client
from raftlease.testing import LocalCluster

from . import targets
from .cluster import log_alerts, node_rss, save_failure_logs
from .context import (
    MAIN_GROUPS,
    T0,
    BenchTimeout,
    Context,
    Profile,
    isolated,
    loadavg,
    progress,
    run_meta,
)
from .report import write_outputs
from .workloads import (
    certs,
    durability,
    failover,
    handoff,
    memory,
    scale,
    security,
    tasks,
    throughput,
)

COMMON_METHOD = (
    "Each workload: warm-up {p.warmup} s, then {p.repeat} repetitions of "
    "{p.duration} s. Throughput = completed calls / wall time; 'spread' = "
    "(max - min) / median of the repetitions. p50/p99 = median over repetitions "
    "of each repetition's latency percentile (client-side, per call). CPU = median "
    "per repetition of utime+stime (+ reaped children) from /proc/<pid>/stat; "
    "'client' is the benchmark process (all its threads); 'others' is the rest of the "
    "machine's busy CPU (/proc/stat) in the same interval: other work on the shared "
    "cores, which depresses the figures. Before each repetition the bench waits up "
    "to {p.settle} s for the rest of the machine to use < 0.25 core. 'vs raw' divides the "
    "median throughput by raw PySyncObj's in the same run: 1-thread sync commits, "
    "and the best pipelined figure. Elections = change of the highest Raft term "
    "seen across nodes during the workload."
)


def guarded(
    ctx: Context, group: str, fn: Callable[[], None], cluster: LocalCluster | None = None
) -> bool:
    """Run one workload group (if wanted); on failure record the error (and the
    cluster's node logs in DIR/logs/) and go on with the next group. Returns True on
    success or when the group was not wanted."""
    if not ctx.wanted(group):
        return True

    def save_logs() -> None:
        if cluster is not None:
            path = save_failure_logs(ctx.out, group, cluster)
            progress(f"{group}: node logs saved in {path.parent}")

    return isolated(ctx.workloads, "", group, fn, save_logs)


def main_cluster(ctx: Context) -> None:
    """Workloads 1-6 on one 3-node cluster with default settings; the throughput
    workloads and the certs group's signing rounds share one Client (their 1-thread
    and N-thread modes run on it)."""
    progress("raftlease: starting a 3-node cluster with default settings")
    with LocalCluster(3) as cluster:
        cluster.start()
        time.sleep(0.5)
        ctx.result["meta"]["main_cluster_idle_rss_mib"] = {
            node: mem.get("VmRSS", 0.0) for node, mem in node_rss(cluster).items()
        }
        with cluster.client() as client:
            for group, workload in _THROUGHPUT:
                guarded(ctx, group, _bind(workload, ctx, cluster, client), cluster)
            # Issue 39: signing's cost on the same cluster, after the throughput groups.
            guarded(ctx, "certs", _bind(certs.signing, ctx, cluster, client), cluster)
        guarded(ctx, "handoff", lambda: handoff.handoff(ctx, cluster), cluster)
        guarded(ctx, "failover", lambda: failover.failover(ctx, cluster), cluster)
        ctx.result.setdefault("node_log_alerts", {})["main"] = log_alerts(cluster)


_Workload = Callable[[Context, LocalCluster, Client], None]

#: The throughput groups of the main cluster, in order.
_THROUGHPUT: list[tuple[str, _Workload]] = [
    ("acquire", throughput.acquire),
    ("renew", throughput.renew),
    ("release", throughput.release),
    ("holder", throughput.holder),
]


def _bind(
    workload: _Workload, ctx: Context, cluster: LocalCluster, client: Client
) -> Callable[[], None]:
    return lambda: workload(ctx, cluster, client)


def run_all(ctx: Context, code: dict[str, str]) -> None:
    """Every wanted phase in order; whatever happens, the targets are judged and
    bench.json / bench.md written with what was measured."""
    p = ctx.profile
    meta = ctx.result["meta"]
    meta.update(run_meta(p, code))
    ctx.method("common", COMMON_METHOD.format(p=p))
    try:
        guarded(ctx, "raw", lambda: throughput.raw(ctx))
        # Right after raw: its ratios to the ceiling come from the same stretch of time.
        guarded(ctx, "durability", lambda: durability.durability(ctx))
        if p.security or (ctx.only is not None and "security" in ctx.only):
            guarded(ctx, "security", lambda: security.security(ctx))
        if any(ctx.wanted(g) for g in MAIN_GROUPS):
            main_cluster(ctx)
        if p.anchors:
            # Right after raftlease's main cluster, with the same workloads (issue 16);
            # each anchor isolates its own failures and stops its servers by pid.
            from .anchors import run as anchors_run

            if any(ctx.wanted(g) for g in anchors_run.ANCHOR_GROUPS):
                anchors_run.anchors(ctx, list(p.anchors))
            else:
                progress("anchors: not started (--only names none of the groups they measure)")
        # The rest of the certs group: in this process while no cluster runs, then
        # the audit rounds' own clusters (workloads/certs.py).
        guarded(ctx, "certs", lambda: certs.costs(ctx))
        guarded(ctx, "memory", lambda: memory.memory_snapshot(ctx))
        guarded(ctx, "tasks", lambda: tasks.tasks(ctx))
        # Last: its agent processes load the machine more than any other phase.
        guarded(ctx, "scale", lambda: scale.scale(ctx))
    finally:
        meta["loadavg_end"] = loadavg()
        meta["elapsed_s"] = time.monotonic() - T0
        # A result too incomplete to judge is still written (with no targets).
        with contextlib.suppress(Exception):
            ctx.result["targets"] = targets.evaluate(ctx.result, p.concurrent_modes)
        write_outputs(ctx.result, ctx.out)


def run(
    profile: Profile, out: Path, only: set[str] | None, code: dict[str, str], argv: list[str]
) -> int:
    """The whole run under a time limit of ``profile.max_seconds``; SIGALRM, SIGTERM
    and SIGINT end it through the normal clean-up (clusters stopped, files written).
    SIGINT is set here too, not left to Python's default: a bench started as a
    background job inherits SIGINT ignored, and Ctrl-C must still stop it.
    ``argv`` (the bench's arguments) is kept in meta so a published figure names
    the command that measured it.

    Returns 0, or 130 when a SIGINT came even if its ``KeyboardInterrupt`` never
    reached this frame: Python runs a signal handler in whatever frame the main
    thread is executing, and one raised inside a finalizer (``__del__`` of a
    garbage-collected event loop or socket, run at any allocation) is printed as
    "Exception ignored" and lost; the run then goes on to its end, bounded by
    ``max_seconds``, and must not look like a clean one."""
    interrupted: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGALRM:
            raise BenchTimeout(f"benchmark exceeded {profile.max_seconds:.0f} s")
        if signum == signal.SIGINT:
            interrupted.append(signum)
            raise KeyboardInterrupt
        raise BenchTimeout(f"stopped by signal {signal.Signals(signum).name}")

    for sig in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    signal.alarm(int(profile.max_seconds))
    ctx = Context(profile, out, only)
    ctx.result["meta"]["argv"] = list(argv)
    progress(f"raftlease bench, {profile.name} profile, output in {out}")
    try:
        run_all(ctx, code)
    finally:
        signal.alarm(0)
    if interrupted:
        progress("interrupted (SIGINT): the run did not finish as asked")
        return 130
    return 0
