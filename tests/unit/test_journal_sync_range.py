"""A journal sync covers every byte written since the previous one (issues 15, 16).

``DurableJournal.sync`` makes durable only what ``ranges()`` declares (the test
build's recorder copies exactly those ranges; off Linux they are what is msync'ed).
These tests drive PySyncObj's ``FileJournal`` through our wrapper with seeded random
sequences of appends (small and page-crossing, enough to grow the map), truncations
(``deleteEntriesFrom``), compactions (``deleteEntriesTo``, which rewrites the file from
the first record) and clears, syncing at random points, and keep their own copy of
the disk built only from the declared ranges: after every sync it must equal the file
on every byte the loader reads, and load as the entries the journal held.
"""

from __future__ import annotations

import mmap
import random
import shutil
import struct
from pathlib import Path

import pytest
from pysyncobj.journal import FIRST_RECORD_OFFSET, LAST_RECORD_OFFSET_OFFSET, FileJournal

from raftlease.replication import DurableJournal, SyncRecorder
from raftlease.testing.power import cut_to_synced

PAGE = mmap.ALLOCATIONGRANULARITY


def open_journal(directory: Path, recorder: SyncRecorder | None = None) -> DurableJournal:
    path = directory / "raft.journal"
    return DurableJournal(FileJournal(str(path)), path, directory / "raft.dump", "fsync", recorder)


def load(data: bytes, scratch: Path) -> list[tuple[bytes, int, int]]:
    """The entries PySyncObj's loader reads from a journal holding ``data``."""
    path = scratch / "load.journal"
    path.write_bytes(data)
    j = FileJournal(str(path))
    try:
        return [j[i] for i in range(len(j))]
    finally:
        j._destroy()
        path.unlink()
        Path(str(path) + ".meta").unlink(missing_ok=True)


def last_record_end(data: bytes) -> int:
    end: int = struct.unpack_from("<I", data, LAST_RECORD_OFFSET_OFFSET)[0]
    return end


def entries_of(j: DurableJournal) -> list[tuple[bytes, int, int]]:
    return [j[i] for i in range(len(j))]


def run_sequence(directory: Path, scratch: Path, seed: int, steps: int) -> dict[str, int]:
    """One seeded random sequence; returns counts of what it did (so each test can
    check the sequence exercised every write path)."""
    rng = random.Random(seed)
    recorder = SyncRecorder()
    j = open_journal(directory, recorder)
    path = directory / "raft.journal"
    disk = bytearray()  # what the declared ranges made durable, nothing else
    next_idx = 1
    done = {"add": 0, "from": 0, "to": 0, "clear": 0, "sync": 0, "grew": 0}
    size = path.stat().st_size

    def sync() -> None:
        ranges = j.ranges()
        for offset, length in ranges:
            assert offset % PAGE == 0 and length > 0
        j.sync()
        current = path.read_bytes()
        for offset, length in ranges:
            if len(disk) < offset + length:
                disk.extend(b"\0" * (offset + length - len(disk)))
            disk[offset : offset + length] = current[offset : offset + length]
        end = last_record_end(current)
        # Every byte the loader reads (header and records) is on the simulated disk.
        assert bytes(disk[:end]) == current[:end], f"seed {seed}: a written byte was not synced"
        assert load(bytes(disk), scratch) == entries_of(j)
        # The recorder's shadow is the same disk.
        shadow = Path(str(path) + SyncRecorder.SUFFIX).read_bytes()
        assert shadow[:end] == current[:end]
        done["sync"] += 1

    sync()  # the loader's state: the whole file
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.70:
            # Mostly small entries, now and then one that crosses pages.
            length = (
                rng.choice([1, 40, 200, 700]) if rng.random() < 0.9 else rng.randint(PAGE, 3 * PAGE)
            )
            j.add(b"\x01" + rng.randbytes(length), next_idx, 1)
            next_idx += 1
            done["add"] += 1
        elif roll < 0.78 and len(j) > 1:
            cut = rng.randint(1, len(j) - 1)  # a follower dropping a conflicting tail
            j.deleteEntriesFrom(cut)
            next_idx = entries_of(j)[-1][1] + 1
            done["from"] += 1
        elif roll < 0.84 and len(j) > 2:
            j.deleteEntriesTo(rng.randint(1, len(j) - 2))  # log compaction
            # A new file, synced and renamed over the journal: durable whole, at once.
            assert not j.dirty
            disk[:] = path.read_bytes()
            assert Path(str(path) + SyncRecorder.SUFFIX).read_bytes() == bytes(disk)
            assert load(bytes(disk), scratch) == entries_of(j)
            done["to"] += 1
        elif roll < 0.85:
            j.clear()  # a snapshot installed from the leader
            done["clear"] += 1
        else:
            sync()
        grown = path.stat().st_size
        done["grew"] += grown > size
        size = grown
    sync()
    expected = entries_of(j)
    # A power loss now keeps exactly what the last sync covered.
    j.add(b"\x01never synced", next_idx, 1)
    j._destroy()
    cut_to_synced(directory)
    assert load(path.read_bytes(), scratch) == expected
    return done


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(8))
def test_a_ranged_sync_covers_every_byte_written_since_the_last(tmp_path: Path, seed: int) -> None:
    directory, scratch = tmp_path / "node", tmp_path / "scratch"
    directory.mkdir()
    scratch.mkdir()
    done = run_sequence(directory, scratch, seed, steps=400)
    assert done["add"] > 100 and done["sync"] > 20 and done["grew"] > 0
    assert done["from"] + done["to"] + done["clear"] > 0


