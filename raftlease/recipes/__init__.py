"""Recipes: coordination built on the client protocols of ``raftlease.models``, never
on a client's internals (the clients bind them: ``c.lock()``, ``c.session()``,
``c.election()``, as kazoo binds its recipes).

* ``keepalive``: validity, jeopardy and loss of something renewed in the background;
* ``locks``: held locks (``HeldLock``, ``AsyncHeldLock``);
* ``sessions``: lease sessions (``Session``, ``AsyncSession``);
* ``election``: leader election (``Election``, ``AsyncElection``);
* ``shared``: semaphores, pools, read/write locks over ``lock``;
* ``fencing``: ``FencedResource``, the resource side of fencing tokens.
"""

from .election import DEFAULT_CAMPAIGN_WAIT, AsyncElection, Election
from .fencing import FencedResource, StaleTokenError, UnconfirmedTokenError
from .keepalive import KeepAliveState, LostCallback
from .locks import AsyncHeldLock, HeldLock
from .sessions import AsyncSession, Session
from .shared import SharedKeyLocks

__all__ = [
    "DEFAULT_CAMPAIGN_WAIT",
    "AsyncElection",
    "AsyncHeldLock",
    "AsyncSession",
    "Election",
    "FencedResource",
    "HeldLock",
    "KeepAliveState",
    "LostCallback",
    "Session",
    "SharedKeyLocks",
    "StaleTokenError",
    "UnconfirmedTokenError",
]
