"""Memory and snapshot stall, on a dedicated cluster.

Memory: RSS per node idle and with ``memory_leases`` live leases (created pipelined
on one AsyncClient while a ``Monitor`` watches the nodes). Snapshot: the same loaded
cluster restarted with aggressive log compaction, a pacer renewing one lease every
10 ms, and the Monitor measuring how long the tick loop went without applying while
PySyncObj took snapshots of the full state. Both block for their whole duration.
"""

from __future__ import annotations

import time
from typing import Any

from raftlease.config import NodeConfig
from raftlease.errors import RaftLeaseError
from raftlease.testing import LocalCluster

from ..cluster import log_alerts, max_term, node_rss, wait_caught_up
from ..context import TTL_MEMORY, Context, progress
from ..measure import counts, create_leases, percentile
from ..monitor import Monitor

SNAPSHOT_METHOD = (
    "The memory cluster (holding the live leases) is stopped and restarted with "
    "compaction_min_entries={entries} and "
    "compaction_min_time={seconds} s, so PySyncObj compacts "
    "its log (snapshot of the whole state via fork) every few seconds while a pacer "
    "renews one lease every 10 ms, alternating its TTL between 60 and 61 s (a renewal "
    "with a new TTL is a log write even with keepalives = memory: one log entry each, "
    "applied on every node). A "
    "poller per node reads its status every 10 ms (applied index, term) and "
    "watches raft.dump / raft.dump.tmp (a snapshot is being written while the .tmp "
    "exists; a new raft.dump mtime is a finished snapshot). A stall of the tick "
    "loop stops applying. A poll reads the applied index somewhere between its "
    "start and its end; if polls i..j all read the same index, nothing was applied "
    "from the end of poll i to the start of poll j ('certain', a lower bound on the "
    "longest stall); the stall fits within start of poll i-1 .. end of poll j+1 "
    "('upper bound', which includes the polls' own delay). With the pacer's 10 ms "
    "entries plus 10 ms polls the resolution is ~20-30 ms. Elections = change of "
    "the highest term seen; each term change is checked for a snapshot within 2 s "
    "on any node. The same "
    "poller ran while the leases were created (memory.load_window), with default "
    "compaction settings."
)


def default_election_timeout_min() -> float:
    """raftlease's default election_timeout_min (s): the bound a snapshot stall is
    compared with (both clusters run the NodeConfig defaults)."""
    defaults = NodeConfig.create(
        node_id="n1",
        data_dir="/tmp",
        nodes=[{"id": "n1", "raft": "127.0.0.1:1", "client": "127.0.0.1:2"}],
    )
    return defaults.election_timeout_min


def memory_snapshot(ctx: Context) -> None:
    """The memory workload, then the snapshot phase on the same cluster; the node
    log alerts of this cluster are recorded either way."""
    p = ctx.profile
    progress("memory: starting a dedicated 3-node cluster with default settings")
    with LocalCluster(3) as cluster:
        cluster.start()
        time.sleep(1.0)
        idle = node_rss(cluster)
        term0 = max_term(cluster)
        monitor = Monitor(cluster, interval=0.01)
        monitor.start()
        keys = [f"tenant-{i % 97:02d}/job/{i:08d}" for i in range(p.memory_leases)]
        progress(f"memory: creating {p.memory_leases:,} leases ({p.preload_inflight} in flight)")
        t_load = time.monotonic()
        try:
            _, took, errors = create_leases(
                cluster.endpoints, keys, TTL_MEMORY, p.preload_inflight, keep=False
            )
        finally:
            t_loaded = time.monotonic()
            time.sleep(1.0)
            monitor.stop()
        loaded = node_rss(cluster)
        statuses = {s["node"]: s for s in cluster.statuses() if s.get("reachable")}
        live = max((int(s.get("leases", 0)) for s in statuses.values()), default=0)
        progress(
            f"memory: {live:,} live leases after {took:.1f} s "
            f"({p.memory_leases / took:,.0f}/s); RSS MiB "
            + ", ".join(f"{k} {v.get('VmRSS', 0):.0f}" for k, v in loaded.items())
        )
        preload_window = monitor.analyse(t_load, t_loaded)
        settled: dict[str, dict[str, float]] = {}
        if p.memory_settle > 0:
            # What a node holds in steady state: the load's journal entries go with the
            # next compaction and freed heap pages with the next trims.
            progress(f"memory: waiting {p.memory_settle:.0f} s for the nodes to settle")
            time.sleep(max(0.0, t_loaded + p.memory_settle - time.monotonic()))
            settled = node_rss(cluster)
            progress(
                "memory: settled RSS MiB "
                + ", ".join(f"{k} {v.get('VmRSS', 0):.0f}" for k, v in settled.items())
            )
        ctx.workloads["memory"] = {
            f"{p.memory_leases} leases": {
                "mode": f"{p.memory_leases} live leases",
                "leases_requested": p.memory_leases,
                "live_leases": live,
                "create_errors": errors,
                "create_seconds": took,
                "create_per_s": p.memory_leases / took if took else 0.0,
                "rss_idle_mib": {k: v.get("VmRSS", 0.0) for k, v in idle.items()},
                "rss_loaded_mib": {k: v.get("VmRSS", 0.0) for k, v in loaded.items()},
                "peak_rss_mib": {k: v.get("VmHWM", 0.0) for k, v in loaded.items()},
                "rss_settled_mib": {k: v.get("VmRSS", 0.0) for k, v in settled.items()},
                "settle_seconds": p.memory_settle,
                "elections_during_load": max_term(cluster) - term0,
                "load_window": preload_window,
                "primary": {
                    "name": "max_rss_loaded_mib",
                    "value": max(v.get("VmRSS", 0.0) for v in loaded.values()),
                },
            }
        }
        try:
            snapshot(ctx, cluster)
        finally:
            ctx.result.setdefault("node_log_alerts", {})["memory"] = log_alerts(cluster)


