"""``FreezeSurvivors`` (raftlease/gc_pauses.py): the survivors of a full collection
are frozen, so the next one does not scan them; cyclic garbage among them waits for
the next unfreeze and is then collected; uninstalling unfreezes. The node installs it
unless ``gc_unfreeze_interval`` is 0 (tests/integration/test_gc_freeze.py)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from raftlease import gc_pauses
from raftlease.gc_pauses import FreezeSurvivors

pytestmark = pytest.mark.timeout(60)


class Node:
    """Something that can sit in a reference cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def freezer() -> Iterator[tuple[FreezeSurvivors, Clock]]:
    clock = Clock()
    installed = FreezeSurvivors(10.0, clock=clock).install()
    try:
        yield installed, clock
    finally:
        installed.uninstall()
        gc.collect()


def _cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_survivors_of_a_full_collection_are_frozen_and_not_scanned_again(
    freezer: tuple[FreezeSurvivors, Clock],
) -> None:
    installed, _clock = freezer
    assert gc_pauses.current() is installed
    kept = [Node() for _ in range(1000)]
    gc.collect()
    assert installed.freezes == 1
    assert gc.get_freeze_count() >= len(kept)
    # A collection's scan covers only the objects not frozen.
    assert sum(gc.get_count()) < gc.get_freeze_count()
    assert installed.describe() == {"unfreeze_interval": 10.0, "freezes": 1, "unfreezes": 0}
    # Only full collections freeze.
    gc.collect(0)
    gc.collect(1)
    assert installed.freezes == 1


def test_cyclic_garbage_among_frozen_objects_waits_for_the_unfreeze(
    freezer: tuple[FreezeSurvivors, Clock],
) -> None:
    installed, clock = freezer
    ref = _cycle()
    # A cycle nobody refers to when a full collection runs is collected by it.
    gc.collect()
    assert ref() is None
    holder = [Node()]
    holder[0].other = Node()
    holder[0].other.other = holder[0]
    weak = weakref.ref(holder[0])
    gc.collect()  # alive: frozen with the survivors
    assert installed.freezes >= 2
    holder.clear()  # now cyclic garbage, but frozen
    gc.collect()
    assert weak() is not None  # not collected while frozen: the documented cost
    clock.now = 11.0  # the interval passed: the next full collection unfreezes
    gc.collect()
    assert installed.unfreezes == 1
    gc.collect()  # scans everything once
    assert weak() is None


def test_uninstall_unfreezes_and_a_bad_interval_is_refused() -> None:
    installed = FreezeSurvivors(5.0).install()
    assert installed.install() is installed  # idempotent
    gc.collect()
    assert gc.get_freeze_count() > 0
    installed.uninstall()
    assert gc.get_freeze_count() == 0
    assert gc_pauses.current() is None
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError):
            FreezeSurvivors(bad)


def test_a_python_newer_than_measured_gets_a_warning_at_install(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # On a CPython whose collector may report no generation-2 collections (3.14's is
    # incremental) the helper would do nothing: say so rather than stay silent.
    monkeypatch.setattr(gc_pauses, "MEASURED_UP_TO", (3, 10))
    with caplog.at_level("WARNING", logger=gc_pauses.__name__):
        installed = FreezeSurvivors(5.0).install()
        installed.install()  # idempotent: one warning
        installed.uninstall()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "measured on CPython up to 3.10" in warnings[0], warnings
    caplog.clear()
    monkeypatch.setattr(gc_pauses, "MEASURED_UP_TO", (3, 13))
    with caplog.at_level("WARNING", logger=gc_pauses.__name__):
        FreezeSurvivors(5.0).install().uninstall()
    assert caplog.records == []
