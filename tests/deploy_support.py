"""Helpers shared by tests/integration/test_multi_host.py and tests/integration/test_deploy_run.py:
the docs'
``# step:`` blocks, a hosts network that skips (or fails under CI) where hosts cannot
run, ``raftlease``/``python`` shims that run this checkout, passwd/group files for a
host, snapshots of file trees, a systemd service emulated on a host (``Unit`` and
``Service``) and a client that keeps acquiring in the background (``Prober``).

Nothing here sleeps to guess: waits poll conditions until deadlines; the one sleep is a
unit's own RestartSec, the delay systemd waits before a restart.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from raftlease.testing import wait_for
from raftlease.testing.hosts import Host, HostNetwork, HostsUnavailable, require

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "deployment.md"
PY = sys.executable
#: systemd's environment for a service before its Environment= lines (PATH as systemd
#: sets it; LANG from the locale it runs with).
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_FENCE = re.compile(r"^```sh\n# step: (?P<name>[^\n]+)\n(?P<body>.*?)^```$", re.M | re.S)


# ------------------------------------------------------------------ the docs


@dataclass(frozen=True)
class Step:
    name: str
    body: str  # the block's lines after its marker
    prose: str  # the text between the previous block (or heading) and this one


def doc_steps(text: str) -> dict[str, Step]:
    """The ```sh blocks whose first line is ``# step: NAME``, by name, each with the
    prose before it (back to the previous fence or ``##`` heading)."""
    steps: dict[str, Step] = {}
    previous_end = 0
    for match in _FENCE.finditer(text):
        before = text[previous_end : match.start()]
        before = before.rsplit("```", 1)[-1]  # after the last fence of another kind
        before = re.split(r"^#{2,} ", before, flags=re.M)[-1]
        name = match["name"].strip()
        assert name not in steps, f"two blocks are called step {name!r}"
        steps[name] = Step(name, match["body"], before)
        previous_end = match.end()
    return steps


def backticked(prose: str) -> list[str]:
    """The `quoted` words of a paragraph, in order."""
    return re.findall(r"`([^`\n]+)`", prose)


