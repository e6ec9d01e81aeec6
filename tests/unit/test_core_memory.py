"""What a live lease costs the state machine in memory (issue 16: 100,000 live leases
under 100 MiB RSS per node). tracemalloc counts the allocations exactly, so the bound
is not a timing guess; it fails if a plain lock gets its own holders dict back
(about 200 B) or a copy of its owner string per lease."""

from __future__ import annotations

import gc
import secrets
import tracemalloc
from collections.abc import Callable

import msgpack
import pytest

from raftlease.core import LeaseStore
from raftlease.core.audit import AuditTrail
from raftlease.limits import MAX_AUDIT_RECORDS

LEASES = 20_000
#: Bytes per live lease: 382 granted and 378 restored, measured with these 20,000
#: (417 with 100,000, whose top-level maps are emptier after their last doubling);
#: 478 and 474 before a lease's rare fields went into a shared tuple (-40 B) and the
#: expiry heap left out the leases due past its horizon (-72 B for these 10-minute
#: leases); 791 before the lone holder went bare, capacity 1 went implicit and owners
#: were shared, and ~560 restored without the restore's sharing.
BOUND = 400


@pytest.mark.timeout(120)
def test_a_plain_lease_costs_under_400_bytes_granted_or_restored() -> None:
    grant_all = granting(per_ms=1, key=lambda i: f"tenant-{i % 97:02d}/job/{i:08d}")
    per_lease, store = bytes_per_lease(grant_all)
    assert per_lease < BOUND, f"{per_lease:.0f} B per live lease"
    # A node restored from the snapshot (a restart, a snapshot from the leader) holds
    # them as cheaply: the restore shares owners and TTLs as grants do.
    packed = msgpack.packb(store.to_plain(), use_bin_type=True)
    del store
    restored, _ = bytes_per_lease(
        lambda: LeaseStore.from_plain(msgpack.unpackb(packed, raw=False, strict_map_key=False))
    )
    assert restored < BOUND, f"{restored:.0f} B per restored lease"


@pytest.mark.timeout(120)
def test_leases_granted_in_one_millisecond_share_their_time_ints() -> None:
    """Five grants a millisecond (5,000 acquires/s): granted and restored, the leases
    of one millisecond share one ``granted_at`` and one ``expires_at`` int: 334 and
    333 B a lease with 20,000 leases, 324 and 323 with these 10,000 (359 and 378
    with 20,000 before the expiry and the restore shared them: 4.5 MiB for 100,000
    restored leases)."""
    count = LEASES // 2  # enough to measure; half the time
    grant_all = granting(per_ms=5, key=lambda i: f"job/{i:08d}", count=count)

    def distinct(store: LeaseStore) -> tuple[int, int]:
        leases = store.leases.values()
        return len({id(r.granted_at) for r in leases}), len({id(r.expires_at) for r in leases})

    per_lease, store = bytes_per_lease(grant_all, count)
    assert distinct(store) == (count // 5, count // 5)
    assert per_lease < 345, f"{per_lease:.0f} B per live lease"
    packed = msgpack.packb(store.to_plain(), use_bin_type=True)
    del store
    restored, store = bytes_per_lease(
        lambda: LeaseStore.from_plain(msgpack.unpackb(packed, raw=False, strict_map_key=False)),
        count,
    )
    assert distinct(store) == (count // 5, count // 5)
    assert restored < 345, f"{restored:.0f} B per restored lease"


def granting(
    per_ms: int, key: Callable[[int], str], count: int = LEASES
) -> Callable[[], LeaseStore]:
    """A builder of a store granted ``count`` plain leases by one client, ``per_ms``
    grants a millisecond of log time, each entry decoded as the node decodes a log
    entry (fresh strings and ints every time)."""
    raw = [
        msgpack.packb(
            {
                "op": "acquire",
                "now": 1_000_000 + i // per_ms,
                "term": 1,
                "key": key(i),
                "owner": "bench-agent",
                "ttl": 600_000,
                "lid": secrets.token_hex(16),
                "cid": "client-1",
                "seq": i + 1,
                "ack": i + 1,
            }
        )
        for i in range(count)
    ]

    def grant_all() -> LeaseStore:
        store = LeaseStore()
        for entry in raw:
            assert store.apply(msgpack.unpackb(entry, raw=False))["ok"]
        return store

    return grant_all


def bytes_per_lease(
    build: Callable[[], LeaseStore], count: int = LEASES
) -> tuple[float, LeaseStore]:
    """What the store ``build`` returns holds, per lease, counted by tracemalloc, and
    the store."""
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        built = build()
        # The audit trail is a table of its own, bounded whatever the number of
        # leases (MAX_AUDIT_RECORDS; test_the_audit_trail_stays_under_its_bound).
        built.audit = AuditTrail()
        gc.collect()
        size = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert len(built.leases) == count
    return size / count, built


@pytest.mark.timeout(120)
def test_the_audit_trail_stays_under_its_bound() -> None:
    """A full trail (MAX_AUDIT_RECORDS records, more added than kept) holds under
    5 MB (docs/audit.md): about 410 bytes a record with its chain value and its own
    key string (4.1 MB measured)."""
    store = LeaseStore()
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for i in range(MAX_AUDIT_RECORDS + 500):
            store.audit.add(
                i,
                "grant",
                f"tenant-{i % 97:02d}/job/{i:08d}",
                10**9 + i,
                "bench-agent",
                "agent-7",
                "agent-7",
                10**9 + i,
            )
        gc.collect()
        size = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert len(store.audit.records) == MAX_AUDIT_RECORDS
    assert size < 5_000_000, f"{size} B for a full audit trail"
