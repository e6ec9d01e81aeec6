"""The test build's trace of the events the SPIN model speaks of (issue 43).

With the hook ``trace: True`` a test node appends one JSON line per event to
``<data_dir>/trace.jsonl``; jepsen-style/trace_checker.py validates the lines of every
node of a chaos run against the model's transition rules (model/lease.pml: the log
clock's ``stamp``, ``read_allowed``). Only what must come from inside the node is
recorded here, and only by the test build: a production node has no trace, and a test
node without the hook records nothing (its classes are not wrapped).

Events (``ev``), each with the node's clock reading(s) in seconds:

* ``start``: a process started (the log clock starts afresh; terms are read again);
  ``node``, ``pid``.
* ``stamp``: the log clock stamped an entry or a lease read: ``term``, the applied log
  time it was given (``applied``, ms), the stamp (``stamp``, ms), and the node clock
  just before and just after (``m0``, ``m1``).
* ``lease_read``: the node decided it may answer from local state (a lease read or a
  keep-alive from memory): before and after that decision (``before``, ``after``),
  each a snapshot of what the model's ``read_allowed`` reads: ``term`` (the node's
  Raft term), ``applied_term`` (the term of its last applied entry), ``leader_term``,
  ``lease_until`` and ``mono`` (the guard's clock), ``alarm`` (drift alarm),
  ``size`` (cluster size).
* ``lease``: an applied entry granted, renewed (moved the expiry of: a renewal, a
  keep-alive's ``extend`` entry, a new term's extension), or ended (released, expired,
  transferred, revoked, its session ended) leases (``LeaseTap``): ``i`` (the log
  index), ``node``, ``at`` (the entry's log time, ms), ``rev`` (the store's revision
  after it), and ``ch``, the changes in the order the store made them, each
  ``[kind, key, lease, token, owner, units, capacity, until]``: ``kind`` is ``grant``,
  ``renew`` or the end's kind (``release``, ``expire``, ...), ``lease`` a hash of the
  lease id (the id itself proves ownership), ``until`` the expiry in log time (a
  grant's or renewal's new one; an end's as it was before the entry; None for a lease
  granted and ended in the same entry).

Threads: events come from the event loop and the tick thread; one lock orders them,
and a ``stamp`` is taken and written under it, so the file's order is the order of the
log clock's stamps (every one: the node builds its log clock from
``ServerHooks.log_clock_class``). Bounded: at ``MAX_TRACE_BYTES`` the trace writes one ``truncated``
line and stops (the checker then says the trace is incomplete).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import IO, Any

from ..core import LeaseStore
from ..models import LEASE_END_KINDS
from ..replication import Replica
from ..server.log_clock import LogClock
from ..server.reads import Reads

#: The trace's file in a node's data directory.
TRACE_FILE = "trace.jsonl"
#: The most a node's trace grows to (a ci chaos run writes a few MB).
MAX_TRACE_BYTES = 256 * 1024 * 1024


class TraceLog:
    """One node's trace file (appended: a restarted node continues it)."""

    def __init__(self, path: Path, node: str) -> None:
        self.node = node
        self.lock = threading.Lock()
        torn = False
        if path.exists() and path.stat().st_size > 0:
            with path.open("rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
        self._file: IO[str] | None = path.open("a", buffering=1, encoding="utf-8")
        if torn:  # a kill mid-line: end that line, so that this process's start is whole
            self._file.write("\n")
        self._size = path.stat().st_size
        self.event("start", node=node, pid=os.getpid())

    def event(self, ev: str, **fields: Any) -> None:
        """Append one event. Never raises for a full trace (it stops instead)."""
        with self.lock:
            self._write({"ev": ev, **fields})

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        line = json.dumps(record, separators=(",", ":")) + "\n"
        if self._size + len(line) > MAX_TRACE_BYTES:
            self._file.write('{"ev":"truncated"}\n')
            self._file.close()
            self._file = None
            return
        self._file.write(line)
        self._size += len(line)


def traced_log_clock(trace: TraceLog) -> type[LogClock]:
    """The log clock class of a traced node (``ServerHooks.log_clock_class``): every
    stamp (by the proposer, the reads, keep-alives, housekeeping) is traced."""

    class TracedLogClock(LogClock):
        def stamp(self, term: int, applied_now: int) -> int:
            with trace.lock:
                m0 = self._clock.monotonic()
                out = super().stamp(term, applied_now)
                m1 = self._clock.monotonic()
                trace._write(
                    {
                        "ev": "stamp",
                        "term": term,
                        "applied": applied_now,
                        "stamp": out,
                        "m0": m0,
                        "m1": m1,
                    }
                )
            return out

    return TracedLogClock


def _guard_view(replica: Replica) -> dict[str, Any]:
    guard = replica.guard
    return {
        "term": replica.term(),
        "applied_term": replica.store.term,
        "leader_term": guard.leader_term,
        "lease_until": guard.lease_until if guard.lease_until != float("-inf") else None,
        "mono": guard.clock.monotonic(),
        "alarm": bool(guard.drift.alarm),
        "size": guard.cluster_size,
    }


def traced_reads(base: type[Reads], trace: TraceLog) -> type[Reads]:
    """``base`` (the honest ``Reads`` or a planted one) with its lease-read decisions
    traced."""

    class TracedReads(base):  # type: ignore[valid-type,misc]
        def lease_read_allowed(self) -> bool:
            replica = self._replica()
            before = _guard_view(replica) if replica is not None else None
            allowed = bool(super().lease_read_allowed())
            if allowed and replica is not None:
                # The after view under the trace's lock: its term is then no lower
                # than that of any stamp written before it (terms only grow).
                with trace.lock:
                    after = _guard_view(replica)
                    trace._write({"ev": "lease_read", "before": before, "after": after})
            return allowed

    TracedReads.__name__ = "Traced" + base.__name__
    return TracedReads


#: The end kinds of a lease (``LeaseStore._end_lease``), as the store's events name them.
END_KINDS = LEASE_END_KINDS


def lease_hash(lease_id: str) -> str:
    """A short hash standing for a lease id in the trace."""
    return hashlib.sha256(lease_id.encode()).hexdigest()[:12]


class LeaseTap:
    """``ServerHooks.apply_tap`` of a traced node: around each applied entry (tick
    thread, inside the replicated method), writes one ``lease`` event when the entry
    granted, renewed or ended leases. ``before`` copies each live lease's expiry (a
    test build's cost: linear in the live leases, per entry); the store is only read,
    never changed."""

    def __init__(self, trace: TraceLog, node: str) -> None:
        self.trace = trace
        self.node = node

    def before(self, store: LeaseStore) -> dict[str, int]:
        return {lid: lease.expires_at for lid, lease in store.leases.items()}

    def after(self, index: int, store: LeaseStore, before: dict[str, int]) -> None:
        changes: list[list[Any]] = []
        for event in store.events:
            kind, lid = event.get("type"), event.get("lease_id")
            if not isinstance(lid, str) or (kind != "grant" and kind not in END_KINDS):
                continue
            key = event["key"]
            if kind == "grant":
                lease = store.leases.get(lid)
                until = lease.expires_at if lease is not None else None
            else:
                until = before.get(lid)
            changes.append(
                [
                    kind,
                    key,
                    lease_hash(lid),
                    event["token"],
                    event["owner"],
                    event.get("units", 1),
                    store.capacity_of(key),
                    until,
                ]
            )
        for lid, lease in store.leases.items():
            old = before.get(lid)
            if old is not None and lease.expires_at != old:
                changes.append(
                    [
                        "renew",
                        lease.key,
                        lease_hash(lid),
                        lease.token,
                        lease.owner,
                        lease.units,
                        store.capacity_of(lease.key),
                        lease.expires_at,
                    ]
                )
        if changes:
            self.trace.event(
                "lease", i=index, node=self.node, at=store.now, rev=store.revision, ch=changes
            )
