"""PySyncObj's files for backup and restore: seed a new node's data directory with a
full dump PySyncObj loads at start, and read a stopped node's dump and journal offline.

PySyncObj's on-disk formats (0.3.17; tests/integration/test_backup.py starts real nodes on what
``write_seed_dump`` writes, so a change fails loudly):

* ``raft.dump`` (``serializer.py``): gzip of a protocol-2 pickle of
  ``(data, last_entry, before_last_entry, cluster)``. ``data`` is
  ``[syncobj_fields, consumer_data]``; our consumer's data is the msgpack map of
  ``LeaseStore.to_plain()`` (``replica._PackedSnapshot``): a list of its consecutive
  pieces as this build writes it (``snapshot_rows.pack_snapshot``), one ``bytes`` as
  earlier builds and ``write_seed_dump`` write it. An entry is
  ``(command, index, term)``. At start PySyncObj loads the dump when the file exists;
  when its journal does not begin with the dump's two entries, it clears the journal
  and starts it with them, and takes ``last_entry``'s index as applied.
* ``raft.journal`` (``FileJournal``): a 40-byte header whose last 4 bytes are the end
  of the last record, then records ``u32 size | u64 index | u64 term | command | u32
  size`` (little-endian).
* ``raft.journal.meta``: a pickled dict with ``raftCommitIndex`` (saved at most a
  second late), term and vote.

A command is a type byte (0 regular, 1 no-op, 2 membership, 3 code version) and, for
a regular one, the pickled call ``(method_id, (entry_bytes,))`` of our one replicated
method. Pickles are read with an unpickler that constructs only builtin containers
(anything else becomes an inert stand-in, never imported or run): a data directory
handed to an operator's tool must not be able to run code.

Blocking file I/O; call from a CLI or an executor thread, never from an event loop.
Raises ``BackupError`` for a directory it cannot interpret.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.journal import FIRST_RECORD_OFFSET, LAST_RECORD_OFFSET_OFFSET
from pysyncobj.node import TCPNode

from ..config import NodeAddress
from ..core import LeaseStore
from .durable import REWRITE_SUFFIXES, fsync_path
from .journal import whole_records
from .safe_pickle import SafeUnpickler, read_commit_index, safe_loads

#: The files of a node's Raft state in its data directory (beside them the node may
#: keep its config and log, which a restore leaves alone).
DUMP_NAME = "raft.dump"
JOURNAL_NAME = "raft.journal"
RAFT_STATE_FILES = (
    DUMP_NAME,
    JOURNAL_NAME,
    JOURNAL_NAME + ".meta",
    DUMP_NAME + ".tmp",
    *(JOURNAL_NAME + suffix for suffix in REWRITE_SUFFIXES),
    "running",
    # The member set a node saw last (membership.py): the old cluster's, not the new one's.
    "members.json",
    # The mark of a member removed from the old cluster (membership.py): a restored
    # node is a member of the new one.
    "removed",
)

_NO_OP = b"\x01"
_REGULAR, _NO_OP_TYPE, _MEMBERSHIP, _VERSION = 0, 1, 2, 3
_JOURNAL_MAGIC = b"PYSYNCOBJ"

Entry = tuple[bytes, int, int]  # (command, index, term)


class BackupError(Exception):
    """A data directory or dump that cannot be read or written as PySyncObj's."""


# ------------------------------------------------------------- seeding


def write_seed_dump(
    data_dir: Path, body: bytes | list[bytes], index: int, members: Sequence[NodeAddress]
) -> Path:
    """Write ``data_dir/raft.dump``: a full dump PySyncObj loads at start, holding
    ``body`` (``LeaseStore.to_plain()`` as ``snapshot_rows.pack_snapshot``'s pieces,
    which the node frees as it loads them, or as one msgpack ``bytes``, as earlier
    builds wrote it) as applied through log ``index``.

    The dump's two entries are no-ops of term 0 at ``index - 1`` and ``index``: every
    node seeded from one snapshot holds the same two, so their logs agree there, and a
    new cluster's first election (term 1) appends after them. ``members``: the new
    cluster's members, as the dump's cluster set (PySyncObj takes it as its peer set
    at load with dynamic membership on), each node carrying its id and client address
    the way ``membership.member_node`` makes them.
    Written atomically (temporary file, fsync, rename, directory fsync), the data
    directory made 0700 and the file 0600 as a node makes them. Raises ``OSError``.
    """
    if index < 2:
        raise BackupError(f"log index {index} is below 2 (a dump holds two entries)")
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    data_dir.chmod(0o700)
    consumer: list[bytes] | bytes = list(body) if isinstance(body, list) else bytes(body)
    dump: tuple[Any, ...] = (
        [{}, consumer],
        (_NO_OP, index, 0),
        (_NO_OP, index - 1, 0),
        {_member_node(member) for member in members},
    )
    path = data_dir / DUMP_NAME
    tmp = path.with_name(path.name + ".seed")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        with gzip.GzipFile(fileobj=f, mode="wb") as g:
            pysyncobj_pickle.dump(dump, g)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(data_dir, directory=True)
    return path


def _member_node(member: NodeAddress) -> TCPNode:
    node = TCPNode(member.raft)
    node.rl_id = member.id
    node.rl_client = member.client
    return node


def raft_state_present(data_dir: Path) -> list[str]:
    """The Raft state files already in ``data_dir`` (empty: safe to seed)."""
    if not data_dir.exists():
        return []
    return sorted(name for name in RAFT_STATE_FILES if (data_dir / name).exists())


# ------------------------------------------------------ offline reading


