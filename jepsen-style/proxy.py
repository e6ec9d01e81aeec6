"""Userspace TCP fault proxy between Raft node pairs, steered by the chaos harness.

PySyncObj keeps one TCP connection per node pair: the node whose ``"host:port"`` raft
address is greater dials the other, and messages flow both ways on that connection.
A node is identified by the address string it sends first, not by where it dialled, so
pointing the dialer at a proxy (``dial = {peer_id: proxy_addr}`` in its config) puts
the proxy on the pair's only link while both nodes keep their identity.

One ``Link`` per unordered pair listens on its own port and forwards to the acceptor's
raft address. Each direction of a link (``src -> dst``, by node id) has a mode:

* ``pass``: forward bytes, after ``delay`` seconds if set (order is kept);
* ``drop``: read and discard bytes (a black hole). The stream is then corrupt, so the
  connection is marked tainted and reset on heal (a real TCP connection cut that long
  would have timed out too; resuming it would hand PySyncObj a torn frame);
* ``hold``: stop reading (the bytes wait in socket buffers, TCP backpressure) and
  deliver everything late when the direction is released.

A link can also ``refuse`` new connections (accepted, then reset at once) and
``reset`` its connections (RST both sides).

Threads: the proxies run on one asyncio loop in a daemon thread. Every steering method
of ``ProxyNet`` may be called from any thread; it blocks until the change is applied
(at most ``STEER_TIMEOUT`` seconds) and raises ``TimeoutError`` otherwise. Only
127.0.0.1 is ever dialled or listened on.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from raftlease.config import NodeAddress, parse_addr

T = TypeVar("T")

PASS, DROP, HOLD = "pass", "drop", "hold"
MODES = (PASS, DROP, HOLD)
STEER_TIMEOUT = 5.0
CONNECT_TIMEOUT = 1.0
CHUNK = 1 << 16


@dataclass
class Flow:
    """The state of one direction of a link. Mutated only on the proxy loop."""

    mode: str = PASS
    delay: float = 0.0
    released: asyncio.Event = field(default_factory=asyncio.Event)
    dropped_bytes: int = 0
    forwarded_bytes: int = 0

    def set(self, mode: str, delay: float) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
        self.mode, self.delay = mode, max(0.0, float(delay))
        if mode == HOLD:
            self.released.clear()
        else:
            self.released.set()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a reset connection would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Pipe:
    """One proxied connection: the dialer side and the acceptor side."""

    def __init__(
        self,
        link: Link,
        dialer: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        acceptor: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.link = link
        self.dialer = dialer
        self.acceptor = acceptor
        self.tainted = False
        self.closed = False
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [
            asyncio.create_task(self._pump(self.dialer[0], self.acceptor[1], self.link.forward)),
            asyncio.create_task(self._pump(self.acceptor[0], self.dialer[1], self.link.backward)),
        ]

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flow: Flow
    ) -> None:
        """Copy one direction until EOF or error; then close the whole pipe."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(maxsize=4096)
        deliver = asyncio.create_task(self._deliver(queue, writer))
        try:
            while True:
                await flow.released.wait()  # hold: do not even read (backpressure)
                data = await reader.read(CHUNK)
                if not data:
                    break
                await flow.released.wait()  # held after we read: keep the chunk in hand
                if flow.mode == DROP:
                    self.tainted = True
                    flow.dropped_bytes += len(data)
                    continue
                flow.forwarded_bytes += len(data)
                await queue.put((loop.time() + flow.delay, data))
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(deliver, 5.0)
            self.close(reset=False)

    async def _deliver(
        self, queue: asyncio.Queue[tuple[float, bytes] | None], writer: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                due, data = item
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            self.close(reset=True)

    def close(self, reset: bool) -> None:
        if self.closed:
            return
        self.closed = True
        self.link.pipes.discard(self)
        for _, writer in (self.dialer, self.acceptor):
            if reset:
                _abort(writer)
            else:
                with contextlib.suppress(Exception):
                    writer.close()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


class Link:
    """The proxy of one node pair. ``dialer`` dials (greater raft address); bytes it
    sends travel ``forward``, the acceptor's answers travel ``backward``."""

    def __init__(self, dialer: NodeAddress, acceptor: NodeAddress, listen: str) -> None:
        self.dialer = dialer
        self.acceptor = acceptor
        self.listen = listen
        self.forward = Flow()
        self.backward = Flow()
        self.forward.released.set()
        self.backward.released.set()
        self.refuse = False
        self.pipes: set[_Pipe] = set()
        self.accepted = 0
        self.refused = 0
        self._server: asyncio.Server | None = None

    def flow(self, src: str, dst: str) -> Flow:
        if (src, dst) == (self.dialer.id, self.acceptor.id):
            return self.forward
        if (src, dst) == (self.acceptor.id, self.dialer.id):
            return self.backward
        raise KeyError(f"link {self.dialer.id}-{self.acceptor.id} does not carry {src}->{dst}")

    async def start(self) -> None:
        host, port = parse_addr(self.listen, "proxy address")
        self._server = await asyncio.start_server(
            self._accept, host, port, reuse_address=True, limit=CHUNK
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self.reset()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refuse:
            self.refused += 1
            _abort(writer)
            return
        host, port = parse_addr(self.acceptor.raft, "raft address")
        try:
            upstream = await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=CHUNK), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError):
            _abort(writer)  # the acceptor is down: the dialer sees a reset
            return
        self.accepted += 1
        pipe = _Pipe(self, (reader, writer), upstream)
        self.pipes.add(pipe)
        pipe.start()

    def reset(self, only_tainted: bool = False) -> int:
        victims = [p for p in self.pipes if p.tainted or not only_tainted]
        for pipe in victims:
            pipe.close(reset=True)
        return len(victims)

    def describe(self) -> dict[str, Any]:
        return {
            "dialer": self.dialer.id,
            "acceptor": self.acceptor.id,
            "listen": self.listen,
            "forward": {"mode": self.forward.mode, "delay": self.forward.delay},
            "backward": {"mode": self.backward.mode, "delay": self.backward.delay},
            "refuse": self.refuse,
            "connections": len(self.pipes),
            "accepted": self.accepted,
            "refused": self.refused,
            "dropped_bytes": self.forward.dropped_bytes + self.backward.dropped_bytes,
            "forwarded": [self.forward.forwarded_bytes, self.backward.forwarded_bytes],
        }


