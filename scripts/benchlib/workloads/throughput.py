"""Throughput workloads: the raw PySyncObj ceiling, then acquire, renew, release and
holder reads on the main cluster, each in the concurrency modes of
``measure.concurrency_variants``.

Every function blocks until its measurements are done. The per-call ops run on the
load threads or tasks of ``measure``; they share the Context only through ``key``
and read-only pools.
"""

from __future__ import annotations

import inspect
import itertools
import statistics
from collections.abc import Collection
from typing import Any

from raftlease.client import AsyncClient, Client, Lease
from raftlease.errors import RaftLeaseError
from raftlease.testing import LocalCluster

from ..cluster import CpuProbe
from ..context import TTL_FRESH, TTL_POOL, Context, progress
from ..measure import concurrency_variants, create_leases, median_cpu, spread
from ..raw import RawCluster

# ------------------------------------------------------------------ raw


def raw(ctx: Context) -> None:
    """Raw PySyncObj no-op commits on its own 3-process cluster with raftlease's
    SyncObjConf: 1 thread sync at the leader, and pipelined with N in flight."""
    p = ctx.profile
    progress("raw PySyncObj: starting 3 node processes (same SyncObjConf as raftlease)")
    with RawCluster({}, max_lifetime=p.max_seconds + 60) as cluster:
        cluster.start()
        leader = cluster.leader()
        ctx.result["raw_conf"] = leader.ask({"cmd": "conf"})
        probe = CpuProbe(cluster.pids())
        cases: list[tuple[str, dict[str, Any]]] = [("sync_1thread", {"cmd": "sync"})]
        cases += [(f"pipelined_{n}", {"cmd": "pipelined", "inflight": n}) for n in p.raw_inflight]
        for name, command in cases:
            leader = cluster.leader()
            leader.ask({**command, "duration": p.warmup})
            reps: list[dict[str, Any]] = []
            for rep in range(p.repeat):
                waited = probe.settle(p.settle) if p.settle > 0 else 0.0
                before = probe.sample()
                reply = leader.ask({**command, "duration": p.duration})
                reply["settle_wait_s"] = waited
                reply["cpu"] = CpuProbe.delta(before, probe.sample())
                reply["leader"] = leader.node_id
                reps.append(reply)
                progress(
                    f"raw {name}: rep {rep + 1}/{p.repeat}: {reply['ops_per_s']:,.0f}/s "
                    f"p50 {reply['p50_ms']:.2f} ms"
                )
            ctx.result["raw"][name] = {
                "ops_per_s": spread([r["ops_per_s"] for r in reps]),
                "p50_ms": statistics.median(r["p50_ms"] for r in reps),
                "p99_ms": statistics.median(r["p99_ms"] for r in reps),
                "errors": sum(r["errors"] for r in reps),
                "cpu_s": median_cpu([r["cpu"] for r in reps]),
                "leader": reps[-1]["leader"],
                "settle_wait_s": sum(r["settle_wait_s"] for r in reps),
                "primary": {
                    "name": "ops_per_s",
                    "value": statistics.median(r["ops_per_s"] for r in reps),
                },
            }


# ------------------------------------------------------------- raftlease


def acquire(
    ctx: Context, cluster: LocalCluster, client: Client, only: Collection[str] | None = None
) -> None:
    """Acquire of fresh keys (each call a new lease); ``only``: these concurrency
    modes (all by default)."""

    def sync_op(c: Client, i: int) -> bool:
        c.acquire(ctx.key("acq"), owner="bench-agent", ttl=TTL_FRESH)
        return True

    async def async_op(c: AsyncClient, i: int) -> bool:
        await c.acquire(ctx.key("acq"), owner="bench-agent", ttl=TTL_FRESH)
        return True

    concurrency_variants(ctx, "acquire", cluster, client, sync_op, async_op, only=only)


def renew(ctx: Context, cluster: LocalCluster, client: Client) -> None:
    """Renewal of a pool of live leases, round robin; the pool is kept in
    ``ctx.renew_pool`` for the holder reads."""
    p = ctx.profile
    keys = [ctx.key("renew") for _ in range(p.renew_pool)]
    pool, _, _ = create_leases(cluster.endpoints, keys, TTL_POOL, p.preload_inflight)
    ctx.renew_pool = pool
    progress(f"{ctx.label}renew: {len(pool)} leases to renew created")

    def sync_op(c: Client, i: int) -> bool:
        c.renew(pool[i % len(pool)])
        return True

    async def async_op(c: AsyncClient, i: int) -> bool:
        await c.renew(pool[i % len(pool)])
        return True

    concurrency_variants(ctx, "renew", cluster, client, sync_op, async_op)


