"""Deadlock detection for acquires that hold and wait (docs/design.md §4e). Pure.

The waits-for graph is derived from the replicated state, never stored: its nodes are
*agents*, a ``(principal, owner)`` pair (the owner name a client gives, within its
authenticated principal: two principals never share an agent), and there is an edge
``a -> b`` for each queued acquire of ``a`` on a key that ``b`` holds (a live lease),
and for each queued acquire of ``a`` behind a waiting set of ``b`` on a key (a waiting
set keeps its place at the head of each of its keys' queues until all are free for
it, so what queues behind it waits for it). An agent waiting on a key it holds itself
adds no edge (several processes may share an owner name; a pool's units may be held
by the same owner). Single-key waiters ahead make no edge: one that is granted later
becomes a holder then, and that grant is checked.

The graph changes in exactly two ways that can close a cycle, and both are checked in
the entry that makes the change:

* an acquire (or a set of keys) is about to queue: is there a path from a holder of
  one of its keys, or a set queued ahead of it, back to its agent (or, for a set, to
  an agent queued behind it)? If so it is refused ``DEADLOCK`` and does not queue (it
  is the youngest waiter of the cycle: every other one queued before it);
* a lease is granted on a key others wait for (a grant from the queue, a direct grant
  with a higher priority, a transfer): is there a path from the new holder back to
  the agent of one of those waiters? If so the youngest waiter of the cycle (the
  highest queue order) leaves its queue (a set: every key's), and its long-poll
  learns ``DEADLOCK``.

Every search is breadth-first (the shortest cycle is named), in a canonical order
(waiters by queue order, holders by token, queues in rank order) so every replica,
restored from a snapshot or not, finds the same cycle; and examines at most
``MAX_DEADLOCK_SEARCH`` edges and queue places (``raftlease.limits``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from ..limits import MAX_DEADLOCK_REFUSALS, MAX_DEADLOCK_SEARCH
from .records import LeaseRecord, Result, Waiter, error

#: A node of the waits-for graph: (principal, owner).
Agent = tuple[str, str]


def agent_of(item: LeaseRecord | Waiter) -> Agent:
    """The agent a lease or a queued acquire belongs to."""
    return (item.principal, item.owner)


@dataclass(frozen=True, slots=True)
class Wait:
    """One edge of a cycle: ``owner`` waits (queued acquire ``lease_id``, queue order
    ``order``) for ``key``, which ``holder`` holds."""

    owner: str
    key: str
    holder: str
    order: int
    lease_id: str
    #: ``holder`` does not hold ``key`` yet: it is a waiting set queued ahead, to which
    #: the key is promised (a set holds its place at the head of each key's queue).
    ahead: bool = False

    @classmethod
    def of(cls, waiter: Waiter, holder: str, ahead: bool = False) -> Wait:
        return cls(waiter.owner, waiter.key, holder, waiter.order, waiter.lease_id, ahead)

    def named(self) -> dict[str, Any]:
        """The edge as the refusal names it: owners and keys, never a lease id."""
        if self.ahead:
            return {"owner": self.owner, "waits_for": self.key, "queued_behind": self.holder}
        return {"owner": self.owner, "waits_for": self.key, "held_by": self.holder}


class WaitIndex:
    """agent -> the lease ids of its queued acquires: derived from the wait queues
    (rebuilt on restore, never snapshotted). Written by the apply thread only."""

    def __init__(self) -> None:
        self.by_agent: dict[Agent, dict[str, int]] = {}

    def add(self, waiter: Waiter) -> None:
        self.by_agent.setdefault(agent_of(waiter), {})[waiter.lease_id] = waiter.order

    def remove(self, waiter: Waiter) -> None:
        agent = agent_of(waiter)
        waits = self.by_agent.get(agent)
        if waits is not None:
            waits.pop(waiter.lease_id, None)
            if not waits:
                del self.by_agent[agent]


class _Budget:
    """Edges and queue places a search may still examine (``MAX_DEADLOCK_SEARCH``)."""

    def __init__(self) -> None:
        self.left = MAX_DEADLOCK_SEARCH

    def spend(self, count: int = 1) -> bool:
        self.left -= count
        return self.left >= 0


def _edges(state: Any, agent: Agent, budget: _Budget) -> list[tuple[Wait, Agent]] | None:
    """``agent``'s out-edges in canonical order (its waiters by queue order; for each,
    its key's holders by token, then the waiting sets queued ahead of it on the key,
    in queue order) with their targets; None when the budget ran out."""
    waits = state.wait_index.by_agent.get(agent)
    if not waits:
        return []
    out: list[tuple[Wait, Agent]] = []
    for lease_id in sorted(waits, key=waits.__getitem__):
        waiter: Waiter = state.waiting[lease_id]
        holders: list[LeaseRecord] = state.holders_of(waiter.key)
        for lease in sorted(holders, key=lambda held: held.token):
            target = agent_of(lease)
            if target != agent:
                out.append((Wait.of(waiter, lease.owner), target))
        for ahead in state.queues.get(waiter.key, ()):
            if not budget.spend():
                return None
            if ahead is waiter:
                break
            if ahead.group and agent_of(ahead) != agent:
                out.append((Wait.of(waiter, ahead.owner, True), agent_of(ahead)))
    return out


def find_path(
    state: Any, starts: list[Agent], goals: set[Agent]
) -> tuple[list[Wait], Agent, Agent] | None:
    """The shortest path (breadth first) from one of ``starts`` to one of ``goals``
    (none of them a start) in the waits-for graph of ``state`` (a ``StoreState``):
    its edges in order, the start it leaves and the goal it reaches. None if there is
    none, or none within ``MAX_DEADLOCK_SEARCH`` edges and queue places examined."""
    parent: dict[Agent, tuple[Wait, Agent] | None] = {}
    frontier: deque[Agent] = deque()
    for start in starts:
        if start not in parent:
            parent[start] = None
            frontier.append(start)
    budget = _Budget()
    while frontier:
        agent = frontier.popleft()
        edges = _edges(state, agent, budget)
        if edges is None:
            return None
        for edge, target in edges:
            if not budget.spend():
                return None
            if target in parent:
                continue
            parent[target] = (edge, agent)
            if target in goals:
                path: list[Wait] = []
                start = target
                step = parent[target]
                while step is not None:
                    path.append(step[0])
                    start = step[1]
                    step = parent[start]
                path.reverse()
                return path, start, target
            frontier.append(target)
    return None


def describe(cycle: list[Wait]) -> str:
    """The cycle in words: "'a' waits for 'k2' held by 'b', ..." (owners and keys)."""
    return ", ".join(
        f"{w.owner!r} waits for {w.key!r} "
        + (f"promised to {w.holder!r}" if w.ahead else f"held by {w.holder!r}")
        for w in cycle
    )


def refusal(cycle: list[Wait], refused: Wait) -> Result:
    """The ``DEADLOCK`` outcome for ``refused``, the youngest waiter of ``cycle``."""
    return error(
        "DEADLOCK",
        f"deadlock: {describe(cycle)}; refused the youngest waiter ({refused.owner!r} "
        f"on {refused.key!r})",
        key=refused.key,
        cycle=[w.named() for w in cycle],
    )


def youngest(cycle: list[Wait]) -> Wait:
    """The waiter of ``cycle`` that queued last (the highest queue order)."""
    return max(cycle, key=lambda w: w.order)


class Refusals:
    """Queued acquires refused ``DEADLOCK`` after they queued: lease id -> (key, wait
    deadline, the refusal), kept for their long-poll until the deadline, at most
    ``MAX_DEADLOCK_REFUSALS`` (oldest forgotten first). Replicated state (snapshot)."""

    def __init__(self) -> None:
        self.by_lease: dict[str, tuple[str, int, Result]] = {}

    def add(self, lease_id: str, key: str, deadline: int, outcome: Result, now: int) -> None:
        for old in [lid for lid, row in self.by_lease.items() if row[1] <= now]:
            del self.by_lease[old]
        while len(self.by_lease) >= MAX_DEADLOCK_REFUSALS:
            del self.by_lease[next(iter(self.by_lease))]
        self.by_lease[lease_id] = (key, deadline, outcome)

    def status(self, key: str, lease_id: str, at: int) -> dict[str, Any] | None:
        """A long-poll's answer for a refused waiter: ``state`` ``refused`` with the
        ``reason`` code, its ``message`` and the ``cycle``; None if not refused."""
        row = self.by_lease.get(lease_id)
        if row is None or row[0] != key or row[1] <= at:
            return None
        outcome = row[2]
        detail = outcome.get("detail", {})
        return {
            "state": "refused",
            "reason": outcome["code"],
            "message": outcome["message"],
            "cycle": list(detail.get("cycle", [])),
        }

    def to_plain(self) -> list[list[Any]]:
        return [[lid, key, deadline, out] for lid, (key, deadline, out) in self.by_lease.items()]

    @classmethod
    def from_plain(cls, rows: Any) -> Refusals:
        refusals = cls()
        for lid, key, deadline, outcome in rows:
            refusals.by_lease[lid] = (key, deadline, outcome)
        return refusals
