"""Mutual TLS on peer connections, in one process (peers.py, peer_tls.py): two of our
connections over a socket pair, each with its member's TLS contexts, driven by
PySyncObj's own poller. What a connection lets through, what it buffers before and
after the handshake, and what the files it is built from must be.

The same, between real node processes: tests/integration/test_peer_tls_cluster.py.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pysyncobj.poller import PollPoller
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection

from raftlease import pki
from raftlease.errors import ConfigError
from raftlease.replication.peer_tls import MAX_HANDSHAKE_BYTES, PeerTLS, TlsSession, load_peer_tls
from raftlease.replication.peers import BoundedTcpConnection, zlib_frame
from raftlease.testing.certs import ClusterCerts

pytestmark = pytest.mark.timeout(30)

MESSAGES = [
    {"type": "append_entries", "term": 3, "entries": [(b"x" * 300, 7, 3)]},
    {"type": "next_node_idx", "next_node_idx": 8, "success": True},
    {"type": "append_entries", "term": 3, "entries": [(os.urandom(40_000), 8, 3)]},
]


@pytest.fixture
def certs(tmp_path: Path) -> ClusterCerts:
    return ClusterCerts(tmp_path / "certs")


class Pair:
    """A dialer and an acceptor connection over a socket pair, each ours, each with
    a TLS session of its own member's contexts (or none: ``None``)."""

    def __init__(
        self,
        dialer_tls: PeerTLS | None,
        acceptor_tls: PeerTLS | None,
        limit: int = 1 << 20,
    ) -> None:
        left, right = socket.socketpair()
        left.setblocking(False)
        right.setblocking(False)
        self.poller = PollPoller()
        self.received: list[Any] = []
        self.verified: dict[str, list[str]] = {}
        self.dialer = self._conn(left, None)
        self.acceptor = self._conn(right, self.received.append)
        self.acceptor.rl_start_tls(
            acceptor_tls.server if acceptor_tls else None,
            True,
            self._on("acceptor"),
            limit,
        )
        self.dialer.rl_start_tls(
            dialer_tls.client if dialer_tls else None, False, self._on("dialer"), limit
        )

    def _conn(self, sock: socket.socket, on_message: Callable[[Any], None] | None) -> Any:
        conn = TcpConnection(self.poller, socket=sock, onMessageReceived=on_message)
        conn.__class__ = BoundedTcpConnection
        return conn

    def _on(self, side: str) -> Callable[[TlsSession], None]:
        def verified(session: TlsSession) -> None:
            self.verified[side] = list(session.peer_ids)

        return verified

    def pump(self, until: Callable[[], bool], seconds: float = 5.0) -> bool:
        deadline = time.monotonic() + seconds
        while not until():
            if time.monotonic() > deadline:
                return False
            self.poller.poll(0.02)
        return True

    def closed(self, conn: Any) -> bool:
        return bool(conn.state == CONNECTION_STATE.DISCONNECTED)

    def close(self) -> None:
        self.dialer.disconnect()
        self.acceptor.disconnect()


@pytest.fixture
def pairs() -> Iterator[list[Pair]]:
    made: list[Pair] = []
    yield made
    for pair in made:
        pair.close()


def test_members_verify_each_other_and_frames_pass_inside_tls(
    certs: ClusterCerts, pairs: list[Pair]
) -> None:
    pair = Pair(certs.peer_tls("n1"), certs.peer_tls("n2"))
    pairs.append(pair)
    for message in MESSAGES:  # sent before the handshake: held until it completes
        pair.dialer.send(message)
    assert pair.pump(lambda: len(pair.received) == len(MESSAGES))
    assert pair.received == MESSAGES
    # Each side saw the member its peer's certificate names.
    assert pair.verified == {"dialer": ["n2"], "acceptor": ["n1"]}
    assert pair.acceptor._rl_tls.obj.version() == "TLSv1.3"


def test_plain_peers_exist_only_when_both_ends_ask_for_them(pairs: list[Pair]) -> None:
    """The test build's baseline (``plain_peers``): no TLS at all, frames as PySyncObj's."""
    pair = Pair(None, None)
    pairs.append(pair)
    for message in MESSAGES:
        pair.dialer.send(message)
    assert pair.pump(lambda: len(pair.received) == len(MESSAGES))
    assert pair.received == MESSAGES


