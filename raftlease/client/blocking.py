"""The blocking, thread-safe client: ``Client``, a facade over an ``AsyncClient`` run
on a private event-loop thread. Any number of threads may call it at once; their
requests are pipelined on one connection, except that a short call makes its first
try on the calling thread, on a connection of the thread's lane (up to ``lanes``
threads at once; client/direct.py). Calls block the calling thread up to their deadline and
raise what the ``AsyncClient`` call raises.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from ..errors import ConnectionLostError, InvalidArgumentError, UnavailableError
from ..models import (
    Attachable,
    Holder,
    HolderSigner,
    Lease,
    LeaseSet,
    Queued,
    Read,
    SessionInfo,
    WatchEvent,
)
from ..recipes.election import Election
from ..recipes.locks import HeldLock
from ..recipes.sessions import Session
from ..recipes.shared import SharedKeyLocks
from .aio import AsyncClient
from .budgets import BudgetInfo, Reservation, Settlement, Spend
from .direct import LanePool, run_inline
from .effects import Effect, Reconcile
from .queue import Queue

T = TypeVar("T")


class LoopPortal:
    """Runs coroutines on one event-loop thread for callers on other threads (the
    ``BlockingPortal`` of ``raftlease.models``)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="raftlease-client", daemon=True
        )
        self.thread.start()
        self.closed = False
        #: How long an interrupted call waits for its coroutine's clean-up (``run``).
        self.interrupt_grace = 15.0
        #: The calls of other threads running on the loop (failed by ``close``).
        self._running: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.Lock()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and block until it is done; its result or its
        exception. Raises ``UnavailableError`` once closed, and ``RuntimeError`` when
        called from the loop's own thread (it would deadlock).

        A ``KeyboardInterrupt`` (or any exception a signal handler raises) in the
        calling thread cancels ``coro`` on the loop and waits up to
        ``interrupt_grace`` seconds for its clean-up (a waiting acquire withdraws its
        waiter) before it propagates; a second interrupt stops that wait."""
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError(
                "a blocking Client call from the client's own event-loop thread would "
                "deadlock (callbacks of this client run there? hand the work to a thread)"
            )
        done = threading.Event()
        # Touched only on the loop thread: the running task, and whether it was
        # interrupted before it started.
        state: dict[str, Any] = {"task": None, "stop": False}

        async def tracked() -> T:
            if state["stop"]:
                coro.close()
                raise asyncio.CancelledError
            state["task"] = asyncio.current_task()
            try:
                return await coro
            finally:
                done.set()

        def interrupt() -> None:
            state["stop"] = True
            task = state["task"]
            if task is None:
                done.set()
            else:
                task.cancel()

        with self._lock:
            if self.closed:
                coro.close()
                raise UnavailableError("client is closed")
            future = asyncio.run_coroutine_threadsafe(tracked(), self.loop)
            self._running.add(future)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self.closed:
                raise _closed_meanwhile() from None
            raise
        except BaseException:
            if not future.done() and not self.closed:
                # Interrupted in this thread (KeyboardInterrupt): the coroutine still
                # runs on the loop. Cancel it there and let it clean up, bounded.
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    self.loop.call_soon_threadsafe(interrupt)
                done.wait(self.interrupt_grace)
            raise
        finally:
            with self._lock:
                self._running.discard(future)

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        """A blocking iterator over an async iterator run on the loop; breaking out of
        it (or closing it) closes an async generator there."""

        async def step() -> T:
            return await agen.__anext__()

        try:
            while True:
                try:
                    yield self.run(step())
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(agen, "aclose", None)
            if not self.closed and aclose is not None:
                self.run(aclose())

    def close(self) -> None:
        """Stop the loop and join its thread. A call of another thread still running
        on the loop (an acquire waiting its turn, a transfer...) is cancelled there
        first, so it can clean up, and its caller gets ``ConnectionLostError`` (outcome
        unknown); no caller is left blocked. Blocks up to a few seconds."""
        with self._lock:
            self.closed = True
            running = list(self._running)

        async def cancel_running() -> None:
            here = asyncio.current_task()
            for _ in range(3):  # a cancelled call's clean-up may start a task or two
                tasks = [t for t in asyncio.all_tasks() if t is not here]
                if not tasks:
                    return
                for task in tasks:
                    task.cancel()
                await asyncio.wait(tasks, timeout=1.0)

        if running and self.thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(cancel_running(), self.loop).result(5.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        for future in running:  # whatever the cancellation did not settle
            if not future.done():
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    future.set_exception(_closed_meanwhile())
        self.loop.close()


def _closed_meanwhile() -> ConnectionLostError:
    return ConnectionLostError("the client was closed while this call ran; its outcome is unknown")


class Client(SharedKeyLocks[HeldLock]):
    """Blocking, thread-safe client with the same methods as ``AsyncClient``.

    Use as a context manager, or call ``close()``. Calls block the calling thread up to
    their deadline; they may be made from many threads at once.
    """

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        *,
        direct: bool = True,
        lanes: int = 16,
        **options: Any,
    ) -> None:
        """``options``: those of ``AsyncClient`` (deadline, attempt_timeout, ...).
        ``direct``: make the first try of renew, release, read, holder, fence and
        acquire without ``wait`` on the calling thread (client/direct.py: no hop to
        the loop thread); up to ``lanes`` threads at once do so, each on a
        connection of its own to the leader, made when first needed (the others go
        through the loop thread); False: every call goes through the loop thread.
        Raises ``InvalidArgumentError`` if ``lanes`` is not a whole number >= 1."""
        if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
            raise InvalidArgumentError(f"lanes must be a whole number >= 1, not {lanes!r}")
        self._portal = LoopPortal()

        async def make() -> AsyncClient:
            return AsyncClient(endpoints, **options)

        self._async = self._portal.run(make())
        # An interrupted waiting acquire withdraws within about one deadline.
        self._portal.interrupt_grace = self._async.deadline + self._async.attempt_timeout
        self._lanes = LanePool(self._async.transport, self._portal.run, lanes) if direct else None

    def _direct(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run the coroutine ``make()`` (one whose only await is ``AsyncClient.call``)
        with its first try on this thread when the lane is free, else as ``_run``."""
        pool = self._lanes
        portal = self._portal
        if pool is None or portal.closed or threading.current_thread() is portal.thread:
            return self._run(make())
        lane = None
        try:
            # Taken inside the try: an interrupt must not leave the lane held for good.
            lane = pool.take()
            if lane is not None:
                return run_inline(self._async, lane, make())
        finally:
            if lane is not None:
                pool.give(lane)
        return self._run(make())

    @property
    def aio(self) -> AsyncClient:
        """The ``AsyncClient`` this client runs on its loop thread (for recipes)."""
        return self._async

    @property
    def portal(self) -> LoopPortal:
        """Runs coroutines of ``aio`` from this thread (for recipes)."""
        return self._portal

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._portal.run(coro)

    @property
    def client_id(self) -> str:
        return self._async.client_id

    @property
    def endpoints(self) -> list[str]:
        return self._async.endpoints

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections (see ``AsyncClient.close``), the direct lane and the
        loop thread. Idempotent; later calls raise ``UnavailableError``. A call still
        running on another thread ends with an error: ``UnavailableError`` if its
        request certainly did not apply, else an indefinite one (its outcome unknown)."""
        if self._portal.closed:
            return
        self._run(self._async.close())
        self._portal.close()
        if self._lanes is not None:
            self._lanes.close()

    def acquire(
        self,
        key: str,
        *,
        owner: str | None = None,
        ttl: float | None = None,
        wait: float = 0.0,
        priority: int = 0,
        capacity: int = 1,
        units: int = 1,
        value: str | None = None,
        session: Attachable | None = None,
        timeout: float | None = None,
        fairness_key: str | None = None,
        weight: int | None = None,
        holder_key: HolderSigner | None = None,
        progress_timeout: float | None = None,
    ) -> Lease:
        def make() -> Coroutine[Any, Any, Lease]:
            return self._async.acquire(
                key,
                owner=owner,
                ttl=ttl,
                wait=wait,
                priority=priority,
                capacity=capacity,
                units=units,
                value=value,
                session=session,
                timeout=timeout,
                fairness_key=fairness_key,
                weight=weight,
                holder_key=holder_key,
                progress_timeout=progress_timeout,
            )

        # A waiting acquire long-polls on the loop (AsyncClient._await_grant).
        return self._run(make()) if wait > 0 else self._direct(make)

    def acquire_many(
        self,
        keys: Sequence[str] | Mapping[str, int],
        *,
        owner: str | None = None,
        ttl: float,
        wait: float = 0.0,
        priority: int = 0,
        capacity: int = 1,
        timeout: float | None = None,
        holder_key: HolderSigner | None = None,
    ) -> LeaseSet:
        """Every key of ``keys`` or none, in one log entry (see
        ``AsyncClient.acquire_many``). Blocks the calling thread until answered (with
        ``wait``, until granted or the wait is over)."""

        def make() -> Coroutine[Any, Any, LeaseSet]:
            return self._async.acquire_many(
                keys,
                owner=owner,
                ttl=ttl,
                wait=wait,
                priority=priority,
                capacity=capacity,
                timeout=timeout,
                holder_key=holder_key,
            )

        # A waiting set long-polls on the loop (AsyncClient._await_set).
        return self._run(make()) if wait > 0 else self._direct(make)

    def renew_many(self, lease_set: LeaseSet, *, timeout: float | None = None) -> LeaseSet:
        """One keep-alive for every key of the set (see ``AsyncClient.renew_many``)."""
        return self._direct(lambda: self._async.renew_many(lease_set, timeout=timeout))

    def release_many(self, lease_set: LeaseSet, *, timeout: float | None = None) -> int:
        """End every key of the set in one entry (see ``AsyncClient.release_many``)."""
        return self._direct(lambda: self._async.release_many(lease_set, timeout=timeout))

    def proclaim(self, lease: Lease, value: str, *, timeout: float | None = None) -> Lease:
        return self._run(self._async.proclaim(lease, value, timeout=timeout))

    def effect(
        self,
        lease: Lease,
        effect_id: str,
        *,
        idempotency_key: str | None = None,
        reconcile: Reconcile | None = None,
        timeout: float | None = None,
    ) -> Effect:
        """As ``AsyncClient.effect``, for ``with``: entering begins the effect (blocks
        up to its deadline; the reconcile hook runs in the calling thread)."""
        aio = self._async.effect(
            lease, effect_id, idempotency_key=idempotency_key, reconcile=reconcile, timeout=timeout
        )
        return Effect(self._portal, aio)

    def request_yield(
        self,
        key: str,
        *,
        deadline: float,
        priority: int = 0,
        owner: str | None = None,
        timeout: float | None = None,
    ) -> int:
        """Ask the holders of ``key`` to yield within ``deadline`` seconds (see
        ``AsyncClient.request_yield``). Blocks the calling thread until answered."""
        return self._direct(
            lambda: self._async.request_yield(
                key, deadline=deadline, priority=priority, owner=owner, timeout=timeout
            )
        )

    def transfer(
        self,
        lease: Lease,
        *,
        owner: str,
        ttl: float | None = None,
        timeout: float | None = None,
        holder_key: HolderSigner | None = None,
    ) -> Lease:
        return self._run(
            self._async.transfer(
                lease, owner=owner, ttl=ttl, timeout=timeout, holder_key=holder_key
            )
        )

    def fence(
        self,
        key: str,
        token: int,
        *,
        consistency: str = "linearizable",
        timeout: float | None = None,
    ) -> bool:
        return self._direct(
            lambda: self._async.fence(key, token, consistency=consistency, timeout=timeout)
        )

    def lock(self, key: str, **options: Any) -> HeldLock:
        """``with client.lock(key, owner=..., ttl=..., wait=...) as held:`` acquires,
        renews from a daemon thread every ``ttl / 3``, releases on exit; ``held.token``
        is the fencing token, ``held.lost`` an Event set if the lease is lost.
        Options: those of ``acquire`` (``session=`` attaches it) and ``on_lost``;
        ``owner`` defaults to ``hostname:pid`` (a label, not a credential)."""
        return HeldLock(self, key, **options)

    def session(
        self,
        *,
        owner: str | None = None,
        ttl: float,
        on_lost: Callable[[str], None] | None = None,
        on_jeopardy: Callable[[str], None] | None = None,
        on_yield_requested: Callable[[list[dict[str, Any]]], None] | None = None,
        holder_key: HolderSigner | None = None,
    ) -> Session:
        """``with client.session(owner=..., ttl=10) as s:`` (see ``AsyncClient.session``;
        ``owner`` defaults to ``hostname:pid``, a label, not a credential; with
        ``holder_key``, ``s.certified(lease)`` gives the freshest certificate)."""
        return Session(
            self,
            owner=owner,
            ttl=ttl,
            on_lost=on_lost,
            on_jeopardy=on_jeopardy,
            on_yield_requested=on_yield_requested,
            holder_key=holder_key,
        )

    def election(self, name: str) -> Election:
        return Election(self, name)

    def queue(self, name: str, **defaults: Any) -> Queue:
        """The leased task queue ``name`` (see ``AsyncClient.queue``), blocking."""
        return Queue(self, self._async, name, **defaults)

    def budget_set(
        self,
        key: str,
        *,
        capacity: int,
        refill_per_s: float,
        timeout: float | None = None,
    ) -> BudgetInfo:
        """Blocking ``AsyncClient.budget_set``."""
        return self._run(
            self._async.budget_set(
                key, capacity=capacity, refill_per_s=refill_per_s, timeout=timeout
            )
        )

    def budget_get(self, key: str, *, timeout: float | None = None) -> BudgetInfo:
        """Blocking ``AsyncClient.budget_get``."""
        return self._run(self._async.budget_get(key, timeout=timeout))

    def budget_delete(self, key: str, *, timeout: float | None = None) -> None:
        """Blocking ``AsyncClient.budget_delete``."""
        self._run(self._async.budget_delete(key, timeout=timeout))

    def spend(
        self, key: str, amount: int, *, wait: float = 0.0, timeout: float | None = None
    ) -> Spend:
        """Blocking ``AsyncClient.spend``: blocks the calling thread up to ``wait``
        seconds (plus the deadline); an interrupted call is cancelled on the loop,
        which withdraws the queued spend (as ``AsyncClient.spend``)."""
        return self._run(self._async.spend(key, amount, wait=wait, timeout=timeout))

    def reserve(
        self,
        key: str,
        amount: int,
        *,
        wait: float = 0.0,
        ttl: float | None = None,
        timeout: float | None = None,
    ) -> Reservation:
        """Blocking ``AsyncClient.reserve``."""
        return self._run(self._async.reserve(key, amount, wait=wait, ttl=ttl, timeout=timeout))

    def settle(
        self, reservation: Reservation, actual: int, *, timeout: float | None = None
    ) -> Settlement:
        """Blocking ``AsyncClient.settle``."""
        return self._run(self._async.settle(reservation, actual, timeout=timeout))

    def renew(
        self,
        lease: Lease,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        progress: float | None = None,
    ) -> Lease:
        return self._direct(
            lambda: self._async.renew(lease, ttl=ttl, timeout=timeout, progress=progress)
        )

    def release(self, lease: Lease, *, timeout: float | None = None) -> None:
        self._direct(lambda: self._async.release(lease, timeout=timeout))

    def read(
        self, key: str, *, consistency: str = "linearizable", timeout: float | None = None
    ) -> Read:
        return self._direct(lambda: self._async.read(key, consistency=consistency, timeout=timeout))

    def holder(
        self, key: str, *, consistency: str = "linearizable", timeout: float | None = None
    ) -> Holder | None:
        return self._direct(
            lambda: self._async.holder(key, consistency=consistency, timeout=timeout)
        )

    def leases(
        self,
        prefix: str = "",
        *,
        limit: int = 1000,
        consistency: str = "linearizable",
        timeout: float | None = None,
    ) -> list[Holder]:
        return self._run(
            self._async.leases(prefix, limit=limit, consistency=consistency, timeout=timeout)
        )

    def revoke(
        self,
        key: str,
        *,
        lease_id: str | None = None,
        token: int | None = None,
        timeout: float | None = None,
    ) -> list[int]:
        """Operators: end the leases on ``key`` (see ``AsyncClient.revoke``)."""
        return self._run(self._async.revoke(key, lease_id=lease_id, token=token, timeout=timeout))

    def waiters(
        self,
        key: str,
        *,
        limit: int = 1000,
        consistency: str = "linearizable",
        timeout: float | None = None,
    ) -> list[Queued]:
        """The queue of ``key`` (see ``AsyncClient.waiters``)."""
        return self._run(
            self._async.waiters(key, limit=limit, consistency=consistency, timeout=timeout)
        )

    def sessions(
        self, *, limit: int = 1000, consistency: str = "linearizable", timeout: float | None = None
    ) -> list[SessionInfo]:
        """Live lease sessions, without their ids (see ``AsyncClient.sessions``)."""
        return self._run(
            self._async.sessions(limit=limit, consistency=consistency, timeout=timeout)
        )

    def call(
        self, op: str, args: dict[str, Any], *, mutating: bool, timeout: float | None = None
    ) -> dict[str, Any]:
        """Low-level: send any operation (used by tests and tools)."""
        return self._run(self._async.call(op, args, mutating=mutating, timeout=timeout))

    def session_keepalive(self, session_id: str, *, timeout: float | None = None) -> dict[str, Any]:
        """As ``AsyncClient.session_keepalive``: one keep-alive of a lease session (on
        the client's loop, batched with its other sessions' when they are due together).
        Blocks until answered; raises what ``call`` raises."""
        return self._run(self._async.session_keepalive(session_id, timeout=timeout))

    def node_status(self, endpoint: str, *, timeout: float = 2.0) -> dict[str, Any]:
        return self._run(self._async.node_status(endpoint, timeout=timeout))

    def watch(self, prefix: str = "", *, from_revision: int = 0) -> Iterator[WatchEvent]:
        """Blocking iterator over ``AsyncClient.watch``; stop by breaking out of it."""
        return self._portal.iterate(self._async.watch(prefix, from_revision=from_revision))

    def reload(self, endpoint: str, *, timeout: float = 10.0) -> dict[str, Any]:
        """``AsyncClient.reload``: the node at ``endpoint`` reads its auth and TLS
        files again (admin). Blocks up to ``timeout``."""
        return self._run(self._async.reload(endpoint, timeout=timeout))

    def audit(
        self,
        endpoint: str,
        *,
        key: str | None = None,
        principal: str | None = None,
        since: int = 0,
        limit: int = 1000,
        refusals: bool = False,
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        """``AsyncClient.audit``: the audit trail the node at ``endpoint`` holds
        (admin), or its refusal ring with ``refusals``. Blocks up to ``timeout``."""
        return self._run(
            self._async.audit(
                endpoint,
                key=key,
                principal=principal,
                since=since,
                limit=limit,
                refusals=refusals,
                timeout=timeout,
            )
        )

    def cluster_status(self, *, timeout: float = 2.0) -> list[dict[str, Any]]:
        return self._run(self._async.cluster_status(timeout=timeout))
