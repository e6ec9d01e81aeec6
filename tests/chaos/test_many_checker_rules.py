"""Checks that can fail: the set-taking agents' checker (jepsen-style/many_checker.py,
issue 40) on hand-made histories.

Every rule is shown failing on a small bad history, and passing on a good history that is
otherwise the same; a malformed history, or one with nothing to judge, is ``unknown``
(never a pass). The event shapes are those of jepsen-style/many_workload.py; times are
seconds from 0.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

SUITE = Path(__file__).resolve().parents[2] / "jepsen-style"
sys.path.insert(0, str(SUITE))

import checker  # noqa: E402
import many_checker  # noqa: E402

pytestmark = pytest.mark.timeout(60)

Event = dict[str, Any]


class MHist:
    """A hand-made history of the set-taking agents."""

    def __init__(self) -> None:
        self.events: list[Event] = [{"type": "meta", "t": 0.0, "rho": 0.01}]
        self.n = 0

    def _op(self, f: str, key: str, t0: float, value: dict[str, Any]) -> Event:
        self.n += 1
        base = {"op": f"s1:{self.n}", "process": "s1", "f": f, "key": key}
        self.events.append({**base, "type": "invoke", "t": t0, "value": value})
        return base

    def acquire(
        self,
        owner: str,
        keys: list[str],
        t0: float,
        t1: float | None,
        *,
        tokens: dict[str, int] | None = None,
        error: str | None = None,
        cycle: list[dict[str, str]] | None = None,
        many: bool = True,
        wait: float = 2.0,
        ttl: float = 2.0,
    ) -> None:
        value = {"owner": owner, "keys": keys, "set": many, "wait": wait, "ttl": ttl}
        base = self._op("many-acquire", keys[0], t0, value)
        if t1 is None:
            return
        if error is None:
            ok = {"tokens": tokens if tokens is not None else dict.fromkeys(keys, 1)}
            self.events.append({**base, "type": "ok", "t": t1, "value": ok})
        else:
            end: Event = {**base, "type": "fail", "t": t1, "error": error}
            if cycle is not None:
                end["value"] = {"cycle": cycle}
            self.events.append(end)

    def release(self, owner: str, keys: list[str], t0: float, t1: float) -> None:
        base = self._op("many-release", keys[0], t0, {"owner": owner, "keys": keys})
        self.events.append({**base, "type": "ok", "t": t1, "value": {}})

    def read(self, t0: float, t1: float, holders: list[tuple[str, str, int]]) -> None:
        base = self._op("many-read", "m1", t0, {})
        value = {"holders": [{"key": k, "owner": o, "token": tok} for k, o, tok in holders]}
        self.events.append({**base, "type": "ok", "t": t1, "value": value})

    def watched(self, t: float, changes: list[tuple[int, str, str, str]]) -> None:
        """A batch the watcher was delivered: (revision, type, key, owner) each."""
        events = [
            {"revision": r, "type": kind, "key": k, "owner": o, "token": 1, "units": 1}
            for r, kind, k, o in changes
        ]
        self.events.append({"type": "watch", "f": "events", "t": t, "events": events})

    def renew(
        self, owner: str, key: str, token: int, t0: float, t1: float, *, asked: int | None = None
    ) -> None:
        """A renewal accepted (``asked``: the yield deadline its answer carried, ms)."""
        base = self._op("many-renew", key, t0, {"owner": owner, "key": key, "token": token})
        self.events.append({**base, "type": "ok", "t": t1, "value": {"yield_deadline_ms": asked}})

    def renew_refused(self, owner: str, key: str, token: int, t0: float, t1: float) -> None:
        base = self._op("many-renew", key, t0, {"owner": owner, "key": key, "token": token})
        self.events.append({**base, "type": "fail", "t": t1, "error": "LEASE_NOT_FOUND"})

    def ask_yield(
        self, asker: str, key: str, holder: str, token: int, t0: float, t1: float
    ) -> None:
        value = {"owner": asker, "key": key, "holder": holder, "token": token, "deadline": 0.8}
        base = self._op("many-yield", key, t0, value)
        self.events.append({**base, "type": "ok", "t": t1, "value": {"asked": 1}})

    def fault(self, start: float, stop: float) -> None:
        self.events.append({"type": "nemesis", "f": "start", "id": 1, "t": start})
        self.events.append({"type": "nemesis", "f": "stop", "id": 1, "t": stop})


def good() -> MHist:
    h = MHist()
    h.acquire("a", ["m1", "m2"], 0.0, 0.1, tokens={"m1": 1, "m2": 1})
    h.read(0.2, 0.25, [("m1", "a", 1), ("m2", "a", 1)])
    h.release("a", ["m1", "m2"], 0.3, 0.35)
    h.acquire("b", ["m2"], 0.2, 0.4, tokens={"m2": 2}, many=False)
    h.release("b", ["m2"], 0.5, 0.55)
    h.read(0.6, 0.65, [])
    return h


def rules(h: MHist) -> set[str]:
    found = many_checker.check_many(h.events)
    return {v["rule"] for v in found["violations"]}


def test_a_good_history_passes() -> None:
    found = many_checker.check_many(good().events)
    assert found["valid"] is True, found
    assert found["stats"]["set_grants"] == 1 and found["stats"]["reads"] == 2


def test_a_set_granted_in_part_is_caught() -> None:
    h = good()
    h.acquire("c", ["m3", "m4"], 1.0, 1.1, tokens={"m3": 1})
    assert rules(h) == {"partial_grant"}


def test_a_read_showing_part_of_a_set_is_caught() -> None:
    # The client's answer named every key; a read shows the owner on one of them only.
    h = good()
    h.acquire("c", ["m3", "m4"], 1.0, 1.1, tokens={"m3": 1, "m4": 1})
    h.read(1.2, 1.25, [("m3", "c", 1)])
    assert rules(h) == {"partial_visibility"}


def test_a_read_showing_none_or_all_of_a_set_passes() -> None:
    h = good()
    h.acquire("c", ["m3", "m4"], 1.0, 1.1, tokens={"m3": 1, "m4": 1})
    h.read(1.2, 1.25, [("m3", "c", 1), ("m4", "c", 1)])
    h.read(5.0, 5.1, [])
    assert many_checker.check_many(h.events)["valid"] is True


def test_a_watch_showing_part_of_a_set_is_caught() -> None:
    h = good()
    h.acquire("c", ["m3", "m4"], 1.0, 1.1, tokens={"m3": 1, "m4": 1})
    h.watched(1.2, [(1, "grant", "m1", "a"), (2, "grant", "m2", "a"), (3, "grant", "m3", "c")])
    h.watched(1.3, [(4, "release", "m1", "a"), (5, "release", "m2", "a")])
    assert rules(h) == {"partial_watch"}
    # Every key of the set delivered: a pass; a gap around the grant: not judged.
    h = good()
    h.acquire("c", ["m3", "m4"], 1.0, 1.1, tokens={"m3": 1, "m4": 1})
    h.watched(1.2, [(1, "grant", "m1", "a"), (2, "grant", "m2", "a"), (3, "grant", "m3", "c")])
    h.watched(1.3, [(4, "grant", "m4", "c"), (5, "release", "m1", "a")])
    h.watched(1.4, [(6, "release", "m2", "a"), (7, "release", "m3", "c")])
    found = many_checker.check_many(h.events)
    assert found["valid"] is True and found["stats"]["sets_watched"] == 2, found
    h = good()
    h.acquire("c", ["m3", "m4"], 1.0, 1.1, tokens={"m3": 1, "m4": 1})
    h.watched(1.2, [(10, "grant", "m3", "c")])
    assert many_checker.check_many(h.events)["valid"] is True


def test_overlapping_holders_of_a_key_across_a_set_and_a_single_are_caught() -> None:
    h = good()
    h.acquire("c", ["m3", "m4"], 1.0, 1.1, tokens={"m3": 1, "m4": 1})
    h.acquire("d", ["m4"], 1.2, 1.3, tokens={"m4": 2}, many=False)
    assert "mutual_exclusion" in rules(h)
    # After the set's release, the single may hold the key.
    h = good()
    h.acquire("c", ["m3", "m4"], 1.0, 1.1, tokens={"m3": 1, "m4": 1})
    h.release("c", ["m3", "m4"], 1.2, 1.25)
    h.acquire("d", ["m4"], 1.15, 1.3, tokens={"m4": 2}, many=False)
    assert many_checker.check_many(h.events)["valid"] is True


def test_a_read_with_two_holders_of_a_key_is_caught() -> None:
    h = good()
    h.read(1.0, 1.1, [("m1", "x", 5), ("m1", "y", 6)])
    assert "mutual_exclusion" in rules(h)


def test_tokens_going_back_or_repeating_are_caught() -> None:
    h = good()
    # b's grant of m2 (token 2) was acknowledged before c asked: c's token must be higher.
    h.acquire("c", ["m2", "m3"], 1.0, 1.1, tokens={"m2": 1, "m3": 1})
    assert "tokens" in rules(h)
    h = good()
    h.acquire("c", ["m2", "m3"], 1.0, 1.1, tokens={"m2": 3, "m3": 1})
    assert many_checker.check_many(h.events)["valid"] is True


def test_a_wait_that_never_ends_is_caught() -> None:
    h = good()
    h.acquire("c", ["m3", "m4"], 1.0, None, wait=1.0)
    h.read(20.0, 20.1, [])
    assert rules(h) == {"stuck"}
    h = good()
    h.acquire("c", ["m3", "m4"], 1.0, 15.0, error="LEASE_HELD", wait=1.0)
    assert rules(h) == {"stuck"}
    h = good()
    h.acquire("c", ["m3", "m4"], 1.0, 2.1, error="LEASE_HELD", wait=1.0)
    assert many_checker.check_many(h.events)["valid"] is True


def cycle_history(refusal: list[dict[str, str]] | None) -> MHist:
    """x holds m5, y holds m6; x waits for m6, then y for m5: refused (or not)."""
    h = good()
    h.acquire("x", ["m5"], 1.0, 1.05, tokens={"m5": 1}, many=False, wait=0, ttl=4.0)
    h.acquire("y", ["m6"], 1.0, 1.05, tokens={"m6": 1}, many=False, wait=0, ttl=4.0)
    if refusal is None:
        h.acquire("x", ["m6"], 1.1, 3.1, error="LEASE_HELD", many=False)
        h.acquire("y", ["m5"], 1.1, 3.1, error="LEASE_HELD", many=False)
    else:
        h.acquire("x", ["m6"], 1.1, 1.3, tokens={"m6": 2}, many=False)
        h.acquire("y", ["m5"], 1.1, 1.15, error="DEADLOCK", cycle=refusal, many=False)
    return h


REAL_CYCLE = [
    {"owner": "y", "waits_for": "m5", "held_by": "x"},
    {"owner": "x", "waits_for": "m6", "held_by": "y"},
]


def test_a_refused_real_cycle_passes() -> None:
    h = cycle_history(REAL_CYCLE)
    h.release("y", ["m6"], 1.2, 1.25)
    h.release("x", ["m5"], 1.4, 1.45)
    found = many_checker.check_many(h.events)
    assert found["valid"] is True, found
    assert found["stats"]["deadlocks_refused"] == 1


def test_a_cycle_left_standing_is_caught() -> None:
    # What the planted skip_deadlock_detection build does: both wait until their waits end.
    assert rules(cycle_history(None)) == {"undetected_deadlock"}


def test_a_cycle_standing_only_during_a_fault_is_not_judged() -> None:
    h = cycle_history(None)
    h.fault(0.9, 2.0)
    assert many_checker.check_many(h.events)["valid"] is True


@pytest.mark.parametrize(
    "refusal",
    [
        [],  # no cycle at all
        [{"owner": "y", "waits_for": "m5", "held_by": "x"}],  # one edge
        # not closed: x is said to wait behind z
        [
            {"owner": "y", "waits_for": "m5", "held_by": "x"},
            {"owner": "x", "waits_for": "m6", "held_by": "z"},
        ],
        # closed, but x never waited for m1
        [
            {"owner": "y", "waits_for": "m5", "held_by": "x"},
            {"owner": "x", "waits_for": "m1", "held_by": "y"},
        ],
    ],
)
def test_a_deadlock_refusal_naming_no_real_cycle_is_caught(
    refusal: list[dict[str, str]],
) -> None:
    h = cycle_history(refusal)
    h.release("y", ["m6"], 1.2, 1.25)
    h.release("x", ["m5"], 1.4, 1.45)
    assert "deadlock_named" in rules(h)


def yield_history(*, honour: bool, granted: float | None = 2.06) -> MHist:
    """h holds m7 (token 1); w queues on it and asks h to yield within 0.8 s (answered
    at 1.25: the old lease may be seen alive until 1.25 + 0.8 + 2.0 = 4.05). h learns it
    in a renewal, then releases (``honour``) or renews until its lease is ended; w is
    granted token 2 at ``granted`` (None: not recorded here)."""
    h = good()
    h.acquire("h", ["m7"], 1.0, 1.1, tokens={"m7": 1}, many=False, wait=0)
    if granted is not None:
        h.acquire("w", ["m7"], 1.15, granted, tokens={"m7": 2}, many=False, wait=4.8)
    h.ask_yield("w", "m7", "h", 1, 1.2, 1.25)
    h.renew("h", "m7", 1, 1.3, 1.35, asked=2050)
    if honour:
        h.release("h", ["m7"], 1.4, 1.45)
    else:
        h.renew("h", "m7", 1, 1.5, 1.55, asked=2050)
        h.renew_refused("h", "m7", 1, 2.1, 2.15)
    return h


@pytest.mark.parametrize("honour", [True, False])
def test_a_yield_honoured_or_enforced_passes(honour: bool) -> None:
    # The holder's certain holding ends at the request (no mutual_exclusion although
    # its TTL from the acquire would outlast the waiter's grant).
    found = many_checker.check_many(yield_history(honour=honour, granted=2.06).events)
    assert found["valid"] is True, found
    stats = found["stats"]
    assert stats["yield_requests"] == 1 and stats["yields_learnt"] == 1, stats
    assert stats["yields_released" if honour else "yields_ended"] == 1, stats


@pytest.mark.parametrize("late", ["renew", "read"])
def test_the_old_token_accepted_after_the_next_grant_is_caught(late: str) -> None:
    # (a): w was granted token 2 at 2.06; token 1 still accepted after that.
    h = yield_history(honour=False, granted=2.06)
    if late == "renew":
        h.renew("h", "m7", 1, 2.2, 2.25)
    else:
        h.read(2.2, 2.25, [("m7", "h", 1)])
    assert rules(h) == {"yields"}


def test_a_lease_outliving_its_yield_deadline_is_caught_unless_a_fault_overlaps() -> None:
    # (b): nobody else granted yet, but the old lease renewed at 4.5 (> 4.05).
    h = yield_history(honour=False, granted=None)
    h.acquire("w", ["m7"], 1.15, 5.0, tokens={"m7": 2}, many=False, wait=4.8)
    h.renew("h", "m7", 1, 4.5, 4.55)
    assert rules(h) == {"yields"}
    h.fault(4.0, 4.2)
    found = many_checker.check_many(h.events)
    assert found["valid"] is True and found["stats"]["yields_unresolved"] >= 1, found


def test_a_waiter_not_granted_after_the_deadline_is_caught_unless_a_fault_overlaps() -> None:
    # (c): w's wait (to 5.95) outlasted the deadline (4.05) and it was refused.
    h = yield_history(honour=True, granted=None)
    h.acquire("w", ["m7"], 1.15, 5.95, many=False, wait=4.8, error="TIMEOUT")
    assert rules(h) == {"yields"}
    h.fault(3.0, 3.5)
    assert many_checker.check_many(h.events)["valid"] is True
    # A waiter that never ends.
    h = yield_history(honour=True, granted=None)
    h.acquire("w", ["m7"], 1.15, None, many=False, wait=4.8)
    h.read(17.0, 17.1, [])
    assert "yields" in rules(h)


def test_malformed_or_empty_histories_are_unknown() -> None:
    h = good()
    h.events.append({"op": "s1:99", "f": "many-acquire", "type": "invoke", "t": 1.0})
    assert many_checker.check_many(h.events)["valid"] == "unknown"
    # A yield request or renewal that does not say whose token it is.
    for f in ("many-yield", "many-renew"):
        h = good()
        bad = {"owner": "w", "key": "m7", "holder": "h", "deadline": 0.8}
        h.events.append({"op": "s1:99", "f": f, "type": "invoke", "t": 1.0, "value": bad})
        assert many_checker.check_many(h.events)["valid"] == "unknown"
    # Nothing granted as a set, or nothing read: nothing judged.
    h = MHist()
    h.acquire("b", ["m2"], 0.2, 0.4, tokens={"m2": 2}, many=False)
    h.read(0.6, 0.65, [])
    assert many_checker.check_many(h.events)["valid"] == "unknown"
    h = MHist()
    h.acquire("a", ["m1", "m2"], 0.0, 0.1)
    assert many_checker.check_many(h.events)["valid"] == "unknown"


def test_the_suite_verdict_includes_the_many_checker() -> None:
    h = good()
    h.acquire("c", ["m3", "m4"], 1.0, 1.1, tokens={"m3": 1})
    found = checker.check(h.events)
    assert found["checkers"]["many"]["valid"] is False
    assert found["valid"] is False
    # The lease checkers do not see the agents' operations.
    assert found["checkers"]["history"]["valid"] is True
