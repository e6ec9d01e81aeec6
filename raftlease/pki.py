"""The cluster's certificates: a CA, member certificates, client certificates and a
revocation list, made with ``cryptography``'s x509 builder (no openssl command needed),
and how a member is named in a certificate (docs/security.md, "Peers").

A member's certificate names its node id in a URI subject alternative name,
``urn:raftlease:member:<id>`` (``member_uri``). That, not the common name, is what
a peer connection is checked against: a client certificate signed by the same CA
(whose common name is a principal's name, possibly ``n2``) never carries such a URI,
so it cannot pass as member n2. Member certificates carry both extended key usages
(every member dials some peers and accepts others) and the hosts given as DNS or IP
names, so the same certificate can serve the client port.

``raftlease certs`` (cli/certs.py), ``raftlease up`` and the test clusters
(testing/certs.py) use these functions; cert-manager, Vault or openssl can make the
same files (docs/deployment.md).

Files are written mode 0600 (keys) or 0644 (certificates, the CA's, the revocation
list), each atomically (a temporary file renamed into place). Blocking file I/O;
raises ``ConfigError`` for files that cannot be read or are not what they should be,
and ``FileExistsError`` where a file would be overwritten without ``force``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .errors import ConfigError

#: The URI a member's certificate carries to name its node id.
MEMBER_URI_PREFIX = "urn:raftlease:member:"
#: Node ids and principal names a certificate may be made for (they become file
#: names and URI parts).
SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
CA_DAYS = 3650
CERT_DAYS = 365
#: A certificate is valid from a little before it was made: clocks of the hosts
#: that check it may run behind the one that made it.
BACKDATE = datetime.timedelta(minutes=5)
CA_CERT = "ca.pem"
CA_KEY = "ca.key"
CRL = "crl.pem"


def member_uri(node_id: str) -> str:
    """The subject alternative name that makes a certificate member ``node_id``'s."""
    return MEMBER_URI_PREFIX + node_id


def check_name(name: str, what: str = "name") -> str:
    """``name`` if it is a safe node id or principal name; raises ``ConfigError``."""
    if not isinstance(name, str) or not SAFE_NAME.match(name):
        raise ConfigError(
            f"{what} {name!r} must be 1-64 letters, digits, '_', '.' or '-' (not starting "
            "with '.' or '-')"
        )
    return name


def member_ids(cert: x509.Certificate) -> list[str]:
    """The node ids ``cert`` names as a member (its ``urn:raftlease:member:`` URIs)."""
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [
        uri[len(MEMBER_URI_PREFIX) :]
        for uri in names.get_values_for_type(x509.UniformResourceIdentifier)
        if uri.startswith(MEMBER_URI_PREFIX)
    ]


def member_ids_of_peercert(peercert: dict[str, Any] | None) -> list[str]:
    """The node ids named by a verified peer certificate as ``ssl`` returns it
    (``SSLObject.getpeercert()``: a dict whose ``subjectAltName`` is pairs)."""
    if not peercert:
        return []
    found = []
    for kind, value in peercert.get("subjectAltName", ()):
        if kind == "URI" and isinstance(value, str) and value.startswith(MEMBER_URI_PREFIX):
            found.append(value[len(MEMBER_URI_PREFIX) :])
    return found


# --------------------------------------------------------------------- files


def write_file(path: Path, data: bytes, mode: int, force: bool = True) -> Path:
    """Write ``data`` to ``path`` with ``mode``, atomically (a temporary file in the
    same folder, fsynced, renamed into place). Without ``force`` an existing file is
    kept and ``FileExistsError`` raised."""
    if not force and path.exists():
        raise FileExistsError(f"{path} exists (keep it, or give --force to replace it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # the umask does not narrow it
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_certificates(path: Path, what: str = "certificate file") -> list[x509.Certificate]:
    """Every certificate of a PEM file; raises ``ConfigError`` if it cannot be read
    or holds none."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} {str(path)!r}: {exc.strerror}") from None
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        certs = []
    if not certs:
        raise ConfigError(f"the {what} {str(path)!r} holds no PEM certificate")
    return certs


def load_private_key(path: Path, what: str = "key file") -> Any:
    """The private key of a PEM file (unencrypted); raises ``ConfigError``."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} {str(path)!r}: {exc.strerror}") from None
    try:
        return serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"the {what} {str(path)!r} is not an unencrypted PEM private key ({exc})"
        ) from None


