"""Every guard has a planted bug that the suite catches.

Each guard below is switched off in a planted build of the test node
(``python -m raftlease.testing.node --planted-bug NAME``, ``raftlease.testing.hooks.
PLANTED_BUGS``), and each test runs the same scenario and the same safety check on
the honest test build and on the planted one: the check must report nothing on the
honest build and a violation on the planted one. The checks are written once, as
functions returning a list of violations.

| planted bug | guard | check |
|---|---|---|
| ``skip_vote_promise`` | vote promise | ``stale_reads`` (a read misses an acknowledged write) |
| ``ignore_drift_alarm`` | drift alarm stops lease reads | ``lease_reads_under_alarm`` |
| ``skip_read_barrier`` | own-term entry before lease reads | ``stale_reads`` |
| ``raw_follower_log`` | follower-log correction | ``applied_entries_truncated`` |
| ``skip_dedup`` | dedup table | ``retry_applied_twice`` |
| ``unwritten_keepalives`` | keep-alives from memory reach the log | ``early_grants`` |
| ``no_term_extension`` | a new term extends every lease | ``early_grants`` |
| ``partial_many_grant`` | a set of keys all or none | ``check_entry`` (test_core_many.py) |
| ``skip_deadlock_detection`` | deadlock detection | ``cycles`` (test_core_deadlock.py) |
| ``skip_effect_check`` | a begin reads the effect journal | ``queue_checker.check_effects`` |
| ``early_child`` | a child waits for its parents | ``queue_checker.check_dependencies`` |
| ``skip_lease_effect_fence`` | a live lease fences effects | ``queue_checker.check_effects`` |
| ``progress_from_memory`` | progress renewals go through the log | ``promised_past_progress`` |
| ``rebind_holder_key`` | a certificate binds the key named at the grant | ``foreign_key_bound`` |

The chaos suite's own runs catch the other two (``CHAOS_COVERED``, in
tests/chaos/test_chaos.py): ``fast_log_clock`` (the log clock) and ``unsynced_acks`` (no
acknowledgement before a sync: three ``power-loss`` faults, honest and planted).

Where catching the planted build depends on timing (the follower-log load opens a
window that a loaded machine may miss), the planted run is retried a bounded number of
times (``ATTEMPTS``); the honest run is never retried, and each attempt of either build
asserts that the scenario really happened (the candidate campaigned, the alarm was
raised, the new leader was elected, the load ran). The vote-promise and read-barrier
scenarios hold their windows open with the test build's peer controls (``test_hold``,
``test_elections``) and catch their planted builds on every run.

The unit half of these tests (no process); the integration half is
tests/integration/test_planted_bugs.py.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raftlease.config import NodeConfig
from raftlease.core import LeaseStore
from raftlease.replication import LeaseGuard, LeaseTransport
from raftlease.server import ServerHooks
from raftlease.server.node import unclean_stop_wait
from raftlease.server.proposer import Proposer
from raftlease.server.reads import Reads
from raftlease.testing import PLANTED_BUGS, hook_arguments
from raftlease.testing.node import (
    BarrierlessReads,
    DeadlockBlindStore,
    DriftBlindGuard,
    EagerElectionTransport,
    EarlyChildStore,
    EffectBlindStore,
    FenceBlindEffectStore,
    ForgetfulStore,
    PartialSetStore,
    ProgressFromMemoryStore,
    PromiselessGuard,
    RawFollowerLogTransport,
    RebindingStore,
    ShortMemoryStore,
    StaleAcceptingStore,
    StaleAcceptingTasks,
    UnwritingProposer,
    build_hooks,
    controlled,
    join_at_once,
)
from tests.integration.test_cluster import raw_request
from tests.unit import test_follower_log
from tests.unit.test_follower_log import START, Follower, ae, entry, run
from tests.unit.test_leadership import FakeClock, feed

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "jepsen-style"))

pytestmark = pytest.mark.timeout(60)

#: The planted bugs this file covers (the others: ``CHAOS_COVERED``).
COVERED = (
    "skip_pre_vote",
    "skip_vote_promise",
    "ignore_drift_alarm",
    "skip_read_barrier",
    "raw_follower_log",
    "skip_dedup",
    "accept_stale_attempt",
    "unwritten_keepalives",
    "no_term_extension",
    "partial_many_grant",
    "skip_deadlock_detection",
    "skip_effect_check",
    "early_child",
    "progress_from_memory",
    "skip_lease_effect_fence",
    "rebind_holder_key",
)

#: Planted bugs caught by chaos-suite runs, and the test of tests/chaos/test_chaos.py that
#: runs the suite on the planted build (it must fail) and, where it is parametrized,
#: on the honest one (it must pass).
CHAOS_COVERED = {
    "fast_log_clock": "test_planted_bug_fast_log_clock_is_caught",
    "unsynced_acks": "test_power_loss_keeps_acknowledged_grants_only_with_fsync",
    "accept_stale_attempt": "test_planted_bug_accept_stale_attempt_is_caught",
}


def status_of(addr: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """A node's local status, or None if it does not answer in time."""
    try:
        response = raw_request(addr, {"id": 1, "op": "status"}, timeout=timeout)
    except (OSError, AssertionError):
        return None
    return response["result"] if response.get("ok") else None


