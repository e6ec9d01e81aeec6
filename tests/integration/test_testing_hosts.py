"""``raftlease.testing.hosts``: hosts as network namespaces on one machine. The
integration tests need root, ``ip`` and ``unshare``; without them they skip, except
under CI=true, where they fail (as the browser test does without chromium), so that
the multi-host tests built on this harness cannot vanish silently. The unit tests at
the end need nothing.

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_testing_hosts.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlease.testing import hosts as hosts_module
from raftlease.testing import wait_for
from raftlease.testing.hosts import (
    Host,
    HostNetwork,
    HostsUnavailable,
    chown,
    require,
)
from raftlease.testing.net import LISTEN, tcp_sockets

PY = sys.executable
UID = 10001
PORT = 7001

#: An echo server: one line per connection, echoed back.
ECHO_SERVER = """
import socket, sys
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
while True:
    conn, _ = server.accept()
    with conn:
        conn.sendall(conn.recv(1024))
"""

#: Connects once and says what happened: "echo <peer address> <data>", "timeout"
#: or "error <errno>".
CLIENT = """
import socket, sys
host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
try:
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(b"ping")
        print("echo", sock.getpeername()[0], sock.recv(1024).decode())
except TimeoutError:
    print("timeout")
except OSError as exc:
    print("error", exc.errno)
"""

#: Waits (up to argv[2] s) until argv[1] resolves, first saying it does not yet.
RESOLVE_LATER = """
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[2])
said = False
while time.monotonic() < deadline:
    try:
        print("resolved", socket.gethostbyname(sys.argv[1]), flush=True)
        sys.exit(0)
    except OSError:
        if not said:
            print("missing", flush=True)
            said = True
        time.sleep(0.02)
sys.exit(1)
"""

#: Resolves argv[1] every 20 ms for up to argv[2] s, printing each change of answer
#: ("missing" or the address) until it has printed argv[3].
RESOLVE_CHANGES = """
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[2])
last = None
while time.monotonic() < deadline:
    try:
        now = socket.gethostbyname(sys.argv[1])
    except OSError:
        now = "missing"
    if now != last:
        print(now, flush=True)
        last = now
    if now == sys.argv[3]:
        sys.exit(0)
    time.sleep(0.02)
sys.exit(1)
"""

#: Tries to write each path in argv[1:], printing "<path> ok" or "<path> <errno name>".
WRITE_PROBE = """
import errno, sys
for path in sys.argv[1:]:
    try:
        with open(path, "a") as f:
            f.write("x\\n")
        print(path, "ok")
    except OSError as exc:
        print(path, errno.errorcode[exc.errno])
