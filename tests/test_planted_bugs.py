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

The chaos suite's own runs catch the other two (``CHAOS_COVERED``, in
tests/test_chaos.py): ``fast_log_clock`` (the log clock) and ``unsynced_acks`` (no
acknowledgement before a sync: three ``power-loss`` faults, honest and planted).

Where catching the planted build depends on timing (the scenario opens a window that
a loaded machine may miss), the planted run is retried a bounded number of times
(``ATTEMPTS``); the honest run is never retried, and each attempt of either build
asserts that the scenario really happened (the candidate campaigned, the alarm was
raised, the new leader was elected, the load ran).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raftlease import Client
from raftlease.config import local_cluster
from raftlease.core import LeaseStore
from raftlease.errors import RaftLeaseError
from raftlease.replication import LeaseGuard, LeaseTransport
from raftlease.server import ServerHooks
from raftlease.testing import PLANTED_BUGS, LocalCluster, free_port_block, hook_arguments, wait_for
from raftlease.testing.node import (
    DriftBlindGuard,
    EagerElectionTransport,
    ForgetfulStore,
    PromiselessGuard,
    RawFollowerLogTransport,
    ShortMemoryStore,
    StaleAcceptingStore,
    StaleAcceptingTasks,
    build_hooks,
)

from . import test_follower_log
from .conftest import FAST_SETTINGS
from .test_cluster import raw_request
from .test_follower_log import START, Follower, ae, entry, run
from .test_leadership import FakeClock, feed

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jepsen-style"))
from proxy import DROP, PASS, ProxyNet

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
)

#: Planted bugs caught by chaos-suite runs, and the test of tests/test_chaos.py that
#: runs the suite on the planted build (it must fail) and, where it is parametrized,
#: on the honest one (it must pass).
CHAOS_COVERED = {
    "fast_log_clock": "test_planted_bug_fast_log_clock_is_caught",
    "unsynced_acks": "test_power_loss_keeps_acknowledged_grants_only_with_fsync",
    "accept_stale_attempt": "test_planted_bug_accept_stale_attempt_is_caught",
}

#: Runs of a planted build whose catch depends on timing, at most.
ATTEMPTS = 3


def hooks_for(build: str) -> dict[str, Any]:
    """The honest test build (clock control, no bug) or the planted one."""
    return {"clock_control": True} if build == "honest" else {"planted_bug": build}


