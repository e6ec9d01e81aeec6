"""An impostor in a stopped member's place and a relay on the path between two
members, against real node processes on 127.0.0.1 (docs/security.md, "Peers";
transport.py ``_onTlsVerified``, peers.py): the dialers check the acceptor's
certificate names the member they dialled, so an impostor's acknowledgements and
votes never count; a relay reads none of the traffic and an altered record closes
the connection. Replaces git show 85c1991:tests/test_peer_mutual.py and
tests/test_peer_conn_key.py. Helpers: tests/integration/test_peer_tls_cluster.py.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlease.errors import RaftLeaseError
from raftlease.testing import LocalCluster, free_port_block, wait_for
from raftlease.testing.certs import ClusterCerts
from tests.conftest import FAST_SETTINGS
from tests.integration.test_peer_tls_cluster import (
    Frames,
    Pair,
    commits,
    frame,
    log_text,
    logged,
    raft_addr,
    tls_context,
    wait_logged,
)

pytestmark = pytest.mark.integration

Factory = Callable[..., LocalCluster]


# ------------------------------------------------------- in a member's place


class Impostor:
    """A TLS server bound on a stopped member's raft address, presenting a certificate
    of our choosing (``use`` swaps it for new connections), behaving as an eager
    follower for any dialer that takes it: it grants every pre-vote and vote and
    acknowledges every ``append_entries`` as appended. Counts the connections
    (``accepted``) and the completed handshakes (``handshakes``) and records every
    message received (``received``)."""

    def __init__(self, addr: tuple[str, int], ca: Path, cert: Pair) -> None:
        self.ca = ca
        self.context = tls_context(ca, *cert, server=True)
        self.lock = threading.Lock()
        self.accepted = 0
        self.handshakes = 0
        self.messages: list[Any] = []
        self.closing = False
        self.socks: list[socket.socket] = []
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        wait_for(lambda: self._bind(addr), 20, f"binding {addr}")
        self.server.listen(16)
        self.server.settimeout(0.2)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _bind(self, addr: tuple[str, int]) -> bool:
        self.server.bind(addr)  # OSError (retried) while the member's socket lingers
        return True

    def use(self, cert: Pair) -> None:
        """Present ``cert`` from now on, and drop the open connections."""
        self.context = tls_context(self.ca, *cert, server=True)
        with self.lock:
            socks, self.socks = self.socks, []
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while not self.closing:
            try:
                sock, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                self.socks.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(10)
        try:
            sock = self.context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            raw.close()
            return
        with self.lock:
            self.handshakes += 1
        frames = Frames()
        try:
            while not self.closing:
                data = sock.recv(65536)
                if not data:
                    return
                for message in frames.feed(data):
                    with self.lock:
                        self.messages.append(message)
                    answer = self._follow(message)
                    if answer is not None:
                        sock.sendall(frame(answer))
        except (ssl.SSLError, OSError):
            return
        finally:
            with contextlib.suppress(OSError):
                sock.close()

    @staticmethod
    def _follow(message: Any) -> dict[str, Any] | None:
        if not isinstance(message, dict):
            return None
        kind = message.get("type")
        if kind == "append_entries" and "prevLogIdx" in message:
            appended = message["prevLogIdx"] + len(message.get("entries") or []) + 1
            return {
                "type": "next_node_idx",
                "next_node_idx": appended,
                "reset": False,
                "success": True,
                "rl_et": message.get("term"),
                "rl_e": message.get("rl_s"),
                "rl_t": time.monotonic(),
            }
        if kind == "request_vote" and not message.get("rl_bump"):
            return {"type": "response_vote", "term": message.get("term")}
        if kind == "rl_pre_vote":
            term = message.get("term")
            return {
                "type": "rl_pre_vote_response",
                "term": term,
                "round": message.get("round"),
                "granted": True,
                "rl_term": term - 1 if isinstance(term, int) else 0,
            }
        return None

    def received(self) -> list[Any]:
        with self.lock:
            return list(self.messages)

    def close(self) -> None:
        self.closing = True
        with self.lock:
            socks, self.socks = self.socks, []
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self.thread.join(timeout=10)


@pytest.mark.timeout(180)
def test_an_impostor_on_a_stopped_members_address_is_refused_by_the_dialers(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    """The acceptor proves who it is too. The member every other one dials (the
    lowest address: PySyncObj's greater address dials) stops, and an impostor
    listens on its raft address, eager to acknowledge and vote: with a certificate
    of another CA (naming that member), then with another member's genuine
    certificate. The dialers refuse it at each connection, before sending it a
    single frame; with one more real member down, the lone member commits nothing
    (the impostor's acknowledgements and votes never count). Positive control: the
    real members restarted, commits resume and nobody refuses anybody."""
    cluster = cluster_factory(3)
    commits(cluster, "mutual/before")
    low = min(cluster.nodes, key=lambda n: raft_addr(n)[1])
    alone, gone = (n for n in cluster.nodes if n.id != low.id)
    ca = cluster.certs.ca.cert_file
    foreign = ClusterCerts(tmp_path / "foreign").member(low.id)
    cluster.stop_node(low.id)
    impostor = Impostor(raft_addr(low), ca, foreign)
    try:
        verify_failed = "TLS handshake failed (CERTIFICATE_VERIFY_FAILED"
        for dialer in (alone, gone):
            wait_logged(cluster, dialer.id, verify_failed)
        assert impostor.handshakes == 0
        # Another member's genuine certificate: the handshake completes, the check
        # of the member it names does not.
        impostor.use(cluster.certs.member(gone.id))
        wrong = f"{low.id} at {low.raft} presented a certificate for {gone.id}, not for {low.id}"
        wait_for(
            # (A build that takes the impostor sends it frames instead: on to the
            # commit check, which is what must fail then.)
            lambda: impostor.received() or all(logged(cluster, d.id, wrong) for d in (alone, gone)),
            20,
            "both dialers to refuse the impostor's certificate",
        )
        # One more real member down: the lone one and the impostor would be a
        # majority, if the impostor counted.
        cluster.stop_node(gone.id)
        with pytest.raises(RaftLeaseError), cluster.client(deadline=3.0) as client:
            client.acquire("mutual/minority", owner="a", ttl=300)
        committed = cluster.node_status(alone.id)["commit_index"]
        with pytest.raises(RaftLeaseError), cluster.client(deadline=2.0) as client:
            client.acquire("mutual/minority-2", owner="a", ttl=300)
        assert cluster.node_status(alone.id)["commit_index"] == committed, "committed alone"
        assert impostor.received() == [], "a dialer sent the impostor a frame"
        before = logged(cluster, alone.id, wrong)
        wait_logged(cluster, alone.id, wrong, before)  # still dialling, still refusing
    finally:
        impostor.close()

    # Positive control: the real members come back and commits resume.
    cluster.start_node(low.id)
    cluster.start_node(gone.id)
    cluster.wait_for_leader(60)
    commits(cluster, "mutual/after", timeout=60)
    assert logged(cluster, low.id, "peer connection refused") == 0, log_text(cluster, low.id)


# ------------------------------------------------------------- on the path


class Relay:
    """A TCP relay on the path from a dialing member to an accepting one (the
    dialer's ``dial`` setting points at it): it passes every byte on and records
    it, both ways. Once ``arm`` is set, it flips the last byte (in the AEAD tag) of
    the next TLS application-data record the dialer sends, and notes on which
    connection (``tampered``; ``closed`` is set when that connection ends)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.upstream = ("127.0.0.1", 0)  # the acceptor's raft address, set before use
        self.listener = socket.create_server(("127.0.0.1", port))
        self.listener.settimeout(0.2)
        self.lock = threading.Lock()
        self.streams: list[tuple[bytearray, bytearray]] = []  # (from the dialer, back)
        self.arm = threading.Event()
        self.closed = threading.Event()
        self.tampered: int | None = None
        self.sockets: list[socket.socket] = []
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                down, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                up = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                down.close()  # the acceptor is not up (yet): the dialer retries
                continue
            up.settimeout(None)
            down.settimeout(None)
            with self.lock:
                self.streams.append((bytearray(), bytearray()))
                number = len(self.streams) - 1
                self.sockets += [down, up]
            for src, dst, way in ((down, up, 0), (up, down, 1)):
                args = (src, dst, number, way)
                threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, number: int, way: int) -> None:
        buffer = b""
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                with self.lock:
                    self.streams[number][way].extend(chunk)
                if way == 1:
                    dst.sendall(chunk)
                    continue
                # From the dialer: passed on whole TLS records (header: type, version,
                # 2-byte length), so that one can be altered.
                buffer += chunk
                out = b""
                while len(buffer) >= 5:
                    end = 5 + int.from_bytes(buffer[3:5], "big")
                    if len(buffer) < end:
                        break
                    record, buffer = buffer[:end], buffer[end:]
                    with self.lock:
                        if record[0] == 23 and self.arm.is_set() and self.tampered is None:
                            record = record[:-1] + bytes([record[-1] ^ 1])
                            self.tampered = number
                    out += record
                if out:
                    dst.sendall(out)
        except OSError:
            pass
        finally:
            if self.tampered == number:
                self.closed.set()
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def recorded(self) -> list[tuple[bytes, bytes]]:
        with self.lock:
            return [(bytes(a), bytes(b)) for a, b in self.streams]

    def stop(self) -> None:
        self.stopping = True
        self.listener.close()
        with self.lock:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.close()
        self.thread.join(timeout=10)


@pytest.fixture
def relayed(request: pytest.FixtureRequest) -> Iterator[tuple[LocalCluster, Relay, str]]:
    """A 3-node cluster whose middle member dials the lowest one through a ``Relay``
    (the ``dial`` setting, as jepsen-style/proxy.py routes peers); the highest member
    is then stopped, so every commit crosses the relay. Yields the cluster, the
    relay and the acceptor's id."""
    # The relay's port is bound first, so that the cluster's block is drawn around it.
    relay = Relay(free_port_block(1))
    cluster = LocalCluster(3, settings=dict(FAST_SETTINGS))
    low, mid, high = sorted(cluster.nodes, key=lambda n: raft_addr(n)[1])
    relay.upstream = raft_addr(low)
    cluster.node_settings = {mid.id: {"dial": {low.id: f"127.0.0.1:{relay.port}"}}}
    try:
        cluster.start()
        cluster.stop_node(high.id)
        cluster.wait_for_leader(60, exclude=high.id)
        yield cluster, relay, low.id
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(cluster.logs())
        relay.stop()
        cluster.close()


@pytest.mark.timeout(120)
def test_a_relay_on_the_path_reads_nothing_and_an_altered_record_closes_the_connection(
    relayed: tuple[LocalCluster, Relay, str],
) -> None:
    """Writes commit through the relay, which sees TLS 1.3 records only: the keys and
    owners acquired, written in clear in the members' journals (what a relay of the
    old plain frames read), never appear in the bytes it passed. A record altered
    after the handshake fails its authentication: the acceptor closes that
    connection (and says so), the dialer connects again and commits go on."""
    cluster, relay, acceptor = relayed
    mark = os.urandom(6).hex()
    key, owner = f"relay/secret-key-{mark}", f"owner-{mark}"

    def total() -> int:
        return sum(len(sent) + len(back) for sent, back in relay.recorded())

    before = total()
    with cluster.client() as client:
        for n in range(5):
            assert client.acquire(f"{key}-{n}", owner=owner, ttl=300).owner == owner
    # Every entry crossed the relay (the only path between the two members up).
    assert total() - before >= 5 * len(f"{key}-0{owner}")
    journal = (cluster.node_dir(acceptor) / "raft.journal").read_bytes()
    assert key.encode() in journal and owner.encode() in journal  # in clear at rest
    streams = relay.recorded()
    for sent, back in streams:
        for stream in (sent, back):
            assert key.encode() not in stream and owner.encode() not in stream
            assert mark.encode() not in stream
        # A TLS handshake (ClientHello, ServerHello), then TLS 1.3 records.
        assert sent[:1] == b"\x16" and back[:1] == b"\x16", (sent[:8], back[:8])
        assert b"\x17\x03\x03" in sent and b"\x17\x03\x03" in back

    closed = "peer connection closed: DECRYPTION_FAILED_OR_BAD_RECORD_MAC"
    before = logged(cluster, acceptor, closed)
    relay.arm.set()
    wait_for(relay.closed.is_set, 30, "the altered record to close the connection")
    wait_logged(cluster, acceptor, closed, before)
    tampered = relay.tampered
    assert tampered is not None
    wait_for(lambda: len(relay.recorded()) > tampered + 1, 30, "a new connection")
    commits(cluster, f"{key}-after")
    sent, back = relay.recorded()[-1]
    assert key.encode() not in sent + back
