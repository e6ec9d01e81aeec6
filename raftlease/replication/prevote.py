"""PreVote (Raft dissertation §9.6; etcd's ``PreVote``) at the PySyncObj seam.

PySyncObj starts an election by raising its term as soon as its election timer fires.
A member cut off from the others (a partition, a one-way link, a paused process)
therefore raised its term again and again; when it could talk again, the first
message of a lower-term leader it answered made that leader step down (term 7 -> 9
in 4 ms, every ``/readyz`` 503 for a moment) although the leader was healthy.

With PreVote a node whose election timer fires first asks the members whether they
*would* vote for it in the next term (``rl_pre_vote``: that term, its last log index
and term), changing no term and no vote anywhere. A member grants only if it would
vote: the candidate's log is at least as up to date as its own, its term is below
the one asked for, and it has no leader: a follower under its vote promise (it heard
a leader within the minimum election timeout, leadership.py) refuses, and so does a
leader that a majority acknowledges (CheckQuorum's vote side). Only with grants from
a majority (itself included) does the node let PySyncObj run its election; otherwise
it holds the election back and asks again: when the refusing members' promises end
(a follower that refuses under its promise says in how long, ``rl_retry``: a
survivor that heard the dead leader's last message a little later than the asker),
else after a short pause for the first rounds, then at a full random election
timeout. So a member that cannot reach a majority, or whose
majority still hears a leader, never raises its term, and rejoins as a follower.
A refusal that names a higher term makes the asker take that term (it was behind;
raising one's own term never disturbs anyone else).

PreVote owns the election timer. PySyncObj starts an election in its tick as soon as
its deadline has passed; a check in ``before_tick`` and PySyncObj's own check a moment
later read the clock twice, and a deadline that fell between the two (a hold's end,
while the tick thread was descheduled or the journal's once-a-second work ran) started
an election no pre-vote had won: a member cut off from every other raised its term
(the chaos suite's ``rejoin`` checker caught it under load). So PySyncObj's deadline is
kept at ``NEVER``: a deadline anyone writes there (PySyncObj when it hears a leader,
gives a vote or starts its election; a leadership transfer; the early election of
transport.py; a test control) is taken as this node's election deadline (``timer``) at
the next ``before_tick``, and only the tick that lets an election run puts a due one
(0) back.

CheckQuorum's other half, a leader stepping down when a majority has not answered
for ``leader_fallback`` (at least the maximum election timeout, config.py), is
PySyncObj's ``leaderFallbackTimeout`` (replica.syncobj_conf); the leader lease
(leadership.py) stops lease reads sooner.

Threads: PySyncObj's tick thread only (``before_tick`` and the message handlers).
"""

from __future__ import annotations

import logging
import math
import random
from typing import Any

from pysyncobj.monotonic import monotonic as raft_clock
from pysyncobj.syncobj import _RAFT_STATE

from .leadership import LeaseGuard

log = logging.getLogger("raftlease.replication")

