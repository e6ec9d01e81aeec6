"""Clients on a secured node (issue 11): TLS on the client port, bearer tokens and
client certificates, roles with permissions on key prefixes, protected mode.
Real node processes; certificates made by ``raftlease.testing.certs``."""

from __future__ import annotations

import socket
import ssl
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from raftlease import (
    Client,
    PermissionDeniedError,
    QuotaExceededError,
    UnauthenticatedError,
)
from raftlease.config import NodeConfig
from raftlease.errors import ConfigError, ConnectionLostError, RaftLeaseError
from raftlease.protocol import encode_frame
from raftlease.server.auth import token_digest
from raftlease.testing import LocalCluster
from raftlease.testing.certs import SecureBundle, issue, make_ca, secure_bundle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Factory = Callable[..., LocalCluster]

AGENT_TOKEN = "agent-token-0123456789abcdef"


def secured(cluster_factory: Factory, tmp_path: Path) -> tuple[LocalCluster, SecureBundle]:
    bundle = secure_bundle(tmp_path / "tls")
    # One more principal: an agent that may use gpu/ only, priority up to 5.
    bundle.auth_file.write_text(
        bundle.auth_file.read_text()
        + textwrap.dedent(
            f"""
            [roles.agent]
            permissions = [{{ prefix = "gpu/", actions = ["read", "write"] }}]
            max_priority = 5

            [[principals]]
            name = "agent-7"
            token_sha256 = "{token_digest(AGENT_TOKEN)}"
            roles = ["agent"]
            """
        )
    )
    return cluster_factory(3, **bundle.node_settings()), bundle


def test_tokens_and_roles_guard_every_operation(cluster_factory: Factory, tmp_path: Path) -> None:
    cluster, bundle = secured(cluster_factory, tmp_path)
    ca = str(bundle.ca_file)
    with Client(cluster.endpoints, tls=ca, token=bundle.admin_token) as admin:
        admin.acquire("ops/x", owner="admin", ttl=5)
    with Client(cluster.endpoints, tls=ca, token=AGENT_TOKEN) as agent:
        held = agent.acquire("gpu/0", owner="agent-7", ttl=5)
        assert agent.holder("gpu/0") is not None
        with pytest.raises(PermissionDeniedError, match="may not write 'ops/y'"):
            agent.acquire("ops/y", owner="agent-7", ttl=5)
        with pytest.raises(PermissionDeniedError):
            agent.holder("ops/x")
        with pytest.raises(PermissionDeniedError, match="priority up to 5"):
            agent.acquire("gpu/1", owner="agent-7", ttl=5, wait=1.0, priority=6)
        with pytest.raises(PermissionDeniedError):
            agent.leases("")  # a prefix wider than its own
        assert [h.key for h in agent.leases("gpu/")] == ["gpu/0"]
        agent.release(held)
    with Client(cluster.endpoints, tls=ca, token=bundle.admin_token) as admin:
        assert admin.holder("ops/y") is None, "a denied request changed the state"
        assert admin.holder("gpu/1") is None


