"""Reads a node answers from memory, and its long-polls.

* ``lease_read_allowed``: whether the leader may answer from its own state (its leader
  lease is valid, it has applied an entry of its own term, no keep-alive answered from
  memory lags its log);
* ``local_read``: ``holder``, ``fence``, ``waiters``, ``sessions``, ``leases`` from this
  node's state, ``lease`` (the leader) or ``stale`` (any node) consistency;
* the long-polls (``await_lease`` for a queued acquire, ``await_claim`` for a waiting
  task claim, ``await_task`` for a producer's result; docs/queues.md; ``await_spend``
  for a queued spend, docs/budgets.md), ONE mechanism for all four (``long_poll``):
  read the state (from memory under the leader lease, else
  through the log), answer if it is final or the time is up, else park until the tick
  thread's wake-up for that lease id, attempt id or task id, and read again;
* ``PollSlots``: the long-poll quota.

Threads: everything runs on the event loop except ``wake``, which runs on PySyncObj's
tick thread after each applied entry and hops to the loop with
``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from ..config import NodeConfig
from ..core import LeaseStore, Result
from ..errors import UnavailableError, error_class
from ..protocol import Request
from ..replication import Replica
from .keepalive import LAG_SLACK_MS, MemoryKeepalives
from .log_clock import LogClock
from .slots import Slots

#: Task statuses after which a producer's ``await_task`` answers at once.
FINAL = ("completed", "dead")

#: The long-polls: each holds a slot of ``PollSlots`` while it waits on this node.
#: How many times a local read is tried while entries are being applied under it
#: (``Reads.local_read``): each try is a few dict reads, an entry's apply about as short.
LOCAL_READ_TRIES = 8

LONG_POLL_OPS = frozenset({"await_lease", "await_claim", "await_task", "await_spend"})


class PollSlots(Slots):
    """The long-poll quota of one node (``max_long_polls_per_principal`` and
    ``max_long_polls_per_node``; node-local, like watches: long-polls are not
    replicated). A closed connection cancels its polls, which frees their slots.
    Event loop only; never blocks."""

    def __init__(self, per_principal: int, per_node: int) -> None:
        super().__init__("long-polls", "max_long_polls", per_principal, per_node)


async def park(
    awaiting: dict[str, list[asyncio.Future[None]]],
    ident: str,
    timeout: float,
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Event loop: wait up to ``timeout`` seconds until a state change concerning
    ``ident`` resolves the future parked under it in ``awaiting`` (the tick thread's
    wake-ups), then unpark. Returns on the wake-up or the timeout alike: the long-poll
    re-reads the state either way. Cancellation unparks too."""
    wake: asyncio.Future[None] = loop.create_future()
    awaiting.setdefault(ident, []).append(wake)
    try:
        await asyncio.wait_for(wake, timeout)
    except TimeoutError:
        pass
    finally:
        waiters = awaiting.get(ident, [])
        if wake in waiters:
            waiters.remove(wake)
        if not waiters:
            awaiting.pop(ident, None)


