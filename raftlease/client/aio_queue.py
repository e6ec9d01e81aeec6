"""Leased task queues on the asyncio client: ``AsyncQueue`` and ``AsyncTask``
(``AsyncClient.queue(name)``), and the value types both clients return.

A task is handed to one worker at a time. Each hand-over (*attempt*) has its own
attempt id (``task.lease_id``: the secret that proves it, never shown to anyone else)
and fencing token (``task.token``: the store revision of the claim, strictly
increasing per task). A completion, failure, release or heartbeat from an attempt that
is no longer current raises ``StaleAttemptError`` (definite: nothing was applied), and
exactly one completion per task is ever accepted. docs/queues.md has the semantics.

Payloads and results are JSON values (sent as JSON text, at most 16 KiB each).
Cancelling a call leaves its outcome unknown, exactly like a timeout; a waiting claim
that is cancelled or ends with an unknown outcome is withdrawn, retried until the
cluster answers or the wait would have ended (a task granted meanwhile is given back).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import (
    InvalidArgumentError,
    RaftLeaseError,
    StaleAttemptError,
    TaskDeadError,
    TaskNotFoundError,
    TimeoutError_,
)
from ..limits import MAX_TASK_CHECKPOINT_BYTES
from ..models import Attachable, HolderSigner
from ..recipes.keepalive import KeepAliveState, LostCallback
from .caller import Caller
from .effects import AsyncEffect, Reconcile, effect_call
from .transport import Pin, unknown_outcome

#: What a context-managed task does when its block ends without an exception and
#: without the task having been completed, failed or released.
ON_EXIT = ("release", "complete")


class TaskCaller(Caller, Protocol):
    """What the queue needs of the client (``AsyncClient`` is one): a ``Caller``
    that also knows its deadline and how long a lease sent at ``sent`` is safe."""

    @property
    def deadline(self) -> float: ...

    def valid_until(self, sent: float, seconds: float) -> float: ...


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One past attempt of a task. ``outcome``: completed, failed, expired (no
    heartbeat within its TTL), stalled (no progress within ``progress_timeout``),
    released, session (its lease session ended) or deadline. Times are log-time
    milliseconds."""

    number: int
    worker: str
    token: int
    started_at: int
    ended_at: int
    outcome: str
    error: str


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """A task as ``get`` and ``dead`` show it (never an attempt id). ``status``:
    ready, delayed, claimed, completed or dead. ``attempts``: claims so far;
    ``failures``: the attempts counted against ``max_attempts``. ``worker``, ``token``
    and ``progress`` describe the current attempt while claimed. ``fairness_key``: its
    tenant ("" the queue's default one; docs/queues.md, "Fair shares")."""

    task_id: str
    queue: str
    status: str
    payload: Any
    priority: int
    requires: dict[str, str]
    attempts: int
    failures: int
    max_attempts: int
    history: tuple[AttemptRecord, ...]
    result: Any = None
    dead_reason: str = ""
    dedup_key: str = ""
    fairness_key: str = ""
    worker: str | None = None
    token: int | None = None
    progress: float | None = None
    #: The latest checkpoint a heartbeat carried (bytes; None: none) and the number
    #: of the attempt that wrote it (docs/queues.md, "Checkpoints").
    checkpoint: bytes | None = None
    checkpoint_attempt: int = 0
    #: The effect journal (docs/queues.md, "Effects"), in the order begun: each a dict
    #: with ``effect``, ``state`` (begun, committed), ``token``, ``attempt``, ``key``
    #: and ``result`` (the JSON value committed, None before).
    effects: tuple[dict[str, Any], ...] = ()
    #: Task dependencies (docs/queues.md, "Dependencies"): the ids it runs after, and
    #: those not completed yet (it waits while any is left).
    after: tuple[str, ...] = ()
    waiting_on: tuple[str, ...] = ()

    @property
    def errors(self) -> list[str]:
        """The error of every counted attempt, oldest first."""
        return [a.error for a in self.history if a.outcome not in ("completed", "released")]


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts of one queue. ``oldest_ready_age``: seconds (log time) the oldest ready
    task has waited since its put, None when none is ready; ``attempts``: claims ever
    granted in the queue."""

    queue: str
    ready: int
    delayed: int
    claimed: int
    dead: int
    completed: int
    waiting_claims: int
    attempts: int
    oldest_ready_age: float | None


def encode_json(value: Any, what: str) -> str:
    """JSON text of ``value``; raises ``InvalidArgumentError`` if it has none."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"the {what} must be a JSON value: {exc}") from None


