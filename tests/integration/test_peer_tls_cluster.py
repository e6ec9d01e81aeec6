"""Mutual TLS on the raft port of real node processes on 127.0.0.1 (docs/security.md,
"Peers"; peers.py, peer_tls.py, transport.py): what a stranger and an insider holding
some certificate can do there, and what a node refuses at start.

Each guarantee of the handshake-era tests (git show 85c1991:tests/test_peer_*.py)
that still applies, rewritten for TLS: nothing a stranger sends is parsed, absurd
input is cut off before it is buffered, a connection is member n2 only with a
certificate of the cluster CA naming n2 and n2's address, a member connection carries
only the Raft messages we use, a node refuses to start without valid peer TLS, its
files are private. An impostor in a member's place and a relay on the path:
tests/integration/test_peer_tls_impostors.py; reloads (SIGHUP):
tests/integration/test_peer_tls_reload.py; the
same mechanisms in one process: tests/unit/test_peer_tls.py. The helpers here serve all
three files.
"""

from __future__ import annotations

import contextlib
import pickle
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from pysyncobj.syncobj import _COMMAND_TYPE

from raftlease import pki
from raftlease.config import NodeAddress
from raftlease.errors import RaftLeaseError
from raftlease.replication.journal import seal_command
from raftlease.replication.peer_tls import MAX_HANDSHAKE_BYTES
from raftlease.replication.peers import PICKLE_PROTOCOL, zlib_frame
from raftlease.testing import LocalCluster, free_port_block, port_free, wait_for
from raftlease.testing.certs import ClusterCerts
from tests.conftest import FAST_SETTINGS

pytestmark = pytest.mark.integration

Factory = Callable[..., LocalCluster]
#: A certificate and its key.
Pair = tuple[Path, Path]


# ------------------------------------------------------------------ helpers


def raft_addr(node: NodeAddress) -> tuple[str, int]:
    host, _, port = node.raft.rpartition(":")
    return host, int(port)


def log_text(cluster: LocalCluster, node_id: str) -> str:
    return cluster.log_path(node_id).read_text(errors="replace")


def logged(cluster: LocalCluster, node_id: str, text: str) -> int:
    """How many lines of ``node_id``'s log hold ``text``."""
    return sum(text in line for line in log_text(cluster, node_id).splitlines())


def wait_logged(
    cluster: LocalCluster, node_id: str, text: str, before: int = 0, timeout: float = 20.0
) -> None:
    """Wait until ``node_id``'s log holds more than ``before`` lines with ``text``."""
    wait_for(
        lambda: logged(cluster, node_id, text) > before,
        timeout,
        f"{text!r} in {node_id}'s log (more than {before})",
    )


def commits(cluster: LocalCluster, key: str, timeout: float = 30.0) -> None:
    """A write commits (retried while the cluster settles, up to ``timeout``)."""

    def once() -> bool:
        with cluster.client() as client:
            return client.acquire(key, owner="a", ttl=300).token > 0

    wait_for(once, timeout, f"the cluster to commit {key!r}")


def tls_context(ca: Path, cert: Path, key: Path, server: bool = False) -> ssl.SSLContext:
    """A TLS 1.3 context presenting ``cert``: as a client it checks the server against
    ``ca`` (a stranger knows the cluster's public CA); as a server it takes anyone."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE if server else ssl.CERT_REQUIRED
    if not server:
        context.load_verify_locations(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    return context


def frame(message: Any) -> bytes:
    """PySyncObj's framing as our members send it (peers.py): a native-endian 4-byte
    length, then a zlib stream of the pickle."""
    data = zlib_frame(pickle.dumps(message, PICKLE_PROTOCOL))
    return struct.pack("i", len(data)) + data


class Frames:
    """Frames parsed out of a byte stream (the node is trusted here: plain pickle)."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, data: bytes) -> list[Any]:
        self.buffer += data
        out = []
        while len(self.buffer) >= 4:
            (length,) = struct.unpack_from("i", self.buffer)
            if len(self.buffer) < 4 + length:
                break
            body, self.buffer = self.buffer[4 : 4 + length], self.buffer[4 + length :]
            out.append(pickle.loads(zlib.decompress(body)))
        return out


