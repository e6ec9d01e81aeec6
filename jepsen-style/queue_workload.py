"""The chaos suite's queue workload (issue 12): producers, workers, crashes, final reads.

It runs beside the lease workload (``workload.py``) under every fault kind, on the same
cluster and into the same ``History``; the events are the queue shapes of
``queue_checker.py`` (jepsen-style/README.md, *Queue events*).

* ``Producer`` (a thread): puts tasks with unique payloads (``<producer>-<n>``) into the
  queue, each with a drawn ``max_attempts`` (1 in 4 get a single attempt, so failures
  dead-letter), ``lease_ttl``, and now and then a ``progress_timeout`` or a deadline it
  cannot meet (``delay`` past its ``deadline``: dead-lettered by deadline).
* ``QueueWorker`` (a thread, or the main loop of a worker process): claims a task
  (``wait`` on the server), works on it for a while with explicit heartbeats that
  advance ``progress``, then completes it (result ``{"by", "token", "payload"}``), or
  fails it, or releases it. Sometimes it *stalls* (sleeps past its attempt's TTL, then
  tries to complete: a zombie whose late completion must be refused once the task was
  handed on) or is *stuck* (keeps heartbeating a ``progress_timeout`` task without
  advancing ``progress``: it must lose the task like a dead worker). It trusts an
  attempt up to ``send + ttl*(1-rho) - margin`` of its claim or of its last heartbeat
  that advanced progress (a heartbeat that did not is not counted as an extension), and
  records that as ``valid_until``.
* ``QueueProcess``: a ``QueueWorker`` in its own process (``python queue_workload.py
  --endpoints ...``), its events copied from stdout into the history, so that
  ``Crasher`` can SIGKILL a real worker process while it holds a task (it announces each
  claim with a ``marker`` line) and start another one (a new process name).
* ``final_reads``: after the clients stopped and the faults healed, one ``q.get`` per
  acknowledged put and one ``q.dead`` (``final``: true), retried until they answer.

Threads: ``History`` is thread-safe; each ``QueueWorker`` and ``Producer`` runs on its own
thread with its own ``raftlease.Client``; ``Crasher`` on one more. Each stops at ``stop``;
every call is bounded by the client deadline. Nothing raises out of a thread: a client
bug is an ``info`` completion.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import secure
from workload import History

from raftlease import Client
from raftlease.errors import RaftLeaseError

Event = dict[str, Any]
HERE = Path(__file__).resolve().parent
#: The most dead-letter entries one read returns (raftlease.limits.MAX_DEAD_LIST).
DEAD_LIST_LIMIT = 10_000
#: What a read or purge of a task the cluster does not know answers.
NOT_FOUND_CODES = frozenset({"TASK_NOT_FOUND", "NOT_FOUND"})


@dataclass(frozen=True)
class QueueConfig:
    """The queue workload's shape. Times in seconds."""

    queue: str = "jobs"
    producers: int = 1
    #: Worker threads in the harness process, and worker processes (SIGKILLed).
    workers: int = 3
    processes: int = 1
    put_every: tuple[float, float] = (0.15, 0.35)
    #: Drawn per put: 1 in 4 tasks gets one attempt (a failure dead-letters it).
    max_attempts: tuple[int, ...] = (1, 3, 3, 4)
    lease_ttls: tuple[float, ...] = (1.0, 1.5, 2.0)
    #: Every n-th put has ``progress_timeout``; every m-th a deadline it cannot meet.
    progress_every: int = 4
    progress_timeout: float = 1.0
    deadline_every: int = 20
    claim_wait: float = 1.0
    work: tuple[float, float] = (0.02, 0.4)
    p_fail: float = 0.1
    p_release: float = 0.05
    p_stall: float = 0.08
    #: A stall lasts the attempt's TTL plus this: past the expiry and the first retry
    #: backoff (0.5-1 s by default), so the task is usually handed on meanwhile.
    stall_extra: float = 2.5
    stall_poll: float = 0.05
    p_stuck: float = 0.3  # of the attempts of a progress_timeout task
    #: Seconds between SIGKILLs of the worker process (drawn), while it holds a task.
    crash_every: tuple[float, float] = (4.0, 9.0)
    deadline: float = 3.0  # client call deadline
    attempt_timeout: float = 1.0
    clock_drift: float = 0.01
    margin: float = 0.05
    #: Seconds after its put's answer when the janitor purges a finished task (0: no
    #: janitor). The soak profile sets it so that the replicated state levels off
    #: within its warm-up: completed tasks are otherwise kept for their retention (an
    #: hour by default) and dead letters until purged, so the state (and every node's
    #: memory) would grow all run, which the resource rules cannot tell from a leak.
    purge_after: float = 0.0
    #: Seconds between janitor rounds, and the most purges one round sends.
    purge_every: float = 1.0
    purge_batch: int = 50

    def meta(self) -> dict[str, Any]:
        """The ``meta`` event's ``queues`` entry."""
        return {
            self.queue: {
                "producers": self.producers,
                "workers": self.workers,
                "processes": self.processes,
                "max_attempts": list(self.max_attempts),
                "lease_ttls": list(self.lease_ttls),
                "progress_timeout": self.progress_timeout,
                "purge_after": self.purge_after,
            }
        }


