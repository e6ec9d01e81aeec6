"""Shared ownership, lease sessions and election on a real cluster.

* semaphores, pools and read/write locks never exceed their capacity, checked
  exactly from the state machine's own event stream (a watch) and from the clients'
  holding intervals, under 8 concurrent clients and a leader failover;
* one session keep-alive keeps many leases; a SIGKILLed session holder loses them all
  when its session expires, and waiters get them in the same entry;
* a session closed behind its holder's back is reported lost (callback, event,
  attached locks); a session whose keep-alives fail reports jeopardy and recovers;
* election: one leader at a time; a killed leader's successor is elected only after
  its session expires; observers see every change in the same order.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from raftlease import (
    RW_CAPACITY,
    AsyncClient,
    CapacityMismatchError,
    Client,
    InvalidArgumentError,
    Leader,
    LeaseHeldError,
    RaftLeaseError,
    SessionNotFoundError,
    WatchEvent,
)
from raftlease.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: The TTL of lease sessions whose leases a test asserts stay held for a while:
#: keep-alives come every third of it, so one may be late by most of a second (a
#: busy 2-core machine) before anything lapses.
SESSION_TTL = 2.5


# ------------------------------------------------------------------ checkers


def capacity_violations(events: Iterable[WatchEvent], capacities: dict[str, int]) -> list[str]:
    """Replay the state machine's changes and report every moment a key had more
    units granted than its capacity, a token granted twice or out of order, or an
    end of a lease that was never granted."""
    problems: list[str] = []
    live: dict[str, dict[int, int]] = {}  # key -> token -> units
    last_token = 0
    for e in events:
        if e.key not in capacities:
            continue
        held = live.setdefault(e.key, {})
        if e.type == "grant":
            if e.token <= last_token:
                problems.append(f"token {e.token} on {e.key} after {last_token}")
            last_token = max(last_token, e.token)
            held[e.token] = e.units
            used = sum(held.values())
            if used > capacities[e.key]:
                problems.append(
                    f"{e.key}: {used} units held at revision {e.revision} "
                    f"(capacity {capacities[e.key]})"
                )
        elif e.type in ("release", "expire", "transfer") and held.pop(e.token, None) is None:
            problems.append(f"{e.type} of token {e.token} on {e.key}, never granted")
    return problems


@dataclass(frozen=True)
class Holding:
    key: str
    units: int
    start: float  # after the grant returned (the client trusts it from here)
    end: float  # before the release was sent, or when the lease stopped being valid


def interval_violations(holdings: list[Holding], capacities: dict[str, int]) -> list[str]:
    """Client side: at no instant may the units of the intervals in which clients
    trusted their leases on a key add up to more than its capacity."""
    problems = []
    for key, capacity in capacities.items():
        edges = sorted(
            [(h.start, h.units) for h in holdings if h.key == key]
            + [(h.end, -h.units) for h in holdings if h.key == key],
            key=lambda edge: (edge[0], edge[1]),  # ends before starts at one instant
        )
        used = 0
        for at, delta in edges:
            used += delta
            if used > capacity:
                problems.append(f"{key}: {used} units trusted at {at:.3f} (capacity {capacity})")
                break
    return problems


def ev(kind: str, key: str, token: int, units: int = 1, revision: int = 0) -> WatchEvent:
    return WatchEvent(kind, key, "o", token, revision or token, "", units)


def test_checkers_catch_overcommitted_histories() -> None:
    caps = {"p": 3}
    ok = [ev("grant", "p", 1, 2), ev("grant", "p", 2, 1), ev("release", "p", 1, 2)]
    ok += [ev("grant", "p", 4, 2)]
    assert capacity_violations(ok, caps) == []
    too_many = [*ok, ev("grant", "p", 5, 1)]
    assert "4 units held" in capacity_violations(too_many, caps)[0]
    backwards = [ev("grant", "p", 3), ev("grant", "p", 2)]
    assert "after 3" in capacity_violations(backwards, caps)[0]
    phantom = [ev("expire", "p", 9)]
    assert "never granted" in capacity_violations(phantom, caps)[0]

    fine = [Holding("p", 2, 0.0, 1.0), Holding("p", 1, 0.5, 2.0), Holding("p", 2, 1.0, 3.0)]
    assert interval_violations(fine, caps) == []
    overlap = [*fine, Holding("p", 1, 1.5, 1.6)]
    assert "4 units trusted" in interval_violations(overlap, caps)[0]


# ------------------------------------------------------- limits under failover

RESOURCES = {
    "shared/pool": (8, (1, 2, 3)),  # 8 GPUs; a job takes 1 to 3
    "shared/sem": (3, (1,)),  # 3 slots
    "shared/rw": (RW_CAPACITY, (1, 1, 1, RW_CAPACITY)),  # readers, and a writer in four
}


class EventLog:
    """A watch on a prefix of a fresh cluster, collected on a thread until ``stop``.

    It watches from revision 1: the client's watch is subscribed only when first
    iterated, on the thread, so a watch "from now" could miss the first grants of
    workers started right after (seen once: a release of token 1 "never granted")."""

    def __init__(self, cluster: LocalCluster, prefix: str) -> None:
        self.events: list[WatchEvent] = []
        self.error: BaseException | None = None
        self._client = cluster.client()
        self._prefix = prefix
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._started.wait(10)

    def _run(self) -> None:
        try:
            stream = self._client.watch(self._prefix, from_revision=1)
            self._started.set()
            for event in stream:
                self.events.append(event)
                if event.key.endswith("/end-marker"):
                    return
        except BaseException as exc:  # reported by the test
            self.error = exc
            self._started.set()

    def stop(self, c: Client) -> list[WatchEvent]:
        """Take a marker lease: once the watch sees it, it has seen everything
        before it (events arrive in revision order)."""
        c.acquire(self._prefix + "end-marker", owner="test", ttl=1.0)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the watch never saw the end marker"
        assert self.error is None, self.error
        self._client.close()
        return self.events


def test_semaphores_pools_rwlocks_never_exceed_capacity_under_failover(
    cluster: LocalCluster,
) -> None:
    capacities = {key: cap for key, (cap, _) in RESOURCES.items()}
    log = EventLog(cluster, "shared/")
    holdings: list[Holding] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + 12.0

    def worker(n: int) -> None:
        rng = random.Random(n)
        try:
            with cluster.client(deadline=20.0) as c:
                for _ in range(40):  # bounded; usually stopped by the clock first
                    if time.monotonic() > stop_at:
                        return
                    key = rng.choice(sorted(RESOURCES))
                    capacity, choices = RESOURCES[key]
                    units = rng.choice(choices)
                    try:
                        lease = c.acquire(
                            key,
                            owner=f"w{n}",
                            ttl=5.0,
                            wait=8.0,
                            capacity=capacity,
                            units=units,
                        )
                    except LeaseHeldError:
                        continue  # waited 8 s without a grant: fine, try again
                    start = time.monotonic()
                    time.sleep(rng.uniform(0.0, 0.05))
                    end = min(time.monotonic(), lease.valid_until)
                    with lock:
                        holdings.append(Holding(key, units, start, end))
                    try:
                        c.release(lease)
                    except RaftLeaseError as exc:
                        if exc.definite:
                            raise
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    with cluster.client() as c:
        wait_for(lambda: len(holdings) >= 20, 30, "the workload got going")
        old = cluster.leader_id()
        cluster.kill_node(old)
        new = cluster.wait_for_leader(timeout=30, exclude=old)
        before = len(holdings)
        wait_for(lambda: len(holdings) >= before + 20, 30, "grants continue after failover")
        cluster.restart_node(old)
        for thread in threads:
            thread.join(60)
        assert not any(t.is_alive() for t in threads)
        assert errors == [], errors
        events = log.stop(c)
    grants = [e for e in events if e.type == "grant" and e.key in capacities]
    assert len(grants) >= 40 and new["node"] != old
    # Shared keys were shared: some instant had several holders of the pool.
    assert (
        max(
            sum(1 for h in holdings if h.key == "shared/pool" and h.start <= t.start < h.end)
            for t in holdings
        )
        >= 2
    )
    assert capacity_violations(events, capacities) == []
    assert interval_violations(holdings, capacities) == []


def test_capacity_is_fixed_while_a_key_is_in_use(shared: LocalCluster) -> None:
    with shared.client() as c:
        lease = c.acquire("cap/k", owner="a", ttl=5.0, capacity=4, units=3)
        with pytest.raises(CapacityMismatchError) as info:
            c.acquire("cap/k", owner="b", ttl=5.0, capacity=2)
        assert info.value.detail["capacity"] == 4
        with pytest.raises(LeaseHeldError) as held:
            c.acquire("cap/k", owner="b", ttl=5.0, capacity=4, units=2)
        assert held.value.detail["used"] == 3
        second = c.acquire("cap/k", owner="c", ttl=5.0, capacity=4, units=1)
        read = c.read("cap/k")
        assert (read.capacity, read.used) == (4, 4)
        assert sorted(h.owner for h in read.holders) == ["a", "c"]
        assert c.fence("cap/k", lease.token) and c.fence("cap/k", second.token)
        c.release(lease)
        c.release(second)
        assert c.holder("cap/k") is None
        plain = c.acquire("cap/k", owner="d", ttl=5.0)  # free again: any capacity
        c.release(plain)


def test_rwlock_writer_is_not_starved_by_readers(shared: LocalCluster) -> None:
    """A queued writer blocks later readers, and gets the lock when the readers
    that were there before it leave."""
    granted: list[str] = []
    with shared.client() as c:
        r1 = c.acquire("rwq/doc", owner="r1", ttl=10.0, capacity=RW_CAPACITY)

        def writer() -> None:
            with shared.client() as w, w.write_lock("rwq/doc", owner="writer", ttl=5.0, wait=30):
                granted.append("writer")

        thread = threading.Thread(target=writer)
        thread.start()
        wait_for(lambda: queued(c, "rwq/doc") == 1, 20, "writer queued")
        # A reader arriving now would fit but must not overtake the writer.
        with pytest.raises(LeaseHeldError):
            c.acquire("rwq/doc", owner="r2", ttl=10.0, capacity=RW_CAPACITY)
        assert granted == []
        c.release(r1)
        thread.join(30)
        assert granted == ["writer"]


def queued(c: Client, key: str) -> int:
    """How many acquires wait on ``key``, from a refused probe (changes nothing)."""
    try:
        lease = c.acquire(key, owner="probe", ttl=0.5, capacity=RW_CAPACITY, units=RW_CAPACITY)
    except LeaseHeldError as exc:
        return int(exc.detail.get("waiting", 0))
    c.release(lease)
    return -1


# ------------------------------------------------------------------ sessions

HOLDER_SCRIPT = """
import json, sys, time
from raftlease import Client
endpoints, ttl, keys = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
with Client(endpoints) as c:
    session = c.session(owner="doomed", ttl=ttl).open()
    tokens = {key: session.acquire(key).token for key in keys}
    print(json.dumps({"session": session.session_id, "tokens": tokens}), flush=True)
    deadline = time.monotonic() + 120  # bounded: the test kills it long before
    while time.monotonic() < deadline and not session.lost.is_set():
        time.sleep(0.1)
