"""raftlease: a Raft-replicated lease and coordination service with fencing tokens."""

__version__ = "0.1.0"

from .client import RW_CAPACITY, AsyncClient, Client, Holder, Lease, Read, WatchEvent
from .election import AsyncElection, Election, Leader
from .errors import (
    BadRequestError,
    CapacityMismatchError,
    CompactedError,
    ConnectionLostError,
    InvalidArgumentError,
    LeaderChangedError,
    LeaseHeldError,
    LeaseNotFoundError,
    LeaseTimeoutError,
    NotLeaderError,
    NotOwnerError,
    RaftLeaseError,
    SessionExpiredError,
    SessionNotFoundError,
    TooManyPendingError,
    UnavailableError,
)
from .fencing import FencedResource, StaleTokenError
from .locks import AsyncHeldLock, HeldLock
from .sessions import AsyncSession, Session

__all__ = [
    "RW_CAPACITY",
    "AsyncClient",
    "AsyncElection",
    "AsyncHeldLock",
    "AsyncSession",
    "BadRequestError",
    "CapacityMismatchError",
    "Client",
    "CompactedError",
    "ConnectionLostError",
    "Election",
    "FencedResource",
    "HeldLock",
    "Holder",
    "InvalidArgumentError",
    "Leader",
    "LeaderChangedError",
    "Lease",
    "LeaseHeldError",
    "LeaseNotFoundError",
    "LeaseTimeoutError",
    "NotLeaderError",
    "NotOwnerError",
    "RaftLeaseError",
    "Read",
    "Session",
    "SessionExpiredError",
    "SessionNotFoundError",
    "StaleTokenError",
    "TooManyPendingError",
    "UnavailableError",
    "WatchEvent",
    "__version__",
]
