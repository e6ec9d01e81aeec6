"""The etcd and ZooKeeper anchors of ``scripts/bench`` (issue 16).

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_bench_anchors.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_bench_anchors import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

from benchlib import context
from benchlib.anchors import etcd, zookeeper

pytestmark = pytest.mark.timeout(120)


# ------------------------------------------------------------------ real servers


def _short_run(tmp_path: Path, name: str) -> dict[str, Any]:
    from benchlib.anchors import run

    profile = context.QUICK
    ctx = context.Context(profile, tmp_path, {"acquire", "renew", "holder", "handoff", "failover"})
    run.anchors(ctx, [name])
    system: dict[str, Any] = ctx.result["anchors"]["systems"][name]
    assert "error" not in system, system["error"]
    return system


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.skipif(etcd.installed() is not None, reason=str(etcd.installed()))
def test_etcd_cluster_measured(tmp_path: Path) -> None:
    system = _short_run(tmp_path, "etcd")
    w = system["workloads"]
    for group in ("acquire", "renew", "holder linearizable", "holder serializable"):
        for mode in ("1 thread", "16 threads"):
            entry = w[group][mode]
            assert entry["ops_per_s"]["median"] > 0 and entry["errors"] == 0, (group, mode)
            assert len(entry["cpu_s"]) == 5  # client, 3 servers, others
    handoff = next(iter(w["handoff"].values()))
    assert handoff["ops_per_s"]["median"] > 0 and 0 < handoff["jain_index"] <= 1
    _check_failover_and_stop(system)


def _check_failover_and_stop(system: dict[str, Any]) -> None:
    failover = system["workloads"]["failover"]["SIGKILL leader"]
    assert failover["deadline_s"] == 0.25 and failover["reps"]
    assert all(r["time_to_success_s"] > 0 for r in failover["reps"])
    # Every server, the restarted one included, stopped by pid at the end of the phase.
    assert set(system["pids_stopped"]) == set(system["pids"])
    assert set(system["pids_stopped"].values()) != set(system["pids"].values())  # a restart
    for pid in (*system["pids"].values(), *system["pids_stopped"].values()):
        assert not Path(f"/proc/{pid}").exists(), pid


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.skipif(zookeeper.installed() is not None, reason=str(zookeeper.installed()))
def test_zookeeper_ensemble_measured(tmp_path: Path) -> None:
    system = _short_run(tmp_path, "zookeeper")
    w = system["workloads"]
    for group in ("acquire", "renew", "holder get"):
        for mode in ("1 thread", "16 threads"):
            entry = w[group][mode]
            assert entry["ops_per_s"]["median"] > 0 and entry["errors"] == 0, (group, mode)
    handoff = next(iter(w["handoff"].values()))
    assert handoff["ops_per_s"]["median"] > 0
    _check_failover_and_stop(system)
