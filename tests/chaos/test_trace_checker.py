"""Trace validation's rules (jepsen-style/trace_checker.py, issue 43), each shown to
fail on a trace that breaks it and to pass on one that does not; and the test build's
trace (raftlease/testing/trace.py) read back by the checker."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from raftlease.clock import AdjustableClock
from raftlease.core import LeaseStore
from raftlease.testing.trace import END_KINDS, TRACE_FILE, LeaseTap, TraceLog, traced_log_clock

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "jepsen-style"))
import trace_checker

pytestmark = pytest.mark.timeout(30)


def stamp(
    term: int, applied: int, value: int, m0: float, m1: float | None = None
) -> dict[str, Any]:
    return {
        "ev": "stamp",
        "term": term,
        "applied": applied,
        "stamp": value,
        "m0": m0,
        "m1": m1 or m0,
    }


def view(term: int = 2, **changes: Any) -> dict[str, Any]:
    base = {
        "term": term,
        "applied_term": term,
        "leader_term": term,
        "lease_until": 10.0,
        "mono": 5.0,
        "alarm": False,
        "size": 3,
    }
    return {**base, **changes}


def read(before: dict[str, Any] | None, after: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"ev": "lease_read", "before": before, "after": after if after is not None else before}


START = {"ev": "start", "node": "n1", "pid": 1}


def rules(traces: dict[str, list[dict[str, Any]]]) -> set[str]:
    return {v["rule"] for v in trace_checker.check_events(traces)["violations"]}


def test_an_honest_trace_passes() -> None:
    events = [
        START,
        stamp(2, 1000, 1000, 1.0),  # anchored at the applied log time
        stamp(2, 1000, 1500, 1.5),  # 500 ms of clock, 500 ms of log time
        stamp(2, 3000, 3000, 1.6),  # re-anchored: applied log time passed the projection
        read(view()),
        stamp(3, 3000, 3000, 2.0),  # a new term anchors again
        read(view(3)),
    ]
    result = trace_checker.check_events({"n1": events, "n2": [START, read(view(4))]})
    assert result["valid"] is True, result["violations"]
    assert result["stats"]["stamp"] == 4 and result["stats"]["lease_read"] == 3


def test_stamp_rate_catches_log_time_faster_than_the_clock() -> None:
    """The planted fast_log_clock: 3 ms of log time per ms of the node's clock."""
    events = [START, stamp(2, 1000, 1000, 1.0), stamp(2, 1000, 1300, 1.1)]
    assert rules({"n1": events}) == {"stamp_rate"}
    # The same move over 300 ms of clock is the model's rate.
    assert rules({"n1": [START, stamp(2, 1000, 1000, 1.0), stamp(2, 1000, 1300, 1.3)]}) == set()


def test_stamps_monotone_and_not_behind_applied() -> None:
    back = [START, stamp(2, 1000, 1500, 1.0), stamp(2, 1000, 1400, 1.1)]
    assert rules({"n1": back}) == {"stamps_monotone"}
    behind = [START, stamp(2, 2000, 1500, 1.0)]
    assert rules({"n1": behind}) == {"stamp_not_behind_applied"}


def test_terms_monotone_per_process() -> None:
    assert rules({"n1": [START, stamp(3, 0, 0, 1.0), stamp(2, 0, 0, 1.1)]}) == {"terms_monotone"}
    # A restart begins a new process (the term is read afresh; still never lower in
    # Raft, but the checker judges each process on its own).
    assert rules({"n1": [START, stamp(3, 0, 0, 1.0), START, stamp(2, 0, 0, 0.1)]}) == set()


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"lease_until": 4.0}, "leader lease ended"),
        ({"lease_until": None}, "leader lease ended"),
        ({"alarm": True}, "drift alarm"),  # the planted ignore_drift_alarm
        ({"applied_term": 1}, "read barrier"),  # the planted skip_read_barrier
        ({"leader_term": 1}, "leader lease of term 1"),
    ],
)
def test_lease_reads_need_the_models_read_allowed(changes: dict[str, Any], why: str) -> None:
    result = trace_checker.check_events({"n1": [START, read(view(**changes))]})
    assert result["valid"] is False
    assert [v["rule"] for v in result["violations"]] == ["lease_read_allowed"]
    assert why in result["violations"][0]["detail"]
    # One snapshot of the two holding is enough: the guard changed around the decision.
    assert rules({"n1": [START, read(view(**changes), view())]}) == set()
    assert rules({"n1": [START, read(view(), view(**changes))]}) == set()


def test_one_leader_lease_per_term() -> None:
    """Two nodes serving lease reads in one term: the planted skip_vote_promise's
    deposed leader, if it kept its term."""
    assert rules({"n1": [START, read(view(5))], "n2": [START, read(view(5))]}) == {
        "one_lease_per_term"
    }
    assert rules({"n1": [START, read(view(5))], "n2": [START, read(view(6))]}) == set()


