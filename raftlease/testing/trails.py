"""SPIN counterexamples replayed against real nodes (issue 43).

model/trail.py writes each planted-bug variant's shortest counterexample into
``model/trails/<VARIANT>.trail``: one model step a line (``model/lease.pml``, ``STEP``).
This module is the mapping from those steps to actions on a real ``LocalCluster``, and
``replay`` runs a trail as a scripted fault scenario that returns the property
violations it saw (none on the honest build; model/README.md, "Counterexamples on the
real cluster", says how each variant replays).

The mapping (model unit of time: ``unit`` seconds; the model's TTL of 6 units is a
lease TTL of ``6 * unit``, its task attempt TTL of 2 units ``2 * unit``). A trail whose
last step reads needs set-up ahead (``plan``): the windows those reads need are held
open with the test build's peer controls (``test_hold``: a leader's appends to a peer
carry no entries, or no newer commit index; ``test_elections``: a node's elections held,
or run now; raftlease.testing.node.PeerControls), not hit by timing:

==========================  ===========================================================
model step                  real action
==========================  ===========================================================
``TIME a0 a1 a2``           ``unit`` seconds of real time pass (the trails are searched
                            with ``-DEXACT_CLOCKS``: every clock keeps real time)
``HB L f``                  the leader sends heartbeats on its own; in a trail with a
                            plan, the replay waits until ``L`` holds a leader lease
                            (what the model's heartbeat earns it; a leader that reads
                            once deposed: until it serves lease reads)
``COMMIT L f TICK``         nothing: the leader writes ticks on its own
``COMMIT L f ACQ k c``      client ``c`` acquires key ``k`` (no waiting)
``COMMIT L f REN k c``      client ``c`` renews its lease of ``k``
``COMMIT L f REL k c``      client ``c`` releases its lease of ``k``
``KEEP L k c``              client ``c`` renews (the leader answers from memory)
``COMMIT L f CLAIM 0 c``    worker ``c`` claims the queue's task (a waiting claim)
``COMMIT L f DONE 0 c``     worker ``c`` completes the attempt it claimed
``ELECT L v``               the node the model calls the current leader is killed
                            and the cluster elects another, which is model node ``L``
                            from then on (only when the deposed leader never leads
                            again: ``unsupported``; the follower ``f`` of a step and
                            the voter ``v`` are not replayed: any live node acks).
                            When the deposed leader reads later in the trail, it is
                            cut off from both others (``net``, the proxy) instead,
                            and the two others elect one of them
``TIME`` with a 0           (``-DFAULTS``: a clock at fault stands still) the node's
                            clock is stopped from that step on. First its drift alarm
                            is raised: the model latches it the moment the clock
                            leaves its band, the real monitor from two 1 s buckets
                            past a jump (leadership.DriftMonitor, ``JUMP_THRESHOLD``),
                            so the clock jumps ``FAULT_JUMP`` and the replay waits for
                            the alarm; then its rate is set to ``STOPPED_RATE``
``READ L k``                a lease read: holder reads of key ``k`` sent to model node
                            ``L``, repeated for the last step's window: on a deposed
                            leader (cut off) or on the leader the trail's one
                            election made
==========================  ===========================================================

The plans (``Plan``), by the reader of the last step:

* a deposed leader whose clock stands still (``IGNORE_DRIFT_ALARM``): no set-up; the
  ``TIME`` steps stop its clock and its ``ELECT`` cuts it off.
* ``promise``, a deposed leader whose clock keeps time (``SKIP_VOTE_PROMISE``: ``TIME``
  x3, ``HB 0 1``, ``ELECT 2 1``, grant on 2, ``READ 0 0``): its lease outlasts the
  election only if the candidate's vote promise is over while the voter's is fresh.
  The candidate hears no ``HB`` or ``COMMIT`` of the leader in the trail, so before the
  first step its link with the leader is cut (both ways, the proxy) and its elections
  are held; so that its log stays as long as the voter's (a candidate whose log is
  behind gets no vote, promise or not), the leader's appends to both followers are
  held first (heartbeats go on: the voter keeps hearing the leader, whose lease goes
  on; not before the leader serves lease reads, its own first entry applied), and the
  cut waits until both followers have every entry sent before. ``HB 0 1`` waits until
  the leader serves lease reads; ``ELECT 2 1`` cuts the leader off from the voter too
  and makes the candidate run now: on the planted build the voter, just acknowledged
  by the leader, votes at once; on the honest one it refuses until its promise ends,
  after the leader's lease. The leader must commit nothing itself in the trail (its
  appends are held).
* ``barrier``, the leader the trail's election made, before a ``COMMIT`` of its own
  (``SKIP_READ_BARRIER``: ``TIME`` x3, grant on 0 with 1, ``ELECT 2 0``, ``HB 2 0``,
  ``READ 2 0``). In the model the new leader's view lacks the grant; on real nodes it
  must hold the entry to be elected (the voters have it), so it is the follower that
  acknowledges the grant and never learns it committed: at the deposed leader's last
  ``COMMIT`` its commit index to that follower is held (``commit``), its appends to the
  other follower are held (that one lacks the entry, so it cannot win), and the future
  leader's own appends to that other one are held from its election on, so its lease
  comes from heartbeats while its first entry never commits. ``ELECT`` kills the
  deposed leader (the future leader is the only one that can win; otherwise the
  premise fails), ``HB 2 0`` waits for its lease.

The last step is the one whose assertion fails in the model; the real system's timing
is not the model's, so it is retried until the property's window closes: an acquire
(P1) until every other client's ``valid_until`` has passed, a read (P3) for
``READ_WINDOW`` seconds. Properties checked on the real answers: P1 (no grant of a key
acknowledged before another client's ``valid_until`` of it), P3 (no read sent after
the newest grant of its key was acknowledged, and before its grantee's ``valid_until``,
answered without it) and P5 (no
completion accepted from an attempt that is not the current one). A read replay also
checks its own premises (``Replay.premises``); otherwise the run proves nothing: a
grant was acknowledged before the reads, and after them the reader still took itself
for the leader; a stopped clock's reader with its drift alarm raised; a ``promise``
candidate asked for votes while the deposed leader still held its lease; a
``barrier`` reader was the node prepared for it, held a leader lease with no drift
alarm, and had applied nothing past the commit index held back from it.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from raftlease.client import Client
from raftlease.errors import RaftLeaseError, StaleAttemptError
from raftlease.models import Lease
from raftlease.protocol import FrameDecoder, encode_frame
from raftlease.testing.cluster import LocalCluster, wait_for

#: model/trails/ of a source checkout (the trails are not installed with the package).
TRAILS = Path(__file__).resolve().parents[2] / "model" / "trails"

#: The model's ops of a log entry (lease.pml: TICK ACQ REN REL CLAIM DONE).
OPS = ("TICK", "ACQ", "REN", "REL", "CLAIM", "DONE")
#: The model's constants the mapping scales (lease.pml: TTL, ATTL).
MODEL_TTL = 6
MODEL_ATTL = 2

#: A clock at fault: jumped this far (seconds) to raise the node's drift alarm, more
#: than leadership.JUMP_THRESHOLD (0.1 s), then run at this rate ("stopped": the
#: test clock takes no rate of 0). At 0.001 its drift monitor's next 1 s bucket closes
#: after 1,000 s, so the raised alarm stays raised for the rest of the replay.
FAULT_JUMP = 1.0
STOPPED_RATE = 0.001
#: How long the last step, a lease read, is repeated (seconds; within the grant's
#: validity at the unit the test uses), and each read's timeout: a read the node
#: cannot serve from its lease waits for the log, which a node cut off from both
#: others never commits.
READ_WINDOW = 1.0
READ_TIMEOUT = 0.5


class Links(Protocol):
    """What a replay needs of the network between the nodes: cut the links named
    (``(from, to)`` node ids, one direction each). jepsen-style/proxy.py's ``ProxyNet``
    is one."""

    def block(self, pairs: Iterable[tuple[str, str]]) -> None: ...


@dataclass(frozen=True)
class Step:
    """One model step: ``kind`` (TIME, ELECT, HB, COMMIT, KEEP, READ) and its numbers."""

    kind: str
    args: tuple[int, ...]

    def __str__(self) -> str:
        if self.kind == "COMMIT":
            leader, follower, op, key, client = self.args
            return f"COMMIT {OPS[op]} key {key} client {client} (leader {leader}, with {follower})"
        return " ".join([self.kind, *map(str, self.args)])


@dataclass(frozen=True)
class Trail:
    """A counterexample: the variant, the property it breaks (P1, P3, P5), its steps."""

    variant: str
    breaks: str
    steps: tuple[Step, ...]


def parse(variant: str, text: str) -> Trail:
    """A trail file's text. Raises ``ValueError`` on a line that is not a step."""
    breaks = ""
    steps: list[Step] = []
    for line in text.splitlines():
        if line.startswith("# breaks "):
            breaks = line.split()[2].rstrip(":")
        if not line.strip() or line.startswith("#"):
            continue
        kind, *numbers = line.split()
        if kind not in {"TIME", "ELECT", "HB", "COMMIT", "KEEP", "READ"}:
            raise ValueError(f"{variant}: not a model step: {line!r}")
        steps.append(Step(kind, tuple(int(n) for n in numbers)))
    return Trail(variant, breaks, tuple(steps))


