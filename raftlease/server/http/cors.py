"""Which other origins may read this admin endpoint: the live views of the other
members (docs/security.md "Cross-origin reads").

The page (dashboard.py) moves its reads to another member's admin endpoint when its own
node is unreachable, not ready or without a leader; the browser lets it read that other
origin only when the answer names its origin in ``Access-Control-Allow-Origin``. The rule
(``AdminEndpoint._frame``, ``allowed``): a request's ``Origin`` is allowed exactly when
it is ``<scheme>://<host>:<port>`` of the admin endpoint of another current member of
this cluster, where the scheme is this endpoint's (``https`` with TLS) and host:port the
admin address that member's own ``status`` reports (a wildcard host such as ``0.0.0.0``
replaced by the host of its client address). Nothing else: never ``*``, no credentials
mode (the page sends its token as an ``Authorization`` header).

A node knows only its own admin address; the others' are learned from their ``status``
over their client ports (the open ``status`` operation, as the page's cluster table
reads it): every ``LEARN_EVERY`` seconds while a member's is unknown, every
``RELEARN_EVERY`` seconds after, and on each ``/ui/api/cluster`` read. A learned address
is kept while its member stays in the cluster (a member that has just died is the very
case the page switches for); one that leaves is forgotten.

Threads: the node's event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from ...config import parse_addr
from ...errors import ConfigError, RaftLeaseError, UnavailableError

if TYPE_CHECKING:
    from .http_api import HttpApi

log = logging.getLogger("raftlease.server.cors")

#: Seconds between attempts to learn a member's admin address while it is unknown,
#: and between re-reads once all are known.
LEARN_EVERY = 2.0
RELEARN_EVERY = 30.0
#: Seconds a member has to answer ``status``.
STATUS_TIMEOUT = 1.5
#: What a preflight answer allows (the page's requests: GET, the retry's POST).
ALLOW_METHODS = "GET, POST"
ALLOW_HEADERS = "Authorization, Content-Type"
PREFLIGHT_MAX_AGE = "600"


def admin_origin(status: dict[str, Any], scheme: str) -> str | None:
    """``scheme://host:port`` of the admin endpoint a member's ``status`` names (None
    without one); a wildcard host is replaced by its client address's host."""
    admin = status.get("admin")
    if not isinstance(admin, str) or not admin:
        return None
    try:
        host, port = parse_addr(admin, "admin address")
    except ConfigError:
        return None
    if host in ("", "0.0.0.0", "::"):
        client = status.get("client")
        try:
            host = parse_addr(client, "client address")[0] if isinstance(client, str) else ""
        except ConfigError:
            host = ""
        if host in ("", "0.0.0.0", "::"):
            return None
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


class MemberOrigins:
    """The admin origins of the other members, as learned (see the module docstring)."""

    def __init__(self, api: HttpApi, scheme: str) -> None:
        self.api = api
        self.node = api.node
        self.scheme = scheme
        #: member id -> (its client address, its admin origin or None)
        self._learned: dict[str, tuple[str, str | None]] = {}
        self._asked_all_at = 0.0

    def _members(self) -> list[Any]:
        me = self.node.config.self_node
        try:
            members = list(self.node.require_replica().membership.members())
        except UnavailableError:
            members = [me]
        return [m for m in members if m.id != me.id]

    def origins(self) -> list[str]:
        """The admin origins of the other current members known now, sorted."""
        out = set()
        for member in self._members():
            known = self._learned.get(member.id)
            if known is not None and known[0] == member.client and known[1] is not None:
                out.add(known[1])
        return sorted(out)

    def allowed(self, origin: str | None) -> bool:
        """Whether a request with this ``Origin`` header may be read cross-origin."""
        return origin is not None and origin in self.origins()

    def learn(self, member_id: str, client: str, status: dict[str, Any]) -> None:
        """Note what a member's ``status`` says of its admin endpoint."""
        self._learned[member_id] = (client, admin_origin(status, self.scheme))

    def missing(self) -> bool:
        return any(self._learned.get(m.id, ("", None))[0] != m.client for m in self._members())

    async def refresh(self, everyone: bool = False) -> None:
        """Ask the members whose admin address is unknown (``everyone``: all) for their
        status; one that does not answer keeps what was learned of it."""
        members = self._members()
        current = {m.id for m in members}
        for member_id in [k for k in self._learned if k not in current]:
            del self._learned[member_id]
        wanted = [
            m for m in members if everyone or self._learned.get(m.id, ("", None))[0] != m.client
        ]

        async def one(member: Any) -> None:
            try:
                status = await self.api.forwarder.call(
                    member.client, None, {"id": 1, "op": "status"}, STATUS_TIMEOUT
                )
            except (RaftLeaseError, OSError, TimeoutError) as exc:
                log.debug("admin address of %s not learned: %s", member.id, exc)
                return
            if isinstance(status, dict):
                self.learn(member.id, member.client, status)

        await asyncio.gather(*(one(m) for m in wanted))

    async def run(self) -> None:
        """Learn for as long as the endpoint serves (cancelled by its ``close``)."""
        while True:
            try:
                now = time.monotonic()
                everyone = now - self._asked_all_at >= RELEARN_EVERY
                if everyone:
                    self._asked_all_at = now
                if everyone or self.missing():
                    await self.refresh(everyone)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let a bug end the learning (or the node)
                log.debug("learning the members' admin addresses failed", exc_info=True)
            await asyncio.sleep(LEARN_EVERY)
