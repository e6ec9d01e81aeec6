"""Leased task queues on the blocking client: ``Queue`` and ``Task``
(``Client.queue(name)``), facades over ``AsyncQueue``/``AsyncTask`` run on the
client's event-loop thread. Thread-safe like ``Client``; calls block the calling
thread up to their deadline and raise what the async call raises.

    q = c.queue("rollouts")
    tid = q.put({"env": "cartpole", "seed": 7}, priority=5, dedup_key="cartpole-7")
    for task in q.tasks(worker="w-17", wait=30.0):   # ends when none came within wait
        with task:                                   # heartbeats every ttl/3
            out = run(task.payload, fencing_token=task.token)
            task.complete(result=out)                # StaleAttemptError if not current
    result = q.wait_result(tid, timeout=300)

docs/queues.md has the semantics and the safety argument.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from ..errors import RaftLeaseError
from ..models import Attachable, BlockingPortal, HolderSigner
from ..recipes.keepalive import LostCallback
from .aio_queue import AsyncQueue, AsyncTask, QueueStats, TaskCaller, TaskInfo
from .effects import Effect, Reconcile


class PortalClient(Protocol):
    """What the blocking queue needs of the client (``Client`` is one)."""

    @property
    def portal(self) -> BlockingPortal: ...


class Task:
    """One claimed attempt (see ``AsyncTask`` for every field: ``payload``,
    ``token``, ``lease_id``, ``attempt``, ``valid_until``...).

    ``with task:`` heartbeats every ``ttl / 3`` from a daemon thread; an exception out
    of the block fails the attempt, a block that ends without completing, failing or
    releasing does ``on_exit`` ("release" or "complete"). ``lost`` (a
    ``threading.Event``) is set, and ``on_lost`` called, once the attempt is gone."""

    def __init__(self, portal: BlockingPortal, task: AsyncTask) -> None:
        self._portal = portal
        self.aio = task
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def payload(self) -> Any:
        """The task's payload (the JSON value put)."""
        return self.aio.payload

    @property
    def certificate(self) -> str:
        """The attempt's latest lease certificate ("" without ``holder_key``)."""
        return self.aio.certificate

    def prove(self, challenge: bytes, message: bytes = b"") -> str:
        """As ``AsyncTask.prove``."""
        return self.aio.prove(challenge, message)

    @property
    def token(self) -> int:
        """The attempt's fencing token (strictly increasing per task)."""
        return self.aio.token

    @property
    def lease_id(self) -> str:
        """The attempt id: the secret that proves this attempt."""
        return self.aio.lease_id

    @property
    def attempt(self) -> int:
        """1 for the task's first claim, 2 for the next..."""
        return self.aio.attempt

    @property
    def task_id(self) -> str:
        return self.aio.task_id

    @property
    def queue(self) -> str:
        return self.aio.queue

    @property
    def worker(self) -> str:
        return self.aio.worker

    @property
    def ttl(self) -> float:
        """Seconds each heartbeat extends the attempt by."""
        return self.aio.ttl

    @property
    def session(self) -> str:
        """The lease session it is attached to, "" for none."""
        return self.aio.session

    @property
    def finished(self) -> str | None:
        """completed, failed or released once this client ended it."""
        return self.aio.finished

    @property
    def valid(self) -> bool:
        return self.aio.valid

    @property
    def valid_until(self) -> float:
        """On ``time.monotonic()``."""
        return self.aio.valid_until

    @property
    def remaining(self) -> float:
        return self.aio.remaining

    def __repr__(self) -> str:
        return f"Task({self.aio.queue!r}, {self.aio.task_id!r}, attempt={self.aio.attempt})"

    def _lost_check(self) -> None:
        if self.aio.lost.is_set():
            self.lost.set()

    @property
    def after(self) -> tuple[str, ...]:
        """The ids of the tasks it ran after (docs/queues.md, "Dependencies")."""
        return self.aio.after

    @property
    def parent_results(self) -> dict[str, Any]:
        """Their results (JSON values), by task id (those still kept)."""
        return self.aio.parent_results

    @property
    def checkpoint(self) -> bytes | None:
        """The bytes an earlier attempt's latest heartbeat saved (None: none)."""
        return self.aio.checkpoint

    @property
    def checkpoint_attempt(self) -> int:
        """The number of the attempt that saved ``checkpoint`` (0: none)."""
        return self.aio.checkpoint_attempt

    def heartbeat(
        self,
        progress: float | None = None,
        *,
        checkpoint: bytes | None = None,
        timeout: float | None = None,
    ) -> None:
        """As ``AsyncTask.heartbeat`` (raises ``StaleAttemptError``); blocks until
        the heartbeat, and its checkpoint, are committed."""
        try:
            self._portal.run(self.aio.heartbeat(progress, checkpoint=checkpoint, timeout=timeout))
        finally:
            self._lost_check()

    def effect(
        self,
        effect_id: str,
        *,
        idempotency_key: str | None = None,
        reconcile: Reconcile | None = None,
        timeout: float | None = None,
    ) -> Effect:
        """As ``AsyncTask.effect``, for ``with``: entering begins the effect (blocks
        for one replicated write; the reconcile hook runs in this thread)."""
        aio = self.aio.effect(
            effect_id, idempotency_key=idempotency_key, reconcile=reconcile, timeout=timeout
        )
        return Effect(self._portal, aio)

    def complete(self, result: Any = None, *, timeout: float | None = None) -> None:
        """As ``AsyncTask.complete`` (raises ``StaleAttemptError``)."""
        try:
            self._portal.run(self.aio.complete(result, timeout=timeout))
        finally:
            self._lost_check()

    def fail(
        self, error: str = "", *, retry_after: float | None = None, timeout: float | None = None
    ) -> None:
        """As ``AsyncTask.fail``."""
        try:
            self._portal.run(self.aio.fail(error, retry_after=retry_after, timeout=timeout))
        finally:
            self._lost_check()

    def release(self, *, timeout: float | None = None) -> None:
        """As ``AsyncTask.release``."""
        try:
            self._portal.run(self.aio.release(timeout=timeout))
        finally:
            self._lost_check()

    def _renew(self, timeout: float) -> None:
        self.heartbeat(timeout=timeout)

    def __enter__(self) -> Task:
        if not self.aio.session:
            self._thread = threading.Thread(
                target=self.aio.keep.keep_alive_thread,
                args=(self._renew, self._stop, self.lost),
                name=f"raftlease-task-{self.aio.task_id}",
                daemon=True,
            )
            self._thread.start()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.aio.keep.interval() + 10)
        if self.aio.finished is not None or self.lost.is_set() or self.aio.lost.is_set():
            return
        with contextlib.suppress(RaftLeaseError):
            if exc is not None:
                self.fail(f"{type(exc).__name__}: {exc}", timeout=5.0)
            elif self.aio.on_exit == "complete":
                self.complete(None, timeout=5.0)
            else:
                self.release(timeout=5.0)


