"""The HTTP middleware example (examples/verified_http, issue 39) with certificates from
a real cluster: the holder's write is accepted; a thief with a copied certificate, a
request without one, an expired certificate and a lower token after a higher one are
refused with 401/403 and the verifier's code."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from aiohttp import web

from raftlease.testing import LocalCluster, free_port_block
from raftlease.verify import HolderKey, Verifier, parse

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SERVICE = (
    Path(__file__).resolve().parents[2] / "examples" / "verified_http" / "certified_service.py"
)


def load_service() -> ModuleType:
    spec = importlib.util.spec_from_file_location("certified_service", SERVICE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cluster_keys(cluster: LocalCluster) -> dict[int, str]:
    with cluster.client() as c:
        statuses = [s for s in c.cluster_status() if s.get("reachable") and "cert_keys" in s]
    statuses.sort(key=lambda s: s.get("role") != "leader")
    return {int(kid): str(pub) for kid, pub in statuses[0]["cert_keys"]}


class Clock:
    """The service's wall clock, which the test moves ahead."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


class Server:
    """An aiohttp app served on a thread of its own, on a port of this worker's slice."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = free_port_block(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.runner: web.AppRunner | None = None

    def start(self, app: web.Application) -> None:
        async def run() -> web.AppRunner:
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            return runner

        self.runner = asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=10)

    def close(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    try:
        yield s
    finally:
        s.close()


def call(
    url: str, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    request = urllib.request.Request(url + path, data=body or None, method=method)
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read()), dict(answer.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


def test_the_middleware_lets_only_the_current_holder_write(
    shared: LocalCluster, server: Server
) -> None:
    service = load_service()
    url = server.url
    key = "http-verified/gpu-0"
    path = f"/resources/{key}"
    clock = Clock()
    first, second, thief = HolderKey(), HolderKey(), HolderKey()
    with shared.client() as c:
        lease = c.acquire(key, owner="first", ttl=30.0, holder_key=first)
        assert lease.certificate
        verifier = Verifier(cluster_keys(shared), drift_allowance=0.5, clock=clock)
        server.start(service.make_app(verifier))

        def challenge() -> bytes:
            status, body, _ = call(url, "GET", "/challenge")
            assert status == 200
            return bytes(service.unb64(body["challenge"]))

        def write(lease_or_none: Any, value: bytes, *, signer: Any = None) -> tuple[int, Any]:
            nonce = challenge()
            headers = service.certified_headers(lease_or_none, nonce, "PUT", path, value)
            if signer is not None:  # a thief: the copied certificate, its own proof
                message = service.request_message("PUT", path, value)
                headers[service.HEADER_PROOF] = signer.prove(
                    lease_or_none.certificate, nonce, message
                )
            status, body, _ = call(url, "PUT", path, value, headers)
            return status, body

        status, body = write(lease, b"v1")
        assert (status, body) == (200, {"key": key, "token": lease.token})
        assert call(url, "GET", path)[1]["value"] == service.b64(b"v1")

        # No certificate: 401 with a challenge to prove with.
        status, body, headers = call(url, "PUT", path, b"v")
        assert (status, body["code"]) == (401, "MISSING_CERTIFICATE")
        assert headers["WWW-Authenticate"].startswith('Raftlease-Certificate challenge="')
        # Hostile headers: a definite 401 with a code, never a crash.
        for garbage in (
            {"Raftlease-Certificate": "x", "Raftlease-Challenge": "!!!", "Raftlease-Proof": "?"},
            {
                "Raftlease-Certificate": "rlc1.AA.AA",
                "Raftlease-Challenge": "é",
                "Raftlease-Proof": "p",
            },
        ):
            status, body, _ = call(url, "PUT", path, b"v", garbage)
            assert status == 401 and body["code"] in ("BAD_CERTIFICATE", "UNKNOWN_CHALLENGE"), body
        # A thief with a copy of the holder's certificate.
        status, body = write(lease, b"stolen", signer=thief)
        assert (status, body["code"]) == (401, "BAD_PROOF")
        # The same headers replayed: the challenge is spent.
        nonce = challenge()
        headers = service.certified_headers(lease, nonce, "PUT", path, b"v2")
        assert call(url, "PUT", path, b"v2", headers)[0] == 200
        status, body, _ = call(url, "PUT", path, b"v2", headers)
        assert (status, body["code"]) == (401, "UNKNOWN_CHALLENGE")
        # A proof for another body than the one sent.
        nonce = challenge()
        headers = service.certified_headers(lease, nonce, "PUT", path, b"v3")
        status, body, _ = call(url, "PUT", path, b"other", headers)
        assert (status, body["code"]) == (401, "BAD_PROOF")

        # A lower token after a higher one: released (the certificate is not revoked),
        # the next holder writes, then the first holder's write is refused.
        c.release(lease)
        newer = c.acquire(key, owner="second", ttl=30.0, holder_key=second)
        assert write(newer, b"v4") == (200, {"key": key, "token": newer.token})
        status, body = write(lease, b"late")
        assert (status, body["code"]) == (403, "STALE_TOKEN")
        assert call(url, "GET", path)[1] == {
            "key": key,
            "token": newer.token,
            "value": service.b64(b"v4"),
        }

        # Expired: the service's clock reaches not_after less the allowance.
        clock.offset = parse(newer.certificate).not_after_ms / 1000 - time.time() - 0.4
        status, body = write(newer, b"v5")
        assert (status, body["code"]) == (403, "CERT_EXPIRED")
        c.release(newer)
