"""Lease certificates on a real cluster (issue 39, docs/certificates.md): a grant and
its renewals (from the leader's memory and through the log) carry a certificate the
resource verifies offline with the keys ``raftlease cert-keys`` prints; a reader that
copies the token or the certificate is refused; a malformed holder key is refused
before anything is proposed; a renewal naming another holder key than the one bound
at the grant is refused (the security fix); every node holds the same keys. The pure half (the
verifier's refusals, the ``certkey`` entry) is tests/unit/test_certificates.py."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest

from raftlease import HolderKeyMismatchError, InvalidArgumentError
from raftlease.testing import LocalCluster, wait_for
from raftlease.verify import CertificateError, HolderKey, Verifier, load_keys, parse

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def cluster_keys(cluster: LocalCluster) -> dict[int, str]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "raftlease",
            "cert-keys",
            "--endpoints",
            ",".join(cluster.endpoints),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return load_keys(out.stdout)


def test_a_grant_and_its_renewals_carry_certificates_the_resource_verifies(
    shared: LocalCluster,
) -> None:
    holder = HolderKey()
    with shared.client() as c:
        before = time.time()
        lease = c.acquire("certs/gpu-0", owner="agent", ttl=5.0, holder_key=holder)
        assert lease.certificate
        cert = parse(lease.certificate)
        assert (cert.key, cert.token, cert.holder, cert.op) == (
            "certs/gpu-0",
            lease.token,
            holder.public,
            "acquire",
        )
        # not_after: at most the TTL less the drift bound from when the node answered.
        assert before * 1000 < cert.not_after_ms <= (time.time() + 5.0 * 0.99) * 1000
        keys = cluster_keys(shared)
        assert cert.kid in keys
        resource = Verifier(keys)
        challenge = resource.challenge()
        resource.check(lease.certificate, lease.prove(challenge, b"w1"), challenge, b"w1")

        # A reader sees the token, and even with the copied certificate it cannot
        # write: it does not have the holder's private key.
        reader = HolderKey()
        seen = c.read("certs/gpu-0").holder
        assert seen is not None and seen.token == lease.token
        challenge = resource.challenge()
        with pytest.raises(CertificateError) as refused:
            resource.check(lease.certificate, reader.prove(lease.certificate, challenge), challenge)
        assert refused.value.code == "BAD_PROOF"

        # A keep-alive answered from the leader's memory, and a renewal with a new
        # TTL (a log write), each bring a fresh certificate.
        time.sleep(0.05)  # so the new not_after is measurably later (ms resolution)
        renewed = c.renew(lease)
        assert renewed.certificate != lease.certificate
        assert parse(renewed.certificate).not_after_ms > cert.not_after_ms
        assert parse(renewed.certificate).op == "renew"
        longer = c.renew(renewed, ttl=8.0)
        assert parse(longer.certificate).not_after_ms > parse(renewed.certificate).not_after_ms
        challenge = resource.challenge()
        resource.check(longer.certificate, longer.prove(challenge), challenge)
        c.release(longer)

        # Without a holder key, no certificate.
        plain = c.acquire("certs/plain", owner="agent", ttl=5.0)
        assert plain.certificate == ""
        c.release(plain)


def test_a_grant_after_waiting_gets_its_certificate_and_the_fence_holds(
    shared: LocalCluster,
) -> None:
    first, second = HolderKey(), HolderKey()
    with shared.client() as c:
        held = c.acquire("certs/queue", owner="one", ttl=5.0, holder_key=first)
        got: list[object] = []

        def wait() -> None:
            got.append(c.acquire("certs/queue", owner="two", ttl=5.0, wait=20.0, holder_key=second))

        waiter = threading.Thread(target=wait)
        waiter.start()
        wait_for(lambda: c.waiters("certs/queue"), 10.0, "the acquire queued")
        resource = Verifier(cluster_keys(shared))
        challenge = resource.challenge()
        resource.check(held.certificate, held.prove(challenge), challenge)
        c.release(held)
        waiter.join(30)
        lease = got[0]
        assert lease.certificate and parse(lease.certificate).holder == second.public  # type: ignore[attr-defined]
        challenge = resource.challenge()
        resource.check(lease.certificate, lease.prove(challenge), challenge)  # type: ignore[attr-defined]
        # The first holder's certificate is still within its not_after, but the
        # resource saw a newer token: refused.
        challenge = resource.challenge()
        with pytest.raises(CertificateError) as stale:
            resource.check(held.certificate, held.prove(challenge), challenge)
        assert stale.value.code == "STALE_TOKEN"
        c.release(lease)  # type: ignore[arg-type]


def test_a_malformed_holder_key_is_refused_and_nothing_is_granted(shared: LocalCluster) -> None:
    class Bad:
        def public_hex(self) -> str:
            return "AB" * 32  # upper case: not the wire format

        def prove(self, certificate: str, challenge: bytes, message: bytes = b"") -> str:
            return ""

    with shared.client() as c:
        with pytest.raises(InvalidArgumentError):
            c.acquire("certs/bad", owner="x", ttl=5.0, holder_key=Bad())
        assert c.read("certs/bad").holder is None


def test_every_node_holds_the_same_signing_keys(shared: LocalCluster) -> None:
    with shared.client() as c:
        c.release(c.acquire("certs/any", owner="x", ttl=5.0, holder_key=HolderKey()))

    def same() -> list[list[object]] | None:
        keys = [s.get("cert_keys") for s in shared.statuses()]
        return keys[0] if len(keys) == 3 and keys[0] and all(k == keys[0] for k in keys) else None

    keys = wait_for(same, 10.0, "every node applied the same certkey entries")
    assert {int(kid) for kid, _ in keys} == set(cluster_keys(shared))


def test_a_renewal_naming_another_holder_key_is_refused_and_certifies_nothing(
    shared: LocalCluster,
) -> None:
    """The security fix of issue 39: whoever has the lease id (with auth, the same
    principal) cannot get a certificate for a key of its own by renewing with it,
    neither from the leader's memory nor through the log; the holder's own key still
    renews, and a lease granted without a key gets none later."""
    mine, thief = HolderKey(), HolderKey()
    with shared.client() as c:
        lease = c.acquire("certs/bound", owner="agent", ttl=5.0, holder_key=mine)
        stolen = replace(lease, holder_key=thief, certificate="")
        with pytest.raises(HolderKeyMismatchError) as memory:
            c.renew(stolen)  # a keep-alive the leader would answer from memory
        assert memory.value.definite
        with pytest.raises(HolderKeyMismatchError):
            c.renew(stolen, ttl=8.0)  # a new TTL: through the log
        # Nothing changed: the lease is still the holder's, with its own TTL.
        seen = c.read("certs/bound").holder
        assert seen is not None and (seen.token, seen.ttl) == (lease.token, 5.0)
        # The verifier refuses a proof made with the thief's key, whichever
        # certificate it shows (the holder's binds only the holder's key).
        resource = Verifier(cluster_keys(shared))
        challenge = resource.challenge()
        with pytest.raises(CertificateError) as refused:
            resource.check(lease.certificate, thief.prove(lease.certificate, challenge), challenge)
        assert refused.value.code == "BAD_PROOF"
        # The holder's own key renews and gets a certificate for it.
        renewed = c.renew(lease)
        assert parse(renewed.certificate).holder == mine.public
        challenge = resource.challenge()
        resource.check(renewed.certificate, renewed.prove(challenge), challenge)
        c.release(renewed)

        plain = c.acquire("certs/bound-plain", owner="agent", ttl=5.0)
        with pytest.raises(HolderKeyMismatchError):
            c.renew(replace(plain, holder_key=thief))
        assert c.renew(plain).certificate == ""
        c.release(plain)


def test_a_transfer_certifies_the_new_holders_key_only(shared: LocalCluster) -> None:
    old, new = HolderKey(), HolderKey()
    with shared.client() as c:
        lease = c.acquire("certs/handoff", owner="one", ttl=5.0, holder_key=old)
        moved = c.transfer(lease, owner="two", holder_key=new)
        cert = parse(moved.certificate)
        assert (cert.key, cert.token, cert.holder, cert.op) == (
            "certs/handoff",
            moved.token,
            new.public,
            "transfer",
        )
        resource = Verifier(cluster_keys(shared))
        challenge = resource.challenge()
        resource.check(moved.certificate, moved.prove(challenge, b"w"), challenge, b"w")
        # The old holder's key proves nothing for the new lease, nor renews it.
        challenge = resource.challenge()
        with pytest.raises(CertificateError) as refused:
            resource.check(moved.certificate, old.prove(moved.certificate, challenge), challenge)
        assert refused.value.code == "BAD_PROOF"
        with pytest.raises(HolderKeyMismatchError):
            c.renew(replace(moved, holder_key=old))
        assert parse(c.renew(moved).certificate).holder == new.public
        # A transfer naming no key: the new lease has none, so no certificate.
        bare = c.transfer(moved, owner="three")
        assert bare.certificate == ""
        c.release(bare)


def test_a_set_carries_one_certificate_per_key_and_its_keepalive_fresh_ones(
    shared: LocalCluster,
) -> None:
    holder, thief = HolderKey(), HolderKey()
    with shared.client() as c:
        got = c.acquire_many(["certs/m1", "certs/m2"], owner="set", ttl=5.0, holder_key=holder)
        resource = Verifier(cluster_keys(shared))
        for lease in got.leases:
            cert = parse(lease.certificate)
            assert (cert.key, cert.token, cert.holder, cert.op) == (
                lease.key,
                lease.token,
                holder.public,
                "acquire_many",
            )
            challenge = resource.challenge()
            resource.check(lease.certificate, lease.prove(challenge), challenge, key=lease.key)
            challenge = resource.challenge()
            with pytest.raises(CertificateError) as refused:
                resource.check(
                    lease.certificate, thief.prove(lease.certificate, challenge), challenge
                )
            assert refused.value.code == "BAD_PROOF"
        time.sleep(0.05)  # so the new not_after is measurably later (ms resolution)
        kept = c.renew_many(got)
        for before, after in zip(got.leases, kept.leases, strict=True):
            cert = parse(after.certificate)
            assert cert.op == "session_keepalive" and cert.holder == holder.public
            assert cert.not_after_ms > parse(before.certificate).not_after_ms
            challenge = resource.challenge()
            resource.check(after.certificate, after.prove(challenge), challenge)
        c.release_many(kept)
        # Without a holder key: no certificates.
        plain = c.acquire_many(["certs/m3"], owner="set", ttl=5.0)
        assert plain.leases[0].certificate == ""
        assert c.renew_many(plain).leases[0].certificate == ""
        c.release_many(plain)


def test_pool_and_semaphore_units_held_through_the_recipes_are_certified(
    shared: LocalCluster,
) -> None:
    """The recipes pass holder_key to acquire and renew with it: a pool's certificate
    names its units and unit indices, a semaphore's its slot, and another key's proof
    is refused."""
    holder, thief = HolderKey(), HolderKey()
    with shared.client() as c:
        with c.pool("certs/gpus", capacity=4, units=2, ttl=5.0, holder_key=holder) as held:
            lease = held.lease
            assert lease is not None
            resource = Verifier(cluster_keys(shared))  # the first key exists by now
            cert = parse(lease.certificate)
            assert (cert.units, cert.unit_indices, cert.holder) == (
                2,
                lease.unit_indices,
                holder.public,
            )
            assert len(cert.unit_indices) == 2
            challenge = resource.challenge()
            resource.check(lease.certificate, lease.prove(challenge), challenge, key="certs/gpus")
            challenge = resource.challenge()
            with pytest.raises(CertificateError) as refused:
                resource.check(
                    lease.certificate, thief.prove(lease.certificate, challenge), challenge
                )
            assert refused.value.code == "BAD_PROOF"
        with c.semaphore("certs/slots", limit=3, ttl=5.0, holder_key=holder) as held:
            lease = held.lease
            assert lease is not None
            cert = parse(lease.certificate)
            assert (cert.units, cert.unit_indices) == (1, lease.unit_indices)
            challenge = resource.challenge()
            resource.check(lease.certificate, lease.prove(challenge), challenge)


def test_a_sessions_keepalives_bring_fresh_certificates_for_its_bound_leases(
    shared: LocalCluster,
) -> None:
    holder = HolderKey()
    with shared.client() as c, c.session(owner="s", ttl=5.0, holder_key=holder) as s:
        lease = s.acquire("certs/in-session")  # bound to the session's key by default
        first = parse(lease.certificate)
        assert (first.holder, first.op) == (holder.public, "acquire")
        plain = s.acquire("certs/in-session-plain", holder_key=None)
        time.sleep(0.05)  # so the new not_after is measurably later (ms resolution)
        s.keepalive()
        fresh = s.certified(lease)
        cert = parse(fresh.certificate)
        assert cert.op == "session_keepalive" and cert.not_after_ms > first.not_after_ms
        assert (cert.key, cert.token, cert.holder) == (lease.key, lease.token, holder.public)
        resource = Verifier(cluster_keys(shared))
        challenge = resource.challenge()
        resource.check(fresh.certificate, fresh.prove(challenge), challenge)
        assert s.certified(plain).certificate == ""  # bound to no key: never certified


def test_a_task_claim_is_certified_for_its_attempt_and_heartbeats_refresh_it(
    shared: LocalCluster,
) -> None:
    holder, thief = HolderKey(), HolderKey()
    with shared.client() as c:
        queue = c.queue("certs-q")
        tid = queue.put({"job": 1})
        task = queue.claim(worker="w", lease_ttl=5.0, holder_key=holder)
        assert task is not None
        cert = parse(task.certificate)
        assert (cert.key, cert.token, cert.holder, cert.op) == (
            f"certs-q/{tid}",
            task.token,
            holder.public,
            "task_claim",
        )
        assert (cert.queue, cert.task, cert.attempt) == ("certs-q", tid, 1)
        resource = Verifier(cluster_keys(shared))
        challenge = resource.challenge()
        resource.check(task.certificate, task.prove(challenge, b"r"), challenge, b"r", key=cert.key)
        challenge = resource.challenge()
        with pytest.raises(CertificateError) as refused:
            resource.check(task.certificate, thief.prove(task.certificate, challenge), challenge)
        assert refused.value.code == "BAD_PROOF"
        time.sleep(0.05)  # so the new not_after is measurably later (ms resolution)
        task.heartbeat()
        fresh = parse(task.certificate)
        assert fresh.op == "task_heartbeat" and fresh.not_after_ms > cert.not_after_ms
        # A heartbeat naming another key is refused and certifies nothing.
        task.aio.holder_key = thief
        with pytest.raises(HolderKeyMismatchError):
            task.heartbeat()
        task.aio.holder_key = holder
        assert task.certificate == fresh.text
        task.complete()
