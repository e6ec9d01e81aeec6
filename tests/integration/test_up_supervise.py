"""``raftlease up`` supervises its nodes (cli/up_console.py), and no node outlives its
launcher (server/launcher.py): real processes, no mocks, waits on conditions.

* a node SIGKILLed under ``up`` is reported (pid, signal), the others keep serving,
  ``status`` and the dashboard show it down, and ``restart ID`` typed on ``up``'s
  stdin brings it back caught up; end of stdin does not stop the cluster;
* ``up`` killed with SIGKILL: every node it started stops by itself;
* a LocalCluster whose launcher (a short-lived process that started the nodes from a
  worker thread, one of them the test build) is SIGKILLed: its nodes stop;
* a node whose ``--parent-pid`` is not its parent watches that pid, and a launcher
  that died but was not reaped (a zombie) counts as gone.

The nodes of ``up`` and of the launchers are not this process's children: they are
checked through ``os.kill(pid, 0)`` and ``/proc``, and any left alive (a failed
test) are SIGKILLed by the pids the test learned.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlease import Client
from raftlease.testing import LocalCluster, free_port_block, wait_for
from tests.process_support import DIES_WITH_PYTEST

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

RAFTLEASE = [sys.executable, "-m", "raftlease"]
NODE = [*RAFTLEASE, "node"]
NODE_ID = r"n\d"
#: Seconds a node may take to notice its launcher is gone (1 s checks) and stop.
ORPHAN_DEADLINE = 20.0


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: exists and is not a zombie (an orphan's new parent, in a
    container, may never reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def kill_leftovers(pids: set[int]) -> None:
    """SIGKILL each learned node pid still running (a test that failed midway)."""
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def wait_all_gone(pids: set[int], what: str) -> None:
    wait_for(lambda: not any(alive(p) for p in pids), ORPHAN_DEADLINE, what, interval=0.1)


class Output:
    """Every line a process writes, collected by a reader thread (daemon: it ends
    at the process's end of output)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self._stream = proc.stdout
        self.lines: list[str] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._stream:
            with self._lock:
                self.lines.append(line)

    @property
    def text(self) -> str:
        with self._lock:
            return "".join(self.lines)

    def wait(self, pattern: str, timeout: float = 60.0, after: int = 0) -> re.Match[str]:
        """The first match of ``pattern`` in the lines from number ``after`` on."""

        def found() -> re.Match[str] | None:
            with self._lock:
                return re.search(pattern, "".join(self.lines[after:]))

        try:
            return wait_for(found, timeout, f"{pattern!r} in the output")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; output:\n{self.text}") from None

    def mark(self) -> int:
        with self._lock:
            return len(self.lines)


def start_up(port: int, data_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*RAFTLEASE, "up", "--port", str(port), "--data-dir", str(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=DIES_WITH_PYTEST,
    )


def node_lines(text: str) -> dict[str, dict[str, str]]:
    """``up``'s node lines: id -> client, admin address, pid."""
    pattern = r"(n\d+): clients (\S+)\s+raft \S+\s+admin http://(\S+)\s+pid (\d+)"
    return {m[1]: {"client": m[2], "admin": m[3], "pid": m[4]} for m in re.finditer(pattern, text)}


def send(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


@pytest.fixture
def learned() -> Iterator[set[int]]:
    """Node pids a test learned; SIGKILLed at its end if still running."""
    pids: set[int] = set()
    try:
        yield pids
    finally:
        kill_leftovers(pids)


def test_up_reports_a_killed_node_keeps_serving_and_restarts_it(
    tmp_path: Path, learned: set[int]
) -> None:
    port = free_port_block(3)
    up = start_up(port, tmp_path / "up")
    try:
        out = Output(up)
        out.wait(r"commands: status, kill ID, restart ID, help, quit")
        nodes = node_lines(out.text)
        assert sorted(nodes) == ["n1", "n2", "n3"], out.text
        learned.update(int(n["pid"]) for n in nodes.values())
        leader = out.wait(r"leader: (n\d)")[1]
        # Whom the zero-configuration cluster trusts, and how to secure it: one line.
        trust = out.wait(r"trust: .*\n")[0]
        assert "every process on this machine may do everything" in trust, trust
        assert "raftlease up --secure" in trust, trust

        # SIGKILL the leader by the pid up printed: a failover to watch.
        victim, pid = leader, int(nodes[leader]["pid"])
        others = [i for i in nodes if i != victim]
        os.kill(pid, signal.SIGKILL)
        report = out.wait(rf"node {victim} \(pid {pid}\) was killed by SIGKILL; (.*)\n")
        assert f"{others[0]} and {others[1]} keep serving" in report[1], report[0]
        assert f'Type "restart {victim}"' in report[1], report[0]
        # Named once agreed; on a loaded machine the election may outlast up's wait.
        named = out.wait(r"leader now: (n\d) \(|no leader agreed within")
        assert named[1] in (*others, None), named[0]
        assert up.poll() is None, "up must keep running"

        # The others serve: an acquire through their endpoints.
        with Client([nodes[i]["client"] for i in others]) as c:
            lease = c.acquire("up/while-down", owner="tester", ttl=60)
            assert lease.token > 0

        # `raftlease status` and the dashboard show the dead member unreachable.
        every = ",".join(n["client"] for n in nodes.values())
        status = subprocess.run(
            [*RAFTLEASE, "status", "--json", "--endpoints", every],
            capture_output=True,
            text=True,
            timeout=60,
        )
        by_client = {s["client"]: s for s in json.loads(status.stdout)["nodes"]}
        assert by_client[nodes[victim]["client"]]["reachable"] is False, status.stdout
        assert all(by_client[nodes[i]["client"]]["reachable"] for i in others)
        url = f"http://{nodes[others[0]]['admin']}/ui/api/cluster"
        with urllib.request.urlopen(url, timeout=10) as answer:
            view = {s["node"]: s for s in json.load(answer)["nodes"]}
        assert view[victim]["reachable"] is False and "error" in view[victim], view
        assert all(view[i]["reachable"] for i in others), view

        # up's own status, then anything unknown gets the one-line help.
        mark = out.mark()
        send(up, "status")
        out.wait(rf"{victim}\s+down: pid {pid} was killed by SIGKILL", after=mark)
        out.wait(rf"{named[1] or NODE_ID}\s+pid \d+\s+leader\s+term", after=mark)
        send(up, "bogus 1")
        out.wait(r"unknown command 'bogus 1'; commands: status, kill ID", after=mark)

        # restart: running again, and caught up with what was granted meanwhile.
        send(up, f"restart {victim}")
        new_pid = int(out.wait(rf"{victim} started again: pid (\d+)", after=mark)[1])
        learned.add(new_pid)
        assert alive(new_pid) and new_pid != pid
        # (follower of the leader it finds; the leader, if it won an election meanwhile)
        out.wait(rf"{victim} \(pid {new_pid}\) caught up: (follower of n\d|the leader)", after=mark)
        with Client([nodes[victim]["client"]]) as c:
            read = c.read("up/while-down", consistency="stale")
            assert read.served_by == victim
            assert read.holder is not None and read.holder.owner == "tester"

        # End of input ends the commands, not the cluster.
        assert up.stdin is not None
        up.stdin.close()
        out.wait(r"standard input closed: no more commands", after=mark)
        with Client([n["client"] for n in nodes.values()]) as c:
            c.release(lease)
        assert up.poll() is None

        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=60) == 0, out.text
        out.wait(r"all nodes stopped")
        wait_all_gone(learned, "every node of up to stop")
    finally:
        if up.poll() is None:
            up.kill()
        up.wait(timeout=30)


def test_nodes_stop_when_up_is_killed_with_sigkill(tmp_path: Path, learned: set[int]) -> None:
    port = free_port_block(3)
    up = start_up(port, tmp_path / "up")
    try:
        out = Output(up)
        out.wait(r"commands: ")
        nodes = node_lines(out.text)
        pids = {int(n["pid"]) for n in nodes.values()}
        assert len(pids) == 3, out.text
        learned.update(pids)
        assert all(alive(p) for p in pids)
        up.kill()  # SIGKILL: up runs no cleanup at all
        up.wait(timeout=30)
        wait_all_gone(pids, "every node of the SIGKILLed up to stop by itself")
    finally:
        if up.poll() is None:
            up.kill()
        up.wait(timeout=30)
    for node_id in nodes:  # a clean stop, as on SIGTERM, saying why
        log = (tmp_path / "up" / node_id / "node.log").read_text()
        assert f"launched this node (pid {up.pid}) is gone; stopping" in log, log[-2000:]
        assert f"node {node_id} stopped" in log, log[-2000:]


#: A launcher that starts its nodes from a worker thread, which then ends (a
#: PR_SET_PDEATHSIG would fire there), waits for a leader, says so, and blocks.
LAUNCHER = """
import sys, threading
from raftlease.testing import LocalCluster
cluster = LocalCluster(3, client_port=int(sys.argv[2]), data_dir=sys.argv[1],
                       node_hooks={"n3": {"clock_control": True}})
worker = threading.Thread(target=cluster.start, kwargs={"wait": False})
worker.start()
worker.join()
print(" ".join(str(cluster.pid(n.id)) for n in cluster.nodes), flush=True)
cluster.wait_for_leader(60)
print("leader agreed", flush=True)
sys.stdin.read()
"""


def test_nodes_stop_when_their_launcher_is_killed(tmp_path: Path, learned: set[int]) -> None:
    port = free_port_block(3)
    data = tmp_path / "cluster"
    # `-c`: the launcher imports the package from this directory, as the tests do.
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(data), str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out = Output(launcher)
        pids = {int(p) for p in out.wait(r"(?m)^(\d+) (\d+) (\d+)$")[0].split()}
        learned.update(pids)
        out.wait(r"leader agreed")
        # The thread that forked them is long gone: they run on.
        assert all(alive(p) for p in pids)
        launcher.kill()
        launcher.wait(timeout=30)
        wait_all_gone(pids, "every node of the SIGKILLed launcher to stop by itself")
    finally:
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait(timeout=30)
    test_build = (data / "n3" / "node.log").read_text()
    assert "TEST BUILD" in test_build and "is gone; stopping" in test_build, test_build[-2000:]


def test_a_node_watches_a_launcher_that_is_not_its_parent(
    tmp_path: Path, learned: set[int]
) -> None:
    """``--parent-pid`` of a process that is not the node's parent (a wrapper stood
    between them, or the launcher died before the node's first look): the node
    watches that pid, and once it has died, even unreaped (a zombie, as an orphan's
    new parent in a container may leave it), the node stops cleanly."""
    layout = LocalCluster(1, data_dir=tmp_path / "one")
    config = layout.write_config("n1")
    launcher = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    with open(layout.log_path("n1"), "ab") as log_file:
        node = subprocess.Popen(
            [*NODE, "--config", str(config), "--parent-pid", str(launcher.pid)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    learned.add(node.pid)
    try:
        wait_for(lambda: layout.node_status("n1"), 60, "the node to answer status")
        assert node.poll() is None
        launcher.kill()  # not reaped (no wait, no poll) until the finally: a zombie
        wait_for(lambda: not alive(launcher.pid), 10, "the launcher to die")
        os.kill(launcher.pid, 0)  # still there, as a zombie: kill(pid, 0) alone would not do
        assert node.wait(timeout=ORPHAN_DEADLINE) == 0
    finally:
        if node.poll() is None:
            node.kill()
        node.wait(timeout=30)
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait(timeout=30)
    log = layout.log_path("n1").read_text()
    assert "not (or no longer) this node's parent" in log, log
    assert f"(pid {launcher.pid}) is gone; stopping" in log and "node n1 stopped" in log, log