def test_a_connection_without_a_session_takes_nothing(certs: ClusterCerts) -> None:
    """Fail closed: a connection of ours that never started TLS (no plain mode either)
    closes at the first byte it reads and sends nothing."""
    left, right = socket.socketpair()
    right.setblocking(False)
    poller = PollPoller()
    received: list[Any] = []
    conn = TcpConnection(poller, socket=right, onMessageReceived=received.append)
    conn.__class__ = BoundedTcpConnection
    conn.send({"type": "append_entries"})  # no session: nothing may leave
    left.setblocking(False)
    with pytest.raises(BlockingIOError):
        left.recv(10)
    left.sendall(struct.pack("i", 20) + zlib_frame(b"plain pickle bytes"))
    deadline = time.monotonic() + 5
    while conn.state != CONNECTION_STATE.DISCONNECTED and time.monotonic() < deadline:
        poller.poll(0.02)
    assert conn.state == CONNECTION_STATE.DISCONNECTED and received == []
    left.close()


def test_a_stranger_without_tls_reaches_no_parser(certs: ClusterCerts, pairs: list[Pair]) -> None:
    """PySyncObj's own plain frame (a pickle that would run code) sent to a member:
    the handshake fails on it and nothing is parsed."""
    pair = Pair(None, certs.peer_tls("n2"))
    pairs.append(pair)
    pair.dialer._rl_plain_ok = True
    pair.dialer.send({"type": "append_entries", "term": 99})
    assert pair.pump(lambda: pair.closed(pair.acceptor))
    assert pair.received == [] and "acceptor" not in pair.verified


def test_a_certificate_of_another_ca_is_refused(tmp_path: Path, pairs: list[Pair]) -> None:
    ours = ClusterCerts(tmp_path / "ours")
    theirs = ClusterCerts(tmp_path / "theirs")
    for dialer, acceptor in ((theirs, ours), (ours, theirs)):
        pair = Pair(dialer.peer_tls("n1"), acceptor.peer_tls("n2"))
        pairs.append(pair)
        pair.dialer.send(MESSAGES[0])
        assert pair.pump(lambda p=pair: p.closed(p.acceptor) or p.closed(p.dialer))
        pair.pump(lambda p=pair: p.closed(p.acceptor) and p.closed(p.dialer), 2.0)
        assert pair.received == []
        # Neither side counted the other verified with a name.
        assert not (pair.verified.get("acceptor") and pair.verified.get("dialer"))


def test_a_client_certificate_of_the_same_ca_names_no_member(
    certs: ClusterCerts, tmp_path: Path, pairs: list[Pair]
) -> None:
    """The client port may share the CA: a client certificate (its common name a
    principal, possibly "n1") must not pass as member n1. OpenSSL refuses its use as a
    server (no serverAuth), and as a dialer it verifies but names no member, which
    the transport refuses (tests/integration/test_peer_tls_cluster.py)."""
    cert, key = pki.issue(certs.ca, tmp_path / "clients", "n1", client=True)
    assert pki.member_ids(pki.load_certificates(cert)[0]) == []
    # As the acceptor: the dialing member's OpenSSL refuses it (purpose check).
    impostor = _raw_tls(certs.ca.cert_file, cert, key)
    pair = Pair(certs.peer_tls("n2"), impostor)
    pairs.append(pair)
    assert pair.pump(lambda: pair.closed(pair.dialer))
    assert "dialer" not in pair.verified
    # As a dialer: verified by the CA, but it names no member.
    pair = Pair(impostor, certs.peer_tls("n2"))
    pairs.append(pair)
    assert pair.pump(lambda: "acceptor" in pair.verified or pair.closed(pair.acceptor))
    assert pair.verified.get("acceptor", []) == []


def _raw_tls(ca_file: Path, cert: Path, key: Path) -> PeerTLS:
    """A PeerTLS built around any certificate (load_peer_tls would refuse one that
    names no member): for impostors."""
    contexts = []
    for protocol in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        context = ssl.SSLContext(protocol)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.check_hostname = False
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_cert_chain(cert, key)
        context.load_verify_locations(cafile=ca_file)
        contexts.append(context)
    leaf = pki.load_certificates(cert)[0]
    return PeerTLS(
        "impostor",
        contexts[0],
        contexts[1],
        tuple(pki.load_certificates(ca_file)),
        frozenset(),
        leaf.serial_number,
        leaf.not_valid_after_utc,
    )