def decode_json(text: Any) -> Any:
    """The value of JSON text the clients wrote; other text (written by another tool)
    is returned as it is."""
    if not isinstance(text, str) or not text:
        return None if text in (None, "") else text
    try:
        return json.loads(text)
    except ValueError:
        return text


def encode_checkpoint(checkpoint: bytes) -> str:
    """The wire text of a checkpoint (base64: JSON and HTTP carry no bytes); raises
    ``InvalidArgumentError`` for a value that is not bytes or is over the limit."""
    if not isinstance(checkpoint, bytes | bytearray | memoryview):
        raise InvalidArgumentError(f"a checkpoint must be bytes, not {type(checkpoint).__name__}")
    raw = bytes(checkpoint)
    if len(raw) > MAX_TASK_CHECKPOINT_BYTES:
        raise InvalidArgumentError(
            f"a checkpoint is at most {MAX_TASK_CHECKPOINT_BYTES} bytes, not {len(raw)}"
        )
    return base64.b64encode(raw).decode("ascii")


def decode_checkpoint(text: Any) -> bytes | None:
    """The bytes of a checkpoint's wire text (None when there is none): base64, as
    the clients send it; text another tool wrote that is not base64 is returned as
    its UTF-8 bytes."""
    if not isinstance(text, str):
        return None
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return text.encode("utf-8", "surrogatepass")


def task_info(data: dict[str, Any]) -> TaskInfo:
    return TaskInfo(
        task_id=str(data["tid"]),
        queue=str(data["queue"]),
        status=str(data["status"]),
        payload=decode_json(data.get("payload")),
        priority=int(data.get("priority", 0)),
        requires=dict(data.get("requires", {})),
        attempts=int(data.get("attempts", 0)),
        failures=int(data.get("failures", 0)),
        max_attempts=int(data.get("max_attempts", 0)),
        history=tuple(AttemptRecord(*row) for row in data.get("history", [])),
        result=decode_json(data.get("result")),
        dead_reason=str(data.get("dead_reason", "")),
        dedup_key=str(data.get("dedup_key", "")),
        fairness_key=str(data.get("fairness_key", "")),
        worker=data.get("worker"),
        token=data.get("token"),
        progress=data.get("progress"),
        checkpoint=decode_checkpoint(data.get("checkpoint")),
        checkpoint_attempt=int(data.get("checkpoint_attempt", 0)),
        effects=tuple(
            {**row, "result": decode_json(row.get("result"))} for row in data.get("effects", [])
        ),
        after=tuple(data.get("after", ())),
        waiting_on=tuple(data.get("waiting_on", ())),
    )


def queue_stats(data: dict[str, Any]) -> QueueStats:
    age = data.get("oldest_ready_age")
    return QueueStats(
        queue=str(data["queue"]),
        ready=int(data["ready"]),
        delayed=int(data["delayed"]),
        claimed=int(data["claimed"]),
        dead=int(data["dead"]),
        completed=int(data["completed"]),
        waiting_claims=int(data["waiting_claims"]),
        attempts=int(data["attempts"]),
        oldest_ready_age=None if age is None else age / 1000.0,
    )


