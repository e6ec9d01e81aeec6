"""Error taxonomy: one registry of wire codes, each paired with one exception class.

Every error says whether its outcome is *definite*: a definite error means the request
certainly did not change state (it was rejected, or it was answered by the state
machine with a domain outcome). An indefinite error means the request may or may not
have been applied; a mutating request may then be retried only because the state
machine deduplicates retries by ``(client_id, seq)``.

Modelled on kazoo's ``exceptions.py`` (one class per code) and on jepsen-io/etcd's
``:definite?`` flag.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


class RaftLeaseError(Exception):
    """Base of every error the raftlease library raises.

    ``code`` is the wire code (a short upper-case string), ``definite`` says whether the
    request certainly did not take effect, ``detail`` carries structured context (for
    example the current holder of a key).
    """

    code: ClassVar[str] = "INTERNAL"
    definite: ClassVar[bool] = False

    def __init__(self, message: str = "", detail: dict[str, Any] | None = None) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        self.detail: dict[str, Any] = dict(detail or {})

    def __str__(self) -> str:
        outcome = "definite" if self.definite else "outcome unknown"
        return f"[{self.code}, {outcome}] {self.message}"


class RetryAfter:
    """A mixin of the errors whose ``detail`` says when to try again: ``retry_after``
    (seconds; None when it does not say). Not an error of its own: no wire code."""

    detail: dict[str, Any]

    @property
    def retry_after(self) -> float | None:
        value = self.detail.get("retry_after")
        return float(value) if isinstance(value, int | float) else None


# --- domain outcomes (answered by the state machine; always definite) -------------


class LeaseHeldError(RaftLeaseError):
    """The key is held by another owner. ``detail`` has ``owner``, ``token`` and
    ``remaining`` (seconds of log time left on the holder's lease)."""

    code = "LEASE_HELD"
    definite = True

    @property
    def owner(self) -> str | None:
        value = self.detail.get("owner")
        return value if isinstance(value, str) else None

    @property
    def token(self) -> int | None:
        value = self.detail.get("token")
        return value if isinstance(value, int) else None

    @property
    def remaining(self) -> float | None:
        value = self.detail.get("remaining")
        return float(value) if isinstance(value, int | float) else None


class NotOwnerError(RaftLeaseError):
    """The lease id does not match the live lease on the key (someone else holds it)."""

    code = "NOT_OWNER"
    definite = True


class HolderKeyMismatchError(RaftLeaseError):
    """A renewal named a lease certificate holder key (``holder_key``) other than the
    one bound to the lease at its grant, or named one for a lease granted without one
    (docs/certificates.md): nothing changed and no certificate was signed. A holder
    key cannot be swapped on a live lease, so whoever has the lease id cannot get a
    certificate for a key of its own. Renew without ``holder_key`` (no certificate),
    or acquire anew with the key."""

    code = "HOLDER_KEY_MISMATCH"
    definite = True


class LeaseNotFoundError(RaftLeaseError):
    """No live lease on the key: it expired, was released, or never existed."""

    code = "LEASE_NOT_FOUND"
    definite = True


class DeadlockError(RaftLeaseError):
    """A queued acquire would close (or closed) a cycle of agents each holding a key
    the next waits for (docs/design.md §4e): it was refused (if it was already
    queued, it left its queue), and it is the youngest waiter of the cycle. Nothing
    the caller holds was released: release something, or retry later. ``detail``
    has ``key`` and ``cycle``: ``[{"owner", "waits_for", "held_by"}, ...]`` (owners
    and keys, never lease ids)."""

    code = "DEADLOCK"
    definite = True

    @property
    def cycle(self) -> list[dict[str, str]]:
        value = self.detail.get("cycle")
        return list(value) if isinstance(value, list) else []


class ClientExpiredError(RaftLeaseError):
    """The client id is unknown to the cluster although the client has had requests
    acknowledged under it before: its dedup record was evicted after inactivity, so a
    retry can no longer be deduplicated. The request was not applied. (Not a lease
    session: those end with ``SessionNotFoundError``.) The clients recover by
    themselves, under a fresh client id."""

    code = "SESSION_EXPIRED"  # the wire code keeps its first name
    definite = True


#: The former name of ``ClientExpiredError`` (kept for compatibility).
SessionExpiredError = ClientExpiredError


class TooManyPendingError(RaftLeaseError):
    """The client has too many unacknowledged requests under its client id."""

    code = "TOO_MANY_PENDING"
    definite = True


class SessionNotFoundError(RaftLeaseError):
    """The lease session does not exist: it expired (no keep-alive within its TTL) or
    was closed, and everything attached to it was released. Open a new session."""

    code = "SESSION_NOT_FOUND"
    definite = True


class CapacityMismatchError(RaftLeaseError):
    """The key is in use as a semaphore, pool or rwlock of another capacity (or as a
    plain lock, capacity 1). ``detail['capacity']`` is the capacity in use."""

    code = "CAPACITY_MISMATCH"
    definite = True


class CompactedError(RaftLeaseError):
    """A watch asked to resume from a revision this node no longer has (its history
    starts later, e.g. after a restart or snapshot). Re-read the state and watch from
    ``detail['revision'] + 1``."""

    code = "COMPACTED"
    definite = True


class StaleAttemptError(RaftLeaseError):
    """A task completion, failure, release or heartbeat came from an attempt that is
    not the task's current one: it expired (the worker stopped heartbeating or made
    no progress), failed, was released, or the task was completed or dead-lettered.
    Nothing was applied; stop the work. ``detail`` has ``tid``, ``status`` and, when
    another attempt holds the task, ``current_token``."""

    code = "STALE_ATTEMPT"
    definite = True


class TaskNotFoundError(RaftLeaseError):
    """The queue has no such task: never put, purged, or dropped after its
    retention."""

    code = "TASK_NOT_FOUND"
    definite = True


class TaskDeadError(RaftLeaseError):
    """``wait_result``: the task was dead-lettered (it used all its attempts or passed
    its deadline). ``detail['task']`` is its record, with every attempt's error."""

    code = "TASK_DEAD"
    definite = True


class BudgetNotFoundError(RaftLeaseError):
    """No budget has this key: never defined (``budget_set``), or deleted."""

    code = "BUDGET_NOT_FOUND"
    definite = True


class BudgetExhaustedError(RetryAfter, RaftLeaseError):
    """The budget cannot grant the amount now (its level is too low, or earlier
    spends wait ahead), and the spend had no ``wait`` left. Nothing was drawn.
    ``detail`` has ``level``, ``capacity``, ``waiting`` and ``retry_after`` (seconds
    of log time until the refill covers the amount with nobody ahead; null when
    others wait or the budget has no refill)."""

    code = "BUDGET_EXHAUSTED"
    definite = True


class AmountOverCapacityError(RaftLeaseError):
    """The amount asked is above the budget's capacity: it could never be granted,
    so it is refused at once instead of waiting for ever. ``detail`` has
    ``amount`` and ``capacity``."""

    code = "AMOUNT_OVER_CAPACITY"
    definite = True


class ReservationNotFoundError(RaftLeaseError):
    """The budget has no such open reservation: already settled or cancelled, or
    past its TTL (then it was settled at its reserved amount)."""

    code = "RESERVATION_NOT_FOUND"
    definite = True


# --- request errors (rejected before proposing; definite) -------------------------


class BadRequestError(RaftLeaseError):
    """The request is malformed: wrong types, missing fields, unknown operation."""

    code = "BAD_REQUEST"
    definite = True


class InvalidArgumentError(RaftLeaseError):
    """A field is well-typed but out of range: TTL, key or owner length, limit."""

    code = "INVALID_ARGUMENT"
    definite = True


class TaskStateError(InvalidArgumentError):
    """A task is not in the state the operation needs: ``retry`` of a task that is
    not dead, or of a dead task one of whose ``after`` parents is dead (retry that
    first). A state conflict, not a malformed request (HTTP 409). Nothing was
    applied. ``detail`` has ``status`` or ``parent``. A subclass of
    ``InvalidArgumentError``, which this refusal was before issue 41."""

    code = "TASK_STATE"
    definite = True


class FrameTooLargeError(RaftLeaseError):
    """A frame exceeded the maximum size; the server closes the connection."""

    code = "FRAME_TOO_LARGE"
    definite = True


class NotLeaderError(RaftLeaseError):
    """This node is not the leader. ``detail['leader']`` is the client address of the
    leader it knows of, if any. The request was not proposed."""

    code = "NOT_LEADER"
    definite = True

    @property
    def leader(self) -> str | None:
        value = self.detail.get("leader")
        return value if isinstance(value, str) else None


class UnavailableError(RaftLeaseError):
    """The node cannot serve now (no leader known, still replaying its log, shutting
    down). The request was not proposed."""

    code = "UNAVAILABLE"
    definite = True


class OverloadedError(RetryAfter, UnavailableError):
    """The node is past its capacity (its event loop runs more than ``overload_lag``
    behind: docs/operations.md, "Capacity") and refuses what would add load of its
    own, opening a lease session, so that the sessions it has keep being served.
    Nothing was applied. Retry after ``detail['retry_after']`` seconds (the clients
    do, within their deadline); ``detail['lag']`` is the loop's lag in seconds. A
    subclass of ``UnavailableError``: code that retries that retries this too."""

    code = "OVERLOADED"
    definite = True


# --- indefinite outcomes ----------------------------------------------------------


class TimeoutError_(RaftLeaseError):
    """No answer within the deadline; the request may or may not have been applied."""

    code = "TIMEOUT"
    definite = False


class LeaderChangedError(RaftLeaseError):
    """Leadership changed while the request was in flight (PySyncObj NOT_LEADER,
    LEADER_CHANGED, DISCARDED or UNKNOWN_OUTCOME): the outcome is unknown."""

    code = "LEADER_CHANGED"
    definite = False


class ConnectionLostError(RaftLeaseError):
    """The connection broke while the request was in flight; outcome unknown."""

    code = "CONNECTION_LOST"
    definite = False


class InternalError(RaftLeaseError):
    """A bug or an unexpected failure inside a node. Outcome unknown."""

    code = "INTERNAL"
    definite = False


class UnauthenticatedError(RaftLeaseError):
    """The connection is not authenticated (no token or client certificate, or an
    unknown one). Nothing was applied."""

    code = "UNAUTHENTICATED"
    definite = True


class PermissionDeniedError(RaftLeaseError):
    """The authenticated principal's roles do not allow this operation on this key
    (or this priority). Nothing was applied."""

    code = "PERMISSION_DENIED"
    definite = True


class QuotaExceededError(RaftLeaseError):
    """The principal reached a quota (leases, lease sessions, connections). Nothing
    was applied; free some first."""

    code = "QUOTA_EXCEEDED"
    definite = True


class ConfigError(RaftLeaseError):
    """Invalid configuration (raised at start, never over the wire)."""

    code = "CONFIG"
    definite = True


LeaseTimeoutError = TimeoutError_

_REGISTRY: dict[str, type[RaftLeaseError]] = {
    cls.code: cls
    for cls in (
        LeaseHeldError,
        NotOwnerError,
        HolderKeyMismatchError,
        LeaseNotFoundError,
        DeadlockError,
        SessionExpiredError,
        TooManyPendingError,
        SessionNotFoundError,
        CapacityMismatchError,
        CompactedError,
        StaleAttemptError,
        TaskNotFoundError,
        TaskDeadError,
        BudgetNotFoundError,
        BudgetExhaustedError,
        AmountOverCapacityError,
        ReservationNotFoundError,
        BadRequestError,
        InvalidArgumentError,
        TaskStateError,
        FrameTooLargeError,
        NotLeaderError,
        UnavailableError,
        OverloadedError,
        TimeoutError_,
        LeaderChangedError,
        ConnectionLostError,
        InternalError,
        ConfigError,
        UnauthenticatedError,
        PermissionDeniedError,
        QuotaExceededError,
    )
}

#: All wire codes, for documentation and tests.
CODES: frozenset[str] = frozenset(_REGISTRY)


def error_class(code: str) -> type[RaftLeaseError]:
    """The exception class for a wire code; unknown codes map to ``InternalError``."""
    return _REGISTRY.get(code, InternalError)


def from_wire(code: str, message: str, detail: dict[str, Any] | None = None) -> RaftLeaseError:
    """Build the exception for an error response received over the wire."""
    return error_class(code)(message, detail)


def from_response(response: Mapping[str, Any]) -> RaftLeaseError:
    """The exception an error response (``{"ok": False, "code", "message",
    "detail"}``) stands for; fields of the wrong type are taken as text."""
    detail = response.get("detail")
    return from_wire(
        str(response.get("code")),
        str(response.get("message")),
        detail if isinstance(detail, dict) else None,
    )