def load(variant: str, directory: Path = TRAILS) -> Trail:
    """``model/trails/<variant>.trail`` (raises ``OSError`` if there is none)."""
    return parse(variant, (directory / f"{variant}.trail").read_text())


@dataclass(frozen=True)
class Plan:
    """What a trail's reads need set up ahead (``plan``): none, or one of

    * ``promise``: the deposed leader (model node ``deposed``), whose clock keeps
      time, reads last; ``candidate`` (model node) is elected at step ``elect`` and
      never heard from the deposed leader in the trail before: its link to it is cut
      from the start, the deposed leader's appends are held (so that the candidate's
      log stays as long as the voter's), and the candidate runs for election at the
      ``ELECT`` step only;
    * ``barrier``: ``candidate`` is elected at step ``elect`` and reads last, before a
      ``COMMIT`` of its own; the deposed leader's ``COMMIT`` at step ``commit`` is the
      entry whose commit it must not learn.
    """

    kind: str = ""
    deposed: int = -1
    candidate: int = -1
    elect: int = -1
    commit: int = -1


def plan(trail: Trail) -> Plan:
    """The set-up ``trail``'s reads need (``Plan``); no kind for a trail without a
    read, or whose deposed leader's clock stands still. Assumes ``unsupported`` found
    nothing."""
    steps = trail.steps
    if not steps or steps[-1].kind != "READ":
        return Plan()
    reader = steps[-1].args[0]
    elect = next((i for i, s in enumerate(steps) if s.kind == "ELECT"), -1)
    if elect < 0:
        return Plan()
    candidate = steps[elect].args[0]
    if reader == candidate:
        commit = max(
            (i for i, s in enumerate(steps[:elect]) if s.kind == "COMMIT"),
            default=-1,
        )
        return Plan("barrier", 0, candidate, elect, commit)
    stopped = any(s.kind == "TIME" and s.args[reader] == 0 for s in steps)
    return Plan() if stopped else Plan("promise", reader, candidate, elect)