# ------------------------------------------------------- the client API seam


def _field(obj: Any, *names: str) -> Any:
    """The first of ``names`` present on ``obj`` (an attribute or a mapping key)."""
    for name in names:
        if isinstance(obj, dict) and name in obj:
            return obj[name]
        if not isinstance(obj, dict) and hasattr(obj, name):
            return getattr(obj, name)
    return None


def task_id(task: Any) -> str | None:
    value = _field(task, "task_id", "id", "tid")
    return None if value is None else str(value)


def describe_task_state(state: Any) -> dict[str, Any]:
    """A ``q.get`` answer as the checkers read it: ``status``, ``attempts``,
    ``result``, ``reason``. A pending task's reason says why it is pending."""
    status = _field(state, "status", "state")
    status = None if status is None else str(status).lower()
    out: dict[str, Any] = {
        "status": status,
        "attempts": _field(state, "attempts", "attempt"),
        "failures": _field(state, "failures"),
    }
    if status == "completed":
        out["result"] = _field(state, "result")
    elif status == "dead":
        out["reason"] = dead_reason(state)
        out["payload"] = _field(_field(state, "payload"), "id")  # see describe_dead
    elif status == "ready":
        out["reason"] = "ready at the end: the workers had stopped"
    elif status == "delayed":
        out["reason"] = "waiting out a retry backoff or its delay at the end"
    elif status == "claimed":
        out["reason"] = "an attempt still held at the end (its lease had not run out)"
    return out


def dead_reason(state: Any) -> str | None:
    """``attempts`` or ``deadline``: why a task was dead-lettered, as the checkers
    name it (None: the answer did not say)."""
    raw = _field(state, "dead_reason", "reason", "why")
    if raw is None:
        return None
    text = str(raw).lower()
    if "deadline" in text or "expired" in text:
        return "deadline"
    if "attempt" in text:
        return "attempts"
    return text


def describe_dead(entries: Any) -> list[dict[str, Any]]:
    """A ``q.dead`` answer as ``[{task, attempts, failures, reason, payload}]``;
    ``payload`` is the producer's unique payload id (None if the entry has none), so
    a dead letter of a put whose answer was lost can still be matched to its put."""
    out = []
    for entry in list(entries or []):
        out.append(
            {
                "task": task_id(entry),
                "attempts": _field(entry, "attempts", "attempt"),
                "failures": _field(entry, "failures"),
                "reason": dead_reason(entry),
                "payload": _field(_field(entry, "payload"), "id"),
            }
        )
    return out


# ----------------------------------------------------------------- recording