def test_at_most_a_handshakes_worth_is_taken_before_it_completes(
    certs: ClusterCerts,
) -> None:
    """A stranger streaming bytes that never finish a handshake (here: a TLS record
    header announcing a huge handshake, then filler) is cut off after
    ``MAX_HANDSHAKE_BYTES``, never buffered beyond that."""
    left, right = socket.socketpair()
    right.setblocking(False)
    poller = PollPoller()
    conn = TcpConnection(poller, socket=right)
    conn.__class__ = BoundedTcpConnection
    conn.rl_start_tls(certs.peer_tls("n2").server, True, lambda s: None, 1 << 20)
    # A ClientHello record header claiming 16 KiB, and 16 KiB records after it.
    left.setblocking(False)
    sent = 0
    record = b"\x16\x03\x01\x40\x00" + b"\x01" * 0x4000
    deadline = time.monotonic() + 10
    while conn.state != CONNECTION_STATE.DISCONNECTED and time.monotonic() < deadline:
        try:
            sent += left.send(record)
        except BlockingIOError:
            pass
        except OSError:
            break
        poller.poll(0.01)
    assert conn.state == CONNECTION_STATE.DISCONNECTED
    assert sent <= 8 * MAX_HANDSHAKE_BYTES  # closed early (socket buffers hold the rest)
    left.close()


def test_a_frame_over_the_limit_closes_before_its_body_is_buffered(
    certs: ClusterCerts, pairs: list[Pair]
) -> None:
    """After the handshake a member announces a frame longer than ``max_peer_frame``:
    the connection closes as soon as the length is read."""
    pair = Pair(certs.peer_tls("n1"), certs.peer_tls("n2"), limit=64 * 1024)
    pairs.append(pair)
    pair.dialer.send(MESSAGES[1])
    assert pair.pump(lambda: len(pair.received) == 1)
    session = pair.dialer._rl_tls
    session.obj.write(struct.pack("i", 2**31 - 1) + b"\x00" * 1000)
    pair.dialer._rl_flush(session)
    assert pair.pump(lambda: pair.closed(pair.acceptor))
    assert len(pair.received) == 1