# ---------------------------------------------------------------- the checks


@dataclass(frozen=True)
class Write:
    """An acquire the cluster acknowledged at ``acked`` (test-process monotonic time)."""

    key: str
    token: int
    acked: float


@dataclass(frozen=True)
class ReadResult:
    """A read of ``key`` sent at ``sent`` (test-process monotonic time); ``response``
    is the node's answer (None: no answer)."""

    key: str
    sent: float
    response: dict[str, Any] | None


def stale_reads(write: Write, reads: list[ReadResult]) -> list[str]:
    """Linearizable reads that started after ``write`` was acknowledged and do not
    show it: each is a violation. Refusals and reads without an answer are not."""
    violations = []
    for read in reads:
        if read.key != write.key or read.sent <= write.acked or read.response is None:
            continue
        if not read.response.get("ok"):
            continue
        result = read.response["result"]
        holder = result.get("holder")
        if holder is None or holder.get("token") != write.token:
            violations.append(
                f"read of {read.key!r} sent {read.sent - write.acked:.3f} s after the grant "
                f"(token {write.token}) was acknowledged, served by {result.get('served_by')} "
                f"as {result.get('consistency')!r}, answered holder {holder}"
            )
    return violations


@dataclass(frozen=True)
class AlarmedRead:
    """A read from the leader between two of its status answers."""

    alarm_before: bool
    consistency: str | None
    alarm_after: bool


def lease_reads_under_alarm(reads: list[AlarmedRead]) -> list[str]:
    """Reads the leader served from its lease while its drift alarm was raised (seen
    raised both just before and just after the read): each is a violation."""
    return [
        f"read {i} served as 'lease' while the leader's drift alarm was raised"
        for i, read in enumerate(reads)
        if read.alarm_before and read.alarm_after and read.consistency == "lease"
    ]


#: What PySyncObj logs when a follower deletes entries it has already applied.
TRUNCATION = "truncating already-applied log entries"


def applied_entries_truncated(logs: dict[str, str]) -> list[str]:
    """Every time a node deleted log entries it had already applied (PySyncObj logs it,
    CRITICAL): a follower shortened a log it had acknowledged, the precondition for
    losing a committed write."""
    return [
        f"{node}: {line.strip()}"
        for node, text in sorted(logs.items())
        for line in text.splitlines()
        if TRUNCATION in line
    ]


def retry_applied_twice(
    first: dict[str, Any], retry: dict[str, Any], held_by_owner: int
) -> list[str]:
    """A retried mutating request (same cid and seq) must get the first answer and
    must not change the state again: a different answer, or more than one lease held
    for one request, is a violation."""
    violations = []
    if retry != first:
        violations.append(f"the retry was answered {retry}, the first attempt {first}")
    if held_by_owner > 1:
        violations.append(f"one acquire holds {held_by_owner} leases")
    return violations


def promised_past_progress(cap_ms: int, promised_ms: list[int]) -> list[str]:
    """``progress_from_memory``: renewals without progress of a progress-aware lease
    whose deadline (log time) is ``cap_ms`` must never promise an expiry past it (the
    log ends the lease there; a later promise lets the holder act while another holds
    the key)."""
    return [
        f"a renewal promised {p} ms, past the progress deadline {cap_ms}"
        for p in promised_ms
        if p > cap_ms
    ]


