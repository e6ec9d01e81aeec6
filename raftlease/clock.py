"""Clocks. The lease logic outside the state machine reads time only through a
``Clock`` so tests and the chaos suite can shift or skew one node's clock
(libfaketime breaks CPython's blocking timeouts, so we do it in-program)."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (arbitrary origin)."""
        ...


class SystemClock:
    """``time.monotonic``."""

    def monotonic(self) -> float:
        return time.monotonic()


class AdjustableClock:
    """A monotonic clock whose offset and rate can be changed at run time.

    Reads ``base + (real - real_at_change) * rate + offset``. Rate changes keep the
    clock continuous; ``jump`` moves it forward (a backward jump is refused so the
    clock stays monotonic). Thread-safe.
    """

    def __init__(self, source: Clock | None = None) -> None:
        self._source = source or SystemClock()
        self._lock = threading.Lock()
        self._real_origin = self._source.monotonic()
        self._value_origin = self._real_origin
        self._rate = 1.0

    def monotonic(self) -> float:
        with self._lock:
            return self._value_origin + (self._source.monotonic() - self._real_origin) * self._rate

    @property
    def rate(self) -> float:
        return self._rate

    def set_rate(self, rate: float) -> None:
        if not 0 < rate < 100:
            raise ValueError(f"clock rate must be in (0, 100), got {rate}")
        with self._lock:
            real = self._source.monotonic()
            self._value_origin += (real - self._real_origin) * self._rate
            self._real_origin = real
            self._rate = rate

    def jump(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock cannot jump backwards")
        with self._lock:
            self._value_origin += seconds
