"""Checkers of the leased task queues over a chaos-suite history (issue 12).

Queue operations are recorded like lease operations (``workload.History``): an
``invoke`` then ``ok`` / ``fail`` (definite) / ``info`` (outcome unknown), paired by
``op``, with ``process``, ``f``, ``key`` (the queue's name), ``t`` (CLOCK_MONOTONIC,
the one clock every worker thread and process shares) and ``value``. The shapes
(jepsen-style/README.md, *Queue events*):

* ``q.put``: invoke ``payload`` (unique in the run), ``max_attempts``, ``lease_ttl``,
  optional ``deadline`` (seconds after the put) and ``progress_timeout``; ok ``task``.
* ``q.claim``: invoke ``worker``, ``lease_ttl``, ``wait``; ok ``task`` (None: nothing
  within ``wait``), and with a task ``token``, ``attempt``, ``lease_id``, ``payload``,
  ``valid_until`` (the worker's own expiry: ``send + ttl*(1-rho) - margin``).
* ``q.heartbeat``: invoke ``task``, ``token``, ``progress``; ok ``valid_until`` (the new
  local expiry; no later than before when the lease was not extended).
* ``q.complete`` (invoke ``task``, ``token``, ``result``), ``q.fail`` (``task``,
  ``token``, ``error``), ``q.release`` (``task``, ``token``): ok with no value.
* ``q.get``: invoke ``task``, ``final`` (true for the end-of-run read); ok ``status``
  (``ready``, ``delayed``, ``claimed``, ``completed``, ``dead``), ``attempts``,
  ``result`` (completed), ``reason`` (dead: ``attempts`` or ``deadline``; pending: why).
* ``q.dead``: invoke ``final``; ok ``tasks``: ``[{task, attempts, reason, payload}]``
  (``payload``: the put's unique payload, which finds the put of a dead letter whose
  put answer was lost; a ``q.get`` of a dead task carries it too).
* ``q.purge`` (the soak's janitor, ``queue_workload.Janitor``): invoke ``task``; ok with
  no value; a task still pending is refused definitely (``INVALID_ARGUMENT``).

A refusal of a stale attempt is ``fail`` with ``error`` ``STALE_ATTEMPT``; a final
``q.get`` of an unknown task is ``fail`` with ``TASK_NOT_FOUND``. ``q.note`` events
(``what``: ``crash``, ``stall``, ``stuck``; ``process``, ``task``, ``token``) say what a
worker did on purpose; they are counted, not judged.

An *attempt* is one ``ok`` claim of a task: ``(task, token)``. Its holder holds it
from the claim's ``ok`` to its own ``valid_until`` (each ``ok`` heartbeat adds
``[ok, valid_until]``), cut at the holder's first ``q.complete``, ``q.fail`` or
``q.release`` invocation for it. A crash does not cut it: a dead worker's attempt is
held (for this rule) until it would have expired on its own clock, which is what the
cluster must wait for before handing the task on.

Checkers (each ``{"valid": True | False | "unknown", "violations": [...], "stats": ...,
"unknown": [...]}``); a field a checker needs that is missing or of the wrong type
makes it ``unknown``, never a pass, and so does a run with nothing to judge:

* ``queue_origin``: every task the cluster handed out (an ``ok`` claim) or accepted an
  attempt's call for came from a put the history shows: one answered with its task id
  (invoked before the task was seen), or, with no such answer, one whose outcome is
  unknown and whose payload the claim carries (it may have happened). A task whose
  payload no put sent, or only a put the cluster definitely refused, or a put answered
  with another task id, or whose put was invoked only after the task was handed out,
  was created by nobody; so were two tasks carrying one put's payload.
* ``queue_lost_put``: every acknowledged put ends completed or dead-lettered, or is
  still pending at the end with a reason, in the final reads; a task the cluster no
  longer knows, or two puts of different payloads answered with one task id, is lost.
  The one exception is a task whose ``q.purge`` was invoked after a read had returned
  it completed or dead, and was not definitely refused: it may be gone (``purged``);
  and a task whose purge was acknowledged must be gone (found again, the purge was
  undone).
* ``queue_one_completion``: at most one completion is accepted per task; no
  completion, failure or heartbeat is accepted from an attempt after a newer attempt
  of its task was granted (a stale attempt); an accepted completion is not lost (the
  final read says completed) and the final result is the accepted one's.
* ``queue_exclusive``: no two attempts of one task are held at one instant.
* ``queue_tokens``: per task, an attempt granted before another was asked for has the
  smaller token and the smaller attempt number; no token is handed out twice.
* ``queue_effects`` (``check_effects``, over the effect proof's events, not a chaos
  history: scripts/effect_proof): every external effect is made exactly once, and no
  commit from an attempt older than the task's newest is accepted.
* ``queue_dependencies`` (``check_dependencies``, over a task graph's events: the
  DAG tests): each child's claim token is above every parent's completion revision,
  and no task is completed twice.
* ``queue_dead_letter``: every task in the dead-letter list (or read as ``dead``)
  used all its attempts (and no more than the history can account for) or passed the
  deadline its put gave it, and was put by someone.

Threads: pure functions over lists; no I/O. Nothing is raised on a malformed history
(it is ``unknown``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard

Event = dict[str, Any]
MAX_REPORTED = 50
QUEUE_FS = frozenset(
    {
        "q.put",
        "q.claim",
        "q.heartbeat",
        "q.complete",
        "q.fail",
        "q.release",
        "q.get",
        "q.dead",
        "q.purge",
    }
)
#: Operations of one attempt, invoked with its ``task`` and ``token``.
ATTEMPT_FS = frozenset({"q.heartbeat", "q.complete", "q.fail", "q.release"})
PENDING = frozenset({"ready", "delayed", "claimed"})
STATUSES = PENDING | {"completed", "dead"}
DEAD_REASONS = frozenset({"attempts", "deadline"})
NOT_FOUND_CODES = frozenset({"TASK_NOT_FOUND", "NOT_FOUND"})
CHECKERS = (
    "queue_origin",
    "queue_lost_put",
    "queue_one_completion",
    "queue_exclusive",
    "queue_tokens",
    "queue_dead_letter",
)


class QOp(Protocol):
    """What the checkers read of a paired operation (``checker.Op``)."""

    id: str
    process: str
    f: str
    key: str
    inv: float
    ret: float
    type: str
    args: dict[str, Any]
    value: dict[str, Any]
    error: str | None


class QParams(Protocol):
    # Read-only members: checker.Params is a frozen dataclass.
    @property
    def rho(self) -> float: ...

    @property
    def margin(self) -> float: ...


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _waited(op: QOp) -> bool:
    """A claim asked to wait for a task (queued in the replicated state)."""
    wait = op.args.get("wait")
    return _is_num(wait) and wait > 0


def _brief(op: QOp) -> dict[str, Any]:
    out: dict[str, Any] = {
        "op": op.id,
        "process": op.process,
        "f": op.f,
        "queue": op.key,
        "type": op.type,
        "inv": round(op.inv, 4),
        "ret": None if math.isinf(op.ret) else round(op.ret, 4),
    }
    for name in ("task", "token"):
        if name in op.args:
            out[name] = op.args[name]
        elif name in op.value:
            out[name] = op.value[name]
    if op.error:
        out["error"] = op.error
    return out


class _Verdict:
    """Violations and reasons for ``unknown`` of one checker."""

    def __init__(self) -> None:
        self.violations: list[dict[str, Any]] = []
        self.unknown: list[dict[str, Any]] = []

    def bad(self, kind: str, **detail: Any) -> None:
        self.violations.append({"kind": kind, **detail})

    def cannot(self, kind: str, **detail: Any) -> None:
        self.unknown.append({"kind": kind, **detail})

    def result(self, stats: dict[str, Any]) -> dict[str, Any]:
        valid: bool | str = not self.violations
        if valid and self.unknown:
            valid = "unknown"
        return {
            "valid": valid,
            "violation_count": len(self.violations),
            "violations": self.violations[:MAX_REPORTED],
            "unknown": self.unknown[:MAX_REPORTED],
            "stats": stats,
        }


def queue_ops(ops: Iterable[QOp]) -> list[QOp]:
    """The queue operations among ``ops``, by invocation time."""
    return sorted((op for op in ops if op.f in QUEUE_FS), key=lambda o: o.inv)


def has_queues(events: Iterable[Event], ops: Iterable[QOp]) -> bool:
    """Whether the run used queues: its ``meta`` declares them or some op is one. A
    run that declares queues and did nothing with them is judged (``unknown``)."""
    for event in events:
        if event.get("type") == "meta":
            if event.get("queues"):
                return True
            break
    return any(op.f in QUEUE_FS for op in ops)


def _task_of_claim(op: QOp) -> str | None:
    task = op.value.get("task")
    return task if isinstance(task, str) else None


def _claims(qops: list[QOp], verdict: _Verdict) -> list[QOp]:
    """``ok`` claims that handed out a task, each with the fields an attempt needs;
    a claim missing one makes ``verdict`` unknown (it could hide a second holder)."""
    out = []
    for op in qops:
        if op.f != "q.claim" or op.type != "ok":
            continue
        if "task" not in op.value:
            verdict.cannot("ok claim without task", op=_brief(op))
            continue
        task = op.value["task"]
        if task is None:
            continue  # nothing to hand out within ``wait``
        if not isinstance(task, str):
            verdict.cannot("ok claim with a malformed task", op=_brief(op))
            continue
        missing = [
            name
            for name, ok in (
                ("token", _is_int(op.value.get("token"))),
                ("attempt", _is_int(op.value.get("attempt"))),
                ("valid_until", _is_num(op.value.get("valid_until"))),
            )
            if not ok
        ]
        if missing:
            verdict.cannot(f"ok claim without {', '.join(missing)}", op=_brief(op))
            continue
        out.append(op)
    return out


def _attempt_args(op: QOp, verdict: _Verdict) -> tuple[str, int] | None:
    task, token = op.args.get("task"), op.args.get("token")
    if not isinstance(task, str) or not _is_int(token):
        verdict.cannot(f"{op.f} invoked without task and token", op=_brief(op))
        return None
    return task, token


def _final_reads(qops: list[QOp]) -> tuple[dict[str, QOp], list[QOp]]:
    """The final ``q.get`` of each task (the last one invoked) and the final
    ``q.dead`` reads."""
    gets: dict[str, QOp] = {}
    deads: list[QOp] = []
    for op in qops:
        if op.args.get("final") is not True:
            continue
        if op.f == "q.get" and isinstance(op.args.get("task"), str):
            gets[op.args["task"]] = op
        elif op.f == "q.dead":
            deads.append(op)
    return gets, deads


def _purges(qops: list[QOp], verdict: _Verdict) -> tuple[set[str], set[str]]:
    """Tasks that may be gone by a purge: its ``q.purge`` was invoked after a read
    (any ``q.get`` ok) had returned the task ``completed`` or ``dead``, and was not
    definitely refused (ok, or unknown outcome); and the tasks whose purge was
    acknowledged. A purge of a task nobody had seen finished excuses nothing, so a
    cluster that purged (or lost) a pending task is still caught."""
    finished: dict[str, float] = {}  # task -> earliest answer of a read saying finished
    for op in qops:
        if op.f == "q.get" and op.type == "ok" and op.value.get("status") in ("completed", "dead"):
            task = op.args.get("task")
            if isinstance(task, str):
                finished[task] = min(finished.get(task, math.inf), op.ret)
    maybe: set[str] = set()
    acked: set[str] = set()
    for op in qops:
        if op.f != "q.purge" or op.type not in ("ok", "info"):
            continue
        task = op.args.get("task")
        if not isinstance(task, str):
            verdict.cannot("purge invoked without a task id", op=_brief(op))
            continue
        if op.type == "ok":
            acked.add(task)
        if finished.get(task, math.inf) < op.inv:
            maybe.add(task)
    return maybe, acked


def _puts(qops: list[QOp], verdict: _Verdict | None = None) -> dict[str, QOp]:
    """Acknowledged puts by task id (the first one answered with that id)."""
    out: dict[str, QOp] = {}
    for op in qops:
        if op.f != "q.put" or op.type != "ok":
            continue
        task = op.value.get("task")
        if not isinstance(task, str):
            if verdict is not None:
                verdict.cannot("ok put without a task id", op=_brief(op))
            continue
        out.setdefault(task, op)
    return out


# ------------------------------------------------------------------ origin


def check_origin(qops: list[QOp]) -> dict[str, Any]:
    """Every task a claim handed out, and every task an accepted attempt call names,
    came from a put the history shows.

    What a history can prove: an ``ok`` put answered with the task's id created it (if
    it was invoked before the task was seen); a put whose outcome is unknown (``info``)
    may have created it, and the claim's ``payload`` (the put's, unique in the run)
    ties the task to that put; a put refused definitely (``fail``) created nothing. So a
    task is a violation when no acknowledged put answered its id and its payload is no
    unanswered put's (or it has no payload and no put on its queue is unanswered), when
    its payload is that of a put answered with another task id (one put, two tasks),
    when two task ids carry one payload, when its payload differs from the put answered
    with its id, or when the only put answered with its id was invoked after the task
    was handed out. A task without a payload, no acknowledged put and some unanswered
    put on its queue: the history cannot tell (``unknown``)."""
    verdict = _Verdict()
    acked: dict[str, list[QOp]] = defaultdict(list)  # task id -> ok puts answered with it
    put_payload: dict[str, QOp] = {}  # payload -> its put (any outcome)
    unanswered: dict[str, list[QOp]] = defaultdict(list)  # queue -> info puts
    for op in qops:
        if op.f != "q.put":
            continue
        payload = op.args.get("payload")
        if isinstance(payload, str):
            put_payload.setdefault(payload, op)
        if op.type == "ok" and isinstance(op.value.get("task"), str):
            acked[op.value["task"]].append(op)
        elif op.type == "info":
            unanswered[op.key].append(op)
    # Every sighting of a task: (when the cluster had shown it, the op, its payload).
    seen: dict[str, list[tuple[float, QOp, str | None]]] = defaultdict(list)
    for op in qops:
        if op.f == "q.claim" and op.type == "ok":
            task = op.value.get("task")
            if isinstance(task, str):
                payload = op.value.get("payload")
                seen[task].append((op.ret, op, payload if isinstance(payload, str) else None))
        elif op.f in ATTEMPT_FS and op.type == "ok":
            task = op.args.get("task")
            # A call the cluster accepted: the attempt, and so its task, existed. (One
            # whose answer was lost proves nothing: it may have been refused.)
            if isinstance(task, str):
                seen[task].append((op.ret, op, None))
    tasks_of_payload: dict[str, set[str]] = defaultdict(set)
    counts: dict[str, int] = defaultdict(int)
    for task, sightings in sorted(seen.items()):
        first, first_op, _ = min(sightings, key=lambda row: row[0])
        payloads = sorted({p for _, _, p in sightings if p is not None})
        for payload in payloads:
            tasks_of_payload[payload].add(task)
        puts = acked.get(task, [])
        if puts:
            if not any(put.inv < first for put in puts):
                verdict.bad(
                    "task handed out before any put of it was invoked",
                    task=task,
                    seen=_brief(first_op),
                    put=_brief(puts[0]),
                )
            sent = {put.args.get("payload") for put in puts}
            for payload in payloads:
                if payload not in sent:
                    verdict.bad(
                        "claimed task's payload is not its put's",
                        task=task,
                        payload=payload,
                        put=_brief(puts[0]),
                    )
            counts["from_acknowledged_put"] += 1
            continue
        if payloads:
            maybe = True
            for payload in payloads:
                put = put_payload.get(payload)
                if put is not None and put.type == "ok":
                    maybe = False
                    verdict.bad(
                        "task carries the payload of a put answered with another task id",
                        task=task,
                        payload=payload,
                        put=_brief(put),
                    )
                elif put is None or put.type != "info" or put.inv >= first:
                    maybe = False
                    verdict.bad(
                        "task claimed that no put could have created",
                        task=task,
                        payload=payload,
                        put=None if put is None else _brief(put),
                        seen=_brief(first_op),
                    )
            if maybe:
                counts["from_unanswered_put"] += 1
            continue
        if not any(put.inv < first for put in unanswered.get(first_op.key, [])):
            verdict.bad(
                "task claimed that no put could have created",
                task=task,
                seen=_brief(first_op),
            )
            continue
        verdict.cannot(
            "task of no acknowledged put, without a payload to tie it to an unanswered put",
            task=task,
            seen=_brief(first_op),
        )
    for payload, tasks in sorted(tasks_of_payload.items()):
        if len(tasks) > 1:
            verdict.bad("one put's payload on two tasks", payload=payload, tasks=sorted(tasks))
    if not seen:
        verdict.cannot("no task handed out: nothing to judge")
    return verdict.result({"tasks_seen": len(seen), **dict(sorted(counts.items()))})


# ------------------------------------------------------------- no lost put


def check_lost_puts(qops: list[QOp]) -> dict[str, Any]:
    """Every acknowledged put ends completed or dead-lettered, or pending with a
    reason, in its final read. No final read of an acknowledged put, or one whose
    status is missing or unknown, or a pending one without a reason: ``unknown``."""
    verdict = _Verdict()
    seen_payload: dict[str, QOp] = {}
    by_task: dict[str, list[QOp]] = defaultdict(list)
    for op in qops:
        if op.f != "q.put" or op.type != "ok":
            continue
        payload = op.args.get("payload")
        task = op.value.get("task")
        if not isinstance(payload, str) or not isinstance(task, str):
            verdict.cannot("ok put without payload or task id", op=_brief(op))
            continue
        if payload in seen_payload:
            verdict.cannot("payload put twice (payloads must be unique)", op=_brief(op))
        seen_payload[payload] = op
        by_task[task].append(op)
    for task, puts in by_task.items():
        payloads = sorted({str(p.args["payload"]) for p in puts})
        if len(payloads) > 1:
            verdict.bad(
                "puts of different payloads answered with one task id",
                task=task,
                payloads=payloads,
                ops=[_brief(p) for p in puts],
            )
    gets, _ = _final_reads(qops)
    maybe_purged, purged = _purges(qops, verdict)
    outcome: dict[str, int] = defaultdict(int)
    for task, puts in sorted(by_task.items()):
        read = gets.get(task)
        if read is None:
            verdict.cannot("acknowledged put without a final read", task=task)
            continue
        if read.type == "ok" and task in purged:
            verdict.bad(
                "acknowledged purge undone: the final read finds the task",
                task=task,
                read=_brief(read),
            )
            continue
        if read.type == "fail" and read.error in NOT_FOUND_CODES and task in maybe_purged:
            outcome["purged"] += 1
            continue
        if read.type == "fail" and read.error in NOT_FOUND_CODES:
            verdict.bad(
                "acknowledged put lost: the cluster no longer knows it",
                task=task,
                put=_brief(puts[0]),
                read=_brief(read),
            )
            outcome["lost"] += 1
            continue
        if read.type != "ok":
            verdict.cannot(
                "final read of an acknowledged put did not answer", task=task, read=_brief(read)
            )
            continue
        status = read.value.get("status")
        if status not in STATUSES:
            verdict.cannot("final read without a known status", task=task, read=_brief(read))
            continue
        if status in PENDING:
            reason = read.value.get("reason")
            if not isinstance(reason, str) or not reason:
                verdict.cannot(
                    "pending at the end without a reason",
                    task=task,
                    status=status,
                    read=_brief(read),
                )
                continue
        outcome[str(status)] += 1
    if not by_task:
        verdict.cannot("no acknowledged put: nothing to judge")
    stats = {"acknowledged_puts": len(by_task), "final": dict(sorted(outcome.items()))}
    return verdict.result(stats)


# ---------------------------------------------------------- one completion


def check_one_completion(qops: list[QOp]) -> dict[str, Any]:
    """At most one accepted completion per task; nothing accepted from a stale
    attempt (one whose task had a newer attempt granted before it was invoked); an
    accepted completion survives to the final read, with its result."""
    verdict = _Verdict()
    claims = _claims(qops, verdict)
    granted: dict[str, list[tuple[float, int]]] = defaultdict(list)  # task -> (ret, token)
    for op in claims:
        granted[str(op.value["task"])].append((op.ret, int(op.value["token"])))
    for rows in granted.values():
        rows.sort()
    completions: dict[str, list[QOp]] = defaultdict(list)  # accepted or maybe accepted
    accepted: dict[str, list[QOp]] = defaultdict(list)
    stale_refused = stale_accepted = 0
    for op in qops:
        if op.f not in ATTEMPT_FS:
            continue
        ident = _attempt_args(op, verdict)
        if ident is None:
            continue
        task, token = ident
        if op.type == "fail" and op.error == "STALE_ATTEMPT":
            stale_refused += 1
        if op.f == "q.complete" and op.type in ("ok", "info"):
            if "result" not in op.args:
                verdict.cannot("complete invoked without a result", op=_brief(op))
                continue
            completions[task].append(op)
            if op.type == "ok":
                accepted[task].append(op)
        if op.type != "ok":
            continue
        newer = [(t, tok) for t, tok in granted.get(task, []) if t < op.inv and tok > token]
        if newer:
            stale_accepted += 1
            verdict.bad(
                f"{op.f} accepted from a stale attempt",
                task=task,
                token=token,
                newer_token=max(tok for _, tok in newer),
                newer_granted_at=round(min(t for t, _ in newer), 4),
                op=_brief(op),
            )
    for task, oks in accepted.items():
        if len(oks) > 1:
            verdict.bad(
                "two completions accepted for one task",
                task=task,
                ops=[_brief(op) for op in oks],
            )
    gets, _ = _final_reads(qops)
    maybe_purged, _ = _purges(qops, verdict)
    for task, maybe in completions.items():
        read = gets.get(task)
        if (
            read is not None
            and read.type == "fail"
            and read.error in NOT_FOUND_CODES
            and task in maybe_purged
        ):
            continue  # purged once finished (the soak's janitor): nothing left to read
        if read is None or read.type != "ok":
            if accepted.get(task):
                verdict.cannot("accepted completion without a final read", task=task)
            continue
        status = read.value.get("status")
        if status not in STATUSES:
            verdict.cannot("final read without a known status", task=task, read=_brief(read))
            continue
        if status != "completed":
            if accepted.get(task):
                verdict.bad(
                    "accepted completion lost",
                    task=task,
                    status=status,
                    completion=_brief(accepted[task][0]),
                )
            continue
        if "result" not in read.value:
            verdict.cannot("final read of a completed task without its result", task=task)
            continue
        result = read.value["result"]
        candidates = accepted.get(task) or maybe
        if not any(op.args["result"] == result for op in candidates):
            verdict.bad(
                "final result is not the accepted completion's",
                task=task,
                result=result,
                completions=[{**_brief(op), "result": op.args["result"]} for op in candidates],
            )
    for task, read in gets.items():
        if (
            read.type == "ok"
            and read.value.get("status") == "completed"
            and task not in completions
            and task in granted
        ):
            verdict.bad("completed with no completion that could have been accepted", task=task)
    if not claims:
        verdict.cannot("no attempt granted: nothing to judge")
    stats = {
        "attempts": len(claims),
        "completions_accepted": sum(len(v) for v in accepted.values()),
        "stale_refused": stale_refused,
        "stale_accepted": stale_accepted,
    }
    return verdict.result(stats)


# -------------------------------------------------------------- exclusive


@dataclass
class Attempt:
    """One granted attempt of a task, as its worker saw it."""

    claim: QOp
    heartbeats: list[QOp] = field(default_factory=list)
    end_inv: float = math.inf

    @property
    def task(self) -> str:
        return str(self.claim.value["task"])

    @property
    def token(self) -> int:
        return int(self.claim.value["token"])

    def intervals(self) -> list[tuple[float, float]]:
        """``[ok, valid_until)`` of the claim and of each ok heartbeat, cut at the
        first complete, fail or release the holder invoked, merged."""
        spans = []
        for op in [self.claim, *self.heartbeats]:
            end = min(float(op.value["valid_until"]), self.end_inv)
            if end > op.ret:
                spans.append((op.ret, end))
        spans.sort()
        merged: list[tuple[float, float]] = []
        for start, end in spans:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return merged


def attempts(qops: list[QOp], verdict: _Verdict) -> dict[str, list[Attempt]]:
    """Per task, its attempts with their ok heartbeats and end."""
    by_ident: dict[tuple[str, str, int], Attempt] = {}
    out: dict[str, list[Attempt]] = defaultdict(list)
    for op in _claims(qops, verdict):
        view = Attempt(op)
        ident = (op.process, view.task, view.token)
        if ident in by_ident:
            verdict.bad("one attempt granted twice", op=_brief(op))
            continue
        by_ident[ident] = view
        out[view.task].append(view)
    for op in qops:
        if op.f not in ATTEMPT_FS:
            continue
        attempt = _attempt_args(op, verdict)
        if attempt is None:
            continue
        view_ = by_ident.get((op.process, *attempt))
        if view_ is None:
            continue  # the attempt's claim was not answered: it cannot be held
        if op.f == "q.heartbeat":
            if op.type == "ok":
                if not _is_num(op.value.get("valid_until")):
                    verdict.cannot("ok heartbeat without valid_until", op=_brief(op))
                    continue
                view_.heartbeats.append(op)
        else:
            view_.end_inv = min(view_.end_inv, op.inv)
    return out


def check_exclusive(qops: list[QOp]) -> dict[str, Any]:
    """No two attempts of one task are held at one instant (on the shared
    monotonic clock: each holder's own ``valid_until``)."""
    verdict = _Verdict()
    per_task = attempts(qops, verdict)
    held = 0
    for task, views in sorted(per_task.items()):
        spans = sorted((start, end, view) for view in views for start, end in view.intervals())
        held += len(spans)
        latest: tuple[float, Attempt] | None = None  # the span that ends last so far
        for start, end, view in spans:
            if latest is not None and start < latest[0] and latest[1].token != view.token:
                other = latest[1]
                verdict.bad(
                    "two workers held one task at once",
                    task=task,
                    t=round(start, 4),
                    overlap=round(min(end, latest[0]) - start, 4),
                    holders=[
                        {"process": other.claim.process, "token": other.token},
                        {"process": view.claim.process, "token": view.token},
                    ],
                )
            if latest is None or end > latest[0]:
                latest = (end, view)
    if not per_task and not verdict.unknown:
        verdict.cannot("no attempt granted: nothing to judge")
    return verdict.result({"tasks_claimed": len(per_task), "holding_intervals": held})


# ----------------------------------------------------------------- tokens


def check_tokens(qops: list[QOp]) -> dict[str, Any]:
    """Per task, an attempt granted before another was invoked has the smaller
    token and attempt number; no token goes to two attempts (tokens are the store
    revision: unique across tasks too)."""
    verdict = _Verdict()
    claims = _claims(qops, verdict)
    owner: dict[int, QOp] = {}
    for op in claims:
        token = int(op.value["token"])
        if token in owner:
            verdict.bad(
                "one token handed to two attempts",
                token=token,
                ops=[_brief(owner[token]), _brief(op)],
            )
        else:
            owner[token] = op
    per_task: dict[str, list[QOp]] = defaultdict(list)
    for op in claims:
        per_task[str(op.value["task"])].append(op)
    for task, ops in sorted(per_task.items()):
        by_ret = sorted(ops, key=lambda o: o.ret)
        for later in ops:
            before = [o for o in by_ret if o.ret < later.inv]
            if not before:
                continue
            top = max(before, key=lambda o: int(o.value["token"]))
            if int(top.value["token"]) >= int(later.value["token"]):
                verdict.bad(
                    "attempt token did not increase",
                    task=task,
                    earlier=_brief(top),
                    later=_brief(later),
                )
            top_attempt = max(int(o.value["attempt"]) for o in before)
            if top_attempt >= int(later.value["attempt"]):
                verdict.bad(
                    "attempt number did not increase",
                    task=task,
                    earlier_attempt=top_attempt,
                    later=_brief(later),
                )
    if not claims:
        verdict.cannot("no attempt granted: nothing to judge")
    return verdict.result({"attempts": len(claims), "tasks": len(per_task)})


# ------------------------------------------------------------ dead letters


def check_dead_letters(qops: list[QOp], params: QParams) -> dict[str, Any]:
    """Every dead-lettered task (in a final ``q.dead`` list, or read as ``dead``)
    was put, and used all its attempts (no more than the history accounts for: its
    granted attempts plus every claim whose answer was lost, or that waited and came
    back empty: it may have been granted and given back) or passed the deadline
    its put gave it (observed no earlier than ``put invoke + deadline/(1+rho) -
    margin``, the earliest local instant the log clock can have passed it)."""
    verdict = _Verdict()
    gets, deads = _final_reads(qops)
    puts = _puts(qops)
    # Puts whose answer was lost, by payload: a dead letter that names its payload
    # (the workload records it) is judged against its put like an acknowledged one.
    maybe_puts = {
        str(op.args.get("payload")): op for op in qops if op.f == "q.put" and op.type == "info"
    }
    granted: dict[str, set[int]] = defaultdict(set)
    unanswered: dict[str, int] = defaultdict(int)  # per queue
    for op in qops:
        if op.f != "q.claim":
            continue
        if op.type == "ok" and isinstance(op.value.get("task"), str):
            attempt = op.value.get("attempt")
            if _is_int(attempt):
                granted[op.value["task"]].add(attempt)
        elif op.type == "info":
            unanswered[op.key] += 1
        elif op.type == "ok" and op.value.get("task") is None and _waited(op):
            # A claim that waited and came back empty may still have been granted as its
            # wait ran out: the client then gives the attempt back (a release,
            # ``aio_queue._await_claim``), and that attempt counts in ``attempts``.
            unanswered[op.key] += 1
    records: list[tuple[str, dict[str, Any], QOp]] = []
    read_dead_lists = 0
    for op in deads:
        if op.type != "ok":
            verdict.cannot("final dead-letter read did not answer", op=_brief(op))
            continue
        tasks = op.value.get("tasks")
        if not isinstance(tasks, list):
            verdict.cannot("dead-letter read without tasks", op=_brief(op))
            continue
        read_dead_lists += 1
        for row in tasks:
            if not isinstance(row, dict) or not isinstance(row.get("task"), str):
                verdict.cannot("malformed dead-letter entry", op=_brief(op), entry=row)
                continue
            records.append((row["task"], row, op))
    for task, op in gets.items():
        if op.type == "ok" and op.value.get("status") == "dead":
            records.append((task, op.value, op))
    if not deads:
        verdict.cannot("no final dead-letter read")
    judged: set[str] = set()
    by_reason: dict[str, int] = defaultdict(int)
    for task, record, op in records:
        put = puts.get(task)
        if put is None and isinstance(record.get("payload"), str):
            put = maybe_puts.get(record["payload"])
        if put is None:
            if maybe_puts:
                verdict.cannot("dead-lettered task of an unanswered put?", task=task)
            else:
                verdict.bad("dead-letter list holds a task nobody put", task=task)
            continue
        final = gets.get(task)
        if final is not None and final.type == "ok" and final.value.get("status") == "completed":
            verdict.bad("completed task in the dead-letter list", task=task)
        reason, used = record.get("reason"), record.get("attempts")
        if reason not in DEAD_REASONS or not _is_int(used):
            verdict.cannot("dead-letter entry without reason or attempts", task=task, entry=record)
            continue
        if task not in judged:
            by_reason[str(reason)] += 1
        judged.add(task)
        if reason == "attempts":
            most = put.args.get("max_attempts")
            # ``failures``: the attempts counted against max_attempts (a released one
            # is not); ``attempts``: every claim. Without ``failures``, the claims.
            counted = record.get("failures", used)
            if not _is_int(most) or not _is_int(counted):
                verdict.cannot("put without max_attempts, or malformed failures", task=task)
                continue
            if counted < most or counted > used:
                verdict.bad(
                    "dead-lettered before using all its attempts",
                    task=task,
                    attempts=used,
                    failures=counted,
                    max_attempts=most,
                )
            possible = len(granted.get(task, ())) + unanswered.get(put.key, 0)
            if used > possible:
                verdict.bad(
                    "dead-letter entry counts attempts the history cannot account for",
                    task=task,
                    attempts=used,
                    granted=sorted(granted.get(task, ())),
                    unanswered_claims=unanswered.get(put.key, 0),
                )
        else:
            deadline = put.args.get("deadline")
            if not _is_num(deadline):
                verdict.bad("dead-lettered for a deadline its put did not have", task=task)
                continue
            earliest = put.inv + deadline / (1 + params.rho) - params.margin
            if op.ret < earliest:
                verdict.bad(
                    "dead-lettered for its deadline before the deadline",
                    task=task,
                    seen=round(op.ret, 4),
                    earliest=round(earliest, 4),
                )
    stats = {
        "dead_lists_read": read_dead_lists,
        "dead_tasks": len(judged),
        "by_reason": dict(sorted(by_reason.items())),
    }
    return verdict.result(stats)


# ------------------------------------------------------------------ effects

#: The definite refusals of a zombie's commit: a task attempt no longer current, or
#: (the journal under a lease, docs/design.md §4h) a lease no longer the key's live one.
ZOMBIE_REFUSALS = frozenset({"STALE_ATTEMPT", "NOT_OWNER", "LEASE_NOT_FOUND"})


def check_effects(events: Iterable[Event]) -> dict[str, Any]:
    """``queue_effects`` (issue 41; docs/queues.md, "Effects"): every external effect
    is made exactly once. ``events`` (the effect proof's, scripts/effect_proof):

    * ``effect.apply``: ``effect``, ``task``, ``token``: the provider made the effect
      (a counting fake provider's own record: it happened, whatever the cluster says);
    * ``effect.commit``: ``effect``, ``task``, ``token``, ``type`` (``ok``, ``fail``
      definite, ``info`` unknown), ``error``, ``already`` (an ok commit of an effect
      committed before), ``newest`` (the newest token of the task's attempts granted
      before the commit was invoked; under a lease, of the key's leases);
    * ``effect.final``: ``effect``, ``task``, ``status`` (the task's final state).

    Violations: an effect made twice or more (``applied_twice``); an effect of a
    completed task never made (``never_applied``); a commit accepted from an attempt
    older than one granted before it was invoked (``zombie_commit_accepted``); two
    first commits accepted for one effect (``committed_twice``). Nothing to judge, or
    an event missing a field, is ``unknown``."""
    verdict = _Verdict()
    applied: dict[str, int] = defaultdict(int)
    firsts: dict[str, int] = defaultdict(int)
    finals: dict[str, str] = {}
    zombies_refused = 0
    for event in events:
        kind = event.get("f")
        eid = event.get("effect")
        if kind not in ("effect.apply", "effect.commit", "effect.final"):
            continue
        if not isinstance(eid, str):
            verdict.cannot(f"{kind} without effect", event=event)
            continue
        if kind == "effect.apply":
            applied[eid] += 1
        elif kind == "effect.final":
            finals[eid] = str(event.get("status"))
        else:
            token, newest = event.get("token"), event.get("newest")
            if not _is_int(token) or not _is_int(newest):
                verdict.cannot("effect.commit without token or newest", event=event)
                continue
            if event.get("type") == "ok":
                if token < newest:
                    verdict.bad("zombie_commit_accepted", effect=eid, token=token, newest=newest)
                if not event.get("already"):
                    firsts[eid] += 1
            elif token < newest and event.get("error") in ZOMBIE_REFUSALS:
                zombies_refused += 1
    for eid, count in applied.items():
        if count > 1:
            verdict.bad("applied_twice", effect=eid, times=count)
    for eid, count in firsts.items():
        if count > 1:
            verdict.bad("committed_twice", effect=eid, times=count)
    for eid, status in finals.items():
        if status == "completed" and applied.get(eid, 0) == 0:
            verdict.bad("never_applied", effect=eid)
    if not finals:
        verdict.cannot("no effect.final event: nothing to judge")
    return verdict.result(
        {
            "effects": len(finals),
            "applied_once": sum(1 for eid in finals if applied.get(eid, 0) == 1),
            "applications": sum(applied.values()),
            "zombie_commits_refused": zombies_refused,
        }
    )


# ------------------------------------------------------------------ dependencies


def check_dependencies(events: Iterable[Event]) -> dict[str, Any]:
    """``queue_dependencies`` (issue 41; docs/queues.md, "Dependencies"): every edge of
    a task graph is respected. ``events``: ``dag.put`` (``task``, ``after``: its
    parents), ``dag.claim`` (``task``, ``token``: an ok claim), ``dag.complete``
    (``task``, ``revision``: an accepted completion's revision).

    Violations: a claim of a task whose token is not above the completion revision of
    every parent, or whose parent was never completed (``claimed_before_parent``); a
    task completed twice (``completed_twice``). Nothing put, or an event missing a
    field, is ``unknown``."""
    verdict = _Verdict()
    parents: dict[str, list[str]] = {}
    completed: dict[str, int] = {}
    claims: list[tuple[str, int]] = []
    for event in events:
        kind, task = event.get("f"), event.get("task")
        if kind not in ("dag.put", "dag.claim", "dag.complete"):
            continue
        if not isinstance(task, str):
            verdict.cannot(f"{kind} without task", event=event)
            continue
        if kind == "dag.put":
            after = event.get("after")
            if not isinstance(after, list):
                verdict.cannot("dag.put without after", event=event)
                continue
            parents[task] = [str(p) for p in after]
            continue
        number = event.get("token" if kind == "dag.claim" else "revision")
        if not _is_int(number):
            verdict.cannot(f"{kind} without its number", event=event)
            continue
        if kind == "dag.claim":
            claims.append((task, number))
        elif task in completed:
            verdict.bad("completed_twice", task=task)
        else:
            completed[task] = number
    for task, token in claims:
        for parent in parents.get(task, ()):
            done = completed.get(parent)
            if done is None or token <= done:
                verdict.bad(
                    "claimed_before_parent", task=task, token=token, parent=parent, completed=done
                )
    if not parents:
        verdict.cannot("no dag.put event: nothing to judge")
    return verdict.result(
        {
            "tasks": len(parents),
            "edges": sum(len(p) for p in parents.values()),
            "claims": len(claims),
            "completed": len(completed),
        }
    )


# ------------------------------------------------------------------ all


def queue_stats(events: Iterable[Event], qops: list[QOp]) -> dict[str, Any]:
    """What the queue workload did: puts, attempts, completions, refusals, and the
    workers' deliberate crashes, stalls and stuck attempts (``q.note``)."""
    counts: dict[str, int] = defaultdict(int)
    for op in qops:
        counts[f"{op.f}:{op.type}"] += 1
    notes: dict[str, int] = defaultdict(int)
    for event in events:
        if event.get("type") == "q.note":
            notes[str(event.get("what"))] += 1
    return {"ops": dict(sorted(counts.items())), "notes": dict(sorted(notes.items()))}


def check_queues(
    events: list[Event], ops: Iterable[QOp], params: QParams
) -> dict[str, dict[str, Any]]:
    """Every queue checker, by name (``CHECKERS``)."""
    qops = queue_ops(ops)
    return {
        "queue_origin": check_origin(qops),
        "queue_lost_put": check_lost_puts(qops),
        "queue_one_completion": check_one_completion(qops),
        "queue_exclusive": check_exclusive(qops),
        "queue_tokens": check_tokens(qops),
        "queue_dead_letter": check_dead_letters(qops, params),
    }


def queue_volume(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The queue figures the run's summary prints."""
    lost = results.get("queue_lost_put", {}).get("stats", {})
    one = results.get("queue_one_completion", {}).get("stats", {})
    return {
        "acknowledged_puts": lost.get("acknowledged_puts", 0),
        "final": lost.get("final", {}),
        "attempts": one.get("attempts", 0),
        "completions_accepted": one.get("completions_accepted", 0),
        "stale_refused": one.get("stale_refused", 0),
    }
