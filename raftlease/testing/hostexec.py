"""The in-namespace half of ``raftlease.testing.hosts``: run as root inside a host's
network namespace and a fresh private mount (and UTS) namespace, it sets the host name,
makes the directories, bind mounts and read-only mounts ``Host.popen`` asked for, drops
to the requested uid and gid, changes directory and *execs* the program, so that the
program keeps this process's pid (the pid ``Host.popen`` returned).

Run as ``python -I -S hostexec.py CONFIG_JSON PROGRAM [ARGS...]``; it imports nothing but
the stdlib (``-I -S``: no site packages, no environment variables, so the program's
``PYTHONPATH`` and friends do not change how this runs). Mounts use ``mount(2)`` through
ctypes rather than ``mount(8)``: a host with a few dozen bind mounts would otherwise
fork a ``mount`` per mount on every start. Every failure is written to stderr as
``raftlease.testing.hostexec: <what failed>`` and exits ``SETUP_FAILED`` (125, as
``docker run`` does for its own errors) before the program runs; a program that cannot
be executed exits 127.

Nothing here can outlive the process: every mount lives in the process's private mount
namespace and goes away with it (``ip netns exec`` already made ``/`` a slave mount,
``unshare --propagation private`` then cut propagation both ways).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any, NoReturn

# <sys/mount.h>
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_RELATIME = 1 << 21
MNT_DETACH = 2

#: statvfs ``f_flag`` bits -> the mount flags a remount must repeat to keep them (a
#: bind remount sets the per-mount flags to exactly the ones given).
KEPT_FLAGS = {
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME,
    os.ST_RELATIME: MS_RELATIME,
}

#: Kernel API file systems stay writable under a read-only ``/`` unless listed
#: themselves, as with systemd's ProtectSystem=strict.
API_TREES = ("/dev", "/proc", "/sys")

SETUP_FAILED = 125
NOT_EXECUTABLE = 127

_libc = ctypes.CDLL(None, use_errno=True)


def fail(message: str, code: int = SETUP_FAILED) -> NoReturn:
    sys.stderr.write(f"raftlease.testing.hostexec: {message}\n")
    sys.stderr.flush()
    os._exit(code)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    result = _libc.mount(
        source.encode() if source is not None else None,
        target.encode(),
        fstype.encode() if fstype is not None else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if result != 0:
        err = ctypes.get_errno()
        fail(f"mount {source} on {target} ({fstype}, flags {flags:#x}): {os.strerror(err)}")


def umount_detach(target: str) -> None:
    if _libc.umount2(target.encode(), MNT_DETACH) != 0:
        fail(f"umount {target}: {os.strerror(ctypes.get_errno())}")


def under(path: str, top: str) -> bool:
    """True if ``path`` is ``top`` or inside it (both normalized, absolute)."""
    return path == top or top == "/" or path.startswith(top + "/")


def mount_points() -> list[str]:
    """This mount namespace's mount points, in mount order (``/proc/self/mountinfo``,
    field 5, octal escapes undone)."""
    points = []
    with open("/proc/self/mountinfo", "rb") as info:
        for line in info:
            raw = line.split(b" ")[4]
            points.append(raw.decode("unicode_escape").encode("latin-1").decode())
    return points


class Mounter:
    """Makes bind targets exist without touching the real file tree: a missing mount
    point is created inside a tmpfs laid over its deepest existing ancestor, on which
    every entry of the original directory is bind-mounted back (directories
    recursively, symlinks copied), so the directory looks the same plus the new path.
    The originals are reached through a recursive bind at ``stage`` (a directory of the
    harness's, covered by a tmpfs first so that nothing is created in it)."""

    def __init__(self, stage: str) -> None:
        mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700")
        # From here on the stage is reached through this descriptor: a later mask may
        # cover the stage's path itself (pytest's temp dir under a masked /tmp/...).
        self.stage_fd = os.open(stage, os.O_PATH | os.O_DIRECTORY)
        self.stage = f"/proc/self/fd/{self.stage_fd}"
        self.masks = 0
        # Directories created on one of our tmpfs masks, where new paths can be made.
        self.made: set[str] = set()
        self.bound: set[str] = set()

    def ensure(self, target: str, is_dir: bool) -> None:
        if os.path.lexists(target):
            return
        ancestor = os.path.dirname(target)
        while not os.path.lexists(ancestor):
            ancestor = os.path.dirname(ancestor)
        if ancestor not in self.made or ancestor in self.bound:
            self.mask(ancestor)
        parent = os.path.dirname(target)
        missing = []
        while parent != ancestor:
            missing.append(parent)
            parent = os.path.dirname(parent)
        for directory in reversed(missing):
            os.mkdir(directory, 0o755)
            self.made.add(directory)
        if is_dir:
            os.mkdir(target, 0o755)
            self.made.add(target)
        else:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))

    def mask(self, directory: str, more_mode: int = 0) -> None:
        """Lay the tmpfs over ``directory`` (with its mode, plus ``more_mode``) and bind
        its entries back."""
        if directory == "/":
            fail("refusing to lay a tmpfs over / (a bind target's top directory is missing)")
        if not os.path.isdir(directory) or os.path.islink(directory):
            fail(f"cannot create a mount point under {directory}: not a directory")
        original = os.path.join(self.stage, str(self.masks))
        self.masks += 1
        os.mkdir(original, 0o700)
        mount(directory, original, None, MS_BIND | MS_REC)
        info = os.stat(directory)
        flags = MS_NOSUID | MS_NODEV
        mode = f"mode={(info.st_mode | more_mode) & 0o7777:o},uid={info.st_uid},gid={info.st_gid}"
        mount("tmpfs", directory, "tmpfs", flags, mode)
        self.made.add(directory)
        self.bound.discard(directory)
        with os.scandir(original) as entries:
            for entry in entries:
                path = os.path.join(directory, entry.name)
                if entry.is_symlink():
                    os.symlink(os.readlink(entry.path), path)
                elif entry.is_dir(follow_symlinks=False):
                    os.mkdir(path, 0o755)
                    mount(entry.path, path, None, MS_BIND | MS_REC)
                else:
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                    mount(entry.path, path, None, MS_BIND)

    def traverse(self, directory: str) -> None:
        """Let every uid pass through ``directory`` (o+x, g+x; not list it)."""
        self.mask(directory, 0o011)

    def bind(self, target: str, source: str) -> None:
        if not os.path.exists(source):
            fail(f"bind source {source} (for {target}) does not exist")
        self.ensure(target, os.path.isdir(source))
        mount(source, target, None, MS_BIND | MS_REC)
        self.bound.add(target)

    def close(self) -> None:
        # The bind mounts made from the staged originals are mounts of their own: the
        # stage can go, and must, so that the program does not see the originals.
        umount_detach(self.stage)
        os.close(self.stage_fd)


