"""Every guard has a planted bug that the suite catches.

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_planted_bugs.py.
"""

from __future__ import annotations

import contextlib
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from raftlease import Client
from raftlease.config import local_cluster
from raftlease.errors import RaftLeaseError
from raftlease.testing import LocalCluster, free_port_block, wait_for
from tests.conftest import FAST_SETTINGS
from tests.integration.test_cluster import raw_request
from tests.unit.test_planted_bugs import (
    AlarmedRead,
    ReadResult,
    Write,
    applied_entries_truncated,
    lease_reads_under_alarm,
    retry_applied_twice,
    stale_reads,
    status_of,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "jepsen-style"))
from proxy import DROP, PASS, ProxyNet

pytestmark = pytest.mark.timeout(60)

#: Runs of a planted build whose catch depends on timing, at most.
ATTEMPTS = 3


def hooks_for(build: str) -> dict[str, Any]:
    """The honest test build (clock control, no bug) or the planted one."""
    return {"clock_control": True} if build == "honest" else {"planted_bug": build}


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
