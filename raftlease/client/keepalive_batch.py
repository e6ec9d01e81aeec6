"""Keep-alives of many lease sessions on one client, sent together.

A process that runs many agents on one ``AsyncClient`` (one lease session each) sends
each session's keep-alive as a request of its own: measured on a 2-core machine, about
80 µs of the leader's CPU and 95 µs of the agents' process per keep-alive, most of it
per request (framing, parsing, dispatch, an asyncio timer and a ``send``), not per
session (docs/performance.md). The batcher gathers the keep-alives asked for in one
event-loop turn, and those asked for while ``MAX_IN_FLIGHT`` batches are already on the
wire, into one ``session_keepalive_many`` request of at most
``MAX_KEEPALIVE_SESSIONS`` ids. A lone keep-alive on an idle client therefore leaves at
once, as before, and the busier the client, the larger its batches.

The leader answers each session of a batch from its memory exactly as it answers one
``session_keepalive`` (server/dispatch.py ``keepalive_many``); a session it cannot
answer so comes back ``single`` and the batcher sends that session's own
``session_keepalive``, whose answer or error (``SESSION_NOT_FOUND``, ``NOT_OWNER``...)
the log decides. So a caller gets the same answers and errors as with single
keep-alives.

Pauses: a node of an earlier build refuses the unknown operation ``BAD_REQUEST`` (a
member not yet upgraded, in a rolling upgrade), and a cluster with ``keepalives =
"log"`` answers every session of a batch ``single`` (and says so: ``"keepalives":
"log"``), so that each keep-alive would cost two requests. Either pauses the batcher for
``PAUSE`` seconds, with a warning in the log: its keep-alives are sent singly, as
before batching, and then it tries a batch again.

Timeouts: each caller waits at most its own timeout (None: the client's deadline)
and then gets a ``TimeoutError_`` with the outcome unknown, as for a single
keep-alive that timed out; a batch's request may run until its latest caller's
deadline, so a caller with a short timeout never cuts a longer one's short. It holds
one of the ``MAX_IN_FLIGHT`` places on the wire only until its earliest caller's
deadline: a slow cluster must not leave the keep-alives asked for meanwhile waiting
behind batches whose callers have given up (each keep-alive is still sent once).
Cancelling a caller leaves the batch in flight for the others; a batch cancelled
under its callers (the loop ending) gives them ``TimeoutError_``, never a
cancellation they did not ask for.

Threads: the client's event loop only. Nothing blocks.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import BadRequestError, RaftLeaseError, TimeoutError_
from ..limits import MAX_ID_CHARS, MAX_KEEPALIVE_SESSIONS

#: Batches on the wire at once: while they are, new keep-alives wait and join the next.
#: Two, so that one slow batch (a retry on the next node) does not hold up the rest.
MAX_IN_FLIGHT = 2

#: Seconds a batcher sends its keep-alives singly after a node did not know the
#: operation or the cluster keeps sessions alive through the log (module docstring).
PAUSE = 60.0

log = logging.getLogger(__name__)

#: The ids ``session_keepalive_many`` takes (the cluster issues hex ids).
_SESSION_ID = re.compile(f"[0-9a-f]{{1,{MAX_ID_CHARS}}}")

#: ``call(op, args, timeout)``: one request through the client's transport.
Call = Callable[[str, dict[str, Any], float | None], Awaitable[dict[str, Any]]]


class _Waiter:
    """One caller's keep-alive: its session, its timeout's end and its answer."""

    __slots__ = ("deadline", "future", "sid")

    def __init__(self, sid: str, deadline: float, future: asyncio.Future[dict[str, Any]]) -> None:
        self.sid = sid
        self.deadline = deadline
        self.future = future


class _Place:
    """A batch's place on the wire (one of ``MAX_IN_FLIGHT``): held until it lands or
    its earliest caller's deadline passes, whichever comes first."""

    __slots__ = ("held", "timer")

    def __init__(self) -> None:
        self.held = True
        self.timer: asyncio.TimerHandle | None = None


