"""Long-lived requests on the admin endpoint (issue 37): a reload that revokes a
principal ends its open HTTP watch streams (and its native watches, with their
connection), and one principal's streams cannot fill the endpoint: /readyz and
/metrics are answered whatever the streams."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import pytest

from raftlease.protocol import FrameDecoder, encode_frame
from raftlease.server.http.admin import MAX_CONNECTIONS
from raftlease.server.http.http_api import MAX_STREAMS, MAX_STREAMS_PER_PRINCIPAL
from raftlease.testing import wait_for
from raftlease.testing.certs import agent_role, secure_bundle
from tests.integration.test_admin_http import admin_cluster, admin_of, get

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOKEN = "agent-token-to-be-revoked-0123456"


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _replace(path: Path, text: str) -> None:
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    fresh.chmod(0o600)
    os.replace(fresh, path)


def _native_frames(sock: ssl.SSLSocket, decoder: FrameDecoder, rid: int) -> dict[str, Any]:
    """Frames until the one answering ``rid``."""
    while True:
        data = sock.recv(65536)
        assert data, "the node closed the connection"
        for frame in decoder.feed(data):
            if frame.get("id") == rid:
                return frame


def test_the_stream_caps_stay_below_the_connection_cap() -> None:
    assert MAX_STREAMS_PER_PRINCIPAL < MAX_STREAMS < MAX_CONNECTIONS - 8


def test_a_reload_that_removes_a_principal_ends_its_http_and_native_watches(
    tmp_path: Path,
) -> None:
    bundle = secure_bundle(tmp_path / "tls")
    base = bundle.auth_file.read_text()
    bundle.auth_file.write_text(base + agent_role({"agent-7": TOKEN}))
    cluster = admin_cluster(1, **bundle.node_settings())
    cluster.start()
    try:
        context = ssl.create_default_context(cafile=str(bundle.ca_file))
        host, port = _addr(admin_of(cluster, "n1"))
        wait_for(
            lambda: (
                get(admin_of(cluster, "n1"), "/readyz", scheme="https", context=context)[0] == 200
            ),
            30,
            "ready",
        )
        web = http.client.HTTPSConnection(host, port, context=context, timeout=30)
        web.request("GET", "/v1/watch?prefix=gpu/", headers={"Authorization": f"Bearer {TOKEN}"})
        stream = web.getresponse()
        assert stream.status == 200
        assert json.loads(stream.readline())["type"] == "sync"

        chost, cport = _addr(cluster.nodes[0].client)
        native = context.wrap_socket(
            socket.create_connection((chost, cport)), server_hostname=chost
        )
        native.settimeout(30)
        decoder = FrameDecoder()
        native.sendall(encode_frame({"id": 1, "op": "auth", "token": TOKEN}))
        assert _native_frames(native, decoder, 1)["ok"] is True
        native.sendall(encode_frame({"id": 2, "op": "watch", "prefix": "gpu/"}))
        assert _native_frames(native, decoder, 2)["ok"] is True

        _replace(bundle.auth_file, base)  # agent-7 is gone
        os.kill(cluster.pid("n1"), signal.SIGHUP)

        # The HTTP stream ends (keep-alive lines until then), well before the 30 s.
        started = time.monotonic()
        while stream.readline():
            assert time.monotonic() - started < 30, "the revoked watch kept streaming"
        # And the native connection, its watch with it.
        closed = False
        try:
            closed = native.recv(65536) == b""
        except (ssl.SSLError, ConnectionError):
            closed = True
        assert closed
        log = cluster.log_path("n1").read_text()
        assert "auth reload ended 1 HTTP streams and waits" in log
        native.close()
        web.close()
    finally:
        cluster.close()


def _open_watch(addr: str, token: str | None = None) -> tuple[socket.socket, int]:
    """A watch on a raw socket, left open; its status code."""
    sock = socket.create_connection(_addr(addr), timeout=30)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sock.sendall(f"GET /v1/watch?prefix=s/ HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n".encode())
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, "closed before a status line"
        head += chunk
    return sock, int(head.split(b" ", 2)[1])


def test_streams_cannot_fill_the_admin_endpoint_and_probes_are_answered() -> None:
    """Issue 37: 70 watch streams of one principal made the endpoint drop /readyz
    and /metrics. Without an auth file every caller is counted together."""
    cluster = admin_cluster(1)
    cluster.start()
    addr = admin_of(cluster, "n1")
    opened: list[socket.socket] = []
    try:
        wait_for(lambda: get(addr, "/readyz")[0] == 200, 30, "ready")
        codes = []
        for _ in range(70):
            sock, code = _open_watch(addr)
            opened.append(sock)
            codes.append(code)
        assert codes[:MAX_STREAMS] == [200] * MAX_STREAMS
        assert set(codes[MAX_STREAMS:]) == {429}
        for _ in range(5):
            assert get(addr, "/readyz")[0] == 200
            assert get(addr, "/metrics")[0] == 200
    finally:
        for sock in opened:
            sock.close()
        cluster.close()


def test_one_principal_has_a_share_of_the_streams(tmp_path: Path) -> None:
    bundle = secure_bundle(tmp_path / "tls")
    cluster = admin_cluster(1, **bundle.node_settings())
    cluster.start()
    addr = admin_of(cluster, "n1")
    context = ssl.create_default_context(cafile=str(bundle.ca_file))
    opened: list[ssl.SSLSocket] = []
    try:
        wait_for(
            lambda: get(addr, "/readyz", scheme="https", context=context)[0] == 200, 30, "ready"
        )
        host, port = _addr(addr)
        codes = []
        for _ in range(MAX_STREAMS_PER_PRINCIPAL + 3):
            sock = context.wrap_socket(
                socket.create_connection((host, port), timeout=30), server_hostname=host
            )
            opened.append(sock)
            sock.sendall(
                (
                    "GET /v1/watch?prefix=s/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {bundle.admin_token}\r\n\r\n"
                ).encode()
            )
            head = sock.recv(4096)
            codes.append(int(head.split(b" ", 2)[1]))
        n = MAX_STREAMS_PER_PRINCIPAL
        assert codes == [200] * n + [429] * 3
        token = {"Authorization": f"Bearer {bundle.admin_token}"}
        assert get(addr, "/metrics", headers=token, scheme="https", context=context)[0] == 200
        assert get(addr, "/readyz", scheme="https", context=context)[0] == 200
    finally:
        for sock in opened:
            sock.close()
        cluster.close()
