"""Task dependencies (issue 41; docs/queues.md, "Dependencies"): pure, deterministic.

A put may name ``after``: up to ``MAX_TASK_PARENTS`` task ids of the same queue. The
child is ready only once every parent is completed: until then it waits as a
``delayed`` task with ``waiting_on`` (the parents not completed yet), and no claim can
take it. The completion of its last pending parent makes it ready in the same entry
(or delayed until its own ``delay`` ends), so a child's claim always comes after
every parent's completion in the log, and its token (the claim's revision) is above
every parent's completion revision. A parent that dies (dead-lettered: attempts used
up, deadline passed) kills its waiting children in the same entry, with the reason
``parent <id> is dead: <its reason>``, and so on down the graph. A put naming a dead
parent puts the child dead at once. The claim of a child carries its parents'
results (those still kept).

These functions are ``TaskQueues``' (core/queue.py), split out to keep that file to
the queue itself; ``children`` (parent id -> waiting child ids) is derived from the
task records, rebuilt on restore.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..limits import MAX_ID_CHARS, MAX_TASK_PARENTS
from .checks import valid_str
from .records import Result, error
from .task_records import COMPLETED, DEAD, TaskRecord


class TaskState(Protocol):
    """What these functions need of the task queues (``task_state.TaskState`` is
    one): the task records and the derived children index."""

    tasks: dict[str, TaskRecord]
    children: dict[str, list[str]]


def check_after(entry: dict[str, Any]) -> str | None:
    """Why a put's ``after`` is malformed, or None. On the wire and in the entry it
    is a key set (``[[task id, 1], ...]``: the table's ``keyset`` kind, so every
    surface reads it alike); ``parents`` gives the ids."""
    if "after" not in entry:
        return None
    after = entry["after"]
    if (
        not isinstance(after, list)
        or not 1 <= len(after) <= MAX_TASK_PARENTS
        or not all(
            isinstance(pair, list)
            and len(pair) == 2
            and valid_str(pair[0], MAX_ID_CHARS)
            and pair[1] == 1
            and not isinstance(pair[1], bool)
            for pair in after
        )
        or len({pair[0] for pair in after}) != len(after)
    ):
        return f"'after' must be 1 to {MAX_TASK_PARENTS} distinct task ids"
    return None


def parents(entry: dict[str, Any]) -> list[str]:
    """The parent ids of a checked put (``after``), in order."""
    return [pair[0] for pair in entry.get("after", ())]


def parents_refusal(tq: TaskState, entry: dict[str, Any]) -> Result | None:
    """The refusal of a put whose parents are not tasks of its queue (nothing
    changed), or None."""
    for tid in parents(entry):
        parent = tq.tasks.get(tid)
        if parent is None or parent.queue != entry["queue"]:
            return error(
                "TASK_NOT_FOUND",
                f"queue {entry['queue']!r} has no task {tid!r} to run after (never put, "
                "purged, or dropped after its retention)",
                parent=tid,
            )
    return None


def link(tq: TaskState, task: TaskRecord, after: list[str]) -> str:
    """Record ``task``'s parents; returns why it is dead at once ("" if not): the
    first dead parent. Parents not completed yet are its ``waiting_on``."""
    task.after = list(after)
    pending = []
    for tid in after:
        parent = tq.tasks[tid]
        if parent.status == DEAD:
            return f"parent {tid} is dead: {parent.dead_reason}"
        if parent.status != COMPLETED:
            pending.append(tid)
    task.waiting_on = pending
    for tid in pending:
        tq.children.setdefault(tid, []).append(task.tid)
    return ""


def released_children(tq: TaskState, parent: TaskRecord) -> list[TaskRecord]:
    """``parent`` completed: its waiting children with no other pending parent, in
    put order of the links (they are made ready by the caller)."""
    out = []
    for cid in tq.children.pop(parent.tid, ()):
        child = tq.tasks.get(cid)
        if child is None or parent.tid not in child.waiting_on:
            continue  # dead meanwhile (another parent died), or purged
        child.waiting_on.remove(parent.tid)
        if not child.waiting_on:
            out.append(child)
    return out


def doomed_children(tq: TaskState, parent: TaskRecord) -> list[tuple[TaskRecord, str]]:
    """``parent`` died: every task that waits on it, directly or through other
    waiting tasks, with its reason (the caller kills them; parents first)."""
    out: list[tuple[TaskRecord, str]] = []
    stack = [parent]
    while stack:
        dead = stack.pop()
        why = f"parent {dead.tid} is dead: {dead.dead_reason}"
        for cid in tq.children.pop(dead.tid, ()):
            child = tq.tasks.get(cid)
            if child is None or dead.tid not in child.waiting_on:
                continue
            for other in child.waiting_on:  # it waits on nothing any more
                siblings = tq.children.get(other)
                if siblings is not None and cid in siblings:
                    siblings.remove(cid)
                    if not siblings:
                        del tq.children[other]
            child.waiting_on = []
            child.dead_reason = why  # read by its own children's reason
            out.append((child, why))
            stack.append(child)
    return out


def parent_results(tq: TaskState, task: TaskRecord) -> dict[str, Any]:
    """The results of ``task``'s completed parents still kept (JSON text each)."""
    out: dict[str, Any] = {}
    for tid in task.after:
        parent = tq.tasks.get(tid)
        if parent is not None and parent.status == COMPLETED:
            out[tid] = parent.result
    return out


def dead_parent(tq: TaskState, task: TaskRecord) -> str:
    """The first of ``task``'s parents that is dead ("" if none): a dead child is
    retried only after its dead parents are."""
    for tid in task.after:
        parent = tq.tasks.get(tid)
        if parent is not None and parent.status == DEAD:
            return tid
    return ""


def relink(tq: TaskState, task: TaskRecord) -> bool:
    """A retried dead ``task`` waits again on its parents that are not completed (and
    still kept; a parent dropped was completed). Returns whether any holds it."""
    for tid in task.waiting_on:  # its old links (a child killed by a deadline)
        siblings = tq.children.get(tid)
        if siblings is not None and task.tid in siblings:
            siblings.remove(task.tid)
            if not siblings:
                del tq.children[tid]
    pending = [
        tid
        for tid in task.after
        if (parent := tq.tasks.get(tid)) is not None and parent.status != COMPLETED
    ]
    task.waiting_on = pending
    for tid in pending:
        tq.children.setdefault(tid, []).append(task.tid)
    return bool(pending)


def rebuild(tq: TaskState) -> None:
    """``children`` from the task records (after a restore)."""
    tq.children = {}
    for task in tq.tasks.values():
        for tid in task.waiting_on:
            tq.children.setdefault(tid, []).append(task.tid)
