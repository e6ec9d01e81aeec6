"""Rebuild each replica's whole state from its data directory, offline, and compare.

After a run the harness stops every node cleanly (SIGTERM) and reads what each one
left on disk, without PySyncObj and without writing a byte (PySyncObj's own
``FileJournal`` creates and resizes the file it opens; evidence must stay as it was):

* ``raft.dump``: PySyncObj's full dump (``serializer.py``): gzip of a pickle
  (protocol 2) of ``(data, last_entry, before_last_entry, cluster)``. ``data`` is
  ``[syncobj_fields, consumer_data]``; raftlease's consumer data is the msgpack bytes
  of ``LeaseStore.to_plain()`` (its snapshot hook pickles as plain ``bytes``). An
  entry is ``(command, index, term)``; ``last_entry`` is the last one applied to the
  dumped state.
* ``raft.journal``: PySyncObj's ``FileJournal``: a 40-byte header (name, version,
  format 1, offset of the end of the last record), then records
  ``u32 size | u64 index | u64 term | command | u32 size`` (little-endian).
* ``raft.journal.meta``: a pickled dict holding ``raftCommitIndex`` (saved at most a
  second late).

A command is a type byte (0 regular, 1 no-op, 2 membership, 3 code version) and, for a
regular one, the pickled call ``(method_id, (entry_bytes,))`` of the one replicated
method (``apply_entry``), whose argument is the msgpack-encoded log entry. Only the
regular ones reach the state machine.

Each replica is rebuilt with ``raftlease.core.LeaseStore``: ``from_plain`` of its
dump, then ``apply`` of every entry after the dump up to one index ``N`` that every
replica holds and itself knows to be committed (``known_committed``), exactly as the
node does (an undecodable entry is skipped, an exception in ``apply`` is caught). The
replicas must then hold one state: the sha256 of the msgpack encoding of
``to_plain()`` (rows sorted by key, so a dict's insertion order, which a snapshot
round trip may change, is not taken for a difference) must be the same on every
node, and so must every committed log entry two nodes both hold.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from raftlease.core import LeaseStore

# The package's offline reader (raftlease snapshot save --from-data-dir) reads dumps,
# commit indexes and commands the same way; only the journal is read here strictly (a
# damaged record is a finding for the checker, where a restore stops at a torn tail).
from raftlease.replication.backup import BackupError as ReplayError
from raftlease.replication.backup import entry_bytes, read_dump
from raftlease.replication.journal import command_intact
from raftlease.replication.safe_pickle import read_commit_index

JOURNAL_NAME = b"PYSYNCOBJ"
JOURNAL_FORMAT = 1
HEADER_SIZE = 24 + 8 + 4 + 4
END_OFFSET_AT = 24 + 8 + 4
Entry = tuple[bytes, int, int]  # (command, index, term)


def read_journal(path: Path) -> list[Entry]:
    """Every record of a PySyncObj ``FileJournal``, read-only."""
    data = path.read_bytes()
    if len(data) < HEADER_SIZE or data[:24].rstrip(b"\0") != JOURNAL_NAME:
        raise ReplayError(f"{path}: not a PySyncObj journal")
    (fmt,) = struct.unpack_from("<I", data, 32)
    (end,) = struct.unpack_from("<I", data, END_OFFSET_AT)
    if fmt != JOURNAL_FORMAT or not HEADER_SIZE <= end <= len(data):
        raise ReplayError(f"{path}: journal format {fmt}, end offset {end} of {len(data)}")
    out: list[Entry] = []
    offset = HEADER_SIZE
    while offset < end:
        (size,) = struct.unpack_from("<I", data, offset)
        if size < 16 or offset + size + 8 > end:
            raise ReplayError(f"{path}: record at {offset} of size {size} overruns {end}")
        (trailer,) = struct.unpack_from("<I", data, offset + 4 + size)
        if trailer != size:
            raise ReplayError(f"{path}: record at {offset}: size {size}, trailer {trailer}")
        index, term = struct.unpack_from("<QQ", data, offset + 4)
        command = bytes(data[offset + 20 : offset + 4 + size])
        if not command_intact(command):
            raise ReplayError(f"{path}: record at {offset} (entry {index}): seal does not match")
        out.append((command, index, term))
        offset += size + 8
    return out


@dataclass
class NodeDisk:
    """What one stopped node left on disk."""

    node: str
    entries: list[Entry]
    dump: dict[str, Any] | None = None
    dump_index: int = 0
    commit_index: int | None = None
    by_index: dict[int, Entry] = field(default_factory=dict)

    @property
    def first_index(self) -> int:
        return self.entries[0][1] if self.entries else 0

    @property
    def last_index(self) -> int:
        last = self.entries[-1][1] if self.entries else 0
        return max(last, self.dump_index)

    def reachable(self, index: int) -> bool:
        """Whether the state at ``index`` can be rebuilt: the dump is not newer and
        every entry after the dump up to ``index`` is in the journal."""
        if index < self.dump_index or index > self.last_index:
            return False
        return all(i in self.by_index for i in range(self.dump_index + 1, index + 1))


def load_node(node: str, directory: Path) -> NodeDisk:
    journal = directory / "raft.journal"
    if not journal.exists():
        raise ReplayError(f"{node}: no journal in {directory}")
    disk = NodeDisk(node, read_journal(journal))
    dump = directory / "raft.dump"
    if dump.exists():
        disk.dump, last = read_dump(dump)
        disk.dump_index = last[1]
    disk.commit_index = read_commit_index(directory / "raft.journal.meta")
    for entry in disk.entries:
        if entry[1] in disk.by_index:
            raise ReplayError(f"{node}: index {entry[1]} twice in the journal")
        disk.by_index[entry[1]] = entry
    return disk


def canonical(plain: Any) -> Any:
    """``to_plain()`` output with its keyed rows (lists of rows whose first field is
    a key or id string) stably sorted by that field: the order of rows within one key
    (its holders in grant order, its queue) is kept, the order of keys in a dict is
    not (a restored snapshot may insert them in another order than the log did)."""
    if not isinstance(plain, dict):
        return plain
    out: dict[str, Any] = {}
    for name, value in plain.items():
        rows = value if isinstance(value, list) else None
        if rows and all(isinstance(r, list) and r and isinstance(r[0], str) for r in rows):
            value = sorted(rows, key=lambda r: r[0])
        out[name] = value
    return out


def digest(plain: Any) -> str:
    return hashlib.sha256(msgpack.packb(plain, use_bin_type=True)).hexdigest()


@dataclass
class Rebuilt:
    store: LeaseStore
    applied: int = 0
    skipped: int = 0
    raised: int = 0


def rebuild(disk: NodeDisk, index: int) -> Rebuilt:
    """The node's state machine at ``index``: its dump, then its entries after it."""
    store = LeaseStore.from_plain(disk.dump) if disk.dump is not None else LeaseStore()
    out = Rebuilt(store)
    for i in range(disk.dump_index + 1, index + 1):
        data = entry_bytes(disk.by_index[i][0])
        if data is None:
            continue
        # As raftlease's _StoreConsumer.apply_entry: skip what does not decode, and an
        # exception in apply does not stop the node (its partial effect stays).
        try:
            entry = msgpack.unpackb(data, raw=False, strict_map_key=True)
        except Exception:
            out.skipped += 1
            continue
        try:
            store.apply(entry)
        except Exception:
            out.raised += 1
        out.applied += 1
    return out


