"""The benchmark's scale phase (issue 16; scripts/benchlib/workloads/scale.py).

Fast tests of its pure parts on synthetic figures: the latency summary, the ramp's
levels and shares, the merge of the agent processes' reports, the rule that stops
the ramp, the report section and the target row that judges both halves of the
scale target (agents from this phase, RSS from the memory phase). Two integration
tests run ``scripts/bench --quick --only scale``: once to the end (its figures are
not judged: the machine decides them), once interrupted with SIGINT, after which
no agent process and no node may be left running.

The unit half of these tests (no process); the integration half is
tests/integration/test_bench_scale.py.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib import report, targets  # noqa: E402 - benchlib is found through scripts/
from benchlib.workloads import scale  # noqa: E402

NAME = (
    "20,000 agents with lease sessions, p99 keep-alive < 100 ms, none lost; "
    "100,000 leases < 100 MiB RSS"
)


# ---------------------------------------------------------------- pure parts


@pytest.mark.timeout(30)
def test_summarize_gives_nearest_rank_percentiles_in_ms() -> None:
    latencies = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    s = scale.summarize(latencies)
    assert s["keepalives"] == 100
    assert s["p50_ms"] == pytest.approx(51.0) and s["p99_ms"] == pytest.approx(99.0)
    assert s["max_ms"] == pytest.approx(100.0)
    assert scale.summarize([]) == {"keepalives": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}


@pytest.mark.timeout(30)
def test_levels_and_shares() -> None:
    assert scale.levels(20_000, 10) == [2_000 * k for k in range(1, 11)]
    assert scale.levels(300, 1) == [300]
    assert scale.levels(3, 10) == [1, 2, 3]  # never more steps than agents
    assert scale.shares(10, 4) == [3, 3, 2, 2] and sum(scale.shares(20_000, 4)) == 20_000
    assert scale.shares(0, 4) == [0, 0, 0, 0]


@pytest.mark.timeout(30)
def test_merge_sums_counters_and_joins_latencies() -> None:
    a = {"opened": 5, "lost": 1, "alive": 4, "latencies": [0.01], "lost_kinds": {"X": 1}}
    b = {"opened": 3, "failed": 2, "alive": 3, "latencies": [0.02, 0.03]}
    b["failed_kinds"] = {"TIMEOUT": 2}
    merged = scale.merge([a, b])
    assert merged["opened"] == 8 and merged["alive"] == 7 and merged["lost"] == 1
    assert merged["failed"] == 2 and merged["failed_kinds"] == {"TIMEOUT": 2}
    assert merged["lost_kinds"] == {"X": 1} and merged["open_error_kinds"] == {}
    assert sorted(merged["latencies"]) == [0.01, 0.02, 0.03]
    later = {**merged, "opened": 10, "lost": 3}
    assert scale.delta(later, merged) == {
        "opened": 2,
        "open_errors": 0,
        "failed": 0,
        "lost": 2,
        "closed": 0,
        "keepalive_requests": 0,
        "keepalives_batched": 0,
    }


def _step(agents: int = 2000, **over: Any) -> dict[str, Any]:
    """A step that held: 2,000 agents, interval 10/3 s, a 4.2 s window."""
    interval = 10 / 3
    latencies = [0.02] * 2400 + [0.08] * 100
    step: dict[str, Any] = {"agents": agents, "lost": 0, "open_errors": 0}
    step.update(scale.window_figures(latencies, agents, 1.25 * interval, interval))
    step.update(over)
    return step


@pytest.mark.timeout(30)
def test_window_figures() -> None:
    step = _step()
    assert step["due_per_s"] == pytest.approx(600.0) and step["due"] == pytest.approx(2500.0)
    assert step["per_s"] == pytest.approx(2500 / 4.1666, rel=1e-3)
    assert step["p99_ms"] == pytest.approx(80.0) and step["p50_ms"] == pytest.approx(20.0)


@pytest.mark.timeout(30)
def test_ramp_stops_on_loss_refusal_lateness_or_backlog() -> None:
    interval = 10 / 3
    assert scale.ramp_verdict(_step(), interval) is None
    lost = scale.ramp_verdict(_step(lost=2), interval)
    assert lost == "2 session(s) lost at 2,000 agents"
    refused = scale.ramp_verdict(_step(open_errors=1), interval)
    assert refused == "1 agent(s) could not open at 2,000 agents"
    # With the codes the agents saw: OVERLOADED is the leader's admission control.
    shed = scale.ramp_verdict(_step(open_errors=21, open_error_kinds={"OVERLOADED": 21}), interval)
    assert shed == "21 agent(s) could not open at 2,000 agents (OVERLOADED 21)"
    late = scale.ramp_verdict(_step(p99_ms=3500.0), interval)
    assert late == "keep-alive p99 3,500 ms > ttl/3 3,333 ms at 2,000 agents"
    # p99 exactly at ttl/3 still holds; only above it stops.
    assert scale.ramp_verdict(_step(p99_ms=interval * 1000), interval) is None
    # Keep-alives that never completed in the window: the cluster is behind.
    behind = scale.ramp_verdict(_step(keepalives=1000, per_s=240.0), interval)
    assert behind is not None and behind.startswith("only 1,000 of the ~2,500 keep-alives due")
    assert scale.ramp_verdict(_step(keepalives=1875), interval) is None  # 75 % is enough
    assert scale.ramp_verdict(_step(keepalives=0), interval) == (
        "no keep-alive completed in the window at 2,000 agents"
    )
    timeout = scale.ramp_verdict({"agents": 4000, "open_timeout": 35.0}, interval)
    assert timeout == "opening the agents of the step to 4,000 took longer than 35 s"
    # A loss outranks lateness in the reason given.
    assert scale.ramp_verdict(_step(lost=1, p99_ms=9000.0), interval).startswith("1 session")


# -------------------------------------------------------- report and target


def _hold(agents: int, p99: float) -> dict[str, Any]:
    hold: dict[str, Any] = {"agents": agents, "alive_end": agents, "lost": 0, "failed": 0}
    hold.update(scale.window_figures([0.01] * 100, agents, 60.0, 10 / 3))
    hold.update({"keepalives": agents * 18, "p99_ms": p99, "max_ms": 2 * p99})
    hold.update({"per_s": agents * 18 / 60.0, "failed_kinds": {}, "leader": "n2"})
    hold["cpu_share"] = {"n1": 0.3, "n2": 0.9, "n3": 0.3, "agents-0": 0.1, "agents-1": 0.1}
    hold["cpu_share"].update({"client": 0.0, "others": 0.05})
    hold["leader_cpu_share"] = 0.9
    hold["journal"] = {"n2": {"journal_syncs": agents * 3}}
    return hold


def _scale_entry(requested: int, sustained: int, p99: float, stopped: str | None) -> dict[str, Any]:
    steps = [_step(n) | {"verdict": None, "open_seconds": 1.0} for n in (sustained // 2, sustained)]
    if stopped:
        steps.append({"agents": sustained + 1000, "open_seconds": 2.0, "verdict": stopped})
        steps[-1].update(scale.window_figures([1.0] * 10, sustained + 1000, 4.2, 10 / 3))
    return {
        "mode": f"{requested} agents",
        "agents_requested": requested,
        "processes": 4,
        "ttl_s": 10.0,
        "interval_s": 10 / 3,
        "steps": steps,
        "stopped": stopped,
        "sustained": sustained,
        "agents_reached": sustained + (1000 if stopped else 0),
        "hold": _hold(sustained, p99),
        "ramp_seconds": 30.0,
        "open_seconds": 4.0,
        "sessions_lost": 0,
        "lost_kinds": {},
        "elections": 0,
        "rss_end_mib": {"n1": 80.0, "n2": 82.5, "n3": 79.0},
        "leader_end": {"lease_sessions": sustained, "leases": sustained},
        "agent_pids": [1, 2],
        "primary": {"name": "agents_sustained", "value": sustained},
    }


def _memory(leases: int, peak: float, settled: float | None = None) -> dict[str, Any]:
    rss = {"n1": peak - 1, "n2": peak, "n3": peak - 2}
    out: dict[str, Any] = {"leases_requested": leases, "rss_loaded_mib": rss, "rss_idle_mib": rss}
    if settled is not None:
        out["rss_settled_mib"] = {"n1": settled - 2, "n2": settled, "n3": settled - 1}
    return out


def _result(
    scale_entry: dict[str, Any] | None, memory: dict[str, Any] | None, anchors: bool = False
) -> dict[str, Any]:
    workloads: dict[str, Any] = {}
    if scale_entry is not None:
        workloads["scale"] = {scale_entry["mode"]: scale_entry}
    if memory is not None:
        workloads["memory"] = {"m": memory}
    result: dict[str, Any] = {"meta": {"profile": "full"}, "raw": {}, "workloads": workloads}
    if anchors:
        result["anchors"] = {"requested": [], "skipped": {}, "systems": {}}
    return result


def _row(result: dict[str, Any]) -> dict[str, Any] | None:
    specs = [s for s in targets.load_specs() if s["kind"] == "scale" and s["issue"] == 16]
    assert len(specs) == 1 and specs[0]["name"] == NAME
    rows = targets.evaluate(result, specs=specs)
    return rows[0] if rows else None


@pytest.mark.timeout(30)
def test_scale_target_judges_both_halves() -> None:
    met = _row(_result(_scale_entry(20_000, 20_000, 60.0, None), _memory(100_000, 95.0)))
    assert met is not None and met["met"] is True and met["issue"] == 16
    assert met["figure"] == (
        "agents: 20,000 of 20,000 sustained, hold p99 60 ms, 0 session(s) lost; "
        "RSS: max 95 MiB per node with 100,000 leases (memory phase, 1 s after the load; "
        "not settled)"
    )
    # Settled (after the load's log compaction) is what is judged when the run has it.
    steady = _row(_result(_scale_entry(20_000, 20_000, 60.0, None), _memory(100_000, 138.0, 97.0)))
    assert steady is not None and steady["met"] is True
    assert steady["figure"].endswith(
        "RSS: max 97 MiB per node settled with 100,000 leases (138 MiB 1 s after the load; "
        "memory phase)"
    )
    heavy = _row(_result(_scale_entry(20_000, 20_000, 60.0, None), _memory(100_000, 98.0, 101.0)))
    assert heavy is not None and heavy["met"] is False
    # Either half failing fails the row.
    rss = _row(_result(_scale_entry(20_000, 20_000, 60.0, None), _memory(100_000, 141.0)))
    assert rss is not None and rss["met"] is False
    slow = _row(_result(_scale_entry(20_000, 20_000, 100.0, None), _memory(100_000, 95.0)))
    assert slow is not None and slow["met"] is False  # p99 must be under 100 ms
    stopped = "keep-alive p99 4,000 ms > ttl/3 3,333 ms at 13,000 agents"
    short = _row(_result(_scale_entry(20_000, 12_000, 40.0, stopped), _memory(100_000, 95.0)))
    assert short is not None and short["met"] is False
    assert (
        f"12,000 of 20,000 sustained, hold p99 40 ms, 0 session(s) lost (ramp stopped: {stopped})"
        in short["figure"]
    )
    lost = _scale_entry(20_000, 20_000, 60.0, None)
    lost["sessions_lost"] = 1
    row = _row(_result(lost, _memory(100_000, 95.0)))
    assert row is not None and row["met"] is False and "1 session(s) lost" in row["figure"]


@pytest.mark.timeout(30)
def test_the_50k_agents_target_judges_the_agents_alone_and_only_when_the_phase_ran() -> None:
    """Issue 38's row: 50,000 agents (``--scale-agents 50000``), no RSS half."""
    specs = [s for s in targets.load_specs() if s["kind"] == "scale" and s["issue"] == 38]
    assert len(specs) == 1 and specs[0]["min_agents"] == 50_000

    def row(result: dict[str, Any]) -> dict[str, Any] | None:
        rows = targets.evaluate(result, specs=specs)
        return rows[0] if rows else None

    met = row(_result(_scale_entry(50_000, 50_000, 60.0, None), None))
    assert met is not None and met["met"] is True
    assert met["figure"] == "agents: 50,000 of 50,000 sustained, hold p99 60 ms, 0 session(s) lost"
    short = row(_result(_scale_entry(50_000, 28_000, 205.0, "lost"), None))
    assert short is not None and short["met"] is False
    default = row(_result(_scale_entry(20_000, 20_000, 60.0, None), None))
    assert default is not None and default["met"] is None  # the default run: n/a
    assert row(_result(None, _memory(100_000, 95.0), anchors=True)) is None


