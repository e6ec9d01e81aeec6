"""Faults (nemeses) on a real cluster, and the schedules that order them.

Every fault kind has a start and a heal; ``Nemesis.run`` applies one fault, holds it for
its duration, heals it and records ``nemesis`` start/stop events in the history (the
stop event's time is when the heal took effect: liveness is measured from it).

Kinds (``KINDS``), by what they break:

* network, through the ``proxy.ProxyNet`` on every node pair: ``isolate-leader``,
  ``isolate-follower`` (a follower cut from every other node; at the heal the nemesis
  records its term before the heal and whether the leader kept its term after it: the
  ``rejoin`` checker, PreVote's case), ``split-majority`` (random minority/majority),
  ``bridge`` (two halves that only one node sees both of), ``partial-leader`` (leader
  cut from one follower only),
  ``one-way`` (the leader's outbound or inbound bytes lost), ``stall-leader`` (the
  leader's bytes held, then delivered late), ``reset-refuse-leader`` (connections reset
  and new ones refused), ``latency`` (delay on every link);
* processes: ``kill-leader``, ``kill-follower``, ``kill-all`` (SIGKILL, then restart
  from the data directory; after ``kill-all`` a wait for a leader), ``power-loss``
  (SIGKILL of a majority, or of every node, then each one's journal, journal meta and
  dump cut back to what had reached stable storage,
  ``raftlease.testing.power.cut_to_synced``, and a simulated reboot; needs the nodes'
  ``record_synced`` test hook), ``pause-leader``, ``pause-follower``
  (SIGSTOP/SIGCONT), ``pause-client`` (SIGSTOP of the client process in the window
  between its lease check and its fenced write: the fenced resource must refuse it);
* membership (docs/membership.md): ``membership`` replaces the leader itself, as an
  operator replaces a dead host: SIGKILL of the leader, ``member_remove`` of it through
  the new leader (the cluster runs one member short while the fault holds), and at the
  heal a fresh node in its place (same id and addresses, empty data directory) started
  and added with ``member_add``, which returns once it has caught up (from a snapshot
  if the log was compacted). Covers a remove, an add and the leader's replacement;
  ``membership-missed`` grows the cluster while a member is down: SIGKILL of a
  follower, a new node (a fresh id and addresses) started and added; at the heal the
  follower restarts from its data directory, which does not list the new member, and
  must learn it (docs/membership.md, "A member that missed a change"; recorded:
  ``learned`` and how long it took), then the new member is removed again, and on
  half the seeds the leader is SIGKILLed right after the removal is sent (a change in
  flight during a leader kill) and restarted, and the removal repeated until the
  member set is the original one;
* clocks, through the test-only ``test_clock`` request: ``clock-within`` (rates within
  ``clock_drift``, jumps below the margins: safe by assumption) and ``clock-beyond``
  (a slow leader, a fast and jumped follower: beyond the drift bound, where the drift
  monitor must stop lease reads). A fast *leader* clock beyond the bound is outside
  the safety model (it is what the ``fast_log_clock`` planted bug does) and is not
  scheduled; ``clock-beyond`` withdraws its fault if its fast target becomes leader.

* overlapping faults (``OVERLAPS``), a second fault started while the first holds, for
  the guards that only one fault alone does not exercise: ``clock-beyond+isolate-leader``
  (a leader whose clock runs slow beyond the drift bound is cut off once its drift alarm
  is raised: it must not serve lease reads past its real lease while the majority elects
  a new leader and writes; the drift guard's case) and ``partial-leader+pause-leader``
  (the leader, already cut from one follower, is paused: a new leader is elected while
  the old one may still believe its lease; the vote promise's case).

Schedules: ``schedule(profile, seed, minutes)`` returns every kind alone once, then a
random mix drawn from ``seed`` (``ci``: a short one; ``long`` and ``soak``: filling
``minutes``); ``smoke`` is three quick faults. Every random choice a fault makes at run time (which
follower, which split) comes from ``random.Random(spec.seed)``, so a seed reproduces
the schedule exactly; which node is leader when a fault starts is up to the cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import secure
from proxy import DROP, HOLD, ProxyNet
from workload import History

from raftlease.testing import LocalCluster

#: kind -> (category, default duration in seconds)
KINDS: dict[str, tuple[str, float]] = {
    "isolate-leader": ("network", 3.5),
    "isolate-follower": ("network", 3.5),
    "split-majority": ("network", 3.5),
    "bridge": ("network", 3.5),
    "partial-leader": ("network", 3.0),
    "one-way": ("network", 3.0),
    "stall-leader": ("network", 2.5),
    "reset-refuse-leader": ("network", 3.0),
    "latency": ("network", 3.0),
    "kill-leader": ("process", 2.5),
    "kill-follower": ("process", 2.0),
    "kill-all": ("process", 1.5),
    "power-loss": ("process", 1.5),
    "pause-leader": ("process", 3.0),
    "pause-follower": ("process", 2.0),
    "pause-client": ("client", 4.5),
    "membership": ("membership", 3.0),
    "membership-missed": ("membership", 3.0),
    "clock-within": ("clock", 3.5),
    "clock-beyond": ("clock", 3.5),
    "clock-beyond+isolate-leader": ("overlap", 4.0),
    "partial-leader+pause-leader": ("overlap", 3.5),
}

#: Overlapping kinds: (first fault, second fault started while the first holds).
OVERLAPS: dict[str, tuple[str, str]] = {
    "clock-beyond+isolate-leader": ("clock-beyond", "isolate-leader"),
    "partial-leader+pause-leader": ("partial-leader", "pause-leader"),
}
#: How long an overlap waits for the first fault to take effect before the second
#: (the drift alarm needs a few seconds of samples: docs/leader-lease.md).
OVERLAP_SETTLE = {"clock-beyond": 8.0, "partial-leader": 0.5}
#: Kinds that take down a majority (or every node): while one holds, no quorum may be
#: up, so no read can be answered (run.py asks no reads during faults of a schedule
#: made of these alone).
NO_QUORUM = frozenset({"kill-all", "power-loss"})
#: ``isolate-follower``: how long after the heal the nemesis watches the leader.
REJOIN_WATCH = 2.0
#: ``power-loss``: the chance that every node loses power (else a random majority).
POWER_LOSS_ALL = 0.4
#: After a ``power-loss`` or ``kill-all`` heal (every victim restarted), how long the
#: nemesis waits for a leader before the fault's recovery time starts (bounded; a
#: cluster that elects none in time is the liveness checker's to judge).
POWER_LOSS_LEADER_WAIT = 15.0
#: Profiles ``schedule`` knows, and the default ``minutes`` of the ones that fill it.
PROFILES = ("ci", "long", "smoke", "soak")
DEFAULT_MINUTES = {"long": 10.0, "soak": 30.0}
#: Seconds of random mix the ``ci`` profile adds after every kind alone (18 before
#: ``membership`` joined the kinds: its 3 s hold, 2.5 s recovery, the election before
#: its removal and the join at its heal are taken from the mix, so the profile's run
#: stays about as long).
CI_MIX = 10.0
#: ``membership``: how long the fault waits for a leader to remove the old member, and
#: the heal for the replacement to be added (its catch-up included).
MEMBERSHIP_CHANGE_WAIT = 20.0
#: ``membership``: how many times the heal asks for the replacement's add when its
#: learner stage ran out before it caught up (each try waits up to 15 s).
MEMBERSHIP_ADD_TRIES = 3
#: Files of a node's directory a replacement host keeps (its config, its log).
MEMBERSHIP_KEEP = frozenset({"node.toml", "node.log"})


@dataclass(frozen=True)
class FaultSpec:
    """One scheduled fault: ``kind`` held for ``duration`` s, then ``recovery`` s of
    quiet before the next one. ``seed`` drives its run-time choices."""

    kind: str
    duration: float
    recovery: float
    seed: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def schedule(
    profile: str, seed: int, minutes: float | None = None, kinds: list[str] | None = None
) -> list[FaultSpec]:
    """The fault schedule of a profile. ``ci``: every kind alone, then a short random
    mix. ``long`` and ``soak``: every kind alone, then a random mix filling ``minutes``
    (default 10 and 30). ``smoke``: three quick faults (used by the planted-bug
    self-tests): ``isolate-leader``, ``kill-leader``, ``pause-client``, or, when
    ``kinds`` excludes all three, the selected kinds in turn (``--kinds power-loss``:
    three power losses). ``kinds`` restricts the kinds used."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; expected one of {', '.join(PROFILES)}")
    rng = random.Random(seed)
    names = [k for k in KINDS if kinds is None or k in kinds]
    if not names:
        raise ValueError(f"no fault kinds selected; known: {sorted(KINDS)}")
    recovery = 2.5
    specs: list[FaultSpec] = []
    if profile == "smoke":
        picks: list[str] = [
            k for k in ("isolate-leader", "kill-leader", "pause-client") if k in names
        ]
        if not picks:
            picks = [names[i % len(names)] for i in range(max(3, len(names)))]
        return [FaultSpec(k, KINDS[k][1], recovery, rng.randrange(1 << 30)) for k in picks]
    alone = list(names)
    rng.shuffle(alone)
    specs += [FaultSpec(k, KINDS[k][1], recovery, rng.randrange(1 << 30)) for k in alone]
    if profile == "ci":
        budget = CI_MIX if minutes is None else max(0.0, minutes * 60 - _length(specs) - 15)
    else:
        length = minutes if minutes is not None else DEFAULT_MINUTES[profile]
        budget = max(0.0, length * 60 - _length(specs) - 15)
    while _length(specs) < _length(specs[: len(alone)]) + budget and len(specs) < 10_000:
        kind = rng.choice(names)
        duration = round(rng.uniform(0.6, 1.5) * KINDS[kind][1], 2)
        specs.append(
            FaultSpec(kind, duration, round(rng.uniform(2.0, 4.0), 2), rng.randrange(1 << 30))
        )
    return specs


