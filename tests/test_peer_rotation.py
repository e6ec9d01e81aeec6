"""A rolling rotation of the cluster peer secret (issue 11, docs/security.md).

The peer secret file holds one secret per line: the first seals, each opens; a frame
names its secret by a 4-byte key id, so opening is one lookup and one AES-GCM try.
``SIGHUP`` reads the file again, under the peer connections already open. Unit tests
of the cipher's key ids, then real 3-node clusters rotating while a client acquires.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from raftlease import Client, Lease, RaftLeaseError
from raftlease.errors import ConfigError
from raftlease.replication import peers
from raftlease.replication.peers import (
    MAX_SECRETS,
    PeerCipher,
    UnacceptedKey,
    load_or_create_secret,
    load_secrets,
    parse_secrets,
)
from raftlease.testing import TEST_SETTINGS, LocalCluster, wait_for
from raftlease.testing.net import ESTABLISHED, tcp_sockets

OLD = "old-secret-" + "a" * 40
NEW = "new-secret-" + "b" * 40
THIRD = "third-secret-" + "c" * 40


def kid(secret: str) -> str:
    """The key id (hex) frames sealed with ``secret`` carry."""
    return PeerCipher(secret).key_ids[0]


# ----------------------------------------------------------------- the cipher


@pytest.mark.timeout(30)
def test_a_frame_names_its_key_by_a_short_id_derived_from_the_secret() -> None:
    old, new = PeerCipher(OLD), PeerCipher(NEW)
    assert len(bytes.fromhex(kid(OLD))) == 4
    assert kid(OLD) == PeerCipher(OLD).key_ids[0]  # derived, the same in every process
    assert kid(OLD) != kid(NEW)
    assert old.key_ids == (kid(OLD), (kid(OLD),))
    token = old.encrypt_at_time(b"frame", 7)
    assert token[8:12].hex() == kid(OLD)  # time stamp | key id | salt | sealed
    assert old.extract_timestamp(token) == 7 and old.decrypt(token) == b"frame"
    with pytest.raises(UnacceptedKey, match=kid(OLD)):
        new.decrypt(token)


@pytest.mark.timeout(30)
def test_the_first_secret_seals_and_every_secret_opens() -> None:
    ring = PeerCipher(f"{NEW}\n{OLD}\n")
    assert ring.key_ids == (kid(NEW), (kid(NEW), kid(OLD)))
    for sender in (PeerCipher(OLD), PeerCipher(NEW), PeerCipher(f"{OLD}\n{NEW}")):
        assert ring.decrypt(sender.encrypt_at_time(b"x" * 100, 1)) == b"x" * 100
    sealed = ring.encrypt_at_time(b"y", 2)
    assert sealed[8:12].hex() == kid(NEW)
    assert PeerCipher(NEW).decrypt(sealed) == b"y"
    with pytest.raises(UnacceptedKey):
        PeerCipher(OLD).decrypt(sealed)


@pytest.mark.timeout(30)
def test_opening_costs_one_try_whatever_the_number_of_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unknown key id is refused before any decryption; a known one is tried
    once, with its own key only; the id is authenticated (pointing a frame at
    another accepted key fails its tag)."""
    ring = PeerCipher("\n".join([OLD, NEW, THIRD]))
    tries: list[bytes] = []

    def counted(key: bytes) -> Any:
        tries.append(key)
        return AESGCM(key)

    monkeypatch.setattr(peers, "AESGCM", counted)
    stranger = PeerCipher("stranger-" + "d" * 40).encrypt_at_time(b"z", 1)
    tries.clear()
    with pytest.raises(UnacceptedKey):
        ring.decrypt(stranger)
    assert tries == []
    token = PeerCipher(THIRD).encrypt_at_time(b"z", 1)
    tries.clear()
    assert ring.decrypt(token) == b"z" and len(tries) == 1
    bad = bytearray(token)
    bad[-1] ^= 1
    tries.clear()
    with pytest.raises(InvalidTag):
        ring.decrypt(bytes(bad))
    assert len(tries) == 1
    moved = token[:8] + bytes.fromhex(kid(OLD)) + token[12:]
    with pytest.raises(InvalidTag):
        ring.decrypt(moved)


