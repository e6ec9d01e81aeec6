"""Snapshots: the whole state as plain msgpack-able data, and back.

The layout is versioned (``SNAPSHOT_VERSION``); older layouts this code knows are
upgraded on load, any other is refused. Restoring a snapshot and replaying the rest of
the log gives exactly the state that never snapshotted (tests/unit/test_core_shared.py).
"""

from __future__ import annotations

import heapq
from typing import Any

from ..limits import MAX_AUDIT_REFUSALS, TOKEN_RESERVE_STEP
from .audit import AuditTrail
from .budget import Budgets
from .certkeys import CertKeys
from .deadlock import Refusals
from .dedup import ClientTable
from .lease_effects import LeaseEffects
from .preempt import Preemption
from .progress import LeaseProgress
from .queue import TaskQueues
from .records import KeyShares, LeaseRecord, LeaseSession, Share, Waiter
from .state import StoreState

#: Bump when the snapshot layout changes; ``restore`` refuses other versions.
#: 5: task queues (``tasks``, core/queue.py); a layout 4 snapshot has none.
#: 6: shared budgets (``budgets``, core/budget.py); a task's rank (priority aging) ends
#:    its row, a queue's tallies end its row, and the queues' ``totals``. A layout 5
#:    snapshot loads with no budgets, strict ranks and zero tallies.
#: 7: fair shares (docs/queues.md, "Fair shares"): a task's fairness key ends its row,
#:    a queue's virtual time and its tenants' ``[name, weight, pass]`` end its row. A
#:    layout 6 (or older) snapshot loads with every task in the default tenant "",
#:    weight 1, pass 0: the order it had.
#: 8: fair shares on wait queues (docs/design.md §4d): a waiter's fairness key ends its
#:    row (after its principal, "" if none), and ``fair`` lists each key's
#:    ``[key, virtual time, [[tenant, weight, pass], ...]]``. A layout 7 (or older)
#:    snapshot loads with no fair shares: every queue in rank order, as it was.
#: 9: deadlock detection (docs/design.md §4e): ``deadlock_refusals`` lists the queued
#:    acquires refused DEADLOCK after they queued, ``[lease id, key, deadline,
#:    outcome]``, kept for their long-polls; a waiter of a waiting set of keys ends
#:    its row with the set's id (after its fairness key); cooperative preemption
#:    (§4f): ``preempt`` holds the grant priorities (``[lease id, priority]``, not 0)
#:    and the yield requests (``[lease id, deadline, by]``). A layout 8 (or older)
#:    snapshot loads with none of them.
#:    Also task checkpoints and effect journals (docs/queues.md, "Checkpoints", "Effects"):
#:    a task's row ends with its latest checkpoint (base64 text or nil), the number of
#:    the attempt that wrote it, its effect rows ``[effect id, state, token,
#:    attempt, key, result]``, and its dependencies ``after`` and ``waiting_on``
#:    (docs/queues.md, "Dependencies"). A layout 8 (or older) row loads with none.
#:    Also lease certificate signing keys (``cert_keys``, core/certkeys.py; issue 39) and
#:    the audit trail (``audit``, core/audit.py). A layout 8 (or older) snapshot loads
#:    with no keys (the next certificate request makes the first) and an empty trail.
#:    Also progress-aware plain leases (docs/design.md §4g): ``lease_progress`` holds
#:    ``leases``, ``[lease id, progress_timeout ms, progress_at, progress or nil]``, and
#:    ``pending``, ``[queued acquire's lease id, progress_timeout ms]``; a snapshot
#:    without it loads with none.
#:    Also the refusal ring (``audit_refusals``, docs/audit.md "Refusals"), written only
#:    once a refusal was recorded; a snapshot without it loads with an empty ring.
#:    Also the effect journals of lease keys (``lease_effects``, core/lease_effects.py,
#:    docs/design.md §4h): ``journals``, ``[key, [[effect id, state, token, 0,
#:    idempotency key, result], ...]]``, and ``idle``, ``[key, drop time]``; written
#:    only once a journal exists; a snapshot without it loads with none.

