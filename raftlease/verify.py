"""Lease certificates, checked by the resource a lease protects with no call to the
cluster (docs/certificates.md gives the design and the wire format byte by byte).

A node that grants or renews a lease for a request carrying a holder's public key
answers with a *certificate*: the cluster's signing key (Ed25519, rotated through the
log) signs the key, the fencing token, the principal, the units and their indices,
the holder's public key and ``not_after`` (milliseconds of Unix time on the signer's
wall clock, the clock-drift bound already subtracted). The holder keeps the private
half of its own key pair (``HolderKey``) and proves possession by signing a
challenge the resource draws (``Verifier.challenge``) together with the request.

``Verifier.check`` accepts a request only if all hold:

* the certificate parses and names a cluster key the resource trusts (``keys``,
  printed by ``raftlease cert-keys``), and its signature verifies;
* it is for the key the resource guards (when the caller names one);
* ``now + drift_allowance < not_after`` on the resource's own wall clock;
* its token is at least the highest the verifier accepted for that key;
* the proof verifies under the certificate's holder key, over this certificate, a
  challenge this verifier issued and has not seen used, and the request's bytes.

So a copied token (no certificate), a copied certificate (no holder key) or a
replayed proof (its challenge is spent) is refused. Self-contained on purpose: it
imports only the standard library, ``cryptography`` and ``msgpack``, so a resource
can embed this file alone.

Threads: ``Verifier`` and ``HolderKey`` are thread-safe; nothing blocks.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

#: A certificate's text starts with this (its format version).
PREFIX = "rlc1"
#: Signed before the body bytes (domain separation: a signature over a certificate
#: never doubles as a proof, or anything else).
CERT_DOMAIN = b"raftlease-cert-v1\x00"
#: Signed before a proof's fields.
PROOF_DOMAIN = b"raftlease-pop-v1\x00"
#: The longest certificate text a verifier parses (a key of 1 KiB, 1,024 unit
#: indices and a principal fit well below it).
MAX_CERT_CHARS = 16384
#: Challenges a verifier keeps open at once (the oldest is forgotten first) and for
#: how long one stays valid (seconds).
MAX_CHALLENGES = 10000
CHALLENGE_TTL = 60.0
#: Keys whose highest accepted token a verifier remembers.
MAX_TRACKED_KEYS = 100000


class CertificateError(Exception):
    """A request the verifier refuses; ``code`` says why (definite: retrying the same
    request gets the same answer)."""

    code = "BAD_CERTIFICATE"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


#: RFC 4648 §5 without padding: the only characters a certificate's parts may hold.
_B64URL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _unb64(text: str) -> bytes:
    # Strict: the decoder alone skips characters outside the alphabet, so a
    # certificate text with stray characters would decode (the signature still held,
    # but the wire format says strict base64url, as the TypeScript verifier checks).
    if not text or len(text) % 4 == 1 or not set(text) <= _B64URL:
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def public_bytes(key: Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of an Ed25519 public key."""
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


@dataclass(frozen=True, slots=True)
class Certificate:
    """What a certificate says (``parse``); ``text`` is the certificate itself."""

    kid: int
    key: str
    token: int
    principal: str
    units: int
    unit_indices: tuple[int, ...]
    holder: bytes
    not_after_ms: int
    issued_at_ms: int
    op: str
    text: str
    #: A task attempt's certificate (``op`` ``task_claim`` or ``task_heartbeat``): its
    #: queue, task id and attempt number ("", "" and 0 for a lease's). Optional in
    #: the body, so certificates without them parse as before.
    queue: str = ""
    task: str = ""
    attempt: int = 0


def certificate_body(
    *,
    kid: int,
    key: str,
    token: int,
    principal: str,
    units: int,
    unit_indices: tuple[int, ...] | list[int],
    holder: bytes,
    not_after_ms: int,
    issued_at_ms: int,
    op: str,
    task: tuple[str, str, int] | None = None,
) -> bytes:
    """The signed bytes of a certificate: a msgpack map, keys in this order.
    ``task``: ``(queue, task id, attempt number)`` for a task attempt's certificate,
    added as the keys ``queue``, ``task`` and ``attempt`` after ``op`` (absent for a
    lease's)."""
    extra: dict[str, Any] = {}
    if task is not None:
        extra = {"queue": task[0], "task": task[1], "attempt": task[2]}
    body: bytes = msgpack.packb(
        {
            "v": 1,
            "kid": kid,
            "key": key,
            "token": token,
            "principal": principal,
            "units": units,
            "slots": list(unit_indices),
            "holder": holder,
            "not_after": not_after_ms,
            "issued_at": issued_at_ms,
            "op": op,
            **extra,
        },
        use_bin_type=True,
    )
    return body


