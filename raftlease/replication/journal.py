"""Journal repair at start: cut a torn tail (records a power loss left half written),
and make PySyncObj's journal consistent with a newer snapshot left by a crash during
log compaction."""

from __future__ import annotations

import gzip
import logging
import os
import struct
from pathlib import Path

from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.journal import FIRST_RECORD_OFFSET, LAST_RECORD_OFFSET_OFFSET, FileJournal

from .durable import fsync_path

log = logging.getLogger("raftlease.replication")


def trim_torn_tail(journal_path: Path) -> int:
    """Cut the journal back to its last whole record; return how many bytes of
    records were dropped.

    PySyncObj's journal is an mmap file whose header names the end of the last
    record. After a power loss, the header may have reached the disk while the pages
    of the records it counts did not (they read as zeros, or as older contents), and
    PySyncObj's loader would then fail or load garbage. A record is whole when its
    length prefix and suffix agree, it holds at least the index and term, and its
    index follows the previous record's. Everything after the first record that is
    not whole was never synced, so never acknowledged (``durable.DurableJournal``).
    """
    if not journal_path.exists():
        return 0
    data = journal_path.read_bytes()
    if len(data) < FIRST_RECORD_OFFSET:
        return 0
    last: int = struct.unpack_from("<I", data, LAST_RECORD_OFFSET_OFFSET)[0]
    offset, previous = FIRST_RECORD_OFFSET, None
    while offset < last:
        if offset + 4 > len(data):
            break
        (size,) = struct.unpack_from("<I", data, offset)
        end: int = offset + 4 + size + 4
        if size < 16 or end > last or end > len(data):
            break
        if struct.unpack_from("<I", data, offset + 4 + size)[0] != size:
            break
        idx, _term = struct.unpack_from("<QQ", data, offset + 4)
        if previous is not None and idx != previous + 1:
            break
        previous, offset = idx, end
    if offset >= last:
        return 0
    with open(journal_path, "r+b") as f:
        f.seek(LAST_RECORD_OFFSET_OFFSET)
        f.write(struct.pack("<I", offset))
        f.flush()
        os.fsync(f.fileno())
    log.warning(
        "journal %s ended in a torn record (a power loss during a write): cut %d bytes "
        "after the last whole record (entry %s); they were never acknowledged",
        journal_path,
        last - offset,
        previous,
    )
    dropped: int = last - offset
    return dropped


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
        with gzip.open(dump_path, "rb") as f:
            dump = pysyncobj_pickle.load(f)
        before_last, last = dump[2], dump[1]
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
    tmp = journal_path.with_name(journal_path.name + ".repair")
    tmp.unlink(missing_ok=True)
    fresh = FileJournal(str(tmp))
    try:
        for command, idx, term in entries[k:]:
            fresh.add(command, idx, term)
    finally:
        fresh._destroy()
    fsync_path(tmp)
    os.replace(tmp, journal_path)
    fsync_path(journal_path.parent, directory=True)
    log.warning(
        "journal head was older than the snapshot (crash during log compaction): "
        "dropped %d entries before it, kept %d after",
        k,
        len(entries) - k,
    )
    return k
