"""Progress-aware plain leases (docs/design.md §4g): the state behind
``acquire(progress_timeout=)`` and ``renew(progress=)``. Pure: no I/O, no clock; the
store (core/store.py) decides and calls in.

A lease acquired with a ``progress_timeout`` (log-time ms) is kept alive only while its
holder reports progress: a ``renew`` whose ``progress`` is higher than the last one
reported (the first one counts) moves ``progress_at`` to the entry's log time, and no
renewal (nor a new term's blanket extension) ever sets its expiry past
``progress_at + progress_timeout``. At that time the lease expires like any other, and
the store ends it as ``stalled`` instead of ``expire``. The decision is made in log
time by every replica alike: a progress report counts only once it is in the log, so
the leader never answers such a lease's renewals from memory (server/dispatch.py).

``leases``: lease id -> ``[timeout_ms, progress_at, progress or None]``, one per live
progress-aware lease (forgotten with the lease), so bounded by the live leases;
``pending``: the timeout of each queued acquire that asked for one, until its grant
starts its clock (bounded by the waiters).
"""

from __future__ import annotations

import math
from typing import Any


def valid_progress(value: Any) -> bool:
    """A progress figure (as a task heartbeat's): a finite float, or an int within
    ±2**62 (not a bool)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -(2**62) <= value <= 2**62
    return isinstance(value, float) and math.isfinite(value)


class LeaseProgress:
    """Progress records of live leases. Apply thread writes; the event loop reads
    ``tracked`` (a dict lookup) to route a renewal through the log."""

    def __init__(self) -> None:
        self.leases: dict[str, list[Any]] = {}
        #: Queued acquires with a ``progress_timeout``: lease id -> timeout (ms), until
        #: granted (``granted``) or dequeued (``forget``). Bounded by the waiters.
        self.pending: dict[str, int] = {}

    def granted(self, lease_id: str, timeout_ms: int | None, now: int) -> int | None:
        """A lease granted at log time ``now``, with the acquire's ``progress_timeout``
        (None: the one its queued acquire left in ``pending``, if any): its clock
        starts at its grant. Returns the timeout, or None for a plain lease."""
        queued = self.pending.pop(lease_id, None)
        timeout = queued if timeout_ms is None else timeout_ms
        if timeout is None:
            return None
        self.leases[lease_id] = [timeout, now, None]
        return timeout

    def tracked(self, lease_id: str) -> bool:
        return lease_id in self.leases

    def report(self, lease_id: str, progress: int | float | None, now: int) -> None:
        """A renewal at log time ``now``; a higher ``progress`` than the last counts."""
        record = self.leases.get(lease_id)
        if record is None or progress is None:
            return
        if record[2] is None or progress > record[2]:
            record[1] = now
            record[2] = progress

    def cap(self, lease_id: str) -> int | None:
        """The latest expiry the lease may have (``progress_at + timeout``), or None."""
        record = self.leases.get(lease_id)
        return None if record is None else int(record[0] + record[1])

    def stalled(self, lease_id: str, now: int) -> bool:
        """True when the lease's progress deadline is at or before ``now``."""
        cap = self.cap(lease_id)
        return cap is not None and cap <= now

    def info(self, lease_id: str) -> dict[str, Any] | None:
        """What a lease's answer shows: the timeout (ms) and the last progress."""
        record = self.leases.get(lease_id)
        if record is None:
            return None
        out: dict[str, Any] = {"progress_timeout": record[0], "progress_at": record[1]}
        if record[2] is not None:
            out["progress"] = record[2]
        return out

    def forget(self, lease_id: str) -> None:
        """The lease ended (released, expired, stalled, preempted, revoked,
        transferred), or its queued acquire left the queue ungranted."""
        self.leases.pop(lease_id, None)
        self.pending.pop(lease_id, None)

    def __bool__(self) -> bool:
        return bool(self.leases or self.pending)

    def to_plain(self) -> dict[str, Any]:
        return {
            "leases": [[lid, *record] for lid, record in self.leases.items()],
            "pending": [[lid, timeout] for lid, timeout in self.pending.items()],
        }

    @classmethod
    def from_plain(cls, data: Any) -> LeaseProgress:
        out = cls()
        if not isinstance(data, dict):
            return out
        for lid, timeout_ms, progress_at, progress in data.get("leases", ()):
            out.leases[lid] = [timeout_ms, progress_at, progress]
        for lid, timeout_ms in data.get("pending", ()):
            out.pending[lid] = timeout_ms
        return out
