"""Shared budgets in the state machine (core/budget.py, docs/budgets.md): pure unit
tests of ``LeaseStore`` with budget entries, no node process, no clock.

The safety claims each have a test here that fails when the claim breaks: grants
never exceed the bucket over any span of log time; the level refills only through
log time (entries at one time stamp add nothing, however many); a replica restored
from a snapshot decides exactly as the one that lived through the log; a waiter for
a big amount is not overtaken by small ones.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest

from raftlease.core import MUTATING_OPS, LeaseStore
from raftlease.core.budget import SCALE, check_budget_args
from raftlease.errors import BadRequestError, InvalidArgumentError
from raftlease.operations import Limits
from raftlease.protocol import parse_request

pytestmark = pytest.mark.timeout(60)


class Log:
    """A store fed entries as a leader would stamp them (one client id, term 1)."""

    def __init__(self, store: LeaseStore | None = None) -> None:
        self.store = store or LeaseStore()
        self.seq = itertools.count(1)
        self.rids = itertools.count(1)
        self.now = 1000
        self.entries: list[dict[str, Any]] = []

    def entry(self, op: str, at: int | None = None, **fields: Any) -> dict[str, Any]:
        if at is not None:
            self.now = at
        entry: dict[str, Any] = {"op": op, "now": self.now, "term": 1, **fields}
        if op in MUTATING_OPS:
            seq = next(self.seq)
            entry.update(cid="c", seq=seq, ack=seq)
        if op in ("budget_spend", "budget_reserve") and "rid" not in entry:
            entry["rid"] = f"r{next(self.rids)}"
        return entry

    def run(self, op: str, at: int | None = None, **fields: Any) -> dict[str, Any]:
        entry = self.entry(op, at, **fields)
        self.entries.append(entry)
        return self.store.apply(entry)

    def level(self, key: str = "b") -> float:
        return float(self.run("budget_get", key=key)["budget"]["level"])


def budget(capacity: int = 10, refill: float = 2.0, key: str = "b") -> Log:
    log = Log()
    assert log.run("budget_set", key=key, capacity=capacity, refill=refill)["created"] is True
    return log


# ------------------------------------------------------------------ basics


def test_a_new_budget_starts_full_and_a_spend_draws_from_it() -> None:
    log = budget(10, 2.0)
    got = log.run("budget_spend", key="b", amount=7)
    assert got["ok"] and got["granted"] is True and got["level"] == 3.0
    view = log.run("budget_get", key="b")["budget"]
    assert view == {
        "key": "b",
        "capacity": 10,
        "refill_per_s": 2.0,
        "level": 3.0,
        "waiting": 0,
        "waiting_amount": 0,
        "reservations": 0,
        "reserved": 0,
    }


def test_a_spend_the_level_does_not_cover_is_refused_with_when_to_retry() -> None:
    log = budget(10, 2.0)
    log.run("budget_spend", key="b", amount=9)
    refused = log.run("budget_spend", key="b", amount=4)
    assert refused["code"] == "BUDGET_EXHAUSTED"
    # 3 units short at 2 per second: 1.5 s of log time.
    assert refused["detail"]["retry_after"] == 1.5 and refused["detail"]["level"] == 1.0
    assert log.level() == 1.0  # nothing drawn


def test_more_than_the_capacity_is_refused_at_once_and_never_queued() -> None:
    log = budget(10, 2.0)
    refused = log.run("budget_spend", key="b", amount=11, wait=60_000)
    assert refused["code"] == "AMOUNT_OVER_CAPACITY"
    assert refused["detail"] == {"key": "b", "amount": 11, "capacity": 10}
    assert log.run("budget_get", key="b")["budget"]["waiting"] == 0
    assert log.run("budget_reserve", key="b", amount=11)["code"] == "AMOUNT_OVER_CAPACITY"


def test_an_unknown_budget_is_a_definite_not_found() -> None:
    log = Log()
    for op, fields in (
        ("budget_spend", {"amount": 1}),
        ("budget_reserve", {"amount": 1}),
        ("budget_settle", {"rid": "x", "actual": 1}),
        ("budget_cancel", {"rid": "x"}),
        ("budget_delete", {}),
        ("budget_get", {}),
    ):
        assert log.run(op, key="nope", **fields)["code"] == "BUDGET_NOT_FOUND", op


def test_changing_a_budget_cuts_its_level_to_the_new_capacity() -> None:
    log = budget(10, 2.0)
    changed = log.run("budget_set", key="b", capacity=4, refill=0.5)
    assert changed["created"] is False
    assert changed["budget"]["level"] == 4.0 and changed["budget"]["refill_per_s"] == 0.5


# -------------------------------------------------------------- log time


def test_the_level_refills_only_through_log_time() -> None:
    """However many entries arrive at one time stamp, nothing refills; a stamp
    earlier than log time refills nothing either (log time never goes back); each
    millisecond of log time adds exactly the rate."""
    log = budget(10, 2.0)
    log.run("budget_spend", key="b", amount=10)
    for _ in range(50):
        log.run("tick")
        assert log.run("budget_spend", key="b", amount=1)["code"] == "BUDGET_EXHAUSTED"
    log.run("tick", at=900)  # a stale stamp: log time stays at 1000
    assert log.level() == 0.0
    log.run("tick", at=1500)
    assert log.level() == 1.0  # 0.5 s x 2/s
    log.run("tick", at=1501)
    assert log.level() == 1.002
    log.run("tick", at=100_000)
    assert log.level() == 10.0  # never above capacity


def test_a_fractional_refill_is_exact_however_often_it_is_applied() -> None:
    """0.001 unit/s (the finest rate) refilled at every millisecond adds up to
    what one refill over the whole span adds: no remainder is lost."""
    every = budget(1, 0.001)
    once = budget(1, 0.001)
    every.run("budget_spend", key="b", amount=1)
    once.run("budget_spend", key="b", amount=1)
    for at in range(1001, 3001):
        every.run("tick", at=at)
    once.run("tick", at=3000)
    assert every.level() == once.level() == 0.002


# ----------------------------------------------------------------- waiting


def test_waiters_are_granted_in_arrival_order_and_a_big_one_is_not_overtaken() -> None:
    log = budget(10, 1.0)
    log.run("budget_spend", key="b", amount=10)
    big = log.run("budget_spend", key="b", amount=8, wait=60_000)
    assert big["queued"] is True and big["position"] == 1
    # A small spend without wait is refused while someone waits, even if it would fit.
    log.run("tick", at=3000)  # level 2: a 1-unit spend would fit
    small_now = log.run("budget_spend", key="b", amount=1)
    assert small_now["code"] == "BUDGET_EXHAUSTED" and small_now["detail"]["waiting"] == 1
    small = log.run("budget_spend", key="b", amount=1, wait=60_000)
    assert small["position"] == 2
    log.run("tick", at=8999)  # level 7.999: the head still does not fit
    status = log.run("budget_spend_status", key="b", rid=small["spend_id"])
    assert status["state"] == "waiting" and status["position"] == 2
    log.run("tick", at=9000)  # 8 units: the head is granted, in this entry
    assert log.store.events == [
        {"type": "budget_grant", "key": "b", "lease_id": big["spend_id"]},
    ]
    log.run("tick", at=10_000)
    assert log.run("budget_spend_status", key="b", rid=small["spend_id"])["state"] == "granted"
    assert log.level() == 0.0


def test_the_next_deadline_is_when_the_refill_covers_the_head() -> None:
    log = budget(10, 4.0)
    log.run("budget_spend", key="b", amount=10)
    log.run("budget_spend", key="b", amount=5, wait=60_000)
    assert log.store.next_deadline() == 1000 + 1250  # 5 units at 4/s


def test_a_waiter_past_its_deadline_is_gone_and_the_one_behind_moves_up() -> None:
    log = budget(10, 1.0)
    log.run("budget_spend", key="b", amount=10)
    head = log.run("budget_spend", key="b", amount=9, wait=2000)
    behind = log.run("budget_spend", key="b", amount=2, wait=60_000)
    log.run("tick", at=3000)  # head's deadline: gone; 2 units refilled cover the next
    assert log.run("budget_spend_status", key="b", rid=head["spend_id"]) == {
        "ok": True,
        "state": "gone",
        "reason": "expired",
        "now": 3000,
    }
    assert log.run("budget_spend_status", key="b", rid=behind["spend_id"])["state"] == "granted"


def test_a_cancelled_waiter_leaves_the_queue_and_its_outcome_says_so() -> None:
    log = budget(10, 1.0)
    log.run("budget_spend", key="b", amount=10)
    queued = log.run("budget_spend", key="b", amount=3, wait=60_000)
    got = log.run("budget_cancel", key="b", rid=queued["spend_id"])
    assert got["cancelled"] is True
    assert log.run("budget_get", key="b")["budget"]["waiting"] == 0
    status = log.run("budget_spend_status", key="b", rid=queued["spend_id"])
    assert status["state"] == "gone" and status["reason"] == "cancelled"
    again = log.run("budget_cancel", key="b", rid=queued["spend_id"])
    assert again["cancelled"] is False


def test_a_spend_granted_before_its_cancel_stays_spent() -> None:
    log = budget(10, 1.0)
    log.run("budget_spend", key="b", amount=10)
    queued = log.run("budget_spend", key="b", amount=3, wait=60_000)
    log.run("tick", at=4000)
    got = log.run("budget_cancel", key="b", rid=queued["spend_id"])
    assert got["cancelled"] is False and got["granted"] is True
    assert log.level() == 0.0


def test_lowering_the_capacity_ends_waits_it_can_never_grant() -> None:
    log = budget(10, 1.0)
    log.run("budget_spend", key="b", amount=10)
    queued = log.run("budget_spend", key="b", amount=8, wait=60_000)
    log.run("budget_set", key="b", capacity=5, refill=1.0)
    status = log.run("budget_spend_status", key="b", rid=queued["spend_id"])
    assert status["state"] == "gone" and status["reason"] == "refused"


def test_deleting_a_budget_ends_its_waits() -> None:
    log = budget(10, 1.0)
    log.run("budget_spend", key="b", amount=10)
    queued = log.run("budget_spend", key="b", amount=8, wait=60_000)
    assert log.run("budget_delete", key="b")["deleted"] is True
    status = log.run("budget_spend_status", key="b", rid=queued["spend_id"])
    assert status["state"] == "gone" and status["reason"] == "deleted"
    assert log.store.next_deadline() is None or log.store.budgets.budgets == {}


def test_outcomes_are_forgotten_a_minute_of_log_time_later() -> None:
    log = budget(10, 1.0)
    log.run("budget_spend", key="b", amount=10)
    queued = log.run("budget_spend", key="b", amount=1, wait=60_000)
    log.run("tick", at=2000)
    assert queued["spend_id"] in log.store.budgets.outcomes
    log.run("tick", at=2000 + 60_000)
    assert log.store.budgets.outcomes == {}


# ------------------------------------------------------------- reservations


def test_settling_lower_returns_the_difference_and_higher_draws_into_debt() -> None:
    log = budget(10, 1.0)
    held = log.run("budget_reserve", key="b", amount=6, ttl=30_000)
    assert held["granted"] and held["expires_at"] == 31_000 and held["level"] == 4.0
    low = log.run("budget_settle", key="b", rid=held["reservation_id"], actual=2)
    assert low["reserved"] == 6 and low["actual"] == 2 and low["level"] == 8.0
    held = log.run("budget_reserve", key="b", amount=8)
    high = log.run("budget_settle", key="b", rid=held["reservation_id"], actual=15)
    assert high["level"] == -7.0  # 8 - 15: in debt
    log.run("tick", at=8000)  # 7 s at 1/s pays it off
    assert log.level() == 0.0


def test_debt_stops_at_minus_one_capacity() -> None:
    log = budget(10, 1.0)
    held = log.run("budget_reserve", key="b", amount=1)
    settled = log.run("budget_settle", key="b", rid=held["reservation_id"], actual=10**9)
    assert settled["level"] == -10.0


def test_an_unsettled_reservation_is_settled_at_its_amount_at_its_ttl() -> None:
    log = budget(10, 0.0)
    held = log.run("budget_reserve", key="b", amount=6, ttl=5000)
    assert log.store.next_deadline() == 6000
    log.run("tick", at=6000)
    assert log.run("budget_get", key="b")["budget"]["reservations"] == 0
    assert log.level() == 4.0  # nothing returned
    late = log.run("budget_settle", key="b", rid=held["reservation_id"], actual=1)
    assert late["code"] == "RESERVATION_NOT_FOUND"


def test_cancelling_a_granted_reservation_hands_it_back_whole() -> None:
    log = budget(10, 0.0)
    held = log.run("budget_reserve", key="b", amount=6)
    got = log.run("budget_cancel", key="b", rid=held["reservation_id"])
    assert got["cancelled"] is True and got["released"] == 6
    assert log.level() == 10.0


def test_a_queued_reserve_is_granted_as_a_reservation() -> None:
    log = budget(10, 1.0)
    log.run("budget_spend", key="b", amount=10)
    queued = log.run("budget_reserve", key="b", amount=3, wait=60_000, ttl=10_000)
    log.run("tick", at=4000)
    status = log.run("budget_spend_status", key="b", rid=queued["spend_id"])
    assert status["state"] == "granted" and status["expires_at"] == 14_000
    assert status["reservation_id"] == queued["spend_id"]
    settled = log.run("budget_settle", key="b", rid=queued["spend_id"], actual=1)
    assert settled["level"] == 2.0


def test_another_principal_may_not_settle_or_cancel() -> None:
    log = budget(10, 0.0)
    held = log.run("budget_reserve", key="b", amount=6, principal="alice")
    rid = held["reservation_id"]
    other = log.run("budget_settle", key="b", rid=rid, actual=0, principal="mallory")
    assert other["code"] == "PERMISSION_DENIED"
    assert log.run("budget_cancel", key="b", rid=rid, principal="mallory")["code"] == (
        "PERMISSION_DENIED"
    )
    assert log.run("budget_settle", key="b", rid=rid, actual=0, principal="alice")["ok"]


# ----------------------------------------------------------------- retries


def test_a_retried_spend_is_answered_again_not_drawn_twice() -> None:
    log = budget(10, 0.0)
    entry = log.entry("budget_spend", key="b", amount=4)
    first = log.store.apply(entry)
    again = log.store.apply({**entry, "rid": "another-draw"})  # the leader drew anew
    assert again == first and log.level() == 6.0


def test_a_reused_spend_id_is_refused_unchanged() -> None:
    log = budget(10, 0.0)
    log.run("budget_spend", key="b", amount=10)
    log.run("budget_spend", key="b", amount=1, wait=60_000, rid="same")
    before = log.store.to_plain()
    refused = log.store.apply(log.entry("budget_spend", key="b", amount=1, rid="same"))
    assert refused["code"] == "BAD_REQUEST"
    after = log.store.to_plain()
    assert {k: v for k, v in after.items() if k != "sessions"} == {
        k: v for k, v in before.items() if k != "sessions"
    }


# ------------------------------------------------------------ hostile input


@pytest.mark.parametrize(
    ("op", "fields"),
    [
        ("budget_set", {"capacity": 0, "refill": 1}),
        ("budget_set", {"capacity": True, "refill": 1}),
        ("budget_set", {"capacity": 10**13, "refill": 1}),
        ("budget_set", {"capacity": 5, "refill": math.nan}),
        ("budget_set", {"capacity": 5, "refill": math.inf}),
        ("budget_set", {"capacity": 5, "refill": -1}),
        ("budget_set", {"capacity": 5, "refill": "1"}),
        ("budget_set", {"capacity": 5}),
        ("budget_spend", {"amount": -1, "rid": "r"}),
        ("budget_spend", {"amount": 0, "rid": "r"}),
        ("budget_spend", {"amount": 1.5, "rid": "r"}),
        ("budget_spend", {"amount": 10**13, "rid": "r"}),
        ("budget_spend", {"amount": 1, "rid": "r", "wait": -5}),
        ("budget_spend", {"amount": 1, "rid": None}),
        ("budget_reserve", {"amount": 1, "rid": "r", "ttl": 0}),
        ("budget_settle", {"rid": "r", "actual": -1}),
        ("budget_settle", {"rid": "r", "actual": None}),
        ("budget_cancel", {"rid": ""}),
    ],
)
def test_a_malformed_budget_entry_is_refused_and_changes_nothing(
    op: str, fields: dict[str, Any]
) -> None:
    log = budget(10, 1.0)
    before = log.store.to_plain()
    result = log.store.apply(log.entry(op, key="b", **fields))
    assert result["code"] == "BAD_REQUEST", result
    assert log.store.to_plain() == before


def test_an_oversized_or_missing_key_is_refused() -> None:
    assert check_budget_args("budget_get", {"key": "k" * 5000}) is not None
    assert check_budget_args("budget_get", {}) is not None
    assert check_budget_args("budget_get", {"key": "\ud800"}) is not None
    assert check_budget_args("budget_get", {"key": "ok"}) is None


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"amount": "1"}, BadRequestError),
        ({"amount": True}, BadRequestError),
        ({"amount": 1.0}, BadRequestError),
        ({"amount": None}, BadRequestError),
        ({"amount": -1}, InvalidArgumentError),
        ({"amount": 0}, InvalidArgumentError),
        ({"amount": 10**12 + 1}, InvalidArgumentError),
        ({"amount": 10**400}, InvalidArgumentError),
        ({"amount": 1, "wait": -1}, InvalidArgumentError),
        ({"amount": 1, "wait": math.nan}, InvalidArgumentError),
        ({"amount": 1, "wait": "5"}, BadRequestError),
        ({"amount": 1, "key": ""}, InvalidArgumentError),
        ({"amount": 1, "key": "k" * 513}, InvalidArgumentError),
        ({"amount": 1, "key": 7}, BadRequestError),
    ],
)
def test_the_wire_refuses_a_hostile_spend_field_by_field(
    fields: dict[str, Any], error: type[Exception]
) -> None:
    message = {"id": 1, "op": "budget_spend", "key": "b", "cid": "c", "seq": 1, "ack": 1}
    with pytest.raises(error):
        parse_request({**message, **fields}, Limits())


@pytest.mark.parametrize(
    "refill", [math.nan, math.inf, -math.inf, -0.5, 10**9 + 1, 10**400, "1", True, None]
)
def test_the_wire_refuses_a_refill_that_is_not_a_finite_rate_in_range(refill: Any) -> None:
    message = {"id": 1, "op": "budget_set", "key": "b", "capacity": 5, "cid": "c", "seq": 1}
    with pytest.raises((BadRequestError, InvalidArgumentError)):
        parse_request({**message, "ack": 1, "refill_per_s": refill}, Limits())


def test_the_wire_hands_the_core_its_names_and_units() -> None:
    message = {"id": 1, "op": "budget_reserve", "key": "b", "amount": 3, "wait": 1.5}
    request = parse_request({**message, "ttl": 60, "cid": "c", "seq": 1, "ack": 1}, Limits())
    assert request.args == {"key": "b", "amount": 3, "wait": 1500, "ttl": 60_000}
    settle = {"id": 1, "op": "budget_settle", "key": "b", "reservation_id": "r", "actual": 0}
    request = parse_request({**settle, "cid": "c", "seq": 1, "ack": 1}, Limits())
    assert request.args == {"key": "b", "rid": "r", "actual": 0}


# ---------------------------------------------------- never over the budget


def _workload(seed: int, steps: int = 400) -> list[tuple[str, dict[str, Any], int]]:
    """A seeded mix of spends (some waiting), reserves, settles, cancels and ticks,
    each as (op, fields, time step in ms)."""
    rng = random.Random(seed)
    out: list[tuple[str, dict[str, Any], int]] = []
    for _ in range(steps):
        roll = rng.random()
        step = rng.choice((0, 0, 1, 7, 50, 250))
        if roll < 0.45:
            fields = {"amount": rng.randint(1, 12)}
            if rng.random() < 0.5:
                fields["wait"] = rng.choice((100, 1000, 5000))
            out.append(("budget_spend", fields, step))
        elif roll < 0.6:
            out.append(("budget_reserve", {"amount": rng.randint(1, 8), "ttl": 2000}, step))
        elif roll < 0.75:
            out.append(("settle", {"actual": rng.randint(0, 12)}, step))
        elif roll < 0.85:
            out.append(("cancel", {}, step))
        else:
            out.append(("tick", {}, step))
    return out


def _play(log: Log, workload: list[tuple[str, dict[str, Any], int]], rng: random.Random) -> None:
    rids: list[str] = []
    for op, fields, step in workload:
        at = log.now + step
        if op == "settle":
            if not rids:
                continue
            log.run("budget_settle", at=at, key="b", rid=rng.choice(rids), **fields)
        elif op == "cancel":
            if not rids:
                continue
            log.run("budget_cancel", at=at, key="b", rid=rng.choice(rids))
        elif op == "tick":
            log.run("tick", at=at)
        else:
            result = log.run(op, at=at, key="b", **fields)
            rid = result.get("spend_id") or result.get("reservation_id")
            if rid:
                rids.append(str(rid))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_grants_never_exceed_the_bucket_over_any_span_of_log_time(seed: int) -> None:
    """Spends only (settles return units, which the bound does not count): over
    every span [a, b] of log time the units granted are at most capacity + rate x
    (b - a). Grants are read from the store's results and events."""
    capacity, rate = 20, 20.0
    log = budget(capacity, rate)
    grants: list[tuple[int, int]] = []  # (log time, amount)
    waiting: dict[str, int] = {}
    rng = random.Random(seed)
    for op, fields, step in _workload(seed, 500):
        if op != "budget_spend":
            log.run("tick", at=log.now + step)
        else:
            result = log.run(op, at=log.now + step, key="b", **fields)
            if result.get("granted"):
                grants.append((log.now, int(result["amount"])))
            elif result.get("queued"):
                waiting[str(result["spend_id"])] = int(result["amount"])
            if waiting and rng.random() < 0.1:  # withdraw one now and then
                log.run("budget_cancel", key="b", rid=rng.choice(sorted(waiting)))
        for event in log.store.events:
            if event["type"] == "budget_grant":
                grants.append((log.now, waiting[event["lease_id"]]))
    assert len(grants) > 50
    for i, (start, _) in enumerate(grants):
        total = 0
        for at, amount in grants[i:]:
            total += amount
            assert total <= capacity + rate * (at - start) / 1000, (start, at, total)