class TlsDialer:
    """Our own TLS client on a member's raft port, presenting any certificate, with
    PySyncObj's frames inside: what a holder of that certificate can do."""

    def __init__(self, addr: tuple[str, int], ca: Path, cert: Pair, timeout: float = 10.0) -> None:
        raw = socket.create_connection(addr, timeout=timeout)
        try:
            # TLS 1.3: the client's handshake ends before the server has checked the
            # client's certificate; a refusal arrives as an alert at the next read.
            self.sock = tls_context(ca, *cert).wrap_socket(raw)
        except (ssl.SSLError, OSError):
            raw.close()
            raise
        self.frames = Frames()
        self.received: list[Any] = []

    def send(self, message: Any) -> None:
        self.sock.sendall(frame(message))

    def next_message(self, timeout: float = 10.0) -> Any:
        """The next frame from the node; None once the connection is closed (an end
        of stream, an alert, a reset). Raises ``TimeoutError`` if nothing comes."""
        deadline = time.monotonic() + timeout
        while not self.received:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except (ssl.SSLError, ConnectionError):
                return None
            if not data:
                return None
            self.received += self.frames.feed(data)
        return self.received.pop(0)

    def refused(self, timeout: float = 10.0) -> bool:
        """True if the node closes the connection before sending any frame (a frame,
        or a connection left open, means it was taken)."""
        try:
            return self.next_message(timeout) is None
        except TimeoutError:
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def dial(addr: tuple[str, int], ca: Path, cert: Pair) -> TlsDialer | None:
    """A ``TlsDialer``, or None if the node refused the handshake outright."""
    try:
        return TlsDialer(addr, ca, cert)
    except (ssl.SSLError, ConnectionError):
        return None


def closed_silently(sock: socket.socket, timeout: float = 10.0) -> bytes | None:
    """What the node sends before closing ``sock`` (at most a TLS alert is allowed
    by the callers), or None if it keeps the connection open for ``timeout``."""
    sock.settimeout(timeout)
    got = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(got) < 1 << 20:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return got
        except TimeoutError:
            return None
        if not data:
            return got
        got += data
    return None


def is_alert_or_nothing(data: bytes) -> bool:
    """Nothing, or only TLS alert records (content type 21): no handshake, no data."""
    while data:
        if len(data) < 5 or data[0] != 21:
            return False
        data = data[5 + int.from_bytes(data[3:5], "big") :]
    return True


def vm_kib(pid: int, field: str = "VmRSS") -> int:
    """A /proc/PID/status memory figure (kB) of a node process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


class _MakesAFile:
    """Unpickling this creates a file: the proof that a frame reached pickle."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


# ------------------------------------------------------------ strangers


@pytest.mark.timeout(90)
def test_a_strangers_pickle_runs_nothing_and_the_cluster_commits(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    """PySyncObj's plain frame carrying a pickle that would create a file, sent to
    every member's raft port (as PySyncObj frames it, and as our members do): the
    TLS handshake fails on it, nothing is unpickled, the node answers at most an
    alert and closes; every node stays up and the cluster commits."""
    cluster = cluster_factory(3)
    proof = tmp_path / "pwned"
    payloads = [
        zlib.compress(pickle.dumps(_MakesAFile(str(proof)))),  # PySyncObj's (protocol 2)
        zlib_frame(pickle.dumps(_MakesAFile(str(proof)), PICKLE_PROTOCOL)),  # ours
    ]
    failed = "peer connection refused: TLS handshake failed"
    before = {n.id: logged(cluster, n.id, failed) for n in cluster.nodes}
    for node in cluster.nodes:
        for payload in payloads:
            with socket.create_connection(raft_addr(node), timeout=10) as sock:
                sock.sendall(struct.pack("i", len(payload)) + payload)
                answer = closed_silently(sock)
            assert answer is not None, f"{node.id} kept a stranger's connection open"
            assert is_alert_or_nothing(answer), answer[:64]
    for node in cluster.nodes:
        wait_logged(cluster, node.id, failed, before[node.id] + 1)
    assert not proof.exists(), "a stranger's frame was unpickled"
    commits(cluster, "stranger/after")
    assert all(cluster.is_running(n.id) for n in cluster.nodes)


def _flood(addr: tuple[str, int], prefix: bytes, chunk: bytes, limit: int, seconds: float) -> int:
    """Send ``prefix``, then ``chunk`` again and again, at most ``limit`` bytes in all
    and for at most ``seconds``; returns the bytes sent before the node closed the
    connection (fails if it did not)."""
    sent = 0
    deadline = time.monotonic() + seconds
    with socket.create_connection(addr, timeout=seconds) as sock:
        # A small send buffer, so that "sent" is close to what reached the node.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        try:
            sock.sendall(prefix)
            sent = len(prefix)
            while sent < limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"still open after {seconds} s and {sent} bytes")
                sock.settimeout(left)
                sent += sock.send(chunk)
        except (BrokenPipeError, ConnectionResetError):
            return sent
    raise AssertionError(f"the node took all {limit} bytes")


