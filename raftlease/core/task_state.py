"""The task queues' state and its reads (``TaskState``); ``queue.TaskQueues`` adds
every mutation. Pure: no I/O, no clock, no randomness."""

from __future__ import annotations

import heapq
from typing import Any, Self

from . import deps
from .effects import effect_view
from .records import Result, error
from .task_records import (
    CLAIMED,
    COMPLETED,
    DEAD,
    DELAYED,
    READY,
    TALLIES,
    Attempt,
    ClaimWaiter,
    Host,
    QueueState,
    TaskRecord,
    Tenant,
)

#: Task states that count as open (not completed): a queue's depth.
OPEN_STATES = frozenset({READY, DELAYED, CLAIMED, DEAD})


class TaskState:
    """Every queue of one store. Single-threaded writes (``apply``); the reads are
    meant to go through the log (the server proposes ``task_get``/``task_stats``/
    ``task_dead``), except ``claim_status`` and ``task_info``, which only look up dicts
    and copy, so they are also safe from another thread while ``apply`` runs."""

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
        #: Task dependencies (core/deps.py): parent id -> ids of the tasks waiting on
        #: it, in link order. Derived from the records (rebuilt on restore).
        self.children: dict[str, list[str]] = {}
        #: Put order (FIFO within a priority) and claim arrival order.
        self.order = 0
        #: Tasks not completed (ready, delayed, claimed, dead): bounds the token
        #: headroom one entry may need.
        self.open = 0
        #: Authenticated principal -> queue -> its open tasks there (those it put,
        #: not completed), and principal -> their sum: the per-principal quotas
        #: (``max_tasks_per_principal``, ``max_queues_per_principal``: the number of
        #: queues is the inner dict's size). Moved with ``open`` (``_hold``,
        #: ``_unhold``) so each put and removal is O(1); derived from the task
        #: records, so a restored snapshot counts the same (its layout is unchanged).
        #: A principal or queue whose count reaches 0 is dropped, so these stay as
        #: small as the open tasks.
        self.held_by: dict[str, int] = {}
        self.queues_by: dict[str, dict[str, int]] = {}
        #: Authenticated principal -> its waiting claims (``max_waiters_per_principal``);
        #: moved with ``claims``, derived from them (rebuilt on restore).
        self.claims_by: dict[str, int] = {}
        # Heaps, stale items skipped when popped (rebuilt on restore):
        self._expiries: list[tuple[int, str]] = []  # (expires_at, aid)
        self._delayed: list[tuple[int, int, str]] = []  # (ready_at, seq, tid)
        self._deadlines: list[tuple[int, str]] = []  # (deadline_at, tid)
        self._claim_deadlines: list[tuple[int, str]] = []  # (deadline, aid)
        self._drops: list[tuple[int, str]] = []  # (finished_at + retention, tid)
        #: Completed tasks, oldest first by ``(finished_at, seq, tid)``: the count
        #: bound's victims (``max_completed_tasks``). Items of tasks dropped since
        #: (retention, purge) are stale; ``oldest_completed`` skips them and
        #: ``_compact_completed`` rebuilds the heap from the records.
        self._completed: list[tuple[int, int, str]] = []
        #: Completed tasks in all queues (the sum of every queue's ``counts``).
        self.completed = 0
        #: The current entry's leader-drawn seed (for backoff jitter). Not state.
        self.seed = 0
        #: ``claims`` and the ``TALLIES`` of every queue, since the cluster began
        #: (in the snapshot: a queue's own counters restart when it is forgotten,
        #: these never do). Read by the metrics.
        self.totals: dict[str, int] = dict.fromkeys(("claims", *TALLIES), 0)
        #: Tasks by state across all queues (derived from the records), for the
        #: metrics: the part of the queues a scrape does not show one by one.
        self.by_state: dict[str, int] = {}

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

    def _hold(self, task: TaskRecord) -> None:
        """``task`` is open (put, or restored not completed): count it, and toward
        the quotas of the principal that put it (an unauthenticated put has none),
        and in its tenant (created with weight 1 if new; its queue exists)."""
        self.open += 1
        tenants = self.queues[task.queue].tenants
        tenant = tenants.get(task.tenant)
        if tenant is None:
            tenant = tenants[task.tenant] = Tenant(task.tenant)
        tenant.held += 1
        principal = task.principal
        if principal:
            self.held_by[principal] = self.held_by.get(principal, 0) + 1
            queues = self.queues_by.setdefault(principal, {})
            queues[task.queue] = queues.get(task.queue, 0) + 1

    def _unhold(self, task: TaskRecord) -> None:
        """``task`` is no longer open (completed, or a dead one purged): its slot in
        its principal's quotas is free again, and a tenant left with no open task is
        forgotten (weight and pass: it comes back with weight 1 at the queue's virtual
        time, so the tenants a queue holds stay as few as its open tasks)."""
        self.open -= 1
        tenants = self.queues[task.queue].tenants
        tenant = tenants[task.tenant]
        tenant.held -= 1
        if not tenant.held:
            del tenants[task.tenant]
        principal = task.principal
        if principal:
            left = self.held_by[principal] - 1
            if left:
                self.held_by[principal] = left
            else:
                del self.held_by[principal]
            queues = self.queues_by[principal]
            there = queues[task.queue] - 1
            if there:
                queues[task.queue] = there
            else:
                del queues[task.queue]
                if not queues:
                    del self.queues_by[principal]

    def _queue(self, name: str) -> QueueState:
        queue = self.queues.get(name)
        if queue is None:
            queue = self.queues[name] = QueueState(name)
        return queue

    def _forget_if_empty(self, queue: QueueState) -> None:
        if queue.empty() and not queue.dedup:
            self.queues.pop(queue.name, None)

    def _completed_item(self, item: tuple[int, int, str]) -> bool:
        """Is ``item`` of ``_completed`` a retained completed task (not a stale
        item of a task dropped since, nor of a later task given the same id)?"""
        task = self.tasks.get(item[2])
        return (
            task is not None
            and task.status == COMPLETED
            and task.finished_at == item[0]
            and task.seq == item[1]
        )

    def _compact_completed(self) -> None:
        """Rebuild ``_completed`` from the task records once stale items outnumber
        live ones (amortized O(1) per completion; derived from the records only, so
        a restored replica holds the same set)."""
        self._completed = [
            (t.finished_at, t.seq, t.tid) for t in self.tasks.values() if t.status == COMPLETED
        ]
        heapq.heapify(self._completed)

    def oldest_completed(self) -> TaskRecord | None:
        """The completed task the count bound drops next: the oldest by
        ``(finished_at, put order)``, or None. Pops stale items on the way."""
        heap = self._completed
        while heap and not self._completed_item(heap[0]):
            heapq.heappop(heap)
        return self.tasks[heap[0][2]] if heap else None

    def _move(self, queue: QueueState, old: str | None, new: str | None) -> None:
        counts = queue.counts
        totals = self.by_state
        if old is not None:
            counts[old] = counts.get(old, 0) - 1
            totals[old] = totals.get(old, 0) - 1
            queue.depth -= old in OPEN_STATES
        if new is not None:
            counts[new] = counts.get(new, 0) + 1
            totals[new] = totals.get(new, 0) + 1
            queue.depth += new in OPEN_STATES

    def _tally(self, queue: QueueState, kind: str) -> None:
        """Count one of ``TALLIES`` for ``queue`` and for the whole store."""
        queue.tally[kind] = queue.tally.get(kind, 0) + 1
        self.totals[kind] += 1

    def oldest_ready(self, queue: QueueState) -> int | None:
        """The log time at which the ready task of ``queue`` that has waited longest
        became ready, or None. O(1). Safe from another thread while ``apply`` runs
        (a scrape): a change of the dict under it answers None for this once."""
        try:
            return next(iter(queue.ready_since.values()), None)
        except RuntimeError:  # the dict changed during the look-up
            return None

    # ------------------------------------------------------------------ reads

    def claim_result(self, host: Host, attempt: Attempt) -> Result:
        """What the claimer receives: the task and its attempt (with the attempt id,
        a capability only the claimer sees)."""
        return {"ok": True, **self._full_view(self.tasks[attempt.tid], attempt), "now": host.now}

    def _full_view(self, task: TaskRecord, attempt: Attempt) -> dict[str, Any]:
        """``_claim_view`` and, for a task with parents, their results (deps.py)."""
        view = self._claim_view(task, attempt)
        if task.after:
            view["after"] = list(task.after)
            view["parent_results"] = deps.parent_results(self, task)
        return view

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
            return {"state": "claimed", **self._full_view(task, attempt), "now": now}
        return {"state": "gone"}

    @staticmethod
    def _claim_view(task: TaskRecord, attempt: Attempt) -> dict[str, Any]:
        view: dict[str, Any] = {
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
        if task.checkpoint is not None:
            # The latest checkpoint of an earlier attempt: where this one starts.
            view["checkpoint"] = task.checkpoint
            view["checkpoint_attempt"] = task.checkpoint_attempt
        return view

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
        if task.tenant:
            info["fairness_key"] = task.tenant
        if task.status == COMPLETED:
            info["result"] = task.result
            info["finished_at"] = task.finished_at
        if task.status == DEAD:
            info["dead_reason"] = task.dead_reason
        if task.checkpoint is not None:
            info["checkpoint"] = task.checkpoint
            info["checkpoint_attempt"] = task.checkpoint_attempt
        if task.after:
            info["after"] = list(task.after)
            info["waiting_on"] = list(task.waiting_on)
        if task.effects:
            info["effects"] = [effect_view(row) for row in list(task.effects.values())]
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
                    "dropped after its retention or by max_completed_tasks)",
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
            for heap in (h for t in queue.tenants.values() for h in t.ready.values()):
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
        queues = [
            [
                q.name,
                q.claims_total,
                sorted(q.dedup.items()),
                _pairs(q.tally),
                q.vtime,
                [[t.name, t.weight, t.vpass] for _, t in sorted(q.tenants.items())],
            ]
            for q in self.queues.values()
        ]
        return {
            "order": self.order,
            "totals": _pairs(self.totals),
            "queues": queues,
            "tasks": [t.to_plain() for t in self.tasks.values()],
            "attempts": [a.to_plain() for a in self.attempts.values()],
            "claims": [w.to_plain() for w in self.claims.values()],
            "dead": [[q.name, list(q.dead)] for q in self.queues.values() if q.dead],
            # Attach order matters (a session's end processes it in this order).
            "by_session": [[sid, list(aids)] for sid, aids in self.by_session.items()],
        }

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> Self:
        """Rebuild from ``to_plain`` output (the heaps and counters are derived)."""
        tq = cls()
        tq.order = data["order"]
        for row in data["queues"]:
            name, claims_total, dedup = row[:3]
            # Layout 5 had no tallies (the counters start at 0 on upgrade).
            tally = dict(row[3]) if len(row) > 3 else {}
            queue = tq.queues[name] = QueueState(
                name, claims_total=claims_total, dedup=dict(dedup), tally=tally
            )
            # Layout 7: the virtual time and the tenants' weights and passes; before
            # it, every task is the default tenant's, at weight 1 and pass 0.
            if len(row) > 4:
                queue.vtime = row[4]
                for tenant_name, weight, vpass in row[5]:
                    queue.tenants[tenant_name] = Tenant(tenant_name, weight, vpass)
        if "totals" in data:
            tq.totals.update(dict(data["totals"]))
        else:  # layout 5: the claims the queues still count; the rest start at 0
            tq.totals["claims"] = sum(q.claims_total for q in tq.queues.values())
        for row in data["tasks"]:
            task = TaskRecord.from_plain(row)
            tq.tasks[task.tid] = task
            queue = tq._queue(task.queue)
            tq._move(queue, None, task.status)
            if task.status != COMPLETED:
                tq._hold(task)
            else:
                tq.completed += 1
            if task.status == READY:
                tenant = queue.tenants[task.tenant]
                tenant.ready_n += 1
                heap = tenant.ready.setdefault(task.requires, [])
                heap.append((task.rank, task.seq, task.tid))
            elif task.status == DELAYED:
                tq._delayed.append((task.ready_at, task.seq, task.tid))
            elif task.status == COMPLETED:
                tq._drops.append((task.finished_at + task.retention_ms, task.tid))
                tq._completed.append((task.finished_at, task.seq, task.tid))
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
            if principal:
                tq.claims_by[principal] = tq.claims_by.get(principal, 0) + 1
        for waiter in sorted(tq.claims.values(), key=lambda w: w.order):
            tq._queue(waiter.queue).claimers[waiter.aid] = None
        for sid, aids in data["by_session"]:
            tq.by_session[sid] = dict.fromkeys(aids)
        for queue in tq.queues.values():
            for tenant in queue.tenants.values():
                for heap in tenant.ready.values():
                    heapq.heapify(heap)
            queue.turns = [(t.vpass, t.name) for t in queue.tenants.values() if t.ready_n]
            heapq.heapify(queue.turns)
        # Ready tasks in the order they became ready (``ready_at`` is that time).
        ready = [t for t in tq.tasks.values() if t.status == READY]
        for task in sorted(ready, key=lambda t: (t.ready_at, t.seq)):
            tq.queues[task.queue].ready_since[task.tid] = task.ready_at
        heapq.heapify(tq._delayed)
        for pairs in (tq._drops, tq._deadlines, tq._expiries, tq._claim_deadlines):
            heapq.heapify(pairs)
        heapq.heapify(tq._completed)
        deps.rebuild(tq)
        return tq


def _pairs(counts: dict[str, int]) -> list[list[Any]]:
    """A counter dict as sorted ``[name, count]`` rows (lists, as msgpack reads them
    back, so a restored store writes the same plain data)."""
    return [[name, count] for name, count in sorted(counts.items())]
