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
from proxy import DROP, ProxyNet

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
    request: pytest.FixtureRequest, hooks: dict[str, Any], **settings: Any
) -> Iterator[Proxied]:
    """A started 3-node cluster of ``hooks``' build whose peers dial through a
    ``ProxyNet``, with ``settings`` over FAST_SETTINGS; stopped (and its logs shown
    if the test failed) at the end."""
    base = free_port_block(3)
    proxies = ProxyNet(local_cluster(3, base), [base + 200 + i for i in range(3)]).start()
    cluster = LocalCluster(
        3,
        client_port=base,
        settings={**FAST_SETTINGS, **settings},
        node_settings=proxies.dial_settings(),
        hooks=hooks,
    )
    try:
        cluster.start()
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

    def __init__(self, addr: str, key: str, interval: float = 0.02, timeout: float = 5.0) -> None:
        self.addr, self.key, self.interval, self.timeout = addr, key, interval, timeout
        self._pool = ThreadPoolExecutor(max_workers=128)
        self._futures: list[Future[ReadResult]] = []
        self._started: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self) -> ReadResult:
        sent = time.monotonic()
        try:
            response: dict[str, Any] | None = raw_request(
                self.addr, holder_frame(self.key), timeout=self.timeout
            )
        except (OSError, AssertionError):
            response = None
        return ReadResult(self.key, sent, response)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._started.append(time.monotonic())
            self._futures.append(self._pool.submit(self._read))

    def sent(self, after: float = 0.0) -> int:
        """Reads started after ``after`` so far (answered or not)."""
        return sum(1 for at in list(self._started) if at > after)

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


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("build", ["honest", "skip_vote_promise"])
def test_vote_promise_keeps_a_deposed_leader_from_stale_lease_reads(
    request: pytest.FixtureRequest, build: str
) -> None:
    """Leader L holds back its entries from both followers (the test build's
    ``test_hold``: heartbeats only, so B and C keep equal logs; a candidate whose log
    is behind gets no vote, promise or not) and C's elections are held
    (``test_elections``). Cut L from C (both ways) until C's own vote promise is over,
    then cut L from B too and make C run now. B heard L a heartbeat ago: with the
    promise it refuses its pre-vote (and vote) until the promise ends, after L's
    lease, which rests on B's acknowledgements; without it, B elects C at once and L,
    which never hears of the new term, serves lease reads that miss a grant C
    acknowledged. Deterministic: the election comes within L's lease on every run of
    the planted build (premise, both builds: C asked while L held its lease)."""
    with proxied_cluster(request, hooks_for(build), leader_fallback=15.0, **SLOW_RAFT) as p:
        violations = _vote_promise_scenario(p)
    assert expect(build, violations), "the planted build served no stale read"


def _vote_promise_scenario(p: Proxied) -> list[str]:
    old = p.cluster.leader_id()
    bridge, cut = sorted(n.id for n in p.cluster.nodes if n.id != old)
    addr = {n.id: p.addr(n.id) for n in p.cluster.nodes}

    def status(node: str) -> dict[str, Any]:
        return p.status(node) or {}

    # Its own first entry applied before its entries are held (nothing commits after).
    wait_for(lambda: status(old).get("lease_reads"), 15, f"{old}'s lease reads")
    elections(addr[cut], "hold")
    sent = {n: int(hold(addr[old], n, "appends")["sent"]) for n in (bridge, cut)}

    def same_logs() -> bool:
        ends = {n: int(status(n).get("last_log_index", -1)) for n in sent}
        return all(ends[n] >= sent[n] for n in sent) and len(set(ends.values())) == 1

    wait_for(same_logs, 10, "both followers to have every entry sent", interval=0.02)
    p.proxies.block([(old, cut), (cut, old)])
    promise = float(SLOW_RAFT["election_timeout_min"])
    wait_for(
        lambda: float(status(cut).get("heard_from_leader_ago") or 0) > promise,
        10,
        f"{cut}'s vote promise to end",
        interval=0.05,
    )
    wait_for(lambda: status(old).get("lease_reads"), 5, f"{old}'s lease reads on {bridge}")
    p.proxies.block([(old, bridge), (bridge, old)])
    lease_end = time.monotonic() + float(status(old).get("lease_remaining") or 0)
    asked = int(status(cut).get("pre_vote_rounds", 0))
    elections(addr[cut], "now")
    wait_for(
        lambda: int(status(cut).get("pre_vote_rounds", 0)) > asked,
        10,
        f"{cut} to ask for pre-votes",
        interval=0.01,
    )
    assert time.monotonic() < lease_end, f"{cut} asked for votes after {old}'s lease"
    key = "promise/k"
    reader = Reader(addr[old], key, timeout=0.5)
    try:
        wait_for(
            lambda: status(cut).get("role") == "leader" or status(bridge).get("role") == "leader",
            20,
            "a new leader",
            interval=0.01,
        )
        leader = cut if status(cut).get("role") == "leader" else bridge
        write = wait_for(
            lambda: acquire_on(addr[leader], key, "new-leader-client"), 10, "the grant"
        )
        acked = write.acked
        # The old leader, cut off, answers only from its lease; the rest wait for a
        # log that never commits there (unanswered, not a violation).
        wait_for(lambda: reader.sent(after=acked) >= 50, 20, "reads of the old leader")
    finally:
        reads = reader.stop()
    assert status(old).get("role") == "leader", f"{old} stepped down: the run proves nothing"
    return stale_reads(write, reads)


