"""How the client classifies failures (definite or not): against tiny fake servers
that misbehave on purpose, the server's handling of a broken stream, and each error
code that says a request could not be served produced by real node processes (a
cluster without quorum, a paused leader, a node killed mid-request, a leader cut off
while a request waits on it)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
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
    UnavailableError,
    from_response,
    from_wire,
)
from raftlease.protocol import FrameDecoder, encode_frame
from raftlease.testing import LocalCluster, wait_for
from raftlease.testing.net import ESTABLISHED, LOOPBACK, tcp_sockets

from .test_cluster import raw_request
from .test_partitions import Proxied, _proxied

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


@pytest.mark.integration
def test_requests_before_a_broken_frame_are_still_answered(shared: LocalCluster) -> None:
    host, _, port = shared.endpoints[0].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(encode_frame({"id": 1, "op": "ping"}) + (1 << 30).to_bytes(4, "big") + b"xx")
        decoder = FrameDecoder()
        frames: list[dict[str, object]] = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            frames.extend(decoder.feed(data))
    assert [f["id"] for f in frames] == [1, None]
    assert frames[0]["ok"] is True
    assert frames[1]["code"] == "FRAME_TOO_LARGE"


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


def bytes_waiting(port: int) -> int:
    """Connections to 127.0.0.1:``port`` whose received bytes nobody has read yet
    (``/proc/net/tcp``, Linux): requests that reached a stopped node's socket."""
    return sum(
        1
        for sock in tcp_sockets()
        if (sock.local_ip, sock.local_port, sock.state) == (LOOPBACK, port, ESTABLISHED)
        and sock.rx_queue > 0
    )


@pytest.mark.integration
def test_a_cluster_without_quorum_is_unavailable_and_definite(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    """No leader anywhere: the survivor refuses at once (UNAVAILABLE) and the dead
    nodes refuse connections, so nothing was ever proposed: definite."""
    cluster = cluster_factory()
    survivor = wait_without_quorum(cluster)
    response = raw_request(
        cluster.node(survivor).client,
        {
            "id": 1,
            "op": "acquire",
            "key": "noquorum/k",
            "owner": "o",
            "ttl": 5.0,
            "cid": "no-quorum-client",
            "seq": 1,
            "ack": 1,
        },
    )
    assert (response["ok"], response["code"], response["definite"]) == (False, "UNAVAILABLE", True)
    with Client(cluster.endpoints, deadline=2.0) as c:
        with pytest.raises(UnavailableError) as acquired:
            c.acquire("noquorum/k", owner="o", ttl=5.0)
        assert acquired.value.definite is True
        with pytest.raises(UnavailableError) as read:
            c.holder("noquorum/k")
        assert read.value.definite is True


@pytest.mark.integration
def test_a_paused_leader_times_out_with_an_unknown_outcome(cluster: LocalCluster) -> None:
    """The paused leader's kernel accepts the connection and the request, and nothing
    answers: the request may yet be applied, so TIMEOUT, never definite."""
    leader = cluster.leader_id()
    addr = cluster.node(leader).client
    cluster.pause_node(leader)
    try:
        with Client([addr], deadline=2.0, attempt_timeout=1.0) as c:
            with pytest.raises(TimeoutError_) as acquired:
                c.acquire("paused/k", owner="o", ttl=5.0)
            assert acquired.value.definite is False
            with pytest.raises(TimeoutError_) as read:
                c.holder("paused/k")
            assert read.value.definite is False
    finally:
        cluster.resume_node(leader)


@pytest.mark.integration
def test_a_node_killed_mid_request_loses_the_connection(cluster: LocalCluster) -> None:
    """Requests reach a stopped leader's socket; then it is killed. The status call
    (no retry) raises CONNECTION_LOST; the acquire, retried against the dead node
    until its deadline, ends in TIMEOUT. Neither is definite: the node had the
    request."""
    leader = cluster.leader_id()
    addr = cluster.node(leader).client
    port = int(addr.rpartition(":")[2])
    cluster.pause_node(leader)
    outcomes: dict[str, BaseException] = {}

    def call(name: str, fn: Callable[[Client], object]) -> None:
        try:
            with Client([addr], deadline=10.0) as c:
                fn(c)
        except BaseException as exc:  # inspected below
            outcomes[name] = exc

    threads = [
        threading.Thread(target=call, args=("status", lambda c: c.node_status(addr, timeout=30))),
        threading.Thread(
            target=call, args=("acquire", lambda c: c.acquire("killed/k", owner="o", ttl=5.0))
        ),
    ]
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: bytes_waiting(port) >= 2, 10, "both requests in the stopped node")
    finally:
        cluster.kill_node(leader)  # SIGKILL works on a stopped process
    for thread in threads:
        thread.join(30)
    status, acquired = outcomes.get("status"), outcomes.get("acquire")
    assert isinstance(status, ConnectionLostError), repr(status)
    assert status.definite is False
    assert isinstance(acquired, TimeoutError_), repr(acquired)
    assert acquired.definite is False


@pytest.fixture
def proxied_patient(request: pytest.FixtureRequest) -> Iterator[Proxied]:
    """Behind fault proxies; a leader cut off keeps believing it leads (it would step
    down after ``leader_fallback``) and a request waits for its outcome (up to
    ``request_timeout``) long enough for the test to heal the partition."""
    yield from _proxied(request, leader_fallback=30.0, request_timeout=30.0)


@pytest.mark.integration
def test_a_request_on_a_deposed_leader_ends_leader_changed(proxied_patient: Proxied) -> None:
    """A leader cut off from the others appends an acquire it cannot commit; the
    others elect a leader that writes over that log position; after the heal the old
    leader takes the new log, and its proposal is answered LEADER_CHANGED: not
    definite (a leader change can also come after the commit)."""
    p = proxied_patient
    cluster = p.cluster
    old = cluster.leader_id()
    others = [n.id for n in cluster.nodes if n.id != old]
    start_term = p.status(old)["term"]
    p.proxies.partition([[old], others])
    healed = False
    try:

        def other_leader() -> str | None:
            leaders = [n for n in others if p.status(n)["role"] == "leader"]
            return leaders[0] if len(leaders) == 1 else None

        new = wait_for(other_leader, 20, "a leader among the others")
        assert p.status(new)["term"] > start_term
        assert p.status(old)["role"] == "leader", "the cut-off leader should still believe it"
        host, _, port = cluster.node(old).client.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=40) as sock:
            sock.sendall(
                encode_frame(
                    {
                        "id": 1,
                        "op": "acquire",
                        "key": "changed/k",
                        "owner": "o",
                        "ttl": 30.0,
                        "cid": "leader-changed-client",
                        "seq": 1,
                        "ack": 1,
                    }
                )
            )
            # The majority commits entries past the cut-off leader's tail.
            with Client([cluster.node(n).client for n in others]) as c:
                for i in range(5):
                    c.acquire(f"changed/other-{i}", owner="o", ttl=30.0)
            p.proxies.heal()
            healed = True
            decoder = FrameDecoder()
            frames: list[dict[str, Any]] = []
            while not frames:
                data = sock.recv(65536)
                assert data, "connection closed without an answer"
                frames.extend(decoder.feed(data))
    finally:
        if not healed:
            p.proxies.heal()
    response = frames[0]
    assert (response["ok"], response["code"], response["definite"]) == (
        False,
        "LEADER_CHANGED",
        False,
    ), response
    err = from_wire(response["code"], response["message"], response.get("detail"))
    assert isinstance(err, LeaderChangedError) and err.definite is False
    with cluster.client() as c:  # here it was discarded: nothing was granted
        assert c.holder("changed/k") is None


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
