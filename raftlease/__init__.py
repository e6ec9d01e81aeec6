"""raftlease: a Raft-replicated lease and coordination service with fencing tokens."""

__version__ = "0.1.0"

from .client import AsyncClient, Client, Holder, Lease, Read
from .errors import (
    BadRequestError,
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

__all__ = [
    "AsyncClient",
    "BadRequestError",
    "Client",
    "ConnectionLostError",
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
    "TooManyPendingError",
    "UnavailableError",
    "__version__",
]
