"""``raftlease queue put|claim|heartbeat|complete|fail|stats|dead|retry``: the leased
task queues from the shell (docs/queues.md), with human output or JSON (``-o json``,
``--json``).

A task claimed here gets no heartbeats of its own (the command exits): give
``--lease-ttl`` long enough for the work, or run ``queue heartbeat`` as it goes, with
``--progress`` and a ``--checkpoint`` file (at most 8 KiB) that the next attempt's
``claim`` hands back (``--checkpoint-out``). The attempt id (the secret that proves the
attempt) is printed once, to the claimer; ``complete``/``heartbeat``/``fail`` take it
from ``--attempt-id`` or the environment (``RAFTLEASE_ATTEMPT_ID``, not visible in
``ps``). Payloads and results are JSON text; text that is not JSON is sent as a JSON
string.

Exit status as for the other client commands: 0 done, 1 a definite error, 3 an
unknown outcome; ``claim`` exits 4 when no task came within ``--wait``.
"""

from __future__ import annotations

import base64
import json
import math
import sys
from typing import TYPE_CHECKING, Any

import click

from ..errors import RaftLeaseError
from ..limits import MAX_TASK_CHECKPOINT_BYTES
from .common import DURATION, TTL, client_options, connect, exit_error, run_wait, safe

if TYPE_CHECKING:  # a node process imports the CLI: it must not load the client
    from ..client.aio_queue import QueueStats, TaskInfo

#: ``claim`` found no task within ``--wait``.
EXIT_NO_TASK = 4


