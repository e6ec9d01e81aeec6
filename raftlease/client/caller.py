"""What the client's helper modules (budgets, the task queue) need of
``client.aio.AsyncClient``: a protocol, so that they do not import the client that
imports them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .transport import Pin


class Caller(Protocol):
    """One request with retries (``call``), one pinned to a (cid, seq) so that a
    retry after an unknown outcome is the same request (``_call_pinned``), and a
    withdrawal sent until the cluster answers it (``_withdraw_until``). All are
    coroutines of the client's event loop; they raise what the transport raises."""

    @property
    def attempt_timeout(self) -> float: ...

    async def call(
        self, op: str, args: dict[str, Any], *, mutating: bool, timeout: float | None = None
    ) -> dict[str, Any]: ...

    async def _call_pinned(
        self, op: str, args: dict[str, Any], pin: Pin, timeout: float | None = None
    ) -> dict[str, Any]: ...

    async def _withdraw_until(
        self, send: Callable[[float], Awaitable[object]], until: float
    ) -> bool: ...
