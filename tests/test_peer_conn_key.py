"""A key per peer connection, agreed in the signed hellos (issue 11, docs/security.md).

The dialer's hello and the acceptor's reply each carry an ephemeral X25519 public key
inside what is signed; both ends derive a key for that connection alone, and every
frame after the reply (both ways) is sealed with it. An insider holding only the
cluster secret who sits on the path between two running members can relay their
traffic but open none of it, and a frame it alters closes the connection.

Real node processes: the on-path relay below holds the cluster secret and tries to
open every frame it passes.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from raftlease.replication.identity import (
    HelloVerifier,
    connection_key,
    exchange_public,
    make_hello,
    make_reply,
    public_hex,
)
from raftlease.replication.peers import ConnectionCipher, PeerCipher
from raftlease.testing import LocalCluster, wait_for
from raftlease.testing.cluster import port_free
from tests.conftest import FAST_SETTINGS

SECRET = "s" * 64


def join_as_member(
    peer: Any,
    cipher_attr: str,
    key: Ed25519PrivateKey,
    dialer: str,
    dialer_id: str,
    acceptor: str,
    nonce: bytes | None = None,
) -> tuple[Any, ...]:
    """What an insider holding a member's own ``peer.key`` does (a test ``Peer`` of
    tests/test_peer_identity.py or test_peer_security.py, after its key exchange):
    send that member's signed hello with an ephemeral key, take the acceptor's
    reply and seal and open every later frame with the connection key (the peer's
    cipher attribute ``cipher_attr`` is replaced). Returns the hello sent."""
    private = X25519PrivateKey.generate()
    mine = exchange_public(private)
    hello = make_hello(key, dialer, dialer_id, acceptor, peer.their_key, nonce=nonce, exchange=mine)
    peer.send(hello)
    reply = peer.receive()
    conn = connection_key(private, reply[8], mine, reply[8], peer.my_key, peer.their_key)
    setattr(peer, cipher_attr, ConnectionCipher(getattr(peer, cipher_attr), conn))
    return hello


# ------------------------------------------------------------------ unit tests


@pytest.mark.timeout(30)
def test_both_ends_derive_one_key_and_a_relay_with_the_secret_opens_nothing() -> None:
    cluster = PeerCipher(SECRET)
    dialer, acceptor = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    d_rand, a_rand = b"d" * 32, b"a" * 32
    d_pub, a_pub = exchange_public(dialer), exchange_public(acceptor)
    key_d = connection_key(dialer, a_pub, d_pub, a_pub, d_rand, a_rand)
    key_a = connection_key(acceptor, d_pub, d_pub, a_pub, d_rand, a_rand)
    assert key_d == key_a and len(key_d) == 32
    # Another connection's random keys, or another ephemeral key: another key.
    assert connection_key(dialer, a_pub, d_pub, a_pub, a_rand, d_rand) != key_d
    other = X25519PrivateKey.generate()
    assert connection_key(other, a_pub, exchange_public(other), a_pub, d_rand, a_rand) != key_d

    sealer, opener = ConnectionCipher(cluster, key_d), ConnectionCipher(cluster, key_a)
    token = sealer.encrypt_at_time(b"lease ids", 7)
    assert opener.decrypt(token) == b"lease ids"
    assert opener.extract_timestamp(token) == 7
    # The cluster secret alone (the relay) opens nothing; the frame names the cluster
    # secret's key id, so a rotation refuses it as it refuses any frame.
    with pytest.raises(Exception):  # noqa: B017 (InvalidTag)
        cluster.decrypt(token)
    assert token[8:12] == cluster.encrypt_at_time(b"", 0)[8:12]
    altered = token[:-1] + bytes([token[-1] ^ 1])
    with pytest.raises(Exception):  # noqa: B017
        opener.decrypt(altered)
    # Another connection's key opens nothing either.
    with pytest.raises(Exception):  # noqa: B017
        ConnectionCipher(cluster, bytes(32)).decrypt(token)
    # The cluster's rekey applies under the connection key too (rolling rotation).
    cluster.rekey(f"{'t' * 64}\n{SECRET}\n")
    newer = sealer.encrypt_at_time(b"x", 8)
    assert newer[8:12] != token[8:12]
    assert opener.decrypt(newer) == b"x" and opener.decrypt(token) == b"lease ids"
    cluster.rekey("t" * 64)
    with pytest.raises(ValueError, match="not accepted here"):
        opener.decrypt(token)


@pytest.mark.timeout(30)
def test_the_exchange_keys_are_signed() -> None:
    """A relay cannot swap the ephemeral keys: they are inside the signatures."""
    n1, n2 = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    members = {"127.0.0.1:1": ("n1", [public_hex(n1)]), "127.0.0.1:2": ("n2", [public_hex(n2)])}
    bind = b"b" * 32
    mine, theirs = (exchange_public(X25519PrivateKey.generate()) for _ in range(2))
    hello = make_hello(n1, "127.0.0.1:1", "n1", "127.0.0.1:2", bind, exchange=mine)
    assert hello[8] == mine
    acceptor = HelloVerifier("127.0.0.1:2", members.get)
    with pytest.raises(Exception, match="not signed"):
        acceptor.verify((*hello[:8], theirs), bind)
    assert acceptor.verify(hello, bind) == "127.0.0.1:1"
    reply = make_reply(n2, "127.0.0.1:2", "n2", "n1", bind, exchange=mine)
    dialer = HelloVerifier("127.0.0.1:1", members.get)
    with pytest.raises(Exception, match="not signed"):
        dialer.verify_reply((*reply[:8], theirs), "127.0.0.1:2", "n1", bind)
    dialer.verify_reply(reply, "127.0.0.1:2", "n1", bind)
    with pytest.raises(Exception, match="malformed"):
        dialer.verify_reply((*reply[:8], b"short"), "127.0.0.1:2", "n1", bind)


# ------------------------------------------------------------ the on-path relay


@dataclass
class Direction:
    """What the relay saw one way of one connection: per frame, whether the cluster
    secret opened it."""

    opened: list[bool] = field(default_factory=list)


class Relay:
    """An insider on the path from a dialing member to an accepting one, holding the
    cluster secret: it passes every byte on, tries to open every frame with the
    secret, and (``tamper``) flips the last byte of the dialer's frame number
    ``tamper`` on the first connection that gets that far (``tampered``: its index;
    ``closed`` is set when that connection ends)."""

    def __init__(
        self, port: int, upstream: tuple[str, int], secret: Path, tamper: int = -1
    ) -> None:
        self.secret = secret  # read at each connection: the first node creates it
        self.cipher: PeerCipher | None = None
        self.upstream = upstream
        self.tamper = tamper
        self.listener = socket.create_server(("127.0.0.1", port))
        self.lock = threading.Lock()
        self.connections: list[tuple[Direction, Direction]] = []  # (to acceptor, back)
        self.closed = threading.Event()
        self.tampered: int | None = None
        self.threads: list[threading.Thread] = []
        self.sockets: list[socket.socket] = []
        self.stopping = False

    def start(self) -> Relay:
        self._spawn(self._accept)
        return self

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return  # stopped
            try:
                self.cipher = PeerCipher(self.secret.read_text())
                up = socket.create_connection(self.upstream, timeout=10)
            except (OSError, ValueError):
                down.close()  # the acceptor is not up yet: the dialer retries
                continue
            up.settimeout(None)
            with self.lock:
                pair = (Direction(), Direction())
                self.connections.append(pair)
                number = len(self.connections) - 1
                self.sockets += [down, up]
            self._spawn(self._pump, down, up, pair[0], number, self.tamper)
            self._spawn(self._pump, up, down, pair[1], number, -1)

    def _pump(
        self, src: socket.socket, dst: socket.socket, seen: Direction, number: int, tamper: int
    ) -> None:
        buffer = b""
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                buffer += chunk
                out = b""
                while len(buffer) >= 4:
                    (length,) = struct.unpack("i", buffer[:4])
                    if len(buffer) < 4 + length:
                        break
                    data, buffer = buffer[4 : 4 + length], buffer[4 + length :]
                    try:
                        assert self.cipher is not None
                        self.cipher.decrypt(data)
                        opened = True
                    except Exception:
                        opened = False
                    with self.lock:
                        if self.tampered is None and len(seen.opened) == tamper:
                            data = data[:-1] + bytes([data[-1] ^ 1])
                            self.tampered = number
                        seen.opened.append(opened)
                    out += struct.pack("i", length) + data
                if out:
                    dst.sendall(out)
        except OSError:
            pass
        finally:
            if self.tampered == number:
                self.closed.set()
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def snapshot(self) -> list[tuple[list[bool], list[bool]]]:
        with self.lock:
            return [(list(a.opened), list(b.opened)) for a, b in self.connections]

    def stop(self) -> None:
        self.stopping = True
        self.listener.close()
        with self.lock:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.close()


def _addr(raft: str) -> tuple[str, int]:
    host, _, port = raft.rpartition(":")
    return host, int(port)


@pytest.fixture
def relayed(request: pytest.FixtureRequest) -> Iterator[tuple[LocalCluster, Relay, str, str]]:
    """A 3-node cluster whose middle member dials the lowest one through a relay
    holding the cluster secret (PySyncObj: the greater address dials); the highest
    member is then stopped, so every commit crosses the relay. ``request.param``:
    the dialer frame the relay alters on its first connection (-1: none)."""
    tamper = getattr(request, "param", -1)
    cluster = LocalCluster(3, settings=dict(FAST_SETTINGS))
    low, mid, high = sorted(cluster.nodes, key=lambda n: n.raft)
    # Not in the cluster's client or raft port blocks (base.., base+100..).
    port = next(p for p in range(_addr(low.raft)[1] + 50, 32768) if port_free(p))
    cluster.node_settings = {mid.id: {"dial": {low.id: f"127.0.0.1:{port}"}}}
    relay: Relay | None = None
    try:
        relay = Relay(port, _addr(low.raft), cluster.data_dir / "peer.secret", tamper).start()
        cluster.start()
        cluster.wait_for_leader()
        cluster.stop_node(high.id)
        cluster.wait_for_leader(timeout=60, exclude=high.id)
        yield cluster, relay, low.id, mid.id
    finally:
        print(cluster.logs()[-20000:])  # shown by pytest only if the test failed
        if relay is not None:
            relay.stop()
        cluster.close()


def _commits(cluster: LocalCluster, key: str) -> None:
    with cluster.client() as client:
        lease = client.acquire(key, owner="a", ttl=30)
        assert lease.token > 0


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_relay_holding_the_secret_passes_traffic_but_opens_no_frame_after_the_hellos(
    relayed: tuple[LocalCluster, Relay, str, str],
) -> None:
    cluster, relay, _low, _mid = relayed
    for n in range(5):
        _commits(cluster, f"relayed/{n}")
    wait_for(
        lambda: any(len(a) > 6 and len(b) > 6 for a, b in relay.snapshot()),
        60,
        "traffic both ways through the relay",
    )
    seen = relay.snapshot()
    assert seen, "the member never dialled through the relay"
    through = 0
    for to_acceptor, back in seen:
        # The key exchange and the hellos are sealed with the cluster secret (the
        # relay holds it: it opens them); every later frame, both ways, it cannot.
        for way in (to_acceptor, back):
            assert way[:2] == [True, True][: len(way)], way
            assert not any(way[2:]), f"the relay opened a frame after the hellos: {way}"
            through += len(way[2:])
    assert through > 10


@pytest.mark.integration
@pytest.mark.timeout(240)
@pytest.mark.parametrize("relayed", [4], indirect=True)
def test_an_altered_frame_after_the_hellos_closes_the_connection(
    relayed: tuple[LocalCluster, Relay, str, str],
) -> None:
    cluster, relay, low, _mid = relayed
    wait_for(relay.closed.is_set, 60, "the altered frame to close the connection")
    log = cluster.log_path(low)
    wait_for(
        lambda: "malformed peer frame (InvalidTag): closed" in log.read_text(),
        30,
        "the acceptor to refuse the altered frame",
    )
    # The dialer connects again (through the relay) and commits go on.
    _commits(cluster, "altered/1")
    assert relay.tampered is not None
    wait_for(lambda: len(relay.snapshot()) > relay.tampered + 1, 60, "a new connection")
    altered = relay.snapshot()[relay.tampered][0]
    assert len(altered) >= 5 and altered[:2] == [True, True] and not any(altered[2:])
