"""How the client classifies failures (definite or not), against tiny fake servers
that misbehave on purpose, and the server's handling of a broken stream."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from raftlease import Client, InvalidArgumentError, RaftLeaseError
from raftlease.protocol import FrameDecoder, encode_frame
from raftlease.testing import LocalCluster

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