def unsupported(trail: Trail) -> str | None:
    """Why ``replay`` cannot run ``trail`` on real nodes, or None if it can."""
    leader = 0
    deposed: set[int] = set()
    stopped: set[int] = set()  # model nodes whose clock stands still
    elected_at: dict[int, int] = {}  # model node -> the step that elected it
    elections = [i for i, s in enumerate(trail.steps) if s.kind == "ELECT"]
    for i, step in enumerate(trail.steps):
        if step.kind == "TIME":
            for node, moved in enumerate(step.args):
                if moved == 0 and node != leader:
                    return f"a clock at fault on a node that does not lead ({step})"
                if moved == 0:
                    stopped.add(node)
            continue
        if step.kind == "READ" and i != len(trail.steps) - 1:
            return f"a read before the last step ({step})"
        if step.kind == "READ" and len(elections) != 1:
            return f"a read in a trail of {len(elections)} elections ({step})"
        if step.kind == "READ" and step.args[0] in deposed:
            if step.args[0] in stopped:
                continue
            # SKIP_VOTE_PROMISE: the deposed leader keeps its lease because a
            # follower acknowledged it just before voting for another. The candidate
            # must have heard nothing from it (its own promise over) while its log is
            # as long as the voter's: the leader's appends are held from the start,
            # so it must commit nothing itself.
            old, candidate = step.args[0], trail.steps[elections[0]].args[0]
            for s in trail.steps[: elections[0]]:
                if s.kind == "COMMIT" and s.args[0] == old:
                    return f"the deposed leader commits before its last read ({s})"
                if s.kind in {"HB", "COMMIT"} and s.args[1] == candidate:
                    return f"the candidate {candidate} hears the deposed leader ({s})"
            continue
        if step.kind == "READ":
            since = elected_at.get(step.args[0], -1)
            if since < 0:
                return f"a read on a leader that was never deposed nor elected ({step})"
            # SKIP_READ_BARRIER: the new leader reads before an entry of its own
            # term. Only heartbeats of its own between its election and the read: a
            # commit of its own would close the window.
            if any(s.kind != "HB" for s in trail.steps[since + 1 : i]):
                return f"a read on a new leader after more than its heartbeats ({step})"
            continue
        # Only a leader's part is replayed: any live follower acknowledges (or votes),
        # so a killed node may be the model's follower, never its leader again.
        if step.args[0] in deposed:
            return f"the deposed leader leads again ({step})"
        if step.kind == "ELECT":
            deposed.add(leader)
            leader = step.args[0]
            elected_at[leader] = i
    return None