@pytest.mark.timeout(30)
def test_rekey_swaps_the_keys_and_a_bad_text_changes_nothing() -> None:
    cipher = PeerCipher(OLD)
    old_frame = PeerCipher(OLD).encrypt_at_time(b"a", 1)
    cipher.rekey(f"{OLD}\n{NEW}")  # step 1: the new secret accepted
    assert cipher.encrypt_at_time(b"a", 1)[8:12].hex() == kid(OLD)
    cipher.rekey(f"{NEW}\n{OLD}")  # step 2: sealing with it
    assert cipher.encrypt_at_time(b"a", 1)[8:12].hex() == kid(NEW)
    assert cipher.decrypt(old_frame) == b"a"
    for bad in ("", "\n\n", "short", f"{NEW}\nshort", "\n".join(f"{i:040d}" for i in range(5))):
        with pytest.raises(ConfigError):
            cipher.rekey(bad)
        assert cipher.key_ids == (kid(NEW), (kid(NEW), kid(OLD)))
    cipher.rekey(NEW)  # step 3: the old one dropped
    with pytest.raises(UnacceptedKey):
        cipher.decrypt(old_frame)


@pytest.mark.timeout(30)
def test_parse_secrets_reads_one_per_line(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_secrets(f"  {NEW}  \n\n{OLD}\n{NEW}\n") == (NEW, OLD)  # duplicates dropped
    assert len(parse_secrets("\n".join(f"{i:040d}" for i in range(MAX_SECRETS)))) == MAX_SECRETS
    with pytest.raises(ConfigError, match=f"at most {MAX_SECRETS}"):
        parse_secrets("\n".join(f"{i:040d}" for i in range(MAX_SECRETS + 1)))
    with pytest.raises(ConfigError, match="line 2"):
        parse_secrets(f"{NEW}\nshort")
    with pytest.raises(ConfigError, match="no secret"):
        parse_secrets(" \n")
    monkeypatch.setattr(peers, "key_id", lambda key: b"same")
    with pytest.raises(ConfigError, match="same key id"):
        parse_secrets(f"{NEW}\n{OLD}")


@pytest.mark.timeout(30)
def test_a_reload_never_creates_the_file_and_checks_it_as_the_start_does(
    tmp_path: Path,
) -> None:
    path = tmp_path / "peer.secret"
    with pytest.raises(ConfigError, match="cannot read"):
        load_secrets(path)
    assert not path.exists()
    created = load_or_create_secret(path)  # what `raftlease up` relies on: unchanged
    assert len(created) == 64 and "\n" not in created and load_secrets(path) == created
    path.write_text(f"{NEW}\n{created}\n")
    assert load_secrets(path) == f"{NEW}\n{created}"
    assert PeerCipher(load_or_create_secret(path)).key_ids[0] == kid(NEW)
    path.chmod(0o640)
    with pytest.raises(ConfigError, match="readable by other users"):
        load_secrets(path)


# ------------------------------------------------------------ on real nodes


def frame(data: bytes) -> bytes:
    return struct.pack("i", len(data)) + data


class Peer:
    """The dialing side of PySyncObj's sealed key exchange, driven by hand with the
    secrets given (``PeerCipher`` text: the first seals, each opens)."""

    def __init__(self, addr: tuple[str, int], secret: str) -> None:
        self.sock = socket.create_connection(addr, timeout=10)
        self.cipher = PeerCipher(secret)
        self.my_key = os.urandom(32)

    def answered(self) -> bool:
        """Send our random key; True if the node answers with its own (it opened our
        frame, and we opened its answer), False if it closes the connection."""
        data = zlib.compress(pickle.dumps(self.my_key))
        self.sock.sendall(frame(self.cipher.encrypt_at_time(data, int(time.time()))))
        buffer = b""
        try:
            while len(buffer) < 4 or len(buffer) < 4 + struct.unpack("i", buffer[:4])[0]:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return False
                buffer += chunk
        except ConnectionResetError:
            return False
        finally:
            self.sock.close()
        (length,) = struct.unpack("i", buffer[:4])
        key, their_key = pickle.loads(zlib.decompress(self.cipher.decrypt(buffer[4 : 4 + length])))
        assert key == self.my_key and len(their_key) == 32
        return True


def raft_addr(cluster: LocalCluster, node_id: str) -> tuple[str, int]:
    host, _, port = cluster.node(node_id).raft.rpartition(":")
    return host, int(port)


def write_secret(path: Path, text: str) -> None:
    """Replace the secret file atomically (as an operator's rename would), 0600."""
    fresh = path.with_name(path.name + ".new")
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(fresh, path)


def hup_until(cluster: LocalCluster, node_id: str, text: str, count: int) -> str:
    """SIGHUP the node once; wait until its log holds ``text`` ``count`` times (the
    reload is done) and return the last line holding it."""
    os.kill(cluster.pid(node_id), signal.SIGHUP)

    def done() -> str | None:
        lines = [ln for ln in cluster.log_path(node_id).read_text().splitlines() if text in ln]
        return lines[-1] if len(lines) >= count else None

    return wait_for(done, 60, f"{text!r} x{count} in {node_id}'s log")


def raft_connections(cluster: LocalCluster) -> set[tuple[int, int]]:
    """The established TCP connections between the cluster's raft ports, as (dialer's
    port, listener's port) pairs, from /proc/net/tcp (the kernel's table: a
    reconnect gets a new dialer port)."""
    ports = {raft_addr(cluster, n.id)[1] for n in cluster.nodes}
    return {
        (sock.local_port, sock.remote_port)
        for sock in tcp_sockets()
        if sock.state == ESTABLISHED and sock.remote_port in ports and sock.local_port not in ports
    }


class Writer:
    """A client acquiring a new key every few ms on a thread until stopped; records
    every outcome (a ``Lease``, or the error raised)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.client = Client(cluster.endpoints)
        self.outcomes: list[tuple[str, Lease | RaftLeaseError]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            key = f"rot/{i:06d}"
            i += 1
            try:
                outcome: Lease | RaftLeaseError = self.client.acquire(key, owner="w", ttl=120)
            except RaftLeaseError as exc:
                outcome = exc
            self.outcomes.append((key, outcome))
            self.stopping.wait(0.01)  # pacing, so the run holds hundreds of leases, not more

    def granted(self) -> int:
        return sum(isinstance(o, Lease) for _, o in self.outcomes)

    def progress(self, more: int = 5) -> None:
        """Wait until ``more`` acquires were granted after this call (writes commit)."""
        target = self.granted() + more
        wait_for(lambda: self.granted() >= target, 60, f"{more} more grants")

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=60)
        self.client.close()


@pytest.fixture
def rotating(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A 3-node cluster in which every node reads its own peer secret file (as on
    separate hosts), all holding ``OLD``: ``<data_dir>/<id>.secret``."""
    cluster = LocalCluster(3, settings=dict(TEST_SETTINGS))
    cluster.node_settings = {
        n.id: {"peer_secret_file": str(cluster.data_dir / f"{n.id}.secret")} for n in cluster.nodes
    }
    for n in cluster.nodes:
        write_secret(cluster.data_dir / f"{n.id}.secret", OLD + "\n")
    try:
        cluster.start()
        yield cluster
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(f"\n===== node logs of the cluster in {cluster.data_dir} =====")
            print(cluster.logs())
        cluster.close()


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_rolling_rotation_keeps_every_write_committing(rotating: LocalCluster) -> None:
    cluster = rotating
    ids = [n.id for n in cluster.nodes]
    wait_for(
        lambda: all(len(s.get("connected_peers", [])) == 2 for s in cluster.statuses()),
        60,
        "every node connected to both others",
    )
    writer = Writer(cluster)
    writer.thread.start()
    try:
        writer.progress()
        connections = raft_connections(cluster)
        assert len(connections) == 3  # one per pair of nodes
        steps = [
            # 1) the new secret accepted everywhere, 2) sealing with it, 3) old dropped
            (f"{OLD}\n{NEW}\n", kid(OLD), f"{kid(OLD)}, {kid(NEW)}"),
            (f"{NEW}\n{OLD}\n", kid(NEW), f"{kid(NEW)}, {kid(OLD)}"),
            (f"{NEW}\n", kid(NEW), kid(NEW)),
        ]
        for step, (text, seal, accepted) in enumerate(steps, start=1):
            for node_id in ids:  # one node at a time; writes go on between them
                write_secret(cluster.data_dir / f"{node_id}.secret", text)
                line = hup_until(cluster, node_id, "reloaded the peer secret file", step)
                assert f"sealing with key id {seal}; accepting {accepted}" in line
                writer.progress()
            if step == 2:
                # Mid-rotation a frame sealed with the old secret is still opened (the
                # node's answer is sealed with the new one, hence both on our side).
                assert Peer(raft_addr(cluster, ids[0]), f"{OLD}\n{NEW}").answered()
        # The connections opened before the rotation carried it: none was replaced.
        assert raft_connections(cluster) == connections
    finally:
        writer.stop()

    # Every acquire succeeded or failed definitely; here (distinct keys, connected
    # peers throughout) every one succeeded.
    indefinite = [(k, o) for k, o in writer.outcomes if isinstance(o, RaftLeaseError)]
    assert all(o.definite for _, o in indefinite), indefinite
    assert indefinite == []
    granted = [(k, o) for k, o in writer.outcomes if isinstance(o, Lease)]
    assert len(granted) >= 45
    tokens = [lease.token for _, lease in granted]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    for node_id in ids:
        text = cluster.log_path(node_id).read_text()
        assert "unauthenticated" not in text and "peer connection refused" not in text

    # The store is consistent: every grant is held as granted, on every node alike.
    expected = {k: (lease.owner, lease.token) for k, lease in granted}
    with cluster.client() as client:
        held = client.leases(prefix="rot/", limit=10_000)
        assert {h.key: (h.owner, h.token) for h in held} == expected
    wait_for(
        lambda: all(s.get("revision", 0) >= tokens[-1] for s in cluster.statuses()),
        60,
        "every node to apply the last grant",
    )
    for node in cluster.nodes:
        with Client([node.client]) as one:
            stale = one.leases(prefix="rot/", limit=10_000, consistency="stale")
            assert {h.key: (h.owner, h.token) for h in stale} == expected, node.id

    # After the last step a process holding only the old secret is refused, as a
    # stranger is, and logged with the key id it sealed with; the new one is a peer.
    for node_id in ids:
        assert not Peer(raft_addr(cluster, node_id), OLD).answered()
        assert Peer(raft_addr(cluster, node_id), NEW).answered()
    wait_for(
        lambda: (
            f"sealed with key id {kid(OLD)}, not accepted" in cluster.log_path(ids[0]).read_text()
        ),
        30,
        "the refusal in the log",
    )
    with cluster.client() as client:
        client.acquire("after-rotation", owner="a", ttl=5)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_malformed_secret_file_at_reload_is_refused_and_the_old_keys_stay(
    rotating: LocalCluster,
) -> None:
    cluster = rotating
    node_id = cluster.nodes[0].id
    path = cluster.data_dir / f"{node_id}.secret"
    refused = "the previous peer secrets stay in force"
    bad_files: list[tuple[str, str, int]] = [
        ("", "holds no secret", 0o600),
        ("short\n", "at least 32 characters", 0o600),
        (f"{NEW}\nshort\n", "line 2", 0o600),
        ("\n".join(f"{i:040d}" for i in range(MAX_SECRETS + 1)), "at most", 0o600),
        (f"{NEW}\n{OLD}\n", "readable by other users", 0o644),
        ("(missing)", "cannot read", 0o600),
    ]
    with cluster.client() as client:
        for n, (text, why, mode) in enumerate(bad_files, start=1):
            if text == "(missing)":
                path.unlink()
            else:
                write_secret(path, text)
                path.chmod(mode)
            line = hup_until(cluster, node_id, refused, n)
            assert "reload refused" in line and why in line
            assert NEW not in line and OLD not in line  # no secret in a log line
            # The old keys stay: the node still seals with OLD and accepts it only.
            assert Peer(raft_addr(cluster, node_id), OLD).answered()
            assert not Peer(raft_addr(cluster, node_id), NEW).answered()
            client.acquire(f"bad/{n}", owner="a", ttl=30)
    assert "reloaded the peer secret file" not in cluster.log_path(node_id).read_text()
    assert not path.exists()  # a reload never creates the file
    # A good file afterwards is taken.
    write_secret(path, f"{OLD}\n{NEW}\n")
    line = hup_until(cluster, node_id, "reloaded the peer secret file", 1)
    assert f"accepting {kid(OLD)}, {kid(NEW)}" in line
    assert Peer(raft_addr(cluster, node_id), NEW + "\n" + OLD).answered()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_round_out_of_order_cuts_one_node_off_until_it_is_finished(
    rotating: LocalCluster,
) -> None:
    """Two nodes seal with the new secret while the third does not accept it yet
    (round 2 begun before round 1 ended there): it refuses their frames (logged with
    the key id) and is cut off, the two commit on, and once it accepts the new secret
    it is connected again. A node started mid-rotation reads the file as a reload
    does. (Followers send each other nothing, so the refusals come from the leader's
    frames: both others seal with the new secret, whichever leads.)"""
    cluster = rotating
    late = next(n.id for n in cluster.nodes if n.id != cluster.leader_id())
    early = [n.id for n in cluster.nodes if n.id != late]
    for step, text in enumerate((f"{OLD}\n{NEW}\n", f"{NEW}\n{OLD}\n"), start=1):
        for node_id in early:
            write_secret(cluster.data_dir / f"{node_id}.secret", text)
            hup_until(cluster, node_id, "reloaded the peer secret file", step)
    refusal = f"sealed with key id {kid(NEW)}, not accepted here"
    wait_for(lambda: refusal in cluster.log_path(late).read_text(), 60, "the refusals")

    def peers_of(node_id: str) -> set[str]:
        with Client([cluster.node(node_id).client]) as one:
            return set(one.node_status(cluster.node(node_id).client).get("connected_peers", []))

    with cluster.client() as client:
        client.acquire("cut/1", owner="a", ttl=30)  # the majority commits
    write_secret(cluster.data_dir / f"{late}.secret", f"{OLD}\n{NEW}\n")  # its round 1
    hup_until(cluster, late, "reloaded the peer secret file", 1)
    wait_for(lambda: len(peers_of(late)) == 2, 60, "the late node connected again")
    with cluster.client() as client:
        client.acquire("cut/2", owner="a", ttl=30)
    # A node restarted in the middle of the rotation: its start reads both secrets.
    cluster.stop_node(late)
    cluster.start_node(late)
    wait_for(
        lambda: (
            f"sealing with key id {kid(OLD)}; accepting {kid(OLD)}, {kid(NEW)}"
            in cluster.log_path(late).read_text()
        ),
        60,
        "the restarted node to log its keys",
    )
    wait_for(lambda: len(peers_of(late)) == 2, 60, "the restarted node connected to both")
    with cluster.client() as client:
        client.acquire("cut/3", owner="a", ttl=30)
        assert [h.key for h in client.leases(prefix="cut/")] == ["cut/1", "cut/2", "cut/3"]
