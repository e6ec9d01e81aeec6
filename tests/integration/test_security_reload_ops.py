"""Issue 11: shapes pinned in the auth file, ``reload`` as an admin operation, and a
client CA removed without a restart. Real node processes (certificates made by
``raftlease.testing.certs``); the auth file's loader is also tested on its own.

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_security_reload_ops.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from raftlease import Client, PermissionDeniedError, UnauthenticatedError
from raftlease.errors import CapacityMismatchError, RaftLeaseError
from raftlease.protocol import encode_frame
from raftlease.testing import TEST_SETTINGS, LocalCluster
from raftlease.testing.certs import SecureBundle, issue, make_ca, secure_bundle
from tests.integration.test_admin_http import admin_cluster, admin_of
from tests.unit.test_security_reload_ops import AGENT, AGENT_TOKEN, SHAPES

Factory = Callable[..., LocalCluster]


def _replace(path: Path, text: str) -> None:
    """Replace a file by rename (as an operator should), mode 0600."""
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    fresh.chmod(0o600)
    os.replace(fresh, path)


def _bundle(tmp_path: Path, extra: str) -> tuple[SecureBundle, str]:
    bundle = secure_bundle(tmp_path / "tls")
    base = bundle.auth_file.read_text() + AGENT
    bundle.auth_file.write_text(base + extra)
    return bundle, base


def _http(addr: str, path: str, body: dict[str, Any], token: str, ca: Path) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"https://{addr}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_malformed_shapes_table_stops_the_node_at_start(tmp_path: Path) -> None:
    bundle, _ = _bundle(tmp_path, '[[shapes]]\nprefix = "gpu/pools/"\ncapacity = -1\n')
    cluster = LocalCluster(1, settings={**TEST_SETTINGS, **bundle.node_settings()})
    try:
        proc = cluster.start_node(cluster.nodes[0].id)
        assert proc.wait(timeout=60) == 2  # a CONFIG error, as for any bad auth file
        assert "shapes entry 1: capacity" in cluster.log_path(cluster.nodes[0].id).read_text()
    finally:
        cluster.close()


# ------------------------------------------------------------- pinned shapes


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_pinned_shape_refuses_other_capacities_on_every_leader_and_surface(
    tmp_path: Path,
) -> None:
    bundle, _ = _bundle(tmp_path, SHAPES)
    cluster = admin_cluster(3, **bundle.node_settings())
    cluster.start()
    ca = str(bundle.ca_file)
    try:
        with Client(cluster.endpoints, tls=ca, token=AGENT_TOKEN) as agent:
            # A plain lock on a pinned key (the squat the pin exists for) and a wrong
            # capacity: refused before anything is proposed; nothing is held after.
            for key, capacity, pinned in [
                ("gpu/pools/h100/0", 1, 8),
                ("gpu/pools/h100/0", 4, 8),
                ("gpu/pools/a100/big", 8, 4),
                ("gpu/pools/a100/small", 4, 2),
            ]:
                with pytest.raises(CapacityMismatchError, match="pinned") as refused:
                    agent.acquire(key, owner="squat", ttl=30, capacity=capacity)
                assert refused.value.definite is True
                assert refused.value.detail["capacity"] == pinned
                assert agent.holder(key) is None
                assert agent.waiters(key) == []
            # The pinned capacity needs no shape permission; every unit can be taken.
            first = agent.acquire("gpu/pools/a100/small", owner="u1", ttl=30, capacity=2)
            agent.acquire("gpu/pools/a100/small", owner="u2", ttl=30, capacity=2)
            agent.acquire("gpu/pools/h100/0", owner="u1", ttl=30, capacity=8)
            # A key nobody pinned is as before: a pool needs the shape permission.
            with pytest.raises(PermissionDeniedError, match="shape"):
                agent.acquire("gpu/free", owner="u1", ttl=30, capacity=3)
            agent.acquire("gpu/free", owner="u1", ttl=30)  # a plain lock needs none
            # Through a follower's HTTP API (forwarded to the leader): the same rule.
            leader = cluster.leader_id()
            follower = next(n.id for n in cluster.nodes if n.id != leader)
            api = admin_of(cluster, follower)
            body = {"key": "gpu/pools/h100/1", "owner": "http", "ttl": 30}
            status, answer = _http(api, "/v1/leases/acquire", body, AGENT_TOKEN, bundle.ca_file)
            assert status == 409 and answer["error"]["code"] == "CAPACITY_MISMATCH", answer
            assert answer["error"]["definite"] is True
            body["capacity"] = 8
            status, answer = _http(api, "/v1/leases/acquire", body, AGENT_TOKEN, bundle.ca_file)
            assert status == 200 and answer["token"] > 0, answer
            # A new leader (every node carries the same auth file) enforces it too.
            cluster.stop_node(leader)
            cluster.wait_for_leader(exclude=leader)
            with pytest.raises(CapacityMismatchError, match="pinned"):
                agent.acquire("gpu/pools/a100/other", owner="squat", ttl=30)
            assert agent.holder("gpu/pools/a100/other") is None
            agent.acquire("gpu/pools/a100/other", owner="u1", ttl=30, capacity=4)
            agent.release(first)
    finally:
        cluster.stop()
        cluster.close()


# --------------------------------------------------------- reload, the admin op


def _cli(
    cluster: LocalCluster, token: str, ca: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "RAFTLEASE_AUTH_TOKEN": token,
        "RAFTLEASE_CA_FILE": str(ca),
        "RAFTLEASE_ENDPOINTS": ",".join(cluster.endpoints),
    }
    return subprocess.run(
        [sys.executable, "-m", "raftlease", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_reload_needs_admin_takes_new_shapes_and_refuses_a_bad_file(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    bundle, base = _bundle(tmp_path, SHAPES)
    cluster = cluster_factory(2, **bundle.node_settings())
    ca = str(bundle.ca_file)
    one = cluster.endpoints[0]
    with (
        Client(cluster.endpoints, tls=ca, token=AGENT_TOKEN) as agent,
        Client(cluster.endpoints, tls=ca, token=bundle.admin_token) as admin,
        Client(cluster.endpoints, tls=ca) as anonymous,
    ):
        with pytest.raises(PermissionDeniedError, match="admin only"):
            agent.reload(one)
        with pytest.raises(UnauthenticatedError):
            anonymous.reload(one)
        # New shapes, taken by both nodes (the file is each node's own: ask each).
        _replace(bundle.auth_file, base + '[[shapes]]\nprefix = "gpu/new/"\ncapacity = 3\n')
        for endpoint in cluster.endpoints:
            answer = admin.reload(endpoint)
            assert answer["reloaded"] is True and answer["errors"] == [], answer
        with pytest.raises(CapacityMismatchError, match="pinned to capacity 3"):
            agent.acquire("gpu/new/0", owner="a", ttl=30)
        agent.acquire("gpu/new/0", owner="a", ttl=30, capacity=3)  # no shape permission
        with pytest.raises(PermissionDeniedError, match="shape"):
            agent.acquire("gpu/pools/a100/big", owner="a", ttl=30, capacity=4)  # unpinned
        # A malformed shapes table is refused with its reason; the last policy stays.
        _replace(bundle.auth_file, base + '[[shapes]]\nkey = "gpu/x"\ncapacity = "many"\n')
        answer = admin.reload(one)
        assert answer["reloaded"] is False
        assert any("capacity must be an integer" in why for why in answer["errors"]), answer
        with pytest.raises(CapacityMismatchError, match="pinned to capacity 3"):
            agent.acquire("gpu/new/1", owner="a", ttl=30)
        # The CLI: every node with --all; exit 1 and the reason when a file is refused.
        done = _cli(cluster, bundle.admin_token, bundle.ca_file, "reload", "--all", "--json")
        assert done.returncode == 1, done
        rows = json.loads(done.stdout)["nodes"]
        assert [row["reloaded"] for row in rows] == [False, False]
        assert all("capacity must be an integer" in row["errors"][0] for row in rows)
        _replace(bundle.auth_file, base + SHAPES)
        done = _cli(cluster, bundle.admin_token, bundle.ca_file, "reload", "--all")
        assert done.returncode == 0, done
        assert done.stdout.count(": reloaded") == 2, done.stdout
        done = _cli(cluster, AGENT_TOKEN, bundle.ca_file, "reload")
        assert done.returncode == 1 and "PERMISSION_DENIED" in done.stdout, done
        with pytest.raises(CapacityMismatchError, match="pinned to capacity 4"):
            agent.acquire("gpu/pools/a100/big", owner="a", ttl=30)
        assert admin.holder("gpu/pools/a100/big") is None
    for node in cluster.nodes:
        assert "Traceback" not in cluster.log_path(node.id).read_text()


# ------------------------------------------------------ removing a client CA


def _client_tls(ca: Path, cert: Path, key: Path, tls12: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


def _ping(endpoint: str, context: ssl.SSLContext, session: ssl.SSLSession | None = None) -> Any:
    """A fresh TLS connection and a ping on it: (accepted, session, resumed). A client
    certificate the node cannot verify fails the handshake (TLS 1.3: on the first
    read). Closed cleanly (close_notify both ways), so OpenSSL keeps the session for
    resumption: a connection closed without it has its session dropped."""
    host, _, port = endpoint.rpartition(":")
    try:
        with (
            socket.create_connection((host, int(port)), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=host, session=session) as tls,
        ):
            tls.sendall(encode_frame({"id": 1, "op": "ping"}))
            answered = bool(tls.recv(65536))
            result = answered, tls.session, tls.session_reused
            with contextlib.suppress(ssl.SSLError, OSError):
                tls.unwrap()
            return result
    except (ssl.SSLError, ConnectionError):
        return False, None, False


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_removed_client_ca_is_refused_after_reload_and_its_open_connections_closed(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    bundle, base = _bundle(tmp_path, "")
    # A second CA, trusted for client certificates beside the first, with a principal
    # of its own; the node's client CA file holds both.
    other = make_ca(tmp_path / "ca2", name="second CA")
    bob_cert, bob_key = issue(other, tmp_path / "ca2", "bob", client=True)
    _replace(bundle.auth_file, base + '[[principals]]\nname = "bob"\nroles = ["agent"]\n')
    client_cas = tmp_path / "client-cas.pem"
    client_cas.write_text(bundle.ca_file.read_text() + other.cert_file.read_text())
    settings = {**bundle.node_settings(), "tls_client_ca_file": str(client_cas)}
    cluster = cluster_factory(1, **settings)
    endpoint = cluster.endpoints[0]
    bob_tls = _client_tls(bundle.ca_file, bob_cert, bob_key)
    bob_tls12 = _client_tls(bundle.ca_file, bob_cert, bob_key, tls12=True)
    admin_tls = _client_tls(bundle.ca_file, bundle.client_cert, bundle.client_key)
    accepted, bob_session, _ = _ping(endpoint, bob_tls12)
    assert accepted and bob_session is not None
    with (
        Client(cluster.endpoints, tls=bob_tls) as bob,
        Client(cluster.endpoints, tls=admin_tls) as by_cert,
        Client(cluster.endpoints, tls=str(bundle.ca_file), token=bundle.admin_token) as admin,
    ):
        lease = bob.acquire("gpu/bob", owner="bob", ttl=60)  # bob's certificate names bob
        assert by_cert.holder("gpu/bob") is not None
        # Drop the second CA from the file; reload through the admin operation.
        _replace(client_cas, bundle.ca_file.read_text())
        answer = admin.reload(endpoint)
        assert answer["reloaded"] is True, answer
        # bob's open connection was closed at the reload, and no new handshake with
        # his certificate is accepted: a fresh one, nor a resumed TLS 1.2 session.
        with pytest.raises(RaftLeaseError):
            bob.renew(lease, timeout=5)
        assert _ping(endpoint, bob_tls12, bob_session)[0] is False  # resumption: skips
        assert _ping(endpoint, bob_tls)[0] is False  # certificate checks, so refused
        assert _ping(endpoint, bob_tls12)[0] is False
        # The kept CA still works: the open connection is served, new ones are made.
        assert by_cert.holder("gpu/bob") is not None
        assert _ping(endpoint, admin_tls)[0] is True
        with Client(cluster.endpoints, tls=admin_tls) as again:
            assert again.holder("gpu/bob") is not None
    log_text = cluster.log_path(cluster.nodes[0].id).read_text()
    assert "reloaded the client-port TLS files; 1 connections closed" in log_text
    assert "Traceback" not in log_text


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_client_port_resumes_no_tls_session(cluster_factory: Factory, tmp_path: Path) -> None:
    """A resumed session skips certificate verification, so none is resumed: TLS 1.3
    gets no tickets and a TLS 1.2 session id offered again fails that handshake once
    (the session is dropped), after which a full handshake is accepted."""
    bundle, _ = _bundle(tmp_path, "")
    cluster = cluster_factory(1, **bundle.node_settings())
    endpoint = cluster.endpoints[0]
    tls = _client_tls(bundle.ca_file, bundle.client_cert, bundle.client_key)
    tls12 = _client_tls(bundle.ca_file, bundle.client_cert, bundle.client_key, tls12=True)
    accepted, session, _ = _ping(endpoint, tls)
    assert accepted
    accepted, _, resumed = _ping(endpoint, tls, session)
    assert accepted and not resumed
    accepted, session, _ = _ping(endpoint, tls12)
    assert accepted
    assert _ping(endpoint, tls12, session)[0] is False
    accepted, _, resumed = _ping(endpoint, tls12, session)  # the session is gone now
    assert accepted and not resumed
