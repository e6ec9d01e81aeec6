"""``raftlease budget set|get|delete|spend|reserve|settle``: shared budgets from the
shell (docs/budgets.md), with human output or JSON (``-o json``, ``--json``).

The reservation id ``reserve`` prints is the capability to settle it; ``settle``
takes it from ``--reservation-id`` or the environment
(``RAFTLEASE_RESERVATION_ID``, not visible in ``ps``).

Exit status as for the other client commands: 0 done, 1 a definite error (among
them ``BUDGET_EXHAUSTED``: nothing was drawn), 3 an unknown outcome; SIGINT or
SIGTERM during ``--wait`` withdraw the queued spend (exit 130/143).
"""

from __future__ import annotations

import json
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import click

from .common import DURATION, TTL, client_options, run_wait, safe, with_client

if TYPE_CHECKING:  # a node process imports the CLI: it must not load the client
    from ..client import Client as BlockingClient
    from ..client.budgets import BudgetInfo

T = TypeVar("T")


def _info_dict(info: BudgetInfo) -> dict[str, Any]:
    return {
        "key": info.key,
        "capacity": info.capacity,
        "refill_per_s": info.refill_per_s,
        "level": info.level,
        "waiting": info.waiting,
        "waiting_amount": info.waiting_amount,
        "reservations": info.reservations,
        "reserved": info.reserved,
    }


def _info_text(info: BudgetInfo) -> str:
    return (
        f"{safe(info.key)}: level {info.level:g} of {info.capacity}, refill "
        f"{info.refill_per_s:g}/s, {info.waiting} waiting ({info.waiting_amount} units), "
        f"{info.reservations} reservations ({info.reserved} units)"
    )


def _draw(
    c: BlockingClient, coro: Coroutine[Any, Any, T], key: str, wait: float, timeout: float
) -> T:
    """Run a spend or reserve: with a wait, SIGINT/SIGTERM withdraw it (run_wait)."""
    return run_wait(c, coro, f"budget {key}", timeout) if wait else c.portal.run(coro)


def _echo(as_json: bool, data: dict[str, Any], human: str) -> None:
    click.echo(json.dumps({"ok": True, **data}) if as_json else human)


@click.group()
def budget() -> None:
    """Shared budgets (token buckets in log time): set, get, delete, spend, reserve,
    settle."""


@budget.command("set")
@click.argument("key")
@click.option("--capacity", type=click.IntRange(min=1), required=True, help="Most units held.")
@click.option(
    "--refill", type=click.FloatRange(min=0.0), required=True, help="Units added per second."
)
@client_options
def set_(
    key: str, capacity: int, refill: float, endpoints: str, as_json: bool, timeout: float
) -> None:
    """Define budget KEY, or change its capacity and refill (a new one starts full)."""
    info = with_client(
        endpoints,
        as_json,
        lambda c: c.budget_set(key, capacity=capacity, refill_per_s=refill, timeout=timeout),
    )
    _echo(as_json, {"budget": _info_dict(info)}, _info_text(info))


@budget.command()
@click.argument("key")
@client_options
def get(key: str, endpoints: str, as_json: bool, timeout: float) -> None:
    """Show budget KEY: level, capacity, refill, waiting spends, reservations."""
    info = with_client(endpoints, as_json, lambda c: c.budget_get(key, timeout=timeout))
    _echo(as_json, {"budget": _info_dict(info)}, _info_text(info))


@budget.command()
@click.argument("key")
@client_options
def delete(key: str, endpoints: str, as_json: bool, timeout: float) -> None:
    """Delete budget KEY (its waiting spends end, its reservations are dropped)."""
    with_client(endpoints, as_json, lambda c: c.budget_delete(key, timeout=timeout))
    _echo(as_json, {"key": key, "deleted": True}, f"deleted budget {safe(key)}")


@budget.command()
@click.argument("key")
@click.argument("amount", type=click.IntRange(min=1))
@click.option("--wait", type=DURATION, default=0.0, help="Queue up to this long (FIFO).")
@client_options
def spend(
    key: str, amount: int, wait: float, endpoints: str, as_json: bool, timeout: float
) -> None:
    """Draw AMOUNT units from budget KEY (exit 1 with BUDGET_EXHAUSTED if not granted)."""
    done = with_client(
        endpoints,
        as_json,
        lambda c: _draw(
            c, c.aio.spend(key, amount, wait=wait, timeout=timeout), key, wait, timeout
        ),
    )
    data = {"key": key, "granted": True, "amount": done.amount, "level": done.level}
    _echo(as_json, data, f"spent {done.amount} from {safe(key)}")


@budget.command()
@click.argument("key")
@click.argument("amount", type=click.IntRange(min=1))
@click.option("--wait", type=DURATION, default=0.0, help="Queue up to this long (FIFO).")
@click.option("--ttl", type=TTL, default=None, help="Settled at AMOUNT after this (300s).")
@client_options
def reserve(
    key: str,
    amount: int,
    wait: float,
    ttl: float | None,
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """Reserve AMOUNT units of budget KEY; prints the reservation id to settle with."""
    held = with_client(
        endpoints,
        as_json,
        lambda c: _draw(
            c, c.aio.reserve(key, amount, wait=wait, ttl=ttl, timeout=timeout), key, wait, timeout
        ),
    )
    data = {
        "key": key,
        "granted": True,
        "amount": held.amount,
        "reservation_id": held.reservation_id,
        "expires_at": held.expires_at_ms,
    }
    _echo(
        as_json,
        data,
        f"reserved {held.amount} of {safe(key)}\nreservation id: {held.reservation_id}",
    )


@budget.command()
@click.argument("key")
@click.argument("actual", type=click.IntRange(min=0))
@click.option(
    "--reservation-id",
    envvar="RAFTLEASE_RESERVATION_ID",
    required=True,
    help="The id reserve printed (env RAFTLEASE_RESERVATION_ID).",
)
@client_options
def settle(
    key: str, actual: int, reservation_id: str, endpoints: str, as_json: bool, timeout: float
) -> None:
    """Settle a reservation of budget KEY with the ACTUAL cost in units."""
    args = {"key": key, "reservation_id": reservation_id, "actual": actual}
    result = with_client(
        endpoints, as_json, lambda c: c.call("budget_settle", args, mutating=True, timeout=timeout)
    )
    data = {k: result[k] for k in ("key", "reserved", "actual", "level")}
    _echo(
        as_json,
        data,
        f"settled {safe(key)}: reserved {result['reserved']}, actual {result['actual']}, "
        f"level {result['level']:g}",
    )
