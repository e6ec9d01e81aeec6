"""The test build of a node: ``python -m raftlease.testing.node --config FILE
[--clock-control] [--record-synced] [--planted-bug NAME] [--trace] [--no-audit]
[--parent-pid PID]``.

It runs the same ``NodeServer`` as ``raftlease node``, with test hooks injected
(``raftlease.server.ServerHooks``): an adjustable clock and the ``test_clock`` control
operation, the peer controls ``test_hold`` and ``test_elections`` (``PeerControls``),
the loop stall ``test_stall`` (``loop_stall``), and optionally a planted bug
(``hooks.PLANTED_BUGS``). etcd keeps its failpoints out of release builds the same
way: a production node has no switch that turns any of this on.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from ..clock import AdjustableClock
from ..config import NodeConfig, load_toml
from ..core import LeaseStore
from ..core.audit import AuditTrail
from ..core.certkeys import holder_key_of
from ..core.progress import LeaseProgress
from ..core.queue import TaskQueues
from ..errors import BadRequestError, ConfigError, InvalidArgumentError
from ..limits import MAX_AUDIT_REFUSALS
from ..replication import LeaseGuard, LeaseTransport, Replica, SyncRecorder, raft_clock
from ..server import ServerHooks, run_node
from ..server.keepalive import MemoryKeepalives
from ..server.log_clock import LogClock
from ..server.logs import setup_logging
from ..server.node import unclean_stop_wait
from ..server.proposer import Proposer
from ..server.reads import Reads
from .hooks import PLANTED_BUGS
from .trace import TRACE_FILE, LeaseTap, TraceLog, traced_log_clock, traced_reads

log = logging.getLogger("raftlease.testing")

#: How fast a ``fast_log_clock`` leader's log time runs.
FAST_LOG_CLOCK_RATE = 3.0


class PromiselessGuard(LeaseGuard):
    """Planted bug ``skip_vote_promise``: followers never refuse a vote."""

    def refuse_vote(self) -> bool:
        return False


class DriftBlindGuard(LeaseGuard):
    """Planted bug ``ignore_drift_alarm``: the drift monitor still raises its alarm
    (``status`` shows it), but the leader lease no longer yields to it."""

    def lease_valid(self, term: int) -> bool:
        return term == self.leader_term and self.clock.monotonic() < self.lease_until


class RawFollowerLogTransport(LeaseTransport):
    """Planted bug ``raw_follower_log``: ``append_entries`` reach PySyncObj's follower
    code uncorrected (jepsen-style/README.md findings 1 and 2); the leader-lease
    stamps, echoes and vote promise stay."""

    follower_log_correction = False


class PlainPeerTransport(LeaseTransport):
    """Hook ``plain_peers``: members talk without TLS (the benchmark's baseline for
    what peer TLS costs). Not a planted bug, but never a production build either."""

    plain_peers = True


class ForgetfulStore(LeaseStore):
    """Planted bug ``skip_dedup``: the dedup table still admits and records every
    mutating request, but its recorded answer is dropped before the lookup, so a
    retry of a request it answered is applied again. Tick thread, like the store."""

    def _apply_mutation(self, op: str, entry: dict[str, Any]) -> dict[str, Any]:
        record = self.clients.get(entry["cid"])
        if record is not None:
            record.results.pop(entry["seq"], None)
        return super()._apply_mutation(op, entry)


class PartialSetStore(LeaseStore):
    """Planted bug ``partial_many_grant``: an ``acquire_many`` takes the free keys of
    its set and leaves out the busy ones (answering success), instead of refusing the
    whole set: readers see an agent holding part of its set. Tick thread, like the
    store."""

    def _acquire_many(self, entry: dict[str, Any]) -> dict[str, Any]:
        free = [pair for pair in entry["keys"] if self.holder(pair[0]) is None]
        if free:
            entry = {**entry, "keys": free}
        return super()._acquire_many(entry)

    # The dispatch table holds the functions themselves: point it at the override.
    _MUTATIONS: ClassVar[dict[str, Callable[[LeaseStore, dict[str, Any]], dict[str, Any]]]] = {
        **LeaseStore._MUTATIONS,
        "acquire_many": _acquire_many,  # type: ignore[dict-item]
    }


class DeadlockBlindStore(LeaseStore):
    """Planted bug ``skip_deadlock_detection``: no cycle of waits is ever looked for,
    so an acquire that closes one queues and its agents wait on each other until a
    wait or a TTL runs out. Tick thread, like the store."""

    def _closes_cycle(
        self,
        principal: str,
        owner: str,
        keys: list[str],
        priority: int,
        lease_id: str,
        is_set: bool = False,
    ) -> dict[str, Any] | None:
        return None

    def _resolve_deadlocks(self) -> None:
        self._grants_to_check = []


class FenceBlindEffectStore(LeaseStore):
    """Planted bug ``skip_lease_effect_fence``: a lease effect's begin or commit is
    taken from any lease the key ever had (remembered at grant), not only from the
    key's live lease: a zombie holder's late commit goes through. Tick thread, like
    the store; what it remembers is not in the snapshot (a test build)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ever: dict[str, Any] = {}

    def _grant(self, *args: Any, **kwargs: Any) -> Any:
        lease = super()._grant(*args, **kwargs)
        self._ever[lease.lease_id] = lease
        return lease

    def _effect_lease(self, entry: dict[str, Any]) -> Any:
        lease = self.leases.get(entry["lid"]) or self._ever.get(entry["lid"])
        return lease if lease is not None else super()._effect_lease(entry)


