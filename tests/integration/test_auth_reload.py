"""Rotation without restart (issue 11): ``SIGHUP`` makes a node read its auth file and
its client-port TLS files again. Real node processes; certificates made by
``raftlease.testing.certs``."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509

from raftlease import Client, UnauthenticatedError
from raftlease.protocol import encode_frame
from raftlease.testing import LocalCluster
from raftlease.testing.certs import SecureBundle, agent_role, issue, make_ca, secure_bundle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

Factory = Callable[..., LocalCluster]

OLD_TOKEN = "agent-token-before-rotation-0123"
NEW_TOKEN = "agent-token-after-rotation-45678"


def _agent(token: str) -> str:
    return agent_role({"agent-7": token})


def _replace(path: Path, text: str) -> None:
    """Replace a file atomically (as an operator's rename would), mode 0600."""
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    fresh.chmod(0o600)
    os.replace(fresh, path)


def _hup_until(cluster: LocalCluster, node_id: str, log_text: str, count: int) -> None:
    """Send SIGHUP once and wait until the node's log holds ``log_text`` ``count``
    times (the reload is done)."""
    os.kill(cluster.pid(node_id), signal.SIGHUP)
    deadline = time.monotonic() + 60
    while cluster.log_path(node_id).read_text().count(log_text) < count:
        assert time.monotonic() < deadline, f"no {log_text!r} in the node's log"
        time.sleep(0.05)


def _start(cluster_factory: Factory, tmp_path: Path) -> tuple[LocalCluster, SecureBundle, str]:
    bundle = secure_bundle(tmp_path / "tls")
    base = bundle.auth_file.read_text()
    bundle.auth_file.write_text(base + _agent(OLD_TOKEN))
    return cluster_factory(1, **bundle.node_settings()), bundle, base


def test_sighup_rotates_tokens_and_closes_revoked_connections(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    cluster, bundle, base = _start(cluster_factory, tmp_path)
    node = cluster.nodes[0].id
    ca = str(bundle.ca_file)
    with (
        Client(cluster.endpoints, tls=ca, token=OLD_TOKEN) as old,
        Client(cluster.endpoints, tls=ca, token=bundle.admin_token) as admin,
    ):
        lease = old.acquire("gpu/0", owner="a", ttl=60)
        assert admin.holder("gpu/0") is not None
        _replace(bundle.auth_file, base + _agent(NEW_TOKEN))
        _hup_until(cluster, node, "reloaded the auth file", 1)
        # The old token's connection was closed; reconnecting with it is refused.
        with pytest.raises(UnauthenticatedError):
            old.holder("gpu/0")
        with pytest.raises(UnauthenticatedError):
            old.renew(lease)
        # The admin's connection (token unchanged) was kept and is served.
        assert admin.holder("gpu/0") is not None
        # The new token works at once, for the same principal: its lease is its own.
        with Client(cluster.endpoints, tls=ca, token=NEW_TOKEN) as new:
            assert new.holder("gpu/0") is not None
            new.release(lease)
        assert admin.holder("gpu/0") is None


def test_a_bad_auth_file_is_refused_and_the_old_policy_stays(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    cluster, bundle, base = _start(cluster_factory, tmp_path)
    node = cluster.nodes[0].id
    ca = str(bundle.ca_file)
    with Client(cluster.endpoints, tls=ca, token=OLD_TOKEN) as agent:
        agent.acquire("gpu/1", owner="a", ttl=60)
        for n, bad in enumerate(
            [
                "this is = = not toml",
                base + _agent(NEW_TOKEN).replace('"agent"]', '"nobody"]'),  # unknown role
                "",  # no principals
            ],
            start=1,
        ):
            _replace(bundle.auth_file, bad)
            _hup_until(cluster, node, "the previous auth policy stays in force", n)
            # Same connection, same token: still served; a fresh one too.
            assert agent.holder("gpu/1") is not None
            with Client(cluster.endpoints, tls=ca, token=OLD_TOKEN) as again:
                assert again.holder("gpu/1") is not None
            with (
                pytest.raises(UnauthenticatedError),
                Client(cluster.endpoints, tls=ca, token=NEW_TOKEN) as new,
            ):
                new.holder("gpu/1")
    assert "Traceback" not in cluster.log_path(node).read_text()


def _served_certificate(endpoint: str, ca_file: Path) -> x509.Certificate:
    """The certificate a fresh TLS connection to ``endpoint`` is shown (verified
    against ``ca_file``)."""
    host, _, port = endpoint.rpartition(":")
    context = ssl.create_default_context(cafile=str(ca_file))
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _handshake_accepted(endpoint: str, context: ssl.SSLContext) -> bool:
    """Does the node accept a TLS connection made with ``context`` (a client
    certificate it cannot verify fails the handshake, in TLS 1.3 on the first read)?"""
    host, _, port = endpoint.rpartition(":")
    try:
        with (
            socket.create_connection((host, int(port)), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            tls.sendall(encode_frame({"id": 1, "op": "ping"}))
            return bool(tls.recv(65536))
    except (ssl.SSLError, ConnectionError):
        return False


def test_sighup_loads_a_new_server_certificate_and_a_new_client_ca(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    cluster, bundle, _ = _start(cluster_factory, tmp_path)
    node = cluster.nodes[0].id
    endpoint = cluster.endpoints[0]
    first = _served_certificate(endpoint, bundle.ca_file)
    # A new server certificate and a second CA for client certificates, put in
    # place by rename; a client certificate of the new CA names the admin.
    other = make_ca(tmp_path / "ca2", name="second CA")
    cert, key = issue(other, tmp_path / "ca2", "raftlease-node", ("127.0.0.1", "localhost"))
    client_cert, client_key = issue(other, tmp_path / "ca2", "admin", client=True)
    both = tmp_path / "ca2" / "both.pem"
    both.write_text(bundle.ca_file.read_text() + other.cert_file.read_text())
    # Before the reload the node refuses the second CA's client certificate.
    client_tls = ssl.create_default_context(cafile=str(bundle.ca_file))
    client_tls.load_cert_chain(str(client_cert), str(client_key))
    assert not _handshake_accepted(endpoint, client_tls)
    os.replace(cert, bundle.server_cert)
    os.replace(key, bundle.server_key)
    _replace(bundle.ca_file, both.read_text())  # the client CA file (and ours) holds both
    _hup_until(cluster, node, "reloaded the client-port TLS files", 1)
    served = _served_certificate(endpoint, bundle.ca_file)
    assert served.serial_number != first.serial_number
    assert served.issuer == other.cert.subject
    client_tls = ssl.create_default_context(cafile=str(bundle.ca_file))
    client_tls.load_cert_chain(str(client_cert), str(client_key))
    with Client(cluster.endpoints, tls=client_tls) as after:
        assert after.holder("gpu/x") is None  # authenticated by the new CA's certificate
    # A key that does not match the certificate is refused; the new pair stays.
    _, wrong_key = issue(other, tmp_path / "ca2", "stranger", ("127.0.0.1",))
    os.replace(wrong_key, bundle.server_key)
    _hup_until(cluster, node, "the previous TLS files stay in force", 1)
    assert _served_certificate(endpoint, bundle.ca_file).serial_number == served.serial_number
