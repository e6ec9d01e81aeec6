"""The blocking client's direct lane (client/direct.py): a call's first try made on
the calling thread, anything but a plain success handed to the event loop's
``Transport.call`` with that try's outcome.

* Against scripted peers (tests/unit/test_client_retry.py's ``ScriptedPeer``, run on a
  loop thread of the test's own): when the lane's try fails (no answer, connection
  closed, a redirect, a leadership change) the retry is the same request (client id
  and seq), and ``valid_until`` is still counted from the lane's send.
* Against a real cluster: the calls that take the lane make no hop to the loop thread
  when they succeed; definite errors come back as such without a second send; a
  redirect moves the lane to the leader; many threads at once (some on the lane, the
  rest through the loop) all get right answers under distinct seqs.

The unit half of these tests (no process); the integration half is
tests/integration/test_client_direct.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
import types
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from raftlease.client import Client, direct
from raftlease.client.direct import DirectLane, run_inline
from raftlease.errors import (
    InternalError,
    InvalidArgumentError,
    RaftLeaseError,
    TimeoutError_,
)
from raftlease.models import Lease
from raftlease.protocol import encode_frame
from raftlease.testing.cluster import wait_for
from tests.unit.test_client_retry import (
    ATTEMPT_TIMEOUT,
    DROP,
    FIRST_FAILURES,
    NOW_MS,
    TTL,
    Action,
    Received,
    ScriptedPeer,
    _always_granted,
    _first_attempt_fails,
    lease_result,
)

pytestmark = pytest.mark.timeout(90)

T = TypeVar("T")


class PeerLoop:
    """An event loop on a thread of its own for scripted peers (the blocking client
    runs its own loop thread; the peers must not share it)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def peers() -> Iterator[PeerLoop]:
    loop = PeerLoop()
    try:
        yield loop
    finally:
        loop.close()


class HopCounter:
    """Counts the blocking client's hops to its loop thread (``LoopPortal.run``)."""

    def __init__(self, client: Client) -> None:
        self.count = 0
        #: Calls that went to the portal without a lane try (no lane free).
        self.without_lane = 0
        portal = client.portal
        original = portal.run

        def counting(coro: Coroutine[Any, Any, Any]) -> Any:
            self.count += 1
            return original(coro)

        def portal_run(coro: Coroutine[Any, Any, Any]) -> Any:
            self.without_lane += 1
            return counting(coro)

        portal.run = portal_run  # type: ignore[method-assign]
        assert client._lanes is not None
        client._lanes.resume = counting  # the lanes' hand-overs go through the portal too


@pytest.mark.parametrize("op", ["acquire", "renew"])
@pytest.mark.parametrize("kind", FIRST_FAILURES)
def test_a_failed_lane_try_is_retried_as_the_same_request(
    peers: PeerLoop, kind: str, op: str
) -> None:
    other: list[str] = []
    first = peers.run(ScriptedPeer(_first_attempt_fails(kind, other)).start())
    second = peers.run(ScriptedPeer(_always_granted).start())
    other.append(second.addr)
    client = Client([first.addr, second.addr], deadline=20, attempt_timeout=ATTEMPT_TIMEOUT)
    try:
        hops = HopCounter(client)
        before = time.monotonic()
        if op == "renew":
            held = Lease("k", "o", 7, TTL, "L1", valid_until=0.0, expires_at_ms=NOW_MS)
            lease = client.renew(held)
        else:
            lease = client.acquire("k", owner="o", ttl=TTL)
        assert hops.count == 1, "the failed try was not handed to the loop once"
    finally:
        client.close()
        peers.run(first.close())
        peers.run(second.close())
    frames: list[Received] = sorted(first.ops(op) + second.ops(op), key=lambda r: r.at)
    assert len(frames) >= 2, "the lane's try was not retried"
    lane_try, retry = frames[0], frames[-1]
    assert lane_try.peer == first.addr and lane_try.conn == 0  # the lane's connection
    assert (retry.frame["cid"], retry.frame["seq"]) == (
        lane_try.frame["cid"],
        lane_try.frame["seq"],
    )
    if kind == "not_leader_redirect":
        assert retry.peer == second.addr, "the redirect was not followed"
    # Counted from the lane's send (between `before` and the peer receiving it).
    low = client.aio.valid_until(before, TTL)
    high = client.aio.valid_until(lane_try.at, TTL)
    assert low <= lease.valid_until <= high