def elections(addr: str, mode: str) -> None:
    """The test build's ``test_elections`` on the node at ``addr``: ``hold``, ``now``
    or ``free`` (raftlease.testing.node.PeerControls)."""
    response = raw_request(addr, {"id": 1, "op": "test_elections", "mode": mode})
    assert response["ok"], response


def hold(addr: str, peer: str, what: str) -> dict[str, Any]:
    """The test build's ``test_hold`` on the node at ``addr``: its ``append_entries``
    to ``peer`` carry no entries (``appends``), no newer commit index (``commit``), or
    as usual again (``nothing``); raftlease.testing.node.PeerControls."""
    response = raw_request(addr, {"id": 1, "op": "test_hold", "peer": peer, "what": what})
    assert response["ok"], response
    return dict(response["result"])


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("build", ["honest", "skip_read_barrier"])
def test_read_barrier_keeps_a_new_leader_from_stale_lease_reads(
    cluster_factory: Callable[..., LocalCluster], build: str
) -> None:
    """Leader A holds back its commit index from follower B and its entries from
    follower C (the test build's ``test_hold``); B holds back its own entries from C
    once it leads. Acquire on A: B appends the grant and acknowledges it (A commits
    with it) but never learns that it committed; C never gets it. Kill A: only B can
    be elected (C's log is behind), and C's answers to B's heartbeats earn B its
    leader lease while B's own first entry cannot commit. With the barrier, B serves
    no lease read until its own entry is applied (its reads wait for the log, and
    once B's entries reach C, answer with the grant); without it, B answers from its
    lease without the acknowledged grant. Deterministic: the window stays open until
    the hold is lifted, on every run."""
    cluster = cluster_factory(hooks=hooks_for(build))
    a = cluster.leader_id()
    b, c = sorted(n.id for n in cluster.nodes if n.id != a)
    addr = {n.id: cluster.node(n.id).client for n in cluster.nodes}
    hold(addr[a], c, "appends")
    cap = int(hold(addr[a], b, "commit")["commit_index"])
    hold(addr[b], c, "appends")
    key = "barrier/k"
    write = acquire_on(addr[a], key, "old-leader-client")
    assert write is not None, "the leader did not grant"
    cluster.kill_node(a)
    reader = Reader(addr[b], key)
    try:
        wait_for(
            lambda: (status_of(addr[b], timeout=1.0) or {}).get("role") == "leader",
            20,
            f"{b} to be elected",
            interval=0.01,
        )
        elected = time.monotonic()
        wait_for(
            lambda: float((status_of(addr[b], timeout=1.0) or {}).get("lease_remaining") or 0) > 0,
            10,
            f"{b}'s leader lease",
            interval=0.01,
        )
        leased = time.monotonic()
        # The window: B leads with a lease and has not applied the grant. Reads
        # sent in it (one every 20 ms) are the test; then B's entries may reach C.
        wait_for(lambda: reader.sent(after=leased) >= 25, 10, "reads in the window")
        status = status_of(addr[b], timeout=1.0) or {}
        assert status.get("role") == "leader", status
        assert int(status.get("applied_index", 0)) <= cap, (cap, status)
        hold(addr[b], c, "nothing")
        wait_for(lambda: reader.answered(after=elected) >= 50, 30, "reads of the new leader")
    finally:
        reads = reader.stop()
    assert expect(build, stale_reads(write, reads)), "the planted build served no stale read"


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
    """Two keys, one held as a plain lease and one in a lease session. A renewal of the
    lease and a keep-alive of the session, sent in a batch (``session_keepalive_many``,
    the path that keeps sessions alive), 65 % into a 10 s TTL are answered from the
    leader's memory; each is due for the log a quarter of a TTL before its logged
    expiry (server/keepalive.py), at 75 %. Another owner then tries to take each key
    until its holder's ``valid_until``: no grant may come before it. Without writing
    the keep-alives into the log (``unwritten_keepalives``) the lease and the session
    end at their logged expiry; with the leader killed right after the renewals and a
    new term that extends nothing (``no_term_extension``) the new leader ends them
    there too: both grant each key early.

    Log time stands still from the old leader's last entry (a tick at most
    ``LOG_TIME_REFRESH`` before the kill) until the new leader's first, so after a kill
    the planted build's early grant comes that much later: the renewal is late in the
    TTL so that 6.5 s of window covers an election of several seconds on a loaded
    machine (CI saw a 2 s one, with split votes, that a 2.4 s window did not)."""
    cluster = cluster_factory(hooks=hooks_for(build))
    ttl = 10.0
    kinds = ("lease", "session")
    with cluster.client() as holder, cluster.client(deadline=2.0) as rival:
        sent = time.monotonic()  # the leader stamps the grants no earlier than this
        renewals = {kind: hold_key(holder, f"keepalive/{kind}", ttl, kind) for kind in kinds}
        granted = time.monotonic()
        wait_for(
            lambda: time.monotonic() >= granted + 0.65 * ttl, 15, "65 % of the TTL", interval=0.02
        )
        renewed_at = time.monotonic()
        valid_until = {kind: renew() for kind, renew in renewals.items()}
        leader = cluster.leader_id()
        status = status_of(cluster.node(leader).client)
        assert status is not None and status["keepalives_pending"] >= 2, status
        if kill_leader:
            cluster.kill_node(leader)
            # Killed before the promises were due for the log, or the run proves
            # nothing: due 75 % of the TTL after the grants' stamps in log time, which
            # runs no faster than real time, so not before ``sent`` + 75 %.
            assert time.monotonic() < sent + 0.75 * ttl, "the kill may have come after the flush"
        grants: dict[str, list[tuple[float, str]]] = {kind: [] for kind in kinds}
        # What the rival's tries met, relative to the holder's grant (repeats folded):
        # a failure says where the time went.
        timeline = [
            f"renewed at +{renewed_at - granted:.3f} s, valid_until "
            + ", ".join(f"{k} +{v - granted:.3f} s" for k, v in valid_until.items())
            + f", leader {leader}"
        ]
        # After a leader change a lease may outlive its holder by one TTL (the new
        # term's extension), so the rival may have to wait that long more.
        deadline = max(valid_until.values()) + (ttl + 2.0 if kill_leader else 1.0)
        while time.monotonic() < deadline and not all(grants.values()):
            for kind in (k for k in kinds if not grants[k]):
                tried = time.monotonic()
                try:
                    rival.acquire(f"keepalive/{kind}", owner="rival", ttl=ttl, timeout=1.0)
                except RaftLeaseError as exc:
                    note_try(timeline, tried - granted, time.monotonic() - granted, kind, exc.code)
                    continue
                grants[kind].append((time.monotonic(), "rival"))
                note_try(timeline, tried - granted, grants[kind][-1][0] - granted, kind, "granted")
            time.sleep(0.05)  # held (or no leader yet): try again, until the deadline
    for kind in kinds:
        violations = early_grants(valid_until[kind], grants[kind])
        if build == "honest":
            assert violations == [], (kind, violations, timeline)
            assert grants[kind], (f"{kind}: never granted to the rival after valid_until", timeline)
        else:
            assert violations != [], (
                f"{kind}: the planted build kept it until valid_until",
                timeline,
            )