def sign_certificate(signing_key: Ed25519PrivateKey, body: bytes) -> str:
    """The certificate text for ``body``: ``rlc1.<body>.<signature>``, base64url
    without padding (the signature is Ed25519 over ``CERT_DOMAIN + body``)."""
    signature = signing_key.sign(CERT_DOMAIN + body)
    return f"{PREFIX}.{_b64(body)}.{_b64(signature)}"


def _split(text: Any) -> tuple[bytes, bytes]:
    if not isinstance(text, str) or len(text) > MAX_CERT_CHARS:
        raise CertificateError("a certificate must be a string of at most 16384 characters")
    parts = text.split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise CertificateError(f"not a certificate (expected '{PREFIX}.<body>.<signature>')")
    try:
        return _unb64(parts[1]), _unb64(parts[2])
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"certificate is not base64url: {exc}") from None


def _int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def parse(text: Any) -> Certificate:
    """What ``text`` says, unverified. Raises ``CertificateError`` (BAD_CERTIFICATE)
    for anything malformed."""
    body, _signature = _split(text)
    try:
        data = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # any malformed msgpack: a definite refusal, never a crash
        raise CertificateError(f"certificate body is not msgpack: {exc}") from None
    if not isinstance(data, dict) or data.get("v") != 1:
        raise CertificateError("certificate body is not a version 1 map")
    slots = data.get("slots")
    fields_ok = (
        _int(data.get("kid"), 1, 2**31)
        and isinstance(data.get("key"), str)
        and _int(data.get("token"), 1, 2**63)
        and isinstance(data.get("principal"), str)
        and _int(data.get("units"), 1, 2**31)
        and isinstance(slots, list)
        and all(_int(s, 0, 2**31) for s in slots)
        and isinstance(data.get("holder"), bytes)
        and len(data["holder"]) == 32
        and _int(data.get("not_after"), 0, 2**63)
        and _int(data.get("issued_at"), 0, 2**63)
        and isinstance(data.get("op"), str)
        # A task attempt's fields, when present (absent in a lease's certificate).
        and isinstance(data.get("queue", ""), str)
        and isinstance(data.get("task", ""), str)
        and _int(data.get("attempt", 0), 0, 2**31)
    )
    if not fields_ok:
        raise CertificateError("certificate body has a missing or malformed field")
    assert isinstance(slots, list)
    return Certificate(
        kid=data["kid"],
        key=data["key"],
        token=data["token"],
        principal=data["principal"],
        units=data["units"],
        unit_indices=tuple(slots),
        holder=data["holder"],
        not_after_ms=data["not_after"],
        issued_at_ms=data["issued_at"],
        op=data["op"],
        text=text,
        queue=data.get("queue", ""),
        task=data.get("task", ""),
        attempt=data.get("attempt", 0),
    )


def proof_message(certificate: str, challenge: bytes, message: bytes) -> bytes:
    """What a holder signs: ``PROOF_DOMAIN``, SHA-256 of the certificate text (UTF-8),
    the challenge's length (1 byte) and bytes, SHA-256 of the request's bytes."""
    if len(challenge) > 255:
        raise CertificateError("a challenge is at most 255 bytes", "BAD_PROOF")
    return (
        PROOF_DOMAIN
        + hashlib.sha256(certificate.encode("utf-8")).digest()
        + bytes([len(challenge)])
        + challenge
        + hashlib.sha256(message).digest()
    )


class HolderKey:
    """A holder's own Ed25519 key pair. Made by the agent (``HolderKey()``), its
    public half goes to the cluster with the acquire; the private half never leaves
    this object. Thread-safe (immutable)."""

    def __init__(self, private: Ed25519PrivateKey | None = None) -> None:
        self._private = private if private is not None else Ed25519PrivateKey.generate()
        self.public = public_bytes(self._private.public_key())

    def public_hex(self) -> str:
        """The public half as 64 hex characters (the ``holder_key`` field)."""
        return self.public.hex()

    def prove(self, certificate: str, challenge: bytes, message: bytes = b"") -> str:
        """The proof of possession for one request: base64url of the Ed25519 signature
        over ``proof_message``."""
        return _b64(self._private.sign(proof_message(certificate, challenge, message)))


@dataclass(frozen=True, slots=True)
class Accepted:
    """A request ``Verifier.check`` accepted: its certificate."""

    certificate: Certificate


