"""raftlease: a Raft-replicated lease and coordination service with fencing tokens."""

from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from .client import (
        RW_CAPACITY,
        AsyncClient,
        AsyncQueue,
        AsyncTask,
        Client,
        Holder,
        Lease,
        Queue,
        QueueStats,
        Read,
        Task,
        TaskInfo,
        WatchEvent,
    )
    from .errors import (
        AmountOverCapacityError,
        BadRequestError,
        BudgetExhaustedError,
        BudgetNotFoundError,
        CapacityMismatchError,
        ClientExpiredError,
        CompactedError,
        ConnectionLostError,
        DeadlockError,
        HolderKeyMismatchError,
        InvalidArgumentError,
        LeaderChangedError,
        LeaseHeldError,
        LeaseNotFoundError,
        LeaseTimeoutError,
        NotLeaderError,
        NotOwnerError,
        OverloadedError,
        PermissionDeniedError,
        QuotaExceededError,
        RaftLeaseError,
        ReservationNotFoundError,
        SessionExpiredError,
        SessionNotFoundError,
        StaleAttemptError,
        TaskDeadError,
        TaskNotFoundError,
        TaskStateError,
        TooManyPendingError,
        UnauthenticatedError,
        UnavailableError,
    )
    from .models import Leader, LeaseSet
    from .recipes import (
        AsyncElection,
        AsyncHeldLock,
        AsyncSession,
        Election,
        FencedResource,
        HeldLock,
        Session,
        StaleTokenError,
        UnconfirmedTokenError,
    )

# Imported on first use (PEP 562), so that a node process, which imports
# ``raftlease.server`` and so this package, does not load the client and recipes.
_EXPORTS = {
    **dict.fromkeys(
        (
            "RW_CAPACITY",
            "AsyncClient",
            "AsyncQueue",
            "AsyncTask",
            "Client",
            "Holder",
            "Lease",
            "Queue",
            "QueueStats",
            "Read",
            "Task",
            "TaskInfo",
            "WatchEvent",
        ),
        "client",
    ),
    "Leader": "models",
    "LeaseSet": "models",
    **dict.fromkeys(
        (
            "AsyncElection",
            "AsyncHeldLock",
            "AsyncSession",
            "Election",
            "FencedResource",
            "HeldLock",
            "Session",
            "StaleTokenError",
            "UnconfirmedTokenError",
            "UnconfirmedTokenError",
        ),
        "recipes",
    ),
}


def __getattr__(name: str) -> Any:
    import importlib

    module = _EXPORTS.get(name)
    if module is None:
        if name.endswith("Error"):
            module = "errors"
        else:
            raise AttributeError(f"module 'raftlease' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"raftlease.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "RW_CAPACITY",
    "AmountOverCapacityError",
    "AsyncClient",
    "AsyncElection",
    "AsyncHeldLock",
    "AsyncQueue",
    "AsyncSession",
    "AsyncTask",
    "BadRequestError",
    "BudgetExhaustedError",
    "BudgetNotFoundError",
    "CapacityMismatchError",
    "Client",
    "ClientExpiredError",
    "CompactedError",
    "ConnectionLostError",
    "DeadlockError",
    "Election",
    "FencedResource",
    "HeldLock",
    "Holder",
    "HolderKeyMismatchError",
    "InvalidArgumentError",
    "Leader",
    "LeaderChangedError",
    "Lease",
    "LeaseHeldError",
    "LeaseNotFoundError",
    "LeaseSet",
    "LeaseTimeoutError",
    "NotLeaderError",
    "NotOwnerError",
    "OverloadedError",
    "PermissionDeniedError",
    "Queue",
    "QueueStats",
    "QuotaExceededError",
    "RaftLeaseError",
    "Read",
    "ReservationNotFoundError",
    "Session",
    "SessionExpiredError",
    "SessionNotFoundError",
    "StaleAttemptError",
    "StaleTokenError",
    "Task",
    "TaskDeadError",
    "TaskInfo",
    "TaskNotFoundError",
    "TaskStateError",
    "TooManyPendingError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnconfirmedTokenError",
    "WatchEvent",
    "__version__",
]
