"""The command line, run as a real subprocess against a real cluster."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from raftlease.testing import LocalCluster, free_port_block, wait_for
from raftlease.testing.certs import ClusterCerts
from tests.process_support import DIES_WITH_PYTEST
from tests.unit.test_client_errors import wait_without_quorum

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def run_cli(*args: str, endpoints: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "raftlease", *args]
    if endpoints is not None:
        cmd += ["--endpoints", ",".join(endpoints)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_lease_commands_json_and_human(shared: LocalCluster) -> None:
    eps = shared.endpoints
    out = run_cli(
        "acquire", "cli/job-1", "--owner", "agent-a", "--ttl", "30", "--json", endpoints=eps
    )
    assert out.returncode == 0, out.stderr
    lease = json.loads(out.stdout)
    assert lease["ok"] and lease["owner"] == "agent-a" and lease["token"] > 0
    assert len(lease["lease_id"]) == 32

    held = run_cli(
        "acquire", "cli/job-1", "--owner", "agent-b", "--ttl", "30", "--json", endpoints=eps
    )
    assert held.returncode == 1
    err = json.loads(held.stdout)
    assert err["code"] == "LEASE_HELD" and err["definite"] is True
    assert err["detail"]["owner"] == "agent-a"

    human = run_cli("holder", "cli/job-1", endpoints=eps)
    assert human.returncode == 0 and "held by agent-a" in human.stdout
    stale = run_cli("holder", "cli/job-1", "--consistency", "stale", "--json", endpoints=eps)
    stale_read = json.loads(stale.stdout)
    assert stale_read["consistency"] == "stale" and stale_read["applied_index"] > 0
    assert stale_read["holder"]["owner"] == "agent-a"
    logged = run_cli("holder", "cli/job-1", "--consistency", "log", "--json", endpoints=eps)
    assert json.loads(logged.stdout)["consistency"] == "log"

    renewed = run_cli(
        "renew", "cli/job-1", lease["lease_id"], "--ttl", "40", "--json", endpoints=eps
    )
    assert renewed.returncode == 0 and json.loads(renewed.stdout)["ttl"] == 40.0

    stranger = run_cli("release", "cli/job-1", "f" * 32, endpoints=eps)
    assert stranger.returncode == 1 and "NOT_OWNER" in stranger.stderr

    listed = run_cli("leases", "--prefix", "cli/", "--json", endpoints=eps)
    assert [item["key"] for item in json.loads(listed.stdout)["leases"]] == ["cli/job-1"]

    released = run_cli("release", "cli/job-1", lease["lease_id"], endpoints=eps)
    assert released.returncode == 0 and "released cli/job-1" in released.stdout
    free = run_cli("holder", "cli/job-1", "--json", endpoints=eps)
    assert json.loads(free.stdout)["holder"] is None

    bad = run_cli("acquire", "cli/x", "--owner", "a", "--ttl", "-1", "--json", endpoints=eps)
    assert bad.returncode == 1 and json.loads(bad.stdout)["code"] == "INVALID_ARGUMENT"


def test_shared_key_from_the_command_line(shared: LocalCluster) -> None:
    eps = shared.endpoints
    args = ["--ttl", "30", "--capacity", "3", "--json"]
    first = run_cli("acquire", "cli/pool", "--owner", "a", "--units", "2", *args, endpoints=eps)
    assert first.returncode == 0, first.stderr
    second = run_cli("acquire", "cli/pool", "--owner", "b", *args, endpoints=eps)
    assert second.returncode == 0, second.stderr
    full = run_cli("acquire", "cli/pool", "--owner", "c", *args, endpoints=eps)
    assert json.loads(full.stdout)["code"] == "LEASE_HELD"
    mismatch = run_cli(
        "acquire", "cli/pool", "--owner", "c", "--ttl", "30", "--json", endpoints=eps
    )
    assert json.loads(mismatch.stdout)["code"] == "CAPACITY_MISMATCH"
    read = json.loads(run_cli("holder", "cli/pool", "--json", endpoints=eps).stdout)
    assert (read["capacity"], read["used"]) == (3, 3)
    assert sorted((h["owner"], h["units"]) for h in read["holders"]) == [("a", 2), ("b", 1)]
    human = run_cli("holder", "cli/pool", endpoints=eps).stdout
    assert "3 of 3 units held" in human and "a: 2 unit(s)" in human
    for lease in (first, second):
        lid = json.loads(lease.stdout)["lease_id"]
        assert run_cli("release", "cli/pool", lid, endpoints=eps).returncode == 0


def test_unknown_outcome_exits_3(cluster: LocalCluster) -> None:
    """A paused leader takes the request and never answers: TIMEOUT, outcome unknown,
    exit status 3 (the docstring of raftlease.cli), in JSON and for people."""
    leader = cluster.leader_id()
    eps = [cluster.node(leader).client]
    cluster.pause_node(leader)
    try:
        args = ["acquire", "cli/paused", "--owner", "a", "--ttl", "5", "--timeout", "2"]
        out = run_cli(*args, "--json", endpoints=eps)
        assert out.returncode == 3, out.stdout + out.stderr
        err = json.loads(out.stdout)
        assert (err["ok"], err["code"], err["definite"]) == (False, "TIMEOUT", False)
        human = run_cli(*args, endpoints=eps)
        assert human.returncode == 3 and "outcome unknown" in human.stderr, human.stderr
    finally:
        cluster.resume_node(leader)


def test_no_quorum_is_a_definite_failure_exit_1(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    """No leader anywhere: UNAVAILABLE, definite (nothing was proposed), exit 1."""
    cluster = cluster_factory()
    wait_without_quorum(cluster)
    out = run_cli(
        "acquire",
        "cli/noquorum",
        "--owner",
        "a",
        "--ttl",
        "5",
        "--timeout",
        "2",
        "--json",
        endpoints=cluster.endpoints,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    err = json.loads(out.stdout)
    assert (err["ok"], err["code"], err["definite"]) == (False, "UNAVAILABLE", True)


def test_status_shows_every_node(shared: LocalCluster) -> None:
    leader = shared.wait_for_leader()
    out = run_cli("status", "--json", endpoints=shared.endpoints)
    assert out.returncode == 0, out.stderr
    nodes = json.loads(out.stdout)["nodes"]
    assert len(nodes) == 3
    for node in nodes:
        assert node["reachable"] is True
        assert node["leader"] == leader["client"]
        assert node["term"] >= 1 and node["applied_index"] >= 1
        assert node["role"] in ("leader", "follower")
        # What this build reads and writes (docs/membership.md, "Rolling upgrades").
        assert node["formats"] == {"entry": 6, "snapshot": 9, "snapshot_container": 2}
    assert [n["role"] for n in nodes].count("leader") == 1
    human = run_cli("status", endpoints=shared.endpoints)
    assert human.returncode == 0 and "leader" in human.stdout


def test_status_reports_unreachable_node(tmp_path: Path) -> None:
    base = free_port_block(1)
    out = run_cli("status", "--json", endpoints=[f"127.0.0.1:{base}"])
    assert out.returncode == 1
    nodes = json.loads(out.stdout)["nodes"]
    assert nodes[0]["reachable"] is False and "cannot connect" in nodes[0]["error"]


def test_up_demo_then_ctrl_c_stops_every_node(tmp_path: Path) -> None:
    port = free_port_block(3)
    demo = subprocess.run(
        [
            sys.executable,
            "-m",
            "raftlease",
            "up",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "demo"),
            "--demo",
            "--exit-after-demo",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        preexec_fn=DIES_WITH_PYTEST,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "leader: n" in demo.stdout and "demo: OK" in demo.stdout
    assert "3 of 4 pool units" in demo.stdout
    assert "everything released: True" in demo.stdout
    assert "agent-e leads at 10.0.0.5:7000" in demo.stdout
    assert "all nodes stopped" in demo.stdout

    # Ctrl-C, and SIGTERM (kill, timeout, a service stop), each stop every node.
    for sig in (signal.SIGINT, signal.SIGTERM):
        _up_until_running_then(sig, port, tmp_path / f"run-{sig.name}")


def _up_until_running_then(sig: signal.Signals, port: int, data_dir: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raftlease",
            "up",
            "--port",
            str(port),
            "--data-dir",
            str(data_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=DIES_WITH_PYTEST,
    )
    try:
        lines: list[str] = []
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "press Ctrl-C" in line:
                break
        text = "".join(lines)
        assert "press Ctrl-C" in text, text
        pids = [int(p) for p in re.findall(r"pid (\d+)", text)]
        assert len(pids) == 3
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=30)
        assert "all nodes stopped" in rest
        assert proc.returncode == 0

        def all_gone() -> bool:
            for pid in pids:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    continue
                return False
            return True

        wait_for(all_gone, timeout=10, what="every node process to exit")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_cli_env(
    *args: str, endpoints: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "raftlease", *args, "--endpoints", ",".join(endpoints)]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )


def test_lease_ids_from_a_file_or_the_environment(shared: LocalCluster, tmp_path: Path) -> None:
    """The lease id need not be an argument (visible to every user in ``ps``)."""
    eps = shared.endpoints
    out = run_cli("acquire", "cli/secret", "--owner", "a", "--ttl", "30", "--json", endpoints=eps)
    lease_id = json.loads(out.stdout)["lease_id"]
    id_file = tmp_path / "lease-id"
    id_file.write_text(lease_id + "\n")
    renewed = run_cli("renew", "cli/secret", "--lease-id-file", str(id_file), endpoints=eps)
    assert renewed.returncode == 0, renewed.stderr
    missing = run_cli("renew", "cli/secret", endpoints=eps)
    assert missing.returncode == 2 and "RAFTLEASE_LEASE_ID" in missing.stderr
    released = run_cli_env(
        "release", "cli/secret", endpoints=eps, env={"RAFTLEASE_LEASE_ID": lease_id}
    )
    assert released.returncode == 0, released.stderr
    assert "free" in run_cli("holder", "cli/secret", endpoints=eps).stdout


def test_human_output_escapes_control_characters(shared: LocalCluster) -> None:
    """A key or owner carrying terminal escape sequences is shown escaped, never sent
    raw to the operator's terminal; --json output stays exact."""
    eps = shared.endpoints
    key, owner = "cli/\x1b[2Jwipe", "mal\x1b]0;title\x07lory\u202e"
    with shared.client() as c:
        c.acquire(key, owner=owner, ttl=30)
    human = run_cli("holder", key, endpoints=eps)
    assert human.returncode == 0, human.stderr
    assert "\x1b" not in human.stdout and "\x07" not in human.stdout
    assert "\u202e" not in human.stdout
    assert "\\x1b[2Jwipe" in human.stdout and "\\u202e" in human.stdout
    listed = run_cli("leases", "--prefix", "cli/", endpoints=eps)
    assert "\x1b" not in listed.stdout
    exact = json.loads(run_cli("holder", key, "--json", endpoints=eps).stdout)
    assert exact["holder"]["owner"] == owner


