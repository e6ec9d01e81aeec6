"""``CompactJournal``: PySyncObj's journal with the log kept in its file only. It must
answer every read PySyncObj makes exactly as ``FileJournal``'s list did, and leave a
file that ``FileJournal`` loads to the same entries (and the reverse)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pysyncobj.journal import FileJournal

from raftlease.replication.compact_journal import CompactJournal, LogView
from raftlease.replication.durable import DurableJournal

Entry = tuple[bytes, int, int]


def entries(count: int, first: int = 1, term: int = 1, seed: int = 7) -> list[Entry]:
    rng = random.Random(seed)
    out: list[Entry] = [(b"\x01", first, term)]  # PySyncObj's no-op, one byte
    for i in range(first + 1, first + count):
        out.append((b"\x00" + rng.randbytes(rng.randint(1, 600)), i, term + i // 50))
    return out


def loaded(path: Path) -> list[Entry]:
    plain = FileJournal(str(path))
    try:
        return [plain[i] for i in range(len(plain))]
    finally:
        plain._destroy()


@pytest.mark.timeout(30)
def test_reads_answer_as_the_list_did_and_the_file_is_pysyncobjs(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    want = entries(500)
    journal = CompactJournal(str(path))
    for entry in want:
        journal.add(*entry)
    assert len(journal) == len(want)
    assert journal[0] == want[0] and journal[-1] == want[-1] and journal[123] == want[123]
    with pytest.raises(IndexError):
        journal[len(want)]
    # Slices are lazy views that behave as the list's slices did where PySyncObj uses
    # them: len, truth, iteration, reversed, an int index, a slice of them (a list).
    view = journal[10:]
    assert isinstance(view, LogView)
    assert len(view) == len(want) - 10 and bool(view)
    assert list(view) == want[10:]
    assert list(reversed(view)) == list(reversed(want[10:]))
    assert view[0] == want[10] and view[-1] == want[-1]
    assert view[:3] == want[10:13] and isinstance(view[:3], list)
    assert list(journal[20:25]) == want[20:25]
    assert not journal[len(want) : len(want) + 5]
    journal._destroy()
    assert loaded(path) == want


@pytest.mark.timeout(30)
def test_cutting_the_tail_and_appending_again(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    want = entries(300)
    journal = CompactJournal(str(path))
    for entry in want:
        journal.add(*entry)
    journal.deleteEntriesFrom(200)
    replacement = entries(50, first=201, term=9, seed=3)
    for entry in replacement:
        journal.add(*entry)
    expect = want[:200] + replacement
    assert list(journal[0:]) == expect
    journal.deleteEntriesFrom(len(journal))  # nothing past the end: a no-op
    assert len(journal) == len(expect)
    journal.deleteEntriesTo(100)  # PySyncObj's in-place rewrite
    assert list(journal[0:]) == expect[100:]
    journal._destroy()
    assert loaded(path) == expect[100:]
    reopened = CompactJournal(str(path))
    assert list(reopened[0:]) == expect[100:]
    reopened.clear()
    assert len(reopened) == 0
    reopened.add(b"\x01", 7, 7)
    reopened._destroy()
    assert loaded(path) == [(b"\x01", 7, 7)]


@pytest.mark.timeout(30)
def test_adopting_pysyncobjs_journal_drops_its_list(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    want = entries(200)
    plain = FileJournal(str(path))
    for entry in want:
        plain.add(*entry)
    plain._destroy()
    inner = FileJournal(str(path))
    compact = CompactJournal.adopt(inner)
    assert compact is inner and not hasattr(compact, "_FileJournal__journal")
    assert list(compact[0:]) == want
    compact.add(b"\x01", 201, 9)
    compact._destroy()
    assert loaded(path) == [*want, (b"\x01", 201, 9)]


@pytest.mark.timeout(60)
def test_released_pages_read_back_the_same(tmp_path: Path) -> None:
    """``release`` drops the map's older pages from the process; the entries read back
    from the page cache unchanged, and appending goes on."""
    path = tmp_path / "raft.journal"
    want = entries(6000)
    journal = CompactJournal(str(path))
    for entry in want:
        journal.add(*entry)
    assert journal.release(keep=4096) > 0
    assert journal.release(keep=1 << 40) == 0  # nothing old enough
    assert list(journal[0:]) == want
    more = entries(10, first=6001, term=200, seed=5)
    for entry in more:
        journal.add(*entry)
    assert journal.release(keep=0) > 0
    assert list(journal[0:]) == want + more
    journal._destroy()
    assert loaded(path) == want + more


@pytest.mark.timeout(30)
def test_the_durable_journal_keeps_it_compact_across_a_compaction(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    want = entries(400)
    inner = FileJournal(str(path))
    durable = DurableJournal(inner, path, tmp_path / "raft.dump", "fsync")
    for entry in want:
        durable.add(*entry)
    assert isinstance(durable._inner, CompactJournal)
    durable.deleteEntriesTo(250)
    assert isinstance(durable._inner, CompactJournal)
    assert list(durable[0:]) == want[250:]
    durable.onOneSecondTimer()  # releases the old pages; nothing changes for readers
    assert durable[-1] == want[-1]
    durable._destroy()
    assert loaded(path) == want[250:]


@pytest.mark.timeout(30)
def test_syncobj_loads_a_compact_journal_inside_compact_journals(tmp_path: Path) -> None:
    """PySyncObj's constructor calls its module's ``createJournal``: inside
    ``compact_journals`` that gives a ``CompactJournal`` for a file (no list of
    entries is ever built), and PySyncObj's own afterwards."""
    from pysyncobj import syncobj

    from raftlease.replication.compact_journal import compact_journals

    path = tmp_path / "raft.journal"
    plain = FileJournal(str(path))
    for entry in entries(50):
        plain.add(*entry)
    plain._destroy()
    original = syncobj.createJournal
    with compact_journals():
        made = syncobj.createJournal(str(path))
        assert isinstance(made, CompactJournal) and list(made[0:]) == entries(50)
        assert CompactJournal.adopt(made) is made
        made._destroy()
        assert type(syncobj.createJournal(None)).__name__ == "MemoryJournal"
    assert syncobj.createJournal is original