@pytest.mark.parametrize("seed", [4, 5])
def test_the_level_stays_within_minus_and_plus_capacity(seed: int) -> None:
    log = budget(20, 5.0)
    rng = random.Random(seed)
    for op, fields, step in _workload(seed):
        _play(log, [(op, fields, step)], rng)
        level = log.store.budgets.budgets["b"].level
        assert -20 * SCALE <= level <= 20 * SCALE


@pytest.mark.parametrize("seed", [6, 7])
def test_a_restored_replica_decides_exactly_as_the_one_that_lived_through_the_log(
    seed: int,
) -> None:
    """Snapshot midway (waiters, reservations and outcomes in it), restore, and apply
    the rest of the log: the same results entry by entry, the same state and the
    same next deadline as a replica that applied every entry."""
    live = budget(20, 5.0)
    rng = random.Random(seed)
    workload = _workload(seed, 500)
    _play(live, workload[:250], rng)
    middle = len(live.entries)
    _play(live, workload[250:], rng)
    replay = LeaseStore()
    results = [replay.apply(dict(e)) for e in live.entries]
    twin = LeaseStore()
    for entry in live.entries[:middle]:
        twin.apply(dict(entry))
    pending = twin.budgets.budgets["b"]
    assert pending.waiters or pending.reservations, "the snapshot should hold some"
    twin = LeaseStore.from_plain(twin.to_plain())
    assert [twin.apply(dict(e)) for e in live.entries[middle:]] == results[middle:]
    assert twin.to_plain() == replay.to_plain()
    assert twin.next_deadline() == replay.next_deadline()


