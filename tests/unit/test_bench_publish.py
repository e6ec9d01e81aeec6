"""``scripts/bench --publish``: the figures users read are written from a saved run.

Without a cluster: the blocks rendered from a hand-made result, the marker
replacement, the errors that keep a stale figure from passing unnoticed, and that
README.md, docs/performance.md and docs/certificates.md carry every block's markers.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "scripts" / "bench"
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib import publish  # noqa: E402 - found through scripts/

pytestmark = pytest.mark.timeout(60)


def _e(rate: float, cpu_servers: float | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "mode": "m",
        "ops_per_s": {"median": rate, "spread_pct": 5.0},
        "p50_ms": 1.0,
        "p99_ms": 2.0,
    }
    if cpu_servers is not None:
        entry["cpu_us_per_op"] = {"client": 1.0, "servers": cpu_servers}
    return entry


META = {
    "profile": "full",
    "started": "2026-12-06 16:00:00 UTC",
    "cpus": 2,
    "loadavg_start": [0.5, 0.4, 0.3],
    "repeat": 3,
    "duration_s": 3.0,
    "code": {"git_head": "0123456789abcdef"},
    "argv": ["--only", "acquire", "--anchors", "etcd"],
}


@pytest.fixture
def anchored() -> dict[str, Any]:
    return {
        "meta": dict(META),
        "raw": {"sync_1thread": {"ops_per_s": {"median": 2000.0}}},
        "workloads": {"acquire": {"1 thread": _e(1500.0, 800.0)}},
        "anchors": {
            "skipped": {},
            "systems": {
                "etcd": {
                    "version": "3.4.23",
                    "workloads": {"acquire": {"1 thread": _e(1000.0, 900.0)}},
                }
            },
        },
        "targets": [
            {"target": "acquire >= 1.5x", "figure": "1.50x", "met": True, "issue": 16},
            {"target": "something else", "figure": "x", "met": False, "issue": 12},
        ],
    }


@pytest.fixture
def secured() -> dict[str, Any]:
    def cluster(rate: float) -> dict[str, Any]:
        return {"workloads": {"acquire": {"1 thread": _e(rate)}}}

    return {
        "meta": dict(META),
        "security": {
            "clusters": {"plain-peers": cluster(1000.0), "insecure": cluster(900.0)},
            "peer_rounds": {
                "modes": ["1 thread"],
                "rounds": [
                    {"plain-peers": cluster(1000.0), "insecure": cluster(900.0)},
                    {"plain-peers": cluster(1000.0), "insecure": cluster(950.0)},
                ],
            },
        },
        "targets": [{"target": "peer TLS", "figure": "0.93", "met": False, "issue": 35}],
    }


def _blocks(tmp_path: Path) -> tuple[publish.Block, ...]:
    readme, perf = tmp_path / "README.md", tmp_path / "performance.md"
    readme.write_text(
        "# title\n<!-- bench:figures:start -->\nold\n<!-- bench:figures:end -->\n"
        "text\n<!-- bench:peer-tls:start -->\n<!-- bench:peer-tls:end -->\n"
    )
    perf.write_text(
        "<!-- bench:anchors-run:start -->\nold\nold\n<!-- bench:anchors-run:end -->\n"
        "<!-- bench:security-run:start -->\n<!-- bench:security-run:end -->\nend\n"
    )
    certs = tmp_path / "certificates.md"
    certs.write_text("<!-- bench:certs-run:start -->\n<!-- bench:certs-run:end -->\n")
    paths = {"README.md": readme, "performance.md": perf, "certificates.md": certs}
    return tuple(publish.Block(paths[b.path.name], b.name, b.render) for b in publish.BLOCKS)


def test_anchor_blocks_are_written_from_the_result(
    tmp_path: Path, anchored: dict[str, Any]
) -> None:
    blocks = _blocks(tmp_path)
    written = publish.publish([("run.json", anchored)], blocks, root=tmp_path)
    assert written == [
        "README.md [figures] from run.json",
        "performance.md [anchors-run] from run.json",
    ]
    readme = (tmp_path / "README.md").read_text()
    assert "old" not in readme and readme.startswith("# title\n<!-- bench:figures:start -->\n")
    assert "Measured 2026-12-06 16:00:00 UTC on 2 CPUs" in readme
    assert "git 0123456, full profile, `scripts/bench --only acquire --anchors etcd`" in readme
    assert "| acquire (ops/s) | 1 thread | 1,500 | 1,000 | 1.50x |" in readme
    # The peer TLS block had no source in this result: untouched.
    assert "<!-- bench:peer-tls:start -->\n<!-- bench:peer-tls:end -->" in readme
    perf = (tmp_path / "performance.md").read_text()
    assert "| acquire (ops/s) | 1 thread | 1,500 | 1,000 | etcd 1,000 | 1.50x |" in perf
    assert "- acquire >= 1.5x: 1.50x: met" in perf
    assert "something else" not in perf  # another issue's target
    assert "## raftlease beside" not in perf  # the doc has its own heading
    assert perf.endswith("<!-- bench:security-run:end -->\nend\n")


def test_security_blocks_and_several_results(
    tmp_path: Path, anchored: dict[str, Any], secured: dict[str, Any]
) -> None:
    blocks = _blocks(tmp_path)
    written = publish.publish([("a.json", anchored), ("s.json", secured)], blocks, root=tmp_path)
    assert len(written) == 4
    readme = (tmp_path / "README.md").read_text()
    assert "median of 2 alternating rounds: 0.93 at 1 thread" in readme
    perf = (tmp_path / "performance.md").read_text()
    assert "- peer TLS: 0.93: **not met**" in perf
    assert "1 thread: 0.90, 0.95 (median 0.93)" in perf
    # Publishing again replaces, never stacks.
    publish.publish([("a.json", anchored), ("s.json", secured)], blocks, root=tmp_path)
    assert (tmp_path / "README.md").read_text() == readme
    assert (tmp_path / "performance.md").read_text() == perf


def test_an_anchors_phase_that_measured_nothing_publishes_nothing(
    tmp_path: Path, anchored: dict[str, Any]
) -> None:
    """``--only certs`` in the full profile still runs the anchors phase, which then
    measures no workload: its empty table must not replace the published one."""
    blocks = _blocks(tmp_path)
    before = (tmp_path / "README.md").read_text()
    empty = copy.deepcopy(anchored)
    empty["workloads"] = {}
    empty["anchors"]["systems"]["etcd"]["workloads"] = {}
    with pytest.raises(publish.PublishError, match=r"empty\.json has no section"):
        publish.publish([("empty.json", empty)], blocks, root=tmp_path)
    assert (tmp_path / "README.md").read_text() == before


def test_a_result_that_feeds_nothing_is_an_error(tmp_path: Path, anchored: dict[str, Any]) -> None:
    blocks = _blocks(tmp_path)
    before = (tmp_path / "README.md").read_text()
    bare = {"meta": dict(META), "workloads": {}}
    with pytest.raises(publish.PublishError, match=r"bare\.json has no section"):
        publish.publish([("run.json", anchored), ("bare.json", bare)], blocks, root=tmp_path)
    # Nothing was written, not even the block the first result fed.
    assert (tmp_path / "README.md").read_text() == before


@pytest.mark.parametrize(
    "text",
    [
        "no markers\n",
        "<!-- bench:figures:end -->\n<!-- bench:figures:start -->\n",
        "<!-- bench:figures:start -->\n<!-- bench:figures:end -->\n" * 2,
    ],
)
def test_missing_or_broken_markers_are_an_error(
    tmp_path: Path, anchored: dict[str, Any], text: str
) -> None:
    blocks = _blocks(tmp_path)
    (tmp_path / "README.md").write_text(text)
    with pytest.raises(publish.PublishError, match=r"README.md: no single .*figures"):
        publish.publish([("run.json", anchored)], blocks, root=tmp_path)
    assert (tmp_path / "README.md").read_text() == text


def test_the_docs_carry_every_block() -> None:
    for block in publish.BLOCKS:
        text = block.path.read_text()
        start = f"<!-- bench:{block.name}:start -->"
        end = f"<!-- bench:{block.name}:end -->"
        assert text.count(start) == 1 and text.count(end) == 1, (block.path, block.name)
        inner = text.split(start)[1].split(end)[0]
        assert inner.startswith("\nMeasured ") or "(measured " in inner, (block.path, block.name)


def test_publish_command_reports_errors(tmp_path: Path, anchored: dict[str, Any]) -> None:
    bare = copy.deepcopy(anchored)
    del bare["anchors"]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bare))
    run = subprocess.run(
        [sys.executable, str(BENCH), "--publish", str(path)],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert run.returncode == 1
    assert "has no section any published block shows" in run.stderr
    missing = subprocess.run(
        [sys.executable, str(BENCH), "--publish", str(tmp_path / "absent.json")],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert missing.returncode == 1 and "absent.json" in missing.stderr
