"""The alert rules shipped in cluster/prometheus/ (docs/operations.md, "Alerts") are
valid Prometheus rules, pass their unit tests (a single election pages nobody; a lost
majority, a lasting outage and INTERNAL answers do), and name only metrics a node
exports. promtool comes from Debian's prometheus package (scripts/test extracts it);
without it these tests skip, and fail under CI=true."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.fitness.test_docs_match_code import exported_families, exposed_names

pytestmark = pytest.mark.timeout(60)

RULES_DIR = Path(__file__).resolve().parent.parent.parent / "cluster" / "prometheus"
RULES = RULES_DIR / "raftlease-alerts.yml"
RULE_TESTS = RULES_DIR / "raftlease-alerts.test.yml"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing (scripts/test installs it as root with apt-get)")
        pytest.skip("promtool is not installed (scripts/test installs it as root)")
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=50
    )


def test_the_rules_are_valid() -> None:
    done = run("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_pass_their_unit_tests() -> None:
    done = run("test", "rules", RULE_TESTS.name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_unit_tests_catch_an_alert_that_pages_on_one_election(tmp_path: Path) -> None:
    """Self-check: the same tests fail for a rule without its ``for:`` (it would page on
    the seconds of an election)."""
    promtool()
    bad = RULES.read_text().replace("for: 30s", "for: 0s")
    assert bad != RULES.read_text()
    (tmp_path / RULES.name).write_text(bad)
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    done = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode != 0 and "RaftleaseNoLeader" in done.stdout + done.stderr


def test_the_rules_name_only_exported_metrics(tmp_path: Path) -> None:
    exposed = exposed_names(exported_families(tmp_path))
    rules = yaml.safe_load(RULES.read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    named = {name for expr in exprs for name in re.findall(r"\braftlease_[a-z0-9_]+", expr)}
    assert named and not named - exposed, sorted(named - exposed)
