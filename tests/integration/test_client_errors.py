"""How the client classifies failures (definite or not): against tiny fake servers
that misbehave on purpose, the server's handling of a broken stream, and each error
code that says a request could not be served produced by real node processes (a
cluster without quorum, a paused leader, a node killed mid-request, a leader cut off
while a request waits on it).

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_client_errors.py.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raftlease import Client
from raftlease.errors import (
    ConnectionLostError,
    LeaderChangedError,
    TimeoutError_,
    UnavailableError,
    from_wire,
)
from raftlease.protocol import FrameDecoder, encode_frame
from raftlease.testing import LocalCluster, wait_for
from raftlease.testing.net import ESTABLISHED, LOOPBACK, tcp_sockets
from tests.integration.test_cluster import raw_request
from tests.integration.test_partitions import Proxied, _proxied
from tests.unit.test_client_errors import wait_without_quorum

pytestmark = pytest.mark.timeout(60)


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
