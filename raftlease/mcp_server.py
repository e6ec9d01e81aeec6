"""``raftlease mcp``: the lease service as Model Context Protocol tools, over stdio.

An LLM agent (or any MCP host) starts ``raftlease mcp`` as a subprocess and gets tools
to claim keys, keep and release them, see who holds what and check fencing tokens.
Built on the official ``mcp`` SDK (``MCPServer``, stdio transport) and the asyncio
client (``AsyncClient``); every request goes through the cluster's native protocol,
so the cluster's validation and permissions apply exactly as for any other client.

Lifetime (the rule the whole module is built around): the claims of one MCP session
are attached to ONE lease session (``raftlease.recipes.sessions``) that this process
keeps alive every ``session_ttl / 3``. The lease session lives exactly as long as the
MCP session: when the host closes our stdin (end of the MCP session) the server
closes the lease session, which releases every claim at once; when the process dies
or hangs instead, the keep-alives stop and the cluster releases every claim after
``session_ttl``. Nothing is ever held forever by a dead agent. A lease session that
is lost while the MCP session goes on (keep-alives failed for a whole TTL) loses its
claims; they are reported in the next tool result (``lost_claims``) and as a log
message to the client, and the next ``claim`` opens a new lease session.

Threads: everything runs on the one asyncio event loop of the MCP server (anyio's
asyncio backend); tools run concurrently, one task per request. A tool call that the
client cancels is cancelled like an ``AsyncClient`` call (a waiting claim leaves the
key's queue). Errors: a tool never raises anything but ``ToolError``, whose text is a
JSON object ``{"code", "message", "definite"}`` with the cluster's wire code (or
``INVALID_ARGUMENT`` for arguments refused here); an unexpected exception is reported
by the SDK as a generic tool error and never ends the server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import signal
import ssl
import time
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field, StrictFloat, StrictInt, StrictStr

from ._version import __version__
from .client.aio import AsyncClient
from .client.aio_queue import AsyncTask
from .errors import RaftLeaseError
from .limits import MAX_CAPACITY, MAX_KEY_BYTES
from .models import Holder, Lease
from .recipes.sessions import AsyncSession

log = logging.getLogger("raftlease.mcp")

# Tool argument types: strict (no "12" -> 12, no true -> 1; a model's sloppy argument
# is refused, not guessed), with the descriptions the host shows the model.
Key = Annotated[StrictStr, Field(description="The lease key, e.g. gpus/node-4 or task/17.")]
Seconds = Annotated[StrictFloat, Field(description="Seconds to wait in the key's queue.")]
Count = Annotated[StrictInt, Field(description="A positive integer.")]

#: Longest wait a claim may ask for (an agent that needs longer asks again).
MAX_WAIT = 3600.0
#: Most units a claim may take, and the largest capacity it may name (the server's).
MAX_UNITS = MAX_CAPACITY


@dataclass(frozen=True)
class McpOptions:
    """How ``raftlease mcp`` reaches the cluster and keeps its claims.

    ``token``/``tls`` are the CLI's credentials (``RAFTLEASE_AUTH_TOKEN`` or
    ``RAFTLEASE_TOKEN``, ``RAFTLEASE_CA_FILE`` / ``RAFTLEASE_TLS``, a client
    certificate from ``RAFTLEASE_CERT_FILE`` / ``RAFTLEASE_KEY_FILE``); ``owner`` the label
    readers see; ``session_ttl`` how long the claims outlive a dead MCP server."""

    endpoints: list[str]
    owner: str
    session_ttl: float = 15.0
    token: str | None = None
    tls: ssl.SSLContext | str | bool | None = None
    deadline: float = 15.0


def _tool_error(code: str, message: str, definite: bool = True) -> ToolError:
    return ToolError(json.dumps({"code": code, "message": message, "definite": definite}))


#: Lease, session and attempt ids (the leader draws 128 random bits, 32 hex digits):
#: bearer capabilities, never shown to the model (docs/mcp.md).
_ID = re.compile(r"\b[0-9a-f]{32}\b")
#: Detail fields that carry such ids.
_ID_FIELDS = frozenset({"lease_id", "session", "session_id", "sid", "aid", "attempt"})


def _from_raftlease(exc: RaftLeaseError) -> ToolError:
    # The cluster's messages may name this agent's own lease session (a full session,
    # SESSION_NOT_FOUND, "not yours"): its id is what would let anyone who reads the
    # transcript keep the agent's claims alive after it died, or close them.
    message = _ID.sub("<id withheld>", exc.message)
    body: dict[str, Any] = {"code": exc.code, "message": message, "definite": exc.definite}
    # A LEASE_HELD detail says who holds it; nothing in a detail is a capability.
    if exc.detail:
        body["detail"] = {k: v for k, v in exc.detail.items() if k not in _ID_FIELDS}
    return ToolError(json.dumps(body, default=str))


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise _tool_error("INVALID_ARGUMENT", "key must be a non-empty string")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise _tool_error("INVALID_ARGUMENT", f"key is longer than {MAX_KEY_BYTES} bytes")
    if "\x00" in key:
        raise _tool_error("INVALID_ARGUMENT", "key must not contain NUL")
    return key


def _check_seconds(name: str, value: float, high: float) -> float:
    if isinstance(value, bool) or not math.isfinite(value) or value < 0 or value > high:
        raise _tool_error("INVALID_ARGUMENT", f"{name} must be between 0 and {high:g} seconds")
    return float(value)


def _check_count(name: str, value: int, high: int = MAX_UNITS) -> int:
    if isinstance(value, bool) or not 1 <= value <= high:
        raise _tool_error("INVALID_ARGUMENT", f"{name} must be an integer from 1 to {high}")
    return value


def _units_of(lease: Lease | Holder) -> list[int] | None:
    """The unit indices a pool grant holds (``unit_indices``); None for a plain lock
    or a key too large to index."""
    return list(lease.unit_indices) if lease.unit_indices else None


def _holder_view(holder: Holder) -> dict[str, Any]:
    view: dict[str, Any] = {
        "key": holder.key,
        "owner": holder.owner,
        "token": holder.token,
        "remaining": round(holder.remaining, 3),
        "units": holder.units,
    }
    if holder.value:
        view["value"] = holder.value
    if (indices := _units_of(holder)) is not None:
        view["unit_indices"] = indices
    return view


class ClaimBook:
    """The claims of one MCP session and the lease session that keeps them.

    One instance per ``raftlease mcp`` process (one MCP session over stdio). All
    methods run on the server's event loop; ``close`` is called once, at the end of
    the MCP session."""

    def __init__(self, options: McpOptions) -> None:
        self.options = options
        self.client = AsyncClient(
            options.endpoints, deadline=options.deadline, token=options.token, tls=options.tls
        )
        self.session: AsyncSession | None = None
        self.claims: dict[str, Lease] = {}
        #: Keys with a claim in flight (a second claim of the same key is refused).
        self._claiming: set[str] = set()
        #: Claims lost since the last tool result, reported (once) in the next one.
        self._lost: list[dict[str, Any]] = []
        #: Task attempts taken from queues by this session, by task id.
        self.tasks: dict[str, AsyncTask] = {}
        #: Tools run concurrently: two first claims must not open two lease sessions.
        self._opening = asyncio.Lock()
        #: Closing lease sessions given up as lost (see ``_collect_session_loss``).
        self._closing: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------- lifetime

    async def _live_session(self) -> AsyncSession:
        """The lease session, opened on first use and opened anew after a loss."""
        async with self._opening:
            self._collect_session_loss()
            if self.session is None:
                session = self.client.session(
                    owner=self.options.owner, ttl=self.options.session_ttl
                )
                try:
                    await session.open()
                except RaftLeaseError as exc:
                    raise _from_raftlease(exc) from None
                self.session = session
                log.info("lease session %s opened", session.session_id[:8])
            return self.session

    def _collect_session_loss(self) -> None:
        """Move the claims of a lost lease session to the lost list."""
        session = self.session
        if session is None or session.valid:
            return
        reason = session.lost_reason or "session no longer valid"
        for key, lease in sorted(self.claims.items()):
            if lease.session is session:
                self._lose(key, lease, f"lease session lost: {reason}")
        for task_id, task in sorted(self.tasks.items()):
            if task.session == session.session_id:
                self._lose_task(task_id, task, f"lease session lost: {reason}")
        self.session = None
        # Reported lost, so it must end: a late keep-alive answer could otherwise
        # revive it (and its claims) behind our back. Stop its keep-alive and close
        # it on the cluster, in the background (the cluster may be unreachable).
        closing = asyncio.get_running_loop().create_task(session.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    def _lose(self, key: str, lease: Lease, reason: str) -> None:
        self.claims.pop(key, None)
        self._lost.append({"key": key, "token": lease.token, "reason": reason})
        log.warning("claim of %r (token %d) lost: %s", key, lease.token, reason)

    def _lose_task(self, task_id: str, task: AsyncTask, reason: str) -> None:
        self.tasks.pop(task_id, None)
        self._lost.append(
            {"queue": task.queue, "task_id": task_id, "token": task.token, "reason": reason}
        )
        log.warning("task %s (token %d) lost: %s", task_id, task.token, reason)

    async def close(self) -> None:
        """End of the MCP session: close the lease session (releasing every claim at
        once and giving every taken task back; if the cluster cannot be reached they
        expire after the session TTL) and the client. Never raises a cluster error."""
        session, self.session = self.session, None
        self.claims.clear()
        self.tasks.clear()
        try:
            if session is not None:
                await session.close()
            if self._closing:
                await asyncio.gather(*self._closing, return_exceptions=True)
        finally:
            await self.client.close()

    # ------------------------------------------------------------- results

    def _claim_view(self, lease: Lease) -> dict[str, Any]:
        view: dict[str, Any] = {
            "key": lease.key,
            "owner": lease.owner,
            "token": lease.token,
            "valid_for": round(lease.remaining, 3),
            "units": lease.units,
        }
        if (indices := _units_of(lease)) is not None:
            view["unit_indices"] = indices
        return view

    async def result(self, ctx: Context | None, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` plus the claims lost since the last result (also sent as a log
        message where the client takes them)."""
        self._collect_session_loss()
        if self._lost:
            lost, self._lost = self._lost, []
            body["lost_claims"] = lost
            if ctx is not None:
                await _notify_lost(ctx, lost)
        return body

    # ------------------------------------------------------------- tools

    async def claim(
        self, key: str, wait: float, units: int, capacity: int, value: str | None
    ) -> dict[str, Any]:
        _check_key(key)
        wait = _check_seconds("wait", wait, MAX_WAIT)
        capacity = _check_count("capacity", capacity)
        units = _check_count("units", units, capacity)
        if value is not None and not isinstance(value, str):
            raise _tool_error("INVALID_ARGUMENT", "value must be a string")
        self._collect_session_loss()
        held = self.claims.get(key)
        if held is not None and held.valid:
            return {**self._claim_view(held), "already_held": True}
        if key in self._claiming:
            raise _tool_error("INVALID_ARGUMENT", f"a claim of {key!r} is already in progress")
        self._claiming.add(key)
        try:
            session = await self._live_session()
            try:
                lease = await session.acquire(
                    key, wait=wait, units=units, capacity=capacity, value=value
                )
            except RaftLeaseError as exc:
                raise _from_raftlease(exc) from None
            self.claims[key] = lease
            return self._claim_view(lease)
        finally:
            self._claiming.discard(key)

    async def _verify(self, key: str, lease: Lease) -> bool:
        """Is our claim of ``key`` still the cluster's (not revoked or expired)?"""
        try:
            current = await self.client.fence(key, lease.token)
        except RaftLeaseError as exc:
            raise _from_raftlease(exc) from None
        if not current:
            self._lose(key, lease, "no longer held (revoked or expired)")
        return current

    async def renew(self, key: str | None) -> dict[str, Any]:
        """A keep-alive of the lease session now, then the claim(s) it keeps."""
        if key is not None:
            _check_key(key)
            if key not in self.claims:
                self._collect_session_loss()
                raise _tool_error("LEASE_NOT_FOUND", f"this session holds no claim of {key!r}")
        self._collect_session_loss()
        session = self.session
        if session is None:
            if key is not None:
                raise _tool_error("LEASE_NOT_FOUND", f"this session holds no claim of {key!r}")
            return {"claims": []}
        try:
            await session.keepalive()
        except RaftLeaseError as exc:
            # Gone on the cluster (or out of validity): its claims are lost now.
            if session.renew_failed(exc):
                self._collect_session_loss()
            raise _from_raftlease(exc) from None
        keys = [key] if key is not None else sorted(self.claims)
        views = []
        for name in keys:
            lease = self.claims.get(name)
            if lease is not None and await self._verify(name, lease):
                views.append(self._claim_view(lease))
        if key is not None:
            if not views:
                raise _tool_error("LEASE_NOT_FOUND", f"the claim of {key!r} was lost")
            return views[0]
        return {"claims": views}

    async def release(self, key: str) -> dict[str, Any]:
        _check_key(key)
        self._collect_session_loss()
        lease = self.claims.get(key)
        if lease is None:
            raise _tool_error("LEASE_NOT_FOUND", f"this session holds no claim of {key!r}")
        try:
            await self.client.release(lease)
        except RaftLeaseError as exc:
            if exc.definite:
                # Gone already (expired, revoked): it is not ours any more either way.
                self._lose(key, lease, f"already gone at release ({exc.code})")
            raise _from_raftlease(exc) from None
        self.claims.pop(key, None)
        return {"key": key, "token": lease.token, "released": True}

    async def release_all(self) -> dict[str, Any]:
        self._collect_session_loss()
        released, failed = [], []
        for key, lease in sorted(self.claims.items()):
            try:
                await self.client.release(lease)
                released.append(key)
            except RaftLeaseError as exc:
                failed.append({"key": key, "code": exc.code, "definite": exc.definite})
                if exc.definite:
                    self._lose(key, lease, f"already gone at release ({exc.code})")
                continue
            self.claims.pop(key, None)
        body: dict[str, Any] = {"released": released}
        if failed:
            body["failed"] = failed
        return body

    async def who_holds(self, key: str) -> dict[str, Any]:
        _check_key(key)
        try:
            read = await self.client.read(key)
        except RaftLeaseError as exc:
            raise _from_raftlease(exc) from None
        mine = self.claims.get(key)
        holders = []
        for holder in read.holders:
            view = _holder_view(holder)
            view["mine"] = mine is not None and mine.token == holder.token
            holders.append(view)
        body: dict[str, Any] = {"key": key, "held": bool(holders), "holders": holders}
        if read.capacity != 1:
            body.update(capacity=read.capacity, used=read.used)
        return body

    async def list_claims(self, prefix: str | None, limit: int) -> dict[str, Any]:
        """This session's claims (each checked with the cluster), or with ``prefix``
        every live lease under it."""
        self._collect_session_loss()
        if prefix is not None:
            if len(prefix.encode("utf-8", "replace")) > MAX_KEY_BYTES:
                raise _tool_error("INVALID_ARGUMENT", f"prefix exceeds {MAX_KEY_BYTES} bytes")
            limit = _check_count("limit", limit, 1000)
            try:
                holders = await self.client.leases(prefix, limit=limit)
            except RaftLeaseError as exc:
                raise _from_raftlease(exc) from None
            return {"prefix": prefix, "leases": [_holder_view(h) for h in holders]}
        views = []
        for key, lease in sorted(self.claims.items()):
            if await self._verify(key, lease):
                views.append(self._claim_view(lease))
        body: dict[str, Any] = {"claims": views}
        if self.session is not None:
            body["session_valid_for"] = round(self.session.remaining, 3)
        return body

    # ------------------------------------------------------------- queues

    def _task_view(self, task: AsyncTask) -> dict[str, Any]:
        # An attempt attached to the lease session lives by its keep-alives.
        session = self.session
        attached = session is not None and task.session == session.session_id
        remaining = session.remaining if attached and session is not None else task.remaining
        return {
            "queue": task.queue,
            "task_id": task.task_id,
            "token": task.token,
            "attempt": task.attempt,
            "valid_for": round(remaining, 3),
        }

    def _task(self, task_id: str) -> AsyncTask:
        if not isinstance(task_id, str) or not task_id or len(task_id) > 128:
            raise _tool_error("INVALID_ARGUMENT", "task_id must be a task id from take_task")
        self._collect_session_loss()
        task = self.tasks.get(task_id)
        if task is None:
            raise _tool_error("TASK_NOT_FOUND", f"this session holds no task {task_id!r}")
        return task

    async def take_task(
        self, queue: str, wait: float, capabilities: dict[str, str] | None
    ) -> dict[str, Any]:
        if not queue or len(queue.encode("utf-8", "replace")) > 256:
            raise _tool_error("INVALID_ARGUMENT", "queue must be a name of 1 to 256 bytes")
        wait = _check_seconds("wait", wait, MAX_WAIT)
        session = await self._live_session()
        try:
            task = await self.client.queue(queue).claim(
                wait=wait, capabilities=capabilities, session=session
            )
        except RaftLeaseError as exc:
            raise _from_raftlease(exc) from None
        if task is None:
            return {"queue": queue, "task": None}
        self.tasks[task.task_id] = task
        return {**self._task_view(task), "payload": task.payload}

    async def heartbeat(self, task_id: str, progress: float | None) -> dict[str, Any]:
        task = self._task(task_id)
        if progress is not None and not math.isfinite(progress):
            raise _tool_error("INVALID_ARGUMENT", "progress must be a finite number")
        try:
            await task.heartbeat(progress)
        except RaftLeaseError as exc:
            if task.lost.is_set():
                self._lose_task(task_id, task, f"no longer current ({exc.code})")
            raise _from_raftlease(exc) from None
        return self._task_view(task)

    async def finish_task(
        self,
        task_id: str,
        how: str,
        result: Any = None,
        error: str = "",
        retry_after: float | None = None,
    ) -> dict[str, Any]:
        task = self._task(task_id)
        try:
            if how == "completed":
                await task.complete(result)
            else:
                if retry_after is not None:
                    retry_after = _check_seconds("retry_after", retry_after, 300.0)
                await task.fail(error, retry_after=retry_after)
        except RaftLeaseError as exc:
            if task.lost.is_set():
                self._lose_task(task_id, task, f"no longer current ({exc.code})")
            raise _from_raftlease(exc) from None
        self.tasks.pop(task_id, None)
        return {"queue": task.queue, "task_id": task_id, "token": task.token, how: True}

    async def check_token(self, key: str, token: int) -> dict[str, Any]:
        _check_key(key)
        if isinstance(token, bool) or not 0 <= token < 2**63:
            raise _tool_error("INVALID_ARGUMENT", "token must be a non-negative integer")
        try:
            current = await self.client.fence(key, token)
        except RaftLeaseError as exc:
            raise _from_raftlease(exc) from None
        return {"key": key, "token": token, "current": current}


