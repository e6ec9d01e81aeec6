"""The dedup table: idempotent retries of mutating requests (Raft dissertation §6.3).

Every mutating entry carries ``(cid, seq, ack)``: the client id, the request's sequence
number and the smallest sequence number the client still waits for. The table keeps,
per client id, the results of requests the client has not acknowledged (``seq >=
ack``), so a retry of one is answered from here and never applied twice. Pure: log
time comes from the caller.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

from .records import ClientRecord, Result, error

#: A client id with no request for this long (log time) is forgotten.
CLIENT_IDLE_MS = 10 * 60 * 1000
#: Most unacknowledged results kept per client id.
MAX_PENDING_PER_CLIENT = 4096


#: Fields of an entry that the leader adds or draws (or that legitimately differ
#: between a request and its retry): left out of the fingerprint.
#: ``waiters_total``, ``max_completed``, ``tasks_quota``, ``queues_quota`` and ``aging``
#: are node config, not the client's: a retry after a config change is still the same
#: request. ``gate_budget`` and ``gate_cost`` come from the auth file, likewise.
_STAMPED = frozenset(
    {
        "now",
        "term",
        "ack",
        "durable",
        "seed",
        "fv",
        "waiters_total",
        "max_completed",
        "tasks_quota",
        "queues_quota",
        "aging",
        "gate_budget",
        "gate_cost",
    }
)
_DRAWN = {
    "acquire": "lid",
    "acquire_many": "lid",
    "transfer": "new_lid",
    "session_open": "sid",
    "task_put": "tid",
    "task_claim": "aid",
    "budget_spend": "rid",
    "budget_reserve": "rid",
}


def fingerprint(op: str, entry: dict[str, Any]) -> str:
    """A digest of what the client asked for in ``entry``: the same for a request and
    each of its retries, different for any other request. Deterministic (sorted
    fields, ``repr`` of plain values, BLAKE2b)."""
    drawn = _DRAWN.get(op)
    fields = sorted((k, v) for k, v in entry.items() if k not in _STAMPED and k != drawn)
    return hashlib.blake2b(repr(fields).encode(), digest_size=16).hexdigest()


#: Values that cannot change after the entry is applied (no container the state
#: machine could keep and change later): a request made of them alone may be kept and
#: digested later with the same result (``remember``).
_SCALARS = (str, int, float, bool, type(None))


def remember(record: ClientRecord, seq: int, op: str, entry: dict[str, Any]) -> None:
    """Keep what ``fingerprint_of(record, seq)`` needs for the request ``entry``
    answered as ``seq``. Digesting costs more than applying an acquire, and nearly
    every answer is acknowledged (and dropped) without ever being compared, so a
    request of plain scalars is kept as it is and digested only when asked; any other
    is digested now, as its containers might be shared with state that changes later.
    Either way every node gets the same digest, whenever it asks (snapshots differ in
    time between nodes)."""
    if all(type(v) in _SCALARS for v in entry.values()):
        # A copy of the fields the digest reads: smaller, and the caller's dict may
        # be reused.
        drawn = _DRAWN.get(op)
        kept = {k: v for k, v in entry.items() if k not in _STAMPED and k != drawn}
        record.fingerprints[seq] = (op, kept)
    else:
        record.fingerprints[seq] = fingerprint(op, entry)


def fingerprint_of(record: ClientRecord, seq: int) -> str | None:
    """The fingerprint of the request ``record`` answered as ``seq``; None if it
    has none (an answer kept by a layout before fingerprints)."""
    known = record.fingerprints.get(seq)
    if isinstance(known, tuple):
        known = record.fingerprints[seq] = fingerprint(*known)
    return known


class ClientTable(OrderedDict[str, ClientRecord]):
    """Client id -> its record, ordered by last request (oldest first), so idle
    clients are evicted in order."""

    def answered(self, cid: str, seq: int) -> bool:
        """Does the table hold the answer to request ``seq`` of ``cid``?"""
        record = self.get(cid)
        return record is not None and seq in record.results

    def admit(self, cid: str, seq: int, ack: int, now: int) -> ClientRecord | Result:
        """Account a mutating request at log time ``now``: the client's record (to
        look the answer up in, or store it in), or a refusal that is the answer."""
        record = self.get(cid)
        if record is None:
            if ack > 1:
                return error(
                    "SESSION_EXPIRED",
                    "client id is unknown (evicted after inactivity); request not applied",
                )
            record = ClientRecord(last_seen=now, results={})
            self[cid] = record
        else:
            record.last_seen = now
            self.move_to_end(cid)
        if ack > record.acked:
            record.acked = ack
            for done in [s for s in record.results if s < ack]:
                del record.results[done]
                record.fingerprints.pop(done, None)
        if seq < record.acked:
            return error(
                "BAD_REQUEST",
                f"seq {seq} was already acknowledged by the client (ack {record.acked}); "
                "a late duplicate is never applied",
            )
        if seq not in record.results and len(record.results) >= MAX_PENDING_PER_CLIENT:
            return error(
                "TOO_MANY_PENDING",
                f"client has {len(record.results)} unacknowledged requests",
            )
        return record

    def touch(self, cid: str, now: int) -> None:
        """``cid`` was heard from at log time ``now`` outside the log (a keep-alive
        answered from the leader's memory): keep it from idle eviction."""
        record = self.get(cid)
        if record is not None and now > record.last_seen:
            record.last_seen = now
            self.move_to_end(cid)

    def evict_idle(self, now: int) -> None:
        """Forget every client whose last request is ``CLIENT_IDLE_MS`` before ``now``."""
        while self:
            cid, record = next(iter(self.items()))
            if record.last_seen + CLIENT_IDLE_MS > now:
                break
            del self[cid]

    def to_plain(self) -> list[Any]:
        return [
            [
                cid,
                r.last_seen,
                r.acked,
                [[seq, res, fingerprint_of(r, seq) or ""] for seq, res in r.results.items()],
            ]
            for cid, r in self.items()
        ]

    @classmethod
    def from_plain(cls, rows: list[Any]) -> ClientTable:
        """Rows of ``to_plain``; results of layouts before fingerprints are pairs
        (their answers are then returned to any retry, as those layouts did)."""
        table = cls()
        for cid, last_seen, acked, results in rows:
            answers = {item[0]: item[1] for item in results}
            prints = {item[0]: item[2] for item in results if len(item) > 2 and item[2]}
            table[cid] = ClientRecord(last_seen, answers, acked, prints)
        return table
