"""Slow and stalled clients on the client port (issue 11): a started frame must arrive
whole within ``frame_timeout``, an idle connection is closed after ``idle_timeout``
(but not one with a watch in flight), and a watcher that does not read is ended with
a definite code, its queue bounded, instead of being buffered without end.

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_client_port_limits.py.
"""

from __future__ import annotations

import socket
import struct
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from raftlease.protocol import FrameDecoder, encode_frame
from raftlease.testing import LocalCluster
from tests.integration.test_admin_http import admin_cluster, admin_of

Factory = Callable[..., LocalCluster]


def client_addr(cluster: LocalCluster) -> tuple[str, int]:
    host, _, port = cluster.nodes[0].client.rpartition(":")
    return host, int(port)


def closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the node closes ``sock`` (fails if it stays open longer)."""
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the connection stayed open for {seconds} s")
    return time.monotonic() - started


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_half_a_frame_then_silence_is_closed_by_the_frame_deadline(
    cluster_factory: Factory,
) -> None:
    cluster = cluster_factory(1, frame_timeout=1.0, idle_timeout=600.0)
    with socket.create_connection(client_addr(cluster)) as sock:
        sock.sendall(struct.pack(">I", 1000) + b"\x81")  # a 1000-byte frame, 1 byte of it
        assert closed_within(sock, 30) >= 0.5
    with socket.create_connection(client_addr(cluster)) as sock:
        # One byte a second: every read is "progress", but the frame never completes.
        header = struct.pack(">I", 50)
        for byte in header:
            sock.sendall(bytes([byte]))
            time.sleep(0.3)  # the pace of the slow sender is the test's input
        deadline = time.monotonic() + 30
        closed = False
        while time.monotonic() < deadline and not closed:
            try:
                sock.sendall(b"x")
                sock.settimeout(0.3)
                closed = sock.recv(1) == b""
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                closed = True
        assert closed, "a trickling sender kept its connection past the frame deadline"
    with cluster.client() as client:  # the node serves others throughout
        client.acquire("k", owner="a", ttl=5)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_an_idle_connection_is_closed_but_a_watch_is_kept(cluster_factory: Factory) -> None:
    cluster = cluster_factory(1, idle_timeout=1.0)
    with socket.create_connection(client_addr(cluster)) as idle:
        assert closed_within(idle, 30) >= 0.5
    with socket.create_connection(client_addr(cluster)) as watching:
        watching.sendall(encode_frame({"id": 1, "op": "watch", "prefix": "w/"}))
        decoder = FrameDecoder()
        watching.settimeout(10)
        first = next(iter(decoder.feed(watching.recv(65536))))
        assert first["ok"] is True
        with cluster.client() as client:
            time.sleep(2.0)  # longer than idle_timeout: the watch must still be served
            client.acquire("w/a", owner="a", ttl=5)
        frames: list[dict[str, Any]] = []
        while not frames:
            frames.extend(decoder.feed(watching.recv(65536)))
        assert frames[0]["result"]["events"][0]["key"] == "w/a"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_connection_that_never_sends_is_closed_at_the_frame_deadline(
    cluster_factory: Factory,
) -> None:
    """Issue 37: a connection that sent nothing stayed open past 12 s (for the whole
    15-minute idle_timeout); now frame_timeout after it was accepted. One that sends
    its request in time is served."""
    cluster = cluster_factory(1, frame_timeout=1.0, idle_timeout=900.0)
    with socket.create_connection(client_addr(cluster)) as silent:
        assert 0.5 <= closed_within(silent, 30) < 30
    with socket.create_connection(client_addr(cluster)) as prompt:
        prompt.sendall(encode_frame({"id": 1, "op": "holder", "key": "silent/k"}))
        prompt.settimeout(10)
        answers = list(FrameDecoder().feed(prompt.recv(65536)))
        assert answers[0]["ok"] is True


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_connection_is_closed_when_idle_after_its_requests_were_answered(
    cluster_factory: Factory,
) -> None:
    """The idle clock starts when the last request in flight is answered: before,
    the read after a request had no limit while the request was in flight, and kept
    none after it was answered, so a connection that had sent anything stayed open."""
    cluster = cluster_factory(1, idle_timeout=1.0)
    with socket.create_connection(client_addr(cluster)) as sock:
        decoder = FrameDecoder()
        sock.settimeout(10)
        for rid in (1, 2):
            sock.sendall(encode_frame({"id": rid, "op": "holder", "key": "idle/k"}))
            answers: list[dict[str, Any]] = []
            while not answers:
                answers.extend(decoder.feed(sock.recv(65536)))
            assert answers[0]["ok"] is True
        assert closed_within(sock, 30) >= 0.5


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_idle_and_frame_closes_are_counted_in_metrics() -> None:
    """An operator sees why connections were closed: the idle and frame deadlines are
    counted by ``raftlease_client_connections_closed_total`` like the other limits."""
    cluster = admin_cluster(1, idle_timeout=1.0, frame_timeout=1.0)
    cluster.start()
    try:
        with socket.create_connection(client_addr(cluster)) as idle:
            closed_within(idle, 30)
        with socket.create_connection(client_addr(cluster)) as partial:
            partial.sendall(struct.pack(">I", 1000) + b"\x81")  # 1 byte of 1000
            closed_within(partial, 30)
        url = f"http://{admin_of(cluster, 'n1')}/metrics"
        with urllib.request.urlopen(url, timeout=30) as response:
            text = response.read().decode()
        assert 'raftlease_client_connections_closed_total{limit="idle_timeout"} 1.0' in text
        assert 'raftlease_client_connections_closed_total{limit="frame_timeout"} 1.0' in text
    finally:
        cluster.close()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_pipelining_sender_whose_reads_end_mid_frame_is_not_closed(
    cluster_factory: Factory,
) -> None:
    """The frame deadline is per frame: a client that keeps sending whole requests,
    each send ending partway into the next frame, makes progress and must not be
    closed when one partial frame after another spans more than ``frame_timeout``."""
    cluster = cluster_factory(1, frame_timeout=1.0, idle_timeout=600.0)
    frames = [encode_frame({"id": i, "op": "holder", "key": f"p/{i}"}) for i in range(1, 10)]
    stream = b"".join(frames)
    assert len({len(f) for f in frames}) == 1
    step = len(frames[0]) + 1  # every send but the last ends inside a frame
    decoder = FrameDecoder()
    answers: list[dict[str, Any]] = []
    with socket.create_connection(client_addr(cluster)) as sock:
        sock.settimeout(10)
        for offset in range(0, len(stream), step):
            sock.sendall(stream[offset : offset + step])
            time.sleep(0.3)  # the sender's pace is the test's input: 9 sends, ~2.7 s
        while len(answers) < len(frames):
            data = sock.recv(65536)
            assert data, (
                f"closed after {len(answers)} answers: the frame deadline ran across frames"
            )
            answers.extend(decoder.feed(data))
    assert sorted(a["id"] for a in answers) == list(range(1, 10))
    assert all(a["ok"] for a in answers)