# ------------------------------------------------------ hooks: unit tests


@pytest.mark.parametrize("bug", COVERED)
def test_hook_arguments_name_the_planted_bug(bug: str) -> None:
    assert bug in PLANTED_BUGS
    assert hook_arguments({"planted_bug": bug}) == ["--planted-bug", bug, "--clock-control"]


def test_every_planted_bug_has_a_catcher() -> None:
    """A planted bug nothing runs is a guard nobody shows to work."""
    assert set(PLANTED_BUGS) == set(COVERED) | set(CHAOS_COVERED)
    chaos = (Path(__file__).resolve().parents[1] / "chaos" / "test_chaos.py").read_text()
    for bug, test in CHAOS_COVERED.items():
        assert f"def {test}(" in chaos, (bug, test)
        assert f'"{bug}"' in chaos, f"tests/chaos/test_chaos.py never runs {bug}"


def test_unsynced_acks_build_records_what_reached_the_disk() -> None:
    """The power-loss twin needs the synced shadows on the planted build too."""
    args = hook_arguments({"planted_bug": "unsynced_acks"})
    assert args[:2] == ["--planted-bug", "unsynced_acks"] and "--record-synced" in args
    assert "--record-synced" in hook_arguments({"clock_control": True, "record_synced": True})


def test_unsynced_acks_build_joins_at_once_after_a_machine_crash() -> None:
    """The planted build's wait after an unclean stop with durability none is none;
    the honest build's covers the longest TTL, drift and an election."""
    assert build_hooks("unsynced_acks").restart_wait is join_at_once
    assert build_hooks("").restart_wait is unclean_stop_wait
    assert join_at_once(NodeConfig.__new__(NodeConfig)) == 0.0


def test_unknown_planted_bug_is_refused_before_any_process_starts() -> None:
    with pytest.raises(ValueError, match="unknown planted bug"):
        hook_arguments({"planted_bug": "skip_everything"})
    with pytest.raises(ValueError, match="unknown planted bug"):
        build_hooks("skip_everything")


#: What each planted build changes in ServerHooks, against the honest test build.
PLANTED_FIELDS: dict[str, dict[str, Any]] = {
    "skip_pre_vote": {"transport_class": controlled(EagerElectionTransport)},
    "skip_vote_promise": {"guard_class": PromiselessGuard},
    "ignore_drift_alarm": {"guard_class": DriftBlindGuard},
    "skip_read_barrier": {"reads_class": BarrierlessReads},
    "raw_follower_log": {"transport_class": controlled(RawFollowerLogTransport)},
    "skip_dedup": {"store_class": ForgetfulStore},
    "accept_stale_attempt": {"store_class": StaleAcceptingStore},
    "unwritten_keepalives": {"proposer_class": UnwritingProposer},
    "no_term_extension": {"store_class": ShortMemoryStore},
    "partial_many_grant": {"store_class": PartialSetStore},
    "skip_deadlock_detection": {"store_class": DeadlockBlindStore},
    "skip_effect_check": {"store_class": EffectBlindStore},
    "early_child": {"store_class": EarlyChildStore},
    "skip_lease_effect_fence": {"store_class": FenceBlindEffectStore},
    "progress_from_memory": {"store_class": ProgressFromMemoryStore},
    "rebind_holder_key": {"store_class": RebindingStore},
}

HOOK_FIELDS = (
    "log_clock_rate",
    "guard_class",
    "reads_class",
    "transport_class",
    "store_class",
    "proposer_class",
)


@pytest.mark.parametrize("bug", COVERED)
def test_build_hooks_changes_exactly_the_planted_guard(bug: str) -> None:
    honest, planted = build_hooks(""), build_hooks(bug)
    changed = {
        name: getattr(planted, name)
        for name in HOOK_FIELDS
        if getattr(planted, name) != getattr(honest, name)
    }
    assert changed == PLANTED_FIELDS[bug]
    assert planted.clock is not None and "test_clock" in planted.control_ops
    assert {"test_hold", "test_elections"} <= set(planted.control_ops)


