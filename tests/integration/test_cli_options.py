"""The command line's shared behaviour (raftlease/cli/common.py, docs/cli.md): client
options before or after the subcommand, ``-o/--output text|json``, the ``RAFTLEASE_*``
variables, the import arrows inside the cli/ package, and the one signal policy of the
long-running commands (SIGINT and SIGTERM stop them even when SIGINT was inherited
ignored, as a shell's background job inherits it).

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_cli_options.py.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from raftlease.testing import LocalCluster, free_port_block, wait_for
from tests.unit.test_cli_options import run_cli

pytestmark = pytest.mark.timeout(120)


@pytest.mark.integration
def test_json_output_of_the_lease_queue_and_member_commands(shared: LocalCluster) -> None:
    eps = ",".join(shared.endpoints)
    key = "cli-options/job"
    acquired = run_cli(
        "--endpoints", eps, "-o", "json", "acquire", key, "--owner", "a", "--ttl", "30"
    )
    assert acquired.returncode == 0, acquired.stderr
    lease = json.loads(acquired.stdout)
    assert lease["ok"] and lease["key"] == key and lease["owner"] == "a" and lease["token"] > 0

    # RAFTLEASE_ENDPOINTS is where the command goes when no --endpoints is given.
    env = {"RAFTLEASE_ENDPOINTS": eps}
    held = json.loads(run_cli("holder", key, "-o", "json", env=env).stdout)
    assert (
        held["ok"] and held["holder"]["owner"] == "a" and held["holder"]["token"] == lease["token"]
    )
    # ... and RAFTLEASE_OUTPUT chooses JSON for every command.
    renewed = run_cli("renew", key, lease["lease_id"], env={**env, "RAFTLEASE_OUTPUT": "json"})
    assert renewed.returncode == 0, renewed.stderr
    body = json.loads(renewed.stdout)
    assert (body["ok"], body["key"], body["ttl"]) == (True, key, 30.0) and body["valid_for"] > 0
    status = json.loads(run_cli("-o", "json", "status", env=env).stdout)
    assert status["ok"] and len(status["nodes"]) == 3
    members = json.loads(run_cli("member", "list", "--output", "json", env=env).stdout)
    assert [m["id"] for m in members["members"]] == ["n1", "n2", "n3"]

    put = json.loads(
        run_cli("-o", "json", "queue", "put", "cli-options-q", '{"n": 1}', env=env).stdout
    )
    assert put["ok"] and put["queue"] == "cli-options-q"
    claim = run_cli("-o", "json", "queue", "claim", "cli-options-q", "--worker", "w", env=env)
    task = json.loads(claim.stdout)
    assert task["claimed"] and task["task_id"] == put["task_id"] and task["payload"] == {"n": 1}
    # --after: the child waits for its parent (nothing to claim until it completed).
    child = json.loads(
        run_cli(
            "-o", "json", "queue", "put", "cli-options-q", '{"n": 2}', "--after",
            put["task_id"], env=env,
        ).stdout
    )  # fmt: skip
    early = run_cli("-o", "json", "queue", "claim", "cli-options-q", "--worker", "w", env=env)
    assert not json.loads(early.stdout)["claimed"], early.stdout
    attempt = {**env, "RAFTLEASE_ATTEMPT_ID": task["attempt_id"]}
    done = run_cli("queue", "complete", "cli-options-q", task["task_id"], "-o", "json", env=attempt)
    assert json.loads(done.stdout) == {
        "ok": True,
        "queue": "cli-options-q",
        "task_id": put["task_id"],
    }
    late = run_cli(
        "-o", "json", "queue", "claim", "cli-options-q", "--worker", "w", "--wait", "10", env=env
    )
    assert json.loads(late.stdout)["task_id"] == child["task_id"], late.stdout

    released = run_cli("-o", "json", "release", key, lease["lease_id"], env=env)
    assert json.loads(released.stdout) == {"ok": True, "key": key}
    # text stays what it was.
    assert run_cli("holder", key, env=env).stdout.strip() == f"{key}: free"


@pytest.mark.integration
def test_queue_heartbeat_saves_a_checkpoint_the_next_claim_hands_back(
    shared: LocalCluster, tmp_path: Path
) -> None:
    """Issue 41: ``queue heartbeat --checkpoint FILE`` (at most 8 KiB: a larger file is a
    usage error, nothing sent) keeps the work's state; after the attempt fails, the
    next ``claim`` shows it (JSON ``checkpoint``, base64) and writes it to
    ``--checkpoint-out``."""
    env = {"RAFTLEASE_ENDPOINTS": ",".join(shared.endpoints)}
    name = "cli-checkpoint-q"
    put = json.loads(run_cli("-o", "json", "queue", "put", name, "{}", env=env).stdout)
    task = json.loads(
        run_cli("-o", "json", "queue", "claim", name, "--worker", "w", env=env).stdout
    )
    attempt = {**env, "RAFTLEASE_ATTEMPT_ID": task["attempt_id"]}
    state = tmp_path / "state.bin"
    state.write_bytes(b"page 6 of 10\x00\xff")
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (8 * 1024 + 1))
    refused = run_cli("queue", "heartbeat", name, put["task_id"], "--checkpoint", str(big),
                      env=attempt)  # fmt: skip
    assert refused.returncode == 2 and "at most 8192 bytes" in refused.stderr, refused.stderr
    beat = run_cli("-o", "json", "queue", "heartbeat", name, put["task_id"], "--progress", "0.6",
                   "--checkpoint", str(state), env=attempt)  # fmt: skip
    assert beat.returncode == 0, beat.stderr
    assert json.loads(beat.stdout)["checkpoint_bytes"] == 14
    failed = run_cli("queue", "fail", name, put["task_id"], "--retry-after", "0", env=attempt)
    assert failed.returncode == 0, failed.stderr
    out = tmp_path / "resumed.bin"
    again = json.loads(
        run_cli("-o", "json", "queue", "claim", name, "--worker", "w2", "--wait", "10",
                "--checkpoint-out", str(out), env=env).stdout
    )  # fmt: skip
    assert again["task_id"] == put["task_id"] and again["attempt"] == 2
    assert again["checkpoint_attempt"] == 1
    assert base64.b64decode(again["checkpoint"]) == out.read_bytes() == state.read_bytes()


# ------------------------------------------------------------- signals


def _ignore_sigint() -> None:
    """In the child before exec: SIGINT ignored, as a shell starts a background job."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Lines:
    """A child's stdout lines, read on a daemon thread, waited for with deadlines."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None
        stream = proc.stdout

        def pump() -> None:
            for line in stream:
                self._queue.put(line)
            self._queue.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def wait_for(self, pattern: str, timeout: float, count: int = 1) -> str:
        """The text read so far once ``pattern`` has appeared ``count`` times; raises
        AssertionError at the deadline or at the end of the output."""
        deadline = time.monotonic() + timeout
        while sum(bool(re.search(pattern, line)) for line in self.seen) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"{pattern!r} not seen within {timeout} s:\n{''.join(self.seen)}"
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, f"output ended before {pattern!r}:\n{''.join(self.seen)}"
            self.seen.append(line)
        return "".join(self.seen)

    def rest(self, timeout: float) -> str:
        """Everything up to the end of the output (within ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
        return "".join(self.seen)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_for_good(proc: subprocess.Popen[str], pids: list[int]) -> None:
    """On the way out of a test, even a failed one: no process of it left running."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_up_with_sigint_inherited_ignored_stops_every_node(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """``raftlease up &`` in a script: SIGINT arrives ignored; SIGINT (and SIGTERM)
    must still stop every node, exit 0, and leave no node process behind."""
    port = free_port_block(3)
    cmd = [sys.executable, "-m", "raftlease", "up", "--port", str(port), "--no-admin"]
    cmd += ["--data-dir", str(tmp_path / "up")]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_ignore_sigint,
    )
    pids: list[int] = []
    try:
        lines = Lines(proc)
        text = lines.wait_for("press Ctrl-C", 90)
        pids = [int(p) for p in re.findall(r"pid (\d+)", text)]
        assert len(pids) == 3, text
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0, lines.rest(5)
        assert "all nodes stopped" in lines.rest(10)
        wait_for(lambda: not any(map(_alive, pids)), 10, "every node process to exit")
    finally:
        _stop_for_good(proc, pids)


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_top_and_watch_with_sigint_inherited_ignored_stop_with_0(
    shared: LocalCluster, sig: signal.Signals
) -> None:
    eps = ",".join(shared.endpoints)
    prefix = f"cli-options/{sig.name}/"

    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "raftlease", "--endpoints", eps, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_ignore_sigint,
        )

    top = start("top", "--interval", "0.3", "--prefix", prefix)
    try:
        lines = Lines(top)
        lines.wait_for("^raftlease top", 60, count=2)  # refreshing
        top.send_signal(sig)
        assert top.wait(timeout=30) == 0, lines.rest(5)
    finally:
        _stop_for_good(top, [])

    watch = start("watch", prefix, "-o", "json")
    try:
        lines = Lines(watch)
        with shared.client() as c:
            # The watch starts at the revision it finds: acquire until it reports one.
            def seen() -> bool:
                c.release(c.acquire(prefix + "k", owner="w", ttl=10))
                with contextlib.suppress(AssertionError):
                    lines.wait_for('"grant"', 0.5)
                    return True
                return False

            wait_for(seen, 60, "the watch to report a grant")
        assert json.loads(lines.seen[0])["key"] == prefix + "k"
        watch.send_signal(sig)
        assert watch.wait(timeout=30) == 0, lines.rest(5)
    finally:
        _stop_for_good(watch, [])
