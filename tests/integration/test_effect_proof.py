"""The effect proof (scripts/effect_proof, issue 41), short: 12 runs of "crash after
the external call, before the commit" in 3 batches of 4 (SIGKILL, SIGSTOP past the
TTL with the zombie's commit refused, SIGKILL with a leader change), on the honest
build (every effect applied exactly once) and on the planted ``skip_effect_check``
build (4 runs: the next attempt calls the provider again: caught). The full run's figures are in
docs/queues.md ("Effects"). Serial (tests/conftest.py SERIAL_FILES): a planted build
must be caught, and the run kills a leader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(170)]

ROOT = Path(__file__).resolve().parents[2]


def run_proof(tmp_path: Path, runs: int, *extra: str) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "effect_proof"), "--runs", str(runs),
         "--batch", "4", "--out", str(tmp_path), *extra],
        capture_output=True,
        text=True,
        timeout=160,
        env=env,
    )  # fmt: skip
    report = json.loads((tmp_path / "effect_proof.json").read_text())
    return out.returncode, report, out.stderr[-3000:]


@pytest.mark.parametrize("build", ["honest", "skip_effect_check"])
def test_every_effect_is_applied_once_and_the_planted_build_is_caught(
    build: str, tmp_path: Path
) -> None:
    if build == "honest":
        code, report, err = run_proof(tmp_path, 12)
    else:  # one batch (SIGKILL) is enough to show the second call
        code, report, err = run_proof(tmp_path, 4, "--planted-bug", build)
    verdict = report["queue_effects"]
    stats = verdict["stats"]
    if build == "honest":
        faults = report["faults"]
        assert report["runs"] == 12 and sum(faults.values()) + report["unstarted"] == 12
        assert min(faults.values()) >= 1, report  # every fault met at least one run
        assert report["leader_changes"] == 1 and stats["effects"] == 12, (report, err)
        assert code == 0 and report["passed"], (report, err)
        assert stats["applied_once"] == 12 and stats["applications"] == 12
        assert stats["zombie_commits_refused"] == faults["pause"]
    else:
        assert report["runs"] == 4 and stats["effects"] == 4, (report, err)
        assert code == 1 and not report["passed"]
        kinds = {v["kind"] for v in verdict["violations"]}
        assert kinds == {"applied_twice"}, verdict
