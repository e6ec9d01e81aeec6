"""The etcd and ZooKeeper anchors of ``scripts/bench`` (issue 16).

Without the servers (CI): the command lines, configs and request bodies the drivers
build, the parsing of the servers' replies, ``--anchors`` parsing, the comparison
table and the issue 16 target checks on a hand-made result, and that a run whose
anchors are not installed skips them and says why. With Debian's etcd-server and
zookeeper (+ a JRE and kazoo) installed, two integration tests start each 3-server
cluster and run a short measurement on it; they are skipped, with the reason,
otherwise.

The unit half of these tests (no process); the integration half is
tests/integration/test_bench_anchors.py.
"""

from __future__ import annotations

import base64
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

from benchlib import context, report, targets  # noqa: E402 - found through scripts/
from benchlib.anchors import ANCHORS, etcd, table, wanted_anchors, zookeeper  # noqa: E402
from benchlib.anchors.common import (  # noqa: E402
    AnchorError,
    Driver,
    Threads,
    entry_of,
    free_ports,
    jain,
    split,
)
from benchlib.measure import Run  # noqa: E402

pytestmark = pytest.mark.timeout(120)


# ------------------------------------------------------------------ drivers


def test_etcd_command_line() -> None:
    spec = etcd.initial_cluster(["etcd1", "etcd2"], [20001, 20002])
    assert spec == "etcd1=http://127.0.0.1:20001,etcd2=http://127.0.0.1:20002"
    argv = etcd.command("etcd1", Path("/d/etcd1"), 20011, 20001, spec)
    args = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert argv[0] == "etcd"
    assert args["--name"] == "etcd1" and args["--data-dir"] == "/d/etcd1"
    assert args["--listen-client-urls"] == args["--advertise-client-urls"]
    assert args["--listen-client-urls"] == "http://127.0.0.1:20011"
    assert args["--listen-peer-urls"] == "http://127.0.0.1:20001"
    assert args["--initial-cluster"] == spec
    assert args["--initial-cluster-state"] == "new"
    # Default settings: nothing that turns the WAL fsync off or changes timing.
    assert not any("unsafe" in a or "heartbeat" in a or "election" in a for a in argv)


def test_etcd_acquire_is_a_create_only_txn_in_base64() -> None:
    body = etcd.acquire_txn("bench/k/1", "agent", "42")
    (compare,) = body["compare"]
    assert base64.b64decode(compare["key"]) == b"bench/k/1"
    assert compare == {
        "key": compare["key"],
        "result": "EQUAL",
        "target": "CREATE",
        "create_revision": "0",
    }
    (put,) = body["success"]
    assert base64.b64decode(put["request_put"]["value"]) == b"agent"
    assert put["request_put"]["lease"] == "42"
    json.dumps(body)  # what the gateway gets


def test_etcd_status_parsing() -> None:
    reply = {"header": {"member_id": "123", "revision": "1"}, "leader": "456"}
    assert etcd.parse_status(reply) == ("123", "456")
    assert etcd.parse_status({"header": {"member_id": "7"}}) == ("7", "0")


def test_zookeeper_config_and_command() -> None:
    cfg = zookeeper.config(Path("/d/zk1"), 20100, [(20101, 20102), (20103, 20104)])
    lines = cfg.splitlines()
    assert "dataDir=/d/zk1" in lines and "clientPort=20100" in lines
    assert "clientPortAddress=127.0.0.1" in lines
    assert "forceSync=yes" in lines and "tickTime=2000" in lines
    assert "server.1=127.0.0.1:20101:20102" in lines
    assert "server.2=127.0.0.1:20103:20104" in lines
    assert any(line.startswith("4lw.commands.whitelist=") and "srvr" in line for line in lines)
    argv = zookeeper.command(Path("/d/zk1.cfg"), Path("/d"))
    assert argv[0] == "java" and "-Xmx1000m" in argv
    assert argv[-2:] == [zookeeper.MAIN_CLASS, "/d/zk1.cfg"]


def test_zookeeper_srvr_parsing() -> None:
    text = "Zookeeper version: 3.8.0\nLatency min/avg/max: 0/0.0/0\nMode: follower\nNode count: 5\n"
    assert zookeeper.parse_srvr(text) == "follower"
    assert zookeeper.parse_srvr("Mode: leader\n") == "leader"
    assert zookeeper.parse_srvr("This ZooKeeper instance is not currently serving") is None


def test_free_ports_are_distinct_and_below_32768() -> None:
    ports = free_ports(9)
    assert len(set(ports)) == 9 and all(1024 < p < 32768 for p in ports)


