"""Reloading the peer TLS files of running members (``SIGHUP``, the ``reload``
operation; server/node.py ``reload_security``, transport.py ``reload_tls``): a
re-issued certificate, a CA rotation in three rolling steps, a revocation that cuts a
member off at once, and malformed files that change nothing. Real node processes on
127.0.0.1, each reading its own files (as on separate hosts). Replaces the peer
secret rotation tests (git show 85c1991:tests/test_peer_rotation.py).
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from raftlease import Client, Lease, RaftLeaseError, pki
from raftlease.testing import LocalCluster, wait_for
from raftlease.testing.certs import ClusterCerts
from tests.conftest import FAST_SETTINGS
from tests.integration.test_peer_tls_cluster import (
    Pair,
    TlsDialer,
    commits,
    log_text,
    logged,
    raft_addr,
)

pytestmark = pytest.mark.integration

RELOADED = "reloaded the peer TLS files"
REFUSED = "the previous peer TLS files stay in force"


class HostFiles:
    """Each member's own peer TLS files, as on separate hosts: ``hosts/<id>/`` holds
    its ``ca.pem`` (the CAs it trusts), ``crl.pem`` (the revocation lists, one per
    CA) and ``<id>.pem`` / ``<id>.key``. The cluster CA is LocalCluster's
    (``<data_dir>/certs``, with its revocation list ``crl.pem`` there)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.root = cluster.data_dir / "hosts"
        self.ca = cluster.certs.ca
        self.crl = cluster.certs.directory / pki.CRL
        pki.revoke(self.ca, [], self.crl)  # an empty list, signed by the CA
        for node in cluster.nodes:
            self.trust(node.id, self.ca)
            self.lists(node.id, self.crl)
            self.issue(node.id, self.ca)
            cluster.node_settings[node.id] = self.settings(node.id)

    def dir(self, node_id: str) -> Path:
        return self.root / node_id

    def settings(self, node_id: str) -> dict[str, str]:
        folder = self.dir(node_id)
        return {
            "peer_ca_file": str(folder / "ca.pem"),
            "peer_cert_file": str(folder / f"{node_id}.pem"),
            "peer_key_file": str(folder / f"{node_id}.key"),
            "peer_crl_file": str(folder / "crl.pem"),
        }

    def issue(self, node_id: str, ca: pki.Authority) -> Pair:
        """A new member certificate and key for ``node_id`` from ``ca``, in place."""
        return pki.issue(ca, self.dir(node_id), node_id, hosts=ClusterCerts.HOSTS, member=True)

    def trust(self, node_id: str, *cas: pki.Authority) -> None:
        pem = b"".join(ca.cert_file.read_bytes() for ca in cas)
        pki.write_file(self.dir(node_id) / "ca.pem", pem, 0o644)

    def lists(self, node_id: str, *crls: Path) -> None:
        pem = b"".join(crl.read_bytes() for crl in crls)
        pki.write_file(self.dir(node_id) / "crl.pem", pem, 0o644)


@pytest.fixture
def hosts(request: pytest.FixtureRequest) -> Iterator[tuple[LocalCluster, HostFiles]]:
    """A running 3-node cluster whose members each read their own ``HostFiles``,
    with a revocation list from the start (a node reads its config only at start:
    ``peer_crl_file`` must be named then; SIGHUP re-reads the files' content)."""
    cluster = LocalCluster(3, settings=dict(FAST_SETTINGS))
    try:
        files = HostFiles(cluster)
        cluster.start()
        wait_for(
            lambda: all(len(s.get("connected_peers", [])) == 2 for s in cluster.statuses()),
            30,
            "every member connected to both others",
        )
        yield cluster, files
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(cluster.logs())
        cluster.close()


def hup(cluster: LocalCluster, node_id: str, text: str = RELOADED) -> str:
    """SIGHUP ``node_id`` and wait until its log holds one more line with ``text``
    (the reload is done); returns that line."""
    before = logged(cluster, node_id, text)
    os.kill(cluster.pid(node_id), signal.SIGHUP)
    wait_for(lambda: logged(cluster, node_id, text) > before, 30, f"{text!r} in {node_id}'s log")
    return [line for line in log_text(cluster, node_id).splitlines() if text in line][-1]


