"""Cancellation that really cancels (issue 37): a waiting acquire or claim that is
cancelled, interrupted or ends with an unknown outcome withdraws its waiter, and a
grant that raced the withdrawal is released, so that no lease is left whose id
nobody has. Real node processes; every wait is on a condition with a deadline."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from raftlease import AsyncClient, Client
from raftlease.errors import RaftLeaseError
from raftlease.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "raftlease", *args]


def eps(cluster: LocalCluster) -> str:
    return ",".join(cluster.endpoints)


def ep(cluster: LocalCluster) -> tuple[str, str]:
    return ("--endpoints", eps(cluster))


def owners(c: Client, key: str) -> list[str]:
    return [w.owner for w in c.waiters(key)]


def leases_of(c: Client, owner: str) -> list[Any]:
    return [h for h in c.leases() if h.owner == owner]


@pytest.fixture
def interruptible() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in the main thread for the test."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_acquire_wait_signal_withdraws_the_waiter(
    shared: LocalCluster, sig: signal.Signals
) -> None:
    key = f"cancel/cli-acquire-{sig.name}"
    with shared.client() as c:
        held = c.acquire(key, owner="holder", ttl=60)
        proc = subprocess.Popen(
            cli("acquire", key, "--owner", "ghost", "--ttl", "30s", "--wait", "60s", *ep(shared)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: owners(c, key) == ["ghost"], 30, "the CLI's waiter")
            started = time.monotonic()
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 128 + sig, (out, err)
        assert time.monotonic() - started < 20
        assert "Traceback" not in err and "Aborted" not in err
        assert len(err.strip().splitlines()) == 1, err
        assert "withdrawn" in err
        assert c.waiters(key) == []
        c.release(held)
        # Nobody waits: the key goes to nobody (not to the abandoned waiter).
        assert c.holder(key) is None
        assert leases_of(c, "ghost") == []


def test_cli_queue_claim_wait_sigterm_withdraws_the_claim(shared: LocalCluster) -> None:
    name = "cancel-cli-claim"
    with shared.client() as c:
        q = c.queue(name)
        proc = subprocess.Popen(
            cli("queue", "claim", name, "--worker", "ghost", "--wait", "60s", *ep(shared)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: q.stats().waiting_claims == 1, 30, "the CLI's waiting claim")
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 128 + signal.SIGTERM, (out, err)
        assert "Traceback" not in err
        assert q.stats().waiting_claims == 0
        q.put({"n": 1})
        stats = q.stats()
        assert (stats.ready, stats.claimed) == (1, 0)  # nobody was handed it


def test_async_acquire_cancelled_leaves_no_waiter(shared: LocalCluster) -> None:
    key = "cancel/async"

    async def main() -> None:
        async with AsyncClient(shared.endpoints, **shared.client_options) as a:
            held = await a.acquire(key, owner="holder", ttl=60)
            task = asyncio.create_task(a.acquire(key, owner="ghost", ttl=30, wait=60))
            deadline = time.monotonic() + 30
            while [w.owner for w in await a.waiters(key)] != ["ghost"]:
                assert time.monotonic() < deadline, "the waiter never queued"
                await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await a.waiters(key) == []
            await a.release(held)
            assert await a.holder(key) is None

    asyncio.run(main())


def test_async_claim_cancelled_leaves_no_waiting_claim(shared: LocalCluster) -> None:
    """A waiting claim cancelled (at once, or once it waits) is withdrawn: the next
    task put is handed to nobody."""
    name = "cancel-async-claim"

    async def main() -> None:
        async with AsyncClient(shared.endpoints, **shared.client_options) as a:
            q = a.queue(name)
            for delay in (0.0, 0.001, 0.005):
                claim = asyncio.create_task(q.claim(worker="ghost", wait=60))
                await asyncio.sleep(delay)
                claim.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await claim
                assert (await q.stats()).waiting_claims == 0, delay
            claim = asyncio.create_task(q.claim(worker="ghost", wait=60))
            deadline = time.monotonic() + 30
            while (await q.stats()).waiting_claims != 1:
                assert time.monotonic() < deadline, "the claim never waited"
                await asyncio.sleep(0.05)
            claim.cancel()
            with pytest.raises(asyncio.CancelledError):
                await claim
            assert (await q.stats()).waiting_claims == 0
            await q.put({"n": 1})
            stats = await q.stats()
            assert (stats.ready, stats.claimed) == (1, 0)

    asyncio.run(main())


def test_async_acquire_cancelled_at_any_moment_leaves_no_orphan(shared: LocalCluster) -> None:
    """Cancelled while the acquire itself is in flight (outcome unknown, no lease id
    known yet): the same request is sent again under the same (cid, seq) to learn
    the id, then withdrawn. A cancellation that arrives with the answer is not lost
    (asyncio.wait_for on 3.11 swallowed it: the call went on waiting)."""
    key = "cancel/async-early"

    async def main() -> None:
        async with AsyncClient(shared.endpoints, **shared.client_options) as a:
            held = await a.acquire(key, owner="holder", ttl=300)
            for i, delay in enumerate((0.0, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01)):
                task = asyncio.create_task(a.acquire(key, owner=f"ghost{i}", ttl=30, wait=60))
                await asyncio.sleep(delay)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert await a.waiters(key) == [], delay
            await a.release(held)
            assert await a.holder(key) is None
            assert [h for h in await a.leases() if h.owner.startswith("ghost")] == []

    asyncio.run(main())


def test_async_cancel_racing_the_grant_releases_it(shared: LocalCluster) -> None:
    """The holder releases and the waiter is cancelled at about the same moment: the
    waiter was granted just before its withdrawal. Either the call returned the lease
    (it won the race) or it raised CancelledError and released the grant: the key is
    never left to a lease whose id nobody has."""
    key = "cancel/race"

    async def main() -> None:
        async with AsyncClient(shared.endpoints, **shared.client_options) as a:
            outcomes = set()
            for i, delay in enumerate((0.0, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016)):
                held = await a.acquire(key, owner="holder", ttl=60)
                owner = f"racer{i}"
                task = asyncio.create_task(a.acquire(key, owner=owner, ttl=60, wait=60))
                deadline = time.monotonic() + 30
                while [w.owner for w in await a.waiters(key)] != [owner]:
                    assert time.monotonic() < deadline, "the waiter never queued"
                    await asyncio.sleep(0.02)
                # The release grants the waiter in the same entry; the cancel comes
                # before it, with it, or after the grant but before its answer.
                release = asyncio.create_task(a.release(held))
                await asyncio.sleep(delay)
                task.cancel()
                await release
                try:
                    lease = await task
                except asyncio.CancelledError:
                    outcomes.add("cancelled")
                    assert await a.holder(key) is None, delay  # the raced grant was released
                else:
                    outcomes.add("granted")
                    await a.release(lease)
                assert await a.waiters(key) == []
            assert "cancelled" in outcomes  # a cancellation won at least once

    asyncio.run(main())


def test_blocking_acquire_interrupted_withdraws(shared: LocalCluster, interruptible: None) -> None:
    key = "cancel/blocking-interrupt"
    with shared.client() as c, shared.client() as waiter:
        held = c.acquire(key, owner="holder", ttl=60)
        main = threading.main_thread().ident
        assert main is not None

        def interrupt() -> None:
            wait_for(lambda: owners(c, key) == ["ghost"], 30, "the waiter")
            signal.pthread_kill(main, signal.SIGINT)

        helper = threading.Thread(target=interrupt, daemon=True)
        helper.start()
        interrupted = False
        try:
            waiter.acquire(key, owner="ghost", ttl=30, wait=60)
        except KeyboardInterrupt:
            interrupted = True
        helper.join(timeout=30)
        assert interrupted
        # The portal waited for the withdrawal before the interrupt propagated.
        assert c.waiters(key) == []
        c.release(held)
        assert c.holder(key) is None
        assert leases_of(c, "ghost") == []


def test_blocking_acquire_ending_unknown_during_leader_loss_withdraws(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiting acquire's poll fails (no leader: two of three nodes killed): the
    acquire raises, withdrawing its waiter with retries that outlast the outage; once
    the cluster is back the waiter is gone and no lease is owned by it."""
    key = "cancel/leader-loss"
    with (
        cluster.client() as c,
        cluster.client(deadline=3.0, attempt_timeout=1.0) as waiter,
    ):
        held = c.acquire(key, owner="holder", ttl=120)
        errors: list[BaseException] = []
        withdrawing = threading.Event()
        withdraw = waiter.aio._withdraw_until

        async def spy(send: Any, until: float) -> bool:
            withdrawing.set()
            return await withdraw(send, until)

        monkeypatch.setattr(waiter.aio, "_withdraw_until", spy)

        def run() -> None:
            try:
                waiter.acquire(key, owner="ghost", ttl=30, wait=90)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        wait_for(lambda: owners(c, key) == ["ghost"], 30, "the waiter")
        leader = cluster.leader_id()
        others = [n.id for n in cluster.nodes if n.id != leader]
        cluster.kill_node(leader)
        cluster.kill_node(others[0])
        # The poll fails (no leader) and the acquire starts withdrawing, retried
        # through the outage.
        wait_for(withdrawing.is_set, 60, "the withdrawal to start")
        cluster.start_node(leader)
        cluster.start_node(others[0])
        cluster.wait_for_leader()
        thread.join(timeout=90)
        assert not thread.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], RaftLeaseError), errors
        assert not errors[0].definite  # TIMEOUT / LEADER_CHANGED: outcome unknown
        wait_for(lambda: c.waiters(key) == [], 30, "the waiter withdrawn")
        c.release(held)
        assert c.holder(key) is None
        assert leases_of(c, "ghost") == []


@pytest.mark.parametrize("command", ["lock", "elect"])
def test_lock_timeout_against_a_dead_endpoint_fails_fast(command: str) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    out = subprocess.run(
        cli(command, "k", "--timeout", "2", "--endpoints", f"127.0.0.1:{port}", "--", "true"),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    elapsed = time.monotonic() - started
    assert out.returncode == 1, out
    assert elapsed < 10, elapsed
    assert "no node of the cluster answered within --timeout 2 s" in out.stderr
    assert "Traceback" not in out.stderr
