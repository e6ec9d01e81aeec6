"""PySyncObj's journal with the log kept in its file only (``CompactJournal``).

PySyncObj's ``FileJournal`` writes each entry to its mmap'ed file and also keeps it
in a Python list, ``(command, index, term)``, until a log compaction cuts the log:
a tuple, a bytes object and an int per entry, about 140 bytes plus the command's own
length, on top of the record in the map. A node that has just taken 100,000 leases
holds all of their entries until its next compaction (``compaction_min_entries``
entries or ``compaction_min_time`` seconds, each node in its own time slot): 30-35 MiB
per node over its settled size, measured with the memory benchmark. The entries are
what the file already holds, byte for byte, so ``CompactJournal`` keeps only each
record's offset in the file (8 bytes an entry, in an ``array``) and reads an entry
back from the map when PySyncObj asks for it (``__getitem__``): the same tuple, the
same bytes. The map's own pages are then the log's only copy in the process, and
``release`` hands those of older records back to the page cache (the node calls it
once a second, ``DurableJournal.onOneSecondTimer``).

The file format is PySyncObj's, unchanged (a ``FileJournal`` and every reader of the
journal load a ``CompactJournal``'s file and the reverse). The term, vote and commit
index (``.meta``) are the parent's, untouched.

Threads: as PySyncObj's journal, used only on PySyncObj's tick thread (and the
constructor by whoever builds it).
"""

from __future__ import annotations

import contextlib
import mmap
import struct
import threading
from array import array
from collections.abc import Iterator
from typing import Any, overload

from pysyncobj import syncobj as syncobj_module
from pysyncobj.journal import (
    FIRST_RECORD_OFFSET,
    FileJournal,
    MemoryJournal,
    MetaStorer,
    ResizableFile,
)
from pysyncobj.pickle import to_bytes

#: A record: its length (of index, term and command), then index and term.
_HEAD = struct.Struct("<IQQ")
_LENGTH = struct.Struct("<I")
_INDEX_TERM = struct.Struct("<QQ")

#: Bytes of the newest records ``release`` leaves mapped: what the leader sends its
#: followers and applies next is read from resident pages, not faulted back in.
RELEASE_KEEP = 1 << 20
#: A ``LogView`` walked this many bytes of the file calls ``release`` on its way.
ITER_RELEASE = 4 << 20


Entry = tuple[bytes, int, int]


class LogView:
    """The entries of a slice of a ``CompactJournal``, read from its file as they are
    asked for: what the journal's ``__getitem__`` returns for a slice. PySyncObj slices
    the log to the end and then iterates (``__getEntries``: for a follower far behind,
    tens of thousands of entries, of which it sends what fits one batch), so a list
    would read every entry up front. Supports ``len``, iteration, ``reversed`` and an
    int index (negative from the end); a slice of a view is a list (PySyncObj puts
    those in its messages, which are pickled). The record offsets are taken at the
    slice: read it before the log is cut or rewritten (PySyncObj does, within a
    tick)."""

    __slots__ = ("_journal", "_offsets")

    def __init__(self, journal: CompactJournal, offsets: array[int]) -> None:
        self._journal = journal
        self._offsets = offsets

    def __len__(self) -> int:
        return len(self._offsets)

    @overload
    def __getitem__(self, item: int) -> Entry: ...

    @overload
    def __getitem__(self, item: slice) -> list[Entry]: ...

    def __getitem__(self, item: int | slice) -> Entry | list[Entry]:
        read, mapping = self._journal._entry, self._journal._map()
        if isinstance(item, slice):
            return [read(mapping, offset) for offset in self._offsets[item]]
        return read(mapping, self._offsets[item])

    def __iter__(self) -> Iterator[Entry]:
        read, journal = self._journal._entry, self._journal
        mark = self._offsets[0] if self._offsets else 0
        for offset in self._offsets:
            if offset - mark >= ITER_RELEASE:
                # A long walk (a node replaying its journal at start: every entry in
                # one tick) drops the pages it has read as it goes, not a second later.
                journal.release()
                mark = offset
            yield read(journal._map(), offset)

    def __reversed__(self) -> Iterator[Entry]:
        read, journal = self._journal._entry, self._journal
        for offset in reversed(self._offsets):
            yield read(journal._map(), offset)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LogView):
            return list(self) == list(other)
        return isinstance(other, list) and list(self) == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LogView({len(self)} entries)"


