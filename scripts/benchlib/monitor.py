"""Per-node status pollers and what their samples say about stalls.

A ``Monitor`` runs one daemon thread per node that polls the node's status every
``interval`` s over its own blocking ``Client`` (term, applied index, role, round-trip
time) and looks at the node's snapshot files. ``analyse`` then finds, per node, the
longest stretch without an apply, snapshots finished, and term changes.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from raftlease.client import Client
from raftlease.errors import RaftLeaseError
from raftlease.testing import LocalCluster

from .measure import counts, percentile


class Monitor:
    """One poller thread per node: status every ``interval`` s (term, applied index,
    role, RTT), plus the node's snapshot files (raft.dump mtime, raft.dump.tmp).

    Each thread appends only to its own node's list in ``samples``; read them (``first``,
    ``analyse``) after ``stop``. A poller ends by itself after ``max_seconds``."""

    def __init__(self, cluster: LocalCluster, interval: float, max_seconds: float = 600) -> None:
        self.cluster = cluster
        self.interval = interval
        self.max_seconds = max_seconds
        self.samples: dict[str, list[dict[str, Any]]] = {n.id: [] for n in cluster.nodes}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._poll, args=(n.id, n.client), daemon=True)
            for n in cluster.nodes
        ]

    def start(self) -> None:
        """Start the poller threads (daemons; returns at once)."""
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Stop the pollers and wait (at most 10 s each) for them to end."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)

    def _poll(self, node_id: str, endpoint: str) -> None:
        """Poller thread body: one blocking status call per ``interval`` (1 s deadline,
        so a stalled node shows as a long RTT or an error sample, not a hung poller)."""
        node_dir = self.cluster.node_dir(node_id)
        dump, tmp = node_dir / "raft.dump", node_dir / "raft.dump.tmp"
        out = self.samples[node_id]
        end = time.monotonic() + self.max_seconds
        with Client([endpoint], deadline=1.0) as c:
            while not self._stop.is_set() and time.monotonic() < end:
                t0 = time.monotonic()
                sample: dict[str, Any] = {"t": t0, "ok": False}
                try:
                    status = c.node_status(endpoint, timeout=1.0)
                    sample.update(
                        ok=True,
                        term=int(status.get("term", 0)),
                        applied=int(status.get("applied_index", 0)),
                        role=status.get("role"),
                    )
                except RaftLeaseError as exc:
                    sample["error"] = f"{type(exc).__name__}: {exc}"[:200]
                sample["rtt"] = time.monotonic() - t0
                try:
                    sample["dump_mtime"] = dump.stat().st_mtime_ns
                except OSError:
                    sample["dump_mtime"] = None
                sample["tmp"] = tmp.exists()
                out.append(sample)
                self._stop.wait(self.interval)

    def first(self, pred: Callable[[dict[str, Any]], bool], after: float) -> float | None:
        """The earliest time after ``after`` at which a successful poll matched ``pred``."""
        times = [
            s["t"]
            for samples in self.samples.values()
            for s in samples
            if s["t"] > after and s.get("ok") and pred(s)
        ]
        return min(times) if times else None

    def analyse(self, t0: float, t1: float) -> dict[str, Any]:
        """Per node, over [t0, t1]: how long the applied index stood still, snapshots
        seen, term changes and status round trips.

        A poll reads the applied index at some instant between its start ``t`` and its
        end ``t + rtt``. For a run of polls i..j that all read the same index, nothing
        was applied from the end of poll i to the start of poll j: that is a *certain*
        stall (a lower bound). The stall may have begun after the previous poll
        i-1 started and ended before poll j+1 ended: that is its *upper bound*, which
        includes the polls' own delays (large when the node's event loop is busy).
        """
        nodes: dict[str, Any] = {}
        total_snaps = 0
        max_rtt = 0.0
        busy: list[tuple[float, float]] = []  # (start, end) of snapshot activity, any node
        for samples in self.samples.values():
            for a, b in itertools.pairwise(samples):
                if a["tmp"] or b["tmp"] or a["dump_mtime"] != b["dump_mtime"]:
                    busy.append((a["t"], b["t"] + b["rtt"]))
        term_changes: list[dict[str, Any]] = []
        for node_id, samples in self.samples.items():
            window = [s for s in samples if t0 <= s["t"] <= t1 and s.get("ok")]
            certain: list[float] = []
            bound: list[float] = []
            i = 0
            while i < len(window):
                j = i
                while j + 1 < len(window) and window[j + 1]["applied"] == window[i]["applied"]:
                    j += 1
                if j > i:
                    first, last = window[i], window[j]
                    certain.append(max(0.0, last["t"] - (first["t"] + first["rtt"])))
                    before = window[i - 1]["t"] if i > 0 else first["t"]
                    after = window[j + 1] if j + 1 < len(window) else last
                    bound.append(after["t"] + after["rtt"] - before)
                i = j + 1
            for a, b in itertools.pairwise(window):
                if b["term"] > a["term"]:
                    near = any(s0 - 2.0 <= b["t"] <= e0 + 2.0 for s0, e0 in busy)
                    term_changes.append(
                        {
                            "node": node_id,
                            "at_s": round(b["t"] - t0, 3),
                            "term": b["term"],
                            "snapshot_within_2s": near,
                        }
                    )
            mtimes = {s["dump_mtime"] for s in samples if t0 <= s["t"] <= t1}
            mtimes.discard(None)
            # The dump as it was when the window opened (None: no snapshot yet).
            first_mtime = next((s["dump_mtime"] for s in samples if s["t"] >= t0), None)
            snaps = len(mtimes - {first_mtime})
            tmp_polls = sum(1 for s in samples if t0 <= s["t"] <= t1 and s["tmp"])
            rtts = [s["rtt"] for s in samples if t0 <= s["t"] <= t1]
            poll_gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(window)]
            total_snaps += snaps
            max_rtt = max(max_rtt, max(rtts, default=0.0))
            errors = counts([s["error"] for s in samples if t0 <= s["t"] <= t1 and "error" in s])
            nodes[node_id] = {
                "polls": len(rtts),
                "failed_polls": len(rtts) - len(window),
                "poll_errors": errors,
                "terms": sorted({s["term"] for s in window}),
                "max_no_apply_certain_ms": max(certain, default=0.0) * 1000,
                "max_no_apply_bound_ms": max(bound, default=0.0) * 1000,
                "max_poll_interval_ms": max(poll_gaps, default=0.0) * 1000,
                "snapshots_finished": snaps,
                "polls_with_snapshot_in_progress": tmp_polls,
                "max_status_rtt_ms": max(rtts, default=0.0) * 1000,
                "p99_status_rtt_ms": percentile(rtts, 0.99) * 1000,
            }
        return {
            "nodes": nodes,
            "snapshots_total": total_snaps,
            "term_changes": term_changes,
            "max_no_apply_certain_ms": max(
                (v["max_no_apply_certain_ms"] for v in nodes.values()), default=0.0
            ),
            "max_no_apply_bound_ms": max(
                (v["max_no_apply_bound_ms"] for v in nodes.values()), default=0.0
            ),
            "max_status_rtt_ms": max_rtt * 1000,
        }
