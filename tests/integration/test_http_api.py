"""The HTTP/JSON API (issue 14; docs/http-api.md).

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_http_api.py.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from raftlease.protocol import OPS
from raftlease.server.http.openapi import STATUS
from raftlease.testing import LocalCluster
from raftlease.testing.certs import secure_bundle
from raftlease.testing.cluster import wait_for
from tests.integration.test_admin_http import admin_cluster, admin_of
from tests.unit.test_http_api import EXAMPLE, call, erase_types


def raw(addr: str, data: bytes, timeout: float = 20.0) -> bytes:
    """Send ``data``; what comes back until the server closes (or the timeout)."""
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
        return b"".join(chunks)


def code_of(answer: dict[str, Any]) -> str:
    return str(answer["error"]["code"])


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    c = admin_cluster(3)
    c.start()
    try:
        yield c
    finally:
        c.stop()
        c.close()


def follower_api(cluster: LocalCluster) -> str:
    leader = cluster.leader_id()
    return admin_of(cluster, next(n.id for n in cluster.nodes if n.id != leader))


def leader_api(cluster: LocalCluster) -> str:
    return admin_of(cluster, cluster.leader_id())


# ------------------------------------------------------------- resources


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_lease_resources_through_a_follower(cluster: LocalCluster) -> None:
    api = follower_api(cluster)
    status, grant = call(api, "POST", "/v1/leases/acquire", {"key": "r/1", "owner": "a", "ttl": 10})
    assert status == 200 and grant["token"] > 0 and grant["lease_id"]
    status, held = call(api, "POST", "/v1/leases/acquire", {"key": "r/1", "owner": "b", "ttl": 10})
    assert status == 409 and code_of(held) == "LEASE_HELD" and held["error"]["definite"] is True
    assert held["error"]["detail"]["owner"] == "a"
    for mode in ("linearizable", "log", "stale"):
        status, read = call(api, "GET", f"/v1/leases/holder?key=r/1&consistency={mode}")
        assert status == 200 and read["holder"]["owner"] == "a", mode
        assert "lease_id" not in json.dumps(read), "a read reveals no lease id"
    status, listing = call(api, "GET", "/v1/leases?prefix=r/&limit=10")
    assert status == 200 and [h["key"] for h in listing["leases"]] == ["r/1"]
    status, fence = call(api, "GET", f"/v1/leases/fence?key=r/1&token={grant['token']}")
    assert status == 200 and fence["current"] is True
    lease = {"key": "r/1", "lease_id": grant["lease_id"]}
    status, renewed = call(api, "POST", "/v1/leases/renew", {**lease, "ttl": 20})
    assert status == 200 and renewed["token"] == grant["token"]
    status, moved = call(api, "POST", "/v1/leases/transfer", {**lease, "owner": "c"})
    assert status == 200 and moved["token"] > grant["token"] and moved["owner"] == "c"
    status, gone = call(api, "POST", "/v1/leases/release", lease)  # the old lease id
    assert code_of(gone) in ("NOT_OWNER", "LEASE_NOT_FOUND") and status == STATUS[code_of(gone)]
    status, _ = call(
        api, "POST", "/v1/leases/release", {"key": "r/1", "lease_id": moved["lease_id"]}
    )
    assert status == 200
    status, read = call(api, "GET", "/v1/leases/holder?key=r/1")
    assert status == 200 and read["holder"] is None
    status, node = call(api, "GET", "/v1/status")
    assert status == 200 and node["node"]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_an_effect_under_a_lease_over_http(cluster: LocalCluster) -> None:
    """Issue 41 (docs/design.md §4h): begin and commit under a held lease; the next
    holder sees it committed; the ended lease's late commit is refused, definite."""
    api = follower_api(cluster)
    _, a = call(api, "POST", "/v1/leases/acquire", {"key": "r/eff", "owner": "a", "ttl": 10})
    lease_a = {"key": "r/eff", "lease_id": a["lease_id"], "effect": "charge"}
    status, began = call(api, "POST", "/v1/leases/effect/begin",
                         {**lease_a, "idempotency_key": "order-17"})  # fmt: skip
    assert status == 200 and began["state"] == "new" and began["key"] == "order-17"
    status, done = call(api, "POST", "/v1/leases/effect/commit", {**lease_a, "result": '"r"'})
    assert status == 200 and done["already"] is False and done["token"] == a["token"]
    status, _ = call(api, "POST", "/v1/leases/release", {"key": "r/eff", "lease_id": a["lease_id"]})
    assert status == 200
    _, b = call(api, "POST", "/v1/leases/acquire", {"key": "r/eff", "owner": "b", "ttl": 10})
    lease_b = {"key": "r/eff", "lease_id": b["lease_id"], "effect": "charge"}
    status, seen = call(api, "POST", "/v1/leases/effect/begin", lease_b)
    assert status == 200 and seen["state"] == "committed" and seen["result"] == '"r"'
    status, late = call(api, "POST", "/v1/leases/effect/commit", lease_a)
    assert code_of(late) == "NOT_OWNER" and late["error"]["definite"] is True
    assert status == STATUS["NOT_OWNER"]
    call(api, "POST", "/v1/leases/release", {"key": "r/eff", "lease_id": b["lease_id"]})


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_sessions_and_elections(cluster: LocalCluster) -> None:
    api = follower_api(cluster)
    status, session = call(api, "POST", "/v1/sessions/open", {"owner": "s", "ttl": 10})
    assert status == 200
    sid = session["session_id"]
    status, grant = call(
        api, "POST", "/v1/leases/acquire", {"key": "s/1", "owner": "s", "session": sid}
    )
    assert status == 200 and grant["token"] > 0
    status, _ = call(api, "POST", "/v1/sessions/keepalive", {"session_id": sid})
    assert status == 200
    status, _ = call(api, "POST", "/v1/sessions/close", {"session_id": sid})
    assert status == 200
    status, read = call(api, "GET", "/v1/leases/holder?key=s/1")
    assert read["holder"] is None, "closing the session released its lease"
    status, gone = call(api, "POST", "/v1/sessions/keepalive", {"session_id": sid})
    assert status == 404 and code_of(gone) == "SESSION_NOT_FOUND"

    campaign = {"name": "e/1", "owner": "one", "ttl": 10, "value": "10.0.0.1"}
    status, first = call(api, "POST", "/v1/elections/campaign", campaign)
    assert status == 200
    status, leader = call(api, "GET", "/v1/elections/leader?name=e/1")
    assert leader["holder"]["owner"] == "one" and leader["holder"]["value"] == "10.0.0.1"
    mine = {"name": "e/1", "lease_id": first["lease_id"]}
    status, _ = call(api, "POST", "/v1/elections/proclaim", {**mine, "value": "10.0.0.2"})
    assert status == 200
    result: dict[str, Any] = {}

    def second() -> None:
        body = {"name": "e/1", "owner": "two", "ttl": 10, "wait": 30}
        result["answer"] = call(api, "POST", "/v1/elections/campaign", body, timeout=60)

    thread = threading.Thread(target=second)
    thread.start()
    wait_for(lambda: _waiting(api, "e/1") == 1, timeout=20, what="the second candidate queued")
    status, _ = call(api, "POST", "/v1/elections/resign", mine)
    assert status == 200
    thread.join(40)
    status, elected = result["answer"]
    assert status == 200 and elected["token"] > first["token"]
    status, leader = call(api, "GET", "/v1/elections/leader?name=e/1")
    assert leader["holder"]["owner"] == "two"
    status, unnamed = call(api, "POST", "/v1/elections/campaign", {"owner": "x", "ttl": 5})
    assert status == 400 and "'name'" in unnamed["error"]["message"]


