"""The chaos suite's watcher (jepsen-style/watch_workload.py) against an in-process watch
source, then the watch checker on what it recorded.

No cluster: ``FakeWatch`` makes a change every few milliseconds, with revisions as a
raftlease store numbers them (contiguous within a term, a jump to the token ceiling at
a new term), and serves watches from any revision. It shows the recorder's history is
complete enough for ``watch_checker`` to decide (``True`` on the honest source, with
resumed streams and a term jump in them) and that the checker catches a source that
skips revisions when a stream resumes (issue 37: a node just restarted served a watch
from revision 0 and streamed 61, 62, ...). The real runs are in tests/chaos/test_chaos.py.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

SUITE = Path(__file__).resolve().parents[2] / "jepsen-style"
sys.path.insert(0, str(SUITE))

import checker  # noqa: E402
import watch_checker  # noqa: E402
from watch_workload import WatchConfig, WatchRecorder  # noqa: E402
from workload import History  # noqa: E402

from raftlease.errors import CompactedError  # noqa: E402
from raftlease.models import WatchEvent  # noqa: E402

pytestmark = pytest.mark.timeout(120)

STEP = watch_checker.JUMP_SPACING
#: The change (by count) at which a new term jumps the revision to the ceiling.
JUMP_AT = 60
EVERY = 0.004


def revision_of(n: int) -> int:
    """The revision of the ``n``-th change (from 1): contiguous, then a new term."""
    return n if n < JUMP_AT else n + STEP


def change_at(revision: int) -> int:
    """The first change at or after ``revision``."""
    if revision < JUMP_AT:
        return max(revision, 1)
    return max(revision - STEP, JUMP_AT)


def event(n: int) -> WatchEvent:
    """Change ``n``: an odd one grants ``k<n>`` (token = its revision), an even one
    releases the lease the change before granted."""
    revision = revision_of(n)
    if n % 2:
        return WatchEvent("grant", f"k{n}", "o", revision, revision)
    return WatchEvent("release", f"k{n - 1}", "o", revision_of(n - 1), revision)


class FakeWatch:
    """Changes at a steady rate from its creation; ``bug="skip_on_resume"`` starts a
    resumed stream (``from_revision`` > 1) three changes late; ``compact_before``
    answers ``COMPACTED`` to a watch from an older revision."""

    def __init__(self, bug: str = "", compact_before: int = 0) -> None:
        self.t0 = time.monotonic()
        self.bug = bug
        self.compact_before = compact_before

    def head(self) -> int:
        return int((time.monotonic() - self.t0) / EVERY)

    async def _watch(self, from_revision: int) -> AsyncIterator[WatchEvent]:
        if 0 < from_revision < self.compact_before:
            raise CompactedError("compacted", {"revision": revision_of(self.head())})
        n = self.head() + 1 if from_revision == 0 else change_at(from_revision)
        if self.bug == "skip_on_resume" and from_revision > 1:
            n += 3
        while True:
            while n <= self.head():
                yield event(n)
                n += 1
            await asyncio.sleep(EVERY)

    def watch(self, prefix: str = "", *, from_revision: int = 0) -> AsyncIterator[WatchEvent]:
        return self._watch(from_revision)

    async def close(self) -> None:
        return None


def record(source: FakeWatch, seconds: float = 1.2, **config: Any) -> list[dict[str, Any]]:
    history = History()
    history.append({"type": "meta", "t": time.monotonic(), "watch": {"prefix": ""}})
    stop = threading.Event()
    options = {"rotate_every": 0.3, "flush_every": 0.05, **config}
    recorder = WatchRecorder("watch1", lambda: source, history.append, WatchConfig(**options), stop)
    recorder.start()
    time.sleep(seconds)
    stop.set()
    recorder.join(timeout=10)
    assert not recorder.is_alive() and not recorder.errors, recorder.errors
    return history.snapshot()


def judge(events: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = watch_checker.check_watch(events, checker.pair_ops(events))
    return result


def test_an_honest_source_passes_with_resumed_streams_and_a_term_jump() -> None:
    events = record(FakeWatch())
    result = judge(events)
    assert result["valid"] is True, (result["violations"][:3], result["unknown"][:3])
    stats = result["stats"]
    assert stats["streams"] >= 3 and stats["ends"]["rotate"] >= 2, stats
    assert stats["term_jumps"] == 1 and stats["events"] > JUMP_AT, stats
    starts = [e["from_revision"] for e in events if e.get("f") == "start"]
    assert starts[0] == 1 and all(s > 1 for s in starts[1:]), starts
    # The registry runs it: a history with a watcher gets the watch checker.
    assert checker.check(events)["checkers"]["watch"]["valid"] is True


def test_a_source_that_skips_revisions_on_resume_is_caught() -> None:
    result = judge(record(FakeWatch(bug="skip_on_resume")))
    assert result["valid"] is False
    kinds = {v["kind"] for v in result["violations"]}
    assert "gap no term change explains: revisions skipped" in kinds, kinds


def test_a_compacted_stream_ends_with_the_error_and_the_next_starts_after_it() -> None:
    events = record(FakeWatch(compact_before=JUMP_AT + 10), seconds=0.8)
    ends = [e for e in events if e.get("f") == "end"]
    assert any(e.get("error") == "COMPACTED" for e in ends), ends
    assert judge(events)["valid"] is True


def test_the_recording_is_bounded() -> None:
    events = record(FakeWatch(), seconds=1.0, max_events=25)
    rows = [r for e in events if e.get("f") == "events" for r in e["events"]]
    assert len(rows) == 25
    assert [e["reason"] for e in events if e.get("f") == "end"][-1] == "limit"
    assert judge(events)["valid"] is True
