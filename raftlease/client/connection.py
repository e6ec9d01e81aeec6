"""One TCP connection to a node with many requests in flight (matched by request
id), and the client id + sequence numbers that make retries idempotent.

``Connection``: event-loop only (create and use it from the client's asyncio loop);
``RequestSequencer``: any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import secrets
import ssl
import threading
from typing import Any

from ..errors import ConnectionLostError, RaftLeaseError, TimeoutError_, from_response
from ..protocol import DEFAULT_MAX_FRAME, FrameBatcher, FrameDecoder, encode_frame


class Connection:
    """One TCP connection with many requests in flight, matched by id."""

    def __init__(self, addr: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.addr = addr
        self._reader = reader
        self._writer = writer
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._streams: dict[int, asyncio.Queue[dict[str, Any] | RaftLeaseError]] = {}
        self._ids = itertools.count(1)
        self._decoder = FrameDecoder(DEFAULT_MAX_FRAME * 16)
        self.closed = False
        #: When this connection last received anything (event loop time): a node that
        #: answers other calls is slow, not gone (``Transport``).
        self.last_heard = asyncio.get_running_loop().time()
        # Requests sent in one loop turn (many agents on one AsyncClient) leave in one
        # write (protocol.py); a lone request is written at once.
        self._out = FrameBatcher(self._send, asyncio.get_running_loop().call_soon)
        self._task = asyncio.create_task(self._read_loop())

    def _send(self, data: bytes) -> None:
        if not self._writer.is_closing():  # closed: the requests fail on their own
            self._writer.write(data)

    @classmethod
    async def open(
        cls,
        addr: str,
        timeout: float,
        tls: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> Connection:
        """Connect (over TLS when ``tls`` is given, checking the node's certificate for
        its host) and, with a ``token``, authenticate before anything else is sent.
        Raises ``OSError``/``TimeoutError`` if it cannot connect, ``UnauthenticatedError``
        if the node refuses the token."""
        host, _, port = addr.rpartition(":")
        host = host.strip("[]")
        async with asyncio.timeout(timeout):  # not wait_for: see ``request``
            reader, writer = await asyncio.open_connection(
                host, int(port), ssl=tls, server_hostname=host if tls is not None else None
            )
        conn = cls(addr, reader, writer)
        if token is not None:
            try:
                answer = await conn.request({"op": "auth", "token": token}, timeout)
            except BaseException:
                await conn.close()
                raise
            if not answer.get("ok"):
                await conn.close()
                raise from_response(answer)
        return conn

    async def _read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await self._reader.read(1 << 16)
                if not data:
                    break
                self.last_heard = loop.time()
                for frame in self._decoder.feed(data):
                    rid = frame.get("id")
                    stream = self._streams.get(rid)  # type: ignore[arg-type]
                    if stream is not None:
                        stream.put_nowait(frame)
                        continue
                    if rid is None and not frame.get("ok", True):
                        # The server rejected the stream itself (e.g. an oversized
                        # frame) and closes it: every request on it gets that error.
                        self._fail_all(from_response(frame))
                        return
                    future = self._pending.pop(rid, None)  # type: ignore[arg-type]
                    if future is not None and not future.done():
                        future.set_result(frame)
        except (ConnectionError, RaftLeaseError, OSError):
            pass
        finally:
            self._fail_all()

    def _fail_all(self, error: RaftLeaseError | None = None) -> None:
        self.closed = True
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.put_nowait(error or ConnectionLostError(f"connection to {self.addr} lost"))
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(
                    error or ConnectionLostError(f"connection to {self.addr} lost")
                )
        with contextlib.suppress(Exception):
            self._writer.close()

    async def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.closed:
            raise ConnectionLostError(f"connection to {self.addr} is closed")
        rid = next(self._ids)
        message["id"] = rid
        frame = encode_frame(message)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            # Batched while other calls are in flight on this connection (they are
            # likely sent in the same loop turn); a lone call is written at once.
            self._out.batching = len(self._pending) > 1
            self._out.write(frame)
            await self._writer.drain()
            # Not asyncio.wait_for: on 3.11 it returns the answer and swallows a
            # cancellation that arrives with it, so a cancelled call would go on (a
            # waiting acquire kept waiting instead of withdrawing).
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise TimeoutError_(f"no answer from {self.addr} within {timeout:.2f} s") from None
        except (ConnectionError, OSError) as exc:
            self._fail_all()
            raise ConnectionLostError(f"connection to {self.addr} lost: {exc}") from None
        finally:
            self._pending.pop(rid, None)

    def open_stream(
        self, message: dict[str, Any]
    ) -> tuple[int, asyncio.Queue[dict[str, Any] | RaftLeaseError]]:
        """Send a request whose answers keep coming (a watch); they arrive in the
        returned queue, an error instance when the connection ends."""
        if self.closed:
            raise ConnectionLostError(f"connection to {self.addr} is closed")
        rid = next(self._ids)
        message["id"] = rid
        queue: asyncio.Queue[dict[str, Any] | RaftLeaseError] = asyncio.Queue()
        self._streams[rid] = queue
        self._out.write(encode_frame(message))
        return rid, queue

    def close_stream(self, rid: int) -> None:
        self._streams.pop(rid, None)

    async def close(self) -> None:
        self._task.cancel()
        self._fail_all()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


class RequestSequencer:
    """The client id and request numbers that make retries idempotent (Raft
    dissertation §6.3; the cluster's dedup table keys on them): a random id, a sequence
    number per mutating request, and the requests still awaiting an answer (every seq
    below the smallest of them is acknowledged to the cluster).

    Threads: any (the blocking client's direct lane numbers requests on the calling
    thread while the event loop numbers the rest); each method holds a lock for a few
    set and heap operations, never while waiting."""

    def __init__(self) -> None:
        self.cid = secrets.token_hex(16)
        self._seq = itertools.count(1)
        self._outstanding: set[int] = set()
        self._heap: list[int] = []  # outstanding seqs, ended ones removed lazily
        self._lock = threading.Lock()

    def begin(self) -> int:
        with self._lock:
            seq = next(self._seq)
            self._outstanding.add(seq)
            heapq.heappush(self._heap, seq)
            return seq

    def end(self, seq: int) -> None:
        """Idempotent: ending a seq twice is harmless."""
        with self._lock:
            self._outstanding.discard(seq)

    def ack(self) -> int:
        with self._lock:
            heap = self._heap
            while heap[0] not in self._outstanding:
                heapq.heappop(heap)
            return heap[0]
