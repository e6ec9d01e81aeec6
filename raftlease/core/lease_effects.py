"""The effect journal on plain leases (issue 41; docs/design.md §4h): pure,
deterministic, no I/O.

The task form (core/effects.py) keeps a journal per task; this one keeps one per lease
KEY, shared by the key's successive holders: an effect id begun under the lease with
token 5 is seen by the next holder (token 6) as ``in_progress`` by token 5 with its
idempotency key (reconcile), or ``committed`` with its result (skip the call). The
rows and the begin/commit rules are the task form's (``effects.begin_in``,
``effects.commit_in``), with a lease's token in place of an attempt's and no attempt
number (0 in the row).

The fence is the caller's (``LeaseStore._lease_effect``): only the key's current live
lease, proved by its lease id, may begin or commit (an ended lease is
``LEASE_NOT_FOUND``, one whose key another lease holds ``NOT_OWNER``, both definite),
and only on a key of capacity 1 (a shared key has several holders at once, which no
token orders). So a zombie holder's late commit is refused.

Bounds (raftlease/limits.py): at most ``MAX_KEY_EFFECTS`` rows per key and
``MAX_LEASE_EFFECTS`` in all (a begin of a new effect beyond either is
``QUOTA_EXCEEDED``). Retention: a key's journal is kept while the key is held; when
its last lease ends, it is dropped ``LEASE_EFFECT_RETENTION_MS`` of log time later,
unless the key is held again by then (it is then kept until that lease ends, and so
on). ``idle`` holds the drop time of each journal whose key's last lease ended; the
heap of drop times is derived from it (not in the snapshot).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from ..limits import (
    LEASE_EFFECT_RETENTION_MS,
    MAX_EFFECT_ID_BYTES,
    MAX_EFFECT_KEY_BYTES,
    MAX_EFFECT_RESULT_BYTES,
    MAX_KEY_EFFECTS,
    MAX_LEASE_EFFECTS,
)
from .checks import utf8_size, valid_str
from .effects import begin_in, commit_in
from .records import Result, error

LEASE_EFFECT_OPS = frozenset({"lease_effect_begin", "lease_effect_commit"})


def check_lease_effect_args(op: str, entry: dict[str, Any]) -> str | None:
    """Why a lease effect entry is malformed, or None (structural only; ``key`` and
    ``lid`` are checked with every lease operation's)."""
    if not valid_str(entry.get("effect"), MAX_EFFECT_ID_BYTES):
        return f"'effect' must be a non-empty string of at most {MAX_EFFECT_ID_BYTES} bytes"
    if (
        op == "lease_effect_begin"
        and "ikey" in entry
        and not valid_str(entry["ikey"], MAX_EFFECT_KEY_BYTES)
    ):
        return (
            f"'idempotency_key' must be a non-empty string of at most {MAX_EFFECT_KEY_BYTES} bytes"
        )
    if op == "lease_effect_commit" and "result" in entry:
        result = entry["result"]
        if not isinstance(result, str) or utf8_size(result) > MAX_EFFECT_RESULT_BYTES:
            return f"'result' must be a string of at most {MAX_EFFECT_RESULT_BYTES} bytes"
    return None


class LeaseEffects:
    """The journals of lease keys. Apply thread only (like the store)."""

    def __init__(self) -> None:
        #: key -> effect id -> ``[effect id, state, token, 0, idempotency key, result]``.
        self.journals: dict[str, dict[str, list[Any]]] = {}
        #: key -> log time its journal is dropped (its last lease ended).
        self.idle: dict[str, int] = {}
        #: Rows in all journals (the overall cap).
        self.rows = 0
        self._drops: list[tuple[int, str]] = []

    def begin(self, key: str, token: int, entry: dict[str, Any]) -> Result:
        """Begin ``entry["effect"]`` for the key's current lease (``token``; the
        caller checked it), or answer what an earlier holder left."""
        eid: str = entry["effect"]
        journal = self.journals.get(key)
        full: Result | None = None
        if journal is None or eid not in journal:
            if journal is not None and len(journal) >= MAX_KEY_EFFECTS:
                full = error(
                    "QUOTA_EXCEEDED",
                    f"key {key!r} already records {MAX_KEY_EFFECTS} effects",
                    quota=MAX_KEY_EFFECTS,
                    setting="max_key_effects",
                )
            elif self.rows >= MAX_LEASE_EFFECTS:
                full = error(
                    "QUOTA_EXCEEDED",
                    f"the cluster already records {MAX_LEASE_EFFECTS} lease effects",
                    quota=MAX_LEASE_EFFECTS,
                    setting="max_lease_effects",
                )
        if journal is None:
            if full is not None:
                return full
            journal = self.journals[key] = {}
        before = len(journal)
        result = begin_in(journal, key, token, 0, eid, entry.get("ikey"), full)
        self.rows += len(journal) - before
        result.pop("prior_attempt", None)  # a lease has no attempt number
        return result

    def commit(self, key: str, token: int, entry: dict[str, Any]) -> Result:
        """Commit ``entry["effect"]`` for the key's current lease (``token``), which
        must be the holder that began it (or took it over)."""
        return commit_in(self.journals.get(key, {}), f"key {key!r}", "lease", token, entry)

    def ended(self, key: str, now: int) -> None:
        """A lease on ``key`` ended at log time ``now`` and the key has no other
        holder: its journal (if any) is dropped one retention period later."""
        if key in self.journals:
            at = now + LEASE_EFFECT_RETENTION_MS
            self.idle[key] = at
            heapq.heappush(self._drops, (at, key))

    def advance(self, now: int, held: Callable[[str], bool]) -> None:
        """Drop the journals due at log time ``now`` whose key is not held (a held one
        is kept: ``ended`` schedules it again when that lease ends)."""
        drops = self._drops
        while drops and drops[0][0] <= now:
            at, key = heapq.heappop(drops)
            if self.idle.get(key) != at:
                continue  # stale: rescheduled since
            del self.idle[key]
            if not held(key):
                self.rows -= len(self.journals.pop(key, {}))
        # Stale items (a key that ended many leases) accumulate; rebuild when they
        # dominate, so the heap stays within a constant factor of the idle journals.
        if len(drops) > 64 and len(drops) > 4 * len(self.idle):
            self._rebuild()

    def _rebuild(self) -> None:
        self._drops = [(at, key) for key, at in self.idle.items()]
        heapq.heapify(self._drops)

    def view(self, key: str) -> list[dict[str, Any]]:
        """The journal of ``key`` as reads and tests show it."""
        return [
            {"effect": r[0], "state": r[1], "token": r[2], "key": r[4], "result": r[5]}
            for r in self.journals.get(key, {}).values()
        ]

    def __bool__(self) -> bool:
        return bool(self.journals)

    def to_plain(self) -> dict[str, Any]:
        return {
            "journals": [
                [key, [list(row) for row in journal.values()]]
                for key, journal in self.journals.items()
            ],
            "idle": [[key, at] for key, at in self.idle.items()],
        }

    @classmethod
    def from_plain(cls, data: Any) -> LeaseEffects:
        out = cls()
        if not isinstance(data, dict):
            return out
        for key, rows in data.get("journals", ()):
            out.journals[key] = {row[0]: list(row) for row in rows}
            out.rows += len(rows)
        for key, at in data.get("idle", ()):
            out.idle[key] = at
        out._rebuild()
        return out
