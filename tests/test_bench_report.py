"""The benchmark report renders from a saved result, without a cluster.

``tests/data/bench_small.json`` is the result of a ``scripts/bench --quick`` run,
trimmed (one holder mode replaced by a failure, no per-repetition handoff extras) and
given the cases a clean quick run does not reach: a failover repetition that saw no
new leader, term changes during the load and the snapshot phase, a node log alert.
``bench_small.md`` is what the single-file benchmark's renderer (before it became the
``benchlib`` package) printed for that JSON, and the fixture's ``targets`` are what its
target evaluation gave: the package must reproduce both exactly.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "scripts" / "bench"
DATA = Path(__file__).resolve().parent / "data"
FIXTURE = DATA / "bench_small.json"
GOLDEN = DATA / "bench_small.md"

sys.path.insert(0, str(ROOT / "scripts"))

from benchlib import report, targets  # noqa: E402 - benchlib is found through scripts/

#: Runs scripts/bench in a fresh interpreter and fails if anything imported raftlease.
NO_RAFTLEASE = """
import runpy, sys
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as exc:
    if exc.code:
        raise
loaded = sorted(m for m in sys.modules if m == "raftlease" or m.startswith("raftlease."))
if loaded:
    sys.exit(f"--render imported {loaded}")
"""


@pytest.fixture
def result() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(FIXTURE.read_text())
    return loaded


def test_render_reproduces_the_original_report(result: dict[str, Any]) -> None:
    assert report.render_markdown(result) == GOLDEN.read_text()


def test_targets_from_the_data_file_reproduce_the_original_evaluation(
    result: dict[str, Any],
) -> None:
    assert targets.evaluate(result) == result["targets"]
    # The profile's modes are found from meta.profile; without it, from the result.
    del result["meta"]["profile"]
    assert targets.concurrent_modes(result) == ["16 threads", "async 256"]
    assert targets.evaluate(result) == json.loads(FIXTURE.read_text())["targets"]


@pytest.mark.parametrize("extra", [[], ["--retarget"]])
def test_render_command_prints_the_report_without_raftlease(extra: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", NO_RAFTLEASE, str(BENCH), "--render", str(FIXTURE), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == GOLDEN.read_text()


def test_write_outputs_round_trips(
    result: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    markdown = report.write_outputs(result, tmp_path)
    assert markdown == GOLDEN.read_text()
    assert (tmp_path / "bench.md").read_text() == markdown
    assert report.load_result(tmp_path / "bench.json") == result
    assert capsys.readouterr().out == markdown + "\n"  # the run prints it too


def test_sections_follow_what_was_measured(result: dict[str, Any]) -> None:
    markdown = report.render_markdown(result)
    for heading in (
        "## Throughput and latency",
        "## Contended handoff",
        "## Failover (SIGKILL of the leader)",
        "## Memory",
        "## Snapshot stall",
        "## Node log alerts (WARNING and above)",
        "## Failures",
        "## Targets (issue 6)",
        "## Method",
    ):
        assert heading in markdown, heading
    assert "- **holder stale**: UnavailableError" in markdown
    assert "| 2 | n2 | 0.612 | - | 1 |" in markdown  # no new leader seen: "-"

    partial = copy.deepcopy(result)
    partial["workloads"] = {"acquire": {"error": "TimeoutError: no leader"}}
    partial["raw"] = {}
    partial["node_log_alerts"] = {}
    markdown = report.render_markdown(partial)
    assert "- **acquire**: TimeoutError: no leader" in markdown
    for heading in ("## Contended", "## Failover", "## Memory", "## Snapshot", "## Node log"):
        assert heading not in markdown, heading
    assert "| raw PySyncObj |" not in markdown


def test_targets_follow_the_data(result: dict[str, Any], tmp_path: Path) -> None:
    specs = targets.load_specs()
    assert [s["kind"] for s in specs][:2] == ["rate", "best_concurrent_rate"]
    first = targets.evaluate(result, specs=specs[:1])
    assert first == [result["targets"][0]] and first[0]["met"] is False
    # A lower bar in the data passes the same measurement.
    lowered = [{**specs[0], "name": "acquire, 1 client thread >= 100/s", "min_per_s": 100}]
    row = targets.evaluate(result, specs=lowered)[0]
    assert row["target"] == "acquire, 1 client thread >= 100/s" and row["met"] is True
    assert row["figure"] == first[0]["figure"]

    bad = tmp_path / "targets.toml"
    bad.write_text('[[target]]\nkind = "latency"\nname = "p99 < 1 ms"\n')
    with pytest.raises(ValueError, match="unknown kind 'latency'"):
        targets.load_specs(bad)
