"""Replication over PySyncObj: the only package that imports pysyncobj (ARCHITECTURE §3).

* ``replica``: ``Replica`` (one node's replica of the lease store), the PySyncObj
  configuration we run with (``syncobj_conf``), the store consumer and snapshot hooks;
* ``transport``: ``LeaseTransport``, PySyncObj's TCP transport plus the leader-lease
  stamps, the vote promise and the follower-log corrections;
* ``follower_log``: the pure planner of a follower's ``append_entries`` handling;
* ``durable``: durable acknowledgements (``DurableJournal``: group-commit syncs of
  PySyncObj's journal, durable term/vote and dump writes);
* ``compact_journal``: ``CompactJournal``, PySyncObj's journal with the log kept in
  its file alone (no list of entries in memory);
* ``snapshot_rows``: a packed snapshot unpacked with its lease rows read one at a time;
* ``journal``: journal repair at start (a crash during log compaction, a torn tail);
* ``leadership``: leader lease, vote promise and clock-drift monitor (pure bookkeeping
  on an injected clock).

docs/pysyncobj.md lists what we rely on; tests/fitness/test_pysyncobj_contract.py guards it.
"""

# PySyncObj's own clock (CLOCK_MONOTONIC_RAW), which its election deadline is on.
from pysyncobj.monotonic import monotonic as raft_clock

from .durable import DURABILITY_FAILED, DURABLE_MARK, DurableJournal, SyncRecorder
from .follower_log import AppendPlan, Conflict, plan_append_entries, snapshot_is_behind
from .journal import repair_journal
from .leadership import LEASE_MARGIN, DriftMonitor, LeaseGuard
from .replica import (
    SNAPSHOT_LOAD_FAILED,
    ApplyObserver,
    ApplyTap,
    ProposeCallback,
    Replica,
    syncobj_conf,
)
from .transport import LeaseTransport

__all__ = [
    "DURABILITY_FAILED",
    "DURABLE_MARK",
    "LEASE_MARGIN",
    "SNAPSHOT_LOAD_FAILED",
    "AppendPlan",
    "ApplyObserver",
    "ApplyTap",
    "Conflict",
    "DriftMonitor",
    "DurableJournal",
    "LeaseGuard",
    "LeaseTransport",
    "ProposeCallback",
    "Replica",
    "SyncRecorder",
    "plan_append_entries",
    "raft_clock",
    "repair_journal",
    "snapshot_is_behind",
    "syncobj_conf",
]
