"""What lease certificates and the audit trail cost, the parts measured in one process
(issue 39): shared by the benchmark's certs group (workloads/certs.py) and the quick
separate tool scripts/cert_bench, so that the two never measure differently.

* ``certified_acquire``: one acquire with a holder key whose answer must carry a
  certificate (``MissingCertificate`` otherwise, a ``RaftLeaseError`` so the load
  loops count it as an error);
* ``apply_costs``: the state machine alone applying an acquire and its release, with
  the audit trail and without it (``AuditTrail.add`` replaced by a no-op), in
  alternating tries;
* ``verify_rates``: ``Verifier.check`` and ``HolderKey.prove`` per second on one core.

Everything blocks the calling thread for its duration. ``apply_costs`` swaps a class
attribute of ``raftlease.core.audit.AuditTrail`` while it runs: call it with no
store applying entries on another thread of this process (the benchmark's clusters
are other processes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import raftlease.core.audit as audit_module
from raftlease.client import Client, Lease
from raftlease.core import LeaseStore
from raftlease.errors import RaftLeaseError
from raftlease.verify import HolderKey, Verifier, certificate_body, public_bytes, sign_certificate


class MissingCertificate(RaftLeaseError):
    """An acquire with ``holder_key`` was answered without a certificate (a node whose
    drift alarm is raised, or one that cannot sign): counted as an error, never as a
    certified acquire."""

    code = "NO_CERTIFICATE"
    definite = False


def certified_acquire(
    client: Client, key: str, holder: HolderKey | None, ttl: float, owner: str = "bench-agent"
) -> Lease:
    """Acquire ``key`` on ``client`` (blocking), with ``holder`` as its holder key when
    given. Raises what ``Client.acquire`` raises, and ``MissingCertificate`` when a
    holder key was sent and the answer has no certificate."""
    lease = client.acquire(key, owner=owner, ttl=ttl, holder_key=holder)
    if holder is not None and not lease.certificate:
        raise MissingCertificate(f"acquire of {key} answered without a certificate")
    return lease


def _apply_pairs(pairs: int) -> float:
    """Seconds a fresh store takes to apply ``pairs`` acquires, each with its release
    (500 keys, 50 clients, log time advancing by one ms per pair)."""
    store = LeaseStore()
    start = time.perf_counter()
    for i in range(pairs):
        key, lid, cid = f"k{i % 500}", f"L{i}", f"c{i % 50}"
        seq = 2 * (i // 50) + 1
        store.apply(
            {
                "op": "acquire",
                "now": i,
                "term": 1,
                "key": key,
                "owner": "o",
                "ttl": 10**6,
                "lid": lid,
                "cid": cid,
                "seq": seq,
                "ack": seq,
                "principal": "p",
            }
        )
        store.apply(
            {
                "op": "release",
                "now": i,
                "term": 1,
                "key": key,
                "lid": lid,
                "cid": cid,
                "seq": seq + 1,
                "ack": seq + 1,
                "principal": "p",
            }
        )
    return time.perf_counter() - start


def _silent_add(self: audit_module.AuditTrail, *args: Any) -> None:
    return None


def _set_add(add: Callable[..., None]) -> None:
    """Make ``add`` every AuditTrail's ``add`` (class attribute; see the module doc)."""
    audit_module.AuditTrail.add = add  # type: ignore[method-assign]


def apply_costs(pairs: int, tries: int) -> dict[str, Any]:
    """Microseconds the state machine takes for one acquire and its release, the best
    of ``tries`` runs of ``pairs`` pairs each with the audit trail and without it
    (tries alternate: without, with, with, without, ...; so a drift of the machine
    favours neither). Returns ``pairs``, ``tries``, ``without_audit_us``,
    ``with_audit_us``, ``audit_us`` (their difference) and ``records_per_pair`` (2:
    the grant and the release). ``AuditTrail.add`` is restored whatever happens."""
    saved = audit_module.AuditTrail.add
    best = {False: float("inf"), True: float("inf")}
    try:
        for n in range(tries):
            for audited in (False, True) if n % 2 == 0 else (True, False):
                _set_add(saved if audited else _silent_add)
                best[audited] = min(best[audited], _apply_pairs(pairs) / pairs * 1e6)
    finally:
        _set_add(saved)
    return {
        "pairs": pairs,
        "tries": tries,
        "without_audit_us": best[False],
        "with_audit_us": best[True],
        "audit_us": best[True] - best[False],
        "records_per_pair": 2,
    }


def verify_rates(seconds: float) -> dict[str, Any]:
    """``Verifier.check`` (certificate signature, expiry, challenge, proof of
    possession, token) and the holder's ``HolderKey.prove`` per second on one core:
    ``seconds`` of challenge + prove + check, then ``seconds / 2`` of prove alone; a
    check's rate is the first loop's with the prove's time taken out. Raises
    ``raftlease.verify.CertificateError`` if a check refuses (the figure would then
    be meaningless)."""
    cluster_key = Ed25519PrivateKey.generate()
    holder = HolderKey()
    now_ms = int(time.time() * 1000)
    body = certificate_body(
        kid=1,
        key="gpu-0",
        token=7,
        principal="agent",
        units=1,
        unit_indices=[],
        holder=holder.public,
        not_after_ms=now_ms + 3_600_000,
        issued_at_ms=now_ms,
        op="acquire",
    )
    cert = sign_certificate(cluster_key, body)
    verifier = Verifier({1: public_bytes(cluster_key.public_key())})
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or n == 0:
        challenge = verifier.challenge()
        verifier.check(cert, holder.prove(cert, challenge, b"write"), challenge, b"write")
        n += 1
    both = n / (time.perf_counter() - start)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds / 2 or n == 0:
        holder.prove(cert, b"c" * 16, b"write")
        n += 1
    prove = n / (time.perf_counter() - start)
    # One loop did a prove and a check; take the prove's time out (a check alone).
    rest = 1 / both - 1 / prove
    check = 1 / rest if rest > 0 else both
    return {"seconds": seconds, "check_per_s": check, "prove_per_s": prove}