#:    Also lease certificate holder keys bound at the grant (issue 39, the security
#:    fix: docs/certificates.md): ``holder_keys`` lists ``[lease id, 64 hex]`` for
#:    every live lease and queued acquire whose acquire named one, written only when
#:    there is one; a snapshot without it loads with no key bound (no certificate
#:    until the lease is acquired anew with a key). ``attempt_holder_keys`` does the
#:    same for task attempts and waiting claims (``[attempt id, 64 hex]``).
SNAPSHOT_VERSION = 9
#: The log entry format this build writes and applies. An entry without ``fv`` is
#: format 1 (every entry before the field existed), so this build writes none; a
#: build that changes what an entry means writes a higher ``fv``, and nodes that
#: do not know it stop instead of applying it differently (replication/replica.py,
#: docs/membership.md "Rolling upgrades").
#: 2: leaders answer keep-alives from memory and log them later (``extend``); the
#: first entry of a new term extends every live lease and session by its TTL.
#: 3: a task put carries the aging step (``aging``), which orders claims (docs/queues.md,
#: "Order"); a member that ignored it would hand out other tasks than the rest.
#: 4: a task put may carry a fairness key and a weight (``fairness_key``, ``weight``),
#: which decide between tenants (docs/queues.md, "Fair shares"); a member that ignored
#: them would hand out other tasks than the rest.
#: 5: an acquire may carry a fairness key and a weight (``fairness_key``, ``weight``),
#: which decide between tenants waiting on a key (docs/design.md §4d); a member that
#: ignored them would grant other waiters than the rest.
#: 6: deadlock detection (docs/design.md §4e): an acquire that would close a cycle of
#: waits is refused DEADLOCK, and a grant that closes one refuses the cycle's youngest
#: waiter; a member that ignored it would keep waiters the rest refused.
#: Also: a task heartbeat may carry a checkpoint (``checkpoint``), handed to the next
#: attempt's claim (docs/queues.md, "Checkpoints"), and ``task_effect_begin`` /
#: ``task_effect_commit`` entries keep a task's effect journal ("Effects"), and a put
#: may carry ``after`` ("Dependencies"); a member that ignored them would answer
#: claims and effects differently from the rest.
#: Also: the leader's ``certkey`` entry stores a lease certificate signing key
#: (core/certkeys.py; issue 39); a member that did not know it would refuse it and
#: sign with another key than the rest.
#: Also: an acquire may carry ``progress_timeout`` and a renew ``progress`` (progress-
#: aware plain leases, docs/design.md §4g); a member that ignored them would end leases
#: (``stalled``) at other times than the rest.
#: Also: a mutation the state machine refuses NOT_OWNER, STALE_ATTEMPT or
#: PERMISSION_DENIED adds a record to the audit refusal ring (docs/audit.md
#: "Refusals"); a member that did not would hold another ring than the rest.
#: Also: an acquire attached to a session may carry ``progress_timeout``, and a renew
#: of such an attached lease ``progress``; session keep-alives then stop at its progress
#: deadline (docs/design.md §4g); a member that refused them would hold other leases.
#: Also: ``lease_effect_begin`` / ``lease_effect_commit`` entries keep a lease key's
#: effect journal (docs/design.md §4h); a member that did not know them would refuse
#: them and answer effects differently from the rest.

#: Also: an acquire may carry ``holder_key``, bound to the lease (or its queued
#: acquire) at the grant, and a renew naming another one is refused
#: HOLDER_KEY_MISMATCH (issue 39, docs/certificates.md); a member that ignored it
#: would renew leases the rest refused. A transfer may carry ``holder_key`` too (the
#: new holder's, bound to the new lease), and an acquire_many (bound to every key's
#: lease of the set, also when a waiting set is granted), a task claim (bound to its
#: attempt; a heartbeat naming another is refused HOLDER_KEY_MISMATCH).
ENTRY_FORMAT = 6


def entry_format(entry: Any) -> int | None:
    """The format version an entry declares (1 when it declares none); None when
    ``fv`` is not a positive integer."""
    fv = entry.get("fv", 1) if isinstance(entry, dict) else 1
    if isinstance(fv, bool) or not isinstance(fv, int) or fv < 1:
        return None
    return fv