def test_production_hooks_are_the_honest_ones() -> None:
    """``raftlease node`` builds no hooks; the defaults are the honest build (whose
    transport adds only the test build's peer controls, ``test_hold`` and
    ``test_elections``)."""
    production, honest = ServerHooks(), build_hooks("")
    for name in HOOK_FIELDS:
        expected = getattr(production, name)
        if name == "transport_class":
            expected = controlled(expected)
        assert getattr(honest, name) == expected, name
    assert production.guard_class is LeaseGuard
    assert production.transport_class is LeaseTransport
    assert production.store_class is LeaseStore
    assert production.reads_class is Reads and production.proposer_class is Proposer
    assert production.restart_wait is unclean_stop_wait
    assert production.clock is None and not production.control_ops


def test_drift_blind_guard_keeps_its_lease_under_an_alarm() -> None:
    clock = FakeClock()
    for guard_class, valid in ((LeaseGuard, False), (DriftBlindGuard, True)):
        guard = guard_class(clock, cluster_size=3, promise=0.4, rho=0.01)
        guard.on_reply("F1", 3, guard.stamp_outgoing(3), None)
        feed(guard.drift, rate=1.1, seconds=8)
        clock.now = guard.lease_until - 0.01  # still inside the lease window
        assert guard.drift.alarm
        assert guard.lease_valid(3) is valid, guard_class.__name__
        clock.now = guard.lease_until
        assert not guard.lease_valid(3), "the planted guard still ends its lease on time"


@pytest.mark.parametrize("build", ["honest", "skip_dedup"])
def test_store_answers_a_retry_from_the_dedup_table(build: str) -> None:
    """The state machine alone: the same acquire entry applied twice (a retry after a
    lost response; the leader draws a fresh lease id for each attempt)."""
    store = build_hooks("" if build == "honest" else build).store_class()
    base = {"op": "acquire", "key": "k", "owner": "a", "ttl": 30_000, "capacity": 2}
    base |= {"cid": "c1", "seq": 1, "ack": 1, "term": 1}
    first = store.apply({**base, "lid": "a" * 32, "now": 1000})
    retry = store.apply({**base, "lid": "b" * 32, "now": 1001})
    held = len(store.holders_of("k"))
    violations = retry_applied_twice(first, retry, held)
    if build == "honest":
        assert violations == []
    else:
        assert violations != [], "the planted store answered the retry from the table"


@pytest.mark.parametrize("build", ["honest", "partial_many_grant"])
def test_a_set_of_keys_is_granted_whole_or_not_at_all(build: str) -> None:
    """The state machine alone: the seeded workload of tests/unit/test_core_many.py,
    whose check after every entry reports a set granted in part."""
    from tests.unit.test_core_many import run_workload

    store = build_hooks("" if build == "honest" else build).store_class()
    violations = [v for v in run_workload(store, 1) if "granted" in v]
    if build == "honest":
        assert violations == []
    else:
        assert violations != [], "the planted store granted no set in part"


@pytest.mark.parametrize("build", ["honest", "skip_deadlock_detection"])
def test_no_cycle_of_waits_outlives_the_entry_that_closes_it(build: str) -> None:
    """The state machine alone: the seeded workload of tests/unit/test_core_deadlock.py,
    whose check after every entry reports a cycle left in the waits-for graph."""
    from tests.unit.test_core_deadlock import run_workload

    store = build_hooks("" if build == "honest" else build).store_class()
    violations = [v for v in run_workload(store, 1) if "cycle left" in v]
    if build == "honest":
        assert violations == []
    else:
        assert violations != [], "the planted store left no cycle"


def _task_entry(op: str, now: int, seq: int, **fields: Any) -> dict[str, Any]:
    return {"op": op, "now": now, "cid": f"t{seq}", "seq": 1, "ack": 1, "queue": "q", **fields}


