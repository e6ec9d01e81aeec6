"""Cooperative preemption (docs/design.md §4f): the state behind ``request_yield``.
Pure: no I/O, no clock; the store (core/store.py) decides and calls in.

* ``priorities``: the priority each live lease was granted at, when not 0 (the queued
  acquire's, or the acquire's own): a ``request_yield`` at priority p asks only the
  holders granted below p (an admin's asks every holder).
* ``requests``: lease id -> ``(deadline, asker's owner)``, at most one per live lease
  (a second request keeps the earlier deadline), so bounded by the live leases. The
  holder learns it in its next keep-alive answer; at ``deadline`` (log time) the
  store ends the lease itself (``preempt``) and grants the next waiter in that entry.
  Forgotten with the lease.
"""

from __future__ import annotations

import heapq
from typing import Any


class Preemption:
    """Yield requests and grant priorities. Apply thread writes; reads (a keep-alive
    answered from memory) copy what they return."""

    def __init__(self) -> None:
        self.priorities: dict[str, int] = {}
        self.requests: dict[str, tuple[int, str]] = {}
        # (deadline, lease id); stale items (the lease ended, or an earlier deadline
        # replaced it) are skipped when popped. Rebuilt on restore.
        self._due: list[tuple[int, str]] = []

    def granted(self, lease_id: str, priority: int) -> None:
        if priority:
            self.priorities[lease_id] = priority

    def priority_of(self, lease_id: str) -> int:
        return self.priorities.get(lease_id, 0)

    def ask(self, lease_id: str, deadline: int, by: str) -> int:
        """Record a request; returns the deadline that holds (the earlier one)."""
        known = self.requests.get(lease_id)
        if known is not None and known[0] <= deadline:
            return known[0]
        self.requests[lease_id] = (deadline, by)
        heapq.heappush(self._due, (deadline, lease_id))
        return deadline

    def forget(self, lease_id: str) -> None:
        """The lease ended (released, expired, preempted, revoked, transferred)."""
        self.priorities.pop(lease_id, None)
        self.requests.pop(lease_id, None)

    def due(self, now: int) -> list[str]:
        """Lease ids whose yield deadline is at or before ``now``, in (deadline, id)
        order; their requests are dropped (the store ends the leases)."""
        out: list[str] = []
        while self._due and self._due[0][0] <= now:
            deadline, lease_id = heapq.heappop(self._due)
            known = self.requests.get(lease_id)
            if known is not None and known[0] == deadline:
                del self.requests[lease_id]
                out.append(lease_id)
        if len(self._due) > 64 and len(self._due) > 4 * len(self.requests):
            self._due = [(d, lid) for lid, (d, _by) in self.requests.items()]
            heapq.heapify(self._due)
        return out

    def next_deadline(self) -> int | None:
        due = list(self._due[:1])  # the event loop asks while the tick thread applies
        return due[0][0] if due else None

    def request_of(self, lease_id: str) -> dict[str, Any] | None:
        """What a keep-alive answer shows the holder: the deadline and who asked."""
        known = self.requests.get(lease_id)
        return None if known is None else {"deadline": known[0], "by": known[1]}

    def to_plain(self) -> dict[str, Any]:
        return {
            "priorities": [[lid, p] for lid, p in self.priorities.items()],
            "requests": [[lid, d, by] for lid, (d, by) in self.requests.items()],
        }

    @classmethod
    def from_plain(cls, data: Any) -> Preemption:
        out = cls()
        if not isinstance(data, dict):
            return out
        for lid, priority in data.get("priorities", ()):
            out.priorities[lid] = priority
        for lid, deadline, by in data.get("requests", ()):
            out.requests[lid] = (deadline, by)
        out._due = [(d, lid) for lid, (d, _by) in out.requests.items()]
        heapq.heapify(out._due)
        return out