class AsyncTask:
    """One claimed attempt of a task. ``payload`` (the JSON value put), ``token``
    (the attempt's fencing token: hand it to whatever the work writes to),
    ``lease_id`` (the attempt id; secret), ``attempt`` (1 for the first claim),
    ``valid_until`` (this process's ``time.monotonic()``: the attempt is trusted until
    then, counted from the claim's send like a lease), ``checkpoint`` (the bytes an
    earlier attempt's latest heartbeat saved, None if none: start from there) and
    ``checkpoint_attempt`` (the number of the attempt that saved it).

    ``async with task:`` heartbeats every ``ttl / 3`` in an asyncio task; an exception
    out of the block fails the attempt (its text is the error), a block that ends
    without completing, failing or releasing does ``on_exit`` ("release" or
    "complete"). ``lost`` is set (and ``on_lost`` called) when the attempt is gone:
    stop the work, its results would be refused.
    """

    def __init__(
        self,
        client: TaskCaller,
        result: dict[str, Any],
        sent: float,
        *,
        remaining: float | None = None,
        on_exit: str = "release",
        on_lost: LostCallback | None = None,
        attached: Attachable | None = None,
        holder_key: HolderSigner | None = None,
    ) -> None:
        self._client = client
        #: The lease certificate key the claim named (docs/certificates.md) and the
        #: attempt's latest certificate ("" if none): its heartbeats refresh it.
        self.holder_key = holder_key
        self.certificate = str(result.get("certificate", ""))
        #: The lease session an attached attempt lives by (its validity is the
        #: session's: it sends no heartbeats of its own).
        self._attached = attached
        self.queue: str = result["queue"]
        self.task_id: str = result["tid"]
        self.lease_id: str = result["aid"]
        self.payload: Any = decode_json(result.get("payload"))
        self.token = int(result["token"])
        self.attempt = int(result["attempt"])
        self.worker = str(result["worker"])
        self.ttl = int(result["ttl"]) / 1000.0
        self.session = str(result.get("session", ""))
        self.checkpoint: bytes | None = decode_checkpoint(result.get("checkpoint"))
        self.checkpoint_attempt = int(result.get("checkpoint_attempt") or 0)
        #: The ids it ran after, and their results (JSON values) still kept.
        self.after: tuple[str, ...] = tuple(result.get("after", ()))
        self.parent_results: dict[str, Any] = {
            tid: decode_json(text) for tid, text in (result.get("parent_results") or {}).items()
        }
        self.on_exit = on_exit
        #: With a progress timeout, a heartbeat extends only that far past the last
        #: progress: the background heartbeats (which carry none) run often enough to
        #: notice at once when the attempt is lost.
        self.progress_timeout = int(result.get("progress_timeout") or 0) / 1000.0
        beat_ttl = min(self.ttl, self.progress_timeout) if self.progress_timeout else self.ttl
        self.keep = KeepAliveState(
            f"task {self.task_id} attempt {self.attempt}", beat_ttl, noun="attempt", on_lost=on_lost
        )
        self.lost = asyncio.Event()
        #: "completed", "failed" or "released" once this client ended the attempt.
        self.finished: str | None = None
        self._keep_alive: asyncio.Task[None] | None = None
        self._set_validity(result, sent, remaining)

    def _set_validity(
        self, result: dict[str, Any], sent: float, remaining: float | None = None
    ) -> None:
        if remaining is None:
            remaining = (int(result["expires_at"]) - int(result["now"])) / 1000.0
        self.keep.renewed(self._client.valid_until(sent, min(self.ttl, remaining)))

    @property
    def valid_until(self) -> float:
        if self._attached is not None:
            return self._attached.valid_until  # 0 once the session is lost
        return self.keep.valid_until

    @property
    def valid(self) -> bool:
        return self.remaining > 0 and self.finished is None

    @property
    def remaining(self) -> float:
        if self._attached is not None:
            return max(0.0, self._attached.valid_until - time.monotonic())
        return self.keep.remaining

    def _ids(self) -> dict[str, Any]:
        return {"queue": self.queue, "task_id": self.task_id, "attempt_id": self.lease_id}

    def prove(self, challenge: bytes, message: bytes = b"") -> str:
        """The proof of possession for ``message`` under the attempt's certificate
        (as ``Lease.prove``). Raises ``ValueError`` without a certificate (claimed
        without ``holder_key``, or the leader could not sign yet). Never blocks."""
        if self.holder_key is None or not self.certificate:
            raise ValueError("this attempt has no certificate (claim it with holder_key=)")
        return self.holder_key.prove(self.certificate, challenge, message)

    async def _ended(self, op: str, args: dict[str, Any], how: str, timeout: float | None) -> None:
        try:
            await self._client.call(op, {**self._ids(), **args}, mutating=True, timeout=timeout)
        except (StaleAttemptError, TaskNotFoundError) as exc:
            self._gone(exc)
            raise
        self.finished = how
        await self._stop()

    def _gone(self, exc: RaftLeaseError) -> None:
        self.keep.gone = True
        self.keep.lose(f"the cluster no longer has this attempt: {exc}")
        self.lost.set()

    async def heartbeat(
        self,
        progress: float | None = None,
        *,
        checkpoint: bytes | None = None,
        timeout: float | None = None,
    ) -> None:
        """Extend the attempt by its TTL and record ``progress`` (a number; with a
        ``progress_timeout``, only heartbeats within that long of the last increase
        extend) and ``checkpoint`` (at most 8 KiB of bytes, replicated: the task keeps
        the latest and hands it to the next attempt's claim; docs/queues.md,
        "Checkpoints"). Once this returns, the checkpoint is committed. Raises
        ``StaleAttemptError`` once the attempt is not current (the checkpoint was not
        kept), ``InvalidArgumentError`` for a checkpoint over the limit."""
        sent = time.monotonic()
        args: dict[str, Any] = self._ids()
        if progress is not None:
            args["progress"] = progress
        if checkpoint is not None:
            args["checkpoint"] = encode_checkpoint(checkpoint)
        if self.holder_key is not None:
            # A fresh certificate to the new expiry (the claim's key only: another is
            # refused HOLDER_KEY_MISMATCH).
            args["holder_key"] = self.holder_key.public_hex()
        try:
            result = await self._client.call("task_heartbeat", args, mutating=True, timeout=timeout)
        except (StaleAttemptError, TaskNotFoundError) as exc:
            self._gone(exc)
            raise
        self._set_validity(result, sent)
        self.certificate = str(result.get("certificate") or self.certificate)

    def effect(
        self,
        effect_id: str,
        *,
        idempotency_key: str | None = None,
        reconcile: Reconcile | None = None,
        timeout: float | None = None,
    ) -> AsyncEffect:
        """An external effect of this attempt, for ``async with`` (client/effects.py;
        docs/queues.md, "Effects"): entering records the intent in the log before the
        call, ``commit`` the result after; a later attempt finds it committed (skip
        the call) or in progress (``reconcile(prior_token, key)`` decides)."""
        return AsyncEffect(
            self,
            effect_id,
            idempotency_key=idempotency_key,
            reconcile=reconcile,
            timeout=timeout,
        )

    async def _effect_call(
        self, op: str, args: dict[str, Any], timeout: float | None
    ) -> dict[str, Any]:
        call = self._client.call(
            f"task_effect_{op}", {**self._ids(), **args}, mutating=True, timeout=timeout
        )
        return await effect_call(lambda: call, self._gone)

    async def complete(self, result: Any = None, *, timeout: float | None = None) -> None:
        """Finish the task with ``result`` (a JSON value; the producer's
        ``wait_result`` returns it). Raises ``StaleAttemptError`` if this attempt is
        no longer current (another attempt, or nobody, may complete it)."""
        await self._ended(
            "task_complete", {"result": encode_json(result, "result")}, "completed", timeout
        )

    async def fail(
        self, error: str = "", *, retry_after: float | None = None, timeout: float | None = None
    ) -> None:
        """Count this attempt as failed with ``error``: the task is retried after an
        exponential backoff with jitter (or after ``retry_after`` seconds), or
        dead-lettered once it used all its attempts."""
        # At most 2000 bytes of UTF-8 (the limit is 2048), cut on a character boundary.
        text = str(error).encode("utf-8", "replace")[:2000].decode("utf-8", "ignore")
        args: dict[str, Any] = {"error": text}
        if retry_after is not None:
            args["retry_after"] = retry_after
        await self._ended("task_fail", args, "failed", timeout)

    async def release(self, *, timeout: float | None = None) -> None:
        """Give the task back at once, not counted as an attempt."""
        await self._ended("task_release", {}, "released", timeout)

    async def _renew(self, timeout: float) -> None:
        await self.heartbeat(timeout=timeout)

    async def _stop(self) -> None:
        task, self._keep_alive = self._keep_alive, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> AsyncTask:
        if not self.session:  # an attached attempt lives by its session's keep-alive
            beats = self.keep.keep_alive_task(self._renew, self.lost)
            self._keep_alive = asyncio.create_task(beats)
        return self

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        await self._stop()
        if self.finished is not None or self.lost.is_set():
            return
        with contextlib.suppress(RaftLeaseError):
            if exc is not None:
                await self.fail(f"{type(exc).__name__}: {exc}", timeout=5.0)
            elif self.on_exit == "complete":
                await self.complete(None, timeout=5.0)
            else:
                await self.release(timeout=5.0)