@pytest.mark.timeout(120)
def test_absurd_input_before_the_handshake_is_cut_off_and_the_leader_keeps_leading(
    cluster_factory: Factory,
) -> None:
    """The issue's attack on the leader: a 2 GiB length prefix, then up to 64 MiB (the
    old transport buffered it all, and missed heartbeats while it did); and bytes
    that keep OpenSSL waiting for a ClientHello longer than a handshake (16 KiB
    handshake records announcing a 64 KiB+ message). Each connection is closed
    after at most a handshake's worth of bytes (``MAX_HANDSHAKE_BYTES``; what else
    was sent sat in socket buffers), the leader's memory does not grow by the
    flood, it keeps its term (no election), and linearizable reads go on."""
    cluster = cluster_factory(3)
    status = cluster.wait_for_leader()
    leader, term = str(status["node"]), int(status["term"])
    pid = cluster.pid(leader)
    addr = raft_addr(cluster.node(leader))
    record = b"\x16\x03\x01\x40\x00" + b"\x01" * 0x4000
    sent: list[int] = []
    errors: list[BaseException] = []

    def flooder() -> None:
        try:
            for _ in range(10):
                sent.append(_flood(addr, struct.pack("i", 2**31 - 1), bytes(65536), 64 << 20, 10))
                sent.append(_flood(addr, b"", record, 64 << 20, 10))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    before = logged(cluster, leader, "before its TLS handshake completed")
    reads: list[bool] = []
    with cluster.client() as client:
        client.acquire("flood/probe", owner="a", ttl=300)
        rss_before = vm_kib(pid)
        peak = rss_before
        threads = [threading.Thread(target=flooder, daemon=True) for _ in range(3)]
        for thread in threads:
            thread.start()
        # Linearizable reads while the flood goes on (bounded in count and time).
        deadline = time.monotonic() + 60
        while (any(t.is_alive() for t in threads) or len(reads) < 5) and (
            time.monotonic() < deadline and len(reads) < 10_000
        ):
            try:
                held = client.holder("flood/probe")
                reads.append(held is not None and held.owner == "a")
            except RaftLeaseError:
                reads.append(False)
            peak = max(peak, vm_kib(pid))
        for thread in threads:
            thread.join(timeout=30)
        assert not errors, errors
        assert len(sent) == 60
        held = client.holder("flood/probe")
        assert held is not None and held.owner == "a"
    # Each connection was closed long before its 64 MiB: what the node read is at
    # most MAX_HANDSHAKE_BYTES plus a socket read; the rest sat in socket buffers.
    assert max(sent) < 1 << 20, sent
    wait_logged(cluster, leader, "before its TLS handshake completed", before)
    assert reads and all(reads), f"{reads.count(False)} of {len(reads)} reads failed"
    grown = max(peak, vm_kib(pid)) - rss_before
    assert grown < 8 * 1024, f"the leader's RSS grew by {grown} KiB during the flood"
    after = cluster.wait_for_leader()
    assert (after["node"], after["term"]) == (leader, term), "an election during the flood"
    assert MAX_HANDSHAKE_BYTES == 64 * 1024  # what the docstring and the bound assume