class Queue:
    """A named task queue on a blocking ``Client`` (``client.queue(name, **defaults)``);
    the same methods as ``AsyncQueue``, blocking."""

    def __init__(self, client: PortalClient, aio: TaskCaller, name: str, **defaults: Any) -> None:
        self._portal = client.portal
        self.aio = AsyncQueue(aio, name, **defaults)
        self.name = name

    def put(
        self,
        payload: Any,
        *,
        priority: int = 0,
        delay: float = 0.0,
        not_before: float | None = None,
        dedup_key: str | None = None,
        max_attempts: int | None = None,
        lease_ttl: float | None = None,
        progress_timeout: float | None = None,
        requires: Mapping[str, str] | None = None,
        deadline: float | None = None,
        retention: float | None = None,
        backoff: float | None = None,
        fairness_key: str | None = None,
        weight: int | None = None,
        after: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> str:
        """As ``AsyncQueue.put`` (the same options, spelled out so that type checkers
        and editors see them): the task id. Blocks the calling thread."""
        return self._portal.run(
            self.aio.put(
                payload,
                priority=priority,
                delay=delay,
                not_before=not_before,
                dedup_key=dedup_key,
                max_attempts=max_attempts,
                lease_ttl=lease_ttl,
                progress_timeout=progress_timeout,
                requires=requires,
                deadline=deadline,
                retention=retention,
                backoff=backoff,
                fairness_key=fairness_key,
                weight=weight,
                after=after,
                timeout=timeout,
            )
        )

    def claim(
        self,
        *,
        worker: str | None = None,
        wait: float = 0.0,
        lease_ttl: float | None = None,
        capabilities: Mapping[str, str] | None = None,
        session: Attachable | None = None,
        on_exit: str = "release",
        on_lost: LostCallback | None = None,
        timeout: float | None = None,
        holder_key: HolderSigner | None = None,
    ) -> Task | None:
        """As ``AsyncQueue.claim``: a ``Task`` or None."""
        task = self._portal.run(
            self.aio.claim(
                worker=worker,
                wait=wait,
                lease_ttl=lease_ttl,
                capabilities=capabilities,
                session=session,
                on_exit=on_exit,
                on_lost=on_lost,
                timeout=timeout,
                holder_key=holder_key,
            )
        )
        return None if task is None else Task(self._portal, task)

    def tasks(
        self,
        *,
        worker: str | None = None,
        wait: float = 30.0,
        lease_ttl: float | None = None,
        capabilities: Mapping[str, str] | None = None,
        session: Attachable | None = None,
        on_exit: str = "release",
    ) -> Iterator[Task]:
        """Claim tasks one after another; ends when none came within ``wait``."""
        while True:
            task = self.claim(
                worker=worker,
                wait=wait,
                lease_ttl=lease_ttl,
                capabilities=capabilities,
                session=session,
                on_exit=on_exit,
            )
            if task is None:
                return
            yield task

    def wait_result(self, task_id: str, *, timeout: float = 300.0) -> Any:
        """As ``AsyncQueue.wait_result`` (raises ``TaskDeadError``, ``TimeoutError_``)."""
        return self._portal.run(self.aio.wait_result(task_id, timeout=timeout))

    def get(self, task_id: str, *, timeout: float | None = None) -> TaskInfo:
        return self._portal.run(self.aio.get(task_id, timeout=timeout))

    def stats(self, *, timeout: float | None = None) -> QueueStats:
        return self._portal.run(self.aio.stats(timeout=timeout))

    def dead(self, *, limit: int = 100, timeout: float | None = None) -> list[TaskInfo]:
        return self._portal.run(self.aio.dead(limit=limit, timeout=timeout))

    def retry(self, task_id: str, *, timeout: float | None = None) -> None:
        self._portal.run(self.aio.retry(task_id, timeout=timeout))

    def purge(self, task_id: str, *, timeout: float | None = None) -> None:
        self._portal.run(self.aio.purge(task_id, timeout=timeout))
