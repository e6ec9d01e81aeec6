"""The acquire_many proof run (scripts/many_proof, issue 40), short, with waiting sets
and single-key waiters (``--wait --singles 1``): 0 deadlocks, 0 DEADLOCK refusals, 0
partial reads or watch sets, Jain >= 0.95. The full run (2 agents x 1,000 rounds, 8
agents x 200 rounds + 2 single-key agents) is recorded in docs/usage.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


def test_the_short_proof_run_with_waiting_sets_passes() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [
            *(sys.executable, str(ROOT / "scripts" / "many_proof"), "--rounds", "30"),
            *("--random-rounds", "15", "--agents", "4", "--wait", "--singles", "1", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=110,
        env=env,
    )
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    report = json.loads(out.stdout)
    assert report["ok"] and [run["run"] for run in report["runs"]] == ["pair", "random"]
    for run in report["runs"]:
        assert run["deadlocks"] == run["deadlock_refusals"] == run["partial_reads"] == 0
        assert run["partial_watch"] == 0 and run["sets_watched"] > 0
    assert report["runs"][1]["single_rounds_per_agent"]
