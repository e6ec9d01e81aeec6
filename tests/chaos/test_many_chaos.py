"""The set-taking agents in real chaos runs (issue 40: ``run.py --many on``).

Two short smoke runs (three faults, 3 nodes, about 30 s each): the planted build
``partial_many_grant`` must fail the ``many`` checker with sets seen in part by reads
and by the watcher (and granted in part), and the honest build must pass every
checker, with sets granted, induced cycles refused ``DEADLOCK`` and yield requests
judged by the ``yields`` rule (asked holders honouring or ignoring them). The planted
``skip_deadlock_detection`` build is caught by the same checker's
``undetected_deadlock`` rule (hand-made history in test_many_checker_rules.py; by hand:
jepsen-style/README.md, *Key sets*). Serial (tests/conftest.py SERIAL_FILES): a
planted build, and runs judged on timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

RUN = Path(__file__).resolve().parents[2] / "jepsen-style" / "run.py"


def _run(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "run"
    argv = [sys.executable, str(RUN), "--out", str(out), "--profile", "smoke"]
    argv += ["--nodes", "3", "--seed", "1", "--many", "on", "--queue", "off", *args]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=140,
    )
    path = out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    return (
        proc.returncode,
        results,
        f"output dir: {out}\n{proc.stdout[-5000:]}\n{proc.stderr[-2000:]}",
    )


@pytest.mark.integration
@pytest.mark.timeout(160)
def test_planted_partial_many_grant_is_caught(tmp_path: Path) -> None:
    code, results, output = _run(tmp_path, "--planted-bug", "partial_many_grant")
    assert code == 1 and results["valid"] is False, output
    many = results["checkers"]["many"]
    assert many["valid"] is False, output
    # Reads saw owners holding part of their sets, whatever the clients were told.
    assert many["stats"]["by_rule"].get("partial_visibility", 0) >= 1, many["stats"]
    assert many["stats"]["by_rule"].get("partial_watch", 0) >= 1, many["stats"]


@pytest.mark.integration
@pytest.mark.timeout(160)
def test_honest_build_passes_with_sets_granted_and_cycles_refused(tmp_path: Path) -> None:
    code, results, output = _run(tmp_path)
    verdicts = {name: r["valid"] for name, r in results["checkers"].items()}
    assert code == 0 and all(v is True for v in verdicts.values()), (verdicts, output)
    stats = results["checkers"]["many"]["stats"]
    assert stats["set_grants"] >= 20 and stats["reads"] >= 20, stats
    assert stats["deadlocks_refused"] >= 3 and stats["sets_watched"] >= 20, stats
    # Yields in the workload (request_yield), judged by the yields rule.
    assert stats["yield_requests"] >= 1, stats
