"""Leased task queues (issue 12): put, claim and complete throughput and latency, end to
end tasks/s (put -> claim -> complete), and RSS per node with many queued tasks.

Runs on its own 3-node cluster with default settings (the queues it fills would
weigh on the main cluster's figures), in the same run as the raw PySyncObj ceiling,
so every entry has its ``vs_raw`` ratios. Each throughput group is measured with
``measure`` (warm-up, repetitions, medians) with 1 thread and ``threads`` threads
sharing one ``Client``:

- ``task put``: ``put`` of a small payload into ``bench-tasks``;
- ``task claim``: ``claim(wait=0)`` while tasks are ready (the queue is topped up
  before each repetition, unmeasured, so a claim never waits for a put): the claim
  latency when tasks are ready;
- ``task complete``: ``complete`` of the tasks the claims took;
- ``task end-to-end``: on queue ``bench-e2e``, as many producer threads (on a Client
  of their own) put as there are worker threads (1 or ``threads``) claiming and
  completing: one op is one task through
  put -> claim -> complete, three replicated steps; and ``async N``: N such loops in
  flight on one AsyncClient.

Then ``task memory``, on a fresh cluster: RSS per node idle and with ``queued_tasks``
ready tasks (put by ``threads`` threads, spread over ``QUEUES`` queues).

Every function blocks until its measurements are done; the load threads share the
pools below (a ``deque`` and ``itertools.count``: thread-safe under the GIL).
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from typing import Any

from raftlease.client import AsyncClient, Client
from raftlease.errors import RaftLeaseError
from raftlease.testing import LocalCluster

from ..cluster import log_alerts, max_term, node_rss
from ..context import Context, progress
from ..measure import Variant, measure, run_async, run_threads

#: Attempt TTL of the benchmark's claims: long enough that no attempt expires
#: before the complete phase reaches it.
CLAIM_TTL = 600.0
#: Queues the memory phase spreads its tasks over (a per-queue quota stays far).
QUEUES = 10
PAYLOAD = {"env": "cartpole", "seed": 7, "steps": 1000}

METHOD = (
    "Own 3-node cluster, default settings. 'task put': put of a 40-byte payload. "
    "'task claim': claim(wait=0) of a ready task (the queue is topped up, unmeasured, "
    "before each repetition: the latency of a claim when tasks are ready). 'task "
    "complete': complete of the tasks the claims took (topped up, unmeasured). 'task "
    "end-to-end': as many producer threads as workers (on a Client of their own) put "
    "while the worker threads claim (waiting on the server when none is ready) and "
    "complete: one op = one task "
    "through put -> claim -> complete (three replicated steps), its latency claim + "
    "complete. 'task end-to-end [async N]': N loops of put -> claim -> complete in "
    "flight on one AsyncClient (concurrent requests batched into log entries). "
    "Modes: 1 thread, and {threads} threads sharing one Client. 'task memory': a fresh "
    "cluster, RSS per node idle and with {tasks:,} ready tasks over {queues} queues."
)


class _Counter:
    """A count the load threads add to (one lock: increments are not atomic)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self, n: int = 1) -> None:
        with self._lock:
            self.value += n


class _Pool:
    """Tasks handed out once each to the load threads (claimed tasks to complete)."""

    def __init__(self) -> None:
        self.items: collections.deque[Any] = collections.deque()

    def put(self, item: Any) -> None:
        self.items.append(item)

    def take(self) -> Any:
        try:
            return self.items.popleft()
        except IndexError:
            return None


def tasks(ctx: Context) -> None:
    """The throughput groups on one cluster, then the memory phase on another."""
    p = ctx.profile
    ctx.method("tasks", METHOD.format(threads=p.threads, tasks=p.queued_tasks, queues=QUEUES))
    progress("tasks: starting a 3-node cluster with default settings")
    with LocalCluster(3) as cluster:
        cluster.start()
        time.sleep(0.5)
        try:
            with cluster.client() as client:
                throughput(ctx, cluster, client)
        finally:
            ctx.result.setdefault("node_log_alerts", {})["tasks"] = log_alerts(cluster)
    memory(ctx)