def test_small_helpers() -> None:
    assert split(10, 3) == [4, 3, 3] and sum(split(7, 16)) == 7
    assert jain([5, 5, 5]) == pytest.approx(1.0)
    assert jain([10, 0]) == pytest.approx(0.5)
    assert jain([0, 0]) == 0.0
    runs = [
        Run(300, 1, 3.0, [0.001] * 300, cpu={"client": 0.3, "a": 0.1, "b": 0.1, "others": 1.0}),
        Run(330, 0, 3.0, [0.002] * 330, cpu={"client": 0.3, "a": 0.2, "b": 0.1, "others": 1.0}),
    ]
    entry = entry_of(runs, "1 thread")
    assert entry["ops_per_s"]["median"] == pytest.approx(105.0)
    assert entry["errors"] == 1 and entry["ops"] == 630
    # Servers = every process but the client and the rest of the machine.
    assert entry["cpu_us_per_op"]["servers"] == pytest.approx((0.15 + 0.1) / 315 * 1e6)
    assert "cpu_us_per_op" not in entry_of(runs, "1 thread", cpu_valid=False)


class _FakeDriver(Driver[list[int]]):
    """Client objects are lists recording the calls made on them."""

    def __init__(self) -> None:
        self.made: list[list[int]] = []
        self.closed = 0

    def connect(self) -> list[int]:
        self.made.append([])
        return self.made[-1]

    def close(self, client: list[int]) -> None:
        self.closed += 1


def test_load_threads_have_one_client_each() -> None:
    driver = _FakeDriver()
    with Threads(driver, 4) as threads:
        assert len(driver.made) == 4

        def op(c: list[int], i: int) -> bool:
            if i >= 5:
                return False  # this thread's pool is used up
            c.append(i)
            if i == 2:
                raise AnchorError("refused")  # counted, the loop goes on
            return True

        run = threads.run(op, 30.0)
        assert run.elapsed < 30.0  # ended by the pools, not the clock
        assert all(c == [0, 1, 2, 3, 4] for c in driver.made)
        assert run.ops == 16 and run.errors == 4
        assert run.extra["per_thread"] == [4, 4, 4, 4]

        def bad_setup(c: list[int], w: int) -> None:
            if w == 1:
                raise RuntimeError("set-up failed")

        with pytest.raises(RuntimeError, match="set-up failed"):
            threads.run(op, 30.0, bad_setup)
    assert driver.closed == 4


# ------------------------------------------------------------------ selection


def test_anchors_option() -> None:
    assert wanted_anchors("default", quick=True) == []
    assert wanted_anchors("default", quick=False) == list(ANCHORS)
    assert wanted_anchors("auto", quick=True) == ["etcd", "zookeeper"]
    assert wanted_anchors("none", quick=False) == []
    assert wanted_anchors("zookeeper, etcd,zookeeper", quick=True) == ["zookeeper", "etcd"]
    with pytest.raises(ValueError, match="unknown anchor"):
        wanted_anchors("etcd,consul", quick=False)