@pytest.mark.parametrize("build", ["honest", "accept_stale_attempt"])
@pytest.mark.parametrize("snapshotted", [False, True])
def test_a_zombies_completion_is_refused(build: str, snapshotted: bool) -> None:
    """The state machine alone: attempt A1 expires, the task is claimed again (A2),
    then A1's worker completes it. The honest store refuses STALE_ATTEMPT and keeps
    the task for A2; the planted one accepts the zombie's result (also after a
    snapshot round trip, which must keep the planted queues)."""
    store = build_hooks("" if build == "honest" else build).store_class()
    if snapshotted:
        store = type(store).from_plain(store.to_plain())
    put = _task_entry("task_put", 0, 1, tid="T", payload="{}", ttl=500, backoff=1)
    assert store.apply(put)["ok"] is True
    first = store.apply(_task_entry("task_claim", 10, 2, aid="A1", worker="w1"))
    assert first["claimed"] is True
    store.apply({"op": "tick", "now": 600, "seed": 7})  # A1 expired at 510
    second = store.apply(_task_entry("task_claim", 2000, 3, aid="A2", worker="w2"))
    assert second["claimed"] is True and second["token"] > first["token"]
    if snapshotted:
        store = type(store).from_plain(store.to_plain())
    zombie = store.apply(_task_entry("task_complete", 2001, 4, tid="T", aid="A1", result='"z"'))
    task = store.apply({"op": "task_get", "now": 2002, "queue": "q", "tid": "T"})["task"]
    if build == "honest":
        assert zombie["ok"] is False and zombie["code"] == "STALE_ATTEMPT"
        assert task["status"] == "claimed"
        assert not isinstance(store.tasks, StaleAcceptingTasks)
    else:
        assert zombie["ok"] is True, "the planted store refused the zombie"
        assert task["status"] == "completed" and task["result"] == '"z"'
        assert isinstance(store.tasks, StaleAcceptingTasks)


def foreign_key_bound(renewal: dict[str, Any], bound: bytes | None, granted: bytes) -> list[str]:
    """Violations of "a lease stays bound to the holder key named at its grant": a
    renewal naming another key that was accepted, or a lease now bound to another."""
    problems = []
    if renewal.get("ok"):
        problems.append("a renewal naming another holder key was accepted")
    if bound != granted:
        problems.append("the lease is bound to another key than its grant's")
    return problems


@pytest.mark.parametrize("build", ["honest", "rebind_holder_key"])
def test_a_renewal_cannot_rebind_the_holder_key(build: str) -> None:
    """The state machine alone: a lease acquired with key A, renewed naming key B (by
    whoever has the lease id). The honest store refuses HOLDER_KEY_MISMATCH and keeps A
    (so the signer certifies only A); the planted one rebinds the lease to B."""
    store = build_hooks("" if build == "honest" else build).store_class()
    base = {"cid": "c", "ack": 1, "key": "k", "lid": "L"}
    key_a, key_b = "a1" * 32, "b2" * 32
    store.apply({**base, "op": "acquire", "now": 1, "seq": 1, "owner": "o", "ttl": 1000,
                 "holder_key": key_a})  # fmt: skip
    renewal = store.apply({**base, "op": "renew", "now": 2, "seq": 2, "holder_key": key_b})
    violations = foreign_key_bound(renewal, store.leases["L"].holder, bytes.fromhex(key_a))
    if build == "honest":
        assert violations == []
        assert renewal["code"] == "HOLDER_KEY_MISMATCH"
    else:
        assert violations != [], "the planted store kept the grant's key"


@pytest.fixture
def raw_follower(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Follower]:
    """tests/unit/test_follower_log.py's hand-driven PySyncObj follower, running the
    transport of the build this fixture is parametrized with ("honest" or a bug)."""
    transport = build_hooks("" if request.param == "honest" else request.param).transport_class
    recording = type("Recording", (test_follower_log._Recording, transport), {})
    monkeypatch.setattr(test_follower_log, "_Recording", recording)
    f = Follower(tmp_path)
    try:
        yield f
    finally:
        f.close()


@pytest.mark.parametrize("raw_follower", ["honest", "raw_follower_log"], indirect=True)
def test_follower_transport_keeps_an_acknowledged_log(
    raw_follower: Follower, caplog: pytest.LogCaptureFixture
) -> None:
    """A late copy of an earlier append_entries (pipelining: several are in flight)
    must not delete what the follower acknowledged and applied since."""
    if test_follower_log.RAW:
        pytest.skip("RAFTLEASE_TEST_RAW_FOLLOWER runs every transport raw")
    caplog.set_level(logging.CRITICAL, logger="pysyncobj")
    follower = raw_follower
    first = ae(1, 1, 0, run(2, 4, 1), commit=1)
    follower.deliver(0, first)
    follower.deliver(0, ae(1, 4, 1, run(5, 6, 1), commit=6))
    acknowledged = follower.log()
    assert acknowledged == [START, *[entry(i, 1) for i in range(2, 7)]]
    follower.deliver(0, first)
    logs = {"follower": "\n".join(r.getMessage() for r in caplog.records)}
    violations = applied_entries_truncated(logs)
    if follower.log() != acknowledged:
        violations.append(f"log shortened from {len(acknowledged)} to {len(follower.log())}")
    if isinstance(follower.transport, RawFollowerLogTransport):
        assert violations != []
    else:
        assert violations == []


