"""The durable journal seam without a cluster: what is synced when, in each mode,
what a test build records, and the torn-tail repair at start.

The unit half of these tests (no process); the integration half is
tests/integration/test_durable_journal.py."""

from __future__ import annotations

import gzip
import logging
import os
import pickle
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.journal import FIRST_RECORD_OFFSET, LAST_RECORD_OFFSET_OFFSET, FileJournal

from raftlease.replication import DURABILITY_FAILED, DURABLE_MARK, DurableJournal, SyncRecorder
from raftlease.replication.backup import RAFT_STATE_FILES, read_journal
from raftlease.replication.durable import REWRITE_SUFFIXES, remove_stale_rewrites
from raftlease.replication.journal import (
    REGULAR_COMMAND,
    UnusableFiles,
    check_start_files,
    clamp_commit_index,
    command_intact,
    seal_command,
    trim_torn_tail,
)
from raftlease.testing.power import PAGE, SECTOR, cut_to_synced


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
    data = _sealed_journal(path, 4)
    (last,) = struct.unpack_from("<I", data, LAST_RECORD_OFFSET_OFFSET)
    record = 4 + 16 + len(_sealed(b"entry-4")) + 4
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
    j.add(b"\x01", 1, 1)  # PySyncObj's no-op
    j.add(bytes([REGULAR_COMMAND]) + pickle.dumps((7, (b"e",)), 2), 2, 1)  # unsealed kinds
    j.add(bytes([REGULAR_COMMAND]) + pickle.dumps((7, (b"e",)), 4), 3, 1)
    j.add(_sealed(b"e"), 4, 1)
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


def _sealed_journal(path: Path, count: int) -> bytearray:
    """A journal at ``path`` of sealed entries ``entry-1`` .. ``entry-<count>`` (term 1),
    and its bytes."""
    j = FileJournal(str(path))
    for i in range(1, count + 1):
        j.add(_sealed(b"entry-%d" % i), i, 1)
    j._destroy()
    return bytearray(path.read_bytes())


def _sealed(data: bytes) -> bytes:
    """A regular command as ``Replica.propose`` builds it (PySyncObj prepends the type)."""
    return bytes([REGULAR_COMMAND]) + seal_command((7, (data,)))