def load_crls(path: Path) -> list[x509.CertificateRevocationList]:
    """Every certificate revocation list of a PEM file (one per CA it covers);
    raises ``ConfigError`` if it cannot be read or holds none."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the revocation list {str(path)!r}: {exc.strerror}"
        ) from None
    marker = b"-----BEGIN X509 CRL-----"
    crls = []
    for part in data.split(marker)[1:]:
        try:
            crls.append(x509.load_pem_x509_crl(marker + part))
        except ValueError as exc:
            raise ConfigError(
                f"the revocation list {str(path)!r} holds a malformed CRL ({exc})"
            ) from None
    if not crls:
        raise ConfigError(f"the revocation list {str(path)!r} holds no PEM CRL")
    return crls


# ----------------------------------------------------------------------- CA


@dataclass(frozen=True)
class Authority:
    """A CA: its certificate, its private key and the file of the certificate."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    cert_file: Path

    @property
    def key_file(self) -> Path:
        return self.cert_file.with_name(CA_KEY)


def make_ca(
    directory: Path,
    name: str = "raftlease cluster CA",
    days: int = CA_DAYS,
    force: bool = False,
) -> Authority:
    """A new CA in ``directory``: ``ca.pem`` (its certificate, 0644), ``ca.key`` (its
    key, 0600; keep it off the nodes) and ``crl.pem`` (its revocation list, empty).
    Raises ``FileExistsError`` if the certificate or key exists and not ``force``."""
    if days < 1:
        raise ConfigError(f"days must be at least 1, got {days}")
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not force:
        for existing in (directory / CA_CERT, directory / CA_KEY):
            if existing.exists():
                raise FileExistsError(
                    f"{existing} exists: this folder already has a CA (give --force to "
                    "replace it: every certificate it signed stops being trusted)"
                )
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    # The key first: a folder with a CA certificate but no key would look complete.
    write_file(directory / CA_KEY, _key_pem(key), 0o600)
    path = write_file(directory / CA_CERT, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    ca = Authority(cert, key, path)
    # An empty revocation list, so members can name peer_crl_file from the start and
    # a revocation later is a file copy and a reload, not a config change.
    (directory / CRL).unlink(missing_ok=True)
    revoke(ca, [], directory / CRL)
    return ca


def load_ca(directory: Path) -> Authority:
    """The CA in ``directory`` (``ca.pem`` and ``ca.key``); raises ``ConfigError``
    naming the missing or unusable file."""
    cert_file = directory / CA_CERT
    if not cert_file.exists() or not (directory / CA_KEY).exists():
        raise ConfigError(
            f"no CA in {str(directory)!r} (it needs {CA_CERT} and {CA_KEY}); make one with "
            f"`raftlease certs init --dir {directory}`"
        )
    cert = load_certificates(cert_file, "CA certificate")[0]
    key = load_private_key(directory / CA_KEY, "CA key")
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key().public_numbers() != (
        cert.public_key().public_numbers()  # type: ignore[union-attr]
    ):
        raise ConfigError(f"{CA_KEY} in {str(directory)!r} is not the key of its {CA_CERT}")
    return Authority(cert, key, cert_file)


# -------------------------------------------------------------- certificates


def _general_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        host = host.strip()
        if not host:
            continue
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host.strip("[]"))))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def issue(
    ca: Authority,
    directory: Path,
    name: str,
    *,
    hosts: Sequence[str] = (),
    member: bool = False,
    client: bool = False,
    days: int = CERT_DAYS,
    force: bool = True,
) -> tuple[Path, Path]:
    """A certificate with common name ``name`` signed by ``ca``, written to
    ``directory/<name>.pem`` (0644) with its key ``<name>.key`` (0600). Returns
    (certificate file, key file).

    ``member``: a cluster member's (the ``urn:raftlease:member:<name>`` URI, server
    and client use; ``hosts`` as DNS/IP names, so it can serve the client port too).
    ``client``: a client's (client use only; its common name is the principal).
    Neither: a server certificate for ``hosts`` (the client port alone)."""
    if days < 1:
        raise ConfigError(f"days must be at least 1, got {days}")
    check_name(name, "node id" if member else "name")
    if member and client:
        raise ValueError("a certificate is a member's or a client's, not both")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usages = []
    if member or not client:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if member or client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    names = _general_names(hosts)
    if member:
        names.insert(0, x509.UniformResourceIdentifier(member_uri(name)))
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + datetime.timedelta(days=days), ca.cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca.key, hashes.SHA256())
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    cert_path = directory / f"{name}.pem"
    key_path = directory / f"{name}.key"
    if not force:
        for existing in (cert_path, key_path):
            if existing.exists():
                raise FileExistsError(f"{existing} exists (give --force to replace it)")
    write_file(key_path, _key_pem(key), 0o600)
    write_file(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert_path, key_path


def revoke(ca: Authority, certificates: Iterable[x509.Certificate], crl_path: Path) -> int:
    """Add ``certificates`` to the revocation list at ``crl_path`` (made if missing,
    signed by ``ca``; 0644). Returns how many serials the list holds now. Raises
    ``ConfigError`` if a certificate was not issued by ``ca`` (revoking it here would
    do nothing) or the existing list is not this CA's."""
    serials: dict[int, datetime.datetime] = {}
    if crl_path.exists():
        for old in load_crls(crl_path):
            if not old.is_signature_valid(ca.key.public_key()):
                raise ConfigError(
                    f"the revocation list {str(crl_path)!r} holds a list not signed by this "
                    "CA (keep one file per CA)"
                )
            for revoked in old:
                serials[revoked.serial_number] = revoked.revocation_date_utc
    now = datetime.datetime.now(datetime.UTC)
    for cert in certificates:
        if cert.issuer != ca.cert.subject:
            raise ConfigError(
                f"the certificate of {describe_subject(cert)} was not issued by this CA "
                f"({ca.cert.subject.rfc4514_string()})"
            )
        serials.setdefault(cert.serial_number, now)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca.cert.subject)
        .last_update(now - BACKDATE)
        # A node reads the list from its file, not from a distribution point: the
        # next update only tells a reader how old the list may be.
        .next_update(now + datetime.timedelta(days=CA_DAYS))
    )
    for serial, when in sorted(serials.items()):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when).build()
        )
    crl = builder.sign(ca.key, hashes.SHA256())
    write_file(crl_path, crl.public_bytes(serialization.Encoding.PEM), 0o644)
    return len(serials)


def describe_subject(cert: x509.Certificate) -> str:
    """A short name for ``cert`` in messages: its common name, else its subject."""
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else cert.subject.rfc4514_string()


def describe(cert: x509.Certificate) -> dict[str, Any]:
    """What ``raftlease certs show`` prints of a certificate."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [str(getattr(n, "value", n)) for n in sans]
    except x509.ExtensionNotFound:
        names = []
    try:
        ekus = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        named = {
            ExtendedKeyUsageOID.SERVER_AUTH: "serverAuth",
            ExtendedKeyUsageOID.CLIENT_AUTH: "clientAuth",
        }
        usage = sorted(named.get(u, u.dotted_string) for u in ekus)
    except x509.ExtensionNotFound:
        usage = []
    try:
        ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        ca = False
    return {
        "subject": cert.subject.rfc4514_string(),
        "issuer": cert.issuer.rfc4514_string(),
        "serial": format(cert.serial_number, "x"),
        "not_before": cert.not_valid_before_utc.isoformat(),
        "not_after": cert.not_valid_after_utc.isoformat(),
        "ca": ca,
        "member": member_ids(cert),
        "names": names,
        "usage": usage,
        "sha256": cert.fingerprint(hashes.SHA256()).hex(),
    }