def hup_outcome(cluster: LocalCluster, node_id: str) -> str:
    """SIGHUP ``node_id``; the line that says whether its peer TLS files were taken
    (``RELOADED``) or refused (``REFUSED``)."""
    before = logged(cluster, node_id, RELOADED) + logged(cluster, node_id, REFUSED)
    os.kill(cluster.pid(node_id), signal.SIGHUP)
    wait_for(
        lambda: logged(cluster, node_id, RELOADED) + logged(cluster, node_id, REFUSED) > before,
        30,
        f"{node_id}'s reload",
    )
    lines = log_text(cluster, node_id).splitlines()
    return [line for line in lines if RELOADED in line or REFUSED in line][-1]


def serial_of(cert: Path) -> str:
    return format(pki.load_certificates(cert)[0].serial_number, "x")


def served_serial(cluster: LocalCluster, node_id: str, ca: Path, cert: Pair) -> str:
    """The serial of the certificate ``node_id`` presents to a new peer connection
    now (our own dialer, presenting ``cert``, closes without a frame)."""
    peer = TlsDialer(raft_addr(cluster.node(node_id)), ca, cert)
    try:
        der = peer.sock.getpeercert(binary_form=True)
        assert der is not None
        return format(x509.load_der_x509_certificate(der).serial_number, "x")
    finally:
        peer.close()


def refusals(cluster: LocalCluster, node_id: str, reason: str) -> int:
    """Refused peer connections in ``node_id``'s log whose reason holds ``reason``."""
    lines = log_text(cluster, node_id).splitlines()
    return sum("peer connection refused" in line and reason in line for line in lines)


def peers_of(cluster: LocalCluster, node_id: str) -> set[str]:
    return set(cluster.node_status(node_id).get("connected_peers", []))


def followers(cluster: LocalCluster) -> list[str]:
    leader = cluster.leader_id()
    return [n.id for n in cluster.nodes if n.id != leader]