class CompactJournal(FileJournal):  # type: ignore[misc]
    """A ``FileJournal`` whose entries live in its file alone (module docstring).
    Same interface and file; ``__getitem__`` takes an int (negative counts from the
    end) and returns a ``(command, index, term)`` tuple, as the list did, or a slice
    and returns a ``LogView`` of the entries (a sequence read on demand). Raises
    ``IndexError`` for an index out of range; ``OSError`` from the file."""

    def __init__(self, journalFile: str) -> None:
        # PySyncObj's constructor, without the list: the file, its meta, then the
        # offsets of the records up to the header's last-record offset.
        self._FileJournal__journalFile = ResizableFile(
            journalFile, defaultContent=self._FileJournal__getDefaultHeader()
        )
        self._FileJournal__metaStorer = MetaStorer(journalFile + ".meta")
        self._FileJournal__meta = self._FileJournal__metaStorer.getMeta()
        self._FileJournal__metaSaved = True
        self._offsets = array("Q")
        self._head: tuple[int, Entry] | None = None
        self._tail: tuple[int, Entry] | None = None
        self._scan()

    @classmethod
    def adopt(cls, journal: FileJournal) -> CompactJournal:
        """Turn PySyncObj's loaded ``journal`` into a ``CompactJournal`` in place (its
        file, meta and offsets stay; its list of entries is dropped). Returns it (as
        it is if it is one already)."""
        if isinstance(journal, CompactJournal):
            return journal
        journal.__class__ = cls
        compact: CompactJournal = journal
        compact._offsets = array("Q")
        compact._head = compact._tail = None
        compact._scan()
        del compact._FileJournal__journal
        return compact

    def _scan(self) -> None:
        """Record the offset of each record from the first to the header's last-record
        offset (as PySyncObj's loader walks them), and set the write offset after it."""
        file = self._FileJournal__journalFile
        end = self._FileJournal__getLastRecordOffset()
        offsets = self._offsets
        offset = FIRST_RECORD_OFFSET
        while offset < end:
            offsets.append(offset)
            (size,) = _LENGTH.unpack(file.read(offset, 4))
            offset += size + 8
        self._FileJournal__currentOffset = offset

    def _map(self) -> Any:
        # Looked up on each read: ResizableFile replaces its map when it grows by
        # reopening the file (where mmap.resize is refused).
        mapping = self._FileJournal__journalFile._ResizableFile__mm
        if mapping.closed:
            # Destroyed (PySyncObj's destroy, at shutdown): a tick still running reads
            # the log as it could from the list, through a read-only map of the file.
            mapping = self._closed_map()
        return mapping

    def _closed_map(self) -> Any:
        mapping = getattr(self, "_read_only", None)
        if mapping is None:
            file = self._FileJournal__journalFile
            with open(file._ResizableFile__fileName, "rb") as f:
                mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._read_only = mapping
        return mapping

    def _entry(self, mapping: Any, offset: int) -> Entry:
        size, index, term = _HEAD.unpack_from(mapping, offset)
        return mapping[offset + 20 : offset + 4 + size], index, term

    # ------------------------------------------------ PySyncObj's Journal API

    def add(self, command: bytes, idx: int, term: int) -> None:
        """Append a record to the file (PySyncObj's framing). Raises ``OSError`` if the
        file cannot grow; the entry is then not in the log."""
        data = _INDEX_TERM.pack(idx, term) + to_bytes(command)
        length = _LENGTH.pack(len(data))
        record = length + data + length
        offset: int = self._FileJournal__currentOffset
        self._FileJournal__journalFile.write(offset, record)
        self._offsets.append(offset)
        self._FileJournal__currentOffset = offset + len(record)
        self._FileJournal__setLastRecordOffset(offset + len(record))
        self._tail = (offset, (command, idx, term))

    def clear(self) -> None:
        self._offsets = array("Q")
        self._FileJournal__setLastRecordOffset(FIRST_RECORD_OFFSET)
        self._FileJournal__currentOffset = FIRST_RECORD_OFFSET
        self._head = self._tail = None

    @overload
    def __getitem__(self, item: int) -> Entry: ...

    @overload
    def __getitem__(self, item: slice) -> LogView: ...

    def __getitem__(self, item: int | slice) -> Entry | LogView:
        if isinstance(item, slice):
            return LogView(self, self._offsets[item])
        # The first and the last entry are asked for on every tick (PySyncObj's
        # current log index and term, the start of every __getEntries): kept, with
        # the offset they were read or written at, so they cost no read. Every write
        # at an offset is an ``add``, which replaces the last one; ``clear`` and
        # ``deleteEntriesFrom`` forget both.
        offset = self._offsets[item]
        for cached in (self._tail, self._head):
            if cached is not None and cached[0] == offset:
                return cached[1]
        entry = self._entry(self._map(), offset)
        if offset == FIRST_RECORD_OFFSET:
            self._head = (offset, entry)
        elif offset == self._offsets[-1]:
            self._tail = (offset, entry)
        return entry

    def __len__(self) -> int:
        return len(self._offsets)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """Cut the log from list position ``entryFrom`` on (the header's last-record
        offset moves back; the bytes stay until overwritten, as in PySyncObj)."""
        start = slice(entryFrom, None).indices(len(self._offsets))[0]
        if start >= len(self._offsets):
            return
        offset = self._offsets[start]
        del self._offsets[start:]
        self._head = self._tail = None
        self._FileJournal__currentOffset = offset
        self._FileJournal__setLastRecordOffset(offset)

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Keep the entries from list position ``entryTo`` on, rewritten from the
        file's start in place (PySyncObj's way; ``DurableJournal`` writes a new file
        instead)."""
        kept = list(self[entryTo:])
        self.clear()
        for entry in kept:
            self.add(*entry)

    # ------------------------------------------------------------ residency

    def release(self, keep: int = RELEASE_KEEP) -> int:
        """Drop this process's mapping of the file's pages from the first whole page
        after the header up to ``keep`` bytes before the end of the last record;
        return how many bytes that covered (pages a read faulted back in since the
        last call go again; the kernel skips those not mapped).

        ``MADV_DONTNEED`` on a shared file mapping unmaps the pages from this process
        only: they stay in the page cache, a dirty one is still written back (and
        synced by the next fdatasync), a later read of an entry faults the page back
        in from the cache (or the disk), a later write likewise. So what a reader or a
        sync sees does not change; only this process's resident set shrinks. The
        header's page stays (every append writes it). Best effort: where madvise is
        missing or refuses, nothing happens."""
        page = mmap.PAGESIZE
        current: int = self._FileJournal__currentOffset
        end = current - keep
        end -= end % page
        start = page
        if end <= start:
            return 0
        mapping = self._map()
        if not hasattr(mapping, "madvise"):
            return 0
        try:
            mapping.madvise(mmap.MADV_DONTNEED, start, end - start)
        except (OSError, ValueError):
            return 0
        return end - start


_CREATING = threading.Lock()


def _create_journal(journalFile: str | None = None) -> Any:
    """PySyncObj's ``createJournal``, with a ``CompactJournal`` for a file."""
    return MemoryJournal() if journalFile is None else CompactJournal(journalFile)


@contextlib.contextmanager
def compact_journals() -> Iterator[None]:
    """While inside, a ``SyncObj`` constructed loads its journal file as a
    ``CompactJournal`` (PySyncObj's constructor calls its module's ``createJournal``;
    it is swapped for the duration, one constructor at a time). Without it PySyncObj
    first loads every entry of the file into its list (which ``DurableJournal`` then
    drops): a node restarting with 100,000 entries in its journal went ~30 MiB above
    what it holds once started, and kept most of it. Blocks while another thread is
    inside."""
    with _CREATING:
        original = syncobj_module.createJournal
        syncobj_module.createJournal = _create_journal
        try:
            yield
        finally:
            syncobj_module.createJournal = original
