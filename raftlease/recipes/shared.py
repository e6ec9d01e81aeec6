"""Shared keys for both clients: semaphores, pools and read/write locks, each a held
lock (``lock``) with a capacity and units. Mixed into ``Client`` and ``AsyncClient``
(``L``: the lock type their ``lock`` returns)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from ..models import RW_CAPACITY

L = TypeVar("L")


class SharedKeyLocks(Generic[L]):
    """``semaphore``, ``pool``, ``read_lock`` and ``write_lock`` over ``lock``."""

    def lock(self, key: str, **options: Any) -> L:
        raise NotImplementedError

    def semaphore(self, key: str, *, limit: int, **options: Any) -> L:
        """One of ``limit`` slots of ``key`` (every user gives the same ``limit``)."""
        return self.lock(key, capacity=limit, units=1, **options)

    def pool(self, key: str, *, capacity: int, units: int, **options: Any) -> L:
        """``units`` of a pool of ``capacity`` units (a job taking 2 of 8 GPUs)."""
        return self.lock(key, capacity=capacity, units=units, **options)

    def read_lock(self, key: str, **options: Any) -> L:
        """Shared with other readers; waits behind a queued writer (no starvation)."""
        return self.lock(key, capacity=RW_CAPACITY, units=1, **options)

    def write_lock(self, key: str, **options: Any) -> L:
        """Exclusive: no reader and no other writer while held."""
        return self.lock(key, capacity=RW_CAPACITY, units=RW_CAPACITY, **options)
