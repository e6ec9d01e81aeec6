"""``unpack_snapshot``: a node's packed snapshot unpacked with its lease and capacity
rows read one at a time (replication/snapshot_rows.py). The store restored from it
must be the one ``msgpack.unpackb`` gives, whatever the snapshot holds."""

from __future__ import annotations

import msgpack
import pytest

from raftlease.core import LeaseStore
from raftlease.replication.snapshot_rows import PackedRows, unpack_snapshot
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