def test_a_restored_replica_expires_and_grants_as_the_original() -> None:
    """A waiter that expires, one that is granted, a reservation that expires and
    an outcome that is forgotten, all after the snapshot: the restored replica
    does each at the same entry as the original."""
    log = budget(10, 1.0)
    log.run("budget_reserve", key="b", amount=4, ttl=3000)
    log.run("budget_spend", key="b", amount=6)
    log.run("budget_spend", key="b", amount=9, wait=2000)  # expires at 3000
    log.run("budget_spend", key="b", amount=2, wait=60_000)  # granted at 3000
    log.run("budget_spend", key="b", amount=1, wait=60_000)  # granted at 4000
    twin = LeaseStore.from_plain(log.store.to_plain())
    for at in (1500, 2999, 3000, 3500, 4000, 64_000, 70_000):
        entry = log.entry("tick", at=at)
        assert twin.apply(dict(entry)) == log.store.apply(dict(entry))
        assert twin.events == log.store.events, at
        for rid in ("r2", "r3", "r4", "r5"):
            status = log.entry("budget_spend_status", key="b", rid=rid)
            assert twin.apply(dict(status)) == log.store.apply(dict(status)), (at, rid)
        assert twin.to_plain() == log.store.to_plain(), at
        assert twin.next_deadline() == log.store.next_deadline(), at


def test_a_layout_5_snapshot_restores_with_no_budgets() -> None:
    log = budget()
    plain = log.store.to_plain()
    old = {k: v for k, v in plain.items() if k != "budgets"}
    old["v"] = 5
    restored = LeaseStore.from_plain(old)
    assert restored.budgets.budgets == {}