def known_committed(disk: NodeDisk, applied: int | None) -> int:
    """The highest index this node itself knows to be committed: its applied index as
    it reported it, its durable commit index, its dump (taken of applied state). Up to
    there its log is the committed log; beyond, entries may be an uncommitted tail
    that other nodes legitimately do not share."""
    known = [disk.dump_index]
    if disk.commit_index is not None:
        known.append(disk.commit_index)
    if applied is not None:
        known.append(applied)
    return max(known)


def newest_dump_index(disks: list[NodeDisk], index: int) -> int | None:
    """When a node took its dump after the others last said what they had applied (the
    leader goes on writing log-time entries until the nodes stop), the smallest known
    committed ``index`` is older than that dump and that node cannot be rebuilt there.
    The newest dump's index is committed (a dump is applied state); it may serve instead
    when every node reaches it and the nodes holding that entry are a majority and agree
    on its term: the committed entry is on a majority, two majorities share a node, and
    logs that agree on an entry's term agree on every entry before it (Raft's log
    matching), so no node's log up to there is a stale tail. None otherwise."""
    newest = max(d.dump_index for d in disks)
    if newest <= index or not all(d.reachable(newest) for d in disks):
        return None
    holders = [d.by_index[newest] for d in disks if newest in d.by_index]
    if len(holders) < len(disks) // 2 + 1 or len({term for _, _, term in holders}) != 1:
        return None
    return newest