class _ReleasePool:
    """Leases created before a repetition, handed out once each to the load
    threads (``take`` from any thread: ``next`` on a count is atomic under the GIL)."""

    def __init__(self) -> None:
        self.leases: list[Lease] = []
        self._next = itertools.count()

    def refill(self, leases: list[Lease]) -> None:
        self.leases, self._next = leases, itertools.count()

    def take(self) -> Lease | None:
        idx = next(self._next)
        return self.leases[idx] if idx < len(self.leases) else None


def release(ctx: Context, cluster: LocalCluster, client: Client) -> None:
    """Release of leases created just before each repetition (a repetition ends
    early when its pool is used up)."""
    p = ctx.profile
    pool = _ReleasePool()

    def prepare(mode: str, rep: int) -> None:
        # Enough leases for this repetition: 1.5x what acquire did in this mode.
        try:
            acquired = ctx.workloads["acquire"][mode]["ops_per_s"]["max"]
        except KeyError:  # acquire not measured (--only) or failed
            acquired = 3000.0
        seconds = p.warmup if rep < 0 else p.duration
        count = max(200, int(acquired * seconds * 1.5) + 100)
        keys = [ctx.key("rel") for _ in range(count)]
        leases, took, _ = create_leases(cluster.endpoints, keys, TTL_POOL, p.preload_inflight)
        pool.refill(leases)
        if rep >= 0:
            progress(f"release [{mode}]: {len(leases)} leases created in {took:.1f} s")

    def sync_op(c: Client, i: int) -> bool:
        lease = pool.take()
        if lease is None:
            return False
        c.release(lease)
        return True

    async def async_op(c: AsyncClient, i: int) -> bool:
        lease = pool.take()
        if lease is None:
            return False
        await c.release(lease)
        return True

    concurrency_variants(ctx, "release", cluster, client, sync_op, async_op, prepare)


def holder(ctx: Context, cluster: LocalCluster, client: Client) -> None:
    """Holder reads of live keys, one group per consistency mode the client offers
    ("holder linearizable", "holder log", "holder stale"), counting how the server
    says it served them."""
    pool = ctx.renew_pool
    if not pool:
        keys = [ctx.key("read") for _ in range(ctx.profile.renew_pool)]
        pool, _, _ = create_leases(cluster.endpoints, keys, TTL_POOL, ctx.profile.preload_inflight)
    # Feature checks, so that the bench also measures clients without these options.
    params = inspect.signature(Client.holder).parameters
    has_modes = "consistency" in params
    has_read = hasattr(Client, "read") and hasattr(AsyncClient, "read")
    modes: list[str | None] = ["linearizable", "log", "stale"] if has_modes else [None]
    ctx.method(
        "holder",
        "Client.holder accepts consistency: measured each of linearizable, log, stale; "
        "'served' counts how the server says it answered (Client.read)."
        if has_modes
        else "Client.holder has no consistency argument: reads go through the log only.",
    )
    for consistency in modes:
        served: dict[str, int] = {}
        kwargs: dict[str, Any] = {} if consistency is None else {"consistency": consistency}
        group = "holder" if consistency is None else f"holder {consistency}"

        # Default arguments bind this iteration's dict and kwargs (the closures
        # outlive the loop variable). Counting races between load threads only
        # blur the tally of how reads were served, never a measured figure.
        def count(how: str, served: dict[str, int] = served) -> None:
            served[how] = served.get(how, 0) + 1

        def sync_op(c: Client, i: int, kw: dict[str, Any] = kwargs) -> bool:
            key = pool[i % len(pool)].key
            if has_read and kw:
                count(c.read(key, **kw).consistency)
            else:
                c.holder(key, **kw)
            return True

        async def async_op(c: AsyncClient, i: int, kw: dict[str, Any] = kwargs) -> bool:
            key = pool[i % len(pool)].key
            if has_read and kw:
                count((await c.read(key, **kw)).consistency)
            else:
                await c.holder(key, **kw)
            return True

        try:
            concurrency_variants(ctx, group, cluster, client, sync_op, async_op)
        except RaftLeaseError as exc:
            ctx.workloads[group] = {"error": str(exc)}
            progress(f"{group}: failed: {exc}")
            continue
        for entry in ctx.workloads[group].values():
            entry["served"] = dict(served)
