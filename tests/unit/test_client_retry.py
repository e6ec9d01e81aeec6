"""The client's retry logic against scripted peers (not a cluster): small TCP servers
in the test, on 127.0.0.1, that speak the frame protocol (``raftlease.protocol``) and
answer each request as the test scripts it: drop it, close the connection, redirect,
fail, then answer.

* ``valid_until`` is anchored at the FIRST send of a request, across the transport's
  retries (``AsyncClient.acquire`` / ``renew``): a retry may be the one the cluster
  applied, but the lease's TTL may have started with the first attempt, and validity
  counted from a later send would outlive the lease.
* ``SESSION_EXPIRED`` (``ClientExpiredError``) recovery: the transport continues under
  a fresh client id, seq 1 / ack 1, and the call succeeds.

Each test runs its own event loop (``asyncio.run``); the scripted servers and the
client share it, and so share ``time.monotonic``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from raftlease.client import AsyncClient
from raftlease.errors import ClientExpiredError
from raftlease.models import Lease
from raftlease.protocol import FrameDecoder, encode_frame
from raftlease.testing import free_port_block

pytestmark = pytest.mark.timeout(60)

TTL = 3.0
NOW_MS = 50_000


@dataclass
class Received:
    frame: dict[str, Any]
    at: float  # time.monotonic() when the server decoded it
    peer: str  # the address of the scripted peer that got it
    conn: int  # which of that peer's connections it came on (0, 1, ...)


#: What a script does with one request: a response map to send (without ``id``),
#: DROP (never answer), or CLOSE (close the connection without answering).
DROP = "drop"
CLOSE = "close"
Action = dict[str, Any] | str
Script = Callable[[Received, int], Awaitable[Action]]


class ScriptedPeer:
    """A TCP server answering each frame as ``script(received, n)`` says (``n``: how
    many frames of the same op it got before). Event-loop only; ``close`` stops it."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.received: list[Received] = []
        self._server: asyncio.Server | None = None
        self._conns = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.addr = ""

    async def start(self) -> ScriptedPeer:
        last: OSError | None = None
        for _ in range(20):  # another engineer's run may take a port we were given
            port = free_port_block(1)
            try:
                self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
            except OSError as exc:
                last = exc
                continue
            self.addr = f"127.0.0.1:{port}"
            return self
        raise RuntimeError(f"no free port for a scripted peer: {last}")

    def ops(self, op: str) -> list[Received]:
        return [r for r in self.received if r.frame.get("op") == op]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self._conns
        self._conns += 1
        self._writers.append(writer)
        decoder = FrameDecoder(1 << 20)
        try:
            while data := await reader.read(1 << 16):
                for frame in decoder.feed(data):
                    got = Received(frame, time.monotonic(), self.addr, conn)
                    n = len(self.ops(str(frame.get("op"))))
                    self.received.append(got)
                    # Each request is answered in its own task, like a node's, so a
                    # delayed answer does not hold back the others on the connection.
                    task = asyncio.create_task(self._answer(got, n, writer))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _answer(self, got: Received, n: int, writer: asyncio.StreamWriter) -> None:
        action = await self.script(got, n)
        if action == CLOSE:
            writer.close()
        elif isinstance(action, dict) and not writer.is_closing():
            writer.write(encode_frame({"id": got.frame["id"], **action}))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)


def lease_result(frame: dict[str, Any], token: int = 7) -> dict[str, Any]:
    """What a node answers to a successful acquire or renew: the full TTL from now."""
    ttl_ms = int(frame.get("ttl", TTL) * 1000)
    return {
        "ok": True,
        "result": {
            "key": frame["key"],
            "owner": frame.get("owner", "o"),
            "token": token,
            "ttl": ttl_ms,
            "lease_id": frame.get("lease_id", "L1"),
            "expires_at": NOW_MS + ttl_ms,
            "now": NOW_MS,
        },
    }


def error(code: str, message: str, **detail: Any) -> dict[str, Any]:
    return {"ok": False, "code": code, "message": message, "detail": detail}


# --------------------------------------------- valid_until from the first send