@pytest.mark.timeout(120)
def test_the_seeds_together_take_every_write_path(tmp_path: Path) -> None:
    totals: dict[str, int] = {}
    for seed in range(8):
        directory, scratch = tmp_path / f"node{seed}", tmp_path / f"scratch{seed}"
        directory.mkdir()
        scratch.mkdir()
        for key, count in run_sequence(directory, scratch, seed, steps=400).items():
            totals[key] = totals.get(key, 0) + count
        shutil.rmtree(directory)
    assert all(totals[key] > 0 for key in ("add", "from", "to", "clear", "grew")), totals


@pytest.mark.timeout(60)
def test_a_sync_after_appends_covers_the_header_and_the_tail_only(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    for i in range(1, 20_001):
        j.add(b"\x01" + b"x" * 200, i, 1)
    j.sync()
    assert j._file._ResizableFile__mm.size() > 4_000_000
    j.add(b"\x01one more", 20_001, 1)
    ranges = j.ranges()
    assert ranges[0] == (0, PAGE)
    assert len(ranges) == 2 and ranges[1][1] <= 2 * PAGE  # one record, not the map
    j.sync()
    # Nothing written since: the header's page and the end of the last record's page.
    (header, (start, length)) = j.ranges()
    assert header == (0, PAGE) and start == j._offset() - j._offset() % PAGE
    assert length == j._offset() - start < PAGE
    j._destroy()


@pytest.mark.timeout(60)
def test_the_portable_path_msyncs_the_ranges(tmp_path: Path) -> None:
    """Off Linux the ranges are msync'ed before the fdatasync; that path runs here too
    (msync of page-aligned ranges inside the map), through growth and a compaction."""
    j = open_journal(tmp_path)
    j.MSYNC = True
    for i in range(1, 3_001):
        j.add(b"\x01" + b"y" * (1 + i % 300), i, 1)
        if i % 500 == 0:
            j.sync()
    j.deleteEntriesTo(2_000)
    j.sync()
    j.deleteEntriesFrom(500)
    j.sync()
    assert (j.syncs, len(j)) == (9, 500)  # six, the compaction's new file, two
    j._destroy()
    assert load((tmp_path / "raft.journal").read_bytes(), tmp_path)[0][1] == 2_001
    assert FIRST_RECORD_OFFSET < PAGE
