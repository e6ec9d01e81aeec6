"""Reloading a node's security files without a restart, and what a reload answers
(docs/security.md, "Rotating client credentials without a restart"): the client
port's TLS context (``client_tls_context``), a listener's TLS served from the files of
the last reload (``LiveTLS``), and the reload of the auth file, the client-port TLS
files and the peer TLS files (``SecurityReload``, on ``SIGHUP`` or the ``reload``
operation).

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.serialization import Encoding

from ..config import NodeConfig
from ..errors import ConfigError
from ..replication import Replica
from .auth import AuthPolicy, load_auth
from .connections import ClientPort

log = logging.getLogger("raftlease.server")  # the node's logger, as before the split


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


def _log_peer_cutoff(closed: int) -> None:
    """Tick thread, after a peer TLS reload: how many peer connections it closed."""
    if closed:
        log.warning("peer TLS reload closed %d peer connection(s) it no longer admits", closed)


def client_tls_context(config: NodeConfig) -> ssl.SSLContext | None:
    """TLS for the client port (tls_cert_file); with tls_client_ca_file, client
    certificates it signed are verified (optional: a token also authenticates).
    Raises ``ConfigError`` if a file cannot be loaded."""
    if not config.tls_cert_file:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
        if config.tls_client_ca_file:
            context.load_verify_locations(config.tls_client_ca_file)
            context.verify_mode = ssl.CERT_OPTIONAL
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the client-port TLS files: {exc}") from None
    return context


class SecurityReload:
    """``SIGHUP`` and the ``reload`` operation of one node (docs/security.md): the
    auth file, the client-port TLS files (every listener that serves them: the client
    port, the admin endpoint) and the peer TLS files, read again. Owned by
    ``NodeServer``, which hands it the client port (whose connections an auth reload
    re-checks), ``replica`` (None before it exists) and ``on_auth`` (gives a new
    auth policy to the admin endpoint and the dashboard). Event loop only."""

    def __init__(
        self,
        config: NodeConfig,
        port: ClientPort,
        *,
        replica: Callable[[], Replica | None],
        on_auth: Callable[[AuthPolicy], None],
    ) -> None:
        self.config = config
        self._port = port
        self._replica = replica
        self._on_auth = on_auth
        #: The TLS listeners a reload loads new files into.
        self.live_tls: list[LiveTLS] = []

    def listener_context(self) -> ssl.SSLContext | None:
        """The TLS context a new listener starts with (None without tls_cert_file);
        a reload replaces the context its new handshakes use. Raises ``ConfigError``
        if a file cannot be loaded."""
        context = client_tls_context(self.config)
        if context is not None:
            self.live_tls.append(LiveTLS(context, self.config.tls_client_ca_file))
        return context

    def reload(self) -> bool:
        """``SIGHUP`` (event loop): read the auth file, the client-port TLS files and
        the peer TLS files again. A file that fails to load is refused with an
        error log line and what was in force stays so. With a new auth file every
        open connection is checked against it: one whose principal is gone, or that
        authenticated with a token the file no longer holds (and has no client
        certificate naming it), is closed; the others get their principal's new
        roles. New TLS files serve new handshakes (existing TLS connections keep
        theirs). New peer TLS files serve new peer connections, and an open peer
        connection whose certificate they no longer admit (revoked, its CA gone) is
        closed at once. Never raises; returns whether everything was applied."""
        ok = True
        if self.config.auth_file:
            try:
                policy = load_auth(Path(self.config.auth_file))
            except ConfigError as exc:
                log.error("reload refused: %s; the previous auth policy stays in force", exc)
                ok = False
            else:
                self._on_auth(policy)  # the admin endpoint's and the dashboard's
                closed = self._port.adopt_policy(policy)
                log.info(
                    "reloaded the auth file: %d principals, %d pinned shapes; %d "
                    "connections closed",
                    len(policy.principals),
                    len(policy.shape_keys) + len(policy.shape_prefixes),
                    closed,
                )
        if self.live_tls:
            try:
                # Fresh contexts from the files, all built before any is used: all or
                # nothing. (OpenSSL cannot remove a CA from a live context.)
                fresh = [client_tls_context(self.config) for _ in self.live_tls]
            except ConfigError as exc:
                log.error("reload refused: %s; the previous TLS files stay in force", exc)
                ok = False
            else:
                removed = False
                for live, context in zip(self.live_tls, fresh, strict=True):
                    assert context is not None  # _live_tls is only filled with TLS on
                    removed |= live.replace(context, self.config.tls_client_ca_file)
                closed = self._port.close_untrusted(self.live_tls[0].trusted) if removed else 0
                log.info("reloaded the client-port TLS files; %d connections closed", closed)
        replica = self._replica()
        if replica is not None:  # before it exists, it reads the files when made
            # New certificates, CAs or revocations (docs/security.md, "Rotating peer
            # certificates"): all files or none; the cut-off runs on the tick thread.
            try:
                loaded = replica.reload_peer_tls(_log_peer_cutoff)
            except ConfigError as exc:
                log.error("reload refused: %s; the previous peer TLS files stay in force", exc)
                ok = False
            else:
                log.info(
                    "reloaded the peer TLS files: certificate serial %s valid until %s, "
                    "%s CA(s), %s revoked",
                    loaded.get("serial"),
                    loaded.get("not_after"),
                    loaded.get("cas"),
                    loaded.get("revoked"),
                )
        return ok

    def reload_op(self) -> dict[str, Any]:
        """The ``reload`` operation (admin): what ``SIGHUP`` does, on this node, and
        whether every file was taken (``errors``: why not). Event loop; never raises.
        A connection the new auth file no longer admits is closed, the caller's too."""
        refusals = RefusalLog()
        log.addHandler(refusals)
        try:
            reloaded = self.reload()
        finally:
            log.removeHandler(refusals)
        return {"node": self.config.node_id, "reloaded": reloaded, "errors": refusals.messages}