def throughput(ctx: Context, cluster: LocalCluster, client: Client) -> None:
    p = ctx.profile
    queue = client.queue("bench-tasks")
    e2e = client.queue("bench-e2e")
    puts, claims = _Counter(), _Counter()  # bench-tasks: ready = puts - claims
    claimed = _Pool()
    modes = [("1 thread", 1), (f"{p.threads} threads", p.threads)]

    def put(c: Client, i: int) -> bool:
        queue.put(PAYLOAD, lease_ttl=CLAIM_TTL)
        puts.add()
        return True

    for mode, n in modes:
        measure(ctx, cluster, Variant("task put", mode, _threads(client, n, put)))

    def claim(c: Client, i: int) -> bool:
        task = queue.claim(worker=f"w{i % 64}", wait=0.0, lease_ttl=CLAIM_TTL)
        if task is None:
            return False  # no ready task left: the repetition ends early
        claims.add()
        claimed.put(task)
        return True

    def top_up(mode: str, rep: int) -> None:
        # Enough ready tasks for this repetition: 1.5x what the put group managed in
        # this mode for as long (claims are about as fast), at least 500.
        try:
            rate = ctx.workloads["task put"][mode]["ops_per_s"]["max"]
        except KeyError:
            rate = 2000.0
        seconds = p.warmup if rep < 0 else p.duration
        need = max(500, int(rate * seconds * 1.5) + 100)
        have = puts.value - claims.value
        if have < need:
            t0 = time.monotonic()
            run_threads(client, p.threads, _count_up(put, need - have), 600.0)
            progress(
                f"task claim [{mode}]: {need - have} tasks put in {time.monotonic() - t0:.1f} s"
            )

    for mode, n in modes:
        measure(
            ctx,
            cluster,
            Variant("task claim", mode, _threads(client, n, claim), _bind(top_up, mode)),
        )

    def complete(c: Client, i: int) -> bool:
        task = claimed.take()
        if task is None:
            return False  # every claimed task completed: the repetition ends early
        task.complete(result={"ok": True, "i": i})
        return True

    def claim_more(c: Client, i: int) -> bool:
        queue.put(PAYLOAD, lease_ttl=CLAIM_TTL)
        task = queue.claim(worker=f"w{i % 64}", wait=5.0, lease_ttl=CLAIM_TTL)
        if task is not None:
            claimed.put(task)
        return True

    def more_claimed(mode: str, rep: int) -> None:
        # Enough claimed tasks for this repetition: 1.5x what the claims managed.
        try:
            rate = ctx.workloads["task claim"][mode]["ops_per_s"]["max"]
        except KeyError:
            rate = 2000.0
        seconds = p.warmup if rep < 0 else p.duration
        need = max(500, int(rate * seconds * 1.5) + 100) - len(claimed.items)
        if need > 0:
            t0 = time.monotonic()
            run_threads(client, p.threads, _count_up(claim_more, need), 600.0)
            progress(
                f"task complete [{mode}]: {need} tasks claimed in {time.monotonic() - t0:.1f} s"
            )

    for mode, n in modes:
        measure(
            ctx,
            cluster,
            Variant(
                "task complete", mode, _threads(client, n, complete), _bind(more_claimed, mode)
            ),
        )

    # The producers have a Client of their own (its own connections and event loop).
    with cluster.client() as producer:
        feed = producer.queue("bench-e2e")
        for mode, n in modes:
            measure(
                ctx, cluster, Variant("task end-to-end", mode, _end_to_end(client, e2e, feed, n))
            )

    # Many tasks in flight on one AsyncClient: what batching of concurrent requests
    # into one log entry gives (each in-flight loop: put -> claim -> complete).
    async def pipelined(c: AsyncClient, i: int) -> bool:
        q = c.queue("bench-e2e-async")
        await q.put(PAYLOAD, lease_ttl=CLAIM_TTL)
        task = await q.claim(worker=f"a{i % 64}", wait=1.0, lease_ttl=CLAIM_TTL)
        if task is None:
            raise RuntimeError("end-to-end: no task within 1 s after a put")
        await task.complete(result={"ok": True})
        return True

    mode = f"async {p.async_tasks}"
    measure(
        ctx,
        cluster,
        Variant(
            "task end-to-end",
            mode,
            lambda seconds: run_async(cluster.endpoints, p.async_tasks, pipelined, seconds),
        ),
    )


