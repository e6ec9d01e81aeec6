"""The acceptor proves who it is too (issue 11, "Peers"; identity.py, transport.py).

A dialer sends its signed hello and then takes nothing from the connection, and sends
nothing on it, until the acceptor's signed *hello reply* verifies with the key of the
member it dialled. An insider holding only the cluster secret who binds a stopped
member's raft address is therefore refused by the dialers: it is streamed no entry,
its votes and acknowledgements count for nothing. And ``member add --peer-key``
carries the new member's public key in the change entry.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from raftlease.config import NodeAddress
from raftlease.errors import InvalidArgumentError, RaftLeaseError
from raftlease.protocol import Limits, parse_request
from raftlease.replication.identity import (
    HelloRefused,
    HelloVerifier,
    connection_key,
    exchange_public,
    make_hello,
    make_reply,
    public_hex,
    read_public_key,
)
from raftlease.replication.peers import ConnectionCipher, PeerCipher
from raftlease.testing import LocalCluster, wait_for
from tests.conftest import FAST_SETTINGS
from tests.test_cluster import raw_request
from tests.test_membership import all_agree, members, new_node_that_dials
from tests.test_peer_identity import key_of, log_text, old_leader, refusals, secret_of

Factory = Callable[..., LocalCluster]
#: What the fake acceptor answers a hello with: (dialer's random key, hello) -> the
#: frame to send first (None: nothing, it goes straight on as a follower).
Answer = Callable[[bytes, Any], Any]


# --------------------------------------------------------------- the impostor


class FakeAcceptor:
    """An insider holding only the cluster secret, listening on a stopped member's
    raft address. It does PySyncObj's acceptor side of the key exchange by hand,
    answers each hello with what ``answer`` returns, then behaves as an eager
    follower: it acknowledges every ``append_entries`` as appended and grants every
    vote. It records every message each connection brings (``connections``)."""

    def __init__(self, addr: tuple[str, int], secret: str, answer: Answer) -> None:
        self.cipher = PeerCipher(secret)
        self.answer = answer
        # Ephemeral keys of replies made with a member's key (exchange public -> its
        # private key): after such a reply the connection goes on under the agreed
        # connection key, as the member's would (tests/test_peer_conn_key.py).
        self.agree: dict[bytes, X25519PrivateKey] = {}
        self.connections: list[list[Any]] = []
        self.lock = threading.Lock()
        self.closing = False
        self._socks: list[socket.socket] = []
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 20
        while True:  # the stopped member's socket may linger a moment
            try:
                self.server.bind(addr)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.server.listen(16)
        self.server.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True).start()

    # -- frames as PySyncObj's TcpConnection makes them, sealed with the secret
    def _send(
        self, sock: socket.socket, key: bytes | None, message: Any, cipher: Any = None
    ) -> None:
        if key is not None:
            message = (key, message)
        sealed = (cipher or self.cipher).encrypt_at_time(
            zlib.compress(pickle.dumps(message)), int(time.monotonic())
        )
        sock.sendall(struct.pack("i", len(sealed)) + sealed)

    def _frames(self, sock: socket.socket, box: list[Any]) -> Any:
        buffer = b""
        while not self.closing:
            while len(buffer) >= 4:
                (length,) = struct.unpack("i", buffer[:4])
                if len(buffer) < 4 + length:
                    break
                data, buffer = buffer[4 : 4 + length], buffer[4 + length :]
                yield pickle.loads(zlib.decompress(box[0].decrypt(data)))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk

    def _accept(self) -> None:
        while not self.closing:
            try:
                sock, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(0.2)
            with self.lock:
                self._socks.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        seen: list[Any] = []
        with self.lock:
            self.connections.append(seen)
        mine = os.urandom(32)
        theirs: bytes | None = None
        box: list[Any] = [self.cipher]  # this connection's cipher
        try:
            for frame in self._frames(sock, box):
                if theirs is None:  # the dialer's random key, unwrapped
                    seen.append(frame)
                    theirs = frame
                    self._send(sock, theirs, mine)
                    continue
                key, message = frame
                assert key == mine
                seen.append(message)
                if len(seen) == 2:  # the dialer's hello
                    first = self.answer(theirs, message)
                    if first is not None:
                        self._send(sock, theirs, first)
                    private = None
                    if isinstance(first, tuple) and len(first) == 9:
                        private = self.agree.get(first[8])
                    if private is not None:
                        conn = connection_key(
                            private, message[8], message[8], first[8], theirs, mine
                        )
                        box[0] = ConnectionCipher(self.cipher, conn)
                elif isinstance(message, dict):
                    self._follow(sock, theirs, message, box[0])
        except (OSError, ValueError, AssertionError):
            pass
        finally:
            with contextlib.suppress(OSError):
                sock.close()

    def _follow(
        self, sock: socket.socket, theirs: bytes, message: dict[str, Any], cipher: Any
    ) -> None:
        kind = message.get("type")
        if kind == "append_entries" and "prevLogIdx" in message:
            appended = message["prevLogIdx"] + len(message.get("entries") or []) + 1
            ack = {"type": "next_node_idx", "next_node_idx": appended, "reset": False}
            ack.update(success=True, rl_et=message.get("term"), rl_e=message.get("rl_s"))
            self._send(sock, theirs, ack, cipher)
        elif kind == "request_vote" and not message.get("rl_bump"):
            vote = {"type": "response_vote", "term": message.get("term")}
            self._send(sock, theirs, vote, cipher)

    def drop_connections(self) -> None:
        with self.lock:
            socks, self._socks = self._socks, []
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def received(self) -> list[list[Any]]:
        with self.lock:
            return [list(c) for c in self.connections]

    def close(self) -> None:
        self.closing = True
        self.drop_connections()
        self.server.close()


def raft_of(node: NodeAddress) -> tuple[str, int]:
    host, _, port = node.raft.rpartition(":")
    return host, int(port)


def lowest(cluster: LocalCluster) -> NodeAddress:
    """The member every other member dials (PySyncObj: the greater address dials)."""
    return min(cluster.nodes, key=lambda n: n.raft)


def wait_refusal(cluster: LocalCluster, node_id: str, before: int, reason: str) -> None:
    """``node_id`` logged a refusal beyond its first ``before`` ones, with ``reason``."""

    def seen() -> bool:
        lines = [line for line in log_text(cluster, node_id).splitlines() if "refused" in line]
        new = [line for line in lines if "peer connection refused" in line][before:]
        return any(reason in line for line in new)

    wait_for(seen, 30, f"{node_id} to refuse the impostor ({reason})")


def status_of(node: NodeAddress) -> dict[str, Any]:
    answer = raw_request(node.client, {"id": 1, "op": "status"})
    assert answer["ok"], answer
    result: dict[str, Any] = answer["result"]
    return result


def write(cluster: LocalCluster, key: str) -> None:
    with cluster.client() as client:
        lease = client.acquire(key, owner="a", ttl=300)
        client.release(lease)


# ------------------------------------------------------------ unit tests


@pytest.mark.timeout(30)
def test_the_reply_check_takes_exactly_the_dialled_members_fresh_bound_reply() -> None:
    n1, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    members = {"127.0.0.1:1": ("n1", [public_hex(n1)]), "127.0.0.1:3": ("n3", [public_hex(other)])}
    verifier = HelloVerifier("127.0.0.1:2", members.get)
    bind = os.urandom(32)  # the dialer's own random key
    now = 1_000_000.0
    good = make_reply(n1, "127.0.0.1:1", "n1", "n2", bind, now=now)
    verifier.verify_reply(good, "127.0.0.1:1", "n2", bind, now=now)

    def refused(message: Any, dialled: str = "127.0.0.1:1", binding: bytes = bind) -> str:
        with pytest.raises(HelloRefused) as info:
            verifier.verify_reply(message, dialled, "n2", binding, now=now)
        return str(info.value)

    assert "replayed" in refused(good)  # the same nonce again

    def fresh(
        key: Ed25519PrivateKey = n1,
        acc: str = "127.0.0.1:1",
        aid: str = "n1",
        did: str = "n2",
        at: float = now,
    ) -> Any:
        return make_reply(key, acc, aid, did, bind, now=at)

    # Another connection (binding), another key, another member's answer, a reply for
    # another dialer, an id that is not the dialled member's, stale or future time.
    assert "not signed" in refused(fresh(), binding=os.urandom(32))
    assert "not signed" in refused(fresh(key=other))
    assert "we dialled" in refused(fresh(key=other, acc="127.0.0.1:3", aid="n3"))
    assert "not this node" in refused(fresh(did="n3"))
    assert "answered for member" in refused(fresh(aid="n3"))
    for skew in (-61.0, 61.0):
        assert "from ours" in refused(fresh(at=now + skew))
    assert "no member" in refused(fresh(acc="127.0.0.1:7"), dialled="127.0.0.1:7")
    # A hello (same fields, the hello's own signature) never passes as a reply, nor a
    # reply's fields under a hello's signature.
    hello = make_hello(n1, "127.0.0.1:1", "n1", "n2", bind, now=now)
    assert "not a signed hello reply" in refused(hello)
    assert "not signed" in refused(("rl_hello_reply", *hello[1:]))
    for junk in (None, "127.0.0.1:1", {"type": "append_entries"}, ["status"], good[:7]):
        assert "not a signed hello reply" in refused(junk)
    assert "malformed" in refused((*good[:5], b"short", *good[6:]))


@pytest.mark.timeout(30)
def test_pysyncobj_dials_as_our_gate_expects() -> None:
    """What the dialer's gate relies on in PySyncObj 0.3.17 (transport.py): the
    dialer sends its random key on connect, answers the acceptor's with its address
    and counts the node connected at once; ``send`` needs only a CONNECTED state,
    which TcpConnection sets as soon as ``onConnected`` returns."""
    from pysyncobj import tcp_connection, transport

    tr = inspect.getsource(transport.TCPTransport)
    for fragment in (
        "def _onOutgoingConnected(self, conn):",
        "functools.partial(self._onOutgoingMessageReceived, conn)",
        "conn.send(conn.recvRandKey)",
        "def _onOutgoingMessageReceived(self, conn, message):",
        "self._sendSelfAddress(conn)",
        "conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))",
        "self._onNodeConnected(node)",
        "self._connections[node].state != CONNECTION_STATE.CONNECTED:",
        "conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))",
    ):
        assert fragment in tr, f"pysyncobj changed: {fragment!r}"
    conn = inspect.getsource(tcp_connection.TcpConnection)
    assert "self.__onConnected()" in conn and "self.__state = CONNECTION_STATE.CONNECTED" in conn
    # Each parsed frame goes to the callback set at that moment (the reply handler
    # hands the rest of a read batch to PySyncObj once the reply verified).
    assert "if self.__onMessageReceived is not None:" in conn


@pytest.mark.timeout(30)
def test_a_peer_key_is_checked_at_the_command_line_and_on_the_wire(tmp_path: Path) -> None:
    from raftlease.cli import main

    bad = tmp_path / "n4.pub"
    base = ["member", "add", "n4", "--raft", "127.0.0.1:1", "--client", "127.0.0.1:2"]
    # Refused before anything is sent (no node listens on these endpoints).
    endpoints = ["--endpoints", "127.0.0.1:9"]
    for text in ("", "zz" * 32, "ab" * 31, "ab" * 33, "-----BEGIN PRIVATE KEY-----\n"):
        bad.write_text(text)
        result = CliRunner().invoke(main, [*base, "--peer-key", str(bad), *endpoints])
        assert result.exit_code == 2, result.output
        assert "is not a public peer key" in result.output
    result = CliRunner().invoke(main, [*base, "--peer-key", str(tmp_path / "none"), *endpoints])
    assert result.exit_code == 2 and "cannot read" in result.output
    # The request's field: 64 hex digits, or refused definitely.
    message = {"id": 1, "op": "member_add", "member_id": "n4"}
    message.update(raft="127.0.0.1:1", client="127.0.0.1:2")
    assert parse_request({**message, "peer_key": "AB" * 32}, Limits()).args["peer_key"] == "ab" * 32
    assert "peer_key" not in parse_request(message, Limits()).args
    for junk in ("zz" * 32, "ab" * 31, "ab" * 33):
        with pytest.raises(InvalidArgumentError, match="peer_key"):
            parse_request({**message, "peer_key": junk}, Limits())


# ----------------------------------------------------- real node processes


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_an_impostor_on_a_stopped_members_address_is_refused_by_the_dialers(
    cluster_factory: Factory,
) -> None:
    """n1 (the member the others dial) stops; an insider holding only the cluster
    secret listens on its raft address. Whatever it answers the dialers' hellos with
    (nothing, a Raft message, a reply signed with another key, n1's own reply
    recorded on another connection), the dialers refuse it: no connection carries
    more than the key exchange and the hello, its huge term reaches no one, and with
    one more member down its acknowledgements and votes commit nothing."""
    cluster = cluster_factory(3)
    write(cluster, "mutual/before")
    low = lowest(cluster)
    dialers = [n for n in cluster.nodes if n.id != low.id]
    real_reply_key = key_of(cluster, low.id)  # what a recording of n1's replies holds
    forged = Ed25519PrivateKey.generate()
    cluster.stop_node(low.id)
    phases: list[tuple[str, Answer]] = [
        ("no signed hello reply", lambda bind, hello: None),
        (
            "not a signed hello reply",
            lambda bind, hello: {
                "type": "request_vote",
                "term": 10**6,
                "last_log_index": 10**9,
                "last_log_term": 10**6,
            },
        ),
        (
            "not signed by member",
            lambda bind, hello: make_reply(forged, low.raft, low.id, hello[3], bind),
        ),
        (
            "not signed by member",  # n1's genuine reply, but of another connection
            lambda bind, hello: make_reply(
                real_reply_key, low.raft, low.id, hello[3], os.urandom(32)
            ),
        ),
    ]
    fake = FakeAcceptor(raft_of(low), secret_of(cluster), phases[2][1])
    try:
        # One more real member down: the one left and the impostor would be a
        # majority, if the impostor counted (its acks, its votes).
        alone, gone = dialers[0], dialers[1]
        cluster.stop_node(gone.id)

        def steady() -> int | None:
            first = status_of(alone)["commit_index"]
            time.sleep(1.0)
            return int(first) if status_of(alone)["commit_index"] == first else None

        committed = wait_for(steady, 30, "the lone member's commit index to settle")
        with (
            pytest.raises(RaftLeaseError),
            cluster.client(deadline=8.0) as client,
        ):
            client.acquire("mutual/minority", owner="a", ttl=300)
        assert status_of(alone)["commit_index"] == committed, "committed without a majority"
        wait_refusal(cluster, alone.id, 0, "not signed by member")
        cluster.start_node(gone.id)
        cluster.wait_for_leader(60)
        write(cluster, "mutual/two-real")  # the two real members are a majority

        # Each way of answering the hello, on both dialers.
        for reason, answer in phases:
            before = {d.id: refusals(cluster, d.id) for d in dialers}
            fake.answer = answer
            fake.drop_connections()
            for dialer in dialers:
                wait_refusal(cluster, dialer.id, before[dialer.id], reason)
        assert all(status_of(d)["term"] < 10**6 for d in dialers)
        received = fake.received()
        assert len(received) >= 4 * len(dialers)
        for messages in received:
            # The dialer's random key and its hello; nothing else, ever.
            assert len(messages) <= 2, messages[2:]
            assert not any(isinstance(m, dict) for m in messages), messages
    finally:
        fake.close()

    # The real members come back: the cluster serves, n1 is accepted by the dialers.
    cluster.start_node(low.id)
    statuses = wait_for(
        lambda: (
            (found := [s for s in cluster.statuses() if s.get("reachable")])
            and len(found) == 3
            and all(s.get("leader") is not None for s in found)
            and found
        ),
        60,
        "all three members to know the leader again",
    )
    write(cluster, "mutual/after")
    assert refusals(cluster, low.id) == 0, log_text(cluster, low.id)
    assert all(s["term"] < 10**6 for s in statuses)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_members_own_reply_is_accepted_and_a_replayed_reply_is_not(
    cluster_factory: Factory,
) -> None:
    """Positive control: the impostor holding n1's key (that is n1) is accepted and
    streamed the log. Replays: n1's recorded reply on a new connection fails its
    nonce (a replay); re-signed for the new connection with the recorded nonce, too;
    a reply too old is refused (a fresh nonce under another connection's binding:
    the test above)."""
    cluster = cluster_factory(3)
    write(cluster, "mutual/replay")
    low = lowest(cluster)
    dialers = [n for n in cluster.nodes if n.id != low.id]
    key = key_of(cluster, low.id)
    baseline = {d.id: refusals(cluster, d.id) for d in dialers}
    cluster.stop_node(low.id)
    recorded: dict[str, Any] = {}  # dialer id -> the genuine reply it accepted

    def genuine(bind: bytes, hello: Any) -> Any:
        private = X25519PrivateKey.generate()
        mine = exchange_public(private)
        fake.agree[mine] = private
        reply = make_reply(key, low.raft, low.id, hello[3], bind, exchange=mine)
        recorded.setdefault(hello[3], reply)
        return reply

    fake = FakeAcceptor(raft_of(low), secret_of(cluster), genuine)
    try:
        # The leader among the dialers streams the log to the (key-holding) impostor.
        wait_for(
            lambda: any(
                isinstance(m, dict) and m.get("type") == "append_entries"
                for c in fake.received()
                for m in c
            ),
            30,
            "the impostor holding n1's key to be streamed the log",
        )
        wait_for(lambda: len(recorded) == len(dialers), 30, "both dialers to accept n1's reply")
        assert all(refusals(cluster, d.id) == baseline[d.id] for d in dialers)
        phases: list[tuple[str, Answer]] = [
            ("replayed hello reply", lambda bind, hello: recorded[hello[3]]),
            (
                "replayed hello reply",
                lambda bind, hello: make_reply(
                    key, low.raft, low.id, hello[3], bind, nonce=recorded[hello[3]][5]
                ),
            ),
            (
                "from ours",
                lambda bind, hello: make_reply(
                    key, low.raft, low.id, hello[3], bind, now=time.time() - 120
                ),
            ),
        ]
        for reason, answer in phases:
            before = {d.id: refusals(cluster, d.id) for d in dialers}
            fake.answer = answer
            fake.drop_connections()
            for dialer in dialers:
                wait_refusal(cluster, dialer.id, before[dialer.id], reason)
    finally:
        fake.close()
    cluster.start_node(low.id)
    cluster.wait_for_leader(60)
    write(cluster, "mutual/replay-after")


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_member_add_with_peer_key(tmp_path: Path) -> None:
    """Each member with its own key folder (as on separate hosts); no member has
    n4's key. ``member add --peer-key`` with a key contradicting the one the leader has
    is refused (exit 1, nothing changed); with n4's key file it adds n4: the leader
    checks the learner with it, the entry carries it, every member keeps it."""
    import shutil

    cluster = LocalCluster(3, settings=dict(FAST_SETTINGS))
    try:
        for node in cluster.nodes:
            cluster.node_settings[node.id] = {"peer_keys_dir": str(tmp_path / f"keys-{node.id}")}
        cluster.start(wait=False)
        folders = {n.id: tmp_path / f"keys-{n.id}" for n in cluster.nodes}
        wait_for(
            lambda: all((folders[n.id] / f"{n.id}.pub").exists() for n in cluster.nodes),
            30,
            "every node to publish its key",
        )
        for src in cluster.nodes:
            for folder in folders.values():
                if not (folder / f"{src.id}.pub").exists():
                    shutil.copy(folders[src.id] / f"{src.id}.pub", folder)
        cluster.wait_for_leader(60)
        write(cluster, "mutual/three")

        n4 = new_node_that_dials(cluster, "n4")
        n4_keys = tmp_path / "keys-n4"
        n4_keys.mkdir(mode=0o700)
        for folder_id, folder in folders.items():
            shutil.copy(folder / f"{folder_id}.pub", n4_keys)
        cluster.node_settings["n4"] = {"peer_keys_dir": str(n4_keys)}
        cluster.start_node("n4")
        wait_for(lambda: (n4_keys / "n4.pub").exists(), 30, "n4 to publish its key")
        pub_file = tmp_path / "given-n4.pub"
        shutil.copy(n4_keys / "n4.pub", pub_file)
        pub = pub_file.read_text().strip()
        old_leader(cluster)

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            cmd = [sys.executable, "-m", "raftlease", "member", "add", "n4"]
            cmd += ["--raft", n4.raft, "--client", n4.client, *args]
            cmd += ["--endpoints", ",".join(n.client for n in cluster.nodes[:3]), "--json"]
            return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

        # Every member's folder holds another key for n4 (whoever leads has it).
        other = public_hex(Ed25519PrivateKey.generate())
        for folder in folders.values():
            (folder / "n4.pub").write_text(other + "\n")
        refused = cli("--peer-key", str(pub_file))
        assert refused.returncode == 1, refused.stdout + refused.stderr
        answer = json.loads(refused.stdout)
        assert answer["code"] == "INVALID_ARGUMENT" and answer["definite"] is True
        assert "not the one this leader already has" in answer["message"]
        for folder in folders.values():
            (folder / "n4.pub").unlink()
        assert members(cluster, cluster.node(old_leader(cluster)).client) == ["n1", "n2", "n3"]

        added = cli("--peer-key", str(pub_file))
        assert added.returncode == 0, added.stdout + added.stderr
        result = json.loads(added.stdout)
        assert result["members"] == ["n1", "n2", "n3", "n4"] and result["caught_up"] is True
        wait_for(lambda: all_agree(cluster, ["n1", "n2", "n3", "n4"]), 60, "four members")
        for node_id, folder in folders.items():
            wait_for(
                lambda f=folder: read_public_key(f, "n4") == pub,
                30,
                f"{node_id} to keep n4's key from the change entry",
            )
        # n4 counts: with one old member down, a majority of four needs n4.
        leader = old_leader(cluster)
        down = [n.id for n in cluster.nodes[:3] if n.id != leader][:1]
        for node_id in down:
            cluster.stop_node(node_id)
        write(cluster, "mutual/four")
        assert refusals(cluster, "n4") == 0, log_text(cluster, "n4")
    finally:
        cluster.close()
