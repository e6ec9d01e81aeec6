"""Per-node peer identity on the Raft port (issue 11, "Peers"; identity.py).

The cluster secret seals every peer frame, but every member holds it. The first frame
of a peer connection is therefore a hello signed with the dialing member's own
Ed25519 key and bound to the connection: a holder of the secret without node n2's key
cannot connect as n2, and a recorded hello cannot be replayed.
"""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import struct
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from raftlease.errors import ConfigError
from raftlease.replication.identity import (
    HelloRefused,
    HelloVerifier,
    PeerIdentity,
    load_or_create_key,
    make_hello,
    public_hex,
    read_public_key,
)
from raftlease.replication.peers import PeerCipher
from raftlease.testing import LocalCluster, wait_for
from tests.conftest import FAST_SETTINGS
from tests.test_membership import add, all_agree, new_node_that_dials
from tests.test_peer_conn_key import join_as_member

Factory = Callable[..., LocalCluster]


# --------------------------------------------------------------- helpers


class Peer:
    """PySyncObj's encrypted peer handshake driven by hand with the cluster secret
    (what an insider holding only the secret can do)."""

    def __init__(self, addr: tuple[str, int], secret: str) -> None:
        self.sock = socket.create_connection(addr, timeout=10)
        self.cipher = PeerCipher(secret)
        self.my_key = os.urandom(32)
        self.their_key: bytes | None = None
        self.buffer = b""

    def send(self, message: Any) -> None:
        if self.their_key is not None:
            message = (self.their_key, message)
        data = self.cipher.encrypt_at_time(zlib.compress(pickle.dumps(message)), int(time.time()))
        self.sock.sendall(struct.pack("i", len(data)) + data)

    def receive(self) -> Any:
        while True:
            if len(self.buffer) >= 4:
                (length,) = struct.unpack("i", self.buffer[:4])
                if len(self.buffer) >= 4 + length:
                    data, self.buffer = self.buffer[4 : 4 + length], self.buffer[4 + length :]
                    key, message = pickle.loads(zlib.decompress(self.cipher.decrypt(data)))
                    assert key == self.my_key
                    return message
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buffer += chunk

    def handshake(self) -> bytes:
        """The key exchange; returns the acceptor's random key (the hello's binding)."""
        self.send(self.my_key)
        self.their_key = self.receive()
        assert isinstance(self.their_key, bytes)
        return self.their_key

    def closed(self, timeout: float = 15.0) -> bool:
        """True when the node closes the connection (anything it sends first, such as
        a heartbeat to an accepted member, makes this False)."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(65536) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


def raft_addr(cluster: LocalCluster, index: int) -> tuple[str, int]:
    host, _, port = cluster.nodes[index].raft.rpartition(":")
    return host, int(port)


def secret_of(cluster: LocalCluster) -> str:
    return (cluster.data_dir / "peer.secret").read_text().strip()


def key_of(cluster: LocalCluster, node_id: str) -> Ed25519PrivateKey:
    return load_or_create_key(cluster.node_dir(node_id) / "peer.key")


def log_text(cluster: LocalCluster, node_id: str) -> str:
    return cluster.log_path(node_id).read_text(errors="replace")


def refusals(cluster: LocalCluster, node_id: str) -> int:
    return log_text(cluster, node_id).count("peer connection refused")


def wait_refused(cluster: LocalCluster, node_id: str, before: int, reason: str) -> None:
    def seen() -> bool:
        text = log_text(cluster, node_id)
        return text.count("peer connection refused") > before and reason in text

    wait_for(seen, 20, f"{node_id} to refuse the connection ({reason})")


def old_leader(cluster: LocalCluster) -> str:
    """The leader the first three members agree on (a node being added knows none)."""

    def check() -> str | None:
        ours = [s for s in cluster.statuses() if s.get("node") in ("n1", "n2", "n3")]
        leaders = [s for s in ours if s.get("role") == "leader" and s.get("reachable")]
        if len(leaders) == 1 and all(s.get("leader") == leaders[0]["client"] for s in ours):
            return str(leaders[0]["node"])
        return None

    return wait_for(check, 60, "a leader of the three members")


def serves(cluster: LocalCluster, key: str) -> None:
    with cluster.client() as client:
        client.acquire(key, owner="a", ttl=5)
    assert all(cluster.is_running(n.id) for n in cluster.nodes)


# ------------------------------------------------------------ unit tests


@pytest.mark.timeout(30)
def test_the_key_file_is_created_private_kept_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "d" / "peer.key"
    key = load_or_create_key(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert public_hex(load_or_create_key(path)) == public_hex(key)
    path.chmod(0o640)
    with pytest.raises(ConfigError, match="readable by other users"):
        load_or_create_key(path)
    path.chmod(0o600)
    path.write_text("not a key\n")
    with pytest.raises(ConfigError, match="not a PEM private key"):
        load_or_create_key(path)


@pytest.mark.timeout(30)
def test_the_public_key_is_published_under_the_node_id(tmp_path: Path) -> None:
    identity = PeerIdentity.load(tmp_path / "n1" / "peer.key", "n1", tmp_path / "peers")
    assert read_public_key(tmp_path / "peers", "n1") == identity.public
    assert read_public_key(tmp_path / "peers", "n2") is None
    assert read_public_key(tmp_path / "peers", "../n1") is None  # never a path
    (tmp_path / "peers" / "n2.pub").write_text("zz" * 32)
    assert read_public_key(tmp_path / "peers", "n2") is None  # malformed


def _verifier(members: dict[str, tuple[str, list[str]]]) -> HelloVerifier:
    return HelloVerifier("127.0.0.1:2", members.get)


@pytest.mark.timeout(30)
def test_the_verifier_accepts_exactly_the_members_signed_fresh_bound_hello() -> None:
    n1, n2 = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    members = {
        "127.0.0.1:1": ("n1", [public_hex(n1)]),
        "127.0.0.1:3": ("n3", [public_hex(n2)]),  # n3's entry: not n1's key
    }
    verifier = _verifier(members)
    bind = os.urandom(32)
    now = 1_000_000.0
    good = make_hello(n1, "127.0.0.1:1", "n1", "127.0.0.1:2", bind, now=now)
    assert verifier.verify(good, bind, now=now) == "127.0.0.1:1"

    def refused(message: Any, binding: bytes = bind, at: float = now) -> str:
        with pytest.raises(HelloRefused) as info:
            verifier.verify(message, binding, now=at)
        return str(info.value)

    assert "replayed" in refused(good)  # same nonce again
    # Another connection (binding), the wrong key, a claim on another member's
    # address, another acceptor, stale or future time, bare addresses, junk.
    assert "not signed" in refused(
        make_hello(n1, "127.0.0.1:1", "n1", "127.0.0.1:2", bind, now=now), os.urandom(32)
    )
    assert "not signed" in refused(
        make_hello(n2, "127.0.0.1:1", "n1", "127.0.0.1:2", bind, now=now)
    )
    assert "claims member" in refused(
        make_hello(n1, "127.0.0.1:3", "n1", "127.0.0.1:2", bind, now=now)
    )
    assert "not signed" in refused(
        make_hello(n1, "127.0.0.1:3", "n3", "127.0.0.1:2", bind, now=now)
    )
    assert "not this node" in refused(
        make_hello(n1, "127.0.0.1:1", "n1", "127.0.0.1:9", bind, now=now)
    )
    assert "names no member" in refused(
        make_hello(n1, "127.0.0.1:7", "n7", "127.0.0.1:2", bind, now=now)
    )
    for skew in (-61.0, 61.0):
        assert "from ours" in refused(
            make_hello(n1, "127.0.0.1:1", "n1", "127.0.0.1:2", bind, now=now + skew)
        )
    for junk in ("127.0.0.1:1", "readonly", ["status"], None, (1, 2), good[:7], (*good, 1)):
        assert "names no member" in refused(junk)
    bad_sig = (*good[:7], b"x" * 64)
    assert refused((*bad_sig[:5], os.urandom(16), *bad_sig[6:]))
    assert "malformed" in refused((*good[:5], b"short", *good[6:]))


@pytest.mark.timeout(30)
def test_the_nonce_cache_is_bounded() -> None:
    key = Ed25519PrivateKey.generate()
    verifier = HelloVerifier("b", {"a": ("n1", [public_hex(key)])}.get, cache=8)
    for _ in range(50):
        verifier.verify(make_hello(key, "a", "n1", "b", b""), b"")
    assert len(verifier._seen) == 8


# ----------------------------------------------------- real node processes


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_normal_cluster_keys_and_a_restart(cluster_factory: Factory) -> None:
    cluster = cluster_factory(3)
    serves(cluster, "id/before")
    peers = cluster.data_dir / "peers"
    keys = {}
    for node in cluster.nodes:
        path = cluster.node_dir(node.id) / "peer.key"
        assert path.stat().st_mode & 0o777 == 0o600
        keys[node.id] = public_hex(load_or_create_key(path))
        assert read_public_key(peers, node.id) == keys[node.id]
    assert peers.stat().st_mode & 0o077 == 0
    # A restarted node keeps its key and is accepted again by the others.
    victim = cluster.nodes[1].id
    cluster.stop_node(victim)
    cluster.start_node(victim)
    wait_for(
        lambda: (
            all(s.get("leader") is not None for s in cluster.statuses())
            and len(cluster.statuses()) == 3
        ),
        60,
        "all three nodes to know the leader after the restart",
    )
    assert public_hex(key_of(cluster, victim)) == keys[victim]
    serves(cluster, "id/after")
    for node in cluster.nodes:
        assert refusals(cluster, node.id) == 0, log_text(cluster, node.id)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_secret_holder_without_n2s_key_cannot_connect_as_n2(cluster_factory: Factory) -> None:
    cluster = cluster_factory(3)
    leader = cluster.wait_for_leader()
    target = next(i for i, n in enumerate(cluster.nodes) if n.client == leader["client"])
    me = cluster.nodes[target]
    n2 = next(n for n in cluster.nodes if n.id != me.id)
    n3 = next(n for n in cluster.nodes if n.id not in (me.id, n2.id))
    secret = secret_of(cluster)
    forged = Ed25519PrivateKey.generate()
    n3_key = key_of(cluster, n3.id)

    attempts: list[tuple[str, Callable[[bytes], Any]]] = [
        # PySyncObj's own first frame: the bare member address.
        ("names no member", lambda bind: n2.raft),
        # A hello for n2 signed with a key that is not n2's.
        ("not signed", lambda bind: make_hello(forged, n2.raft, n2.id, me.raft, bind)),
        # Member n3 (its real key) claiming n2's address, with either id.
        ("claims member", lambda bind: make_hello(n3_key, n2.raft, n3.id, me.raft, bind)),
        ("not signed", lambda bind: make_hello(n3_key, n2.raft, n2.id, me.raft, bind)),
    ]
    for reason, first in attempts:
        before = refusals(cluster, me.id)
        peer = Peer(raft_addr(cluster, target), secret)
        bind = peer.handshake()
        peer.send(first(bind))
        # Anything after it is never taken (the connection is closed first).
        peer.send({"type": "apply_command", "command": b"\x00junk", "request_id": 1})
        assert peer.closed(), f"{reason}: the connection stayed open"
        peer.close()
        wait_refused(cluster, me.id, before, reason)
    text = log_text(cluster, me.id)
    assert "'apply_command' message: dropped" not in text  # nothing reached a member
    assert cluster.is_running(me.id)
    serves(cluster, "id/still")
    # The leader still leads and its lease is counted over the real members only: it
    # keeps answering linearizable reads.
    with cluster.client() as client:
        assert client.holder("id/still") is not None
    assert cluster.leader_id() == me.id or cluster.leader() is not None


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_members_own_key_is_accepted_and_a_replayed_hello_is_not(
    cluster_factory: Factory,
) -> None:
    """Positive control (an insider holding n2's key is taken as n2: its messages
    reach the Raft filter) and replays: a recorded hello on another connection fails
    its binding; the same nonce, even re-signed for the new connection, is refused."""
    cluster = cluster_factory(3)
    cluster.wait_for_leader()
    target = 0
    me = cluster.nodes[target]
    n2 = cluster.nodes[1]
    secret = secret_of(cluster)
    key = key_of(cluster, n2.id)

    peer = Peer(raft_addr(cluster, target), secret)
    bind = peer.handshake()
    nonce = os.urandom(16)
    # After the hellos, frames are sealed with the connection's key (test_peer_conn_key).
    hello = join_as_member(peer, "cipher", key, n2.raft, n2.id, me.raft, nonce=nonce)
    peer.send({"type": "timeout_now", "term": 10**9})
    wait_for(
        lambda: "'timeout_now' message: dropped" in log_text(cluster, me.id),
        20,
        "the impostor-with-the-key's message to reach the Raft filter (accepted as n2)",
    )
    peer.close()

    # The recorded hello, replayed as is on a new connection.
    before = refusals(cluster, me.id)
    replay = Peer(raft_addr(cluster, target), secret)
    replay.handshake()
    replay.send(hello)
    assert replay.closed()
    replay.close()
    wait_refused(cluster, me.id, before, "replayed hello")

    # Re-signed for the new connection but with the same nonce.
    before = refusals(cluster, me.id)
    again = Peer(raft_addr(cluster, target), secret)
    bind = again.handshake()
    again.send(make_hello(key, n2.raft, n2.id, me.raft, bind, nonce=nonce))
    assert again.closed()
    again.close()
    wait_refused(cluster, me.id, before, "replayed hello")

    # A fresh nonce but a recorded binding (another connection's key exchange).
    before = refusals(cluster, me.id)
    other = Peer(raft_addr(cluster, target), secret)
    other.handshake()
    other.send(make_hello(key, n2.raft, n2.id, me.raft, bind))
    assert other.closed()
    other.close()
    wait_refused(cluster, me.id, before, "not signed")

    serves(cluster, "id/replay")
    assert all(s.get("term", 0) < 10**6 for s in cluster.statuses())


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_an_added_member_is_accepted_through_the_key_its_entry_carries(tmp_path: Path) -> None:
    """n4 is set up as on another host: its own key folder, holding copies of the
    members' public keys. Only the leader's key folder gets n4.pub; the add entry
    carries it to the followers, which accept n4 and keep the key (a restart)."""
    cluster = LocalCluster(3, settings=dict(FAST_SETTINGS))
    try:
        # Each member with its own key folder, seeded by hand as an operator would.
        for node in cluster.nodes:
            cluster.node_settings[node.id] = {"peer_keys_dir": str(tmp_path / f"keys-{node.id}")}
        cluster.start(wait=False)
        folders = [tmp_path / f"keys-{n.id}" for n in cluster.nodes]
        wait_for(
            lambda: all(
                (f / f"{n.id}.pub").exists() for f, n in zip(folders, cluster.nodes, strict=True)
            ),
            30,
            "every node to publish its key",
        )
        for src in cluster.nodes:
            for folder in folders:
                dest = folder / f"{src.id}.pub"
                if not dest.exists():
                    shutil.copy(tmp_path / f"keys-{src.id}" / f"{src.id}.pub", dest)
        cluster.wait_for_leader(60)
        serves(cluster, "id/three")

        n4 = new_node_that_dials(cluster, "n4")
        n4_keys = tmp_path / "keys-n4"
        n4_keys.mkdir(mode=0o700)
        for node in cluster.nodes[:3]:
            shutil.copy(tmp_path / f"keys-{node.id}" / f"{node.id}.pub", n4_keys)
        cluster.node_settings["n4"] = {"peer_keys_dir": str(n4_keys)}
        cluster.start_node("n4")
        wait_for(lambda: (n4_keys / "n4.pub").exists(), 30, "n4 to publish its key")
        leader = old_leader(cluster)
        followers = [n.id for n in cluster.nodes[:3] if n.id != leader]
        shutil.copy(n4_keys / "n4.pub", tmp_path / f"keys-{leader}")
        assert not any((tmp_path / f"keys-{f}" / "n4.pub").exists() for f in followers)

        result = add(cluster, n4)
        assert result["members"] == ["n1", "n2", "n3", "n4"]
        wait_for(lambda: all_agree(cluster, ["n1", "n2", "n3", "n4"]), 60, "four members")
        pub = (n4_keys / "n4.pub").read_text().strip()
        for follower in followers:
            wait_for(
                lambda f=follower: read_public_key(tmp_path / f"keys-{f}", "n4") == pub,
                30,
                f"{follower} to keep n4's carried key",
            )
        # A follower restarted from members.json (no keys in it) still accepts n4:
        # stop the leader too, so n4 and the restarted follower are needed for a quorum.
        cluster.stop_node(followers[0])
        cluster.start_node(followers[0])
        cluster.stop_node(leader)
        wait_for(
            lambda: (
                (cluster.leader() or {}).get("client") != cluster.node(leader).client
                and cluster.leader() is not None
            ),
            90,
            "a leader among n4 and the two followers",
        )
        with cluster.client() as client:
            client.acquire("id/after-add", owner="a", ttl=5)
        assert refusals(cluster, "n4") == 0, log_text(cluster, "n4")
    finally:
        cluster.close()
