"""Schemathesis with ``--checks all`` over the HTTP API's OpenAPI document, on one node
(issue 44): no server error, no status or content type the document does not name, no
schema-valid request refused, no schema-invalid one accepted. Small and deterministic
(schemathesis's deterministic generation, a few examples per operation, no example
database): the same requests on every run. docs/http-api.md ("Checked with
schemathesis") records the larger run it stands for; tests/integration/schemathesis.toml
and schemathesis_hooks.py say what is configured and why."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from raftlease.server.http.openapi import all_routes
from tests.integration.test_admin_http import admin_cluster, admin_of

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("schemathesis.toml")


def schemathesis_run(
    url: str, cwd: Path, *extra: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One bounded run of the schemathesis CLI (its own process: it owns its event
    loop and threads) in ``cwd`` (its cache goes there, not into the work tree); the
    hooks module is imported from the repository root. Returns the run and its NDJSON
    report."""
    report = cwd / "report.ndjson"
    command = [
        sys.executable,
        "-c",
        "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())",
        "--config-file",
        str(CONFIG),
        "run",
        url,
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing",
        "--max-examples",
        "3",
        "--generation-deterministic",  # the same examples every run, no database
        "--workers",
        "1",
        "--request-timeout",
        "10",
        "--no-color",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(report),
        *extra,
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=100, check=False
    )
    return run, report


def failures(report: Path) -> list[str]:
    """Each failed check of the run: operation, check, status and what was sent."""
    found = []
    for line in report.read_text().splitlines():
        event = json.loads(line)
        finished = event.get("ScenarioFinished")
        if not finished:
            continue
        recorder = finished["recorder"]
        for case_id, checks in recorder.get("checks", {}).items():
            for check in checks:
                if check["status"] == "success":
                    continue
                case = recorder.get("cases", {}).get(case_id, {}).get("value", {})
                answer = (recorder.get("interactions", {}).get(case_id) or {}).get("response")
                found.append(
                    f"{recorder.get('label')}: {check['name']} ({check['status']}), "
                    f"status {(answer or {}).get('status_code')}, "
                    f"query {case.get('query')}, body {case.get('body')!r:.300}"
                )
    return found


@pytest.mark.timeout(150)
def test_schemathesis_finds_nothing(tmp_path: Path) -> None:
    # One node, no fsync: the HTTP contract is under test, not durability. About
    # 1,600 requests, a fifth of them log writes of some 50 ms each: ~30 s in all.
    cluster = admin_cluster(1, durability="none")
    cluster.start()
    try:
        api = admin_of(cluster, "n1")
        run, report = schemathesis_run(f"http://{api}/openapi.json", tmp_path)
        found = failures(report) if report.exists() else []
        tail = "\n".join(run.stdout.splitlines()[-40:])
        assert run.returncode == 0 and not found, (
            f"schemathesis exited {run.returncode}:\n"
            + "\n".join(found)
            + f"\n{tail}\n{run.stderr[-2000:]}"
        )
        print(tail)  # with pytest -s: schemathesis's summary and the run's time
        # It tested every operation of the document (a run that tested nothing passes).
        tested = re.search(r"Tested: (\d+)", run.stdout)
        assert tested is not None and int(tested.group(1)) == len(all_routes()), tail
    finally:
        cluster.close()
