"""Replication over PySyncObj: the only package that imports pysyncobj (ARCHITECTURE §3).

* ``replica``: ``Replica`` (one node's replica of the lease store), the PySyncObj
  configuration we run with (``syncobj_conf``), the store consumer and snapshot hooks;
* ``transport``: ``LeaseTransport``, PySyncObj's TCP transport plus the leader-lease
  stamps, the vote promise and the follower-log corrections;
* ``follower_log``: the pure planner of a follower's ``append_entries`` handling;
* ``journal``: journal repair after a crash during log compaction;
* ``leadership``: leader lease, vote promise and clock-drift monitor (pure bookkeeping
  on an injected clock).

docs/pysyncobj.md lists what we rely on; tests/test_pysyncobj_contract.py guards it.
"""

from .follower_log import AppendPlan, Conflict, plan_append_entries, snapshot_is_behind
from .journal import repair_journal
from .leadership import LEASE_MARGIN, DriftMonitor, LeaseGuard
from .replica import (
    SNAPSHOT_LOAD_FAILED,
    ApplyObserver,
    ProposeCallback,
    Replica,
    syncobj_conf,
)
from .transport import LeaseTransport

__all__ = [
    "LEASE_MARGIN",
    "SNAPSHOT_LOAD_FAILED",
    "AppendPlan",
    "ApplyObserver",
    "Conflict",
    "DriftMonitor",
    "LeaseGuard",
    "LeaseTransport",
    "ProposeCallback",
    "Replica",
    "plan_append_entries",
    "repair_journal",
    "snapshot_is_behind",
    "syncobj_conf",
]
