"""Durable acknowledgements over PySyncObj's journal (``durability``; docs/design.md,
"Durability").

PySyncObj writes its journal through an mmap and never syncs it, writes its term and
vote file without fsync, and renames its dump into place without fsync (its issue
#84). Here, at our seam, nothing is acknowledged before it is on stable storage:

* ``DurableJournal`` wraps PySyncObj's ``FileJournal`` (installed by our transport
  before PySyncObj's tick thread starts) and remembers whether entries were written
  since the last sync. ``sync`` is one ``fdatasync`` for everything appended since
  the previous one (group commit); on Linux that alone writes back the map's dirty
  pages, elsewhere an ``msync`` of the pages written since the last sync comes first
  (``DurableJournal.MSYNC``).
* A follower syncs before it answers an ``append_entries`` (``next_node_idx``,
  ``LeaseTransport.send``): its answer is what the leader counts.
* A leader sends its new entries first and syncs at the end of the same tick (an
  on-tick callback), so its sync overlaps the followers' round trip; and in any case
  before its commit index moves (``setRaftCommitIndex``, called before any entry is
  applied or answered), so it never counts itself on an entry that is not on disk.
* Term and vote (``DurableMetaStorer``): written to a temporary file, fsynced,
  renamed, directory fsynced; in both modes (elections are rare, and Raft's safety
  needs the vote on disk before the vote is sent).
* The dump (``DurableSerializer``): written, fsynced, renamed, directory fsynced
  before the journal is cut to it (log compaction) or rewritten for it (a snapshot
  installed from the leader).
* Log compaction (``deleteEntriesTo``): the kept entries go to a new file, fsynced
  and renamed over the journal (PySyncObj would rewrite it in place, which a power
  loss can tear).

With ``durability = "none"`` only term and vote, log rewrites, and the entries a
leader marks ``durable`` (the fencing-token ceiling, see ``core.store``) are synced.

A sync that fails stops the process (``DURABILITY_FAILED``): after a failed fsync the
kernel may have dropped the dirty pages, so retrying could report success for data
that is gone (PostgreSQL's "fsyncgate"). A stopped node restarts from what is on disk.

Threads: everything here runs on PySyncObj's tick thread, except the serializer's
``serialize`` (in the forked child that writes the dump).
"""

from __future__ import annotations

import gzip
import logging
import mmap
import os
import shutil
import stat
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.journal import FIRST_RECORD_OFFSET, FileJournal, MetaStorer, ResizableFile
from pysyncobj.serializer import Serializer

from .compact_journal import CompactJournal

log = logging.getLogger("raftlease.replication")

#: Exit status of a node whose journal, vote or dump could not be synced (72: 70 and
#: 71 are a snapshot or log entry too new for this build, replication/replica.py;
#: the list is in docs/operations.md, "Exit status").
DURABILITY_FAILED = 72

#: The bytes every entry that must reach stable storage in either mode carries: the
#: msgpack encoding of the map item ``"durable": true`` (``server.proposer`` sets it).
#: Searched for in the log command's bytes, which hold our msgpack verbatim (a
#: protocol-4 pickle, ``Replica.propose``; the protocol-2 commands of earlier versions
#: hold it too: UTF-8 encodes U+00A7 as C2 A7 and U+00C3 as C3 83). A payload that
#: happens to contain them only costs an extra sync.
DURABLE_MARK = b"\xa7durable\xc3"


