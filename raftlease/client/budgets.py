"""Shared budgets on the client side (docs/budgets.md): the value types the budget
calls of ``AsyncClient`` and ``Client`` answer, and the spend with a wait (queue in
the replicated state, long-poll the leader, withdraw on the way out).

Threads: everything here runs on the asyncio client's event loop (the blocking
``Client`` runs it there through its portal). Cancelling a call leaves its outcome
unknown exactly like a timeout: a queued spend is withdrawn before the error is
raised (retried until the cluster answers or the wait would have ended), a
reservation granted meanwhile is handed back whole, and a plain spend granted
meanwhile stays spent (the budget errs toward under-use, never over).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..errors import BudgetExhaustedError
from .caller import Caller
from .transport import Pin, unknown_outcome

#: The client as this module uses it (``client.aio.AsyncClient`` is one).
AsyncClient = Caller


@dataclass(frozen=True, slots=True)
class BudgetInfo:
    """A budget as the cluster read it: ``level`` in units at the read's log time
    (negative: debt a settle ran into), ``waiting`` spends and the units they ask
    (``waiting_amount``), open ``reservations`` and the units they hold
    (``reserved``)."""

    key: str
    capacity: int
    refill_per_s: float
    level: float
    waiting: int
    waiting_amount: int
    reservations: int
    reserved: int

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> BudgetInfo:
        return cls(
            key=str(data["key"]),
            capacity=int(data["capacity"]),
            refill_per_s=float(data["refill_per_s"]),
            level=float(data["level"]),
            waiting=int(data["waiting"]),
            waiting_amount=int(data["waiting_amount"]),
            reservations=int(data["reservations"]),
            reserved=int(data["reserved"]),
        )


@dataclass(frozen=True, slots=True)
class Spend:
    """A granted spend: ``amount`` units drawn from ``key``; ``level`` the budget's
    level right after (None when it was granted after waiting: others may have
    drawn in the same entry); ``granted_at_ms`` the log time of the entry that
    granted it (None from a node too old to say)."""

    key: str
    amount: int
    level: float | None
    granted_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    """A granted reservation: settle it (``settle``) with the actual cost before log
    time ``expires_at_ms``, or it is settled at ``amount``. ``reservation_id`` is a
    capability: whoever has it may settle or hand back the reservation."""

    key: str
    amount: int
    reservation_id: str
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class Settlement:
    """A settled reservation: ``reserved`` and ``actual`` units, and the budget's
    ``level`` after (negative: in debt)."""

    key: str
    reserved: int
    actual: int
    level: float


async def draw(
    client: AsyncClient,
    op: str,
    args: dict[str, Any],
    wait: float,
    timeout: float | None,
) -> dict[str, Any]:
    """A ``budget_spend`` or ``budget_reserve`` (``op``) with ``args``: its granted
    answer (the long-poll's, after a wait). Raises ``BudgetExhaustedError`` when not
    granted (at once without ``wait``), ``AmountOverCapacityError``,
    ``BudgetNotFoundError``, ``QuotaExceededError``, or what the transport raises
    (after withdrawing a spend that may have queued)."""
    if wait <= 0:
        return await client.call(op, args, mutating=True, timeout=timeout)
    args = {**args, "wait": wait}
    sent = time.monotonic()
    pin = Pin()
    try:
        result = await client._call_pinned(op, args, pin, timeout)
    except BaseException as exc:
        if unknown_outcome(exc):
            # It may have queued (or been granted): send the same request again
            # under the same (cid, seq) to learn its spend id, then withdraw it.
            await client._withdraw_until(
                lambda t: _withdraw_unknown(client, op, args, pin, t), sent + wait
            )
        raise
    finally:
        pin.end()
    if not result.get("queued"):
        return result
    return await _await_spend(client, str(result["key"]), str(result["spend_id"]), sent + wait)


async def _withdraw_unknown(
    client: AsyncClient, op: str, args: dict[str, Any], pin: Pin, timeout: float
) -> None:
    """Withdraw a spend whose outcome is unknown: its answer (the cached one if it
    applied, else it applies now), then a cancel of its spend or reservation id."""
    until = time.monotonic() + timeout
    result = await client._call_pinned(op, args, pin, timeout)
    rid = result.get("spend_id") or result.get("reservation_id")
    if rid:
        left = max(until - time.monotonic(), client.attempt_timeout)
        await _cancel(client, str(result["key"]), str(rid), left)


async def _cancel(client: AsyncClient, key: str, rid: str, timeout: float) -> dict[str, Any]:
    """Withdraw a spend or reservation: the cluster's answer (``granted`` true with
    the ``amount`` and ``granted_at`` when a plain spend was granted before it)."""
    return await client.call(
        "budget_cancel", {"key": key, "spend_id": rid}, mutating=True, timeout=timeout
    )


async def _await_spend(client: AsyncClient, key: str, rid: str, until: float) -> dict[str, Any]:
    """Long-poll the leader until our queued spend is granted or gone; withdraw it
    on the way out unless granted (a reservation granted meanwhile is handed back;
    a plain spend granted between the last poll and the withdrawal is answered as
    granted: it stays spent, so the caller must not be told it was refused)."""
    reason = "wait over"
    try:
        while (left := until - time.monotonic()) > 0:
            # The server holds a poll at most half an attempt, so a poll that simply
            # waits is never mistaken for a dead node.
            hold = min(left, client.attempt_timeout / 2)
            status = await client.call(
                "await_spend",
                {"key": key, "spend_id": rid, "timeout": hold},
                mutating=False,
                timeout=hold + client.attempt_timeout,
            )
            if status["state"] == "granted":
                return status
            if status["state"] == "gone":
                reason = str(status.get("reason", "gone"))
                break
    except BaseException:
        await client._withdraw_until(lambda t: _cancel(client, key, rid, t), until)
        raise
    answers: list[dict[str, Any]] = []

    async def cancel(timeout: float) -> None:
        answers.append(await _cancel(client, key, rid, timeout))

    await client._withdraw_until(cancel, until)
    if answers and answers[-1].get("granted"):
        granted: dict[str, Any] = {
            f: answers[-1][f] for f in ("amount", "granted_at") if f in answers[-1]
        }
        return {**granted, "state": "granted", "key": key}
    raise BudgetExhaustedError(
        f"budget {key!r} did not grant the spend within the wait ({reason})",
        {"key": key, "reason": reason},
    )
