"""How the client classifies failures (definite or not): against tiny fake servers
that misbehave on purpose, the server's handling of a broken stream, and each error
code that says a request could not be served produced by real node processes (a
cluster without quorum, a paused leader, a node killed mid-request, a leader cut off
while a request waits on it).

The unit half of these tests (no process); the integration half is
tests/integration/test_client_errors.py."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from raftlease import Client, InvalidArgumentError, RaftLeaseError
from raftlease.client.transport import Outcome, Transport
from raftlease.errors import (
    ConnectionLostError,
    LeaderChangedError,
    LeaseHeldError,
    NotLeaderError,
    QuotaExceededError,
    TimeoutError_,
    UnauthenticatedError,
    from_response,
)
from raftlease.protocol import FrameDecoder
from raftlease.testing import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def hangup_server() -> Iterator[tuple[str, list[int]]]:
    """Accepts connections, reads one request frame, then closes without answering."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    received: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                decoder = FrameDecoder()
                try:
                    while not list(decoder.feed(conn.recv(65536))):
                        pass
                    received.append(1)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", received
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_connection_lost_after_sending_is_an_unknown_outcome(
    hangup_server: tuple[str, list[int]],
) -> None:
    addr, received = hangup_server
    with Client([addr]) as c, pytest.raises(RaftLeaseError) as info:
        c.acquire("k", owner="o", ttl=5.0, timeout=1.0)
    assert received, "the server did receive the request"
    assert info.value.definite is False, "it may have been applied: never report definite"


def test_nothing_listening_is_definite(tmp_path: object) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with Client([f"127.0.0.1:{port}"]) as c, pytest.raises(RaftLeaseError) as info:
        c.acquire("k", owner="o", ttl=5.0, timeout=0.5)
    assert info.value.definite is True, "a request never sent cannot have been applied"


def test_oversized_request_is_refused_before_sending() -> None:
    with Client(["127.0.0.1:1"]) as c, pytest.raises(InvalidArgumentError, match="frame limit"):
        c.acquire("k" * (2 << 20), owner="o", ttl=5.0, timeout=1.0)


# ------------------------------------------------- error codes from real nodes


def wait_without_quorum(cluster: LocalCluster) -> str:
    """Kill both followers; return the survivor (the old leader) once it has stepped
    down (``leader_fallback`` without hearing a majority) and knows no leader. Alone,
    it never campaigns (PySyncObj runs only while connected to someone)."""
    survivor = cluster.leader_id()
    for node in cluster.nodes:
        if node.id != survivor:
            cluster.kill_node(node.id)
    wait_for(
        lambda: (s := cluster.node_status(survivor))["role"] != "leader" and not s["leader"],
        timeout=20,
        what=f"{survivor} to step down and know no leader",
    )
    return survivor


@pytest.mark.parametrize("detail", [[1, 2, 3], "text", 7, None])
def test_an_error_answer_with_a_malformed_detail_is_still_its_error(detail: object) -> None:
    """A node's (or a stranger's) answer whose ``detail`` is not a map: the client
    raises the answer's own error, not a TypeError from reading the detail."""
    error = from_response({"ok": False, "code": "LEASE_HELD", "message": "held", "detail": detail})
    assert isinstance(error, LeaseHeldError) and error.detail == {}
    assert error.message == "held"


def _answer(code: str) -> dict[str, Any]:
    return {"ok": False, "code": code, "message": code.lower()}