class Recorder:
    """Records client calls as ``invoke`` + ``ok`` / ``fail`` (definite) / ``info``."""

    def __init__(self, name: str, emit: Callable[[Event], Any], queue: str) -> None:
        self.name = name
        self.emit = emit
        self.queue = queue
        self.ops = 0

    def call(
        self,
        f: str,
        value: dict[str, Any],
        call: Callable[[], Any],
        describe: Callable[[Any, float], dict[str, Any]] | None = None,
    ) -> Any:
        """Run ``call``, recording it. Returns its result, or the exception it raised
        (a ``RaftLeaseError``, or anything else: a client bug, recorded as ``info``).
        ``describe(result, sent)`` gives the ok value."""
        self.ops += 1
        base = {"op": f"{self.name}:{self.ops}", "process": self.name, "f": f, "key": self.queue}
        sent = time.monotonic()
        self.emit({**base, "type": "invoke", "value": value, "t": sent})
        try:
            result = call()
        except RaftLeaseError as err:
            self.emit(
                {
                    **base,
                    "type": "fail" if err.definite else "info",
                    "error": err.code,
                    "message": err.message[:200],
                    "t": time.monotonic(),
                }
            )
            return err
        except Exception as exc:  # a client bug: unknown outcome, keep going
            self.emit(
                {
                    **base,
                    "type": "info",
                    "error": type(exc).__name__,
                    "message": str(exc)[:200],
                    "t": time.monotonic(),
                }
            )
            return exc
        done = time.monotonic()
        ok = describe(result, sent) if describe is not None else {}
        self.emit({**base, "type": "ok", "value": ok, "t": done})
        return result

    def note(self, what: str, **detail: Any) -> None:
        self.emit({"type": "q.note", "what": what, "process": self.name, **detail})


def _failed(result: Any) -> bool:
    return isinstance(result, BaseException)


# ------------------------------------------------------------------ producer


class Producer:
    """Puts tasks with unique payloads until ``stop``. ``acknowledged`` collects the
    ids of acknowledged puts (for the final reads)."""

    def __init__(
        self,
        name: str,
        client: Client,
        emit: Callable[[Event], Any],
        config: QueueConfig,
        seed: int,
        acknowledged: list[str],
    ) -> None:
        self.name = name
        self.queue = client.queue(config.queue)
        self.config = config
        self.rng = random.Random(seed)
        self.rec = Recorder(name, emit, config.queue)
        self.acknowledged = acknowledged
        self.n = 0

    def step(self) -> None:
        cfg, rng = self.config, self.rng
        self.n += 1
        payload = f"{self.name}-{self.n}"
        options: dict[str, Any] = {
            "max_attempts": rng.choice(cfg.max_attempts),
            "lease_ttl": rng.choice(cfg.lease_ttls),
        }
        if self.n % cfg.progress_every == 0:
            options["progress_timeout"] = cfg.progress_timeout
        if self.n % cfg.deadline_every == 0:
            # A deadline before the task can be claimed: it must be dead-lettered for it.
            options["deadline"] = 1.0
            options["delay"] = 2.0
        value = {"payload": payload, **options}
        result = self.rec.call(
            "q.put",
            value,
            # The payload carries progress_timeout: the worker's own expiry depends on it.
            lambda: self.queue.put(
                {"id": payload, "n": self.n, "pt": options.get("progress_timeout")}, **options
            ),
            lambda tid, _sent: {"task": str(tid)},
        )
        if not _failed(result):
            self.acknowledged.append(str(result))

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.step()
            stop.wait(self.rng.uniform(*self.config.put_every))


# -------------------------------------------------------------------- worker


