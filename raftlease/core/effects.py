"""The effect journal of a task's attempts (issue 41; docs/queues.md, "Effects"):
pure, deterministic, no I/O.

A worker about to call something outside the cluster (charge a card, send a mail)
first *begins* the effect (its id, and an idempotency key to hand the provider): the
intent is in the log, with the attempt's token, before the call. After the call it
*commits* the effect with its result. A later attempt of the same task that reaches
the same effect id learns, from the log, that the effect is

* ``committed`` (with the result): it skips the call;
* ``in_progress`` by an earlier token: the call may or may not have happened; the
  answer names that token and the idempotency key so the worker can reconcile with the
  provider. The intent now belongs to the asking attempt (its token), so only it can
  commit it; the idempotency key stays the first intent's.

Only the task's current attempt may begin or commit (``TaskQueues._current``: any
other is ``STALE_ATTEMPT``, definite), so a zombie worker's commit is refused. A row is
``[effect id, state, token, attempt number, idempotency key, result]`` with state
``begun`` or ``committed``; a task keeps at most ``MAX_TASK_EFFECTS`` of them, for as
long as the task is kept (a retried dead task keeps them: its effects stay done).
"""

from __future__ import annotations

from typing import Any

from ..limits import (
    MAX_EFFECT_ID_BYTES,
    MAX_EFFECT_KEY_BYTES,
    MAX_EFFECT_RESULT_BYTES,
    MAX_TASK_EFFECTS,
)
from .checks import utf8_prefix, utf8_size, valid_str
from .records import Result, error
from .task_records import Attempt, TaskRecord

BEGUN, COMMITTED = "begun", "committed"
EFFECT_OPS = frozenset({"task_effect_begin", "task_effect_commit"})


def check_effect_args(op: str, entry: dict[str, Any]) -> str | None:
    """Why an effect entry is malformed, or None (structural only)."""
    if not valid_str(entry.get("effect"), MAX_EFFECT_ID_BYTES):
        return f"'effect' must be a non-empty string of at most {MAX_EFFECT_ID_BYTES} bytes"
    if (
        op == "task_effect_begin"
        and "key" in entry
        and not valid_str(entry["key"], MAX_EFFECT_KEY_BYTES)
    ):
        return f"'key' must be a non-empty string of at most {MAX_EFFECT_KEY_BYTES} bytes"
    if op == "task_effect_commit" and "result" in entry:
        result = entry["result"]
        if not isinstance(result, str) or utf8_size(result) > MAX_EFFECT_RESULT_BYTES:
            return f"'result' must be a string of at most {MAX_EFFECT_RESULT_BYTES} bytes"
    return None


def effect_view(row: list[Any]) -> dict[str, Any]:
    """One journal row as reads show it (``get``, ``dead``)."""
    eid, state, token, number, key, result = row
    return {
        "effect": eid,
        "state": state,
        "token": token,
        "attempt": number,
        "key": key,
        "result": result,
    }


def begin(task: TaskRecord, attempt: Attempt, entry: dict[str, Any]) -> Result:
    """Record the intent of ``entry["effect"]`` for the current ``attempt`` (checked
    by the caller), or answer what an earlier attempt left (see the module)."""
    full = None
    if len(task.effects) >= MAX_TASK_EFFECTS:
        full = error(
            "QUOTA_EXCEEDED",
            f"task {task.tid!r} already records {MAX_TASK_EFFECTS} effects",
            quota=MAX_TASK_EFFECTS,
            setting="max_task_effects",
        )
    return begin_in(
        task.effects,
        task.tid,
        attempt.token,
        attempt.number,
        entry["effect"],
        entry.get("key"),
        full,
    )


def begin_in(
    journal: dict[str, list[Any]],
    name: str,
    token: int,
    number: int,
    eid: str,
    key: str | None,
    full: Result | None,
) -> Result:
    """``begin`` on any journal (a task's, or a lease key's: core/lease_effects.py):
    ``name`` derives the default idempotency key (``name:effect id``), ``token`` and
    ``number`` are the acting holder's; ``full`` is the refusal to answer if the
    effect is new and the journal may not grow (None: it may)."""
    row = journal.get(eid)
    if row is None:
        if full is not None:
            return full
        # The key defaults to one derived from the owner and effect: stable across
        # attempts (holders), so a provider that honours idempotency keys
        # deduplicates retries.
        key = key or utf8_prefix(f"{name}:{eid}", MAX_EFFECT_KEY_BYTES)
        journal[eid] = [eid, BEGUN, token, number, key, None]
        return {"ok": True, "state": "new", "effect": eid, "key": key, "token": token}
    if row[1] == COMMITTED:
        return {
            "ok": True,
            "state": "committed",
            "effect": eid,
            "key": row[4],
            "token": row[2],
            "result": row[5],
        }
    prior_token, prior_attempt = row[2], row[3]
    # The intent passes to the asking (current) holder: only it may commit it now.
    row[2], row[3] = token, number
    return {
        "ok": True,
        "state": "in_progress",
        "effect": eid,
        "key": row[4],
        "token": token,
        "prior_token": prior_token,
        "prior_attempt": prior_attempt,
    }


def commit(task: TaskRecord, attempt: Attempt, entry: dict[str, Any]) -> Result:
    """Mark ``entry["effect"]`` done with its result, for the current ``attempt``
    (checked by the caller) that began it. An effect already committed keeps its
    first result (answered with ``already``)."""
    return commit_in(task.effects, f"task {task.tid!r}", "attempt", attempt.token, entry)


def commit_in(
    journal: dict[str, list[Any]], what: str, holder: str, token: int, entry: dict[str, Any]
) -> Result:
    """``commit`` on any journal: ``what`` names its owner in messages (``task 'T'``,
    ``key 'k'``), ``holder`` the kind of holder (attempt, lease), ``token`` the
    acting holder's."""
    eid: str = entry["effect"]
    row = journal.get(eid)
    if row is None:
        return error(
            "INVALID_ARGUMENT",
            f"effect {eid!r} of {what} was never begun: begin it first",
            effect=eid,
        )
    if row[1] == COMMITTED:
        return {"ok": True, "effect": eid, "already": True, "token": row[2], "result": row[5]}
    if row[2] != token:
        return error(
            "INVALID_ARGUMENT",
            f"effect {eid!r} was begun by the {holder} with token {row[2]}, not this one: "
            f"begin it in this {holder} first (and reconcile)",
            effect=eid,
            begun_by=row[2],
        )
    row[1], row[5] = COMMITTED, entry.get("result", "null")
    return {"ok": True, "effect": eid, "already": False, "token": token, "result": row[5]}