def test_checks_report_hand_made_violations() -> None:
    write = Write("k", token=5, acked=10.0)
    good = {"ok": True, "result": {"holder": {"token": 5}, "served_by": "n1"}}
    bad = {"ok": True, "result": {"holder": None, "served_by": "n1", "consistency": "lease"}}
    refused = {"ok": False, "code": "NOT_LEADER"}
    assert stale_reads(write, [ReadResult("k", 11.0, good), ReadResult("k", 11.0, refused)]) == []
    assert stale_reads(write, [ReadResult("k", 9.0, bad), ReadResult("k", 11.0, None)]) == []
    assert len(stale_reads(write, [ReadResult("k", 11.0, bad)])) == 1
    assert lease_reads_under_alarm([AlarmedRead(True, "log", True)]) == []
    assert lease_reads_under_alarm([AlarmedRead(False, "lease", True)]) == []
    assert len(lease_reads_under_alarm([AlarmedRead(True, "lease", True)])) == 1
    assert applied_entries_truncated({"n1": "INFO fine\n"}) == []
    assert len(applied_entries_truncated({"n1": f"x CRITICAL {TRUNCATION} from 5\n"})) == 1
    assert retry_applied_twice({"ok": True}, {"ok": True}, 1) == []
    assert len(retry_applied_twice({"ok": True}, {"ok": False}, 2)) == 2


@pytest.mark.parametrize("build", ["honest", "skip_effect_check"])
def test_an_effect_made_before_a_crash_is_not_made_again(build: str) -> None:
    """The state machine alone, with a counting provider: an attempt begins an effect,
    makes the call and dies before its commit; the next attempt begins the same effect
    and calls the provider only if the journal says it must. The effect checker of
    the queue suite (``check_effects``) judges the calls (the integration half, with
    real processes, is tests/integration/test_effect_proof.py)."""
    from queue_checker import check_effects

    store = build_hooks("" if build == "honest" else build).store_class()
    calls: list[int] = []
    base = {"queue": "q", "ack": 1, "term": 1}

    def mut(op: str, now: int, seq: int, **fields: Any) -> dict[str, Any]:
        return store.apply({"op": op, "now": now, "cid": f"c{seq}", "seq": 1, **base, **fields})

    assert mut("task_put", 0, 1, tid="T", payload="{}", ttl=1000, backoff=0)["ok"]
    first = mut("task_claim", 10, 2, aid="A1", worker="w1")["token"]
    assert mut("task_effect_begin", 20, 3, tid="T", aid="A1", effect="charge")["state"] == "new"
    calls.append(first)  # the call is made; the worker dies before its commit
    second = mut("task_claim", 2000, 4, aid="A2", worker="w2")["token"]
    began = mut("task_effect_begin", 2010, 5, tid="T", aid="A2", effect="charge")
    if began["state"] == "new":
        calls.append(second)  # nothing recorded: the call is made again
    assert mut("task_effect_commit", 2020, 6, tid="T", aid="A2", effect="charge")["ok"]
    zombie = mut("task_effect_commit", 2030, 7, tid="T", aid="A1", effect="charge")
    assert mut("task_complete", 2040, 8, tid="T", aid="A2")["ok"]
    ok = {"ok": True}
    verdict = check_effects(effect_history(calls, [(second, ok, second), (first, zombie, second)]))
    if build == "honest":
        assert began["state"] == "in_progress" and began["prior_token"] == first
        assert verdict["valid"] is True, verdict
        assert verdict["stats"]["zombie_commits_refused"] == 1
    else:
        assert verdict["valid"] is False
        assert [v["kind"] for v in verdict["violations"]] == ["applied_twice"]


