"""The node's side of the leased task queues (docs/queues.md): the ids and quota the
leader stamps into task entries, and the two long-polls (``await_claim`` for a waiting
claim, ``await_task`` for a producer's result).

A mixin of ``node.NodeServer``. Threads: everything runs on the event loop except
``wake_tasks``, which runs on PySyncObj's tick thread after each applied entry and
hops to the loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable
from typing import Any

from ..config import NodeConfig
from ..core import LeaseStore, Result
from ..errors import error_class
from ..protocol import Request
from ..replication import Replica
from .log_clock import LogClock
from .slots import Slots

#: Task statuses after which a producer's ``await_task`` answers at once.
FINAL = ("completed", "dead")

#: The long-polls: each holds a slot of ``PollSlots`` while it waits on this node.
LONG_POLL_OPS = frozenset({"await_lease", "await_claim", "await_task"})


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


class TaskWaits:
    """What ``NodeServer`` adds for task queues; it provides the attributes and
    methods declared here."""

    _awaiting: dict[str, list[asyncio.Future[None]]]
    _loop: asyncio.AbstractEventLoop | None
    log_clock: LogClock
    config: NodeConfig

    def require_leader(self) -> None:
        raise NotImplementedError

    def _lease_read_allowed(self) -> bool:
        raise NotImplementedError

    def require_replica(self) -> Replica:
        raise NotImplementedError

    async def propose(self, entry: dict[str, Any]) -> Result:
        raise NotImplementedError

    def draw_task_ids(self, op: str, entry: dict[str, Any]) -> None:
        """Randomness is drawn here, never in the state machine: a put's task id, a
        claim's attempt id (a capability: only the claimer receives it). A put also
        carries the queue's task quota (``max_queue_tasks``), a completion the count
        bound on retained completed tasks (``max_completed_tasks``), both decided by
        the state machine."""
        if op == "task_put":
            entry["tid"] = secrets.token_hex(12)
            entry["quota"] = min(self.config.max_queue_tasks, 2**31)
        elif op == "task_claim":
            entry["aid"] = secrets.token_hex(16)
        elif op == "task_complete":
            entry["max_completed"] = min(self.config.max_completed_tasks, 2**31)

    async def await_task_op(self, request: Request) -> dict[str, Any]:
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

            return await self._long_poll(
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

        return await self._long_poll(
            tid,
            args["timeout"],
            task,
            {"op": "task_get", "queue": queue, "tid": tid},
            lambda status: status["task"]["status"] in FINAL,
        )

    async def _long_poll(
        self,
        ident: str,
        timeout: float,
        local: Callable[[LeaseStore, int], Result],
        entry: dict[str, Any],
        done: Callable[[dict[str, Any]], bool],
    ) -> dict[str, Any]:
        loop = self._loop
        assert loop is not None
        deadline = loop.time() + timeout
        while True:
            self.require_leader()
            if self._lease_read_allowed():
                replica = self.require_replica()
                now = self.log_clock.stamp(replica.term(), replica.store.now)
                result = local(replica.store, now)
            else:
                result = await self.propose(dict(entry))
            if not result.get("ok"):
                code = str(result.get("code", "INTERNAL"))
                raise error_class(code)(str(result.get("message", code)), result.get("detail"))
            status = {k: v for k, v in result.items() if k != "ok"}
            remaining = deadline - loop.time()
            if done(status) or remaining <= 0:
                return status
            await park(self._awaiting, ident, remaining, loop)

    def wake_tasks(self, events: list[dict[str, Any]], loop: asyncio.AbstractEventLoop) -> None:
        """Tick thread: wake the long-polls a task change concerns (a claim granted
        or gone: its attempt id; any change of a task: its task id)."""
        for event in events:
            if not str(event.get("type", "")).startswith("task_"):
                continue
            for ident in (event.get("lease_id"), event.get("tid")):
                if ident and ident in self._awaiting:
                    with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                        loop.call_soon_threadsafe(self._wake_ident, ident)

    def _wake_ident(self, ident: str) -> None:
        for wake in self._awaiting.get(ident, []):
            if not wake.done():
                wake.set_result(None)
