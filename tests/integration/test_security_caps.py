"""The last quotas of issue 11: long-polls per principal and per node, queued acquires
from everyone (``max_waiters_total``), and connections that have not authenticated
(``max_unauthenticated_connections``, ``auth_timeout``, ``max_connections_per_address``).

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_security_caps.py.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from raftlease import Client, QuotaExceededError
from raftlease.protocol import FrameDecoder, encode_frame
from raftlease.testing import LocalCluster, wait_for
from raftlease.testing.certs import secure_bundle
from tests.integration.test_admin_http import admin_cluster, admin_of

Factory = Callable[..., LocalCluster]

AGENT_TOKEN = "agent-token-caps-0123456789ab"
OTHER_TOKEN = "other-token-caps-0123456789ab"

# ------------------------------------------------------------------ helpers


class Raw:
    """A raw client connection (frames in, frames out) from ``source`` (a loopback
    address: the node sees it as the connection's address)."""

    def __init__(self, endpoint: str, source: str = "127.0.0.1", timeout: float = 10.0) -> None:
        host, _, port = endpoint.rpartition(":")
        self.sock = socket.create_connection(
            (host, int(port)), timeout=timeout, source_address=(source, 0)
        )
        self.decoder = FrameDecoder(1 << 24)
        self.frames: list[dict[str, Any]] = []
        self.next_id = 1

    def send(self, op: str, **fields: Any) -> int:
        rid = self.next_id
        self.next_id += 1
        self.sock.sendall(encode_frame({"id": rid, "op": op, **fields}))
        return rid

    def answer(self, rid: int, timeout: float = 30.0) -> dict[str, Any]:
        """The answer to request ``rid`` (or to none: id None, a refusal on accept)."""
        deadline = time.monotonic() + timeout
        while True:
            for frame in self.frames:
                if frame.get("id") in (rid, None):
                    self.frames.remove(frame)
                    return frame
            left = deadline - time.monotonic()
            assert left > 0, f"no answer to request {rid}"
            self.sock.settimeout(left)
            data = self.sock.recv(1 << 16)
            assert data, f"connection closed before the answer to request {rid}"
            self.frames.extend(self.decoder.feed(data))

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        return self.answer(self.send(op, **fields))

    def close(self) -> None:
        self.sock.close()


def closed_within(sock: socket.socket, timeout: float) -> bool:
    """Does the peer close ``sock`` within ``timeout`` (EOF or reset; data before
    it, such as a refusal frame, is skipped)?"""
    deadline = time.monotonic() + timeout
    poller = select.poll()  # not select(): descriptors above 1023 are normal here
    poller.register(sock, select.POLLIN)
    while (left := deadline - time.monotonic()) > 0:
        if not poller.poll(left * 1000):
            continue
        try:
            if not sock.recv(1 << 16):
                return True
        except (ConnectionError, TimeoutError):
            return True
    return False


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


#: The admin token of the last ``auth_file`` made: with an auth file, a node shows its
#: whole status (long_polls, unauthenticated_connections) only to an admin.
ADMIN_TOKEN: list[str] = []


def status_of(endpoint: str) -> dict[str, Any]:
    raw = Raw(endpoint)
    try:
        if ADMIN_TOKEN:  # without an auth file, auth answers "off" and changes nothing
            assert raw.call("auth", token=ADMIN_TOKEN[0]).get("ok")
        answer = raw.call("status")
        assert answer.get("ok"), answer
        return dict(answer["result"]) if "result" in answer else answer
    finally:
        raw.close()


def long_polls(endpoint: str) -> int:
    return int(status_of(endpoint)["long_polls"])


def auth_file(tmp_path: Path) -> Path:
    """The test bundle's auth file (admin) plus two agents on gpu/ and queue:."""
    bundle = secure_bundle(tmp_path / "tls")
    bundle.add_agents({"agent-7": AGENT_TOKEN, "agent-8": OTHER_TOKEN}, ("gpu/", "queue:"))
    ADMIN_TOKEN[:] = [bundle.admin_token]
    return bundle.auth_file


def authenticated(endpoint: str, token: str, source: str = "127.0.0.1") -> Raw:
    raw = Raw(endpoint, source)
    answer = raw.call("auth", token=token)
    assert answer.get("ok"), answer
    return raw


def error_code(answer: dict[str, Any]) -> str:
    assert not answer.get("ok"), answer
    return str(answer["code"])


# ------------------------------------------------------------------ real nodes


def _queue(client: Client, key: str, owner: str) -> dict[str, Any]:
    """One queued acquire (wait 600 s, beyond the test): the node's first answer,
    no long-poll."""
    return client.call(
        "acquire", {"key": key, "owner": owner, "ttl": 600, "wait": 600}, mutating=True
    )


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_queued_acquires_from_everyone_stop_at_the_cluster_cap(cluster_factory: Factory) -> None:
    cluster = cluster_factory(3, max_waiters_total=3)
    with Client(cluster.endpoints) as one, Client(cluster.endpoints) as two:
        blockers = {f"k/{i}": one.acquire(f"k/{i}", owner="ops", ttl=60) for i in range(4)}
        # Different clients, different keys: the cap counts them together.
        assert _queue(one, "k/0", "a")["queued"]
        assert _queue(two, "k/1", "b")["queued"]
        assert _queue(two, "k/2", "c")["queued"]
        before = {key: [w.owner for w in one.waiters(key)] for key in blockers}
        with pytest.raises(QuotaExceededError) as refused:
            _queue(one, "k/3", "d")
        assert refused.value.definite and "max_waiters_total" in str(refused.value)
        assert {key: [w.owner for w in one.waiters(key)] for key in blockers} == before
        # An acquire granted at once needs no waiter slot; one without wait is refused
        # as before (LEASE_HELD), not by the cap.
        assert two.acquire("k/free", owner="e", ttl=30).token > 0
        # A grant frees a slot: k/0's waiter becomes its holder.
        one.release(blockers["k/0"])
        wait_for(
            lambda: (h := one.holder("k/0")) is not None and h.owner == "a",
            30,
            "the queued acquire on k/0 to be granted",
        )
        assert _queue(two, "k/3", "d")["queued"]
        with pytest.raises(QuotaExceededError):
            _queue(one, "k/0", "f")
        # Every replica decided the same (the cap travels in the entry).
        for endpoint in cluster.endpoints:
            with Client([endpoint]) as node:
                wait_for(
                    lambda node=node: (
                        [w.owner for w in node.waiters("k/3", consistency="stale")] == ["d"]
                        and node.waiters("k/0", consistency="stale") == []
                    ),
                    30,
                    f"{endpoint} to apply the same queue",
                )


POLL_TIMEOUT = 50.0  # seconds a parked long-poll would wait: far beyond each check


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_long_polls_stop_at_the_quotas_and_free_their_slots(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    auth = auth_file(tmp_path)
    cluster = cluster_factory(
        1, auth_file=str(auth), max_long_polls_per_principal=2, max_long_polls_per_node=3
    )
    endpoint = cluster.endpoints[0]
    token = (tmp_path / "tls" / "admin.token").read_text().strip()
    opened: list[Raw] = []

    def conn(secret: str) -> Raw:
        made = authenticated(endpoint, secret)
        opened.append(made)
        return made

    try:
        with (
            Client(cluster.endpoints, token=token) as admin,
            Client(cluster.endpoints, token=AGENT_TOKEN) as agent,
        ):
            admin.acquire("gpu/k", owner="ops", ttl=120)
            lids = [_queue(agent, "gpu/k", f"w{i}")["lease_id"] for i in range(3)]
            task = admin.call("task_put", {"queue": "jobs", "payload": "{}"}, mutating=True)
            waiters_before = [w.owner for w in admin.waiters("gpu/k")]

            def poll(raw: Raw, lid: str, timeout: float = POLL_TIMEOUT) -> int:
                return raw.send("await_lease", key="gpu/k", lease_id=lid, timeout=timeout)

            first = conn(AGENT_TOKEN)
            poll(first, lids[0])
            # await_task parks too (the task is not finished) and holds a slot.
            first.send("await_task", queue="jobs", task_id=task["tid"], timeout=POLL_TIMEOUT)
            wait_for(lambda: long_polls(endpoint) == 2, 30, "two parked long-polls")
            refused = first.answer(poll(first, lids[1]), timeout=10)
            assert error_code(refused) == "QUOTA_EXCEEDED"
            assert "max_long_polls_per_principal" in refused["message"]
            # A flood of 1,000 more on the same connection: each refused at once, none
            # parked, and the node's memory does not grow with them.
            rss_before = rss_kib(cluster.pid(cluster.nodes[0].id))
            sent = [poll(first, lids[n % 3]) for n in range(1_000)]
            codes = {error_code(first.answer(rid, timeout=60)) for rid in sent}
            assert codes == {"QUOTA_EXCEEDED"}
            assert long_polls(endpoint) == 2
            assert rss_kib(cluster.pid(cluster.nodes[0].id)) - rss_before < 32 * 1024
            # Another principal gets the node's last slot (this one ends at 15 s: far
            # beyond the checks that need it parked, on a loaded machine too).
            other = conn(OTHER_TOKEN)
            short = poll(other, lids[1], timeout=15.0)
            wait_for(lambda: long_polls(endpoint) == 3, 30, "three parked long-polls")
            for op, fields in (
                ("await_lease", {"key": "gpu/k", "lease_id": lids[2]}),
                ("await_claim", {"queue": "jobs", "attempt_id": "none"}),
                ("await_task", {"queue": "jobs", "task_id": task["tid"]}),
            ):
                full = other.answer(other.send(op, timeout=POLL_TIMEOUT, **fields), timeout=10)
                assert error_code(full) == "QUOTA_EXCEEDED", (op, full)
                assert "max_long_polls_per_node" in full["message"]
            # The poll that timed out answered and gave its slot back.
            assert other.answer(short, timeout=60)["result"]["state"] == "waiting"
            wait_for(lambda: long_polls(endpoint) == 2, 30, "the timed-out poll's slot")
            # Closing a connection frees its parked polls' slots at once.
            first.close()
            wait_for(lambda: long_polls(endpoint) == 0, 30, "the closed connection's slots")
            # A client killed mid-poll (SIGKILL: the kernel closes its socket).
            script = textwrap.dedent(
                f"""
                import socket, sys, time
                from raftlease.protocol import encode_frame
                sock = socket.create_connection(("{endpoint.rpartition(":")[0]}",
                                                 {endpoint.rpartition(":")[2]}))
                sock.sendall(encode_frame({{"id": 1, "op": "auth", "token": "{AGENT_TOKEN}"}}))
                sock.recv(65536)
                for n, lid in enumerate({lids[:2]!r}, start=2):
                    sock.sendall(encode_frame({{"id": n, "op": "await_lease", "key": "gpu/k",
                                                "lease_id": lid, "timeout": {POLL_TIMEOUT}}}))
                print("sent", flush=True)
                time.sleep(600)
                """
            )
            child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
            try:
                assert child.stdout is not None and child.stdout.readline() == b"sent\n"
                wait_for(lambda: long_polls(endpoint) == 2, 30, "the child's parked polls")
                os.kill(child.pid, signal.SIGKILL)
            finally:
                child.kill()
                child.wait(30)
            wait_for(lambda: long_polls(endpoint) == 0, 30, "the killed client's slots")
            # Nothing changed in the state: the queued acquires are all still there.
            assert [w.owner for w in admin.waiters("gpu/k")] == waiters_before
            # And long-polls are served again.
            again = conn(AGENT_TOKEN)
            ok = again.answer(poll(again, lids[0], timeout=0.5), timeout=30)
            assert ok["result"]["state"] == "waiting"
    finally:
        for raw in opened:
            raw.close()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_long_polls_without_auth_count_per_node_native_and_http() -> None:
    cluster = admin_cluster(1, max_long_polls_per_node=1)
    cluster.start()
    try:
        endpoint = cluster.endpoints[0]
        with Client(cluster.endpoints) as client:
            client.acquire("k", owner="ops", ttl=120)
            lid = _queue(client, "k", "w")["lease_id"]
            parked = Raw(endpoint)
            try:
                parked.send("await_lease", key="k", lease_id=lid, timeout=POLL_TIMEOUT)
                wait_for(lambda: long_polls(endpoint) == 1, 30, "the parked long-poll")
                second = Raw(endpoint)
                try:
                    refused = second.call("await_lease", key="k", lease_id=lid, timeout=5)
                    assert error_code(refused) == "QUOTA_EXCEEDED"
                finally:
                    second.close()
                # The HTTP API's acquire with wait long-polls the same way: 429, and
                # its queued acquire is withdrawn (only the first one stays queued).
                body = json.dumps({"key": "k", "owner": "h", "ttl": 30, "wait": 20}).encode()
                request = urllib.request.Request(
                    f"http://{admin_of(cluster, 'n1')}/v1/leases/acquire",
                    data=body,
                    headers={"Content-Type": "application/json"},
                )
                with pytest.raises(urllib.error.HTTPError) as http:
                    urllib.request.urlopen(request, timeout=60).close()
                assert http.value.code == 429
                assert json.loads(http.value.read())["error"]["code"] == "QUOTA_EXCEEDED"
                wait_for(
                    lambda: [w.owner for w in client.waiters("k")] == ["w"],
                    30,
                    "the HTTP acquire's withdrawal",
                )
                # The native client does the same: its acquire with wait raises, and
                # it withdraws the acquire it had queued.
                with pytest.raises(QuotaExceededError):
                    client.acquire("k", owner="n", ttl=30, wait=20)
                wait_for(
                    lambda: [w.owner for w in client.waiters("k")] == ["w"],
                    30,
                    "the native acquire's withdrawal",
                )
            finally:
                parked.close()
            wait_for(lambda: long_polls(endpoint) == 0, 30, "the closed connection's slot")
    finally:
        cluster.close()


def _unauthenticated(endpoint: str) -> int:
    return int(status_of(endpoint)["unauthenticated_connections"])


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_strangers_connections_do_not_keep_an_agent_out(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    auth = auth_file(tmp_path)
    auth_timeout = 3.0
    cluster = cluster_factory(
        1,
        auth_file=str(auth),
        max_unauthenticated_connections=32,
        max_connections_per_address=8,
        auth_timeout=auth_timeout,
    )
    node = cluster.nodes[0].id
    endpoint = cluster.endpoints[0]
    pid = cluster.pid(node)
    rss_before = rss_kib(pid)
    agent = authenticated(endpoint, AGENT_TOKEN)
    stranger: list[socket.socket] = []
    refused = 0
    host, _, port = endpoint.rpartition(":")
    try:
        # 2,000 connections from 100 addresses (127.0.0.2 ...), kept open; the node
        # refuses or closes what is beyond its limits.
        for n in range(2_000):
            source = f"127.0.{1 + n % 100 // 50}.{2 + n % 50}"
            try:
                stranger.append(
                    socket.create_connection(
                        (host, int(port)), timeout=10, source_address=(source, 0)
                    )
                )
            except OSError:
                refused += 1
            if n % 250 == 249:
                # An agent from another address still connects and authenticates
                # during the flood, and the authenticated one is served.
                late = authenticated(endpoint, OTHER_TOKEN, source="127.0.0.1")
                assert late.call("holder", key="gpu/x")["ok"]
                late.close()
                assert agent.call("holder", key="gpu/x")["ok"]
        assert _unauthenticated(endpoint) <= 32 + 1  # + the status connection itself
        # Every stranger's connection is closed by the node: refused beyond the
        # limits, or at its auth deadline (idle, never authenticated).
        deadline = time.monotonic() + auth_timeout + 60
        for sock in stranger:
            assert closed_within(sock, max(0.1, deadline - time.monotonic())), (
                "an unauthenticated connection outlived its auth deadline"
            )
        # The agent's authenticated connection outlived every deadline.
        assert agent.call("holder", key="gpu/x")["ok"]
        wait_for(lambda: _unauthenticated(endpoint) <= 1, 30, "no stranger connection left")
        # RSS stays bounded: 2,000 connections left nothing behind that grows.
        assert rss_kib(pid) - rss_before < 64 * 1024
    finally:
        for sock in stranger:
            sock.close()
        agent.close()
    text = cluster.log_path(node).read_text()
    assert "not authenticated within" in text and "Traceback" not in text


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_connections_per_address_without_auth() -> None:
    cluster = admin_cluster(1, max_connections_per_address=4)
    cluster.start()
    endpoint = cluster.endpoints[0]
    held = [Raw(endpoint, source="127.0.0.3") for _ in range(4)]
    try:
        for raw in held:
            assert raw.call("ping")["ok"]
        extra = Raw(endpoint, source="127.0.0.3")
        try:
            refusal = extra.answer(0, timeout=30)
            assert error_code(refusal) == "QUOTA_EXCEEDED" and refusal["id"] is None
            assert "max_connections_per_address" in refusal["message"]
            assert closed_within(extra.sock, 30)
        finally:
            extra.close()
        # Another address is served; the held connections stay.
        with Client(cluster.endpoints) as client:
            assert client.acquire("k", owner="o", ttl=30).token > 0
        for raw in held:
            assert raw.call("ping")["ok"]
        # The refusal is counted by the limit that made it.
        url = f"http://{admin_of(cluster, 'n1')}/metrics"
        with urllib.request.urlopen(url, timeout=30) as response:
            text = response.read().decode()
        assert (
            'raftlease_client_connections_closed_total{limit="max_connections_per_address"} 1.0'
            in text
        )
    finally:
        for raw in held:
            raw.close()
        cluster.close()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_client_without_token_reconnects_after_its_auth_deadline(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    """``status`` and ``ping`` need no token, but their connection is closed at the auth
    deadline like any other; the client library connects again on its next request."""
    cluster = cluster_factory(1, auth_file=str(auth_file(tmp_path)), auth_timeout=1.0)
    node = cluster.nodes[0].id
    endpoint = cluster.endpoints[0]
    with Client(cluster.endpoints) as anonymous:
        assert anonymous.node_status(endpoint)["node"] == node
        wait_for(
            lambda: "not authenticated within" in cluster.log_path(node).read_text(),
            30,
            "the node to close the connection at its auth deadline",
        )
        statuses = wait_for(
            lambda: anonymous.node_status(endpoint, timeout=5.0),
            30,
            "a status over a new connection",
        )
        assert statuses["node"] == node


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_one_principals_2000_connections_do_not_keep_another_out(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    """agent-7 opens 2,000 connections (from 127.0.0.2) and authenticates each:
    ``max_connections_per_principal`` (256) of them are its, the others are refused
    (QUOTA_EXCEEDED on ``auth``, then closed at the auth deadline, or refused on
    accept once its address holds its share of unauthenticated connections), and
    agent-8 (from 127.0.0.1) connects and is served throughout."""
    cluster = cluster_factory(1, auth_file=str(auth_file(tmp_path)), auth_timeout=3.0)
    node = cluster.nodes[0].id
    endpoint = cluster.endpoints[0]
    pid = cluster.pid(node)
    rss_before = rss_kib(pid)
    flood: list[Raw] = []
    outcomes = {"ok": 0, "QUOTA_EXCEEDED": 0, "closed": 0}
    try:
        for n in range(2_000):
            try:
                raw = Raw(endpoint, source="127.0.0.2")
            except OSError:
                outcomes["closed"] += 1
                continue
            flood.append(raw)
            try:
                answer = raw.call("auth", token=AGENT_TOKEN)
            except (OSError, AssertionError):  # closed before it answered
                outcomes["closed"] += 1
                continue
            if answer.get("ok"):
                outcomes["ok"] += 1
            else:
                assert answer["code"] == "QUOTA_EXCEEDED", answer
                outcomes["QUOTA_EXCEEDED"] += 1
            if n % 250 == 249:
                other = authenticated(endpoint, OTHER_TOKEN)
                assert other.call("holder", key="gpu/x")["ok"]
                other.close()
        assert outcomes["ok"] == 256, outcomes
        assert sum(outcomes.values()) == 2_000
        with Client(cluster.endpoints, token=OTHER_TOKEN) as other_client:
            assert other_client.acquire("gpu/b", owner="b", ttl=30).token > 0
        assert rss_kib(pid) - rss_before < 64 * 1024
    finally:
        for raw in flood:
            raw.close()
    assert "Traceback" not in cluster.log_path(node).read_text()