def status_of(addr: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """A node's local status, or None if it does not answer in time."""
    try:
        response = raw_request(addr, {"id": 1, "op": "status"}, timeout=timeout)
    except (OSError, AssertionError):
        return None
    return response["result"] if response.get("ok") else None


def acquire_frame(key: str, owner: str, cid: str, seq: int, **fields: Any) -> dict[str, Any]:
    return {
        "id": seq,
        "op": "acquire",
        "key": key,
        "owner": owner,
        "ttl": 30.0,
        "cid": cid,
        "seq": seq,
        "ack": 1,
        **fields,
    }


def holder_frame(key: str, consistency: str = "linearizable") -> dict[str, Any]:
    return {"id": 7, "op": "holder", "key": key, "consistency": consistency}


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


def early_grants(valid_until: float, grants: list[tuple[float, str]]) -> list[str]:
    """Grants of the key to another owner acknowledged (``(returned at, owner)``, this
    process's monotonic time) before the holder's ``valid_until``: each means two
    owners at once."""
    return [
        f"{owner} was granted the key {valid_until - returned:.3f} s before the holder's "
        "valid_until"
        for returned, owner in grants
        if returned < valid_until
    ]


# ------------------------------------------------------ hooks: unit tests


@pytest.mark.parametrize("bug", COVERED)
def test_hook_arguments_name_the_planted_bug(bug: str) -> None:
    assert bug in PLANTED_BUGS
    assert hook_arguments({"planted_bug": bug}) == ["--planted-bug", bug, "--clock-control"]


def test_every_planted_bug_has_a_catcher() -> None:
    """A planted bug nothing runs is a guard nobody shows to work."""
    assert set(PLANTED_BUGS) == set(COVERED) | set(CHAOS_COVERED)
    chaos = (Path(__file__).resolve().parent / "test_chaos.py").read_text()
    for bug, test in CHAOS_COVERED.items():
        assert f"def {test}(" in chaos, (bug, test)
        assert f'"{bug}"' in chaos, f"tests/test_chaos.py never runs {bug}"


def test_unsynced_acks_build_records_what_reached_the_disk() -> None:
    """The power-loss twin needs the synced shadows on the planted build too."""
    args = hook_arguments({"planted_bug": "unsynced_acks"})
    assert args[:2] == ["--planted-bug", "unsynced_acks"] and "--record-synced" in args
    assert "--record-synced" in hook_arguments({"clock_control": True, "record_synced": True})


def test_unknown_planted_bug_is_refused_before_any_process_starts() -> None:
    with pytest.raises(ValueError, match="unknown planted bug"):
        hook_arguments({"planted_bug": "skip_everything"})
    with pytest.raises(ValueError, match="unknown planted bug"):
        build_hooks("skip_everything")


#: What each planted build changes in ServerHooks, against the honest test build.
PLANTED_FIELDS: dict[str, dict[str, Any]] = {
    "skip_pre_vote": {"transport_class": EagerElectionTransport},
    "skip_vote_promise": {"guard_class": PromiselessGuard},
    "ignore_drift_alarm": {"guard_class": DriftBlindGuard},
    "skip_read_barrier": {"lease_read_barrier": False},
    "raw_follower_log": {"transport_class": RawFollowerLogTransport},
    "skip_dedup": {"store_class": ForgetfulStore},
    "accept_stale_attempt": {"store_class": StaleAcceptingStore},
    "unwritten_keepalives": {"keepalive_flush": False},
    "no_term_extension": {"store_class": ShortMemoryStore},
}

HOOK_FIELDS = (
    "log_clock_rate",
    "guard_class",
    "lease_read_barrier",
    "transport_class",
    "store_class",
    "keepalive_flush",
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


def test_production_hooks_are_the_honest_ones() -> None:
    """``raftlease node`` builds no hooks; the defaults are the honest build."""
    production, honest = ServerHooks(), build_hooks("")
    for name in HOOK_FIELDS:
        assert getattr(production, name) == getattr(honest, name), name
    assert production.guard_class is LeaseGuard
    assert production.transport_class is LeaseTransport
    assert production.store_class is LeaseStore
    assert production.lease_read_barrier is True
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


@pytest.fixture
def raw_follower(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Follower]:
    """tests/test_follower_log.py's hand-driven PySyncObj follower, running the
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


# ------------------------------------------------------ real clusters


def expect(build: str, violations: list[str]) -> bool:
    """Assert the honest build is safe; True once the planted one is caught."""
    if build == "honest":
        assert violations == [], violations
        return True
    return violations != []


# --- skip_dedup: the dedup table


@pytest.mark.integration
@pytest.mark.parametrize("build", ["honest", "skip_dedup"])
def test_retried_acquire_is_applied_once(
    cluster_factory: Callable[..., LocalCluster], build: str
) -> None:
    """The same acquire frame (same cid, seq) sent twice, as a client does after a
    lost response: on a shared key a second application grants a second lease; on a
    plain key it answers LEASE_HELD to the client that holds it (a leaked lease)."""
    cluster = cluster_factory(hooks=hooks_for(build))
    leader = cluster.node(cluster.leader_id()).client
    cid = "retry-" + secrets.token_hex(8)
    violations = []
    for seq, key, fields in ((1, "dedup/shared", {"capacity": 2}), (2, "dedup/plain", {})):
        frame = acquire_frame(key, "retrier", cid, seq, **fields)
        first = raw_request(leader, frame)
        assert first["ok"], first
        retry = raw_request(leader, frame)
        read = raw_request(leader, holder_frame(key, "log"))
        assert read["ok"], read
        holder = read["result"]["holder"]
        held = len(holder.get("holders", [holder])) if holder is not None else 0
        violations += retry_applied_twice(first, retry, held)
    assert expect(build, violations), "the planted build applied no retry twice"


# --- ignore_drift_alarm: the drift guard


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("build", ["honest", "ignore_drift_alarm"])
def test_drift_alarm_stops_lease_reads(
    cluster_factory: Callable[..., LocalCluster], build: str
) -> None:
    """The leader's clock runs 5 % fast (the bound is 1 %): once its drift alarm is
    raised, no read may be served from its lease."""
    cluster = cluster_factory(hooks=hooks_for(build))
    leader = cluster.leader_id()
    addr = cluster.node(leader).client

    def status() -> dict[str, Any]:
        found = wait_for(lambda: status_of(addr), 10, f"{leader}'s status")
        assert found["role"] == "leader", found
        return found

    wait_for(lambda: status()["lease_reads"], 15, "the leader's lease")
    response = raw_request(addr, {"id": 1, "op": "test_clock", "rate": 1.05})
    assert response["ok"], response
    wait_for(lambda: status()["drift_alarm"], 40, "the leader to raise its drift alarm")
    reads = []
    for _ in range(30):
        before = bool(status()["drift_alarm"])
        answer = raw_request(addr, holder_frame("drift/k"))
        assert answer["ok"], answer
        after = bool(status()["drift_alarm"])
        reads.append(AlarmedRead(before, answer["result"]["consistency"], after))
    assert sum(r.alarm_before and r.alarm_after for r in reads) >= 10, "the alarm did not hold"
    assert expect(build, lease_reads_under_alarm(reads)), "the planted build served no lease read"


# --- raw_follower_log: the follower-log correction


def _load(cluster: LocalCluster, writes: int, writers: int = 6) -> int:
    """``writes`` acquires of fresh keys from ``writers`` concurrent clients (several
    append_entries in flight per follower); returns how many succeeded."""
    done = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + 40

    def writer(name: str) -> None:
        with Client(cluster.endpoints, deadline=3.0) as c:
            i = 0
            while time.monotonic() < deadline:
                with lock:
                    if done[0] >= writes:
                        return
                with contextlib.suppress(RaftLeaseError, TimeoutError, OSError):
                    c.acquire(f"load/{name}/{i}", owner=name, ttl=30.0)
                    with lock:
                        done[0] += 1
                i += 1

    threads = [threading.Thread(target=writer, args=(f"w{k}",)) for k in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0]


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("build", ["honest", "raw_follower_log"])
def test_followers_never_truncate_applied_entries(
    cluster_factory: Callable[..., LocalCluster], build: str
) -> None:
    """A write-heavy load with no fault. Without the correction, a late append_entries
    (the leader steps its next index back on a reply overtaken by newer messages)
    makes PySyncObj's follower delete the entries after its prevLogIdx, applied ones
    included (jepsen-style/README.md finding 2). Catching it depends on message
    timing: the planted build is loaded up to ATTEMPTS times."""
    cluster = cluster_factory(hooks=hooks_for(build))
    for _ in range(ATTEMPTS if build != "honest" else 1):
        assert _load(cluster, 3000) >= 3000, "the load did not complete"
        logs = {n.id: cluster.log_path(n.id).read_text(errors="replace") for n in cluster.nodes}
        if expect(build, applied_entries_truncated(logs)):
            return
    pytest.fail(f"the planted build truncated no applied entry in {ATTEMPTS} loads")


# --- skip_vote_promise and skip_read_barrier: proxied clusters


class Proxied:
    """A 3-node cluster whose Raft links run through the chaos suite's proxy."""

    def __init__(self, cluster: LocalCluster, proxies: ProxyNet) -> None:
        self.cluster = cluster
        self.proxies = proxies

    def addr(self, node_id: str) -> str:
        return self.cluster.node(node_id).client

    def status(self, node_id: str) -> dict[str, Any] | None:
        return status_of(self.addr(node_id), timeout=1.0)


@contextlib.contextmanager
def proxied_cluster(
    request: pytest.FixtureRequest,
    hooks: dict[str, Any],
    node_settings: dict[str, dict[str, Any]] | None = None,
    late: str | None = None,
    **settings: Any,
) -> Iterator[Proxied]:
    """``node_settings``: per-node overrides; ``late``: a node started only once the
    others agree on a leader (so that it starts as a follower)."""
    base = free_port_block(3)
    proxies = ProxyNet(local_cluster(3, base), [base + 200 + i for i in range(3)]).start()
    per_node = proxies.dial_settings()
    for node_id, extra in (node_settings or {}).items():
        per_node[node_id].update(extra)
    cluster = LocalCluster(
        3,
        client_port=base,
        settings={**FAST_SETTINGS, **settings},
        node_settings=per_node,
        hooks=hooks,
    )
    try:
        for node in cluster.nodes:
            if node.id != late:
                cluster.start_node(node.id)
        cluster.wait_for_leader()
        if late is not None:
            cluster.start_node(late)
            cluster.wait_for_leader()
        yield Proxied(cluster, proxies)
    finally:
        if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
            print(cluster.logs())
        cluster.close()
        proxies.stop()


# --- skip_pre_vote: PreVote


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("build", ["honest", "skip_pre_vote"])
def test_pre_vote_keeps_a_cut_off_member_from_deposing_the_leader(
    request: pytest.FixtureRequest, build: str
) -> None:
    """A follower cut off from both others for 4 s (several election timeouts), then
    healed (issue 35's measurement: term 7 -> 9 in 4 ms, the healthy leader deposed).
    With PreVote its term never rises (no majority grants it a pre-vote) and the leader
    keeps its term after the heal; without, it raises its term while cut off, and
    healed, makes the leader step down."""
    with proxied_cluster(request, hooks_for(build)) as p:
        cluster = p.cluster
        leader = cluster.leader_id()
        term = int((p.status(leader) or {})["term"])
        victim = next(n.id for n in cluster.nodes if n.id != leader)
        others = [n.id for n in cluster.nodes if n.id != victim]
        p.proxies.block([(victim, o) for o in others] + [(o, victim) for o in others], DROP)
        time.sleep(4.0)  # the fault's length, not a wait for a condition
        cut_off = p.status(victim)
        assert cut_off is not None, f"{victim} stopped answering its client port"
        p.proxies.heal()
        deposed = None
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and deposed is None:
            status = p.status(leader)
            if status is not None and (status["role"], status["term"]) != ("leader", term):
                deposed = f"{status['role']} in term {status['term']}"
            time.sleep(0.05)
    violations = []
    if int(cut_off["term"]) > term:
        violations.append(f"{victim} raised its term {term} -> {cut_off['term']} while cut off")
    if deposed is not None:
        violations.append(f"the healthy leader {leader} (term {term}) became {deposed}")
    assert expect(build, violations), "the planted build kept its leader and its term"


#: Long Raft timers (S = election_timeout_min = 2 s) so that the windows a planted
#: bug opens are wide enough to hit on a loaded machine.
SLOW_RAFT: dict[str, Any] = {
    "election_timeout_min": 2.0,
    "election_timeout_max": 3.0,
    "connection_timeout": 4.0,
}


def acquire_on(addr: str, key: str, owner: str) -> Write | None:
    """Acquire ``key`` on the node at ``addr`` (raw, no redirect); the acknowledged
    write, or None if that node refused or did not answer."""
    frame = acquire_frame(key, owner, "writer-" + secrets.token_hex(8), 1)
    try:
        response = raw_request(addr, frame, timeout=4.0)
    except (OSError, AssertionError):
        return None
    acked = time.monotonic()
    if not response.get("ok"):
        return None
    return Write(key, int(response["result"]["token"]), acked)


class Reader:
    """Sends a read of ``key`` to ``addr`` every ``interval`` seconds, each on its own
    connection and thread, so that a read waiting for the log does not hold up the
    next one; ``stop()`` returns every read with its answer."""

    def __init__(self, addr: str, key: str, interval: float = 0.02) -> None:
        self.addr, self.key, self.interval = addr, key, interval
        self._pool = ThreadPoolExecutor(max_workers=128)
        self._futures: list[Future[ReadResult]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self) -> ReadResult:
        sent = time.monotonic()
        try:
            response: dict[str, Any] | None = raw_request(
                self.addr, holder_frame(self.key), timeout=5.0
            )
        except (OSError, AssertionError):
            response = None
        return ReadResult(self.key, sent, response)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._futures.append(self._pool.submit(self._read))

    def answered(self, after: float = 0.0) -> int:
        """Reads sent after ``after`` that got an answer so far."""
        return sum(
            1
            for f in list(self._futures)
            if f.done() and f.result().response is not None and f.result().sent > after
        )

    def stop(self) -> list[ReadResult]:
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)
        return [f.result() for f in self._futures]


#: The follower that campaigns in the vote-promise scenario (n3), with a short
#: election timeout so that it runs before the leader's next log-time tick reaches the
#: other follower (a candidate whose log is behind gets no vote, promise or not).
EAGER = "n3"
EAGER_TIMERS: dict[str, Any] = {"election_timeout_min": 0.5, "election_timeout_max": 0.7}


@pytest.mark.integration
@pytest.mark.timeout(240)
@pytest.mark.parametrize("build", ["honest", "skip_vote_promise"])
def test_vote_promise_keeps_a_deposed_leader_from_stale_lease_reads(
    request: pytest.FixtureRequest, build: str
) -> None:
    """Right after the leader L applied a tick, cut L from follower C (both ways) and
    delay the other follower B's messages to L by 1 s. C times out after 0.5-0.7 s and
    campaigns with a log as long as B's (asks for pre-votes first). With the promise, B,
    which hears from L (S = 2 s), refuses its pre-vote (or its vote): nobody else leads.
    Without it, B elects C; L, whose lease was earned on B's echoes, learns of the new
    term only with B's delayed messages and meanwhile serves lease reads that miss a
    grant C acknowledged.
    Timing-dependent: the planted build gets ATTEMPTS runs."""
    for _ in range(ATTEMPTS if build != "honest" else 1):
        with proxied_cluster(
            request,
            hooks_for(build),
            node_settings={EAGER: EAGER_TIMERS},
            late=EAGER,
            leader_fallback=15.0,
            **SLOW_RAFT,
        ) as p:
            violations = _vote_promise_scenario(p)
        if expect(build, violations):
            return
    pytest.fail(f"the planted build served no stale read in {ATTEMPTS} runs")


def _vote_promise_scenario(p: Proxied) -> list[str]:
    old = p.cluster.leader_id()
    if old == EAGER:
        # It won an election after a scheduling stall: restart it as a follower.
        p.cluster.restart_node(EAGER)
        old = str(p.cluster.wait_for_leader(exclude=EAGER)["node"])
    cut, bridge = EAGER, next(n.id for n in p.cluster.nodes if n.id not in (old, EAGER))

    def followed() -> bool:
        status = p.status(cut)
        leader = p.status(old)
        return bool(status and leader and status["leader"] == leader["client"])

    wait_for(followed, 15, f"{cut} to follow {old}")
    wait_for(lambda: (p.status(old) or {}).get("lease_reads"), 15, "the leader's lease")
    before = wait_for(lambda: p.status(old), 10, f"{old}'s status")
    # Cut just after a tick is applied: C's log then stays as long as B's until the
    # next tick, about a second later.
    wait_for(
        lambda: (p.status(old) or {}).get("applied_index", 0) > before["applied_index"],
        5,
        "a tick",
        interval=0.005,
    )
    p.proxies.set_flows([(old, cut, DROP, 0.0), (cut, old, DROP, 0.0), (bridge, old, PASS, 1.0)])
    key = "promise/k"
    reader = Reader(p.addr(old), key)
    campaigned = []

    asked = int((p.status(cut) or {}).get("pre_vote_rounds", 0))

    def new_leader_grant() -> Write | None:
        status = p.status(cut)
        if status is not None and status.get("pre_vote_rounds", 0) > asked:
            campaigned.append(-1)  # it asked for pre-votes (refused under B's promise)
        if status is None or status["term"] <= before["term"]:
            return None
        campaigned.append(status["term"])
        return (
            acquire_on(p.addr(cut), key, "new-leader-client")
            if status["role"] == "leader"
            else None
        )

    try:
        try:
            write = wait_for(new_leader_grant, 8, f"{cut} to lead", interval=0.01)
        except TimeoutError:
            # Nobody else leads (the honest outcome): the old leader grants.
            granted = acquire_on(p.addr(old), key, "old-leader-client")
            assert granted is not None, "the old leader, still leading, did not grant"
            write = granted
        acked = write.acked
        wait_for(lambda: reader.answered(after=acked) >= 50, 20, "reads of the old leader")
    finally:
        reads = reader.stop()
    assert campaigned, f"{cut} never campaigned"
    return stale_reads(write, reads)


@pytest.mark.integration
@pytest.mark.timeout(240)
@pytest.mark.parametrize("build", ["honest", "skip_read_barrier"])
def test_read_barrier_keeps_a_new_leader_from_stale_lease_reads(
    request: pytest.FixtureRequest, build: str
) -> None:
    """Pause follower C; delay leader A's messages to B by 0.8 s; acquire on A (A
    commits with B's acknowledgement). The moment the grant is acknowledged, stop A
    and drop what it still had in flight to B, so B holds the entry but never learns
    that it is committed. Resume C with B's messages to it delayed by 0.6 s: B is
    elected, and the first round trip to C (which lacks the entry) earns B its leader
    lease a round trip before B's own entry commits. With the barrier, B serves no
    lease read until its own tick is applied; without it, B answers from its lease
    without the acknowledged grant. Timing-dependent: the planted build gets ATTEMPTS
    runs."""
    for _ in range(ATTEMPTS if build != "honest" else 1):
        with proxied_cluster(request, hooks_for(build), leader_fallback=3.0, **SLOW_RAFT) as p:
            violations = _read_barrier_scenario(p)
        if expect(build, violations):
            return
    pytest.fail(f"the planted build served no stale read in {ATTEMPTS} runs")


def _read_barrier_scenario(p: Proxied) -> list[str]:
    a = p.cluster.leader_id()
    b, c = [n.id for n in p.cluster.nodes if n.id != a]
    p.cluster.pause_node(c)
    # C must not get the grant: not even from its socket buffer once resumed.
    p.proxies.set_flows([(a, c, DROP, 0.0), (a, b, PASS, 0.8)])
    key = "barrier/k"
    write = acquire_on(p.addr(a), key, "old-leader-client")
    p.cluster.pause_node(a)
    p.proxies.reset(a)  # drops the delayed messages that carry the new commit index
    p.cluster.kill_node(a)
    assert write is not None, "the leader did not grant"
    p.proxies.set_flow(b, c, PASS, 0.6)
    reader = Reader(p.addr(b), key)
    p.cluster.resume_node(c)
    try:
        wait_for(
            lambda: (p.status(b) or {}).get("role") == "leader",
            40,
            f"{b} to be elected",
            interval=0.01,
        )
        elected = time.monotonic()
        # Until B's own entry commits, its reads wait for C (or are lease reads, in the
        # planted build); 50 answered reads sent after its election cover that.
        wait_for(lambda: reader.answered(after=elected) >= 50, 30, "reads of the new leader")
    finally:
        reads = reader.stop()
    return stale_reads(write, reads)


# --- unwritten_keepalives, no_term_extension: keep-alives from the leader's memory


@pytest.mark.integration
@pytest.mark.parametrize(
    ("build", "kill_leader"),
    [
        ("honest", False),
        ("unwritten_keepalives", False),
        ("honest", True),
        ("no_term_extension", True),
    ],
)
def test_a_keepalive_from_memory_holds_until_valid_until(
    cluster_factory: Callable[..., LocalCluster], build: str, kill_leader: bool
) -> None:
    """A renewal 65 % into a 10 s TTL is answered from the leader's memory; it is due
    for the log a quarter of a TTL before the logged expiry (server/keepalive.py), at
    75 %. Another owner then tries to take the key until the holder's ``valid_until``:
    no grant may come before it. Without writing the keep-alive into the log
    (``unwritten_keepalives``) the lease ends at its logged expiry; with the leader
    killed right after the renewal and a new term that extends nothing
    (``no_term_extension``) the new leader ends it there too: both grant the key early.

    Log time stands still from the old leader's last entry (a tick at most
    ``LOG_TIME_REFRESH`` before the kill) until the new leader's first, so after a kill
    the planted build's early grant comes that much later: the renewal is late in the
    TTL so that 6.5 s of window covers an election of several seconds on a loaded
    machine (CI saw a 2 s one, with split votes, that a 2.4 s window did not)."""
    cluster = cluster_factory(hooks=hooks_for(build))
    ttl = 10.0
    with cluster.client() as holder, cluster.client(deadline=2.0) as rival:
        sent = time.monotonic()  # the leader stamps the grant no earlier than this
        lease = holder.acquire("keepalive/k", owner="holder", ttl=ttl)
        granted = time.monotonic()
        wait_for(
            lambda: time.monotonic() >= granted + 0.65 * ttl, 15, "65 % of the TTL", interval=0.02
        )
        renewed_at = time.monotonic()
        renewed = holder.renew(lease)
        leader = cluster.leader_id()
        status = status_of(cluster.node(leader).client)
        assert status is not None and status["keepalives_pending"] >= 1, status
        if kill_leader:
            cluster.kill_node(leader)
            # Killed before the promise was due for the log, or the run proves nothing:
            # it is due 75 % of the TTL after the grant's stamp in log time, which runs
            # no faster than real time, so not before ``sent`` + 75 %.
            assert time.monotonic() < sent + 0.75 * ttl, "the kill may have come after the flush"
        grants: list[tuple[float, str]] = []
        # What the rival's tries met, relative to the holder's grant (repeats folded):
        # a failure says where the time went.
        timeline = [
            f"renewed at +{renewed_at - granted:.3f} s, valid_until +"
            f"{renewed.valid_until - granted:.3f} s, leader {leader}"
        ]
        # After a leader change a lease may outlive its holder by one TTL (the new
        # term's extension), so the rival may have to wait that long more.
        deadline = renewed.valid_until + (ttl + 2.0 if kill_leader else 1.0)
        while time.monotonic() < deadline and not grants:
            tried = time.monotonic()
            try:
                rival.acquire("keepalive/k", owner="rival", ttl=ttl, timeout=1.0)
            except RaftLeaseError as exc:
                note_try(timeline, tried - granted, time.monotonic() - granted, exc.code)
                time.sleep(0.05)  # held (or no leader yet): try again, until the deadline
                continue
            grants.append((time.monotonic(), "rival"))
            note_try(timeline, tried - granted, grants[-1][0] - granted, "granted")
    violations = early_grants(renewed.valid_until, grants)
    if build == "honest":
        assert violations == [], (violations, timeline)
        assert grants, ("the key was never granted to the rival after valid_until", timeline)
    else:
        assert violations != [], ("the planted build kept the lease until valid_until", timeline)


def note_try(timeline: list[str], began: float, ended: float, outcome: str) -> None:
    """Add one try (``began``..``ended`` s after the grant) to ``timeline``, folded
    into the previous line when its outcome is the same."""
    if timeline and timeline[-1].endswith(f": {outcome}") and timeline[-1].startswith("+"):
        first = timeline[-1].split("..", 1)[0]
        timeline[-1] = f"{first}..+{ended:.3f} s: {outcome}"
    else:
        timeline.append(f"+{began:.3f}..+{ended:.3f} s: {outcome}")
