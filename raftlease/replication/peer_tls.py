"""Mutual TLS between members (docs/security.md, "Peers"): the contexts, built from
the cluster CA, this member's certificate and key and an optional revocation list,
and one TLS session per peer connection, run as a byte transform over two
``ssl.MemoryBIO`` objects (what asyncio's own ``sslproto`` does).

PySyncObj's poller drives plain non-blocking sockets itself. A TLS socket there would
need its handshake and want-read/want-write states inside PySyncObj's read and write
paths; an ``ssl.SSLObject`` needs neither: the connection (peers.py) feeds it the
bytes it received and sends the bytes it produced, at the seam where it frames
messages. OpenSSL does the record layer, the handshake and the certificate checks.

What a member accepts: TLS 1.3 only, both ends present a certificate that chains to
the cluster CA (``peer_ca_file``), is not expired, not revoked (``peer_crl_file``),
and carries the extended key usage of its role; the transport (transport.py) then
takes a connection as member n2 only if the verified certificate names n2
(``urn:raftlease:member:n2``, pki.py) and, on the accepting side, the connection's
first frame is n2's raft address. No session tickets (a resumed session would skip
the certificate checks of a reload).

Threads: ``load_peer_tls`` does blocking file reads (start-up, SIGHUP on the event
loop); a ``PeerTLS`` is immutable and is swapped whole by the transport on the tick
thread; a ``TlsSession`` belongs to one connection on the tick thread.
"""

from __future__ import annotations

import datetime
import logging
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from ..errors import ConfigError
from ..pki import (
    describe_subject,
    load_certificates,
    load_crls,
    member_ids,
    member_ids_of_peercert,
)

log = logging.getLogger("raftlease.replication")

#: Most bytes a peer may send before its TLS handshake completes (a handshake with a
#: certificate chain is a few KiB): beyond it the connection is closed.
MAX_HANDSHAKE_BYTES = 64 * 1024
#: A member certificate that expires within this many days is warned about at start
#: and at each reload.
EXPIRY_WARNING_DAYS = 30


@dataclass(frozen=True)
class PeerTLS:
    """The TLS side of this member's peer connections, as read from its files.

    ``server`` and ``client``: contexts for accepted and dialled connections.
    ``cas``: the CA certificates (DER) and ``revoked``: serial numbers of the
    revocation list, used to check the connections that are already open when a
    reload changes them (``admits``). ``serial``, ``not_after``: this member's own
    certificate."""

    node_id: str
    server: ssl.SSLContext
    client: ssl.SSLContext
    cas: tuple[x509.Certificate, ...]
    revoked: frozenset[int]
    serial: int
    not_after: datetime.datetime

    def admits(self, certificate_der: bytes) -> str | None:
        """Why a peer's certificate (DER, the leaf of an open connection) would not
        be accepted now, or None if it would: issued directly by one of ``cas``, not
        revoked, not expired. (Only the leaf of an open connection is known, so a
        leaf whose issuer is an intermediate not in the CA file counts as not.)"""
        try:
            leaf = x509.load_der_x509_certificate(certificate_der)
        except ValueError:
            return "its certificate cannot be read"
        if leaf.serial_number in self.revoked:
            return f"its certificate (serial {leaf.serial_number:x}) is revoked"
        if leaf.not_valid_after_utc <= datetime.datetime.now(datetime.UTC):
            return "its certificate has expired"
        for ca in self.cas:
            try:
                leaf.verify_directly_issued_by(ca)
            except (InvalidSignature, ValueError, TypeError):
                continue
            return None
        return "its certificate is not issued by a CA of peer_ca_file"

    def describe(self) -> dict[str, Any]:
        """What ``status`` shows of it (no secret)."""
        return {
            "serial": format(self.serial, "x"),
            "not_after": self.not_after.isoformat(),
            "cas": len(self.cas),
            "revoked": len(self.revoked),
        }