def test_no_token_or_a_wrong_one_is_unauthenticated(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    cluster, bundle = secured(cluster_factory, tmp_path)
    ca = str(bundle.ca_file)
    with Client(cluster.endpoints, tls=ca) as anonymous:
        with pytest.raises(UnauthenticatedError):
            anonymous.acquire("gpu/0", owner="x", ttl=5)
        assert anonymous.node_status(cluster.endpoints[0])  # never an unauthenticated read
    wrong = Client(cluster.endpoints, tls=ca, token="wrong-token")
    with wrong, pytest.raises(UnauthenticatedError):
        wrong.acquire("gpu/0", owner="x", ttl=5)


def test_a_client_certificate_names_the_principal(cluster_factory: Factory, tmp_path: Path) -> None:
    cluster, bundle = secured(cluster_factory, tmp_path)
    context = ssl.create_default_context(cafile=str(bundle.ca_file))
    context.load_cert_chain(str(bundle.client_cert), str(bundle.client_key))
    with Client(cluster.endpoints, tls=context) as by_cert:
        by_cert.acquire("ops/cert", owner="admin", ttl=5)
    # A certificate from another CA proves nothing: the handshake fails.
    stranger_ca = make_ca(tmp_path / "other")
    cert, key = issue(stranger_ca, tmp_path / "other", "admin", client=True)
    forged = ssl.create_default_context(cafile=str(bundle.ca_file))
    forged.load_cert_chain(str(cert), str(key))
    impostor = Client(cluster.endpoints, tls=forged, deadline=2.0)
    with impostor, pytest.raises(RaftLeaseError):
        impostor.acquire("ops/cert2", owner="admin", ttl=5)


def test_plain_tcp_to_a_tls_port_gets_nothing(cluster_factory: Factory, tmp_path: Path) -> None:
    cluster, _ = secured(cluster_factory, tmp_path)
    host, _, port = cluster.endpoints[0].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(encode_frame({"id": 1, "op": "holder", "key": "gpu/0"}))
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    # Nothing but, at most, a TLS alert record (content type 21): never an answer.
    assert data == b"" or data[0] == 0x15, data[:40]
    with (
        Client(cluster.endpoints, deadline=1.0) as plain,
        pytest.raises((ConnectionLostError, RaftLeaseError)),
    ):
        plain.acquire("gpu/0", owner="x", ttl=5)


def _config(**values: Any) -> NodeConfig:
    base: dict[str, Any] = {
        "node_id": "n1",
        "nodes": [{"id": "n1", "raft": "10.1.2.3:7100", "client": "10.1.2.3:7000"}],
        "data_dir": "/tmp/unused",
    }
    return NodeConfig.create(**{**base, **values})


def test_protected_mode_refuses_an_open_client_port_without_tls_and_auth() -> None:
    with pytest.raises(ConfigError, match="protected mode"):
        _config()
    with pytest.raises(ConfigError, match="protected mode"):
        _config(tls_cert_file="c.pem", tls_key_file="k.pem")  # encrypted, not authenticated
    assert _config(insecure=True).insecure is True
    assert _config(tls_cert_file="c.pem", tls_key_file="k.pem", auth_file="a.toml")
    with pytest.raises(ConfigError, match="go together"):
        _config(tls_cert_file="c.pem", insecure=True)


def test_a_lease_id_alone_does_not_let_another_principal_use_the_lease(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    cluster, bundle = secured(cluster_factory, tmp_path)
    ca = str(bundle.ca_file)
    with (
        Client(cluster.endpoints, tls=ca, token=AGENT_TOKEN) as agent,
        Client(cluster.endpoints, tls=ca, token=bundle.admin_token) as other,
    ):
        held = agent.acquire("gpu/7", owner="agent-7", ttl=30)
        with pytest.raises(PermissionDeniedError, match="another principal"):
            other.renew(held)  # the admin has write on every prefix, but not this lease
        with pytest.raises(PermissionDeniedError):
            other.release(held)
        assert agent.holder("gpu/7") is not None
        agent.renew(held)
        agent.release(held)


def test_quotas_stop_one_principal_without_locking_out_another(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    bundle = secure_bundle(tmp_path / "tls")
    bundle.add_agents({"agent-7": AGENT_TOKEN})
    cluster = cluster_factory(
        1,
        **bundle.node_settings(),
        max_leases_per_principal=5,
        max_sessions_per_principal=2,
        max_connections_per_principal=3,
    )
    ca = str(bundle.ca_file)
    with Client(cluster.endpoints, tls=ca, token=AGENT_TOKEN) as agent:
        held = [agent.acquire(f"gpu/{i}", owner="a", ttl=30) for i in range(5)]
        with pytest.raises(QuotaExceededError):
            agent.acquire("gpu/5", owner="a", ttl=30)
        agent.release(held[0])
        agent.acquire("gpu/5", owner="a", ttl=30)  # room again
        sessions = [agent.session(owner="a", ttl=5) for _ in range(2)]
        for session in sessions:
            session.__enter__()
        with pytest.raises(QuotaExceededError):
            agent.session(owner="a", ttl=5).__enter__()
        for session in sessions:
            session.__exit__(None, None, None)
    # Connections: three are fine, the fourth is refused; another principal still gets in.
    extra = [Client(cluster.endpoints, tls=ca, token=AGENT_TOKEN) for _ in range(4)]
    try:
        for client in extra[:3]:
            client.holder("gpu/1")
        with pytest.raises(QuotaExceededError):
            extra[3].holder("gpu/1")
        with Client(cluster.endpoints, tls=ca, token=bundle.admin_token) as admin:
            assert admin.holder("gpu/1") is not None
    finally:
        for client in extra:
            client.close()
