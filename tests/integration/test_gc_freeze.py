"""A node freezes the survivors of its full garbage collections unless
``gc_unfreeze_interval`` is 0 (raftlease/gc_pauses.py; the class's own rules:
tests/unit/test_gc_pauses.py), and sets the GIL's switch interval to
``switch_interval`` unless it is 0: its status says so, on real node processes."""

from __future__ import annotations

import pytest

from raftlease.testing import LocalCluster
from tests.conftest import FAST_SETTINGS
from tests.unit.test_planted_bugs import status_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_nodes_freeze_gc_survivors_by_default_and_not_with_zero() -> None:
    cluster = LocalCluster(
        2,
        settings=dict(FAST_SETTINGS),
        node_settings={"n2": {"gc_unfreeze_interval": 0, "switch_interval": 0}},
    )
    try:
        cluster.start()
        on = status_of(cluster.node("n1").client)
        off = status_of(cluster.node("n2").client)
        assert on is not None and off is not None
        assert on["gc_freeze"]["unfreeze_interval"] == 600.0
        assert on["gc_freeze"]["freezes"] >= 0 and on["gc_freeze"]["unfreezes"] == 0
        assert off["gc_freeze"] is None
        # The GIL's switch interval: the setting's 1 ms, or Python's own 5 ms with 0.
        assert on["switch_interval"] == pytest.approx(0.001)
        assert off["switch_interval"] == pytest.approx(0.005)
    finally:
        cluster.close()