class KeepaliveBatcher:
    """Sends the keep-alives of one client's lease sessions in batches (module
    docstring). ``call`` sends one request (mutating, with the client's retries);
    ``deadline`` is the client's default for a caller without a timeout."""

    def __init__(self, call: Call, deadline: float) -> None:
        self._call = call
        self._deadline = deadline
        self._pending: list[_Waiter] = []
        self._in_flight = 0
        self._scheduled = False
        #: The batches' tasks: the loop keeps only weak references to tasks.
        self._tasks: set[asyncio.Task[None]] = set()
        #: Loop time until which keep-alives are sent singly (``PAUSE``).
        self._paused_until = float("-inf")
        #: Requests sent and keep-alives they carried, and pauses (for tests and
        #: diagnostics).
        self.batches = 0
        self.batched = 0
        self.pauses = 0

    @property
    def enabled(self) -> bool:
        """False while the batcher is paused (module docstring). Event loop."""
        return asyncio.get_running_loop().time() >= self._paused_until

    def _pause(self, why: str) -> None:
        self._paused_until = asyncio.get_running_loop().time() + PAUSE
        self.pauses += 1
        log.warning("keep-alives of lease sessions are sent singly for %g s: %s", PAUSE, why)

    async def keepalive(self, sid: str, timeout: float | None) -> dict[str, Any]:
        """The answer ``session_keepalive`` would give for session ``sid``. Raises
        what a single keep-alive raises (``TimeoutError_`` when no answer came within
        ``timeout``, the log's error for a session it could not answer from memory)."""
        budget = self._deadline if timeout is None else timeout
        if _SESSION_ID.fullmatch(sid) is None:
            # Not an id the cluster issued: in a batch it would be refused, and the
            # batch with it; alone it gets its own answer (SESSION_NOT_FOUND).
            return await self._call("session_keepalive", {"session_id": sid}, budget)
        loop = asyncio.get_running_loop()
        waiter = _Waiter(sid, loop.time() + budget, loop.create_future())
        self._pending.append(waiter)
        if not self._scheduled and self._in_flight < MAX_IN_FLIGHT:
            # At the end of this turn, so that the turn's other keep-alives join it.
            self._scheduled = True
            loop.call_soon(self._flush)
        try:
            # Also while it waits for a batch behind the ones in flight.
            async with asyncio.timeout_at(waiter.deadline):
                answer = await waiter.future
        except TimeoutError:
            raise TimeoutError_(
                f"no answer to the keep-alive of session {sid[:8]} within {budget:g} s; "
                "the outcome is unknown"
            ) from None
        if answer.get("single"):
            left = max(waiter.deadline - loop.time(), 0.001)
            return await self._call("session_keepalive", {"session_id": sid}, left)
        return answer

    def _flush(self) -> None:
        """Event loop: send what is pending, up to ``MAX_IN_FLIGHT`` batches."""
        self._scheduled = False
        while self._pending and self._in_flight < MAX_IN_FLIGHT:
            batch: dict[str, list[_Waiter]] = {}
            rest: list[_Waiter] = []
            for waiter in self._pending:
                if waiter.future.done():
                    continue  # its caller was cancelled
                if waiter.sid in batch:
                    batch[waiter.sid].append(waiter)
                elif len(batch) < MAX_KEEPALIVE_SESSIONS:
                    batch[waiter.sid] = [waiter]
                else:
                    rest.append(waiter)
            self._pending = rest
            if not batch:
                return
            self._in_flight += 1
            loop = asyncio.get_running_loop()
            place = _Place()
            # Its place on the wire ends at its earliest caller's deadline at the latest
            # (module docstring), or when it lands.
            earliest = min(w.deadline for ws in batch.values() for w in ws)
            place.timer = loop.call_at(earliest, self._leave, place)
            task = loop.create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._landed, place))

    def _leave(self, place: _Place) -> None:
        """A batch gives up its place on the wire (once); the next batch may go."""
        if place.held:
            place.held = False
            self._in_flight -= 1
            if self._pending and not self._scheduled:
                self._flush()

    def _landed(self, place: _Place, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if place.timer is not None:
            place.timer.cancel()
        if not task.cancelled():
            # A bug's exception: its callers already have it; retrieved here so that
            # asyncio does not also report it as never retrieved.
            task.exception()
        self._leave(place)

    async def _send(self, batch: dict[str, list[_Waiter]]) -> None:
        """One batch: every waiter gets its session's answer or the batch's error."""
        waiters = [w for ws in batch.values() for w in ws]
        if not self.enabled:
            _settle(waiters, {"single": True})
            return
        loop = asyncio.get_running_loop()
        # The latest caller's deadline: each caller's own wait ends at its own.
        timeout = max(max(w.deadline for w in waiters) - loop.time(), 0.001)
        self.batches += 1
        self.batched += len(batch)
        try:
            result = await self._call(
                "session_keepalive_many", {"session_ids": list(batch)}, timeout
            )
        except BadRequestError as exc:
            if "unknown operation 'session_keepalive_many'" not in str(exc):
                _fail(waiters, exc)
                return
            # A node of an earlier build: it does not know the operation.
            self._pause("a node does not know session_keepalive_many (an earlier build)")
            _settle(waiters, {"single": True})
            return
        except RaftLeaseError as exc:
            _fail(waiters, exc)
            return
        except asyncio.CancelledError:
            # The loop is ending. Not a cancellation of the callers: for them the
            # outcome is unknown, as after a timeout (their keep-alive loops go on).
            _fail(
                waiters,
                TimeoutError_("the keep-alive batch was cancelled; the outcome is unknown"),
            )
            raise
        except BaseException as exc:  # a bug: every caller sees it
            _fail(waiters, exc)
            raise
        if result.get("keepalives") == "log":
            # Every session comes back single: batching would only add a request.
            self._pause('the cluster keeps sessions alive through the log (keepalives = "log")')
        answers = result.get("sessions")
        by_sid = {
            str(one.get("session_id")): one
            for one in (answers if isinstance(answers, list) else ())
            if isinstance(one, dict)
        }
        for sid, ws in batch.items():
            # A session missing from the answer is kept alive singly: the log decides.
            _settle(ws, by_sid.get(sid, {"single": True}))


def _settle(waiters: list[_Waiter], answer: dict[str, Any]) -> None:
    for waiter in waiters:
        if not waiter.future.done():
            waiter.future.set_result(answer)


def _fail(waiters: list[_Waiter], exc: BaseException) -> None:
    """Each waiter gets its own copy of ``exc``: one instance raised in several tasks
    would gather every task's traceback, and a caller changing it would change the
    others'."""
    for waiter in waiters:
        if not waiter.future.done():
            waiter.future.set_exception(_own(exc))


def _own(exc: BaseException) -> BaseException:
    try:
        mine = copy.copy(exc)
    except Exception:  # an exception type that cannot be copied: share it
        return exc
    mine.__cause__, mine.__context__ = exc.__cause__, exc.__context__
    return mine