#: How the first attempt fails. Each first failure takes a while (a lost answer
#: waits out the attempt timeout; the others are delayed by DELAY), so a validity
#: counted from a later send than the first would be later by at least that much.
DELAY = 0.3
ATTEMPT_TIMEOUT = 0.5
FIRST_FAILURES = ["no_answer", "connection_closed", "not_leader_redirect", "leader_changed"]


def _first_attempt_fails(kind: str, other: list[str]) -> Script:
    async def script(got: Received, n: int) -> Action:
        op = got.frame["op"]
        if op not in ("acquire", "renew") or n > 0:
            return lease_result(got.frame)
        if kind == "no_answer":
            return DROP
        await asyncio.sleep(DELAY)  # the scripted peer is slow to fail
        if kind == "connection_closed":
            return CLOSE
        if kind == "not_leader_redirect":
            return error("NOT_LEADER", "not the leader", leader=other[0])
        return error("LEADER_CHANGED", "leadership changed while in flight")

    return script


async def _always_granted(got: Received, n: int) -> Action:
    return lease_result(got.frame)


async def _retried(kind: str, op: str) -> tuple[Lease, float, AsyncClient, list[Received]]:
    """Run one ``op`` whose first attempt fails as ``kind``; return the lease, the time
    just before the call, the client, and every frame of ``op`` the peers received."""
    other: list[str] = []
    first = await ScriptedPeer(_first_attempt_fails(kind, other)).start()
    second = await ScriptedPeer(_always_granted).start()
    other.append(second.addr)
    client = AsyncClient([first.addr, second.addr], deadline=20, attempt_timeout=ATTEMPT_TIMEOUT)
    try:
        if op == "renew":
            held = Lease("k", "o", 7, TTL, "L1", valid_until=0.0, expires_at_ms=NOW_MS)
            before = time.monotonic()
            lease = await client.renew(held)
        else:
            before = time.monotonic()
            lease = await client.acquire("k", owner="o", ttl=TTL)
        frames = sorted(first.ops(op) + second.ops(op), key=lambda r: r.at)
        return lease, before, client, frames
    finally:
        await client.close()
        await first.close()
        await second.close()


@pytest.mark.parametrize("op", ["acquire", "renew"])
@pytest.mark.parametrize("kind", FIRST_FAILURES)
def test_valid_until_is_counted_from_the_first_send(kind: str, op: str) -> None:
    lease, before, client, frames = asyncio.run(_retried(kind, op))
    assert len(frames) >= 2, "the first attempt was not retried"
    first, retry = frames[0], frames[-1]
    # The retry is the same request (deduplicated by the cluster), sent later.
    assert (retry.frame["cid"], retry.frame["seq"]) == (first.frame["cid"], first.frame["seq"])
    assert retry.at > first.at
    if kind == "not_leader_redirect":
        assert retry.peer != first.peer, "the redirect was not followed"
    if kind == "connection_closed":
        assert (retry.peer, retry.conn) != (first.peer, first.conn)
    # The first send happened between `before` and the peer receiving it, so validity
    # counted from it lies between these bounds; counted from the retry's send it
    # would exceed the upper one.
    low = client.valid_until(before, TTL)
    high = client.valid_until(first.at, TTL)
    assert low <= lease.valid_until <= high, (
        f"valid_until {lease.valid_until:.3f} not within [{low:.3f}, {high:.3f}]: "
        f"counted {lease.valid_until - low:.3f} s after the call started "
        f"(the retry was sent {retry.at - first.at:.3f} s after the first attempt)"
    )


# ------------------------------------------------------- SESSION_EXPIRED recovery


def _expired_on(victims: set[int]) -> Script:
    """Answer the ``n``-th acquire (0-based) with SESSION_EXPIRED for ``n`` in
    ``victims``; every other acquire is granted."""

    async def script(got: Received, n: int) -> Action:
        if got.frame["op"] == "acquire" and n in victims:
            return error("SESSION_EXPIRED", "client id expired (idle)")
        return lease_result(got.frame)

    return script


