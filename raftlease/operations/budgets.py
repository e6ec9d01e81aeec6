"""The shared budget operations of the table (package docstring; docs/budgets.md):
defining, reading and deleting a budget, spending from it (with a FIFO wait),
reserving and settling, withdrawing a waiting spend, and the spend long-poll."""

from __future__ import annotations

from ..limits import MAX_BUDGET_AMOUNT, MAX_BUDGET_REFILL, MAX_ID_CHARS
from .schema import (
    BUDGETS,
    POLL_TIMEOUT,
    WAIT,
    Field,
    LimitRef,
    Operation,
    operation,
    result,
)

BUDGET_KEY = Field(
    "key", "string", "the budget's key", required=True, high=LimitRef("max_key_bytes")
)
AMOUNT = Field(
    "amount", "integer", "whole units to draw", required=True, low=1, high=MAX_BUDGET_AMOUNT
)
SPEND_ID = Field(
    "spend_id", "string", "from the queued spend or reserve", arg="rid", required=True,
    high=MAX_ID_CHARS,
)  # fmt: skip
NOW = result("now", "integer", "log time of the answer (ms)", True)
BUDGET_VIEW = result(
    "budget",
    "object",
    "key, capacity, refill_per_s, level (units; negative: debt), waiting, "
    "waiting_amount, reservations, reserved",
    True,
)
#: What a spend or reserve answers: granted now, queued (``wait``), or, over HTTP
#: with ``wait``, the long-poll's outcome.
DRAW = (
    result("granted", "boolean", "true: the amount was drawn", True),
    result("key", "string", "the budget", True),
    result("amount", "integer", "the amount asked", True),
    result("level", "number", "the level after a grant (units)"),
    result("reservation_id", "string", "a granted reserve's id (settle with it)"),
    result("expires_at", "integer", "log time a granted reservation is settled at its amount"),
    result("queued", "boolean", "true: waiting in the budget's queue (wait)"),
    result("spend_id", "string", "a queued spend's id (await_spend, budget_cancel)"),
    result("position", "integer", "a queued spend's place in the queue (1: next)"),
    result("deadline", "integer", "log time a queued spend gives up (ms)"),
    result("state", "string", "over HTTP with wait: granted"),
    result("granted_at", "integer", "over HTTP with wait: log time of the grant (ms)"),
    NOW,
)

BUDGET_OPS: tuple[Operation, ...] = (
    operation(
        "budget_set",
        True,
        "budget_admin",
        "define a budget or change its capacity and refill (a new one starts full)",
        (
            BUDGET_KEY,
            Field("capacity", "integer", "the most units it holds", required=True, low=1,
                  high=MAX_BUDGET_AMOUNT),
            Field("refill_per_s", "number", "units added per second of log time (0: none; "
                  "rounded to 0.001)", arg="refill", required=True, low=0,
                  high=MAX_BUDGET_REFILL),
        ),
        (result("created", "boolean", "true: a new budget", True), BUDGET_VIEW, NOW),
        (("POST", "/v1/budgets/set", "Define or change a budget", BUDGETS),),
    ),
    operation(
        "budget_get",
        False,
        "budget_read",
        "a budget's level, capacity, refill, waiting spends and reservations",
        (BUDGET_KEY,),
        (BUDGET_VIEW, NOW),
        (("GET", "/v1/budgets/get", "A budget's state", BUDGETS),),
    ),
    operation(
        "budget_delete",
        True,
        "budget_admin",
        "delete a budget: its waiting spends end, its reservations are dropped",
        (BUDGET_KEY,),
        (
            result("key", "string", "the budget", True),
            result("deleted", "boolean", "true", True),
            NOW,
        ),
        (("POST", "/v1/budgets/delete", "Delete a budget", BUDGETS),),
    ),
    operation(
        "budget_spend",
        True,
        "budget_write",
        "draw an amount; with wait, queue (FIFO, nobody overtakes the head) until the "
        "refill covers it",
        (BUDGET_KEY, AMOUNT, WAIT),
        DRAW,
        (("POST", "/v1/budgets/spend", "Spend from a budget (wait: long-poll)", BUDGETS,
          "budget"),),
    ),
    operation(
        "budget_reserve",
        True,
        "budget_write",
        "draw an estimate now and settle the actual cost later (or at its TTL, at the "
        "estimate); with wait, queue like a spend",
        (
            BUDGET_KEY,
            AMOUNT,
            WAIT,
            Field("ttl", "seconds", "seconds the reservation lives unsettled (default 300)",
                  low=LimitRef("min_ttl"), high=LimitRef("max_ttl")),
        ),
        DRAW,
        (("POST", "/v1/budgets/reserve", "Reserve from a budget (wait: long-poll)", BUDGETS,
          "budget"),),
    ),
    operation(
        "budget_settle",
        True,
        "budget_write",
        "settle a reservation with the actual cost: less returns the difference, more "
        "draws the extra (into debt, down to minus one capacity)",
        (
            BUDGET_KEY,
            Field("reservation_id", "string", "from the reserve", arg="rid", required=True,
                  high=MAX_ID_CHARS),
            Field("actual", "integer", "the actual cost in whole units", required=True,
                  low=0, high=MAX_BUDGET_AMOUNT),
        ),
        (
            result("key", "string", "the budget", True),
            result("reserved", "integer", "the amount reserved", True),
            result("actual", "integer", "the actual cost", True),
            result("level", "number", "the level after it (units)", True),
            NOW,
        ),
        (("POST", "/v1/budgets/settle", "Settle a reservation", BUDGETS),),
    ),
    operation(
        "budget_cancel",
        True,
        "budget_write",
        "withdraw a waiting spend or reserve, or hand back a granted reservation whole",
        (BUDGET_KEY, SPEND_ID),
        (
            result("key", "string", "the budget", True),
            result("cancelled", "boolean", "false: no such wait or open reservation", True),
            result("released", "integer", "the units a cancelled reservation handed back"),
            result("granted", "boolean", "true: the spend was granted before (it stays spent)"),
            NOW,
        ),
        (("POST", "/v1/budgets/cancel", "Withdraw a spend or reservation", BUDGETS),),
    ),
    operation(
        "await_spend",
        False,
        "budget_write",
        "long-poll a queued spend until it is granted, gone, or the timeout passes",
        (BUDGET_KEY, SPEND_ID, POLL_TIMEOUT),
        (
            result("state", "string", "granted, waiting or gone", True),
            result("key", "string", "the budget"),
            result("amount", "integer", "the amount granted"),
            result("granted_at", "integer", "log time of the grant (ms)"),
            result("reservation_id", "string", "a granted reserve's id"),
            result("expires_at", "integer", "log time a granted reservation expires"),
            result("position", "integer", "a waiting spend's place in the queue"),
            result("deadline", "integer", "log time a waiting spend gives up (ms)"),
            result("reason", "string", "why it is gone: expired, cancelled, refused, "
                   "deleted or unknown"),
            NOW,
        ),
    ),
)  # fmt: skip
