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


@dataclass(slots=True)
class LeaseRecord:
    """One live lease. ``expires_at`` and ``granted_at`` are log-time milliseconds.

    ``units`` is how much of the key's capacity the lease takes (1 for a plain lock);
    ``value`` is free text the holder publishes (an elected leader's address);
    ``session`` is the lease session it is attached to ("" for none): an attached
    lease expires with its session and is renewed by the session's keep-alive;
    ``principal`` is the authenticated client that took it ("" without auth): only it
    may renew, release, transfer or proclaim the lease. ``slots`` are the unit indices
    it holds on a shared key of capacity 2..``MAX_INDEXED_CAPACITY`` (the lowest free
    ones at grant time, kept across a transfer; empty otherwise)."""

    key: str
    lease_id: str
    owner: str
    token: int
    ttl_ms: int
    granted_at: int
    expires_at: int
    units: int = 1
    value: str = ""
    session: str = ""
    principal: str = ""
    slots: tuple[int, ...] = ()
    #: The lease certificate holder key named at the grant (32 raw bytes of an
    #: Ed25519 public key; None when the acquire named none): a renewal may ask for a
    #: certificate only for this key (docs/certificates.md). Not in the row below:
    #: the snapshot keeps it in ``holder_keys`` (core/snapshot.py), so rows of every
    #: layout load alike. One slot, None by default: no cost per lease without one.
    holder: bytes | None = None

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