def compare(data_dir: Path, nodes: list[str], applied: dict[str, int | None]) -> dict[str, Any]:
    """Rebuild every node of ``nodes`` (``data_dir/<node>``) at one committed index and
    compare them. ``applied``: each node's applied index as it reported it after the
    clients stopped (None if it did not answer).

    The index is the smallest ``known_committed`` of any node: committed, and within
    every node's own committed log. Returns ``{"index", "nodes": {node: {...,
    "digest"}}, "log_conflicts", "problems"}``; any problem means the replicas could
    not be compared (unknown); a digest that differs or a conflicting committed entry
    means they diverged."""
    problems: list[str] = []
    disks: list[NodeDisk] = []
    for node in nodes:
        try:
            disks.append(load_node(node, data_dir / node))
        except (ReplayError, OSError, ValueError) as exc:
            problems.append(f"{node}: {exc}")
    result: dict[str, Any] = {"index": None, "nodes": {}, "log_conflicts": [], "problems": problems}
    if problems or not disks:
        return result
    index = min(known_committed(d, applied.get(d.node)) for d in disks)
    if index > 0 and not all(d.reachable(index) for d in disks):
        index = newest_dump_index(disks, index) or index
    if index <= 0 or not all(d.reachable(index) for d in disks):
        problems.append(
            f"cannot rebuild every replica at committed index {index}: "
            + ", ".join(f"{d.node}: dump {d.dump_index}, log to {d.last_index}" for d in disks)
        )
        return result
    result["index"] = index
    for disk in disks:
        try:
            rebuilt = rebuild(disk, index)
        except (ReplayError, pickle.UnpicklingError, ValueError, KeyError, TypeError) as exc:
            problems.append(f"{disk.node}: cannot replay: {type(exc).__name__}: {exc}")
            continue
        plain = rebuilt.store.to_plain()
        result["nodes"][disk.node] = {
            "index": index,
            "dump_index": disk.dump_index,
            "first_index": disk.first_index,
            "last_index": disk.last_index,
            "commit_index": disk.commit_index,
            "replayed": rebuilt.applied,
            "skipped": rebuilt.skipped,
            "raised": rebuilt.raised,
            "revision": plain.get("revision"),
            "leases": len(plain.get("leases") or ()),
            "digest": digest(canonical(plain)),
            "raw_digest": digest(plain),
        }
    result["log_conflicts"] = log_conflicts(disks, index)
    result["entries_compared"] = sum(
        1 for i in range(1, index + 1) if sum(i in d.by_index for d in disks) > 1
    )
    return result


def log_conflicts(disks: list[NodeDisk], index: int, limit: int = 20) -> list[dict[str, Any]]:
    """Committed entries (up to ``index``) that two nodes both hold but that differ."""
    out: list[dict[str, Any]] = []
    for i in range(1, index + 1):
        held = {d.node: d.by_index[i] for d in disks if i in d.by_index}
        if len({(e[2], e[0]) for e in held.values()}) > 1:
            out.append({"index": i, "terms": {n: e[2] for n, e in held.items()}})
            if len(out) >= limit:
                break
    return out
