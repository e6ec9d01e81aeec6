"""How a node's HTTP API reaches the leader: native client connections from this node
to the leader's client port, one per (leader, bearer token), so the leader
authenticates the HTTP caller's own token and binds leases to the same principal as
if the caller had connected itself. The request map is sent exactly as the HTTP layer
built it (dedup ids included): a forwarded retry is deduplicated like a native one.

Why forward rather than redirect (307): a redirect needs each node to know the
leader's HTTP address (members carry their Raft and client addresses only), and
browsers' ``fetch`` drops the ``Authorization`` header on a redirect to another
origin (another port is another origin), so every secured call through a follower
would fail with 401.

Event loop only. ``call`` raises ``ConnectionLostError`` (indefinite) if the connection
drops after sending, ``TimeoutError_`` (indefinite) after ``timeout``,
``UnavailableError`` (definite) if the leader cannot be reached at all, and
``UnauthenticatedError`` if the leader refuses the token.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import ssl
from collections import OrderedDict
from typing import Any

from ...config import NodeConfig
from ...errors import (
    ConfigError,
    ConnectionLostError,
    FrameTooLargeError,
    RaftLeaseError,
    TimeoutError_,
    UnavailableError,
    from_wire,
)
from ...protocol import DEFAULT_MAX_FRAME, FrameDecoder, ProtocolError, encode_frame

#: Forwarding connections a node keeps open (least recently used closed first).
MAX_FORWARD_CONNECTIONS = 64
#: Largest answer frame accepted from the leader (a leases listing may be large).
MAX_ANSWER_FRAME = 16 << 20


def client_context(config: NodeConfig) -> ssl.SSLContext | None:
    """TLS for dialling another node's client port, when the client port has TLS:
    trusting ``tls_client_ca_file`` (the CA of the cluster's certificates), else the
    node's own certificate (a cluster sharing one self-signed certificate)."""
    if not config.tls_cert_file:
        return None
    try:
        return ssl.create_default_context(cafile=config.tls_client_ca_file or config.tls_cert_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the CA for forwarding to the leader: {exc}") from None


class _Upstream:
    """One connection to the leader, many requests in flight, matched by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.closed = False
        self._task = asyncio.create_task(self._read_loop())

    async def _read_loop(self) -> None:
        decoder = FrameDecoder(MAX_ANSWER_FRAME)
        try:
            while data := await self._reader.read(1 << 16):
                for frame in decoder.feed(data):
                    rid = frame.get("id")
                    future = self._pending.pop(rid, None) if isinstance(rid, int) else None
                    if future is not None and not future.done():
                        future.set_result(frame)
        except (OSError, RaftLeaseError, ProtocolError):
            pass
        finally:
            self.closed = True
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionLostError("connection to the leader lost"))
            self._pending.clear()

    async def request(
        self, message: dict[str, Any], timeout: float, max_frame: int
    ) -> dict[str, Any]:
        rid = next(self._ids)
        frame = encode_frame({**message, "id": rid})
        if len(frame) > max_frame:
            # A JSON body under the limit can grow in msgpack (0.5 is 3 bytes of
            # JSON, 9 of msgpack): sent, the leader would close this connection, and
            # with it every other caller's request in flight on it. Refused here,
            # definitely (nothing was sent).
            raise FrameTooLargeError(
                f"the request is {len(frame)} bytes as a native frame, over the limit of "
                f"{max_frame} bytes"
            )
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            self._writer.write(frame)
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise TimeoutError_("the leader did not answer in time; outcome unknown") from None
        except OSError as exc:
            raise ConnectionLostError(f"connection to the leader lost: {exc}") from None
        finally:
            self._pending.pop(rid, None)

    async def close(self) -> None:
        self.closed = True
        self._task.cancel()
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


class Forwarder:
    """Connections from this node to leaders, keyed by (address, token digest).

    ``tls``: the client context for a leader's client port (None: plain TCP)."""

    def __init__(self, tls: ssl.SSLContext | None, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.tls = tls
        #: Largest frame sent to a leader: its client port's limit (ours, the same
        #: setting cluster-wide).
        self.max_frame = max_frame
        self._conns: OrderedDict[tuple[str, str], _Upstream] = OrderedDict()
        self._lock = asyncio.Lock()

    async def _connection(self, addr: str, token: str | None, timeout: float) -> _Upstream:
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest() if token else ""
        slot = (addr, digest)
        async with self._lock:
            conn = self._conns.get(slot)
            if conn is not None and not conn.closed:
                self._conns.move_to_end(slot)
                return conn
            host, _, port = addr.rpartition(":")
            host = host.strip("[]")
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        host,
                        int(port),
                        ssl=self.tls,
                        server_hostname=host if self.tls is not None else None,
                    ),
                    timeout,
                )
            except (OSError, TimeoutError, ValueError) as exc:
                raise UnavailableError(f"cannot reach the leader at {addr}: {exc}") from None
            conn = _Upstream(reader, writer)
            if token is not None:
                answer = await conn.request({"op": "auth", "token": token}, timeout, self.max_frame)
                if not answer.get("ok"):
                    await conn.close()
                    raise from_wire(str(answer.get("code")), str(answer.get("message")))
            self._conns[slot] = conn
            while len(self._conns) > MAX_FORWARD_CONNECTIONS:
                _, oldest = self._conns.popitem(last=False)
                await oldest.close()
            return conn

    async def call(
        self, addr: str, token: str | None, message: dict[str, Any], timeout: float
    ) -> dict[str, Any]:
        """Send ``message`` to the node at ``addr``; its result map, or raise the
        ``RaftLeaseError`` it answered (a ``NotLeaderError`` names the new leader)."""
        conn = await self._connection(addr, token, timeout)
        answer = await conn.request(message, timeout, self.max_frame)
        if not answer.get("ok"):
            raise from_wire(
                str(answer.get("code")), str(answer.get("message")), answer.get("detail")
            )
        result: dict[str, Any] = answer.get("result") or {}
        return result

    async def close(self) -> None:
        conns, self._conns = self._conns, OrderedDict()
        for conn in conns.values():
            await conn.close()
