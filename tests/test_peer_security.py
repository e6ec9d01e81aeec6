"""Strangers and peers on the Raft port of real nodes (issue 11, the peer part).

A stranger's frame never reaches pickle: it fails the peer secret's HMAC and the
connection is closed. Even a holder of the secret is held to what members use: the
first frame must name a member (no read-only node, no utility command), and only the
Raft messages we use are handled. Frames are bounded before decryption.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from raftlease.config import ConfigError
from raftlease.replication.identity import load_or_create_key
from raftlease.replication.peers import PeerCipher, load_or_create_secret
from raftlease.testing import LocalCluster, wait_for
from tests.test_peer_conn_key import join_as_member

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Factory = Callable[..., LocalCluster]


class _MakesAFile:
    """Unpickling this creates a file: the proof that a frame reached pickle."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def raft_addr(cluster: LocalCluster, index: int = 0) -> tuple[str, int]:
    host, _, port = cluster.nodes[index].raft.rpartition(":")
    return host, int(port)


def closed_without_answer(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True when the node closes the connection having sent nothing back."""
    sock.settimeout(timeout)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def frame(data: bytes) -> bytes:
    return struct.pack("i", len(data)) + data


class Peer:
    """The client side of PySyncObj's encrypted peer handshake, driven by hand with
    the cluster's secret (what an insider holding the secret could send)."""

    def __init__(self, addr: tuple[str, int], secret: str) -> None:
        """``secret``: the cluster's peer secret (what only members hold)."""
        self.sock = socket.create_connection(addr, timeout=10)
        self.fernet = PeerCipher(secret)
        self.my_key = os.urandom(32)
        self.their_key: bytes | None = None
        self.buffer = b""

    def send(self, message: Any) -> None:
        if self.their_key is not None:
            message = (self.their_key, message)
        data = self.fernet.encrypt_at_time(zlib.compress(pickle.dumps(message)), int(time.time()))
        self.sock.sendall(frame(data))

    def receive(self) -> Any:
        while True:
            if len(self.buffer) >= 4:
                (length,) = struct.unpack("i", self.buffer[:4])
                if len(self.buffer) >= 4 + length:
                    data, self.buffer = self.buffer[4 : 4 + length], self.buffer[4 + length :]
                    key, message = pickle.loads(zlib.decompress(self.fernet.decrypt(data)))
                    assert key == self.my_key
                    return message
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buffer += chunk

    def handshake(self) -> None:
        self.send(self.my_key)
        self.their_key = self.receive()


def secret_of(cluster: LocalCluster) -> str:
    return (cluster.data_dir / "peer.secret").read_text().strip()


def test_a_strangers_pickle_runs_nothing_and_the_node_stays_up(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    cluster = cluster_factory(3)
    proof = tmp_path / "pwned"
    payload = zlib.compress(pickle.dumps(_MakesAFile(str(proof))))
    # Plain, and dressed as a token (time stamp, salt, then the payload as "ciphertext").
    for data in (payload, bytes(8) + bytes(16) + payload):
        with socket.create_connection(raft_addr(cluster)) as sock:
            sock.sendall(frame(data))
            assert closed_without_answer(sock)
    assert not proof.exists(), "a stranger's frame was unpickled"
    with cluster.client() as client:
        client.acquire("still-up", owner="a", ttl=5)
    assert all(cluster.is_running(n.id) for n in cluster.nodes)


@pytest.mark.parametrize("length", [0x7FFFFFFF, -5, 0])
def test_absurd_frame_lengths_close_the_connection(cluster_factory: Factory, length: int) -> None:
    cluster = cluster_factory(1)
    with socket.create_connection(raft_addr(cluster)) as sock:
        sock.sendall(struct.pack("i", length) + b"x" * 1000)
        assert closed_without_answer(sock)


def test_a_frame_longer_than_the_limit_is_refused_before_it_is_buffered(
    cluster_factory: Factory,
) -> None:
    cluster = cluster_factory(1)
    with socket.create_connection(raft_addr(cluster)) as sock:
        sock.sendall(struct.pack("i", (32 << 20) + 1))
        assert closed_without_answer(sock)


@pytest.mark.parametrize("first", ["readonly", ["status"], ["transfer", "x"], "10.0.0.1:1"])
def test_even_a_secret_holder_cannot_join_as_a_non_member(
    cluster_factory: Factory, first: Any
) -> None:
    cluster = cluster_factory(3)
    peer = Peer(raft_addr(cluster), secret_of(cluster))
    peer.handshake()
    peer.send(first)
    assert closed_without_answer(peer.sock)
    peer.sock.close()


def test_a_member_connection_cannot_inject_proposals(cluster_factory: Factory) -> None:
    """``apply_command`` from a connected member (PySyncObj's proposal forwarding,
    which we never use) is dropped, as is ``timeout_now``: they would let anyone with
    the secret append an entry with any time stamp or term, or force an election."""
    cluster = cluster_factory(3)
    leader = cluster.wait_for_leader()
    target = next(i for i, n in enumerate(cluster.nodes) if n.client == leader["client"])
    other = cluster.nodes[(target + 1) % 3]
    peer = Peer(raft_addr(cluster, target), secret_of(cluster))
    peer.handshake()
    # An insider holding another member's identity key too (identity.py): its signed
    # hello, bound to this connection, is accepted as that member.
    key = load_or_create_key(cluster.node_dir(other.id) / "peer.key")
    assert peer.their_key is not None
    # After the hellos, frames are sealed with the connection's key (test_peer_conn_key).
    join_as_member(peer, "fernet", key, other.raft, other.id, cluster.nodes[target].raft)
    peer.send({"type": "apply_command", "command": b"\x00junk", "request_id": 1})
    peer.send({"type": "timeout_now", "term": 10**9})
    log = cluster.log_path(cluster.nodes[target].id)
    wait_for(
        lambda: (
            "'timeout_now' message: dropped" in log.read_text()
            and "'apply_command' message: dropped" in log.read_text()
        ),
        20,
        "the node to drop both messages",
    )
    peer.sock.close()
    with cluster.client() as client:
        client.acquire("k", owner="a", ttl=5)
    assert all(s.get("term", 0) < 10**6 for s in cluster.statuses())


def test_the_secret_file_is_created_once_private_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "peer.secret"
    first = load_or_create_secret(path)
    assert load_or_create_secret(path) == first and len(first) == 64
    assert path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by other users"):
        load_or_create_secret(path)
    path.chmod(0o600)
    path.write_text("short\n")
    with pytest.raises(ConfigError, match="at least 32"):
        load_or_create_secret(path)


def test_the_data_directory_and_its_files_are_private(cluster_factory: Factory) -> None:
    cluster = cluster_factory(1)
    with cluster.client() as client:
        client.acquire("k", owner="a", ttl=5)
    node_dir = cluster.node_dir(cluster.nodes[0].id)
    assert node_dir.stat().st_mode & 0o777 == 0o700
    files = [p for p in node_dir.iterdir() if p.is_file() and p.name != "node.log"]
    assert any(p.name == "raft.journal" for p in files)
    for path in files:
        assert path.stat().st_mode & 0o077 == 0, f"{path.name} is readable by others"


def test_the_peer_cipher_refuses_any_change_and_never_repeats_a_key() -> None:
    cipher = PeerCipher("s" * 64)
    token = cipher.encrypt_at_time(b"frame", 7)
    assert cipher.extract_timestamp(token) == 7 and cipher.decrypt(token) == b"frame"
    assert cipher.encrypt_at_time(b"frame", 7) != token  # a fresh salt, a fresh key
    for i in range(len(token)):
        bad = bytearray(token)
        bad[i] ^= 1
        with pytest.raises(Exception):  # noqa: B017 (InvalidTag or ValueError)
            cipher.decrypt(bytes(bad))
    with pytest.raises(Exception):  # noqa: B017
        PeerCipher("t" * 64).decrypt(token)
