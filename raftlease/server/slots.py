"""Node-local concurrency quotas: how many of one kind of long-lived request (watches,
long-polls) a node serves at once, in all and per authenticated principal.

These requests are not replicated, so each node counts its own. Event loop only; never
blocks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..errors import QuotaExceededError


class Slots:
    """A per-node total (``per_node``) and per-principal counts (``per_principal``)
    of one kind of request. ``what`` names it in messages ("watches"); ``setting``
    is the config fields' stem ("max_watches": ``max_watches_per_node`` and
    ``max_watches_per_principal``), so a refusal names the setting to raise."""

    def __init__(self, what: str, setting: str, per_principal: int, per_node: int) -> None:
        self.what = what
        self.setting = setting
        self.per_principal = per_principal
        self.per_node = per_node
        #: Requests holding a slot now, in all and by principal.
        self.total = 0
        self.by_principal: dict[str, int] = {}

    def admit(self, principal: str | None) -> None:
        """Raise ``QuotaExceededError`` (definite, nothing held) if one more request
        would exceed the node's total or ``principal``'s share. ``principal`` None
        (no authentication) counts toward the node's limit only."""
        if self.total >= self.per_node:
            raise QuotaExceededError(
                f"this node already serves {self.total} {self.what} "
                f"({self.setting}_per_node is {self.per_node})",
                {"quota": self.per_node},
            )
        mine = self.by_principal.get(principal, 0) if principal else 0
        if principal and mine >= self.per_principal:
            raise QuotaExceededError(
                f"{principal} already has {mine} {self.what} on this node "
                f"({self.setting}_per_principal is {self.per_principal})",
                {"quota": self.per_principal},
            )

    @contextlib.contextmanager
    def hold(self, principal: str | None) -> Iterator[None]:
        """Hold one slot for the ``with`` block; it is freed however the block ends
        (answer, timeout, error, cancellation). Raises ``QuotaExceededError``
        (``admit``) when full."""
        self.admit(principal)
        self.total += 1
        if principal:
            self.by_principal[principal] = self.by_principal.get(principal, 0) + 1
        try:
            yield
        finally:
            self.total -= 1
            if principal:
                left = self.by_principal[principal] - 1
                if left:
                    self.by_principal[principal] = left
                else:
                    del self.by_principal[principal]