def run_block(
    body: str, cwd: Path, env: Mapping[str, str], timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """A docs block run as written by ``sh -e`` on this machine; fails the test (with
    the block's output) on a non-zero exit."""
    done = subprocess.run(
        ["sh", "-e", "-c", body],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{body}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


# --------------------------------------------------------------- the machine


@contextlib.contextmanager
def host_network(base: Path, subnet: str) -> Iterator[HostNetwork]:
    """A started ``HostNetwork``, closed (namespaces deleted, processes killed) however
    the test ends. Skips where hosts cannot run, fails under CI=true."""
    try:
        require()
        net = HostNetwork(base, subnet=subnet).start()
    except HostsUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must be able to run hosts (scripts/test, as root): {exc}")
        pytest.skip(f"hosts cannot run here: {exc}")
    try:
        yield net
    finally:
        net.close()


def write_shim(path: Path, module: str | None = "raftlease") -> Path:
    """An executable ``path`` that runs this checkout's ``python -m module`` (or, with
    None, this Python itself), as an installed console script or a venv's interpreter
    would: PYTHONPATH names the worktree, whatever the cwd."""
    path.parent.mkdir(parents=True, exist_ok=True)
    target = f'"{PY}" -m {module}' if module else f'"{PY}"'
    path.write_text(f'#!/bin/sh\nPYTHONPATH={shlex.quote(str(ROOT))} exec {target} "$@"\n')
    path.chmod(0o755)
    return path


def accounts(directory: Path, user: str, uid: int, home: str, shell: str) -> dict[str, Path]:
    """passwd and group files: this machine's, plus ``user`` (and its group) at
    ``uid``, as ``useradd`` would add them. Returns the binds for /etc/passwd and
    /etc/group."""
    directory.mkdir(parents=True, exist_ok=True)
    passwd, group = directory / "passwd", directory / "group"
    passwd.write_text(Path("/etc/passwd").read_text() + f"{user}:x:{uid}:{uid}::{home}:{shell}\n")
    group.write_text(Path("/etc/group").read_text() + f"{user}:x:{uid}:\n")
    for path in (passwd, group):
        path.chmod(0o644)
    return {"/etc/passwd": passwd, "/etc/group": group}


def lookup(passwd: Path, name: str) -> int:
    """The uid (passwd) or gid (group) of ``name`` in such a file."""
    for line in passwd.read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return int(fields[2])
    raise KeyError(f"{name} is not in {passwd}")


def bind_root(path: str) -> str:
    """The outermost directory of ``path`` that this machine does not have: what a
    host binds so that ``path`` exists in it (``/opt/raftlease`` for
    ``/opt/raftlease/venv``)."""
    current = Path(path)
    while not current.parent.exists():
        current = current.parent
    return str(current)


def tree_state(path: Path) -> dict[str, tuple[int, int, int, int, int, str]]:
    """relative path -> (mode, uid, gid, size, mtime_ns, sha256) of everything under
    ``path``: equal before and after means nothing was written there."""
    state = {}
    for entry in sorted([path, *path.rglob("*")]):
        info = entry.lstat()
        digest = hashlib.sha256(entry.read_bytes()).hexdigest() if entry.is_file() else ""
        state[str(entry.relative_to(path))] = (
            info.st_mode,
            info.st_uid,
            info.st_gid,
            info.st_size,
            info.st_mtime_ns,
            digest,
        )
    return state


def owner_mode(path: Path) -> tuple[int, int, str]:
    info = path.stat()
    return info.st_uid, info.st_gid, oct(stat.S_IMODE(info.st_mode))


# ------------------------------------------------------------------ systemd


def seconds(value: str) -> float:
    """A systemd time span: ``2s``, ``100ms``, ``1min``, ``20`` (seconds)."""
    units = {"ms": 0.001, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "": 1.0}
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


@dataclass
class Unit:
    """A systemd unit file: (key, value) lines per section, comments dropped."""

    sections: dict[str, list[tuple[str, str]]]

    @classmethod
    def parse(cls, text: str) -> Unit:
        sections: dict[str, list[tuple[str, str]]] = {}
        current: list[tuple[str, str]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                current = sections.setdefault(line.strip("[]"), [])
                continue
            key, _, value = line.partition("=")
            current.append((key.strip(), value.strip()))
        return cls(sections)

    def values(self, section: str, key: str) -> list[str]:
        """Every value of ``key`` (an empty assignment resets the list, as in systemd)."""
        out: list[str] = []
        for k, v in self.sections.get(section, []):
            if k == key:
                out = [*out, v] if v else []
        return out

    def get(self, section: str, key: str, default: str = "") -> str:
        values = self.values(section, key)
        return values[-1] if values else default


#: Signals after which Restart=on-failure does not restart (systemd's clean signals).
CLEAN_SIGNALS = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE}


@dataclass(eq=False)
class Service:
    """``systemctl start UNIT@INSTANCE`` on ``host``: the unit's ExecStart with %i, as
    its User and Group, with its Environment=, UMask=, LimitNOFILE=, StateDirectory=
    (made under /var/lib, owned by the user, StateDirectoryMode) and ProtectSystem=
    strict (all of / read-only but the state directories); ``binds`` is the host's
    own file system (its /etc/raftlease, passwd, venv, /var/lib/<top>). Restart=
    on-failure with RestartSec=, RestartPreventExitStatus= and the start limit are
    kept by a supervising thread. Output goes to ``log`` (the unit's journal)."""

    host: Host
    unit: Unit
    instance: str
    binds: dict[str, Path]
    log: Path
    starts: int = 0
    exits: list[int] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def spec(self, key: str, section: str = "Service") -> str:
        value = self.unit.get(section, key)
        value = value.replace("%i", self.instance)
        assert "%" not in value.replace("%%", ""), f"{key}={value}: a specifier not emulated"
        return value.replace("%%", "%")

    def state_dirs(self) -> list[str]:
        return [f"/var/lib/{d}" for d in self.spec("StateDirectory").split()]

    def prepare(self) -> None:
        """What systemd does before the first exec: the state directories, owned by
        User, with StateDirectoryMode (parents root 0755)."""
        assert self.spec("ProtectSystem") == "strict", "only ProtectSystem=strict is emulated"
        uid, gid = self.ids()
        mode = int(self.spec("StateDirectoryMode") or "0755", 8)
        for directory in self.state_dirs():
            path = self.host.path(directory)
            for parent in reversed(path.relative_to(self.host.root).parents[:-1]):
                self.host.path(f"/{parent}", make=True)
            path.mkdir(exist_ok=True)
            os.chown(path, uid, gid)
            path.chmod(mode)
            self.binds.setdefault(bind_root(directory), self.host.path(bind_root(directory)))

    def ids(self) -> tuple[int, int]:
        user = self.spec("User")
        group = self.spec("Group") or user
        return lookup(self.binds["/etc/passwd"], user), lookup(self.binds["/etc/group"], group)

    def environment(self) -> dict[str, str]:
        user = self.spec("User")
        entry = next(
            line.split(":")
            for line in self.binds["/etc/passwd"].read_text().splitlines()
            if line.split(":")[0] == user
        )
        env = {"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8", "USER": user, "LOGNAME": user}
        env |= {"HOME": entry[5], "SHELL": entry[6], "INVOCATION_ID": os.urandom(16).hex()}
        for value in self.unit.values("Service", "Environment"):
            for assignment in shlex.split(value):
                key, _, val = assignment.partition("=")
                env[key] = val
        return env

    def argv(self) -> list[str]:
        exec_start = shlex.split(self.spec("ExecStart"))
        assert not exec_start[0].startswith(("-", "@", "+", "!")), "prefixes not emulated"
        # UMask= and LimitNOFILE= apply to the process; sh sets them and execs (same pid).
        limits = f"umask {self.spec('UMask') or '0022'}"
        if self.spec("LimitNOFILE"):
            limits += f" && ulimit -n {self.spec('LimitNOFILE')}"
        return ["sh", "-c", f'{limits} && exec "$0" "$@"', *exec_start]

    def _exec(self) -> subprocess.Popen[bytes]:
        uid, gid = self.ids()
        self.starts += 1
        with self.log.open("a") as log:
            log.write(f"-- start {self.starts} of {self.instance} --\n")
        return self.host.popen(
            self.argv(),
            uid=uid,
            gid=gid,
            env=self.environment(),
            cwd="/",
            stdout=self.log,
            stderr=self.log,
            binds=self.binds,
            read_only=["/"],
            writable=self.state_dirs(),
        )

    def start(self) -> None:
        """``systemctl start``: runs the unit and supervises it until ``stop``."""
        assert self._thread is None or not self._thread.is_alive(), "already running"
        self.prepare()
        self._stopping.clear()
        with self._lock:
            self.proc = self._exec()
        self._thread = threading.Thread(target=self._supervise, daemon=True)
        self._thread.start()

    def wants_restart(self, code: int) -> bool:
        """Restart=on-failure with RestartPreventExitStatus=: after a non-zero exit
        or an unclean signal, not after the listed statuses."""
        assert self.spec("Restart") in ("on-failure", "no", ""), "only on-failure is emulated"
        if self.spec("Restart") != "on-failure":
            return False
        prevent = self.spec("RestartPreventExitStatus").split()
        if code < 0:
            return signal.Signals(-code) not in CLEAN_SIGNALS and (
                signal.Signals(-code).name not in prevent
            )
        return code != 0 and str(code) not in prevent

    def _supervise(self) -> None:
        burst = int(self.spec("StartLimitBurst", "Unit") or "5")
        interval = seconds(self.spec("StartLimitIntervalSec", "Unit") or "10s")
        started = [time.monotonic()]
        while True:
            proc = self.proc
            assert proc is not None
            code = proc.wait()
            self.exits.append(code)
            if self._stopping.is_set() or not self.wants_restart(code):
                return
            # RestartSec: systemd's own delay before the restart (not a guess).
            if self._stopping.wait(seconds(self.spec("RestartSec") or "100ms")):
                return
            started = [t for t in started if time.monotonic() - t < interval]
            if len(started) >= burst:
                return  # start limit hit: the unit stays failed
            with self._lock:
                if self._stopping.is_set() or self.host.network.closed:
                    return
                started.append(time.monotonic())
                self.proc = self._exec()

    def kill(self, sig: int = signal.SIGKILL) -> int:
        """``systemctl kill -s SIG`` (or the OOM killer): the main process only;
        returns its pid."""
        with self._lock:
            assert self.proc is not None and self.proc.poll() is None, "not running"
            os.kill(self.proc.pid, sig)
            return self.proc.pid

    def stop(self) -> int:
        """``systemctl stop``: KillSignal, then SIGKILL after TimeoutStopSec; no
        restart. Returns the exit status."""
        self._stopping.set()
        with self._lock:
            proc = self.proc
        assert proc is not None
        if proc.poll() is None:
            proc.send_signal(getattr(signal, self.spec("KillSignal") or "SIGTERM"))
            try:
                proc.wait(timeout=seconds(self.spec("TimeoutStopSec") or "90s"))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self._thread is not None:
            self._thread.join(timeout=10)
        return proc.returncode

    def abandon(self) -> None:
        """No more restarts (the machine is about to lose power: the network's
        ``close`` kills the process)."""
        self._stopping.set()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_finished(self, timeout: float) -> None:
        """Wait until the unit is over (stopped, failed, or not to be restarted)."""
        assert self._thread is not None
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self.instance} still running after {timeout} s"

    def wait_started(self, count: int, timeout: float) -> None:
        wait_for(lambda: self.starts >= count and self.running(), timeout, f"start {count}")


# ------------------------------------------------------------------ clients

#: Acquires a new key every argv[3] s until argv[2] s passed (or argv[4] acquires),
#: one JSON line each: start and end (wall clock), ok, the error.
PROBER = """
import json, os, ssl, sys, time
from raftlease.client import Client
out, duration, period, most = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
prefix = sys.argv[5]
tls = None
if os.environ.get("RAFTLEASE_CA_FILE"):
    tls = ssl.create_default_context(cafile=os.environ["RAFTLEASE_CA_FILE"])
    if os.environ.get("RAFTLEASE_CERT_FILE"):
        tls.load_cert_chain(os.environ["RAFTLEASE_CERT_FILE"], os.environ["RAFTLEASE_KEY_FILE"])
end = time.monotonic() + duration
with Client(os.environ["RAFTLEASE_ENDPOINTS"], tls=tls, deadline=5.0, attempt_timeout=1.0) as c, \\
        open(out, "a") as log:
    for n in range(most):
        if time.monotonic() > end:
            break
        t0 = time.time()
        try:
            c.acquire(f"{prefix}/{n}", owner="prober", ttl=30)
            ok, err = True, ""
        except Exception as exc:
            ok, err = False, repr(exc)
        log.write(json.dumps({"t0": t0, "t1": time.time(), "ok": ok, "err": err}) + "\\n")
        log.flush()
        time.sleep(period)
"""


@dataclass
class Prober:
    """A client on ``host`` that keeps acquiring new keys (``PROBER``), so a test can
    ask whether the cluster served throughout a span of time (``longest_gap``)."""

    host: Host
    env: dict[str, str]
    out: Path
    cwd: str
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self, duration: float = 900.0, period: float = 0.2) -> None:
        """Start the prober (bounded by ``duration`` seconds; the test's host network
        kills it sooner at its end). ``duration`` outlasts any run of the test: a
        prober that ended on its own would read as the cluster not serving."""
        self.out.touch()
        self.starts += 1  # a restarted prober's keys are new ones (the old stay held)
        prefix = f"probe/{self.starts}"
        argv = [PY, "-c", PROBER, str(self.out), str(duration), str(period), "5000", prefix]
        self.proc = self.host.popen(
            argv, env=self.env, cwd=self.cwd, stderr=self.out.with_suffix(".err")
        )
        wait_for(lambda: self.successes(time.time() - 600), 30, "the prober's first acquire")

    def restart(self, env: dict[str, str]) -> None:
        """Stop the prober (SIGTERM by pid, bounded wait) and start it again with
        ``env`` (e.g. new endpoints), appending to the same records."""
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.env = env
        since = time.time()
        self.start()
        wait_for(lambda: self.successes(since), 30, "the restarted prober's first acquire")

    def records(self) -> list[dict[str, Any]]:
        lines = self.out.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def successes(self, since: float, until: float | None = None) -> list[float]:
        until = time.time() if until is None else until
        return [r["t1"] for r in self.records() if r["ok"] and since <= r["t1"] <= until]

    def wait_success(self, timeout: float, what: str) -> float:
        """Wait for an acquire that completes from now on; its completion time. Fails
        at once if the prober has ended, and on a timeout with its last records."""
        now = time.time()

        def check() -> float:
            assert self.proc is not None and self.proc.poll() is None, (
                f"the prober ended (status {self.proc and self.proc.returncode}) "
                f"before {what}: {self.tail()}"
            )
            return (self.successes(now) or [0.0])[-1]

        try:
            return wait_for(check, timeout, what)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; the prober's last tries: {self.tail()}") from None

    def tail(self, count: int = 5) -> str:
        """The prober's last ``count`` records and its stderr's end, for a failure."""
        err = self.out.with_suffix(".err")
        errors = err.read_text(errors="replace")[-1500:] if err.exists() else ""
        return f"{self.records()[-count:]} stderr: {errors!r}"

    def longest_gap(self, since: float, until: float) -> float:
        """The longest time in [since, until] without a successful acquire."""
        times = [since, *self.successes(since, until), until]
        return max(b - a for a, b in itertools.pairwise(times))


def run_in(
    host: Host,
    script: str,
    *,
    env: Mapping[str, str],
    cwd: str,
    binds: Mapping[str, Path] | None = None,
    read_only: Sequence[str] = ("/etc",),
    writable: Sequence[str] = (),
    timeout: float = 60.0,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """``sh -e -c script`` on ``host`` as root; with ``check``, a non-zero exit fails
    the test with the script and its output."""
    done = host.run(
        ["sh", "-e", "-c", script],
        env=env,
        cwd=cwd,
        binds=binds,
        read_only=read_only,
        writable=writable,
        timeout=timeout,
    )
    if check:
        output = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
        assert done.returncode == 0, f"on {host.name}:\n{script}\nexit {done.returncode}\n{output}"
    return done
