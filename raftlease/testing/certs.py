"""Local certificates and tokens for a secured cluster: a CA, a server certificate
for the client port, client certificates, a bearer token and an auth file. Used by
``raftlease up --secure`` and by the tests (built with ``cryptography``).

Files are written mode 0600 into the given directory. Blocking file I/O.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..server.auth import token_digest

VALID_DAYS = 365


def _write(path: Path, data: bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class Authority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    cert_file: Path


def make_ca(directory: Path, name: str = "raftlease local CA") -> Authority:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = _write(directory / "ca.pem", cert.public_bytes(serialization.Encoding.PEM))
    return Authority(cert, key, path)


def issue(
    ca: Authority, directory: Path, name: str, hosts: tuple[str, ...] = (), client: bool = False
) -> tuple[Path, Path]:
    """A certificate with common name ``name`` signed by ``ca``: for a server (its
    ``hosts`` as subject alternative names) or a client. Returns (cert, key) files."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
            ),
            critical=False,
        )
    )
    if hosts:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca.key, hashes.SHA256())
    cert_file = _write(directory / f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM))
    key_file = _write(directory / f"{name}.key", _key_pem(key))
    return cert_file, key_file


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
