"""A fence for the resource a lease protects: it remembers the highest fencing token it
has accepted per key and refuses anything lower, so a holder that was paused past its
lease (and replaced) cannot write after its successor. Recipes layer: no I/O, no
dependency on the cluster; keep one instance next to the resource (or persist
``highest`` with it).

    fence = FencedResource(confirm=client.fence)
    fence.check("gpu-0", held.token)   # raises StaleTokenError if a newer holder wrote

``confirm`` (for example ``Client.fence``) is asked about every token higher than any
the resource has seen before it is adopted: without it, anyone who can reach the
resource can show it a made-up huge token and lock the real holder out.

Thread-safe. ``check`` blocks while ``confirm`` asks the cluster (outside the lock) and
raises what ``confirm`` raises (a ``RaftLeaseError`` if the cluster cannot answer).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import RaftLeaseError


class StaleTokenError(RaftLeaseError):
    """A write carried a fencing token lower than one the resource already accepted."""

    code = "STALE_TOKEN"
    definite = True


class UnconfirmedTokenError(RaftLeaseError):
    """A token higher than any the resource has seen that the cluster does not confirm
    as the current holder's (forged, or its lease already ended)."""

    code = "UNCONFIRMED_TOKEN"
    definite = True


class FencedResource:
    def __init__(self, confirm: Callable[[str, int], bool] | None = None) -> None:
        """``confirm(key, token)``: is ``token`` the current holder's? (``Client.fence``.)
        Asked before a token higher than every one seen for ``key`` is adopted."""
        self._lock = threading.Lock()
        self._confirm = confirm
        self.highest: dict[str, int] = {}

    def check(self, key: str, token: int) -> None:
        """Accept ``token`` for ``key`` (and remember it) or raise ``StaleTokenError``
        (a newer holder wrote) or ``UnconfirmedTokenError`` (``confirm`` said no).
        Equal tokens pass without asking: one holder may write many times."""
        with self._lock:
            seen = self.highest.get(key, -1)
            self._refuse_older(key, token, seen)
            if token == seen or self._confirm is None:
                self.highest[key] = token
                return
        if not self._confirm(key, token):
            raise UnconfirmedTokenError(
                f"token {token} for {key!r} is not the current holder's (the cluster does "
                "not confirm it): refused",
                {"key": key, "token": token},
            )
        with self._lock:  # another check may have moved on meanwhile
            seen = self.highest.get(key, -1)
            self._refuse_older(key, token, seen)
            self.highest[key] = token

    @staticmethod
    def _refuse_older(key: str, token: int, seen: int) -> None:
        if token < seen:
            raise StaleTokenError(
                f"token {token} for {key!r} is older than {seen}: a newer holder wrote",
                {"key": key, "token": token, "highest": seen},
            )

    def accepts(self, key: str, token: int) -> bool:
        """Whether ``check`` would accept ``token`` now (changes nothing)."""
        with self._lock:
            return token >= self.highest.get(key, -1)