def fsync_path(path: Path, directory: bool = False) -> None:
    """fsync a file or a directory (raises ``OSError``)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: Suffixes of the files ``replace_journal`` writes beside the journal before renaming
#: them over it: log compaction's and the start-up repair's (journal.repair_journal).
COMPACT_SUFFIX = ".compact"
REPAIR_SUFFIX = ".repair"
REWRITE_SUFFIXES = (COMPACT_SUFFIX, REPAIR_SUFFIX)


def remove_stale_rewrites(journal_path: Path) -> list[Path]:
    """Remove the rewrite files (``REWRITE_SUFFIXES``) a crash left beside the journal
    and return their paths. Call at start, before the journal is read.

    A rewrite file is renamed over the journal only after it is whole and synced, so
    one still there at start is one the crash cut before its rename: the journal
    itself is the old one, whole, and the file is garbage that would otherwise stay
    on disk (as large as the log) until the next rewrite of its kind. Raises
    ``OSError`` if one cannot be removed."""
    removed = []
    for suffix in REWRITE_SUFFIXES:
        stale = journal_path.with_name(journal_path.name + suffix)
        if stale.exists():
            stale.unlink()
            removed.append(stale)
            log.info("removed %s, a journal rewrite a crash cut before its rename", stale)
    return removed


class PreallocatedFile(ResizableFile):  # type: ignore[misc]
    """PySyncObj's ``ResizableFile`` (the journal's mmap file), growing by allocating
    the new disk blocks first. Installed on a ``FileJournal``'s file by changing its
    class (``preallocate``); the one method it overrides is the only one that grows.

    Why: PySyncObj grows the file with ``mmap.resize`` (an ``ftruncate``: a sparse
    file) and then writes through the map. On a full disk the kernel cannot back the
    page on that write and the process dies of SIGBUS: no message, no exit status
    (reproduced on a 256 KiB tmpfs, tests/unit/test_durable_journal.py). With the blocks
    allocated first (``posix_fallocate``, which glibc emulates by writing zeros
    where the file system cannot), a full disk is an ``OSError`` before anything is
    written. The journal doubles as it grows, so this runs rarely.

    It also writes without asking the file's size: PySyncObj's ``write`` calls
    ``mmap.size()``, an ``fstat`` of the file, on every write (two per log entry, the
    record and the header), each a system call that lets go of the GIL on the tick
    thread (4 ``fstat`` per 1-thread acquire in an strace of the leader). The map's
    length is the file's size here: the map covers the whole file from the start
    and only this method grows either, both to the same size."""

    def write(self, offset: int, values: bytes) -> None:
        """Raises ``OSError`` (ENOSPC, EFBIG, EIO) if the file must grow and its new
        blocks cannot be allocated; nothing is written then."""
        mapping = self._ResizableFile__mm
        end = offset + len(values)
        if end > len(mapping):
            current = mapping.size()  # the file's size (fstat): rare, so asked
            # PySyncObj's own growth rule: the map then resizes to exactly this size.
            size = max(int(current * self._ResizableFile__resizeFactor), end)
            os.posix_fallocate(self._ResizableFile__f.fileno(), current, size - current)
            mapping.resize(size)
        mapping[offset:end] = values


def preallocate(journal: FileJournal) -> FileJournal:
    """Make ``journal``'s file a ``PreallocatedFile``; returns ``journal``."""
    file = journal._FileJournal__journalFile
    if type(file) is ResizableFile:
        file.__class__ = PreallocatedFile
    return journal


def replace_journal(path: Path, entries: Sequence[tuple[bytes, int, int]], suffix: str) -> None:
    """Make ``entries`` (command, index, term) the journal at ``path``, atomically: a
    new PySyncObj journal written beside it (``path`` + ``suffix``), fsynced, renamed
    over it, the directory fsynced. The disk then holds the old file or the new one,
    whole, whatever a crash interrupts. Raises ``OSError``. Only the journal file: its
    ``.meta`` (term, vote, commit index) is left as it is."""
    tmp = path.with_name(path.name + suffix)
    tmp.unlink(missing_ok=True)
    fresh = preallocate(CompactJournal(str(tmp)))
    try:
        for entry in entries:
            fresh.add(*entry)
    finally:
        fresh._destroy()  # flushes the map (an msync) and closes the file
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(path.parent, directory=True)


#: ``_fail_stop``'s messages: a sync failed; the journal could not grow.
_SYNC_FAILED = (
    "cannot sync %s to stable storage; stopping this node (a failed sync cannot "
    "be retried safely). Check the disk, then restart it."
)
_GROW_FAILED = (
    "cannot grow the journal %s: the disk is full (or the file size limit reached); "
    "stopping this node (PySyncObj cannot refuse an entry, and a write into journal "
    "space the disk has not allocated would kill it with SIGBUS). Free space on the "
    "disk, then restart it: it loads what was synced."
)


def _fail_stop(what: str, problem: str = _SYNC_FAILED) -> NoReturn:
    """Log ``problem`` (a format with ``what``) as CRITICAL with the exception being
    handled, and exit with ``DURABILITY_FAILED``. Never returns."""
    log.critical(problem, what, exc_info=True)
    logging.shutdown()
    os._exit(DURABILITY_FAILED)