def _json_value(text: str) -> Any:
    """The JSON value of ``text``, or ``text`` itself as a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _labels(pairs: tuple[str, ...], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.UsageError(f"{what} must be NAME=VALUE, not {pair!r}")
        out[name] = value
    return out


def _info_dict(info: TaskInfo) -> dict[str, Any]:
    return {
        "task_id": info.task_id,
        "queue": info.queue,
        "status": info.status,
        "payload": info.payload,
        "priority": info.priority,
        "requires": info.requires,
        "attempts": info.attempts,
        "failures": info.failures,
        "max_attempts": info.max_attempts,
        "result": info.result,
        "dead_reason": info.dead_reason,
        "history": [
            {
                "attempt": a.number,
                "worker": a.worker,
                "token": a.token,
                "outcome": a.outcome,
                "error": a.error,
            }
            for a in info.history
        ],
    }


def _stats_dict(stats: QueueStats) -> dict[str, Any]:
    return {
        "queue": stats.queue,
        "ready": stats.ready,
        "delayed": stats.delayed,
        "claimed": stats.claimed,
        "dead": stats.dead,
        "completed": stats.completed,
        "waiting_claims": stats.waiting_claims,
        "attempts": stats.attempts,
        "oldest_ready_age": stats.oldest_ready_age,
    }


def _echo(as_json: bool, data: dict[str, Any], human: str) -> None:
    click.echo(json.dumps({"ok": True, **data}) if as_json else human)


@click.group()
def queue() -> None:
    """Leased task queues: put, claim, complete, fail, stats, dead, retry."""


_attempt_option = click.option(
    "--attempt-id",
    envvar="RAFTLEASE_ATTEMPT_ID",
    required=True,
    help="The attempt id claim printed (env RAFTLEASE_ATTEMPT_ID).",
)


@queue.command()
@click.argument("name")
@click.argument("payload")
@click.option("--priority", type=int, default=0, show_default=True, help="-1000..1000.")
@click.option("--delay", type=DURATION, default=0.0, help="Claimable only after this long.")
@click.option("--dedup-key", default=None, help="A repeat with this key returns the first id.")
@click.option("--max-attempts", type=int, default=None, help="Attempts before dead-letter.")
@click.option("--lease-ttl", type=TTL, default=None, help="Each attempt's TTL (default 30s).")
@click.option("--progress-timeout", type=TTL, default=None, help="Progress-aware expiry.")
@click.option("--requires", multiple=True, metavar="NAME=VALUE", help="A needed capability.")
@click.option("--deadline", type=DURATION, default=None, help="Dead-letter after this long.")
@click.option("--fairness-key", default=None, help="Its tenant (fair shares between tenants).")
@click.option("--weight", type=int, default=None, help="The tenant's weight from now on: 1..1000.")
@click.option(
    "--after",
    multiple=True,
    metavar="TASK_ID",
    help="A parent task (repeatable): ready once every parent completed; a dead parent "
    "makes it dead.",
)
@client_options
def put(
    name: str,
    payload: str,
    priority: int,
    delay: float,
    dedup_key: str | None,
    max_attempts: int | None,
    lease_ttl: float | None,
    progress_timeout: float | None,
    requires: tuple[str, ...],
    deadline: float | None,
    fairness_key: str | None,
    weight: int | None,
    after: tuple[str, ...],
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """Put PAYLOAD (JSON text) into queue NAME; prints the task id. With --after, the
    task waits for its parents (docs/queues.md, "Dependencies")."""
    try:
        with connect(endpoints) as c:
            tid = c.queue(name).put(
                _json_value(payload),
                priority=priority,
                delay=delay,
                dedup_key=dedup_key,
                max_attempts=max_attempts,
                lease_ttl=lease_ttl,
                progress_timeout=progress_timeout,
                requires=_labels(requires, "--requires") or None,
                deadline=deadline,
                fairness_key=fairness_key,
                weight=weight,
                after=list(after) or None,
                timeout=timeout,
            )
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    _echo(as_json, {"queue": name, "task_id": tid}, f"put into {safe(name)}: task {tid}")


@queue.command()
@click.argument("name")
@click.option("--worker", required=True, help="Who works on it (a label for people and logs).")
@click.option("--wait", type=DURATION, default=0.0, help="Wait for a task up to this long.")
@click.option("--lease-ttl", type=TTL, default=None, help="This attempt's TTL.")
@click.option("--capability", multiple=True, metavar="NAME=VALUE", help="An offered capability.")
@click.option(
    "--checkpoint-out",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write the checkpoint an earlier attempt saved (if any) to this file.",
)
@client_options
def claim(
    name: str,
    worker: str,
    wait: float,
    lease_ttl: float | None,
    capability: tuple[str, ...],
    checkpoint_out: str | None,
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """Claim one task from queue NAME; prints it with its attempt id (no heartbeats
    follow unless you run ``queue heartbeat``: the attempt lasts its TTL). The
    checkpoint an earlier attempt saved is in the JSON output (``checkpoint``, base64)
    and written to ``--checkpoint-out``."""
    try:
        with connect(endpoints) as c:
            # Reaching the cluster takes --timeout; the wait for a task, --wait.
            # SIGINT/SIGTERM withdraw a waiting claim (exit 130/143).
            coro = c.queue(name).aio.claim(
                worker=worker,
                wait=wait,
                lease_ttl=lease_ttl,
                capabilities=_labels(capability, "--capability") or None,
                timeout=timeout,
            )
            task = run_wait(c, coro, f"a task of {name}", timeout) if wait else c.portal.run(coro)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    if task is None:
        if as_json:
            click.echo(json.dumps({"ok": True, "queue": name, "claimed": False}))
        else:
            click.echo(f"no task in {safe(name)}", err=True)
        raise SystemExit(EXIT_NO_TASK)
    data = {
        "queue": name,
        "claimed": True,
        "task_id": task.task_id,
        "attempt_id": task.lease_id,
        "attempt": task.attempt,
        "token": task.token,
        "ttl": task.ttl,
        "valid_for": round(task.remaining, 3),
        "payload": task.payload,
    }
    saved = ""
    if task.checkpoint is not None:
        # Handed on from the attempt that saved it (docs/queues.md, "Checkpoints").
        data["checkpoint"] = base64.b64encode(task.checkpoint).decode("ascii")
        data["checkpoint_attempt"] = task.checkpoint_attempt
        saved = f"\ncheckpoint: {len(task.checkpoint)} bytes from attempt {task.checkpoint_attempt}"
        if checkpoint_out is not None:
            with open(checkpoint_out, "wb") as out:
                out.write(task.checkpoint)
    _echo(
        as_json,
        data,
        f"claimed task {task.task_id} (attempt {task.attempt}, token {task.token}, "
        f"ttl {task.ttl:g} s)\npayload: {safe(json.dumps(task.payload))}\n"
        f"attempt id: {task.lease_id}{saved}",
    )


def _read_checkpoint(path: str) -> bytes:
    """The bytes of ``--checkpoint`` (a file, or ``-`` for stdin); refused (a usage
    error, exit 2, nothing sent) above the limit."""
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(MAX_TASK_CHECKPOINT_BYTES + 1)
        else:
            with open(path, "rb") as f:
                raw = f.read(MAX_TASK_CHECKPOINT_BYTES + 1)
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path!r}: {exc.strerror}") from None
    if len(raw) > MAX_TASK_CHECKPOINT_BYTES:
        raise click.BadParameter(
            f"a checkpoint is at most {MAX_TASK_CHECKPOINT_BYTES} bytes (8 KiB); "
            f"{path!r} holds more: keep a smaller state (or a pointer to it)"
        )
    return raw


@queue.command()
@click.argument("name")
@click.argument("task_id")
@_attempt_option
@click.option("--progress", type=float, default=None, help="A progress figure (higher: further).")
@click.option(
    "--checkpoint",
    "checkpoint_path",
    type=click.Path(dir_okay=False, allow_dash=True),
    default=None,
    help="A file (- for stdin) of at most 8 KiB: the work's state, handed to the next "
    "attempt's claim.",
)
@client_options
def heartbeat(
    name: str,
    task_id: str,
    attempt_id: str,
    progress: float | None,
    checkpoint_path: str | None,
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """Extend the attempt on TASK_ID of queue NAME by its TTL, recording --progress
    and --checkpoint (replicated: once this exits 0 the checkpoint is kept, and the
    next attempt's claim gets it; docs/queues.md, "Checkpoints"). Refused
    STALE_ATTEMPT once the attempt is not current (the checkpoint is not kept)."""
    args: dict[str, Any] = {"queue": name, "task_id": task_id, "attempt_id": attempt_id}
    if progress is not None:
        if not math.isfinite(progress):
            raise click.BadParameter("--progress must be a finite number")
        args["progress"] = progress
    size = 0
    if checkpoint_path is not None:
        raw = _read_checkpoint(checkpoint_path)
        size = len(raw)
        args["checkpoint"] = base64.b64encode(raw).decode("ascii")
    try:
        with connect(endpoints) as c:
            c.call("task_heartbeat", args, mutating=True, timeout=timeout)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    data: dict[str, Any] = {"queue": name, "task_id": task_id}
    if checkpoint_path is not None:
        data["checkpoint_bytes"] = size
    kept = f" (checkpoint of {size} bytes kept)" if checkpoint_path is not None else ""
    _echo(as_json, data, f"heartbeat for task {task_id}{kept}")


@queue.command()
@click.argument("name")
@click.argument("task_id")
@_attempt_option
@click.option("--result", default="null", help="The result (JSON text).")
@client_options
def complete(
    name: str,
    task_id: str,
    attempt_id: str,
    result: str,
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """Complete TASK_ID of queue NAME with --result (refused unless the attempt is
    the current one: STALE_ATTEMPT)."""
    args = {
        "queue": name,
        "task_id": task_id,
        "attempt_id": attempt_id,
        "result": json.dumps(_json_value(result)),
    }
    try:
        with connect(endpoints) as c:
            c.call("task_complete", args, mutating=True, timeout=timeout)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    _echo(as_json, {"queue": name, "task_id": task_id}, f"completed task {task_id}")


@queue.command()
@click.argument("name")
@click.argument("task_id")
@_attempt_option
@click.option("--error", "error_text", default="", help="Why it failed.")
@click.option("--retry-after", type=DURATION, default=None, help="Retry after this long.")
@client_options
def fail(
    name: str,
    task_id: str,
    attempt_id: str,
    error_text: str,
    retry_after: float | None,
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """Fail the attempt on TASK_ID of queue NAME: retried after a backoff (or
    --retry-after), or dead-lettered once it used all its attempts."""
    args: dict[str, Any] = {
        "queue": name,
        "task_id": task_id,
        "attempt_id": attempt_id,
        "error": error_text,
    }
    if retry_after is not None:
        args["retry_after"] = retry_after
    try:
        with connect(endpoints) as c:
            result = c.call("task_fail", args, mutating=True, timeout=timeout)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    status = str(result.get("status", ""))
    _echo(
        as_json,
        {"queue": name, "task_id": task_id, "status": status},
        f"failed task {task_id}: now {status}",
    )


@queue.command()
@click.argument("name")
@client_options
def stats(name: str, endpoints: str, as_json: bool, timeout: float) -> None:
    """Counts of queue NAME."""
    try:
        with connect(endpoints) as c:
            got = c.queue(name).stats(timeout=timeout)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    age = "-" if got.oldest_ready_age is None else f"{got.oldest_ready_age:.1f} s"
    _echo(
        as_json,
        _stats_dict(got),
        f"queue {safe(name)}: {got.ready} ready, {got.delayed} delayed, {got.claimed} "
        f"claimed, {got.dead} dead, {got.completed} completed, {got.waiting_claims} "
        f"waiting claims, {got.attempts} attempts; oldest ready {age}",
    )


@queue.command()
@click.argument("name")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@client_options
def dead(name: str, limit: int, endpoints: str, as_json: bool, timeout: float) -> None:
    """The dead-letter list of queue NAME, with every attempt's error."""
    try:
        with connect(endpoints) as c:
            tasks = c.queue(name).dead(limit=limit, timeout=timeout)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    if as_json:
        click.echo(json.dumps({"ok": True, "queue": name, "dead": [_info_dict(t) for t in tasks]}))
        return
    if not tasks:
        click.echo(f"no dead tasks in {safe(name)}")
    for task in tasks:
        click.echo(f"{task.task_id}: {safe(task.dead_reason)}")
        for attempt in task.history:
            click.echo(
                f"  attempt {attempt.number} by {safe(attempt.worker)} (token "
                f"{attempt.token}): {attempt.outcome} {safe(attempt.error)}".rstrip()
            )


@queue.command()
@click.argument("name")
@click.argument("task_id")
@client_options
def retry(name: str, task_id: str, endpoints: str, as_json: bool, timeout: float) -> None:
    """Put dead TASK_ID of queue NAME back (a fresh attempt budget)."""
    try:
        with connect(endpoints) as c:
            c.queue(name).retry(task_id, timeout=timeout)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    _echo(as_json, {"queue": name, "task_id": task_id}, f"retrying task {task_id}")