async def _notify_lost(ctx: Context, lost: list[dict[str, Any]]) -> None:
    """A warning log message to the client (MCP logging: deprecated by the newest
    protocol revision, still delivered to clients that take it). Best effort."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            await ctx.warning({"lost_claims": lost}, logger_name="raftlease")
    except Exception:  # a client that refuses log messages must not fail the call
        log.debug("could not send the lost-claims log message", exc_info=True)


def build_server(options: McpOptions) -> tuple[MCPServer[Any], ClaimBook]:
    """The MCP server and its claim book (not started: ``run_stdio``)."""
    book = ClaimBook(options)

    @asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
        try:
            yield {}
        finally:
            # The MCP session ended (stdin EOF, or SIGTERM cancelled the server):
            # release everything now. Shielded, so a cancellation does not skip it;
            # bounded, so an unreachable cluster does not keep the process (the
            # claims then expire after the session TTL).
            with anyio.CancelScope(shield=True), anyio.move_on_after(10.0):
                await book.close()

    server: MCPServer[Any] = MCPServer(
        "raftlease",
        version=__version__,
        instructions=(
            "Leases on a raftlease cluster. claim a key before using what it protects and "
            "pass its fencing token to that resource; claims last as long as this MCP "
            "session (they are released when it ends, or expire after "
            f"{options.session_ttl:g} s if this server dies). Results carry lost_claims "
            "when a claim was lost since the previous call: stop using those."
        ),
        lifespan=lifespan,
        log_level="WARNING",
    )

    @server.tool()
    async def claim(
        key: Key,
        ctx: Context,
        wait: Seconds = 0.0,
        units: Annotated[StrictInt, Field(description="Units of a pool to take.")] = 1,
        capacity: Annotated[StrictInt, Field(description="The pool's size (1: a lock).")] = 1,
        value: Annotated[StrictStr | None, Field(description="A value to publish.")] = None,
    ) -> dict[str, Any]:
        """Claim (acquire) `key` for this agent, waiting up to `wait` seconds in the
        key's fair queue if someone else holds it. For a pool or semaphore give its
        `capacity` and the `units` you need. Returns the fencing `token` (pass it to
        the protected resource), `valid_for` (seconds), and for pools `unit_indices`
        (e.g. GPU indices for CUDA_VISIBLE_DEVICES). The claim lives as long as this
        MCP session. Error LEASE_HELD: someone else holds it (detail says who)."""
        return await book.result(ctx, await book.claim(key, wait, units, capacity, value))

    @server.tool()
    async def renew(ctx: Context, key: Key | None = None) -> dict[str, Any]:
        """Refresh the claims now (they are also kept alive automatically) and check
        they are still held. With `key`, that claim only. Returns token and
        `valid_for` per claim; error LEASE_NOT_FOUND if the claim is gone."""
        return await book.result(ctx, await book.renew(key))

    @server.tool()
    async def release(key: Key, ctx: Context) -> dict[str, Any]:
        """Release this session's claim of `key` (the next waiter gets it at once)."""
        return await book.result(ctx, await book.release(key))

    @server.tool()
    async def release_all(ctx: Context) -> dict[str, Any]:
        """Release every claim this session holds. Returns the keys released."""
        return await book.result(ctx, await book.release_all())

    @server.tool()
    async def who_holds(key: Key, ctx: Context) -> dict[str, Any]:
        """Who holds `key` now: owner, fencing token, remaining seconds, units (and
        `mine` for this session's own claim). `held` is false when it is free."""
        return await book.result(ctx, await book.who_holds(key))

    @server.tool()
    async def list_claims(
        ctx: Context, prefix: StrictStr | None = None, limit: Count = 100
    ) -> dict[str, Any]:
        """This session's claims (each checked with the cluster), or, with `prefix`,
        every live lease whose key starts with it (anyone's, up to `limit`)."""
        return await book.result(ctx, await book.list_claims(prefix, limit))

    @server.tool()
    async def check_token(
        key: Key,
        token: Annotated[StrictInt, Field(description="A fencing token from a claim.")],
        ctx: Context,
    ) -> dict[str, Any]:
        """Is `token` the fencing token of the current holder of `key`? A protected
        resource asks this before accepting work from a claim holder."""
        return await book.result(ctx, await book.check_token(key, token))

    @server.tool()
    async def take_task(
        queue: Annotated[StrictStr, Field(description="The task queue's name.")],
        ctx: Context,
        wait: Seconds = 0.0,
        capabilities: Annotated[
            dict[StrictStr, StrictStr] | None,
            Field(description="What this agent offers (tasks may require some)."),
        ] = None,
    ) -> dict[str, Any]:
        """Take the next ready task from `queue` (waiting up to `wait` seconds for
        one). Returns `task_id`, `payload`, the attempt's fencing `token` and
        `valid_for`; `task` is null when none was ready. The attempt lives as long as
        this MCP session: finish it with complete_task or fail_task."""
        return await book.result(ctx, await book.take_task(queue, wait, capabilities))

    @server.tool()
    async def heartbeat(
        task_id: StrictStr,
        ctx: Context,
        progress: Annotated[StrictFloat | None, Field(description="Progress, a number.")] = None,
    ) -> dict[str, Any]:
        """Report that a taken task is still being worked on (with optional
        `progress`). Error STALE_ATTEMPT: the task was given to someone else."""
        return await book.result(ctx, await book.heartbeat(task_id, progress))

    @server.tool()
    async def complete_task(
        task_id: StrictStr,
        ctx: Context,
        result: Annotated[Any, Field(description="The task's result, any JSON value.")] = None,
    ) -> dict[str, Any]:
        """Finish a taken task with `result`. Error STALE_ATTEMPT: this attempt is
        no longer current (its result is refused; exactly one completion counts)."""
        return await book.result(ctx, await book.finish_task(task_id, "completed", result))

    @server.tool()
    async def fail_task(
        task_id: StrictStr,
        ctx: Context,
        error: Annotated[StrictStr, Field(description="What went wrong.")] = "",
        retry_after: Annotated[
            StrictFloat | None, Field(description="Seconds before a retry (default: backoff).")
        ] = None,
    ) -> dict[str, Any]:
        """Give up on a taken task: it is retried later (or dead-lettered once out of
        attempts)."""
        return await book.result(
            ctx, await book.finish_task(task_id, "failed", error=error, retry_after=retry_after)
        )

    return server, book


async def run_stdio(options: McpOptions) -> None:
    """Serve one MCP session on stdin/stdout until stdin closes (or SIGTERM/SIGINT);
    then release every claim. Blocks (a coroutine for ``anyio.run``)."""
    server, book = build_server(options)
    started = time.monotonic()

    async def on_signals() -> None:
        # SIGTERM/SIGINT (a host stopping us) end the session like stdin EOF does:
        # claims are released at once instead of waiting out the session TTL. The
        # SDK reads stdin in a worker thread that no cancellation interrupts, so
        # after the release the process exits directly (nothing else is pending:
        # every claim is gone and stdout carries no answer worth waiting for).
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("signal %d: ending the MCP session", signum)
                with anyio.CancelScope(shield=True), anyio.move_on_after(10.0):
                    await book.close()
                log.info("MCP session ended after %.1f s", time.monotonic() - started)
                logging.shutdown()
                os._exit(0)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(on_signals)
            await server.run_stdio_async()
            group.cancel_scope.cancel()
    finally:
        log.info("MCP session ended after %.1f s", time.monotonic() - started)


__all__ = ["MAX_WAIT", "ClaimBook", "McpOptions", "build_server", "run_stdio"]