@pytest.mark.parametrize("middle", ["zeros", "older"])
def test_a_record_whose_middle_page_never_reached_the_disk_is_cut(
    tmp_path: Path, middle: str
) -> None:
    """A record over several pages whose first and last pages reached the disk and a
    page between them did not (power lost before its sync): framing, index and term
    all look whole, only the seal tells. Without it the node would keep the entry
    (the leader's has the same term) and apply bytes no other node applied."""
    path = tmp_path / "raft.journal"
    j = FileJournal(str(path))
    j.add(_sealed(b"small"), 1, 1)
    j.add(_sealed(bytes(range(256)) * 48), 2, 1)  # 12 KiB: spans four pages
    j._destroy()
    data = bytearray(path.read_bytes())
    (last,) = struct.unpack_from("<I", data, LAST_RECORD_OFFSET_OFFSET)
    page = 4096
    start = last - (4 + 16 + len(_sealed(bytes(range(256)) * 48)) + 4)
    hole = (start // page + 2) * page  # a page strictly inside the record
    assert start + 4 + 20 < hole and hole + page < last - 12
    data[hole : hole + page] = b"\0" * page if middle == "zeros" else b"\xab" * page
    path.write_bytes(bytes(data))
    # Framing alone would keep it: this is the case the seal exists for.
    records = read_journal(path)
    assert [r[1] for r in records] == [1]
    assert trim_torn_tail(path) > 0
    assert [e[1] for e in entries(path)] == [1]
    assert trim_torn_tail(path) == 0


def test_sealed_commands_load_as_plain_pickles_and_check_their_seal() -> None:
    command = _sealed(b"entry")
    assert pickle.loads(command[1:]) == (7, (b"entry",))  # the seal is ignored
    assert pysyncobj_pickle.loads(command[1:]) == (7, (b"entry",))
    assert command_intact(command)
    assert not command_intact(command[:-1] + bytes([command[-1] ^ 1]))  # CRC differs
    assert not command_intact(command[:-8])  # protocol 5 without its seal
    flipped = bytearray(command)
    flipped[12] ^= 0x40
    assert not command_intact(bytes(flipped))
    assert not command_intact(bytes(12) + command[12:])  # its start lost: zeros
    # Earlier versions' commands (protocols 2 and 4, no seal) and PySyncObj's own,
    # whole only in full.
    for protocol in (2, 4):
        old = bytes([REGULAR_COMMAND]) + pickle.dumps((7, (b"e",)), protocol)
        assert command_intact(old)
        assert not command_intact(old[:-1])  # its end lost
        assert not command_intact(bytes(4) + old[4:])
    membership = bytes([2]) + pysyncobj_pickle.dumps(["add", "n4", "127.0.0.1:7000"])
    assert command_intact(membership) and command_intact(bytes([3]) + pysyncobj_pickle.dumps(2))
    assert command_intact(b"\x01")  # a no-op
    assert not command_intact(b"\x01\x00\x00")
    assert not command_intact(b"") and not command_intact(b"\x09" + command[1:-8])


@pytest.mark.parametrize("unit", [PAGE, SECTOR])
def test_a_power_loss_with_torn_writes_keeps_every_synced_record_and_no_garbage(
    tmp_path: Path, unit: int
) -> None:
    """``cut_to_synced`` with a writeback source keeps a random half of the journal
    pages (or sectors: a page torn by the disk) written since the last sync (the
    kernel may have written any of them back). Over many draws: what was synced
    always survives, the start's repair then leaves only records exactly as written,
    and some draws tear a record it must cut."""
    source = tmp_path / "source"
    source.mkdir()
    j = journal(source, "fsync", SyncRecorder())
    synced = [_sealed(b"s%d" % i * 300) for i in range(1, 6)]
    for i, command in enumerate(synced, 1):
        j.add(command, i, 1)
    j.sync()
    unsynced = [_sealed(bytes([i]) * 9000) for i in range(6, 10)]  # three pages each
    for i, command in enumerate(unsynced, 6):
        j.add(command, i, 1)
    j._destroy()
    written = dict(enumerate(synced + unsynced, 1))
    cut_records = kept_pages = 0
    for seed in range(40):
        node = tmp_path / f"seed{seed}"
        shutil.copytree(source, node)
        cut = cut_to_synced(node, random.Random(seed), unit)
        kept_pages += cut["raft.journal"]["unsynced_pages_kept"]
        cut_records += trim_torn_tail(node / "raft.journal") > 0
        records = entries(node / "raft.journal")
        assert [r[1] for r in records][:5] == [1, 2, 3, 4, 5], f"seed {seed}: synced lost"
        for command, index, _term in records:
            assert command == written[index], f"seed {seed}: entry {index} is not as written"
    assert kept_pages > 0 and cut_records > 0, (kept_pages, cut_records)


@pytest.mark.parametrize("before_page_end", [13, 17, 22])
def test_a_torn_record_whose_start_straddles_a_page_is_cut(
    tmp_path: Path, before_page_end: int
) -> None:
    """A record starting a few bytes before a page's end has its length and index on
    that page and its term's high bytes, type byte and pickle header on the next: if
    that next page never reached the disk, the command starts with zeros. The seal at
    its end (on the record's last page, with the length suffix) still decides."""
    path = tmp_path / "raft.journal"
    start = 2 * 4096 - before_page_end
    need = start - FIRST_RECORD_OFFSET - 24  # the first record's command fills up to it
    filler = next(c for n in range(need, 0, -1) if len(c := _sealed(b"a" * n)) == need)
    big = _sealed(bytes(range(256)) * 48)
    j = FileJournal(str(path))
    j.add(filler, 1, 1)
    j.add(big, 2, 1)
    j._destroy()
    data = bytearray(path.read_bytes())
    (last,) = struct.unpack_from("<I", data, LAST_RECORD_OFFSET_OFFSET)
    assert last - (24 + len(big)) == start
    data[2 * 4096 : 3 * 4096] = bytes(4096)  # the page after the record's first
    path.write_bytes(bytes(data))
    assert [r[1] for r in read_journal(path)] == [1]
    assert trim_torn_tail(path) > 0
    assert [e[1] for e in entries(path)] == [1]


def test_a_power_loss_during_a_compaction_keeps_every_entry_after_the_dump(
    tmp_path: Path,
) -> None:
    """Log compaction keeps the entries after the dump, acknowledged ones among them.
    PySyncObj rewrites its journal in place from the first record, so a power loss
    before the next sync could leave any mix of old and rewritten pages and lose
    them; ``DurableJournal.deleteEntriesTo`` writes a new file, syncs it and renames
    it over the journal instead. Whatever pages of the time since survive (here a
    random half, 40 draws), the journal holds every kept entry after the loss."""
    source = tmp_path / "source"
    source.mkdir()
    j = journal(source, "fsync", SyncRecorder())
    for i in range(1, 61):
        j.add(_sealed(b"%d" % i * 150), i, 1)
    j.sync()  # 1..60 on disk, acknowledged
    j.deleteEntriesTo(40)  # the dump covers 1..40: keep 41..60
    assert [e[1] for e in (j[k] for k in range(len(j)))] == list(range(41, 61))
    assert not j.dirty  # nothing of the compaction is left to sync
    j.add(_sealed(b"after"), 61, 1)  # and the journal goes on from there
    j._destroy()
    for seed in range(40):
        node = tmp_path / f"seed{seed}"
        shutil.copytree(source, node)
        cut_to_synced(node, random.Random(seed))
        trim_torn_tail(node / "raft.journal")
        kept = [e[1] for e in entries(node / "raft.journal")]
        # (An older head before 41, the old journal whole, the start's repair_journal
        # cuts against the dump; losing any of 41..60 nothing could repair.)
        assert set(range(41, 61)) <= set(kept), f"seed {seed}: after the loss {kept}"


def test_a_failed_sync_stops_the_node_with_its_own_exit_status(tmp_path: Path) -> None:
    """A sync the kernel fails stops the process (a retry could report success for
    pages the kernel dropped) with a status of its own, listed in docs/operations.md
    beside the other fatal ones, so a supervisor tells a disk error from an upgrade."""
    from raftlease.replication.replica import ENTRY_FORMAT_TOO_NEW, SNAPSHOT_LOAD_FAILED

    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from pysyncobj.journal import FileJournal\n"
        "from raftlease.replication import DurableJournal\n"
        f"d = Path({str(tmp_path)!r})\n"
        "j = DurableJournal(FileJournal(str(d / 'raft.journal')), d / 'raft.journal',"
        " d / 'raft.dump', 'fsync')\n"
        "def fail(fd): raise OSError(5, 'Input/output error')\n"
        "os.fdatasync = fail\n"
        "j.add(b'\\x01', 1, 1)\n"
        "j.sync()\n"
        "sys.exit(0)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == DURABILITY_FAILED, done.stderr.decode()
    assert b"cannot sync" in done.stderr
    fatal = {SNAPSHOT_LOAD_FAILED, ENTRY_FORMAT_TOO_NEW, DURABILITY_FAILED}
    assert len(fatal) == 3 and not fatal & {0, 1, 2}
    table = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    for status in fatal:
        assert f"| {status} |" in table, f"exit status {status} is not in docs/operations.md"


@pytest.mark.parametrize(
    ("committed", "dump_covers", "damage"),
    [(5, None, True), (3, None, False), (5, 4, False), (None, None, False)],
)
def test_a_record_damaged_below_the_saved_commit_index_is_logged_as_damage(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    committed: int | None,
    dump_covers: int | None,
    damage: bool,
) -> None:
    """A record that is not whole is cut either way. Beyond the commit index this
    node saved it is a torn write, never acknowledged (a warning); at or below it, and
    not covered by the dump, the disk lost entries the node had synced, maybe
    acknowledged: an error that says so, not the torn-write warning."""
    path = tmp_path / "raft.journal"
    data = _sealed_journal(path, 5)
    at = bytes(data).index(b"entry-4")
    data[at] ^= 0x20  # a flipped bit in entry 4's command: its seal no longer matches
    path.write_bytes(bytes(data))
    if committed is not None:
        meta = {"raftCommitIndex": committed, "currentTerm": 1, "votedForNodeId": None}
        Path(str(path) + ".meta").write_bytes(pysyncobj_pickle.dumps(meta))
    dump = tmp_path / "raft.dump"
    if dump_covers is not None:
        with gzip.open(dump, "wb") as f:
            last = (b"\x01", dump_covers, 1)
            f.write(pysyncobj_pickle.dumps((None, last, (b"\x01", dump_covers - 1, 1))))
    with caplog.at_level(logging.WARNING, logger="raftlease.replication"):
        assert trim_torn_tail(path, dump) > 0
    assert [e[1] for e in entries(path)] == [1, 2, 3]
    (record,) = [r for r in caplog.records if r.name == "raftlease.replication"]
    if damage:
        assert record.levelno == logging.ERROR and "damaged at entry 4" in record.getMessage()
    else:
        assert record.levelno == logging.WARNING and "torn record" in record.getMessage()


def test_a_compaction_is_a_sync_of_the_entries_it_kept(tmp_path: Path) -> None:
    """The compaction's new file is fsynced before it replaces the journal: the
    entries written since the last sync are durable from then on, and the sync
    counters say so once (``journal_syncs`` / ``journal_synced_entries``), not again
    at the next sync."""
    j = journal(tmp_path, "fsync")
    for i in range(1, 11):
        j.add(_sealed(b"%d" % i), i, 1)
    j.sync()
    assert (j.syncs, j.covered) == (1, 10)
    for i in range(11, 14):
        j.add(_sealed(b"%d" % i), i, 1)  # three not yet synced
    j.deleteEntriesTo(5)
    assert (j.syncs, j.covered) == (2, 13) and not j.dirty
    j.sync_if_dirty()
    assert (j.syncs, j.covered) == (2, 13)
    j.add(_sealed(b"14"), 14, 1)
    j.sync_if_dirty()
    assert (j.syncs, j.covered) == (3, 14)
    j._destroy()


def test_a_rewrite_a_crash_cut_before_its_rename_is_removed_at_start(tmp_path: Path) -> None:
    """A compaction or start-up repair writes its new journal beside the old one
    and renames it over it only when whole and synced. A crash before the rename
    leaves the file behind (as large as the log); the start removes it and leaves
    the journal, the authoritative copy, as it was."""
    j = journal(tmp_path, "fsync")
    for i in range(1, 4):
        j.add(_sealed(b"%d" % i), i, 1)
    j.sync()
    j._destroy()
    path = tmp_path / "raft.journal"
    before = path.read_bytes()
    for suffix in REWRITE_SUFFIXES:
        (tmp_path / ("raft.journal" + suffix)).write_bytes(b"half a rewrite")
    removed = remove_stale_rewrites(path)
    assert sorted(p.name for p in removed) == ["raft.journal.compact", "raft.journal.repair"]
    assert not any(p.name.endswith(REWRITE_SUFFIXES) for p in tmp_path.iterdir())
    assert path.read_bytes() == before
    assert remove_stale_rewrites(path) == []  # nothing left: nothing to do
    # A restore replaces a data directory's Raft state: the rewrite files with it.
    assert {"raft.journal.compact", "raft.journal.repair"} <= set(RAFT_STATE_FILES)


def _dump_at(path: Path, index: int) -> None:
    """A full dump (PySyncObj's shape) whose last entry is ``index``."""
    with gzip.open(path, "wb") as f:
        f.write(pysyncobj_pickle.dumps((None, (b"\x01", index, 1), (b"\x01", index - 1, 1))))


def test_a_damaged_first_record_below_the_commit_index_is_logged_as_damage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With no whole record at all (the first one damaged), what is lost starts at the
    first entry the dump does not cover: at or below the saved commit index that is
    the disk losing acknowledged entries (an error), not a torn write (a warning)."""
    path = tmp_path / "raft.journal"
    data = _sealed_journal(path, 5)
    data[bytes(data).index(b"entry-1")] ^= 0x20
    path.write_bytes(bytes(data))
    meta = {"raftCommitIndex": 5, "currentTerm": 1, "votedForNodeId": None}
    Path(str(path) + ".meta").write_bytes(pysyncobj_pickle.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="raftlease.replication"):
        assert trim_torn_tail(path, tmp_path / "raft.dump") > 0
    (record,) = [r for r in caplog.records if r.name == "raftlease.replication"]
    assert record.levelno == logging.ERROR and "damaged at entry 1" in record.getMessage()


def test_start_refuses_an_unreadable_snapshot_or_one_that_misses_the_journals_start(
    tmp_path: Path,
) -> None:
    """PySyncObj only logs a dump it cannot read and runs with an empty state (such a
    node could win an election and wedge the cluster), and clears a journal that
    starts after the dump's end (the entries between lost). Both refuse the start."""
    path, dump = tmp_path / "raft.journal", tmp_path / "raft.dump"
    j = FileJournal(str(path))
    for i in range(99, 106):
        j.add(_sealed(b"entry-%d" % i), i, 1)
    j._destroy()
    _dump_at(dump, 100)  # a compaction's layout: the journal starts at the dump's 99
    check_start_files(path, dump)
    _dump_at(dump, 35)  # an old dump put back beside a newer journal
    with pytest.raises(
        UnusableFiles, match=r"ends at entry 35 but the journal .* starts at entry 99"
    ):
        check_start_files(path, dump)
    _dump_at(dump, 200)  # a dump newer than every entry (the loader's own case)
    check_start_files(path, dump)
    dump.write_bytes(dump.read_bytes()[:20])  # cut short
    with pytest.raises(UnusableFiles, match="cannot read the snapshot"):
        check_start_files(path, dump)
    dump.unlink()
    check_start_files(path, dump)  # no dump: nothing to check


@pytest.mark.parametrize(
    ("count", "dump_at", "committed", "expected"),
    [
        (5, None, 9, 1),  # beyond the journal, no snapshot: PySyncObj's default
        (5, 4, 9, 4),  # beyond the journal: the snapshot's last entry
        (2, 12, 9, None),  # within the snapshot (a journal the loader replaces)
        (5, None, 5, None),  # at the journal's end: this log's, left alone
        (5, 4, 3, None),  # below it
        (0, None, 9, 1),  # no journal at all
    ],
)
def test_a_commit_index_beyond_everything_held_is_lowered_before_the_load(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    count: int,
    dump_at: int | None,
    committed: int,
    expected: int | None,
) -> None:
    """A saved commit index beyond the journal's last entry and the snapshot's is not
    this log's (entries cut, or a meta file from another node): PySyncObj would clamp
    it to the journal's end and apply every entry the journal holds, a deposed
    leader's uncommitted tail among them. It is lowered to the snapshot's last entry
    (1 without one), term and vote kept; one within what is held is left alone."""
    path = tmp_path / "raft.journal"
    if count:
        _sealed_journal(path, count)
    dump = tmp_path / "raft.dump"
    if dump_at is not None:
        _dump_at(dump, dump_at)
    meta_path = Path(str(path) + ".meta")
    meta = {"raftCommitIndex": committed, "currentTerm": 7, "votedForNodeId": "n2"}
    meta_path.write_bytes(pysyncobj_pickle.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="raftlease.replication"):
        assert clamp_commit_index(path, dump) == expected
    after = pysyncobj_pickle.loads(meta_path.read_bytes())
    if expected is None:
        assert after == meta and not caplog.records
        return
    assert after == {**meta, "raftCommitIndex": expected}
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "beyond everything" in record.getMessage()
    # The loader takes the lowered index as it is.
    j = FileJournal(str(path))
    try:
        assert j.getRaftCommitIndex() == expected and j.getCurrentTerm() == 7
    finally:
        j._destroy()


def test_no_commit_index_saved_is_left_to_the_loader(tmp_path: Path) -> None:
    _sealed_journal(tmp_path / "raft.journal", 3)
    assert clamp_commit_index(tmp_path / "raft.journal", tmp_path / "raft.dump") is None
    assert not Path(str(tmp_path / "raft.journal") + ".meta").exists()


def _in_full_disk(mount: Path, *scripts: str) -> subprocess.CompletedProcess[bytes]:
    """Run each Python ``scripts`` in turn in one private mount namespace with a
    256 KiB tmpfs at ``mount`` (root: ``unshare -m``; otherwise a user namespace,
    ``unshare -rm``), printing ``status=N`` after each."""
    user = [] if os.geteuid() == 0 else ["-r"]
    steps = "".join(f'"$0" -c "${k + 1}"; echo status=$?; ' for k in range(len(scripts)))
    shell = f'mount -t tmpfs -o size=256k tmpfs "{mount}" && {steps}'
    command = ["unshare", *user, "-m", "sh", "-c", shell, sys.executable, *scripts]
    return subprocess.run(command, capture_output=True, timeout=120, check=False)


def test_a_full_disk_stops_the_node_with_a_message_instead_of_sigbus(tmp_path: Path) -> None:
    """PySyncObj grows its journal with a sparse resize and writes through the map:
    on a full disk the kernel cannot back the page and the process died of SIGBUS,
    without a word (reproduced: status -7). The journal's blocks are now allocated
    before the map grows (``PreallocatedFile``): a full disk stops the node with
    ``DURABILITY_FAILED`` and a CRITICAL line saying so, and every synced entry
    loads again."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if shutil.which("unshare") is None or _in_full_disk(mount, "pass").returncode != 0:
        pytest.skip("needs a private tmpfs (unshare -m, util-linux)")
    open_journal = (
        "from pathlib import Path\n"
        "from pysyncobj.journal import FileJournal\n"
        "from raftlease.replication import DurableJournal\n"
        f"d = Path({str(mount)!r})\n"
        "j = DurableJournal(FileJournal(str(d / 'raft.journal')), d / 'raft.journal',"
        " d / 'raft.dump', 'fsync')\n"
    )
    fill = open_journal + (
        "for i in range(1, 100_000):\n"
        "    j.add(b'\\x01' + b'x' * 1000, i, 1)\n"
        "    if i % 20 == 0:\n"
        "        j.sync()\n"
        "        print('synced', i, flush=True)\n"
    )
    reload = open_journal + "print('loaded', [e[1] for e in j][-1], flush=True)\n"
    done = _in_full_disk(mount, fill, reload)
    out, err = done.stdout.decode(), done.stderr.decode()
    statuses = [int(line[7:]) for line in out.splitlines() if line.startswith("status=")]
    assert statuses == [DURABILITY_FAILED, 0], (statuses, err[-2000:])
    assert "cannot grow the journal" in err and "No space left on device" in err
    synced = [int(line.split()[1]) for line in out.splitlines() if line.startswith("synced")]
    loaded = [int(line.split()[1]) for line in out.splitlines() if line.startswith("loaded")]
    assert synced, "the disk filled before the first sync: nothing to check"
    assert loaded and loaded[0] >= synced[-1], (synced[-1], loaded)


@pytest.mark.timeout(30)
def test_start_up_reads_the_dump_once_and_again_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start-up checks ask for the dump's tail up to four times; each read
    decompresses and unpickles the whole snapshot (the restart's memory peak and CPU),
    so it is read once per version of the file, and again once the file is replaced."""
    from raftlease.replication import journal as journal_module

    dump = tmp_path / "raft.dump"

    def write(last_index: int) -> None:
        tmp = tmp_path / "raft.dump.tmp"
        with gzip.open(tmp, "wb") as f:
            last = (b"\x01", last_index, 1)
            f.write(pysyncobj_pickle.dumps((None, last, (b"\x01", last_index - 1, 1))))
        os.replace(tmp, dump)  # a new inode, as PySyncObj's atomic rename makes

    loads = []
    real_load = journal_module.pysyncobj_pickle.load

    def counting_load(f: object) -> object:
        loads.append(1)
        return real_load(f)

    monkeypatch.setattr(journal_module, "_tail_memo", None)
    monkeypatch.setattr(journal_module.pysyncobj_pickle, "load", counting_load)
    write(40)
    for _ in range(4):
        assert journal_module._dump_last_index(dump) == 40
    assert len(loads) == 1
    write(41)
    assert journal_module._dump_last_index(dump) == 41
    assert len(loads) == 2
    dump.unlink()
    assert journal_module._dump_last_index(dump) is None  # gone: not the memo's answer


@pytest.mark.timeout(30)
def test_the_mmap_threshold_is_pinned_where_glibc_has_mallopt() -> None:
    """A freed multi-MiB buffer (a snapshot being loaded) goes back to the kernel: the
    threshold no longer rises to the size of the last big block freed."""
    from raftlease.server.heap import fix_mmap_threshold

    assert fix_mmap_threshold() is True  # Debian's glibc has mallopt


@pytest.mark.timeout(30)
def test_journal_writes_do_not_ask_the_files_size_until_it_must_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PySyncObj's write asked ``mmap.size()`` (an fstat, a GIL release on the tick
    thread) twice per entry; the map's length says the same. Only growing the file
    asks its size, and what was written reads back across growths."""
    import mmap as mmap_module

    from raftlease.replication.durable import PreallocatedFile

    calls = []
    real_size = mmap_module.mmap.size

    class CountingMap(mmap_module.mmap):
        def size(self) -> int:
            calls.append(1)
            return real_size(self)

    file = PreallocatedFile(str(tmp_path / "f"), initialSize=1024, defaultContent=b"\0" * 16)
    old = file._ResizableFile__mm
    file._ResizableFile__mm = CountingMap(file._ResizableFile__f.fileno(), 0)
    old.close()
    for k in range(60):  # 60 x 100 B = 6,000 B: grows 1 KiB -> 2 -> 4 -> 8 KiB
        file.write(k * 100, bytes([k]) * 100)
    assert len(calls) == 3  # one per growth, none per write
    assert os.path.getsize(tmp_path / "f") == 8192 == len(file._ResizableFile__mm)
    assert all(file.read(k * 100, 100) == bytes([k]) * 100 for k in range(60))
    file._destroy()