"""


def start_holder(cluster: LocalCluster, ttl: float, keys: list[str]) -> tuple[Any, dict[str, Any]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER_SCRIPT, ",".join(cluster.endpoints), str(ttl), *keys],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the session holder did not start"
    return proc, json.loads(line)


def test_one_keepalive_keeps_many_leases_and_expiry_releases_them_all(
    shared: LocalCluster,
) -> None:
    keys = [f"sess/k{i}" for i in range(20)]
    ttl = SESSION_TTL
    proc, started = start_holder(shared, ttl, keys)
    try:
        with shared.client() as c:
            # Three TTLs later every lease is still held, under its first token:
            # kept by the session's keep-alives alone.
            until = time.monotonic() + 3 * ttl
            while time.monotonic() < until:
                for key in keys:
                    holder = c.holder(key)
                    assert holder is not None and holder.token == started["tokens"][key]
            # A waiter queues on one key; the holder process dies without a word.
            waiter = threading.Thread(
                target=lambda: results.append(c.acquire(keys[0], owner="next", ttl=5.0, wait=30))
            )
            results: list[Any] = []
            waiter.start()
            wait_for(lambda: waiting_on(c, keys[0]) == 1, 20, "the waiter queued")
            read_sent = time.monotonic()
            kept = c.holder(keys[1])  # an attached lease ends with its session
            assert kept is not None and kept.remaining > 0
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            waiter.join(30)
            assert results and results[0].owner == "next"
            assert_granted_after_expiry(time.monotonic() - read_sent, kept.remaining)
            assert all(c.holder(key) is None for key in keys[1:])
            assert c.holder(keys[0]) is not None
            c.release(results[0])
            with pytest.raises(SessionNotFoundError):
                c.call("session_keepalive", {"session_id": started["session"]}, mutating=True)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def assert_granted_after_expiry(elapsed: float, remaining: float) -> None:
    """A waiter on a dead holder's key is granted only once the holder's session
    expired. A read sent ``elapsed`` seconds before the grant returned saw the session
    with ``remaining`` seconds of log time left (no keep-alive can have come after the
    kill, one before only moves the expiry later), and a leader never stamps log time
    ahead of its own clock: so at least that long passed. Exact up to the read's
    millisecond rounding, whatever the load; the kill itself ends no session early."""
    assert elapsed >= remaining - 0.01, (
        f"granted {elapsed:.3f} s after a read that saw {remaining:.3f} s left on the session"
    )


def waiting_on(c: Client, key: str) -> int:
    try:
        lease = c.acquire(key, owner="probe", ttl=0.5)
    except LeaseHeldError as exc:
        return int(exc.detail.get("waiting", 0))
    c.release(lease)
    return -1


def test_attached_lease_is_trusted_only_to_its_sessions_expiry() -> None:
    """A lease attached to a session expires with the session, which may have been
    kept alive last well before the acquire: the lease's own window is the log time
    it had left when granted, not a full TTL."""

    async def build() -> Any:
        client = AsyncClient(["127.0.0.1:9"], clock_drift=0.01, margin=0.05)
        result = {"key": "k", "owner": "o", "token": 7, "ttl": 10_000, "lease_id": "L"}
        attached = client._lease({**result, "now": 1_000, "expires_at": 5_000}, sent=100.0)
        plain = client._lease({**result, "now": 1_000, "expires_at": 11_000}, sent=100.0)
        return attached, plain

    attached, plain = asyncio.run(build())
    assert attached.valid_until == pytest.approx(100.0 + 4.0 * 0.99 - 0.05)
    assert plain.valid_until == pytest.approx(100.0 + 10.0 * 0.99 - 0.05)


def test_session_closed_behind_its_back_is_reported_lost(shared: LocalCluster) -> None:
    reasons: list[str] = []
    seen_from_callback: list[Any] = []

    def on_lost(reason: str) -> None:
        reasons.append(reason)
        # A blocking call from the callback: it runs on its own thread, not on the
        # client's event loop (where it would deadlock).
        seen_from_callback.append(c.holder("lost-sess/a"))

    with shared.client() as c, shared.client() as other:
        session = c.session(owner="agent", ttl=SESSION_TTL, on_lost=on_lost).open()
        with pytest.raises(InvalidArgumentError):
            session.lock("lost-sess/b", on_lost=print)  # the session reports loss
        with session.lock("lost-sess/a") as held:
            assert held.valid and held.lease is not None and held.lease.session is not None
            other.call("session_close", {"session_id": session.session_id}, mutating=True)
            assert session.lost.wait(10) and held.lost.is_set()
            assert not held.valid and not session.valid
            wait_for(lambda: bool(seen_from_callback), 10, "the callback's client call")
            assert reasons and "no longer has our session" in reasons[0]
            assert seen_from_callback == [None]
            assert c.holder("lost-sess/a") is None
        session.close()


#: The jeopardy test's session TTL. Its first failed keep-alive (sent a third of the
#: TTL after the last good one, failing a third later) reports jeopardy with a third
#: of the TTL still valid; that third is what the test has to see it, resume the
#: cluster, and get the next keep-alive through a possible election. 12 s leaves 4 s.
JEOPARDY_TTL = 12.0


def test_session_jeopardy_while_the_cluster_is_paused_then_recovers(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    # Peer connections outlive the pause (no reconnect to wait for after it).
    cluster = cluster_factory(connection_timeout=30.0)
    jeopardy: list[str] = []
    lost: list[str] = []
    with cluster.client() as c:
        with c.session(
            owner="agent", ttl=JEOPARDY_TTL, on_jeopardy=jeopardy.append, on_lost=lost.append
        ) as session:
            lease = session.acquire("jeop/a")
            nodes = [n.id for n in cluster.nodes]
            for node in nodes:
                cluster.pause_node(node)
            try:
                wait_for(lambda: bool(jeopardy), JEOPARDY_TTL, "jeopardy reported")
                assert session.jeopardy and session.valid and not lost
            finally:
                for node in nodes:
                    cluster.resume_node(node)
            wait_for(lambda: not session.jeopardy, JEOPARDY_TTL, "out of jeopardy")
            assert not lost and lease.valid
            holder = c.holder("jeop/a")
            assert holder is not None and holder.token == lease.token
        assert c.holder("jeop/a") is None  # closing the session released it


# ------------------------------------------------------------------ election

CANDIDATE_SCRIPT = """
import json, sys, time
from raftlease import Client
endpoints, name, value, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
with Client(endpoints) as c:
    session = c.session(owner=value, ttl=ttl).open()
    lease = c.election(name).campaign(value, session=session)
    print(json.dumps({"token": lease.token}), flush=True)
    deadline = time.monotonic() + 120  # bounded: the test kills it long before
    while time.monotonic() < deadline:
        time.sleep(0.1)
