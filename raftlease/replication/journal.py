"""Journal repair at start: make PySyncObj's journal consistent with a newer
snapshot left by a crash during log compaction."""

from __future__ import annotations

import gzip
import logging
import os
from pathlib import Path

from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.journal import FileJournal

log = logging.getLogger("raftlease.replication")


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
    os.replace(tmp, journal_path)
    log.warning(
        "journal head was older than the snapshot (crash during log compaction): "
        "dropped %d entries before it, kept %d after",
        k,
        len(entries) - k,
    )
    return k
