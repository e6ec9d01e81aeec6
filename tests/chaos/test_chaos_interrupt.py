"""The chaos harness stopped by a signal leaves no node running (jepsen-style/run.py).

A run stopped with SIGTERM (a CI job's timeout, ``kill PID``) or Ctrl-C used to leave
its node processes behind: SIGTERM ended the harness without its cleanup, and a Ctrl-C
went on into the final reads, where a second one cut the cleanup short. Now either
signal heals the faults, stops the clients and every node, and exits 130 without
judging the partial history.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[2] / "jepsen-style" / "run.py"


def _processes_under(directory: Path) -> dict[int, str]:
    """Live processes whose command line names ``directory`` (the run's nodes do:
    their config and data directory are under ``--out``), pid -> command line."""
    found: dict[int, str] = {}
    needle = str(directory)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if needle in cmdline and state != "Z":
            found[int(entry.name)] = cmdline
    return found


def _wait(what: str, cond: Callable[[], bool], deadline: float) -> None:
    end = time.monotonic() + deadline
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_every_node_of_the_run(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "run"
    log = tmp_path / "harness.log"
    with open(log, "w") as sink:
        harness = subprocess.Popen(
            [
                *(sys.executable, str(RUN), "--profile", "smoke", "--seed", "1"),
                *("--nodes", "3", "--clients", "2", "--out", str(out)),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            # As a background job inherits it: the harness sets its own handlers.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    nodes: dict[int, str] = {}
    try:
        # Faults are under way once the warm-up is done: stop it in the middle.
        _wait(
            "the run's warm-up",
            lambda: "warm-up done" in log.read_text() or harness.poll() is not None,
            150,
        )
        assert harness.poll() is None, log.read_text()[-4000:]
        nodes = {
            pid: cmd
            for pid, cmd in _processes_under(out).items()
            if pid != harness.pid and "raftlease" in cmd
        }
        assert len(nodes) >= 3, (nodes, log.read_text()[-2000:])
        harness.send_signal(sig)
        code = harness.wait(timeout=120)
        output = log.read_text()
        assert code == 130, output[-4000:]
        assert "interrupted" in output, output[-4000:]
        left = {pid for pid in nodes if pid in _processes_under(out)}
        assert not left, (left, output[-4000:])
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait(timeout=30)
        # Whatever this test started and is still running (only on a failure).
        for pid in _processes_under(out):
            if pid in nodes:
                os.kill(pid, signal.SIGKILL)
