"""The report: a result document (bench.json) rendered as Markdown (bench.md).

Pure functions of the result, so a saved bench.json renders again without a
cluster (``scripts/bench --render bench.json``); this module imports neither
raftlease nor the measuring modules. ``write_outputs`` writes both files of a run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .context import NON_THROUGHPUT_GROUPS, Result, first_variant, fmt

#: File names inside the output directory.
JSON_NAME = "bench.json"
MARKDOWN_NAME = "bench.md"


def load_result(path: Path) -> Result:
    """A result document saved by a run (bench.json)."""
    result: Result = json.loads(path.read_text())
    if not isinstance(result, dict) or "meta" not in result:
        raise ValueError(f"{path} is not a benchmark result (no meta)")
    return result


def write_outputs(result: Result, out: Path) -> str:
    """Write ``out``/bench.json and ``out``/bench.md, print the Markdown on stdout,
    and return it."""
    out.mkdir(parents=True, exist_ok=True)
    # default=str: anything not JSON-native (e.g. a Path) is saved as its text.
    (out / JSON_NAME).write_text(json.dumps(result, indent=2, default=str))
    markdown = render_markdown(result)
    (out / MARKDOWN_NAME).write_text(markdown)
    print(markdown)
    return markdown


def render_markdown(result: Result) -> str:
    """The Markdown report of ``result``: tables and sections for what was measured
    (a group that did not run is left out; a failed one is listed under Failures)."""
    meta = result["meta"]
    lines = [
        f"# raftlease benchmark ({meta.get('profile')} profile)",
        "",
        f"{meta.get('started')}; Python {meta.get('python')}, raftlease "
        f"{meta.get('raftlease')}, {meta.get('cpus')} CPUs; load average at start "
        f"{meta.get('loadavg_start')}, at end {meta.get('loadavg_end')}; "
        f"{meta.get('elapsed_s', 0):.0f} s in all. {meta.get('repeat')} repetitions of "
        f"{meta.get('duration_s')} s after a {meta.get('warmup_s')} s warm-up. Code: "
        f"git {str(meta.get('code', {}).get('git_head', '?'))[:10]}, raftlease/*.py sha256 "
        f"{meta.get('code', {}).get('sha256', '?')} (frozen copy for the whole run).",
        "",
        "## Throughput and latency",
        "",
        "| workload | mode | ops/s (median) | spread (min..max) | p50 ms | p99 ms "
        "| vs raw sync | vs raw pipelined | CPU s client | CPU s servers (* leader) "
        "| CPU s others | elections |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for name, entry in result.get("raw", {}).items():
        cpu = entry.get("cpu_s", {})
        lines.append(
            f"| raw PySyncObj | {name} | {entry['ops_per_s']['median']:,.0f} "
            f"| {_range(entry['ops_per_s'])} | {entry['p50_ms']:.2f} | {entry['p99_ms']:.2f} "
            f"| | | (in leader) | {_server_cpu(cpu, entry.get('leader'))} "
            f"| {cpu.get('others', 0):.2f} | |"
        )
    for group, modes in result.get("workloads", {}).items():
        if group in NON_THROUGHPUT_GROUPS:
            continue
        for mode, e in modes.items():
            if not isinstance(e, dict):
                continue
            vs = e.get("vs_raw", {})
            lines.append(
                f"| {group} | {mode} | {e['ops_per_s']['median']:,.0f} "
                f"| {_range(e['ops_per_s'])} | {e['p50_ms']:.2f} | {e['p99_ms']:.2f} "
                f"| {_ratio(vs.get('sync_1thread'))} | {_ratio(vs.get('pipelined_best'))} "
                f"| {e['cpu_s'].get('client', 0):.2f} "
                f"| {_server_cpu(e['cpu_s'], e.get('leader'))} "
                f"| {e['cpu_s'].get('others', 0):.2f} | {e.get('elections', 0)} |"
            )
    w = result.get("workloads", {})
    reads = [(g, m) for g, m in w.items() if g.startswith("holder")]
    served = [
        f"{g}: {next(iter(m.values())).get('served')}"
        for g, m in reads
        if isinstance(m, dict)
        and m
        and isinstance(next(iter(m.values())), dict)
        and next(iter(m.values())).get("served")
    ]
    if served:
        lines += ["", "Reads, as the server says it served them: " + "; ".join(served) + "."]
    handoffs = [e for e in w.get("handoff", {}).values() if isinstance(e, dict)]
    if handoffs:
        lines += ["", "## Contended handoff"]
    for handoff in handoffs:
        f = handoff["fairness"]
        lines += [
            "",
            f"**{handoff['mode']}**: "
            f"{handoff['ops_per_s']['median']:,.0f} handoffs/s; Jain's fairness index "
            f"{f['jain_index']:.3f}; shares x clients from {f['min_share_x_n']:.2f} to "
            f"{f['max_share_x_n']:.2f} (1 = equal); longest run of grants to one client "
            f"{f['longest_same_client_streak']:.0f}; {f['attempts_per_grant']:.1f} acquire "
            f"attempts per grant; gap between grants p50 {f['handoff_gap_p50_ms']:.2f} ms, "
            f"p99 {f['handoff_gap_p99_ms']:.2f} ms.",
        ]
    fo = first_variant(w, "failover")
    if fo:
        reps = fo["reps"]
        lines += [
            "",
            "## Failover (SIGKILL of the leader)",
            "",
            f"Median time to the next successful call {fo['time_to_success_s']['median']:.3f} s "
            f"(range {_range(fo['time_to_success_s'], '.3f')}); new leader seen after a median "
            f"{fo['time_to_new_leader_s']['median']:.3f} s.",
            "",
            "| rep | killed | to next success s | to new leader s | terms | client errors |",
            "|---:|---|---:|---:|---:|---|",
        ]
        for i, r in enumerate(reps, 1):
            lines.append(
                f"| {i} | {r['killed']} | {r['time_to_success_s']:.3f} "
                f"| {fmt(r['time_to_new_leader_s'], '.3f')} | {r['elections']} "
                f"| {r['client_errors']} |"
            )
    mem = first_variant(w, "memory")
    if mem:
        lines += [
            "",
            "## Memory",
            "",
            "| node | RSS idle MiB | RSS with leases MiB | peak RSS MiB |",
            "|---|---:|---:|---:|",
        ]
        for node in mem["rss_idle_mib"]:
            lines.append(
                f"| {node} | {mem['rss_idle_mib'][node]:.1f} "
                f"| {mem['rss_loaded_mib'].get(node, 0):.1f} "
                f"| {mem['peak_rss_mib'].get(node, 0):.1f} |"
            )
        lw = mem["load_window"]
        lines += [
            "",
            f"{mem['live_leases']:,} live leases created in {mem['create_seconds']:.1f} s "
            f"({mem['create_per_s']:,.0f}/s, AsyncClient pipelined; {mem['create_errors']} "
            f"errors); {mem['elections_during_load']} election(s) during the load; "
            f"{lw['snapshots_total']} snapshot(s) finished during it (default compaction); "
            "longest interval without an apply per node during the load (certain / upper "
            "bound incl. poll delay): "
            + ", ".join(
                f"{k} {v['max_no_apply_certain_ms']:.0f} / {v['max_no_apply_bound_ms']:.0f} ms"
                for k, v in lw["nodes"].items()
            )
            + f"; status RTT max {lw['max_status_rtt_ms']:.0f} ms.",
        ]
        if lw.get("term_changes"):
            lines.append("")
            lines.append("Term changes during the load: " + _term_changes(lw["term_changes"]))
    snap = first_variant(w, "snapshot")
    if snap:
        win = snap["window"]
        lines += [
            "",
            "## Snapshot stall",
            "",
            f"Settings {snap['settings']}; cluster restarted (dump + journal replay) and "
            f"caught up in {snap['restart_to_caught_up_s']:.1f} s. Over "
            f"{snap['steady_seconds']:.1f} s: {snap['snapshots_seen']} snapshots finished, "
            f"{snap['elections']} election(s); pacer renew p50 {snap['pacer']['p50_ms']:.1f} ms, "
            f"p99 {snap['pacer']['p99_ms']:.1f} ms, max {snap['pacer']['max_ms']:.1f} ms.",
            "",
            "| node | snapshots | no apply, certain ms | no apply, upper bound ms "
            "| max poll interval ms | max status RTT ms | terms |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for node, v in win["nodes"].items():
            lines.append(
                f"| {node} | {v['snapshots_finished']} | {v['max_no_apply_certain_ms']:.0f} "
                f"| {v['max_no_apply_bound_ms']:.0f} | {v['max_poll_interval_ms']:.0f} "
                f"| {v['max_status_rtt_ms']:.0f} | {v['terms']} |"
            )
        if win.get("term_changes"):
            lines += ["", "Term changes: " + _term_changes(win["term_changes"])]
    alerts = result.get("node_log_alerts", {})
    if any(alerts.values()):
        lines += ["", "## Node log alerts (WARNING and above)", ""]
        for name, kinds in alerts.items():
            for shape, kind in list(kinds.items())[:8]:
                lines.append(f"- {name} cluster, {kind['count']}x {kind['nodes']}: `{shape}`")
    errors = [(g, m["error"]) for g, m in w.items() if isinstance(m, dict) and "error" in m]
    if errors:
        lines += ["", "## Failures", ""]
        lines += [f"- **{g}**: {e}" for g, e in errors]
    if result.get("targets"):
        lines += ["", "## Targets (issue 6)", "", "| target | figure | met |", "|---|---|---|"]
        for t in result["targets"]:
            met = {True: "yes", False: "**no**", None: "n/a"}[t["met"]]
            note = f" ({t['note']})" if t.get("note") else ""
            lines.append(f"| {t['target']} | {t['figure']}{note} | {met} |")
    raw_conf = result.get("raw_conf")
    if raw_conf:
        lines += [
            "",
            f"Raw PySyncObj SyncObjConf: {raw_conf.get('source')}; payload "
            f"{raw_conf.get('payload_bytes')} bytes per no-op entry.",
        ]
    if result.get("methods"):
        lines += ["", "## Method", ""]
        for name, text in result["methods"].items():
            lines.append(f"- **{name}**: {text}")
    return "\n".join(lines) + "\n"


def _term_changes(changes: list[dict[str, Any]]) -> str:
    return "; ".join(
        f"{c['node']} to term {c['term']} at +{c['at_s']:.1f} s"
        + (" (a snapshot within 2 s)" if c["snapshot_within_2s"] else " (no snapshot near)")
        for c in changes
    )


def _range(s: dict[str, Any], spec: str = ",.0f") -> str:
    return f"{format(s['min'], spec)}..{format(s['max'], spec)} ({s['spread_pct']:.0f} %)"


def _ratio(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.2f}"


def _server_cpu(cpu: dict[str, float], leader: str | None) -> str:
    return " / ".join(
        f"{k}{'*' if k == leader else ''} {v:.2f}"
        for k, v in sorted(cpu.items())
        if k not in ("client", "others")
    )