def _check_private(path: Path) -> None:
    """A key file that anyone on the host can read is refused (group-readable is
    allowed: Kubernetes mounts secrets for the pod's fsGroup that way)."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"cannot read the peer key {str(path)!r}: {exc.strerror}") from None
    if mode & stat.S_IRWXO:
        raise ConfigError(
            f"the peer key {str(path)!r} is readable by every user (mode "
            f"{stat.S_IMODE(mode):o}); run: chmod 600 {path}"
        )


def load_peer_tls(
    node_id: str, ca_file: str, cert_file: str, key_file: str, crl_file: str = ""
) -> PeerTLS:
    """The peer TLS of member ``node_id`` from its files. Blocks on file reads.

    Raises ``ConfigError`` (naming the file and what to do) if a file is missing,
    unreadable or malformed, the key is readable by every user or does not match
    the certificate, the certificate does not name ``node_id``
    (``urn:raftlease:member:<id>``), has expired or is not issued by a CA of
    ``ca_file``, or the revocation file holds a list not signed by one of them, lacks
    the list of one of them, or holds a list past its next update."""
    if not (ca_file and cert_file and key_file):
        raise ConfigError(
            "peer TLS is not configured: set peer_ca_file, peer_cert_file and "
            "peer_key_file (every member's certificate is signed by the cluster CA and "
            "names its node id). Make them with `raftlease certs init --dir certs` and "
            f"`raftlease certs node {node_id} --dir certs --host <its address>` "
            "(docs/deployment.md); `raftlease up` makes them for a local cluster"
        )
    cas = tuple(load_certificates(Path(ca_file), "peer CA file"))
    own = load_certificates(Path(cert_file), "peer certificate")[0]
    named = member_ids(own)
    if node_id not in named:
        raise ConfigError(
            f"the peer certificate {cert_file!r} names "
            + (f"member(s) {', '.join(named)}" if named else "no member")
            + f", not this node {node_id!r} (a member certificate carries the URI "
            f"urn:raftlease:member:{node_id}; make one with `raftlease certs node "
            f"{node_id}`)"
        )
    now = datetime.datetime.now(datetime.UTC)
    if own.not_valid_after_utc <= now:
        raise ConfigError(
            f"the peer certificate {cert_file!r} expired on "
            f"{own.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: issue a new one"
        )
    if own.not_valid_after_utc - now < datetime.timedelta(days=EXPIRY_WARNING_DAYS):
        log.warning(
            "the peer certificate %s expires on %s UTC: issue a new one and reload (SIGHUP)",
            cert_file,
            f"{own.not_valid_after_utc:%Y-%m-%d %H:%M}",
        )
    if not any(_issued_by(own, ca) for ca in cas):
        raise ConfigError(
            f"the peer certificate {cert_file!r} is not issued by a CA of {ca_file!r}"
        )
    _check_private(Path(key_file))
    revoked: frozenset[int] = frozenset()
    if crl_file:
        serials: set[int] = set()
        listed: set[int] = set()  # indexes in ``cas`` of the CAs with a list
        for crl in load_crls(Path(crl_file)):
            signers = {
                i
                for i, ca in enumerate(cas)
                if crl.is_signature_valid(ca.public_key())  # type: ignore[arg-type]
            }
            if not signers:
                raise ConfigError(
                    f"the revocation list {crl_file!r} holds a list not signed by a CA of "
                    f"{ca_file!r}"
                )
            listed |= signers
            # OpenSSL refuses every certificate a list covers once the list is past
            # its next update ("CRL has expired"): a member taking such a file would
            # be cut off from every peer at its next connection.
            next_update = crl.next_update_utc
            if next_update is not None and next_update <= now:
                raise ConfigError(
                    f"the revocation list {crl_file!r} expired on "
                    f"{next_update:%Y-%m-%d %H:%M} UTC (its next update): re-sign it "
                    "(raftlease certs revoke re-signs the list it adds to)"
                )
            if next_update is not None and next_update - now < datetime.timedelta(
                days=EXPIRY_WARNING_DAYS
            ):
                log.warning(
                    "the revocation list %s expires on %s UTC (its next update): re-sign it "
                    "and reload (SIGHUP) before then, or every peer it covers is refused",
                    crl_file,
                    f"{next_update:%Y-%m-%d %H:%M}",
                )
            serials.update(r.serial_number for r in crl)
        # OpenSSL checks each peer's certificate against the list of the CA that
        # issued it and refuses it if there is none: a CA without a list would be
        # trusted in name only (a CA rotation's new certificates refused at their
        # first connection). Say so now instead.
        for i, ca in enumerate(cas):
            if i not in listed:
                raise ConfigError(
                    f"the revocation list {crl_file!r} holds no list of the CA "
                    f"{describe_subject(ca)!r} of {ca_file!r}: every certificate it issued "
                    "would be refused; add that CA's list to the file (one list per CA)"
                )
        revoked = frozenset(serials)
        if own.serial_number in revoked:
            raise ConfigError(f"the peer certificate {cert_file!r} is revoked by {crl_file!r}")
    server = _context(ssl.PROTOCOL_TLS_SERVER, ca_file, cert_file, key_file, crl_file)
    client = _context(ssl.PROTOCOL_TLS_CLIENT, ca_file, cert_file, key_file, crl_file)
    return PeerTLS(
        node_id, server, client, cas, revoked, own.serial_number, own.not_valid_after_utc
    )


def _issued_by(leaf: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        leaf.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def _context(
    protocol: int, ca_file: str, cert_file: str, key_file: str, crl_file: str
) -> ssl.SSLContext:
    context = ssl.SSLContext(protocol)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.maximum_version = ssl.TLSVersion.TLSv1_3
    # Members are checked by the member URI of their certificate (the transport),
    # not by a host name: a member's raft address may be an IP, a name, a proxy.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot use the peer certificate {cert_file!r} with the key {key_file!r} "
            f"({getattr(exc, 'reason', None) or exc}): is the key this certificate's?"
        ) from None
    try:
        context.load_verify_locations(cafile=ca_file)
        if crl_file:
            # A PEM file of CRLs loads like a CA file (OpenSSL's cert-or-CRL reader);
            # with the flag, every peer's leaf certificate is checked against it.
            context.load_verify_locations(cafile=crl_file)
            context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load {ca_file!r} / {crl_file!r}: {exc}") from None
    if protocol == ssl.PROTOCOL_TLS_SERVER:
        context.num_tickets = 0  # no resumption: every connection is checked in full
    return context


class TlsSession:
    """The TLS state of one peer connection: an ``ssl.SSLObject`` between two memory
    buffers. ``incoming``: bytes received from the socket, not yet consumed by
    OpenSSL; ``outgoing``: bytes OpenSSL produced, to be sent. ``done``: the
    handshake completed (the peer's certificate is verified); ``received``: bytes
    received before that (bounded by ``MAX_HANDSHAKE_BYTES``); ``pending``: frames
    sent before that, written once it completes. Tick thread only."""

    __slots__ = ("done", "incoming", "obj", "outgoing", "peer_ids", "pending", "received")

    def __init__(self, context: ssl.SSLContext, server_side: bool) -> None:
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_side=server_side)
        self.done = False
        self.received = 0
        self.pending = bytearray()
        #: The member ids the verified peer certificate names (set when ``done``).
        self.peer_ids: list[str] = []

    def finish_handshake(self) -> None:
        """Record what the completed handshake verified."""
        self.done = True
        self.peer_ids = member_ids_of_peercert(self.obj.getpeercert())

    def peer_der(self) -> bytes | None:
        """The peer's certificate (DER), once the handshake is done."""
        if not self.done:
            return None
        der: bytes | None = self.obj.getpeercert(binary_form=True)
        return der