REQUEST = "rl_pre_vote"
RESPONSE = "rl_pre_vote_response"
MESSAGE_TYPES = frozenset({REQUEST, RESPONSE})
#: Rounds asked again after a short pause (a share of the vote promise) before the
#: node waits a full random election timeout between rounds.
QUICK_ROUNDS = 3
QUICK_PAUSE = (1 / 16, 1 / 8)
#: PySyncObj's election deadline between ticks (module docstring): never due.
NEVER = math.inf


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class PreVote:
    """One node's pre-vote state, driven by ``LeaseTransport`` (its ``before_tick``
    and ``_onMessageReceived``). ``transport`` sends (``send``, which keeps its own
    gating of unproven connections) and wakes the tick thread (``_wake_at``)."""

    def __init__(self, transport: Any, guard: LeaseGuard) -> None:
        self.transport = transport
        self.guard = guard
        self.round = 0  # id of the latest round (responses name it)
        self.term = 0  # the term asked for in it
        self.grants: set[str] = set()
        self.won = False
        #: Rounds asked since the election timer last fired after news of a leader.
        self.streak = 0
        #: The election deadline we set ourselves (a hold), None once another was set.
        self.held: float | None = None
        #: This node's election deadline on PySyncObj's clock (module docstring: PySyncObj
        #: holds ``NEVER``); None until the first tick takes PySyncObj's.
        self.timer: float | None = None
        #: Rounds asked and rounds won since start (status).
        self.rounds = 0
        self.wins = 0

    @property
    def sync(self) -> Any:
        return self.transport._syncObj

    def _majority(self) -> int:
        return (len(self.sync._SyncObj__otherNodes) + 1) // 2 + 1

    def _reset(self) -> None:
        self.grants = set()
        self.won = False
        self.streak = 0
        self.held = None

    def deadline(self) -> float:
        """This node's election deadline on PySyncObj's clock: one written since the
        last tick, else ``timer``. Tick thread."""
        written = float(self.sync._SyncObj__raftElectionDeadline)
        if written != NEVER or self.timer is None:
            return written
        return self.timer

    def before_tick(self) -> None:
        """Before PySyncObj's tick, whose first step starts an election once the
        election deadline passed: take a deadline written since the last tick, keep
        PySyncObj's at ``NEVER``, and put a due one back only when a majority granted
        a pre-vote for the next term (module docstring)."""
        sync = self.sync
        written = sync._SyncObj__raftElectionDeadline
        if written != NEVER:
            # PySyncObj heard a leader, gave a vote or started its election; or a
            # transfer, an early election or a test control set it: a new deadline,
            # and what was asked before it no longer counts.
            if self.timer is not None:
                self._reset()
            self.timer = float(written)
            sync._SyncObj__raftElectionDeadline = NEVER
        if sync._SyncObj__raftState == _RAFT_STATE.LEADER or sync._SyncObj__selfNode is None:
            self._reset()
            return
        now = raft_clock()
        assert self.timer is not None
        if self.timer >= now:
            return
        if not sync._SyncObj__connectedToAnyone():
            return  # PySyncObj starts no election then either
        term = sync.raftCurrentTerm + 1
        if self.won and self.term == term:
            self.wins += 1
            self._reset()
            sync._SyncObj__raftElectionDeadline = 0.0  # due: PySyncObj runs it in this tick
            return
        left = self.guard.promise_left()
        if left > 0:
            # We heard a leader within the promise: we would refuse our own vote.
            self._hold(now + left)
            return
        self.round += 1
        self.rounds += 1
        self.term = term
        self.grants = {str(sync._SyncObj__selfNode.id)}
        self.won = False
        if self.streak == 0:
            log.info("no leader heard: asking the members for pre-votes for term %d", term)
            sync._SyncObj__raftLeader = None  # we know none now (PySyncObj would say so)
        self.streak += 1
        if len(self.grants) >= self._majority():  # a cluster of one
            self.won = True
            return
        request = {
            "type": REQUEST,
            "term": term,
            "round": self.round,
            "last_log_index": sync._SyncObj__getCurrentLogIndex(),
            "last_log_term": sync._SyncObj__getCurrentLogTerm(),
        }
        for node in list(sync._SyncObj__otherNodes):
            self.transport.send(node, request)
        if self.streak <= QUICK_ROUNDS:
            pause = self.guard.promise * random.uniform(*QUICK_PAUSE)
        else:
            pause = sync._SyncObj__generateRaftTimeout()
        self._hold(now + pause)

    def _hold(self, until: float) -> None:
        self.held = until
        self.timer = until

    def on_message(self, node: Any, message: dict[str, Any]) -> None:
        if message.get("type") == REQUEST:
            self._answer(node, message)
        else:
            self._count(node, message)

    def _answer(self, node: Any, message: dict[str, Any]) -> None:
        """Would we vote for ``node`` in the term it asks for? Changes nothing here."""
        sync = self.sync
        term = _int(message.get("term"))
        last_index = _int(message.get("last_log_index"))
        last_term = _int(message.get("last_log_term"))
        if term is None or last_index is None or last_term is None:
            log.warning("malformed pre-vote request from %s ignored", node.id)
            return
        ours = (sync._SyncObj__getCurrentLogTerm(), sync._SyncObj__getCurrentLogIndex())
        current = int(sync.raftCurrentTerm)
        retry = None
        # The leader question first (it counts the refusals ``status`` shows).
        if sync._SyncObj__raftState == _RAFT_STATE.LEADER:
            granted = not self.guard.has_quorum()  # a leader a majority hears stays
        else:
            granted = not self.guard.refuse_vote()  # we heard a leader just now
            if not granted:
                retry = self.guard.promise_left()  # ask again when it ends
        if term <= current or (last_term, last_index) < ours:
            granted, retry = False, None  # as a vote: not a term we are past, a shorter log
        answer: dict[str, Any] = {
            "type": RESPONSE,
            "term": term,
            "round": message.get("round"),
            "granted": granted,
            "rl_term": current,
        }
        if retry is not None:
            answer["rl_retry"] = retry
        self.transport.send(node, answer)

    def _count(self, node: Any, message: dict[str, Any]) -> None:
        sync = self.sync
        if sync._SyncObj__raftState == _RAFT_STATE.LEADER:
            return
        if message.get("granted") is True:
            if message.get("round") != self.round or message.get("term") != self.term:
                return  # an answer to an older round
            members = {str(n.id) for n in sync._SyncObj__otherNodes}
            if str(node.id) not in members:
                return
            self.grants.add(str(node.id))
            if not self.won and len(self.grants) >= self._majority():
                self.won = True
                # Run the election at the next tick, now.
                self._hold(0.0)
                self.held = None
                self.transport._wake_at(0.0)
            return
        retry = message.get("rl_retry")
        if (
            isinstance(retry, float | int)
            and not isinstance(retry, bool)
            and 0 <= retry <= self.guard.promise
            and message.get("round") == self.round
            and self.held is not None
        ):
            # Refused under the member's vote promise, which ends in ``retry`` s:
            # ask again just after that rather than at our next pause (a little
            # spread, so that two askers do not come back at the same moment).
            delay = retry + self.guard.promise * random.uniform(0.01, 0.04)
            until = raft_clock() + delay
            if until < self.held:
                self._hold(until)
                self.transport._wake_at(delay)
            return
        their = _int(message.get("rl_term"))
        if their is not None and their > sync.raftCurrentTerm:
            # We were behind: take their term (no vote in it), as PySyncObj takes any
            # higher term it sees. Our next round asks for the one after it.
            log.info(
                "pre-vote refused by %s at term %d: taking that term (was %d)",
                node.id,
                their,
                sync.raftCurrentTerm,
            )
            sync._SyncObj__setCurrentTerm(their, None)
            sync._SyncObj__setState(_RAFT_STATE.FOLLOWER)
            sync._SyncObj__raftLeader = None
