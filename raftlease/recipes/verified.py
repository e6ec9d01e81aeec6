"""A resource that checks lease certificates itself, with no call to the cluster
(docs/certificates.md): ``FencedResource`` with proof of possession. Recipes layer;
needs only ``raftlease.verify`` (cryptography, msgpack). Not imported by
``raftlease.recipes``: import it from here.

    resource = VerifiedResource(load_keys(open("cluster-keys.txt").read()))
    challenge = resource.challenge()           # the resource, per write: to the holder
    proof = lease.prove(challenge, write_message("gpu-0", value))     # the holder
    resource.write("gpu-0", value, lease.certificate, proof, challenge)  # the resource

Thread-safe; nothing blocks. ``write`` raises ``raftlease.verify.CertificateError``
(its ``code`` says why) and then changes nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from ..verify import Accepted, CertificateError, Verifier


class VerifiedResource:
    """A key-value store guarded by lease certificates (an example of the pattern:
    a real resource checks the same way before its own write). ``data`` holds each
    key's last accepted value and token; ``accepted`` counts accepted writes.

    ``keys``, ``drift_allowance``, ``clock``: as ``raftlease.verify.Verifier``;
    ``verifier``: one made already (then those three are not used)."""

    def __init__(
        self,
        keys: Mapping[int, bytes | str],
        *,
        drift_allowance: float = 0.5,
        clock: Callable[[], float] = time.time,
        verifier: Verifier | None = None,
    ) -> None:
        self.verifier = verifier or Verifier(keys, drift_allowance=drift_allowance, clock=clock)
        self._lock = threading.Lock()
        self.data: dict[str, tuple[int, bytes]] = {}
        self.accepted = 0

    def challenge(self) -> bytes:
        """A single-use challenge for the next write (``Verifier.challenge``)."""
        return self.verifier.challenge()

    def write(
        self, key: str, value: bytes, certificate: str, proof: str, challenge: bytes
    ) -> Accepted:
        """Store ``value`` under ``key`` if the certificate is valid for ``key`` now,
        its token is not older than one accepted, and ``proof`` is the holder's
        signature over the certificate, ``challenge`` and ``key`` + NUL + ``value``.
        Raises ``CertificateError`` otherwise (nothing stored)."""
        message = write_message(key, value)
        with self._lock:  # check and store as one step: no newer token slips between
            accepted = self.verifier.check(certificate, proof, challenge, message, key=key)
            self.data[key] = (accepted.certificate.token, value)
            self.accepted += 1
        return accepted


__all__ = ["CertificateError", "VerifiedResource", "write_message"]


def write_message(key: str, value: bytes) -> bytes:
    """The bytes a holder signs for ``VerifiedResource.write(key, value, ...)``."""
    return key.encode("utf-8") + b"\x00" + value
