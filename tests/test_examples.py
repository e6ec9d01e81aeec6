"""The examples run against a real cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from raftlease.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


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
