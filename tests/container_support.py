"""Containers without a container runtime, for tests/integration/test_deploy_run.py: the image the
Dockerfile builds (its ENV, USER, WORKDIR, VOLUME, ENTRYPOINT, CMD, HEALTHCHECK and
the directories its RUN lines make), and a container of it on a host of
``raftlease.testing.hosts``: the image's directories that this machine lacks are the
container's own (a "layer" folder in the host's tree, with the image's owners and
modes), volumes are folders bound at their targets, ``raftlease`` and ``python`` on
PATH run this checkout, and the rest of / is this machine's, read-only.

What the image build does is not run: the RUN lines are read for the directories
they make (``mkdir -p``, ``chown``, ``chmod``) and the user they add
(``useradd --uid``); ``pip install .`` is the shims.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftlease.testing.hosts import Host

from .deploy_support import accounts, bind_root, write_shim

#: The python image's PATH (its interpreter and the console scripts pip installs are
#: in /usr/local/bin).
IMAGE_PATH = "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Where the image has ``raftlease`` and ``python``: shims of this checkout bound there.
IMAGE_BIN = "/usr/local/bin"


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        word, _, rest = (pending + line).partition(" ")
        pending = ""
        out.append((word.upper(), rest.strip()))
    return out


@dataclass
class Image:
    """What a container of the Dockerfile's image starts with."""

    env: dict[str, str]
    user: str
    workdir: str
    volumes: list[str]
    entrypoint: list[str]
    cmd: list[str]
    healthcheck: list[str]
    #: path -> (uid, gid, mode) of the directories the RUN lines make.
    dirs: dict[str, tuple[int, int, int]]
    #: user or group name -> id, from the RUN lines' groupadd/useradd.
    ids: dict[str, int]
    home: str

    @classmethod
    def parse(cls, dockerfile: Path) -> Image:
        env: dict[str, str] = {"PATH": IMAGE_PATH, "LANG": "C.UTF-8"}
        image = cls(env, "root", "/", [], [], [], [], {}, {"root": 0}, "/root")
        for word, rest in instructions(dockerfile):
            if word == "ENV":
                for assignment in shlex.split(rest):
                    key, _, value = assignment.partition("=")
                    env[key] = value
            elif word == "USER":
                image.user = rest
            elif word == "WORKDIR":
                image.workdir = os.path.join(image.workdir, rest)
                image.dirs.setdefault(image.workdir, (0, 0, 0o755))
            elif word == "VOLUME":
                image.volumes += json.loads(rest)
            elif word in ("ENTRYPOINT", "CMD"):
                setattr(image, word.lower(), json.loads(rest))
            elif word == "HEALTHCHECK":
                image.healthcheck = json.loads(rest.split(" CMD ", 1)[1])
            elif word == "RUN":
                image._run(rest)
        return image

    def _run(self, script: str) -> None:
        """The directories and the user a RUN line makes (not the line itself)."""
        for command in re.split(r"&&|;", script):
            args = shlex.split(command)
            if not args:
                continue
            options = {a: b for a, b in zip(args, [*args[1:], ""], strict=True)}
            if args[0] == "groupadd":
                self.ids[args[-1]] = int(options["--gid"])
            elif args[0] == "useradd":
                self.ids[args[-1]] = int(options["--uid"])
                self.home = options.get("--home-dir", self.home)
            elif args[0] == "mkdir":
                for path in (a for a in args[1:] if not a.startswith("-")):
                    for parent in [*reversed(Path(path).parents[:-1]), Path(path)]:
                        self.dirs.setdefault(str(parent), (0, 0, 0o755))
            elif args[0] == "chown":
                user, _, group = args[1].partition(":")
                for path in args[2:]:
                    self.dirs[path] = (self.ids[user], self.ids[group or user], self.dirs[path][2])
            elif args[:2] == ["rm", "-rf"]:
                for path in args[2:]:
                    for known in [d for d in self.dirs if d == path or d.startswith(path + "/")]:
                        del self.dirs[known]
            elif args[0] == "chmod":
                for path in args[2:]:
                    self.dirs[path] = (*self.dirs[path][:2], int(args[1], 8))

    def uid_gid(self, user: str | None = None) -> tuple[int, int]:
        name, _, group = (user or self.user).partition(":")
        uid = int(name) if name.isdigit() else self.ids[name]
        gid = int(group) if group.isdigit() else self.ids.get(group or name, uid)
        return uid, gid


def make_dir(path: Path, owner: tuple[int, int, int]) -> Path:
    """``path`` as a directory with (uid, gid, mode) ``owner``."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, owner[0], owner[1])
    path.chmod(owner[2])
    return path


def volume_dir(base: Path, name: str, image: Image, target: str) -> Path:
    """A named volume's folder; a new one starts with the owner and mode of the image's
    directory at ``target`` (what Docker copies into an empty volume), else root's."""
    path = base / name
    if not path.exists():
        make_dir(path, image.dirs.get(target, (0, 0, 0o755)))
    return path


@dataclass
class Mount:
    target: str
    source: Path
    read_only: bool = False