@dataclass
class OfflineState:
    """A stopped node's state machine rebuilt from its files."""

    store: LeaseStore
    #: Log index and term of the last entry applied to ``store``.
    index: int
    term: int
    #: Index of the dump it started from, and the commit index the node had saved.
    dump_index: int
    known_committed: int | None
    replayed: int
    #: Entries in the journal after ``index`` that were left out (``committed_only``).
    left_out: int


def read_journal(path: Path) -> list[Entry]:
    """Every whole record of a PySyncObj journal, read-only. A torn tail (a record
    cut short or torn by a crash, ``journal.whole_records``) ends the list, as the
    node's own repair at start would."""
    data = path.read_bytes()
    if len(data) < FIRST_RECORD_OFFSET or data[:24].rstrip(b"\0") != _JOURNAL_MAGIC:
        raise BackupError(f"{path}: not a PySyncObj journal")
    (end,) = struct.unpack_from("<I", data, LAST_RECORD_OFFSET_OFFSET)
    return whole_records(data, end)[0]


def read_dump(path: Path) -> tuple[dict[str, Any], Entry]:
    """A full dump: the consumer's ``to_plain()`` data and its last entry."""
    try:
        with gzip.open(path, "rb") as f:
            dump = SafeUnpickler(f).load()
        consumer, last = dump[0][1], dump[1]
        entry: Entry = (bytes(last[0]), int(last[1]), int(last[2]))
    except Exception as exc:
        raise BackupError(f"{path}: unreadable dump ({type(exc).__name__}: {exc})") from exc
    if isinstance(consumer, list) and all(isinstance(piece, bytes) for piece in consumer):
        consumer = b"".join(consumer)  # the pieces of one map (snapshot_rows.py)
    if not isinstance(consumer, bytes):
        raise BackupError(f"{path}: snapshot data is {type(consumer).__name__}, not bytes")
    try:
        plain = msgpack.unpackb(consumer, raw=False, strict_map_key=False)
    except Exception as exc:
        raise BackupError(f"{path}: snapshot data is not msgpack ({exc})") from exc
    if not isinstance(plain, dict):
        raise BackupError(f"{path}: snapshot is a {type(plain).__name__}, not a map")
    return plain, entry


def entry_bytes(command: bytes) -> bytes | None:
    """The msgpack entry a regular command carries; None for a command that never
    reaches the state machine (no-op, membership, code version)."""
    if not command:
        raise BackupError("empty command in the journal")
    kind = command[0]
    if kind in (_NO_OP_TYPE, _MEMBERSHIP, _VERSION):
        return None
    if kind != _REGULAR:
        raise BackupError(f"unknown command type {kind} in the journal")
    try:
        call = safe_loads(command[1:])
    except Exception as exc:
        raise BackupError(f"undecodable command in the journal ({exc})") from exc
    if not (isinstance(call, tuple) and len(call) in (2, 3) and isinstance(call[1], tuple)):
        raise BackupError("a journal command is not a replicated call")
    args = call[1]
    if len(args) != 1 or not isinstance(args[0], bytes) or (len(call) == 3 and call[2]):
        raise BackupError("a journal command is not apply_entry(bytes)")
    return args[0]


def read_data_dir(data_dir: Path, committed_only: bool = False) -> OfflineState:
    """Rebuild a stopped node's state machine from ``data_dir``: its dump, then every
    journal entry after it (``committed_only``: only up to the commit index the node
    saved, which may lag the real one by a second). Reads only; never writes a byte.

    The node must be stopped (a running node rewrites these files under the reader).
    Entries are applied exactly as the node applies them (an undecodable one skipped,
    an exception in ``apply`` caught), so the result is the node's own state.
    """
    journal_path = data_dir / JOURNAL_NAME
    dump_path = data_dir / DUMP_NAME
    if not journal_path.exists() and not dump_path.exists():
        raise BackupError(f"{data_dir} holds no {JOURNAL_NAME} or {DUMP_NAME}: not a node's data")
    store = LeaseStore()
    dump_index, index, term = 0, 0, 0
    if dump_path.exists():
        plain, last = read_dump(dump_path)
        try:
            store = LeaseStore.from_plain(plain)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise BackupError(f"{dump_path}: snapshot does not load ({exc})") from exc
        dump_index, term = last[1], last[2]
        index = dump_index
    entries = read_journal(journal_path) if journal_path.exists() else []
    known = read_commit_index(data_dir / (JOURNAL_NAME + ".meta"))
    if known is not None and dump_index > known:
        # The saved commit index lags the real one by up to a second, but PySyncObj
        # dumps only applied (so committed) state: the dump's index is committed too.
        known = dump_index
    tail = [e for e in entries if e[1] > dump_index]
    if tail and tail[0][1] != dump_index + 1:
        raise BackupError(
            f"{data_dir}: the journal resumes at entry {tail[0][1]} but the dump ends at "
            f"{dump_index}: entries are missing"
        )
    stop = known if committed_only and known is not None else None
    replayed = left_out = 0
    for command, idx, entry_term in tail:
        if stop is not None and idx > stop:
            left_out += 1
            continue
        data = entry_bytes(command)
        index, term = idx, entry_term
        if data is None:
            continue
        try:
            entry = msgpack.unpackb(data, raw=False, strict_map_key=True)
        except Exception:
            continue  # the node skips it too (replica.apply_entry)
        # The node logs an exception in apply and goes on (replica.apply_entry).
        with contextlib.suppress(Exception):
            store.apply(entry)
        replayed += 1
    return OfflineState(store, index, term, dump_index, known, replayed, left_out)
