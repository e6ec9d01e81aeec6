"""The HTTP API's pieces that are not handlers (server/http/http_api.py has those):
who sent a request (``Caller``) and this node's own client id for requests without an
Idempotency-Key (``Sequencer``), JSON and error responses (shared by the admin
endpoint and the dashboard), the bounded JSON number parsing, and the sink a watch
streams into (NDJSON or server-sent events), which stops reading when its peer does.

Threads: the node's event loop only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import json
import math
import secrets
from typing import Any

import msgpack
from aiohttp import web

from ...errors import BadRequestError, RaftLeaseError
from ...protocol import HEADER
from ..auth import Principal
from .openapi import STATUS

#: A watch stream sends a keep-alive this often, so a vanished client is noticed.
WATCH_KEEPALIVE = 15.0


class Sequencer:
    """This node's own client id for requests without an Idempotency-Key, and the
    sequence numbers still in flight (the smallest is the ack: every answer below
    it may be forgotten by the cluster)."""

    def __init__(self, node_id: str) -> None:
        self.cid = f"http-{node_id}-{secrets.token_hex(8)}"
        self._seq = itertools.count(1)
        self._open: set[int] = set()
        self._heap: list[int] = []

    def begin(self) -> int:
        seq = next(self._seq)
        self._open.add(seq)
        heapq.heappush(self._heap, seq)
        return seq

    def end(self, seq: int) -> None:
        self._open.discard(seq)

    def ack(self) -> int:
        while self._heap and self._heap[0] not in self._open:
            heapq.heappop(self._heap)
        return self._heap[0] if self._heap else 1


@dataclasses.dataclass
class Caller:
    """Who sent an HTTP request: the bearer token (forwarded as is) and its
    principal (None without auth, or before authentication)."""

    token: str | None
    principal: Principal | None


#: The state machine's wording for a ``(cid, seq)`` answered for another request.
_REUSED = "already answered for a different request"


class IdempotencyKeyReusedError(BadRequestError):
    """An Idempotency-Key already used for a different request: ``BAD_REQUEST`` (the
    code the state machine answers), HTTP 422 as the IETF Idempotency-Key draft says."""

    http_status = 422


def key_reused(exc: RaftLeaseError) -> RaftLeaseError:
    """``exc``, or for the state machine's refusal of a reused (cid, seq) under an
    Idempotency-Key, ``IdempotencyKeyReusedError`` in words for the HTTP client."""
    if isinstance(exc, BadRequestError) and _REUSED in exc.message:
        return IdempotencyKeyReusedError(
            "this Idempotency-Key was already used for a different request; nothing "
            "was applied: send a new key for a new request"
        )
    return exc


def error_body(exc: RaftLeaseError) -> dict[str, Any]:
    err: dict[str, Any] = {"code": exc.code, "message": exc.message, "definite": exc.definite}
    if exc.detail:
        err["detail"] = exc.detail
    return {"error": err}


def json_response(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(body, default=str),
        content_type="application/json",
        headers=headers,
    )


def error_response(
    exc: RaftLeaseError, status: int | None = None, close: bool = False
) -> web.Response:
    status = status or getattr(exc, "http_status", None) or STATUS.get(exc.code, 500)
    headers = {"WWW-Authenticate": 'Bearer realm="raftlease"'} if status == 401 else {}
    if close:
        headers["Connection"] = "close"
    retry_after = exc.detail.get("retry_after")
    if (
        isinstance(retry_after, int | float)
        and not isinstance(retry_after, bool)
        and math.isfinite(retry_after)
    ):
        # OVERLOADED, BUDGET_EXHAUSTED: when to come back, as HTTP says it (whole
        # seconds, RFC 9110 §10.2.3), beside the exact value in the body's detail.
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    response = json_response(status, error_body(exc), headers or None)
    if close:
        response.force_close()
    return response


def refusal(
    status: int,
    message: str,
    headers: dict[str, str] | None = None,
    close: bool = False,
    **detail: Any,
) -> web.Response:
    """A request the port itself refuses (unknown path, another method, a parser
    error): the one error object of every route, code ``BAD_REQUEST``, definite, its
    ``detail`` (e.g. ``routes``) under ``error.detail``."""
    response = json_response(status, error_body(BadRequestError(message, detail or None)), headers)
    if close:
        response.force_close()
    return response


def reject_constant(name: str) -> None:
    raise BadRequestError(f"{name} is not a JSON number raftlease accepts")


def bounded_int(text: str) -> int:
    """A JSON integer within what a native (msgpack) request can carry: a signed or
    unsigned 64-bit value. Larger ones (Python's parser takes up to 4,300 digits)
    would reach checks written for msgpack's range, and ``float()`` of one raises
    ``OverflowError``. Raises ``BadRequestError``."""
    if len(text) > 21:  # "-" and 20 digits: the widest 64-bit integer
        raise BadRequestError(f"integer of {len(text)} digits: out of range")
    value = int(text)
    if not -(2**63) <= value < 2**64:
        raise BadRequestError(f"integer {value} is out of range (64 bits)")
    return value


def integral_float(text: str) -> int | float:
    """A JSON number written with a fraction or an exponent: an integer if it is one
    (``86.0``, ``1e3``) within 64 bits, as JSON Schema counts it (the OpenAPI
    document's ``"type": "integer"`` admits ``86.0``, and integer fields took only
    ``86``), else the float."""
    value = float(text)
    if value.is_integer() and -(2**63) <= value < 2**64:
        return int(value)
    return value


def gone(request: web.BaseRequest) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


class Refusal(Exception):
    """A refusal answered with a status of its own (415, 408), and after which the
    connection may be closed (``close``: the body was not read)."""

    def __init__(self, err: RaftLeaseError, status: int | None = None, close: bool = False):
        super().__init__(err.message)
        self.err = err
        self.status = status or STATUS.get(err.code, 400)
        self.close = close


class WatchSink:
    """What ``WatchHub.stream`` writes to, instead of a native connection: it takes
    the native frames, and writes them as NDJSON lines or server-sent events."""

    def __init__(self, request: web.BaseRequest, response: web.StreamResponse, sse: bool) -> None:
        self._request = request
        self._response = response
        self._sse = sse
        self._buffer: list[bytes] = []
        self._lock = asyncio.Lock()

    @property
    def transport(self) -> asyncio.Transport:
        transport = self._request.transport
        if transport is None:
            raise ConnectionResetError("watcher gone")
        assert isinstance(transport, asyncio.Transport)
        return transport

    def is_closing(self) -> bool:
        return gone(self._request)

    def write(self, data: bytes) -> None:
        message = msgpack.unpackb(data[HEADER.size :], raw=False)
        if not message.get("ok"):
            err = RaftLeaseError(str(message.get("message")), message.get("detail"))
            body = {
                "error": {
                    "code": message.get("code"),
                    "message": err.message,
                    "definite": bool(message.get("definite")),
                    **({"detail": err.detail} if err.detail else {}),
                }
            }
            self._emit("error", None, body)
            return
        result = message.get("result") or {}
        if "revision" in result:
            self._emit("sync", result["revision"], {"type": "sync", "revision": result["revision"]})
        for event in result.get("events", ()):
            self._emit(str(event["type"]), event["revision"], event)

    def _emit(self, kind: str, revision: int | None, body: dict[str, Any]) -> None:
        text = json.dumps(body, separators=(",", ":"))
        if not self._sse:
            self._buffer.append(text.encode() + b"\n")
            return
        head = f"id: {revision}\n" if revision is not None and kind != "sync" else ""
        self._buffer.append(f"{head}event: {kind}\ndata: {text}\n\n".encode())

    async def drain(self) -> None:
        async with self._lock:
            chunks, self._buffer = self._buffer, []
            if chunks:
                await self._response.write(b"".join(chunks))

    async def keepalive(self) -> None:
        """A comment (SSE) or an empty line (NDJSON) now and then: a write to a
        vanished client fails, which ends the stream."""
        while not self.is_closing():
            await asyncio.sleep(WATCH_KEEPALIVE)
            async with self._lock:
                try:
                    await self._response.write(b": keepalive\n\n" if self._sse else b"\n")
                except (ConnectionError, RuntimeError):
                    self.transport.abort()
                    return