def effect_history(
    calls: list[int], commits: list[tuple[int, dict[str, Any], int]]
) -> list[dict[str, Any]]:
    """The queue suite's effect events for one effect ``charge``: an external call
    made under each token of ``calls``, then each ``(token, answer, newest token)``
    commit as the state machine answered it, then the task or lease done."""
    events: list[dict[str, Any]] = [
        {"f": "effect.apply", "effect": "charge", "token": t} for t in calls
    ]
    for token, answer, newest in commits:
        events.append(
            {"f": "effect.commit", "effect": "charge", "token": token, "newest": newest,
             "type": "ok" if answer["ok"] else "fail", "error": answer.get("code")}
        )  # fmt: skip
    events.append({"f": "effect.final", "effect": "charge", "status": "completed"})
    return events


def test_the_effect_checker_sees_an_accepted_zombie_commit_and_a_lost_effect() -> None:
    from queue_checker import check_effects

    verdict = check_effects(
        [
            {"f": "effect.commit", "effect": "e", "token": 3, "type": "ok", "newest": 9},
            {"f": "effect.final", "effect": "e", "status": "completed"},
        ]
    )
    kinds = sorted(v["kind"] for v in verdict["violations"])
    assert kinds == ["never_applied", "zombie_commit_accepted"]
    assert check_effects([])["valid"] == "unknown"


@pytest.mark.parametrize("build", ["honest", "early_child"])
def test_a_child_is_claimed_only_after_every_parent_completed(build: str) -> None:
    """The state machine alone: a 100-task random DAG worked by claims that crash a
    third of the time (tests/unit/test_core_deps.py), its claims and completions fed
    to the queue checker's dependency rule (``check_dependencies``)."""
    from queue_checker import check_dependencies

    from tests.unit.test_core_deps import dag_events

    verdict = check_dependencies(dag_events(build_hooks("" if build == "honest" else build)
                                            .store_class(), seed=1))  # fmt: skip
    if build == "honest":
        assert verdict["valid"] is True, verdict
        assert verdict["stats"]["tasks"] == 100 and verdict["stats"]["edges"] > 100
    else:
        assert verdict["valid"] is False
        assert {v["kind"] for v in verdict["violations"]} == {"claimed_before_parent"}


@pytest.mark.parametrize("build", ["honest", "skip_lease_effect_fence"])
def test_a_zombie_lease_holder_cannot_commit_an_effect(build: str) -> None:
    """The state machine alone (issue 41, the journal under a lease): holder A (token
    T1) begins an effect, makes the call with its fencing token, is paused past its TTL;
    B takes the key (T2 > T1). A's late commit must be refused (NOT_OWNER: the key is
    B's), so B, which reads the journal before calling, reconciles instead of trusting
    A's word. ``check_effects`` (the queue suite's effect rule) judges the history."""
    from queue_checker import check_effects

    store = build_hooks("" if build == "honest" else build).store_class()
    calls: list[int] = []
    base = {"ack": 1, "term": 1, "key": "order-17"}

    def mut(op: str, now: int, seq: int, **fields: Any) -> dict[str, Any]:
        return store.apply({"op": op, "now": now, "cid": f"c{seq}", "seq": 1, **base, **fields})

    first = mut("acquire", 0, 1, lid="LA", owner="a", ttl=1000)["token"]
    assert mut("lease_effect_begin", 10, 2, lid="LA", effect="charge")["state"] == "new"
    calls.append(first)  # the call is made; A is paused past its TTL before its commit
    second = mut("acquire", 2000, 3, lid="LB", owner="b", ttl=1000)["token"]
    zombie = mut("lease_effect_commit", 2010, 4, lid="LA", effect="charge", result='"a"')
    began = mut("lease_effect_begin", 2020, 5, lid="LB", effect="charge")
    if began["state"] == "in_progress":
        # B reconciles with the provider (the call A made is found) and commits it.
        assert mut("lease_effect_commit", 2030, 6, lid="LB", effect="charge")["ok"]
    verdict = check_effects(effect_history(calls, [(first, zombie, second)]))
    if build == "honest":
        assert zombie["code"] == "NOT_OWNER" and began["prior_token"] == first
        assert verdict["valid"] is True, verdict
        assert verdict["stats"]["zombie_commits_refused"] == 1
    else:
        assert zombie["ok"] and began["state"] == "committed"
        assert verdict["valid"] is False
        assert [v["kind"] for v in verdict["violations"]] == ["zombie_commit_accepted"]