def test_no_events_or_a_truncated_trace_is_unknown(tmp_path: Path) -> None:
    assert trace_checker.check_events({"n1": [START]})["valid"] == "unknown"
    cut = [START, stamp(2, 0, 0, 1.0), {"ev": "truncated"}]
    assert trace_checker.check_events({"n1": cut})["valid"] == "unknown"
    assert trace_checker.check_dir(tmp_path, ["n1"])["valid"] == "unknown"


def test_the_test_builds_trace_is_read_back(tmp_path: Path) -> None:
    """The traced log clock writes what the checker reads (a torn last line, as a
    kill leaves it, is dropped, and the restarted node's trace goes on after it); a
    clock that runs 3x is caught."""
    node_dir = tmp_path / "n1"
    node_dir.mkdir()
    log = TraceLog(node_dir / TRACE_FILE, "n1")
    clock = AdjustableClock()
    honest = traced_log_clock(log)(clock)
    first = honest.stamp(2, 1000)
    clock.jump(0.5)
    assert honest.stamp(2, first) >= first + 500
    with (node_dir / TRACE_FILE).open("a") as f:
        f.write('{"ev":"sta')
    result = trace_checker.check_dir(tmp_path, ["n1"])
    assert result["valid"] is True and result["stats"]["stamp"] == 2, result
    # A restart after a kill mid-line: the new process's start is still read.
    log = TraceLog(node_dir / TRACE_FILE, "n1")
    fast = traced_log_clock(log)(clock, rate=3.0)
    fast.stamp(3, 5000)
    clock.jump(0.5)
    fast.stamp(3, 5000)
    result = trace_checker.check_dir(tmp_path, ["n1"])
    assert {v["rule"] for v in result["violations"]} == {"stamp_rate"}, result
    assert result["stats"]["start"] == 2 and result["stats"]["stamp"] == 4, result


def lease(index: int, at: int, *changes: list[Any], rev: int = 0) -> dict[str, Any]:
    return {"ev": "lease", "i": index, "node": "n1", "at": at, "rev": rev, "ch": list(changes)}


def grant(key: str, lid: str, token: int, until: int, units: int = 1, cap: int = 1) -> list[Any]:
    return ["grant", key, lid, token, "o-" + lid, units, cap, until]


def end(kind: str, key: str, lid: str, token: int, until: int | None) -> list[Any]:
    return [kind, key, lid, token, "o-" + lid, 1, 1, until]


def renew(key: str, lid: str, token: int, until: int) -> list[Any]:
    return ["renew", key, lid, token, "o-" + lid, 1, 1, until]


def lease_rules(*nodes: list[dict[str, Any]]) -> set[str]:
    traces = {f"n{i}": [START, stamp(2, 0, 0, 1.0), *ev] for i, ev in enumerate(nodes, 1)}
    return rules(traces)


HONEST_LEASES = [
    lease(3, 1000, grant("k", "a", 5, 2000)),
    lease(4, 1500, renew("k", "a", 5, 2500)),  # a renewal moves the expiry
    lease(6, 2500, end("expire", "k", "a", 5, 2500), grant("k", "b", 9, 3500)),  # handoff
    lease(7, 2600, end("release", "k", "b", 9, 3500), grant("k", "c", 10, 3600)),
    lease(8, 2700, grant("s", "d", 11, 3700, cap=2), grant("s", "e", 12, 3700, cap=2)),
]


def test_honest_lease_changes_pass_on_every_replica() -> None:
    """Two replicas, one of them restarted and replaying its journal (the same changes
    at the same indexes again), and a semaphore of two units held twice."""
    replay = [START, *HONEST_LEASES[:3]]
    assert lease_rules(HONEST_LEASES, HONEST_LEASES[2:] + replay) == set()
    result = trace_checker.check_events({"n1": [START, stamp(2, 0, 0, 1.0), *HONEST_LEASES]})
    assert result["stats"]["lease:grant"] == 5 and result["stats"]["lease:expire"] == 1


def test_tokens_per_key_strictly_increase_in_log_order() -> None:
    repeat = [lease(3, 1000, grant("k", "a", 5, 1100)), lease(5, 1200, grant("k", "b", 5, 2200))]
    assert lease_rules(repeat) == {"tokens_monotone"}
    # Log order, not trace order: index 5 applied (traced) before index 3 is backwards.
    backwards = [lease(5, 1200, grant("k", "b", 4, 2200)), lease(3, 1000, grant("k", "a", 5, 1100))]
    assert lease_rules(backwards) == {"tokens_monotone"}
    other_key = [lease(3, 1000, grant("k", "a", 5, 1100)), lease(5, 1200, grant("j", "b", 5, 2200))]
    assert lease_rules(other_key) == set()


