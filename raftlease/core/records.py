"""The state machine's record types (plain data, snapshotted as lists) and the shape
of a result. Pure: no I/O, no clock, no randomness."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Result = dict[str, Any]

#: Shared keys up to this capacity name the units each lease holds (``slots``: a GPU
#: pool's device indices). Larger ones (read/write locks, big semaphores) do not: a
#: writer would carry a million indices.
MAX_INDEXED_CAPACITY = 1024


#: A lease's rarely set fields, in ``LeaseRecord``'s order: units, value, session,
#: principal, slots, holder.
Extras = tuple[int, str, str, str, tuple[int, ...], "bytes | None"]
#: The extras of a plain lease (every field at its default).
PLAIN_EXTRAS: Extras = (1, "", "", "", (), None)
#: ``_extras`` forgets its tuples when it holds this many: bounded memory whatever
#: the number of distinct extras (the leases keep theirs).
EXTRAS_SHARED_MAX = 4096
_shared_extras: dict[Extras, Extras] = {PLAIN_EXTRAS: PLAIN_EXTRAS}


def _extras(value: Extras) -> Extras:
    """``value``, or an equal tuple an earlier lease holds: an agent's leases (the same
    session, principal and holder key) and every plain lease share one. Immutable, so
    sharing changes nothing a reader sees. Safe from any thread (at worst, under a
    race, two equal tuples are kept)."""
    try:
        found = _shared_extras.get(value)
        if found is not None:
            return found
        if len(_shared_extras) >= EXTRAS_SHARED_MAX:
            _shared_extras.clear()
            _shared_extras[PLAIN_EXTRAS] = PLAIN_EXTRAS
        _shared_extras[value] = value
    except TypeError:  # unhashable (a list given for slots): kept as it is
        pass
    return value


class LeaseRecord:
    """One live lease. ``expires_at`` and ``granted_at`` are log-time milliseconds.

    ``units`` is how much of the key's capacity the lease takes (1 for a plain lock);
    ``value`` is free text the holder publishes (an elected leader's address);
    ``session`` is the lease session it is attached to ("" for none): an attached
    lease expires with its session and is renewed by the session's keep-alive;
    ``principal`` is the authenticated client that took it ("" without auth): only it
    may renew, release, transfer or proclaim the lease. ``slots`` are the unit indices
    it holds on a shared key of capacity 2..``MAX_INDEXED_CAPACITY`` (the lowest free
    ones at grant time, kept across a transfer; empty otherwise). ``holder``: the
    lease certificate holder key named at the grant (32 raw bytes of an Ed25519
    public key; None when the acquire named none): a renewal may ask for a
    certificate only for this key (docs/certificates.md). Not in the row below: the
    snapshot keeps it in ``holder_keys`` (core/snapshot.py), so rows of every layout
    load alike.

    Memory: the seven fields every lease has are slots of their own; the six others
    (``Extras``) live in one tuple shared by every lease with the same ones
    (``_extras``: all plain leases share one, an agent's leases another), read and
    written through properties. 96 B a lease instead of 136 as a 13-slot dataclass
    (100,000 leases: 3.8 MiB). Compares equal, and reprs, like the dataclass it was."""

    __slots__ = ("_x", "expires_at", "granted_at", "key", "lease_id", "owner", "token", "ttl_ms")
    #: The fields, in the constructor's (and ``to_plain``'s) order.
    FIELDS = (
        "key",
        "lease_id",
        "owner",
        "token",
        "ttl_ms",
        "granted_at",
        "expires_at",
        "units",
        "value",
        "session",
        "principal",
        "slots",
        "holder",
    )

    def __init__(
        self,
        key: str,
        lease_id: str,
        owner: str,
        token: int,
        ttl_ms: int,
        granted_at: int,
        expires_at: int,
        units: int = 1,
        value: str = "",
        session: str = "",
        principal: str = "",
        slots: tuple[int, ...] = (),
        holder: bytes | None = None,
    ) -> None:
        self.key = key
        self.lease_id = lease_id
        self.owner = owner
        self.token = token
        self.ttl_ms = ttl_ms
        self.granted_at = granted_at
        self.expires_at = expires_at
        self._x: Extras = _extras((units, value, session, principal, slots, holder))

    @property
    def units(self) -> int:
        return self._x[0]

    @units.setter
    def units(self, units: int) -> None:
        x = self._x
        self._x = _extras((units, x[1], x[2], x[3], x[4], x[5]))

    @property
    def value(self) -> str:
        return self._x[1]

    @value.setter
    def value(self, value: str) -> None:
        x = self._x
        self._x = _extras((x[0], value, x[2], x[3], x[4], x[5]))

    @property
    def session(self) -> str:
        return self._x[2]

    @session.setter
    def session(self, session: str) -> None:
        x = self._x
        self._x = _extras((x[0], x[1], session, x[3], x[4], x[5]))

    @property
    def principal(self) -> str:
        return self._x[3]

    @principal.setter
    def principal(self, principal: str) -> None:
        x = self._x
        self._x = _extras((x[0], x[1], x[2], principal, x[4], x[5]))

    @property
    def slots(self) -> tuple[int, ...]:
        return self._x[4]

    @slots.setter
    def slots(self, slots: tuple[int, ...]) -> None:
        x = self._x
        self._x = _extras((x[0], x[1], x[2], x[3], slots, x[5]))

    @property
    def holder(self) -> bytes | None:
        return self._x[5]

    @holder.setter
    def holder(self, holder: bytes | None) -> None:
        x = self._x
        self._x = _extras((x[0], x[1], x[2], x[3], x[4], holder))

    def _fields(self) -> tuple[Any, ...]:
        return (
            self.key,
            self.lease_id,
            self.owner,
            self.token,
            self.ttl_ms,
            self.granted_at,
            self.expires_at,
            *self._x,
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, LeaseRecord)
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass was

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={v!r}" for n, v in zip(self.FIELDS, self._fields(), strict=True))
        return f"LeaseRecord({shown})"

    def to_plain(self) -> list[Any]:
        plain = [
            self.key,
            self.lease_id,
            self.owner,
            self.token,
            self.ttl_ms,
            self.granted_at,
            self.expires_at,
            self.units,
            self.value,
            self.session,
        ]
        if self.slots:
            return [*plain, self.principal, list(self.slots)]
        return [*plain, self.principal] if self.principal else plain


@dataclass(slots=True)
class Waiter:
    """A queued acquire: granted, in the same log entry, when it is first in
    ``(-priority, order)`` and its units fit; leaves the queue at ``deadline`` (log
    time) or when its session ends."""

    key: str
    lease_id: str
    owner: str
    ttl_ms: int
    priority: int
    order: int
    deadline: int
    units: int = 1
    value: str = ""
    session: str = ""
    principal: str = ""
    #: Its fairness key (docs/design.md §4d): "" is the default tenant.
    tenant: str = ""
    #: The waiting set of keys (``acquire_many`` with ``wait``) it is one key of: the
    #: set's lease id ("" for a single acquire). Its lease id is ``<group>/<index>``.
    group: str = ""
    #: The holder key its acquire named (as ``LeaseRecord.holder``), bound to the
    #: lease when it is granted from the queue; in ``holder_keys`` in a snapshot.
    holder: bytes | None = None

    def rank(self) -> tuple[int, int]:
        return (-self.priority, self.order)

    def to_plain(self) -> list[Any]:
        plain = [
            self.key,
            self.lease_id,
            self.owner,
            self.ttl_ms,
            self.priority,
            self.order,
            self.deadline,
            self.units,
            self.value,
            self.session,
        ]
        if self.group:  # layout 9: a waiting set's id ends the row (after the tenant)
            return [*plain, self.principal, self.tenant, self.group]
        if self.tenant:  # layout 8: the fairness key ends the row (after the principal)
            return [*plain, self.principal, self.tenant]
        return [*plain, self.principal] if self.principal else plain


@dataclass(slots=True)
class Share:
    """One tenant's standing on one key's wait queue (docs/design.md §4d): its
    weight, its pass (stride scheduling) and how many of its acquires wait."""

    weight: int = 1
    vpass: int = 0
    waiting: int = 0


@dataclass(slots=True)
class KeyShares:
    """The fair-share state of one key's wait queue, kept while the queue has a
    waiter that named a fairness key or a weight: the queue's virtual time and its
    tenants (backlogged ones, and idle ones whose pass is still ahead of it)."""

    vtime: int = 0
    tenants: dict[str, Share] = field(default_factory=dict)


@dataclass(slots=True)
class LeaseSession:
    """A lease session: one keep-alive for any number of attached leases and queued
    acquires. When it expires (or is closed) everything attached is released."""

    session_id: str
    owner: str
    ttl_ms: int
    expires_at: int
    #: Attached live leases and queued acquires, by lease id, in attach order.
    leases: dict[str, None]
    waiters: dict[str, None]
    #: The authenticated client that opened it ("" without auth): only it may keep it
    #: alive, close it or attach to it.
    principal: str = ""

    def to_plain(self) -> list[Any]:
        plain = [self.session_id, self.owner, self.ttl_ms, self.expires_at]
        return [*plain, self.principal] if self.principal else plain


@dataclass(slots=True)
class ClientRecord:
    """What the dedup table keeps for one client id (Raft dissertation §6.3): when it
    was last seen (log time) and the results of its requests not yet acknowledged."""

    last_seen: int
    results: dict[int, Result]
    #: Highest ``ack`` the client has sent: every seq below it was acknowledged, so a
    #: late duplicate of one (a retry overtaken by later requests) is never applied.
    acked: int = 1
    #: seq -> fingerprint of the request answered (``dedup.fingerprint``): a cached
    #: answer is returned only to the same request. Use ``dedup.fingerprint_of``: a
    #: request of plain scalars is kept as ``(op, entry)`` and digested only when
    #: asked (a retry, a snapshot), since nearly every answer is acknowledged unread.
    fingerprints: dict[int, str | tuple[str, dict[str, Any]]] = field(default_factory=dict)


def error(code: str, message: str, **detail: Any) -> Result:
    """A domain outcome that is not a success (see ``raftlease.errors`` for codes)."""
    result: Result = {"ok": False, "code": code, "message": message}
    if detail:
        result["detail"] = detail
    return result


def waiter_refusal(
    entry: dict[str, Any], what: str, mine: int, everyone: int, adding: int = 1
) -> Result | None:
    """QUOTA_EXCEEDED when ``adding`` more waiters of ``what`` (queued acquires,
    waiting claims) would pass the principal's ``wait_quota`` (``mine`` it has now) or
    everyone's ``waiters_total`` (``everyone`` now), both stamped by the leader; None
    when they fit. Checked only when something would wait: a grant needs no slot."""
    principal = entry.get("principal", "")
    wait_quota = entry.get("wait_quota")
    if principal and wait_quota is not None and mine + adding > wait_quota:
        more = "" if adding == 1 else f"; {adding} more would pass it"
        return error(
            "QUOTA_EXCEEDED",
            f"{principal} has {mine} {what}; its quota is {wait_quota} "
            f"(max_waiters_per_principal){more}",
            quota=wait_quota,
        )
    waiters_total = entry.get("waiters_total")
    if waiters_total is not None and everyone + adding > waiters_total:
        return error(
            "QUOTA_EXCEEDED",
            f"{everyone} {what} on this cluster; at most {waiters_total} may be "
            "(max_waiters_total)",
            quota=waiters_total,
        )
    return None
