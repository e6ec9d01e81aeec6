"""The TypeScript verifier of lease certificates (examples/verify-ts, issue 39) against
certificates from a real cluster: compiled with the pinned tsc (``npm ci``), it accepts
the holder's request and refuses, with the Python verifier's codes, a thief with a
copied certificate, a changed body, an expired certificate (the resource's clock moved
ahead), a lower token after a higher one and a reused challenge; it parses hostile
bodies exactly as ``raftlease.verify.parse`` does (same fields, or BAD_CERTIFICATE);
and it answers every combination of faults as ``raftlease.verify.Verifier`` does.

Needs node and npm (scripts/test installs them with apt on a fresh machine); without
them the tests are skipped, and fail under CI=true."""

from __future__ import annotations

import base64
import itertools
import json
import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from raftlease.testing import LocalCluster
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

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "verify-ts"
SOURCES = (
    "package.json",
    "package-lock.json",
    "tsconfig.json",
    "msgpack.ts",
    "verify.ts",
    "cli.ts",
)


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}: scripts/test installs them on a fresh CI machine")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example compiled in a copy (the work tree stays clean): ``npm ci`` of the
    pinned typescript and @types/node, then ``tsc -p .``. Returns dist/cli.js."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        _missing("node and npm are not installed")
    assert node is not None and npm is not None
    work = tmp_path_factory.mktemp("verify-ts")
    for name in SOURCES:
        shutil.copy(EXAMPLE / name, work / name)
    for command in (
        [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"],
        [node, "node_modules/typescript/bin/tsc", "-p", "."],
    ):
        out = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=150)
        assert out.returncode == 0, f"{command}: {out.stdout}{out.stderr}"
    return work / "dist" / "cli.js"


