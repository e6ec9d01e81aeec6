"""``raftlease top`` (cli/top.py), run as a real subprocess against a real cluster:
``--once`` frames, ``--json`` snapshots, hostile names escaped, read-only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from raftlease.models import Lease
from raftlease.testing import LocalCluster
from raftlease.testing.cluster import wait_for

pytestmark = pytest.mark.integration


def top(*args: str, endpoints: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "raftlease", "top", *args, "--endpoints", ",".join(endpoints)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(180)
def test_once_and_json_show_holders_waiters_sessions_queues(shared: LocalCluster) -> None:
    eps = shared.endpoints
    with shared.client() as c:
        first = c.acquire("top/gpu-0", owner="agent-a", ttl=60.0)
        granted: list[Lease] = []

        def waiter() -> None:
            with shared.client() as other:
                granted.append(other.acquire("top/gpu-0", owner="agent-b", ttl=60.0, wait=90.0))

        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        wait_for(lambda: c.waiters("top/gpu-0"), 30, "agent-b queued")
        pool = c.acquire("top/pool", owner="job-7", ttl=60.0, capacity=4, units=2)
        c.queue("top-jobs").put("frame-1")
        with c.session(owner="sess-7", ttl=30.0) as session:
            held = session.acquire("top/in-session")

            out = top("--once", "--prefix", "top/", "--queue", "top-jobs", endpoints=eps)
            assert out.returncode == 0, out.stderr
            frame = out.stdout
            assert "\x1b" not in frame  # --once to a pipe: no screen control
            line = next(x for x in frame.splitlines() if x.startswith("top/gpu-0"))
            assert "agent-a" in line and str(first.token) in line and "1. agent-b" in line
            pool_line = next(x for x in frame.splitlines() if x.startswith("top/pool"))
            assert "job-7" in pool_line and "2 [0,1]" in pool_line
            assert any(x.startswith("sess-7") for x in frame.splitlines())
            assert any(x.startswith("top-jobs") and " 1 " in x for x in frame.splitlines())
            assert sum(" leader " in x for x in frame.splitlines()) == 1
            # Each node's event-loop lag (ms), none overloaded on an idle cluster.
            assert any(x.rstrip().endswith("lag-ms") for x in frame.splitlines())
            nodes = [x for x in frame.splitlines() if " leader " in x or " follower " in x]
            assert len(nodes) == 3 and all(float(x.split()[-1]) >= 0 for x in nodes), nodes
            assert "OVERLOADED" not in frame
            for secret in (first.lease_id, held.lease_id, session.session_id, pool.lease_id):
                assert secret not in frame

            out = top("--json", "--prefix", "top/", "--queue", "top-jobs", endpoints=eps)
            assert out.returncode == 0, out.stderr
            snap = json.loads(out.stdout)
            assert snap["ok"] and len(snap["nodes"]) == 3
            keys = {k["key"]: k for k in snap["keys"]}
            assert keys["top/gpu-0"]["holders"][0]["token"] == first.token
            assert 0 < keys["top/gpu-0"]["holders"][0]["remaining"] <= 60.0
            assert [w["owner"] for w in keys["top/gpu-0"]["waiters"]] == ["agent-b"]
            assert keys["top/pool"]["holders"][0]["unit_indices"] == [0, 1]
            assert any(s["owner"] == "sess-7" for s in snap["sessions"])
            assert snap["queues"][0]["queue"] == "top-jobs" and snap["queues"][0]["ready"] == 1
            for secret in (first.lease_id, held.lease_id, session.session_id):
                assert secret not in out.stdout
        c.release(first)
        thread.join(timeout=60)
        assert granted
        # Read-only: what top showed is untouched (agent-b got the key by the release).
        holder = c.holder("top/gpu-0")
        assert holder is not None and holder.token == granted[0].token
        c.release(granted[0])
        c.release(pool)


@pytest.mark.timeout(120)
def test_hostile_names_are_escaped(shared: LocalCluster) -> None:
    hostile = "top/\x1b[2J\x1b]0;pwned\x07\u202eevil"
    with shared.client() as c:
        lease = c.acquire(hostile, owner="o\x1b[31mred", ttl=30.0)
        out = top("--once", "--prefix", "top/\x1b", endpoints=shared.endpoints)
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout and "\u202e" not in out.stdout and "\x07" not in out.stdout
        assert "top/\\x1b[2J\\x1b]0;pwned\\x07\\u202eevil" in out.stdout
        assert "o\\x1b[31mred" in out.stdout
        c.release(lease)


@pytest.mark.timeout(120)
def test_refreshing_view_redraws_and_quits_on_interrupt(shared: LocalCluster) -> None:
    """Without --once the view redraws every --interval (frames separated on a pipe,
    no screen control) until Ctrl-C, which exits 0."""
    cmd = [sys.executable, "-m", "raftlease", "top", "--interval", "0.3", "--prefix", "top/r"]
    cmd += ["--endpoints", ",".join(shared.endpoints)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        seen = 0
        deadline = time.monotonic() + 60
        while seen < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            seen += line.startswith("raftlease top")
        assert seen >= 2, "two frames"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.timeout(60)
def test_unreachable_cluster_fails_definitely() -> None:
    out = top("--once", "--timeout", "2", endpoints=["127.0.0.1:1"])
    assert out.returncode in (1, 3)
    assert "error" in out.stderr
