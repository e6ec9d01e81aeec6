"""An HTTP service that accepts a write only from the current holder of a lease, with
no call to the cluster: aiohttp middleware that checks a lease certificate and a proof
of possession (docs/certificates.md) on every protected request.

    python3 examples/verified_http/certified_service.py --keys cluster-keys.txt --port 8080

``cluster-keys.txt`` is the output of ``raftlease cert-keys``. Routes:

* ``GET /challenge``: ``{"challenge": "<base64url>"}``, single use, valid 60 s;
* ``PUT /resources/{key}``: protected (the middleware), stores the body under ``key``;
* ``GET /resources/{key}``: open, ``{"key", "token", "value"}`` (the value base64url).

A protected request carries three headers (``certified_headers`` builds them):
``Raftlease-Certificate`` (the lease's certificate), ``Raftlease-Challenge`` (a
challenge from this service, base64url) and ``Raftlease-Proof`` (the holder key's
proof over the certificate, the challenge and ``request_message``: method, path with
query exactly as sent, a NUL byte, the body). A refusal is JSON ``{"code", "message"}``: 401 (with a
fresh challenge in ``WWW-Authenticate``) when the request does not prove who sends it
(no or malformed headers, ``BAD_CERTIFICATE``, ``UNKNOWN_KEY``, ``BAD_SIGNATURE``,
``UNKNOWN_CHALLENGE``, ``BAD_PROOF``), 403 when it proves it but may not write now
(``WRONG_KEY``, ``CERT_EXPIRED``, ``STALE_TOKEN``).

Challenges are handed to anyone who asks (``GET /challenge``, every 401): the
verifier keeps at most 10,000 open and forgets the oldest first, so a flood of asks
can make a holder's request fail ``UNKNOWN_CHALLENGE`` (it asks again); it can never
make a request accepted. Rate-limit the route where that matters.

Threads: the middleware and handlers run on the service's event loop; the verifier is
thread-safe and never blocks. The store's write compares tokens itself as well, so the
fence holds even if a handler awaited between the check and the write.
"""

from __future__ import annotations

import argparse
import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from raftlease.models import Lease
from raftlease.verify import Certificate, CertificateError, Verifier, load_keys

HEADER_CERTIFICATE = "Raftlease-Certificate"
HEADER_CHALLENGE = "Raftlease-Challenge"
HEADER_PROOF = "Raftlease-Proof"

#: The refusals a caller cannot fix by proving more: it proved who it is, but its
#: lease does not allow this write now. Every other refusal is 401.
FORBIDDEN = frozenset({"WRONG_KEY", "CERT_EXPIRED", "STALE_TOKEN"})

#: Where the middleware puts the accepted certificate on the request (a typed key on
#: the aiohttp releases that have one, else the plain name older releases use).
CERTIFICATE: Any = (
    web.RequestKey("certificate", Certificate)
    if hasattr(web, "RequestKey")
    else "raftlease.certificate"
)
VERIFIER = web.AppKey("verifier", Verifier)
#: The store: key -> (the token of its last write, the value).
STORE = web.AppKey("store", dict[str, tuple[int, bytes]])

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def request_message(method: str, path_qs: str, body: bytes) -> bytes:
    """The bytes a holder signs for one request: ``METHOD path?query``, NUL, body. The
    method and path are in it so a proof for one request never fits another."""
    return f"{method.upper()} {path_qs}".encode() + b"\x00" + body


def certified_headers(
    lease: Lease, challenge: bytes, method: str, path_qs: str, body: bytes = b""
) -> dict[str, str]:
    """The holder's side: the three headers for one request. Raises ``ValueError`` if
    ``lease`` has no certificate (acquire it with ``holder_key=``)."""
    proof = lease.prove(challenge, request_message(method, path_qs, body))
    return {
        HEADER_CERTIFICATE: lease.certificate,
        HEADER_CHALLENGE: b64(challenge),
        HEADER_PROOF: proof,
    }


