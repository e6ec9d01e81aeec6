"""Leased task queues: the limits, record types and entry checks (core/queue.py
applies the operations). Pure: no I/O, no clock, no randomness."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..limits import (
    MAX_FAIRNESS_KEY_BYTES,
    MAX_FAIRNESS_WEIGHT,
    MAX_ID_CHARS,
    MAX_OWNER_BYTES,
    MAX_QUEUE_NAME_BYTES,
    MAX_TASK_ATTEMPTS,
    MAX_TASK_BACKOFF_MS,
    MAX_TASK_CAP_BYTES,
    MAX_TASK_CAPABILITIES,
    MAX_TASK_CHECKPOINT_TEXT,
    MAX_TASK_DEDUP_BYTES,
    MAX_TASK_DELAY_MS,
    MAX_TASK_ERROR_BYTES,
    MAX_TASK_PAYLOAD_BYTES,
    MAX_TASK_REQUIRES,
    MAX_TASK_RESULT_BYTES,
    MAX_TTL_MS,
)
from ..operations import core_bounds
from .checks import utf8_size, valid_int, valid_str
from .records import LeaseSession

if TYPE_CHECKING:
    from .audit import AuditTrail
    from .budget import Budgets

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
#: Priority aging (docs/queues.md, "Order"): the largest aging step a put may carry
#: (log-time milliseconds of waiting worth one priority level): one day.
MAX_AGING_MS = 24 * 3600 * 1000
#: The step of strict priority (no aging): about 139 years of waiting per level, far
#: more than any difference of two ready times, so priority always decides first.
STRICT_AGING_MS = 2**42
#: Fair shares (docs/queues.md, "Fair shares"): a claim advances its tenant's pass by
#: ``FAIR_SCALE // weight``. Integers, so every replica computes the same passes; the
#: rounding (at most 1 part in 10^6 / 1000 of a share) is the same everywhere.
FAIR_SCALE = 1_000_000

#: The counters each queue (and the whole store) keeps of its tasks' events, besides
#: ``claims_total``: completions, attempts that expired (TTL, no progress, or their
#: lease session ended), tasks scheduled for another attempt (after a failed or
#: expired attempt, or a dead letter's ``retry``) and moves to the dead-letter list.
TALLIES = ("completions", "expiries", "retries", "dead_letters")

#: Task states.
READY, DELAYED, CLAIMED, COMPLETED, DEAD = "ready", "delayed", "claimed", "completed", "dead"


class Host(Protocol):
    """What the queues need from the store (``state.StoreState`` is one): log time,
    the revision counter, the events of this entry, and the lease sessions."""

    now: int
    revision: int
    events: list[dict[str, Any]]
    lease_sessions: dict[str, LeaseSession]
    budgets: Budgets
    #: The audit trail (core/audit.py) and the principal of the entry being applied.
    audit: AuditTrail
    audit_actor: str


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
    #: The lease certificate holder key its claim named (32 raw bytes; None for
    #: none): heartbeats may ask for a certificate only for it. Not in the row: the
    #: snapshot keeps it in ``attempt_holder_keys`` (core/snapshot.py).
    holder: bytes | None = None

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
    #: The task's place among ready tasks, a static heap key (``task_rank``): set at
    #: the put, kept through releases and retries, so a task keeps its place.
    rank: int = 0
    #: Its fairness key (tenant; "" the default tenant): fair shares decide between
    #: tenants, ``rank`` within one.
    tenant: str = ""
    #: The latest checkpoint a heartbeat carried (base64 text of at most
    #: ``MAX_TASK_CHECKPOINT_BYTES`` bytes; None: none yet) and the number of the
    #: attempt that wrote it: handed to every later claim, shown by ``get``/``dead``
    #: (layout 9; older rows load with none).
    checkpoint: str | None = None
    checkpoint_attempt: int = 0
    #: The effect journal (core/effects.py): effect id -> ``[effect id, state, token,
    #: attempt number, idempotency key, result]``, in the order begun (layout 9).
    effects: dict[str, list[Any]] = field(default_factory=dict)
    #: Task dependencies (core/deps.py): the parents named at the put, and those not
    #: completed yet (the task waits, ``delayed``, while any is left; layout 9).
    after: list[str] = field(default_factory=list)
    waiting_on: list[str] = field(default_factory=list)

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
            self.rank,
            self.tenant,
            self.checkpoint,
            self.checkpoint_attempt,
            [list(row) for row in self.effects.values()],
            list(self.after),
            list(self.waiting_on),
        ]

    @classmethod
    def from_plain(cls, row: list[Any]) -> TaskRecord:
        task = cls(*row)
        task.requires = tuple((str(k), str(v)) for k, v in row[5])
        # Layout 9 ends with the effect journal's rows; older rows have none.
        task.effects = {r[0]: list(r) for r in row[27]} if len(row) > 27 else {}
        task.after = list(row[28]) if len(row) > 28 else []
        task.waiting_on = list(row[29]) if len(row) > 29 else []
        if len(row) < 24:
            # A layout-5 row (before aging): its task was put by an entry without an
            # aging stamp, ranked by strict priority then put order, as it was.
            task.rank = task_rank(task.priority, 0, None)
        return task


def task_rank(priority: int, ready_at: int, aging: int | None) -> int:
    """The static heap key of a ready task (smaller is claimed first; ties go to the
    earlier put): ``ready_at - priority * step``, where ``ready_at`` is the log time the
    put made it ready (the put, or the end of its ``delay``) and ``step`` the aging
    step stamped into the put (ms of waiting worth one priority level; 0: no aging,
    the strict step). So a task's effective priority rises by one level per step it
    has been ready, without the key ever changing: every task ready later than
    ``ready_at + (p' - p) * step`` ranks behind a task of priority ``p``, whatever its
    priority ``p'``, and the claim path keeps its heaps (no rescan per claim).

    ``aging`` None is an entry written before aging (no stamp): ``-priority *
    STRICT_AGING_MS``, exactly the strict order ``(-priority, put order)`` of that
    build, so an old log replays to the same claims."""
    if aging is None:
        return -priority * STRICT_AGING_MS
    return ready_at - priority * (aging if aging > 0 else STRICT_AGING_MS)


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
    #: The holder key its claim named, bound to the attempt it is handed (as
    #: ``Attempt.holder``); in ``attempt_holder_keys`` in a snapshot.
    holder: bytes | None = None

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
class Tenant:
    """One fairness key of a queue (docs/queues.md, "Fair shares"): its weight (set by
    the latest put that gave one), its *pass* (virtual time: advanced by
    ``FAIR_SCALE // weight`` per claim of one of its tasks), and its ready tasks by
    requirement set (a heap of ``(rank, seq, tid)`` each, stale items skipped;
    ``task_rank``). ``weight`` and ``vpass`` are in the snapshot; ``ready``, ``ready_n``
    (its ready tasks in those heaps) and ``held`` (its tasks not completed: the tenant
    is forgotten when none is left) are derived from the task records."""

    name: str
    weight: int = 1
    vpass: int = 0
    ready: dict[tuple[tuple[str, str], ...], list[tuple[int, int, str]]] = field(
        default_factory=dict
    )
    ready_n: int = 0
    held: int = 0


@dataclass(slots=True)
class QueueState:
    """One named queue: its tenants (``Tenant``: each with its ready heaps) and the
    heap of backlogged tenants by ``(pass, name)`` (stale items skipped), waiting
    claims in arrival order, dead-letter list in death order, dedup keys, and
    counters. ``vtime`` is the queue's virtual time: the pass at which the latest
    claim started, where a tenant that becomes backlogged again starts (if its own
    pass is lower), so idling earns no credit."""

    name: str
    tenants: dict[str, Tenant] = field(default_factory=dict)
    turns: list[tuple[int, str]] = field(default_factory=list)
    vtime: int = 0
    claimers: dict[str, None] = field(default_factory=dict)
    dead: dict[str, None] = field(default_factory=dict)
    dedup: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    #: Attempts started in this queue (claims granted), ever.
    claims_total: int = 0
    #: ``TALLIES`` of this queue, since it was last created (in the snapshot).
    tally: dict[str, int] = field(default_factory=dict)
    #: Derived (rebuilt on restore, not in the snapshot), for the metrics: its tasks
    #: that are not completed (ready, delayed, claimed, dead), and its ready tasks in
    #: the order they became ready, with that log time (``TaskRecord.ready_at``), so
    #: the first item is the one that has waited longest (O(1) at a scrape).
    depth: int = 0
    ready_since: dict[str, int] = field(default_factory=dict)

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


def valid_checkpoint(value: Any) -> bool:
    """Whether ``value`` is a checkpoint's text: a string of at most
    ``MAX_TASK_CHECKPOINT_TEXT`` UTF-8 bytes. The clients send base64 of the bytes
    (JSON and HTTP carry no bytes) and read back what is not base64 as its UTF-8
    bytes; the state machine keeps the text as it came."""
    return isinstance(value, str) and utf8_size(value) <= MAX_TASK_CHECKPOINT_TEXT


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
        "task_effect_begin",
        "task_effect_commit",
    }
)


#: The integer fields of task entries and their bounds, checked in this order. Those
#: with static bounds on the wire come from the operations table (seconds there,
#: milliseconds here); the wire takes ``wait``, ``ttl`` and ``progress_timeout`` from
#: the node's config, so the core checks them against the hard caps.
_INT_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("delay", *core_bounds("task_put", "delay")),
    ("deadline", *core_bounds("task_put", "deadline")),
    ("retention", *core_bounds("task_put", "retention")),
    ("backoff", *core_bounds("task_put", "backoff")),
    ("retry_after", *core_bounds("task_fail", "retry_after")),
    ("wait", 0, MAX_TTL_MS),
    ("ttl", 1, MAX_TTL_MS),
    ("progress_timeout", 1, MAX_TTL_MS),
    ("max_attempts", *core_bounds("task_put", "max_attempts")),
    ("priority", *core_bounds("task_put", "priority")),
    ("limit", *core_bounds("task_dead", "limit")),
    ("max_completed", 1, 2**31),  # stamped by the leader (max_completed_tasks)
    ("tasks_quota", 1, 2**31),  # stamped by the leader (max_tasks_per_principal)
    ("queues_quota", 1, 2**31),  # stamped by the leader (max_queues_per_principal)
    ("waiters_total", 1, 2**31),  # stamped by the leader (max_waiters_total)
    ("wait_quota", 1, 2**31),  # stamped by the leader (max_waiters_per_principal)
    ("aging", 0, MAX_AGING_MS),  # stamped by the leader (task_priority_aging)
    ("weight", 1, MAX_FAIRNESS_WEIGHT),
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
        "task_effect_begin",
        "task_effect_commit",
    ) and not valid_str(entry.get("aid"), MAX_ID_CHARS):
        return "'aid' must be a non-empty string"
    for name, low, high in _INT_FIELDS:
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
        if "fairness_key" in entry and not valid_str(entry["fairness_key"], MAX_FAIRNESS_KEY_BYTES):
            return (
                f"'fairness_key' must be a non-empty string of at most "
                f"{MAX_FAIRNESS_KEY_BYTES} bytes"
            )
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
    if (
        op == "task_heartbeat"
        and "checkpoint" in entry
        and not valid_checkpoint(entry["checkpoint"])
    ):
        return f"'checkpoint' must be a string of at most {MAX_TASK_CHECKPOINT_TEXT} bytes"
    if op == "task_complete" and "result" in entry:
        result = entry["result"]
        if not isinstance(result, str) or utf8_size(result) > MAX_RESULT_BYTES:
            return f"'result' must be a string of at most {MAX_RESULT_BYTES} bytes"
    if op == "task_fail" and "error" in entry:
        text = entry["error"]
        if not isinstance(text, str) or utf8_size(text) > MAX_ERROR_BYTES:
            return f"'error' must be a string of at most {MAX_ERROR_BYTES} bytes"
    return None