@dataclass
class Replay:
    """What a replay saw: the violations, and a line per step (for a failure's message)."""

    violations: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    #: What the scenario needed and did not get (the run then proves nothing either
    #: way): the test fails on any, on both builds.
    premises: list[str] = field(default_factory=list)


def _raw(addr: str, message: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    """One request on a fresh connection to the node at ``addr`` (no client library:
    no redirect, no retry); its answer, or None if it gave none within ``timeout``.
    Blocks the calling thread up to about twice ``timeout``; never raises."""
    host, _, port = addr.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.sendall(encode_frame(message))
            decoder = FrameDecoder()
            while True:
                data = sock.recv(65536)
                if not data:
                    return None
                for frame in decoder.feed(data):
                    return frame
    except (OSError, RaftLeaseError):
        return None


def _status(addr: str) -> dict[str, Any] | None:
    """The node's own status, or None if it does not answer within a second."""
    answer = _raw(addr, {"id": 1, "op": "status"}, 1.0)
    return answer["result"] if answer is not None and answer.get("ok") else None


def stop_clock(addr: str, note: Callable[[str], None] = print) -> None:
    """Put the clock of the (test build) node at ``addr`` at fault: jump it
    ``FAULT_JUMP`` forward, wait until its drift monitor raises the alarm, then run it
    at ``STOPPED_RATE``. Blocks up to about 30 s; raises ``TimeoutError`` if the
    monitor has no five buckets of samples from each peer within 15 s or raises no
    alarm within 15 s of the jump, ``RuntimeError`` if the node refuses ``test_clock``."""

    def measured() -> bool:
        # The monitor judges only with five 1 s buckets of a peer (DriftMonitor's
        # min_buckets): a jump before that is never seen as one.
        drift = (_status(addr) or {}).get("drift") or {}
        return len(drift) >= 2 and all(p.get("buckets", 0) >= 5 for p in drift.values())

    wait_for(measured, 15, f"{addr}'s drift monitor to have five buckets of each peer")
    for change in ({"jump": FAULT_JUMP}, None, {"rate": STOPPED_RATE}):
        if change is None:
            wait_for(
                lambda: (_status(addr) or {}).get("drift_alarm"),
                15,
                f"{addr}'s drift alarm",
                interval=0.02,
            )
            note(f"{addr} raised its drift alarm")
            continue
        answer = _raw(addr, {"id": 1, "op": "test_clock", **change}, 2.0)
        if answer is None or not answer.get("ok"):
            raise RuntimeError(f"{addr} refused test_clock {change}: {answer}")
        note(f"{addr} clock: {change}")


def replay(
    trail: Trail,
    cluster: LocalCluster,
    unit: float,
    name: str = "",
    net: Links | None = None,
) -> Replay:
    """Run ``trail`` on ``cluster`` (started, three nodes), one model unit of time being
    ``unit`` seconds; keys and the queue are named after ``name`` (default: the
    variant), so that replays may share a cluster when none of them elects. ``net``
    cuts links between the nodes: a trail whose deposed leader reads needs it (the
    cluster's peers then dial through that proxy), and a test build with clock control
    for a trail whose clock stands still.

    Blocks the calling thread for the trail's length (its TIME steps, an election, the
    last step's window). Raises ``ValueError`` for a trail ``unsupported`` names (or
    one that needs ``net`` without it), ``TimeoutError`` when the cluster elects no
    leader after a kill or a cut, or a stopped clock's alarm is not raised in time."""
    reason = unsupported(trail)
    if reason is not None:
        raise ValueError(f"{trail.variant}: cannot replay on real nodes: {reason}")
    prep = plan(trail)
    # Deposed leaders that read: cut off (through ``net``), not killed.
    readers = {s.args[0] for s in trail.steps if s.kind == "READ"} - (
        {prep.candidate} if prep.kind == "barrier" else set()
    )
    if readers and net is None:
        raise ValueError(f"{trail.variant}: its deposed leader reads: replay it with net")
    name = name or trail.variant.lower()
    out = Replay()
    start = time.monotonic()
    ttl = MODEL_TTL * unit
    clients = [cluster.client(deadline=2.0 + ttl) for _ in range(2)]
    # key -> its newest grant: (token, acknowledged at, the grantee's valid_until)
    grants: dict[int, tuple[int, float, float]] = {}
    cap: int | None = None  # the commit index held back from a barrier plan's candidate
    stopped: set[int] = set()  # model nodes whose clock was stopped
    held: dict[tuple[int, int], Lease] = {}  # (client, key) -> its lease, as it believes
    tasks: dict[int, Any] = {}  # worker -> the Task it claimed
    attempts: list[int] = []  # the clients in claim order: the last one is current
    queue = [c.queue(f"trail/{name}") for c in clients]

    def note(text: str) -> None:
        out.log.append(f"+{time.monotonic() - start:.3f} s {text}")

    def acquire(k: int, c: int, last: bool) -> None:
        key = f"trail/{name}/{k}"
        # The last step is retried until every other client's belief has ended: the
        # window in which the model's grant breaks P1.
        until = max((v.valid_until for (o, kk), v in held.items() if kk == k and o != c), default=0)
        while True:
            sent = time.monotonic()
            try:
                lease = clients[c].acquire(key, owner=f"c{c}", ttl=ttl, timeout=2.0)
            except RaftLeaseError as exc:
                if not last or time.monotonic() > until + 0.2:
                    note(f"client {c} acquire {key}: {exc.code}")
                    return
                time.sleep(0.02)  # held: try again until the window closes
                continue
            acked = time.monotonic()
            note(f"client {c} acquire {key}: token {lease.token} (sent +{sent - start:.3f})")
            for (other, kk), belief in held.items():
                if kk == k and other != c and acked < belief.valid_until:
                    out.violations.append(
                        f"P1: client {c} was granted {key} {belief.valid_until - acked:.3f} s "
                        f"before client {other}'s valid_until"
                    )
            held[(c, k)] = lease
            grants[k] = (lease.token, acked, lease.valid_until)
            return

    def renew(k: int, c: int) -> None:
        lease = held.get((c, k))
        if lease is None:
            note(f"client {c} holds no lease of key {k} to renew")
            return
        try:
            held[(c, k)] = clients[c].renew(lease)
            note(f"client {c} renewed key {k}: valid for {held[(c, k)].remaining:.3f} s")
        except RaftLeaseError as exc:
            held.pop((c, k), None)
            note(f"client {c} renew key {k}: {exc.code}")

    def claim(c: int) -> None:
        if not tasks and not attempts:
            queue[0].put({"trail": name}, max_attempts=5)
        task = queue[c].claim(
            worker=f"c{c}", wait=4 * unit + 2.0, lease_ttl=MODEL_ATTL * unit, on_exit="release"
        )
        note(f"worker {c} claim: {task!r}")
        if task is not None:
            tasks[c] = task
            attempts.append(c)

    def done(c: int) -> None:
        task = tasks.pop(c, None)
        if task is None:
            return
        current = bool(attempts) and attempts[-1] == c
        try:
            task.complete({"by": c})
        except StaleAttemptError as exc:
            note(f"worker {c} complete: {exc.code}")
            return
        note(f"worker {c} complete: accepted (its attempt current: {current})")
        if not current:
            out.violations.append(f"P5: worker {c}'s completion from a stale attempt was accepted")

    def status(node: str) -> dict[str, Any]:
        return _status(cluster.node(node).client) or {}

    def has_lease(node: str) -> bool:
        return float(status(node).get("lease_remaining") or 0.0) > 0

    def serves_lease_reads(node: str) -> bool:
        return bool(status(node).get("lease_reads"))

    def control(node: str, message: dict[str, Any]) -> dict[str, Any]:
        answer = _raw(cluster.node(node).client, {"id": 1, **message}, 2.0)
        if answer is None or not answer.get("ok"):
            raise RuntimeError(f"{node} refused {message}: {answer}")
        note(f"{node}: {message['op']} {message}")
        return dict(answer["result"])

    def leads(live: list[str], term: int) -> str | None:
        """The one of ``live`` that leads a term above ``term`` and that the others
        follow, if any."""
        statuses = {n: _status(cluster.node(n).client) for n in live}
        for n, st in statuses.items():
            if st is None or st.get("role") != "leader" or int(st.get("term", 0)) <= term:
                continue
            if all((statuses[o] or {}).get("leader") == st.get("client") for o in live):
                return n
        return None

    def cut_off(old: str, candidate: str | None = None) -> str:
        """Cut ``old`` off from both others (both directions) and wait until one of
        them leads a higher term that the other follows; that one's node id. With
        ``candidate``, that node runs for election right after the cut (its elections
        were held), and the premise is that it asked for votes while ``old`` still
        held its leader lease."""
        assert net is not None  # checked above: a trail that reads comes with net
        live = [n.id for n in cluster.nodes if n.id != old]
        term = int(status(old).get("term", 0))
        net.block([(old, n) for n in live] + [(n, old) for n in live])
        note(f"cut {old} off from {live}")
        if candidate is not None:
            lease = float(status(old).get("lease_remaining") or 0.0)
            lease_end = time.monotonic() + lease
            note(f"{old}'s leader lease: {lease:.3f} s left")
            asked = int(status(candidate).get("pre_vote_rounds", 0))
            control(candidate, {"op": "test_elections", "mode": "now"})
            wait_for(
                lambda: int(status(candidate).get("pre_vote_rounds", 0)) > asked,
                10,
                f"{candidate} to ask for pre-votes",
                interval=0.01,
            )
            at = time.monotonic()
            note(f"{candidate} asked for pre-votes ({lease_end - at:.3f} s before the lease's end)")
            if at >= lease_end:
                out.premises.append(
                    f"{candidate} asked for votes {at - lease_end:.3f} s after {old}'s lease ended"
                )
        return str(wait_for(lambda: leads(live, term), 20, f"a leader among {live}", interval=0.02))

    def read(reader: int, k: int) -> None:
        """Lease reads of key ``k`` on model node ``reader`` for ``READ_WINDOW``."""
        addr = cluster.node(real[reader]).client
        key = f"trail/{name}/{k}"
        newest = grants.get(k)
        if newest is None:
            out.premises.append(f"no grant of {key} was acknowledged before the read")
        seen: dict[str, int] = {}
        stale: list[str] = []
        end = time.monotonic() + READ_WINDOW
        while time.monotonic() < end:
            sent = time.monotonic()
            frame = {"id": 1, "op": "holder", "key": key, "consistency": "linearizable"}
            answer = _raw(addr, frame, READ_TIMEOUT)
            if answer is None or not answer.get("ok"):
                code = "no answer" if answer is None else str(answer.get("code"))
                seen[code] = seen.get(code, 0) + 1
                continue
            result = answer["result"]
            holder = result.get("holder")
            token = holder.get("token") if holder else None
            what = f"{result.get('consistency')} token {token}"
            seen[what] = seen.get(what, 0) + 1
            # Until the grantee's valid_until the lease is certainly live in log time
            # (it ends no earlier than send + ttl): a read must show it.
            if newest is not None and newest[1] < sent < newest[2] and token != newest[0]:
                stale.append(
                    f"sent {sent - newest[1]:.3f} s after the grant of token {newest[0]} was "
                    f"acknowledged, answered token {token} ({result.get('consistency')})"
                )
            time.sleep(0.05)  # the pace of the reads, not a wait for a condition
        note(f"reads of {key} on {real[reader]}: {seen}")
        if stale:
            out.violations.append(
                f"P3: {len(stale)} reads of {key} on {real[reader]} missed the grant; the "
                f"first {stale[0]}"
            )
        # The read's premise: the reader still took itself for the leader, and what
        # kept its lease reads open in the model holds on the real node too.
        st = status(real[reader])
        if st.get("role") != "leader":
            out.premises.append(f"after the reads {real[reader]} was {st.get('role')}")
        elif reader in stopped and not st.get("drift_alarm"):
            out.premises.append(f"after the reads {real[reader]} had no drift alarm raised")
        elif prep.kind == "barrier":
            if not float(st.get("lease_remaining") or 0.0) > 0 or st.get("drift_alarm"):
                out.premises.append(f"after the reads {real[reader]} had no leader lease: {st}")
            if cap is None or int(st.get("applied_index", 0)) > cap:
                out.premises.append(
                    f"after the reads {real[reader]} had applied index "
                    f"{st.get('applied_index')}, beyond the commit held back from it ({cap})"
                )

    def hold_for_promise() -> None:
        """``Plan`` promise, before the first step: the candidate hears nothing from
        the leader (cut both ways; its elections held until its ``ELECT``), and no
        entry reaches a follower any more (the leader's appends held to both, then
        the cut once both have every entry sent before), so that the candidate's log
        is as long as the voter's when it runs."""
        assert net is not None
        old = real[0]
        # Its own first entry applied (the read barrier) before its appends are held:
        # after, nothing it appends commits.
        wait_for(partial(serves_lease_reads, old), 15, f"{old} to serve lease reads")
        live = sorted(n.id for n in cluster.nodes if n.id != old)
        candidate = live[1]
        real[prep.candidate] = candidate
        control(candidate, {"op": "test_elections", "mode": "hold"})
        sent = {
            n: int(control(old, {"op": "test_hold", "peer": n, "what": "appends"})["sent"])
            for n in live
        }

        def same_logs() -> bool:
            ends = {n: int(status(n).get("last_log_index", -1)) for n in live}
            return all(ends[n] >= sent[n] for n in live) and len(set(ends.values())) == 1

        wait_for(same_logs, 10, f"{live} to have every entry {old} sent", interval=0.02)
        net.block([(old, candidate), (candidate, old)])
        note(f"cut {candidate} (model node {prep.candidate}) off from {old}")

    def hold_for_barrier(old: str) -> None:
        """``Plan`` barrier, at the deposed leader's last ``COMMIT``: the follower
        that will lead (the candidate) gets the entry but never its commit, the other
        gets neither, and once it leads, the candidate's appends to that other are
        held (heartbeats only: its leader lease is earned, its own entry never
        commits)."""
        nonlocal cap
        live = sorted(n.id for n in cluster.nodes if n.id != old)
        candidate, other = live
        real[prep.candidate] = candidate
        control(old, {"op": "test_hold", "peer": other, "what": "appends"})
        cap = int(
            control(old, {"op": "test_hold", "peer": candidate, "what": "commit"})["commit_index"]
        )
        control(candidate, {"op": "test_hold", "peer": other, "what": "appends"})

    leader = 0
    real = {0: cluster.leader_id()}
    try:
        if prep.kind == "promise":
            hold_for_promise()
        for i, step in enumerate(trail.steps):
            last = i == len(trail.steps) - 1
            if step.kind == "TIME":
                for node, moved in enumerate(step.args):
                    if moved == 0 and node not in stopped:
                        stopped.add(node)  # unsupported: only the leader's, so it is real
                        stop_clock(cluster.node(real[node]).client, note)
                time.sleep(unit)  # model time passing: the scenario's own clock, no guess
            elif step.kind == "HB" and prep.kind:
                # The heartbeat earns the leader its lease (the model's HB): wait for it.
                # A leader that will read once deposed must serve lease reads now (all
                # the model's read needs but the election); a new leader's reads are
                # barred by its barrier on the honest build, so only its lease counts.
                who = real[step.args[0]]
                if prep.kind == "promise":
                    ready = partial(serves_lease_reads, who)
                else:
                    ready = partial(has_lease, who)
                wait_for(ready, 10, f"{who}'s leader lease", interval=0.02)
                note(f"{who} holds a leader lease (model node {step.args[0]})")
            elif step.kind == "ELECT" and leader in readers:
                old = real[leader]
                note(f"the leader {old} (model node {leader}) is deposed")
                leader = step.args[0]
                candidate = real[leader] if prep.kind == "promise" else None
                real[leader] = cut_off(old, candidate)
                live = [n.id for n in cluster.nodes if n.id != old]
                real[step.args[1]] = next(n for n in live if n != real[leader])
                note(f"{real[leader]} leads (model node {leader})")
                for client in clients:
                    client.close()
                endpoints = [cluster.node(n).client for n in live]
                clients = [
                    Client(endpoints, **cluster.client_options, deadline=2.0 + ttl)
                    for _ in range(2)
                ]
            elif step.kind == "ELECT":
                old = real[leader]
                note(f"kill the leader {old} (model node {leader})")
                cluster.kill_node(old)
                leader = step.args[0]
                elected = str(cluster.wait_for_leader(exclude=old)["node"])
                if leader in real and real[leader] != elected:
                    out.premises.append(f"{elected} was elected, not {real[leader]}")
                real[leader] = elected
                note(f"{real[leader]} leads (model node {leader})")
            elif step.kind == "READ":
                read(step.args[0], step.args[1])
            elif step.kind == "KEEP":
                renew(step.args[1], step.args[2])
            elif step.kind == "COMMIT":
                op, k, c = OPS[step.args[2]], step.args[3], step.args[4]
                if prep.kind == "barrier" and i == prep.commit:
                    hold_for_barrier(real[leader])
                if op == "ACQ":
                    acquire(k, c, last)
                elif op == "REN":
                    renew(k, c)
                elif op == "REL" and (c, k) in held:
                    clients[c].release(held.pop((c, k)))
                elif op == "CLAIM":
                    claim(c)
                elif op == "DONE":
                    done(c)
    finally:
        for client in clients:
            with contextlib.suppress(RaftLeaseError, OSError):
                client.close()
    return out


__all__ = [
    "TRAILS",
    "Links",
    "Replay",
    "Step",
    "Trail",
    "load",
    "parse",
    "replay",
    "stop_clock",
    "unsupported",
]