@dataclass
class Container:
    """A process of ``image`` on ``host``: ``mounts`` (volumes, bound files) over the
    image's own directories; the rest of / is this machine's, read-only."""

    host: Host
    image: Image
    mounts: list[Mount] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    #: The image's directories are read-only too (Kubernetes' readOnlyRootFilesystem).
    read_only_root: bool = False

    def layer(self) -> dict[str, Path]:
        """The image's directories that this machine lacks, made in the host's tree
        (once) with the image's owners and modes, with mount points for the mounts
        that fall inside them; their outermost ones, by target."""
        top: dict[str, Path] = {}
        for path, owner in sorted(self.image.dirs.items(), key=lambda d: d[0].count("/")):
            if os.path.exists(path):
                continue
            make_dir(self.host.path("/layer" + path), owner)
            root = bind_root(path)
            top[root] = self.host.path("/layer" + root)
        for mount in self.mounts:
            root = bind_root(mount.target)
            if root in top and mount.target != root:
                inside = self.host.path("/layer" + mount.target)
                if mount.source.is_dir():
                    inside.mkdir(parents=True, exist_ok=True)
                elif not inside.exists():
                    inside.parent.mkdir(parents=True, exist_ok=True)
                    inside.touch()
        return top

    def shims(self) -> dict[str, Path]:
        """``raftlease`` and ``python`` of the image: this checkout's (written once per
        host, never while a process of it may be reading them)."""
        bin_dir = self.host.path("/image-bin")
        shims = {"raftlease": "raftlease", "python": None}
        for name, module in shims.items():
            if not (bin_dir / name).exists():
                write_shim(bin_dir / name, module)
        return {f"{IMAGE_BIN}/{name}": bin_dir / name for name in shims}

    def popen_args(self, cwd: str | None = None) -> dict[str, Any]:
        """``Host.popen``'s arguments for a process of this container."""
        uid, gid = self.image.uid_gid(self.user)
        top = self.layer()
        binds: dict[str, Path] = {**top, **self.shims()}
        user_name = next((n for n, i in self.image.ids.items() if i == uid), "raftlease")
        etc = self.host.path("/image-etc")
        if (etc / "passwd").exists():
            binds |= {"/etc/passwd": etc / "passwd", "/etc/group": etc / "group"}
        else:
            binds |= accounts(etc, user_name, uid, self.image.home, "/usr/sbin/nologin")
        for mount in self.mounts:
            binds[mount.target] = mount.source
        read_only = ["/"] + [m.target for m in self.mounts if m.read_only]
        writable = [m.target for m in self.mounts if not m.read_only]
        if not self.read_only_root:
            writable += [t for t in top if t not in read_only]
        env = {**self.image.env, "HOSTNAME": self.host.name, "HOME": self.image.home}
        env |= self.env
        return {
            "uid": uid,
            "gid": gid,
            "env": env,
            "cwd": cwd or self.image.workdir,
            "binds": binds,
            "read_only": read_only,
            "writable": writable,
        }

    def popen(
        self, argv: Sequence[str], log: Path, cwd: str | None = None
    ) -> subprocess.Popen[bytes]:
        return self.host.popen(list(argv), stdout=log, stderr=log, **self.popen_args(cwd))

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess[bytes]:
        return self.host.run(list(argv), timeout=timeout, **self.popen_args())


def expand_k8s(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` in command and args: the container's variable, ``$$`` a
    literal ``$``, an unknown name left as it is."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]),
        value,
    )


def compose_literal(value: str) -> str:
    """A compose file's string after interpolation: ``$$`` is a literal ``$``; this
    file has no ``${VAR}`` (checked)."""
    assert not re.search(r"(?<!\$)\$\{", value), f"interpolation not emulated: {value}"
    return value.replace("$$", "$")


#: kubectl's two commands of the docs' "kubernetes secrets" step: ``create secret
#: generic NAME --from-file=PATH...`` writes the Secret's keys (a folder's regular
#: files, or a file) into $KUBECTL_STORE/secrets/NAME; ``apply -f FILE`` records FILE.
KUBECTL = """
import os, shutil, sys
from pathlib import Path
args = sys.argv[1:]
store = Path(os.environ["KUBECTL_STORE"])
if args[:3] == ["create", "secret", "generic"]:
    out = store / "secrets" / args[3]
    out.mkdir(parents=True)
    for arg in args[4:]:
        if not arg.startswith("--from-file="):
            sys.exit(f"kubectl emulation: {arg} not emulated")
        source = Path(arg.split("=", 1)[1])
        files = sorted(p for p in source.iterdir() if p.is_file()) if source.is_dir() else [source]
        for path in files:
            shutil.copyfile(path, out / path.name)
    print(f"secret/{args[3]} created")
elif args[:2] == ["apply", "-f"] and len(args) == 3 and Path(args[2]).is_file():
    with open(store / "applied", "a") as applied:
        applied.write(args[2] + "\\n")
else:
    sys.exit(f"kubectl emulation: {args} not emulated")
"""


def write_kubectl(path: Path, python: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{python}\n{KUBECTL}")
    path.chmod(0o755)
    return path


#: The kubelet's HTTP probe: GET each URL of argv[1] (a JSON list) without verifying
#: the certificate; prints {url: status code, or the error}.
PROBE = """
import json, ssl, sys, urllib.error, urllib.request
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
out = {}
for url in json.loads(sys.argv[1]):
    try:
        with urllib.request.urlopen(url, timeout=1, context=context) as answer:
            out[url] = answer.status
    except urllib.error.HTTPError as exc:
        out[url] = exc.code
    except Exception as exc:
        out[url] = repr(exc)
print(json.dumps(out))
"""
