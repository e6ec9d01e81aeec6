"""Node processes seen from outside: CPU seconds and RSS from /proc, the rest of the
machine's load, and cluster-wide waits and log checks over a ``LocalCluster``.

Everything here blocks the calling thread (file reads, status round trips, bounded
waits) and is called from the main thread between measurements.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from raftlease.testing import LocalCluster, wait_for

from .context import BenchTimeout, Context, isolated, progress

CLK_TCK = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024


# ----------------------------------------------------------------- /proc


def proc_cpu(pid: int) -> float:
    """CPU seconds of ``pid``: utime + stime + reaped children (0.0 if gone).

    Reaped children count because the nodes' snapshot writers are fork()ed."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): utime=14, stime=15, cutime=16, cstime=17.
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK_TCK


def proc_mem(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak RSS) of ``pid`` in MiB."""
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0]) * 1024 / MIB
    except OSError:
        pass
    return out


def system_busy() -> float:
    """CPU seconds the whole machine spent busy since boot (/proc/stat, all CPUs)."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()[1:]
    except OSError:
        return 0.0
    values = [int(x) for x in parts]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    # guest time is already counted in user/nice.
    return (sum(values[:8]) - idle) / CLK_TCK


class CpuProbe:
    """CPU seconds of the client (this process), of each server process, and of
    everything else on the machine ("others": other users of the shared cores)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = {"client": os.getpid(), **pids}

    def sample(self) -> dict[str, float]:
        out = {name: proc_cpu(pid) for name, pid in self.pids.items()}
        out["others"] = system_busy()
        return out

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        """CPU seconds used between two samples; "others" excludes our processes."""
        out = {k: max(0.0, after[k] - before.get(k, 0.0)) for k in after}
        ours = sum(v for k, v in out.items() if k != "others")
        out["others"] = max(0.0, out.get("others", 0.0) - ours)
        return out

    def settle(self, max_wait: float, threshold: float = 0.25, window: float = 0.5) -> float:
        """Block (at most ``max_wait`` s) until the rest of the machine used less than
        ``threshold`` of one core over the last ``window`` s. Returns seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < max_wait:
            before = self.sample()
            time.sleep(window)
            if self.delta(before, self.sample())["others"] < threshold * window:
                break
        return time.monotonic() - start


def cluster_probe(cluster: LocalCluster) -> CpuProbe:
    """A CpuProbe of this process and every node process of ``cluster``."""
    return CpuProbe({n.id: cluster.pid(n.id) for n in cluster.nodes})


def node_rss(cluster: LocalCluster) -> dict[str, dict[str, float]]:
    """VmRSS and VmHWM (MiB) of every node process, by node id."""
    return {n.id: proc_mem(cluster.pid(n.id)) for n in cluster.nodes}


# --------------------------------------------------------------- cluster


def max_term(cluster: LocalCluster) -> int:
    """The highest Raft term any reachable node reports (0 if none answers)."""
    return max((int(s.get("term", 0)) for s in cluster.statuses() if s.get("reachable")), default=0)


def journal_counters(cluster: LocalCluster) -> dict[str, dict[str, int]]:
    """The journal counters each reachable node's status reports (integer fields
    named ``journal_*``, e.g. ``journal_syncs`` and ``journal_synced_entries``), by
    node id; empty for a raftlease whose status has none."""
    out: dict[str, dict[str, int]] = {}
    for status in cluster.statuses():
        if not status.get("reachable"):
            continue
        found = {
            k: v
            for k, v in status.items()
            if k.startswith("journal_") and isinstance(v, int) and not isinstance(v, bool)
        }
        if found:
            out[str(status.get("node"))] = found
    return out


def counter_delta(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """Per node and counter, how much it grew (0 if it went back: a restarted node)."""
    return {
        node: {k: max(0, v - before[node].get(k, 0)) for k, v in counters.items()}
        for node, counters in after.items()
        if node in before
    }


def wait_caught_up(cluster: LocalCluster, timeout: float) -> None:
    """Block until every running node is reachable, ready, agreeing on a leader, and
    applied up to the leader's commit index seen before. Raises TimeoutError."""

    def check() -> bool:
        statuses = [s for s in cluster.statuses() if s.get("reachable")]
        if len(statuses) < len([n for n in cluster.nodes if cluster.is_running(n.id)]):
            return False
        leaders = [s for s in statuses if s.get("role") == "leader"]
        if len(leaders) != 1 or not all(s.get("ready") for s in statuses):
            return False
        commit = int(leaders[0]["commit_index"])
        return all(int(s["applied_index"]) >= commit - 5 for s in statuses)

    wait_for(check, timeout, "every node caught up with the leader", interval=0.1)


_ALERT = re.compile(r"level=(WARNING|ERROR|CRITICAL) logger=(\S+) pid=\d+ (.*)")


def log_alerts(cluster: LocalCluster) -> dict[str, Any]:
    """WARNING/ERROR/CRITICAL lines in the nodes' logs, grouped by message shape
    (digits replaced by N): count per node and one example each, most frequent first."""
    kinds: dict[str, dict[str, Any]] = {}
    for node in cluster.nodes:
        path = cluster.log_path(node.id)
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            match = _ALERT.search(line)
            if not match:
                continue
            level, logger, message = match.groups()
            shape = f"{level} {logger}: " + re.sub(r"\d+(\.\d+)?", "N", message)[:120]
            kind = kinds.setdefault(shape, {"count": 0, "nodes": {}, "example": line[:300]})
            kind["count"] += 1
            kind["nodes"][node.id] = kind["nodes"].get(node.id, 0) + 1
    return dict(sorted(kinds.items(), key=lambda kv: -int(kv[1]["count"])))


def save_failure_logs(out: Path, name: str, cluster: LocalCluster) -> Path:
    """After a failed workload ``name``: the current exception's traceback, the
    nodes' statuses (if they answer) and the tail of their logs, in
    ``out``/logs/``name``.log. Call from an ``except`` block; returns the file."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    detail = [traceback.format_exc()]
    with contextlib.suppress(Exception):
        detail.append(json.dumps(cluster.statuses(), indent=1))
    detail.append(cluster.logs(tail=300))
    path = logs / f"{name.replace(' ', '_')}.log"
    path.write_text("\n".join(detail))
    return path


@contextlib.contextmanager
def failure_recorded(
    ctx: Context, name: str, record: dict[str, Any], cluster: LocalCluster
) -> Iterator[None]:
    """Around the work of one cluster of a phase (``name``): an exception other than
    ``BenchTimeout`` or ``KeyboardInterrupt`` is recorded in ``record["error"]``, with
    the nodes' logs saved (``save_failure_logs``), and the phase goes on; either way
    the cluster's log alerts are kept in the result's ``node_log_alerts``."""
    try:
        yield
    except (BenchTimeout, KeyboardInterrupt):
        raise
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        progress(f"{name}: FAILED: {record['error']}")
        path = save_failure_logs(ctx.out, name, cluster)
        progress(f"{name}: node logs saved in {path.parent}")
    finally:
        ctx.result.setdefault("node_log_alerts", {})[name] = log_alerts(cluster)


def group_recorded(
    ctx: Context, name: str, group: str, cluster: LocalCluster, fn: Callable[[], None]
) -> None:
    """One workload ``group`` of a phase's cluster (``name``), isolated
    (``context.isolated``: recorded under the group in ``ctx.workloads``), with the
    nodes' logs saved when it fails."""
    isolated(
        ctx.workloads,
        f"{name}: ",
        group,
        fn,
        lambda: save_failure_logs(ctx.out, f"{name} {group}", cluster),
    )
