"""The examples run against a real cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from raftlease.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("gpu_pool_workers.py", ["--workers", "4", "--episodes", "3"]),
        ("elected_coordinator.py", ["--agents", "3", "--rounds", "2"]),
    ],
)
def test_example_runs(shared: LocalCluster, script: str, args: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--endpoints", ",".join(shared.endpoints), *args],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip()


def test_planning_agents_fence_out_a_crashed_agent(shared: LocalCluster) -> None:
    script = EXAMPLES / "planning_agents.py"
    out = subprocess.run(
        [sys.executable, str(script), "--endpoints", ",".join(shared.endpoints)],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("crash: agent-0") for line in lines), out.stdout
    assert any(line.startswith("expiry: agent-0's session expired") for line in lines), out.stdout
    assert any(line.startswith("reclaim: ") for line in lines), out.stdout
    assert any(
        line.startswith("rejected: stale write") and "by agent-0" in line for line in lines
    ), out.stdout
    assert "  [ok] every subtask done exactly once" in lines
    assert "  [ok] agent-0's late write was rejected by the fence" in lines
    assert "  [ok] agent-0's subtasks were completed by others" in lines
    assert lines[-1] == "OK"


def test_task_planner_gathers_every_result_exactly_once(shared: LocalCluster) -> None:
    script = EXAMPLES / "task_planner.py"
    out = subprocess.run(
        [sys.executable, str(script), "--endpoints", ",".join(shared.endpoints)],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("crash: agent-0 was killed") for line in lines), out.stdout
    assert "  [ok] every subtask's result gathered exactly once" in lines
    assert "  [ok] crashed agents' subtasks were retried and finished by other agents" in lines
    assert "  [ok] each accepted result carries a higher token than every earlier attempt" in lines
    assert lines[-1] == "OK"
