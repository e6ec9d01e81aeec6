"""Shared budgets in the state machine: pure, deterministic, no I/O (issue 42).

A budget is a token bucket per key: ``capacity`` whole units, refilled at
``refill_per_s`` units per second of *log time* (the leader's stamp in each entry,
``host.now``; nothing here reads a clock). Agents draw from it with ``budget_spend``
and ``budget_reserve``; every grant is decided in the log, so the units granted over
any span of log time never exceed ``capacity + refill x span``.

Arithmetic is exact, in integers: the level is kept in micro-units (``SCALE`` per
unit) and the refill in micro-units per millisecond (``refill_per_s`` rounded to
0.001 unit/s). Refilling is ``min(cap, level + rate x dt)``, which gives the same
level whether it is applied once over a span or at every entry inside it, so a
replica restored from a snapshot decides exactly as one that lived through the log.

Waiting: a spend or reserve that does not fit and has ``wait`` joins the budget's
FIFO queue (in the state: it survives a leader change). Nobody overtakes the head:
a small spend arriving behind a big one waits too (head-of-line, so a big amount is
never starved by a stream of small ones), and one without ``wait`` is refused
``BUDGET_EXHAUSTED`` while anyone waits. Every entry first advances log time, then
(``advance``) expires reservations and waits that are due and grants waiting heads
that the refill now covers, in key order. A granted or ended wait leaves an outcome
(``outcomes``, kept ``BUDGET_OUTCOME_MS`` of log time) that its client's long-poll
reads (``spend_status``).

Reservations: ``budget_reserve`` draws an estimate and records it under the spend id
the leader drew; ``budget_settle`` with the actual cost returns the difference (up
to capacity) or draws the extra, into debt (a negative level) down to minus one
capacity: the rest is forgiven, so one wrong settle cannot block a budget for more
than two refill periods. A reservation not settled within its TTL is settled at its
reserved amount (nothing returned). Budgets do not move the store revision: they are
not keys a watch sees.

Reached only through ``LeaseStore.apply`` (store.py dispatches the ``budget_*`` ops).
docs/budgets.md gives the semantics.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from ..limits import (
    BUDGET_OUTCOME_MS,
    MAX_BUDGET_AMOUNT,
    MAX_BUDGET_PENDING,
    MAX_BUDGET_REFILL,
    MAX_BUDGETS,
    MAX_ID_CHARS,
    MAX_KEY_BYTES,
    MAX_OWNER_BYTES,
    MAX_TTL_MS,
)
from .records import Result, error

#: Micro-units per unit: the level's fixed-point scale.
SCALE = 1_000_000

#: Mutating budget operations (each carries ``cid``, ``seq``, ``ack``).
BUDGET_MUTATING_OPS = frozenset(
    {
        "budget_set",
        "budget_delete",
        "budget_spend",
        "budget_reserve",
        "budget_settle",
        "budget_cancel",
    }
)
#: Reads through the log: ``budget_get``, and ``budget_spend_status`` (the leader's
#: own read for the ``await_spend`` long-poll, never a client's).
BUDGET_READ_OPS = frozenset({"budget_get", "budget_spend_status"})
BUDGET_OPS = BUDGET_MUTATING_OPS | BUDGET_READ_OPS

#: Default reservation TTL (ms) when a reserve gives none.
DEFAULT_RESERVATION_TTL_MS = 300_000


def _int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _str(value: Any, most: int) -> bool:
    if not isinstance(value, str) or not value:
        return False
    try:
        return len(value.encode("utf-8")) <= most
    except UnicodeEncodeError:
        return False


def _rate(refill_per_s: int | float) -> int:
    """Micro-units per millisecond for ``refill_per_s`` units per second."""
    return round(refill_per_s * 1000)


def check_budget_args(op: str, entry: dict[str, Any]) -> str | None:
    """Why a ``budget_*`` entry is malformed, or None. Structural only (the state
    machine must not trust the wire): types and bounds, never the state."""
    if not _str(entry.get("key"), MAX_KEY_BYTES):
        return "'key' must be a non-empty string"
    if "owner" in entry and not _str(entry["owner"], MAX_OWNER_BYTES):
        return "'owner' must be a non-empty string"
    if op == "budget_set":
        if not _int(entry.get("capacity"), 1, MAX_BUDGET_AMOUNT):
            return f"'capacity' must be an integer from 1 to {MAX_BUDGET_AMOUNT}"
        refill = entry.get("refill")
        if (
            isinstance(refill, bool)
            or not isinstance(refill, int | float)
            or not math.isfinite(refill)
            or not 0 <= refill <= MAX_BUDGET_REFILL
        ):
            return f"'refill' must be a number from 0 to {MAX_BUDGET_REFILL} (units per second)"
    elif op in ("budget_spend", "budget_reserve"):
        if not _int(entry.get("amount"), 1, MAX_BUDGET_AMOUNT):
            return f"'amount' must be an integer from 1 to {MAX_BUDGET_AMOUNT}"
        if not _int(entry.get("wait", 0), 0, MAX_TTL_MS):
            return "'wait' must be a non-negative integer of milliseconds"
        if not _str(entry.get("rid"), MAX_ID_CHARS):
            return "'rid' must be a non-empty string"
        if op == "budget_reserve" and not _int(
            entry.get("ttl", DEFAULT_RESERVATION_TTL_MS), 1, MAX_TTL_MS
        ):
            return "'ttl' must be a positive integer of milliseconds"
    elif op in ("budget_settle", "budget_cancel", "budget_spend_status"):
        if not _str(entry.get("rid"), MAX_ID_CHARS):
            return "'rid' must be a non-empty string"
        if op == "budget_settle" and not _int(entry.get("actual"), 0, MAX_BUDGET_AMOUNT):
            return f"'actual' must be an integer from 0 to {MAX_BUDGET_AMOUNT}"
    return None


def check_gate(entry: dict[str, Any]) -> str | None:
    """Why a budget gate the leader stamped on an acquire or a claim is malformed, or
    None: ``gate_budget`` (a budget key) and ``gate_cost`` (1 to MAX_BUDGET_AMOUNT),
    both or neither."""
    if ("gate_budget" in entry) != ("gate_cost" in entry):
        return "'gate_budget' and 'gate_cost' come together"
    if "gate_budget" in entry:
        if not _str(entry["gate_budget"], MAX_KEY_BYTES):
            return "'gate_budget' must be a non-empty string"
        if not _int(entry["gate_cost"], 1, MAX_BUDGET_AMOUNT):
            return f"'gate_cost' must be an integer from 1 to {MAX_BUDGET_AMOUNT}"
    return None


@dataclass(slots=True)
class Pending:
    """A waiting spend or reserve (``ttl_ms`` > 0: a reserve, its reservation's TTL),
    or an open reservation (``deadline`` is then its expiry)."""

    rid: str
    amount: int
    deadline: int
    ttl_ms: int = 0
    owner: str = ""
    principal: str = ""

    def to_plain(self) -> list[Any]:
        return [self.rid, self.amount, self.deadline, self.ttl_ms, self.owner, self.principal]


@dataclass(slots=True)
class Budget:
    """One budget. ``level`` in micro-units (negative: debt), refilled up to
    ``stamp`` (log ms); ``rate`` in micro-units per ms; ``waiters`` in arrival order;
    ``reservations`` by spend id."""

    key: str
    capacity: int
    rate: int
    level: int
    stamp: int
    waiters: list[Pending] = field(default_factory=list)
    reservations: dict[str, Pending] = field(default_factory=dict)

    def refill(self, now: int) -> None:
        """Refill up to log time ``now`` (never backwards)."""
        if now > self.stamp:
            self.level = min(self.capacity * SCALE, self.level + self.rate * (now - self.stamp))
            self.stamp = now

    def level_at(self, now: int) -> int:
        """The level at log time ``now`` without changing anything (reads)."""
        if now <= self.stamp:
            return self.level
        return min(self.capacity * SCALE, self.level + self.rate * (now - self.stamp))

    def ready_at(self, amount: int) -> int | None:
        """Log time at which the refill covers ``amount`` (None: never, no refill)."""
        short = amount * SCALE - self.level
        if short <= 0:
            return self.stamp
        if self.rate <= 0:
            return None
        return self.stamp + -(-short // self.rate)

    def view(self, now: int) -> dict[str, Any]:
        level = self.level_at(now)
        return {
            "key": self.key,
            "capacity": self.capacity,
            "refill_per_s": self.rate / 1000,
            "level": level / SCALE,
            "waiting": len(self.waiters),
            "waiting_amount": sum(w.amount for w in self.waiters),
            "reservations": len(self.reservations),
            "reserved": sum(r.amount for r in self.reservations.values()),
        }

    def to_plain(self) -> list[Any]:
        return [
            self.key,
            self.capacity,
            self.rate,
            self.level,
            self.stamp,
            [w.to_plain() for w in self.waiters],
            [r.to_plain() for r in self.reservations.values()],
        ]


class Budgets:
    """Every budget of one store, their waits, reservations and recent outcomes.
    Single-threaded writes (``LeaseStore.apply``); ``get``/``spend_status`` are safe
    from another thread as reads of plain values (a leader-lease long-poll)."""

    def __init__(self) -> None:
        self.budgets: dict[str, Budget] = {}
        #: spend id -> [key, state, at, amount, expires_at]: a wait granted
        #: (``granted``) or ended (``expired``, ``cancelled``, ``deleted``, ``refused``),
        #: oldest first, for its client's long-poll; dropped ``BUDGET_OUTCOME_MS`` later.
        self.outcomes: dict[str, list[Any]] = {}
        #: Keys with waiters (granted from in ``advance``), and every pending item's
        #: deadline as (log ms, spend id, key): stale items are skipped when popped.
        self._backlogged: set[str] = set()
        self._deadlines: list[tuple[int, str, str]] = []

    # ---------------------------------------------------------------- time

    def next_deadline(self) -> int | None:
        """Earliest log time at which something here is due: a wait's or a
        reservation's end, or a waiting head the refill will cover (a hint for the
        leader's tick)."""
        heads = [self._deadlines[0][0]] if self._deadlines else []
        # Called on the event loop while the tick thread applies: copy before
        # iterating, and skip what changes under us (the next loop turn asks again).
        for key in list(self._backlogged):
            budget = self.budgets.get(key)
            waiters = list(budget.waiters) if budget is not None else []
            at = budget.ready_at(waiters[0].amount) if budget is not None and waiters else None
            if at is not None:
                heads.append(at)
        return min(heads) if heads else None

    def advance(self, now: int) -> list[dict[str, Any]]:
        """Log time is ``now``: end the waits and reservations that are due (a
        reservation at its reserved amount), then grant every waiting head the
        refill covers, budgets in key order. Returns the events (granted or ended
        waits, for the server's long-polls)."""
        events: list[dict[str, Any]] = []
        due: set[str] = set()
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, rid, key = heapq.heappop(self._deadlines)
            budget = self.budgets.get(key)
            if budget is None:
                continue
            held = budget.reservations.get(rid)
            if held is not None and held.deadline == deadline:
                del budget.reservations[rid]  # settled at its reserved amount
                continue
            for i, waiter in enumerate(budget.waiters):
                if waiter.rid == rid and waiter.deadline == deadline:
                    del budget.waiters[i]
                    self._ended(key, waiter, "expired", now, events)
                    due.add(key)
                    break
        for key in sorted(self._backlogged | due):
            budget = self.budgets.get(key)
            if budget is not None:
                self._serve(budget, now, events)
        while self.outcomes:
            rid, outcome = next(iter(self.outcomes.items()))
            if outcome[2] + BUDGET_OUTCOME_MS > now:
                break
            del self.outcomes[rid]
        return events

    def _serve(self, budget: Budget, now: int, events: list[dict[str, Any]]) -> None:
        """Grant waiters from the head of ``budget``'s queue while the level covers
        them (never one behind a head that does not fit)."""
        budget.refill(now)
        while budget.waiters and budget.level >= budget.waiters[0].amount * SCALE:
            waiter = budget.waiters.pop(0)
            budget.level -= waiter.amount * SCALE
            expires_at = 0
            if waiter.ttl_ms:
                expires_at = now + waiter.ttl_ms
                self._reserve(budget, waiter.rid, waiter.amount, expires_at, waiter)
            self.outcomes[waiter.rid] = [budget.key, "granted", now, waiter.amount, expires_at]
            events.append({"type": "budget_grant", "key": budget.key, "lease_id": waiter.rid})
        if budget.waiters:
            self._backlogged.add(budget.key)
        else:
            self._backlogged.discard(budget.key)

    def _ended(
        self, key: str, waiter: Pending, state: str, now: int, events: list[dict[str, Any]]
    ) -> None:
        self.outcomes[waiter.rid] = [key, state, now, waiter.amount, 0]
        events.append({"type": "budget_dequeue", "key": key, "lease_id": waiter.rid})

    def _reserve(
        self, budget: Budget, rid: str, amount: int, expires_at: int, who: Pending | None
    ) -> None:
        owner = who.owner if who is not None else ""
        principal = who.principal if who is not None else ""
        budget.reservations[rid] = Pending(rid, amount, expires_at, 0, owner, principal)
        heapq.heappush(self._deadlines, (expires_at, rid, budget.key))

    # --------------------------------------------------------------- apply

    def reused_id(self, op: str, entry: dict[str, Any]) -> str | None:
        """The leader draws fresh spend ids; a known one is a bug or forged."""
        if op in ("budget_spend", "budget_reserve"):
            rid = entry["rid"]
            budget = self.budgets.get(entry["key"])
            if rid in self.outcomes or (
                budget is not None
                and (rid in budget.reservations or any(w.rid == rid for w in budget.waiters))
            ):
                return "spend id already in use"
        return None

    def mutate(self, entry: dict[str, Any], now: int) -> tuple[Result, list[dict[str, Any]]]:
        """Apply one mutating ``budget_*`` entry (checked and admitted by the dedup
        table; log time advanced to ``now``): its result and events."""
        op: str = entry["op"]
        key: str = entry["key"]
        events: list[dict[str, Any]] = []
        if op == "budget_set":
            return self._set(entry, now, events), events
        budget = self.budgets.get(key)
        if budget is None:
            return _not_found(key), events
        budget.refill(now)
        if op == "budget_delete":
            del self.budgets[key]
            self._backlogged.discard(key)
            for waiter in budget.waiters:
                self._ended(key, waiter, "deleted", now, events)
            return {"ok": True, "key": key, "deleted": True, "now": now}, events
        if op in ("budget_spend", "budget_reserve"):
            return self._draw(budget, entry, now, events), events
        if op == "budget_settle":
            return self._settle(budget, entry, now, events), events
        return self._cancel(budget, entry, now, events), events

    def _set(self, entry: dict[str, Any], now: int, events: list[dict[str, Any]]) -> Result:
        key: str = entry["key"]
        capacity: int = entry["capacity"]
        rate = _rate(entry["refill"])
        budget = self.budgets.get(key)
        if budget is None:
            if len(self.budgets) >= MAX_BUDGETS:
                return error(
                    "QUOTA_EXCEEDED",
                    f"{len(self.budgets)} budgets exist; at most {MAX_BUDGETS} may",
                    quota=MAX_BUDGETS,
                )
            # A new budget starts full: its first agents need not wait a refill period.
            budget = Budget(key, capacity, rate, capacity * SCALE, now)
            self.budgets[key] = budget
            created = True
        else:
            budget.refill(now)
            budget.capacity, budget.rate = capacity, rate
            budget.level = min(budget.level, capacity * SCALE)
            # Waits for more than the new capacity could never be granted.
            keep = []
            for waiter in budget.waiters:
                if waiter.amount > capacity:
                    self._ended(key, waiter, "refused", now, events)
                else:
                    keep.append(waiter)
            budget.waiters = keep
            created = False
            self._serve(budget, now, events)
        return {"ok": True, "created": created, "budget": budget.view(now), "now": now}

    def _draw(
        self, budget: Budget, entry: dict[str, Any], now: int, events: list[dict[str, Any]]
    ) -> Result:
        amount: int = entry["amount"]
        rid: str = entry["rid"]
        key = budget.key
        reserve = entry["op"] == "budget_reserve"
        if amount > budget.capacity:
            return error(
                "AMOUNT_OVER_CAPACITY",
                f"{amount} units can never be granted from budget {key!r} of capacity "
                f"{budget.capacity}",
                key=key,
                amount=amount,
                capacity=budget.capacity,
            )
        owner: str = entry.get("owner", "")
        principal: str = entry.get("principal", "")
        ttl: int = entry.get("ttl", DEFAULT_RESERVATION_TTL_MS) if reserve else 0
        if not budget.waiters and budget.level >= amount * SCALE:
            budget.level -= amount * SCALE
            out: Result = {"ok": True, "granted": True, "key": key, "amount": amount}
            if reserve:
                who = Pending(rid, amount, 0, 0, owner, principal)
                self._reserve(budget, rid, amount, now + ttl, who)
                out.update(reservation_id=rid, expires_at=now + ttl)
            out.update(level=budget.level / SCALE, now=now)
            return out
        wait: int = entry.get("wait", 0)
        if wait <= 0:
            ready = budget.ready_at(amount) if not budget.waiters else None
            retry = None if ready is None else (ready - now) / 1000
            why = (
                f"{len(budget.waiters)} spend(s) wait ahead"
                if budget.waiters
                else f"its level is {budget.level / SCALE:g} of {budget.capacity}"
            )
            return error(
                "BUDGET_EXHAUSTED",
                f"budget {key!r} cannot grant {amount} now: {why}",
                key=key,
                level=budget.level / SCALE,
                capacity=budget.capacity,
                waiting=len(budget.waiters),
                retry_after=retry,
            )
        if len(budget.waiters) + len(budget.reservations) >= MAX_BUDGET_PENDING:
            return error(
                "QUOTA_EXCEEDED",
                f"budget {key!r} has {MAX_BUDGET_PENDING} waiting spends and reservations",
                quota=MAX_BUDGET_PENDING,
            )
        waiter = Pending(rid, amount, now + wait, ttl, owner, principal)
        budget.waiters.append(waiter)
        self._backlogged.add(key)
        heapq.heappush(self._deadlines, (waiter.deadline, rid, key))
        return {
            "ok": True,
            "granted": False,
            "queued": True,
            "key": key,
            "amount": amount,
            "spend_id": rid,
            "position": len(budget.waiters),
            "deadline": waiter.deadline,
            "now": now,
        }

    def _settle(
        self, budget: Budget, entry: dict[str, Any], now: int, events: list[dict[str, Any]]
    ) -> Result:
        rid: str = entry["rid"]
        held = budget.reservations.get(rid)
        if held is None:
            return error(
                "RESERVATION_NOT_FOUND",
                f"budget {budget.key!r} has no open reservation {rid!r} (settled, cancelled, "
                "or past its TTL: then it was settled at its reserved amount)",
                key=budget.key,
            )
        if held.principal != entry.get("principal", ""):
            return error(
                "PERMISSION_DENIED",
                f"the reservation on budget {budget.key!r} belongs to another principal",
            )
        actual: int = entry["actual"]
        del budget.reservations[rid]
        self._credit(budget, (held.amount - actual) * SCALE)
        self._serve(budget, now, events)
        return {
            "ok": True,
            "key": budget.key,
            "reserved": held.amount,
            "actual": actual,
            "level": budget.level / SCALE,
            "now": now,
        }

    @staticmethod
    def _credit(budget: Budget, delta: int) -> None:
        """Add ``delta`` micro-units (negative: draw), within minus one capacity
        (debt beyond is forgiven) and the capacity."""
        cap = budget.capacity * SCALE
        budget.level = max(-cap, min(cap, budget.level + delta))

    def _cancel(
        self, budget: Budget, entry: dict[str, Any], now: int, events: list[dict[str, Any]]
    ) -> Result:
        """Withdraw a waiting spend or reserve, or hand back a reservation granted
        (its whole amount: nothing was used). A plain spend granted already stays
        spent (``cancelled`` false, ``granted`` true): the budget errs toward
        under-use, never over."""
        rid: str = entry["rid"]
        principal = entry.get("principal", "")
        out: Result = {"ok": True, "key": budget.key, "cancelled": False, "now": now}
        for i, waiter in enumerate(budget.waiters):
            if waiter.rid == rid:
                if waiter.principal != principal:
                    return _not_yours(budget.key)
                del budget.waiters[i]
                self._ended(budget.key, waiter, "cancelled", now, events)
                if i == 0:
                    self._serve(budget, now, events)  # those behind may fit now
                elif not budget.waiters:
                    self._backlogged.discard(budget.key)
                out["cancelled"] = True
                return out
        held = budget.reservations.get(rid)
        if held is not None:
            if held.principal != principal:
                return _not_yours(budget.key)
            del budget.reservations[rid]
            self._credit(budget, held.amount * SCALE)
            self._serve(budget, now, events)
            out.update(cancelled=True, released=held.amount)
            return out
        outcome = self.outcomes.get(rid)
        if outcome is not None and outcome[0] == budget.key and outcome[1] == "granted":
            # Granted before the cancel: the caller must learn it was spent (its
            # amount and when), not that it was refused.
            out.update(granted=True, amount=outcome[3], granted_at=outcome[2])
        return out

    # --------------------------------------------------------------- gates

    def gate_refusal(self, entry: dict[str, Any], now: int) -> Result | None:
        """Why a budget-gated acquire or claim cannot draw its cost now, or None.

        The leader stamps ``gate_budget`` and ``gate_cost`` from the auth file
        (server/auth.py, docs/budgets.md "Budget gates"); the caller asks this before
        it grants, and calls ``gate_draw`` in the same entry only when it grants, so
        a gated grant never happens without its draw and no draw without its grant.
        Refusals are definite: a missing budget is ``BUDGET_NOT_FOUND``; a cost above
        the capacity, spends waiting on the budget (nobody overtakes them) or a level
        below the cost are ``QUOTA_EXCEEDED`` with the budget, the cost and
        ``retry_after`` (log-time seconds until the refill covers it; None when it
        never will or spends wait). Changes nothing but the refill up to ``now``."""
        key = entry.get("gate_budget")
        if key is None:
            return None
        cost: int = entry["gate_cost"]
        budget = self.budgets.get(key)
        if budget is None:
            return error(
                "BUDGET_NOT_FOUND",
                f"no budget {key!r}, which the auth file gates this principal's grants on",
                key=key,
                budget=key,
            )
        budget.refill(now)
        if not budget.waiters and budget.level >= cost * SCALE:
            return None
        ready = budget.ready_at(cost) if not budget.waiters and cost <= budget.capacity else None
        why = (
            f"{len(budget.waiters)} spend(s) wait on it"
            if budget.waiters
            else f"its level is {budget.level / SCALE:g} of {budget.capacity}"
        )
        return error(
            "QUOTA_EXCEEDED",
            f"budget {key!r} cannot cover the cost {cost} of this grant now: {why}",
            budget=key,
            cost=cost,
            level=budget.level / SCALE,
            capacity=budget.capacity,
            waiting=len(budget.waiters),
            retry_after=None if ready is None else (ready - now) / 1000,
        )

    def gate_draw(self, entry: dict[str, Any]) -> None:
        """Draw a gated grant's cost (``gate_refusal`` returned None in this same
        entry, so the level covers it). Nothing without a gate."""
        key = entry.get("gate_budget")
        if key is not None:
            self.budgets[key].level -= entry["gate_cost"] * SCALE

    # --------------------------------------------------------------- reads

    def read(self, entry: dict[str, Any], now: int) -> Result:
        """``budget_get`` and ``budget_spend_status`` through the log."""
        if entry["op"] == "budget_get":
            return self.get(entry["key"], now)
        return {"ok": True, **self.spend_status(entry["key"], entry["rid"], now), "now": now}

    def get(self, key: str, now: int) -> Result:
        """A budget's state at log time ``now``, or ``BUDGET_NOT_FOUND``."""
        budget = self.budgets.get(key)
        if budget is None:
            return _not_found(key)
        return {"ok": True, "budget": budget.view(now), "now": now}

    def spend_status(self, key: str, rid: str, now: int) -> dict[str, Any]:
        """A waiting spend's state: ``waiting`` (with its position), ``granted``
        (with a reservation's expiry), or ``gone`` (expired, cancelled, refused,
        deleted, or unknown)."""
        budget = self.budgets.get(key)
        if budget is not None:
            for position, waiter in enumerate(list(budget.waiters), start=1):
                if waiter.rid == rid:
                    return {"state": "waiting", "position": position, "deadline": waiter.deadline}
        outcome = self.outcomes.get(rid)
        if outcome is not None and outcome[0] == key and outcome[1] == "granted":
            out: dict[str, Any] = {
                "state": "granted",
                "key": key,
                "amount": outcome[3],
                "granted_at": outcome[2],
            }
            if outcome[4]:
                out.update(reservation_id=rid, expires_at=outcome[4])
            return out
        return {"state": "gone", "reason": outcome[1] if outcome is not None else "unknown"}

    # ----------------------------------------------------------- snapshots

    def to_plain(self) -> dict[str, Any]:
        """Plain data: budgets sorted by key, outcomes oldest first."""
        return {
            "budgets": [self.budgets[k].to_plain() for k in sorted(self.budgets)],
            "outcomes": [[rid, *o] for rid, o in self.outcomes.items()],
        }

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> Budgets:
        """Rebuild from ``to_plain`` output (the deadline heap and the backlog too)."""
        out = cls()
        for key, capacity, rate, level, stamp, waiters, reservations in data["budgets"]:
            budget = Budget(key, capacity, rate, level, stamp)
            budget.waiters = [Pending(*w) for w in waiters]
            budget.reservations = {r[0]: Pending(*r) for r in reservations}
            out.budgets[key] = budget
            for item in [*budget.waiters, *budget.reservations.values()]:
                out._deadlines.append((item.deadline, item.rid, key))
            if budget.waiters:
                out._backlogged.add(key)
        heapq.heapify(out._deadlines)
        out.outcomes = {row[0]: list(row[1:]) for row in data["outcomes"]}
        return out


def _not_found(key: str) -> Result:
    return error("BUDGET_NOT_FOUND", f"no budget {key!r} (define it with budget_set)", key=key)


def _not_yours(key: str) -> Result:
    return error("PERMISSION_DENIED", f"the spend on budget {key!r} belongs to another principal")