class ShortMemoryStore(LeaseStore):
    """Planted bug ``no_term_extension``: the first entry of a new term extends no
    lease, so a keep-alive the deposed leader answered from memory, and had not yet
    written into the log, is forgotten: the lease ends at the expiry the log holds,
    before the time its holder was told. Tick thread, like the store."""

    def _extend_all(self, base: int) -> None:
        return None


class StaleAcceptingTasks(TaskQueues):
    """Planted bug ``accept_stale_attempt``: an attempt call (heartbeat, complete,
    fail, release) that names an attempt which is not its task's current one is
    applied to the current attempt instead of being refused ``STALE_ATTEMPT``: the
    check looks at the task, not at the attempt. Tick thread, like the store."""

    def _current(self, entry: dict[str, Any]) -> Any:
        found = super()._current(entry)
        if isinstance(found, dict) and found.get("code") == "STALE_ATTEMPT":
            current = self.attempts.get(self.current.get(entry["tid"], ""))
            if current is not None:
                return current
        return found


class StaleAcceptingStore(LeaseStore):
    """The store of ``accept_stale_attempt``: its task queues are
    ``StaleAcceptingTasks``, also after a snapshot is loaded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tasks = StaleAcceptingTasks()

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> LeaseStore:
        store = super().from_plain(data)
        store.tasks = StaleAcceptingTasks.from_plain(store.tasks.to_plain())
        return store


class EffectBlindTasks(TaskQueues):
    """Planted bug ``skip_effect_check``: an effect's begin never looks at what
    earlier attempts left in the journal: every begin answers ``new`` and records a
    fresh intent, so a retry makes an external call an earlier attempt already made
    (or committed). Tick thread, like the store."""

    def _effect_begin(self, task: Any, attempt: Any, entry: dict[str, Any]) -> Any:
        task.effects.pop(entry["effect"], None)
        return super()._effect_begin(task, attempt, entry)


class EffectBlindStore(LeaseStore):
    """The store of ``skip_effect_check``: its task queues are ``EffectBlindTasks``,
    also after a snapshot is loaded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tasks = EffectBlindTasks()

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> LeaseStore:
        store = super().from_plain(data)
        store.tasks = EffectBlindTasks.from_plain(store.tasks.to_plain())
        return store


