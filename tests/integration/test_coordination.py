"""Coordination on a real cluster: fair blocking acquire, handoff, transfer, fence
checks and held locks that renew themselves."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from raftlease import AsyncClient, LeaseHeldError, LeaseNotFoundError, NotOwnerError
from raftlease.testing import LocalCluster, wait_for
from tests.integration.test_cluster import raw_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def queue_length(c: object, key: str) -> int:
    """How many acquires wait on ``key`` (a no-wait acquire reports it, changing
    nothing)."""
    try:
        lease = c.acquire(key, owner="probe", ttl=0.5)  # type: ignore[attr-defined]
    except LeaseHeldError as exc:
        return int(exc.detail.get("waiting", 0))
    c.release(lease)  # type: ignore[attr-defined]
    return -1


def run_waiters(
    shared: LocalCluster, key: str, owners: list[str], priorities: list[int]
) -> list[tuple[str, int]]:
    """Queue one blocking acquire per owner, in list order, behind a holder; then
    release and return the (owner, token) grant order."""
    granted: list[tuple[str, int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    with shared.client() as c:
        holder = c.acquire(key, owner="holder", ttl=30.0)

        def waiter(owner: str, priority: int) -> None:
            try:
                with shared.client() as own:
                    lease = own.acquire(key, owner=owner, ttl=10.0, wait=60.0, priority=priority)
                    with lock:
                        granted.append((owner, lease.token))
                    own.release(lease)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = []
        for i, (owner, priority) in enumerate(zip(owners, priorities, strict=True)):
            thread = threading.Thread(target=waiter, args=(owner, priority))
            thread.start()
            threads.append(thread)
            wait_for(lambda n=i + 1: queue_length(c, key) == n, 20, f"waiter {owner} queued")
        c.release(holder)
        for thread in threads:
            thread.join(60)
    assert not errors, errors
    return granted


def test_eight_waiters_are_granted_in_queue_order(shared: LocalCluster) -> None:
    owners = [f"w{i}" for i in range(8)]
    granted = run_waiters(shared, "fair/k", owners, [0] * 8)
    assert [owner for owner, _ in granted] == owners
    tokens = [token for _, token in granted]
    assert tokens == sorted(tokens) and len(set(tokens)) == 8


def test_priority_then_fifo(shared: LocalCluster) -> None:
    owners = ["low-a", "high-a", "low-b", "high-b"]
    granted = run_waiters(shared, "prio/k", owners, [0, 5, 0, 5])
    assert [owner for owner, _ in granted] == ["high-a", "high-b", "low-a", "low-b"]


def test_a_crashed_waiter_does_not_block_the_queue(shared: LocalCluster) -> None:
    leader = shared.wait_for_leader()["client"]
    with shared.client() as c:
        holder = c.acquire("crash/k", owner="holder", ttl=30.0)
        # A waiter that queues and then vanishes (nobody will ever poll or renew).
        ghost = raw_request(
            leader,
            {
                "id": 1,
                "op": "acquire",
                "key": "crash/k",
                "owner": "ghost",
                "ttl": 1.0,
                "wait": 60.0,
                "cid": "ghost-client",
                "seq": 1,
                "ack": 1,
            },
        )
        assert ghost["ok"] and ghost["result"]["queued"]
        result: dict[str, object] = {}

        def live_waiter() -> None:
            with shared.client() as own:
                lease = own.acquire("crash/k", owner="live", ttl=5.0, wait=60.0)
                result["at"] = time.monotonic()
                result["token"] = lease.token
                own.release(lease)

        thread = threading.Thread(target=live_waiter)
        thread.start()
        wait_for(lambda: queue_length(c, "crash/k") == 2, 20, "both waiters queued")
        released_at = time.monotonic()
        c.release(holder)
        thread.join(60)
    # The ghost got the key first and its 1 s lease expired; then the live waiter.
    assert "at" in result, "the live waiter was never granted"
    assert 0.5 <= float(result["at"]) - released_at < 20  # type: ignore[arg-type]


def test_wait_that_times_out_leaves_the_queue(shared: LocalCluster) -> None:
    with shared.client() as c:
        holder = c.acquire("timeout/k", owner="holder", ttl=30.0)
        started = time.monotonic()
        with pytest.raises(LeaseHeldError) as info:
            c.acquire("timeout/k", owner="impatient", ttl=5.0, wait=0.5)
        assert info.value.definite and time.monotonic() - started >= 0.5
        assert queue_length(c, "timeout/k") == 0
        c.release(holder)


def test_transfer_and_fence_check(shared: LocalCluster) -> None:
    with shared.client() as c:
        mine = c.acquire("transfer/k", owner="alice", ttl=30.0)
        assert c.fence("transfer/k", mine.token) is True
        theirs = c.transfer(mine, owner="bob")
        assert theirs.owner == "bob" and theirs.token > mine.token
        assert theirs.lease_id != mine.lease_id
        holder = c.holder("transfer/k")
        assert holder is not None and holder.owner == "bob"
        assert c.fence("transfer/k", mine.token) is False
        assert c.fence("transfer/k", theirs.token, consistency="log") is True
        with pytest.raises((NotOwnerError, LeaseNotFoundError)):
            c.renew(mine)
        c.renew(theirs)
        c.release(theirs)
        assert c.fence("transfer/k", theirs.token) is False


#: The TTL of held locks whose validity a test asserts over several TTLs: renewals
#: come every third of it, so a renewal may be late by more than a second (a busy
#: 2-core machine) before the lock stops being valid on the client's clock.
HELD_TTL = 3.0


def test_held_lock_renews_past_its_ttl_and_releases_on_exit(shared: LocalCluster) -> None:
    with shared.client() as c:
        with c.lock("held/k", owner="agent", ttl=HELD_TTL) as held:
            token = held.token
            until = time.monotonic() + 2.5 * HELD_TTL  # more than two TTLs
            while time.monotonic() < until:
                assert held.valid and not held.lost.is_set()
                holder = c.holder("held/k")
                assert holder is not None and holder.token == token
        assert c.holder("held/k") is None, "released on exit"


def test_held_lock_reports_loss(shared: LocalCluster) -> None:
    reasons: list[str] = []
    with (
        shared.client() as c,
        c.lock("lost/k", owner="agent", ttl=HELD_TTL, on_lost=reasons.append) as held,
    ):
        # Someone with the lease id releases it behind the lock's back.
        assert held.lease is not None
        c.release(held.lease)
        assert held.lost.wait(10), "loss was not detected"
        assert not held.valid and reasons and "no longer has our lease" in reasons[0]


def test_async_lock_and_blocking_acquire(shared: LocalCluster) -> None:
    async def scenario() -> list[str]:
        order: list[str] = []
        async with AsyncClient(shared.endpoints) as a, AsyncClient(shared.endpoints) as b:
            async with a.lock("async/k", owner="a", ttl=HELD_TTL) as held:
                waiter = asyncio.create_task(b.acquire("async/k", owner="b", ttl=5.0, wait=30.0))
                until = time.monotonic() + 2.5 * HELD_TTL  # renewed past two TTLs
                while time.monotonic() < until:
                    assert held.valid
                    await asyncio.sleep(0.05)
                assert not waiter.done(), "b must wait while a holds the lock"
                order.append("a")
            lease = await waiter
            order.append(lease.owner)
            assert lease.token > held.token
            await b.release(lease)
        return order

    assert asyncio.run(scenario()) == ["a", "b"]


def test_fenced_resource_rejects_a_paused_holder(shared: LocalCluster) -> None:
    """The recipe a protected resource uses: a holder whose lease lapsed and was
    replaced cannot write after its successor, whatever it believes."""
    from raftlease import FencedResource, StaleTokenError

    with shared.client() as c:
        fence = FencedResource(confirm=c.fence)
        # Still live for the confirm below (one more call): 2 s of margin on a loaded
        # machine; the successor waits for its expiry.
        old = c.acquire("fenced/k", owner="slow", ttl=2.0)
        fence.check("fenced/k", old.token)
        new = c.acquire("fenced/k", owner="fast", ttl=5.0, wait=10.0)  # after old expires
        fence.check("fenced/k", new.token)
        fence.check("fenced/k", new.token)  # the same holder writes again
        assert not fence.accepts("fenced/k", old.token)
        with pytest.raises(StaleTokenError) as info:
            fence.check("fenced/k", old.token)  # the paused holder wakes up and writes
        assert info.value.detail["highest"] == new.token
        c.release(new)


def test_fenced_resource_refuses_a_made_up_token(shared: LocalCluster) -> None:
    """A huge token nobody was granted, shown to the resource: without confirmation it
    would be adopted and lock the real holder out; with ``confirm=c.fence`` the cluster
    says it is not the holder's and it is refused."""
    from raftlease import FencedResource, UnconfirmedTokenError

    with shared.client() as c:
        fence = FencedResource(confirm=c.fence)
        held = c.acquire("fenced/forged", owner="real", ttl=5.0)
        fence.check("fenced/forged", held.token)
        with pytest.raises(UnconfirmedTokenError):
            fence.check("fenced/forged", held.token + 10**12)
        fence.check("fenced/forged", held.token)  # the real holder still writes
        unguarded = FencedResource()
        unguarded.check("fenced/forged", held.token + 10**12)
        assert not unguarded.accepts("fenced/forged", held.token), "the risk confirm removes"
        c.release(held)