@pytest.mark.timeout(30)
def test_scale_target_is_not_applicable_below_full_size() -> None:
    quick = _row(_result(_scale_entry(300, 300, 20.0, None), _memory(5_000, 40.0)))
    assert quick is not None and quick["met"] is None
    assert (
        "(300 requested: n/a)" in quick["figure"]
        and "5,000 leases (memory phase, 1 s after the load; not settled) (n/a)" in quick["figure"]
    )
    # A half that is judged and fails is enough for "not met".
    half = _row(_result(_scale_entry(300, 300, 20.0, None), _memory(100_000, 141.0)))
    assert half is not None and half["met"] is False
    alone = _row(_result(_scale_entry(20_000, 20_000, 50.0, None), None))
    assert alone is not None and alone["met"] is None
    assert alone["figure"].endswith("RSS: the memory phase did not run")


@pytest.mark.timeout(30)
def test_scale_target_row_shown_with_the_phase_or_anchors() -> None:
    assert _row(_result(None, _memory(100_000, 95.0))) is None
    listed = _row(_result(None, _memory(100_000, 95.0), anchors=True))
    assert listed is not None and listed["met"] is None
    assert listed["figure"].startswith("agents: the scale phase did not run")
    failed = _result(None, None)
    failed["workloads"]["scale"] = {"error": "TimeoutError: agent process 0 did not answer"}
    row = _row(failed)
    assert row is not None and row["met"] is None
    assert row["figure"].startswith("agents: the scale phase failed")