class QueueWorker:
    """Claims and works on tasks until ``stop``. ``announce`` (the worker process) is
    called with each claimed task's id and token, so the crasher knows when it holds
    one."""

    def __init__(
        self,
        name: str,
        client: Client,
        emit: Callable[[Event], Any],
        config: QueueConfig,
        seed: int,
        announce: Callable[[str, int], None] | None = None,
    ) -> None:
        self.name = name
        self.queue = client.queue(config.queue)
        self.config = config
        self.rng = random.Random(seed)
        self.rec = Recorder(name, emit, config.queue)
        self.announce = announce
        self.slack = 1 - config.clock_drift

    def _until(self, sent: float, ttl: float) -> float:
        return sent + ttl * self.slack - self.config.margin

    def step(self, stop: threading.Event) -> None:
        cfg, rng = self.config, self.rng
        ttl = rng.choice(cfg.lease_ttls)
        claimed: dict[str, Any] = {}

        def describe(task: Any, sent: float) -> dict[str, Any]:
            if task is None:
                return {"task": None}
            # The cluster keeps an attempt for its TTL, capped at progress_timeout
            # past the last advance of progress (the claim counts as one).
            attempt_ttl = ttl  # the claim's lease_ttl: what the cluster keeps it for
            cap = _field(_field(task, "payload") or {}, "pt")
            if isinstance(cap, int | float) and cap > 0:
                attempt_ttl = min(attempt_ttl, float(cap))
            claimed["ttl"] = attempt_ttl
            claimed["valid_until"] = self._until(sent, attempt_ttl)
            return {
                "task": task_id(task),
                "token": _field(task, "token"),
                "attempt": _field(task, "attempt"),
                "lease_id": str(_field(task, "lease_id"))[:8],
                "payload": _field(_field(task, "payload") or {}, "id"),
                "ttl": claimed["ttl"],
                "valid_until": claimed["valid_until"],
            }

        task = self.rec.call(
            "q.claim",
            {"worker": self.name, "lease_ttl": ttl, "wait": cfg.claim_wait},
            lambda: self.queue.claim(worker=self.name, wait=cfg.claim_wait, lease_ttl=ttl),
            describe,
        )
        if task is None:
            return
        if _failed(task):
            stop.wait(0.05)  # no hot loop while the cluster cannot answer
            return
        tid, token = task_id(task), _field(task, "token")
        assert tid is not None
        if self.announce is not None:
            self.announce(tid, int(token))
        ident = {"task": tid, "token": token}
        valid_until = float(claimed["valid_until"])
        attempt_ttl = float(claimed["ttl"])
        stuck = (
            _field(_field(task, "payload") or {}, "pt") is not None and rng.random() < cfg.p_stuck
        )
        if stuck:
            self.rec.note("stuck", **ident)
        work_until = time.monotonic() + rng.uniform(*cfg.work)
        progress = 0
        # Work, heartbeating every ttl/3 while the attempt lasts; a stuck worker
        # heartbeats without advancing progress (for longer than progress_timeout).
        if stuck:
            work_until = time.monotonic() + cfg.progress_timeout * 2.5
        while time.monotonic() < work_until and not stop.is_set():
            stop.wait(min(attempt_ttl / 3, max(0.0, work_until - time.monotonic())))
            if time.monotonic() >= work_until:
                break
            if not stuck:
                progress += 1
            hb_progress = progress

            def beat(result: Any, sent: float, advanced: bool = not stuck) -> dict[str, Any]:
                nonlocal valid_until
                if advanced:  # a heartbeat that did not advance progress extends nothing
                    valid_until = max(valid_until, self._until(sent, attempt_ttl))
                return {"valid_until": valid_until}

            beat_result = self.rec.call(
                "q.heartbeat",
                {**ident, "progress": hb_progress},
                functools.partial(task.heartbeat, progress=hb_progress),
                beat,
            )
            if isinstance(beat_result, RaftLeaseError) and beat_result.definite:
                return  # the attempt is over (stale or expired): drop it
        if rng.random() < cfg.p_stall:
            # A zombie: stall past the attempt's TTL, then go on as if nothing happened.
            # It wakes early once its task is held by a newer attempt (watched with
            # reads): the moment its late call does the most harm if accepted.
            seconds = attempt_ttl + cfg.stall_extra
            self.rec.note("stall", **ident, seconds=seconds)
            self._stall(stop, tid, int(token), seconds, valid_until)
        draw = rng.random()
        if draw < cfg.p_fail:
            self.rec.call(
                "q.fail",
                {**ident, "error": "planned failure"},
                lambda: task.fail("planned failure"),
            )
        elif draw < cfg.p_fail + cfg.p_release:
            self.rec.call("q.release", dict(ident), task.release)
        else:
            result = {"by": self.name, "token": token, "payload": _field(task.payload, "id")}
            self.rec.call(
                "q.complete", {**ident, "result": result}, lambda: task.complete(result=result)
            )

    def _stall(
        self, stop: threading.Event, tid: str, token: int, seconds: float, valid_until: float
    ) -> None:
        """Sleep ``seconds``, or less: from the attempt's own expiry on, read the task
        every ``stall_poll`` s (``q.get``, not final) and stop sleeping once another
        attempt holds it."""
        end = time.monotonic() + seconds
        stop.wait(max(0.0, valid_until - time.monotonic()))
        while not stop.is_set() and time.monotonic() < end:
            state = self.rec.call(
                "q.get",
                {"task": tid, "final": False},
                lambda: self.queue.get(tid),
                lambda info, _sent: describe_task_state(info),
            )
            holder = _field(state, "token")
            if _field(state, "status") == "claimed" and holder is not None and holder != token:
                self.rec.note("zombie-wakes", task=tid, token=token, holder=holder)
                return
            stop.wait(self.config.stall_poll)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.step(stop)


