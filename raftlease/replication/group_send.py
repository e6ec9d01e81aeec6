"""One ``append_entries`` per follower per tick, however many commands the tick
appended, and no message only to say the commit index moved (issue 16: server CPU
and throughput of acquires and releases).

PySyncObj has two modes, and neither fits:

* ``appendEntriesUseBatch=True`` sends new entries only at the next heartbeat
  (``appendEntriesPeriod``), and a command put from another thread does not wake the
  tick thread (its pipe notifier exists only without batching): every write waits
  for a heartbeat (docs/pysyncobj.md, trap 8).
* ``appendEntriesUseBatch=False`` (ours) wakes the tick thread for each command and,
  in ``_checkCommandsToApply``, calls ``__sendAppendEntries`` after *each* command it
  appends. With K commands queued, every follower gets K messages, each carrying one
  entry, each pickled, sealed (peers.py) and sent, each answered, and each answer
  costs the follower a journal sync first (durable.py): K of everything where one
  would do.

``GroupSendSyncObj`` keeps the second mode and its wake-ups, and turns the
per-command send into one send at the end of the tick's ``_checkCommandsToApply``:
while that method runs on the tick thread the configuration says "batch" (so it only
appends), and afterwards one ``__sendAppendEntries`` carries everything it appended to
every follower. The send still comes before the tick's journal sync (an on-tick
callback, run after this method), so the leader's sync still overlaps the followers'
round trip.

It also drops PySyncObj's commit broadcast: without batching, a leader that has just
applied entries sends every follower an ``append_entries`` of no entries at once,
only to carry the new commit index, and each follower answers it. That was half
the peer messages of a lone acquire (eight on the leader: the append, the
broadcast, and their answers). The commit index now travels with the next append
or heartbeat (``heartbeat_interval``, 50 ms by default), which every
``append_entries`` carries anyway. Nothing waits for a follower to apply: the
leader commits on the followers' answers to the append, and answers and lease
reads come from the leader. What changes is how soon a follower's own state
catches up: within one heartbeat under no load (a ``stale`` read on a follower
may be that much older; a follower that becomes leader applies everything
committed before it serves, as before).

What it changes is only how entries are grouped into messages: the entries, their
order, their terms, the commit rule and what a follower checks are PySyncObj's, and
nothing here reads or changes the state machine.

The flag flip is seen by the client threads too: ``_applyCommand`` puts a command
and then notifies the tick thread only when the flag says "no batch". A command put
while the flag says "batch" may miss its wake-up; so after restoring the flag the
tick thread wakes itself if the queue is not empty. Under the GIL either the command
was in the queue by then (seen, woken) or its put came after the restore (it
notifies itself).

A subclass, not a wrapper set on the object: PySyncObj writes every attribute added
to a ``SyncObj`` after its constructor into the dump (``__properies``), and a
function there would break log compaction.

It also gives the transport a say before each tick (``before_tick``, if the
transport has one): PySyncObj's tick may start an election as its first step, and
the on-tick callbacks run only at its end. ``LeaseTransport`` takes there the term of
a vote request it dropped under its vote promise, which must happen before this node
runs for election itself, or it would run in that same term and split the vote.

Threads: the overrides run on PySyncObj's tick thread only.
"""

from __future__ import annotations

from pysyncobj import SyncObj
from pysyncobj.syncobj import _RAFT_STATE


class GroupSendSyncObj(SyncObj):  # type: ignore[misc]
    """``SyncObj`` sending the commands a tick appends in one ``append_entries`` per
    follower (module docstring). Needs ``appendEntriesUseBatch=False``."""

    def _onTick(self, timeToWait: float = 0.0) -> None:
        before = getattr(getattr(self, "_SyncObj__transport", None), "before_tick", None)
        if before is not None:
            before()
        super()._onTick(timeToWait)

    def _checkCommandsToApply(self) -> None:
        conf = self._SyncObj__conf
        before = self._SyncObj__getCurrentLogIndex()
        conf.appendEntriesUseBatch = True
        try:
            super()._checkCommandsToApply()
        finally:
            conf.appendEntriesUseBatch = False
        if (
            self._SyncObj__raftState == _RAFT_STATE.LEADER
            and self._SyncObj__getCurrentLogIndex() != before
        ):
            self._SyncObj__sendAppendEntries()
        # FastQueue has no empty(); its deque is read in one step under the GIL.
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)  # absent without pipes
        if notifier is not None and self._SyncObj__commandsQueue._FastQueue__queue:
            notifier.notify()

    def _SyncObj__applyLogEntries(self) -> bool:
        # PySyncObj's "send now" answer, which without batching is always yes after
        # an apply: no. The next append or heartbeat carries the commit index.
        super()._SyncObj__applyLogEntries()
        return False