class _MakesADirectory:
    """Unpickled by a plain ``pickle.loads``, this runs ``os.mkdir(path)``."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, (self.path,))


def test_a_frame_naming_a_callable_is_refused_and_never_run(
    certs: ClusterCerts, pairs: list[Pair], tmp_path: Path
) -> None:
    """Any holder of a certificate of the cluster CA (a client's, a not-yet-added
    node's) gets its first frame parsed. A pickle may name any callable: a frame that
    names one (here ``os.mkdir``) is refused before anything is built from it, the
    connection closes, and nothing ran. Builtin values still pass (MESSAGES)."""
    pair = Pair(certs.peer_tls("n1"), certs.peer_tls("n2"))
    pairs.append(pair)
    pair.dialer.send(MESSAGES[0])
    assert pair.pump(lambda: len(pair.received) == 1)
    marker = tmp_path / "ran"
    body = zlib_frame(pickle.dumps(_MakesADirectory(marker), 2))
    session = pair.dialer._rl_tls
    session.obj.write(struct.pack("i", len(body)) + body)
    pair.dialer._rl_flush(session)
    assert pair.pump(lambda: pair.closed(pair.acceptor))
    assert not marker.exists()
    assert len(pair.received) == 1


def test_the_read_loop_stops_at_each_whole_frame(certs: ClusterCerts, pairs: list[Pair]) -> None:
    """One read event buffers at most one frame and one socket read: many frames
    queued at once are parsed as they come, not all read first."""
    pair = Pair(certs.peer_tls("n1"), certs.peer_tls("n2"))
    pairs.append(pair)
    assert pair.pump(lambda: "acceptor" in pair.verified)
    biggest = 0
    original = pair.acceptor._rl_want_more

    def watch() -> bool:
        nonlocal biggest
        plain = pair.acceptor._rl_plain
        if plain is not None:
            biggest = max(biggest, len(plain) - pair.acceptor._rl_pos)
        return bool(original())

    pair.acceptor._rl_want_more = watch
    message = {"type": "append_entries", "entries": [(b"y" * 20_000, 1, 1)]}
    for _ in range(50):
        pair.dialer.send(message)
    assert pair.pump(lambda: len(pair.received) == 50, 10.0)
    # Each frame is about 20 KiB, a read at most the socket's receive size.
    assert biggest < 20_100 + 2 * 65536


# ------------------------------------------------------------------ the files


def test_a_members_files_are_checked_at_load(certs: ClusterCerts, tmp_path: Path) -> None:
    files = certs.settings("n1")
    ca, cert, key = files["peer_ca_file"], files["peer_cert_file"], files["peer_key_file"]
    assert load_peer_tls("n1", ca, cert, key).node_id == "n1"
    with pytest.raises(ConfigError, match="peer TLS is not configured"):
        load_peer_tls("n1", "", "", "")
    with pytest.raises(ConfigError, match=r"names member\(s\) n1, not this node 'n2'"):
        load_peer_tls("n2", ca, cert, key)
    other = ClusterCerts(tmp_path / "other")
    with pytest.raises(ConfigError, match="not issued by a CA"):
        load_peer_tls("n1", str(other.ca.cert_file), cert, key)
    _, other_key = other.member("n1")
    with pytest.raises(ConfigError, match="is the key this certificate's"):
        load_peer_tls("n1", ca, cert, str(other_key))
    os.chmod(key, 0o644)
    with pytest.raises(ConfigError, match="readable by every user"):
        load_peer_tls("n1", ca, cert, key)
    os.chmod(key, 0o640)  # group-readable (Kubernetes' fsGroup): allowed
    load_peer_tls("n1", ca, cert, key)
    with pytest.raises(ConfigError, match="cannot read"):
        load_peer_tls("n1", ca, str(tmp_path / "missing.pem"), key)
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="holds no PEM certificate"):
        load_peer_tls("n1", str(tmp_path / "junk.pem"), cert, key)


def test_an_expired_member_certificate_is_refused(certs: ClusterCerts, tmp_path: Path) -> None:
    ca = certs.ca
    key = ec.generate_private_key(ec.SECP256R1())
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "n1")]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(past - datetime.timedelta(days=1))
        .not_valid_after(past)
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(pki.member_uri("n1"))]),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    cert_file = pki.write_file(
        tmp_path / "old.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644
    )
    key_file = pki.write_file(
        tmp_path / "old.key",
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        0o600,
    )
    with pytest.raises(ConfigError, match="expired"):
        load_peer_tls("n1", str(ca.cert_file), str(cert_file), str(key_file))


def test_a_revocation_list_revokes_and_must_be_the_cas(certs: ClusterCerts, tmp_path: Path) -> None:
    files = certs.settings("n1")
    n2_cert, _ = certs.member("n2")
    crl = tmp_path / "crl.pem"
    assert pki.revoke(certs.ca, pki.load_certificates(n2_cert), crl) == 1
    tls = load_peer_tls(
        "n1", files["peer_ca_file"], files["peer_cert_file"], files["peer_key_file"], str(crl)
    )
    n2 = pki.load_certificates(n2_cert)[0]
    from cryptography.hazmat.primitives.serialization import Encoding

    assert "revoked" in (tls.admits(n2.public_bytes(Encoding.DER)) or "")
    n3_cert, _ = certs.member("n3")
    assert tls.admits(pki.load_certificates(n3_cert)[0].public_bytes(Encoding.DER)) is None
    # Its own certificate revoked: refused at load.
    pki.revoke(certs.ca, pki.load_certificates(Path(files["peer_cert_file"])), crl)
    with pytest.raises(ConfigError, match="is revoked"):
        load_peer_tls(
            "n1", files["peer_ca_file"], files["peer_cert_file"], files["peer_key_file"], str(crl)
        )
    # A list signed by another CA: refused.
    other = ClusterCerts(tmp_path / "other")
    foreign = tmp_path / "foreign.pem"
    pki.revoke(other.ca, [pki.load_certificates(other.member("x")[0])[0]], foreign)
    with pytest.raises(ConfigError, match="not signed by a CA"):
        load_peer_tls(
            "n3",
            files["peer_ca_file"],
            str(n3_cert),
            str(certs.member("n3")[1]),
            str(foreign),
        )


def test_a_revoked_member_is_refused_by_the_handshake(
    certs: ClusterCerts, tmp_path: Path, pairs: list[Pair]
) -> None:
    crl = tmp_path / "crl.pem"
    pki.revoke(certs.ca, pki.load_certificates(certs.member("n1")[0]), crl)
    files = certs.settings("n2")
    guarded = load_peer_tls(
        "n2", files["peer_ca_file"], files["peer_cert_file"], files["peer_key_file"], str(crl)
    )
    pair = Pair(certs.peer_tls("n1"), guarded)
    pairs.append(pair)
    pair.dialer.send(MESSAGES[0])
    assert pair.pump(lambda: pair.closed(pair.acceptor))
    assert pair.received == [] and "acceptor" not in pair.verified
