"""The asyncio client: ``AsyncClient``.

It finds the leader itself from any endpoint and retries through elections and dead
nodes until the call's deadline (``transport.Transport``). Retrying a mutating request
is safe because every one carries the client id and a sequence number that the state
machine deduplicates (Raft dissertation §6.3); a retried acquire can never grant twice.

Errors: every failure raises a ``RaftLeaseError`` subclass. ``err.definite`` is True
when the request certainly did not take effect (``LeaseHeldError``, ``NotOwnerError``,
a rejected argument...). A ``TimeoutError_`` / ``LeaderChangedError`` after the deadline
means the outcome is unknown: an acquire may have been granted (it then expires after
its TTL unless renewed).
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..errors import (
    ConnectionLostError,
    DeadlockError,
    InvalidArgumentError,
    LeaseHeldError,
    RaftLeaseError,
    UnavailableError,
    from_response,
)
from ..models import (
    Attachable,
    Holder,
    HolderSigner,
    Lease,
    LeaseSet,
    Queued,
    Read,
    SessionInfo,
    WatchEvent,
    default_owner,
)
from ..protocol import CONSISTENCY_MODES
from ..recipes.election import AsyncElection
from ..recipes.locks import AsyncHeldLock
from ..recipes.sessions import AsyncSession
from ..recipes.shared import SharedKeyLocks
from . import budgets, direct
from .aio_queue import AsyncQueue
from .budgets import BudgetInfo, Reservation, Settlement, Spend
from .effects import AsyncEffect, LeaseEffectOwner, Reconcile
from .keepalive_batch import KeepaliveBatcher
from .transport import DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_DEADLINE, Pin, Transport, unknown_outcome


def tls_context(tls: ssl.SSLContext | str | bool | None) -> ssl.SSLContext | None:
    """The client's TLS context for ``AsyncClient(tls=...)``. Raises
    ``InvalidArgumentError`` if a CA file cannot be loaded."""
    if tls is None or tls is False:
        return None
    if isinstance(tls, ssl.SSLContext):
        return tls
    if tls is True:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cafile=tls)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidArgumentError(f"cannot load the CA file {tls!r}: {exc}") from None


DEFAULT_CLOCK_DRIFT = 0.01
DEFAULT_MARGIN = 0.05


def _check_consistency(mode: str) -> None:
    if mode not in CONSISTENCY_MODES:
        raise InvalidArgumentError(f"consistency {mode!r} is not one of {list(CONSISTENCY_MODES)}")


def _holder(data: dict[str, Any]) -> Holder:
    return Holder(
        key=data["key"],
        owner=data["owner"],
        token=int(data["token"]),
        ttl=data["ttl"] / 1000.0,
        remaining=max(0.0, data["remaining"] / 1000.0),
        units=int(data.get("units", 1)),
        value=str(data.get("value", "")),
        unit_indices=tuple(int(i) for i in data.get("unit_indices", ())),
    )


class AsyncClient(SharedKeyLocks[AsyncHeldLock]):
    """asyncio client. Create it inside a running loop; use ``async with`` or
    ``await close()``. All methods are coroutines; cancellation of a call leaves the
    outcome unknown, exactly like a timeout, except for a waiting ``acquire`` (and a
    queue's waiting ``claim``): cancelled, or ended with an unknown outcome, it
    withdraws its waiter before it raises (``_withdraw_until``).

    ``deadline``: total seconds a call may take, retries included (per call override:
    ``timeout=``). ``clock_drift`` and ``margin`` shape ``Lease.valid_until``.
    """

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        *,
        deadline: float = DEFAULT_DEADLINE,
        attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT,
        clock_drift: float = DEFAULT_CLOCK_DRIFT,
        margin: float = DEFAULT_MARGIN,
        token: str | None = None,
        tls: ssl.SSLContext | str | bool | None = None,
        batch_keepalives: bool = True,
    ) -> None:
        """``token``: a bearer token sent on every new connection (the node's auth
        file maps it to a principal); ``tls``: TLS to the client port: True (the
        system's trusted CAs), a CA file's path, or an ``ssl.SSLContext`` (for a
        client certificate, load it into the context); ``batch_keepalives``: the
        keep-alives of this client's lease sessions that are due together are sent
        in one request (client/keepalive_batch.py; False: one request each). Raises
        ``InvalidArgumentError`` on bad arguments."""
        if isinstance(endpoints, str):
            endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
        if not endpoints:
            raise InvalidArgumentError("at least one endpoint is required")
        self.transport = Transport(
            endpoints,
            deadline=deadline,
            attempt_timeout=attempt_timeout,
            tls=tls_context(tls),
            token=token,
        )
        self.clock_drift = clock_drift
        self.margin = margin
        #: Sends the lease sessions' keep-alives together (None: one request each).
        self.keepalives: KeepaliveBatcher | None = (
            KeepaliveBatcher(self._keepalive_call, deadline) if batch_keepalives else None
        )
        #: Callbacks run when the client closes (the keep-alives of open lease sessions).
        self._on_close: dict[int, Callable[[], Awaitable[None]]] = {}
        self._on_close_ids = itertools.count()

    @property
    def endpoints(self) -> list[str]:
        return self.transport.endpoints

    @property
    def deadline(self) -> float:
        return self.transport.deadline

    @property
    def attempt_timeout(self) -> float:
        return self.transport.attempt_timeout

    @property
    def client_id(self) -> str:
        """The client id under which the cluster deduplicates this client's retries."""
        return self.transport.sequencer.cid

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def on_close(self, callback: Callable[[], Awaitable[None]]) -> Callable[[], None]:
        """Run ``callback`` on this loop when the client closes (lease sessions stop
        their keep-alives this way). Returns a function that cancels it."""
        handle = next(self._on_close_ids)
        self._on_close[handle] = callback
        return lambda: self._on_close.pop(handle, None) and None

    async def close(self) -> None:
        """Close the connections. Open lease sessions stop their keep-alives (they are
        not closed on the cluster: their leases expire after the session TTL); close
        sessions first to release their leases at once."""
        callbacks, self._on_close = list(self._on_close.values()), {}
        for callback in callbacks:
            await callback()
        await self.transport.close()

    async def call(
        self, op: str, args: dict[str, Any], *, mutating: bool, timeout: float | None = None
    ) -> dict[str, Any]:
        """Send one request, retrying until the deadline. Returns the result map.
        Low level: the methods below are built on it. Inside a blocking ``Client``
        call that took its direct lane (client/direct.py) the first try is made on the
        calling thread and this awaits nothing."""
        lane = direct.active(self)
        if lane is not None:
            return lane.call(op, args, mutating=mutating, timeout=timeout)
        return await self.transport.call(op, args, mutating=mutating, timeout=timeout)

    async def session_keepalive(
        self, session_id: str, *, timeout: float | None = None
    ) -> dict[str, Any]:
        """One ``session_keepalive`` of a lease session without a holder key: its
        answer map. Sent in a batch with the other sessions' keep-alives due at the
        same time (``batch_keepalives``, client/keepalive_batch.py), alone otherwise
        or inside a blocking call's direct lane; the answers and errors are the
        same either way. Raises what ``call`` raises."""
        batcher = self.keepalives
        if batcher is not None and batcher.enabled and direct.active(self) is None:
            return await batcher.keepalive(session_id, timeout)
        return await self.call(
            "session_keepalive", {"session_id": session_id}, mutating=True, timeout=timeout
        )

    async def _keepalive_call(
        self, op: str, args: dict[str, Any], timeout: float | None
    ) -> dict[str, Any]:
        """The keep-alive batcher's request: mutating, as a session's keep-alive is."""
        return await self.transport.call(op, args, mutating=True, timeout=timeout)

    async def _call_pinned(
        self, op: str, args: dict[str, Any], pin: Pin, timeout: float | None = None
    ) -> dict[str, Any]:
        """A mutating ``call`` under ``pin`` (``transport.Pin``): the first one records
        its client id and seq there; a later one sends the same request again."""
        return await self.transport.call(op, args, mutating=True, timeout=timeout, pin=pin)

    async def _withdraw_until(
        self,
        send: Callable[[float], Awaitable[object]],
        until: float,
    ) -> bool:
        """Send a withdrawal (``send(timeout)``: idempotent, e.g. a release of a queued
        lease id) until the cluster answers it, or until ``until``
        (``time.monotonic()``: when the waiter would have left by itself), but for at
        least the client's deadline. Retries within that are the transport's (every
        node, through elections). True if answered (a definite refusal, such as
        ``LEASE_NOT_FOUND``, is an answer: the waiter is gone); False if not. A
        second cancellation stops it (the waiter then leaves at its own deadline)."""
        budget = max(until - time.monotonic(), self.deadline)
        try:
            await send(budget)
        except RaftLeaseError as exc:
            # UNAVAILABLE is "definite" (nothing applied) but it answers nothing.
            return exc.definite and not isinstance(exc, UnavailableError)
        return True

    def _lease(
        self,
        result: dict[str, Any],
        sent: float,
        remaining: float | None = None,
        session: Attachable | None = None,
    ) -> Lease:
        """``remaining``: log-time seconds left when the server answered (default: what
        the result says, ``expires_at - now``: the full TTL for a lease granted or
        renewed by the request sent at ``sent``, less for a lease attached to a session
        that was last kept alive before it)."""
        ttl = result["ttl"] / 1000.0
        asked = result.get("yield_requested")
        asked = asked if isinstance(asked, dict) else None
        if remaining is None and isinstance(result.get("now"), int):
            remaining = (int(result["expires_at"]) - int(result["now"])) / 1000.0
        window = ttl if remaining is None else min(ttl, remaining)
        progress_until = None
        deadline_at, timeout_ms = result.get("progress_at"), result.get("progress_timeout")
        if isinstance(deadline_at, int) and isinstance(timeout_ms, int):
            # Progress-aware (§4g): the log ends it at progress_at + timeout whatever
            # keeps it alive; counted, like the TTL, from when the request was sent.
            now_ms = result.get("now")
            left = (deadline_at + timeout_ms - (now_ms if isinstance(now_ms, int) else 0)) / 1000.0
            progress_until = self.valid_until(sent, min(left, timeout_ms / 1000.0))
        return Lease(
            key=result["key"],
            owner=result["owner"],
            token=int(result["token"]),
            ttl=ttl,
            lease_id=result["lease_id"],
            valid_until=self.valid_until(sent, window),
            expires_at_ms=int(result["expires_at"]),
            units=int(result.get("units", 1)),
            value=str(result.get("value", "")),
            session=session,
            unit_indices=tuple(int(i) for i in result.get("unit_indices", ())),
            yield_deadline_ms=int(asked["deadline"]) if asked else None,
            yield_by=str(asked.get("by", "")) if asked else "",
            certificate=str(result.get("certificate", "")),
            progress_until=progress_until,
        )

    def valid_until(self, sent: float, seconds: float) -> float:
        """Until when (``time.monotonic()``) this client trusts something the cluster
        keeps for ``seconds`` of log time from a request first sent at ``sent``."""
        return sent + seconds * (1 - self.clock_drift) - self.margin

    async def acquire(
        self,
        key: str,
        *,
        owner: str | None = None,
        ttl: float | None = None,
        wait: float = 0.0,
        priority: int = 0,
        capacity: int = 1,
        units: int = 1,
        value: str | None = None,
        session: Attachable | None = None,
        timeout: float | None = None,
        fairness_key: str | None = None,
        weight: int | None = None,
        holder_key: HolderSigner | None = None,
        progress_timeout: float | None = None,
    ) -> Lease:
        """Take ``key`` for ``owner`` for ``ttl`` seconds, or for as long as the lease
        ``session`` lives (then ``owner`` defaults to the session's and ``ttl`` must
        not be given: the session's keep-alive keeps the lease). ``owner`` defaults to
        ``hostname:pid``; it is a label shown to readers, not a credential (the lease
        id, and with auth the principal, prove ownership).

        With ``wait=0`` (default) raises ``LeaseHeldError`` (definite) at once if the
        key is taken. With ``wait > 0`` the request joins the key's queue in the
        replicated state (higher ``priority`` first, first come first served within a
        priority; nobody overtakes the head) and the call blocks until it is granted,
        in the same log entry that frees the units, or until ``wait`` seconds pass:
        then the queued request is withdrawn and ``LeaseHeldError`` is raised.
        Cancelling the call, or an unknown outcome (``TIMEOUT``, a connection lost
        during a leader change), withdraws it too before the error is raised: retried
        until the cluster answers or the wait would have ended (at least one
        deadline); a grant that raced the withdrawal is released (docs/usage.md).

        Shared keys: ``capacity`` is the key's size (a semaphore of N slots, a pool of
        N units; every user of the key must give the same, else
        ``CapacityMismatchError``), ``units`` how many this lease takes. ``value`` is
        published with the lease (see ``election``). An acquire attached to a session
        that ends while it waits raises ``SessionNotFoundError``.

        Fair shares (docs/design.md §4d): ``fairness_key`` names the tenant this
        acquire waits for (default: the key's default tenant) and ``weight`` (1 to
        1000) that tenant's weight on this key from now on. When units free up, the
        backlogged tenants share the grants by weight; within a tenant the order is
        priority, then arrival. Refused ``QuotaExceededError`` when 1,000 tenants
        already wait on the key; a node of an older build answers
        ``InvalidArgumentError``/bad request for the fields.

        Lease certificates (docs/certificates.md): with ``holder_key`` (a
        ``raftlease.verify.HolderKey`` this process made; only its public half is
        sent) the lease carries a ``certificate`` a resource verifies offline, and
        ``renew`` brings a fresh one. A grant after waiting in the queue asks for its
        certificate with one renewal. ``certificate`` stays "" when the answering
        leader could not sign (no valid leader lease); the next renewal retries.

        Progress-aware (docs/design.md §4g): with ``progress_timeout`` (seconds) the
        lease lives only while its holder makes progress: ``renew(progress=)`` with a
        higher figure than the last restarts its clock, and a holder that renews
        without progress for longer ends as ``stalled`` (a watch event; its next
        ``renew`` raises ``LeaseNotFoundError``). Every renewal of such a lease is a
        log write. A queued acquire's clock starts at its grant. With ``session`` the
        session's keep-alives never keep it past its progress deadline: report
        progress with ``session.progress(lease, n)`` (``Lease.progress_until``).
        """
        if session is not None:
            if ttl is not None:
                raise InvalidArgumentError("give ttl or session, not both")
            owner = owner or session.owner
        elif ttl is None:
            raise InvalidArgumentError("ttl is required (or attach the lease to a session)")
        if owner is None:
            owner = default_owner()
        if not owner:
            raise InvalidArgumentError("owner is required")
        sent = time.monotonic()
        args: dict[str, Any] = {"key": key, "owner": owner}
        if session is not None:
            args["session"] = session.session_id
        else:
            args["ttl"] = ttl
        if wait > 0:
            args["wait"] = wait
            if priority:
                args["priority"] = priority
        if capacity != 1 or units != 1:
            args.update(capacity=capacity, units=units)
        if value is not None:
            args["value"] = value
        if fairness_key is not None:
            args["fairness_key"] = fairness_key
        if weight is not None:
            args["weight"] = weight
        if holder_key is not None:
            args["holder_key"] = holder_key.public_hex()
        if progress_timeout is not None:
            args["progress_timeout"] = progress_timeout
        if wait <= 0:
            result = await self.call("acquire", args, mutating=True, timeout=timeout)
            return replace(self._lease(result, sent, session=session), holder_key=holder_key)
        pin = Pin()
        try:
            result = await self._call_pinned("acquire", args, pin, timeout)
        except BaseException as exc:
            if unknown_outcome(exc):
                # It may have queued (or been granted): send the same request again
                # under the same (cid, seq) to learn its lease id, then withdraw it.
                await self._withdraw_until(
                    lambda t: self._withdraw_unknown(args, pin, t), sent + wait
                )
            raise
        finally:
            pin.end()
        if not result.get("queued"):
            return replace(self._lease(result, sent, session=session), holder_key=holder_key)
        granted = await self._await_grant(key, result["lease_id"], sent + wait, session)
        if holder_key is None:
            return granted
        # The grant came with another request's entry (a release's handoff): one
        # renewal brings its certificate.
        return await self.renew(replace(granted, holder_key=holder_key), timeout=timeout)

    async def acquire_many(
        self,
        keys: Sequence[str] | Mapping[str, int],
        *,
        owner: str | None = None,
        ttl: float,
        wait: float = 0.0,
        priority: int = 0,
        capacity: int = 1,
        timeout: float | None = None,
        holder_key: HolderSigner | None = None,
    ) -> LeaseSet:
        """Take every key of ``keys`` for ``owner`` for ``ttl`` seconds, or none of
        them, in one log entry: a list of keys (one unit each), or a map of key to
        units of a shared key of ``capacity`` (every key of the set has that
        capacity). At most ``MAX_MANY_KEYS`` (16) distinct keys.

        With ``wait=0`` (default) never waits: if any key is held, or promised to
        acquires queued on it, raises ``LeaseHeldError`` (definite; its detail's
        ``keys`` names the busy ones) and nothing was taken. With ``wait > 0`` the set
        queues as one waiter on every key (higher ``priority`` first, then arrival;
        it keeps its place at the head of each key until all are free for it) and the
        call blocks until every key is granted, in one log entry, or ``wait`` seconds
        pass (then it is withdrawn and ``LeaseHeldError`` is raised). Raises
        ``DeadlockError`` (definite) if queueing would close a cycle of waits, or if a
        later grant closes one and the set is the cycle's youngest waiter (it left
        every queue). Cancelling a waiting call, or an unknown outcome while it
        queues, withdraws the set (retried until answered, as ``acquire``); a set
        granted meanwhile is released.

        Without ``wait`` an unknown outcome (``TimeoutError``, ``ConnectionLostError``)
        is retried under the same request id by the call layer until the cluster
        answers or ``timeout`` passes, so it is applied at most once. Other errors:
        ``CapacityMismatchError``, ``QuotaExceededError``, ``PermissionDeniedError``
        (write on every key needed), ``InvalidArgumentError`` / ``BadRequestError``
        for a malformed set (empty, duplicates, too many keys). Keep the set alive
        with ``renew_many`` and give it back with ``release_many``. Cancelling a call
        without ``wait`` cancels the wait for the answer, not the request: the set may
        have been granted and then expires after ``ttl``.

        Lease certificates (docs/certificates.md): with ``holder_key`` every key's
        lease is bound to it and carries its own ``certificate`` (each for the same
        holder key), and ``renew_many`` brings fresh ones; a set granted after
        waiting asks for them with one ``renew_many``."""
        if owner is None:
            owner = default_owner()
        if not owner:
            raise InvalidArgumentError("owner is required")
        wire: list[str] | dict[str, int] = dict(keys) if isinstance(keys, Mapping) else list(keys)
        args: dict[str, Any] = {"keys": wire, "owner": owner, "ttl": ttl}
        if priority:
            args["priority"] = priority
        if capacity != 1:
            args["capacity"] = capacity
        if holder_key is not None:
            args["holder_key"] = holder_key.public_hex()
        sent = time.monotonic()
        if wait <= 0:
            result = await self.call("acquire_many", args, mutating=True, timeout=timeout)
            return self._lease_set(result, sent, holder_key)
        args["wait"] = wait
        pin = Pin()
        try:
            result = await self._call_pinned("acquire_many", args, pin, timeout)
        except BaseException as exc:
            if unknown_outcome(exc):
                # It may have queued (or been granted): the same request again under
                # the same (cid, seq) tells its set id; then withdraw it.
                async def withdraw(budget: float) -> None:
                    until = time.monotonic() + budget
                    again = await self._call_pinned("acquire_many", args, pin, budget)
                    left = max(until - time.monotonic(), self.attempt_timeout)
                    await self._close_set(str(again["lease_id"]), left)

                await self._withdraw_until(withdraw, sent + wait)
            raise
        finally:
            pin.end()
        if not result.get("queued"):
            return self._lease_set(result, sent, holder_key)
        granted = await self._await_set(result, sent + wait)
        if holder_key is None:
            return granted
        # Granted by another request's entry: one keep-alive brings the certificates.
        bound = replace(
            granted,
            leases=tuple(replace(lease, holder_key=holder_key) for lease in granted.leases),
        )
        return await self.renew_many(bound, timeout=timeout)

    async def _close_set(self, lid: str, timeout: float) -> None:
        """Withdraw a waiting set, or release it if it was granted meanwhile (one
        ``session_close`` does both). Raises what the call raises; ``_withdraw_until``
        takes a definite refusal (the set already gone) as an answer."""
        await self.call("session_close", {"session_id": lid}, mutating=True, timeout=timeout)

    async def _await_set(self, queued: dict[str, Any], until: float) -> LeaseSet:
        """Long-poll the leader (on the set's first key) until our waiting set is
        granted (every key at once), refused or gone."""
        lid = str(queued["lease_id"])
        key = str(queued["keys"][0])
        first = f"{lid}/0"
        refused: dict[str, Any] | None = None
        try:
            while (left := until - time.monotonic()) > 0:
                sent = time.monotonic()
                hold = min(left, self.attempt_timeout / 2)
                status = await self.call(
                    "await_lease",
                    {"key": key, "lease_id": first, "timeout": hold},
                    mutating=False,
                    timeout=hold + self.attempt_timeout,
                )
                if status["state"] == "held":
                    return self._lease_set(
                        {
                            "lease_id": lid,
                            "owner": status["owner"],
                            "ttl": status["ttl"],
                            "expires_at": status["expires_at"],
                            "now": status["now"],
                            "leases": status.get("set", []),
                        },
                        sent,
                    )
                if status["state"] == "refused":
                    refused = status
                    break
                if status["state"] == "gone":
                    break
        except BaseException:
            await self._withdraw_until(lambda t: self._close_set(lid, t), until)
            raise
        if refused is not None:
            raise DeadlockError(
                str(refused.get("message", "deadlock")),
                {"key": key, "cycle": refused.get("cycle", [])},
            )
        await self._withdraw_until(lambda t: self._close_set(lid, t), until)
        keys = ", ".join(repr(k) for k in queued["keys"])
        raise LeaseHeldError(
            f"the set {keys} was not granted within the wait", {"keys": queued["keys"]}
        )

    def _lease_set(
        self, result: dict[str, Any], sent: float, holder_key: HolderSigner | None = None
    ) -> LeaseSet:
        ttl = result["ttl"] / 1000.0
        remaining = (int(result["expires_at"]) - int(result["now"])) / 1000.0
        valid_until = self.valid_until(sent, min(ttl, remaining))
        leases = tuple(
            Lease(
                key=one["key"],
                owner=result["owner"],
                token=int(one["token"]),
                ttl=ttl,
                lease_id=one["lease_id"],
                valid_until=valid_until,
                expires_at_ms=int(result["expires_at"]),
                units=int(one.get("units", 1)),
                unit_indices=tuple(int(i) for i in one.get("unit_indices", ())),
                certificate=str(one.get("certificate", "")),
                holder_key=holder_key,
            )
            for one in result["leases"]
        )
        return LeaseSet(
            lease_id=result["lease_id"],
            owner=result["owner"],
            ttl=ttl,
            valid_until=valid_until,
            expires_at_ms=int(result["expires_at"]),
            leases=leases,
        )

    async def renew_many(self, lease_set: LeaseSet, *, timeout: float | None = None) -> LeaseSet:
        """Extend every key of ``lease_set`` by its TTL from now, in one request (a
        keep-alive of the set's lease session). Raises ``SessionNotFoundError`` if the
        set already expired or was released (every key is then gone). A set acquired
        with ``holder_key`` gets a fresh certificate per key (each kept as it was when
        the answer carries none for it)."""
        sent = time.monotonic()
        args: dict[str, Any] = {"session_id": lease_set.lease_id}
        holder_key = next((x.holder_key for x in lease_set.leases if x.holder_key), None)
        if holder_key is not None:
            args["holder_key"] = holder_key.public_hex()
        result = await self.call("session_keepalive", args, mutating=True, timeout=timeout)
        fresh = {
            (str(one.get("key")), int(one.get("token", 0))): str(one.get("certificate", ""))
            for one in result.get("certificates", ())
            if isinstance(one, dict)
        }
        ttl = result["ttl"] / 1000.0
        remaining = (int(result["expires_at"]) - int(result["now"])) / 1000.0
        until = self.valid_until(sent, min(ttl, remaining))
        expires = int(result["expires_at"])
        return replace(
            lease_set,
            valid_until=until,
            expires_at_ms=expires,
            leases=tuple(
                replace(
                    lease,
                    valid_until=until,
                    expires_at_ms=expires,
                    certificate=fresh.get((lease.key, lease.token)) or lease.certificate,
                )
                for lease in lease_set.leases
            ),
        )

    async def release_many(self, lease_set: LeaseSet, *, timeout: float | None = None) -> int:
        """End every key of ``lease_set`` still held, in one log entry; returns how
        many were released. Raises ``SessionNotFoundError`` if the set already
        expired or was released."""
        result = await self.call(
            "session_close", {"session_id": lease_set.lease_id}, mutating=True, timeout=timeout
        )
        return int(result["released"])

    async def _withdraw_unknown(self, args: dict[str, Any], pin: Pin, timeout: float) -> None:
        """Withdraw an acquire whose outcome is unknown: its answer (the cached one if
        it applied, else it applies now), then a release of its lease id (a waiter
        leaves the queue; a lease granted meanwhile ends)."""
        until = time.monotonic() + timeout
        result = await self._call_pinned("acquire", args, pin, timeout)
        left = max(until - time.monotonic(), self.attempt_timeout)
        await self.call(
            "release",
            {"key": args["key"], "lease_id": result["lease_id"]},
            mutating=True,
            timeout=left,
        )

    async def _await_grant(
        self, key: str, lease_id: str, until: float, session: Attachable | None
    ) -> Lease:
        """Long-poll the leader until our queued acquire is granted or gone. Raises
        ``DeadlockError`` if it left its queue to break a deadlock (nothing to
        withdraw then), ``LeaseHeldError`` when the wait ran out."""
        refused: dict[str, Any] | None = None
        try:
            while (left := until - time.monotonic()) > 0:
                sent = time.monotonic()
                # The server holds the poll at most half an attempt, so a poll that
                # simply waits is never mistaken for a dead node.
                hold = min(left, self.attempt_timeout / 2)
                status = await self.call(
                    "await_lease",
                    {"key": key, "lease_id": lease_id, "timeout": hold},
                    mutating=False,
                    timeout=hold + self.attempt_timeout,
                )
                if status["state"] == "held":
                    remaining = (status["expires_at"] - status["now"]) / 1000.0
                    return self._lease(status, sent, remaining=remaining, session=session)
                if status["state"] == "refused":
                    refused = status
                    break
                if status["state"] == "gone":
                    if session is not None:
                        # Dropped at its deadline, or because its session ended? A
                        # keep-alive of the session tells (SessionNotFoundError).
                        await self.call(
                            "session_keepalive",
                            {"session_id": session.session_id},
                            mutating=True,
                            timeout=self.attempt_timeout,
                        )
                    break
        except BaseException:
            await self._withdraw(key, lease_id, until)
            raise
        if refused is not None:
            # The cluster took it out of the queue itself (docs/design.md §4e).
            raise DeadlockError(
                str(refused.get("message", "deadlock")),
                {"key": key, "cycle": refused.get("cycle", [])},
            )
        await self._withdraw(key, lease_id, until)
        raise LeaseHeldError(f"{key!r} was not granted within the wait", {"key": key})

    async def _withdraw(self, key: str, lease_id: str, until: float) -> None:
        """Leave the queue, or release the lease if it was granted meanwhile; retried
        until answered (``_withdraw_until``)."""

        async def send(timeout: float) -> None:
            await self.call(
                "release", {"key": key, "lease_id": lease_id}, mutating=True, timeout=timeout
            )

        await self._withdraw_until(send, until)

    async def request_yield(
        self,
        key: str,
        *,
        deadline: float,
        priority: int = 0,
        owner: str | None = None,
        timeout: float | None = None,
    ) -> int:
        """Ask the holders of ``key`` to yield it within ``deadline`` seconds (log
        time; cooperative preemption, docs/usage.md): the holders granted at a
        priority below ``priority`` (with auth, at most your role's ``max_priority``;
        an ``admin`` on the key asks every holder). Each learns it in its next
        keep-alive answer (``Lease.yield_deadline_ms``, a lock's
        ``on_yield_requested``) and may checkpoint and release; at the deadline the
        cluster ends the lease itself and grants the key's next waiter in the same
        log entry, with a new fencing token. Returns how many holders were asked. A
        second request keeps the earlier deadline. Raises ``LeaseNotFoundError`` if
        nobody holds the key, ``PermissionDeniedError`` without the ``preempt`` (or
        ``admin``) permission on the key, or when every holder was granted at
        ``priority`` or above (definite: nobody was asked). Retried under one
        request id on an unknown outcome (applied at most once)."""
        args: dict[str, Any] = {"key": key, "deadline": deadline}
        if priority:
            args["priority"] = priority
        if owner:
            args["owner"] = owner
        result = await self.call("request_yield", args, mutating=True, timeout=timeout)
        return int(result["asked"])

    async def transfer(
        self,
        lease: Lease,
        *,
        owner: str,
        ttl: float | None = None,
        timeout: float | None = None,
        holder_key: HolderSigner | None = None,
    ) -> Lease:
        """Hand ``lease`` to ``owner`` atomically: the returned lease (new lease id, new
        fencing token) starts in the same log entry that ends ours, so no third party
        can take the key in between. Give the returned lease to the new owner.

        Lease certificates (docs/certificates.md): ``holder_key`` is the NEW holder's
        key (only its public half is read and sent); the new lease is bound to it and
        the returned lease carries its ``certificate`` (op ``transfer``), which only
        that key's owner can prove. Without it the new lease has no holder key and
        gets no certificate, ever (the old holder's key is never carried over). Raises
        as ``renew`` for a lease that is gone or not ours."""
        sent = time.monotonic()
        args: dict[str, Any] = {"key": lease.key, "lease_id": lease.lease_id, "owner": owner}
        if ttl is not None:
            args["ttl"] = ttl
        if holder_key is not None:
            args["holder_key"] = holder_key.public_hex()
        result = await self.call("transfer", args, mutating=True, timeout=timeout)
        return replace(self._lease(result, sent), holder_key=holder_key)

    async def proclaim(self, lease: Lease, value: str, *, timeout: float | None = None) -> Lease:
        """Publish a new ``value`` with a held lease (an elected leader's new address);
        watchers see a ``proclaim`` event. The fencing token stays the same."""
        result = await self.call(
            "proclaim",
            {"key": lease.key, "lease_id": lease.lease_id, "value": value},
            mutating=True,
            timeout=timeout,
        )
        return replace(lease, value=str(result.get("value", "")))

    def effect(
        self,
        lease: Lease,
        effect_id: str,
        *,
        idempotency_key: str | None = None,
        reconcile: Reconcile | None = None,
        timeout: float | None = None,
    ) -> AsyncEffect:
        """An external effect made under ``lease``, for ``async with`` (client/effects.py;
        docs/usage.md, "Effects under a lease"): entering records the intent in the
        key's journal (with the lease's token) before the call, ``commit`` the result
        after; the key's next holder finds it committed (skip the call) or in progress
        (``reconcile(prior_token, key)`` decides). Raises ``LeaseNotFoundError`` or
        ``NotOwnerError`` when ``lease`` is no longer the key's live lease (definite:
        nothing recorded), ``InvalidArgumentError`` on a shared key, and
        ``QuotaExceededError`` past 32 effects per key or 20,000 in all. No call is
        made until the block is entered."""
        return AsyncEffect(
            LeaseEffectOwner(self, lease.key, lease.lease_id),
            effect_id,
            idempotency_key=idempotency_key,
            reconcile=reconcile,
            timeout=timeout,
        )

    async def fence(
        self,
        key: str,
        token: int,
        *,
        consistency: str = "linearizable",
        timeout: float | None = None,
    ) -> bool:
        """Is ``token`` the fencing token of the current holder of ``key``?"""
        _check_consistency(consistency)
        result = await self.call(
            "fence",
            {"key": key, "token": token, "consistency": consistency},
            mutating=False,
            timeout=timeout,
        )
        return bool(result.get("current"))

    def lock(self, key: str, **options: Any) -> AsyncHeldLock:
        """``async with client.lock(key, owner=..., ttl=...) as held:`` acquires (waiting
        up to ``wait``), renews in the background every ``ttl / 3``, and releases on
        exit. Options: those of ``acquire`` (``session=`` attaches it to a lease
        session instead of renewing it) and ``on_lost``. See ``raftlease.recipes.locks``."""
        return AsyncHeldLock(self, key, **options)

    def session(
        self,
        *,
        owner: str | None = None,
        ttl: float,
        on_lost: Callable[[str], None] | None = None,
        on_jeopardy: Callable[[str], None] | None = None,
        on_yield_requested: Callable[[list[dict[str, Any]]], None] | None = None,
        holder_key: HolderSigner | None = None,
    ) -> AsyncSession:
        """A lease session: ``async with client.session(owner=..., ttl=10) as s:``.
        Leases acquired with ``session=s`` (or ``s.acquire``/``s.lock``) are kept
        alive by its one keep-alive and released when it ends. ``owner`` defaults to
        ``hostname:pid`` (a label, not a credential: the session id proves it). With
        ``holder_key`` its leases are acquired bound to that key and each keep-alive
        brings their fresh certificates (``s.certified(lease)``; docs/certificates.md).
        See ``raftlease.recipes.sessions``."""
        return AsyncSession(
            self,
            owner=owner,
            ttl=ttl,
            on_lost=on_lost,
            on_jeopardy=on_jeopardy,
            on_yield_requested=on_yield_requested,
            holder_key=holder_key,
        )

    def election(self, name: str) -> AsyncElection:
        """Leader election on key ``name``: campaign, leader, observe, proclaim,
        resign. See ``raftlease.recipes.election``."""
        return AsyncElection(self, name)

    def queue(self, name: str, **defaults: Any) -> AsyncQueue:
        """The leased task queue ``name``: put, claim, tasks, wait_result, get, stats,
        dead, retry, purge (``raftlease.client.aio_queue``, docs/queues.md).
        ``defaults`` (lease_ttl, max_attempts, progress_timeout, retention, backoff)
        apply to every put that does not set them."""
        return AsyncQueue(self, name, **defaults)

    async def budget_set(
        self,
        key: str,
        *,
        capacity: int,
        refill_per_s: float,
        timeout: float | None = None,
    ) -> BudgetInfo:
        """Define the shared budget ``key`` (a token bucket of ``capacity`` whole
        units, refilled at ``refill_per_s`` units per second of log time, rounded to
        0.001; a new budget starts full) or change an existing one (its level is cut
        to the new capacity; waiting spends above it end). Needs ``admin`` on
        ``budget:<key>`` with auth. Raises ``InvalidArgumentError`` for bad values,
        ``QuotaExceededError`` at 10,000 budgets. Blocks for one round trip."""
        args = {"key": key, "capacity": capacity, "refill_per_s": refill_per_s}
        result = await self.call("budget_set", args, mutating=True, timeout=timeout)
        return BudgetInfo.from_wire(result["budget"])

    async def budget_get(self, key: str, *, timeout: float | None = None) -> BudgetInfo:
        """The budget ``key`` as of now (read through the log). Raises
        ``BudgetNotFoundError``."""
        result = await self.call("budget_get", {"key": key}, mutating=False, timeout=timeout)
        return BudgetInfo.from_wire(result["budget"])

    async def budget_delete(self, key: str, *, timeout: float | None = None) -> None:
        """Delete the budget ``key``: its waiting spends end (their callers get
        ``BudgetExhaustedError``), its reservations are dropped. Raises
        ``BudgetNotFoundError``."""
        await self.call("budget_delete", {"key": key}, mutating=True, timeout=timeout)

    async def spend(
        self, key: str, amount: int, *, wait: float = 0.0, timeout: float | None = None
    ) -> Spend:
        """Draw ``amount`` whole units from the budget ``key``, decided in the log.

        With ``wait=0`` (default) raises ``BudgetExhaustedError`` (definite, nothing
        drawn; ``retry_after`` says when the refill covers it) at once if the level is
        too low or others wait. With ``wait > 0`` the spend joins the budget's FIFO
        queue in the replicated state (nobody overtakes the head, so a big amount is
        not starved by small ones) and the call blocks until it is granted, in the
        log entry whose time the refill covers it, or ``wait`` seconds pass (then it
        is withdrawn and ``BudgetExhaustedError`` raised). Cancelling the call, or an
        unknown outcome, withdraws it too (module docs: raftlease.client.budgets).
        Raises ``AmountOverCapacityError`` at once for more than the capacity,
        ``BudgetNotFoundError``, ``QuotaExceededError`` (10,000 waiting)."""
        result = await budgets.draw(
            self, "budget_spend", {"key": key, "amount": amount}, wait, timeout
        )
        level = result.get("level")
        # Granted at once: the answer's log time; after a wait: the grant's.
        at = result.get("granted_at", result.get("now"))
        return Spend(
            key,
            int(result["amount"]),
            float(level) if level is not None else None,
            int(at) if isinstance(at, int) else None,
        )

    async def reserve(
        self,
        key: str,
        amount: int,
        *,
        wait: float = 0.0,
        ttl: float | None = None,
        timeout: float | None = None,
    ) -> Reservation:
        """Draw an estimate of ``amount`` units now and settle the actual cost later
        (``settle``), for costs known only afterwards (an LLM call's tokens). A
        reservation not settled within ``ttl`` seconds (default 300) is settled at
        ``amount``. Waits, refusals and cancellation as ``spend``; a reservation
        granted while its wait was being withdrawn is handed back whole."""
        args: dict[str, Any] = {"key": key, "amount": amount}
        if ttl is not None:
            args["ttl"] = ttl
        result = await budgets.draw(self, "budget_reserve", args, wait, timeout)
        return Reservation(
            key, int(result["amount"]), str(result["reservation_id"]), int(result["expires_at"])
        )

    async def settle(
        self, reservation: Reservation, actual: int, *, timeout: float | None = None
    ) -> Settlement:
        """Settle ``reservation`` with the ``actual`` cost in whole units: less than
        reserved returns the difference (up to capacity), more draws the extra, into
        debt (a negative level later refills pay off) down to minus one capacity.
        Raises ``ReservationNotFoundError`` if it was settled, cancelled or expired
        (expired: settled at its reserved amount)."""
        args = {"key": reservation.key, "reservation_id": reservation.reservation_id}
        result = await self.call(
            "budget_settle", {**args, "actual": actual}, mutating=True, timeout=timeout
        )
        return Settlement(
            reservation.key,
            int(result["reserved"]),
            int(result["actual"]),
            float(result["level"]),
        )

    async def renew(
        self,
        lease: Lease,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        progress: float | None = None,
    ) -> Lease:
        """Extend ``lease`` by its TTL (or a new ``ttl``) from now. Raises
        ``LeaseNotFoundError`` if it already expired (or stalled), ``NotOwnerError`` if
        the key is held under another lease. A lease with a holder key gets a fresh
        certificate (kept as it was when the answer carries none); its holder key
        must be the one its acquire named, else ``HolderKeyMismatchError`` (definite:
        nothing changed; docs/certificates.md).

        ``progress``: a progress figure (higher is further). On a lease acquired with
        ``progress_timeout``, a higher one than the last restarts its progress clock;
        without one the lease is extended only up to its progress deadline (the
        answer's ``valid_until`` says how long). Ignored on other leases."""
        sent = time.monotonic()
        args: dict[str, Any] = {"key": lease.key, "lease_id": lease.lease_id}
        if ttl is not None:
            args["ttl"] = ttl
        if lease.holder_key is not None:
            args["holder_key"] = lease.holder_key.public_hex()
        if progress is not None:
            args["progress"] = progress
        result = await self.call("renew", args, mutating=True, timeout=timeout)
        renewed = self._lease(result, sent)
        return replace(
            lease,
            ttl=renewed.ttl,
            valid_until=renewed.valid_until,
            expires_at_ms=renewed.expires_at_ms,
            # A yield request reaches the holder in this answer (request_yield).
            yield_deadline_ms=renewed.yield_deadline_ms,
            yield_by=renewed.yield_by,
            certificate=renewed.certificate or lease.certificate,
            progress_until=renewed.progress_until,
        )

    async def release(self, lease: Lease, *, timeout: float | None = None) -> None:
        """Give ``lease`` up. Raises ``LeaseNotFoundError`` if it had already expired."""
        await self.call(
            "release",
            {"key": lease.key, "lease_id": lease.lease_id},
            mutating=True,
            timeout=timeout,
        )

    async def read(
        self, key: str, *, consistency: str = "linearizable", timeout: float | None = None
    ) -> Read:
        """Who holds ``key``, with how the answer was served (see ``Read``).

        ``consistency``: ``"linearizable"`` (default; the leader answers from memory
        while it holds a valid leader lease, otherwise through the log), ``"log"``
        (always through the Raft log), or ``"stale"`` (whichever node the client is
        connected to answers at once from its own state; may be out of date, and says
        how old it may be).
        """
        _check_consistency(consistency)
        result = await self.call(
            "holder", {"key": key, "consistency": consistency}, mutating=False, timeout=timeout
        )
        data = result.get("holder")
        holder = _holder(data) if data else None
        if data and "holders" in data:
            holders = tuple(_holder(item) for item in data["holders"])
        else:
            holders = (holder,) if holder is not None else ()
        return Read(
            holder=holder,
            consistency=str(result.get("consistency", "log")),
            served_by=str(result.get("served_by", "")),
            applied_index=result.get("applied_index"),
            age=result.get("age"),
            holders=holders,
            capacity=int(data.get("capacity", 1)) if data else 1,
            used=int(data.get("used", 1)) if data else 0,
            revision=result.get("revision"),
        )

    async def holder(
        self, key: str, *, consistency: str = "linearizable", timeout: float | None = None
    ) -> Holder | None:
        """Who holds ``key`` now, or None. See ``read`` for ``consistency``."""
        return (await self.read(key, consistency=consistency, timeout=timeout)).holder

    async def leases(
        self,
        prefix: str = "",
        *,
        limit: int = 1000,
        consistency: str = "linearizable",
        timeout: float | None = None,
    ) -> list[Holder]:
        """Live leases whose key starts with ``prefix``, sorted by key."""
        _check_consistency(consistency)
        result = await self.call(
            "leases",
            {"prefix": prefix, "limit": limit, "consistency": consistency},
            mutating=False,
            timeout=timeout,
        )
        return [_holder(item) for item in result.get("leases", [])]

    async def revoke(
        self,
        key: str,
        *,
        lease_id: str | None = None,
        token: int | None = None,
        timeout: float | None = None,
    ) -> list[int]:
        """Operators: end every lease on ``key`` (or only the one with ``lease_id``
        or fencing ``token``) and grant the key to the next waiters, in one log entry;
        watchers see a ``revoke`` event per lease and the holders' renewals fail with
        ``LeaseNotFoundError``. Returns the revoked leases' tokens. Raises
        ``LeaseNotFoundError`` when nothing matched, ``PermissionDeniedError`` without
        the ``admin`` permission on the key (with auth on). Retried safely (dedup)."""
        args: dict[str, Any] = {"key": key}
        if lease_id is not None:
            args["lease_id"] = lease_id
        if token is not None:
            args["token"] = token
        result = await self.call("revoke", args, mutating=True, timeout=timeout)
        return [int(t) for t in result.get("tokens", [])]

    async def waiters(
        self,
        key: str,
        *,
        limit: int = 1000,
        consistency: str = "linearizable",
        timeout: float | None = None,
    ) -> list[Queued]:
        """The queue of ``key`` in grant order (``Queued``: position, owner, units,
        priority, wait left). Lease ids are never shown."""
        _check_consistency(consistency)
        result = await self.call(
            "waiters",
            {"key": key, "limit": limit, "consistency": consistency},
            mutating=False,
            timeout=timeout,
        )
        return [
            Queued(
                key=key,
                position=int(w["position"]),
                owner=str(w["owner"]),
                units=int(w["units"]),
                priority=int(w["priority"]),
                wait_left=max(0.0, w["wait_left"] / 1000.0),
                in_session=bool(w.get("in_session", False)),
            )
            for w in result.get("waiters", [])
        ]

    async def sessions(
        self, *, limit: int = 1000, consistency: str = "linearizable", timeout: float | None = None
    ) -> list[SessionInfo]:
        """Live lease sessions, soonest expiry first (``SessionInfo``: owner, ttl,
        remaining, attached leases and queued acquires). Session ids are never shown.
        With auth on, needs ``read`` on every key (the prefix "")."""
        _check_consistency(consistency)
        result = await self.call(
            "sessions",
            {"limit": limit, "consistency": consistency},
            mutating=False,
            timeout=timeout,
        )
        return [
            SessionInfo(
                owner=str(s["owner"]),
                ttl=s["ttl"] / 1000.0,
                remaining=max(0.0, s["remaining"] / 1000.0),
                leases=int(s["leases"]),
                waiters=int(s["waiters"]),
            )
            for s in result.get("sessions", [])
        ]

    async def watch(
        self, prefix: str = "", *, from_revision: int = 0
    ) -> AsyncGenerator[WatchEvent, None]:
        """Changes to keys under ``prefix``, in order: an async iterator of
        ``WatchEvent`` (grant, renew, release, expire, transfer, proclaim, revoke),
        each with its revision. ``from_revision=0`` starts from now; otherwise from
        that revision.

        On a dropped connection or a dead node it reconnects to another endpoint and
        resumes after the last revision it yielded, so no event is missed or repeated.
        Raises ``CompactedError`` if the serving node no longer has the revision
        (re-read the state, then watch from ``err.detail['revision'] + 1``).
        """
        next_rev = from_revision
        target = self.transport.target
        failures = 0
        while True:
            message = {"op": "watch", "prefix": prefix, "from_revision": next_rev}
            try:
                conn = await self.transport.connection(target, self.attempt_timeout)
                rid, queue = conn.open_stream(message)
            except ConnectionLostError:
                failures += 1
                target = self.transport.next_endpoint()
                await asyncio.sleep(min(0.5, 0.02 * 2**failures))
                continue
            try:
                while True:
                    frame = await queue.get()
                    if isinstance(frame, RaftLeaseError):
                        raise frame
                    if not frame.get("ok"):
                        raise from_response(frame)
                    failures = 0
                    if next_rev == 0 and "revision" in frame.get("result", {}):
                        next_rev = int(frame["result"]["revision"]) + 1
                    for event in frame.get("result", {}).get("events", []):
                        if event["revision"] < next_rev:
                            continue  # already yielded before a reconnect
                        next_rev = event["revision"] + 1
                        yield WatchEvent(
                            type=event["type"],
                            key=event["key"],
                            owner=event["owner"],
                            token=int(event["token"]),
                            revision=int(event["revision"]),
                            value=str(event.get("value", "")),
                            units=int(event.get("units", 1)),
                            unit_indices=tuple(int(i) for i in event.get("unit_indices", ())),
                            handoff=bool(event.get("handoff", False)),
                        )
            except (ConnectionLostError, UnavailableError):
                failures += 1
                target = self.transport.next_endpoint()
                await asyncio.sleep(min(0.5, 0.02 * 2**failures))
            finally:
                conn.close_stream(rid)

    async def node_status(self, endpoint: str, *, timeout: float = 2.0) -> dict[str, Any]:
        """The status of one node (no redirect, no retry)."""
        return await self.transport.node_status(endpoint, timeout=timeout)

    async def reload(self, endpoint: str, *, timeout: float = 10.0) -> dict[str, Any]:
        """Operators: make the node at ``endpoint`` read its auth file and client-port
        TLS files again, as ``SIGHUP`` does (docs/security.md). Returns ``{"node",
        "reloaded", "errors"}``: ``reloaded`` false means a file was refused and the
        old one stays in force, ``errors`` says why. One node, no redirect, no retry
        (reloading is per node: the files are each node's own). Raises
        ``PermissionDeniedError`` without ``admin`` (with auth on),
        ``ConnectionLostError`` if the node is unreachable or the reload closed this
        connection (its token was removed)."""
        conn = await self.transport.connection(endpoint, timeout)
        response = await conn.request({"op": "reload"}, timeout)
        if not response.get("ok"):
            raise from_response(response)
        result: dict[str, Any] = response["result"]
        return result

    async def audit(
        self,
        endpoint: str,
        *,
        key: str | None = None,
        principal: str | None = None,
        since: int = 0,
        limit: int = 1000,
        refusals: bool = False,
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        """Operators: the audit trail as the node at ``endpoint`` holds it
        (docs/audit.md): ``{"records", "base", "head", "first", "applied_index",
        "node"}``, records ``[seq, log time, type, key, token, owner, principal, by,
        revision]`` oldest first, those of ``key`` / involving ``principal`` / from
        ``since`` when given, at most ``limit`` (1 to 10,000). One node, no redirect,
        no retry (compare nodes by asking each). ``refusals``: the refusal ring instead
        (NOT_OWNER, STALE_ATTEMPT, PERMISSION_DENIED decided by the state machine, its
        own ``seq``, ``base`` and ``head``). Raises ``PermissionDeniedError``
        without ``admin`` (with auth on), ``ConnectionLostError`` if unreachable."""
        args: dict[str, Any] = {"limit": limit}
        if key is not None:
            args["key"] = key
        if principal is not None:
            args["principal"] = principal
        if since:
            args["since"] = since
        if refusals:
            args["trail"] = "refusals"
        conn = await self.transport.connection(endpoint, timeout)
        response = await conn.request({"op": "audit", **args}, timeout)
        if not response.get("ok"):
            raise from_response(response)
        result: dict[str, Any] = response["result"]
        return result

    async def cluster_status(self, *, timeout: float = 2.0) -> list[dict[str, Any]]:
        """Status of every endpoint; unreachable ones are reported, not raised."""

        async def one(endpoint: str) -> dict[str, Any]:
            try:
                status = await self.node_status(endpoint, timeout=timeout)
                status["reachable"] = True
                return status
            except RaftLeaseError as exc:
                return {"client": endpoint, "reachable": False, "error": str(exc)}

        return list(await asyncio.gather(*(one(e) for e in self.endpoints)))
