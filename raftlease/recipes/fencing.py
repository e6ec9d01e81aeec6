"""A fence for the resource a lease protects: it remembers the highest fencing token it
has accepted per key and refuses anything lower, so a holder that was paused past its
lease (and replaced) cannot write after its successor. Recipes layer: no I/O, no
dependency on the cluster; keep one instance next to the resource (or persist
``highest`` with it).

    fence = FencedResource()
    fence.check("gpu-0", held.token)   # raises StaleTokenError if a newer holder wrote

Thread-safe.
"""

from __future__ import annotations

import threading

from ..errors import RaftLeaseError


class StaleTokenError(RaftLeaseError):
    """A write carried a fencing token lower than one the resource already accepted."""

    code = "STALE_TOKEN"
    definite = True


class FencedResource:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.highest: dict[str, int] = {}

    def check(self, key: str, token: int) -> None:
        """Accept ``token`` for ``key`` (and remember it) or raise ``StaleTokenError``.
        Equal tokens pass: one holder may write many times."""
        with self._lock:
            seen = self.highest.get(key, -1)
            if token < seen:
                raise StaleTokenError(
                    f"token {token} for {key!r} is older than {seen}: a newer holder wrote",
                    {"key": key, "token": token, "highest": seen},
                )
            self.highest[key] = token

    def accepts(self, key: str, token: int) -> bool:
        """Whether ``check`` would accept ``token`` now (changes nothing)."""
        with self._lock:
            return token >= self.highest.get(key, -1)