def test_up_secure_runs_the_demo_over_tls_with_a_token(tmp_path: Path) -> None:
    port = free_port_block(3)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTLEASE_")}
    args = ["up", "--port", str(port), "--secure", "--data-dir", str(tmp_path / "sec")]
    demo = subprocess.run(
        [sys.executable, "-m", "raftlease", *args, "--demo", "--exit-after-demo"],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "demo: OK" in demo.stdout and "secure: TLS and authentication on" in demo.stdout
    secure = tmp_path / "sec" / "secure"
    token = (secure / "admin.token").read_text().strip()
    assert token not in demo.stdout + demo.stderr, "the token was printed"
    assert (secure / "admin.token").stat().st_mode & 0o077 == 0
    assert "token_sha256" in (secure / "auth.toml").read_text()


def test_up_refuses_ports_in_use_instead_of_demoing_someone_elses_cluster(
    shared: LocalCluster, tmp_path: Path
) -> None:
    """On the ports of a running cluster, ``up`` must not start nodes that die at once
    and then run its demo against the other cluster, reporting success: it refuses
    before starting anything, naming the ports."""
    port = int(shared.nodes[0].client.rpartition(":")[2])
    args = ["up", "--port", str(port), "--demo", "--exit-after-demo"]
    up = subprocess.run(
        [sys.executable, "-m", "raftlease", *args, "--data-dir", str(tmp_path / "dup")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert up.returncode == 2, up.stdout + up.stderr
    assert "in use" in up.stderr and f"127.0.0.1:{port}" in up.stderr, up.stderr
    assert "demo:" not in up.stdout and not (tmp_path / "dup").exists()
    with shared.client() as c:
        assert c.holder("demo/gpu-0") is None


@pytest.mark.parametrize("taken", ["client", "raft"])
def test_a_node_whose_port_is_taken_exits_with_a_config_error(tmp_path: Path, taken: str) -> None:
    """PySyncObj retries a failed bind of the raft port silently, every tick: the node
    sat in term 0 for good; a taken client port ended in a traceback. The node exits
    2 naming the port, as for a taken admin port."""
    import socket

    base = free_port_block(1)
    client, raft = f"127.0.0.1:{base}", f"127.0.0.1:{base + 100}"
    port = base if taken == "client" else base + 100
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen(1)
        args = ["--id", "n1", "--member", f"n1,{raft},{client}"]
        args += [
            f"--set={k}={v}" for k, v in ClusterCerts(tmp_path / "certs").settings("n1").items()
        ]
        node = subprocess.run(
            [sys.executable, "-m", "raftlease", "node", *args, "--data-dir", str(tmp_path / "n1")],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert node.returncode == 2, node.stdout + node.stderr
    where = client if taken == "client" else raft
    assert f"cannot listen on the {taken} address {where}" in node.stderr, node.stderr
    assert "Traceback" not in node.stderr, node.stderr