@pytest.mark.timeout(30)
def test_report_section() -> None:
    stopped = "2 session(s) lost at 13,000 agents"
    result = _result(_scale_entry(20_000, 12_000, 40.0, stopped), None)
    result["meta"] = {"profile": "full", "started": "now", "code": {}}
    result["targets"] = targets.evaluate(result, specs=[])
    markdown = report.render_markdown(result)
    assert "## Scale: agents with lease sessions (issue 16)" in markdown
    assert f"reached 13,000, sustained 12,000; ramp stopped: {stopped}." in markdown
    lines = markdown.splitlines()
    steps = [line for line in lines if line.startswith("| step ")]
    assert len(steps) == 3 and steps[2].startswith("| step 3 | 13,000 | 4.2 |")
    hold = next(line for line in lines if line.startswith("| **hold** |"))
    assert hold == "| **hold** | 12,000 | 60.0 | 3,600 (3,600) | 10.0 | 40.0 | 80 | 0 | 0 | 90% |"
    assert steps[0].endswith("| 0 | 0 | - |")  # a step without CPU figures
    text = next(line for line in lines if line.startswith("Hold: "))
    assert "leader n2 90% (nodes n1 30%, n2* 90%, n3 30%); agent processes 20%" in text
    assert "6.0 keep-alives per leader journal sync" in text
    assert "RSS MiB n1 80.0, n2 82.5, n3 79.0; the leader holds 12,000 sessions" in text
    # The scale group is not a throughput row, and a result without it has no section.
    assert "| scale |" not in markdown
    without = copy.deepcopy(result)
    del without["workloads"]["scale"]
    assert "## Scale" not in report.render_markdown(without)
    # Sessions lost in the failed step were replaced before the hold: the report says so.
    result["workloads"]["scale"]["20000 agents"]["refill"] = {"from": 40, "to": 12_000}
    result["workloads"]["scale"]["20000 agents"]["refill"]["seconds"] = 21.5
    assert (
        " After the failed step 40 agents were left; new ones were opened to 12,000 in "
        "21.5 s before the hold."
    ) in report.render_markdown(result)
    # No hold (no level held): the steps alone.
    entry = _scale_entry(20_000, 0, 0.0, "1 session(s) lost at 2,000 agents")
    entry["hold"] = None
    result["workloads"]["scale"] = {entry["mode"]: entry}
    assert "| **hold** |" not in report.render_markdown(result)


