"""The durable journal seam without a cluster: what is synced when, in each mode,
what a test build records, and the torn-tail repair at start."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from pysyncobj.journal import LAST_RECORD_OFFSET_OFFSET, FileJournal

from raftlease.replication import DURABLE_MARK, DurableJournal, SyncRecorder
from raftlease.replication.journal import trim_torn_tail
from raftlease.testing.power import cut_to_synced


def journal(tmp_path: Path, mode: str, recorder: SyncRecorder | None = None) -> DurableJournal:
    inner = FileJournal(str(tmp_path / "raft.journal"))
    return DurableJournal(inner, tmp_path / "raft.journal", tmp_path / "raft.dump", mode, recorder)


def entries(path: Path) -> list[tuple[bytes, int, int]]:
    j = FileJournal(str(path))
    try:
        return [j[i] for i in range(len(j))]
    finally:
        j._destroy()


def test_fsync_mode_syncs_once_for_everything_since_the_last_sync(tmp_path: Path) -> None:
    j = journal(tmp_path, "fsync")
    j.sync_if_dirty()  # the loader's state
    assert j.syncs == 1 and not j.dirty
    for i in range(1, 6):
        j.add(b"\x01cmd", i, 1)
    assert j.dirty
    j.sync_if_dirty()
    j.sync_if_dirty()  # nothing new: no second sync
    assert (j.syncs, j.covered) == (2, 5)
    j.setRaftCommitIndex(5)  # a commit with nothing unsynced does not sync again
    assert j.syncs == 2
    j.add(b"\x01more", 6, 1)
    j.setRaftCommitIndex(6)  # but never commits past an unsynced entry
    assert j.syncs == 3 and not j.dirty
    j._destroy()


def test_none_mode_syncs_only_marked_entries_and_rewrites(tmp_path: Path) -> None:
    j = journal(tmp_path, "none")
    j.sync_if_dirty()
    j.add(b"\x01plain", 1, 1)
    assert not j.dirty
    j.add(b"\x01" + b"xx" + DURABLE_MARK + b"yy", 2, 1)
    assert j.dirty
    j.sync_if_dirty()
    j.deleteEntriesFrom(1)  # a truncation rewrites the log: always synced
    assert j.dirty
    j._destroy()


def test_the_recorder_keeps_exactly_what_was_synced(tmp_path: Path) -> None:
    j = journal(tmp_path, "fsync", SyncRecorder())
    for i in range(1, 4):
        j.add(b"\x01synced", i, 1)
    j.sync()
    j.add(b"\x01lost", 4, 1)  # written, never synced
    j._destroy()
    assert [e[1] for e in entries(tmp_path / "raft.journal")] == [1, 2, 3, 4]
    cut = cut_to_synced(tmp_path)
    assert cut["raft.journal"]["after"] is not None
    assert [e[1] for e in entries(tmp_path / "raft.journal")] == [1, 2, 3]


def test_a_node_that_never_synced_loses_its_files(tmp_path: Path) -> None:
    (tmp_path / "raft.journal").write_bytes(b"x" * 100)
    (tmp_path / "running").write_text("boot-a\n")
    cut_to_synced(tmp_path)
    assert not (tmp_path / "raft.journal").exists()
    assert (tmp_path / "running").read_text() == "simulated-power-loss\n"


@pytest.mark.parametrize("damage", ["zeros", "short", "bad-suffix", "index-gap"])
def test_a_torn_tail_is_cut_to_the_last_whole_record(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "raft.journal"
    j = FileJournal(str(path))
    for i in range(1, 5):
        j.add(b"\x01entry-%d" % i, i, 1)
    j._destroy()
    data = bytearray(path.read_bytes())
    (last,) = struct.unpack_from("<I", data, LAST_RECORD_OFFSET_OFFSET)
    record = 4 + 16 + len(b"\x01entry-4") + 4
    start = last - record
    if damage == "zeros":  # the header reached the disk, the last record did not
        data[start:last] = b"\0" * record
    elif damage == "short":  # the header claims more than the file holds
        struct.pack_into("<I", data, LAST_RECORD_OFFSET_OFFSET, len(data) + 100)
        data = data[:last]
    elif damage == "bad-suffix":
        data[last - 4 : last] = b"\xff\xff\xff\xff"
    else:  # an older record left in place: its index does not follow
        struct.pack_into("<Q", data, start + 4, 99)
    path.write_bytes(bytes(data))
    assert trim_torn_tail(path) > 0
    kept = [e[1] for e in entries(path)]
    assert kept == ([1, 2, 3, 4] if damage == "short" else [1, 2, 3])
    assert trim_torn_tail(path) == 0  # whole now: left alone


def test_a_whole_journal_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    j = FileJournal(str(path))
    for i in range(1, 4):
        j.add(b"\x01e", i, 1)
    j._destroy()
    before = path.read_bytes()
    assert trim_torn_tail(path) == 0
    assert path.read_bytes() == before
    assert trim_torn_tail(tmp_path / "missing") == 0


def mapped_rss_kib(path: Path) -> int:
    """Resident KiB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):
            inside = len(fields) > 5 and fields[5] == str(path)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux /proc only")
@pytest.mark.parametrize("mode", ["fsync", "none"])
def test_a_compaction_hands_the_dead_pages_back(tmp_path: Path, mode: str) -> None:
    """After a compaction the pages of dead records leave the node's RSS (they were
    19 MiB of it after 100,000 leases), and the journal still loads the same."""
    j = journal(tmp_path, mode)
    path = (tmp_path / "raft.journal").resolve()
    record = b"\x01" + b"r" * 1000
    for i in range(1, 8001):
        j.add(record + str(i).encode(), i, 1)
    j.sync()
    before = mapped_rss_kib(path)
    assert before > 6_000, before  # ~8 MB of records written through the map
    j.deleteEntriesTo(7990)  # PySyncObj's compaction: the last 10 records move up
    j.sync_if_dirty()
    after = mapped_rss_kib(path)
    assert after < 200, (before, after)
    # Nothing the loader reads changed, and appending past the released pages works.
    j.add(record + b"next", 8001, 2)
    j.sync_if_dirty()
    j._destroy()
    kept = entries(path)
    assert [(idx, term) for _, idx, term in kept] == [(i, 1) for i in range(7991, 8001)] + [
        (8001, 2)
    ]
    assert kept[0][0] == record + b"7991" and kept[-1][0] == record + b"next"