class TsVerifier:
    """The compiled verifier as a child process (examples/verify-ts/cli.ts)."""

    def __init__(self, script: Path) -> None:
        node = shutil.which("node")
        assert node is not None
        self.proc = subprocess.Popen(
            [node, str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the TypeScript verifier exited ({self.proc.poll()})"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def challenge(self) -> bytes:
        return bytes.fromhex(self.ask(op="challenge")["challenge"])

    def check(
        self, certificate: str, proof: str, challenge: bytes, message: bytes, key: str
    ) -> dict[str, Any]:
        return self.ask(
            op="check",
            certificate=certificate,
            proof=proof,
            challenge=challenge.hex(),
            message=message.hex(),
            key=key,
        )

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def ts(compiled: Path) -> Iterator[TsVerifier]:
    verifier = TsVerifier(compiled)
    try:
        yield verifier
    finally:
        verifier.close()


def keys_text(cluster: LocalCluster) -> str:
    """The cluster's verification keys as ``raftlease cert-keys`` prints them."""
    with cluster.client() as c:
        statuses = [s for s in c.cluster_status() if s.get("reachable") and "cert_keys" in s]
    statuses.sort(key=lambda s: s.get("role") != "leader")
    return "".join(f"{kid} {pub}\n" for kid, pub in statuses[0]["cert_keys"])


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def refused(answer: dict[str, Any]) -> str:
    assert answer["ok"] is False, answer
    return str(answer["code"])


def test_the_typescript_verifier_accepts_the_holder_and_refuses_the_rest(
    shared: LocalCluster, ts: TsVerifier
) -> None:
    key = "ts-verify/gpu-0"
    first, second, thief = HolderKey(), HolderKey(), HolderKey()
    with shared.client() as c:
        lease = c.acquire(key, owner="first", ttl=30.0, holder_key=first)
        assert lease.certificate
        assert ts.ask(op="keys", keys=keys_text(shared), drift_allowance=0.5)["ok"]

        # The holder: accepted, and the TS verifier reads what Python reads.
        challenge = ts.challenge()
        answer = ts.check(lease.certificate, lease.prove(challenge, b"w1"), challenge, b"w1", key)
        cert = parse(lease.certificate)
        assert answer["ok"] is True, answer
        assert (answer["token"], answer["holder"], answer["not_after"]) == (
            str(lease.token),
            first.public.hex(),
            str(cert.not_after_ms),
        )
        # The same challenge again, even with a valid proof: spent.
        again = ts.check(lease.certificate, lease.prove(challenge, b"w2"), challenge, b"w2", key)
        assert refused(again) == "UNKNOWN_CHALLENGE"
        # A challenge the verifier never issued.
        made_up = os.urandom(16)
        forged = ts.check(lease.certificate, lease.prove(made_up, b"w"), made_up, b"w", key)
        assert refused(forged) == "UNKNOWN_CHALLENGE"

        # A thief with a copy of the certificate, proving with its own key.
        challenge = ts.challenge()
        stolen = thief.prove(lease.certificate, challenge, b"w3")
        assert refused(ts.check(lease.certificate, stolen, challenge, b"w3", key)) == "BAD_PROOF"
        # The holder's proof for other request bytes.
        challenge = ts.challenge()
        other = lease.prove(challenge, b"something else")
        assert refused(ts.check(lease.certificate, other, challenge, b"w4", key)) == "BAD_PROOF"

        # A changed body (a higher token) under the cluster's signature.
        prefix, body, signature = lease.certificate.split(".")
        data = msgpack.unpackb(unb64(body), raw=False)
        data["token"] += 1000
        tampered = f"{prefix}.{b64(msgpack.packb(data, use_bin_type=True))}.{signature}"
        challenge = ts.challenge()
        proof = lease.holder_key.prove(tampered, challenge, b"w5")  # type: ignore[union-attr]
        assert refused(ts.check(tampered, proof, challenge, b"w5", key)) == "BAD_SIGNATURE"
        # For another key than the one this resource guards.
        challenge = ts.challenge()
        proof = lease.prove(challenge, b"w6")
        assert refused(ts.check(lease.certificate, proof, challenge, b"w6", "x")) == "WRONG_KEY"

        # A lower token after a higher one: the first holder's certificate stays valid
        # after its release (not revoked), but the next holder's token was accepted.
        c.release(lease)
        newer = c.acquire(key, owner="second", ttl=30.0, holder_key=second)
        assert newer.token > lease.token
        challenge = ts.challenge()
        answer = ts.check(newer.certificate, newer.prove(challenge, b"w7"), challenge, b"w7", key)
        assert answer["ok"] is True and answer["token"] == str(newer.token), answer
        challenge = ts.challenge()
        late = ts.check(lease.certificate, lease.prove(challenge, b"w8"), challenge, b"w8", key)
        assert refused(late) == "STALE_TOKEN"

        # Expired: the resource's clock moved to within the allowance of not_after.
        not_after = parse(newer.certificate).not_after_ms / 1000
        challenge = ts.challenge()
        assert ts.ask(op="advance", seconds=not_after - time.time() - 0.4)["ok"]
        answer = ts.check(newer.certificate, newer.prove(challenge, b"w9"), challenge, b"w9", key)
        assert refused(answer) == "CERT_EXPIRED"

        # Not a certificate at all; a key id the resource was not given.
        assert refused(ts.check("rlc1.x.y", "p", challenge, b"", key)) == "BAD_CERTIFICATE"
        assert ts.ask(op="keys", keys="", drift_allowance=0.5)["ok"]
        challenge = ts.challenge()
        proof = newer.prove(challenge, b"w10")
        assert refused(ts.check(newer.certificate, proof, challenge, b"w10", key)) == "UNKNOWN_KEY"
        c.release(newer)


def _bodies(real: bytes) -> Iterator[bytes]:
    """Hostile and odd certificate bodies: crafted ones (unknown fields of every msgpack
    type, edge values, Python's own quirks), then seeded random damage to a real one."""
    base = msgpack.unpackb(real, raw=False)

    def pack(**change: Any) -> bytes:
        data = {**base, **change}
        out: bytes = msgpack.packb(
            {k: v for k, v in data.items() if v is not _DROP}, use_bin_type=True
        )
        return out

    yield real
    yield pack(extra={"nested": [1, 2.5, None, True, b"\x00", {"deep": []}]}, more=-(2**63))
    yield pack(ext=msgpack.ExtType(5, b"abc"), when=msgpack.Timestamp(1, 5))
    yield pack(v=True)
    yield pack(v=1.0)
    yield pack(v=2)
    yield pack(v=_DROP)
    yield pack(kid=0)
    yield pack(kid=2**31)
    yield pack(kid=2**31 + 1)
    yield pack(token=2**63)
    yield pack(token=2**63 + 1)
    yield pack(token=0)
    yield pack(token=1.0)
    yield pack(token=True)
    yield pack(units=0)
    yield pack(slots=[0, 2**31])
    yield pack(slots=[-1])
    yield pack(slots=(1, "a"))
    yield pack(holder=b"\x01" * 31)
    yield pack(holder="x" * 32)
    yield pack(not_after=-1)
    yield pack(issued_at=_DROP)
    yield pack(op=None)
    yield pack(key="ключ/🔑")
    yield pack(principal=b"bytes")
    yield real + b"\x00"  # trailing bytes
    yield real[:-1]
    yield b"\x91" * 1023 + b"\x01"
    yield b"\x81\xa1v\x01"

    # The real body with one raw field more (what a newer server might add, or worse).
    assert 0x80 <= real[0] < 0x8F, "the real body is a fixmap"

    def plus(field: bytes) -> bytes:
        return bytes([real[0] + 1]) + real[1:] + field

    yield plus(b"\xc4\x01a\x02")  # a bin key: kept apart, ignored
    yield plus(b"\x01\x02")  # an int key: refused
    yield plus(b"\xc0\x02")  # a nil key: refused
    yield plus(b"\xa1x\xa1\xff")  # a str value that is not UTF-8: refused
    yield plus(b"\xa1x\x81\x01\x02")  # an int key in a nested map: refused
    yield plus(b"\xa5token\x05")  # a repeated key: the last one wins
    yield plus(b"\xa1x\xd7\xff" + b"\xff" * 8)  # a timestamp with nanoseconds too large
    yield plus(b"\xa1x\xc7\x03\xff\x00\x00\x00")  # a timestamp of length 3
    yield plus(b"\xa1x\xc7\x0c\xff" + b"\x00\x00\x00\x01" + b"\x00" * 8)  # valid, 12 bytes
    yield plus(b"\xa1x\xc9\x00\x00\x00\x02\x07ab")  # ext32 of another type
    yield plus(b"\xa1x\xca\x3f\x80\x00\x00")  # float32
    yield plus(b"\xa1x\xcf" + b"\xff" * 8)  # uint64 max
    yield plus(b"\xa1x\xd3" + b"\x80" + b"\x00" * 7)  # int64 min
    yield plus(b"\xa1x\xdd\xff\xff\xff\xff")  # an array32 longer than the body
    yield plus(b"\xa1x\xdb\x00\x00\x00\x01z")  # str32
    # One field nested 1,024 levels deep with the map (accepted), then 1,025 (refused).
    yield plus(b"\xa1x" + b"\x91" * 1023 + b"\x01")
    yield plus(b"\xa1x" + b"\x91" * 1024 + b"\x01")
    yield b"\xc1"
    yield b""
    rng = random.Random(39)
    for _ in range(400):
        damaged = bytearray(real)
        for _ in range(rng.randint(1, 3)):
            what = rng.random()
            at = rng.randrange(len(damaged) or 1)
            if what < 0.6:
                damaged[at] = rng.randrange(256)
            elif what < 0.8:
                del damaged[at:]
            else:
                damaged.insert(at, rng.randrange(256))
        yield bytes(damaged)


_DROP = object()


def test_the_typescript_parser_reads_hostile_bodies_as_python_does(
    shared: LocalCluster, ts: TsVerifier
) -> None:
    with shared.client() as c:
        lease = c.acquire("ts-verify/parse", ttl=10.0, holder_key=HolderKey())
        c.release(lease)
    _, body, _ = lease.certificate.split(".")
    signer = Ed25519PrivateKey.generate()
    # Sanity: certificate_body's layout is what the cluster signs.
    assert msgpack.unpackb(unb64(body), raw=False).keys() == msgpack.unpackb(
        certificate_body(
            kid=1, key="k", token=1, principal="", units=1, unit_indices=[],
            holder=b"\x00" * 32, not_after_ms=0, issued_at_ms=0, op="acquire",
        ),
        raw=False,
    ).keys()  # fmt: skip
    accepted = 0
    for index, candidate in enumerate(_bodies(unb64(body))):
        text = sign_certificate(signer, candidate) if candidate else "rlc1..AAAA"
        answer = ts.ask(op="parse", certificate=text)
        try:
            cert = parse(text)
        except CertificateError as exc:
            assert exc.code == "BAD_CERTIFICATE"
            assert answer == {**answer, "ok": False, "code": "BAD_CERTIFICATE"}, (index, answer)
            continue
        accepted += 1
        expected = {
            "ok": True,
            "kid": cert.kid,
            "key": cert.key,
            "token": str(cert.token),
            "principal": cert.principal,
            "units": cert.units,
            "slots": list(cert.unit_indices),
            "holder": cert.holder.hex(),
            "not_after": str(cert.not_after_ms),
            "issued_at": str(cert.issued_at_ms),
            "op": cert.op,
        }
        assert answer == expected, (index, candidate.hex())
    assert accepted >= 15  # the real body and the odd-but-valid ones parsed on both sides


def test_the_typescript_verifier_refuses_in_the_python_verifiers_order(ts: TsVerifier) -> None:
    """Every combination of faults (unknown key id, bad signature, other key, expired,
    unissued challenge, a thief's or a garbled proof, a stale token) gets the same
    answer from both verifiers: the same checks in the same order. Certificates are
    signed here with a key of the test's own (no cluster needed)."""
    signer, forger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    keys = f"7 {public_bytes(signer.public_key()).hex()}\n"
    assert ts.ask(op="keys", keys=keys, drift_allowance=0.5)["ok"]
    python = Verifier(load_keys(keys), drift_allowance=0.5)
    holder, thief = HolderKey(), HolderKey()
    now_ms = int(time.time() * 1000)

    def certificate(key: str, token: int, *, kid: int = 7, forged: bool = False,
                    expired: bool = False) -> str:  # fmt: skip
        body = certificate_body(
            kid=kid, key=key, token=token, principal="p", units=1, unit_indices=[],
            holder=holder.public, not_after_ms=now_ms + (-1000 if expired else 60_000),
            issued_at_ms=now_ms, op="acquire",
        )  # fmt: skip
        return sign_certificate(forger if forged else signer, body)

    def both(cert: str, guarded: str, prover: str, issued: bool) -> tuple[str, str]:
        answers = []
        for side in ("ts", "python"):
            if issued:
                challenge = ts.challenge() if side == "ts" else python.challenge()
            else:
                challenge = os.urandom(16)
            proof = {
                "holder": holder.prove(cert, challenge, b"m"),
                "thief": thief.prove(cert, challenge, b"m"),
                "garbled": "not+a/proof!",
            }[prover]
            if side == "ts":
                answer = ts.check(cert, proof, challenge, b"m", guarded)
                answers.append("ok" if answer["ok"] else str(answer["code"]))
            else:
                try:
                    python.check(cert, proof, challenge, b"m", key=guarded)
                    answers.append("ok")
                except CertificateError as exc:
                    answers.append(exc.code)
        return answers[0], answers[1]

    cases = 0
    for index, (kid, forged, other, expired, issued, prover, stale) in enumerate(
        itertools.product(
            (7, 8), (False, True), (False, True), (False, True), (True, False),
            ("holder", "thief", "garbled"), (False, True),
        )
    ):  # fmt: skip
        key = f"order/{index}"
        if stale:  # both fences first raised to 10 for this key
            assert both(certificate(key, 10), key, "holder", True) == ("ok", "ok")
        cert = certificate(
            "elsewhere" if other else key, 5, kid=kid, forged=forged, expired=expired
        )
        ts_answer, python_answer = both(cert, key, prover, issued)
        assert ts_answer == python_answer, (kid, forged, other, expired, issued, prover, stale)
        cases += 1
    assert cases == 192
