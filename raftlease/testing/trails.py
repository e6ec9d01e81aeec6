"""SPIN counterexamples replayed against real nodes (issue 43).

model/trail.py writes each planted-bug variant's shortest counterexample into
``model/trails/<VARIANT>.trail``: one model step a line (``model/lease.pml``, ``STEP``).
This module is the mapping from those steps to actions on a real ``LocalCluster``, and
``replay`` runs a trail as a scripted fault scenario that returns the property
violations it saw (none on the honest build; model/README.md, "Counterexamples on the
real cluster", says which variants replay and why the others do not).

The mapping (model unit of time: ``unit`` seconds; the model's TTL of 6 units is a
lease TTL of ``6 * unit``, its task attempt TTL of 2 units ``2 * unit``):

==========================  ===========================================================
model step                  real action
==========================  ===========================================================
``TIME a0 a1 a2``           ``unit`` seconds of real time pass (the trails are searched
                            with ``-DEXACT_CLOCKS``: every clock keeps real time)
``HB L f``                  nothing: the leader sends heartbeats on its own
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
                            the voter ``v`` are not replayed: any live node acks)
``READ L k``                not replayed (``unsupported``): the counterexamples that
                            read do so on a deposed or barely elected leader, a window
                            only network faults with set delays open; the hand-written
                            scenarios of tests/integration/test_planted_bugs.py do that
==========================  ===========================================================

The last step is the one whose assertion fails in the model; the real system's timing
is not the model's, so it is retried until the property's window closes: an acquire
(P1) until every other client's ``valid_until`` has passed. Properties checked on the
real answers: P1 (no grant of a key acknowledged before another client's
``valid_until`` of it) and P5 (no completion accepted from an attempt that is not the
current one).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftlease.errors import RaftLeaseError, StaleAttemptError
from raftlease.models import Lease
from raftlease.testing.cluster import LocalCluster

#: model/trails/ of a source checkout (the trails are not installed with the package).
TRAILS = Path(__file__).resolve().parents[2] / "model" / "trails"

#: The model's ops of a log entry (lease.pml: TICK ACQ REN REL CLAIM DONE).
OPS = ("TICK", "ACQ", "REN", "REL", "CLAIM", "DONE")
#: The model's constants the mapping scales (lease.pml: TTL, ATTL).
MODEL_TTL = 6
MODEL_ATTL = 2


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


def unsupported(trail: Trail) -> str | None:
    """Why ``replay`` cannot run ``trail`` on real nodes, or None if it can."""
    leader = 0
    deposed: set[int] = set()
    for step in trail.steps:
        if step.kind == "READ":
            return "a lease read on a deposed or new leader needs set network delays"
        # Only a leader's part is replayed: any live follower acknowledges (or votes),
        # so a killed node may be the model's follower, never its leader again.
        if step.kind != "TIME" and step.args[0] in deposed:
            return f"the deposed leader leads again ({step})"
        if step.kind == "ELECT":
            deposed.add(leader)
            leader = step.args[0]
    return None


@dataclass
class Replay:
    """What a replay saw: the violations, and a line per step (for a failure's message)."""

    violations: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)


def replay(trail: Trail, cluster: LocalCluster, unit: float, name: str = "") -> Replay:
    """Run ``trail`` on ``cluster`` (started, three nodes), one model unit of time being
    ``unit`` seconds; keys and the queue are named after ``name`` (default: the
    variant), so that replays may share a cluster when none of them elects.

    Blocks the calling thread for the trail's length (its TIME steps, an election, the
    last step's window). Raises ``ValueError`` for a trail ``unsupported`` names, and
    ``TimeoutError`` when the cluster elects no leader after a kill."""
    reason = unsupported(trail)
    if reason is not None:
        raise ValueError(f"{trail.variant}: cannot replay on real nodes: {reason}")
    name = name or trail.variant.lower()
    out = Replay()
    start = time.monotonic()
    ttl = MODEL_TTL * unit
    clients = [cluster.client(deadline=2.0 + ttl) for _ in range(2)]
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

    leader = 0
    real = {0: cluster.leader_id()}
    try:
        for i, step in enumerate(trail.steps):
            last = i == len(trail.steps) - 1
            if step.kind == "TIME":
                time.sleep(unit)  # model time passing: the scenario's own clock, no guess
            elif step.kind == "ELECT":
                old = real[leader]
                note(f"kill the leader {old} (model node {leader})")
                cluster.kill_node(old)
                leader = step.args[0]
                real[leader] = str(cluster.wait_for_leader(exclude=old)["node"])
                note(f"{real[leader]} leads (model node {leader})")
            elif step.kind == "KEEP":
                renew(step.args[1], step.args[2])
            elif step.kind == "COMMIT":
                op, k, c = OPS[step.args[2]], step.args[3], step.args[4]
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


__all__ = ["TRAILS", "Replay", "Step", "Trail", "load", "parse", "replay", "unsupported"]
