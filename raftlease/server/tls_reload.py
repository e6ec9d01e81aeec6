"""Reloading a listener's TLS without a restart, and what a reload answers
(docs/security.md, "Rotating client credentials without a restart").

asyncio keeps the ``SSLContext`` a server was started with for good, and OpenSSL can
add CAs to a live context but never remove one. So the context a listener was started
with (``LiveTLS.listener``) only selects: its SNI callback, which OpenSSL calls during
every ClientHello (with or without a server name), moves the handshake to
``LiveTLS.current``, a context built from the files at the last reload. A handshake
then sends that context's certificate and verifies the client's certificate against
that context's CAs, so a CA removed from ``tls_client_ca_file`` is refused from the
next connection on.

Session resumption would skip that verification (the peer certificate comes from the
cached session), so the listener issues no TLS 1.3 tickets and no TLS 1.2 tickets, and
a TLS 1.2 handshake that resumes a cached session id is aborted with a fatal alert
(which also drops that session from the cache: the client's next attempt is a full
handshake). raftlease's own clients never resume.

Threads: the SNI callback runs inside OpenSSL on the event loop thread (asyncio's SSL
protocol); everything else is called from the event loop. Blocking file reads.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.serialization import Encoding


class LiveTLS:
    """One TLS listener (the client port, the admin endpoint): ``listener`` is what
    the server was started with; ``current`` serves new handshakes."""

    def __init__(self, listener: ssl.SSLContext, ca_file: str = "") -> None:
        self.listener = listener
        self.current = listener
        #: The client CAs ``current`` trusts (DER), to find connections whose CA a
        #: reload removed.
        self.cas = client_cas(ca_file)
        listener.num_tickets = 0  # TLS 1.3: no resumption tickets
        listener.options |= ssl.OP_NO_TICKET  # TLS 1.2: no tickets either
        listener.sni_callback = self._select

    def _select(
        self, ssl_object: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext
    ) -> int | None:
        """OpenSSL's servername callback (every ClientHello): refuse a resumed TLS 1.2
        session, else hand the handshake to the current context."""
        if ssl_object.session_reused:
            return ssl.ALERT_DESCRIPTION_HANDSHAKE_FAILURE
        if ssl_object.context is not self.current:
            ssl_object.context = self.current
        return None

    def replace(self, context: ssl.SSLContext, ca_file: str = "") -> bool:
        """Serve new handshakes with ``context``. True if a CA trusted before is not
        trusted any more (open connections must then be checked: ``trusted``)."""
        cas = client_cas(ca_file)
        removed = not self.cas <= cas
        self.current, self.cas = context, cas
        return removed

    def trusted(self, certificate_der: bytes) -> bool:
        """Was this client certificate issued directly by a CA ``current`` trusts?
        (A leaf whose issuer is an intermediate not in the CA file counts as not: only
        the leaf of an open connection is known, so the safe answer is no.)"""
        try:
            leaf = x509.load_der_x509_certificate(certificate_der)
        except ValueError:
            return False
        for der in self.cas:
            try:
                leaf.verify_directly_issued_by(x509.load_der_x509_certificate(der))
            except (InvalidSignature, ValueError, TypeError):  # not this CA's
                continue
            return True
        return False


def client_cas(ca_file: str) -> frozenset[bytes]:
    """The certificates in a CA file, DER (empty without one, or if it cannot be read:
    loading the context already refused such a file)."""
    if not ca_file:
        return frozenset()
    try:
        certs = x509.load_pem_x509_certificates(Path(ca_file).read_bytes())
    except (OSError, ValueError):
        return frozenset()
    return frozenset(cert.public_bytes(Encoding.DER) for cert in certs)


class RefusalLog(logging.Handler):
    """Keeps the ``reload refused: ...`` messages logged while attached (the reload op
    answers them; every part of a reload says why it refused in that one form)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("reload refused: "):
            self.messages.append(message.removeprefix("reload refused: "))