@pytest.mark.parametrize(("only", "started"), [({"certs"}, False), ({"release"}, True)])
def test_anchors_start_only_for_a_group_they_measure(
    only: set[str], started: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--only certs`` with anchors in the profile starts no etcd or ZooKeeper (the
    phase would measure nothing); ``--only release`` does. The phases are stubbed:
    only the runner's choice is under test."""
    import dataclasses

    from benchlib import runner
    from benchlib.anchors import run as anchors_run

    calls: list[list[str]] = []
    monkeypatch.setattr(runner, "guarded", lambda *a, **k: True)
    monkeypatch.setattr(runner, "main_cluster", lambda ctx: None)
    monkeypatch.setattr(anchors_run, "anchors", lambda ctx, names: calls.append(names))
    profile = dataclasses.replace(context.QUICK, anchors=("etcd",))
    ctx = context.Context(profile, tmp_path, only)
    runner.run_all(ctx, {})
    assert calls == ([["etcd"]] if started else [])


def test_anchor_groups_are_the_groups_the_anchors_measure() -> None:
    from benchlib.anchors import run as anchors_run

    assert set(anchors_run.ANCHOR_GROUPS) <= set(context.MAIN_GROUPS)
    assert "certs" not in anchors_run.ANCHOR_GROUPS


def test_bench_refuses_an_unknown_anchor() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--anchors", "consul"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "unknown anchor(s): consul" in proc.stderr


def test_missing_servers_are_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchlib.anchors import run

    monkeypatch.setattr(etcd, "ETCD", "no-such-etcd")
    monkeypatch.setattr(zookeeper, "JAR", tmp_path / "no-zookeeper.jar")
    ctx = context.Context(context.QUICK, tmp_path)
    run.anchors(ctx, ["etcd", "zookeeper"])
    section = ctx.result["anchors"]
    assert section["systems"] == {}
    assert "no-such-etcd not found on PATH" in section["skipped"]["etcd"]
    assert "no-zookeeper.jar not found" in section["skipped"]["zookeeper"]
    markdown = report.render_markdown(_with_meta(ctx.result))
    assert "- **etcd skipped**: no-such-etcd not found on PATH" in markdown
    assert "- **ZooKeeper skipped**:" in markdown and "No anchor was measured." in markdown
    rows = [r for r in targets.evaluate(ctx.result, ["16 threads"]) if r.get("issue") == 16]
    assert rows and all(r["met"] is None for r in rows)
    assert "etcd: no-such-etcd not found on PATH" in rows[0]["figure"]


def _with_meta(result: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(result)
    out["meta"] = {"profile": "quick", "started": "now", "code": {}}
    return out


# ------------------------------------------------------------------ table


def _issue16() -> list[Any]:
    """The issue 16 targets of the data file (the others need full raftlease entries)."""
    return [s for s in targets.load_specs() if s.get("issue") == 16]


def _e(rate: float, cpu_servers: float | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"mode": "m", "ops_per_s": {"median": rate}, "p50_ms": 1.0}
    if cpu_servers is not None:
        entry["cpu_us_per_op"] = {"client": 1.0, "servers": cpu_servers}
    return entry


def _fo(seconds: float) -> dict[str, Any]:
    return {
        "SIGKILL leader": {
            "mode": "SIGKILL leader",
            "time_to_success_s": {"median": seconds},
            "deadline_s": 0.25,
            "reps": [{"time_to_success_s": seconds}],
        }
    }


@pytest.fixture
def compared() -> dict[str, Any]:
    both = ("1 thread", "16 threads")
    return {
        "meta": {"profile": "full", "started": "now", "code": {}},
        "raw": {
            "sync_1thread": {"ops_per_s": {"median": 2000.0}},
            "pipelined_1000": {"ops_per_s": {"median": 10000.0}},
        },
        "workloads": {
            "acquire": {"1 thread": _e(1500.0, 800.0), "16 threads": _e(4500.0)},
            "renew": {m: _e(1500.0) for m in both},
            "release": {m: _e(1000.0) for m in both},
            "holder linearizable": {m: _e(6000.0) for m in both},
            "handoff": {"spin": _e(300.0), "queued": _e(800.0)},
            "failover": _fo(0.4),
        },
        "anchors": {
            "requested": ["etcd", "zookeeper"],
            "skipped": {},
            "systems": {
                "etcd": {
                    "version": "3.4.23",
                    "workloads": {
                        "acquire": {"1 thread": _e(1000.0, 900.0), "16 threads": _e(3000.0)},
                        "renew": {m: _e(1000.0) for m in both},
                        "release": {m: _e(500.0) for m in both},
                        "holder linearizable": {m: _e(2500.0) for m in both},
                        "holder serializable": {m: _e(4000.0) for m in both},
                        "handoff": {"8 clients": _e(80.0)},
                        "failover": _fo(2.0),
                    },
                },
                "zookeeper": {
                    "version": "3.8.0",
                    "workloads": {
                        "acquire": {"1 thread": _e(900.0, 700.0), "16 threads": _e(2000.0)},
                        "renew": {m: _e(1600.0) for m in both},
                        "release": {"1 thread": {"error": "boom"}, "16 threads": _e(800.0)},
                        "holder get": {m: _e(5000.0) for m in both},
                        "handoff": {"8 clients": _e(500.0)},
                        "failover": _fo(0.8),
                    },
                },
            },
        },
        "targets": [],
        "methods": {},
    }


def test_comparison_rows(compared: dict[str, Any]) -> None:
    rows = {(r["workload"], r["mode"]): r for r in table.comparison_rows(compared)}
    acq = rows[("acquire (ops/s)", "1 thread")]
    assert acq["best"] == "etcd 1,000" and acq["factor"] == pytest.approx(1.5)
    assert acq["raw"] == 2000.0 and acq["vs_raw"] == pytest.approx(0.75)
    assert rows[("acquire (ops/s)", "16 threads")]["raw"] == 10000.0
    # The best anchor of a read is the best of all its read modes.
    read = rows[("read holder (ops/s)", "1 thread")]
    assert read["anchors"]["etcd"] == "lin 2,500 / ser 4,000"
    assert read["best"] == "ZooKeeper get 5,000" and read["factor"] == pytest.approx(1.2)
    # A failed anchor variant is "-" and does not count.
    rel = rows[("release (ops/s)", "1 thread")]
    assert rel["anchors"]["zookeeper"] == "-" and rel["best"] == "etcd 500"
    handoff = rows[("handoff, one lock (grants/s)", "queued")]
    assert handoff["best"] == "ZooKeeper 500" and handoff["factor"] == pytest.approx(1.6)
    # Lower is better: factor = best anchor / raftlease.
    fo = rows[("failover: SIGKILL leader -> next acquire (s)", "median")]
    assert fo["best"] == "ZooKeeper 0.800" and fo["factor"] == pytest.approx(2.0)
    cpu = rows[("server CPU per acquire, 3 processes (us)", "1 thread")]
    assert cpu["best"] == "ZooKeeper 700" and cpu["factor"] == pytest.approx(700 / 800)
    markdown = "\n".join(table.render(compared))
    assert "## raftlease beside etcd and ZooKeeper (same run)" in markdown
    assert "| acquire (ops/s) | 1 thread | 1,500 | 1,000 | 900 | etcd 1,000 | 1.50x |" in markdown
    assert "ZooKeeper failover (0.25 s client deadline): 0.800 s." in markdown


def test_issue16_targets(compared: dict[str, Any]) -> None:
    rows = {
        r["target"]: r for r in targets.evaluate(compared, specs=_issue16()) if r.get("issue") == 16
    }
    acq1 = rows["acquire, 1 thread >= 1.5x the better of etcd and ZooKeeper"]
    assert acq1["met"] is True and acq1["figure"].startswith("1.50x (1,500/s vs etcd")
    assert rows["acquire, 16 threads >= 1.5x the better of etcd and ZooKeeper"]["met"] is True
    assert rows["release, 1 thread >= 1.5x the better of etcd and ZooKeeper"]["met"] is True
    assert rows["release, 16 threads >= 1.5x the better of etcd and ZooKeeper"]["met"] is False
    assert rows["renew, 1 thread >= 1.5x etcd's keep-alive"]["met"] is True
    assert rows["linearizable read, 1 thread >= 2x etcd's linearizable"]["met"] is True
    assert rows["linearizable read, 1 thread >= etcd's serializable"]["met"] is True
    failover = rows["failover: SIGKILL to next acquire, median <= 0.5 s and under ZooKeeper's"]
    assert failover["met"] is True and failover["figure"] == "0.400 s (ZooKeeper 0.800 s)"
    cpu = rows["server CPU per acquire at 1 thread <= ZooKeeper's"]
    assert cpu["met"] is False and cpu["figure"] == "800 us vs ZooKeeper 700 us"
    # The same result without its anchors section has no issue 16 rows at all.
    del compared["anchors"]
    assert not [r for r in targets.evaluate(compared, specs=_issue16()) if r.get("issue") == 16]


def test_issue15_etcd_target_is_judged_from_the_anchors(compared: dict[str, Any]) -> None:
    name = "with fsync, concurrent acquire ahead of etcd (which fsyncs) on the same workload"
    specs = [s for s in targets.load_specs() if s["name"] == name]
    assert targets.evaluate(compared, specs=specs) == []  # no durability phase: no row
    compared["durability"] = {"modes": ["fsync"]}
    (row,) = targets.evaluate(compared, specs=specs)
    assert row["issue"] == 15 and row["met"] is True
    assert row["figure"] == "1.50x (4,500/s vs etcd 3,000/s)"
    del compared["anchors"]
    (row,) = targets.evaluate(compared, specs=specs)
    assert row["met"] is None and row["figure"].startswith("not measured: run with --anchors")


def test_one_anchor_skipped_leaves_its_targets_not_applicable(compared: dict[str, Any]) -> None:
    del compared["anchors"]["systems"]["zookeeper"]
    compared["anchors"]["skipped"]["zookeeper"] = "kazoo not installed"
    rows = {
        r["target"]: r for r in targets.evaluate(compared, specs=_issue16()) if r.get("issue") == 16
    }
    both = rows["acquire, 1 thread >= 1.5x the better of etcd and ZooKeeper"]
    assert both["met"] is None and "ZooKeeper: kazoo not installed" in both["figure"]
    # A target against etcd alone is still judged.
    assert rows["renew, 1 thread >= 1.5x etcd's keep-alive"]["met"] is True
    assert "- **ZooKeeper skipped**: kazoo not installed" in table.render(compared)