def test_session_expired_continues_under_a_fresh_client_id() -> None:
    async def scenario() -> tuple[list[Received], str, str]:
        peer = await ScriptedPeer(_expired_on({2})).start()
        client = AsyncClient([peer.addr], deadline=10, attempt_timeout=3)
        try:
            old_cid = client.client_id
            await client.acquire("a", owner="o", ttl=TTL)
            await client.acquire("b", owner="o", ttl=TTL)
            lease = await client.acquire("c", owner="o", ttl=TTL)  # expired, then granted
            assert lease.key == "c"
            await client.acquire("d", owner="o", ttl=TTL)
            return peer.ops("acquire"), old_cid, client.client_id
        finally:
            await client.close()
            await peer.close()

    frames, old_cid, new_cid = asyncio.run(scenario())
    ids = [(f.frame["cid"], f.frame["seq"], f.frame["ack"]) for f in frames]
    assert ids[:3] == [(old_cid, 1, 1), (old_cid, 2, 2), (old_cid, 3, 3)]
    assert new_cid != old_cid
    # The refused request goes again as the first request of the new client id.
    assert ids[3] == (new_cid, 1, 1)
    assert frames[3].frame["key"] == "c"
    assert ids[4] == (new_cid, 2, 2)  # and the client goes on under it


def test_session_expired_for_concurrent_requests_renews_the_client_id_once() -> None:
    """Two requests in flight both learn that the client id expired: they continue
    under ONE fresh client id, with distinct seqs (a second renewal would orphan the
    first retry's id and start yet another one)."""

    async def scenario() -> tuple[list[Received], str, str]:
        both = asyncio.Event()

        async def script(got: Received, n: int) -> Action:
            if got.frame["op"] == "acquire" and n < 2:
                if n == 1:
                    both.set()
                await asyncio.wait_for(both.wait(), 10)  # answer both only once both came
                return error("SESSION_EXPIRED", "client id expired (idle)")
            return lease_result(got.frame)

        peer = await ScriptedPeer(script).start()
        client = AsyncClient([peer.addr], deadline=15, attempt_timeout=12)
        try:
            old_cid = client.client_id
            leases = await asyncio.gather(
                client.acquire("a", owner="o", ttl=TTL), client.acquire("b", owner="o", ttl=TTL)
            )
            assert sorted(lease.key for lease in leases) == ["a", "b"]
            return peer.ops("acquire"), old_cid, client.client_id
        finally:
            await client.close()
            await peer.close()

    frames, old_cid, new_cid = asyncio.run(scenario())
    assert len(frames) == 4
    assert {f.frame["cid"] for f in frames[:2]} == {old_cid}
    assert {f.frame["seq"] for f in frames[:2]} == {1, 2}
    retries = frames[2:]
    assert new_cid != old_cid
    assert {f.frame["cid"] for f in retries} == {new_cid}
    assert sorted(f.frame["seq"] for f in retries) == [1, 2]
    # Nothing of the new id is acknowledged before its first request is answered.
    for f in retries:
        assert 1 <= f.frame["ack"] <= f.frame["seq"], f.frame
        if f.frame["seq"] == 1:
            assert f.frame["ack"] == 1
    assert sorted(f.frame["key"] for f in retries) == ["a", "b"]


def test_session_expired_on_a_read_is_raised() -> None:
    """A read carries no client id, so SESSION_EXPIRED there is a plain definite error
    (no renewal; nothing to retry under)."""

    async def scenario() -> None:
        async def script(got: Received, n: int) -> Action:
            return error("SESSION_EXPIRED", "client id expired (idle)")

        peer = await ScriptedPeer(script).start()
        client = AsyncClient([peer.addr], deadline=5, attempt_timeout=2)
        try:
            cid = client.client_id
            with pytest.raises(ClientExpiredError):
                await client.holder("k", consistency="stale")
            assert len(peer.received) == 1 and "cid" not in peer.received[0].frame
            assert client.client_id == cid
        finally:
            await client.close()
            await peer.close()

    asyncio.run(scenario())