# ------------------------------------------------------------ identities


def stop_the_top_member(cluster: LocalCluster) -> tuple[NodeAddress, NodeAddress]:
    """Stop the member with the greatest raft address and wait for a leader among the
    others: (the stopped member, the leader). The stopped member is the one that dials
    the leader (PySyncObj's rule: the greater address dials), so a connection in its
    name is one the leader takes; a member below the leader that dials it is refused,
    because the leader dials that one itself (transport.py, _dial_silent_members)."""
    stopped = max(cluster.nodes, key=lambda n: n.raft)
    cluster.stop_node(stopped.id)
    leader = cluster.node(cluster.wait_for_leader()["node"])
    assert leader.raft < stopped.raft
    return stopped, leader


@pytest.mark.timeout(120)
def test_only_a_certificate_naming_the_member_it_claims_is_taken(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    """A stopped member's raft address claimed on the leader's raft port: with a
    certificate of another CA (the handshake fails), a client certificate of the
    same CA whose common name is the member's id (it names no member), another
    running member's genuine certificate, a certificate of the same CA for a
    non-member (n9); and utility or read-only first frames. Each is closed before
    anything it sent is taken, with the reason logged; nothing it sent after reaches
    the Raft filter. Positive control: the member's own certificate is taken (the
    leader streams it the log)."""
    cluster = cluster_factory(3)
    stopped, leader = stop_the_top_member(cluster)
    other = next(n for n in cluster.nodes if n.id not in (stopped.id, leader.id))
    ca = cluster.certs.ca.cert_file
    foreign = ClusterCerts(tmp_path / "foreign").member(stopped.id)
    client_cert = pki.issue(cluster.certs.ca, tmp_path / "clients", stopped.id, client=True)
    assert pki.member_ids(pki.load_certificates(client_cert[0])[0]) == []
    n9 = cluster.certs.member("n9")
    own = cluster.certs.member(stopped.id)
    claims = f"it claims {stopped.id}'s address {stopped.raft} with a certificate for"
    attempts: list[tuple[str, Pair, Any, str]] = [
        ("another CA", foreign, stopped.raft, "TLS handshake failed (CERTIFICATE_VERIFY_FAILED"),
        ("a client certificate", client_cert, stopped.raft, f"{claims} no member"),
        ("another member's", cluster.certs.member(other.id), stopped.raft, f"{claims} {other.id}"),
        ("a non-member's", n9, stopped.raft, f"{claims} n9"),
        ("a non-member's own", n9, "127.0.0.1:1", "its first frame names no member"),
        ("a utility command", own, ["status"], "its first frame names no member (['status'])"),
        ("a read-only node", own, "readonly", "its first frame names no member ('readonly')"),
    ]
    taken = []
    for what, cert, first, reason in attempts:
        before = logged(cluster, leader.id, reason)
        peer = dial(raft_addr(leader), ca, cert)
        if peer is not None:
            with contextlib.suppress(OSError):
                peer.send(first)
                # Anything after it is never taken (the connection is closed first).
                peer.send({"type": "timeout_now", "term": 10**9})
            refused = peer.refused()
            peer.close()
            if not refused:
                taken.append(what)
                continue
        wait_logged(cluster, leader.id, reason, before)
    assert taken == [], f"connections taken as member {stopped.id}: {taken}"
    assert "message: dropped" not in log_text(cluster, leader.id)  # nothing reached a member

    # Positive control: the stopped member's own certificate and address are taken.
    peer = dial(raft_addr(leader), ca, own)
    assert peer is not None
    try:
        peer.send(stopped.raft)
        message = peer.next_message()
        assert isinstance(message, dict) and message["type"] == "append_entries", message
    finally:
        peer.close()
    status = cluster.wait_for_leader()
    assert status["node"] == leader.id and status["term"] < 10**6
    commits(cluster, "identity/after")


@pytest.mark.timeout(120)
def test_a_follower_that_hears_its_leader_takes_no_newer_member_as_a_guest(
    cluster_factory: Factory,
) -> None:
    """A genuine member certificate of the CA for an id no member has (n9, issued and
    never added), at an address no member has: a follower that hears its leader
    refuses it (a guest is taken only by a node cut off from its configuration:
    docs/membership.md), and a frame it sends after is never taken."""
    cluster = cluster_factory(3)
    leader = cluster.leader_id()
    follower = cluster.node(next(n.id for n in cluster.nodes if n.id != leader))
    reason = "its first frame names no member ('127.0.0.1:1')"
    before = logged(cluster, follower.id, reason)
    peer = dial(raft_addr(follower), cluster.certs.ca.cert_file, cluster.certs.member("n9"))
    assert peer is not None
    try:
        with contextlib.suppress(OSError):
            peer.send("127.0.0.1:1")
            peer.send({"type": "request_vote", "term": 10**6, "last_log_index": 10**9})
        assert peer.refused()
    finally:
        peer.close()
    wait_logged(cluster, follower.id, reason, before)
    assert "member of a newer configuration" not in log_text(cluster, follower.id)
    status = cluster.wait_for_leader()
    assert status["node"] == leader and status["term"] < 10**6


@pytest.mark.timeout(120)
def test_a_member_connection_carries_only_the_raft_messages_we_use(
    cluster_factory: Factory,
) -> None:
    """An insider holding a stopped member's genuine certificate and key is taken as
    that member by the leader; still, what it sends beyond the Raft messages we use
    is dropped: a proposal (``apply_command``, a would-be acquire), PySyncObj's
    utility commands, ``readonly``, a ``timeout_now`` with a huge term. Nothing is
    answered, nothing is applied, no term moves."""
    cluster = cluster_factory(3)
    stopped, leader = stop_the_top_member(cluster)
    status = cluster.wait_for_leader()
    assert status["node"] == leader.id
    key = "injected/by-an-insider"
    entry = {
        "op": "acquire",
        **{"cid": "insider", "seq": 1, "ack": 1, "key": key, "lid": "f" * 32},
        **{"owner": "insider", "ttl": 300_000, "term": status["term"]},
        **{"now": status["log_time"], "seed": 1, "fv": 2},
    }
    # What PySyncObj's forwarding carries: the command type, then the replicated call
    # (Replica.propose; apply_entry is the only replicated method: id 0).
    call = seal_command((0, (msgpack.packb(entry, use_bin_type=True),)))
    command = bytes([_COMMAND_TYPE.REGULAR]) + call
    injected: list[tuple[str, Any]] = [
        ("'apply_command' message: dropped", {"type": "apply_command", "command": command}),
        (
            "'apply_command' message: dropped",
            {"type": "apply_command", "command": command, "request_id": 7},
        ),
        ("'list' message: dropped", ["status"]),
        ("'list' message: dropped", ["add", "127.0.0.1:1"]),
        ("'str' message: dropped", "readonly"),
        ("'timeout_now' message: dropped", {"type": "timeout_now", "term": 10**9}),
    ]
    drops = {text: logged(cluster, leader.id, text) for text, _ in injected}
    peer = dial(raft_addr(leader), cluster.certs.ca.cert_file, cluster.certs.member(stopped.id))
    assert peer is not None
    try:
        peer.send(stopped.raft)
        first = peer.next_message()
        assert isinstance(first, dict) and first["type"] == "append_entries"  # taken
        for _, message in injected:
            peer.send(message)
        # What comes back on the connection: Raft traffic only (no proposal result, no
        # utility answer), read until ten more messages (heartbeats) have come.
        answers = []
        for _ in range(10):
            message = peer.next_message()
            assert message is not None, "the leader closed the member's connection"
            answers.append(message)
    finally:
        peer.close()
    with cluster.client() as client:
        assert client.holder(key) is None, "an injected proposal was applied"
        assert client.acquire(key, owner="a", ttl=30).owner == "a"
    kinds = {m.get("type") if isinstance(m, dict) else type(m).__name__ for m in answers}
    assert kinds <= {"append_entries", "rl_pre_vote", "request_vote"}, kinds
    for text in drops:  # each was dropped, and said so
        wanted = drops[text] + sum(t == text for t, _ in injected)
        wait_for(
            lambda t=text, n=wanted: logged(cluster, leader.id, t) >= n,
            20,
            f"{text!r} x{wanted} in the leader's log",
        )
    status = cluster.wait_for_leader()
    assert status["node"] == leader.id and status["term"] < 10**6


# ------------------------------------------------------------ at start-up


@pytest.mark.timeout(120)
def test_a_node_without_valid_peer_tls_refuses_to_start(tmp_path: Path) -> None:
    """``raftlease node --config``: no peer TLS files, the removed peer secret file,
    a certificate of another member, a key every user can read, its own
    certificate revoked. Each: exit status 2, one clear line on stderr, no
    traceback, nothing left listening."""
    certs = ClusterCerts(tmp_path / "certs")
    good = certs.settings("n1")
    n2_cert, n2_key = certs.member("n2")
    loose = tmp_path / "loose.key"
    loose.write_bytes(Path(good["peer_key_file"]).read_bytes())
    loose.chmod(0o644)
    crl = tmp_path / "crl.pem"
    pki.revoke(certs.ca, pki.load_certificates(Path(good["peer_cert_file"])), crl)
    base = free_port_block(1)
    cases: list[tuple[dict[str, str], list[str]]] = [
        ({}, ["peer TLS is not configured", "raftlease certs init"]),
        (
            {**good, "peer_secret_file": str(tmp_path / "peer.secret")},
            ["peer_secret_file", "mutual TLS", "peer_ca_file"],
        ),
        (
            {**good, "peer_cert_file": str(n2_cert), "peer_key_file": str(n2_key)},
            ["names member(s) n2, not this node 'n1'"],
        ),
        ({**good, "peer_key_file": str(loose)}, ["readable by every user", "chmod 600"]),
        ({**good, "peer_crl_file": str(crl)}, ["is revoked by"]),
    ]
    for n, (settings, expected) in enumerate(cases):
        lines = ['node_id = "n1"', f'data_dir = "{tmp_path / f"data-{n}"}"']
        lines += [f'{k} = "{v}"' for k, v in settings.items()]
        lines += ["[[nodes]]", 'id = "n1"', f'raft = "127.0.0.1:{base + 100}"']
        lines += [f'client = "127.0.0.1:{base}"']
        config = tmp_path / f"node-{n}.toml"
        config.write_text("\n".join(lines) + "\n")
        done = subprocess.run(
            [sys.executable, "-m", "raftlease", "node", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 2, (settings, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        for text in expected:
            assert text in done.stderr, (text, done.stderr)
        assert port_free(base) and port_free(base + 100)


@pytest.mark.timeout(60)
def test_the_data_directory_and_its_files_are_private() -> None:
    """The journal and snapshots hold every lease id in clear: a node makes its data
    directory 0700 and its files 0600, also those an older version left readable."""
    cluster = LocalCluster(1, settings=dict(FAST_SETTINGS))
    node_id = cluster.nodes[0].id
    node_dir = cluster.node_dir(node_id)
    node_dir.mkdir(parents=True)
    node_dir.chmod(0o755)
    old = node_dir / "left-by-an-older-version"
    old.write_text("x")
    old.chmod(0o644)
    try:
        cluster.start()
        commits(cluster, "private/k")
        assert node_dir.stat().st_mode & 0o777 == 0o700
        assert logged(cluster, node_id, "was mode 755; made it 0700") == 1
        files = [p for p in node_dir.iterdir() if p.is_file()]
        assert any(p.name == "raft.journal" for p in files)
        for path in files:
            assert path.stat().st_mode & 0o077 == 0, f"{path.name} is readable by others"
        # The cluster's keys (testing/certs.py, as `raftlease certs` writes them).
        for key in cluster.certs.directory.glob("*.key"):
            assert key.stat().st_mode & 0o777 == 0o600, key
    finally:
        cluster.close()