def _length(specs: list[FaultSpec]) -> float:
    return sum(s.duration + s.recovery for s in specs)


def raw_request(addr: str, message: dict[str, Any], timeout: float = 1.0) -> dict[str, Any]:
    """One request to one node on a fresh connection (no redirect, no retry); on a
    secure run over TLS as the ``nemesis`` principal (``secure.raw_request``)."""
    return secure.raw_request(addr, message, timeout, "nemesis")


class Nemesis:
    """Applies faults to ``cluster`` (through ``proxies``) and records them.

    ``client_proc`` (a ``proc_client.ClientProcess``) is the target of ``pause-client``.
    ``say`` prints progress. Methods block the calling thread; they are not
    thread-safe (one fault at a time, from the harness thread).
    """

    def __init__(
        self,
        cluster: LocalCluster,
        proxies: ProxyNet,
        history: History,
        rho: float,
        client_proc: Any = None,
        say: Callable[[str], None] = print,
    ) -> None:
        self.cluster = cluster
        self.proxies = proxies
        self.history = history
        self.rho = rho
        self.client_proc = client_proc
        self.say = say
        self.ids = [n.id for n in cluster.nodes]
        self.count = 0
        self._heal: list[Callable[[], Any]] = []
        # Run once a fault's stop event is recorded, before its recovery time (e.g.
        # wait for a leader after a power loss): not part of the measured heal.
        self._after_heal: list[Callable[[], None]] = []
        self._paused: set[str] = set()
        self._killed: set[str] = set()
        self._skewed: set[str] = set()
        # Members beyond ``ids`` while a fault holds (``membership-missed``'s new node):
        # asked for leadership too, never faulted.
        self._extra: list[str] = []

    # -------------------------------------------------------------- queries

    def status(self, node_id: str, timeout: float = 0.5) -> dict[str, Any] | None:
        if not self.cluster.is_running(node_id) or node_id in self._paused:
            return None
        try:
            reply = raw_request(
                self.cluster.node(node_id).client, {"id": 1, "op": "status"}, timeout
            )
        except OSError:
            return None
        result = reply.get("result") if reply.get("ok") else None
        return result if isinstance(result, dict) else None

    def leader(self, wait: float = 5.0) -> str | None:
        """The node that claims leadership in the highest term (None if none within
        ``wait`` seconds)."""
        deadline = time.monotonic() + wait
        while True:
            best: tuple[int, str] | None = None
            for nid in (*self.ids, *self._extra):
                st = self.status(nid)
                if st and st.get("role") == "leader":
                    cand = (int(st.get("term", 0)), nid)
                    best = cand if best is None or cand > best else best
            if best is not None:
                return best[1]
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def set_clock(self, node_id: str, rate: float | None = None, jump: float | None = None) -> bool:
        message: dict[str, Any] = {"id": 1, "op": "test_clock"}
        if rate is not None:
            message["rate"] = rate
        if jump is not None:
            message["jump"] = jump
        try:
            reply = raw_request(self.cluster.node(node_id).client, message, 2.0)
        except OSError:
            return False
        if rate is not None:
            (self._skewed.discard if rate == 1.0 else self._skewed.add)(node_id)
        return bool(reply.get("ok"))

    # ------------------------------------------------------------- running

    def run(self, spec: FaultSpec) -> dict[str, Any]:
        """Apply ``spec``, hold it, heal it; returns the recorded detail."""
        self.count += 1
        fid = self.count
        rng = random.Random(spec.seed)
        start = self._starter(spec.kind)
        self._heal = []
        self._after_heal = []
        detail: dict[str, Any] = start(rng, spec)
        watch = detail.pop("_watch", None)
        self.history.append(
            {"type": "nemesis", "f": "start", "fault": spec.kind, "id": fid, "detail": detail}
        )
        self.say(f"fault #{fid} {spec.kind} start {_brief(detail)}")
        end = time.monotonic() + spec.duration
        while time.monotonic() < end:
            if watch is not None and watch():
                detail["withdrawn"] = True
                break
            time.sleep(0.05)
        healed = self.heal()
        self.history.append(
            {"type": "nemesis", "f": "stop", "fault": spec.kind, "id": fid, "detail": healed}
        )
        self.say(f"fault #{fid} {spec.kind} healed {_brief(healed)}")
        after, self._after_heal = self._after_heal, []
        for step in after:
            step()
        return detail

    def snapshot(self, why: str) -> dict[str, Any]:
        """Record every node's Raft view and the proxies' state (for diagnosis)."""
        nodes = {}
        for nid in self.ids:
            st = self.status(nid, timeout=0.5)
            nodes[nid] = (
                {
                    k: st.get(k)
                    for k in (
                        "role",
                        "term",
                        "leader",
                        "commit_index",
                        "applied_index",
                        "last_log_index",
                        "lease_reads",
                        "drift_alarm",
                    )
                }
                if st
                else None
            )
        links = [
            {
                k: d[k]
                for k in ("dialer", "acceptor", "connections", "accepted", "refused", "forwarded")
            }
            for d in self.proxies.describe()
        ]
        event = {
            "type": "nemesis",
            "f": "snapshot",
            "why": why,
            "nodes": nodes,
            "links": links,
        }
        self.history.append(event)
        return event

    def final_state(self, timeout: float = 20.0, record: bool = True) -> dict[str, Any]:
        """After the clients stopped: wait (at most ``timeout`` s) until every node has
        caught up, and record each node's state summary so the checker can compare the
        replicas. Caught up: in one round every node answers and either all report one
        applied index, or each has applied at least the highest commit index any node
        reported the round before (entries that keep committing after the clients stop,
        session expiries, must not keep a healthy cluster from converging, while a node
        that lags stays caught). A node that does not answer is recorded with the reason
        (not running and its exit code, paused, or no answer) and fails the wait.
        ``record=False`` returns the event without recording it (run.py adds the
        offline replay of every node first)."""
        fields = (
            "applied_index",
            "commit_index",
            "last_log_index",
            "term",
            "revision",
            "log_time",
            "leases",
            "sessions",
            "role",
        )
        deadline = time.monotonic() + timeout
        target: int | None = None
        nodes: dict[str, Any] = {}
        missing: dict[str, str] = {}
        converged = False
        rounds = 0
        while time.monotonic() < deadline:
            rounds += 1
            nodes, missing = {}, {}
            for nid in self.ids:
                st = self.status(nid, timeout=2.0)
                nodes[nid] = {k: st.get(k) for k in fields} if st else None
                if st is None:
                    missing[nid] = self._why_silent(nid)
            live = [n for n in nodes.values() if n]
            applied = [n["applied_index"] for n in live]
            if not missing and applied:
                if len(set(applied)) == 1:
                    converged = True
                    break
                if target is not None and all(isinstance(a, int) and a >= target for a in applied):
                    converged = True
                    break
            commits = [n["commit_index"] for n in live if isinstance(n.get("commit_index"), int)]
            target = max(commits) if commits else target
            time.sleep(0.5)
        event: dict[str, Any] = {
            "type": "final",
            "converged": converged,
            "waited": timeout,
            "rounds": rounds,
            "target": target,
            "nodes": nodes,
        }
        if missing:
            event["missing"] = missing
        if record:
            self.history.append(event)
        return event

    def _why_silent(self, node_id: str) -> str:
        """Why ``status`` got nothing from a node: for the final state's record."""
        if node_id in self._paused:
            return "paused"
        proc = self.cluster.procs.get(node_id)
        if proc is None:
            return "never started"
        code = proc.poll()
        if code is not None:
            return f"not running (exit code {code})"
        return "running but did not answer status within 2 s"

    def heal(self) -> dict[str, Any]:
        """Undo the current fault (runs every registered heal step, in reverse)."""
        out: dict[str, Any] = {}
        steps, self._heal = self._heal, []
        for step in reversed(steps):
            try:
                result = step()
                for key, value in (result or {}).items():
                    if isinstance(value, list) and isinstance(out.get(key), list):
                        out[key] = [*out[key], *value]
                    else:
                        out[key] = value
            except Exception as exc:  # keep healing the rest
                out.setdefault("errors", []).append(f"{type(exc).__name__}: {exc}")
        return out

    def heal_all(self) -> None:
        """Best-effort cleanup: heal the network, resume and restart nodes, reset clocks."""
        with contextlib.suppress(Exception):
            self.heal()
        with contextlib.suppress(Exception):
            self.proxies.heal()
        for nid in list(self._paused):
            with contextlib.suppress(Exception):
                self.cluster.resume_node(nid)
            self._paused.discard(nid)
        for nid in list(self._killed):
            with contextlib.suppress(Exception):
                self.cluster.start_node(nid)
            self._killed.discard(nid)
        for nid in list(self._skewed):
            self.set_clock(nid, rate=1.0)
        if self.client_proc is not None:
            self.client_proc.resume()

    # -------------------------------------------------------------- helpers

    def _target_leader(self) -> tuple[str, bool]:
        leader = self.leader()
        if leader is None:
            return self.ids[0], False
        return leader, True

    def _followers(self, leader: str) -> list[str]:
        return [n for n in self.ids if n != leader]

    def _heal_net(self) -> None:
        self._heal.append(lambda: {"resets": self.proxies.heal()})

    def _starter(self, kind: str) -> Callable[[random.Random, FaultSpec], dict[str, Any]]:
        if kind in OVERLAPS:
            return self._start_overlap
        starter: Callable[[random.Random, FaultSpec], dict[str, Any]] = getattr(
            self, "_start_" + kind.replace("-", "_")
        )
        return starter

    def _start_overlap(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        """Start the first fault, let it take effect, then start the second; both hold
        until the heal (their heal steps run in reverse: the second is undone first)."""
        first, second = OVERLAPS[spec.kind]
        one = self._starter(first)(rng, spec)
        watch = one.pop("_watch", None)
        settled = self._settle(first, one)
        two = self._starter(second)(rng, spec)
        two.pop("_watch", None)
        detail: dict[str, Any] = {
            "first": {"kind": first, **one},
            "second": {"kind": second, **two},
        }
        detail["settled"] = settled
        if watch is not None:
            # The first fault's own safeguard (clock-beyond withdraws a fast clock from
            # a node that became leader) keeps working, without ending the overlap.
            detail["_watch"] = lambda: bool(watch()) and False
        return detail

    def _settle(self, first: str, detail: dict[str, Any]) -> bool:
        """Wait until ``first`` shows its effect (bounded): for ``clock-beyond``, the
        slowed leader's drift alarm. Returns whether it was seen."""
        limit = time.monotonic() + OVERLAP_SETTLE.get(first, 0.5)
        if first != "clock-beyond":
            time.sleep(max(0.0, limit - time.monotonic()))
            return True
        leader = detail.get("leader")
        while time.monotonic() < limit:
            st = self.status(str(leader), timeout=0.5) if leader else None
            if st is not None and st.get("drift_alarm"):
                return True
            time.sleep(0.1)
        return False

    # ----------------------------------------------------------- network

    def _start_isolate_leader(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        leader, known = self._target_leader()
        groups = [[leader], self._followers(leader)]
        self.proxies.partition(groups, DROP)
        self._heal_net()
        return {"groups": groups, "leader": leader, "leader_known": known}

    def _start_isolate_follower(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        """Cut one follower from every other node. Its term (and the leader's) is
        asked on the client ports, which the proxy does not touch: before the cut,
        just before the heal (what the cut-off member did meanwhile) and for
        ``REJOIN_WATCH`` s after it (whether its return moved the leader)."""
        leader, known = self._target_leader()
        victim = rng.choice(self._followers(leader))
        before = self.status(victim) or {}
        leading = self.status(leader) or {}
        self.proxies.partition([[victim], self._followers(victim)], DROP)

        def heal() -> dict[str, Any]:
            at_heal = self.status(victim) or {}
            resets = self.proxies.heal()
            kept = True
            end = time.monotonic() + REJOIN_WATCH
            while time.monotonic() < end:
                st = self.status(leader)
                if st is not None and (st.get("role"), st.get("term")) != (
                    "leader",
                    leading.get("term"),
                ):
                    kept = False
                    break
                time.sleep(0.05)
            return {
                "resets": resets,
                "victim": victim,
                "victim_term_before": before.get("term"),
                "victim_term_at_heal": at_heal.get("term"),
                "leader": leader,
                "leader_term": leading.get("term"),
                "leader_kept": kept,
            }

        self._heal.append(heal)
        return {
            "victim": victim,
            "leader": leader,
            "leader_known": known,
            "victim_term_before": before.get("term"),
            "leader_term": leading.get("term"),
        }

    def _start_split_majority(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        nodes = list(self.ids)
        rng.shuffle(nodes)
        minority = nodes[: (len(nodes) - 1) // 2 or 1]
        groups = [sorted(minority), sorted(n for n in nodes if n not in minority)]
        self.proxies.partition(groups, DROP)
        self._heal_net()
        return {"groups": groups}

    def _start_bridge(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        nodes = list(self.ids)
        rng.shuffle(nodes)
        half = len(nodes) // 2
        bridge = nodes[half]
        groups = [sorted(nodes[:half]), sorted(nodes[half + 1 :])]
        self.proxies.partition(groups, DROP)
        self._heal_net()
        return {"groups": groups, "bridge": bridge}

    def _start_partial_leader(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        leader, known = self._target_leader()
        other = rng.choice(self._followers(leader))
        self.proxies.partition([[leader], [other]], DROP)
        self._heal_net()
        return {"cut": [leader, other], "leader": leader, "leader_known": known}

    def _start_one_way(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        leader, known = self._target_leader()
        direction = rng.choice(["out", "in"])
        others = self._followers(leader)
        if direction == "out":
            pairs = [(leader, o) for o in others]
        else:
            pairs = [(o, leader) for o in others]
        self.proxies.block(pairs, DROP)
        self._heal_net()
        return {"leader": leader, "direction": direction, "leader_known": known}

    def _start_stall_leader(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        leader, known = self._target_leader()
        others = self._followers(leader)
        self.proxies.block([*((leader, o) for o in others), *((o, leader) for o in others)], HOLD)
        self._heal_net()
        return {"leader": leader, "mode": "hold", "leader_known": known}

    def _start_reset_refuse_leader(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        leader, known = self._target_leader()
        self.proxies.refuse(leader, True)
        resets = self.proxies.reset(leader)
        self._heal_net()
        return {"leader": leader, "resets": resets, "leader_known": known}

    def _start_latency(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        delay = round(rng.uniform(0.03, 0.12), 3)
        scope = rng.choice(["all", "one"])
        nodes = None if scope == "all" else [rng.choice(self.ids)]
        self.proxies.delay_all(delay, nodes)
        self._heal_net()
        return {"delay": delay, "nodes": nodes or "all"}

    # ----------------------------------------------------------- processes

    def _kill(self, nid: str) -> None:
        self.cluster.kill_node(nid)
        self._killed.add(nid)

        def restart() -> dict[str, Any]:
            self.cluster.start_node(nid)
            self._killed.discard(nid)
            return {"restarted": [nid]}

        self._heal.append(restart)

    def _start_kill_leader(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        leader, known = self._target_leader()
        self._kill(leader)
        return {"killed": [leader], "leader_known": known}

    def _start_kill_follower(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        leader, _ = self._target_leader()
        victim = rng.choice(self._followers(leader))
        self._kill(victim)
        return {"killed": [victim], "leader": leader}

    def _start_kill_all(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        """SIGKILL every node; restart them all at the heal, then wait for a leader
        before the recovery time starts, as after a power loss: five processes
        starting at once on a loaded 2-core machine can take longer than the 2-4 s
        recovery gap to elect one, and the next fault would then start before any
        operation could complete, leaving the heal's recovery unmeasured (liveness
        ``unknown``; seen once in a 30-minute soak run beside another)."""
        order = list(self.ids)
        rng.shuffle(order)
        for nid in order:
            self._kill(nid)
        self._after_heal.append(lambda: self._await_leader(spec.kind))
        return {"killed": order}

    def _start_power_loss(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        """A power loss of a majority (sometimes of every node): SIGKILL them all at
        once, cut each one's journal, journal meta and dump back to what had reached
        stable storage (``cut_to_synced``: the node's ``record_synced`` shadows) plus
        a random half of the journal pages written since (torn writes), and restart
        them at the heal. Afterwards the nemesis waits for a leader. Raises
        (a harness failure) if a data directory cannot be cut: a power loss that
        dropped nothing it should have must not pass for one."""
        from raftlease.testing.power import PAGE, SECTOR, cut_to_synced

        leader, known = self._target_leader()
        victims = power_loss_victims(self.ids, rng)
        for nid in victims:  # every signal first: the power goes at one instant
            if self.cluster.is_running(nid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.cluster.pid(nid), signal.SIGKILL)
        for nid in victims:
            self._kill(nid)  # reaps; restarts at the heal
        # The kernel may have written back any page written since the last sync
        # (torn writes). Its own generator, seeded by one draw, so the pages each cut
        # keeps (their number depends on timing) never shift later faults' choices.
        # That draw's low bit picks the unit of a tear: whole pages, or sectors (a
        # page the disk was writing when the power went).
        seed = rng.getrandbits(64)
        writeback = random.Random(seed)
        unit = SECTOR if seed & 1 else PAGE
        cut = {
            nid: _plain(cut_to_synced(Path(self.cluster.node_dir(nid)), writeback, unit))
            for nid in victims
        }
        self._after_heal.append(lambda: self._await_leader(spec.kind))
        return {
            "killed": victims,
            "everyone": len(victims) == len(self.ids),
            "leader": leader,
            "leader_known": known,
            "cut": cut,
        }

    def _await_leader(self, kind: str) -> None:
        """Wait (at most ``POWER_LOSS_LEADER_WAIT`` s) for a leader; record a note."""
        began = time.monotonic()
        leader = self.leader(wait=POWER_LOSS_LEADER_WAIT)
        waited = round(time.monotonic() - began, 3)
        self.history.append(
            {
                "type": "nemesis",
                "f": "note",
                "fault": kind,
                "detail": {"leader_after_restart": leader, "waited": waited},
            }
        )
        self.say(f"{kind}: leader {leader or 'NONE'} {waited} s after the restart")

    def _pause(self, nid: str) -> None:
        self.cluster.pause_node(nid)
        self._paused.add(nid)

        def resume() -> dict[str, Any]:
            self.cluster.resume_node(nid)
            self._paused.discard(nid)
            return {"resumed": nid}

        self._heal.append(resume)

    def _start_pause_leader(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        leader, known = self._target_leader()
        self._pause(leader)
        return {"paused": leader, "leader_known": known}

    def _start_pause_follower(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        leader, _ = self._target_leader()
        victim = rng.choice(self._followers(leader))
        self._pause(victim)
        return {"paused": victim, "leader": leader}

    def _start_pause_client(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        proc = self.client_proc
        if proc is None or not proc.alive():
            return {"skipped": "no client process"}
        marker = proc.wait_for_marker(timeout=10.0)
        proc.pause()

        def resume() -> dict[str, Any]:
            proc.resume()
            return {"resumed": proc.name}

        self._heal.append(resume)
        detail: dict[str, Any] = {"paused": proc.name, "pid": proc.pid}
        if marker is not None:
            detail.update({"key": marker.get("key"), "token": marker.get("token")})
        else:
            detail["marker"] = "none within 10 s (paused anyway)"
        return detail

    # ----------------------------------------------------------- membership

    def _member_request(self, op: str, args: dict[str, Any], wait: float) -> dict[str, Any]:
        """Send a membership operation to the leader, retrying while there is none or
        it refuses definitely for now (``NOT_LEADER``, ``UNAVAILABLE``: an election, a
        change still in flight), until ``wait`` s. ``INVALID_ARGUMENT`` (already or no
        longer a member: a retry of an attempt whose answer was lost) is an answer.
        Raises ``RuntimeError`` (a harness error) when it never succeeds."""
        deadline = time.monotonic() + wait
        last: Any = None
        while (left := deadline - time.monotonic()) > 0:
            leader = self.leader(wait=min(5.0, left))
            if leader is not None:
                message = {"id": 1, "op": op, **args}
                try:
                    reply = raw_request(self.cluster.node(leader).client, message, min(30.0, left))
                except OSError as exc:
                    last = str(exc)
                else:
                    if reply.get("ok"):
                        return dict(reply["result"])
                    last = {k: reply.get(k) for k in ("code", "message")}
                    if reply.get("code") == "INVALID_ARGUMENT":
                        return {"answer": last}
            time.sleep(0.2)
        raise RuntimeError(f"{op} {args} did not succeed within {wait} s (last: {last})")

    def _start_membership(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        leader, known = self._target_leader()
        node = self.cluster.node(leader)
        self.cluster.kill_node(leader)
        self._killed.add(leader)

        def rejoin() -> dict[str, Any]:
            # A new host in the dead one's place: nothing of the old data.
            directory = Path(self.cluster.node_dir(leader))
            for path in directory.iterdir():
                if path.name not in MEMBERSHIP_KEEP:
                    if path.is_dir():
                        shutil.rmtree(path)
                    else:
                        path.unlink()
            self.cluster.start_node(leader)
            self._killed.discard(leader)
            began = time.monotonic()
            # An add whose learner did not catch up in time changes nothing and answers
            # added=false (a slow, loaded machine): ask again, within the heal's budget,
            # so the run ends with every host a member rather than one idling outside.
            tries = 0
            while True:
                tries += 1
                added = self._member_request(
                    "member_add",
                    {
                        "member_id": leader,
                        "raft": node.raft,
                        "client": node.client,
                        "timeout": 15.0,
                    },
                    MEMBERSHIP_CHANGE_WAIT,
                )
                if added.get("added", True) is not False or tries >= MEMBERSHIP_ADD_TRIES:
                    break
            return {
                "rejoined": [leader],
                "added": added.get("added"),
                "caught_up": added.get("caught_up"),
                "tries": tries,
                "join_s": round(time.monotonic() - began, 3),
            }

        self._heal.append(rejoin)
        removed = self._member_request(
            "member_remove", {"member_id": leader}, MEMBERSHIP_CHANGE_WAIT
        )
        return {
            "killed": [leader],
            "removed": leader,
            "leader_known": known,
            "members": removed.get("members", removed),
        }

    def _member_ids(self, node_id: str) -> list[str] | None:
        """The member ids in ``node_id``'s log (None if it does not answer)."""
        if not self.cluster.is_running(node_id):
            return None
        try:
            reply = raw_request(self.cluster.node(node_id).client, {"id": 1, "op": "member_list"})
        except OSError:
            return None
        result = reply.get("result") if reply.get("ok") else None
        if not isinstance(result, dict):
            return None
        return [str(m.get("id")) for m in result.get("members", []) if isinstance(m, dict)]

    def _start_membership_missed(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        leader, known = self._target_leader()
        missed = rng.choice(self._followers(leader))
        original = self.cluster.nodes
        self.cluster.kill_node(missed)
        self._killed.add(missed)
        new = self.cluster.new_node(f"x{self.count}")
        self._extra.append(new.id)
        self.cluster.start_node(new.id)

        def forget_new() -> dict[str, Any]:
            # Last of the heal (steps run in reverse): the new node's process and place
            # in the layout go whatever happened before.
            if new.id in self._extra:
                self._extra.remove(new.id)
            self.cluster.forget_node(new.id)
            return {}

        self._heal.append(forget_new)

        def rejoin_and_shrink() -> dict[str, Any]:
            # The member that missed the add comes back from its own data directory
            # and a config written before the add (an operator edits no file).
            current = self.cluster.nodes
            self.cluster.nodes = original
            try:
                self.cluster.start_node(missed)
            finally:
                self.cluster.nodes = current
            self._killed.discard(missed)
            began = time.monotonic()
            learned = False
            while time.monotonic() - began < MEMBERSHIP_CHANGE_WAIT:
                ids = self._member_ids(missed)
                if ids is not None and new.id in ids:
                    learned = True
                    break
                time.sleep(0.2)
            out: dict[str, Any] = {
                "restarted": [missed],
                "learned": learned,
                "learn_s": round(time.monotonic() - began, 3),
            }
            # Back to the original members: remove the new one, on half the seeds
            # with the leader SIGKILLed as soon as the removal is sent.
            if rng.random() < 0.5:
                target = self.leader(wait=10.0)
                if target is not None:
                    sent = {"id": 1, "op": "member_remove", "member_id": new.id}
                    address = self.cluster.node(target).client

                    def send() -> None:
                        with contextlib.suppress(OSError, ValueError):
                            raw_request(address, sent, 5.0)

                    threading.Thread(target=send, name="remove-in-flight", daemon=True).start()
                    time.sleep(rng.uniform(0.0, 0.3))  # the removal somewhere in flight
                    self.cluster.kill_node(target)
                    if target != new.id:  # the new node killed stays down: it is leaving
                        self.cluster.start_node(target)
                    out["killed_during_remove"] = target
            removed = self._member_request(
                "member_remove", {"member_id": new.id}, 2 * MEMBERSHIP_CHANGE_WAIT
            )
            out["members"] = removed.get("members", removed)
            return out

        self._heal.append(rejoin_and_shrink)
        added = self._member_request(
            "member_add",
            {"member_id": new.id, "raft": new.raft, "client": new.client, "timeout": 15.0},
            MEMBERSHIP_CHANGE_WAIT,
        )
        return {
            "killed": [missed],
            "added": new.id,
            "leader": leader,
            "leader_known": known,
            "members": added.get("members", added),
        }

    # --------------------------------------------------------------- clocks

    def _skew(self, nid: str, rate: float | None, jump: float | None) -> dict[str, Any]:
        ok = self.set_clock(nid, rate=rate, jump=jump)
        if rate is not None:
            self._heal.append(
                lambda: {f"rate_{nid}": 1.0 if self.set_clock(nid, rate=1.0) else None}
            )
        return {"node": nid, "rate": rate, "jump": jump, "applied": ok}

    def _start_clock_within(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        leader, known = self._target_leader()
        changes = []
        for nid in self.ids:
            rate = round(1.0 + rng.choice([-1, 1]) * rng.uniform(0.2, 0.5) * self.rho, 5)
            jump = round(rng.uniform(0.0, 0.005), 4) if rng.random() < 0.5 else None
            changes.append(self._skew(nid, rate, jump))
        return {"changes": changes, "leader": leader, "leader_known": known, "within": True}

    def _start_clock_beyond(self, rng: random.Random, spec: FaultSpec) -> dict[str, Any]:
        leader, known = self._target_leader()
        fast = rng.choice(self._followers(leader))
        changes = [
            self._skew(leader, round(rng.uniform(0.7, 0.85), 3), None),
            self._skew(fast, round(rng.uniform(1.3, 1.6), 3), round(rng.uniform(1.0, 3.0), 2)),
        ]

        def watch() -> bool:
            # A fast clock on a leader is outside the safety model: withdraw at once.
            st = self.status(fast, timeout=0.3)
            if st is not None and st.get("role") == "leader":
                self.set_clock(fast, rate=1.0)
                self.history.append(
                    {
                        "type": "nemesis",
                        "f": "note",
                        "fault": "clock-beyond",
                        "detail": {"withdrawn": f"{fast} became leader with a fast clock"},
                    }
                )
                return True
            return False

        return {
            "changes": changes,
            "leader": leader,
            "leader_known": known,
            "within": False,
            "_watch": watch,
        }


def power_loss_victims(ids: list[str], rng: random.Random) -> list[str]:
    """The nodes a ``power-loss`` fault takes down, in kill order: every node with
    probability ``POWER_LOSS_ALL``, else a random majority."""
    order = list(ids)
    rng.shuffle(order)
    if rng.random() < POWER_LOSS_ALL:
        return order
    return order[: len(order) // 2 + 1]


def _plain(value: Any) -> Any:
    """``value`` as JSON data (paths and other objects become strings)."""
    return json.loads(json.dumps(value, default=str))


def _dropped(files: Any) -> int:
    """Bytes a power loss cut from one node's files (``cut_to_synced``'s answer:
    ``{file: {"before": size or None, "after": size or None}}``)."""
    total = 0
    for sizes in (files or {}).values() if isinstance(files, dict) else ():
        if isinstance(sizes, dict):
            before, after = sizes.get("before") or 0, sizes.get("after") or 0
            if isinstance(before, int) and isinstance(after, int):
                total += max(0, before - after)
    return total


def _brief(detail: dict[str, Any]) -> str:
    parts = []
    for key, value in detail.items():
        if key.startswith("_") or key == "changes":
            continue
        if key == "cut" and isinstance(value, dict):
            value = ",".join(f"{nid}:-{_dropped(files)}B" for nid, files in value.items())
        parts.append(f"{key}={value}")
    if "changes" in detail:
        parts.append(
            "clocks="
            + ",".join(
                f"{c['node']}:{c['rate']}{'+' + str(c['jump']) if c['jump'] else ''}"
                for c in detail["changes"]
            )
        )
    return " ".join(parts)
