"""Admission control on a real cluster (server/overload.py, docs/operations.md
"Capacity"): a leader whose event loop runs behind refuses new lease sessions with a
definite ``OVERLOADED`` and serves the sessions it has, then admits new ones again.

The lag is real: the test build's ``test_stall`` holds every turn of the leader's
event loop (a sleep: the GIL stays free, so heartbeats and elections go on as before),
as a node past its capacity runs. The node's own sampler measures it.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from raftlease import OverloadedError, UnavailableError
from raftlease.testing import LocalCluster, wait_for
from tests.integration.test_admin_http import admin_of, get, running_admin_cluster
from tests.integration.test_cluster import raw_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: The limit the cluster runs with (seconds), and how long each stalled loop turn is
#: held: every lag sample is then near the turn, well above the limit.
LIMIT = 0.1
TURN = 0.2


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # The test build (clock control), with its test_stall.
    yield from running_admin_cluster(3, hooks={"clock_control": True}, overload_lag=LIMIT)


def status_of(addr: str) -> dict[str, Any]:
    answer = raw_request(addr, {"id": 1, "op": "status"}, timeout=10.0)
    assert answer["ok"], answer
    result: dict[str, Any] = answer["result"]
    return result


def stall(addr: str, seconds: float) -> None:
    answer = raw_request(addr, {"id": 1, "op": "test_stall", "seconds": seconds, "turn": TURN})
    assert answer["ok"], answer


def metric(api: str, name: str) -> float:
    status, _, body = get(api, "/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    lines = [line for line in body.decode().splitlines() if "request_errors" in line]
    raise AssertionError(f"{name} not in /metrics: {lines}")


def test_an_overloaded_leader_refuses_new_sessions_and_serves_the_ones_it_has(
    cluster: LocalCluster,
) -> None:
    leader = cluster.leader_id()
    addr = next(n.client for n in cluster.nodes if n.id == leader)
    api = admin_of(cluster, leader)
    assert status_of(addr)["overloaded"] is False
    with cluster.client() as client, client.session(owner="old", ttl=10.0) as old:
        held = old.acquire("overload/old")
        stall(addr, 15.0)
        wait_for(lambda: status_of(addr)["overloaded"], timeout=10.0, what="overloaded")
        status = status_of(addr)
        assert status["loop_lag_ms"] > LIMIT * 1000, status
        assert metric(api, "raftlease_overloaded") == 1
        assert metric(api, "raftlease_event_loop_lag_seconds") > LIMIT

        # A new session: a definite refusal that says when to come back.
        ids = {"cid": "c" * 32, "seq": 1, "ack": 1}
        answer = raw_request(addr, {"id": 2, "op": "session_open", "owner": "n", "ttl": 5, **ids})
        assert not answer["ok"] and answer["code"] == "OVERLOADED", answer
        assert answer["detail"]["retry_after"] == 1.0 and answer["detail"]["lag"] > LIMIT
        # The library raises it (definite, nothing applied; an UnavailableError too)
        # when its deadline leaves no time for a retry after the pause asked for
        # (client/transport.py, overload_pause; its unit test has the pauses).
        with pytest.raises(OverloadedError) as refused:
            client.call("session_open", {"owner": "new", "ttl": 5.0}, mutating=True, timeout=1.5)
        assert refused.value.definite and isinstance(refused.value, UnavailableError)
        assert refused.value.retry_after == 1.0
        # Over HTTP: 503 with Retry-After, at once (no retry inside the node).
        request = urllib.request.Request(
            f"http://{api}/v1/sessions/open",
            data=json.dumps({"owner": "new", "ttl": 5}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            urllib.request.urlopen(request, timeout=10)
            raise AssertionError("the HTTP open was admitted")
        except urllib.error.HTTPError as err:
            assert err.code == 503 and err.headers["Retry-After"] == "1", err.headers
            assert json.loads(err.read())["error"]["code"] == "OVERLOADED"

        # The session the leader has is served: keep-alives, a new lease under it,
        # its release. Nothing was opened by the refused tries.
        old.keepalive()
        second = old.acquire("overload/second")
        client.release(second)
        assert status_of(addr)["lease_sessions"] == 1
        assert status_of(addr)["overload_refused"] >= 3

        # Once the stall is over the node admits new sessions again, by itself.
        wait_for(lambda: not status_of(addr)["overloaded"], timeout=30.0, what="recovered")
        with client.session(owner="new", ttl=5.0) as new:
            assert new.session_id
        assert metric(api, "raftlease_overloaded") == 0
        # Native refusals only (the raw one and the library's): HTTP has its own count.
        refusals = 'raftlease_request_errors_total{code="OVERLOADED",op="session_open"}'
        assert metric(api, refusals) >= 2
        client.release(held)