def test_a_coroutine_that_awaits_the_loop_is_refused() -> None:
    class Suspends:
        def __await__(self) -> Iterator[None]:
            yield None  # what awaiting a loop's future does

    async def awaits() -> None:
        await Suspends()

    lane: DirectLane = object.__new__(DirectLane)
    with pytest.raises(InternalError, match="awaited the event loop"):
        run_inline(object(), lane, awaits())


def test_the_lane_is_only_active_inside_its_call() -> None:
    from raftlease.client import direct

    async def probe(client: object) -> object:
        return direct.active(client)

    lane: DirectLane = object.__new__(DirectLane)
    owner = object()
    assert run_inline(owner, lane, probe(owner)) is lane
    assert direct.active(owner) is None  # reset after the call
    got: list[object] = []

    def other_thread() -> None:
        got.append(run_inline(owner, lane, probe(object())))  # another client's call

    t = threading.Thread(target=other_thread)
    t.start()
    t.join(10)
    assert got == [None]


def test_a_connection_the_node_closed_while_idle_is_replaced_before_sending(
    peers: PeerLoop,
) -> None:
    """A node closes idle connections (``idle_timeout``): the lane notices before it
    sends, so the next call goes on a new connection as a plain first try (no
    hand-over, nothing counted as maybe applied)."""
    peer = peers.run(ScriptedPeer(_always_granted).start())
    client = Client([peer.addr], deadline=10, attempt_timeout=ATTEMPT_TIMEOUT)
    try:
        held = Lease("k", "o", 7, TTL, "L1", valid_until=0.0, expires_at_ms=NOW_MS)
        client.renew(held)

        async def close_all() -> None:
            for writer in peer._writers:
                writer.close()
                await writer.wait_closed()

        peers.run(close_all())
        hops = HopCounter(client)
        client.renew(held)
        assert hops.count == 0, "the closed connection was used for the try"
    finally:
        client.close()
        peers.run(peer.close())
    assert [r.conn for r in peer.ops("renew")] == [0, 1]


async def _never_answers(got: Received, n: int) -> Action:
    return DROP if got.frame.get("op") == "acquire" else lease_result(got.frame)


def test_closing_the_client_wakes_a_lane_call_and_keeps_its_outcome_unknown(
    peers: PeerLoop,
) -> None:
    """``Client.close`` from another thread while a call waits on the lane for an
    answer that may never come: the call ends at once, not at its attempt timeout,
    and says its outcome is unknown (the request was sent: it may have applied), not
    "client is closed", which is definite ("not applied")."""
    peer = peers.run(ScriptedPeer(_never_answers).start())
    client = Client([peer.addr], deadline=60, attempt_timeout=30)
    got: list[BaseException | None] = []

    def call() -> None:
        try:
            client.acquire("k", owner="o", ttl=TTL)
            got.append(None)
        except BaseException as exc:  # the test inspects it
            got.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    try:
        wait_for(lambda: peer.ops("acquire"), 10, "the lane's acquire reached the peer")
        closed_at = time.monotonic()
        client.close()
        worker.join(10)
        assert not worker.is_alive(), "the lane call was not woken by close()"
        assert time.monotonic() - closed_at < 10
    finally:
        client.close()
        worker.join(30)
        peers.run(peer.close())
    assert len(got) == 1 and isinstance(got[0], RaftLeaseError), got
    assert not got[0].definite, f"a request that may have applied was called definite: {got[0]!r}"
    assert [r.conn for r in peer.ops("acquire")] == [0]


def test_a_call_with_no_time_left_sends_nothing(peers: PeerLoop) -> None:
    """A call whose deadline has passed makes no try on the lane, as on the loop
    (``Transport.call``): a write the caller gave no time must not reach a node."""
    peer = peers.run(ScriptedPeer(_always_granted).start())
    client = Client([peer.addr], deadline=10, attempt_timeout=ATTEMPT_TIMEOUT)
    try:
        with pytest.raises(TimeoutError_):
            client.acquire("late", owner="o", ttl=TTL, timeout=0)
        client.acquire("k", owner="o", ttl=TTL)  # same lane: would follow the first
    finally:
        client.close()
        peers.run(peer.close())
    assert [r.frame["key"] for r in peer.ops("acquire")] == ["k"]