class Reads:
    """The node's reads from memory and its long-polls (see the module docstring).

    Owned by ``NodeServer``, which hands it what it reads: ``replica`` (None while the
    node starts), ``keepalives`` (the proposer's keep-alives answered from memory, None
    before it exists), ``require_leader`` and ``require_replica`` (raise
    ``NotLeaderError`` / ``UnavailableError``), ``propose`` (replicate an entry, its
    result). A test build replaces the class (``ServerHooks.reads_class``) to plant a
    bug; production code has no switch for it."""

    def __init__(
        self,
        config: NodeConfig,
        log_clock: LogClock,
        *,
        replica: Callable[[], Replica | None],
        keepalives: Callable[[], MemoryKeepalives | None],
        require_leader: Callable[[], None],
        require_replica: Callable[[], Replica],
        propose: Callable[[dict[str, Any]], Awaitable[Result]],
    ) -> None:
        self.config = config
        self.log_clock = log_clock
        self._replica = replica
        self._keepalives = keepalives
        self._require_leader = require_leader
        self._require_replica = require_replica
        self._propose = propose
        #: The long-polls parked now: lease, attempt or task id -> futures to wake
        #: (event loop only; the tick thread only reads it).
        self.awaiting: dict[str, list[asyncio.Future[None]]] = {}

    # ------------------------------------------------------------- reads

    def lease_read_allowed(self) -> bool:
        """A leader may answer from local state only while its leader lease is valid
        (which includes: no clock-drift alarm) and once it has applied an entry of its
        own term, so its state includes every write acknowledged by earlier leaders."""
        replica = self._replica()
        if replica is None or not replica.lease_valid():
            return False
        return self.barrier_passed(replica)

    def barrier_passed(self, replica: Replica) -> bool:
        """The read barrier: this leader has applied an entry of its own term, and no
        keep-alive answered from memory lags the log (below). Event loop only."""
        term = replica.term()
        if replica.store.term != term:
            return False
        keep = self._keepalives()
        if keep is not None and keep.term == term:
            # A keep-alive answered from memory, not yet written or written in an entry
            # not yet applied, whose logged expiry is reached: local state could read
            # its lease as gone. Through the log, whose flush writes it first
            # (server/keepalive.py). ``LAG_SLACK_MS`` covers the later stamp the read
            # itself takes.
            stamp = self.log_clock.stamp(term, replica.store.now)
            return not keep.lagging(stamp + LAG_SLACK_MS)
        return True

    def local_read(self, request: Request, mode: str) -> dict[str, Any] | None:
        """Answer a read from this node's state. ``lease``: the leader, at the log
        time it would stamp now (so a lease past its expiry reads as gone exactly as a
        read through the log would). ``stale``: any node, at its last applied log
        time, labelled with its applied index and how long since it heard from a
        leader.

        The apply thread may be applying an entry meanwhile; a read that overlapped
        one (``store.apply_seq`` odd or changed) could show part of it (some keys of
        an ``acquire_many`` and not the others), so it is read again, up to
        ``LOCAL_READ_TRIES`` times. Then None for ``lease`` (the caller reads through
        the log instead); ``UnavailableError`` (definite, retried by the clients) for
        ``stale``. Event loop; never blocks."""
        replica = self._require_replica()
        store = replica.store
        for _ in range(LOCAL_READ_TRIES):
            before = store.apply_seq
            if before % 2:
                continue
            out = self._local_read_once(request, mode, replica)
            if store.apply_seq == before:
                return out
        if mode == "lease":
            return None
        raise UnavailableError("the state changed under every try of this read; retry it")

    def _local_read_once(self, request: Request, mode: str, replica: Replica) -> dict[str, Any]:
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
        elif request.op == "waiters":
            out.update(store.list_waiters(request.args["key"], request.args["limit"], now))
        elif request.op == "sessions":
            out["sessions"] = store.list_sessions(request.args["limit"], now)
        else:
            out["leases"] = store.list_leases(request.args["prefix"], request.args["limit"], now)
        return out

    # -------------------------------------------------------- long-polls

    async def await_lease(self, request: Request) -> dict[str, Any]:
        """Long-poll for a queued acquire: answer when it is granted (``held``), gone
        (deadline passed or cancelled), or after ``timeout`` (``waiting``). Answered
        by the leader, from memory under its leader lease or through the log, so a
        ``held`` answer's remaining time is safe for the client to count from its
        request's send time."""
        key, lid = request.args["key"], request.args["lid"]

        def lease(store: LeaseStore, now: int) -> Result:
            return {"ok": True, **store.lease_status(key, lid, now), "now": now}

        return await self.long_poll(
            lid,
            request.args["timeout"],
            lease,
            {"op": "lease_status", "key": key, "lid": lid},
            lambda status: status["state"] != "waiting",
        )

    async def await_task(self, request: Request) -> dict[str, Any]:
        """``await_claim``: until the waiting claim is granted (``claimed``, with the
        task), gone, or ``timeout`` passes (``waiting``). ``await_task``: until the
        task is completed or dead, or ``timeout`` passes (then its current state).
        Answered by the leader, from memory under its leader lease or through the log,
        so a ``claimed`` answer's remaining time is safe to count from the poll's send
        time. Raises ``TaskNotFoundError`` for an unknown task, ``NotLeaderError``."""
        args = request.args
        queue: str = args["queue"]
        if request.op == "await_claim":
            aid: str = args["aid"]

            def claim(store: LeaseStore, now: int) -> Result:
                return {"ok": True, **store.tasks.claim_status(queue, aid, now), "now": now}

            return await self.long_poll(
                aid,
                args["timeout"],
                claim,
                {"op": "task_claim_status", "queue": queue, "aid": aid},
                lambda status: status.get("state") != "waiting",
            )
        tid: str = args["tid"]

        def task(store: LeaseStore, now: int) -> Result:
            info = store.tasks.task_info(queue, tid, now)
            if info is None:
                return {"ok": False, "code": "TASK_NOT_FOUND", "message": f"no task {tid!r}"}
            return {"ok": True, "task": info, "now": now}

        return await self.long_poll(
            tid,
            args["timeout"],
            task,
            {"op": "task_get", "queue": queue, "tid": tid},
            lambda status: status["task"]["status"] in FINAL,
        )

    async def await_spend(self, request: Request) -> dict[str, Any]:
        """``await_spend``: until the queued spend or reserve is granted
        (``granted``, with a reservation's id and expiry), gone (``reason``), or
        ``timeout`` passes (``waiting``). Answered by the leader, from memory under
        its leader lease or through the log. Raises ``NotLeaderError``."""
        key, rid = request.args["key"], request.args["rid"]

        def spend(store: LeaseStore, now: int) -> Result:
            return {"ok": True, **store.budgets.spend_status(key, rid, now), "now": now}

        return await self.long_poll(
            rid,
            request.args["timeout"],
            spend,
            {"op": "budget_spend_status", "key": key, "rid": rid},
            lambda status: status.get("state") != "waiting",
        )

    async def long_poll(
        self,
        ident: str,
        timeout: float,
        local: Callable[[LeaseStore, int], Result],
        entry: dict[str, Any],
        done: Callable[[dict[str, Any]], bool],
    ) -> dict[str, Any]:
        """The one long-poll: on the leader, read the state (``local`` from memory at
        the log time it would stamp now, under its leader lease; else ``entry``
        through the log), and answer it (without ``ok``) once ``done`` says it is
        final or ``timeout`` seconds have passed; meanwhile park under ``ident`` until
        the tick thread wakes it (``wake``) or the time is up, then read again.
        Raises ``NotLeaderError`` (also when leadership moves during the wait) and the
        error a not-ok result names."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self._require_leader()
            if self.lease_read_allowed():
                replica = self._require_replica()
                now = self.log_clock.stamp(replica.term(), replica.store.now)
                result = local(replica.store, now)
            else:
                result = await self._propose(dict(entry))
            if not result.get("ok"):
                code = str(result.get("code", "INTERNAL"))
                raise error_class(code)(str(result.get("message", code)), result.get("detail"))
            status = {k: v for k, v in result.items() if k != "ok"}
            remaining = deadline - loop.time()
            if done(status) or remaining <= 0:
                return status
            await park(self.awaiting, ident, remaining, loop)

    def wake(self, events: list[dict[str, Any]], loop: asyncio.AbstractEventLoop) -> None:
        """Tick thread, after an applied entry's ``events``: wake the long-polls they
        concern (a queued acquire granted or dequeued: its lease id; a queued spend
        granted or ended: its spend id, in the event's ``lease_id``; a task claim
        granted or gone: its attempt id, in the event's ``lease_id``; any change of a
        task: its task id)."""
        if not self.awaiting:
            return
        for event in events:
            kind = str(event.get("type", ""))
            if kind in ("grant", "dequeue", "budget_grant", "budget_dequeue"):
                idents: tuple[Any, ...] = (event.get("lease_id"),)
            elif kind.startswith("task_"):
                idents = (event.get("lease_id"), event.get("tid"))
            else:
                continue
            for ident in idents:
                if ident and ident in self.awaiting:
                    with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                        loop.call_soon_threadsafe(self._wake, ident)

    def _wake(self, ident: str) -> None:
        for wake in self.awaiting.get(ident, []):
            if not wake.done():
                wake.set_result(None)
