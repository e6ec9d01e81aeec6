"""Leased task queues in the state machine: pure, deterministic, no I/O (issue 12).

A task is put into a named queue and handed to exactly one worker at a time. Each
hand-over is an *attempt* with its own attempt id (drawn by the leader, like a lease
id: only the claimer receives it) and its own fencing token, the store revision of the
claim, so tokens strictly increase per task (and store-wide). A completion, failure,
release or heartbeat is accepted only from the current attempt (``STALE_ATTEMPT``
otherwise), and exactly one completion per task is ever accepted.

Time: an attempt expires at ``expires_at`` in log time, like a lease, and every entry
first advances log time and processes what is due, in a fixed order (attempts, task
deadlines, delayed tasks becoming ready, waiting claims past their deadline, finished
tasks past their retention). Randomness: the retry backoff's jitter comes from the
entry's ``seed``, which the leader draws and stamps into every entry (like ``now``),
mixed with the task id and attempt number by BLAKE2b, so every replica computes the
same delay.

Claims: a claim offers the worker's ``caps`` (capabilities); a task's ``requires``
must be a subset. The claimer gets the best task it can take: highest priority, then
oldest put (FIFO). A claim that finds nothing and has ``wait`` joins the queue's
waiting claims (in the state, so they survive a leader change); a task that becomes
ready (put, released, backoff over, retried) goes in the same entry to the *first*
waiting claim that can take it, skipping claims that cannot, so a task only a few
workers can take is never stuck behind claims that will never take it.

Everything here is reached through ``LeaseStore.apply`` (store.py dispatches the
``task_*`` ops to ``TaskQueues``). docs/queues.md gives the semantics and the safety
argument.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..limits import (
    DEFAULT_QUEUE_TASKS,
    MAX_DEAD_LIST,
    MAX_ID_CHARS,
    MAX_OWNER_BYTES,
    MAX_QUEUE_NAME_BYTES,
    MAX_TASK_ATTEMPTS,
    MAX_TASK_BACKOFF_MS,
    MAX_TASK_CAP_BYTES,
    MAX_TASK_CAPABILITIES,
    MAX_TASK_DEDUP_BYTES,
    MAX_TASK_DELAY_MS,
    MAX_TASK_ERROR_BYTES,
    MAX_TASK_PAYLOAD_BYTES,
    MAX_TASK_REQUIRES,
    MAX_TASK_RESULT_BYTES,
    MAX_TTL_MS,
)
from .checks import MAX_PRIORITY, TASK_MUTATING_OPS, utf8_size, valid_int, valid_str
from .records import LeaseSession, Result, error

# ---------------------------------------------------------------------- limits

#: The hard caps live in ``limits`` (the protocol enforces the same ones).
MAX_PAYLOAD_BYTES = MAX_TASK_PAYLOAD_BYTES
MAX_RESULT_BYTES = MAX_TASK_RESULT_BYTES
MAX_ERROR_BYTES = MAX_TASK_ERROR_BYTES
MAX_QUEUE_BYTES = MAX_QUEUE_NAME_BYTES
MAX_ATTEMPTS = MAX_TASK_ATTEMPTS
MAX_REQUIRES = MAX_TASK_REQUIRES
MAX_CAPABILITIES = MAX_TASK_CAPABILITIES
MAX_CAP_BYTES = MAX_TASK_CAP_BYTES
MAX_DELAY_MS = MAX_TASK_DELAY_MS
MAX_DEDUP_BYTES = MAX_TASK_DEDUP_BYTES
#: Defaults of a put that does not say.
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_TASK_TTL_MS = 30_000
DEFAULT_BACKOFF_MS = 1_000
DEFAULT_RETENTION_MS = 3600 * 1000
#: Exponential backoff never waits longer than this (before jitter).
MAX_BACKOFF_MS = MAX_TASK_BACKOFF_MS
#: Waiting claims one queue may hold.
MAX_WAITING_CLAIMS = 10_000
#: Attempt history kept per task (newest): every counted attempt of a task fits,
#: releases beyond it are forgotten first.
MAX_HISTORY = 2 * MAX_ATTEMPTS

#: Task states.
READY, DELAYED, CLAIMED, COMPLETED, DEAD = "ready", "delayed", "claimed", "completed", "dead"


class Host(Protocol):
    """What the queues need from the store (``state.StoreState`` is one): log time,
    the revision counter, the events of this entry, and the lease sessions."""

    now: int
    revision: int
    events: list[dict[str, Any]]
    lease_sessions: dict[str, LeaseSession]


# --------------------------------------------------------------------- records


@dataclass(slots=True)
class Attempt:
    """The current hand-over of a task to one worker. ``session``: the lease session
    it is attached to ("" for none): it then lives exactly as long as the session."""

    aid: str
    tid: str
    worker: str
    token: int
    number: int
    started_at: int
    expires_at: int
    ttl_ms: int
    progress: float | None = None
    progress_at: int = 0
    session: str = ""
    principal: str = ""

    def to_plain(self) -> list[Any]:
        return [
            self.aid,
            self.tid,
            self.worker,
            self.token,
            self.number,
            self.started_at,
            self.expires_at,
            self.ttl_ms,
            self.progress,
            self.progress_at,
            self.session,
            self.principal,
        ]


@dataclass(slots=True)
class TaskRecord:
    """One task. ``history`` rows: ``[number, worker, token, started_at, ended_at,
    outcome, error]`` (outcome: completed, failed, expired, stalled, released,
    session, deadline)."""

    tid: str
    queue: str
    payload: str
    priority: int
    seq: int
    requires: tuple[tuple[str, str], ...]
    max_attempts: int
    ttl_ms: int
    progress_timeout_ms: int
    backoff_ms: int
    retention_ms: int
    deadline_at: int
    dedup_key: str
    created_at: int
    status: str
    ready_at: int = 0
    failures: int = 0
    attempts: int = 0
    history: list[list[Any]] = field(default_factory=list)
    result: str | None = None
    finished_at: int = 0
    dead_reason: str = ""
    principal: str = ""

    def to_plain(self) -> list[Any]:
        return [
            self.tid,
            self.queue,
            self.payload,
            self.priority,
            self.seq,
            [list(item) for item in self.requires],
            self.max_attempts,
            self.ttl_ms,
            self.progress_timeout_ms,
            self.backoff_ms,
            self.retention_ms,
            self.deadline_at,
            self.dedup_key,
            self.created_at,
            self.status,
            self.ready_at,
            self.failures,
            self.attempts,
            self.history,
            self.result,
            self.finished_at,
            self.dead_reason,
            self.principal,
        ]

    @classmethod
    def from_plain(cls, row: list[Any]) -> TaskRecord:
        task = cls(*row)
        task.requires = tuple((str(k), str(v)) for k, v in row[5])
        return task


@dataclass(slots=True)
class ClaimWaiter:
    """A claim waiting for a task it can take, until ``deadline`` (log time) or until
    its session ends."""

    aid: str
    queue: str
    worker: str
    caps: dict[str, str]
    ttl_ms: int
    deadline: int
    order: int
    session: str = ""
    principal: str = ""

    def to_plain(self) -> list[Any]:
        return [
            self.aid,
            self.queue,
            self.worker,
            sorted(self.caps.items()),
            self.ttl_ms,
            self.deadline,
            self.order,
            self.session,
            self.principal,
        ]


@dataclass(slots=True)
class QueueState:
    """One named queue: ready tasks by requirement set (a heap of ``(-priority, seq,
    tid)`` each, stale items skipped), waiting claims in arrival order, dead-letter
    list in death order, dedup keys, and counters."""

    name: str
    ready: dict[tuple[tuple[str, str], ...], list[tuple[int, int, str]]] = field(
        default_factory=dict
    )
    claimers: dict[str, None] = field(default_factory=dict)
    dead: dict[str, None] = field(default_factory=dict)
    dedup: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    #: Attempts started in this queue (claims granted), ever.
    claims_total: int = 0

    def empty(self) -> bool:
        return not self.claimers and not any(self.counts.values())


# ---------------------------------------------------------------------- checks


def _valid_map(value: Any, most: int) -> bool:
    return (
        isinstance(value, dict)
        and len(value) <= most
        and all(
            valid_str(k, MAX_CAP_BYTES) and isinstance(v, str) and utf8_size(v) <= MAX_CAP_BYTES
            for k, v in value.items()
        )
    )


def _valid_progress(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -(2**62) <= value <= 2**62
    return isinstance(value, float) and math.isfinite(value)


_TID_OPS = frozenset(
    {
        "task_put",
        "task_get",
        "task_heartbeat",
        "task_complete",
        "task_fail",
        "task_release",
        "task_retry",
        "task_purge",
    }
)


def check_task_args(op: str, entry: dict[str, Any]) -> str | None:
    """Why a ``task_*`` entry is malformed, or None (structural only)."""
    if not valid_str(entry.get("queue"), MAX_QUEUE_BYTES):
        return f"'queue' must be a non-empty string of at most {MAX_QUEUE_BYTES} bytes"
    if op in _TID_OPS and not valid_str(entry.get("tid"), MAX_ID_CHARS):
        return "'tid' must be a non-empty string"
    if op in (
        "task_claim",
        "task_heartbeat",
        "task_complete",
        "task_fail",
        "task_release",
        "task_claim_cancel",
        "task_claim_status",
    ) and not valid_str(entry.get("aid"), MAX_ID_CHARS):
        return "'aid' must be a non-empty string"
    for name, low, high in (
        ("delay", 0, MAX_DELAY_MS),
        ("deadline", 1, MAX_DELAY_MS),
        ("retention", 0, MAX_DELAY_MS),
        ("backoff", 0, MAX_BACKOFF_MS),
        ("retry_after", 0, MAX_DELAY_MS),
        ("wait", 0, MAX_TTL_MS),
        ("ttl", 1, MAX_TTL_MS),
        ("progress_timeout", 1, MAX_TTL_MS),
        ("max_attempts", 1, MAX_ATTEMPTS),
        ("priority", -MAX_PRIORITY, MAX_PRIORITY),
        ("limit", 1, MAX_DEAD_LIST),
    ):
        if name in entry and not valid_int(entry[name], low, high):
            return f"'{name}' must be an integer from {low} to {high}"
    if op == "task_put":
        payload = entry.get("payload")
        if not isinstance(payload, str) or utf8_size(payload) > MAX_PAYLOAD_BYTES:
            return f"'payload' must be a string of at most {MAX_PAYLOAD_BYTES} bytes"
        if "dedup_key" in entry and not valid_str(entry["dedup_key"], MAX_DEDUP_BYTES):
            return f"'dedup_key' must be a non-empty string of at most {MAX_DEDUP_BYTES} bytes"
        if "requires" in entry and not _valid_map(entry["requires"], MAX_REQUIRES):
            return f"'requires' must map at most {MAX_REQUIRES} names to strings"
    if op == "task_claim":
        if not valid_str(entry.get("worker"), MAX_OWNER_BYTES):
            return "'worker' must be a non-empty string"
        if "caps" in entry and not _valid_map(entry["caps"], MAX_CAPABILITIES):
            return f"'caps' must map at most {MAX_CAPABILITIES} names to strings"
        if "session" in entry:
            if not valid_str(entry["session"], MAX_ID_CHARS):
                return "'session' must be a non-empty string"
            if "ttl" in entry:
                return "'ttl' must be absent: an attached claim lives as long as its session"
    if op == "task_heartbeat" and "progress" in entry and not _valid_progress(entry["progress"]):
        return "'progress' must be a finite number"
    if op == "task_complete" and "result" in entry:
        result = entry["result"]
        if not isinstance(result, str) or utf8_size(result) > MAX_RESULT_BYTES:
            return f"'result' must be a string of at most {MAX_RESULT_BYTES} bytes"
    if op == "task_fail" and "error" in entry:
        text = entry["error"]
        if not isinstance(text, str) or utf8_size(text) > MAX_ERROR_BYTES:
            return f"'error' must be a string of at most {MAX_ERROR_BYTES} bytes"
    return None


# ------------------------------------------------------------------- the model


def _jitter(seed: int, tid: str, number: int) -> int:
    """A deterministic fraction (parts per million) from the entry's leader-drawn
    ``seed``, different per task and attempt."""
    digest = hashlib.blake2b(f"{seed}:{tid}:{number}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 1_000_000


class TaskQueues:
    """Every queue of one store. Single-threaded (``apply``); the reads are meant to
    go through the log (the server proposes ``task_get``/``task_stats``/``task_dead``),
    except ``claim_status`` and ``task_status``, which only look up dicts and copy, so
    they are also safe from another thread while ``apply`` runs."""

    def __init__(self) -> None:
        self.queues: dict[str, QueueState] = {}
        self.tasks: dict[str, TaskRecord] = {}
        #: Live attempts by attempt id, and waiting claims by attempt id.
        self.attempts: dict[str, Attempt] = {}
        self.claims: dict[str, ClaimWaiter] = {}
        #: tid -> id of its live attempt.
        self.current: dict[str, str] = {}
        #: Lease session id -> attempt ids (live attempts and waiting claims) attached.
        self.by_session: dict[str, dict[str, None]] = {}
        #: Put order (FIFO within a priority) and claim arrival order.
        self.order = 0
        #: Tasks not completed (ready, delayed, claimed, dead): bounds the token
        #: headroom one entry may need.
        self.open = 0
        # Heaps, stale items skipped when popped (rebuilt on restore):
        self._expiries: list[tuple[int, str]] = []  # (expires_at, aid)
        self._delayed: list[tuple[int, int, str]] = []  # (ready_at, seq, tid)
        self._deadlines: list[tuple[int, str]] = []  # (deadline_at, tid)
        self._claim_deadlines: list[tuple[int, str]] = []  # (deadline, aid)
        self._drops: list[tuple[int, str]] = []  # (finished_at + retention, tid)
        #: The current entry's leader-drawn seed (for backoff jitter). Not state.
        self.seed = 0

    # ------------------------------------------------------------- bookkeeping

    def headroom(self) -> int:
        """Revisions one entry may create here at most: each open task can expire,
        be dead-lettered or handed to a waiting claim in the same entry."""
        return 3 * (self.open + len(self.claims))

    def next_deadline(self) -> int | None:
        """Earliest log time at which something here is due (a hint for the leader's
        tick)."""
        heads = [
            h[0][0]
            for h in (
                self._expiries,
                self._delayed,
                self._deadlines,
                self._claim_deadlines,
                self._drops,
            )
            if h
        ]
        return min(heads) if heads else None

    def reused_id(self, op: str, entry: dict[str, Any]) -> str | None:
        """The leader draws fresh task and attempt ids; a known one is a bug or forged."""
        if op == "task_put" and entry["tid"] in self.tasks:
            return "task id already in use"
        if op == "task_claim" and (entry["aid"] in self.attempts or entry["aid"] in self.claims):
            return "attempt id already in use"
        return None

    def _queue(self, name: str) -> QueueState:
        queue = self.queues.get(name)
        if queue is None:
            queue = self.queues[name] = QueueState(name)
        return queue

    def _forget_if_empty(self, queue: QueueState) -> None:
        if queue.empty() and not queue.dedup:
            self.queues.pop(queue.name, None)

    @staticmethod
    def _move(queue: QueueState, old: str | None, new: str | None) -> None:
        counts = queue.counts
        if old is not None:
            counts[old] = counts.get(old, 0) - 1
        if new is not None:
            counts[new] = counts.get(new, 0) + 1

    def _event(self, host: Host, kind: str, task: TaskRecord, **extra: Any) -> None:
        """A task change on the watch stream: one revision per event (the watch
        history relies on contiguous revisions). ``key`` is ``queue:<name>/<tid>``,
        ``owner`` the worker, ``token`` the attempt's token, ``value`` the task's
        status after the change, ``units`` the attempt number; ``lease_id`` (the
        attempt id) and ``tid`` are for the server's long-polls, never shown."""
        host.revision += 1
        host.events.append(
            {
                "type": kind,
                "key": f"queue:{task.queue}/{task.tid}",
                "owner": extra.get("worker", ""),
                "token": extra.get("token", 0),
                "revision": host.revision,
                "value": task.status,
                "units": extra.get("number", task.attempts),
                "lease_id": extra.get("aid", ""),
                "tid": task.tid,
            }
        )

    # ------------------------------------------------------------------ apply

    def mutate(self, host: Host, entry: dict[str, Any]) -> Result:
        """Apply one mutating ``task_*`` entry (already checked and admitted by the
        dedup table); log time has been advanced."""
        op: str = entry["op"]
        if op == "task_put":
            return self._put(host, entry)
        if op == "task_claim":
            return self._claim(host, entry)
        if op == "task_claim_cancel":
            return self._claim_cancel(host, entry)
        if op in ("task_retry", "task_purge"):
            return self._dead_op(host, op, entry)
        attempt = self._current(entry)
        if not isinstance(attempt, Attempt):
            return attempt
        task = self.tasks[attempt.tid]
        if op == "task_heartbeat":
            return self._heartbeat(host, task, attempt, entry)
        if op == "task_complete":
            self._end_attempt(host, attempt, "completed", "")
            task.result = entry.get("result", "")
            self._finish(host, task, COMPLETED)
            self._event(host, "task_complete", task, worker=attempt.worker, token=attempt.token)
            return {"ok": True, "tid": task.tid, "token": attempt.token, "revision": host.revision}
        if op == "task_release":
            self._give_back(host, task, attempt)
            return {"ok": True, "tid": task.tid, "revision": host.revision}
        # task_fail
        self._end_attempt(host, attempt, "failed", entry.get("error", ""))
        self._failed(host, task, attempt, entry.get("retry_after"), "task_fail")
        return {
            "ok": True,
            "tid": task.tid,
            "status": task.status,
            "ready_at": task.ready_at if task.status == DELAYED else None,
            "revision": host.revision,
        }

    def _put(self, host: Host, entry: dict[str, Any]) -> Result:
        name: str = entry["queue"]
        queue = self.queues.get(name)
        dedup_key: str = entry.get("dedup_key", "")
        if dedup_key and queue is not None and dedup_key in queue.dedup:
            tid = queue.dedup[dedup_key]
            return {"ok": True, "tid": tid, "duplicate": True, "status": self.tasks[tid].status}
        quota: int = entry.get("quota", DEFAULT_QUEUE_TASKS)
        held = (
            0
            if queue is None
            else len(queue.dead) + sum(queue.counts.get(s, 0) for s in (READY, DELAYED, CLAIMED))
        )
        if held >= quota:
            return error(
                "QUOTA_EXCEEDED",
                f"queue {name!r} holds {held} tasks (ready, delayed, claimed or dead); its "
                f"quota is {quota}",
                queue=name,
                tasks=held,
                quota=quota,
            )
        queue = self._queue(name)
        self.order += 1
        now = host.now
        delay: int = entry.get("delay", 0)
        deadline: int = entry.get("deadline", 0)
        task = TaskRecord(
            tid=entry["tid"],
            queue=name,
            payload=entry["payload"],
            priority=entry.get("priority", 0),
            seq=self.order,
            requires=tuple(sorted(entry.get("requires", {}).items())),
            max_attempts=entry.get("max_attempts", DEFAULT_MAX_ATTEMPTS),
            ttl_ms=entry.get("ttl", DEFAULT_TASK_TTL_MS),
            progress_timeout_ms=entry.get("progress_timeout", 0),
            backoff_ms=entry.get("backoff", DEFAULT_BACKOFF_MS),
            retention_ms=entry.get("retention", DEFAULT_RETENTION_MS),
            deadline_at=now + deadline if deadline else 0,
            dedup_key=dedup_key,
            created_at=now,
            status=DELAYED,
            ready_at=now + delay,
            principal=entry.get("principal", ""),
        )
        self.tasks[task.tid] = task
        self.open += 1
        if dedup_key:
            queue.dedup[dedup_key] = task.tid
        if task.deadline_at:
            heapq.heappush(self._deadlines, (task.deadline_at, task.tid))
        if delay > 0:
            self._move(queue, None, DELAYED)
            heapq.heappush(self._delayed, (task.ready_at, task.seq, task.tid))
            self._event(host, "task_put", task)
        else:
            # The put's event comes before the claim that may take it at once.
            task.status = READY
            self._move(queue, None, READY)
            self._event(host, "task_put", task)
            self._make_ready(host, task)
        return {"ok": True, "tid": task.tid, "status": task.status, "revision": host.revision}

    def _claim(self, host: Host, entry: dict[str, Any]) -> Result:
        name: str = entry["queue"]
        principal: str = entry.get("principal", "")
        sid: str = entry.get("session", "")
        if sid:
            session = host.lease_sessions.get(sid)
            if session is None:
                return error("SESSION_NOT_FOUND", f"lease session {sid!r} does not exist")
            if session.principal != principal:
                return error(
                    "PERMISSION_DENIED", f"the lease session {sid!r} belongs to another principal"
                )
        caps: dict[str, str] = entry.get("caps", {})
        queue = self.queues.get(name)
        task = self._best_ready(queue, caps) if queue is not None else None
        if task is not None:
            attempt = self._start(host, task, entry["aid"], entry, sid, principal)
            return self.claim_result(host, attempt)
        wait: int = entry.get("wait", 0)
        if wait <= 0:
            return {"ok": True, "claimed": False, "queue": name, "now": host.now}
        queue = self._queue(name)
        if len(queue.claimers) >= MAX_WAITING_CLAIMS:
            return error(
                "QUOTA_EXCEEDED",
                f"queue {name!r} already has {MAX_WAITING_CLAIMS} waiting claims",
            )
        self.order += 1
        waiter = ClaimWaiter(
            aid=entry["aid"],
            queue=name,
            worker=entry["worker"],
            caps=dict(caps),
            ttl_ms=entry.get("ttl", 0),
            deadline=host.now + wait,
            order=self.order,
            session=sid,
            principal=principal,
        )
        self.claims[waiter.aid] = waiter
        queue.claimers[waiter.aid] = None
        if sid:
            self.by_session.setdefault(sid, {})[waiter.aid] = None
        heapq.heappush(self._claim_deadlines, (waiter.deadline, waiter.aid))
        return {
            "ok": True,
            "claimed": False,
            "queued": True,
            "queue": name,
            "aid": waiter.aid,
            "deadline": waiter.deadline,
            "now": host.now,
        }

    def _claim_cancel(self, host: Host, entry: dict[str, Any]) -> Result:
        """Withdraw a waiting claim; if it was granted meanwhile, give the task back
        (a release: no attempt counted). Unknown ids answer ``cancelled: False``."""
        aid: str = entry["aid"]
        principal = entry.get("principal", "")
        waiter = self.claims.get(aid)
        if waiter is not None and waiter.queue == entry["queue"]:
            if waiter.principal != principal:
                return error("PERMISSION_DENIED", "the claim belongs to another principal")
            self._drop_claim(host, waiter, "cancelled")
            return {"ok": True, "cancelled": True}
        attempt = self.attempts.get(aid)
        if attempt is not None and self.tasks[attempt.tid].queue == entry["queue"]:
            if attempt.principal != principal:
                return error("PERMISSION_DENIED", "the attempt belongs to another principal")
            task = self.tasks[attempt.tid]
            self._give_back(host, task, attempt)
            return {"ok": True, "cancelled": True, "released": task.tid}
        return {"ok": True, "cancelled": False}

    def _give_back(self, host: Host, task: TaskRecord, attempt: Attempt) -> None:
        """A release: the attempt ends without counting against ``max_attempts`` and
        the task is ready again at its old place (its put order)."""
        self._end_attempt(host, attempt, "released", "")
        queue = self._queue(task.queue)
        self._move(queue, task.status, READY)
        task.status = READY
        self._event(
            host,
            "task_release",
            task,
            worker=attempt.worker,
            token=attempt.token,
            number=attempt.number,
        )
        self._make_ready(host, task)

    def _current(self, entry: dict[str, Any]) -> Attempt | Result:
        """The live attempt ``entry`` names, if it is its task's current one."""
        tid: str = entry["tid"]
        task = self.tasks.get(tid)
        if task is None or task.queue != entry["queue"]:
            return error(
                "TASK_NOT_FOUND",
                f"queue {entry['queue']!r} has no task {tid!r} (never put, purged, or "
                "dropped after its retention)",
            )
        attempt = self.attempts.get(entry["aid"])
        if attempt is None or attempt.tid != tid:
            current = self.attempts.get(self.current.get(tid, ""))
            detail: dict[str, Any] = {"tid": tid, "status": task.status}
            if current is not None:
                detail["current_token"] = current.token
            return error(
                "STALE_ATTEMPT",
                f"the attempt is not the current one of task {tid!r} (status {task.status}: "
                "it expired, failed, was released, or the task was completed)",
                **detail,
            )
        if attempt.principal != entry.get("principal", ""):
            return error(
                "PERMISSION_DENIED", f"the attempt on task {tid!r} belongs to another principal"
            )
        return attempt

    def _heartbeat(
        self, host: Host, task: TaskRecord, attempt: Attempt, entry: dict[str, Any]
    ) -> Result:
        """Extend the attempt by its TTL, unless progress-aware expiry stops it: with a
        ``progress_timeout``, only a heartbeat within that long of the last advance of
        ``progress`` extends, and never past ``progress_at + progress_timeout``. An
        attempt is never shortened."""
        now = host.now
        progress = entry.get("progress")
        if progress is not None and (attempt.progress is None or progress > attempt.progress):
            attempt.progress = progress
            attempt.progress_at = now
        stalled = False
        if attempt.session:
            target = attempt.expires_at  # lives by its session's keep-alive
        else:
            target = now + attempt.ttl_ms
            if task.progress_timeout_ms:
                cap = attempt.progress_at + task.progress_timeout_ms
                if cap < target:
                    target = cap
                    stalled = now >= cap
        if target > attempt.expires_at:
            attempt.expires_at = target
            heapq.heappush(self._expiries, (target, attempt.aid))
        return {
            "ok": True,
            "tid": task.tid,
            "token": attempt.token,
            "expires_at": attempt.expires_at,
            "ttl": attempt.ttl_ms,
            "stalled": stalled,
            "now": now,
        }

    def _dead_op(self, host: Host, op: str, entry: dict[str, Any]) -> Result:
        tid: str = entry["tid"]
        task = self.tasks.get(tid)
        if task is None or task.queue != entry["queue"]:
            return error("TASK_NOT_FOUND", f"queue {entry['queue']!r} has no task {tid!r}")
        queue = self._queue(task.queue)
        if op == "task_retry":
            if task.status != DEAD:
                return error(
                    "INVALID_ARGUMENT",
                    f"task {tid!r} is {task.status}, not dead: only a dead task is retried",
                    status=task.status,
                )
            del queue.dead[tid]
            task.failures = 0
            task.dead_reason = ""
            task.deadline_at = 0  # a retried task gets a fresh budget and no deadline
            self._event(host, "task_retry", task)
            self._make_ready(host, task)
            return {"ok": True, "tid": tid, "status": task.status, "revision": host.revision}
        if task.status not in (DEAD, COMPLETED):
            return error(
                "INVALID_ARGUMENT",
                f"task {tid!r} is {task.status}: only a dead or completed task is purged",
                status=task.status,
            )
        self._event(host, "task_purge", task)
        self._remove(task)
        return {"ok": True, "tid": tid, "revision": host.revision}

    # -------------------------------------------------------------- internals

    def _best_ready(self, queue: QueueState, caps: dict[str, str]) -> TaskRecord | None:
        """Take the best ready task ``caps`` satisfies (highest priority, then oldest
        put) off its heap, or None."""
        best: tuple[int, int, str] | None = None
        best_heap: list[tuple[int, int, str]] | None = None
        for requires, heap in list(queue.ready.items()):
            while heap and self._stale_ready(heap[0]):
                heapq.heappop(heap)
            if not heap:
                del queue.ready[requires]
                continue
            if not all(caps.get(k) == v for k, v in requires):
                continue
            if best is None or heap[0] < best:
                best, best_heap = heap[0], heap
        if best is None or best_heap is None:
            return None
        heapq.heappop(best_heap)
        return self.tasks[best[2]]

    def _stale_ready(self, item: tuple[int, int, str]) -> bool:
        task = self.tasks.get(item[2])
        return task is None or task.status != READY

    def _make_ready(self, host: Host, task: TaskRecord) -> None:
        """``task`` can be claimed now: hand it to the first waiting claim that can
        take it (in arrival order), in this entry; else it waits in its heap."""
        queue = self._queue(task.queue)
        self._move(queue, task.status, READY)
        task.status = READY
        for aid in list(queue.claimers):
            waiter = self.claims[aid]
            if waiter.deadline <= host.now:
                self._drop_claim(host, waiter, "deadline")
                continue
            if waiter.session and waiter.session not in host.lease_sessions:
                self._drop_claim(host, waiter, "session")
                continue
            if all(waiter.caps.get(k) == v for k, v in task.requires):
                self._drop_claim(host, waiter, "granted")
                entry: dict[str, Any] = {"worker": waiter.worker}
                if waiter.ttl_ms:
                    entry["ttl"] = waiter.ttl_ms
                self._start(host, task, aid, entry, waiter.session, waiter.principal)
                return
        heap = queue.ready.setdefault(task.requires, [])
        heapq.heappush(heap, (-task.priority, task.seq, task.tid))
        if len(heap) > 64 and len(heap) > 4 * max(1, queue.counts.get(READY, 0)):
            queue.ready[task.requires] = [i for i in heap if not self._stale_ready(i)]
            heapq.heapify(queue.ready[task.requires])

    def _drop_claim(self, host: Host, waiter: ClaimWaiter, reason: str) -> None:
        del self.claims[waiter.aid]
        queue = self.queues.get(waiter.queue)
        if queue is not None:
            queue.claimers.pop(waiter.aid, None)
        if waiter.session:
            self._detach(waiter.session, waiter.aid)
        if reason != "granted":
            # For the server's long-poll only (no revision: no state a watch shows).
            gone = {"type": "task_claim_gone", "lease_id": waiter.aid, "reason": reason}
            host.events.append(gone)
            if queue is not None:
                self._forget_if_empty(queue)

    def _detach(self, sid: str, aid: str) -> None:
        attached = self.by_session.get(sid)
        if attached is not None:
            attached.pop(aid, None)
            if not attached:
                del self.by_session[sid]

    def _start(
        self,
        host: Host,
        task: TaskRecord,
        aid: str,
        entry: dict[str, Any],
        sid: str,
        principal: str,
    ) -> Attempt:
        """Hand ``task`` to a worker: a new attempt, token = the new revision."""
        queue = self._queue(task.queue)
        self._move(queue, task.status, CLAIMED)
        task.status = CLAIMED
        task.attempts += 1
        queue.claims_total += 1
        ttl: int = entry.get("ttl", task.ttl_ms)
        session = host.lease_sessions.get(sid) if sid else None
        now = host.now
        attempt = Attempt(
            aid=aid,
            tid=task.tid,
            worker=entry["worker"],
            token=host.revision + 1,  # the revision ``_event`` below creates
            number=task.attempts,
            started_at=now,
            expires_at=session.expires_at if session is not None else now + ttl,
            ttl_ms=session.ttl_ms if session is not None else ttl,
            progress_at=now,
            session=sid if session is not None else "",
            principal=principal,
        )
        if task.progress_timeout_ms and session is None:
            attempt.expires_at = min(attempt.expires_at, now + task.progress_timeout_ms)
        self.attempts[aid] = attempt
        self.current[task.tid] = aid
        if attempt.session:
            self.by_session.setdefault(attempt.session, {})[aid] = None
        heapq.heappush(self._expiries, (attempt.expires_at, aid))
        self._event(
            host,
            "task_claim",
            task,
            worker=attempt.worker,
            token=attempt.token,
            number=attempt.number,
            aid=aid,
        )
        return attempt

    def _end_attempt(self, host: Host, attempt: Attempt, outcome: str, why: str) -> None:
        """The attempt is over (``outcome``); its task's status is set by the caller."""
        del self.attempts[attempt.aid]
        self.current.pop(attempt.tid, None)
        if attempt.session:
            self._detach(attempt.session, attempt.aid)
        task = self.tasks[attempt.tid]
        row = [attempt.number, attempt.worker, attempt.token, attempt.started_at, host.now]
        task.history.append([*row, outcome, why])
        if len(task.history) > MAX_HISTORY:
            # Forget the oldest release first (it did not count), else the oldest.
            drop = next((i for i, row in enumerate(task.history) if row[5] == "released"), 0)
            del task.history[drop]

    def _failed(
        self,
        host: Host,
        task: TaskRecord,
        attempt: Attempt,
        retry_after: int | None,
        kind: str,
    ) -> None:
        """A counted attempt failed (or expired): retry after a backoff, or
        dead-letter the task once it used all its attempts or its deadline passed."""
        task.failures += 1
        now = host.now
        queue = self._queue(task.queue)
        if task.failures >= task.max_attempts:
            self._kill(task, f"failed {task.failures} of {task.max_attempts} attempts")
        elif task.deadline_at and task.deadline_at <= now:
            self._kill(task, "deadline passed")
        else:
            if retry_after is not None:
                delay = retry_after
            else:
                # Exponential backoff, "equal jitter": half fixed, half drawn.
                base = min(MAX_BACKOFF_MS, task.backoff_ms * 2 ** min(task.failures - 1, 30))
                half = base // 2
                drawn = _jitter(self.seed, task.tid, attempt.number)
                delay = base - half + half * drawn // 1_000_000
            self._move(queue, task.status, DELAYED)
            task.status = DELAYED
            task.ready_at = now + delay
            if delay > 0:
                heapq.heappush(self._delayed, (task.ready_at, task.seq, task.tid))
        self._event(
            host, kind, task, worker=attempt.worker, token=attempt.token, number=attempt.number
        )
        if task.status == DELAYED and task.ready_at <= now:
            self._make_ready(host, task)

    def _kill(self, task: TaskRecord, why: str) -> None:
        queue = self._queue(task.queue)
        self._move(queue, task.status, DEAD)
        task.status = DEAD
        task.dead_reason = why
        queue.dead[task.tid] = None

    def _finish(self, host: Host, task: TaskRecord, status: str) -> None:
        queue = self._queue(task.queue)
        self._move(queue, task.status, status)
        task.status = status
        task.finished_at = host.now
        self.open -= 1
        heapq.heappush(self._drops, (host.now + task.retention_ms, task.tid))

    def _remove(self, task: TaskRecord) -> None:
        """Forget a dead or completed task (purge, or retention over)."""
        queue = self._queue(task.queue)
        if task.status == DEAD:
            self.open -= 1
            queue.dead.pop(task.tid, None)
        self._move(queue, task.status, None)
        del self.tasks[task.tid]
        if task.dedup_key and queue.dedup.get(task.dedup_key) == task.tid:
            del queue.dedup[task.dedup_key]
        self._forget_if_empty(queue)

    # ------------------------------------------------------------------- time

    def advance(self, host: Host) -> None:
        """Process what is due at ``host.now``, in a fixed order: attempts past their
        expiry (``(expires_at, aid)`` order), tasks past their deadline, delayed tasks
        whose time came (``(ready_at, put order)``), waiting claims past their
        deadline, finished tasks past their retention."""
        now = host.now
        heap = self._expiries
        while heap and heap[0][0] <= now:
            expires_at, aid = heapq.heappop(heap)
            attempt = self.attempts.get(aid)
            if attempt is not None and attempt.expires_at == expires_at:
                self._expire(host, attempt)
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            deadline_at, tid = heapq.heappop(deadlines)
            task = self.tasks.get(tid)
            if task is None or task.deadline_at != deadline_at:
                continue
            if task.status in (READY, DELAYED, CLAIMED):
                self._past_deadline(host, task)
        delayed = self._delayed
        while delayed and delayed[0][0] <= now:
            ready_at, _, tid = heapq.heappop(delayed)
            task = self.tasks.get(tid)
            if task is not None and task.status == DELAYED and task.ready_at == ready_at:
                self._make_ready(host, task)
        waits = self._claim_deadlines
        while waits and waits[0][0] <= now:
            deadline, aid = heapq.heappop(waits)
            waiter = self.claims.get(aid)
            if waiter is not None and waiter.deadline == deadline:
                self._drop_claim(host, waiter, "deadline")
        drops = self._drops
        while drops and drops[0][0] <= now:
            drop_at, tid = heapq.heappop(drops)
            task = self.tasks.get(tid)
            if (
                task is not None
                and task.status == COMPLETED
                and task.finished_at + task.retention_ms == drop_at
            ):
                self._remove(task)  # memory stays bounded: no event, no revision
        if len(heap) > 64 and len(heap) > 4 * len(self.attempts):
            self._expiries = [(a.expires_at, a.aid) for a in self.attempts.values()]
            heapq.heapify(self._expiries)

    def _expire(self, host: Host, attempt: Attempt) -> None:
        task = self.tasks[attempt.tid]
        stalled = (
            task.progress_timeout_ms > 0
            and not attempt.session
            and attempt.progress_at + task.progress_timeout_ms <= host.now
        )
        if stalled:
            outcome, why = "stalled", f"no progress for {task.progress_timeout_ms} ms"
        else:
            outcome, why = "expired", "attempt lease expired (no heartbeat within its TTL)"
        self._end_attempt(host, attempt, outcome, why)
        self._failed(host, task, attempt, None, "task_expire")

    def _past_deadline(self, host: Host, task: TaskRecord) -> None:
        worker, token = "", 0
        aid = self.current.get(task.tid)
        if aid is not None:
            attempt = self.attempts[aid]
            worker, token = attempt.worker, attempt.token
            self._end_attempt(host, attempt, "deadline", "task deadline passed")
        self._kill(task, "deadline passed")
        self._event(host, "task_dead", task, worker=worker, token=token)

    def session_kept(self, host: Host, session: LeaseSession) -> None:
        """A keep-alive extended ``session``: so are its attached attempts."""
        for aid in self.by_session.get(session.session_id, {}):
            attempt = self.attempts.get(aid)
            if attempt is not None and session.expires_at > attempt.expires_at:
                attempt.expires_at = session.expires_at
                attempt.ttl_ms = session.ttl_ms
                heapq.heappush(self._expiries, (attempt.expires_at, aid))

    def session_ended(self, host: Host, sid: str) -> None:
        """``sid`` expired or was closed: its waiting claims leave, and its attempts
        end as failed attempts (the worker is gone), in attach order."""
        for aid in list(self.by_session.get(sid, {})):
            waiter = self.claims.get(aid)
            if waiter is not None:
                self._drop_claim(host, waiter, "session")
                continue
            attempt = self.attempts.get(aid)
            if attempt is not None:
                task = self.tasks[attempt.tid]
                self._end_attempt(host, attempt, "session", "its lease session ended")
                self._failed(host, task, attempt, None, "task_expire")
        self.by_session.pop(sid, None)

    # ------------------------------------------------------------------ reads

    def claim_result(self, host: Host, attempt: Attempt) -> Result:
        """What the claimer receives: the task and its attempt (with the attempt id,
        a capability only the claimer sees)."""
        return {"ok": True, **self._claim_view(self.tasks[attempt.tid], attempt), "now": host.now}

    def claim_status(self, queue: str, aid: str, now: int) -> dict[str, Any]:
        """State of a claim, for whoever knows its attempt id: ``waiting``,
        ``claimed`` (with the task, as ``claim_result``) or ``gone``. Dict look-ups
        only: safe from another thread while ``apply`` runs."""
        waiter = self.claims.get(aid)
        if waiter is not None and waiter.queue == queue and waiter.deadline > now:
            return {"state": "waiting", "deadline": waiter.deadline}
        attempt = self.attempts.get(aid)
        task = self.tasks.get(attempt.tid) if attempt is not None else None
        if (
            attempt is not None
            and task is not None
            and task.queue == queue
            and attempt.expires_at > now
        ):
            return {"state": "claimed", **self._claim_view(task, attempt), "now": now}
        return {"state": "gone"}

    @staticmethod
    def _claim_view(task: TaskRecord, attempt: Attempt) -> dict[str, Any]:
        return {
            "claimed": True,
            "queue": task.queue,
            "tid": task.tid,
            "aid": attempt.aid,
            "payload": task.payload,
            "token": attempt.token,
            "attempt": attempt.number,
            "worker": attempt.worker,
            "ttl": attempt.ttl_ms,
            "expires_at": attempt.expires_at,
            "progress_timeout": task.progress_timeout_ms,
            "session": attempt.session,
        }

    def task_info(self, queue: str, tid: str, now: int) -> dict[str, Any] | None:
        """A task as anyone with read access sees it (never an attempt id), or None.
        Copies what it returns; safe from another thread while ``apply`` runs."""
        task = self.tasks.get(tid)
        if task is None or task.queue != queue:
            return None
        info: dict[str, Any] = {
            "tid": task.tid,
            "queue": task.queue,
            "status": task.status,
            "payload": task.payload,
            "priority": task.priority,
            "requires": dict(task.requires),
            "attempts": task.attempts,
            "failures": task.failures,
            "max_attempts": task.max_attempts,
            "created_at": task.created_at,
            "history": [list(row) for row in list(task.history)],
        }
        if task.status == DELAYED:
            info["ready_at"] = task.ready_at
        if task.deadline_at:
            info["deadline_at"] = task.deadline_at
        if task.dedup_key:
            info["dedup_key"] = task.dedup_key
        if task.status == COMPLETED:
            info["result"] = task.result
            info["finished_at"] = task.finished_at
        if task.status == DEAD:
            info["dead_reason"] = task.dead_reason
        attempt = self.attempts.get(self.current.get(tid, ""))
        if attempt is not None:
            info["worker"] = attempt.worker
            info["token"] = attempt.token
            info["expires_at"] = attempt.expires_at
            info["progress"] = attempt.progress
        return info

    def read(self, host: Host, entry: dict[str, Any]) -> Result:
        """``task_get``, ``task_stats``, ``task_dead`` and ``task_claim_status``
        through the log."""
        op: str = entry["op"]
        name: str = entry["queue"]
        now = host.now
        if op == "task_get":
            info = self.task_info(name, entry["tid"], now)
            if info is None:
                return error(
                    "TASK_NOT_FOUND",
                    f"queue {name!r} has no task {entry['tid']!r} (never put, purged, or "
                    "dropped after its retention)",
                )
            return {"ok": True, "task": info, "now": now}
        if op == "task_claim_status":
            return {"ok": True, **self.claim_status(name, entry["aid"], now), "now": now}
        if op == "task_dead":
            queue = self.queues.get(name)
            limit: int = entry.get("limit", 100)
            tids = list(queue.dead)[:limit] if queue is not None else []
            dead = [self.task_info(name, tid, now) for tid in tids]
            return {"ok": True, "dead": [d for d in dead if d is not None], "now": now}
        return {"ok": True, "stats": self.stats(name, now), "now": now}

    def stats(self, name: str, now: int) -> dict[str, Any]:
        """Counts of one queue (zeros for an unknown one) and the age (ms) of its
        oldest ready task. O(ready tasks): meant for reads through the log."""
        queue = self.queues.get(name)
        counts = queue.counts if queue is not None else {}
        oldest = None
        if queue is not None:
            for heap in queue.ready.values():
                for item in heap:
                    task = self.tasks.get(item[2])
                    if task is not None and task.status == READY:
                        age = now - task.created_at
                        oldest = age if oldest is None or age > oldest else oldest
        return {
            "queue": name,
            "ready": counts.get(READY, 0),
            "delayed": counts.get(DELAYED, 0),
            "claimed": counts.get(CLAIMED, 0),
            "dead": counts.get(DEAD, 0),
            "completed": counts.get(COMPLETED, 0),
            "waiting_claims": len(queue.claimers) if queue is not None else 0,
            "attempts": queue.claims_total if queue is not None else 0,
            "oldest_ready_age": oldest,
        }

    # -------------------------------------------------------------- snapshots

    def to_plain(self) -> dict[str, Any]:
        queues = [[q.name, q.claims_total, sorted(q.dedup.items())] for q in self.queues.values()]
        return {
            "order": self.order,
            "queues": queues,
            "tasks": [t.to_plain() for t in self.tasks.values()],
            "attempts": [a.to_plain() for a in self.attempts.values()],
            "claims": [w.to_plain() for w in self.claims.values()],
            "dead": [[q.name, list(q.dead)] for q in self.queues.values() if q.dead],
            # Attach order matters (a session's end processes it in this order).
            "by_session": [[sid, list(aids)] for sid, aids in self.by_session.items()],
        }

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> TaskQueues:
        """Rebuild from ``to_plain`` output (the heaps and counters are derived)."""
        tq = cls()
        tq.order = data["order"]
        for name, claims_total, dedup in data["queues"]:
            tq.queues[name] = QueueState(name, claims_total=claims_total, dedup=dict(dedup))
        for row in data["tasks"]:
            task = TaskRecord.from_plain(row)
            tq.tasks[task.tid] = task
            queue = tq._queue(task.queue)
            tq._move(queue, None, task.status)
            if task.status != COMPLETED:
                tq.open += 1
            if task.status == READY:
                heap = queue.ready.setdefault(task.requires, [])
                heap.append((-task.priority, task.seq, task.tid))
            elif task.status == DELAYED:
                tq._delayed.append((task.ready_at, task.seq, task.tid))
            elif task.status == COMPLETED:
                tq._drops.append((task.finished_at + task.retention_ms, task.tid))
            if task.deadline_at and task.status in (READY, DELAYED, CLAIMED):
                tq._deadlines.append((task.deadline_at, task.tid))
        for name, tids in data["dead"]:
            tq._queue(name).dead = dict.fromkeys(tids)
        for row in data["attempts"]:
            attempt = Attempt(*row)
            tq.attempts[attempt.aid] = attempt
            tq.current[attempt.tid] = attempt.aid
            tq._expiries.append((attempt.expires_at, attempt.aid))
        for row in data["claims"]:
            aid, queue_name, worker, caps, ttl_ms, deadline, order, session, principal = row
            waiter = ClaimWaiter(
                aid, queue_name, worker, dict(caps), ttl_ms, deadline, order, session, principal
            )
            tq.claims[aid] = waiter
            tq._claim_deadlines.append((deadline, aid))
        for waiter in sorted(tq.claims.values(), key=lambda w: w.order):
            tq._queue(waiter.queue).claimers[waiter.aid] = None
        for sid, aids in data["by_session"]:
            tq.by_session[sid] = dict.fromkeys(aids)
        for heap in [*(h for q in tq.queues.values() for h in q.ready.values())]:
            heapq.heapify(heap)
        heapq.heapify(tq._delayed)
        for pairs in (tq._drops, tq._deadlines, tq._expiries, tq._claim_deadlines):
            heapq.heapify(pairs)
        return tq


__all__ = [
    "DEFAULT_QUEUE_TASKS",
    "MAX_PAYLOAD_BYTES",
    "MAX_RESULT_BYTES",
    "TASK_MUTATING_OPS",
    "TaskQueues",
    "check_task_args",
]