def snapshot(ctx: Context, cluster: LocalCluster) -> None:
    """Restart ``cluster`` with forced compaction and pace renewals through it."""
    p = ctx.profile
    settings = {
        "compaction_min_entries": p.snapshot_compaction_entries,
        "compaction_min_time": p.snapshot_compaction_time,
    }
    progress(f"snapshot: restarting the loaded cluster with {settings}")
    cluster.stop()
    cluster.settings.update(settings)
    t0 = time.monotonic()
    cluster.start(wait=False)
    wait_caught_up(cluster, timeout=120)
    restart_s = time.monotonic() - t0
    # Issue 38's "at all times" includes a restart: the nodes load the snapshot their
    # compaction wrote while they settled (and the journal after it). VmHWM of the new
    # processes is the highest they reached while loading it.
    restarted = node_rss(cluster)
    memory_entry = ctx.workloads.get("memory", {}).get(f"{p.memory_leases} leases")
    if memory_entry is not None:
        memory_entry["restart_peak_rss_mib"] = {
            k: v.get("VmHWM", 0.0) for k, v in restarted.items()
        }
        memory_entry["restart_rss_mib"] = {k: v.get("VmRSS", 0.0) for k, v in restarted.items()}
    progress(
        "snapshot: peak RSS MiB while restarting "
        + ", ".join(f"{k} {v.get('VmHWM', 0):.0f}" for k, v in restarted.items())
    )
    term0 = max_term(cluster)
    leader = cluster.wait_for_leader(30)
    with cluster.client() as c:
        lease = c.acquire("bench/snapshot/pacer", owner="pacer", ttl=60.0)
        monitor = Monitor(cluster, interval=0.01)
        monitor.start()
        pacer_lat: list[float] = []
        pacer_errors: list[str] = []
        t_start = time.monotonic()
        stop_at = t_start + p.snapshot_steady
        progress(
            f"snapshot: cluster back after {restart_s:.1f} s; pacing renewals every "
            f"10 ms for {p.snapshot_steady:.0f} s"
        )
        try:
            while time.monotonic() < stop_at:
                t = time.perf_counter()
                try:
                    # A new TTL each time: a log entry each (keepalives = memory
                    # answers a renewal with the same TTL from the leader's memory).
                    ttl = 61.0 if lease.ttl == 60.0 else 60.0
                    lease = c.renew(lease, ttl=ttl, timeout=5.0)
                    pacer_lat.append(time.perf_counter() - t)
                except RaftLeaseError as exc:
                    pacer_errors.append(type(exc).__name__)
                time.sleep(0.01)
        finally:
            t_end = time.monotonic()
            monitor.stop()
    window = monitor.analyse(t_start, t_end)
    elections = max_term(cluster) - term0
    certain, bound = window["max_no_apply_certain_ms"], window["max_no_apply_bound_ms"]
    election_timeout_ms = default_election_timeout_min() * 1000
    progress(
        f"snapshot: {window['snapshots_total']} snapshots seen, longest no-apply interval "
        f"{certain:.0f} ms (bound {bound:.0f} ms), max status RTT "
        f"{window['max_status_rtt_ms']:.0f} ms, {elections} election(s)"
    )
    entry: dict[str, Any] = {
        "mode": "forced compaction",
        "settings": settings,
        "leader": str(leader["node"]),
        "restart_to_caught_up_s": restart_s,
        "steady_seconds": t_end - t_start,
        "snapshots_seen": window["snapshots_total"],
        "elections": elections,
        "max_no_apply_certain_ms": certain,
        "max_no_apply_bound_ms": bound,
        "election_timeout_min_ms": election_timeout_ms,
        "pacer": {
            "ops": len(pacer_lat),
            "errors": counts(pacer_errors),
            "p50_ms": percentile(pacer_lat, 0.5) * 1000,
            "p99_ms": percentile(pacer_lat, 0.99) * 1000,
            "max_ms": max(pacer_lat, default=0.0) * 1000,
        },
        "window": window,
        "primary": {"name": "max_no_apply_bound_ms", "value": bound},
    }
    ctx.workloads["snapshot"] = {"forced compaction": entry}
    ctx.method(
        "snapshot",
        SNAPSHOT_METHOD.format(
            entries=p.snapshot_compaction_entries, seconds=p.snapshot_compaction_time
        ),
    )