@pytest.mark.parametrize(
    ("outcome", "unknown"),
    [
        (Outcome("n", lost=ConnectionLostError("lost")), ConnectionLostError),
        (Outcome("n", response=_answer("LEADER_CHANGED")), LeaderChangedError),
        (Outcome("n", response=_answer("TIMEOUT")), TimeoutError_),
        (Outcome("n", response=_answer("NOT_LEADER")), None),
        (Outcome("n", response=_answer("LEASE_HELD")), None),
        (Outcome("n", response={"ok": True, "result": {}}), None),
        (Outcome("n", unsent=ConnectionLostError("refused")), None),
    ],
)
def test_a_try_is_of_unknown_outcome_only_when_it_may_have_applied(
    outcome: Outcome, unknown: type[RaftLeaseError] | None
) -> None:
    """``Outcome.unknown``: what the blocking client raises for a try that may have
    applied when the client is closed before it is settled (client/direct.py)."""
    got = outcome.unknown()
    if unknown is None:
        assert got is None
    else:
        assert isinstance(got, unknown) and not got.definite


def _scripted(outcomes: list[Outcome], endpoints: list[str]) -> Transport:
    """A transport whose tries end as ``outcomes`` says, in order (the last one
    repeating): the retry decisions of ``Transport.call`` alone, no network."""
    transport = Transport(endpoints, deadline=0.6)
    script = iter(outcomes)
    last = outcomes[-1]

    async def attempt(*_: Any) -> Outcome:
        return next(script, last)

    transport._attempt = attempt  # type: ignore[method-assign]
    return transport


@pytest.mark.parametrize(
    "refusal",
    [
        Outcome("a", unsent=QuotaExceededError("connection quota")),
        Outcome("a", unsent=UnauthenticatedError("token unknown")),
        Outcome("a", response=_answer("QUOTA_EXCEEDED")),
        Outcome("a", response=_answer("PERMISSION_DENIED")),
    ],
)
def test_a_refusal_after_a_try_that_may_have_applied_is_not_definite(refusal: Outcome) -> None:
    """A transfer whose answer was lost (it may have applied), then a retry the node
    refuses on its own (a connection quota, a token an auth reload dropped): that
    refusal is about the retry. Raised as definite ("nothing was applied"), the old
    holder would go on trusting a lease it had given away; the outcome is unknown."""
    lost = Outcome("a", lost=ConnectionLostError("answer lost"))
    transport = _scripted([lost, refusal], ["a", "b", "c"])
    with pytest.raises(RaftLeaseError) as caught:
        asyncio.run(transport.call("transfer", {}, mutating=True))
    assert caught.value.definite is False, caught.value
    # The same refusal on the first try is definite, as before.
    transport = _scripted([refusal], ["a", "b", "c"])
    with pytest.raises(RaftLeaseError) as caught:
        asyncio.run(transport.call("transfer", {}, mutating=True))
    assert caught.value.definite is True, caught.value


def test_a_redirect_outside_the_endpoints_after_a_lost_answer_is_not_definite() -> None:
    """With one endpoint, a NOT_LEADER naming a leader the client may not follow
    ends the call; after a try that may have applied at the old leader it must say
    the outcome is unknown, not NOT_LEADER (definite)."""
    lost = Outcome("a", lost=ConnectionLostError("answer lost"))
    redirect = Outcome(
        "a",
        response={
            "ok": False,
            "code": "NOT_LEADER",
            "message": "not the leader",
            "detail": {"leader": "elsewhere:1"},
        },
    )
    transport = _scripted([lost, redirect], ["a"])
    with pytest.raises(LeaderChangedError):
        asyncio.run(transport.call("transfer", {}, mutating=True))
    transport = _scripted([redirect], ["a"])
    with pytest.raises(NotLeaderError):
        asyncio.run(transport.call("transfer", {}, mutating=True))


def test_a_refused_connection_is_a_try_never_sent() -> None:
    """A node refusing a try's connection (its quota, an unknown token) is an unsent
    try for ``Transport.call`` to weigh (above), not an error that escapes it."""
    transport = Transport(["a"])

    async def refuse(*_: Any) -> Any:
        raise QuotaExceededError("connection quota")

    transport.connection = refuse  # type: ignore[method-assign]
    outcome = asyncio.run(transport._attempt("acquire", {}, None, 0, 1.0))
    assert isinstance(outcome.unsent, QuotaExceededError) and outcome.lost is None
