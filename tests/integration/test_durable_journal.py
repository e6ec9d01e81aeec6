"""The durable journal seam without a cluster: what is synced when, in each mode,
what a test build records, and the torn-tail repair at start.

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_durable_journal.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.integration
def test_a_node_with_an_unreadable_snapshot_stops_with_status_70(tmp_path: Path) -> None:
    data_dir = tmp_path / "n1"
    data_dir.mkdir()
    (data_dir / "raft.dump").write_bytes(b"\x1f\x8b\x08\x00 not a whole gzip stream")
    from raftlease.testing import free_port_block

    base = free_port_block(1)
    member = f"n1,127.0.0.1:{base + 100},127.0.0.1:{base}"
    args = ["--id", "n1", "--data-dir", str(data_dir), "--member", member]
    from raftlease.testing.certs import ClusterCerts

    args += [f"--set={k}={v}" for k, v in ClusterCerts(tmp_path / "certs").settings("n1").items()]
    node = subprocess.run(
        [sys.executable, "-m", "raftlease", "node", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert node.returncode == 70, node.stdout + node.stderr
    assert "CRITICAL" in node.stderr and "cannot read the snapshot" in node.stderr
