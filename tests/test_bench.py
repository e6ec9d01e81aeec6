"""The benchmark's quick profile runs end to end and writes its files.

No timed assertions: the figures depend on the machine. This only checks that
``scripts/bench --quick`` starts its clusters, runs every workload and reports a
positive figure for each, and that ``scripts/bench --render`` turns the saved JSON
back into the same Markdown (tests/test_bench_report.py covers the renderer alone).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "scripts" / "bench"

#: Workload groups every run must report (holder reads may be split per mode).
GROUPS = ("acquire", "renew", "release", "handoff", "failover", "memory", "snapshot")
RAW = ("sync_1thread", "pipelined_100", "pipelined_1000")
CONCURRENCY = ("1 thread", "16 threads", "async 256")


def _numbers(value: Any) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return []


def test_quick_profile_writes_json_and_markdown(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    markdown = out / "bench.md"
    assert markdown.exists() and "| workload |" in markdown.read_text()
    assert "| workload |" in proc.stdout  # the table is printed too
    assert "raw sync_1thread" in proc.stderr  # progress goes to stderr

    result = json.loads((out / "bench.json").read_text())
    for name in RAW:
        assert result["raw"][name]["primary"]["value"] > 0, name

    workloads = result["workloads"]
    holder_groups = [g for g in workloads if g.startswith("holder")]
    assert holder_groups, "no holder-read workload"
    for group in (*GROUPS, *holder_groups):
        assert group in workloads, f"workload {group} missing"
        variants = workloads[group]
        assert variants and "error" not in variants, f"{group}: {variants}"
        for mode, entry in variants.items():
            assert entry["primary"]["value"] > 0, f"{group} [{mode}]: {entry['primary']}"
            assert all(x >= 0 for x in _numbers(entry)), f"{group} [{mode}] has negatives"
    for group in ("acquire", "renew", "release", *holder_groups):
        assert set(workloads[group]) == set(CONCURRENCY), group
        for entry in workloads[group].values():
            assert entry["p50_ms"] > 0 and entry["p99_ms"] >= entry["p50_ms"]
            assert entry["cpu_s"]["client"] >= 0 and len(entry["cpu_s"]) == 5  # client, 3, others
            assert entry["vs_raw"]["pipelined_best"] > 0

    handoff = next(iter(workloads["handoff"].values()))
    assert 0 < handoff["fairness"]["jain_index"] <= 1.0
    failover = next(iter(workloads["failover"].values()))
    assert failover["reps"] and failover["time_to_success_s"]["median"] > 0
    memory = next(iter(workloads["memory"].values()))
    assert memory["live_leases"] > 0
    assert all(v > 0 for v in memory["rss_idle_mib"].values())
    assert all(v > 0 for v in memory["rss_loaded_mib"].values())
    snapshot = next(iter(workloads["snapshot"].values()))
    assert snapshot["snapshots_seen"] > 0

    assert result["targets"], "targets were not evaluated"
    assert {"target", "figure", "met"} <= set(result["targets"][0])

    # The saved JSON renders again, without a cluster, to the same Markdown; judged
    # again from the targets file, it gets the same targets.
    for extra in ([], ["--retarget"]):
        render = subprocess.run(
            [sys.executable, str(BENCH), "--render", str(out / "bench.json"), *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert render.returncode == 0, render.stderr
        assert render.stdout == markdown.read_text(), extra
