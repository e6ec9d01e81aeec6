"""Measurement: timed load loops, repetitions, and what a variant's entry reports.

A workload is measured as one or more ``Variant``s (e.g. acquire with 16 threads).
``measure`` runs a variant's warm-up and ``repeat`` timed repetitions and records
the median and spread of throughput, the median of the repetitions' p50/p99 latency,
CPU per process, the elections seen and, when the nodes' status reports them, the
growth of their journal counters (syncs). The load loops block the calling thread for
their duration: ``run_threads`` on a shared blocking ``Client`` from N threads,
``run_async`` and ``create_leases`` on their own event loop (``asyncio.run``).
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from raftlease.client import AsyncClient, Client, Lease
from raftlease.errors import RaftLeaseError
from raftlease.testing import LocalCluster

from .cluster import CpuProbe, cluster_probe, counter_delta, journal_counters, max_term
from .context import MAX_ERRORS, Context, progress, raw_pipelined, raw_sync

# ----------------------------------------------------------------- statistics


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by nearest rank; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return float(ordered[rank])


def spread(values: list[float]) -> dict[str, Any]:
    """Median, min, max and (max - min) / median of repetition values."""
    if not values:
        return {"median": 0.0, "min": 0.0, "max": 0.0, "spread_pct": 0.0, "reps": []}
    med = statistics.median(values)
    return {
        "median": med,
        "min": min(values),
        "max": max(values),
        "spread_pct": 100.0 * (max(values) - min(values)) / med if med else 0.0,
        "reps": values,
    }


def median_cpu(cpus: list[dict[str, float]]) -> dict[str, float]:
    """Per process, the median over repetitions of its CPU seconds."""
    keys = cpus[0].keys() if cpus else []
    return {k: statistics.median(c.get(k, 0.0) for c in cpus) for k in keys}


def counts(items: list[str]) -> dict[str, int]:
    """How often each item occurs, in order of first occurrence."""
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


# ----------------------------------------------------------------- load loops


@dataclass
class Run:
    """One timed run of a workload."""

    ops: int
    errors: int
    elapsed: float
    latencies: list[float]
    cpu: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    settle_wait: float = 0.0

    @property
    def rate(self) -> float:
        return self.ops / self.elapsed if self.elapsed > 0 else 0.0


#: One call of a workload: ``op(client, i)`` with i from a shared counter; returns
#: False when the workload's pool is used up (the loop then ends).
SyncOp = Callable[[Client, int], bool]
AsyncOp = Callable[[AsyncClient, int], Awaitable[bool]]


def run_threads(client: Client, nthreads: int, op: SyncOp, duration: float) -> Run:
    """``nthreads`` threads call ``op(client, i)`` (i from a shared counter) until
    ``duration`` has passed or ``op`` returns False (its pool is exhausted). Blocks
    until every thread ended (each joined with a bound of ``duration`` + 60 s)."""
    counter = itertools.count()
    latencies: list[list[float]] = [[] for _ in range(nthreads)]
    # One slot per thread: no lock needed, each thread writes only its own.
    errors = [0] * nthreads
    stop_at = time.perf_counter() + duration

    def worker(w: int) -> None:
        mine = latencies[w]
        while time.perf_counter() < stop_at and errors[w] < MAX_ERRORS:
            t0 = time.perf_counter()
            try:
                if not op(client, next(counter)):
                    return
            except RaftLeaseError:
                errors[w] += 1
                continue
            mine.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(nthreads)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=duration + 60)
    elapsed = time.perf_counter() - start
    merged = [x for lat in latencies for x in lat]
    return Run(len(merged), sum(errors), elapsed, merged)


def run_async(
    endpoints: list[str],
    ntasks: int,
    op: AsyncOp,
    duration: float,
    options: dict[str, Any] | None = None,
) -> Run:
    """An AsyncClient with ``ntasks`` tasks in flight, each looping ``op``; runs its
    own event loop and blocks until the tasks end. ``options``: the AsyncClient's
    keyword arguments (a secured cluster's ``tls`` and ``token``)."""

    async def main() -> Run:
        counter = itertools.count()
        latencies: list[float] = []
        errors = [0]
        async with AsyncClient(endpoints, **(options or {})) as client:
            # Connect and find the leader before the clock starts.
            await client.call("holder", {"key": "bench/warm"}, mutating=False)
            stop_at = time.perf_counter() + duration

            async def worker() -> None:
                while time.perf_counter() < stop_at and errors[0] < MAX_ERRORS:
                    t0 = time.perf_counter()
                    try:
                        if not await op(client, next(counter)):
                            return
                    except RaftLeaseError:
                        errors[0] += 1
                        continue
                    latencies.append(time.perf_counter() - t0)

            start = time.perf_counter()
            await asyncio.wait_for(
                asyncio.gather(*(worker() for _ in range(ntasks))), duration + 60
            )
            elapsed = time.perf_counter() - start
        return Run(len(latencies), errors[0], elapsed, latencies)

    return asyncio.run(main())


def create_leases(
    endpoints: list[str],
    keys: list[str],
    ttl: float,
    inflight: int,
    keep: bool = True,
    owner: str = "bench-agent",
) -> tuple[list[Lease], float, int]:
    """Acquire every key, pipelined on one AsyncClient (``inflight`` tasks; blocks
    until done). Returns (leases, seconds, errors); no leases when not ``keep``."""

    async def main() -> tuple[list[Lease], float, int]:
        out: list[Lease] = []
        errors = [0]
        it = iter(keys)
        async with AsyncClient(endpoints) as client:
            start = time.perf_counter()

            async def worker() -> None:
                for key in it:
                    try:
                        lease = await client.acquire(key, owner=owner, ttl=ttl)
                    except RaftLeaseError:
                        errors[0] += 1
                        if errors[0] > MAX_ERRORS:
                            return
                        continue
                    if keep:
                        out.append(lease)

            await asyncio.wait_for(
                asyncio.gather(*(worker() for _ in range(inflight))), 60 + len(keys) / 100
            )
            return out, time.perf_counter() - start, errors[0]

    return asyncio.run(main())


# ------------------------------------------------------------------ variants


@dataclass
class Variant:
    """One measured configuration of a workload (e.g. acquire, 16 threads)."""

    group: str
    mode: str
    #: Runs the load for the given seconds (blocking) and returns what it did.
    run: Callable[[float], Run]
    #: Called before the warm-up (with -1) and before each repetition (its index).
    prepare: Callable[[int], None] | None = None


def measure(ctx: Context, cluster: LocalCluster, variant: Variant) -> dict[str, Any]:
    """Warm up, run the repetitions, record and return the variant's entry
    (result.workloads[group][mode]). Blocks for the whole measurement."""
    p = ctx.profile
    probe = cluster_probe(cluster)
    term_before = max_term(cluster)
    label = f"{ctx.label}{variant.group} [{variant.mode}]"
    if variant.prepare is not None:
        variant.prepare(-1)
    variant.run(p.warmup)
    # The nodes' journal counters (syncs, entries they covered) over the repetitions.
    journal_before = journal_counters(cluster)
    runs: list[Run] = []
    for rep in range(p.repeat):
        if variant.prepare is not None:
            variant.prepare(rep)
        waited = probe.settle(p.settle) if p.settle > 0 else 0.0
        before = probe.sample()
        run = variant.run(p.duration)
        run.cpu = CpuProbe.delta(before, probe.sample())
        run.settle_wait = waited
        runs.append(run)
        progress(
            f"{label}: rep {rep + 1}/{p.repeat}: {run.rate:,.0f}/s "
            f"p50 {percentile(run.latencies, 0.5) * 1000:.2f} ms "
            f"p99 {percentile(run.latencies, 0.99) * 1000:.2f} ms"
            + (f" errors {run.errors}" if run.errors else "")
        )
    journal = counter_delta(journal_before, journal_counters(cluster))
    leader = cluster.leader_id()
    elections = max_term(cluster) - term_before
    rates = [r.rate for r in runs]
    ops = sum(r.ops for r in runs)
    cpu = median_cpu([r.cpu for r in runs])
    med_ops = statistics.median(r.ops for r in runs) or 1
    server_cpu = sum(v for k, v in cpu.items() if k not in ("client", "others"))
    entry: dict[str, Any] = {
        "mode": variant.mode,
        "ops_per_s": spread(rates),
        "p50_ms": statistics.median(percentile(r.latencies, 0.5) * 1000 for r in runs),
        "p99_ms": statistics.median(percentile(r.latencies, 0.99) * 1000 for r in runs),
        "ops": ops,
        "errors": sum(r.errors for r in runs),
        "cpu_s": cpu,
        "cpu_us_per_op": {
            "client": cpu.get("client", 0.0) / med_ops * 1e6,
            "servers": server_cpu / med_ops * 1e6,
        },
        "leader": leader,
        "elections": elections,
        "settle_wait_s": sum(r.settle_wait for r in runs),
        "primary": {"name": "ops_per_s", "value": statistics.median(rates)},
    }
    extras = [r.extra for r in runs if r.extra]
    if extras:
        entry["extra"] = extras
    if journal:
        # Summed over every repetition (and the settle waits between them), like "ops".
        entry["journal"] = journal
    median_rate = statistics.median(rates)
    sync, pipelined = raw_sync(ctx.result), raw_pipelined(ctx.result)
    entry["vs_raw"] = {
        "sync_1thread": median_rate / sync if sync else None,
        "pipelined_best": median_rate / pipelined if pipelined else None,
    }
    ctx.record(variant.group, variant.mode, entry)
    return entry


def concurrency_variants(
    ctx: Context,
    group: str,
    cluster: LocalCluster,
    client: Client,
    sync_op: SyncOp,
    async_op: AsyncOp,
    prepare: Callable[[str, int], None] | None = None,
    only: Collection[str] | None = None,
) -> None:
    """Measure ``group`` with 1 thread, ``threads`` threads (both on ``client``)
    and an AsyncClient with ``async_tasks`` tasks (``only``: those of these modes).
    ``prepare(mode, rep)`` as in ``Variant.prepare``."""
    p = ctx.profile
    endpoints = cluster.endpoints
    # The names must match Profile.concurrent_modes (the targets look them up).
    modes: list[tuple[str, Callable[[float], Run]]] = [
        ("1 thread", lambda d: run_threads(client, 1, sync_op, d)),
        (f"{p.threads} threads", lambda d: run_threads(client, p.threads, sync_op, d)),
        (
            f"async {p.async_tasks}",
            lambda d: run_async(endpoints, p.async_tasks, async_op, d, cluster.client_options),
        ),
    ]
    for mode, runner in modes:
        if only is not None and mode not in only:
            continue
        prep: Callable[[int], None] | None = None
        if prepare is not None:
            prep = _bind(prepare, mode)
        measure(ctx, cluster, Variant(group, mode, runner, prep))


def _bind(prepare: Callable[[str, int], None], mode: str) -> Callable[[int], None]:
    # A function per mode (not a lambda in the loop, which would see the last mode).
    return lambda rep: prepare(mode, rep)