"""


def _unavailable(exc: HostsUnavailable) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must be able to run hosts (scripts/test, as root): {exc}")
    pytest.skip(f"hosts cannot run here: {exc}")


@pytest.fixture
def network(tmp_path: Path) -> Iterator[HostNetwork]:
    try:
        require()
        net = HostNetwork(tmp_path / "hosts").start()
    except HostsUnavailable as exc:
        _unavailable(exc)
    try:
        yield net
    finally:
        net.close()


def connect(client: Host, target: str, timeout: float = 2.0) -> str:
    """What ``CLIENT`` says when run on ``client`` against ``target``:``PORT``."""
    done = client.run([PY, "-c", CLIENT, target, str(PORT), str(timeout)], timeout=30, check=True)
    return done.stdout.decode().strip()


def start_echo(host: Host, log: Path) -> subprocess.Popen[bytes]:
    proc = host.popen([PY, "-c", ECHO_SERVER, str(PORT)], uid=UID, stdout=log, stderr=log)

    def listening() -> bool:
        assert proc.poll() is None, log.read_text()
        return any(s.local_port == PORT and s.state == LISTEN for s in tcp_sockets(proc.pid))

    wait_for(listening, 20, f"the echo server on {host.name} to listen")
    return proc


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_names_partitions_and_heals(network: HostNetwork, tmp_path: Path) -> None:
    a = network.add_host("a", aliases=["n1", "raftlease-0.raftlease"])
    b = network.add_host("b")
    client = network.add_host("client")
    server = start_echo(a, tmp_path / "echo.log")
    uids = Path(f"/proc/{server.pid}/status").read_text().split("Uid:")[1].split()[:4]
    assert uids == [str(UID)] * 4  # real, effective, saved, file system

    for target in ("a", "n1", "raftlease-0.raftlease", a.address):
        assert connect(client, target) == f"echo {a.address} ping"
    assert connect(b, "a") == f"echo {a.address} ping"

    # A silent drop both ways: the connect times out (no refusal, no EINVAL), and only
    # between the pair.
    network.partition("a", "client")
    assert connect(client, "a", timeout=1.0) == "timeout"
    assert connect(b, "a") == f"echo {a.address} ping"
    network.partition("client", "a")  # idempotent, either order
    network.heal("client", "a")
    assert connect(client, "a") == f"echo {a.address} ping"
    network.heal("a", "client")  # idempotent

    # A process already running sees hosts added later (the file grows in place).
    seen = tmp_path / "resolve.log"
    watcher = client.popen([PY, "-c", RESOLVE_LATER, "late", "20"], stdout=seen)
    wait_for(lambda: seen.exists() and "missing" in seen.read_text(), 20, "the watcher")

    # An isolated host is cut off from every host, those added later included.
    network.isolate("a")
    late = network.add_host("late", "10.201.0.99")
    assert watcher.wait(timeout=20) == 0
    assert seen.read_text().split()[-2:] == ["resolved", "10.201.0.99"]
    assert connect(late, "a", timeout=1.0) == "timeout"
    assert connect(b, "a", timeout=1.0) == "timeout"
    network.heal_all()
    assert connect(late, "n1") == f"echo {a.address} ping"
    assert connect(client, "a") == f"echo {a.address} ping"
    assert server.poll() is None


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_host_removed_comes_back_at_a_new_address(network: HostNetwork, tmp_path: Path) -> None:
    """A pod rescheduled: its processes die, its names stop resolving, and it comes
    back under the same names at another address, with its tree; processes already
    running elsewhere see each change (the hosts file changes in place)."""
    a = network.add_host("a", "10.201.0.21", aliases=["raftlease-1.raftlease"])
    b = network.add_host("b")
    c = network.add_host("c")
    (a.root / "kept").write_text("volume\n")
    server = start_echo(a, tmp_path / "echo-1.log")
    network.partition("a", "b")
    network.isolate("c")
    seen = tmp_path / "changes.log"
    script = [PY, "-c", RESOLVE_CHANGES, "raftlease-1.raftlease", "30", "10.201.0.42"]
    watcher = b.popen(script, stdout=seen)
    wait_for(lambda: "10.201.0.21" in seen.read_text(), 20, "the watcher to resolve a")

    network.remove_host("a")
    assert server.returncode == -signal.SIGKILL
    assert "a" not in network.hosts
    assert network.cuts == {frozenset({"b", "c"})} and network.isolated == {"c"}
    wait_for(lambda: "missing" in seen.read_text(), 20, "the name to stop resolving")
    with pytest.raises(KeyError):
        network.remove_host("a")

    a = network.add_host("a", "10.201.0.42", aliases=["raftlease-1.raftlease"])
    assert watcher.wait(timeout=20) == 0
    assert seen.read_text().split() == ["10.201.0.21", "missing", "10.201.0.42"]
    assert (a.root / "kept").read_text() == "volume\n"
    start_echo(a, tmp_path / "echo-2.log")
    assert connect(b, "raftlease-1.raftlease") == "echo 10.201.0.42 ping"  # not cut any more
    assert connect(c, "a", timeout=1.0) == "timeout"  # c is still isolated, from a too
    # The old address is nobody's: a connect to it finds no host (ARP fails).
    assert connect(b, "10.201.0.21", timeout=1.0) in ("timeout", "error 113")
    assert network.hosts_path.read_text() == network.hosts_text()
    assert "#0.201.0.21\ta raftlease-1.raftlease\n" in network.hosts_text()


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_etc_is_read_only_and_the_bound_data_dir_writable(network: HostNetwork) -> None:
    a = network.add_host("a")
    etc = a.path("/etc/raftlease", make=True)
    (etc / "node.toml").write_text('node_id = "n1"\n')
    data = a.path("/var/lib/raftlease", make=True, mode=0o700)
    chown(data, UID)
    binds = {"/etc/raftlease": etc, "/var/lib/raftlease": data}
    # As the uid, creating a file under /etc fails with EROFS (the mount is checked
    # before the directory's permissions); as root, so does writing any existing file
    # (for the uid, an existing root file fails its permission check first: EACCES).
    home = a.path(f"/home/{UID}")  # HOME, made for the uid (in pytest's 0700 temp dir)
    probes = {
        UID: ["/etc/raftlease/new", "/var/lib/raftlease/journal", f"{home}/.history"],
        0: ["/etc/raftlease/new", "/etc/raftlease/node.toml", "/etc/passwd"],
    }
    probes[0] += ["/var/lib/raftlease/journal"]
    for uid, probe in probes.items():
        done = a.run(
            [PY, "-c", WRITE_PROBE, *probe], uid=uid, binds=binds, cwd="/var/lib/raftlease"
        )
        assert done.returncode == 0, done.stderr
        results = done.stdout.decode().splitlines()
        assert results == [f"{p} {'EROFS' if p.startswith('/etc') else 'ok'}" for p in probe]
    assert (data / "journal").read_text() == "x\nx\n"  # (and one more below)
    assert (data / "journal").stat().st_uid == UID
    assert (etc / "node.toml").read_text() == 'node_id = "n1"\n'
    # The mount points were made in the process's own tmpfs, not on this machine.
    assert not Path("/etc/raftlease").exists()
    assert not Path("/var/lib/raftlease").exists()

    # A bind under a read-only tree is read-only too, unless listed as writable
    # (ReadWritePaths=); the innermost listed path decides.
    secret = a.path("/secret", make=True)
    chown(secret, UID)
    binds = {**binds, "/etc/raftlease/secret": secret}
    target = ["/etc/raftlease/secret/peer.secret"]
    for writable, result in ([], "EROFS"), (["/etc/raftlease/secret"], "ok"):
        done = a.run([PY, "-c", WRITE_PROBE, *target], uid=UID, binds=binds, writable=writable)
        assert done.stdout.decode().split() == [*target, result]
    # ProtectSystem=strict with a StateDirectory; the API trees stay writable. The
    # probe in /tmp is a name no one else uses: a directory of that name left on the
    # machine by anything else answered EISDIR before the mount's EROFS (seen in CI).
    scratch = f"/tmp/raftlease-ro-probe-{os.getpid()}-{os.urandom(4).hex()}"
    strict = a.run(
        [PY, "-c", WRITE_PROBE, "/var/lib/raftlease/journal", scratch, "/dev/null"],
        binds=binds,
        read_only=["/"],
        writable=["/var/lib/raftlease"],
    )
    assert strict.stdout.decode().split("\n")[:3] == [
        "/var/lib/raftlease/journal ok",
        f"{scratch} EROFS",
        "/dev/null ok",
    ]

    # A setup failure says what failed, before the program runs.
    done = a.run(["true"], binds={"/etc/raftlease": a.root / "no-such-dir"})
    assert done.returncode == 125 and b"does not exist" in done.stderr


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_signals_to_popen_pid_reach_the_program(network: HostNetwork, tmp_path: Path) -> None:
    a = network.add_host("a")
    log = tmp_path / "program.log"
    program = [PY, "-c", "import time; print('ready', flush=True); time.sleep(60)"]
    proc = a.popen(program, uid=UID, stdout=log, stderr=log)
    wait_for(lambda: _started(proc, log), 20, "the program to start")
    # The pid is the program's own: ip netns exec, unshare and hostexec exec'd in turn.
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[:-1]
    assert [c.decode() for c in cmdline] == program
    assert a.pids() == [proc.pid]

    os.kill(proc.pid, signal.SIGSTOP)
    wait_for(lambda: _state(proc.pid) == "T", 10, "the program to stop")
    os.kill(proc.pid, signal.SIGCONT)
    wait_for(lambda: _state(proc.pid) != "T", 10, "the program to continue")
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert a.pids() == []

    # A host losing power: everything on it, including a process still on its way in.
    first = a.popen([PY, "-c", "import time; time.sleep(60)"])
    second = a.popen(["sleep", "60"])
    assert sorted(a.kill_all()) == sorted([first.pid, second.pid])
    assert first.returncode == second.returncode == -signal.SIGKILL


def _started(proc: subprocess.Popen[bytes], log: Path) -> bool:
    assert proc.poll() is None, log.read_text()
    return "ready" in log.read_text()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_close_leaves_nothing_behind(tmp_path: Path) -> None:
    try:
        require()
    except HostsUnavailable as exc:
        _unavailable(exc)
    links_before = _root_links()
    mounts_before = set(Path("/proc/self/mountinfo").read_text().splitlines())
    net = HostNetwork(tmp_path / "hosts")
    try:
        a = net.add_host("a")
        b = net.add_host("b")
        net.partition("a", "b")
        ready = tmp_path / "ready"
        # A program with a child of its own, both still running at close().
        script = f"sleep 60 & echo $! > {ready}.tmp && mv {ready}.tmp {ready} && wait"
        parent = a.popen(["sh", "-c", script], binds={"/etc/raftlease": tmp_path})
        wait_for(ready.exists, 20, "the program's child")
        child = int(ready.read_text())
        assert sorted(a.pids()) == sorted([parent.pid, child])
        b.popen([PY, "-c", "import time; time.sleep(60)"])
        assert len(_ours(net.prefix)) == 3
    finally:
        net.close()
    net.close()  # idempotent

    assert parent.returncode == -signal.SIGKILL
    # Dead: gone, or a zombie its new parent (pid 1: the child was orphaned) has not
    # reaped yet; it has left the namespace either way.
    assert not Path(f"/proc/{child}").exists() or _state(child) == "Z"
    assert _ours(net.prefix) == []
    assert _root_links() == links_before
    mountinfo = Path("/proc/self/mountinfo").read_text()
    assert net.prefix + "-" not in mountinfo
    # New mounts may only be other users' namespaces (or /run/netns itself, which the
    # first `ip netns add` since boot makes and leaves for every later user).
    new = set(mountinfo.splitlines()) - mounts_before
    assert all(line.split()[4].startswith("/run/netns") for line in new), new
    assert not net.hosts_path.exists() and not net.stage_dir.exists()
    with pytest.raises(hosts_module.HostsError):
        a.popen(["true"])


def _ours(prefix: str) -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    names = [line.split()[0] for line in listing.stdout.splitlines()]
    return [name for name in names if name.startswith(prefix + "-")]


def _root_links() -> set[str]:
    listing = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=10)
    return {line.split(": ")[1].split("@")[0] for line in listing.stdout.splitlines()}
