"""The benchmark's scale phase (issue 16; scripts/benchlib/workloads/scale.py).

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_bench_scale.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit.test_bench_scale import ROOT

BENCH = ROOT / "scripts" / "bench"
sys.path.insert(0, str(ROOT / "scripts"))


# ------------------------------------------------------------ integration


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie: reaped or not ours)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive:
            return []
        time.sleep(0.1)
    return [pid for pid in pids if _alive(pid)]


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_quick_scale_phase_alone(tmp_path: Path) -> None:
    """``--only scale`` runs the quick profile's few hundred agents to the end and
    stops its agent processes; the leader then holds one lease per live session."""
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--only", "scale", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=140,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads((out / "bench.json").read_text())
    assert list(result["workloads"]) == ["scale"]
    entry = result["workloads"]["scale"]["300 agents"]
    assert entry["agents_requested"] == 300 and entry["processes"] == 2
    assert entry["steps"] and entry["steps"][0]["agents"] == 300
    assert not _gone(entry["agent_pids"], 10.0), "agent processes left running"
    if entry["sustained"]:
        hold = entry["hold"]
        assert hold["keepalives"] > 0 and hold["p99_ms"] >= hold["p50_ms"] > 0
        assert hold["due_per_s"] == pytest.approx(hold["agents"] / entry["interval_s"])
        # Each live session holds exactly its one lease (a lost one released its own).
        end = entry["leader_end"]
        assert end["lease_sessions"] == end["leases"], end
        if entry["sessions_lost"] == 0 and not entry["steps"][0]["open_errors"]:
            assert end["leases"] == hold["alive_end"] == 300, end
        assert all(v > 0 for v in entry["rss_end_mib"].values())
    else:
        assert entry["stopped"], entry  # no level held: the ramp says why
    (row,) = [t for t in result["targets"] if t.get("issue") == 16]
    assert row["met"] is not True  # 300 agents and no memory phase: n/a (or a failed half)
    markdown = (out / "bench.md").read_text()
    assert "## Scale: agents with lease sessions (issue 16)" in markdown


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_interrupted_scale_phase_stops_every_process(tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) while the agents run: the bench ends, and neither an agent
    process nor a node process is left. Started with SIGINT ignored, as a background
    job inherits it: the bench sets its own handler rather than rely on Python's."""
    out = tmp_path / "bench"
    proc = subprocess.Popen(
        [sys.executable, str(BENCH), "--quick", "--only", "scale", "--out", str(out)],
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    agent_pids: list[int] = []
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # ends at EOF: the bench is bounded by its time limit
            seen.append(line)
            match = re.search(r"agent processes started, pids ([\d ]+)", line)
            if match:
                agent_pids = [int(x) for x in match.group(1).split()]
            if agent_pids and "scale: step to" in line:
                break
        assert agent_pids, "".join(seen[-30:])
        node_pids = _node_pids(proc.pid, agent_pids)
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
        seen.append(rest)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    # Interrupted, not a clean run: 130 also when the KeyboardInterrupt was lost in a
    # finalizer (benchlib/runner.py), or killed by the default SIGINT disposition.
    assert proc.returncode != 0, "".join(seen)[-4000:]
    assert not _gone(agent_pids, 15.0), "agent processes left running"
    assert not _gone(node_pids, 15.0), "node processes left running"


def _node_pids(parent: int, agent_pids: list[int]) -> list[int]:
    """The node processes the bench (``parent``) started: children running
    ``-m raftlease``, the agent processes aside."""
    assert all(_ppid(pid) == parent for pid in agent_pids)
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in agent_pids:
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if _ppid(int(entry)) == parent and b"raftlease" in cmdline:
            out.append(int(entry))
    assert len(out) == 3, out
    return out


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1