def make_read_only(read_only: list[str], writable: list[str]) -> None:
    """Every mount at or under a ``read_only`` path becomes read-only (bind mounts
    included), except at or under a ``writable`` path or an API tree; the innermost
    of these paths that contains a mount decides (systemd's ReadOnlyPaths= and
    ReadWritePaths=). Each of these paths that is not a mount point becomes one (a
    bind onto itself), to carry its own flag."""
    points = set(mount_points())
    rules = {path: False for path in API_TREES}
    rules.update({path: False for path in writable})
    rules.update({path: True for path in read_only})
    for path in sorted(rules, key=lambda p: (p.count("/"), p)):
        governed = rules[path] or any(under(path, top) for top in read_only)
        # "/" always is a mount point (and a bind over "/" would not be seen).
        if governed and path not in points and path != "/" and os.path.exists(path):
            mount(path, path, None, MS_BIND | MS_REC)
    for point in dict.fromkeys(mount_points()):
        governing = [rule for rule in rules if under(point, rule)]
        if not governing or not rules[max(governing, key=len)]:
            continue
        try:
            kept = os.statvfs(point).f_flag
        except OSError:
            continue  # hidden under a later mount: its flags do not matter
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        flags |= sum(ms for st, ms in KEPT_FLAGS.items() if kept & st)
        mount(None, point, None, flags)


def drop_privileges(uid: int | None, gid: int | None) -> None:
    """setpriv --regid G --reuid U --clear-groups: real, effective and saved ids, so the
    program keeps no capability (the kernel clears them on leaving uid 0)."""
    if gid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
    if uid is not None:
        os.setresuid(uid, uid, uid)


def main(args: list[str]) -> NoReturn:
    if len(args) < 2:
        fail("usage: hostexec.py CONFIG_JSON PROGRAM [ARGS...]")
    config: dict[str, Any] = json.loads(args[0])
    argv = args[1:]
    hostname = config.get("hostname")
    if hostname:
        name = hostname.encode()
        if _libc.sethostname(name, len(name)) != 0:
            fail(f"sethostname {hostname}: {os.strerror(ctypes.get_errno())}")
    binds: list[list[str]] = config.get("binds", [])
    read_only: list[str] = config.get("read_only", [])
    writable: list[str] = config.get("writable", [])
    traverse: list[str] = config.get("traverse", [])
    if binds or read_only or traverse:
        mounter = Mounter(config["stage"])
        for directory in traverse:
            mounter.traverse(directory)
        for target, source in binds:
            mounter.bind(target, source)
        mounter.close()
        make_read_only(read_only, writable)
    drop_privileges(config.get("uid"), config.get("gid"))
    cwd = config.get("cwd")
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as exc:
            fail(f"chdir {cwd}: {exc}")
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        fail(f"exec {argv[0]}: {exc}", NOT_EXECUTABLE)


if __name__ == "__main__":
    main(sys.argv[1:])