"""


def test_election_one_leader_successor_after_expiry_observers_agree(
    shared: LocalCluster,
) -> None:
    name = "elect/coordinator"
    ttl = SESSION_TTL
    seen: dict[str, list[Leader | None]] = {"a": [], "b": []}
    stop = threading.Event()

    def observer(tag: str) -> None:
        with shared.client() as oc:
            for leader in oc.election(name).observe():
                seen[tag].append(leader)
                if stop.is_set() and leader is not None and leader.value == "final":
                    return

    observers = [threading.Thread(target=observer, args=(t,), daemon=True) for t in seen]
    for thread in observers:
        thread.start()
    wait_for(lambda: all(seen.values()), 20, "observers started")

    first = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CANDIDATE_SCRIPT,
            ",".join(shared.endpoints),
            name,
            "cand-1",
            str(ttl),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert first.stdout is not None
        elected = json.loads(first.stdout.readline())
        with shared.client() as c:
            election = c.election(name)
            leader = election.leader()
            assert leader is not None and leader.value == "cand-1"
            assert leader.token == elected["token"]
            with c.session(owner="cand-2", ttl=5.0) as session:
                result: list[Any] = []
                campaign = threading.Thread(
                    target=lambda: result.append(election.campaign("cand-2", session=session))
                )
                campaign.start()
                wait_for(lambda: waiting_on(c, name) == 1, 20, "cand-2 queued")
                assert not result and election.leader().value == "cand-1"  # type: ignore[union-attr]
                read_sent = time.monotonic()
                kept = c.holder(name)  # cand-1's lease, attached to its session
                assert kept is not None and kept.owner == "cand-1"
                first.send_signal(signal.SIGKILL)
                first.wait(10)
                campaign.join(30)
                assert result, "the successor was not elected"
                assert_granted_after_expiry(time.monotonic() - read_sent, kept.remaining)
                assert result[0].token > elected["token"]
                election.proclaim("cand-2b")
                assert election.leader().value == "cand-2b"  # type: ignore[union-attr]
                election.resign()
                assert election.leader() is None
                stop.set()
                with c.session(owner="last", ttl=5.0) as last:
                    c.election(name).campaign("final", session=last)
                    for thread in observers:
                        thread.join(20)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    assert seen["a"] == seen["b"], "observers saw different sequences"
    values = [leader.value if leader else None for leader in seen["a"]]
    assert values == [None, "cand-1", None, "cand-2", "cand-2b", None, "final"]
    revisions = [leader.revision or 0 for leader in seen["a"] if leader is not None]
    assert revisions == sorted(revisions)


def test_async_sessions_pools_and_election(shared: LocalCluster) -> None:
    """The asyncio flavour of the same surface."""
    cluster = shared

    async def scenario() -> list[str]:
        out: list[str] = []
        async with AsyncClient(cluster.endpoints) as ac:
            async with ac.session(owner="async-agent", ttl=2.0) as session:
                a = await session.acquire("apool/gpus", capacity=4, units=3)
                with pytest.raises(LeaseHeldError):
                    await ac.acquire("apool/gpus", owner="x", ttl=2.0, capacity=4, units=2)
                async with ac.pool("apool/gpus", capacity=4, units=1, owner="b", ttl=2.0) as held:
                    out.append(f"pool used {(await ac.read('apool/gpus')).used}")
                    assert held.valid
                election = ac.election("aelect")
                lease = await election.campaign("here", session=session)
                leader = await election.leader()
                assert leader is not None and leader.token == lease.token
                out.append(f"leader {leader.value}")
                assert a.valid
            out.append(f"after close {(await ac.holder('apool/gpus'))}")
        return out

    assert asyncio.run(scenario()) == ["pool used 4", "leader here", "after close None"]


def test_a_campaign_whose_session_ends_says_so(shared: LocalCluster) -> None:
    """A queued acquire dropped because its session ended raises
    SessionNotFoundError (not "not granted within the wait")."""
    with shared.client() as c, shared.client() as other:
        holder = c.acquire("endq/k", owner="holder", ttl=30.0)
        session = c.session(owner="waiter", ttl=5.0).open()
        outcome: list[BaseException] = []

        def wait() -> None:
            try:
                session.acquire("endq/k", wait=30.0)
            except RaftLeaseError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        wait_for(lambda: waiting_on(c, "endq/k") == 1, 20, "queued")
        other.call("session_close", {"session_id": session.session_id}, mutating=True)
        thread.join(20)
        assert outcome and isinstance(outcome[0], SessionNotFoundError), outcome
        assert c.holder("endq/k") is not None  # the holder is untouched
        c.release(holder)
        session.close()


def test_closing_the_client_stops_its_sessions_keepalives(shared: LocalCluster) -> None:
    """A client closed with a session still open stops that session's keep-alive (no
    task left pending); the session then expires and its leases are released."""
    c = shared.client()
    session = c.session(owner="forgetful", ttl=1.0).open()
    session.acquire("forgot/a")
    c.close()
    assert session._async._task is None
    with shared.client() as other:
        wait_for(lambda: other.holder("forgot/a") is None, 15, "the session expired")


def test_a_blocking_session_can_stop_its_keepalive(shared: LocalCluster) -> None:
    """``Session.stop_keepalive`` (as ``AsyncSession.stop_keepalive``): no more
    keep-alives, so the session expires after its TTL and its leases go; an explicit
    ``keepalive`` still works until then."""
    with shared.client() as c, shared.client() as other:
        session = c.session(owner="stopper", ttl=1.0).open()
        session.acquire("stop-ka/a")
        session.stop_keepalive()
        assert session._async._task is None
        session.keepalive()
        wait_for(lambda: other.holder("stop-ka/a") is None, 15, "the session expired")