class RefusesFirstConnection(ScriptedPeer):
    """A node at its connection quota for the first connection only (the lane's):
    it answers with an id-None refusal before reading anything, as server/node.py
    does, and closes."""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._conns == 0:
            self._conns += 1
            refusal = {"id": None, "ok": False, "code": "QUOTA_EXCEEDED", "message": "full"}
            writer.write(encode_frame(refusal))
            await writer.drain()
            writer.close()
            return
        await super()._serve(reader, writer)


def test_a_connection_refused_to_the_lane_hands_the_call_to_the_loop(peers: PeerLoop) -> None:
    """The node refused the lane's connection (a quota) before reading the request:
    the call goes on through the client's own loop connection to the same node
    instead of failing, and not by way of another endpoint (a redirect back and a
    back-off for nothing). For ``LANE_REST`` seconds after, calls take the client's
    connection without trying a lane (no refused connect per call)."""
    peer = peers.run(RefusesFirstConnection(_always_granted).start())
    other = peers.run(ScriptedPeer(_always_granted).start())
    client = Client([peer.addr, other.addr], deadline=10, attempt_timeout=ATTEMPT_TIMEOUT)
    try:
        lease = client.acquire("k", owner="o", ttl=TTL)
        again = client.acquire("k2", owner="o", ttl=TTL)
    finally:
        client.close()
        peers.run(peer.close())
        peers.run(other.close())
    assert (lease.key, again.key) == ("k", "k2")
    # Both on connection 1, the loop's: the second made no lane connection (2).
    assert [r.conn for r in peer.ops("acquire")] == [1, 1]
    assert other.ops("acquire") == [], "the refused lane's call went to another endpoint"


def test_a_refusal_rests_the_lanes_to_that_node_only(peers: PeerLoop) -> None:
    """The rest after a refusal is the refusing node's (its connection quota): once
    the client's target is another node (it learned of a new leader), calls take
    lanes again, and calls back to the refusing node still take the loop."""
    peer = peers.run(RefusesFirstConnection(_always_granted).start())
    other = peers.run(ScriptedPeer(_always_granted).start())
    client = Client([peer.addr, other.addr], deadline=10, attempt_timeout=ATTEMPT_TIMEOUT)
    try:
        client.acquire("k", owner="o", ttl=TTL)  # the lane refused: on the loop's connection
        hops = HopCounter(client)
        client.aio.transport.target = other.addr  # as a redirect to a new leader would
        client.acquire("k2", owner="o", ttl=TTL)
        client.aio.transport.target = peer.addr
        client.acquire("k3", owner="o", ttl=TTL)
        skipped = hops.without_lane  # before close, which runs on the portal too
    finally:
        client.close()
        peers.run(peer.close())
        peers.run(other.close())
    assert [r.frame["key"] for r in other.ops("acquire")] == ["k2"]
    assert [r.frame["key"] for r in peer.ops("acquire")] == ["k", "k3"]
    assert skipped == 1, "only the call to the resting node should skip the lanes"


def test_ended_lane_rests_are_forgotten() -> None:
    """The rest map keeps only rests that have not ended: a node's redirects can name
    any address, and one entry per address ever refused would grow without bound."""
    pool = direct.LanePool(types.SimpleNamespace(target="a:1"), lambda coro: None, limit=1)  # type: ignore[arg-type]
    pool._refused("a:1")
    pool._rest_until["a:1"] = time.monotonic() - 1.0  # as if LANE_REST had passed
    pool._refused("b:1")
    assert set(pool._rest_until) == {"b:1"}


def test_lanes_are_tried_again_after_their_rest(
    peers: PeerLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal rests the lanes for ``LANE_REST`` only: after it, a call tries a
    lane again (the quota may have room by then)."""
    monkeypatch.setattr(direct, "LANE_REST", 0.0)
    peer = peers.run(RefusesFirstConnection(_always_granted).start())
    client = Client([peer.addr], deadline=10, attempt_timeout=ATTEMPT_TIMEOUT)
    try:
        client.acquire("k", owner="o", ttl=TTL)
        client.acquire("k2", owner="o", ttl=TTL)
    finally:
        client.close()
        peers.run(peer.close())
    # The refused lane (0), the loop's connection (1), then a new lane connection (2).
    assert [r.conn for r in peer.ops("acquire")] == [1, 2]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4"])
def test_lanes_must_be_a_whole_number_of_at_least_one(bad: object) -> None:
    with pytest.raises(InvalidArgumentError):
        Client(["127.0.0.1:1"], lanes=bad)