class SyncRecorder:
    """Test builds only (hook ``record_synced``): keeps a copy of what reached stable
    storage beside each file (``<name>.synced``), so a simulated power loss
    (``raftlease.testing.power.cut_to_synced``) can cut every file back to it. A
    production node never creates one."""

    SUFFIX = ".synced"
    #: Simulated kernel writeback with durability "none": what was written reaches the
    #: disk every this many seconds (Linux writes back dirty pages once they are 30 s
    #: old, dirty_expire_centisecs). Longer than a short chaos run, so a power loss
    #: there always takes the acknowledged writes since the last real sync.
    WRITEBACK_EVERY = 30

    def journal(
        self, path: Path, read: Callable[[int, int], bytes], ranges: list[tuple[int, int]]
    ) -> None:
        """The journal's byte ranges ``(offset, size)`` reached the disk: exactly the
        ranges the sync declared (``DurableJournal.ranges``), so a simulated power
        loss keeps nothing the sync did not cover. The first sync's ranges start at 0
        (``DurableJournal`` starts with everything unsynced)."""
        shadow = Path(str(path) + self.SUFFIX)
        if not shadow.exists():
            shadow.write_bytes(b"")
        with open(shadow, "r+b") as f:
            for offset, size in ranges:
                f.seek(offset)
                f.write(read(offset, size))

    def copy(self, path: Path) -> None:
        """The whole file at ``path`` reached the disk."""
        if path.exists():
            shutil.copyfile(path, Path(str(path) + self.SUFFIX))


class DurableMetaStorer(MetaStorer):  # type: ignore[misc]
    """PySyncObj's term/vote/commit-index file, written durably."""

    def __init__(self, path: str, recorder: SyncRecorder | None) -> None:
        super().__init__(path)
        self._recorder = recorder

    def storeMeta(self, meta: Any) -> None:
        path = Path(self.getPath())
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(pysyncobj_pickle.dumps(meta))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_path(path.parent, directory=True)
        except OSError:
            _fail_stop(f"the term and vote file {path}")
        if self._recorder is not None:
            self._recorder.copy(path)


class TimedSerializer(Serializer):  # type: ignore[misc]
    """PySyncObj's dump writer, timed for the metrics (server/metrics.py): a snapshot
    lasts from the fork in ``serialize`` to the tick on which ``checkSerializing``
    (parent, tick thread) sees the child's exit. Installed by changing the class of
    PySyncObj's serializer object, in either durability mode."""

    snapshot_started: float | None = None
    snapshots_written = 0
    snapshot_failures = 0
    last_snapshot_seconds: float | None = None

    def serialize(self, data: Any, id: Any) -> None:
        if getattr(self, "_Serializer__pid") == 0:  # noqa: B009 (name-mangled)
            self.snapshot_started = time.monotonic()
        super().serialize(data, id)

    def checkSerializing(self) -> Any:
        status, ident = super().checkSerializing()
        started = self.snapshot_started
        if started is not None and status in (SERIALIZER_STATE.SUCCESS, SERIALIZER_STATE.FAILED):
            self.snapshot_started = None
            if status == SERIALIZER_STATE.SUCCESS:
                self.snapshots_written += 1
                self.last_snapshot_seconds = time.monotonic() - started
            else:
                self.snapshot_failures += 1
        return status, ident