# ------------------------------------------------------------------ janitor


class Janitor:
    """Purges finished tasks ``purge_after`` seconds after their put was answered, so
    the soak's replicated state levels off. Each due task is read first (``q.get``,
    not final) and purged (``q.purge``) only if the read says ``completed`` or
    ``dead``; a task still pending is read again in a later round, one the cluster
    does not know (or purged) is not tried again. The checkers excuse a final read
    of ``TASK_NOT_FOUND`` only for a task whose purge was invoked after a read had
    returned it finished and was not definitely refused, and flag one whose
    acknowledged purge is undone (queue_checker.py), so a purge cannot hide a lost
    pending task. Runs in its own thread until ``stop``; blocks only on its client
    calls (each within the workload's deadline)."""

    def __init__(
        self,
        client: Client,
        emit: Callable[[Event], Any],
        config: QueueConfig,
        acknowledged: list[str],
    ) -> None:
        self.queue = client.queue(config.queue)
        self.config = config
        self.rec = Recorder("qj", emit, config.queue)
        self.acknowledged = acknowledged
        self.seen = 0
        #: (first seen, task id): the time is within a round of the put's answer (the
        #: producers append to ``acknowledged`` when answered).
        self.waiting: collections.deque[tuple[float, str]] = collections.deque()

    def _purge(self, tid: str) -> bool:
        """Read ``tid`` and purge it if finished. True when it needs no more rounds."""
        state = self.rec.call(
            "q.get",
            {"task": tid, "final": False},
            functools.partial(self.queue.get, tid),
            lambda info, _sent: describe_task_state(info),
        )
        if _failed(state):
            return isinstance(state, RaftLeaseError) and state.code in NOT_FOUND_CODES
        if _field(state, "status") not in ("completed", "dead"):
            return False
        result = self.rec.call("q.purge", {"task": tid}, functools.partial(self.queue.purge, tid))
        return not _failed(result) or (
            isinstance(result, RaftLeaseError) and result.code in NOT_FOUND_CODES
        )

    def round(self, now: float) -> int:
        """Take in newly acknowledged puts, then handle up to ``purge_batch`` of those
        due. Returns how many were handled."""
        fresh = self.acknowledged[self.seen :]
        self.seen += len(fresh)
        self.waiting.extend((now, tid) for tid in fresh)
        handled = 0
        again: list[tuple[float, str]] = []
        while (
            self.waiting
            and self.waiting[0][0] + self.config.purge_after <= now
            and handled < self.config.purge_batch
        ):
            item = self.waiting.popleft()
            handled += 1
            if not self._purge(item[1]):
                again.append(item)  # pending still, or no answer: a later round
        # Behind the tasks due later, so a task that stays pending blocks nobody.
        self.waiting.extend(again)
        return handled

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.round(time.monotonic())
            stop.wait(self.config.purge_every)


# ----------------------------------------------------------- harness side