def hold_key(holder: Client, key: str, ttl: float, kind: str) -> Callable[[], float]:
    """Take ``key`` for ``holder`` as a plain lease or in a lease session (its
    background keep-alive stopped: the test sends the one that matters); returns the
    renewal to send later, which answers the holder's new ``valid_until``. A session's
    keep-alive must go out in a batch, ``session_keepalive_many``: that is the path
    under test."""
    if kind == "lease":
        lease = holder.acquire(key, owner="holder", ttl=ttl)
        return lambda: holder.renew(lease).valid_until
    session = holder.session(owner="holder", ttl=ttl).open()
    session.stop_keepalive()
    session.acquire(key)
    batcher = holder.aio.keepalives
    assert batcher is not None

    def keepalive() -> float:
        batches = batcher.batches
        session.keepalive()
        assert batcher.batches == batches + 1, "the keep-alive was not sent in a batch"
        return float(session.valid_until)

    return keepalive


def note_try(timeline: list[str], began: float, ended: float, kind: str, outcome: str) -> None:
    """Add one try of ``kind``'s key (``began``..``ended`` s after the grant) to
    ``timeline``, folded into that key's previous line when its outcome is the same."""
    last = next((i for i in range(len(timeline) - 1, 0, -1) if timeline[i].startswith(kind)), None)
    if last is not None and timeline[last].endswith(f": {outcome}"):
        first = timeline[last].split("..", 1)[0]
        timeline[last] = f"{first}..+{ended:.3f} s: {outcome}"
    else:
        timeline.append(f"{kind} +{began:.3f}..+{ended:.3f} s: {outcome}")
