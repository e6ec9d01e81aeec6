"""Backups: the snapshot file, taking one on the leader, reading one offline from a
stopped node's files, and seeding a new cluster's data directories from one
(docs/disaster-recovery.md).

The snapshot file::

    raftlease-snapshot\\n
    {"format": 1, "index": ..., "body_sha256": ..., ...}\\n   (the header: one JSON line)
    <body: msgpack of LeaseStore.to_plain(), body_bytes long>

The header says where the state comes from (log index and term, revision, token
ceiling, creation time, source node) and carries the SHA-256 of the body; a reader
refuses a body whose checksum differs, a newer file format, and a newer state layout.

Taking one on the leader (``SnapshotExports``): a barrier entry through the log (so the
state holds every write acknowledged before the request), then a fork from PySyncObj's
tick thread between two applied entries (the child writes the state to a file in the
data directory from its copy-on-write view and exits, as PySyncObj's own dumps do), so
the tick thread stops only for the fork and the event loop not at all; then the client
reads the file in chunks below the frame limit.

Blocking file I/O in the module functions: call them from a CLI, or from the event
loop through an executor (``SnapshotExports`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from .._version import __version__
from ..config import NodeConfig
from ..core import SNAPSHOT_VERSION, LeaseStore
from ..core.snapshot import for_new_cluster
from ..errors import InvalidArgumentError, UnavailableError
from ..limits import TOKEN_RESERVE_STEP
from ..replication.backup import (
    RAFT_STATE_FILES,
    BackupError,
    raft_state_present,
    read_data_dir,
    write_seed_dump,
)
from ..replication.durable import fsync_path
from ..replication.snapshot_rows import pack_snapshot

log = logging.getLogger("raftlease.server")

MAGIC = b"raftlease-snapshot\n"
#: The snapshot file's format; a reader refuses a newer one.
FORMAT = 1
#: Longest header line a reader accepts.
MAX_HEADER = 64 * 1024
#: Default distance of the restored cluster's first fencing token above the saved
#: ceiling: 256 reserve steps, room for 256 leader changes or reserves of the old
#: cluster after the snapshot (docs/disaster-recovery.md, "Fencing tokens").
DEFAULT_TOKEN_JUMP = 256 * TOKEN_RESERVE_STEP
#: Bytes of the body in one answer of the ``snapshot`` operation: far below the
#: smallest frame limit a node accepts (config ``max_frame`` >= 1024 is checked; the
#: client's is 1 MiB), so a chunk frame always fits.
CHUNK_BYTES = 256 * 1024
#: An export not read for this long is dropped (its file removed).
EXPORT_IDLE = 120.0


class SnapshotError(Exception):
    """A snapshot file, or a restore target, that must be refused (the message says why)."""


# ------------------------------------------------------------- the file


def make_header(
    body: bytes, index: int, term: int, *, source: str, node: str, created: float | None = None
) -> dict[str, Any]:
    """The header for ``body`` (msgpack of ``to_plain()``). Decodes the body once to
    take its revision, ceiling and sizes (raises ``SnapshotError`` if it does not load)."""
    plain = _unpack(body)
    store = _load(plain)
    when = time.time() if created is None else created
    return {
        "format": FORMAT,
        "layout": plain.get("v"),
        "cluster_id": None,  # clusters have no id yet; kept for the format
        "index": index,
        "term": term,
        "revision": store.revision,
        "ceiling": store.ceiling,
        "token_headroom": store.token_headroom(),
        "log_time_ms": store.now,
        "leases": len(store.leases),
        "lease_sessions": len(store.lease_sessions),
        "waiters": len(store.waiting),
        "created": when,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)),
        "source": source,
        "node": node,
        "raftlease_version": __version__,
        "body_bytes": len(body),
        "body_sha256": hashlib.sha256(body).hexdigest(),
    }


def write_snapshot(path: Path, header: dict[str, Any], body: bytes) -> None:
    """Write the snapshot file atomically: a temporary file beside ``path``, fsync,
    rename, fsync of the directory. Raises ``OSError``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    line = json.dumps(header, sort_keys=True).encode() + b"\n"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC)
            f.write(line)
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.resolve().parent, directory=True)


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header of a snapshot file and the offset of its body. Raises
    ``SnapshotError`` (not a snapshot, newer format) or ``OSError``."""
    with open(path, "rb") as f:
        magic = f.read(len(MAGIC))
        if magic != MAGIC:
            raise SnapshotError(
                f"{path} is not a raftlease snapshot (it does not start with {MAGIC!r})"
            )
        line = f.readline(MAX_HEADER + 1)
    if not line.endswith(b"\n"):
        raise SnapshotError(
            f"{path}: the header line is cut short or longer than {MAX_HEADER} bytes"
        )
    try:
        header = json.loads(line)
    except ValueError as exc:
        raise SnapshotError(f"{path}: the header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise SnapshotError(f"{path}: the header is not a JSON object")
    fmt = header.get("format")
    if not isinstance(fmt, int) or isinstance(fmt, bool):
        raise SnapshotError(f"{path}: the header has no format number")
    if fmt > FORMAT:
        raise SnapshotError(
            f"{path} has snapshot format {fmt}, newer than this raftlease {__version__} "
            f"understands ({FORMAT}); restore it with the version that wrote it "
            f"({header.get('raftlease_version')}) or newer"
        )
    layout = header.get("layout")
    if isinstance(layout, int) and layout > SNAPSHOT_VERSION:
        raise SnapshotError(
            f"{path} holds state layout {layout}, newer than this raftlease understands "
            f"({SNAPSHOT_VERSION}); use raftlease {header.get('raftlease_version')} or newer"
        )
    for name in ("index", "term", "body_bytes"):
        value = header.get(name)
        # Bounded as the log's own numbers are (a 64-bit journal field; a larger index
        # restored would make every later write fail in the node).
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**62:
            raise SnapshotError(
                f"{path}: header field {name!r} must be an integer from 0 to 2**62 - 1"
            )
    if not isinstance(header.get("body_sha256"), str):
        raise SnapshotError(f"{path}: the header has no body_sha256")
    return header, len(MAGIC) + len(line)


def read_snapshot(path: Path) -> tuple[dict[str, Any], bytes]:
    """Header and verified body of a snapshot file. Raises ``SnapshotError`` (bad
    checksum, wrong length, newer format, not a snapshot) or ``OSError``."""
    header, offset = read_header(path)
    with open(path, "rb") as f:
        f.seek(offset)
        body = f.read()
    if len(body) != header["body_bytes"]:
        raise SnapshotError(
            f"{path}: the body is {len(body)} bytes, the header says {header['body_bytes']} "
            "(truncated or appended to)"
        )
    digest = hashlib.sha256(body).hexdigest()
    if digest != header["body_sha256"]:
        raise SnapshotError(
            f"{path}: checksum mismatch: the body's SHA-256 is {digest}, the header says "
            f"{header['body_sha256']}; the file is damaged: do not restore it"
        )
    return header, body


def _unpack(body: bytes) -> dict[str, Any]:
    try:
        plain = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:
        raise SnapshotError(f"the snapshot body is not msgpack ({type(exc).__name__})") from None
    if not isinstance(plain, dict):
        raise SnapshotError("the snapshot body is not a map")
    return plain


def _load(plain: dict[str, Any]) -> LeaseStore:
    try:
        return LeaseStore.from_plain(plain)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise SnapshotError(f"the snapshot state does not load: {exc}") from None


# -------------------------------------------------------- offline save


def save_from_data_dir(
    data_dir: Path,
    out: Path,
    *,
    committed_only: bool = False,
    node: str = "",
    crashed: bool = False,
) -> dict[str, Any]:
    """Write a snapshot of a STOPPED node's state, rebuilt from its dump and journal
    (``replication.backup.read_data_dir``; reads only). Returns the header.

    A node's ``running`` marker means it runs, or died without a clean stop: refused
    unless ``crashed`` (the operator says the process is gone; a torn journal tail is
    then cut as the node itself would at start). Raises ``SnapshotError`` (not a
    node's data, a running node) or ``OSError``."""
    data_dir = Path(data_dir)
    if (data_dir / "running").exists() and not crashed:
        raise SnapshotError(
            f"{data_dir} belongs to a node that is running or did not stop cleanly (its "
            "'running' marker is there): stop it first; if its process is gone (a crash, "
            "a power loss), pass --crashed"
        )
    try:
        state = read_data_dir(data_dir, committed_only=committed_only)
    except BackupError as exc:
        raise SnapshotError(str(exc)) from None
    body: bytes = msgpack.packb(state.store.to_plain(), use_bin_type=True)
    header = make_header(body, state.index, state.term, source="data-dir", node=node)
    header["dump_index"] = state.dump_index
    header["known_committed"] = state.known_committed
    header["replayed_entries"] = state.replayed
    header["left_out_entries"] = state.left_out
    write_snapshot(out, header, body)
    return header


# ------------------------------------------------------------- restore


@dataclass(frozen=True)
class RestoreReport:
    data_dir: Path
    index: int
    leases: int
    saved_revision: int
    saved_ceiling: int
    #: The restored store's ceiling: the first new grant's token is above it.
    first_token_above: int
    removed: tuple[str, ...] = field(default_factory=tuple)


def _listening(address: str) -> bool:
    """Whether something accepts TCP connections at ``address`` (1 s at most)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def restore_data_dir(
    snapshot: Path, config: NodeConfig, *, force: bool = False, token_jump: int = DEFAULT_TOKEN_JUMP
) -> RestoreReport:
    """Seed ``config.data_dir`` so the node starts a NEW cluster (``config.nodes``, as
    the dump's member set; a ``members.json`` of an old cluster counts as Raft state)
    with the snapshot's state (``core.snapshot.for_new_cluster``: tokens continue
    ``token_jump`` above the saved ceiling; leases get their TTL again from the new
    cluster's first entry). Every node of the new cluster is seeded from the same file.

    Refuses (``SnapshotError``) a bad checksum, a newer format, and a data directory
    that already holds Raft state unless ``force`` (which removes that state first).
    Raises ``OSError`` on I/O failure."""
    header, body = read_snapshot(snapshot)
    data_dir = config.data_dir
    present = raft_state_present(data_dir)
    if "running" in present and _listening(config.self_node.client):
        # Even with --force: deleting a live node's files leaves it serving its old
        # state from deleted files until it restarts, then the restored one.
        raise SnapshotError(
            f"{data_dir} belongs to a node that is running (its 'running' marker is "
            f"there and {config.self_node.client} accepts connections): stop it first"
        )
    if present and not force:
        raise SnapshotError(
            f"{data_dir} already holds a node's Raft state ({', '.join(present)}); a "
            "restore seeds a new, empty data directory. Point --data-dir elsewhere, or "
            "pass --force to delete that state and replace it"
        )
    if token_jump < TOKEN_RESERVE_STEP:
        raise SnapshotError(f"--token-jump must be at least {TOKEN_RESERVE_STEP}")
    plain = _unpack(body)
    try:
        fresh = for_new_cluster(plain, token_jump)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise SnapshotError(f"the snapshot state does not load: {exc}") from None
    _load(fresh)  # the node will load exactly this: prove it does first
    for name in present:
        (data_dir / name).unlink(missing_ok=True)
    # In pieces, as a node writes its own dumps: the restored node frees them as it
    # loads them (replication/snapshot_rows.py).
    write_seed_dump(data_dir, pack_snapshot(fresh), max(2, int(header["index"])), config.nodes)
    return RestoreReport(
        data_dir=data_dir,
        index=max(2, int(header["index"])),
        leases=len(fresh["leases"]),
        saved_revision=int(plain["revision"]),
        saved_ceiling=int(plain.get("ceiling", 0)),
        first_token_above=int(fresh["ceiling"]),
        removed=tuple(present),
    )


# ------------------------------------------------ taking one on the leader


@dataclass
class _Export:
    sid: str
    path: Path
    index: int
    term: int
    node: str
    size: int = 0
    sha256: str = ""
    last_read: float = field(default_factory=time.monotonic)


class SnapshotExports:
    """The leader's side of ``raftlease snapshot save``: one export at a time.

    Event loop only, except ``on_applied`` (PySyncObj's tick thread, from the node's
    apply observer). ``start`` proposes a barrier and forks; ``read`` serves a chunk.
    Raises ``UnavailableError`` (another export runs, the fork failed) and
    ``InvalidArgumentError`` (unknown export, bad offset), both definite."""

    def __init__(self, data_dir: Path, node: str) -> None:
        self.data_dir = data_dir
        self.node = node
        self._current: _Export | None = None
        self._starting = False
        # Set by the event loop, taken by the tick thread: fork after the next applied
        # entry, (file to write, how to pack the state, callback with (pid, index)).
        self._fork_request: tuple[Path, Callable[[], bytes], Callable[[int, int], None]] | None = (
            None
        )

    def on_applied(self, index: int) -> None:
        """Tick thread, after an entry is applied (``index`` its log index): if an
        export asked for it, fork; the child writes the state and exits."""
        request = self._fork_request
        if request is None:
            return
        self._fork_request = None
        path, pack, done = request
        try:
            pid = os.fork()
        except OSError:
            done(-1, index)
            return
        if pid == 0:  # the child: only this thread exists; never return from here
            code = 1
            try:
                body = pack()
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
                code = 0
            finally:
                os._exit(code)
        done(pid, index)

    async def start(
        self,
        propose: Callable[[dict[str, Any]], Awaitable[Any]],
        state: Callable[[], LeaseStore],
        term: Callable[[], int],
    ) -> dict[str, Any]:
        """Take a snapshot: barrier, fork, wait for the child; returns the export's
        id, size, checksum, log index and term. ``state``: the replica's store (read
        in the forked child only); ``propose``: the node's, for the barrier entries.
        Blocks the calling task (not the loop) for the child's write. Raises what the
        barrier's proposal raises (``NotLeaderError``, timeouts: nothing was taken)
        and ``UnavailableError``."""

        def pack() -> bytes:  # in the forked child, on its copy-on-write view
            packed: bytes = msgpack.packb(state().to_plain(), use_bin_type=True)
            return packed

        loop = asyncio.get_running_loop()
        self._expire()
        if self._starting or self._current is not None:
            raise UnavailableError(
                "another snapshot is being taken or read from this node; retry later"
            )
        self._starting = True
        try:
            # The barrier: once applied here, every write acknowledged before this
            # request is in the state (only the leader commits it).
            await propose({"op": "tick"})
            sid = secrets.token_hex(8)
            path = self.data_dir / f"snapshot-export-{sid}.tmp"
            forked: asyncio.Future[tuple[int, int]] = loop.create_future()

            def done(pid: int, index: int) -> None:  # tick thread
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_resolve, forked, (pid, index))

            self._fork_request = (path, pack, done)
            # The trigger: the fork happens between this entry and the next.
            with contextlib.suppress(Exception):
                await propose({"op": "tick"})
            try:
                pid, index = await asyncio.wait_for(asyncio.shield(forked), 10.0)
            except TimeoutError:
                self._fork_request = None
                # The tick thread may have taken the request just now: reap that child
                # and remove its file when it reports.
                forked.add_done_callback(lambda f: _abandon(loop, f, path))
                raise UnavailableError(
                    "no entry was applied to take the snapshot at; retry"
                ) from None
            if pid < 0:
                raise UnavailableError("cannot fork to write the snapshot (out of memory?)")
            started = time.monotonic()
            _, status = await loop.run_in_executor(None, os.waitpid, pid, 0)
            if status != 0 or not path.exists():
                path.unlink(missing_ok=True)
                raise UnavailableError("the process writing the snapshot failed")
            export = _Export(sid, path, index, term(), self.node)
            export.size, export.sha256 = await loop.run_in_executor(None, _size_and_digest, path)
            self._current = export
            log.info(
                "snapshot %s taken at log index %d: %d bytes, written in %.2f s",
                sid,
                index,
                export.size,
                time.monotonic() - started,
            )
            return {
                "snapshot": sid,
                "index": export.index,
                "term": export.term,
                "size": export.size,
                "sha256": export.sha256,
                "node": self.node,
                "chunk": CHUNK_BYTES,
            }
        finally:
            self._starting = False

    async def read(self, sid: str, offset: int) -> dict[str, Any]:
        """The chunk of export ``sid`` at ``offset``; the export ends after its last
        chunk is read (its file removed)."""
        export = self._current
        if export is None or export.sid != sid:
            raise InvalidArgumentError(f"no snapshot {sid!r} on this node (finished or expired)")
        if not 0 <= offset <= export.size:
            raise InvalidArgumentError(f"offset {offset} is outside 0..{export.size}")
        export.last_read = time.monotonic()
        loop = asyncio.get_running_loop()
        data = await loop.run_in_executor(None, _read_chunk, export.path, offset)
        end = offset + len(data)
        if end >= export.size:
            self.drop()
        return {"snapshot": sid, "offset": offset, "data": data, "done": end >= export.size}

    def drop(self) -> None:
        """End the current export (event loop; also at node stop)."""
        export, self._current = self._current, None
        if export is not None:
            export.path.unlink(missing_ok=True)

    def _expire(self) -> None:
        export = self._current
        if export is not None and time.monotonic() - export.last_read > EXPORT_IDLE:
            log.info("snapshot %s not read for %.0f s: dropped", export.sid, EXPORT_IDLE)
            self.drop()

    def clean_leftovers(self) -> None:
        """Remove export files a previous run left (a crash during an export)."""
        for path in self.data_dir.glob("snapshot-export-*.tmp"):
            path.unlink(missing_ok=True)


def _abandon(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[tuple[int, int]], path: Path
) -> None:
    """Reap a child forked for an export that was given up, and remove its file."""
    pid, _ = future.result()
    if pid <= 0:
        return

    def reap() -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        path.unlink(missing_ok=True)

    loop.run_in_executor(None, reap)


def _resolve(future: asyncio.Future[tuple[int, int]], value: tuple[int, int]) -> None:
    if not future.done():
        future.set_result(value)


def _size_and_digest(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def _read_chunk(path: Path, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(CHUNK_BYTES)


__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_TOKEN_JUMP",
    "FORMAT",
    "RAFT_STATE_FILES",
    "RestoreReport",
    "SnapshotError",
    "SnapshotExports",
    "make_header",
    "read_header",
    "read_snapshot",
    "restore_data_dir",
    "save_from_data_dir",
    "write_snapshot",
]
