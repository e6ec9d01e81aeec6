"""Hostile clients of the admin / HTTP port that a review found getting past its
defences (each test fails on the build before its fix):

* HTTP watches whose clients went away on a quiet prefix stayed open until the node
  stopped: their quota slots, and their places under the admin connection cap, so
  about 64 of them shut every probe and the whole HTTP API out.
* 64 idle sockets from one peer locked everyone out of the admin port, and each
  refused connection logged an ERROR traceback.
* JSON integers too large for a float (Python parses 4,300 digits) answered 500
  INTERNAL, not definite, instead of 400.
* Each HTTP row of issue 44: /nope, POST /metrics and /v1/ answered three different
  error shapes; a 9,000-byte URL or a NUL in a header was logged at ERROR with a
  traceback (operations.md alerts on ERROR) and answered in text/plain.
* A body under the size limit that grows when re-encoded for the leader (0.5 is 3
  bytes of JSON, 9 of msgpack) made the leader close the follower's forwarding
  connection, failing every other caller's request in flight on it.

Real node processes on 127.0.0.1, raw sockets and urllib.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from raftlease.testing import LocalCluster
from raftlease.testing.cluster import wait_for
from tests.integration.test_admin_http import admin_cluster, admin_of, get, status_code

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

QUOTA = 4


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    c = admin_cluster(3, max_watches_per_node=QUOTA)
    try:
        c.start()
        c.wait_for_leader()
        yield c
    finally:
        c.close()


def _connect(addr: str) -> socket.socket:
    host, _, port = addr.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _open_watch(addr: str, prefix: str) -> tuple[socket.socket, int | None]:
    """A watch request on a raw socket, left open; its status line's code."""
    sock = _connect(addr)
    sock.sendall(f"GET /v1/watch?prefix={prefix} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return sock, status_code(head)


def _post(addr: str, path: str, body: bytes) -> tuple[int, dict[str, object]]:
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    with _connect(addr) as sock:
        sock.sendall(request)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    code = status_code(reply)
    assert code is not None, reply[:200]
    return code, json.loads(reply.split(b"\r\n\r\n", 1)[1])


def test_an_http_watch_whose_client_left_frees_its_slot_at_once(cluster: LocalCluster) -> None:
    addr = admin_of(cluster, "n1")
    opened = [_open_watch(addr, "quiet/") for _ in range(QUOTA)]
    assert [code for _, code in opened] == [200] * QUOTA
    extra, code = _open_watch(addr, "quiet/")
    extra.close()
    assert code == 429  # the node's watch quota is full
    for sock, _ in opened:
        sock.close()  # every watcher goes; nothing is ever written under quiet/

    def free() -> bool:
        sock, code = _open_watch(addr, "quiet/")
        sock.close()
        return code == 200

    # At once (the connection's loss ends its stream), not at the next keep-alive
    # write (15 s) or never: well under that, even on a loaded machine.
    wait_for(free, 10, "a watch slot freed by a client that left")
    assert get(addr, "/livez")[0] == 200


def test_idle_connections_from_one_peer_cannot_lock_out_probes(cluster: LocalCluster) -> None:
    addr = admin_of(cluster, "n2")
    idle = [_connect(addr) for _ in range(80)]  # over the cap of 64, never a request
    try:
        # Each probe takes the place of one of the idle sockets.
        for _ in range(5):
            assert get(addr, "/readyz")[0] in (200, 503)
    finally:
        for sock in idle:
            sock.close()
    log = cluster.log_path("n2").read_text(errors="replace")
    assert "Task exception was never retrieved" not in log
    assert "assert manager is not None" not in log


def test_json_integers_beyond_64_bits_are_refused_definitely(cluster: LocalCluster) -> None:
    addr = admin_of(cluster, "n1")
    huge = "9" * 400
    for path, body in [
        ("/v1/leases/acquire", f'{{"key":"k","owner":"o","ttl":{huge}}}'),
        ("/v1/leases/acquire", f'{{"key":"k","owner":"o","ttl":5,"wait":{huge}}}'),
        ("/v1/sessions/open", f'{{"owner":"o","ttl":-{huge}}}'),
        ("/v1/leases/acquire", f'{{"key":"k","owner":"o","ttl":{2**64}}}'),
    ]:
        code, answer = _post(addr, path, body.encode())
        error = answer["error"]
        assert isinstance(error, dict)
        assert (code, error["code"], error["definite"]) == (400, "BAD_REQUEST", True), answer
    log = cluster.log_path("n1").read_text(errors="replace")
    assert "OverflowError" not in log


def test_a_body_that_outgrows_the_frame_limit_is_refused_at_the_follower(
    cluster: LocalCluster,
) -> None:
    leader = cluster.leader_id()
    follower = next(n.id for n in cluster.nodes if n.id != leader)
    addr = admin_of(cluster, follower)
    junk = [0.5] * 200_000  # ~800 KB of JSON, ~1.8 MB of msgpack
    body = json.dumps({"key": "junk/1", "owner": "x", "ttl": 5, "junk": junk}).encode()
    assert len(body) < 1 << 20
    code, answer = _post(addr, "/v1/leases/acquire", body)
    error = answer["error"]
    assert isinstance(error, dict)
    assert (code, error["code"], error["definite"]) == (413, "FRAME_TOO_LARGE", True), answer
    # The forwarding connection was never sent the frame: the next call through the
    # follower goes through.
    code, answer = _post(addr, "/v1/leases/acquire", b'{"key":"ok/1","owner":"o","ttl":5}')
    assert code == 200, answer
    assert "exceeds the limit" not in cluster.log_path(leader).read_text(errors="replace")


def test_a_loopback_endpoint_without_auth_answers_only_loopback_host_names(
    cluster: LocalCluster,
) -> None:
    """DNS rebinding: a web page whose name is made to resolve to 127.0.0.1 gets the
    browser to send it same-origin requests under that name, and without an auth
    file could read every lease, take locks and put tasks through the HTTP API. Such
    requests (a Host header that is not a loopback name) are refused with 421."""
    addr = admin_of(cluster, "n1")
    port = addr.rpartition(":")[2]

    def status(host: str, path: str = "/v1/status") -> int | None:
        with _connect(addr) as sock:
            head = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            sock.sendall(head.encode())
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
        return status_code(reply)

    for host in (f"rebind.attacker.example:{port}", "attacker.example", f"10.0.0.1:{port}"):
        for path in ("/v1/status", "/ui/", "/metrics", "/status", "/openapi.json"):
            assert status(host, path) == 421, (host, path)
        assert status(host, "/livez") == 200  # probes stay open
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST.", f"[::1]:{port}"):
        assert status(host) == 200, host


def _reply(addr: str, data: bytes) -> tuple[int | None, dict[str, str], bytes]:
    """(status, headers lower-cased, body) of one raw request on its own socket."""
    with _connect(addr) as sock:
        sock.sendall(data)
        reply = b""
        try:
            while chunk := sock.recv(65536):
                reply += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    head, _, body = reply.partition(b"\r\n\r\n")
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status_code(reply), headers, body


def _is_error_object(headers: dict[str, str], body: bytes) -> dict[str, object]:
    assert headers.get("content-type", "").startswith("application/json"), headers
    error = json.loads(body)["error"]
    assert isinstance(error, dict), error
    assert isinstance(error["code"], str) and isinstance(error["message"], str)
    assert isinstance(error["definite"], bool)
    return error


def test_every_refusal_on_the_admin_port_is_one_json_error_object_logged_quietly(
    cluster: LocalCluster,
) -> None:
    """Issue 44's HTTP row: one error object, ``application/json``, for unknown paths,
    other methods, the admin endpoint's own refusals, /v1/ and the parser's refusals
    (a too long URL, a NUL in a header, a bad request line, too large or too many
    headers), the parser's at most at INFO: no ERROR line, no traceback."""
    addr = admin_of(cluster, "n3")
    log_path = cluster.log_path("n3")
    before = len(log_path.read_text(errors="replace"))
    close = b"Connection: close\r\n"
    host = b"Host: 127.0.0.1\r\n"

    status, headers, body = _reply(addr, b"GET /nope HTTP/1.1\r\n" + host + close + b"\r\n")
    error = _is_error_object(headers, body)
    assert status == 404 and error["code"] == "BAD_REQUEST"
    assert "/v1/" in error["detail"]["routes"]  # type: ignore[index]

    post = b"POST /metrics HTTP/1.1\r\n" + host + close + b"Content-Length: 0\r\n\r\n"
    status, headers, body = _reply(addr, post)
    assert status == 405 and headers["allow"] == "GET, HEAD"
    assert _is_error_object(headers, body)["definite"] is True

    status, headers, body = _reply(addr, b"GET /v1/nope HTTP/1.1\r\n" + host + close + b"\r\n")
    assert status == 404 and _is_error_object(headers, body)["code"] == "BAD_REQUEST"

    status, headers, body = _reply(addr, b"GET /ui/nope HTTP/1.1\r\n" + host + close + b"\r\n")
    assert status == 404 and _is_error_object(headers, body)["code"] == "BAD_REQUEST"

    hostile = {
        414: b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n" + host + b"\r\n",
        400: b"GET /livez HTTP/1.1\r\n" + host + b"X-A: a\x00b\r\n\r\n",
        431: b"GET /livez HTTP/1.1\r\n" + host + b"X-Big: " + b"a" * 9000 + b"\r\n\r\n",
    }
    for expected, data in hostile.items():
        status, headers, body = _reply(addr, data)
        assert status == expected, (expected, status, body[:200])
        assert _is_error_object(headers, body)["code"] == "BAD_REQUEST"
    many = b"".join(b"X-%d: y\r\n" % i for i in range(200))
    status, headers, body = _reply(addr, b"GET /livez HTTP/1.1\r\n" + host + many + b"\r\n")
    assert status == 431 and _is_error_object(headers, body)["definite"] is True
    status, headers, body = _reply(addr, b"\x00\xffGARBAGE\r\n\r\n")
    assert status == 400 and _is_error_object(headers, body)["code"] == "BAD_REQUEST"

    assert get(addr, "/livez")[0] == 200  # still serving
    text = log_path.read_text(errors="replace")[before:]
    assert "Traceback" not in text, text[-3000:]
    assert not [line for line in text.splitlines() if "ERROR" in line], text[-3000:]