class Verifier:
    """Checks certificates and proofs of possession for one resource, offline (see the
    module docstring).

    ``keys``: the cluster's public keys, key id -> 32 raw bytes or 64 hex characters
    (``raftlease cert-keys`` prints them; ``load_keys`` reads that output).
    ``drift_allowance``: seconds this resource's wall clock may run behind the
    signer's; a certificate is refused that long before its ``not_after``.
    ``clock``: seconds of Unix time (``time.time``; tests move it).
    """

    def __init__(
        self,
        keys: Mapping[int, bytes | str],
        *,
        drift_allowance: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if drift_allowance < 0:
            raise ValueError("drift_allowance must be >= 0")
        self._lock = threading.Lock()
        self._keys: dict[int, Ed25519PublicKey] = {}
        self.drift_allowance = drift_allowance
        self._clock = clock
        self._challenges: OrderedDict[bytes, float] = OrderedDict()
        #: The highest token accepted per key (the fence), oldest-touched first.
        self.highest: OrderedDict[str, int] = OrderedDict()
        self.set_keys(keys)

    def set_keys(self, keys: Mapping[int, bytes | str]) -> None:
        """Trust exactly ``keys`` from now on (after a rotation: fetch them again)."""
        loaded = {}
        for kid, raw in keys.items():
            data = bytes.fromhex(raw) if isinstance(raw, str) else raw
            loaded[int(kid)] = Ed25519PublicKey.from_public_bytes(data)
        with self._lock:
            self._keys = loaded

    def challenge(self) -> bytes:
        """A fresh single-use challenge (16 random bytes) for the next request; valid
        for ``CHALLENGE_TTL`` seconds. At most ``MAX_CHALLENGES`` stay open (the
        oldest is forgotten first: its request is then refused UNKNOWN_CHALLENGE)."""
        value = secrets.token_bytes(16)
        with self._lock:
            self._challenges[value] = self._clock() + CHALLENGE_TTL
            while len(self._challenges) > MAX_CHALLENGES:
                self._challenges.popitem(last=False)
        return value

    def check(
        self,
        certificate: str,
        proof: str,
        challenge: bytes,
        message: bytes = b"",
        *,
        key: str | None = None,
    ) -> Accepted:
        """Accept one request (and raise the fence to its token) or raise
        ``CertificateError`` with ``code``: BAD_CERTIFICATE (malformed), UNKNOWN_KEY
        (signed by a key not trusted), BAD_SIGNATURE, WRONG_KEY (for another key than
        ``key``), CERT_EXPIRED, STALE_TOKEN (below a token already accepted for the
        key), UNKNOWN_CHALLENGE (not issued here, spent or too old), BAD_PROOF (not
        signed by the certificate's holder key over this certificate, challenge and
        ``message``). The challenge is spent by any check that reaches it."""
        cert = parse(certificate)
        body, signature = _split(certificate)
        with self._lock:
            public = self._keys.get(cert.kid)
        if public is None:
            raise CertificateError(f"signed by key {cert.kid}, which is not trusted", "UNKNOWN_KEY")
        try:
            public.verify(signature, CERT_DOMAIN + body)
        except InvalidSignature:
            raise CertificateError(
                "the certificate's signature does not verify", "BAD_SIGNATURE"
            ) from None
        if key is not None and cert.key != key:
            raise CertificateError(f"certificate is for {cert.key!r}, not {key!r}", "WRONG_KEY")
        self._check_expiry(cert)
        self._check_proof(cert, proof, challenge, message)
        with self._lock:
            highest = self.highest.get(cert.key, 0)
            if cert.token < highest:
                raise CertificateError(
                    f"token {cert.token} for {cert.key!r} is below {highest}, already accepted",
                    "STALE_TOKEN",
                )
            self.highest[cert.key] = cert.token
            self.highest.move_to_end(cert.key)
            while len(self.highest) > MAX_TRACKED_KEYS:
                self.highest.popitem(last=False)
        return Accepted(cert)

    def _check_expiry(self, cert: Certificate) -> None:
        """CERT_EXPIRED unless ``now + drift_allowance < not_after``."""
        if (self._clock() + self.drift_allowance) * 1000 >= cert.not_after_ms:
            raise CertificateError("the certificate has expired", "CERT_EXPIRED")

    def _check_proof(self, cert: Certificate, proof: str, challenge: bytes, message: bytes) -> None:
        """Spend ``challenge`` (UNKNOWN_CHALLENGE if not open), then BAD_PROOF unless
        ``proof`` is the holder key's signature over certificate, challenge, message."""
        with self._lock:
            deadline = self._challenges.pop(challenge, None)
        if deadline is None or deadline < self._clock():
            raise CertificateError(
                "challenge not issued here, already used or too old", "UNKNOWN_CHALLENGE"
            )
        try:
            holder = Ed25519PublicKey.from_public_bytes(cert.holder)
            holder.verify(_unb64(proof), proof_message(cert.text, challenge, message))
        except (InvalidSignature, ValueError, TypeError, AttributeError):
            raise CertificateError("the proof of possession does not verify", "BAD_PROOF") from None


def load_keys(text: str) -> dict[int, str]:
    """Keys from ``raftlease cert-keys`` output: lines of ``<kid> <64 hex>`` (blank
    lines and ``#`` comments skipped). Raises ``ValueError`` on any other line."""
    keys: dict[int, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        kid, _, hexkey = line.partition(" ")
        hexkey = hexkey.strip()
        if not kid.isdigit() or len(hexkey) != 64:
            raise ValueError(f"not a '<kid> <64 hex>' line: {line!r}")
        bytes.fromhex(hexkey)
        keys[int(kid)] = hexkey
    return keys
