"""``unpack_snapshot``: a node's packed snapshot unpacked with its lease and capacity
rows read one at a time (replication/snapshot_rows.py). The store restored from it
must be the one ``msgpack.unpackb`` gives, whatever the snapshot holds. And the pieces
this build writes (``pack_snapshot``, ``unpack_chunks``): the same store, each piece
dropped once read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from raftlease.core import LeaseStore
from raftlease.replication import snapshot_rows
from raftlease.replication.snapshot_rows import (
    LAZY_TAIL,
    PackedRows,
    StreamedRows,
    pack_snapshot,
    unpack_chunks,
    unpack_snapshot,
)
from tests.unit.test_core_shared import acquire, keepalive, session_open


def packed(store: LeaseStore) -> bytes:
    # As the forked child packs it (replica._PackedSnapshot).
    data: bytes = msgpack.packb(store.to_plain(), use_bin_type=True)
    return data


def rich_store() -> LeaseStore:
    store = LeaseStore()
    entries = [
        session_open(1, "S1", 5_000),
        acquire(2, "A", "lock/a", ttl=60_000, value="addr:1"),
        acquire(3, "B", "pool", capacity=3, units=2),
        acquire(4, "C", "pool", capacity=3, units=1, session="S1"),
        acquire(5, "D", "pool", capacity=3, units=2, wait=10_000),  # queued
        acquire(6, "E", "lock/e", session="S1"),
        keepalive(7, "S1"),
        *(acquire(8 + i, f"P{i}", f"plain/{i}", ttl=3_600_000) for i in range(50)),
    ]
    for entry in entries:
        assert store.apply(entry)["ok"], entry
    return store


@pytest.mark.timeout(30)
def test_the_restored_store_is_the_one_unpackb_gives() -> None:
    blob = packed(rich_store())
    lazy = unpack_snapshot(blob)
    assert isinstance(lazy["leases"], PackedRows) and isinstance(lazy["capacity"], PackedRows)
    eager = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    assert set(lazy) == set(eager)
    assert list(lazy["leases"]) == eager["leases"] == list(lazy["leases"])  # re-iterable
    assert len(lazy["leases"]) == len(eager["leases"]) >= 50
    assert list(lazy["capacity"]) == eager["capacity"]
    assert {k: v for k, v in lazy.items() if k not in ("leases", "capacity")} == {
        k: v for k, v in eager.items() if k not in ("leases", "capacity")
    }
    restored = LeaseStore.from_plain(lazy)
    assert restored.to_plain() == LeaseStore.from_plain(eager).to_plain()
    assert len(restored.leases) == len(eager["leases"]) and restored.lease_sessions


@pytest.mark.timeout(30)
def test_an_empty_store_and_bad_bytes() -> None:
    empty = unpack_snapshot(packed(LeaseStore()))
    assert list(empty["leases"]) == [] and LeaseStore.from_plain(empty).leases == {}
    blob = packed(rich_store())
    with pytest.raises(ValueError):
        unpack_snapshot(blob + b"\x00")  # bytes after the map
    with pytest.raises(ValueError):
        unpack_snapshot(msgpack.packb([1, 2, 3]))  # not a map
    with pytest.raises(ValueError):
        unpack_snapshot(msgpack.packb({"leases": 7}))  # rows that are no array
    with pytest.raises(msgpack.OutOfData):
        unpack_snapshot(blob[: len(blob) // 2])  # cut short


# ------------------------------------------------ the pieces this build writes


@pytest.mark.timeout(30)
def test_pieces_restore_the_same_store_and_are_dropped_as_they_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(snapshot_rows, "CHUNK_BYTES", 1000)  # many pieces, rows across them
    store = rich_store()
    for i in range(2_000):
        assert store.apply(acquire(100 + i, f"o{i}", f"bulk/{i:05d}", ttl=3_600_000))["ok"]
    pieces = pack_snapshot(store.to_plain())
    assert len(pieces) > 100 and all(0 < len(piece) <= 1000 for piece in pieces)
    joined = b"".join(pieces)
    # Joined, the pieces are one map of the same entries, the lazy ones last.
    eager = msgpack.unpackb(joined, raw=False, strict_map_key=False)
    assert eager == store.to_plain()
    assert list(eager)[-2:] == list(snapshot_rows.LAZY_TAIL)
    total = len(pieces)
    streamed = unpack_chunks(pieces)
    assert all(isinstance(streamed[key], StreamedRows) for key in snapshot_rows.LAZY_TAIL)
    assert {k: v for k, v in streamed.items() if k not in LAZY_TAIL} == {
        k: v for k, v in eager.items() if k not in LAZY_TAIL
    }
    # The eager entries came first (with the audit trail's records); the rows' pieces
    # are still to be read.
    assert 0 < len(pieces) < total
    seen: list[int] = []
    rows = streamed["leases"]

    class Watched:
        """The leases rows, noting how many pieces are left at each row."""

        def __iter__(self) -> Iterator[Any]:
            for row in rows:
                seen.append(len(pieces))
                yield row

    restored = LeaseStore.from_plain({**streamed, "leases": Watched()})
    assert restored.to_plain() == store.to_plain()
    # Each piece left the list (its only holder) as it was read: the list shrank while
    # the leases were built, and nothing is left of it at the end.
    assert seen[0] > seen[-1] and pieces == []


@pytest.mark.timeout(30)
def test_a_default_piece_is_at_least_the_mmap_threshold() -> None:
    # 1 MiB: the node's pinned mmap threshold, so glibc gives a freed piece back.
    from raftlease.server.heap import MMAP_THRESHOLD

    assert snapshot_rows.CHUNK_BYTES >= MMAP_THRESHOLD
    store = LeaseStore()
    for i in range(12_000):  # ~1.2 MiB packed: two pieces
        assert store.apply(acquire(i + 1, f"o{i}", f"key/{i:06d}", ttl=3_600_000))["ok"]
    pieces = pack_snapshot(store.to_plain())
    assert len(pieces) >= 2 and len(pieces[0]) == snapshot_rows.CHUNK_BYTES
    assert LeaseStore.from_plain(unpack_chunks(pieces)).to_plain() == store.to_plain()


@pytest.mark.timeout(30)
def test_pieces_read_out_of_order_twice_or_damaged_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(snapshot_rows, "CHUNK_BYTES", 50)
    plain = rich_store().to_plain()

    def fresh() -> dict[str, Any]:
        return unpack_chunks(pack_snapshot(plain))

    with pytest.raises(ValueError, match="out of order"):
        list(fresh()["leases"])  # before the capacity rows
    streamed = fresh()
    assert list(streamed["capacity"]) == plain["capacity"]
    with pytest.raises(ValueError, match="out of order or twice"):
        list(streamed["capacity"])
    assert list(streamed["leases"]) == plain["leases"]
    blob = b"".join(pack_snapshot(plain))
    # Bytes after the map: a whole object, or one cut short (a stream reader that
    # took "no more data" for the end would load those).
    for tail in (b"\x00", b"\x92", b"\x92\x01", b"\xdb\x00\x00\x10\x00abc"):
        streamed = unpack_chunks([blob, tail])
        list(streamed["capacity"])
        with pytest.raises(ValueError, match="bytes after"):
            list(streamed["leases"])
    streamed = unpack_chunks([blob[: len(blob) - 10]])  # cut short
    list(streamed["capacity"])
    with pytest.raises(msgpack.OutOfData):
        list(streamed["leases"])
    with pytest.raises(ValueError, match="not bytes"):
        unpack_chunks([blob[:10], "text"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="not a list"):
        unpack_chunks((blob,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no lease rows"):
        unpack_chunks([msgpack.packb({"v": 9})])
    # The layout an earlier build wrote (the lazy entries inside the map) is read from
    # bytes only; in pieces it is refused, not misread.
    with pytest.raises(ValueError, match="not where this layout has it"):
        unpack_chunks([packed(rich_store())])


@pytest.mark.timeout(30)
def test_the_node_loads_pieces_and_still_loads_an_earlier_build_s_bytes() -> None:
    from raftlease.replication.replica import SNAPSHOT_LOAD_FAILED, _PackedSnapshot, _StoreConsumer

    store = rich_store()
    halts: list[int] = []
    consumer = _StoreConsumer(None)
    consumer.halt = halts.append  # type: ignore[method-assign]
    # What the forked child pickles into the dump: a list of pieces.
    rebuilt, (pieces,) = _PackedSnapshot(store).__reduce__()
    assert rebuilt is list and all(isinstance(piece, bytes) for piece in pieces)
    consumer._deserialize(list(pieces))
    assert consumer.store.to_plain() == store.to_plain() and halts == []
    consumer._deserialize(packed(store))  # one bytes, as a build before this wrote it
    assert consumer.store.to_plain() == store.to_plain() and halts == []
    consumer._deserialize([b"\x81\xa1v"])  # damaged pieces: stop, never load half
    assert halts == [SNAPSHOT_LOAD_FAILED]


@pytest.mark.timeout(30)
def test_the_node_is_paused_before_the_load_and_every_so_many_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from raftlease.replication.replica import _PackedSnapshot, _StoreConsumer

    monkeypatch.setattr(snapshot_rows, "PAUSE_ROWS", 10)
    store = rich_store()  # 53 leases and 2 capacity rows
    pauses: list[int] = []
    consumer = _StoreConsumer(None, restore_pause=lambda: pauses.append(len(pieces)))
    pieces = list(_PackedSnapshot(store).__reduce__()[1][0])
    consumer._deserialize(pieces)
    assert consumer.store.to_plain() == store.to_plain()
    # Once before anything was read, then before every tenth row of each array.
    plain = store.to_plain()
    expected = 1 + len(plain["capacity"]) // 10 + len(plain["leases"]) // 10
    assert len(plain["leases"]) > 50 and len(pauses) == expected and pauses[0] > 0
    consumer._deserialize(packed(store))  # an earlier build's bytes: loaded, no pause
    assert len(pauses) == expected and consumer.store.to_plain() == store.to_plain()


@pytest.mark.timeout(30)
def test_the_container_is_the_documented_one() -> None:
    """docs/membership.md ("Rolling upgrades") tells operators which container a build
    writes, as ``raftlease status`` shows it (``formats.snapshot_container``)."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "membership.md").read_text()
    assert snapshot_rows.SNAPSHOT_CONTAINER == 2
    assert "`formats.snapshot_container` is 2" in " ".join(doc.split())
