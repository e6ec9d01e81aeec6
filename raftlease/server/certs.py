"""Lease certificates on the node that answers a grant or renewal (docs/certificates.md).

The state machine stays pure: it only stores the signing keys (core/certkeys.py). Here
the leader draws a new key (``key_entry``) when it needs the first one or the current
one is older than ``CERT_KEY_ROTATION_MS`` of log time, and signs the certificate of
an answer it is about to send (``CertSigner.sign``): Ed25519 signatures are
deterministic, so the answer depends only on the committed key and the answer.

``not_after`` is what the client library trusts its own lease for (ARCHITECTURE §4),
measured on this node: the wall clock read just before the log-time stamp ``L`` of
the leader's log clock, plus ``(expires_at - L) * (1 - clock_drift)``, less one
heartbeat interval. Log time runs no faster than the stamping leader's clock and a
leader change never shortens a lease (docs/design.md), so with a valid leader lease
(no other leader can exist) the cluster cannot grant the key to anyone else before
``not_after`` on this node's wall clock, up to the drift bound. Without a valid
leader lease the answer goes out without a certificate.

Threads: the node's event loop only; nothing here blocks.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..config import NodeConfig
from ..core import Result
from ..core.certkeys import CertKeys
from ..core.records import LeaseRecord
from ..errors import InvalidArgumentError
from ..replication import Replica
from ..verify import certificate_body, public_bytes, sign_certificate
from .log_clock import LogClock

#: The leader makes a new signing key when the current one is this old (log time).
CERT_KEY_ROTATION_MS = 24 * 3600 * 1000

_HEX = frozenset("0123456789abcdef")

#: Operations whose answer carries a certificate when the request names a holder key
#: (a transfer's is the new holder's key, bound to the new lease).
CERTIFIED_OPS = frozenset(
    {
        "acquire",
        "renew",
        "transfer",
        "acquire_many",
        "session_keepalive",
        "task_claim",
        "task_heartbeat",
    }
)
#: Operations whose answer certifies a task attempt (``CertSigner.sign_attempt``).
TASK_CERTIFIED_OPS = frozenset({"task_claim", "task_heartbeat"})
#: Operations whose answer certifies several leases (``CertSigner.sign_each``).
MULTI_CERTIFIED_OPS = frozenset({"acquire_many", "session_keepalive"})
#: Most certificates one answer carries (a lease session may hold 10,000 leases; each
#: certificate is an Ed25519 signature, ~35 us on the event loop): the leases attached
#: beyond it, in attach order, get none from that keep-alive.
MAX_CERTIFICATES_PER_ANSWER = 64


def check_holder_key(value: Any) -> None:
    """Raise ``InvalidArgumentError`` (definite, nothing proposed) unless ``value`` is
    an Ed25519 public key as 64 lowercase hex characters. Every surface's request
    reaches this check (the dispatcher), before anything is proposed."""
    if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX:
        raise InvalidArgumentError(
            "holder_key must be 64 lowercase hex characters (an Ed25519 public key)",
            {"field": "holder_key"},
        )


def key_entry(keys: CertKeys) -> dict[str, Any]:
    """A ``certkey`` entry with a freshly drawn key: randomness is drawn here, on the
    leader, never in the state machine."""
    private = Ed25519PrivateKey.generate()
    seed = private.private_bytes_raw().hex()
    return {
        "op": "certkey",
        "kid": keys.next_kid(),
        "secret": seed,
        "pub": public_bytes(private.public_key()).hex(),
    }


def rotation_due(keys: CertKeys, now: int) -> bool:
    """The current key (if any) is older than ``CERT_KEY_ROTATION_MS`` of log time."""
    row = keys.current()
    return row is not None and now - int(row[3]) >= CERT_KEY_ROTATION_MS


class CertSigner:
    """Signs certificates with the committed current key (see the module docstring).
    Owned by the ``Dispatcher``. Event loop only."""

    def __init__(
        self,
        config: NodeConfig,
        log_clock: LogClock,
        *,
        replica: Callable[[], Replica | None],
        lease_read_allowed: Callable[[], bool],
        propose: Callable[[dict[str, Any]], Awaitable[Result]],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.log_clock = log_clock
        self._replica = replica
        self._lease_read_allowed = lease_read_allowed
        self._propose = propose
        self._wall = wall
        self._private: dict[int, Ed25519PrivateKey] = {}
        #: Certificates signed since start (the node's metrics read it).
        self.signed = 0

    async def ensure_key(self) -> None:
        """Before the first certificate: propose the first signing key. Raises what
        the proposer raises (the request then fails, indeterminate, before its own
        entry was proposed)."""
        replica = self._replica()
        if replica is not None and replica.store.cert_keys.current() is None:
            await self._propose(key_entry(replica.store.cert_keys))

    def sign(
        self,
        op: str,
        holder_hex: str,
        principal: str,
        answer: dict[str, Any],
        from_memory: bool = False,
    ) -> str | None:
        """The certificate for ``answer`` (a grant, renewal or transfer; ``principal``,
        the requester's, is the lease's: only it may renew), or
        None: no key yet, no valid leader lease, the lease no longer live in the
        applied state (an answer replayed from the dedup table after a release),
        nothing left of it, or no holder key bound to the lease or another one than
        ``holder_hex``. ``from_memory``: a keep-alive answered from the leader's
        memory, whose new expiry the applied state does not show yet.

        Defence in depth: the certificate binds the holder key stored with the
        applied lease at its grant, never the request's (the state machine already
        refuses a renewal naming another: HOLDER_KEY_MISMATCH)."""
        ready = self._ready()
        if ready is None:
            return None
        if "token" not in answer or "expires_at" not in answer or answer.get("queued"):
            return None
        lease = ready[0].store.leases.get(str(answer.get("lease_id")))
        if lease is None or lease.token != answer["token"] or lease.key != answer["key"]:
            return None
        return self._sign_lease(
            ready, op, holder_hex, lease, int(answer["expires_at"]), from_memory
        )

    def sign_each(
        self,
        op: str,
        holder_hex: str,
        answer: dict[str, Any],
        from_memory: bool = False,
    ) -> list[dict[str, Any]]:
        """Certificates for several leases at once, each as ``sign`` would make it:
        the keys of a set's grant (``acquire_many``: the answer's ``leases``), or the
        leases attached to a lease session (``session_keepalive``: a keep-alive
        renews them all), at most ``MAX_CERTIFICATES_PER_ANSWER`` in attach order.
        Only leases bound to ``holder_hex`` are certified; ``[{"key", "token",
        "lease_id", "certificate"}]``, empty when nothing can be signed."""
        ready = self._ready()
        if ready is None or "expires_at" not in answer or answer.get("queued"):
            return []
        store = ready[0].store
        if op == "acquire_many":
            members = answer.get("leases")
            lids = [str(one.get("lease_id")) for one in members or () if isinstance(one, dict)]
        else:
            session = store.lease_sessions.get(str(answer.get("session_id")))
            lids = list(session.leases) if session is not None else []
        out: list[dict[str, Any]] = []
        for lid in lids:
            lease = store.leases.get(lid)
            if lease is None or lease.holder is None or lease.holder.hex() != holder_hex:
                continue
            text = self._sign_lease(
                ready, op, holder_hex, lease, int(answer["expires_at"]), from_memory
            )
            if text is not None:
                out.append(
                    {"key": lease.key, "token": lease.token, "lease_id": lid, "certificate": text}
                )
                if len(out) >= MAX_CERTIFICATES_PER_ANSWER:
                    break
        return out

    def sign_attempt(
        self, op: str, holder_hex: str, aid: str, answer: dict[str, Any]
    ) -> str | None:
        """The certificate of the task attempt ``aid`` for a claim's or a heartbeat's
        ``answer``, or None (as ``sign``: no key, no valid leader lease, the attempt
        no longer current in the applied state, no key bound to it or another one).
        Its ``key`` is ``<queue>/<task id>``, its token the attempt's fencing token,
        and the body carries ``queue``, ``task`` and ``attempt`` (docs/certificates.md,
        "Wire format"). Heartbeats are always logged, so the applied expiry is the
        truth."""
        ready = self._ready()
        if ready is None or "token" not in answer or "expires_at" not in answer:
            return None
        tasks = ready[0].store.tasks
        attempt = tasks.attempts.get(aid)
        if attempt is None or attempt.token != answer["token"] or attempt.holder is None:
            return None
        if attempt.holder.hex() != holder_hex:
            return None
        task = tasks.tasks.get(attempt.tid)
        if task is None:
            return None
        expires_at = min(int(answer["expires_at"]), attempt.expires_at)
        return self._sign_body(
            ready,
            op,
            key=f"{task.queue}/{attempt.tid}",
            token=attempt.token,
            principal=attempt.principal,
            units=1,
            slots=[],
            holder=attempt.holder,
            expires_at=expires_at,
            task=(task.queue, attempt.tid, attempt.number),
        )

    def _ready(self) -> tuple[Replica, list[Any]] | None:
        """The leader's replica and the current key's row, or None: not the leader,
        no valid leader lease (another leader may exist), or no key yet."""
        replica = self._replica()
        if replica is None or not replica.is_leader() or not self._lease_read_allowed():
            return None
        row = replica.store.cert_keys.current()
        return None if row is None else (replica, row)

    def _sign_lease(
        self,
        ready: tuple[Replica, list[Any]],
        op: str,
        holder_hex: str,
        lease: LeaseRecord,
        expires_at: int,
        from_memory: bool,
    ) -> str | None:
        """The certificate of one live ``lease`` to ``expires_at`` (see ``sign``)."""
        if lease.holder is None or lease.holder.hex() != holder_hex:
            return None
        if not from_memory:
            # The applied state is the truth: a replayed answer may be older than a
            # renewal with a shorter TTL.
            expires_at = min(expires_at, lease.expires_at)
        cap = ready[0].store.progress.cap(lease.lease_id)
        if cap is not None:
            # A progress-aware lease (docs/design.md §4g) ends at its progress deadline
            # whatever a session keep-alive answered from memory says: its certificate
            # must not outlive it.
            expires_at = min(expires_at, cap)
        return self._sign_body(
            ready,
            op,
            key=lease.key,
            token=lease.token,
            principal=lease.principal,  # the grantee's, as the applied state says
            units=lease.units,
            slots=list(lease.slots),
            holder=lease.holder,  # the key bound at the grant, as the applied state says
            expires_at=expires_at,
        )

    def _sign_body(
        self,
        ready: tuple[Replica, list[Any]],
        op: str,
        *,
        key: str,
        token: int,
        principal: str,
        units: int,
        slots: list[int],
        holder: bytes,
        expires_at: int,
        task: tuple[str, str, int] | None = None,
    ) -> str | None:
        """Sign a certificate valid until ``expires_at`` (log time) less the drift
        bound and a heartbeat, measured on this node's wall clock (module docstring);
        None when nothing of it is left."""
        replica, row = ready
        kid = int(row[0])
        private = self._private.get(kid)
        if private is None:
            private = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(row[1]))
            self._private = {kid: private}  # the current key only: old ones never sign
        wall_ms = int(self._wall() * 1000)  # read before the stamp: the earlier, the safer
        log_now = self.log_clock.stamp(replica.term(), replica.store.now)
        remaining = expires_at - log_now
        not_after = (
            wall_ms
            + int(remaining * (1 - self.config.clock_drift))
            - int(self.config.heartbeat_interval * 1000)
        )
        if not_after <= wall_ms:
            return None
        body = certificate_body(
            kid=kid,
            key=key,
            token=token,
            principal=principal,
            units=units,
            unit_indices=slots,
            holder=holder,
            not_after_ms=not_after,
            issued_at_ms=wall_ms,
            op=op,
            task=task,
        )
        self.signed += 1
        return sign_certificate(private, body)
