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
must be a subset. Fair shares decide between the queue's tenants (fairness keys; ""
the default one): the claim goes to the backlogged tenant with the smallest pass
(virtual time, advanced by ``FAIR_SCALE // weight`` per claim; ties by name) that has
a task the worker can take; within it, the claimer gets the best such task: the
smallest rank (``task_records.task_rank``: priority aged by the time the task has
been ready, a static key computed at the put), then oldest put. A queue whose puts
name no fairness key has only the default tenant: the order is the rank's alone.

A claim that finds nothing and has ``wait`` joins the queue's waiting claims (in the
state, so they survive a leader change); a task that becomes ready (put, released,
backoff over, retried) goes in the same entry to the *first* waiting claim that can
take it, skipping claims that cannot, so a task only a few workers can take is never
stuck behind claims that will never take it (and the hand-over counts as its
tenant's claim).

Everything here is reached through ``LeaseStore.apply`` (store.py dispatches the
``task_*`` ops to ``TaskQueues``). docs/queues.md gives the semantics and the safety
argument.
"""

from __future__ import annotations

import hashlib
import heapq
from typing import Any

from ..limits import DEFAULT_COMPLETED_TASKS, DEFAULT_QUEUE_TASKS, MAX_QUEUE_TENANTS
from . import deps, effects
from .certkeys import holder_key_of
from .checks import TASK_MUTATING_OPS
from .records import LeaseSession, Result, error, waiter_refusal
from .task_records import (
    CLAIMED,
    COMPLETED,
    DEAD,
    DEFAULT_BACKOFF_MS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETENTION_MS,
    DEFAULT_TASK_TTL_MS,
    DELAYED,
    FAIR_SCALE,
    MAX_BACKOFF_MS,
    MAX_HISTORY,
    MAX_PAYLOAD_BYTES,
    MAX_RESULT_BYTES,
    MAX_WAITING_CLAIMS,
    READY,
    Attempt,
    ClaimWaiter,
    Host,
    QueueState,
    TaskRecord,
    Tenant,
    check_task_args,
    task_rank,
)
from .task_state import TaskState

# ------------------------------------------------------------------- the model


def _jitter(seed: int, tid: str, number: int) -> int:
    """A deterministic fraction (parts per million) from the entry's leader-drawn
    ``seed``, different per task and attempt."""
    digest = hashlib.blake2b(f"{seed}:{tid}:{number}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 1_000_000


class TaskQueues(TaskState):
    """The task queues of one store: every mutation, and time (``advance``). The
    state and its reads are ``task_state.TaskState``'s. Single-threaded (``apply``)."""

    def _event(self, host: Host, kind: str, task: TaskRecord, **extra: Any) -> None:
        """A task change on the watch stream: one revision per event (the watch
        history relies on contiguous revisions). ``key`` is ``queue:<name>/<tid>``,
        ``owner`` the worker, ``token`` the attempt's token, ``value`` the task's
        status after the change, ``units`` the attempt number; ``lease_id`` (the
        attempt id) and ``tid`` are for the server's long-polls, never shown."""
        host.revision += 1
        host.audit.add(
            host.now,
            kind,
            f"queue:{task.queue}/{task.tid}",
            extra.get("token", 0),
            extra.get("worker", ""),
            task.principal,
            host.audit_actor,
            host.revision,
        )
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
            if "holder_key" in entry and holder_key_of(entry) != attempt.holder:
                # Checked before anything changes, as a lease's renewal (store.py):
                # a certificate binds the key its claim named, never a later one.
                return error(
                    "HOLDER_KEY_MISMATCH",
                    f"this heartbeat names another holder key than the attempt on task "
                    f"{task.tid!r} was claimed with (or it was claimed with none)",
                    tid=task.tid,
                )
            return self._heartbeat(host, task, attempt, entry)
        if op == "task_effect_begin":
            return self._effect_begin(task, attempt, entry)
        if op == "task_effect_commit":
            return effects.commit(task, attempt, entry)
        if op == "task_complete":
            self._end_attempt(host, attempt, "completed", "")
            task.result = entry.get("result", "")
            self._finish(host, task, COMPLETED)
            self._tally(self._queue(task.queue), "completions")
            self._event(host, "task_complete", task, worker=attempt.worker, token=attempt.token)
            revision = host.revision  # the completion's own (children's claims follow)
            # Its waiting children with no other pending parent become ready in this
            # entry (or delayed until their own delay ends): after the completion.
            self._release_children(host, task)
            # The bound counts this task too (it may be the oldest, with a tiny bound).
            self._bound_completed(entry.get("max_completed", DEFAULT_COMPLETED_TASKS))
            return {
                "ok": True,
                "tid": attempt.tid,
                "token": attempt.token,
                "revision": revision,
            }
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

    def _effect_begin(self, task: TaskRecord, attempt: Attempt, entry: dict[str, Any]) -> Result:
        """The journal's begin (core/effects.py); a method so a planted build can
        skip the check of what earlier attempts left."""
        return effects.begin(task, attempt, entry)

    def _link(self, task: TaskRecord, parents: list[str]) -> str:
        """Record ``task``'s parents (core/deps.py); a method so a planted build can
        ready a child early."""
        return deps.link(self, task, parents)

    def _release_children(self, host: Host, parent: TaskRecord) -> None:
        """``parent`` completed: the children it held back go on (core/deps.py)."""
        for child in deps.released_children(self, parent):
            if child.status != DELAYED:
                continue
            if child.ready_at <= host.now:
                self._make_ready(host, child)
            else:
                heapq.heappush(self._delayed, (child.ready_at, child.seq, child.tid))

    def _kill_children(self, host: Host, parent: TaskRecord) -> None:
        """``parent`` is dead: every task waiting on it dies too, with the reason."""
        for child, why in deps.doomed_children(self, parent):
            if child.status == DELAYED:
                self._kill(child, why)
                self._event(host, "task_dead", child)

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
        refused = self._principal_quotas(name, entry) or deps.parents_refusal(self, entry)
        if refused is not None:
            return refused
        tenant_name: str = entry.get("fairness_key", "")
        if (
            queue is not None
            and tenant_name not in queue.tenants
            and len(queue.tenants) >= MAX_QUEUE_TENANTS
        ):
            return error(
                "QUOTA_EXCEEDED",
                f"queue {name!r} already has {len(queue.tenants)} fairness keys with "
                f"tasks that are not completed; at most {MAX_QUEUE_TENANTS}",
                queue=name,
                tenants=len(queue.tenants),
                quota=MAX_QUEUE_TENANTS,
                setting="max_queue_tenants",
            )
        queue = self._queue(name)
        self.order += 1
        now = host.now
        delay: int = entry.get("delay", 0)
        deadline: int = entry.get("deadline", 0)
        priority: int = entry.get("priority", 0)
        task = TaskRecord(
            tid=entry["tid"],
            queue=name,
            payload=entry["payload"],
            priority=priority,
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
            # Aged from the time the put makes it ready (a delay is not waiting).
            rank=task_rank(priority, now + delay, entry.get("aging")),
            tenant=tenant_name,
        )
        self.tasks[task.tid] = task
        self._hold(task)
        if "weight" in entry:
            # The latest put that names a weight sets its tenant's; later claims of
            # the tenant advance its pass by the new stride.
            queue.tenants[tenant_name].weight = entry["weight"]
        if dedup_key:
            queue.dedup[dedup_key] = task.tid
        if task.deadline_at:
            heapq.heappush(self._deadlines, (task.deadline_at, task.tid))
        doomed = self._link(task, deps.parents(entry)) if "after" in entry else ""
        if doomed:
            # A dead parent: the child is dead at once, with the reason.
            self._move(queue, None, DELAYED)
            self._event(host, "task_put", task)
            self._kill(task, doomed)
            self._event(host, "task_dead", task)
        elif delay > 0 or task.waiting_on:
            # Waiting for its delay or its parents (a delayed item of a task that
            # still waits on parents is skipped by ``advance``).
            self._move(queue, None, DELAYED)
            if delay > 0:
                heapq.heappush(self._delayed, (task.ready_at, task.seq, task.tid))
            self._event(host, "task_put", task)
        else:
            # The put's event comes before the claim that may take it at once.
            task.status = READY
            self._move(queue, None, READY)
            self._event(host, "task_put", task)
            self._make_ready(host, task)
        return {"ok": True, "tid": task.tid, "status": task.status, "revision": host.revision}

    def _principal_quotas(self, name: str, entry: dict[str, Any]) -> Result | None:
        """The refusal of a put by the quotas of its principal, or None to go on.

        The quotas come from the entry (``tasks_quota``: ``max_tasks_per_principal``,
        ``queues_quota``: ``max_queues_per_principal``, stamped by the leader), never
        from config, so every replica decides alike. What counts is every task the
        principal put that is not completed (ready, delayed, claimed or dead: a dead
        task stays until purged or retried), and the distinct queues holding them.
        A put with no principal, or an entry without a stamp (unauthenticated, or
        written before the quotas existed), is not limited by it, so an old log
        replays exactly as before. Returns a ``QUOTA_EXCEEDED`` error (nothing
        changed) naming the setting, its limit and the principal."""
        principal: str = entry.get("principal", "")
        if not principal:
            return None
        tasks_quota = entry.get("tasks_quota")
        held = self.held_by.get(principal, 0)
        if tasks_quota is not None and held >= tasks_quota:
            return error(
                "QUOTA_EXCEEDED",
                f"{principal} has {held} tasks that are not completed (ready, delayed, "
                f"claimed or dead); its quota is {tasks_quota} (max_tasks_per_principal)",
                quota=tasks_quota,
                setting="max_tasks_per_principal",
                principal=principal,
                tasks=held,
            )
        queues_quota = entry.get("queues_quota")
        queues = self.queues_by.get(principal, {})
        # Only a put into a queue where it holds no open task yet takes a new slot.
        if queues_quota is not None and name not in queues and len(queues) >= queues_quota:
            return error(
                "QUOTA_EXCEEDED",
                f"{principal} has tasks that are not completed in {len(queues)} queues; "
                f"its quota is {queues_quota} (max_queues_per_principal)",
                quota=queues_quota,
                setting="max_queues_per_principal",
                principal=principal,
                queues=len(queues),
                queue=name,
            )
        return None

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
        # A budget gate (docs/budgets.md) is checked before a task is taken off its
        # heap, and its cost drawn only with the claim, in this entry.
        refusal = host.budgets.gate_refusal(entry, host.now)
        if refusal is not None:
            return refusal
        queue = self.queues.get(name)
        task = self._best_ready(queue, caps) if queue is not None else None
        if task is not None:
            host.budgets.gate_draw(entry)
            attempt = self._start(host, task, entry["aid"], entry, sid, principal)
            return self.claim_result(host, attempt)
        wait: int = entry.get("wait", 0)
        # A gated claim does not wait: a task handed to it later, in another entry,
        # could find the budget empty.
        if wait <= 0 or "gate_budget" in entry:
            return {"ok": True, "claimed": False, "queue": name, "now": host.now}
        # The waiter bounds, as for queued acquires (stamped by the leader): without
        # them a flood of waiting claims on new queue names would grow the state for
        # as long as their waits (up to a year) last.
        waiting = self.claims_by.get(principal, 0)
        refusal = waiter_refusal(entry, "waiting claims", waiting, len(self.claims))
        if refusal is not None:
            return refusal
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
            holder=holder_key_of(entry),  # bound to the attempt it is handed
        )
        self.claims[waiter.aid] = waiter
        if principal:
            self.claims_by[principal] = waiting + 1
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
                "dropped after its retention or by max_completed_tasks)",
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
        checkpoint = entry.get("checkpoint")
        if checkpoint is not None:
            # Kept on the task, not the attempt: it outlives this attempt and is
            # handed to the next claim (only the current attempt gets this far).
            task.checkpoint = checkpoint
            task.checkpoint_attempt = attempt.number
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
                    "TASK_STATE",
                    f"task {tid!r} is {task.status}, not dead: only a dead task is retried",
                    status=task.status,
                )
            blocked = deps.dead_parent(self, task)
            if blocked:
                return error(
                    "TASK_STATE",
                    f"task {tid!r} runs after {blocked!r}, which is dead: retry that first",
                    parent=blocked,
                )
            del queue.dead[tid]
            self._tally(queue, "retries")
            task.failures = 0
            task.dead_reason = ""
            task.deadline_at = 0  # a retried task gets a fresh budget and no deadline
            self._event(host, "task_retry", task)
            if deps.relink(self, task):  # parents not completed yet hold it again
                self._move(queue, task.status, DELAYED)
                task.status = DELAYED
            else:
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
        """Take the task a claim offering ``caps`` gets off its heap, or None: of the
        backlogged tenants, the one with the smallest ``(pass, name)`` that has a task
        ``caps`` satisfies; of its tasks, the best such one (smallest rank, then oldest
        put; ``_tenant_best``). A tenant whose tasks the worker cannot take is skipped
        (it keeps its pass and its place), so it never blocks the others.

        Cost: O(log tenants + the chosen tenant's requirement sets) per claim, plus
        O(log tenants + requirement sets) per tenant skipped (only a claim whose
        capabilities exclude some tenants' tasks skips any). Aging costs nothing: a
        task's rank is ``ready time - priority * step``, fixed at the put, so the heaps
        stay valid (no rescan of the ready tasks per claim)."""
        turns = queue.turns
        aside: list[tuple[int, str]] = []
        seen: set[str] = set()
        found: TaskRecord | None = None
        while turns:
            item = heapq.heappop(turns)
            tenant = queue.tenants.get(item[1])
            if (
                tenant is None
                or tenant.ready_n == 0
                or tenant.vpass != item[0]
                or tenant.name in seen  # a duplicate of a live item already taken
            ):
                continue  # stale: its pass moved on, or it has no ready task left
            seen.add(tenant.name)
            found = self._tenant_best(tenant, caps)
            if found is not None:
                break  # its new turn is pushed by ``_charge`` (if it has more)
            aside.append(item)
        for item in aside:
            heapq.heappush(turns, item)
        return found

    def _tenant_best(self, tenant: Tenant, caps: dict[str, str]) -> TaskRecord | None:
        """Take ``tenant``'s best ready task ``caps`` satisfies (smallest rank, then
        oldest put) off its heap, or None. O(requirement sets + log n)."""
        best: tuple[int, int, str] | None = None
        best_heap: list[tuple[int, int, str]] | None = None
        for requires, heap in list(tenant.ready.items()):
            while heap and self._stale_ready(heap[0]):
                heapq.heappop(heap)
            if not heap:
                del tenant.ready[requires]
                continue
            if not all(caps.get(k) == v for k, v in requires):
                continue
            if best is None or heap[0] < best:
                best, best_heap = heap[0], heap
        if best is None or best_heap is None:
            return None
        heapq.heappop(best_heap)
        tenant.ready_n -= 1
        return self.tasks[best[2]]

    def _charge(self, queue: QueueState, task: TaskRecord) -> None:
        """A claim of ``task`` (from the heaps or handed to a waiting claim) is its
        tenant's turn: the turn starts at ``max(its pass, the queue's virtual time)``
        (a tenant back from idling gets no credit for the idle time), the queue's
        virtual time moves to that start, and the tenant's pass to start + ``FAIR_SCALE
        // weight``, where its next turn is queued if it has more ready tasks."""
        tenant = queue.tenants[task.tenant]
        start = max(tenant.vpass, queue.vtime)
        queue.vtime = start
        tenant.vpass = start + FAIR_SCALE // tenant.weight
        if tenant.ready_n:
            self._push_turn(queue, tenant)

    def _push_turn(self, queue: QueueState, tenant: Tenant) -> None:
        """Queue ``tenant``'s turn at its pass; rebuild the heap of turns when stale
        items outnumber the tenants 4 to 1 (memory only: the order is unchanged)."""
        turns = queue.turns
        heapq.heappush(turns, (tenant.vpass, tenant.name))
        if len(turns) > 64 and len(turns) > 4 * len(queue.tenants):
            queue.turns = [(t.vpass, t.name) for t in queue.tenants.values() if t.ready_n]
            heapq.heapify(queue.turns)

    def _stale_ready(self, item: tuple[int, int, str]) -> bool:
        """Whether a ready-heap item no longer stands for a ready task: its task left
        READY, or was removed and its id used again by a later put (the put order
        ``seq`` is never reused), which may be in another queue or need other
        capabilities than the heap the item sits in."""
        task = self.tasks.get(item[2])
        return task is None or task.status != READY or task.seq != item[1]

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
                if waiter.holder is not None:
                    entry["holder_key"] = waiter.holder.hex()
                self._start(host, task, aid, entry, waiter.session, waiter.principal)
                return
        tenant = queue.tenants[task.tenant]
        if tenant.ready_n == 0:
            # Backlogged again: it starts at the queue's virtual time if its own pass
            # is behind (idling earns no burst of claims).
            tenant.vpass = max(tenant.vpass, queue.vtime)
            self._push_turn(queue, tenant)
        tenant.ready_n += 1
        heap = tenant.ready.setdefault(task.requires, [])
        heapq.heappush(heap, (task.rank, task.seq, task.tid))
        # Waiting since now (for the metrics: the first item waited longest).
        task.ready_at = host.now
        queue.ready_since.pop(task.tid, None)
        queue.ready_since[task.tid] = host.now
        if len(heap) > 64 and len(heap) > 4 * max(1, queue.counts.get(READY, 0)):
            tenant.ready[task.requires] = [i for i in heap if not self._stale_ready(i)]
            heapq.heapify(tenant.ready[task.requires])

    def _drop_claim(self, host: Host, waiter: ClaimWaiter, reason: str) -> None:
        del self.claims[waiter.aid]
        if waiter.principal:
            left = self.claims_by.get(waiter.principal, 0) - 1
            if left > 0:
                self.claims_by[waiter.principal] = left
            else:
                self.claims_by.pop(waiter.principal, None)
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
        self._charge(queue, task)
        self._move(queue, task.status, CLAIMED)
        queue.ready_since.pop(task.tid, None)
        task.status = CLAIMED
        task.attempts += 1
        queue.claims_total += 1
        self.totals["claims"] += 1
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
            holder=holder_key_of(entry),
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
        if kind == "task_expire":
            self._tally(queue, "expiries")
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
            self._tally(queue, "retries")
            self._move(queue, task.status, DELAYED)
            task.status = DELAYED
            task.ready_at = now + delay
            if delay > 0:
                heapq.heappush(self._delayed, (task.ready_at, task.seq, task.tid))
        self._event(
            host, kind, task, worker=attempt.worker, token=attempt.token, number=attempt.number
        )
        if task.status == DEAD:
            self._kill_children(host, task)
        if task.status == DELAYED and task.ready_at <= now:
            self._make_ready(host, task)

    def _kill(self, task: TaskRecord, why: str) -> None:
        queue = self._queue(task.queue)
        if task.status == READY:  # its heap item goes stale
            queue.tenants[task.tenant].ready_n -= 1
        self._move(queue, task.status, DEAD)
        queue.ready_since.pop(task.tid, None)
        self._tally(queue, "dead_letters")
        task.status = DEAD
        task.dead_reason = why
        queue.dead[task.tid] = None

    def _finish(self, host: Host, task: TaskRecord, status: str) -> None:
        queue = self._queue(task.queue)
        self._move(queue, task.status, status)
        task.status = status
        task.finished_at = host.now
        self._unhold(task)  # a completed task is bounded by max_completed_tasks instead
        heapq.heappush(self._drops, (host.now + task.retention_ms, task.tid))
        if status == COMPLETED:
            self.completed += 1
            heapq.heappush(self._completed, (task.finished_at, task.seq, task.tid))
            if len(self._completed) > 64 and len(self._completed) > 2 * self.completed:
                self._compact_completed()

    def _bound_completed(self, bound: int) -> None:
        """``max_completed_tasks`` (stamped by the leader into each completion):
        while more completed tasks are retained than ``bound``, across all queues,
        forget the oldest by ``(finished_at, put order)``, as its retention would
        (no event, no revision). The victim is derived from the task records alone,
        so a replica restored from a snapshot picks the same one."""
        while self.completed > bound:
            oldest = self.oldest_completed()
            if oldest is None:  # pragma: no cover - the count says one exists
                break
            self._remove(oldest)

    def _remove(self, task: TaskRecord) -> None:
        """Forget a dead or completed task (purge, retention over, or the count
        bound on completed tasks)."""
        queue = self._queue(task.queue)
        if task.status == DEAD:
            self._unhold(task)
            queue.dead.pop(task.tid, None)
        elif task.status == COMPLETED:
            self.completed -= 1
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
            if (
                task is not None
                and task.status == DELAYED
                and task.ready_at == ready_at
                and not task.waiting_on  # still waits on a parent (core/deps.py)
            ):
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
        self._kill_children(host, task)

    def session_kept(self, host: Host, session: LeaseSession) -> None:
        """A keep-alive moved ``session``'s expiry: its attached attempts move with
        it, later or earlier (a keep-alive may shorten the TTL). An attached attempt
        ends with its session, so an attempt that kept a later expiry would be
        reported valid (heartbeat, claim status) after its task went to another
        worker."""
        for aid in self.by_session.get(session.session_id, {}):
            attempt = self.attempts.get(aid)
            if attempt is None:
                continue
            attempt.ttl_ms = session.ttl_ms
            if attempt.expires_at != session.expires_at:
                attempt.expires_at = session.expires_at
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


def check_queue_args(op: str, entry: dict[str, Any]) -> str | None:
    """Why a ``task_*`` entry is malformed, or None: the task checks, then the
    effect journal's (core/effects.py) for its two operations."""
    problem = check_task_args(op, entry)
    if problem is None and op in effects.EFFECT_OPS:
        problem = effects.check_effect_args(op, entry)
    if problem is None and op == "task_put":
        problem = deps.check_after(entry)
    return problem


__all__ = [
    "DEFAULT_QUEUE_TASKS",
    "MAX_PAYLOAD_BYTES",
    "MAX_RESULT_BYTES",
    "TASK_MUTATING_OPS",
    "TaskQueues",
    "check_queue_args",
    "check_task_args",
]