class QueueThreads:
    """The producer and worker threads in the harness process, each with its own
    ``Client``. ``start`` returns at once; ``join`` waits for them (after ``stop``)."""

    def __init__(
        self,
        endpoints: list[str],
        history: History,
        config: QueueConfig,
        seed: int,
        stop: threading.Event,
    ) -> None:
        self.endpoints = endpoints
        self.history = history
        self.config = config
        self.seed = seed
        self.stop = stop
        self.acknowledged: list[str] = []
        self.errors: list[str] = []
        self._threads: list[threading.Thread] = []
        self._clients: list[Client] = []

    def _client(self) -> Client:
        cfg = self.config
        client = Client(
            self.endpoints,
            deadline=cfg.deadline,
            attempt_timeout=cfg.attempt_timeout,
            clock_drift=cfg.clock_drift,
            margin=cfg.margin,
            **secure.client_options("queue-worker"),
        )
        self._clients.append(client)
        return client

    def _spawn(self, name: str, body: Callable[[], None]) -> None:
        def run() -> None:
            try:
                body()
            except Exception as exc:  # reported, never silent
                self.errors.append(f"{name}: {exc!r}")

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def start(self) -> QueueThreads:
        cfg = self.config
        for i in range(cfg.producers):
            producer = Producer(
                f"qp{i + 1}",
                self._client(),
                self.history.append,
                cfg,
                self.seed * 31 + i,
                self.acknowledged,
            )
            self._spawn(producer.name, functools.partial(producer.run, self.stop))
        for i in range(cfg.workers):
            worker = QueueWorker(
                f"qw{i + 1}", self._client(), self.history.append, cfg, self.seed * 37 + i
            )
            self._spawn(worker.name, functools.partial(worker.run, self.stop))
        if cfg.purge_after > 0:
            janitor = Janitor(self._client(), self.history.append, cfg, self.acknowledged)
            self._spawn("qj", functools.partial(janitor.run, self.stop))
        return self

    def join(self, timeout: float = 15.0) -> None:
        for thread in self._threads:
            thread.join(timeout=timeout)
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()


