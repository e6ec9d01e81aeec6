"""Watches on real clusters: order, resume across a reconnect and a leader change, and
the compacted signal."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable

import pytest

from raftlease import AsyncClient, Client, CompactedError, WatchEvent
from raftlease.limits import TOKEN_RESERVE_STEP
from raftlease.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class Collector:
    """Runs a blocking watch in a thread and keeps what it sees."""

    def __init__(self, endpoints: list[str], prefix: str, from_revision: int = 0) -> None:
        self.events: list[WatchEvent] = []
        self.error: BaseException | None = None
        self._client = Client(endpoints, attempt_timeout=1.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(prefix, from_revision), daemon=True)
        self._thread.start()

    def _run(self, prefix: str, from_revision: int) -> None:
        try:
            for event in self._client.watch(prefix, from_revision=from_revision):
                self.events.append(event)
                if self._stop.is_set():
                    return
        except BaseException as exc:
            self.error = exc

    def wait_for(self, check: Callable[[list[WatchEvent]], bool], what: str) -> None:
        wait_for(lambda: self.error is None and check(self.events), 30, what)
        assert self.error is None, self.error

    def close(self) -> None:
        self._stop.set()
        self._client.close()


def test_watch_sees_every_change_in_order(shared: LocalCluster) -> None:
    # Watch from a known revision (not "from now"): the watch subscribes on its
    # thread, and a loaded machine can let the first acquire below come before it.
    with shared.client() as c:
        start = c.read("watch/a/x").revision
    assert start is not None
    watcher = Collector(shared.endpoints, "watch/a/", from_revision=int(start) + 1)
    try:
        with shared.client() as c:
            lease = c.acquire("watch/a/x", owner="o1", ttl=5.0)
            # A new TTL: logged at once (with the same TTL the renewal is answered from
            # the leader's memory and its event comes when written, design.md 9a).
            lease = c.renew(lease, ttl=6.0)
            c.release(lease)
            c.acquire("watch/a/y", owner="o2", ttl=0.4)  # expires by itself
            c.acquire("watch/b/z", owner="other", ttl=5.0)  # outside the prefix
        watcher.wait_for(lambda ev: len(ev) >= 5, "five events")
        kinds = [(e.type, e.key) for e in watcher.events[:5]]
        assert kinds == [
            ("grant", "watch/a/x"),
            ("renew", "watch/a/x"),
            ("release", "watch/a/x"),
            ("grant", "watch/a/y"),
            ("expire", "watch/a/y"),
        ]
        revisions = [e.revision for e in watcher.events]
        assert revisions == sorted(set(revisions))
        assert all(e.key.startswith("watch/a/") for e in watcher.events)
    finally:
        watcher.close()


def test_resume_across_leader_change_misses_and_repeats_nothing(cluster: LocalCluster) -> None:
    leader = cluster.wait_for_leader()
    # Watch through the leader first, so killing it forces a reconnect elsewhere.
    order = [leader["client"]] + [n.client for n in cluster.nodes if n.client != leader["client"]]
    with cluster.client() as c:  # from a known revision, as above
        start = c.read("resume/0").revision
    assert start is not None
    watcher = Collector(order, "resume/", from_revision=int(start) + 1)
    try:
        with cluster.client() as c:
            first = [c.acquire(f"resume/{i}", owner="o", ttl=30.0) for i in range(5)]
            watcher.wait_for(lambda ev: len(ev) >= 5, "events before the kill")
            cluster.kill_node(leader["node"])
            more = [
                c.acquire(f"resume/after-{i}", owner="o", ttl=30.0, timeout=30) for i in range(5)
            ]
            for lease in first + more:
                c.release(lease, timeout=30)
        watcher.wait_for(lambda ev: len(ev) >= 20, "every event after the failover")
        grants = [e for e in watcher.events if e.type == "grant"]
        assert len(grants) == 10 and len({e.key for e in grants}) == 10
        revisions = [e.revision for e in watcher.events]
        assert revisions == sorted(set(revisions)), "no duplicates, in order"
        # Only resume/* changes, and revisions contiguous per the store's counter
        # (one apart; no other key changed), except where a new term jumped past the
        # fencing-token ceiling: no gap inside our stream.
        steps = {b - a for a, b in itertools.pairwise(revisions)}
        assert all(step == 1 or step >= TOKEN_RESERVE_STEP for step in steps), steps
    finally:
        watcher.close()


def test_revision_before_a_restored_snapshot_is_compacted(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    """A node keeps the changes it applied itself; one restarted from a snapshot has
    no history before it, and a watch from an older revision gets COMPACTED."""
    cluster = cluster_factory(compaction_min_entries=20, compaction_min_time=1.5)
    follower = next(n for n in cluster.nodes if n.id != cluster.leader_id())
    dump = cluster.node_dir(follower.id) / "raft.dump"
    with cluster.client() as c:
        for i in range(2000):
            c.release(c.acquire(f"old/{i}", owner="o", ttl=5.0))
            if i > 30 and dump.exists():
                break
    assert dump.exists(), "the follower never took a snapshot"
    cluster.stop_node(follower.id)
    cluster.start_node(follower.id)
    with Client([follower.client]) as c:
        wait_for(lambda: c.node_status(follower.client)["revision"] >= 60, 30, "catch up")

    async def first_frame() -> None:
        async with AsyncClient([follower.client]) as ac:
            async for _ in ac.watch("old/", from_revision=1):
                break

    with pytest.raises(CompactedError) as info:
        asyncio.run(first_frame())
    assert info.value.definite and info.value.detail["revision"] >= 60
