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

Threads: events come from the event loop and the tick thread; one lock orders them,
and a ``stamp`` is taken and written under it, so the file's order is the order of the
log clock's stamps (every one: the node builds its log clock from
``ServerHooks.log_clock_class``). Bounded: at ``MAX_TRACE_BYTES`` the trace writes one ``truncated``
line and stops (the checker then says the trace is incomplete).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import IO, Any

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