class EarlyChildTasks(TaskQueues):
    """Planted bug ``early_child``: a put's ``after`` is recorded but holds nothing
    back: the child is ready at once, before its parents complete. Tick thread, like
    the store."""

    def _link(self, task: Any, parents: list[str]) -> str:
        task.after = list(parents)
        return ""


class EarlyChildStore(LeaseStore):
    """The store of ``early_child``: its task queues are ``EarlyChildTasks``, also
    after a snapshot is loaded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tasks = EarlyChildTasks()

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> LeaseStore:
        store = super().from_plain(data)
        store.tasks = EarlyChildTasks.from_plain(store.tasks.to_plain())
        return store


class UntrackedProgress(LeaseProgress):
    """Planted bug ``progress_from_memory``: the records work, but the leader's
    keep-alive path is told no lease is progress-aware, so it answers their renewals
    from memory (``now + ttl``, past the progress deadline the log holds)."""

    def tracked(self, lease_id: str) -> bool:
        return False


class RebindingStore(LeaseStore):
    """Planted bug ``rebind_holder_key``: a renewal naming a holder key rebinds the
    lease to it before the renewal is checked, so the check always passes and the
    signer certifies the new key (what every renewal did before issue 39's fix).
    Tick thread, like the store."""

    def _renew(self, entry: dict[str, Any]) -> dict[str, Any]:
        lease = self.leases.get(entry["lid"])
        if lease is not None and lease.key == entry["key"] and "holder_key" in entry:
            lease.holder = holder_key_of(entry)
        return super()._renew(entry)

    # The dispatch table holds the functions themselves: point it at the override.
    _MUTATIONS: ClassVar[dict[str, Callable[[LeaseStore, dict[str, Any]], dict[str, Any]]]] = {
        **LeaseStore._MUTATIONS,
        "renew": _renew,  # type: ignore[dict-item]
    }


class ProgressFromMemoryStore(LeaseStore):
    """The store of ``progress_from_memory``: its progress records are
    ``UntrackedProgress``, also after a snapshot is loaded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.progress = UntrackedProgress()

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> LeaseStore:
        store = super().from_plain(data)
        store.progress = UntrackedProgress.from_plain(store.progress.to_plain())
        return store


class SilentTrail(AuditTrail):
    """Hook ``no_audit``: an audit trail whose ``add`` makes no record (no hash, no
    list append), the benchmark's baseline for what the trail costs. Tick thread."""

    __slots__ = ()

    def add(
        self,
        now: int,
        kind: str,
        key: str,
        token: int,
        owner: str,
        principal: str,
        by: str,
        revision: int,
    ) -> None:
        return None


class UnauditedStore(LeaseStore):
    """Hook ``no_audit``: a store whose ownership trail and refusal ring are
    ``SilentTrail``s, also after a snapshot is loaded (the snapshot then carries
    empty trails). Everything else, answers included, is the production store's.
    Tick thread, like the store."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.audit = SilentTrail()
        self.audit_refusals = SilentTrail(MAX_AUDIT_REFUSALS)

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> LeaseStore:
        store = super().from_plain(data)
        store.audit = SilentTrail()
        store.audit_refusals = SilentTrail(MAX_AUDIT_REFUSALS)
        return store


class BarrierlessReads(Reads):
    """Planted bug ``skip_read_barrier``: a new leader serves lease reads as soon as
    its leader lease is valid, before it has applied an entry of its own term."""

    def barrier_passed(self, replica: Replica) -> bool:
        return True


class UnwritingProposer(Proposer):
    """Planted bug ``unwritten_keepalives``: keep-alives answered from memory are never
    written into the log, so a lease ends at its logged expiry while its holder was
    told it lives on."""

    def due_keepalives(self, keep: MemoryKeepalives, now: int) -> list[Any]:
        return []


def join_at_once(config: NodeConfig) -> float:
    """Planted bug ``unsynced_acks``: no wait after a machine crash with durability
    none (the node rejoins with a journal that may have lost acknowledged grants)."""
    log.warning("PLANTED BUG: joining at once after a machine crash with durability none")
    return 0.0


def clock_control(clock: AdjustableClock) -> Any:
    """The ``test_clock`` control operation on ``clock``: ``rate`` (0 < r < 100) sets
    its rate, ``jump`` (>= 0 seconds) moves it forward. Raises ``BadRequestError`` /
    ``InvalidArgumentError`` naming a bad field; the clock is then unchanged."""

    def test_clock(message: dict[str, Any]) -> dict[str, Any]:
        changes: dict[str, float] = {}
        for name in ("rate", "jump"):
            value = message.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise BadRequestError(f"field {name!r} must be a number")
            if not math.isfinite(value) or not (0 < value < 100 if name == "rate" else value >= 0):
                raise InvalidArgumentError(f"field {name!r} is out of range: {value!r}")
            changes[name] = float(value)
        if "rate" in changes:
            clock.set_rate(changes["rate"])
        if "jump" in changes:
            clock.jump(changes["jump"])
        log.warning("test clock changed: %s (rate now %s)", changes, clock.rate)
        return {"rate": clock.rate, "monotonic": clock.monotonic()}

    return test_clock


#: ``test_stall``'s bounds: seconds in all, seconds each loop turn is held.
MAX_STALL = 60.0
MAX_STALL_TURN = 2.0


def loop_stall(message: dict[str, Any]) -> dict[str, Any]:
    """``test_stall``: ``{"seconds": s, "turn": t}``: for ``s`` seconds (0 < s <= 60)
    every turn of the node's event loop is held ``t`` seconds more (0 < t <= 2), as
    on a node past its capacity: every answer waits, and the loop's lag (admission
    control, server/overload.py) is real. The hold is a sleep, so the GIL stays free
    and PySyncObj's tick thread (heartbeats, elections) runs as before. Answers at
    once; the stall starts with the next turn. Raises ``BadRequestError`` /
    ``InvalidArgumentError`` naming a bad field. Event loop."""
    bounds = {"seconds": MAX_STALL, "turn": MAX_STALL_TURN}
    values: dict[str, float] = {}
    for name, high in bounds.items():
        value = message.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadRequestError(f"field {name!r} must be a number")
        if not math.isfinite(value) or not 0 < value <= high:
            raise InvalidArgumentError(f"field {name!r} is out of range: {value!r}")
        values[name] = float(value)
    loop = asyncio.get_running_loop()
    end = loop.time() + values["seconds"]
    turn = values["turn"]

    def hold() -> None:
        time.sleep(turn)
        if loop.time() < end:
            loop.call_soon(hold)  # the next turn, after this one's other callbacks

    loop.call_soon(hold)
    log.warning("test stall: every loop turn held %.2f s for %.1f s", turn, values["seconds"])
    return values


#: ``test_hold``'s holds: ``appends`` (no entries), ``commit`` (no newer commit index).
HOLDS = ("appends", "commit", "nothing")
#: ``test_elections``'s modes.
ELECTION_MODES = ("hold", "now", "free")


class PeerControls:
    """Test builds only: what this node's ``append_entries`` to a peer carry, and
    when it runs for election, as the scripted fault scenarios need them
    (raftlease.testing.trails) without timing luck. Set by the control operations
    ``test_hold`` and ``test_elections`` (event loop), read by ``ControlledTransport``
    on PySyncObj's tick thread; one lock orders the two, so every send is either
    before a hold (and counted in ``sent``) or after it (and held).

    * hold ``appends`` to a peer: its ``append_entries`` carry no entries (a heartbeat:
      the follower still hears the leader, renews its vote promise and echoes the
      stamp, so the leader's lease goes on) and a commit index no newer than the
      ``prevLogIdx`` it verifies. A snapshot chunk is not sent.
    * hold ``commit`` to a peer: its ``append_entries`` carry entries as usual but a
      commit index no newer than this node's at the hold: the peer appends and
      acknowledges (the leader commits with it) but never learns that anything
      after the cap committed, so it does not apply it.
    * elections ``hold``: this node never runs for election (its election deadline
      is moved past every tick); ``now``: its election timer fires at the next tick
      (then ``free``); ``free``: PySyncObj's own timers. PreVote and the vote
      promise still decide whether the election runs (prevote.py).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held_appends: set[str] = set()
        self.commit_caps: dict[str, int] = {}
        #: Peer member id -> the highest log index sent to it in an unheld message.
        self.sent: dict[str, int] = {}
        self.elections = "free"
        self.transport: LeaseTransport | None = None

    def hold(self, message: dict[str, Any]) -> dict[str, Any]:
        """``test_hold``: ``{"peer": member id, "what": "appends" | "commit" |
        "nothing"}`` (``nothing`` lifts both holds of that peer). Answers the peer,
        the hold, this node's commit index (the cap of a ``commit`` hold) and the
        highest index sent to the peer before the hold. Raises ``BadRequestError``
        for a missing peer or an unknown hold. Event loop; never blocks."""
        peer, what = message.get("peer"), message.get("what")
        if not isinstance(peer, str) or not peer:
            raise BadRequestError("field 'peer' must be a member id")
        if what not in HOLDS:
            raise BadRequestError(f"field 'what' must be one of {list(HOLDS)}")
        transport = self.transport
        if transport is None:
            raise BadRequestError("the node's transport has not started yet")
        commit = int(transport._syncObj.raftCommitIndex)
        with self._lock:
            if what == "appends":
                self.held_appends.add(peer)
            elif what == "commit":
                self.commit_caps[peer] = commit
            else:
                self.held_appends.discard(peer)
                self.commit_caps.pop(peer, None)
            sent = self.sent.get(peer, 0)
        log.warning(
            "test hold: %s to %s (commit index %d, sent up to %d)", what, peer, commit, sent
        )
        return {"peer": peer, "what": what, "commit_index": commit, "sent": sent}

    def set_elections(self, message: dict[str, Any]) -> dict[str, Any]:
        """``test_elections``: ``{"mode": "hold" | "now" | "free"}``. Raises
        ``BadRequestError`` for an unknown mode. Event loop; never blocks (``now``
        wakes the tick thread through PySyncObj's pipe notifier)."""
        mode = message.get("mode")
        if mode not in ELECTION_MODES:
            raise BadRequestError(f"field 'mode' must be one of {list(ELECTION_MODES)}")
        self.elections = str(mode)
        notifier = getattr(
            getattr(self.transport, "_syncObj", None), "_SyncObj__pipeNotifier", None
        )
        if mode == "now" and notifier is not None:
            notifier.notify()
        log.warning("test elections: %s", mode)
        return {"mode": mode}

    def outgoing(self, peer: str, message: dict[str, Any]) -> dict[str, Any] | None:
        """The ``append_entries`` to send to ``peer`` instead of ``message`` (a copy
        when changed), or None to send nothing. Tick thread."""
        with self._lock:
            if peer in self.held_appends:
                prev = message.get("prevLogIdx")
                if not isinstance(prev, int):
                    return None  # the snapshot path: a held peer gets none of it
                out = {k: v for k, v in message.items() if k not in ("transmission", "data")}
                out["entries"] = []
                # Raft's min(leaderCommit, index of the last new entry): what it verifies.
                out["commit_index"] = min(int(message.get("commit_index", 0)), prev)
                message = out
            else:
                entries = message.get("entries")
                if entries:
                    self.sent[peer] = max(self.sent.get(peer, 0), int(entries[-1][1]))
            cap = self.commit_caps.get(peer)
            if cap is not None and int(message.get("commit_index", 0)) > cap:
                message = {**message, "commit_index": cap}
        return message

    def before_tick(self, sync: Any) -> None:
        """Before PySyncObj's tick (which starts an election once its deadline
        passed): apply the election mode. Tick thread."""
        mode = self.elections
        if mode == "hold":
            # PySyncObj's own clock (its deadline's), taken through replication: the
            # only layer that imports PySyncObj (tests/fitness/test_layers.py).
            sync._SyncObj__raftElectionDeadline = raft_clock() + 3600.0
        elif mode == "now":
            self.elections = "free"
            sync._SyncObj__raftElectionDeadline = 0.0


#: This process's peer controls: a test-build process runs one node.
CONTROLS = PeerControls()


class ControlledTransport(LeaseTransport):
    """The transport of a test build with clock control (``controlled``): the
    process's ``PeerControls`` decide what its ``append_entries`` carry and when it
    runs for election; otherwise it is the transport it extends. Tick thread."""

    controls: ClassVar[PeerControls] = CONTROLS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.controls.transport = self

    def send(self, node: Any, message: Any) -> bool:
        if isinstance(message, dict) and message.get("type") == "append_entries":
            changed = self.controls.outgoing(str(getattr(node, "rl_id", node.id)), message)
            if changed is None:
                return True  # held: as if sent and lost
            message = changed
        return super().send(node, message)

    def before_tick(self) -> None:
        self.controls.before_tick(self._syncObj)
        super().before_tick()


#: Planted bugs that are a store of their own.
STORES: dict[str, type[LeaseStore]] = {
    "skip_dedup": ForgetfulStore,
    "accept_stale_attempt": StaleAcceptingStore,
    "no_term_extension": ShortMemoryStore,
    "partial_many_grant": PartialSetStore,
    "skip_deadlock_detection": DeadlockBlindStore,
    "skip_effect_check": EffectBlindStore,
    "skip_lease_effect_fence": FenceBlindEffectStore,
    "early_child": EarlyChildStore,
    "progress_from_memory": ProgressFromMemoryStore,
    "rebind_holder_key": RebindingStore,
}


def build_hooks(
    planted_bug: str = "",
    clock: bool = True,
    record_synced: bool = False,
    plain_peers: bool = False,
    trace: TraceLog | None = None,
    no_audit: bool = False,
) -> ServerHooks:
    """The hooks of a test node; with ``trace``, its log clock's stamps, its
    lease-read decisions and the lease changes of each applied entry are traced
    there (testing/trace.py); with ``no_audit``, its store keeps no audit trail
    (``UnauditedStore``). Raises ``ValueError`` for an unknown planted bug, or for
    ``no_audit`` with a planted bug that is a store of its own."""
    if planted_bug and planted_bug not in PLANTED_BUGS:
        raise ValueError(f"unknown planted bug {planted_bug!r}; known: {sorted(PLANTED_BUGS)}")
    store_class = STORES.get(planted_bug, LeaseStore)
    if no_audit:
        # A baseline for the benchmark, not a fault: one store class at a time keeps
        # each build's behaviour what its name says.
        if store_class is not LeaseStore:
            raise ValueError(f"no_audit cannot be combined with planted bug {planted_bug!r}")
        store_class = UnauditedStore
    adjustable = AdjustableClock() if clock or planted_bug else None
    # Every test build with clock control also answers the peer controls.
    ops: dict[str, Any] = {}
    if adjustable is not None:
        ops = {
            "test_clock": clock_control(adjustable),
            "test_hold": CONTROLS.hold,
            "test_elections": CONTROLS.set_elections,
            "test_stall": loop_stall,
        }
    guards: dict[str, type[LeaseGuard]] = {
        "skip_vote_promise": PromiselessGuard,
        "ignore_drift_alarm": DriftBlindGuard,
    }
    reads: type[Reads] = BarrierlessReads if planted_bug == "skip_read_barrier" else Reads
    return ServerHooks(
        clock=adjustable,
        log_clock_rate=FAST_LOG_CLOCK_RATE if planted_bug == "fast_log_clock" else 1.0,
        log_clock_class=traced_log_clock(trace) if trace is not None else LogClock,
        guard_class=guards.get(planted_bug, LeaseGuard),
        control_ops=ops,
        reads_class=traced_reads(reads, trace) if trace is not None else reads,
        proposer_class=UnwritingProposer if planted_bug == "unwritten_keepalives" else Proposer,
        transport_class=_transport(planted_bug, plain_peers, controls=adjustable is not None),
        store_class=store_class,
        recorder=SyncRecorder() if record_synced or planted_bug == "unsynced_acks" else None,
        durability="none" if planted_bug == "unsynced_acks" else None,
        restart_wait=join_at_once if planted_bug == "unsynced_acks" else unclean_stop_wait,
        apply_tap=LeaseTap(trace, trace.node) if trace is not None else None,
    )


class EagerElectionTransport(LeaseTransport):
    """Planted bug ``skip_pre_vote``: PySyncObj's election runs as soon as the timer
    fires, raising the term, as before PreVote (prevote.py)."""

    pre_vote = False


def _transport(planted_bug: str, plain_peers: bool, controls: bool = False) -> type[LeaseTransport]:
    base: type[LeaseTransport] = {
        "raw_follower_log": RawFollowerLogTransport,
        "skip_pre_vote": EagerElectionTransport,
    }.get(planted_bug, LeaseTransport)
    if plain_peers:
        if base is LeaseTransport:
            base = PlainPeerTransport
        else:
            base = type("PlainPeer" + base.__name__, (base,), {"plain_peers": True})
    return controlled(base) if controls else base


_CONTROLLED: dict[type[LeaseTransport], type[LeaseTransport]] = {}


def controlled(base: type[LeaseTransport]) -> type[LeaseTransport]:
    """``base`` with the test build's peer controls (``ControlledTransport``); one
    class per base, so that two builds of the same base compare equal."""
    if base not in _CONTROLLED:
        _CONTROLLED[base] = type("Controlled" + base.__name__, (ControlledTransport, base), {})
    return _CONTROLLED[base]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m raftlease.testing.node", description=__doc__)
    parser.add_argument("--config", required=True, help="the node's TOML config file")
    parser.add_argument("--clock-control", action="store_true", help="answer test_clock")
    parser.add_argument("--planted-bug", default="", choices=["", *sorted(PLANTED_BUGS)])
    parser.add_argument(
        "--record-synced", action="store_true", help="keep copies of what reached the disk"
    )
    parser.add_argument(
        "--plain-peers", action="store_true", help="no TLS between members (benchmark baseline)"
    )
    parser.add_argument(
        "--trace", action="store_true", help=f"trace the model's events to DATA_DIR/{TRACE_FILE}"
    )
    parser.add_argument(
        "--no-audit", action="store_true", help="keep no audit trail (benchmark baseline)"
    )
    parser.add_argument("--log-level", default="INFO")
    # As `raftlease node --parent-pid` (hidden there too): stop once PID is gone.
    parser.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        config = load_toml(args.config)
    except ConfigError as exc:
        parser.error(f"invalid configuration: {exc.message}")
    trace = TraceLog(config.data_dir / TRACE_FILE, config.node_id) if args.trace else None
    try:
        hooks = build_hooks(
            args.planted_bug,
            args.clock_control,
            args.record_synced,
            args.plain_peers,
            trace,
            no_audit=args.no_audit,
        )
    except ValueError as exc:
        parser.error(str(exc))
    if args.planted_bug:
        log.warning(
            "TEST BUILD with planted bug %s: %s", args.planted_bug, PLANTED_BUGS[args.planted_bug]
        )
    else:
        on = [
            name
            for name, flag in (
                ("clock control", args.clock_control),
                ("recording synced files", args.record_synced),
                ("plain peers (no TLS between members)", args.plain_peers),
                ("tracing the model's events", args.trace),
                ("no audit trail", args.no_audit),
            )
            if flag
        ]
        log.warning("TEST BUILD: %s", ", ".join(on) or "no hooks")
    run_node(config, hooks, args.parent_pid)


if __name__ == "__main__":
    main(sys.argv[1:])
