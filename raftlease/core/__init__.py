"""The lease state machine: pure, deterministic, no I/O (ARCHITECTURE §2).

``LeaseStore.apply(entry)`` is the only way state changes. Modules:

* ``records``: the record types (lease, waiter, lease session, client record);
* ``checks``: structural validation of entries;
* ``dedup``: the client-id table that makes retries idempotent;
* ``state``: the state and its reads;
* ``store``: ``LeaseStore``, apply and every mutation;
* ``snapshot``: the versioned plain-data snapshot codec;
* ``task_records``, ``task_state``, ``queue``: leased task queues (limits, records and
  checks; the state and its reads; every mutation), docs/queues.md;
* ``budget``: shared budgets, token buckets refilled in log time, docs/budgets.md.

A test walks this package's AST (tests/fitness/test_core_purity.py): it imports nothing that
reads a clock, draws a random number or does I/O.
"""

from .checks import ALL_OPS, LEASE_OPS, MAX_BATCH, MAX_PRIORITY, MUTATING_OPS, READ_OPS
from .dedup import CLIENT_IDLE_MS, MAX_PENDING_PER_CLIENT, ClientTable
from .records import ClientRecord, LeaseRecord, LeaseSession, Result, Waiter, error
from .snapshot import SNAPSHOT_VERSION
from .state import StoreState
from .store import LeaseStore

__all__ = [
    "ALL_OPS",
    "CLIENT_IDLE_MS",
    "LEASE_OPS",
    "MAX_BATCH",
    "MAX_PENDING_PER_CLIENT",
    "MAX_PRIORITY",
    "MUTATING_OPS",
    "READ_OPS",
    "SNAPSHOT_VERSION",
    "ClientRecord",
    "ClientTable",
    "LeaseRecord",
    "LeaseSession",
    "LeaseStore",
    "Result",
    "StoreState",
    "Waiter",
    "error",
]
