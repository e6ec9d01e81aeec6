"""Several "hosts" on one Linux machine, for tests that follow the multi-host
deployment docs step by step, or run the Docker compose and Kubernetes files'
commands and mounts as plain processes (no container runtime): each host is a network
namespace with its own address, file tree, host name and /etc/hosts.

Layout. A dedicated *switch* namespace holds a bridge; each host namespace has an
``eth0`` (one end of a veth pair, the other a port of the bridge) with its address in
a private subnet, and ``lo`` up. Nothing is ever put in the root namespace: an address
there would be reachable from the machine's own processes, and a connect from the root
namespace to a test address would follow the default route off the machine. A host's
only route is its subnet, so nothing a host sends can leave the machine either. The
subnet is private to the switch, so harnesses running at once can share one; the
namespaces' names carry the pid and a per-process counter (``rlh<pid>-<n>-...``); link
names need no such care, as every link is created directly inside its namespace
(``ip link add ... netns A type veth peer ... netns B``) and never exists outside it.

Partitions are silent drops, like a cut cable: a route to the peer through ``sink0``,
one end of a second veth pair inside the host. With ARP off on ``sink0`` the kernel
sends at once, to ``sink0``'s own MAC, which ``sink1`` does not own: dropped. A connect
then times out and established connections stall. ``ip route add blackhole`` would
not do: the kernel answers a local sender at once with EINVAL. (No iptables, nft or tc
classifier is assumed: this machine has none.)

Processes. ``Host.popen`` runs ``ip netns exec NS unshare --mount --uts --propagation
private -- python -I -S hostexec.py CONFIG argv...``. Each of ``ip netns exec``,
``unshare`` (without ``--fork``) and ``hostexec`` *execs* the next, so ``Popen.pid`` is
the program's own pid and a signal sent to it (SIGKILL, SIGSTOP) reaches the program
(the tests check /proc/PID/cmdline). ``hostexec``, the in-namespace half, sets the host
name, makes the bind mounts and read-only mounts in the private mount namespace, drops
to the uid and gid itself (what ``setpriv --reuid --regid --clear-groups`` does) and
execs; its mounts go away with the process. Mount points that do not exist on the
machine (``/etc/raftlease``) are made inside a tmpfs laid over their parent *in that
namespace only*, with the parent's entries bound back (``hostexec.Mounter``): nothing is
ever created in the machine's /etc or /var. A process run as another uid gets the same
treatment, with o+x, for the directories on the way to this Python and the host's tree
that it could not pass (pyenv under a 0700 /root), so ``sys.executable`` runs as any uid.

Requirements: Linux, root, ``ip`` (iproute2) and ``unshare`` (util-linux), and a kernel
with network, mount and UTS namespaces, veth and bridge; ``require()`` says what is
missing. The names and addresses are kept by ``hostnames``. This file is longer than the
house's 600 lines because ``Host`` and ``HostNetwork`` share one lock, one list of
processes and one set of namespaces. Thread-safe (a nemesis thread may partition while
the test's thread starts processes). Every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .hostnames import DEFAULT_SUBNET, HostsTable, hosts_file_text

__all__ = [
    "DEFAULT_READ_ONLY",
    "DEFAULT_SUBNET",
    "Host",
    "HostNetwork",
    "HostsError",
    "HostsTable",
    "HostsUnavailable",
    "chown",
    "hosts_file_text",
    "interpreter_paths",
    "require",
    "untraversable",
]

#: Deadline of one ``ip`` command.
IP_TIMEOUT = 10.0
#: What ``read_only`` is when not given: a host's /etc, as systemd's ProtectSystem
#: leaves it to a service.
DEFAULT_READ_ONLY = ("/etc",)

#: The in-namespace half, run by path (it must not import raftlease: see its docstring).
_HOSTEXEC = Path(__file__).resolve().with_name("hostexec.py")
_counter = itertools.count()

Output = int | IO[Any] | Path | None


class HostsUnavailable(RuntimeError):
    """This machine cannot run hosts: the message names what is missing."""


class HostsError(RuntimeError):
    """An ``ip`` command or a clean-up step failed (the message has its stderr)."""


def require() -> None:
    """Check that hosts can run here (Linux, root, ``ip``, ``unshare``, and that this
    process may create network, mount and UTS namespaces). Blocks for one short
    ``unshare`` probe. Raises ``HostsUnavailable`` naming what is missing."""
    if not sys.platform.startswith("linux"):
        raise HostsUnavailable(f"hosts need Linux network namespaces, not {sys.platform}")
    missing = [tool for tool in ("ip", "unshare") if shutil.which(tool) is None]
    if missing:
        packages = {"ip": "ip (iproute2)", "unshare": "unshare (util-linux)"}
        raise HostsUnavailable("missing: " + ", ".join(packages[t] for t in missing))
    if os.geteuid() != 0:
        raise HostsUnavailable("hosts need root (network namespaces, veth, mounts)")
    probe = [_which("unshare"), "--net", "--mount", "--uts", "--", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=IP_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HostsUnavailable(f"cannot create namespaces: {exc}") from exc
    if done.returncode != 0:
        error = done.stderr.decode(errors="replace").strip()
        raise HostsUnavailable(f"cannot create namespaces (unshare: {error})")


def _which(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise HostsUnavailable(f"missing: {tool}")
    return path


def chown(path: str | Path, uid: int, gid: int | None = None, *, recursive: bool = True) -> None:
    """``chown -R uid:gid path`` (gid defaults to uid), so that a host's process running
    as that uid can use its part of a host's tree. Symlinks are changed, not followed."""
    gid = uid if gid is None else gid
    os.chown(path, uid, gid, follow_symlinks=False)
    if recursive and os.path.isdir(path) and not os.path.islink(path):
        for top, dirs, files in os.walk(path):
            for name in dirs + files:
                os.chown(os.path.join(top, name), uid, gid, follow_symlinks=False)


