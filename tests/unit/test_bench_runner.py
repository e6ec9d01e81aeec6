"""The benchmark's run under signals (scripts/benchlib/runner.py ``run``).

A SIGINT whose ``KeyboardInterrupt`` is raised inside a finalizer is printed as
"Exception ignored" and lost: the run goes on to its end, and must still exit
non-zero (130), not look like a clean run. Each case runs in a subprocess: ``run``
sets the process's SIGINT and SIGALRM handlers (pytest-timeout's alarm among them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import gc, os, signal, sys
from pathlib import Path
sys.path.insert(0, {scripts!r})
from benchlib import runner
from benchlib.context import QUICK

mode = {mode!r}

class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs here, in the finalizer's frame
            pass

def fake_run_all(ctx, code):
    if mode == "swallowed":
        Finalized()  # collected at once: the interrupt is lost in __del__
        gc.collect()
    elif mode == "plain":
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass

runner.run_all = fake_run_all
try:
    status = runner.run(QUICK, Path({out!r}), None, {{}}, [])
except KeyboardInterrupt:
    status = "raised"
print("status", status)
"""


def _run(mode: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = SCRIPT.format(scripts=str(ROOT / "scripts"), mode=mode, out=str(tmp_path))
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


@pytest.mark.timeout(60)
def test_an_interrupt_lost_in_a_finalizer_still_ends_with_130(tmp_path: Path) -> None:
    done = _run("swallowed", tmp_path)
    assert "Exception ignored" in done.stderr, done.stderr  # the loss really happened
    assert "status 130" in done.stdout, done.stdout + done.stderr
    assert "interrupted (SIGINT)" in done.stderr


@pytest.mark.timeout(60)
def test_an_interrupt_that_propagates_still_propagates(tmp_path: Path) -> None:
    done = _run("plain", tmp_path)
    assert "status raised" in done.stdout, done.stdout + done.stderr


@pytest.mark.timeout(60)
def test_a_run_without_a_signal_ends_with_0(tmp_path: Path) -> None:
    done = _run("none", tmp_path)
    assert "status 0" in done.stdout, done.stdout + done.stderr


@pytest.mark.timeout(30)
def test_a_failed_group_is_recorded_and_the_run_goes_on() -> None:
    """``context.isolated``: an exception is recorded under its group (what was measured
    before it kept) and ``on_failure`` runs; BenchTimeout and KeyboardInterrupt end the
    run."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from benchlib.context import BenchTimeout, isolated

    workloads: dict[str, dict[str, object]] = {"acquire": {"1 thread": 1}}
    saved: list[bool] = []

    def fail() -> None:
        raise RuntimeError("no leader")

    assert isolated(workloads, "x: ", "acquire", fail, lambda: saved.append(True)) is False
    assert workloads["acquire"] == {"1 thread": 1, "error": "RuntimeError: no leader"}
    assert saved == [True]
    assert isolated(workloads, "x: ", "renew", lambda: None) is True
    assert "renew" not in workloads
    for stop in (BenchTimeout("limit"), KeyboardInterrupt()):

        def end(exc: BaseException = stop) -> None:
            raise exc

        with pytest.raises(type(stop)):
            isolated(workloads, "x: ", "release", end)
    assert "release" not in workloads