@pytest.mark.timeout(30)
def test_reads_after_destroy_still_answer(tmp_path: Path) -> None:
    """PySyncObj's list answered reads after ``destroy`` (a tick still running at
    shutdown reads the log's last index): so does the file, through a read-only map."""
    journal = CompactJournal(str(tmp_path / "raft.journal"))
    want = entries(20)
    for entry in want:
        journal.add(*entry)
    journal._destroy()
    assert journal[-1] == want[-1] and list(journal[0:]) == want


@pytest.mark.timeout(30)
def test_the_first_and_last_entry_follow_every_change(tmp_path: Path) -> None:
    """``[0]`` and ``[-1]`` are kept between reads (PySyncObj asks for them every
    tick): a cut, a rewrite or an append at an offset a kept one had must not
    answer the old entry."""
    journal = CompactJournal(str(tmp_path / "raft.journal"))
    for entry in entries(10):
        journal.add(*entry)
    assert journal[0] == entries(10)[0] and journal[-1] == entries(10)[-1]
    journal.deleteEntriesFrom(5)  # the old last entry's offset is free again
    assert journal[-1] == entries(10)[4]
    other = (b"\x00other", 6, 9)
    journal.add(*other)
    assert journal[-1] == other and journal[5] == other and journal[4] == entries(10)[4]
    journal.deleteEntriesFrom(0)
    with pytest.raises(IndexError):
        journal[0]
    first = (b"\x01", 40, 9)
    journal.add(*first)
    assert journal[0] == first == journal[-1]
    journal.clear()
    second = (b"\x00second", 41, 9)
    journal.add(*second)
    assert journal[0] == second == journal[-1]
    journal.deleteEntriesTo(0)  # rewrites in place: clear, then the same entries again
    assert journal[0] == second
    journal._destroy()
    assert loaded(tmp_path / "raft.journal") == [second]