def to_plain(store: StoreState) -> dict[str, Any]:
    """Plain data (msgpack-able) describing the whole state."""
    out: dict[str, Any] = {
        "v": SNAPSHOT_VERSION,
        "now": store.now,
        "term": store.term,
        "revision": store.revision,
        "ceiling": store.ceiling,
        "applied": store.applied,
        "expired_total": store.expired_total,
        "capacity": _capacity_rows(store),
        "leases": [lease.to_plain() for lease in store.leases.values()],
        "lease_sessions": [s.to_plain() for s in store.lease_sessions.values()],
        "queue_order": store.queue_order,
        "waiters": [w.to_plain() for q in store.queues.values() for w in q],
        # "sessions" is the dedup table's name in the layout (the client records).
        "sessions": store.clients.to_plain(),
        "tasks": store.tasks.to_plain(),
        "budgets": store.budgets.to_plain(),
        "fair": [
            [key, shares.vtime, [[n, t.weight, t.vpass] for n, t in sorted(shares.tenants.items())]]
            for key, shares in sorted(store.fair.items())
        ],
        "deadlock_refusals": store.deadlock_refusals.to_plain(),
        "preempt": store.preempt.to_plain(),
        "cert_keys": store.cert_keys.to_plain(),
        "audit": store.audit.to_plain(),
    }
    if store.progress:  # written only when used: layout 9 without it loads alike
        out["lease_progress"] = store.progress.to_plain()
    if store.lease_effects:  # written only when used: layout 9 without it loads alike
        out["lease_effects"] = store.lease_effects.to_plain()

    holder_keys = [
        [lid, record.holder.hex()]
        for table in (store.leases, store.waiting)
        for lid, record in table.items()
        if record.holder is not None
    ]
    if holder_keys:  # written only when used: layout 9 without it loads alike
        out["holder_keys"] = holder_keys
    attempt_keys = [
        [aid, record.holder.hex()]
        for table in (store.tasks.attempts, store.tasks.claims)
        for aid, record in table.items()
        if record.holder is not None
    ]
    if attempt_keys:  # likewise
        out["attempt_holder_keys"] = attempt_keys
    if store.audit_refusals.seq > 1:
        # Written once a refusal was recorded, so a store that never refused keeps the
        # layout 9 dict it had (and its golden tests).
        out["audit_refusals"] = store.audit_refusals.to_plain()
    return out


def _capacity_rows(store: StoreState) -> list[list[Any]]:
    """Every key with holders or waiters and its capacity, sorted by key: the rows of
    capacity 1 too, though the store keeps no entry for them, because a build before
    that reads a missing row as "no capacity fixed" (it would let a held lock be
    shared: same layout, same meaning). Sorted, so a replica restored from a snapshot
    writes the same bytes as the one that lived through the history."""
    keys = set(store.holders).union(store.queues, store.capacity)
    return [[key, store.capacity_of(key)] for key in sorted(keys)]


