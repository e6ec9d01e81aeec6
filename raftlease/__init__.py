"""raftlease: a Raft-replicated lease and coordination service with fencing tokens."""

__version__ = "0.1.0"

from .client import AsyncClient, Client, Holder, Lease, Read, WatchEvent
from .errors import (
    BadRequestError,
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
    TooManyPendingError,
    UnavailableError,
)
from .fencing import FencedResource, StaleTokenError

__all__ = [
    "AsyncClient",
    "BadRequestError",
    "Client",
    "CompactedError",
    "ConnectionLostError",
    "FencedResource",
    "Holder",
    "InvalidArgumentError",
    "LeaderChangedError",
    "Lease",
    "LeaseHeldError",
    "LeaseNotFoundError",
    "LeaseTimeoutError",
    "NotLeaderError",
    "NotOwnerError",
    "RaftLeaseError",
    "Read",
    "SessionExpiredError",
    "StaleTokenError",
    "TooManyPendingError",
    "UnavailableError",
    "WatchEvent",
    "__version__",
]
