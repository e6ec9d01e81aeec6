"""Lease certificates (issue 39, docs/certificates.md), the pure halves: the signing
keys the ``certkey`` entry stores (core/certkeys.py), and the offline verifier a
resource embeds (raftlease/verify.py): forged signature, expiry, stale token, missing
or wrong proof of possession, a replayed challenge, a copied certificate, rotation.
The integration half is tests/integration/test_certificates.py."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from raftlease.core import LeaseStore
from raftlease.core.certkeys import MAX_CERT_KEYS
from raftlease.verify import (
    CertificateError,
    HolderKey,
    Verifier,
    certificate_body,
    load_keys,
    parse,
    public_bytes,
    sign_certificate,
)

pytestmark = pytest.mark.timeout(60)

NOW = 1_700_000_000.0  # the resource's wall clock in these tests (seconds)


def certkey(now: int, kid: int, seed: str = "", pub: str = "") -> dict[str, Any]:
    return {
        "op": "certkey",
        "now": now,
        "kid": kid,
        "secret": seed or f"{kid:064x}",
        "pub": pub or f"{kid + 100:064x}",
    }


# ------------------------------------------------------------------ the state machine


def test_a_certkey_entry_makes_the_next_key_current_and_ignores_a_stale_one() -> None:
    store = LeaseStore()
    assert store.cert_keys.current() is None
    assert store.apply(certkey(10, 1))["rotated"] is True
    # A second leader's rotation raced (it also expected id 1): nothing changes.
    again = store.apply(certkey(11, 1, seed="ab" * 32))
    assert again == {"ok": True, "rotated": False, "kid": 1, "now": 11}
    assert store.cert_keys.current() == [1, f"{1:064x}", f"{101:064x}", 10]
    assert store.apply(certkey(12, 2))["rotated"] is True
    assert store.cert_keys.public_keys() == [[1, f"{101:064x}"], [2, f"{102:064x}"]]
    assert store.now == 12  # log time moves like a tick


def test_at_most_four_keys_are_kept_the_oldest_dropped_first() -> None:
    store = LeaseStore()
    for kid in range(1, 8):
        store.apply(certkey(kid, kid))
    assert MAX_CERT_KEYS == 4
    assert [row[0] for row in store.cert_keys.rows] == [4, 5, 6, 7]


@pytest.mark.parametrize(
    "bad",
    [
        {"kid": 0},
        {"kid": True},
        {"kid": 2**31 + 1},
        {"secret": "AB" * 32},
        {"secret": "ab" * 31},
        {"pub": 5},
        {"pub": "zz" * 32},
    ],
)
def test_a_malformed_certkey_entry_is_refused_unchanged(bad: dict[str, Any]) -> None:
    store = LeaseStore()
    before = store.to_plain()
    result = store.apply({**certkey(5, 1), **bad})
    assert result["ok"] is False and result["code"] == "BAD_REQUEST"
    assert store.to_plain() == before


def test_the_keys_survive_a_snapshot_and_an_older_layout_loads_without_keys() -> None:
    store = LeaseStore()
    store.apply(certkey(1, 1))
    store.apply(certkey(2, 2))
    plain = store.to_plain()
    assert plain["v"] == 9 and plain["cert_keys"] == store.cert_keys.to_plain()
    assert LeaseStore.from_plain(copy.deepcopy(plain)).to_plain() == plain
    old = {k: v for k, v in plain.items() if k != "cert_keys"}
    old["v"] = 8
    assert LeaseStore.from_plain(old).cert_keys.rows == []


# ------------------------------------------------------------------ the verifier


class Cluster:
    """A signing key per id, as the nodes would hold them."""

    def __init__(self) -> None:
        self.keys = {1: Ed25519PrivateKey.generate()}

    def public(self) -> dict[int, bytes]:
        return {kid: public_bytes(k.public_key()) for kid, k in self.keys.items()}

    def issue(
        self,
        holder: HolderKey,
        *,
        token: int = 5,
        key: str = "gpu-0",
        not_after: float = NOW + 10,
        kid: int = 1,
    ) -> str:
        body = certificate_body(
            kid=kid,
            key=key,
            token=token,
            principal="agent-7",
            units=1,
            unit_indices=[],
            holder=holder.public,
            not_after_ms=int(not_after * 1000),
            issued_at_ms=int(NOW * 1000),
            op="acquire",
        )
        return sign_certificate(self.keys[kid], body)


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def verifier(cluster: Cluster, clock: list[float] | None = None) -> Verifier:
    now = clock if clock is not None else [NOW]
    return Verifier(cluster.public(), drift_allowance=0.5, clock=lambda: now[0])


def refused(
    code: str,
    v: Verifier,
    cert: str,
    proof: str,
    challenge: bytes,
    message: bytes = b"",
    key: str | None = None,
) -> None:
    with pytest.raises(CertificateError) as caught:
        v.check(cert, proof, challenge, message, key=key)
    assert caught.value.code == code, caught.value


def test_the_holder_with_its_key_is_accepted_and_the_certificate_says_what_it_covers(
    cluster: Cluster,
) -> None:
    holder = HolderKey()
    cert = cluster.issue(holder)
    v = verifier(cluster)
    challenge = v.challenge()
    accepted = v.check(
        cert, holder.prove(cert, challenge, b"write 1"), challenge, b"write 1", key="gpu-0"
    )
    info = accepted.certificate
    assert (info.key, info.token, info.principal, info.units, info.holder) == (
        "gpu-0",
        5,
        "agent-7",
        1,
        holder.public,
    )
    assert v.highest["gpu-0"] == 5
    assert parse(cert) == info


def test_a_forged_signature_is_refused(cluster: Cluster) -> None:
    holder = HolderKey()
    cert = cluster.issue(holder)
    v = verifier(cluster)
    prefix, body, sig = cert.split(".")
    # The body re-signed by another key, and the original signature with a flipped byte.
    mallory = Cluster()
    forged = mallory.issue(holder, token=10**9)
    flipped = f"{prefix}.{body}.{'A' if sig[0] != 'A' else 'B'}{sig[1:]}"
    for bad in (forged, flipped):
        c = v.challenge()
        refused("BAD_SIGNATURE", v, bad, holder.prove(bad, c), c)
    # A body changed under the real signature (a higher token) does not verify either.
    other = cluster.issue(holder, token=6).split(".")[1]
    changed = f"{prefix}.{other}.{sig}"
    c = v.challenge()
    refused("BAD_SIGNATURE", v, changed, holder.prove(changed, c), c)


def test_an_expired_certificate_is_refused_with_the_drift_allowance(cluster: Cluster) -> None:
    holder = HolderKey()
    cert = cluster.issue(holder, not_after=NOW + 10)
    clock = [NOW + 9.4]
    v = verifier(cluster, clock)
    c = v.challenge()
    v.check(cert, holder.prove(cert, c), c)  # 9.4 + 0.5 < 10
    clock[0] = NOW + 9.5  # 9.5 + 0.5 is not before 10
    c = v.challenge()
    refused("CERT_EXPIRED", v, cert, holder.prove(cert, c), c)


def test_a_stale_token_is_refused_after_a_newer_one_was_accepted(cluster: Cluster) -> None:
    old, new = HolderKey(), HolderKey()
    v = verifier(cluster)
    newer = cluster.issue(new, token=9)
    c = v.challenge()
    v.check(newer, new.prove(newer, c), c)
    older = cluster.issue(old, token=5)
    c = v.challenge()
    refused("STALE_TOKEN", v, older, old.prove(older, c), c)
    c = v.challenge()
    v.check(newer, new.prove(newer, c), c)  # the same token again: the same holder


def test_a_copied_certificate_without_the_holder_key_is_refused(cluster: Cluster) -> None:
    holder, thief = HolderKey(), HolderKey()
    cert = cluster.issue(holder)
    v = verifier(cluster)
    c = v.challenge()
    refused("BAD_PROOF", v, cert, thief.prove(cert, c), c)  # signed by the wrong key
    c = v.challenge()
    refused("BAD_PROOF", v, cert, "", c)  # no proof at all
    c = v.challenge()
    refused("BAD_PROOF", v, cert, "not base64!", c)
    # A proof for another request body, or another certificate, does not transfer.
    c = v.challenge()
    refused("BAD_PROOF", v, cert, holder.prove(cert, c, b"read"), c, b"delete everything")
    other = cluster.issue(holder, token=6)
    c = v.challenge()
    refused("BAD_PROOF", v, cert, holder.prove(other, c), c)
    # A bare token is no certificate.
    c = v.challenge()
    refused("BAD_CERTIFICATE", v, "5", holder.prove("5", c), c)
    assert "gpu-0" not in v.highest  # nothing was accepted


def test_a_replayed_or_unknown_challenge_is_refused(cluster: Cluster) -> None:
    holder = HolderKey()
    cert = cluster.issue(holder)
    clock = [NOW]
    v = verifier(cluster, clock)
    c = v.challenge()
    proof = holder.prove(cert, c, b"w")
    v.check(cert, proof, c, b"w")
    refused("UNKNOWN_CHALLENGE", v, cert, proof, c, b"w")  # captured and replayed
    made_up = b"x" * 16
    refused("UNKNOWN_CHALLENGE", v, cert, holder.prove(cert, made_up), made_up)
    late = v.challenge()
    clock[0] += 61  # challenges live 60 s
    cert_later = cluster.issue(holder, not_after=NOW + 120)
    refused("UNKNOWN_CHALLENGE", v, cert_later, holder.prove(cert_later, late), late)


def test_the_wrong_key_and_an_untrusted_key_id_are_refused(cluster: Cluster) -> None:
    holder = HolderKey()
    v = verifier(cluster)
    cert = cluster.issue(holder, key="gpu-1")
    c = v.challenge()
    refused("WRONG_KEY", v, cert, holder.prove(cert, c), c, key="gpu-0")
    cluster.keys[2] = Ed25519PrivateKey.generate()  # rotated, not fetched yet
    cert2 = cluster.issue(holder, kid=2)
    c = v.challenge()
    refused("UNKNOWN_KEY", v, cert2, holder.prove(cert2, c), c)


def test_key_rotation_old_and_new_certificates_verify_until_the_old_key_is_dropped(
    cluster: Cluster,
) -> None:
    holder = HolderKey()
    old = cluster.issue(holder, token=5)
    cluster.keys[2] = Ed25519PrivateKey.generate()
    new = cluster.issue(holder, token=5, kid=2)
    v = verifier(cluster)  # fetched after the rotation: both keys
    for cert in (old, new):
        c = v.challenge()
        v.check(cert, holder.prove(cert, c), c)
    del cluster.keys[1]  # dropped by the cluster (core/certkeys.py keeps 4)
    v.set_keys(cluster.public())
    c = v.challenge()
    refused("UNKNOWN_KEY", v, old, holder.prove(old, c), c)
    c = v.challenge()
    v.check(new, holder.prove(new, c), c)


@pytest.mark.parametrize(
    "text",
    [None, 5, "", "rlc1", "rlc1.a.b.c", "rlc2.AA.AA", "rlc1.!!.AA", "rlc1.AA.AA", "x" * 20000],
)
def test_malformed_certificates_are_refused_never_a_crash(cluster: Cluster, text: Any) -> None:
    v = verifier(cluster)
    c = v.challenge()
    refused("BAD_CERTIFICATE", v, text, "", c)


def test_load_keys_reads_the_cert_keys_command_output() -> None:
    text = "# the cluster's keys\n1 " + "ab" * 32 + "\n\n2 " + "cd" * 32 + "\n"
    assert load_keys(text) == {1: "ab" * 32, 2: "cd" * 32}
    with pytest.raises(ValueError):
        load_keys("one two")


def test_the_verifier_needs_no_server_dependency() -> None:
    """A resource embeds raftlease.verify alone: importing it loads neither the
    server, the core, pysyncobj nor the client."""
    code = (
        "import sys, raftlease.verify\n"
        "bad = [m for m in sys.modules if m.startswith(('raftlease.server', 'raftlease.core',"
        " 'raftlease.client', 'raftlease.replication', 'pysyncobj'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


def test_the_leaders_certkey_entry_applies_with_the_proposers_stamp() -> None:
    """The entry ``server/certs.key_entry`` draws, stamped as the proposer stamps every
    entry (its own random ``seed`` included), makes the key current: the key's secret
    travels in a field of its own."""
    from raftlease.core.snapshot import ENTRY_FORMAT
    from raftlease.server.certs import key_entry

    store = LeaseStore()
    entry = {**key_entry(store.cert_keys), "term": 1, "now": 5, "seed": 12345, "fv": ENTRY_FORMAT}
    assert store.apply(entry)["rotated"] is True
    row = store.cert_keys.current()
    assert row is not None and row[2] == entry["pub"] and row[1] == entry["secret"]


def test_the_verified_resource_stores_only_the_holders_writes(cluster: Cluster) -> None:
    from raftlease.recipes.verified import VerifiedResource, write_message

    holder, other = HolderKey(), HolderKey()
    now = [NOW]
    resource = VerifiedResource(cluster.public(), clock=lambda: now[0])
    cert = cluster.issue(holder, token=7)
    c = resource.challenge()
    resource.write("gpu-0", b"v1", cert, holder.prove(cert, c, write_message("gpu-0", b"v1")), c)
    c = resource.challenge()
    with pytest.raises(CertificateError):  # a proof for other bytes than the write's
        resource.write("gpu-0", b"v2", cert, holder.prove(cert, c, b"v2"), c)
    c = resource.challenge()
    with pytest.raises(CertificateError):  # another agent with the copied certificate
        resource.write("gpu-0", b"v3", cert, other.prove(cert, c, write_message("gpu-0", b"v3")), c)
    assert resource.data == {"gpu-0": (7, b"v1")} and resource.accepted == 1


def test_the_planted_resources_accept_what_the_honest_one_refuses(cluster: Cluster) -> None:
    """The resource bugs scripts/cert_proof must catch (raftlease.testing.hooks):
    skip_proof takes a copied certificate from a thief, skip_expiry a late write."""
    from raftlease.testing.hooks import RESOURCE_BUGS, planted_verifier

    assert set(RESOURCE_BUGS) == {"skip_proof", "skip_expiry"}
    holder, thief = HolderKey(), HolderKey()
    now = [NOW]
    options: dict[str, Any] = {"drift_allowance": 0.5, "clock": lambda: now[0]}
    copied = cluster.issue(holder, token=5)
    expired = cluster.issue(holder, token=6, not_after=NOW - 1)
    honest = Verifier(cluster.public(), **options)
    no_proof = planted_verifier("skip_proof", cluster.public(), **options)
    no_expiry = planted_verifier("skip_expiry", cluster.public(), **options)
    c = honest.challenge()
    refused("BAD_PROOF", honest, copied, thief.prove(copied, c), c)
    c = no_proof.challenge()
    assert no_proof.check(copied, thief.prove(copied, c), c).certificate.token == 5
    c = honest.challenge()
    refused("CERT_EXPIRED", honest, expired, holder.prove(expired, c), c)
    c = no_expiry.challenge()
    assert no_expiry.check(expired, holder.prove(expired, c), c).certificate.token == 6
    with pytest.raises(KeyError):
        planted_verifier("nonsense", cluster.public())


# ------------------------------------------------------------------ the signer


class FakeReplica:
    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.leading = True

    def is_leader(self) -> bool:
        return self.leading

    def term(self) -> int:
        return 1


class FakeLogClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def stamp(self, term: int, applied_now: int) -> int:
        return max(self.now, applied_now)


def signer_for(store: LeaseStore, log_now: int, lease_ok: list[bool]) -> tuple[Any, FakeReplica]:
    from types import SimpleNamespace

    from raftlease.server.certs import CertSigner

    replica = FakeReplica(store)

    async def propose(entry: dict[str, Any]) -> dict[str, Any]:
        return store.apply({**entry, "now": store.now, "term": 1})

    config = SimpleNamespace(clock_drift=0.01, heartbeat_interval=0.05)
    signer = CertSigner(
        config,  # type: ignore[arg-type]
        FakeLogClock(log_now),  # type: ignore[arg-type]
        replica=lambda: replica,  # type: ignore[arg-type,return-value]
        lease_read_allowed=lambda: lease_ok[0],
        propose=propose,
        wall=lambda: 1_000.0,
    )
    return signer, replica


def test_the_signer_bounds_not_after_and_signs_only_a_live_lease() -> None:
    """not_after = wall (read first) + (expires_at - log now) * (1 - drift) - one
    heartbeat; no certificate without a valid leader lease, for a lease no longer live
    (an answer replayed after its release), or past its end."""
    import asyncio

    store = LeaseStore()
    lease_ok = [True]
    signer, replica = signer_for(store, 400, lease_ok)
    asyncio.run(signer.ensure_key())
    assert store.cert_keys.current() is not None
    holder = HolderKey()
    store.apply(
        {
            "op": "acquire",
            "now": 300,
            "term": 1,
            "key": "k",
            "owner": "o",
            "ttl": 10_000,
            "lid": "L1",
            "cid": "c1",
            "seq": 1,
            "ack": 1,
            "principal": "agent",
            "holder_key": holder.public_hex(),
        }
    )
    answer = {"key": "k", "token": 1, "lease_id": "L1", "expires_at": 10_300, "now": 300}
    # Defence in depth: another key than the one bound at the grant is never signed.
    assert signer.sign("acquire", HolderKey().public_hex(), "agent", answer) is None
    text = signer.sign("acquire", holder.public_hex(), "agent", answer)
    cert = parse(text)
    # 1,000,000 ms + (10,300 - 400) * 0.99 - 50
    assert cert.not_after_ms == 1_000_000 + 9_801 - 50
    assert (cert.principal, cert.holder, cert.kid, cert.token) == ("agent", holder.public, 1, 1)
    keys = {int(k): v for k, v in store.cert_keys.public_keys()}
    v = Verifier(keys, clock=lambda: 1_000.0)
    c = v.challenge()
    v.check(text, holder.prove(text, c), c)

    lease_ok[0] = False  # the leader lease lapsed: no certificate
    assert signer.sign("acquire", holder.public_hex(), "agent", answer) is None
    lease_ok[0] = True
    replica.leading = False
    assert signer.sign("acquire", holder.public_hex(), "agent", answer) is None
    replica.leading = True
    # A longer expiry in a replayed answer than the applied state has: the state wins.
    longer = {**answer, "expires_at": 99_999}
    assert parse(signer.sign("acquire", holder.public_hex(), "agent", longer)).not_after_ms == (
        cert.not_after_ms
    )
    store.apply(
        {
            "op": "release",
            "now": 500,
            "term": 1,
            "key": "k",
            "lid": "L1",
            "cid": "c1",
            "seq": 2,
            "ack": 2,
            "principal": "agent",
        }
    )
    assert signer.sign("acquire", holder.public_hex(), "agent", answer) is None  # released


def test_stray_characters_in_a_valid_certificate_are_refused(cluster: Cluster) -> None:
    """The wire format is strict base64url (docs/certificates.md): a valid certificate
    with characters outside the alphabet inserted is refused, as the TypeScript
    verifier refuses it (Python's decoder alone skipped them and accepted it)."""
    holder = HolderKey()
    cert = cluster.issue(holder)
    prefix, body, signature = cert.split(".")
    for bad in (f"{prefix}.{body[:4]}!*{body[4:]}.{signature}", f"{prefix}.{body}.{signature}="):
        v = verifier(cluster)
        c = v.challenge()
        refused("BAD_CERTIFICATE", v, bad, holder.prove(bad, c), c)
    v = verifier(cluster)
    c = v.challenge()
    v.check(cert, holder.prove(cert, c), c)  # the certificate itself is fine


def test_a_session_keepalive_certifies_only_the_attached_leases_bound_to_its_key() -> None:
    """``sign_each``: a lease session's keep-alive answer certifies each attached lease
    bound to the named holder key (to the session's new expiry), never one bound to
    another key or to none, nor a lease outside the session."""
    import asyncio

    store = LeaseStore()
    signer, _replica = signer_for(store, 400, [True])
    asyncio.run(signer.ensure_key())
    mine, other = HolderKey(), HolderKey()
    base = {"now": 300, "term": 1, "seq": 1, "ack": 1}
    store.apply(
        {**base, "op": "session_open", "owner": "o", "ttl": 10_000, "sid": "S", "cid": "c0"}
    )
    for n, key in enumerate([mine.public_hex(), other.public_hex(), None]):
        entry = {**base, "op": "acquire", "key": f"k{n}", "owner": "o", "session": "S"}
        entry.update(lid=f"L{n}", cid=f"c{n + 1}")
        if key is not None:
            entry["holder_key"] = key
        assert store.apply(entry)["ok"]
    store.apply(
        {
            **base,
            "op": "acquire",
            "key": "solo",
            "owner": "o",
            "ttl": 10_000,
            "lid": "L9",
            "cid": "c9",
            "holder_key": mine.public_hex(),
        }
    )
    answer = {"session_id": "S", "ttl": 10_000, "expires_at": 12_000, "now": 400}
    signed = signer.sign_each("session_keepalive", mine.public_hex(), answer, True)
    assert [(one["key"], one["lease_id"]) for one in signed] == [("k0", "L0")]
    cert = parse(signed[0]["certificate"])
    assert (cert.holder, cert.op) == (mine.public, "session_keepalive")
    assert cert.not_after_ms == 1_000_000 + int((12_000 - 400) * 0.99) - 50
    assert signer.sign_each("session_keepalive", HolderKey().public_hex(), answer, True) == []


def test_a_task_attempts_certificate_carries_its_fields_and_a_leases_reads_defaults(
    cluster: Cluster,
) -> None:
    holder = HolderKey()
    body = certificate_body(
        kid=1,
        key="q/T1",
        token=9,
        principal="",
        units=1,
        unit_indices=[],
        holder=holder.public,
        not_after_ms=int((NOW + 10) * 1000),
        issued_at_ms=int(NOW * 1000),
        op="task_claim",
        task=("q", "T1", 2),
    )
    text = sign_certificate(cluster.keys[1], body)
    assert (parse(text).queue, parse(text).task, parse(text).attempt) == ("q", "T1", 2)
    v = verifier(cluster)
    c = v.challenge()
    v.check(text, holder.prove(text, c), c, key="q/T1")
    lease = parse(cluster.issue(holder))
    assert (lease.queue, lease.task, lease.attempt) == ("", "", 0)
    bad = msgpack.unpackb(body, raw=False)
    bad["attempt"] = "two"
    forged = sign_certificate(cluster.keys[1], msgpack.packb(bad, use_bin_type=True))
    with pytest.raises(CertificateError) as refused:
        parse(forged)
    assert refused.value.code == "BAD_CERTIFICATE"


def test_a_session_keepalive_never_certifies_past_a_leases_progress_deadline() -> None:
    """A progress-aware lease attached to a session ends at its progress deadline
    (docs/design.md §4g) whatever the session's keep-alive, answered from memory,
    says: its certificate's not_after is bounded by that deadline, not the session's
    new expiry (else a resource would accept the stalled holder after the cluster
    ended its lease and could grant the key to another)."""
    import asyncio

    store = LeaseStore()
    signer, _replica = signer_for(store, 400, [True])
    asyncio.run(signer.ensure_key())
    mine = HolderKey()
    base = {"now": 300, "term": 1, "seq": 1, "ack": 1}
    store.apply(
        {**base, "op": "session_open", "owner": "o", "ttl": 10_000, "sid": "S", "cid": "c0"}
    )
    entry = {**base, "op": "acquire", "key": "k", "owner": "o", "session": "S", "lid": "L"}
    entry.update(cid="c1", holder_key=mine.public_hex(), progress_timeout=2_000)
    assert store.apply(entry)["ok"]
    assert store.progress.cap("L") == 2_300
    answer = {"session_id": "S", "ttl": 10_000, "expires_at": 12_000, "now": 400}
    signed = signer.sign_each("session_keepalive", mine.public_hex(), answer, True)
    cert = parse(signed[0]["certificate"])
    assert cert.not_after_ms == 1_000_000 + int((2_300 - 400) * 0.99) - 50