@pytest.mark.timeout(30)
def test_the_at_all_times_memory_target_judges_the_worst_figure_of_each_node() -> None:
    """Issue 38's row: the highest of the peak during the load, the RSS 1 s after it
    and the settled RSS, per node; no row below 100,000 leases."""
    specs = [s for s in targets.load_specs() if s["kind"] == "memory" and s.get("at_all_times")]
    assert len(specs) == 1 and specs[0]["issue"] == 38 and specs[0]["max_mib"] == 100

    def judge(memory: dict[str, Any]) -> dict[str, Any]:
        rows = targets.evaluate(_result(None, memory), specs=specs)
        assert len(rows) == 1
        return rows[0]

    memory = _memory(100_000, 96.0, 93.0)
    memory["peak_rss_mib"] = {"n1": 95.0, "n2": 99.5, "n3": 94.0}
    met = judge(memory)
    assert met["met"] is True and met["issue"] == 38
    assert met["figure"] == (
        "max 100 MiB (n1 95, n2 100, n3 94; peak during the load, 1 s after it, settled)"
    )
    memory["rss_settled_mib"]["n3"] = 100.5  # settled higher than the load's peak
    assert judge(memory)["met"] is False
    memory = _memory(100_000, 96.0, 93.0)
    memory["peak_rss_mib"] = {"n1": 95.0, "n2": 101.0, "n3": 94.0}  # only while loading
    assert judge(memory)["met"] is False
    # A restart that loads the snapshot counts as well (the snapshot phase's figure).
    memory = _memory(100_000, 96.0, 93.0)
    memory["restart_peak_rss_mib"] = {"n1": 97.0, "n2": 109.0, "n3": 98.0}
    restarted = judge(memory)
    assert restarted["met"] is False
    assert restarted["figure"].endswith("settled, restart)") and "n2 109" in restarted["figure"]
    assert targets.evaluate(_result(None, _memory(5_000, 140.0)), specs=specs) == []
