"""Log time on the leader: the source of every entry's ``now`` stamp."""

from __future__ import annotations

from ..clock import Clock


class LogClock:
    """The leader's source of entry time stamps (integer milliseconds of log time).

    A leader continues log time from the newest log time it has applied plus its own
    monotonic elapsed time since then. It re-anchors whenever applied log time passes
    its projection (entries of an earlier leader applied late), and on every term
    change. So log time never runs ahead of real time on the stamping leader's clock,
    and a leader change never shortens a lease; it may lengthen one by the election
    gap (the safe direction). docs/design.md gives the argument.
    """

    def __init__(self, clock: Clock, rate: float = 1.0) -> None:
        self._clock = clock
        self._rate = rate
        self._term: int | None = None
        self._anchor_log = 0
        self._anchor_mono = 0.0

    def stamp(self, term: int, applied_now: int) -> int:
        mono = self._clock.monotonic()
        if term != self._term:
            self._term = term
            self._anchor_log, self._anchor_mono = applied_now, mono
        projected = self._anchor_log + int((mono - self._anchor_mono) * 1000 * self._rate)
        if applied_now > projected:
            self._anchor_log, self._anchor_mono = applied_now, mono
            projected = applied_now
        return projected
