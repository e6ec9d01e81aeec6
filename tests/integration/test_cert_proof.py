"""The resource-side chaos checker of issue 39, short (scripts/cert_proof; the
10-minute run's figures are in docs/certificates.md, "Under faults"): a resource cut
off from the cluster accepts no write from a non-holder and none after a
certificate's ``not_after``, the key's audit trail holds every grant the agents got
(the same on every node), and the planted resource that skips the proof of possession
is caught, and so is the node build whose leader certifies under its drift alarm. The
short run's first fault is always a leader isolation through the fault proxy. Serial
(tests/conftest.py SERIAL_FILES): it times writes against certificate windows and runs a
fault loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cert_proof"


def run(*args: str) -> tuple[int, dict[str, object]]:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", *args],
        capture_output=True,
        text=True,
        timeout=100,
        env=os.environ.copy(),  # the port slice of this worker (PYTEST_XDIST_*)
    )
    assert out.stdout.strip(), out.stderr[-2000:]
    return out.returncode, json.loads(out.stdout.strip().splitlines()[-1])


def test_the_honest_resource_accepts_only_holders_inside_their_window() -> None:
    code, figures = run("--seconds", "5")
    assert figures["thief_attempts"] and figures["late_attempts"], figures
    assert figures["thief_accepted"] == 0 and figures["late_accepted"] == 0, figures
    assert figures["token_regressions"] == 0 and figures["holder_refused"] == 0, figures
    # The audit trail of the key holds every grant the agents were answered, the same
    # on every node (docs/audit.md).
    assert figures["audit_missing"] == 0 and figures["audit_nodes_agree"] is True, figures
    assert figures["audit_grants"] >= figures["grants"], figures
    # The run's one fault: the leader cut off from the other two, then healed.
    assert figures["fault_kinds"] == {"isolate-leader": 1}, figures
    assert code == 0, figures


def test_a_resource_that_skips_the_proof_of_possession_is_caught() -> None:
    code, figures = run("--seconds", "3", "--planted-bug", "skip_proof")
    assert code == 1 and figures["thief_accepted"], figures


def test_a_leader_that_certifies_under_its_drift_alarm_is_caught() -> None:
    """The planted node build ``ignore_drift_alarm``: its leader, clock slowed beyond
    the drift bound, raises the alarm but keeps its leader lease, so it still signs
    certificates; the probe acquire under the alarm comes back with one."""
    code, figures = run(
        "--seconds", "4", "--faults", "clock-beyond", "--node-bug", "ignore_drift_alarm"
    )
    assert figures["alarm_probes"] and figures["alarm_certified"], figures
    assert code == 1, figures