def close_inherited_sockets() -> None:
    """In a forked child that only writes files: close every socket it inherited
    (peer and client connections, the listeners, the event loop's self-pipe). The
    parent keeps its own descriptors; but if the parent is killed while the child
    writes a large dump (seconds with 100,000 leases), the child's copies would keep
    its connections open and its ports accepting: followers would not see the
    leader's connections close (no early election), and clients would wait for an
    answer instead of being refused. The standard streams stay, even when they are
    sockets (systemd's journal): closed, the dump file opened next would take their
    number, and a stray write to stderr would land in the dump. Linux
    (/proc/self/fd); elsewhere nothing."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        try:
            fd = int(name)
            if fd > 2 and stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)
        except (OSError, ValueError):
            pass  # the listing's own descriptor, gone by now


class DurableSerializer(TimedSerializer):
    """PySyncObj's dump writer with an fsync before each rename and of the directory
    after it. Installed on PySyncObj's serializer object by changing its class (its
    state stays); only the file-and-fork path we configure is changed."""

    def serialize(self, data: Any, id: Any) -> None:
        file_name = getattr(self, "_Serializer__fileName")  # noqa: B009 (name-mangled)
        busy = getattr(self, "_Serializer__pid") != 0  # noqa: B009
        if file_name is None or not getattr(self, "_Serializer__useFork") or busy:  # noqa: B009
            super().serialize(data, id)
            return
        self._Serializer__currentID = id
        self.snapshot_started = time.monotonic()
        pid = os.fork()
        if pid != 0:
            self._Serializer__pid = pid
            return
        # The forked child: write, sync, rename, sync the directory, exit.
        close_inherited_sockets()
        try:
            tmp = file_name + ".tmp"
            with open(tmp, "wb") as f:
                with gzip.GzipFile(fileobj=f, mode="wb") as g:
                    pysyncobj_pickle.dump(data, g)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, file_name)
            fsync_path(Path(file_name).parent, directory=True)
        except BaseException:
            os._exit(1)
        os._exit(0)

    def setTransmissionData(self, data: Any) -> bool:
        # The last chunk of a snapshot from the leader is empty (PySyncObj's
        # getTransmissionData): everything is written when it arrives, so sync the
        # file before PySyncObj renames it into place.
        incoming = self._Serializer__incomingTransmissionFile
        if isinstance(data, tuple | list) and len(data) == 3 and data[2] and incoming is not None:
            try:
                incoming.flush()
                os.fsync(incoming.fileno())
            except OSError:
                _fail_stop("a snapshot received from the leader")
        done: bool = super().setTransmissionData(data)
        return done


class DurableJournal:
    """PySyncObj's ``FileJournal`` with a sync that covers everything written since
    the previous one. Same interface (PySyncObj calls it as its journal).

    ``fsync``: every write makes the journal dirty. ``none``: only entries carrying
    ``DURABLE_MARK`` and log rewrites (compaction, snapshot install) do.

    What a sync covers (docs/design.md, "Durability"): PySyncObj writes the journal
    through the map only at the end of the last record (``add``), in the header's
    last-record offset (every write path), and from the first record on when it
    rewrites the file (``clear``); ``deleteEntriesFrom`` moves only the header, and
    compaction (``deleteEntriesTo``) writes a new file, synced before it replaces
    the journal. ``_low`` is the lowest record offset written since the last
    sync, so ``ranges`` (the header's page and the pages from ``_low`` to the end of
    the last record) hold every byte the loader reads that changed since then.
    """

    #: msync the written ranges before the fdatasync. Not on Linux: there a shared
    #: mapping's writes dirty the page-cache pages themselves (mm/msync.c: "MS_SYNC
    #: syncs the entire file - including mappings"; MS_ASYNC "doesn't do anything,
    #: since dirty pages are properly tracked"; "the application may now run fsync()
    #: to write out the dirty pages"), and an msync(MS_SYNC) is itself an fdatasync of
    #: its range (``vfs_fsync_range(..., datasync=1)``), so the two would only sync
    #: twice (measured: 13-22 % more time per sync). POSIX promises only what msync does,
    #: so other systems keep it.
    MSYNC = not sys.platform.startswith("linux")

    def __init__(
        self,
        inner: FileJournal,
        journal_path: Path,
        dump_path: Path,
        durability: str,
        recorder: SyncRecorder | None = None,
    ) -> None:
        # The log lives in the journal's file alone (compact_journal.py).
        self._inner = preallocate(CompactJournal.adopt(inner))
        self._file = inner._FileJournal__journalFile
        self.journal_path = journal_path
        self.dump_path = dump_path
        self.fsync = durability == "fsync"
        self.recorder = recorder
        #: Something written since the last sync that this mode must sync.
        self.dirty = True  # whatever PySyncObj's loader wrote (its first no-op entry)
        #: Lowest journal byte offset written since the last sync (0: everything).
        self._low = 0
        #: Syncs done, and entries they covered (group commit: covered >= syncs).
        self.syncs = 0
        self.covered = 0
        #: Called on the tick thread with each sync's seconds (the node's metrics:
        #: the journal-sync latency histogram); None: not measured.
        self.on_sync: Callable[[float], None] | None = None
        self._unsynced_entries = 0
        self._seconds = 0  # one-second timer calls, for the simulated writeback
        inner._FileJournal__metaStorer = DurableMetaStorer(
            inner._FileJournal__metaStorer.getPath(), recorder
        )

    # --------------------------------------------------------------- syncing

    def _offset(self) -> int:
        offset: int = self._inner._FileJournal__currentOffset
        return offset

    def _touch(self, offset: int, must_sync: bool) -> None:
        self._low = min(self._low, offset)
        if must_sync or self.fsync:
            self.dirty = True

    def sync_if_dirty(self) -> None:
        """Sync if anything this mode must sync was written since the last sync."""
        if self.dirty:
            self.sync()

    def ranges(self) -> list[tuple[int, int]]:
        """The journal's byte ranges ``(offset, size)`` written since the last sync,
        widened to whole pages (msync's unit): the header's page (its last-record
        offset changes on every write) and the pages from ``_low`` to the end of the
        last record, merged when they touch. Bytes past the last record are not the
        loader's (their pages are covered only where they share one with a record)."""
        page = mmap.ALLOCATIONGRANULARITY
        high = self._offset()
        start = self._low - self._low % page
        if start <= page:
            return [(0, high)]
        return [(0, page), (start, high - start)]

    def sync(self) -> None:
        """Make everything written so far durable: msync the ranges written since the
        last sync where that is needed (``MSYNC``), then fdatasync the file (its size
        may have grown). Runs on the tick thread and blocks it for the disk's sync
        time. Stops the process if the kernel reports an error (never raises)."""
        started = time.monotonic()
        try:
            if self.MSYNC:
                mapping = self._file._ResizableFile__mm
                for offset, size in self.ranges():
                    mapping.flush(offset, size)
            os.fdatasync(self._file._ResizableFile__f.fileno())
        except (OSError, ValueError):
            _fail_stop(f"the journal {self.journal_path}")
        on_sync = self.on_sync
        if on_sync is not None:
            on_sync(time.monotonic() - started)
        self.syncs += 1
        self.covered += self._unsynced_entries
        self._unsynced_entries = 0
        self.dirty = False
        self._record()

    def _record(self) -> None:
        if self.recorder is not None:
            self.recorder.journal(self.journal_path, self._file.read, self.ranges())
        self._low = self._offset()

    def sync_dump(self) -> None:
        """The dump was renamed into place by PySyncObj (after our fsync of its data,
        ``DurableSerializer``): fsync the directory so the rename itself is durable,
        before the journal is rewritten to match it."""
        try:
            if self.dump_path.exists():
                fsync_path(self.dump_path)
            fsync_path(self.dump_path.parent, directory=True)
        except OSError:
            _fail_stop(f"the snapshot {self.dump_path}")
        if self.recorder is not None:
            self.recorder.copy(self.dump_path)

    # ------------------------------------------------ the Journal interface

    def add(self, command: bytes, idx: int, term: int) -> None:
        """Stops the process (``DURABILITY_FAILED``) if the journal cannot grow: a
        full disk (``PreallocatedFile``); PySyncObj has no way to refuse an entry."""
        self._touch(self._offset(), DURABLE_MARK in command)
        self._unsynced_entries += 1
        try:
            self._inner.add(command, idx, term)
        except OSError:
            _fail_stop(str(self.journal_path), _GROW_FAILED)

    def clear(self) -> None:
        # PySyncObj clears the journal to load a dump: at start when they disagree,
        # or for a snapshot the leader sent (already renamed into place).
        self.sync_dump()
        self._inner.clear()
        self._touch(FIRST_RECORD_OFFSET, True)
        self.release_tail()

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        self._inner.deleteEntriesFrom(entryFrom)
        self._touch(self._offset(), True)

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Log compaction (the dump was just written by the forked child): keep the
        entries from list position ``entryTo`` on, in a new journal file.

        PySyncObj rewrites its journal in place from the first record (``clear``,
        then each kept entry again). The kept entries are the log after the dump,
        acknowledged ones among them, and a power loss before the sync that follows
        could leave any mix of the rewrite's pages and the old ones (the kernel
        writes pages back in any order): the repair at start would then keep only
        the kept entries that happen to precede the first torn page, or an older
        head the loader discards. So they are written to a new file, synced, renamed
        over the journal and the directory synced: the disk holds the old journal
        or the new one, whole (docs/design.md, "Durability"). Stops the process if
        a sync or the rename fails (never raises)."""
        self.sync_dump()
        old = self._inner
        try:
            replace_journal(self.journal_path, old[entryTo:], COMPACT_SUFFIX)
        except OSError:
            _fail_stop(f"the journal {self.journal_path}")
        old._destroy()
        inner = preallocate(CompactJournal(str(self.journal_path)))
        # The term, vote and commit index stay the old object's (saved or not yet),
        # written through the same durable storer.
        for name in ("__metaStorer", "__meta", "__metaSaved"):
            setattr(inner, "_FileJournal" + name, getattr(old, "_FileJournal" + name))
        self._inner = inner
        self._file = inner._FileJournal__journalFile
        # The new file's fsync is a sync like any other: it covered the entries
        # written since the last one (those it kept; the dump covers the others).
        self.syncs += 1
        self.covered += self._unsynced_entries
        self._unsynced_entries = 0
        self.dirty = False
        self._low = self._offset()
        if self.recorder is not None:
            self.recorder.copy(self.journal_path)

    def release_tail(self) -> int:
        """Unmap the journal's pages past the last record from this process (return
        how many bytes that covered); called after a rewrite to the start.

        PySyncObj's file only grows (doubling), and its map keeps every page it ever
        wrote resident: after the load of 100,000 leases and a compaction, about
        19 MiB of dead records counted in the node's RSS. ``MADV_DONTNEED`` on a
        shared file mapping drops only this process's mapping of those pages: they
        stay in the page cache (dirty ones are still written back), a later read
        sees the file's bytes and a later write faults the page back in, so nothing
        the loader or a sync sees changes. Best effort: where madvise is missing or
        refuses, nothing happens."""
        mapping = self._file._ResizableFile__mm
        page = mmap.PAGESIZE
        start = -(-self._offset() // page) * page
        size = len(mapping) - start
        if size <= 0 or not hasattr(mapping, "madvise"):
            return 0
        try:
            mapping.madvise(mmap.MADV_DONTNEED, start, size)
        except (OSError, ValueError):
            return 0
        return size

    def __getitem__(self, item: Any) -> Any:
        return self._inner[item]

    def __len__(self) -> int:
        return len(self._inner)

    def _destroy(self) -> None:
        self._inner._destroy()

    def flush(self) -> None:
        self._inner.flush()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        # Called before PySyncObj applies (and so answers) anything up to the new
        # commit index: a leader's own entries are durable before it counts itself.
        self.sync_if_dirty()
        self._inner.setRaftCommitIndex(raftCommitIndex)

    def getRaftCommitIndex(self) -> int:
        index: int = self._inner.getRaftCommitIndex()
        return index

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        self._inner.setCurrentTerm(term, votedForNodeId)

    def getCurrentTerm(self) -> int:
        term: int = self._inner.getCurrentTerm()
        return term

    def getVotedForNodeId(self) -> Any:
        return self._inner.getVotedForNodeId()

    def onOneSecondTimer(self) -> None:
        self._inner.onOneSecondTimer()
        # The log's records older than the last second or so leave this process's
        # resident set (they stay in the page cache and are read back on demand).
        self._inner.release()
        if self.recorder is not None and not self.fsync:
            # Test builds with "none": take the page cache as written back by the
            # kernel every WRITEBACK_EVERY seconds, as dirty pages reach the disk anyway.
            self._seconds += 1
            if self._seconds % self.recorder.WRITEBACK_EVERY == 0:
                self._record()
                self.recorder.copy(self.dump_path)


def install(sync: Any, durability: str, recorder: SyncRecorder | None = None) -> DurableJournal:
    """Put a ``DurableJournal`` in place of ``sync``'s journal and make its dump writer
    sync (``DurableSerializer``). Call from inside ``SyncObj.__init__`` (our
    transport's constructor), before PySyncObj's tick thread starts. Raises
    ``TypeError`` if PySyncObj's internals are not what tests/fitness/test_pysyncobj_contract.py
    checks."""
    inner = sync._SyncObj__raftLog
    if not isinstance(inner, FileJournal):
        raise TypeError(f"expected PySyncObj's FileJournal, got {type(inner).__name__}")
    conf = sync._SyncObj__conf
    journal = DurableJournal(
        inner, Path(conf.journalFile), Path(conf.fullDumpFile), durability, recorder
    )
    sync._SyncObj__raftLog = journal
    serializer = sync._SyncObj__serializer
    if type(serializer) is not Serializer:
        raise TypeError(f"expected PySyncObj's Serializer, got {type(serializer).__name__}")
    serializer.__class__ = DurableSerializer if durability == "fsync" else TimedSerializer
    return journal
