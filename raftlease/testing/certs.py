"""Local certificates and tokens: the peer certificates of a local cluster
(``ClusterCerts``: a CA and a member certificate per node), and for a secured client
port a CA, a server certificate, client certificates, a bearer token and an auth
file. Used by ``LocalCluster`` (every test cluster and ``raftlease up``), ``raftlease
up --secure`` and the tests; built with ``pki`` (``cryptography``'s x509 builder).

Keys and tokens are written mode 0600. Blocking file I/O.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import pki
from ..pki import Authority
from ..replication.peer_tls import PeerTLS, load_peer_tls
from ..server.auth import token_digest

__all__ = [
    "Authority",
    "ClusterCerts",
    "SecureBundle",
    "agent_role",
    "issue",
    "make_ca",
    "secure_bundle",
]


def _write(path: Path, data: bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def make_ca(directory: Path, name: str = "raftlease local CA") -> Authority:
    """A new CA in ``directory`` (``ca.pem``, ``ca.key``; replaces one there)."""
    return pki.make_ca(directory, name, force=True)


def issue(
    ca: Authority,
    directory: Path,
    name: str,
    hosts: tuple[str, ...] = (),
    client: bool = False,
    member: bool = False,
) -> tuple[Path, Path]:
    """A certificate with common name ``name`` signed by ``ca`` (``pki.issue``): for a
    server (its ``hosts`` as subject alternative names), a client, or a cluster
    member (``member``: it names node ``name``). Returns (cert, key) files."""
    return pki.issue(ca, directory, name, hosts=hosts, client=client, member=member)


class ClusterCerts:
    """The peer certificates of a local cluster: a CA in ``directory`` (made on first
    use) and one member certificate per node id, issued when first asked for, for
    127.0.0.1 and localhost. ``settings(node_id)`` are the node's peer TLS settings.
    Blocking file I/O; not thread-safe (one launcher uses it)."""

    HOSTS = ("127.0.0.1", "localhost")

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._ca: Authority | None = None

    @property
    def ca(self) -> Authority:
        if self._ca is None:
            if (self.directory / pki.CA_CERT).exists() and (self.directory / pki.CA_KEY).exists():
                self._ca = pki.load_ca(self.directory)
            else:
                self._ca = pki.make_ca(self.directory, "raftlease local cluster CA", force=True)
        return self._ca

    def member(self, node_id: str) -> tuple[Path, Path]:
        """Node ``node_id``'s certificate and key files (issued if missing)."""
        cert = self.directory / f"{node_id}.pem"
        key = self.directory / f"{node_id}.key"
        if not (cert.exists() and key.exists()):
            pki.issue(self.ca, self.directory, node_id, hosts=self.HOSTS, member=True)
        return cert, key

    def settings(self, node_id: str) -> dict[str, str]:
        """``peer_ca_file``, ``peer_cert_file`` and ``peer_key_file`` for the node."""
        cert, key = self.member(node_id)
        return {
            "peer_ca_file": str(self.ca.cert_file),
            "peer_cert_file": str(cert),
            "peer_key_file": str(key),
        }

    def peer_tls(self, node_id: str) -> PeerTLS:
        """The node's loaded peer TLS, for a transport built in the test process."""
        files = self.settings(node_id)
        return load_peer_tls(
            node_id, files["peer_ca_file"], files["peer_cert_file"], files["peer_key_file"]
        )


@dataclass(frozen=True)
class SecureBundle:
    """What ``secure_bundle`` wrote: node settings and what a client needs."""

    ca_file: Path
    server_cert: Path
    server_key: Path
    auth_file: Path
    admin_token: str
    token_file: Path
    client_cert: Path
    client_key: Path

    def add_agents(
        self, principals: Mapping[str, str], prefixes: Sequence[str] = ("gpu/",)
    ) -> None:
        """Append ``agent_role(principals, prefixes)`` to the auth file."""
        self.auth_file.write_text(self.auth_file.read_text() + agent_role(principals, prefixes))

    def node_settings(self) -> dict[str, str]:
        return {
            "tls_cert_file": str(self.server_cert),
            "tls_key_file": str(self.server_key),
            "tls_client_ca_file": str(self.ca_file),
            "auth_file": str(self.auth_file),
        }


def agent_role(principals: Mapping[str, str], prefixes: Sequence[str] = ("gpu/",)) -> str:
    """Auth-file text (docs/security.md): a role ``agent`` with read and write on each
    of ``prefixes`` and no other permission, and one principal per ``name: token``
    holding it (the token stored as its SHA-256)."""
    permissions = "".join(
        f'  {{ prefix = "{prefix}", actions = ["read", "write"] }},\n' for prefix in prefixes
    )
    text = f"\n[roles.agent]\npermissions = [\n{permissions}]\n"
    for name, token in principals.items():
        text += (
            f'\n[[principals]]\nname = "{name}"\n'
            f'token_sha256 = "{token_digest(token)}"\nroles = ["agent"]\n'
        )
    return text


def secure_bundle(
    directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
) -> SecureBundle:
    """A CA, the client port's certificate for ``hosts``, an ``admin`` principal with a
    fresh token (and a client certificate with the same name), and an auth file that
    gives it every permission."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca = make_ca(directory)
    server_cert, server_key = issue(ca, directory, "raftlease-node", hosts)
    client_cert, client_key = issue(ca, directory, "admin", client=True)
    token = secrets.token_urlsafe(32)
    token_file = _write(directory / "admin.token", (token + "\n").encode())
    auth_file = _write(
        directory / "auth.toml",
        (
            "# Roles and principals (docs/security.md). Tokens are stored as SHA-256.\n"
            "[roles.admin]\n"
            'permissions = [{ prefix = "", actions = ["read", "write", "admin"] }]\n'
            "max_priority = 1000\n\n"
            "[[principals]]\n"
            'name = "admin"\n'
            f'token_sha256 = "{token_digest(token)}"\n'
            'roles = ["admin"]\n'
        ).encode(),
    )
    return SecureBundle(
        ca.cert_file, server_cert, server_key, auth_file, token, token_file, client_cert, client_key
    )
