"""The budget proof run (scripts/budget_proof, issue 42), short: 8 agents in 2
processes spend one budget for 8 s across a leader SIGKILL; every window of log time
stays within capacity + refill x span, no agent starves, the replicas and a restored
backup hold the same budget state. The full run (64 agents, 120 s) is recorded in
docs/budgets.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


def test_the_short_proof_run_passes_every_check(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [
            *(sys.executable, str(ROOT / "scripts" / "budget_proof"), "--duration", "8"),
            *("--processes", "2", "--agents", "4", "--out", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=110,
        env=env,
    )
    report = json.loads((tmp_path / "budget_proof.json").read_text())
    assert out.returncode == 0, (report, out.stdout[-2000:], out.stderr[-4000:])
    assert report["passed"] and report["killed"]
    assert set(report["checks"]) == {
        "bound_every_window",
        "jain_at_least_0.9",
        "replicas_identical",
        "restore_identical",
    }
    assert report["grants"] > 0
