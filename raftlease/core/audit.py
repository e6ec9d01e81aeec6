"""The audit trail: who owned what, replicated with the state (docs/audit.md).

Every ownership change the state machine makes is one record: a lease's grant, renewal
written to the log, release, expiry, transfer, revocation and proclamation, and a
task's put, claim, completion, failure, retry, death and purge. A record is the list
``[seq, log time, type, key, token, owner, holder principal, by, revision]``: ``owner``
is the holder's label (a task's worker), ``holder principal`` the authenticated
principal the lease belongs to, ``by`` the principal whose request made the change
("" for the leader's own entries: expiry, ticks). Same entries, same records on every
replica; the snapshot carries them.

Hash chain: ``head = sha256(head + encode(record))`` over every record ever made, from
32 zero bytes; ``encode`` joins the record's fields with ``|``, an integer in decimal,
a string as ``<length>:<text>`` (length in characters), and encodes it as UTF-8 (about
2 microseconds a record, a third less than JSON). Retention: the newest
``MAX_AUDIT_RECORDS`` are kept; dropping the oldest folds it into ``base`` (the chain
value just before the oldest record kept), so the kept records still verify from
``base`` to ``head``, and ``seq`` numbers never repeat.

Pure: hashlib only (no clock, no I/O, no randomness).
"""

from __future__ import annotations

import hashlib
from collections import deque
from typing import Any

from ..limits import MAX_AUDIT_RECORDS

#: Refusals the state machine decides that go to the refusal ring (``LeaseStore.
#: audit_refusals``, docs/audit.md "Refusals"): someone acted on what was not theirs
#: (``HOLDER_KEY_MISMATCH``: a renewal or heartbeat that would have a certificate bind a
#: key other than the one bound at the grant).
REFUSAL_CODES = frozenset(
    {"NOT_OWNER", "STALE_ATTEMPT", "PERMISSION_DENIED", "HOLDER_KEY_MISMATCH"}
)

ZERO = "00" * 32


def encode(record: list[Any]) -> bytes:
    """The bytes a record contributes to the chain (module docstring)."""
    return "|".join([f"{len(x)}:{x}" if isinstance(x, str) else str(x) for x in record]).encode(
        "utf-8", "surrogatepass"
    )


def chain(previous: str, record: list[Any]) -> str:
    """The chain value after ``record`` (hex)."""
    return hashlib.sha256(bytes.fromhex(previous) + encode(record)).hexdigest()


def _step(previous: bytes, record: list[Any]) -> bytes:
    return hashlib.sha256(previous + encode(record)).digest()


def verify_chain(base: str, records: list[list[Any]], head: str) -> int | None:
    """The index of the first record whose chain breaks (or ``len(records)`` when
    only ``head`` differs), None when ``base`` through ``records`` gives ``head``."""
    value = base
    for index, record in enumerate(records):
        if index and record[0] != records[index - 1][0] + 1:
            return index  # a record missing (sequence numbers are consecutive)
        value = chain(value, record)
    return None if value == head else len(records)


class AuditTrail:
    """The kept records and their chain values, the chain's ``base`` and ``head``,
    and the next ``seq``. ``cap``: how many records are kept (the ownership trail's
    ``MAX_AUDIT_RECORDS``, the refusal ring's ``MAX_AUDIT_REFUSALS``)."""

    __slots__ = ("_base", "_hashes", "cap", "records", "seq")

    def __init__(self, cap: int | None = None) -> None:
        #: None: ``MAX_AUDIT_RECORDS`` as the module holds it at each add.
        self.cap = cap
        self.records: deque[list[Any]] = deque()
        #: The chain value after each kept record (so trimming costs no hash).
        self._hashes: deque[bytes] = deque()
        self._base = bytes(32)
        self.seq = 1

    @property
    def base(self) -> str:
        return self._base.hex()

    @property
    def head(self) -> str:
        return self._hashes[-1].hex() if self._hashes else self._base.hex()

    def add(
        self,
        now: int,
        kind: str,
        key: str,
        token: int,
        owner: str,
        principal: str,
        by: str,
        revision: int,
    ) -> None:
        record = [self.seq, now, kind, key, token, owner, principal, by, revision]
        self.seq += 1
        self._hashes.append(_step(self._hashes[-1] if self._hashes else self._base, record))
        self.records.append(record)
        if len(self.records) > (MAX_AUDIT_RECORDS if self.cap is None else self.cap):
            self.records.popleft()
            self._base = self._hashes.popleft()

    def select(
        self,
        key: str | None = None,
        principal: str | None = None,
        since: int = 0,
        limit: int = 1000,
    ) -> list[list[Any]]:
        """The kept records with ``seq >= since`` (oldest first), for ``key`` and
        involving ``principal`` (as holder or actor) when given, at most ``limit``."""
        # A copy first: a read on another thread while the apply thread appends.
        return self.filter(list(self.records), key, principal, since, limit)

    @staticmethod
    def filter(
        records: list[list[Any]],
        key: str | None = None,
        principal: str | None = None,
        since: int = 0,
        limit: int = 1000,
    ) -> list[list[Any]]:
        """``select`` over a list of records."""
        out: list[list[Any]] = []
        for record in records:
            if record[0] < since or (key is not None and record[3] != key):
                continue
            if principal is not None and principal not in (record[6], record[7]):
                continue
            out.append(list(record))
            if len(out) >= limit:
                break
        return out

    def to_plain(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "head": self.head,
            "seq": self.seq,
            "records": [list(r) for r in self.records],
        }

    @classmethod
    def from_plain(cls, data: Any, cap: int | None = None) -> AuditTrail:
        """A trail from ``to_plain`` output (None or empty: a new trail). The chain
        values are recomputed from ``base``; the stored ``head`` is not trusted."""
        trail = cls(cap)
        if data:
            trail._base = bytes.fromhex(data["base"])
            trail.seq = data["seq"]
            value = trail._base
            for row in data["records"]:
                # The unpacked row itself, not a copy (records are never changed):
                # a copy of each beside the snapshot's rows added ~2 MiB to a
                # restart's peak with a full trail.
                record = row if type(row) is list else list(row)
                value = _step(value, record)
                trail.records.append(record)
                trail._hashes.append(value)
        return trail