def _refuse(verifier: Verifier, code: str, message: str) -> web.Response:
    status = 403 if code in FORBIDDEN else 401
    headers = {}
    if status == 401:  # the way in: a fresh challenge to prove with
        headers["WWW-Authenticate"] = (
            f'Raftlease-Certificate challenge="{b64(verifier.challenge())}"'
        )
    return web.json_response({"code": code, "message": message}, status=status, headers=headers)


def certificate_middleware(
    verifier: Verifier, resource_key: Callable[[web.Request], str | None]
) -> Any:
    """Middleware that lets a request through only with a valid certificate for
    ``resource_key(request)`` and the holder's proof; a route whose ``resource_key``
    is None is open. The accepted certificate is at ``request[CERTIFICATE]``. The body
    is read (within aiohttp's ``client_max_size``) before the check: the proof covers
    it."""

    @web.middleware
    async def check_certificate(request: web.Request, handler: Handler) -> web.StreamResponse:
        key = resource_key(request)
        if key is None:
            return await handler(request)
        certificate = request.headers.get(HEADER_CERTIFICATE)
        proof = request.headers.get(HEADER_PROOF)
        challenge_text = request.headers.get(HEADER_CHALLENGE)
        if not certificate or not proof or not challenge_text:
            return _refuse(
                verifier,
                "MISSING_CERTIFICATE",
                f"send {HEADER_CERTIFICATE}, {HEADER_CHALLENGE} and {HEADER_PROOF}",
            )
        try:
            challenge = unb64(challenge_text)
        except (binascii.Error, ValueError):
            return _refuse(verifier, "UNKNOWN_CHALLENGE", "the challenge is not base64url")
        body = await request.read()
        message = request_message(request.method, request.path_qs, body)
        try:
            accepted = verifier.check(certificate, proof, challenge, message, key=key)
        except CertificateError as exc:
            return _refuse(verifier, exc.code, str(exc))
        request[CERTIFICATE] = accepted.certificate
        return await handler(request)

    return check_certificate


def _protected_key(request: web.Request) -> str | None:
    """The lease key a request must hold: writes to ``/resources/{key}``."""
    if request.method in ("PUT", "POST", "DELETE") and request.path.startswith("/resources/"):
        return request.match_info.get("key")
    return None


async def _challenge(request: web.Request) -> web.Response:
    return web.json_response({"challenge": b64(request.app[VERIFIER].challenge())})


async def _write(request: web.Request) -> web.Response:
    cert: Certificate = request[CERTIFICATE]
    store = request.app[STORE]
    key = request.match_info["key"]
    # No await between the middleware's check and here, and the token compared again:
    # a write never lands below one already stored.
    current = store.get(key)
    if current is not None and cert.token < current[0]:
        return web.json_response(
            {"code": "STALE_TOKEN", "message": "a newer token wrote first"}, status=403
        )
    store[key] = (cert.token, await request.read())
    return web.json_response({"key": key, "token": cert.token})


async def _read(request: web.Request) -> web.Response:
    key = request.match_info["key"]
    token, value = request.app[STORE].get(key, (0, b""))
    return web.json_response({"key": key, "token": token, "value": b64(value)})


def make_app(verifier: Verifier) -> web.Application:
    """The service: the middleware in front of a key-value store in memory."""
    app = web.Application(middlewares=[certificate_middleware(verifier, _protected_key)])
    app[VERIFIER] = verifier
    app[STORE] = {}
    app.router.add_get("/challenge", _challenge)
    app.router.add_put("/resources/{key:.+}", _write)
    app.router.add_get("/resources/{key:.+}", _read)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", required=True, help="a file of `raftlease cert-keys` output")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--drift-allowance", type=float, default=0.5)
    args = parser.parse_args()
    with open(args.keys) as f:
        verifier = Verifier(load_keys(f.read()), drift_allowance=args.drift_allowance)
    web.run_app(make_app(verifier), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