def test_a_grant_needs_the_key_free_in_log_time() -> None:
    early = [lease(3, 1000, grant("k", "a", 5, 2000)), lease(4, 1999, grant("k", "b", 6, 3000))]
    assert lease_rules(early) == {"grant_when_free"}
    at_expiry = [lease(3, 1000, grant("k", "a", 5, 2000)), lease(4, 2000, grant("k", "b", 6, 3000))]
    assert lease_rules(at_expiry) == set()  # expires_at <= now: gone
    # A renewal moved the expiry: the old one no longer frees the key.
    renewed = [
        early[0],
        lease(4, 1500, renew("k", "a", 5, 2500)),
        lease(5, 2200, early[1]["ch"][0]),
    ]
    assert lease_rules(renewed) == {"grant_when_free"}
    # Capacity: a third unit on a key of two.
    sem = [lease(3, 1000, grant("s", "a", 5, 2000, cap=2), grant("s", "b", 6, 2000, cap=2))]
    assert lease_rules(sem) == set()
    third = [*sem, lease(4, 1100, grant("s", "c", 7, 2100, cap=2))]
    assert lease_rules(third) == {"grant_when_free"}


def test_replicas_apply_the_same_changes_at_each_index() -> None:
    """The planted unsynced_acks: a power loss forgets a grant and the index is reused."""
    mine = [lease(3, 1000, grant("k", "a", 5, 2000))]
    theirs = [lease(3, 1000, grant("k", "b", 5, 2000))]
    assert "replicas_agree" in lease_rules(mine, theirs)
    assert lease_rules(mine, [lease(3, 1000, grant("k", "a", 5, 2000), rev=1)]) == {
        "replicas_agree"
    }
    assert lease_rules(mine, list(mine)) == set()


def test_an_expiry_never_comes_before_the_leases_expiry() -> None:
    early = [
        lease(3, 1000, grant("k", "a", 5, 2000)),
        lease(4, 1999, end("expire", "k", "a", 5, 2000)),
    ]
    assert lease_rules(early) == {"expiry_not_early"}
    # A release may come at any time; an expiry at its time is on time.
    assert lease_rules([early[0], lease(4, 1999, end("release", "k", "a", 5, 2000))]) == set()
    assert lease_rules([early[0], lease(4, 2000, end("expire", "k", "a", 5, 2000))]) == set()


def test_the_apply_tap_traces_what_the_store_changed(tmp_path: Path) -> None:
    """``LeaseTap`` around a real store's applies: a grant, a renewal, a release with a
    handoff to a waiting acquire, an expiry; the checker reads them back as valid, and
    the tap never writes the lease id itself."""
    node_dir = tmp_path / "n1"
    node_dir.mkdir()
    log = TraceLog(node_dir / TRACE_FILE, "n1")
    tap = LeaseTap(log, "n1")
    store = LeaseStore()

    def apply(index: int, op: str, now: int, **fields: Any) -> None:
        before = tap.before(store)
        result = store.apply({"op": op, "now": now, "cid": "c", "ack": 1, **fields})
        assert result["ok"] is True, result
        tap.after(index, store, before)

    apply(1, "acquire", 1000, key="k", owner="a", ttl=100, lid="LA", seq=1)
    apply(2, "acquire", 1010, key="k", owner="b", ttl=100, lid="LB", seq=2, wait=500)
    apply(3, "renew", 1050, key="k", lid="LA", seq=3)
    apply(4, "release", 1060, key="k", lid="LA", seq=4)  # hands off to b
    apply(5, "tick", 1161)  # b's lease (1060 + 100) expires
    log.event("stamp", term=2, applied=0, stamp=0, m0=1.0, m1=1.0)
    text = (node_dir / TRACE_FILE).read_text()
    assert "LA" not in text and "LB" not in text
    events = trace_checker.read_trace(node_dir / TRACE_FILE)
    kinds = [[c[0] for c in e["ch"]] for e in events if e["ev"] == "lease"]
    assert kinds == [["grant"], ["renew"], ["release", "grant"], ["expire"]]
    result = trace_checker.check_dir(tmp_path, ["n1"])
    assert result["valid"] is True, result


def test_every_end_kind_of_the_store_is_traced() -> None:
    """A lease end of a kind the tap does not know would vanish from the trace, and
    the next grant on its key would look like a second holder: every literal kind
    ``LeaseStore`` passes to ``_end_lease`` is in ``END_KINDS``."""
    import re

    import raftlease.core.store as store_module

    source = Path(store_module.__file__).read_text()
    kinds = set(re.findall(r'_end_lease\([^,]+, "([a-z_]+)"', source))
    assert kinds >= {"expire", "release", "preempt"}, kinds
    assert kinds <= END_KINDS, kinds - END_KINDS