class QueueProcess:
    """A worker process (``main`` below): its events go into ``history``; ``holding``
    is set while it announced a claimed task and has not claimed again."""

    def __init__(
        self, name: str, endpoints: list[str], history: History, config: QueueConfig, seed: int
    ) -> None:
        self.name = name
        self.history = history
        self.holding = threading.Event()
        self.last_claim: dict[str, Any] | None = None
        self.stderr_tail: list[str] = []
        args = [
            sys.executable,
            str(HERE / "queue_workload.py"),
            "--name",
            name,
            "--endpoints",
            ",".join(endpoints),
            "--seed",
            str(seed),
            "--queue",
            config.queue,
        ]
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._reader = threading.Thread(target=self._read, name=f"{name}-reader", daemon=True)
        self._reader.start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if event.get("type") == "marker":
                self.last_claim = event
                self.holding.set()
                continue
            if event.get("type") == "invoke" and event.get("f") == "q.claim":
                self.holding.clear()
            self.history.append(event)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr_tail = [*self.stderr_tail[-40:], raw.decode(errors="replace").rstrip()]

    def kill(self) -> None:
        """SIGKILL (no clean-up in the worker: its attempt must run out on its own)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._reader.join(timeout=5)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)


class Crasher:
    """Keeps ``config.processes`` worker processes running and SIGKILLs one now and
    then (``crash_every``, drawn from ``seed``) while it holds a task, starting a new
    one (a new name) in its place. A ``q.note`` ``crash`` event records each kill
    with the task and token it held. Runs on its own thread until ``stop``."""

    def __init__(
        self,
        endpoints: list[str],
        history: History,
        config: QueueConfig,
        seed: int,
        stop: threading.Event,
    ) -> None:
        self.endpoints = endpoints
        self.history = history
        self.config = config
        self.rng = random.Random(seed)
        self.stop = stop
        self.started = 0
        self.crashes = 0
        self.procs: list[QueueProcess] = []
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="queue-crasher", daemon=True)

    def _new(self) -> QueueProcess:
        self.started += 1
        proc = QueueProcess(
            f"qp-w{self.started}",
            self.endpoints,
            self.history,
            self.config,
            self.rng.randrange(1 << 30),
        )
        self.procs.append(proc)
        return proc

    def start(self) -> Crasher:
        for _ in range(self.config.processes):
            self._new()
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self.stop.wait(self.rng.uniform(*self.config.crash_every)):
                live = [p for p in self.procs if p.proc.poll() is None]
                if not live:
                    self._new()
                    continue
                victim = self.rng.choice(live)
                if not victim.holding.wait(5.0) or self.stop.is_set():
                    continue
                held = victim.last_claim or {}
                victim.kill()
                self.crashes += 1
                self.history.append(
                    {
                        "type": "q.note",
                        "what": "crash",
                        "process": victim.name,
                        "task": held.get("task"),
                        "token": held.get("token"),
                    }
                )
                self.procs.remove(victim)
                self._new()
        except Exception as exc:
            self.errors.append(f"crasher: {exc!r}")

    def join(self) -> None:
        self._thread.join(timeout=15)
        for proc in self.procs:
            proc.stop()


def final_reads(
    endpoints: list[str],
    history: History,
    config: QueueConfig,
    tasks: list[str],
    budget: float | None = None,
) -> dict[str, int]:
    """After the clients stopped and the faults healed: ``final_reads_on`` with a
    client of its own, within ``budget`` seconds (default 60 s plus 50 ms a task, so a
    long soak's thousands of reads fit). Blocks; returns counts."""
    if budget is None:
        budget = 60.0 + 0.05 * len(tasks)
    with Client(
        endpoints,
        deadline=config.deadline,
        attempt_timeout=config.attempt_timeout,
        clock_drift=config.clock_drift,
        margin=config.margin,
        **secure.client_options("queue-worker"),
    ) as client:
        return final_reads_on(client.queue(config.queue), history, config, tasks, budget)


def final_reads_on(
    queue: Any, history: History, config: QueueConfig, tasks: list[str], budget: float = 60.0
) -> dict[str, int]:
    """One final ``q.get`` of every acknowledged task (and of every task a claim
    handed out: a put whose answer was lost may have been claimed and completed) and
    one final ``q.dead`` on ``queue``, each retried (a new op) until it answers
    definitely or ``budget`` seconds have passed. Blocks; returns counts."""
    end = time.monotonic() + budget
    claimed = [
        e["value"]["task"]
        for e in history.snapshot()
        if e.get("f") == "q.claim"
        and e.get("type") == "ok"
        and isinstance((e.get("value") or {}).get("task"), str)
    ]
    done = {"get_ok": 0, "get_failed": 0, "get_unanswered": 0, "dead_ok": 0}
    rec = Recorder("final", history.append, config.queue)

    def until_answered(
        f: str,
        value: dict[str, Any],
        call: Callable[[], Any],
        describe: Callable[[Any, float], dict[str, Any]],
    ) -> Any:
        while True:
            result = rec.call(f, {**value, "final": True}, call, describe)
            definite = not _failed(result) or (
                isinstance(result, RaftLeaseError) and result.definite
            )
            if definite or time.monotonic() > end:
                return result
            time.sleep(0.2)

    for tid in dict.fromkeys([*tasks, *claimed]):
        result = until_answered(
            "q.get",
            {"task": tid},
            functools.partial(queue.get, tid),
            lambda state, _s: describe_task_state(state),
        )
        if not _failed(result):
            done["get_ok"] += 1
        elif isinstance(result, RaftLeaseError) and result.definite:
            done["get_failed"] += 1
        else:
            done["get_unanswered"] += 1
    result = until_answered(
        "q.dead",
        {},
        lambda: queue.dead(limit=DEAD_LIST_LIMIT),
        lambda entries, _s: {"tasks": describe_dead(entries)},
    )
    done["dead_ok"] = int(not _failed(result))
    return done


# ------------------------------------------------------------- process side


def main(argv: list[str] | None = None) -> int:
    """A worker process: one ``QueueWorker`` whose events are JSON lines on stdout,
    with a ``marker`` line (``task``, ``token``) after each claim. Stops on SIGTERM."""
    parser = argparse.ArgumentParser(description="chaos-suite queue worker process")
    parser.add_argument("--name", required=True)
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--queue", default=QueueConfig.queue)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    lock = threading.Lock()

    def emit(event: Event) -> None:
        event.setdefault("t", time.monotonic())
        with lock:
            sys.stdout.write(json.dumps(event, sort_keys=True, default=str) + "\n")
            sys.stdout.flush()

    config = QueueConfig(queue=args.queue)
    with Client(
        args.endpoints.split(","),
        deadline=config.deadline,
        attempt_timeout=config.attempt_timeout,
        clock_drift=config.clock_drift,
        margin=config.margin,
        **secure.client_options("queue-worker"),
    ) as client:
        worker = QueueWorker(
            args.name,
            client,
            emit,
            config,
            args.seed,
            announce=lambda tid, token: emit({"type": "marker", "task": tid, "token": token}),
        )
        worker.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
