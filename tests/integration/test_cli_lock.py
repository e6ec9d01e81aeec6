"""``raftlease lock`` and ``raftlease elect`` (issue 13), run as real subprocesses
against real node processes: the command sees its lease, its exit status comes back,
a key held past ``--wait`` gives the "not acquired" code, and a lease lost while the
command runs (revoked, or the majority of nodes killed) stops it with SIGTERM then
SIGKILL and gives the "lease lost" code. Timing is asserted loosely (2 shared cores)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from raftlease import Client
from raftlease.cli.lock import EXIT_CANNOT_RUN, EXIT_LEASE_LOST, EXIT_NOT_ACQUIRED, EXIT_NOT_FOUND
from raftlease.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: Prints the lease environment as JSON, then exits with status 7.
SHOW_ENV = (
    "import json, os; print(json.dumps({k: os.environ.get(k) for k in "
    "('RAFTLEASE_KEY', 'RAFTLEASE_TOKEN', 'RAFTLEASE_LEASE_ID', 'RAFTLEASE_AUTH_TOKEN')})); "
    "raise SystemExit(7)"
)

#: Ignores SIGTERM (and records that it came), writes its pid, then works forever.
STUBBORN = textwrap.dedent(
    """
    import os, signal, sys, time
    out = sys.argv[1]
    def note(signum, frame):
        with open(out + ".term", "w") as f:
            f.write(str(time.monotonic()))
    signal.signal(signal.SIGTERM, note)
    with open(out + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(out + ".tmp", out)
    while True:
        time.sleep(0.05)
    """
)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "raftlease", *args]


def run(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli(*args), capture_output=True, text=True, timeout=timeout)


def eps(cluster: LocalCluster) -> str:
    return ",".join(cluster.endpoints)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): look at its state.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_lock_runs_the_command_with_its_lease_and_returns_its_status(
    shared: LocalCluster,
) -> None:
    out = run(
        "lock",
        "cli-lock/env",
        "--ttl",
        "5s",
        "--endpoints",
        eps(shared),
        "--",
        sys.executable,
        "-c",
        SHOW_ENV,
    )
    assert out.returncode == 7, out.stderr
    env = json.loads(out.stdout)
    assert env["RAFTLEASE_KEY"] == "cli-lock/env"
    assert int(env["RAFTLEASE_TOKEN"]) > 0
    assert len(env["RAFTLEASE_LEASE_ID"]) == 32
    assert env["RAFTLEASE_AUTH_TOKEN"] == ""  # no bearer token here; the CLI inside uses none
    with Client(shared.endpoints) as c:
        assert c.holder("cli-lock/env") is None  # released on exit, not left to expire
        # The token in the environment was the fencing token of the lease it held.
        later = c.acquire("cli-lock/env", owner="after", ttl=5)
        assert later.token > int(env["RAFTLEASE_TOKEN"])
        c.release(later)


def test_exit_status_of_a_signalled_command_is_128_plus_the_signal(shared: LocalCluster) -> None:
    out = run("lock", "cli-lock/sig", "--endpoints", eps(shared), "--", "sh", "-c", "kill -TERM $$")
    assert out.returncode == 128 + signal.SIGTERM, out.stderr


def test_a_command_that_cannot_start_has_its_own_codes_and_releases(
    shared: LocalCluster, tmp_path: Path
) -> None:
    missing = run("lock", "cli-lock/start", "--endpoints", eps(shared), "--", "no-such-command-xyz")
    assert missing.returncode == EXIT_NOT_FOUND
    assert "not found" in missing.stderr
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    denied = run("lock", "cli-lock/start", "--endpoints", eps(shared), "--", str(script))
    assert denied.returncode == EXIT_CANNOT_RUN, denied.stderr
    with Client(shared.endpoints) as c:
        assert c.holder("cli-lock/start") is None


def test_not_acquired_within_wait_exits_with_its_code_and_leaves_no_waiter(
    shared: LocalCluster,
) -> None:
    key = "cli-lock/busy"
    with Client(shared.endpoints) as c:
        held = c.acquire(key, owner="holder", ttl=60)
        try:
            start = time.monotonic()
            out = run("lock", key, "--wait", "1s", "--endpoints", eps(shared), "--", "true")
            took = time.monotonic() - start
            assert out.returncode == EXIT_NOT_ACQUIRED, out.stderr
            assert "not acquired" in out.stderr
            assert took >= 0.9  # it did wait
            now = run("lock", key, "--wait", "0", "--endpoints", eps(shared), "--", "true")
            assert now.returncode == EXIT_NOT_ACQUIRED
            assert c.waiters(key) == []  # the queued acquire was withdrawn
            assert c.holder(key) is not None and c.holder(key).owner == "holder"  # type: ignore[union-attr]
        finally:
            c.release(held)


def start_stubborn_lock(
    cluster: LocalCluster, key: str, tmp_path: Path, *extra: str
) -> tuple[subprocess.Popen[str], Path, int]:
    """``raftlease lock`` running a child that ignores SIGTERM; returns the lock
    process, the child's marker path and the child's pid once it runs."""
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    marker = tmp_path / "child.pid"
    proc = subprocess.Popen(
        cli(
            "lock",
            key,
            "--endpoints",
            eps(cluster),
            *extra,
            "--",
            sys.executable,
            str(script),
            str(marker),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pid = wait_for(lambda: marker.exists() and int(marker.read_text()), 60, "the child to start")
    return proc, marker, pid


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"raftlease lock did not exit: {err}") from None
    return proc.returncode, err


def test_revoked_lease_stops_the_command_term_then_kill_and_exits_lease_lost(
    shared: LocalCluster, tmp_path: Path
) -> None:
    key = "cli-lock/revoked"
    proc, marker, child = start_stubborn_lock(shared, key, tmp_path, "--ttl", "3s", "--grace", "1s")
    with Client(shared.endpoints) as c:
        token = int(wait_for(lambda: c.holder(key), 30, "the lock to hold the key").token)
        assert c.revoke(key) == [token]
        code, err = finish(proc)
        assert code == EXIT_LEASE_LOST, err
        assert "lost" in err
        term = Path(str(marker) + ".term")
        assert term.exists(), "the child never got SIGTERM"
        wait_for(
            lambda: not pid_alive(child), 30, "the child to be killed"
        )  # SIGKILL: it ignored TERM
        assert c.holder(key) is None
        # The key is free for the next holder, with a higher token.
        nxt = c.acquire(key, owner="next", ttl=5)
        assert nxt.token > token
        c.release(nxt)


def test_majority_lost_stops_the_command_before_the_lease_can_lapse(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    key = "cli-lock/majority"
    proc, marker, child = start_stubborn_lock(
        cluster, key, tmp_path, "--ttl", "4s", "--grace", "1s"
    )
    with Client(cluster.endpoints) as c:
        wait_for(lambda: c.holder(key), 30, "the lock to hold the key")
    leader = cluster.wait_for_leader()["node"]
    followers = [n.id for n in cluster.nodes if n.id != leader]
    cluster.kill_node(leader)
    cluster.kill_node(followers[0])
    code, err = finish(proc)
    assert code == EXIT_LEASE_LOST, err
    assert Path(str(marker) + ".term").exists()
    wait_for(lambda: not pid_alive(child), 30, "the child to be killed")


def test_sigterm_to_lock_is_forwarded_and_the_lease_released(
    shared: LocalCluster, tmp_path: Path
) -> None:
    key = "cli-lock/forward"
    marker = tmp_path / "ready"
    # Exits 0 on SIGTERM, after saying so.
    child = (
        "import signal, sys, time, pathlib\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(0)))\n"
        f"pathlib.Path({str(marker)!r}).write_text('x')\n"
        "while True: time.sleep(0.05)\n"
    )
    proc = subprocess.Popen(
        cli(
            "lock",
            key,
            "--ttl",
            "30s",
            "--endpoints",
            eps(shared),
            "--",
            sys.executable,
            "-c",
            child,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(marker.exists, 60, "the child to start")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "got TERM" in out
    with Client(shared.endpoints) as c:
        assert c.holder(key) is None  # released at once (the TTL is 30 s)


def test_a_signal_while_waiting_withdraws_the_queued_acquire(shared: LocalCluster) -> None:
    key = "cli-lock/interrupted"
    with Client(shared.endpoints) as c:
        held = c.acquire(key, owner="holder", ttl=60)
        try:
            proc = subprocess.Popen(
                cli(
                    "lock",
                    key,
                    "--wait",
                    "60s",
                    "--owner",
                    "patient",
                    "--endpoints",
                    eps(shared),
                    "--",
                    "true",
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            wait_for(lambda: [w.owner for w in c.waiters(key)] == ["patient"], 30, "the waiter")
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
            assert proc.returncode == 128 + signal.SIGINT
            assert c.waiters(key) == []
        finally:
            c.release(held)
        assert c.holder(key) is None  # nobody was granted after the holder left


def test_elect_runs_the_command_while_leading_and_resigns(shared: LocalCluster) -> None:
    name = "cli-elect/leader"
    out = run(
        "elect",
        name,
        "--ttl",
        "3s",
        "--owner",
        "candidate-1",
        "--endpoints",
        eps(shared),
        "--",
        sys.executable,
        "-c",
        SHOW_ENV,
    )
    assert out.returncode == 7, out.stderr
    env = json.loads(out.stdout)
    assert env["RAFTLEASE_KEY"] == name and int(env["RAFTLEASE_TOKEN"]) > 0
    with Client(shared.endpoints) as c:
        assert c.election(name).leader() is None  # resigned: the session was closed


def test_elect_exits_lease_lost_when_the_lead_is_revoked(
    shared: LocalCluster, tmp_path: Path
) -> None:
    name = "cli-elect/revoked"
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    marker = tmp_path / "child.pid"
    proc = subprocess.Popen(
        cli(
            "elect",
            name,
            "--ttl",
            "3s",
            "--grace",
            "1s",
            "--endpoints",
            eps(shared),
            "--",
            sys.executable,
            str(script),
            str(marker),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child = wait_for(lambda: marker.exists() and int(marker.read_text()), 60, "the child")
    with Client(shared.endpoints) as c:
        leader: Any = wait_for(lambda: c.election(name).leader(), 30, "a leader")
        assert c.revoke(name) == [leader.token]
    code, err = finish(proc)
    assert code == EXIT_LEASE_LOST, err
    wait_for(lambda: not pid_alive(child), 30, "the child to be killed")


@pytest.mark.timeout(60)
def test_the_sigkill_of_a_lost_lease_comes_no_later_than_its_validity(tmp_path: Path) -> None:
    """A renewal that hangs fails only at its timeout (ttl/3), when less than
    ``--grace`` of validity may be left; the SIGKILL must land by the end of that
    validity, not ``grace`` after the SIGTERM, when the cluster may already have
    granted the key to another. A command that ignores SIGTERM (allowed: SIGKILL
    follows) is killed within the 0.5 s left, not after the 30 s grace."""
    from raftlease.cli.common import SignalBox
    from raftlease.cli.lock import Supervisor

    ready = tmp_path / "ignoring"
    ignore_term = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(ready)!r}, 'w').close(); time.sleep(60)"
    )
    supervisor = Supervisor((sys.executable, "-c", ignore_term), dict(os.environ), grace=30.0)
    assert supervisor.start() is None
    # Only once it ignores SIGTERM: on a loaded machine the SIGTERM could otherwise
    # reach the interpreter still starting up and end it (status 143 in CI).
    wait_for(ready.exists, 30, "the command to ignore SIGTERM")
    started = time.monotonic()
    box = SignalBox()
    status = supervisor.run(lambda: "renewals fail", box, lambda: 0.5)
    assert status == 128 + signal.SIGKILL
    assert time.monotonic() - started < 15, "killed at the grace, after the validity"
