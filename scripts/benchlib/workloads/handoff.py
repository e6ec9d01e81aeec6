"""Contended handoff: N clients loop acquire-then-release on one key, measured as
grants per second with the fairness of who got the grants.

Each client is its own blocking ``Client`` on its own thread; a repetition blocks
until all threads ended. Two modes: "spin" (acquire without waiting, retried at once
on LEASE_HELD) and, when ``Client.acquire`` has ``wait=``, "queued" (the fair
blocking acquire, granted in the log entry that frees the key).
"""

from __future__ import annotations

import inspect
import itertools
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from raftlease.client import Client
from raftlease.errors import LeaseHeldError, RaftLeaseError
from raftlease.testing import LocalCluster

from ..context import MAX_ERRORS, Context
from ..measure import Run, Variant, measure, percentile

#: The fairness figures of each repetition whose median the report gives.
FAIRNESS_KEYS = (
    "jain_index",
    "min_share_x_n",
    "max_share_x_n",
    "longest_same_client_streak",
    "attempts_per_grant",
    "handoff_gap_p50_ms",
    "handoff_gap_p99_ms",
)

METHOD = (
    "{n} threads, each with its own Client, loop on one key: acquire, then "
    "release at once. 'spin': acquire without waiting, retried at once on "
    "LEASE_HELD (no sleep); 'queued' (when Client.acquire has wait=): the fair "
    "blocking acquire, which queues in the replicated state and is granted in "
    "the entry that frees the key. "
    "Throughput = grants/s (each grant is one handoff). Latency = time of the "
    "successful acquire call. Fairness: shares of grants per client, Jain's "
    "index (1 = equal), min/max share x clients (1 = equal), longest run of "
    "consecutive grants to one client."
)


def fairness(
    counts: list[int], attempts: list[int], order: list[tuple[float, int]]
) -> dict[str, Any]:
    """Fairness of one repetition: grants per client, their shares, Jain's index,
    longest run of consecutive grants to one client, attempts per grant and the gaps
    between grants (``order``: (time, client) of each grant)."""
    n = len(counts)
    total = sum(counts)
    shares = [c / total if total else 0.0 for c in counts]
    order = sorted(order)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(order)]
    streak = best = 0
    prev = -1
    for _, w in order:
        streak = streak + 1 if w == prev else 1
        prev = w
        best = max(best, streak)
    return {
        "grants_per_client": counts,
        "shares": shares,
        "jain_index": (total**2) / (n * sum(c * c for c in counts)) if total else 0.0,
        "min_share_x_n": min(shares) * n,
        "max_share_x_n": max(shares) * n,
        "longest_same_client_streak": best,
        "attempts_per_grant": sum(attempts) / total if total else 0.0,
        "handoff_gap_p50_ms": percentile(gaps, 0.5) * 1000,
        "handoff_gap_p99_ms": percentile(gaps, 0.99) * 1000,
    }


def _contend(ctx: Context, clients: list[Client], duration: float, queued: bool) -> Run:
    """One repetition: every client on its own thread until ``duration`` is over."""
    n = len(clients)
    key = ctx.key("handoff")
    # One slot per client thread; only ``order`` is shared, under ``lock``.
    counts = [0] * n
    attempts = [0] * n
    latencies: list[list[float]] = [[] for _ in range(n)]
    errors = [0] * n
    lock = threading.Lock()
    order: list[tuple[float, int]] = []
    stop_at = time.perf_counter() + duration

    def worker(w: int) -> None:
        c = clients[w]
        while time.perf_counter() < stop_at and errors[w] < MAX_ERRORS:
            attempts[w] += 1
            t0 = time.perf_counter()
            try:
                if queued:
                    # Fair blocking acquire: queue in the replicated state,
                    # granted in the same entry that frees the key.
                    wait = min(5.0, max(0.1, stop_at - t0 + 0.5))
                    lease = c.acquire(key, owner=f"client-{w}", ttl=10.0, wait=wait)
                else:
                    lease = c.acquire(key, owner=f"client-{w}", ttl=10.0)
            except LeaseHeldError:
                continue
            except RaftLeaseError:
                errors[w] += 1
                continue
            now = time.perf_counter()
            with lock:
                order.append((now, w))
            latencies[w].append(now - t0)
            counts[w] += 1
            try:
                c.release(lease)
            except RaftLeaseError:
                errors[w] += 1

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=duration + 60)
    elapsed = time.perf_counter() - start
    merged = [x for lat in latencies for x in lat]
    return Run(sum(counts), sum(errors), elapsed, merged, extra=fairness(counts, attempts, order))


def handoff(ctx: Context, cluster: LocalCluster) -> None:
    """Measure the spin and (if supported) queued handoff; each entry gets the
    median fairness figures of its repetitions."""
    n = ctx.profile.handoff_clients
    clients = [cluster.client() for _ in range(n)]
    queue_supported = "wait" in inspect.signature(Client.acquire).parameters
    try:
        variants: list[tuple[str, Callable[[float], Run]]] = [
            (f"{n} clients, spin", lambda d: _contend(ctx, clients, d, queued=False))
        ]
        if queue_supported:
            variants.append(
                (f"{n} clients, queued", lambda d: _contend(ctx, clients, d, queued=True))
            )
        for mode, run in variants:
            entry = measure(ctx, cluster, Variant("handoff", mode, run))
            extras: list[dict[str, Any]] = entry.get("extra", [])
            entry["fairness"] = {
                k: statistics.median(float(e[k]) for e in extras) for k in FAIRNESS_KEYS
            }
        ctx.method("handoff", METHOD.format(n=n))
    finally:
        for c in clients:
            c.close()