def _end_to_end(client: Client, queue: Any, feed: Any, workers: int) -> Any:
    """One end-to-end run: as many producer threads as workers put tasks (``feed``,
    the same queue on another Client) while ``workers`` threads claim on ``client``
    (waiting on the server when none is ready) and complete them. One op = one task
    that went put -> claim -> complete; its latency is claim + complete."""

    def run(seconds: float) -> Any:
        stop = threading.Event()
        puts = _Counter()

        def produce() -> None:
            while not stop.is_set():
                try:
                    feed.put(PAYLOAD, lease_ttl=CLAIM_TTL)
                except RaftLeaseError:
                    continue
                puts.add()

        producers = [threading.Thread(target=produce, daemon=True) for _ in range(workers)]
        for thread in producers:
            thread.start()

        def work(c: Client, i: int) -> bool:
            task = queue.claim(worker=f"e{i % 64}", wait=1.0, lease_ttl=CLAIM_TTL)
            if task is None:
                raise RuntimeError("end-to-end: no task within 1 s while producers put")
            task.complete(result={"ok": True})
            return True

        try:
            result = run_threads(client, workers, work, seconds)
        finally:
            stop.set()
            for thread in producers:
                thread.join(timeout=30)
        result.extra = {"puts": puts.value, "producers": len(producers)}
        return result

    return run


def memory(ctx: Context) -> None:
    """RSS per node of a fresh cluster, idle and with ``queued_tasks`` ready tasks."""
    p = ctx.profile
    progress(f"task memory: a fresh 3-node cluster; {p.queued_tasks:,} tasks to queue")
    with LocalCluster(3) as cluster:
        cluster.start()
        time.sleep(1.0)
        idle = node_rss(cluster)
        term0 = max_term(cluster)
        with cluster.client() as client:
            queues = [client.queue(f"bench-mem-{i}") for i in range(QUEUES)]
            left = itertools.count()

            def put(c: Client, i: int) -> bool:
                n = next(left)
                if n >= p.queued_tasks:
                    return False
                queues[n % QUEUES].put({"n": n, **PAYLOAD}, lease_ttl=CLAIM_TTL)
                return True

            t0 = time.monotonic()
            run = run_threads(client, p.threads, put, 3600.0)
            took = time.monotonic() - t0
            time.sleep(1.0)
            loaded = node_rss(cluster)
            stats = [q.stats() for q in queues]
        ready = sum(int(_stat(s, "ready")) for s in stats)
        progress(
            f"task memory: {ready:,} ready tasks after {took:.1f} s ({run.ops / took:,.0f}/s); "
            "RSS MiB " + ", ".join(f"{k} {v.get('VmRSS', 0):.0f}" for k, v in loaded.items())
        )
        ctx.workloads["task memory"] = {
            f"{p.queued_tasks} tasks": {
                "mode": f"{p.queued_tasks} queued tasks",
                "tasks_requested": p.queued_tasks,
                "ready_tasks": ready,
                "put_errors": run.errors,
                "put_seconds": took,
                "put_per_s": run.ops / took if took else 0.0,
                "rss_idle_mib": {k: v.get("VmRSS", 0.0) for k, v in idle.items()},
                "rss_loaded_mib": {k: v.get("VmRSS", 0.0) for k, v in loaded.items()},
                "peak_rss_mib": {k: v.get("VmHWM", 0.0) for k, v in loaded.items()},
                "elections_during_load": max_term(cluster) - term0,
                "primary": {
                    "name": "max_rss_loaded_mib",
                    "value": max(v.get("VmRSS", 0.0) for v in loaded.values()),
                },
            }
        }
        ctx.result.setdefault("node_log_alerts", {})["task memory"] = log_alerts(cluster)


# ------------------------------------------------------------------ helpers


def _threads(client: Client, n: int, op: Any) -> Any:
    return lambda seconds: run_threads(client, n, op, seconds)


def _bind(prepare: Any, mode: str) -> Any:
    return lambda rep: prepare(mode, rep)


def _count_up(op: Any, total: int) -> Any:
    done = itertools.count()

    def bounded(c: Client, i: int) -> bool:
        if next(done) >= total:
            return False
        return bool(op(c, i))

    return bounded


def _stat(stats: Any, name: str) -> Any:
    if isinstance(stats, dict):
        return stats.get(name, 0)
    return getattr(stats, name, 0)