def untraversable(paths: Iterable[str | Path]) -> list[str]:
    """The directories on the way to ``paths`` (as given and with symlinks resolved)
    that other users may not pass through (no o+x), parents first: what a process
    running as another uid needs made traversable to reach them."""
    found: set[str] = set()
    for given in paths:
        for path in {Path(os.path.abspath(given)), Path(given).resolve()}:
            for directory in path.parents:
                with contextlib.suppress(OSError):
                    if not os.stat(directory).st_mode & stat.S_IXOTH:
                        found.add(str(directory))
    return sorted(found, key=lambda d: (d.count("/"), d))


def interpreter_paths() -> list[Path]:
    """This Python and the raftlease package: what a host's process started with
    ``sys.executable`` must reach."""
    package = Path(__file__).resolve().parents[1]
    return [Path(sys.executable), Path(sys.prefix), Path(sys.base_prefix), package]


@dataclass(eq=False)
class Host:
    """One host: a network namespace (``namespace``) with ``address`` on ``eth0``,
    host name ``name``, and ``root``, a private file tree in the network's base
    directory for the caller to lay out (``path``) and bind into processes."""

    name: str
    address: str
    namespace: str
    root: Path
    network: HostNetwork = field(repr=False)
    #: Every process ``popen`` started here (running or not).
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    def path(self, container_path: str, *, make: bool = False, mode: int = 0o755) -> Path:
        """Where ``container_path`` (``/etc/raftlease``) lives in this host's tree
        (``root/etc/raftlease``); ``make`` creates it as a directory."""
        path = self.root / container_path.lstrip("/")
        if make:
            path.mkdir(parents=True, exist_ok=True, mode=mode)
        return path

    def popen(
        self,
        argv: Sequence[str],
        *,
        uid: int | None = None,
        gid: int | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: Output = subprocess.DEVNULL,
        stdout: Output = None,
        stderr: Output = None,
        binds: Mapping[str, str | Path] | None = None,
        read_only: Sequence[str] = DEFAULT_READ_ONLY,
        writable: Sequence[str] = (),
        hosts_file: bool = True,
        traverse: Sequence[str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` on this host; returns at once (does not wait for it to run).

        ``uid``/``gid`` (gid defaults to uid): run as them, with no supplementary
        groups and no capability; no passwd entry is needed. ``env`` replaces the
        environment (default: this process's), and HOME becomes ``root/home/<uid>``
        (made, owned by the uid) unless ``env`` sets it. ``cwd`` is a path as the
        program sees it (after the mounts, as the uid); by default the program
        inherits this process's, where ``python -c``/``-m`` find packages first (set
        PYTHONPATH to run a checkout's raftlease elsewhere). ``stdout``/``stderr``: as for
        ``Popen``, or a ``Path`` opened for appending. ``binds`` maps a path inside
        the host (``/etc/raftlease/node.toml``) to a file or directory of the machine
        that is mounted there (nested targets are mounted parents first); missing
        mount points are made in a tmpfs, never on the machine. ``read_only`` paths
        (with every mount under them, binds included) are read-only in the process,
        so writes there fail with EROFS, except under ``writable`` paths (systemd's
        ReadOnlyPaths= and ReadWritePaths=; the innermost path decides; /dev, /proc
        and /sys stay writable unless listed). ProtectSystem=strict with a
        StateDirectory is ``read_only=["/"], writable=["/var/lib/raftlease"]``; a
        Docker ``:ro`` volume is its target in ``read_only``.
        ``hosts_file``: /etc/hosts is the network's (read-only, every host's name).
        ``traverse``: directories every uid may pass through in the process (a tmpfs
        copy with o+x); by default, for a non-root uid, those on the way to this
        Python, raftlease and the host's tree (HOME) that it could not (pyenv under
        a 0700 /root, pytest's 0700 temp dirs).

        ``Popen.pid`` is the program's pid from the moment it is known (the wrappers
        exec rather than fork), so ``os.kill(proc.pid, SIGKILL)`` kills the program.
        A setup failure exits 125 with ``raftlease.testing.hostexec: ...`` on stderr;
        a program that cannot be run exits 127. The process is killed by
        ``HostNetwork.close`` if still alive. Raises ``HostsError`` if the host's
        network is closed."""
        net = self.network
        if gid is None and uid is not None:
            gid = uid
        environment = dict(os.environ if env is None else env)
        if uid not in (None, 0) and (env is None or "HOME" not in env):
            home = self.path(f"/home/{uid}", make=True, mode=0o700)
            chown(home, uid, gid, recursive=False)
            environment["HOME"] = str(home)
        mounts: dict[str, str] = {}
        ro = [os.path.normpath(p) for p in read_only]
        rw = [os.path.normpath(p) for p in writable]
        if hosts_file:
            mounts["/etc/hosts"] = str(net.hosts_path)
            ro.append("/etc/hosts")  # shared by every host: nobody may write it
        for path in ro + rw:
            if not os.path.isabs(path):
                raise ValueError(f"{path!r} must be an absolute path")
        if set(ro) & set(rw):
            raise ValueError(f"both read-only and writable: {sorted(set(ro) & set(rw))}")
        for target, source in (binds or {}).items():
            if not os.path.isabs(target) or os.path.normpath(target) == "/":
                raise ValueError(f"bind target {target!r} must be an absolute path, not /")
            mounts[os.path.normpath(target)] = str(Path(source).resolve())
        ordered = sorted(mounts.items(), key=lambda item: (item[0].count("/"), item[0]))
        if traverse is None:
            reach = [*interpreter_paths(), self.root]
            traverse = untraversable(reach) if uid not in (None, 0) else []
        config = {
            "hostname": self.name,
            "traverse": sorted(
                {os.path.normpath(d) for d in traverse}, key=lambda d: (d.count("/"), d)
            ),
            "binds": ordered,
            "read_only": sorted(set(ro)),
            "writable": sorted(set(rw)),
            "stage": str(net.stage_dir),
            "uid": uid,
            "gid": gid,
            "cwd": cwd,
        }
        command = [
            *net.exec_prefix(self.namespace),
            sys.executable,
            "-I",
            "-S",
            str(_HOSTEXEC),
            json.dumps(config),
            *argv,
        ]
        with contextlib.ExitStack() as opened, net._lock:
            if net.closed:
                raise HostsError(f"the network of host {self.name} is closed")
            streams = [
                opened.enter_context(open(s, "rb" if s is stdin else "ab"))
                if isinstance(s, Path)
                else s
                for s in (stdin, stdout, stderr)
            ]
            proc = subprocess.Popen(
                command, stdin=streams[0], stdout=streams[1], stderr=streams[2], env=environment
            )
            net.procs.append(proc)
            self.procs.append(proc)
        return proc

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 30.0,
        input: bytes | None = None,
        check: bool = False,
        uid: int | None = None,
        gid: int | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdout: Output = subprocess.PIPE,
        stderr: Output = subprocess.PIPE,
        binds: Mapping[str, str | Path] | None = None,
        read_only: Sequence[str] = DEFAULT_READ_ONLY,
        writable: Sequence[str] = (),
        hosts_file: bool = True,
        traverse: Sequence[str] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """``popen`` and wait: returns the exit code and (by default) the captured
        output. Blocks up to ``timeout`` s, then kills the program and raises
        ``subprocess.TimeoutExpired``; ``check`` raises ``CalledProcessError`` on a
        non-zero exit."""
        proc = self.popen(
            argv,
            uid=uid,
            gid=gid,
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            binds=binds,
            read_only=read_only,
            writable=writable,
            hosts_file=hosts_file,
            traverse=traverse,
        )
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=IP_TIMEOUT)
            raise
        done = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
        if check:
            done.check_returncode()
        return done

    def pids(self) -> list[int]:
        """Every process now in this host's network namespace (those started here and
        their children). Blocks for one ``ip netns pids``."""
        return self.network.namespace_pids(self.namespace)

    def kill_all(self, sig: int = signal.SIGKILL, timeout: float = 10.0) -> list[int]:
        """Send ``sig`` to every process on this host: those in its namespace and
        those ``popen`` started that are still on their way in. With SIGKILL (a host
        losing power), wait until none is left; connects to the host are then
        refused, so ``isolate`` it too for a machine that is off. Returns the pids
        signalled. Raises ``TimeoutError`` if processes remain after ``timeout`` s."""
        return self.network.kill_namespace(self.namespace, sig, timeout, self.procs)


class HostNetwork:
    """A switch and the hosts on it. ``base_dir`` (a temp dir of the caller's) holds
    the hosts' trees (``base_dir/<name>``), the shared hosts file and the mount stage.
    Use as a context manager, or call ``start`` and ``close``. Nothing privileged
    happens before ``start`` (``add_host`` starts the network if needed)."""

    def __init__(self, base_dir: str | Path, *, subnet: str = DEFAULT_SUBNET) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.table = HostsTable(subnet)
        self.prefix = f"rlh{os.getpid()}-{next(_counter)}"
        self.hosts: dict[str, Host] = {}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.namespaces: list[str] = []  # created, switch first
        self.cuts: set[frozenset[str]] = set()
        self.isolated: set[str] = set()
        self.started = False
        self.closed = False
        self._files: list[Path] = []
        self._next_index = 0
        # Nemesis threads partition while the test's thread starts processes.
        self._lock = threading.RLock()

    # ----------------------------------------------------------------- names

    @property
    def switch_namespace(self) -> str:
        return f"{self.prefix}-switch"

    def namespace_for(self, index: int, name: str) -> str:
        return f"{self.prefix}-{index}-{name}"

    @staticmethod
    def port_name(index: int) -> str:
        """The switch's side of host ``index``'s veth (within the switch namespace)."""
        return f"port{index}"

    @property
    def hosts_path(self) -> Path:
        return self.base_dir / f".{self.prefix}-hosts"

    @property
    def stage_dir(self) -> Path:
        return self.base_dir / f".{self.prefix}-stage"

    def hosts_text(self) -> str:
        """The /etc/hosts every host sees."""
        return self.table.text()

    # ------------------------------------------------------------- lifecycle

    def start(self) -> HostNetwork:
        """Create the switch namespace and its bridge. Raises ``HostsUnavailable``
        when this machine cannot (``require``), ``HostsError`` if a step fails."""
        if self.closed:
            raise HostsError("this network is closed")
        if self.started:
            return self
        require()
        # Names are unique among live processes; a leftover of a crashed run with a
        # recycled pid would still clash, so skip past any that exist.
        existing = set(self._ip("netns", "list").split())
        while any(n.startswith(self.prefix + "-") for n in existing):
            self.prefix = f"rlh{os.getpid()}-{next(_counter)}"
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.started = True
        self._netns_add(self.switch_namespace)
        try:
            self._ip_batch(
                self.switch_namespace,
                ["link set lo up", "link add br0 type bridge", "link set br0 up"],
            )
        except HostsError as exc:
            raise HostsUnavailable(f"cannot make the switch's bridge: {exc}") from exc
        self.stage_dir.mkdir(mode=0o700)
        self._files.append(self.stage_dir)
        self.hosts_path.write_text(self.table.text())
        self._files.append(self.hosts_path)
        return self

    def add_host(self, name: str, address: str | None = None, aliases: Sequence[str] = ()) -> Host:
        """Add host ``name`` at ``address`` (default: the next free one), with extra
        names for it in every host's /etc/hosts (``n1``, ``raftlease-0.raftlease``).
        It is cut off from every ``isolate``d host. Blocks for a few ``ip`` commands.
        Raises ``ValueError`` for a taken name or address."""
        with self._lock:
            self.start()
            address = self.table.check(name, address, aliases)  # before anything is made
            host = self._make_host(name, address)
            table_before = len(self.table.entries)
            self.table.add(name, address, aliases)
            self.hosts[name] = host
            self._append_hosts(self.table.entries[table_before:])
            for other in sorted(self.isolated):
                self._cut(other, name)
            return host

    def _make_host(self, name: str, address: str) -> Host:
        index = self._next_index  # never reused, even after a failed attempt
        self._next_index += 1
        namespace = self.namespace_for(index, name)
        self._netns_add(namespace)
        port = self.port_name(index)
        self._ip(
            "link", "add", "eth0", "netns", namespace, "type", "veth",
            "peer", "name", port, "netns", self.switch_namespace,
        )  # fmt: skip
        self._ip_batch(self.switch_namespace, [f"link set {port} master br0 up"])
        prefix_len = self.table.subnet.prefixlen
        self._ip_batch(
            namespace,
            [
                "link set lo up",
                f"addr add {address}/{prefix_len} dev eth0",
                "link set eth0 up",
                # The partition sink: routes to a cut-off peer go out sink0 and vanish.
                "link add sink0 type veth peer name sink1",
                "link set sink0 arp off up",
                "link set sink1 up",
            ],
        )
        root = self.base_dir / name
        root.mkdir(exist_ok=True)
        return Host(name, address, namespace, root, self)

    def remove_host(self, name: str, timeout: float = 10.0) -> None:
        """Take host ``name`` off the network, as a pod deleted or a machine unplugged:
        every process on it is killed (SIGKILL), its partitions and isolation are
        undone, its namespace (with its links) is deleted, and its name and aliases
        stop resolving (its hosts-file lines are commented out in place, one byte
        each, so running processes see the change). Its tree (``root``) stays: a
        later ``add_host`` with the same name, at any address, uses it again (a pod
        back with its volume at a new IP). Raises ``KeyError`` for an unknown host,
        ``TimeoutError`` if its processes do not die within ``timeout`` s."""
        with self._lock:
            host = self.hosts[name]
            self.kill_namespace(host.namespace, signal.SIGKILL, timeout, host.procs)
            for pair in [p for p in self.cuts if name in p]:
                (other,) = pair - {name}  # its own routes go with its namespace
                self._ip("-n", self.hosts[other].namespace, "route", "del", f"{host.address}/32")
                self.cuts.discard(pair)
            self.isolated.discard(name)
            self._ip("netns", "del", host.namespace)
            self.namespaces.remove(host.namespace)
            del self.hosts[name]
            offsets = [self.table.offset(i) for i in self.table.remove(name)]
            fd = os.open(self.hosts_path, os.O_WRONLY)
            try:
                for offset in offsets:
                    os.pwrite(fd, b"#", offset)
            finally:
                os.close(fd)

    def add_alias(self, name: str, *aliases: str) -> None:
        """More names for host ``name`` in every host's /etc/hosts, running processes'
        included (the file is extended in place, never replaced)."""
        with self._lock:
            entry = self.table.alias(name, aliases)
            self._append_hosts([entry])

    def host(self, name: str) -> Host:
        return self.hosts[name]

    # ------------------------------------------------------------ partitions

    def partition(self, a: str, b: str) -> None:
        """Cut hosts ``a`` and ``b`` off from each other, both ways, silently (a
        connect times out; packets in flight are lost). Idempotent."""
        with self._lock:
            self._cut(a, b)

    def heal(self, a: str, b: str) -> None:
        """Undo ``partition(a, b)`` (and, for that pair, ``isolate``). Idempotent."""
        with self._lock:
            pair = self._pair(a, b)
            self.isolated.difference_update(pair)
            if pair in self.cuts:
                for near, far in ((a, b), (b, a)):
                    address = self.hosts[far].address
                    self._ip("-n", self.hosts[near].namespace, "route", "del", f"{address}/32")
                self.cuts.discard(pair)

    def isolate(self, name: str) -> None:
        """Cut host ``name`` off from every other host, hosts added later included,
        until ``heal_all`` (or ``heal`` of a pair)."""
        with self._lock:
            self.host(name)
            self.isolated.add(name)
            for other in self.hosts:
                if other != name:
                    self._cut(name, other)

    def heal_all(self) -> None:
        """Undo every partition and isolation."""
        with self._lock:
            for pair in sorted(self.cuts, key=sorted):
                self.heal(*sorted(pair))
            self.isolated.clear()

    def _pair(self, a: str, b: str) -> frozenset[str]:
        for name in (a, b):
            self.host(name)  # KeyError for an unknown host
        if a == b:
            raise ValueError(f"cannot partition {a} from itself")
        return frozenset((a, b))

    def _cut(self, a: str, b: str) -> None:
        pair = self._pair(a, b)
        if pair in self.cuts:
            return
        for near, far in ((a, b), (b, a)):
            namespace, address = self.hosts[near].namespace, self.hosts[far].address
            self._ip("-n", namespace, "route", "replace", f"{address}/32", "dev", "sink0")
        self.cuts.add(pair)

    # -------------------------------------------------------------- clean-up

    def namespace_pids(self, namespace: str) -> list[int]:
        return [int(p) for p in self._ip("netns", "pids", namespace).split()]

    def kill_namespace(
        self,
        namespace: str,
        sig: int,
        timeout: float,
        procs: Sequence[subprocess.Popen[bytes]] = (),
    ) -> list[int]:
        """Signal every process in ``namespace`` and every live one of ``procs``
        (which may not have entered it yet); with SIGKILL, wait (up to ``timeout``
        s, reaping our own children) until none is left."""
        with self._lock:
            pids = self.namespace_pids(namespace)
            pids += [p.pid for p in procs if p.poll() is None and p.pid not in pids]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            if sig == signal.SIGKILL:
                deadline = time.monotonic() + timeout
                while True:
                    for proc in self.procs:
                        proc.poll()  # reap, so that none lingers as our zombie
                    left = self.namespace_pids(namespace)
                    left += [p.pid for p in procs if p.returncode is None]
                    if not left:
                        break
                    if time.monotonic() >= deadline:
                        raise TimeoutError(
                            f"processes {left} still in {namespace} after {timeout} s"
                        )
                    time.sleep(0.02)
            return pids

    def close(self, timeout: float = 10.0) -> None:
        """Kill every process still running on the hosts (SIGKILL: the ones started
        here and their children), delete every namespace (with its links and routes)
        and the harness's own files (the hosts' trees stay, for inspection). Runs
        every step even if one fails, then raises ``HostsError`` naming what could
        not be cleaned. Idempotent; blocks up to about ``timeout`` s per host."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            problems: list[str] = []
            for namespace in reversed(self.namespaces):
                try:
                    self.kill_namespace(namespace, signal.SIGKILL, timeout)
                except (HostsError, TimeoutError) as exc:
                    problems.append(str(exc))
            for proc in self.procs:
                if proc.poll() is None:  # not in a namespace any more: only if it got out
                    proc.kill()
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    problems.append(f"process {proc.pid} did not exit")
            for namespace in reversed(self.namespaces):
                try:
                    self._ip("netns", "del", namespace)
                except HostsError as exc:
                    problems.append(str(exc))
            self.namespaces.clear()
            for path in self._files:
                with contextlib.suppress(FileNotFoundError):
                    if path.is_dir():
                        path.rmdir()  # the stage is only ever mounted on, never written
                    else:
                        path.unlink()
            if problems:
                raise HostsError("clean-up incomplete: " + "; ".join(problems))

    def __enter__(self) -> HostNetwork:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ internals

    def exec_prefix(self, namespace: str) -> list[str]:
        """The command that runs what follows it in ``namespace`` and a fresh private
        mount and UTS namespace (each part execs the next: no extra process)."""
        return [
            _which("ip"), "netns", "exec", namespace,
            _which("unshare"), "--mount", "--uts", "--propagation", "private", "--",
        ]  # fmt: skip

    def _append_hosts(self, entries: Sequence[tuple[str, Sequence[str]]]) -> None:
        # One O_APPEND write of whole lines: a process reading the file (it is bind
        # mounted, so it must stay the same inode) sees the old lines or the new.
        data = "".join(self.table.line_for(entry) for entry in entries).encode()
        fd = os.open(self.hosts_path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def _netns_add(self, namespace: str) -> None:
        self._ip("netns", "add", namespace)
        self.namespaces.append(namespace)

    def _ip(self, *args: str) -> str:
        return self._run_ip(list(args))

    def _ip_batch(self, namespace: str, lines: Sequence[str]) -> None:
        self._run_ip(["-n", namespace, "-batch", "-"], "\n".join(lines) + "\n")

    def _run_ip(self, args: list[str], input: str | None = None) -> str:
        command = [_which("ip"), *args]
        try:
            done = subprocess.run(
                command, input=input, capture_output=True, text=True, timeout=IP_TIMEOUT
            )
        except subprocess.TimeoutExpired as exc:
            raise HostsError(f"{' '.join(command)}: no answer in {IP_TIMEOUT} s") from exc
        if done.returncode != 0:
            raise HostsError(f"{' '.join(command)}: {done.stderr.strip()}")
        return done.stdout
