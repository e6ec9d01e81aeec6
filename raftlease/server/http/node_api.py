"""What the HTTP front (admin endpoint, HTTP API, dashboard) needs of its node: a
small interface the node offers, so that nothing in ``server/http/`` imports
``server/node.py`` or reaches for a private method of ``NodeServer`` (the node
imports this package, never the other way round; etcd's lessor declares the
interfaces it needs of higher packages the same way).

Threads: every member is called on the node's event loop.
"""

from __future__ import annotations

from typing import Any, Protocol

from ...config import NodeConfig
from ...protocol import Limits, Request
from ...replication import Replica
from ..auth import AuthPolicy
from ..watch import WatchHub


class NodeApi(Protocol):
    """One node as its HTTP front sees it (``server.node.NodeServer`` offers it)."""

    @property
    def config(self) -> NodeConfig:
        """The node's configuration."""
        ...

    @property
    def limits(self) -> Limits:
        """The request limits ``parse_request`` validates against."""
        ...

    @property
    def auth(self) -> AuthPolicy | None:
        """The auth policy in force (a reload replaces it); None: no authentication."""
        ...

    @property
    def watches(self) -> WatchHub:
        """The node's watch hub (history, subscribers, the watch quota)."""
        ...

    async def handle(self, request: Request) -> dict[str, Any]:
        """Execute one validated request on this node; raises its ``RaftLeaseError``
        (``NOT_LEADER`` with the leader's client address when it must go there)."""
        ...

    def require_leader(self) -> None:
        """Return if this node leads; raise ``NotLeaderError`` naming the leader's
        client address, or ``UnavailableError`` when none is known."""
        ...

    def require_replica(self) -> Replica:
        """The node's replica, once its state is restored; raises ``UnavailableError``
        while the node starts, waits out an unclean stop, or has not yet loaded its
        snapshot and replayed its journal."""
        ...

    def status(self) -> dict[str, Any]:
        """This node's status (``raftlease status``); raises ``UnavailableError``
        while the node starts."""
        ...