def restore(store: StoreState, data: dict[str, Any]) -> None:
    """Fill a fresh ``store`` from ``to_plain`` output (this layout version or versions
    2 to 8, which it upgrades). Raises ``ValueError`` on any other version."""
    version = data.get("v")
    if isinstance(version, int) and not isinstance(version, bool) and version > SNAPSHOT_VERSION:
        raise ValueError(
            f"snapshot version {version} is newer than this build understands "
            f"(up to {SNAPSHOT_VERSION}): it was written by a newer raftlease; upgrade this node"
        )
    if version not in (2, 3, 4, 5, 6, 7, 8, SNAPSHOT_VERSION):
        raise ValueError(
            f"snapshot version {version!r} is not 2, 3, 4, 5, 6, 7, 8 or {SNAPSHOT_VERSION}"
        )
    if "ceiling" not in data:
        # Layouts 2 and 3 had no token ceiling: reserve one step from the revision
        # (the next new term jumps past it anyway).
        data = {**data, "ceiling": data["revision"] + TOKEN_RESERVE_STEP}
    if version == 2:
        # Before shared keys and lease sessions: every key had capacity 1, leases
        # and waiters had no units, value or session (their fields default).
        keys = [plain[0] for plain in data["leases"]] + [w[0] for w in data["waiters"]]
        data = {**data, "capacity": [[key, 1] for key in dict.fromkeys(keys)]}
        data["lease_sessions"] = []
    store.now = data["now"]
    store.term = data["term"]
    store.revision = data["revision"]
    store.ceiling = data["ceiling"]
    store.applied = data["applied"]
    store.expired_total = data["expired_total"]
    for row in data["lease_sessions"]:
        sid, owner, ttl_ms, expires_at = row[:4]
        principal = row[4] if len(row) > 4 else ""
        store.lease_sessions[sid] = LeaseSession(sid, owner, ttl_ms, expires_at, {}, {}, principal)
    store._session_deadlines = [(s.expires_at, sid) for sid, s in store.lease_sessions.items()]
    heapq.heapify(store._session_deadlines)
    # Capacity 1 is the default, kept by no entry (layouts before this build and
    # layout 2's upgrade list it).
    store.capacity = {key: cap for key, cap in data["capacity"] if cap != 1}
    store.used = {key: 0 for key in store.capacity}
    unindexed: list[LeaseRecord] = []
    # Leases granted in one millisecond hold one ``granted_at`` int on the node that
    # granted them (log time moves only forward), and ``expires_at`` ints are shared
    # alike (``StoreState.expiry``); rows come in grant order, so the last row's
    # objects serve the next one (~64 B a lease otherwise, 6 MiB for 100,000).
    granted: int | None = None
    expires: int | None = None
    for plain in data["leases"]:
        lease = LeaseRecord(*plain)
        # The objects a live grant would share (``StoreState.share``): a restored
        # node holds its leases in as little memory as the one that granted them.
        lease.owner = store.share(lease.owner)
        lease.principal = store.share(lease.principal)
        lease.ttl_ms = store.share(lease.ttl_ms)
        if granted is not None and lease.granted_at == granted:
            lease.granted_at = granted
        else:
            granted = lease.granted_at
        if expires is not None and lease.expires_at == expires:
            lease.expires_at = expires
        else:
            expires = lease.expires_at
        if len(plain) > 11:
            lease.slots = tuple(plain[11])
        else:
            unindexed.append(lease)
        store.leases[lease.lease_id] = lease
        store._add_holder(lease)
        if lease.session:
            store.lease_sessions[lease.session].leases[lease.lease_id] = None
    # A snapshot from before unit indices: its pool leases get the lowest free ones,
    # oldest grant (lowest token) first, so every replica assigns the same.
    for lease in sorted(unindexed, key=lambda lease: lease.token):
        lease.slots = store.free_slots(lease.key, lease.units)
    store.clients = ClientTable.from_plain(data["sessions"])
    store.queue_order = data["queue_order"]
    for plain in data["waiters"]:
        waiter = Waiter(*plain)
        store.queues.setdefault(waiter.key, []).append(waiter)
        store.waiting[waiter.lease_id] = waiter
        store.wait_index.add(waiter)
        if waiter.group:  # one key of a waiting set (layout 9)
            store.waiting_sets[waiter.group] = store.waiting_sets.get(waiter.group, 0) + 1
        if waiter.session:
            store.lease_sessions[waiter.session].waiters[waiter.lease_id] = None
    for session in store.lease_sessions.values():
        # Attach order (= arrival order): ending a session dequeues in this order.
        ordered = sorted(session.waiters, key=lambda lid: store.waiting[lid].order)
        session.waiters = dict.fromkeys(ordered)
    store._wait_deadlines = [(w.deadline, w.lease_id) for w in store.waiting.values()]
    heapq.heapify(store._wait_deadlines)
    # Walked, not listed: two lists of every lease's principal would add ~1.6 MiB to
    # the peak of a restart with 100,000 leases.
    for held in (store.leases, store.waiting):
        for record in held.values():
            store._count(store.held_by, record.principal, 1)
    for waiter in store.waiting.values():
        store._count(store.waiting_by, waiter.principal, 1)
    for session in store.lease_sessions.values():
        store._count(store.sessions_by, session.principal, 1)
    store._rebuild_deadlines()
    if "tasks" in data:  # layouts before 5 had no task queues
        store.tasks = TaskQueues.from_plain(data["tasks"])
    if "budgets" in data:  # layouts before 6 had no budgets
        store.budgets = Budgets.from_plain(data["budgets"])
    for key, vtime, tenants in data.get("fair", ()):  # layouts before 8 had none
        shares = store.fair[key] = KeyShares(vtime)
        for name, weight, vpass in tenants:
            shares.tenants[name] = Share(weight, vpass)
    # Layouts before 9 had no deadlock detection, so no refusals.
    store.deadlock_refusals = Refusals.from_plain(data.get("deadlock_refusals", ()))
    # Layouts before 9 had no grant priorities and no yield requests.
    store.preempt = Preemption.from_plain(data.get("preempt", {}))
    # Layouts before 9 had no certificate signing keys.
    store.cert_keys = CertKeys.from_plain(data.get("cert_keys", ()))
    # Layouts before 9 had no audit trail: it starts empty from the zero chain value.
    store.audit = AuditTrail.from_plain(data.get("audit"))
    # Layouts before 9 (and 9 before progress-aware leases) had none.
    store.progress = LeaseProgress.from_plain(data.get("lease_progress", {}))
    # Layouts before 9 (and 9 before lease effect journals) had none.
    store.lease_effects = LeaseEffects.from_plain(data.get("lease_effects", {}))
    # No refusal ring before it (or none recorded yet): it starts empty.
    store.audit_refusals = AuditTrail.from_plain(data.get("audit_refusals"), MAX_AUDIT_REFUSALS)
    # Holder keys bound at the grant (absent before the security fix: none bound).
    for lid, hex_key in data.get("holder_keys", ()):
        bound = store.leases.get(lid) or store.waiting.get(lid)
        if bound is not None:
            bound.holder = bytes.fromhex(hex_key)
    for aid, hex_key in data.get("attempt_holder_keys", ()):  # task claims' keys
        claimed = store.tasks.attempts.get(aid) or store.tasks.claims.get(aid)
        if claimed is not None:
            claimed.holder = bytes.fromhex(hex_key)
    for waiter in store.waiting.values():  # how many each tenant has waiting
        fair = store.fair.get(waiter.key)
        if fair is not None:
            fair.tenants.setdefault(waiter.tenant, Share()).waiting += 1