class ProxyNet:
    """A proxy on every node pair of a cluster, steerable from the harness.

    ``ports`` gives one listening port per pair (in the order of ``pairs()``). Call
    ``start()`` before the nodes start (``dial_settings()`` is what to pass to
    ``LocalCluster(node_settings=...)``), and ``stop()`` at the end.
    """

    def __init__(
        self, nodes: Sequence[NodeAddress], ports: Sequence[int], host: str = "127.0.0.1"
    ) -> None:
        if host != "127.0.0.1":
            raise ValueError("the chaos proxy only listens on 127.0.0.1")
        self.nodes = {n.id: n for n in nodes}
        pairs = self.pairs(nodes)
        if len(ports) < len(pairs):
            raise ValueError(f"need {len(pairs)} proxy ports, got {len(ports)}")
        self.links: dict[frozenset[str], Link] = {}
        for (dialer, acceptor), port in zip(pairs, ports, strict=False):
            self.links[frozenset((dialer.id, acceptor.id))] = Link(
                dialer, acceptor, f"{host}:{port}"
            )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def pairs(nodes: Iterable[NodeAddress]) -> list[tuple[NodeAddress, NodeAddress]]:
        """(dialer, acceptor) for every pair: PySyncObj's rule, the greater address dials."""
        ordered = sorted(nodes, key=lambda n: n.raft)
        return [(b, a) for i, a in enumerate(ordered) for b in ordered[i + 1 :]]

    def dial_settings(self) -> dict[str, dict[str, Any]]:
        """Per-node ``dial`` tables routing every peer connection through its link."""
        settings: dict[str, dict[str, Any]] = {nid: {"dial": {}} for nid in self.nodes}
        for link in self.links.values():
            settings[link.dialer.id]["dial"][link.acceptor.id] = link.listen
        return settings

    # ------------------------------------------------------------ lifecycle

    def start(self) -> ProxyNet:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="chaos-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(STEER_TIMEOUT):
            raise TimeoutError("proxy loop did not start")

        async def start_all() -> None:
            for link in self.links.values():
                await link.start()

        self._call(start_all())
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def stop_all() -> None:
            for link in self.links.values():
                await link.stop()

        with contextlib.suppress(Exception):
            self._call(stop_all())
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=STEER_TIMEOUT)
        self._loop = None

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("proxy net is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(STEER_TIMEOUT)

    def _apply(self, change: Callable[[], T]) -> T:
        async def run() -> T:
            return change()

        return self._call(run())

    # ------------------------------------------------------------- steering

    def link(self, a: str, b: str) -> Link:
        return self.links[frozenset((a, b))]

    def set_flow(self, src: str, dst: str, mode: str, delay: float = 0.0) -> None:
        """Set the mode of bytes from node ``src`` to node ``dst``."""
        self._apply(lambda: self.link(src, dst).flow(src, dst).set(mode, delay))

    def set_flows(self, flows: Iterable[tuple[str, str, str, float]]) -> None:
        """Apply several ``(src, dst, mode, delay)`` changes at once (one loop turn)."""
        items = list(flows)

        def change() -> None:
            for src, dst, mode, delay in items:
                self.link(src, dst).flow(src, dst).set(mode, delay)

        self._apply(change)

    def block(self, pairs: Iterable[tuple[str, str]], mode: str = DROP) -> None:
        """Stop bytes from each ``src`` to each ``dst`` (one-way per pair)."""
        self.set_flows((s, d, mode, 0.0) for s, d in pairs)

    def partition(self, groups: Sequence[Iterable[str]], mode: str = DROP) -> None:
        """Cut every pair of nodes in different groups, both ways. Nodes not named in
        any group keep all their links (a bridge)."""
        sets = [set(g) for g in groups]
        cut = [(a, b) for i, ga in enumerate(sets) for gb in sets[i + 1 :] for a in ga for b in gb]
        self.block([*cut, *((b, a) for a, b in cut)], mode)

    def delay_all(self, delay: float, nodes: Iterable[str] | None = None) -> None:
        """Delay both directions of every link touching ``nodes`` (default: all)."""
        chosen = set(nodes) if nodes is not None else set(self.nodes)
        flows = []
        for link in self.links.values():
            a, b = link.dialer.id, link.acceptor.id
            if a in chosen or b in chosen:
                flows += [(a, b, PASS, delay), (b, a, PASS, delay)]
        self.set_flows(flows)

    def refuse(self, node: str | None, on: bool = True) -> None:
        """Refuse (accept then reset) new connections on the links of ``node`` (or all)."""

        def change() -> None:
            for link in self._links_of(node):
                link.refuse = on

        self._apply(change)

    def reset(self, node: str | None = None) -> int:
        """Reset every connection on the links of ``node`` (or all); returns how many."""
        return self._apply(lambda: sum(link.reset() for link in self._links_of(node)))

    def heal(self) -> int:
        """Everything back to pass: no delay, no refusal; connections that lost bytes
        are reset so PySyncObj reconnects with a clean stream. Returns resets."""

        def change() -> int:
            resets = 0
            for link in self.links.values():
                link.forward.set(PASS, 0.0)
                link.backward.set(PASS, 0.0)
                link.refuse = False
                resets += link.reset(only_tainted=True)
            return resets

        return self._apply(change)

    def describe(self) -> list[dict[str, Any]]:
        return self._apply(lambda: [link.describe() for link in self.links.values()])

    def _links_of(self, node: str | None) -> list[Link]:
        return [
            link
            for link in self.links.values()
            if node is None or node in (link.dialer.id, link.acceptor.id)
        ]
