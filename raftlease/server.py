"""The asyncio TCP front of one node.

Threads: the event loop runs in the main thread; PySyncObj's tick thread applies
entries and fires proposal callbacks, which hop back to the loop with
``call_soon_threadsafe``. Many requests may be in flight on one connection (each frame
is handled in its own task; responses carry the request id), and many proposals are
in flight in Raft at once: nothing waits synchronously on the log.

Only the leader proposes. It stamps each entry with log time (``LogClock``) and its
term, draws the lease id for a grant, and for reads proposes a read entry (a read
through the log is linearizable). A follower answers ``NOT_LEADER`` with the leader's
client address, so the client redirects.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import secrets
import signal
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack

from . import __version__
from .clock import AdjustableClock, Clock, SystemClock
from .config import NodeConfig, parse_addr
from .core import Result
from .errors import (
    BadRequestError,
    CompactedError,
    FrameTooLargeError,
    InternalError,
    NotLeaderError,
    RaftLeaseError,
    TimeoutError_,
    UnavailableError,
    error_class,
)
from .protocol import (
    FrameDecoder,
    Limits,
    ProtocolError,
    Request,
    encode_frame,
    error_response,
    ok_response,
    parse_request,
    request_id,
)
from .replication import Replica

log = logging.getLogger("raftlease.server")

#: The leader proposes a tick at least this often (seconds) to keep log time fresh.
LOG_TIME_REFRESH = 1.0

#: Changes each node keeps for watches to resume from.
WATCH_HISTORY = 100_000

#: Most requests replicated together in one batch log entry.
MAX_BATCH_ENTRIES = 64
#: Most bytes of strings in one batch entry. PySyncObj sends a log entry of 64 KiB or
#: more (``appendEntriesBatchSizeBytes``) through its ``transmission`` path, which our
#: follower-side correction of ``append_entries`` does not cover (docs/pysyncobj.md
#: trap 5); batches stay well below it. A single request is far smaller (its key,
#: owner and value are capped at a few KiB).
MAX_BATCH_BYTES = 32 * 1024

#: Requests in flight on one connection before the server stops reading from it.
MAX_INFLIGHT_PER_CONNECTION = 1024


class LogClock:
    """The leader's source of entry time stamps (integer milliseconds of log time).

    A leader continues log time from the newest log time it has applied plus its own
    monotonic elapsed time since then. It re-anchors whenever applied log time passes
    its projection (entries of an earlier leader applied late), and on every term
    change. So log time never runs ahead of real time on the stamping leader's clock,
    and a leader change never shortens a lease; it may lengthen one by the election
    gap (the safe direction). docs/design.md gives the argument.
    """

    def __init__(self, clock: Clock, rate: float = 1.0) -> None:
        self._clock = clock
        self._rate = rate
        self._term: int | None = None
        self._anchor_log = 0
        self._anchor_mono = 0.0

    def stamp(self, term: int, applied_now: int) -> int:
        mono = self._clock.monotonic()
        if term != self._term:
            self._term = term
            self._anchor_log, self._anchor_mono = applied_now, mono
        projected = self._anchor_log + int((mono - self._anchor_mono) * 1000 * self._rate)
        if applied_now > projected:
            self._anchor_log, self._anchor_mono = applied_now, mono
            projected = applied_now
        return projected


class NodeServer:
    """Serves clients for one node. ``run()`` blocks until ``stop()`` or a signal."""

    def __init__(self, config: NodeConfig, clock: Clock | None = None) -> None:
        self.config = config
        if clock is None:
            clock = AdjustableClock() if config.test_hooks else SystemClock()
        self.clock: Clock = clock
        # Planted bug for the chaos suite's self-test: log time runs 3x too fast on
        # this node's leader, so leases expire early (a leader trusting a skewed clock).
        rate = 3.0 if config.planted_bug == "fast_log_clock" else 1.0
        self.log_clock = LogClock(self.clock, rate=rate)
        self.limits = Limits(
            max_key_bytes=config.max_key_bytes,
            max_owner_bytes=config.max_owner_bytes,
            min_ttl=config.min_ttl,
            max_ttl=config.max_ttl,
            max_list=config.max_list,
        )
        self.replica: Replica | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._connections = 0
        self._tick_in_flight = False
        # Long-polls for queued acquires: lease id -> futures to wake (event loop only).
        self._awaiting: dict[str, list[asyncio.Future[None]]] = {}
        # Proposals waiting for the end of this event-loop turn (see ``propose``).
        self._pending: list[tuple[dict[str, Any], asyncio.Future[Result]]] = []
        self._flush_scheduled = False
        # Watches: recent changes (public fields only) and the live subscribers.
        self._history: collections.deque[dict[str, Any]] = collections.deque(maxlen=WATCH_HISTORY)
        self._watchers: dict[object, tuple[asyncio.Queue[list[dict[str, Any]] | None], str]] = {}
        self.requests_total = 0

    # ----------------------------------------------------------- lifecycle

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        host, port = parse_addr(self.config.self_node.client, "client address")
        # Bind the client port first: if it is taken, fail before joining Raft.
        server = await asyncio.start_server(
            self._serve_connection, host, port, reuse_address=True, limit=1 << 16
        )
        self.replica = Replica(self.config, observer=self._on_applied, clock=self.clock)
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                self._loop.add_signal_handler(sig, self.stop)
        log.info(
            "node %s serving clients on %s, raft on %s, data in %s",
            self.config.node_id,
            self.config.self_node.client,
            self.config.self_node.raft,
            self.config.data_dir,
        )
        expiry = asyncio.create_task(self._expiry_loop())
        try:
            await self._stopping.wait()
        finally:
            expiry.cancel()
            server.close()
            await server.wait_closed()
            replica = self.replica
            await self._loop.run_in_executor(None, replica.close)
            log.info("node %s stopped", self.config.node_id)

    def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    # --------------------------------------------------------- connections

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self._connections >= self.config.max_connections:
            writer.close()
            return
        self._connections += 1
        decoder = FrameDecoder(self.config.max_frame)
        slots = asyncio.Semaphore(MAX_INFLIGHT_PER_CONNECTION)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                frames: list[dict[str, Any]] = []
                broken: RaftLeaseError | None = None
                try:
                    frames.extend(decoder.feed(data))
                except (FrameTooLargeError, ProtocolError) as exc:
                    broken = exc  # the frames before the broken one are still answered
                for message in frames:
                    await slots.acquire()
                    task = asyncio.create_task(self._answer(message, writer, slots))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if broken is not None:
                    # The stream cannot be resynchronised: finish what came before,
                    # answer once with id None, then close.
                    await asyncio.gather(*tasks, return_exceptions=True)
                    writer.write(encode_frame(error_response(None, broken)))
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._connections -= 1
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()

    async def _answer(
        self, message: dict[str, Any], writer: asyncio.StreamWriter, slots: asyncio.Semaphore
    ) -> None:
        try:
            rid = request_id(message)
            try:
                request = parse_request(message, self.limits)
                if request.op == "watch":
                    await self._stream_watch(request, writer)
                    return
                response = ok_response(request.id, await self.handle(request))
            except RaftLeaseError as exc:
                response = error_response(rid, exc)
            except Exception:  # never let a bug take the node down
                log.exception("request handler failed")
                response = error_response(rid, InternalError("request handler failed"))
            if not writer.is_closing():
                writer.write(encode_frame(response))
                await writer.drain()
        except (ConnectionError, RuntimeError):
            pass
        finally:
            slots.release()

    # ------------------------------------------------------------ requests

    async def handle(self, request: Request) -> dict[str, Any]:
        """Execute one validated request; raises a ``RaftLeaseError`` on failure."""
        self.requests_total += 1
        if request.op == "ping":
            return {"node": self.config.node_id, "version": __version__}
        if request.op == "status":
            return self.status()
        if request.op == "test_clock":
            return self._test_clock(request.args)
        if request.op == "await_lease":
            return await self._await_lease(request)
        consistency = request.args.get("consistency")
        if consistency == "stale":
            return self._local_read(request, "stale")
        if consistency == "linearizable" and self._lease_read_allowed():
            return self._local_read(request, "lease")
        self._require_leader()
        entry: dict[str, Any] = {k: v for k, v in request.args.items() if k != "consistency"}
        entry["op"] = request.op
        if request.cid is not None:
            entry["cid"] = request.cid
            entry["seq"] = request.seq
            entry["ack"] = request.ack
        # Randomness is drawn here, never inside the state machine.
        if request.op == "acquire":
            entry["lid"] = secrets.token_hex(16)
        elif request.op == "transfer":
            entry["new_lid"] = secrets.token_hex(16)
        elif request.op == "session_open":
            entry["sid"] = secrets.token_hex(16)
        result = await self.propose(entry)
        if not result.get("ok"):
            code = str(result.get("code", "INTERNAL"))
            raise error_class(code)(str(result.get("message", code)), result.get("detail"))
        # The result object may be the one cached in the state machine's session
        # table (on the leader the callback gets it by reference): never mutate it.
        out = {k: v for k, v in result.items() if k != "ok"}
        if consistency is not None:
            out["consistency"] = "log"
            out["served_by"] = self.config.node_id
        return out

    def _require_leader(self) -> None:
        replica = self._replica()
        if replica.is_leader():
            return
        leader = replica.leader_raft_addr()
        client_addr = self.config.client_addr_for_raft(leader) if leader else None
        if client_addr is None:
            raise UnavailableError("no leader is known to this node; election in progress?")
        raise NotLeaderError(
            f"not the leader; the leader is {client_addr}", {"leader": client_addr}
        )

    async def _await_lease(self, request: Request) -> dict[str, Any]:
        """Long-poll for a queued acquire: answer when it is granted (``held``), gone
        (deadline passed or cancelled), or after ``timeout`` (``waiting``). Answered
        by the leader, from memory under its leader lease or through the log, so a
        ``held`` answer's remaining time is safe for the client to count from its
        request's send time."""
        key, lid, timeout = request.args["key"], request.args["lid"], request.args["timeout"]
        loop = self._loop
        assert loop is not None
        deadline = loop.time() + timeout
        while True:
            self._require_leader()
            if self._lease_read_allowed():
                replica = self._replica()
                now = self.log_clock.stamp(replica.term(), replica.store.now)
                status = replica.store.lease_status(key, lid, now)
                status["now"] = now
            else:
                result = await self.propose({"op": "lease_status", "key": key, "lid": lid})
                status = {k: v for k, v in result.items() if k != "ok"}
            remaining = deadline - loop.time()
            if status["state"] != "waiting" or remaining <= 0:
                return status
            wake = loop.create_future()
            self._awaiting.setdefault(lid, []).append(wake)
            try:
                await asyncio.wait_for(wake, remaining)
            except TimeoutError:
                pass
            finally:
                waiters = self._awaiting.get(lid, [])
                if wake in waiters:
                    waiters.remove(wake)
                if not waiters:
                    self._awaiting.pop(lid, None)

    def _on_applied(self, entry: dict[str, Any], result: Result) -> None:
        """Tick thread, after each applied entry: record its changes in the watch
        history, and hop to the event loop only when someone listens (a watch, or a
        long-poll whose queued acquire was granted or left the queue)."""
        replica = self.replica
        loop = self._loop
        if replica is None or loop is None:
            return
        events = replica.store.events
        if not events:
            return
        public = [
            {k: e[k] for k in ("type", "key", "owner", "token", "revision", "value", "units")}
            for e in events
            if "revision" in e
        ]
        gap = False
        if public:
            history = self._history
            # Revisions are contiguous (every change adds one): a gap means this node
            # skipped history (it installed a snapshot). The history restarts there.
            if history and public[0]["revision"] != history[-1]["revision"] + 1:
                history.clear()
                gap = True
            history.extend(public)  # deque appends are atomic; readers copy first
        with contextlib.suppress(RuntimeError):  # loop closed during shutdown
            if public and self._watchers:
                loop.call_soon_threadsafe(self._publish, public, gap)
            if self._awaiting:
                for event in events:
                    lid = event.get("lease_id")
                    if lid in self._awaiting and event["type"] in ("grant", "dequeue"):
                        loop.call_soon_threadsafe(self._wake, lid)

    # --------------------------------------------------------------- watches

    def _publish(self, events: list[dict[str, Any]], gap: bool) -> None:
        """Event loop: feed live watches; after a history gap they end with
        ``COMPACTED`` rather than silently miss events."""
        for queue, prefix in self._watchers.values():
            if gap:
                queue.put_nowait(None)
                continue
            matching = [e for e in events if e["key"].startswith(prefix)]
            if matching:
                queue.put_nowait(matching)

    async def _stream_watch(self, request: Request, writer: asyncio.StreamWriter) -> None:
        """Stream changes under a prefix, from ``from_revision`` (0: from now), as
        frames that all carry the request's id, until the connection closes. Any node
        serves watches: every replica applies the same log, so it produces the same
        events with the same revisions, in the same order."""
        prefix: str = request.args["prefix"]
        start: int = request.args["from_revision"]
        # Subscribe before copying the history: an event the tick thread records in
        # between then reaches us twice (copy and queue) instead of never; revisions
        # already sent are skipped below.
        queue: asyncio.Queue[list[dict[str, Any]] | None] = asyncio.Queue()
        token = object()
        self._watchers[token] = (queue, prefix)
        try:
            history = list(self._history)  # a copy: the tick thread appends to it
            current = max(self._replica().store.revision, history[-1]["revision"] if history else 0)
            oldest = history[0]["revision"] if history else current + 1
            if start == 0:
                start = current + 1
            if start < oldest and start <= current:
                err = CompactedError(
                    f"revision {start} is not in this node's watch history (it starts at "
                    f"{oldest}); re-read and watch from {current + 1}",
                    {"revision": current},
                )
                writer.write(encode_frame(error_response(request.id, err)))
                await writer.drain()
                return
            backlog = [e for e in history if e["revision"] >= start and e["key"].startswith(prefix)]
            writer.write(
                encode_frame(ok_response(request.id, {"events": backlog, "revision": current}))
            )
            await writer.drain()
            next_rev = max(start, history[-1]["revision"] + 1 if history else start)
            while not writer.is_closing():
                events = await queue.get()
                if events is None:
                    err = CompactedError("this node skipped history; resume elsewhere", {})
                    writer.write(encode_frame(error_response(request.id, err)))
                    await writer.drain()
                    return
                fresh = [e for e in events if e["revision"] >= next_rev]
                if fresh:
                    next_rev = fresh[-1]["revision"] + 1
                    writer.write(encode_frame(ok_response(request.id, {"events": fresh})))
                    await writer.drain()
        finally:
            self._watchers.pop(token, None)

    def _wake(self, lid: str) -> None:
        for wake in self._awaiting.get(lid, []):
            if not wake.done():
                wake.set_result(None)

    def _lease_read_allowed(self) -> bool:
        """A leader may answer from local state only while its leader lease is valid
        (which includes: no clock-drift alarm) and once it has applied an entry of its
        own term, so its state includes every write acknowledged by earlier leaders."""
        replica = self.replica
        if replica is None or not replica.lease_valid():
            return False
        return replica.store.term == replica.term()

    def _local_read(self, request: Request, mode: str) -> dict[str, Any]:
        """Answer a read from this node's state. ``lease``: the leader, at the log
        time it would stamp now (so a lease past its expiry reads as gone exactly as a
        read through the log would). ``stale``: any node, at its last applied log
        time, labelled with its applied index and how long since it heard from a
        leader."""
        replica = self._replica()
        store = replica.store
        if mode == "lease":
            now = self.log_clock.stamp(replica.term(), store.now)
            age: float | None = 0.0
        else:
            now = store.now
            age = replica.guard.staleness(replica.is_leader())
        out: dict[str, Any] = {
            "now": now,
            "consistency": mode,
            "served_by": self.config.node_id,
            "applied_index": replica.last_applied(),
            "age": age,
        }
        if request.op == "holder":
            out["revision"] = store.revision  # read first: the holder is at least as new
            out["holder"] = store.holder(request.args["key"], now)
        elif request.op == "fence":
            out.update(store.fence(request.args["key"], request.args["token"], now))
        else:
            out["leases"] = store.list_leases(request.args["prefix"], request.args["limit"], now)
        return out

    async def propose(self, entry: dict[str, Any]) -> Result:
        """Replicate ``entry`` and return its result.

        Entries proposed in the same turn of the event loop are stamped together and
        replicated as one ``batch`` log entry (up to ``MAX_BATCH_ENTRIES``): PySyncObj's
        cost is per log entry (a pickled, compressed message to every follower, twice),
        so under concurrent load batching multiplies throughput; a lone request is
        proposed as itself, with no added wait.
        """
        loop = self._loop
        assert loop is not None
        future: asyncio.Future[Result] = loop.create_future()
        self._pending.append((entry, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        try:
            return await asyncio.wait_for(future, self.config.request_timeout)
        except TimeoutError:
            raise TimeoutError_(
                f"no commit within {self.config.request_timeout} s; the outcome is unknown"
            ) from None

    def _flush(self) -> None:
        """Event loop: propose what accumulated, stamped with log time and term."""
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        replica = self.replica
        loop = self._loop
        if replica is None or loop is None:
            for _, future in pending:
                if not future.done():
                    future.set_exception(UnavailableError("node is stopping"))
            return
        term = replica.term()
        now = self.log_clock.stamp(term, replica.store.now)
        for chunk in split_batches(pending, lambda item: _text_bytes(item[0])):
            if len(chunk) == 1:
                body: dict[str, Any] = {**chunk[0][0], "term": term, "now": now}
            else:
                body = {
                    "op": "batch",
                    "term": term,
                    "now": now,
                    "entries": [entry for entry, _ in chunk],
                }
            futures = [future for _, future in chunk]

            def on_done(
                result: Result | None,
                err: RaftLeaseError | None,
                futures: list[asyncio.Future[Result]] = futures,
            ) -> None:
                # Tick thread: hop to the event loop.
                with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                    loop.call_soon_threadsafe(_settle, futures, result, err)

            replica.propose(msgpack.packb(body, use_bin_type=True), on_done)

    def status(self) -> dict[str, Any]:
        replica = self._replica()
        leader = replica.leader_raft_addr()
        store = replica.store
        return {
            "node": self.config.node_id,
            "client": self.config.self_node.client,
            "raft": self.config.self_node.raft,
            "role": replica.role(),
            "term": replica.term(),
            "commit_index": replica.commit_index(),
            "applied_index": replica.last_applied(),
            "leader": self.config.client_addr_for_raft(leader) if leader else None,
            "ready": replica.is_ready(),
            "log_time": store.now,
            "revision": store.revision,
            "leases": len(store.leases),
            "sessions": len(store.sessions),
            "lease_sessions": len(store.lease_sessions),
            "version": __version__,
            "connected_peers": replica.connected_peers(),
            "lease_reads": self._lease_read_allowed(),
            "clock_rate": getattr(self.clock, "rate", 1.0),
            **replica.guard.snapshot(),
        }

    def _test_clock(self, args: dict[str, Any]) -> dict[str, Any]:
        """Test-only control channel: change this node's clock rate or jump it."""
        clock = self.clock
        if not self.config.test_hooks or not isinstance(clock, AdjustableClock):
            raise BadRequestError("test_clock is disabled (node not started with test_hooks)")
        if "rate" in args:
            clock.set_rate(args["rate"])
        if "jump" in args:
            clock.jump(args["jump"])
        log.warning("test clock changed: %s (rate now %s)", args, clock.rate)
        return {"rate": clock.rate, "monotonic": clock.monotonic()}

    def _replica(self) -> Replica:
        if self.replica is None:
            raise UnavailableError("node is starting")
        return self.replica

    # -------------------------------------------------------------- expiry

    async def _expiry_loop(self) -> None:
        """The leader's housekeeping entries (``tick``), proposed one at a time:

        * at once after an election: an entry of its own term, the barrier before it
          may serve lease reads;
        * when a lease is due, so expired leases are removed (and waiters woken, and
          memory freed) even when no request touches them; every command also expires
          what is due, so this is for timeliness, not correctness;
        * at least every ``LOG_TIME_REFRESH`` seconds, so log time in the state never
          lags real time by more than that. A new leader continues log time from the
          last applied stamp: without these ticks an idle period before a failover
          would lengthen every lease by its whole length.
        """
        interval = self.config.heartbeat_interval
        last_tick = -1.0
        while True:
            await asyncio.sleep(interval)
            replica = self.replica
            if replica is None or self._tick_in_flight or not replica.is_leader():
                continue
            try:
                due = replica.store.next_deadline()
            except IndexError:  # raced with the tick thread popping the heap
                continue
            term = replica.term()
            now_mono = self.clock.monotonic()
            needed = (
                replica.store.term < term
                or now_mono - last_tick >= LOG_TIME_REFRESH
                or (due is not None and due <= self.log_clock.stamp(term, replica.store.now))
            )
            if not needed:
                continue
            self._tick_in_flight = True
            last_tick = now_mono
            try:
                await self.propose({"op": "tick"})
            except RaftLeaseError as exc:
                log.debug("tick not applied: %s", exc)
            finally:
                self._tick_in_flight = False


def _text_bytes(entry: dict[str, Any]) -> int:
    """A cheap upper bound of an entry's packed size: its strings (4 bytes a character
    unless ASCII, a constant-time check) plus 16 bytes per field (msgpack's field
    names here are short, its numbers at most 9 bytes)."""
    text = sum(len(v) if v.isascii() else 4 * len(v) for v in entry.values() if isinstance(v, str))
    return text + 16 * len(entry)


T = TypeVar("T")


def split_batches(
    items: list[T],
    size: Callable[[T], int],
    max_entries: int = MAX_BATCH_ENTRIES,
    max_bytes: int = MAX_BATCH_BYTES,
) -> list[list[T]]:
    """Consecutive chunks of ``items``, in order, each of at most ``max_entries`` items
    and ``max_bytes`` (by ``size``); an item larger than ``max_bytes`` goes alone."""
    chunks: list[list[T]] = []
    current: list[T] = []
    used = 0
    for item in items:
        n = size(item)
        if current and (len(current) >= max_entries or used + n > max_bytes):
            chunks.append(current)
            current, used = [], 0
        current.append(item)
        used += n
    if current:
        chunks.append(current)
    return chunks


def _settle(
    futures: list[asyncio.Future[Result]], result: Result | None, err: RaftLeaseError | None
) -> None:
    """Event loop: hand a (batch) entry's outcome to the requests it carried."""
    if err is None and result is not None and len(futures) > 1:
        results = result.get("results")
        if result.get("ok") and isinstance(results, list) and len(results) == len(futures):
            for future, one in zip(futures, results, strict=True):
                if not future.done():
                    future.set_result(one)
            return
        err = InternalError(f"batch not applied: {result.get('message', result)}")
    for future in futures:
        if future.done():
            continue
        if err is not None:
            future.set_exception(err)
        else:
            assert result is not None
            future.set_result(result)


def run_node(config: NodeConfig, clock: Clock | None = None) -> None:
    """Run one node until SIGINT/SIGTERM (blocking)."""
    asyncio.run(NodeServer(config, clock).run())