class Writer:
    """A client acquiring a new key every few ms on a thread until stopped; records
    every outcome (a ``Lease``, or the error raised)."""

    def __init__(self, endpoints: list[str], prefix: str) -> None:
        self.client = Client(endpoints)
        self.prefix = prefix
        self.outcomes: list[tuple[str, Lease | RaftLeaseError]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.stopping.is_set() and n < 100_000:
            key = f"{self.prefix}{n:06d}"
            n += 1
            try:
                outcome: Lease | RaftLeaseError = self.client.acquire(key, owner="w", ttl=300)
            except RaftLeaseError as exc:
                outcome = exc
            self.outcomes.append((key, outcome))
            self.stopping.wait(0.01)  # pacing: hundreds of leases, not more

    def granted(self) -> list[tuple[str, Lease]]:
        return [(k, o) for k, o in list(self.outcomes) if isinstance(o, Lease)]

    def progress(self, more: int = 5) -> None:
        """Wait until ``more`` acquires were granted after this call (writes commit)."""
        target = len(self.granted()) + more
        wait_for(lambda: len(self.granted()) >= target, 30, f"{more} more grants")

    def stop(self) -> list[RaftLeaseError]:
        """Stop; returns the acquires that failed."""
        self.stopping.set()
        self.thread.join(timeout=60)
        self.client.close()
        return [o for _, o in self.outcomes if isinstance(o, RaftLeaseError)]


def check_store(cluster: LocalCluster, writer: Writer) -> None:
    """Every grant is held as granted (the writer's keys are its own)."""
    granted = writer.granted()
    tokens = [lease.token for _, lease in granted]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    with cluster.client() as client:
        held = client.leases(prefix=writer.prefix, limit=10_000)
    assert {h.key: (h.owner, h.token) for h in held} == {
        k: (lease.owner, lease.token) for k, lease in granted
    }


@pytest.mark.timeout(120)
def test_a_reissued_member_certificate_is_taken_without_downtime(
    hosts: tuple[LocalCluster, HostFiles],
) -> None:
    """A follower's certificate re-issued (same id, a new key) and SIGHUP: its status
    and new handshakes show the new certificate at once, the other follower,
    restarted, connects to it with it, and a client acquiring throughout sees no
    failure."""
    cluster, files = hosts
    reissued, restarted = followers(cluster)
    writer = Writer(cluster.endpoints, "reissue/")
    try:
        writer.progress()
        old = cluster.node_status(reissued)["peer_tls"]["serial"]
        cert, _ = files.issue(reissued, files.ca)
        new = serial_of(cert)
        assert new != old
        assert f"certificate serial {new} " in hup(cluster, reissued)
        assert cluster.node_status(reissued)["peer_tls"]["serial"] == new
        dialer = files.settings(restarted)
        own = (Path(dialer["peer_cert_file"]), Path(dialer["peer_key_file"]))
        assert served_serial(cluster, reissued, files.ca.cert_file, own) == new
        writer.progress()
        # A new peer connection, verified by a member: the other follower restarts.
        cluster.restart_node(restarted)
        wait_for(lambda: reissued in peers_of(cluster, restarted), 30, "the restart to connect")
        writer.progress()
    finally:
        failed = writer.stop()
    assert failed == []
    check_store(cluster, writer)
    for node in cluster.nodes:
        assert logged(cluster, node.id, "peer connection refused") == 0, log_text(cluster, node.id)


@pytest.mark.timeout(180)
def test_a_ca_rotation_in_three_rolling_steps_keeps_writes_committing(
    hosts: tuple[LocalCluster, HostFiles],
) -> None:
    """1) every member trusts the old and the new CA (and holds both CAs' revocation
    lists), 2) every member gets a certificate of the new CA, 3) the old CA (and its
    list) is dropped: one member at a time, SIGHUP, while a client acquires. Step 3
    closes the connections still verified with old-CA certificates and they are
    made again with new ones. Every acquire succeeds; afterwards an old-CA member
    certificate is refused."""
    cluster, files = hosts
    ids = [n.id for n in cluster.nodes]
    old_ca = files.ca
    keep = cluster.data_dir / "old-n1"
    keep.mkdir()
    old_cert = (
        Path(shutil.copy(files.settings(ids[0])["peer_cert_file"], keep)),
        Path(shutil.copy(files.settings(ids[0])["peer_key_file"], keep)),
    )
    new_ca = pki.make_ca(cluster.data_dir / "new-ca", "raftlease cluster CA 2")
    new_crl = cluster.data_dir / "new-ca" / pki.CRL
    pki.revoke(new_ca, [], new_crl)
    writer = Writer(cluster.endpoints, "rotation/")
    try:
        writer.progress()
        for node_id in ids:  # 1) trust both
            files.trust(node_id, old_ca, new_ca)
            files.lists(node_id, files.crl, new_crl)
            assert "2 CA(s)" in hup(cluster, node_id)
            writer.progress()
        for node_id in ids:  # 2) a certificate of the new CA
            cert, _ = files.issue(node_id, new_ca)
            assert f"certificate serial {serial_of(cert)} " in hup(cluster, node_id)
            writer.progress()
        for node_id in ids:  # 3) the old CA dropped
            files.trust(node_id, new_ca)
            files.lists(node_id, new_crl)
            assert "1 CA(s)" in hup(cluster, node_id)
            writer.progress()
        wait_for(
            lambda: all(len(s.get("connected_peers", [])) == 2 for s in cluster.statuses()),
            30,
            "every member connected to both others again",
        )
        writer.progress()
    finally:
        failed = writer.stop()
    assert failed == []
    assert len(writer.granted()) >= 50
    check_store(cluster, writer)
    # The connections made before step 2 carried old-CA certificates: step 3 cut them.
    cut = "closed after the reload: its certificate is not issued by a CA of peer_ca_file"
    assert sum(logged(cluster, n, cut) for n in ids) >= 2
    for node_id in ids:
        assert cluster.node_status(node_id)["peer_tls"]["cas"] == 1
        assert logged(cluster, node_id, "peer connection refused") == 0, log_text(cluster, node_id)
    # An old-CA member certificate is a stranger's now.
    target = cluster.leader_id()
    before = logged(cluster, target, "CERTIFICATE_VERIFY_FAILED")
    peer = TlsDialer(raft_addr(cluster.node(target)), new_ca.cert_file, old_cert)
    try:
        assert peer.refused()
    finally:
        peer.close()
    wait_for(
        lambda: logged(cluster, target, "CERTIFICATE_VERIFY_FAILED") > before,
        20,
        "the old-CA certificate refused",
    )
    commits(cluster, "rotation/after")


@pytest.mark.timeout(120)
def test_a_revoked_member_is_cut_off_at_once_and_cannot_reconnect(
    hosts: tuple[LocalCluster, HostFiles],
) -> None:
    """``raftlease certs revoke`` of a running follower's certificate, the list copied
    to the other members' ``peer_crl_file`` and SIGHUP: each closes its connection
    to the revoked member at once and says why, the revoked member's every new
    handshake is refused for the revocation, and the other two commit without it."""
    cluster, files = hosts
    revoked = followers(cluster)[0]
    others = [n.id for n in cluster.nodes if n.id != revoked]
    cert = Path(files.settings(revoked)["peer_cert_file"])
    serial = serial_of(cert)
    cadir = cluster.certs.directory
    done = subprocess.run(
        [sys.executable, "-m", "raftlease", "certs", "revoke", str(cert), "--dir", str(cadir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"revoked {revoked} (serial {serial})" in done.stdout
    cut = (
        f"peer connection of {revoked} closed after the reload: its certificate "
        f"(serial {serial}) is revoked"
    )
    for node_id in others:
        files.lists(node_id, files.crl)
        assert "1 revoked" in hup(cluster, node_id)
        wait_for(lambda n=node_id: revoked not in peers_of(cluster, n), 10, f"{node_id}'s cut")
    assert peers_of(cluster, revoked) == set()
    for node_id in others:  # each says why, once
        assert logged(cluster, node_id, cut) == 1, log_text(cluster, node_id)
        assert logged(cluster, node_id, "reload closed 1 peer connection(s)") == 1
    # It cannot come back: its new connections are refused (each way they are made).
    # (OpenSSL's "certificate revoked" in the handshake; the transport's own check of
    # a verified certificate says "is revoked" too.)
    counts = {n: refusals(cluster, n, "revoked") for n in others}
    wait_for(
        lambda: sum(refusals(cluster, n, "revoked") - counts[n] for n in others) >= 4,
        30,
        "the revoked member's new connections refused",
    )
    assert peers_of(cluster, revoked) == set()
    assert all(revoked not in peers_of(cluster, n) for n in others)
    assert "CERTIFICATE_REVOKED" in log_text(cluster, revoked).upper()  # it is told why
    # The two others commit on; the revoked member gets none of it.
    endpoints = [cluster.node(n).client for n in others]
    with Client(endpoints) as client:
        for n in range(3):
            client.acquire(f"revoked/{n}", owner="a", ttl=300)
        leader = max((cluster.node_status(n) for n in others), key=lambda s: s["commit_index"])
    assert cluster.node_status(revoked)["commit_index"] < leader["commit_index"]
    assert peers_of(cluster, revoked) == set()


@pytest.mark.timeout(120)
def test_a_malformed_file_at_reload_is_refused_and_the_old_tls_stays(
    hosts: tuple[LocalCluster, HostFiles],
) -> None:
    """Bad peer TLS files at a reload (SIGHUP, or the ``reload`` operation) are
    refused with the reason logged; the node keeps the certificate, CAs and list it
    had, commits go on, and a member restarted while a bad file is in place
    connects to it (its handshakes still use the old contexts)."""
    cluster, files = hosts
    node_id, restarted = followers(cluster)
    paths = {k: Path(v) for k, v in files.settings(node_id).items()}
    serial = cluster.node_status(node_id)["peer_tls"]["serial"]
    other = ClusterCerts(cluster.data_dir / "other-ca")
    foreign_crl = cluster.data_dir / "other-ca" / pki.CRL
    pki.revoke(other.ca, [], foreign_crl)
    stranger_key = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    member_pem = Path(files.settings(restarted)["peer_cert_file"]).read_bytes()
    ca, cert, key, crl = (paths[f"peer_{k}_file"] for k in ("ca", "cert", "key", "crl"))
    junk_crl = b"-----BEGIN X509 CRL-----\nAA\n"
    bad: list[tuple[str, Path, bytes | None, int, str]] = [
        # (what, file, its new content (None: as it is), mode (-1: removed), the reason)
        ("junk certificate", cert, b"junk\n", 0o644, "holds no PEM certificate"),
        ("a stranger's key", key, stranger_key, 0o600, "key this certificate's"),
        ("key readable by all", key, None, 0o644, "readable by every user"),
        ("another member's", cert, member_pem, 0o644, f"not this node {node_id!r}"),
        ("CA file missing", ca, None, -1, "cannot read"),
        ("another CA's list", crl, foreign_crl.read_bytes(), 0o644, "not signed by a CA"),
        ("malformed list", crl, junk_crl, 0o644, "malformed CRL"),
    ]
    with Client([cluster.node(n.id).client for n in cluster.nodes]) as client:
        for n, (what, path, content, mode, reason) in enumerate(bad):
            saved = (path.read_bytes(), path.stat().st_mode & 0o777)
            if mode == -1:
                path.unlink()
            else:
                if content is not None:
                    pki.write_file(path, content, mode)
                path.chmod(mode)
            if n % 2:  # the reload operation: what SIGHUP does, with the errors returned
                answer = client.reload(cluster.node(node_id).client)
                assert answer["reloaded"] is False, (what, answer)
                assert any(reason in e for e in answer["errors"]), (what, answer)
            else:
                line = hup(cluster, node_id, REFUSED)
                assert "reload refused" in line and reason in line, (what, line)
            assert cluster.node_status(node_id)["peer_tls"]["serial"] == serial, what
            client.acquire(f"malformed/{n}", owner="a", ttl=300)
            if n < len(bad) - 1:  # the last one stays in place
                pki.write_file(path, saved[0], saved[1])
    assert logged(cluster, node_id, RELOADED) == 0
    # The old contexts still serve: a member restarted now connects to it.
    cluster.restart_node(restarted)
    wait_for(lambda: node_id in peers_of(cluster, restarted), 30, "the restart to connect")
    commits(cluster, "malformed/after")


@pytest.mark.timeout(120)
def test_a_ca_without_its_revocation_list_is_refused_at_reload(
    hosts: tuple[LocalCluster, HostFiles],
) -> None:
    """With ``peer_crl_file``, OpenSSL checks a peer's certificate against the list of
    the CA that issued it, and refuses it if that CA has no list in the file
    ("unable to get certificate CRL"). A CA file that names a CA the revocation list
    file has no list for (step 1 of a rotation done without the new CA's list) would
    thus trust that CA in name only, and the first member given one of its
    certificates (step 2) would be cut off from the others at its next connection.
    The reload is refused instead, saying which CA has no list; with both lists in
    the file it is taken."""
    cluster, files = hosts
    node_id = followers(cluster)[0]
    new_ca = pki.make_ca(cluster.data_dir / "new-ca", "raftlease cluster CA 2")
    files.trust(node_id, files.ca, new_ca)  # crl.pem: the old CA's list only
    line = hup_outcome(cluster, node_id)
    assert REFUSED in line and "raftlease cluster CA 2" in line, line
    assert cluster.node_status(node_id)["peer_tls"]["cas"] == 1
    new_crl = cluster.data_dir / "new-ca" / pki.CRL
    pki.revoke(new_ca, [], new_crl)
    files.lists(node_id, files.crl, new_crl)
    assert "2 CA(s)" in hup_outcome(cluster, node_id)
    commits(cluster, "crl/after")


@pytest.mark.timeout(120)
def test_an_expired_revocation_list_is_refused_at_reload(
    hosts: tuple[LocalCluster, HostFiles],
) -> None:
    """A revocation list past its next update (lists from openssl's ``ca`` default to
    30 days; ``raftlease certs revoke`` writes ten years) makes OpenSSL refuse every
    peer certificate it covers: taken at a reload, the member would be cut off from
    every peer at its next connections, silently. It should be refused, the old
    files staying in force, as an expired certificate is."""
    cluster, files = hosts
    node_id = followers(cluster)[0]
    now = datetime.datetime.now(datetime.UTC)
    expired = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(files.ca.cert.subject)
        .last_update(now - datetime.timedelta(days=40))
        .next_update(now - datetime.timedelta(days=10))
        .sign(files.ca.key, hashes.SHA256())
    )
    crl = Path(files.settings(node_id)["peer_crl_file"])
    pki.write_file(crl, expired.public_bytes(serialization.Encoding.PEM), 0o644)
    line = hup_outcome(cluster, node_id)
    assert REFUSED in line and "expired" in line, line