class AsyncQueue:
    """A named task queue on an ``AsyncClient`` (``client.queue(name)``). The keyword
    defaults given here apply to every ``put`` that does not set them (``lease_ttl``,
    ``max_attempts``, ``progress_timeout``, ``retention``, ``backoff``, in seconds
    where they are times)."""

    def __init__(self, client: TaskCaller, name: str, **defaults: Any) -> None:
        unknown = set(defaults) - {
            "lease_ttl",
            "max_attempts",
            "progress_timeout",
            "retention",
            "backoff",
        }
        if unknown:
            raise InvalidArgumentError(f"unknown queue defaults: {sorted(unknown)}")
        if not name:
            raise InvalidArgumentError("a queue needs a name")
        self.client = client
        self.name = name
        self.defaults = {k: v for k, v in defaults.items() if v is not None}

    async def put(
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
        """Put a task; returns its id. A put with the ``dedup_key`` of a task still
        kept returns that task's id instead (and puts nothing).

        ``priority`` (-1000..1000, higher first, aged by the node's
        ``task_priority_aging``: docs/queues.md, "Order"); ``delay`` seconds, or
        ``not_before`` (a ``time.time()`` on this machine's wall clock, turned into a
        delay when the call is made); ``max_attempts`` (1..100, default 3);
        ``lease_ttl`` of each attempt (default 30 s); ``progress_timeout``;
        ``requires`` capabilities a worker must offer; ``deadline`` seconds after
        which it is dead-lettered; ``retention`` seconds a finished task and its
        result are kept (default 3600); ``backoff`` the first retry's base delay
        (default 1 s; it doubles per failure, up to 300 s, with jitter).
        ``fairness_key``: the tenant the task belongs to (at most 128 bytes; none: the
        queue's default tenant); backlogged tenants share the claims in proportion to
        their weights; ``weight`` (1..1000) sets the tenant's weight from this put on
        (none: unchanged; a new tenant's is 1): docs/queues.md, "Fair shares".
        ``after``: up to 16 task ids of this queue: the task is ready only once every
        one is completed (its claim carries their results), dead if one dies
        (docs/queues.md, "Dependencies"). Raises ``QuotaExceededError`` when the queue
        is full or already has 1,000 tenants, ``TaskNotFoundError`` for an ``after``
        id the queue does not hold, ``InvalidArgumentError``."""
        if not_before is not None:
            delay = max(delay, not_before - time.time())
        args: dict[str, Any] = {
            "queue": self.name,
            "payload": encode_json(payload, "payload"),
            **self.defaults,
        }
        optional = {
            "priority": priority or None,
            "delay": delay if delay > 0 else None,
            "dedup_key": dedup_key,
            "max_attempts": max_attempts,
            "lease_ttl": lease_ttl,
            "progress_timeout": progress_timeout,
            "requires": dict(requires) if requires else None,
            "deadline": deadline,
            "retention": retention,
            "backoff": backoff,
            "fairness_key": fairness_key,
            "weight": weight,
            "after": list(after) if after else None,
        }
        args.update({k: v for k, v in optional.items() if v is not None})
        result = await self.client.call("task_put", args, mutating=True, timeout=timeout)
        return str(result["tid"])

    async def claim(
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
    ) -> AsyncTask | None:
        """One task for ``worker``, or None when none is ready (after waiting up to
        ``wait`` seconds: the claim waits in the replicated state and is handed the
        first task it can take, no polling). Highest priority first, aged by the
        time a task has been ready (docs/queues.md, "Order"), FIFO within;
        only tasks whose ``requires`` the ``capabilities`` satisfy. ``lease_ttl``
        overrides the task's; ``session`` attaches the attempt to a lease session (it
        then ends with the session; ``worker`` defaults to the session's owner).
        ``on_exit``: see ``AsyncTask``. With ``holder_key`` (docs/certificates.md) the
        attempt is bound to it and carries a ``certificate`` (key ``<queue>/<task
        id>``, the attempt's token) that its heartbeats refresh; a claim granted after
        waiting gets it with one heartbeat."""
        if on_exit not in ON_EXIT:
            raise InvalidArgumentError(f"on_exit must be one of {list(ON_EXIT)}")
        if session is not None:
            if lease_ttl is not None:
                raise InvalidArgumentError("give lease_ttl or session, not both")
            worker = worker or session.owner
        if not worker:
            raise InvalidArgumentError("worker is required")
        args: dict[str, Any] = {"queue": self.name, "worker": worker}
        if wait > 0:
            args["wait"] = wait
        if lease_ttl is not None:
            args["lease_ttl"] = lease_ttl
        if capabilities:
            args["capabilities"] = dict(capabilities)
        if session is not None:
            args["session"] = session.session_id
        if holder_key is not None:
            args["holder_key"] = holder_key.public_hex()
        sent = time.monotonic()
        if wait > 0:
            pin = Pin()
            try:
                result = await self.client._call_pinned("task_claim", args, pin, timeout)
            except BaseException as exc:
                if unknown_outcome(exc):
                    # Maybe queued (or handed a task): send the same request again
                    # under the same (cid, seq) to learn its attempt id, withdraw it.
                    await self.client._withdraw_until(
                        lambda t: self._withdraw_unknown(args, pin, t), sent + wait
                    )
                raise
            finally:
                pin.end()
        else:
            result = await self.client.call("task_claim", args, mutating=True, timeout=timeout)
        if result.get("claimed"):
            return AsyncTask(
                self.client,
                result,
                sent,
                on_exit=on_exit,
                on_lost=on_lost,
                attached=session,
                holder_key=holder_key,
            )
        if not result.get("queued"):
            return None
        task = await self._await_claim(str(result["aid"]), sent + wait, on_exit, on_lost, session)
        if task is not None and holder_key is not None:
            # Handed a task by another request's entry: one heartbeat brings the
            # certificate (as a waiting acquire's one renewal).
            task.holder_key = holder_key
            await task.heartbeat(timeout=timeout)
        return task

    async def _await_claim(
        self,
        aid: str,
        until: float,
        on_exit: str,
        on_lost: LostCallback | None,
        attached: Attachable | None = None,
    ) -> AsyncTask | None:
        """Long-poll the leader until our waiting claim is granted or gone; withdraw
        it on the way out unless granted (a task granted meanwhile is given back)."""
        granted = False
        try:
            while (left := until - time.monotonic()) > 0:
                sent = time.monotonic()
                # The server holds a poll at most half an attempt, so a poll that
                # simply waits is never mistaken for a dead node.
                hold = min(left, self.client.attempt_timeout / 2)
                status = await self.client.call(
                    "await_claim",
                    {"queue": self.name, "attempt_id": aid, "timeout": hold},
                    mutating=False,
                    timeout=hold + self.client.attempt_timeout,
                )
                if status["state"] == "claimed":
                    remaining = (status["expires_at"] - status["now"]) / 1000.0
                    granted = True
                    return AsyncTask(
                        self.client,
                        status,
                        sent,
                        remaining=remaining,
                        on_exit=on_exit,
                        on_lost=on_lost,
                        attached=attached,
                    )
                if status["state"] == "gone":
                    break
        finally:
            if not granted:
                await self.client._withdraw_until(lambda t: self._cancel_claim(aid, t), until)
        return None

    async def _cancel_claim(self, aid: str, timeout: float) -> None:
        """Withdraw the waiting claim ``aid``, or give back the task it was handed."""
        await self.client.call(
            "task_claim_cancel",
            {"queue": self.name, "attempt_id": aid},
            mutating=True,
            timeout=timeout,
        )

    async def _withdraw_unknown(self, args: dict[str, Any], pin: Pin, timeout: float) -> None:
        """Withdraw a claim whose outcome is unknown: its answer (the cached one if it
        applied, else it applies now), then a cancel of its attempt id."""
        until = time.monotonic() + timeout
        result = await self.client._call_pinned("task_claim", args, pin, timeout)
        if "aid" in result:
            left = max(until - time.monotonic(), self.client.attempt_timeout)
            await self._cancel_claim(str(result["aid"]), left)

    async def tasks(
        self,
        *,
        worker: str | None = None,
        wait: float = 30.0,
        lease_ttl: float | None = None,
        capabilities: Mapping[str, str] | None = None,
        session: Attachable | None = None,
        on_exit: str = "release",
    ) -> AsyncIterator[AsyncTask]:
        """Claim tasks one after another (``async for task in q.tasks(worker=...)``);
        ends when no task came within ``wait`` seconds. Enter each task (``async
        with task:``) to heartbeat it and end it on the way out."""
        while True:
            task = await self.claim(
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

    async def wait_result(self, task_id: str, *, timeout: float = 300.0) -> Any:
        """Block until the task is completed and return its result (the accepted
        completion's; exactly one is ever accepted). Raises ``TaskDeadError`` if it
        was dead-lettered (``detail['task']``), ``TaskNotFoundError`` if unknown, and
        ``TimeoutError_`` if it did not finish within ``timeout`` seconds."""
        until = time.monotonic() + timeout
        while True:
            left = until - time.monotonic()
            hold = max(0.0, min(left, self.client.attempt_timeout / 2))
            status = await self.client.call(
                "await_task",
                {"queue": self.name, "task_id": task_id, "timeout": hold},
                mutating=False,
                timeout=hold + self.client.attempt_timeout,
            )
            data = status["task"]
            if data["status"] == "completed":
                return decode_json(data.get("result"))
            if data["status"] == "dead":
                raise TaskDeadError(
                    f"task {task_id!r} was dead-lettered: {data.get('dead_reason', '')}",
                    {"task": data},
                )
            if left <= 0:
                raise TimeoutError_(
                    f"task {task_id!r} did not finish within {timeout} s (it is {data['status']})",
                    {"task": data},
                )

    async def get(self, task_id: str, *, timeout: float | None = None) -> TaskInfo:
        """The task's state (through the log). Raises ``TaskNotFoundError``."""
        result = await self.client.call(
            "task_get", {"queue": self.name, "task_id": task_id}, mutating=False, timeout=timeout
        )
        return task_info(result["task"])

    async def stats(self, *, timeout: float | None = None) -> QueueStats:
        """Counts of the queue (through the log)."""
        result = await self.client.call(
            "task_stats", {"queue": self.name}, mutating=False, timeout=timeout
        )
        return queue_stats(result["stats"])

    async def dead(self, *, limit: int = 100, timeout: float | None = None) -> list[TaskInfo]:
        """The dead-letter list, oldest death first, with every attempt's error."""
        result = await self.client.call(
            "task_dead", {"queue": self.name, "limit": limit}, mutating=False, timeout=timeout
        )
        return [task_info(item) for item in result["dead"]]

    async def retry(self, task_id: str, *, timeout: float | None = None) -> None:
        """Put a dead task back (ready now, a fresh attempt budget, no deadline).
        Raises ``InvalidArgumentError`` if it is not dead."""
        await self.client.call(
            "task_retry", {"queue": self.name, "task_id": task_id}, mutating=True, timeout=timeout
        )

    async def purge(self, task_id: str, *, timeout: float | None = None) -> None:
        """Forget a dead or completed task now (its dedup key is free again)."""
        await self.client.call(
            "task_purge", {"queue": self.name, "task_id": task_id}, mutating=True, timeout=timeout
        )