def test_a_retry_goes_to_another_node_not_back_to_the_one_that_failed() -> None:
    """After an attempt on the first endpoint times out, the next attempt goes to the
    second endpoint at once (it used to go back to the first: the rotation started at
    the initial target, so a hung node cost two attempt timeouts)."""

    async def hang(got: Received, n: int) -> Action:
        return DROP

    async def answer(got: Received, n: int) -> Action:
        return lease_result(got.frame)

    async def main() -> None:
        hung, good = await ScriptedPeer(hang).start(), await ScriptedPeer(answer).start()
        client = AsyncClient([hung.addr, good.addr], attempt_timeout=0.5, deadline=5.0)
        try:
            lease = await client.acquire("k", owner="o", ttl=TTL)
        finally:
            await client.close()
            await hung.close()
            await good.close()
        assert lease.token == 7
        assert len(hung.ops("acquire")) == 1, "retried on the node that had just failed"
        assert len(good.ops("acquire")) == 1

    asyncio.run(main())


def test_a_try_that_times_out_on_a_node_answering_other_calls_is_retried_there() -> None:
    """A shared client's call that gets no answer in time, on a connection that
    received other calls' answers after it was sent, tries the same node again: the
    node is slow (a loaded leader), not gone, and the hop to a follower and its
    redirect back would add load where there is too much. (A node that answers
    nothing is left at once: the test above.)"""

    async def slow_once(got: Received, n: int) -> Action:
        if got.frame["op"] == "acquire" and n == 0:
            return DROP  # this one answer is lost in a queue; the others come
        return lease_result(got.frame)

    async def answer(got: Received, n: int) -> Action:
        return lease_result(got.frame)

    async def main() -> None:
        busy, other = await ScriptedPeer(slow_once).start(), await ScriptedPeer(answer).start()
        client = AsyncClient([busy.addr, other.addr], attempt_timeout=0.5, deadline=5.0)
        held = Lease("r", "o", 7, TTL, "L1", valid_until=0.0, expires_at_ms=NOW_MS)
        stop = asyncio.Event()

        async def renewing() -> None:  # other calls of the same client, answered
            while not stop.is_set():
                await client.renew(held)
                await asyncio.sleep(0.05)

        try:
            await client.renew(held)  # connected; the target is the busy node
            others = asyncio.create_task(renewing())
            lease = await client.acquire("k", owner="o", ttl=TTL)
            stop.set()
            await others
        finally:
            await client.close()
            await busy.close()
            await other.close()
        assert lease.token == 7
        assert len(busy.ops("acquire")) == 2, "not retried on the node that answers others"
        assert not other.ops("acquire") and not other.ops("renew")

    asyncio.run(main())


def test_a_leader_change_on_any_attempt_names_the_unknown_outcome() -> None:
    """An attempt answered LEADER_CHANGED, then attempts that time out: the call ends in
    ``LeaderChangedError`` (indefinite), not a plain timeout that hides it."""
    from raftlease.errors import LeaderChangedError

    async def changed_then_silent(got: Received, n: int) -> Action:
        return error("LEADER_CHANGED", "leadership changed while in flight") if n == 0 else DROP

    async def main() -> None:
        peer = await ScriptedPeer(changed_then_silent).start()
        client = AsyncClient([peer.addr], attempt_timeout=0.3, deadline=1.5)
        try:
            with pytest.raises(LeaderChangedError) as caught:
                await client.acquire("k", owner="o", ttl=TTL)
        finally:
            await client.close()
            await peer.close()
        assert caught.value.definite is False
        assert len(peer.ops("acquire")) >= 2, "the call must have retried after the change"

    asyncio.run(main())


def test_a_redirect_to_a_node_outside_the_endpoints_is_not_followed() -> None:
    """A node answering NOT_LEADER with a made-up leader address must not send the
    client outside its endpoint list, where anyone could grant it a lease."""

    async def main() -> None:
        impostor = await ScriptedPeer(_always_granted).start()

        async def forge(got: Received, n: int) -> Action:
            return error("NOT_LEADER", "not the leader", leader=impostor.addr)

        liar, honest = (
            await ScriptedPeer(forge).start(),
            await ScriptedPeer(_always_granted).start(),
        )
        client = AsyncClient([liar.addr, honest.addr], attempt_timeout=0.5, deadline=5.0)
        try:
            lease = await client.acquire("k", owner="o", ttl=TTL)
        finally:
            await client.close()
            for peer in (impostor, liar, honest):
                await peer.close()
        assert lease.token == 7
        assert impostor.received == [], "followed a redirect outside the endpoint list"
        assert len(honest.ops("acquire")) == 1

    asyncio.run(main())
