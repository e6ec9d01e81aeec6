"""The blocking client's direct lane (client/direct.py): a call's first try made on
the calling thread, anything but a plain success handed to the event loop's
``Transport.call`` with that try's outcome.

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_client_direct.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from raftlease.client import Client
from raftlease.errors import (
    LeaseHeldError,
    LeaseNotFoundError,
    RaftLeaseError,
)
from raftlease.models import Lease
from raftlease.testing import LocalCluster
from raftlease.testing.cluster import wait_for
from tests.unit.test_client_direct import HopCounter

pytestmark = pytest.mark.timeout(90)


def test_successful_calls_make_no_hop_and_errors_stay_definite(shared: LocalCluster) -> None:
    with shared.client() as c, shared.client(direct=False) as plain:
        c.acquire("direct/warm", owner="w", ttl=10.0)  # the lane finds the leader
        hops = HopCounter(c)
        lease = c.acquire("direct/a", owner="me", ttl=10.0)
        renewed = c.renew(lease)
        assert renewed.token == lease.token and renewed.valid_until >= lease.valid_until
        mine, theirs = c.holder("direct/a"), plain.holder("direct/a")
        assert mine is not None and theirs is not None
        assert (mine.owner, mine.token) == (theirs.owner, theirs.token) == ("me", lease.token)
        assert c.read("direct/a").holder is not None
        assert c.fence("direct/a", lease.token) is True
        assert hops.count == 0, "a successful call hopped to the loop thread"
        with pytest.raises(LeaseHeldError) as held:
            c.acquire("direct/a", owner="other", ttl=10.0)
        assert held.value.definite
        c.release(renewed)
        with pytest.raises(LeaseNotFoundError):
            c.renew(renewed)
        assert plain.holder("direct/a") is None
        # The errors were judged from the lane's answers: one hand-over each, and no
        # second send (the peer's dedup would hide it; the hop count does not).
        assert hops.count == 2


def test_a_redirect_moves_the_lane_to_the_leader(cluster: LocalCluster) -> None:
    leader = cluster.leader_id()
    endpoints = sorted(cluster.endpoints, key=lambda e: e == cluster.node(leader).client)
    with Client(endpoints, **cluster.client_options) as c:
        hops = HopCounter(c)
        lease = c.acquire("direct/redirect", owner="me", ttl=10.0)  # a follower first
        assert hops.count == 1
        c.renew(lease)
        assert hops.count == 1, "the lane stayed on a follower"


def _leases(client: Client, prefix: str, count: int) -> list[Lease]:
    return [client.acquire(f"{prefix}/t{i}", owner=f"o{i}", ttl=30.0) for i in range(count)]


def _in_threads(leases: list[Lease], work: Callable[[Lease], None]) -> None:
    """Run ``work(lease)`` for each lease, each on its own thread, all started
    together; fail with what any of them raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(leases))

    def run(lease: Lease) -> None:
        try:
            start.wait(10)
            work(lease)
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(lease,)) for lease in leases]
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    assert not errors, errors


def test_many_threads_share_one_client(shared: LocalCluster) -> None:
    with shared.client() as c:

        def work(lease: Lease) -> None:
            for _ in range(60):
                lease = c.renew(lease)
                assert c.holder(lease.key) is not None
                assert c.fence(lease.key, lease.token)

        leases = _leases(c, "direct", 8)
        _in_threads(leases, work)
        for lease in leases:
            holder = c.holder(lease.key)
            assert holder is not None and holder.token == lease.token
        seq = c.aio.transport.sequencer
        assert not seq._outstanding, "a request's seq was never ended"


def test_closing_the_client_wakes_a_call_running_on_its_loop(shared: LocalCluster) -> None:
    """Not only lane calls: a call running on the client's loop thread (an acquire
    waiting its turn in the key's queue) ends when another thread closes the client,
    with its outcome unknown, instead of blocking its thread for ever."""
    got: list[BaseException | None] = []
    with shared.client() as holder:
        holder.acquire("close/k", owner="holder", ttl=30)
        client = shared.client()

        def call() -> None:
            try:
                client.acquire("close/k", owner="waiter", ttl=5, wait=20)
                got.append(None)
            except BaseException as exc:  # the test inspects it
                got.append(exc)

        worker = threading.Thread(target=call, daemon=True)  # daemon: a failing build hangs it
        worker.start()
        try:
            wait_for(lambda: holder.waiters("close/k"), 10, "the acquire waiting its turn")
            client.close()
            worker.join(10)
            assert not worker.is_alive(), "the loop call was not woken by close()"
        finally:
            client.close()
            worker.join(30)
    assert len(got) == 1 and isinstance(got[0], RaftLeaseError), got
    assert not got[0].definite, got[0]


def test_concurrent_threads_each_take_a_lane_of_their_own(shared: LocalCluster) -> None:
    """With ``lanes`` at least the number of calling threads, no successful call
    hops to the loop thread, whatever the threads' timing; the pool never makes more
    lanes than its limit, and every seq is ended."""
    with shared.client(lanes=8) as c:
        leases = _leases(c, "lanes", 8)  # the first may be redirected: one hop
        hops = HopCounter(c)

        def work(lease: Lease) -> None:
            for _ in range(30):
                lease = c.renew(lease)
                assert c.holder(lease.key) is not None

        _in_threads(leases, work)
        # Hand-overs of a slow try (a loaded machine) are not counted: only calls
        # that found no lane to take.
        assert hops.without_lane == 0, "a call found no free lane although there were enough"
        assert c._lanes is not None and 1 <= c._lanes.size <= 8
        assert not c.aio.transport.sequencer._outstanding


def test_past_the_lane_limit_calls_take_the_loop(shared: LocalCluster) -> None:
    """``lanes=1``: one lane however many threads call; the others go through the
    loop and get right answers."""
    with shared.client(lanes=1) as c:

        def work(lease: Lease) -> None:
            for _ in range(30):
                lease = c.renew(lease)

        _in_threads(_leases(c, "lane1", 4), work)
        assert c._lanes is not None and c._lanes.size == 1