def for_new_cluster(data: dict[str, Any], token_jump: int) -> dict[str, Any]:
    """``to_plain`` output made the first state of a NEW cluster (a restore from a
    backup; docs/disaster-recovery.md). Pure: returns a new map, ``data`` unchanged.

    * Fencing tokens: the new cluster's first entry (term 1 > the term here, 0) jumps
      the revision to the ceiling, which is set ``token_jump`` above the saved ceiling
      (and above the revision plus the headroom of one request): the old cluster may
      have handed out tokens up to its ceiling, and past it after reserving more,
      after the backup was taken. Every new grant's token is above both.
    * Leases keep their holder, lease id and token; each lease and lease session
      gets its whole TTL again from the saved log time, which the new cluster's first
      leader continues from: it expires one TTL after the new cluster's first entry,
      never earlier than its holder (who could renew only before the old cluster was
      lost) believes it holds. Attached leases follow their session. Task attempts
      likewise get their TTL (or their session's) and a whole progress timeout again.
      Queued acquires and waiting claims keep what was left of their wait.
    """
    if token_jump < TOKEN_RESERVE_STEP:
        raise ValueError(f"token_jump {token_jump} is below one step ({TOKEN_RESERVE_STEP})")
    store = StoreState()
    restore(store, dict(data))  # validates and upgrades the layout; a copy we may change
    now = store.now
    for session in store.lease_sessions.values():
        session.expires_at = now + session.ttl_ms
    for lease in store.leases.values():
        owner = store.lease_sessions.get(lease.session) if lease.session else None
        lease.expires_at = owner.expires_at if owner is not None else now + lease.ttl_ms
    for attempt in store.tasks.attempts.values():
        owner = store.lease_sessions.get(attempt.session) if attempt.session else None
        attempt.expires_at = owner.expires_at if owner is not None else now + attempt.ttl_ms
        attempt.progress_at = max(attempt.progress_at, now)
    floor = max(store.ceiling, store.revision + store.token_headroom())
    # to_plain serializes the records (the heaps are rebuilt when the node loads it).
    return {**to_plain(store), "term": 0, "ceiling": floor + token_jump}