def _waiting(api: str, key: str) -> int:
    status, answer = call(api, "GET", f"/v1/leases/waiters?key={key}")
    assert status == 200, answer
    return len(answer["waiters"])


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_long_poll_acquire_is_woken_by_a_release_and_withdrawn_at_its_wait(
    cluster: LocalCluster,
) -> None:
    api = follower_api(cluster)
    status, first = call(api, "POST", "/v1/leases/acquire", {"key": "w/1", "owner": "a", "ttl": 30})
    assert status == 200
    result: dict[str, Any] = {}

    def waiter() -> None:
        started = time.monotonic()
        body = {"key": "w/1", "owner": "b", "ttl": 30, "wait": 60}
        result["answer"] = call(api, "POST", "/v1/leases/acquire", body, timeout=90)
        result["took"] = time.monotonic() - started

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_for(lambda: _waiting(api, "w/1") == 1, timeout=20, what="the acquire queued")
    status, _ = call(
        api, "POST", "/v1/leases/release", {"key": "w/1", "lease_id": first["lease_id"]}
    )
    assert status == 200
    thread.join(60)
    status, granted = result["answer"]
    assert status == 200 and granted["owner"] == "b" and granted["token"] > first["token"]
    assert granted["remaining"] > 0 and result["took"] < 50, "woken by the release, not the wait"
    # A wait that runs out: LEASE_HELD, and the queued acquire is gone from the queue.
    body = {"key": "w/1", "owner": "c", "ttl": 30, "wait": 1.5}
    status, refused = call(api, "POST", "/v1/leases/acquire", body)
    assert status == 409 and code_of(refused) == "LEASE_HELD"
    assert _waiting(api, "w/1") == 0
    call(api, "POST", "/v1/leases/release", {"key": "w/1", "lease_id": granted["lease_id"]})


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_long_poll_whose_client_hangs_up_leaves_the_queue(cluster: LocalCluster) -> None:
    api = follower_api(cluster)
    status, first = call(api, "POST", "/v1/leases/acquire", {"key": "d/1", "owner": "a", "ttl": 30})
    assert status == 200
    body = json.dumps({"key": "d/1", "owner": "b", "ttl": 30, "wait": 60}).encode()
    head = (
        "POST /v1/leases/acquire HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    host, _, port = api.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + body)
        wait_for(lambda: _waiting(api, "d/1") == 1, timeout=20, what="the acquire queued")
    # Gone within a poll slice or two, long before its 60 s wait.
    wait_for(lambda: _waiting(api, "d/1") == 0, timeout=20, what="the acquire withdrawn")
    status, _ = call(
        api, "POST", "/v1/leases/release", {"key": "d/1", "lease_id": first["lease_id"]}
    )
    assert status == 200
    status, read = call(api, "GET", "/v1/leases/holder?key=d/1")
    assert status == 200 and read["holder"] is None, "nobody was granted the key for b"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_an_idempotent_retry_returns_the_same_grant(cluster: LocalCluster) -> None:
    api = follower_api(cluster)
    body = {"key": "i/1", "owner": "a", "ttl": 10}
    once = call(api, "POST", "/v1/leases/acquire", body, {"Idempotency-Key": "req-1"})
    # The retry goes to another node (the leader): the dedup table is replicated.
    again = call(
        leader_api(cluster), "POST", "/v1/leases/acquire", body, {"Idempotency-Key": "req-1"}
    )
    assert once[0] == again[0] == 200
    assert once[1]["lease_id"] == again[1]["lease_id"] and once[1]["token"] == again[1]["token"]
    # Another request under the same key is refused, not answered with that grant.
    other = {"key": "i/2", "owner": "a", "ttl": 10}
    status, refused = call(api, "POST", "/v1/leases/acquire", other, {"Idempotency-Key": "req-1"})
    # 422, as the IETF Idempotency-Key draft says (issue 44), in words for the client.
    assert status == 422 and code_of(refused) == "BAD_REQUEST", refused
    assert refused["error"]["definite"] is True
    assert "Idempotency-Key" in refused["error"]["message"]
    assert "(cid, seq)" not in refused["error"]["message"]
    assert "lease_id" not in json.dumps(refused)
    status, read = call(api, "GET", "/v1/leases/holder?key=i/2")
    assert read["holder"] is None
    status, bad = call(api, "POST", "/v1/leases/acquire", other, {"Idempotency-Key": "a b"})
    assert status == 400 and code_of(bad) == "BAD_REQUEST"


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_follower_forwards_through_a_leader_change() -> None:
    """Kill the leader: a surviving node's API answers again once a new leader is
    elected, and retries under one Idempotency-Key end in exactly one grant."""
    cluster = admin_cluster(3)
    cluster.start()
    try:
        old = cluster.leader_id()
        api = admin_of(cluster, next(n.id for n in cluster.nodes if n.id != old))
        cluster.kill_node(old)
        body = {"key": "f/1", "owner": "a", "ttl": 30}
        answers: list[tuple[int, dict[str, Any]]] = []

        def granted() -> bool:
            answers.append(call(api, "POST", "/v1/leases/acquire", body, {"Idempotency-Key": "f1"}))
            return answers[-1][0] == 200

        wait_for(granted, timeout=60, what="a grant through the new leader")
        for status, answer in answers[:-1]:
            # Before the election: definite refusals or unknown outcomes, never a grant.
            assert status in (503, 504, 502), answer
        again = call(api, "POST", "/v1/leases/acquire", body, {"Idempotency-Key": "f1"})
        assert again[0] == 200 and again[1]["lease_id"] == answers[-1][1]["lease_id"]
        status, listing = call(api, "GET", "/v1/leases?prefix=f/")
        assert status == 200 and len(listing["leases"]) == 1
    finally:
        cluster.stop()
        cluster.close()


def _read_lines(response: http.client.HTTPResponse, count: int) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    while len(lines) < count:
        line = response.readline()
        assert line, "the stream ended"
        if line.strip():
            lines.append(json.loads(line))
    return lines


def _stream(api: str, path: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    host, _, port = api.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    assert response.status == 200
    return response


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_watch_streams_resume_from_a_revision(cluster: LocalCluster) -> None:
    api = follower_api(cluster)
    stream = _stream(api, "/v1/watch?prefix=wa/")
    assert stream.headers["Content-Type"].startswith("application/x-ndjson")
    sync = _read_lines(stream, 1)[0]
    assert sync["type"] == "sync" and sync["revision"] >= 0
    status, grant = call(
        api, "POST", "/v1/leases/acquire", {"key": "wa/1", "owner": "a", "ttl": 10}
    )
    call(api, "POST", "/v1/leases/release", {"key": "wa/1", "lease_id": grant["lease_id"]})
    events = _read_lines(stream, 2)
    assert [e["type"] for e in events] == ["grant", "release"]
    assert events[0]["token"] == grant["token"] and "lease_id" not in events[0]
    stream.close()
    # Changes made while nobody watches, then a resume after the grant: only the rest.
    status, second = call(
        api, "POST", "/v1/leases/acquire", {"key": "wa/2", "owner": "b", "ttl": 10}
    )
    assert status == 200
    call(api, "POST", "/v1/leases/release", {"key": "wa/2", "lease_id": second["lease_id"]})
    resumed = _stream(api, f"/v1/watch?prefix=wa/&from_revision={events[-1]['revision'] + 1}")
    backlog = _read_lines(resumed, 3)
    assert backlog[0]["type"] == "sync"
    assert [(e["type"], e["key"]) for e in backlog[1:]] == [("grant", "wa/2"), ("release", "wa/2")]
    resumed.close()
    # Server-sent events: each event's id is its revision; Last-Event-ID resumes after it.
    sse = _stream(
        api,
        "/v1/watch?prefix=wa/",
        {"Accept": "text/event-stream", "Last-Event-ID": str(backlog[1]["revision"])},
    )
    assert sse.headers["Content-Type"].startswith("text/event-stream")
    frames: list[dict[str, str]] = []
    frame: dict[str, str] = {}
    while len(frames) < 2:
        line = sse.readline().decode().rstrip("\n")
        if not line:
            if frame:
                frames.append(frame)
            frame = {}
            continue
        name, _, value = line.partition(": ")
        frame[name] = value
    sse.close()
    assert frames[0]["event"] == "sync"
    assert frames[1]["event"] == "release" and frames[1]["id"] == str(backlog[2]["revision"])
    assert json.loads(frames[1]["data"])["key"] == "wa/2"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_queue_resources(cluster: LocalCluster) -> None:
    if "task_put" not in OPS:
        pytest.skip("this build has no task queues")
    api = follower_api(cluster)
    body = {"queue": "q1", "payload": "job-1", "fairness_key": "team-a", "weight": 2}
    status, put = call(api, "POST", "/v1/queues/put", body)
    assert status == 200 and put["task_id"]
    status, bad = call(api, "POST", "/v1/queues/put", {**body, "weight": 0})
    assert status == 400 and "weight" in str(bad), bad  # nothing put: the claim gets job-1
    claim = {"queue": "q1", "worker": "w", "lease_ttl": 10}
    status, claimed = call(api, "POST", "/v1/queues/claim", claim)
    assert status == 200 and claimed["claimed"] is True and claimed["task_id"] == put["task_id"]
    attempt = {"queue": "q1", "task_id": claimed["task_id"], "attempt_id": claimed["attempt_id"]}
    status, _ = call(api, "POST", "/v1/queues/heartbeat", {**attempt, "progress": 0.5})
    assert status == 200
    status, stats = call(api, "GET", "/v1/queues/stats?queue=q1")
    assert status == 200 and stats["stats"]["claimed"] == 1
    status, _ = call(api, "POST", "/v1/queues/complete", {**attempt, "result": "ok"})
    assert status == 200
    status, stale = call(api, "POST", "/v1/queues/complete", {**attempt, "result": "again"})
    assert status in (404, 409), stale
    # A claim that waits is woken by a put.
    result: dict[str, Any] = {}

    def worker() -> None:
        body = {**claim, "wait": 30}
        result["answer"] = call(api, "POST", "/v1/queues/claim", body, timeout=60)

    thread = threading.Thread(target=worker)
    thread.start()
    wait_for(
        lambda: call(api, "GET", "/v1/queues/stats?queue=q1")[1]["stats"]["waiting_claims"] == 1,
        timeout=20,
        what="the claim waiting",
    )
    status, put2 = call(api, "POST", "/v1/queues/put", {"queue": "q1", "payload": "job-2"})
    thread.join(40)
    status, woken = result["answer"]
    assert status == 200 and woken["claimed"] is True and woken["task_id"] == put2["task_id"]
    attempt = {"queue": "q1", "task_id": woken["task_id"], "attempt_id": woken["attempt_id"]}
    status, _ = call(api, "POST", "/v1/queues/fail", {**attempt, "error": "boom"})
    assert status == 200
    status, task = call(api, "GET", f"/v1/queues/task?queue=q1&task_id={woken['task_id']}")
    assert status == 200 and task["task"]["status"] != "claimed", task
    # Issue 44: the documented task_id, and named fields, not positional arrays, in
    # the history; the answer validates against the document's schema for the route.
    assert task["task"]["task_id"] == woken["task_id"], task
    (row,) = task["task"]["history"]
    assert row["outcome"] == "failed" and row["error"] == "boom", row
    assert row["number"] == 1 and isinstance(row["worker"], str), row
    status, doc = call(api, "GET", "/openapi.json")
    schema = doc["paths"]["/v1/queues/task"]["get"]["responses"]["200"]["content"]
    jsonschema.validate(task, schema["application/json"]["schema"])


# ------------------------------------------------------------- bad input


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_hostile_input_gets_a_definite_4xx_and_changes_nothing(cluster: LocalCluster) -> None:
    api = follower_api(cluster)
    acquire = "/v1/leases/acquire"
    cases: list[tuple[bytes, dict[str, str], int]] = [
        (b'{"key": "h/1", "owner": "a", "ttl": 5', {}, 400),  # truncated JSON
        (b'["h/1"]', {}, 400),  # no object
        (b'{"key": "h/1", "owner": "a", "ttl": NaN}', {}, 400),
        (b'{"key": "h/1", "owner": "a", "ttl": "5"}', {}, 400),  # wrong type
        (b'{"key": 7, "owner": "a", "ttl": 5}', {}, 400),
        (b'{"key": "h/1", "owner": "a", "ttl": 1e9}', {}, 400),  # out of range
        (b'{"key": "h/1", "owner": "a", "ttl": 5, "seq": 9}', {}, 400),  # the layer's own
        (b'{"key": "' + b"k" * 600 + b'", "owner": "a", "ttl": 5}', {}, 400),
        (b'{"key": "h/1", "owner": "a", "ttl": 5}', {"Content-Type": "text/plain"}, 415),
        (b"\xff\xfe", {}, 400),
    ]
    for body, headers, expected in cases:
        all_headers = {"Content-Type": "application/json", **headers}
        request = urllib.request.Request(
            f"http://{api}{acquire}", data=body, method="POST", headers=all_headers
        )
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                raise AssertionError(f"{body[:40]!r} was accepted: {response.status}")
        except urllib.error.HTTPError as err:
            answer = json.loads(err.read())
            assert err.code == expected, (body[:60], answer)
            assert answer["error"]["definite"] is True and answer["error"]["code"] in (
                "BAD_REQUEST",
                "INVALID_ARGUMENT",
            )
    status, answer = call(api, "GET", "/v1/leases/holder?key=h/1&consistency=fastest")
    assert status == 400 and code_of(answer) == "INVALID_ARGUMENT"
    status, answer = call(api, "GET", "/v1/leases/fence?key=h/1&token=abc")
    assert status == 400 and code_of(answer) == "BAD_REQUEST"
    status, answer = call(api, "GET", "/v1/leases/acquire")
    assert status == 405
    status, answer = call(api, "GET", "/v1/nothing")
    assert status == 404
    # A body above the frame limit: 413 from its Content-Length, before it is read.
    huge = b'{"key": "h/1", "owner": "a", "ttl": 5, "value": "' + b"v" * (2 << 20) + b'"}'
    head = (
        f"POST {acquire} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(huge)}\r\n\r\n"
    ).encode()
    answer_bytes = raw(api, head + huge[:1000])
    assert answer_bytes.startswith(b"HTTP/1.1 413"), answer_bytes[:200]
    assert b"FRAME_TOO_LARGE" in answer_bytes
    # A slow client: the body never arrives whole; 408, and the connection is closed.
    slow = (
        f"POST {acquire} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        'Content-Length: 100\r\n\r\n{"key":'
    ).encode()
    started = time.monotonic()
    answer_bytes = raw(api, slow, timeout=40)
    assert answer_bytes.startswith(b"HTTP/1.1 408"), answer_bytes[:200]
    assert time.monotonic() - started < 35
    status, read = call(api, "GET", "/v1/leases/holder?key=h/1")
    assert status == 200 and read["holder"] is None, "a refused request changed the state"
    # The node still serves.
    status, _ = call(api, "GET", "/v1/status")
    assert status == 200


# ------------------------------------------------------------- security

AGENT_TOKEN = "agent-token-http-0123456789abcdef"


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_tokens_permissions_and_tls_guard_every_resource(tmp_path: Path) -> None:
    bundle = secure_bundle(tmp_path / "tls")
    bundle.add_agents({"agent-7": AGENT_TOKEN})
    cluster = admin_cluster(3, **bundle.node_settings())
    cluster.start()
    try:
        tls = ssl.create_default_context(cafile=str(bundle.ca_file))
        api = follower_api(cluster)
        agent = {"Authorization": f"Bearer {AGENT_TOKEN}"}
        admin = {"Authorization": f"Bearer {bundle.admin_token}"}
        body = {"key": "gpu/0", "owner": "agent-7", "ttl": 10}
        status, answer = call(api, "POST", "/v1/leases/acquire", body, context=tls)
        assert status == 401 and code_of(answer) == "UNAUTHENTICATED"
        wrong = {"Authorization": "Bearer not-a-token"}
        status, answer = call(api, "POST", "/v1/leases/acquire", body, wrong, context=tls)
        assert status == 401 and code_of(answer) == "UNAUTHENTICATED"
        status, answer = call(api, "GET", "/v1/leases/holder?key=gpu/0", context=tls)
        assert status == 401
        status, answer = call(api, "GET", "/v1/watch?prefix=gpu/", context=tls)
        assert status == 401
        other = {"key": "ops/1", "owner": "agent-7", "ttl": 10}
        status, answer = call(api, "POST", "/v1/leases/acquire", other, agent, context=tls)
        assert status == 403 and code_of(answer) == "PERMISSION_DENIED"
        status, answer = call(api, "GET", "/v1/leases?prefix=", headers=agent, context=tls)
        assert status == 403 and code_of(answer) == "PERMISSION_DENIED"
        # Allowed: forwarded from this follower to the leader over TLS, as agent-7.
        status, grant = call(api, "POST", "/v1/leases/acquire", body, agent, context=tls)
        assert status == 200, grant
        lease = {"key": "gpu/0", "lease_id": grant["lease_id"]}
        # The lease is bound to its principal: the admin cannot renew it with its id.
        status, answer = call(api, "POST", "/v1/leases/renew", lease, admin, context=tls)
        assert status in (403, 409) and code_of(answer) in ("NOT_OWNER", "PERMISSION_DENIED")
        status, _ = call(api, "POST", "/v1/leases/release", lease, agent, context=tls)
        assert status == 200
        status, read = call(api, "GET", "/v1/leases/holder?key=ops/1", headers=admin, context=tls)
        assert status == 200 and read["holder"] is None, "a denied request changed the state"
        # Plain HTTP to the HTTPS endpoint gets no answer in JSON.
        plain = raw(api, b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", timeout=5)
        assert not plain.startswith(b"HTTP/1.1 200")
    finally:
        cluster.stop()
        cluster.close()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_typescript_example_runs_against_a_cluster(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    script = tmp_path / "lease.mjs"
    script.write_text(erase_types(EXAMPLE.read_text()))
    check = subprocess.run([node, "--check", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    env = {"PATH": "/usr/bin:/bin", "RAFTLEASE_URL": f"http://{follower_api(cluster)}"}
    out = subprocess.run(
        [node, str(script)],
        capture_output=True,
        text=True,
        timeout=90,
        env={**env, "RAFTLEASE_KEY": "ts/0"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    token = re.search(r"acquired ts/0 token=(\d+)", out.stdout)
    assert token is not None, out.stdout
    assert f"renewed ts/0 token={token.group(1)}" in out.stdout and "released ts/0" in out.stdout
    status, read = call(follower_api(cluster), "GET", "/v1/leases/holder?key=ts/0")
    assert status == 200 and read["holder"] is None


def _wait_in_thread(
    api: str, path: str, body: dict[str, Any]
) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def run() -> None:
        result["answer"] = call(api, "POST", path, body, timeout=60)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_grants_after_waiting_carry_certificates(cluster: LocalCluster) -> None:
    """docs/certificates.md: a grant from a queue is made by another request's entry,
    so the node renews it once (renew, session keep-alive, heartbeat) with the
    request's holder_key and answers with its certificate, as the native client does:
    a waited acquire, a waited set and a waited claim, each verified by a resource."""
    from raftlease.verify import HolderKey, Verifier, parse
    from tests.integration.test_certificates import cluster_keys

    api = follower_api(cluster)
    first, second = HolderKey(), HolderKey()
    keys: dict[int, str] = {}

    def verified(certificate: str, holder: HolderKey) -> None:
        assert certificate and parse(certificate).holder == holder.public
        keys.update(cluster_keys(cluster))  # the first is made for the first certificate
        resource = Verifier(keys)
        challenge = resource.challenge()
        resource.check(certificate, holder.prove(certificate, challenge), challenge)

    # One key.
    body = {"key": "cw/1", "owner": "a", "ttl": 30, "holder_key": first.public_hex()}
    status, held = call(api, "POST", "/v1/leases/acquire", body)
    assert status == 200
    verified(held["certificate"], first)
    waited = {"key": "cw/1", "owner": "b", "ttl": 30, "wait": 30, "holder_key": second.public_hex()}
    thread, result = _wait_in_thread(api, "/v1/leases/acquire", waited)
    wait_for(lambda: _waiting(api, "cw/1") == 1, timeout=20, what="the acquire queued")
    call(api, "POST", "/v1/leases/release", {"key": "cw/1", "lease_id": held["lease_id"]})
    thread.join(40)
    status, granted = result["answer"]
    assert status == 200 and granted["owner"] == "b", granted
    verified(granted["certificate"], second)
    assert parse(granted["certificate"]).token == granted["token"] > held["token"]
    call(api, "POST", "/v1/leases/release", {"key": "cw/1", "lease_id": granted["lease_id"]})

    # A set of two keys, one of them held.
    status, held = call(
        api, "POST", "/v1/leases/acquire", {"key": "cw/s1", "owner": "a", "ttl": 30}
    )
    assert status == 200
    many = {"keys": ["cw/s1", "cw/s2"], "owner": "b", "ttl": 30, "wait": 30}
    thread, result = _wait_in_thread(
        api, "/v1/leases/acquire-many", {**many, "holder_key": second.public_hex()}
    )
    wait_for(lambda: _waiting(api, "cw/s1") == 1, timeout=20, what="the set queued")
    call(api, "POST", "/v1/leases/release", {"key": "cw/s1", "lease_id": held["lease_id"]})
    thread.join(40)
    status, granted = result["answer"]
    assert status == 200 and len(granted["leases"]) == 2, granted
    for lease in granted["leases"]:
        verified(lease["certificate"], second)
        assert parse(lease["certificate"]).key == lease["key"]

    # A claim that waits for a task.
    claim = {"queue": "cw-q", "worker": "w", "lease_ttl": 10, "wait": 30}
    thread, result = _wait_in_thread(
        api, "/v1/queues/claim", {**claim, "holder_key": second.public_hex()}
    )
    wait_for(
        lambda: call(api, "GET", "/v1/queues/stats?queue=cw-q")[1]["stats"]["waiting_claims"] == 1,
        timeout=20,
        what="the claim waiting",
    )
    status, _ = call(api, "POST", "/v1/queues/put", {"queue": "cw-q", "payload": "job"})
    assert status == 200
    thread.join(40)
    status, woken = result["answer"]
    assert status == 200 and woken["claimed"] is True, woken
    verified(woken["certificate"], second)
