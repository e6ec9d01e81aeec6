"""Journal records and their repair at start: cut a torn tail (records a power loss
left half written), and make PySyncObj's journal consistent with a newer snapshot left
by a crash during log compaction.

**Sealed commands (log command format 2).** PySyncObj frames a journal record as
length, index, term, command, length, with no checksum. Framing alone cannot tell a
whole record from one whose first and last pages reached the disk while a page in
between did not (a record longer than a page, written through the map, power lost
before its sync: the kernel and the disk write pages in any order). The middle then
reads as zeros or as an older record left there before a compaction rewrote the file,
and a follower keeps such an entry when it restarts, because the leader's entry at
that index has the same term (Raft's log matching; follower_log.py): it would apply
something no other node applied. So each regular command raftlease builds
(``Replica.propose``) is the call pickled with protocol ``SEALED_PROTOCOL`` followed by
``COMMAND_SEAL`` and the CRC-32 of the pickle. ``pickle.loads`` ignores bytes after a
pickle's end ("Bytes past the pickled representation of the object are ignored"), so
PySyncObj, older raftlease versions and every reader load it unchanged. Whether a
command is whole is decided by its end, which lies in the record's last page with the
length suffix that framing already checks (its start may lie in a page before, even
the record's first bytes when the record begins near a page's end): a command ending
in a seal must be a sealed regular command whose CRC matches; any other must be one of
the unsealed kinds in full (PySyncObj's no-op ``b"\x01"``, or a regular, membership or
version command pickled with protocol 2 or 4, which ends with the pickle's STOP
opcode). Commands written before (protocols 2 and 4) carry no seal and can be checked
only that far (``command_intact``).
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import mmap
import os
import pickle
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.journal import (
    FIRST_RECORD_OFFSET,
    LAST_RECORD_OFFSET_OFFSET,
    FileJournal,
    MetaStorer,
)

from .durable import REPAIR_SUFFIX, DurableMetaStorer, SyncRecorder, replace_journal
from .safe_pickle import read_commit_index

log = logging.getLogger("raftlease.replication")

#: A journal record's command, index and term.
Record = tuple[bytes, int, int]

#: PySyncObj's ``_COMMAND_TYPE``: the first byte of a command. A no-op is that byte
#: alone; the others are followed by a pickle (membership and version changes always
#: protocol 2, PySyncObj's).
REGULAR_COMMAND, NO_OP_COMMAND, MEMBERSHIP_COMMAND, VERSION_COMMAND = 0, 1, 2, 3
_PICKLED_COMMANDS = (REGULAR_COMMAND, MEMBERSHIP_COMMAND, VERSION_COMMAND)
#: How unsealed pickles start: protocol 2 (PySyncObj's) or 4 (raftlease's before the seal).
_UNSEALED_PICKLES = (b"\x80\x02", b"\x80\x04")
#: A PySyncObj journal's first bytes.
_JOURNAL_MAGIC = b"PYSYNCOBJ"
#: The pickle protocol of sealed commands (earlier versions' commands, never sealed,
#: are protocol 2 or 4).
SEALED_PROTOCOL = 5
_SEALED_PICKLE = bytes([0x80, SEALED_PROTOCOL])
#: Follows a sealed command's pickle, then the pickle's CRC-32 (4 bytes, little-endian).
COMMAND_SEAL = b"RLc\x01"
_SEAL_SIZE = len(COMMAND_SEAL) + 4


def seal_command(call: Any) -> bytes:
    """``call`` pickled with ``SEALED_PROTOCOL``, then the seal: the bytes to hand
    PySyncObj as a regular command (it prepends the command type byte)."""
    pickled = pickle.dumps(call, SEALED_PROTOCOL)
    return pickled + COMMAND_SEAL + struct.pack("<I", zlib.crc32(pickled))


def command_intact(command: bytes) -> bool:
    """Whether ``command`` (a journal record's, type byte first) is whole: a sealed
    regular command whose CRC matches, or one of the unsealed kinds in full (module
    docstring). False means a record torn by a power loss (or a type this build does
    not know)."""
    if len(command) >= 3 + _SEAL_SIZE and command[-_SEAL_SIZE:-4] == COMMAND_SEAL:
        if command[0] != REGULAR_COMMAND or command[1:3] != _SEALED_PICKLE:
            return False  # the end of a sealed command, its start lost
        crc: int = struct.unpack_from("<I", command, len(command) - 4)[0]
        return zlib.crc32(memoryview(command)[1:-_SEAL_SIZE]) == crc
    if not command:
        return False
    if command[0] == NO_OP_COMMAND:
        return len(command) == 1
    if command[0] in _PICKLED_COMMANDS:
        return command[1:3] in _UNSEALED_PICKLES and command[-1:] == b"."
    return False


def whole_records(
    data: bytes | mmap.mmap, end: int, start: int = FIRST_RECORD_OFFSET
) -> tuple[list[Record], int]:
    """The whole records of a journal's bytes ``data`` from ``start`` (a record's
    offset: the first record's by default) up to ``end`` (the header's end of the
    last record), in order, and the offset after the last of them. A record is whole
    when its length prefix and suffix agree, it holds at least the index and term,
    its index follows the previous record's, and its command is intact
    (``command_intact``); the first record that is not ends the list."""
    out: list[Record] = []
    offset = start
    for record, offset in iter_whole_records(data, end, start):  # noqa: B007
        out.append(record)
    return out, offset


def iter_whole_records(
    data: Any, end: int, start: int = FIRST_RECORD_OFFSET
) -> Iterator[tuple[Record, int]]:
    """``whole_records`` one at a time, each with the offset after it, without a list
    of them all: ``data`` is any buffer (bytes, or an mmap of the journal)."""
    end = min(end, len(data))
    offset = start
    previous: int | None = None
    while offset + 4 <= end:
        (size,) = struct.unpack_from("<I", data, offset)
        after = offset + 4 + size + 4
        if size < 16 or after > end:
            return
        if struct.unpack_from("<I", data, offset + 4 + size)[0] != size:
            return
        index, term = struct.unpack_from("<QQ", data, offset + 4)
        if previous is not None and index != previous + 1:
            return
        command = bytes(data[offset + 20 : offset + 4 + size])
        if not command_intact(command):
            return
        previous = index
        offset = after
        yield (command, index, term), offset


#: ``trim_torn_tail`` drops the journal's pages it has read from its resident set
#: every this many bytes (a journal of 100,000 entries is ~32 MiB).
_SCAN_RELEASE = 4 << 20


def trim_torn_tail(journal_path: Path, dump_path: Path | None = None) -> int:
    """Cut the journal back to its last whole record; return how many bytes of
    records were dropped.

    PySyncObj's journal is an mmap file whose header names the end of the last
    record. After a power loss, the header may have reached the disk while the pages
    of the records it counts did not (they read as zeros, or as older contents), or
    only some of a record's pages did, and PySyncObj's loader would then fail or load
    garbage. Whole records: ``whole_records`` (framing, index order, the seal of a
    sealed command). Everything after the first record that is not whole was never
    synced, so never acknowledged (``durable.DurableJournal``): logged as a warning.

    Unless the disk damaged what was synced: a record that is not whole at or below
    the commit index this node saved (its journal's ``.meta``; with ``fsync`` the
    entries up to it were synced before it moved) and not covered by the dump at
    ``dump_path`` held an entry this node may have acknowledged. It is cut all the
    same (applying it would be worse; the leader sends the entries again), but
    logged as an error that says so: until it has them again, fewer nodes hold
    those entries than acknowledged them. (With ``durability = "none"`` a power loss
    can do this too; the node then waits out its TTLs, docs/design.md.)
    """
    if not journal_path.exists():
        return 0
    with open(journal_path, "rb") as f:
        if os.fstat(f.fileno()).st_size < FIRST_RECORD_OFFSET:
            return 0
        # Mapped, not read: the walk keeps one record at a time, and the pages it
        # has passed leave the resident set as it goes (a node starting with a long
        # journal would otherwise hold it twice over, file and records, ~50 MiB for
        # 100,000 entries).
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            last, offset, previous = _walk_records(journal_path, data)
    if offset >= last:
        return 0
    with open(journal_path, "r+b") as f:
        f.seek(LAST_RECORD_OFFSET_OFFSET)
        f.write(struct.pack("<I", offset))
        f.flush()
        os.fsync(f.fileno())
    dropped: int = last - offset
    committed = read_commit_index(Path(str(journal_path) + ".meta"))
    covered = _dump_last_index(dump_path) if dump_path is not None else None
    # No whole record at all (the first one damaged, or no journal): what is lost
    # starts at the first entry the dump does not cover.
    first_cut = previous + 1 if previous is not None else (covered or 0) + 1
    if (
        committed is not None
        and first_cut <= committed
        and (covered is None or first_cut > covered)
    ):
        log.error(
            "journal %s is damaged at entry %d, at or below the commit index %d this "
            "node saved: not a torn write (with durability fsync those entries were "
            "synced) but the disk losing data this node may have acknowledged. Cut "
            "%d bytes from there; the leader sends the entries again. Check the disk.",
            journal_path,
            first_cut,
            committed,
            dropped,
        )
        return dropped
    log.warning(
        "journal %s ended in a torn record (a power loss during a write): cut %d bytes "
        "after the last whole record (entry %s); they were never acknowledged",
        journal_path,
        dropped,
        previous,
    )
    return dropped


def _walk_records(journal_path: Path, data: Any) -> tuple[int, int, int | None]:
    """``trim_torn_tail``'s walk over the mapped journal ``data``: the header's end of
    the last record, the offset after the last whole record and that record's index
    (None if there is none)."""
    if data[: len(_JOURNAL_MAGIC)] != _JOURNAL_MAGIC:
        log.error(
            "journal %s does not start with PySyncObj's header: not a journal, or its "
            "first page was lost; it is read as empty (the leader sends the entries "
            "again). Check the disk.",
            journal_path,
        )
    last: int = struct.unpack_from("<I", data, LAST_RECORD_OFFSET_OFFSET)[0]
    offset, previous, released = FIRST_RECORD_OFFSET, None, 0
    release = hasattr(data, "madvise")
    for (_, index, _), offset in iter_whole_records(data, last):
        previous = index
        if release and offset - released >= _SCAN_RELEASE:
            upto = offset - offset % mmap.PAGESIZE
            with contextlib.suppress(OSError, ValueError):
                data.madvise(mmap.MADV_DONTNEED, 0, upto)
            released = upto
    return last, offset, previous


#: The last dump tail read: (the file's identity, (before last, last)). Start-up asks
#: for it up to four times (check_start_files, trim_torn_tail, repair_journal,
#: clamp_commit_index) and each read decompresses and unpickles the whole dump (for
#: 100,000 leases ~12 MiB of snapshot bytes, ~0.3 s of CPU). One entry: a node
#: has one dump.
_tail_memo: tuple[tuple[int, int, int, int, str], tuple[Any, Any]] | None = None


def _dump_tail(dump_path: Path) -> tuple[Any, Any]:
    """The last two entries a full dump covers, (before last, last); raises if the
    dump cannot be read. Read once per version of the file: a file replaced (a new
    inode, as PySyncObj's atomic rename makes), rewritten or resized is read again.
    Threads: start-up only (not thread-safe)."""
    global _tail_memo
    st = os.stat(dump_path)
    identity = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, str(dump_path))
    if _tail_memo is not None and _tail_memo[0] == identity:
        return _tail_memo[1]
    with gzip.open(dump_path, "rb") as f:
        dump = pysyncobj_pickle.load(f)
    tail = (dump[2], dump[1])
    del dump  # the snapshot itself is not kept: only its last two entries
    _tail_memo = (identity, tail)
    return tail


def _dump_last_index(dump_path: Path) -> int | None:
    """The index of the last entry a full dump covers, or None."""
    try:
        index = _dump_tail(dump_path)[1][1]
    except Exception:  # missing or unreadable
        return None
    return index if isinstance(index, int) else None


class UnusableFiles(Exception):
    """A node's snapshot cannot be read, or does not reach its journal's first entry:
    starting would serve a state without acknowledged entries (``check_start_files``)."""


def check_start_files(journal_path: Path, dump_path: Path) -> None:
    """Refuse files a node must not start from (raises ``UnusableFiles``):

    * a snapshot (``raft.dump``) that cannot be read: PySyncObj would only log it and
      run with an empty state machine, which could even win an election and wedge the
      cluster (its followers ahead of it);
    * a snapshot older than the journal's first entry (an old dump put back, or a
      file-level copy taken during a compaction): PySyncObj's loader would clear the
      journal and run without every entry between them, acknowledged ones among them.

    Reads the dump's tail and walks the journal's first record only."""
    if not dump_path.exists():
        return
    try:
        _before_last, last = _dump_tail(dump_path)
        dump_index = int(last[1])
    except Exception as exc:
        raise UnusableFiles(
            f"cannot read the snapshot {dump_path} ({type(exc).__name__}: {exc})"
        ) from None
    if not journal_path.exists():
        return
    with open(journal_path, "rb") as f:
        if os.fstat(f.fileno()).st_size < FIRST_RECORD_OFFSET:
            return
        # Mapped: only the header's and the first record's pages are read.
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[: len(_JOURNAL_MAGIC)] != _JOURNAL_MAGIC:
                return
            end: int = struct.unpack_from("<I", data, LAST_RECORD_OFFSET_OFFSET)[0]
            if end < FIRST_RECORD_OFFSET + 4:
                return
            (size,) = struct.unpack_from("<I", data, FIRST_RECORD_OFFSET)
            # Only the first record: it ends at its length prefix, the record and
            # its suffix.
            records, _ = whole_records(data, min(end, FIRST_RECORD_OFFSET + 4 + size + 4))
    if records and records[0][1] > dump_index + 1:
        raise UnusableFiles(
            f"the snapshot {dump_path} ends at entry {dump_index} but the journal "
            f"{journal_path} starts at entry {records[0][1]}: the entries between are "
            "in neither (an older snapshot put back beside a newer journal?)"
        )


def _last_index(journal_path: Path) -> int | None:
    """The index of the journal's last record, found through the header's end of the
    last record and that record's length suffix, and checked as ``whole_records``
    checks any (call after ``trim_torn_tail``: the header then ends at a whole
    record); None if there is none or it is not whole."""
    if not journal_path.exists():
        return None
    with open(journal_path, "rb") as f:
        if os.fstat(f.fileno()).st_size < FIRST_RECORD_OFFSET:
            return None
        # Mapped: only the header's and the last record's pages are read.
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[: len(_JOURNAL_MAGIC)] != _JOURNAL_MAGIC:
                return None
            end: int = struct.unpack_from("<I", data, LAST_RECORD_OFFSET_OFFSET)[0]
            if not FIRST_RECORD_OFFSET + 4 <= end <= len(data):
                return None
            (size,) = struct.unpack_from("<I", data, end - 4)
            start = end - size - 8  # the record's length prefix
            if start < FIRST_RECORD_OFFSET:
                return None
            records, _ = whole_records(data, end, start)
    return records[0][1] if records else None


def clamp_commit_index(
    journal_path: Path, dump_path: Path, recorder: SyncRecorder | None = None
) -> int | None:
    """Lower a saved commit index that lies beyond everything this node holds (its
    journal's last entry and its snapshot's) to the snapshot's last entry (1 without
    one); return the new commit index, or None if it was left alone. Call after
    ``trim_torn_tail`` and ``repair_journal``, before PySyncObj loads the files.

    Why: PySyncObj loads the commit index from the journal's ``.meta`` and applies
    every entry up to it, clamping one beyond the journal's end to that end. But a
    commit index beyond the end is not this log's: the entries were cut (a damaged
    disk, or a power loss with ``durability = "none"``) or the file came from another
    node (an operator copying a data directory piecemeal). The entries the journal
    does hold may then include a deposed leader's tail that never committed, which
    the node would apply, and keep applied after the leader overwrote it: a state no
    other node has (a lease granted on this node only). The commit index is not part
    of Raft's persistent state; the leader sends it with every append, so lowering it
    only delays applying until the leader confirms. A commit index within the
    journal is this log's as far as anything here can tell, and is left alone.
    Raises nothing for missing or unreadable files (left to the loader);
    ``OSError`` writing the meta stops the process (``DurableMetaStorer``)."""
    meta_path = Path(str(journal_path) + ".meta")
    committed = read_commit_index(meta_path)
    if committed is None:
        return None
    last = _last_index(journal_path)
    covered = _dump_last_index(dump_path)
    held = max((i for i in (last, covered) if i is not None), default=1)
    if committed <= held:
        return None
    clamped = covered if covered is not None else 1
    meta = MetaStorer(str(meta_path)).getMeta()
    meta["raftCommitIndex"] = clamped
    DurableMetaStorer(str(meta_path), recorder).storeMeta(meta)
    log.warning(
        "the commit index %d saved in %s lies beyond everything this node holds (its "
        "journal ends at entry %s, its snapshot at %s): entries cut by a damaged disk or "
        "a power loss, or a file from another node. Starting from commit index %d "
        "instead, so that nothing in the journal is applied before the leader confirms it",
        committed,
        meta_path,
        last,
        covered,
        clamped,
    )
    return clamped


def repair_journal(journal_path: Path, dump_path: Path) -> int:
    """Make a journal consistent with a newer snapshot, before PySyncObj loads them.

    PySyncObj compacts by (1) writing the snapshot in a forked child, then, a tick
    later, (2) rewriting the journal to start at the snapshot's last two entries. A
    crash between the two leaves a journal whose head is older than the snapshot, and
    PySyncObj's loader then *clears the whole journal*, dropping every entry after the
    snapshot: acknowledged grants lost (reproduced with a SIGKILL of all nodes right
    after a burst of writes). Here, when the journal holds the snapshot's two entries
    further in, we drop what precedes them (atomically: a new file renamed over the
    old), so the loader keeps the tail. Returns how many entries were dropped.
    """
    if not journal_path.exists() or not dump_path.exists():
        return 0
    try:
        before_last, last = _dump_tail(dump_path)
    except Exception:
        log.exception("cannot read snapshot %s; leaving the journal alone", dump_path)
        return 0
    journal = FileJournal(str(journal_path))
    try:
        entries = [journal[i] for i in range(len(journal))]
    finally:
        journal._destroy()
    if len(entries) >= 2 and entries[0] == before_last and entries[1] == last:
        return 0
    for k in range(len(entries) - 1):
        if entries[k] == before_last and entries[k + 1] == last:
            break
    else:
        return 0  # the loader's own handling applies (snapshot newer than all entries)
    replace_journal(journal_path, entries[k:], REPAIR_SUFFIX)
    log.warning(
        "journal head was older than the snapshot (crash during log compaction): "
        "dropped %d entries before it, kept %d after",
        k,
        len(entries) - k,
    )
    return k
