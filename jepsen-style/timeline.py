"""A self-contained HTML page with an SVG timeline of a chaos run.

One lane per key shows who held it when (a bar per holding interval, coloured by
client, labelled with the fencing token); overlapping bars stack, so a double holder
is visible at a glance. A shared key's lane is labelled with its capacity (its holders
may stack up to it) and each bar's tooltip gives the units it holds. Faults are shaded
bands across every lane, refused fenced writes are small red ticks, and every violation
is a red line with its description as a tooltip. Hover anything for details. No
JavaScript libraries, no network.
"""

from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from typing import Any

from checker import Params, leases, pair_ops, shared_keys

Event = dict[str, Any]

CATEGORY_COLOURS = {
    "network": "#9ecae1",
    "process": "#fdae6b",
    "client": "#c7e9c0",
    "clock": "#dadaeb",
    "overlap": "#fcbba1",
}
ROW = 16
LANE_GAP = 10
LEFT = 70
TOP = 46


def _colour(process: str) -> str:
    digits = "".join(ch for ch in process if ch.isdigit()) or "0"
    hue = (int(digits) * 47 + (0 if process.startswith("c") else 180)) % 360
    return f"hsl({hue},65%,55%)"


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def render(events: list[Event], results: dict[str, Any], categories: dict[str, str]) -> str:
    """The HTML page for ``events`` and checker ``results``. ``categories`` maps a
    fault kind to its category (for the band colour)."""
    params = Params.from_meta(events)
    ops = pair_ops(events)
    times = [e["t"] for e in events if isinstance(e.get("t"), int | float)]
    if not times:
        return "<html><body>empty history</body></html>"
    meta = next((e for e in events if e.get("type") == "meta"), {})
    t0 = float(meta.get("t", min(times)))
    t1 = max(times)
    span = max(1.0, t1 - t0)
    scale = max(6.0, min(40.0, 1500.0 / span))
    width = LEFT + span * scale + 30

    def x(t: float) -> float:
        return float(LEFT + (min(max(t, t0), t1) - t0) * scale)

    lanes: list[str] = []
    body: list[str] = []
    y = TOP
    views = leases(ops)
    shared = shared_keys(ops, events)
    keys = sorted({op.key for op in ops})
    lane_y: dict[str, tuple[float, float]] = {}
    for key in keys:
        rows: list[float] = []  # end time of the last bar in each row
        bars = sorted(
            ((s, e, v) for v in views.get(key, []) for s, e in v.intervals(params)),
            key=lambda b: (b[0], b[1]),
        )
        placed = []
        for start, end, view in bars:
            row = next((i for i, last in enumerate(rows) if last <= start), len(rows))
            if row == len(rows):
                rows.append(end)
            else:
                rows[row] = end
            placed.append((row, start, end, view))
        height = max(2 if key in shared else 1, len(rows)) * ROW
        lane_y[key] = (y, y + height)
        lanes.append(
            f'<rect x="0" y="{y}" width="{width:.0f}" height="{height}" fill="#f7f7f7"/>'
            f'<text x="6" y="{y + 12}" class="lane">{_esc(key)}</text>'
        )
        if key in shared:
            lanes.append(f'<text x="6" y="{y + 24}" class="fault">capacity {shared[key]}</text>')
        for row, start, end, view in placed:
            by = y + row * ROW + 2
            bw = max(1.0, (end - start) * scale)
            proc = view.grant.process
            tip = (
                f"{proc} token {view.token} on {key}: held {start - t0:.3f}-{end - t0:.3f} s"
                f" (grant {view.grant.id})"
            )
            if key in shared:
                tip += f", {view.units} of {shared[key]} units"
            label = f"{proc} #{view.token}" if bw > 48 else ""
            body.append(
                f'<g><title>{_esc(tip)}</title><rect x="{x(start):.1f}" y="{by}" '
                f'width="{bw:.1f}" height="{ROW - 4}" rx="2" fill="{_colour(proc)}" '
                f'stroke="#333" stroke-width="0.3"/>'
                f'<text x="{x(start) + 2:.1f}" y="{by + 9}" class="bar">{_esc(label)}</text></g>'
            )
        y += height + LANE_GAP
    bottom = y
    for e in events:
        if e.get("type") == "fenced" and not e.get("accepted") and e.get("key") in lane_y:
            top, _ = lane_y[e["key"]]
            by = e.get("refused_by", "resource")
            why = (
                f"the cluster answered {e.get('cluster')}"
                if by == "cluster"
                else f"< {e.get('highest')} already accepted"
            )
            tip = (
                f"fenced {e['f']} refused by the {by}: {e['process']} token {e['token']} "
                f"{why}, at {e['t'] - t0:.3f} s"
            )
            body.append(
                f'<g><title>{_esc(tip)}</title><rect x="{x(e["t"]) - 1:.1f}" y="{top - 4}" '
                f'width="3" height="8" fill="#d62728"/></g>'
            )
    bands = _fault_bands(events, categories, x, t0, bottom)
    marks = _violation_marks(results, x, t0, bottom)
    axis = _axis(t0, t1, x, bottom)
    svg_height = bottom + 30
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{svg_height}" '
        f'viewBox="0 0 {width:.0f} {svg_height}">'
        + "".join(lanes + bands + body + marks + axis)
        + "</svg>"
    )
    return _page(svg, events, results, meta, categories, t0)


def _fault_bands(
    events: list[Event], categories: dict[str, str], x: Any, t0: float, bottom: float
) -> list[str]:
    out = []
    starts: dict[Any, Event] = {}
    for e in sorted((e for e in events if e.get("type") == "nemesis"), key=lambda e: e["t"]):
        if e["f"] == "start":
            starts[e["id"]] = e
        elif e["f"] == "stop" and e["id"] in starts:
            s = starts.pop(e["id"])
            colour = CATEGORY_COLOURS.get(categories.get(s["fault"], ""), "#ddd")
            tip = f"#{s['id']} {s['fault']} {s['t'] - t0:.2f}-{e['t'] - t0:.2f} s " + json.dumps(
                s.get("detail"), sort_keys=True
            )
            out.append(
                f'<g><title>{_esc(tip)}</title><rect x="{x(s["t"]):.1f}" y="{TOP - 30}" '
                f'width="{max(1.0, x(e["t"]) - x(s["t"])):.1f}" height="{bottom - TOP + 30}" '
                f'fill="{colour}" opacity="0.45"/>'
                f'<text x="{x(s["t"]) + 2:.1f}" y="{TOP - 20 + (s["id"] % 2) * 10}" '
                f'class="fault">{_esc(s["fault"])}</text></g>'
            )
    return out


def _violation_marks(results: dict[str, Any], x: Any, t0: float, bottom: float) -> list[str]:
    out = []
    for name, result in results.get("checkers", {}).items():
        for v in result.get("violations", []):
            t = v.get("t")
            if not isinstance(t, int | float) or math.isinf(t):
                continue
            tip = f"{name}: " + json.dumps(v, sort_keys=True, default=str)[:1500]
            out.append(
                f'<g><title>{_esc(tip)}</title><line x1="{x(t):.1f}" x2="{x(t):.1f}" '
                f'y1="{TOP - 30}" y2="{bottom}" stroke="#d62728" stroke-width="2"/>'
                f'<text x="{x(t) - 5:.1f}" y="{bottom + 12}" class="viol">✖</text></g>'
            )
    return out


def _axis(t0: float, t1: float, x: Any, bottom: float) -> list[str]:
    span = t1 - t0
    step = next(s for s in (1, 2, 5, 10, 20, 30, 60, 120, 300, 600) if span / s <= 40)
    out: list[str] = []
    t = 0.0
    while t <= span and len(out) < 1000:
        out.append(
            f'<line x1="{x(t0 + t):.1f}" x2="{x(t0 + t):.1f}" y1="{bottom}" y2="{bottom + 4}" '
            f'stroke="#555"/><text x="{x(t0 + t) - 6:.1f}" y="{bottom + 24}" class="tick">'
            f"{t:.0f}s</text>"
        )
        t += step
    return out


def _page(
    svg: str,
    events: list[Event],
    results: dict[str, Any],
    meta: Event,
    categories: dict[str, str],
    t0: float,
) -> str:
    verdict = results.get("valid")
    colour = "#2ca02c" if verdict is True else "#d62728" if verdict is False else "#ff7f0e"
    rows = []
    for name, result in results.get("checkers", {}).items():
        v = result.get("valid")
        rows.append(
            f"<tr><td>{_esc(name)}</td><td style='color:"
            f"{ {True: '#2ca02c', False: '#d62728'}.get(v, '#ff7f0e') }'>{_esc(v)}</td>"
            f"<td>{_esc(result.get('violation_count', 0))}</td>"
            f"<td><code>{_esc(json.dumps(result.get('stats'), default=str)[:300])}</code></td></tr>"
        )
    faults: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("type") == "nemesis" and e.get("f") == "start":
            faults[e["fault"]] += 1
    legend = " ".join(
        f"<span style='background:{c};padding:1px 6px'>{_esc(k)}</span>"
        for k, c in CATEGORY_COLOURS.items()
    )
    header = {k: meta.get(k) for k in ("profile", "seed", "planted_bug", "nodes", "clients")}
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>raftlease chaos run</title>
<style>
body {{ font: 13px sans-serif; margin: 16px; }}
.lane {{ font: bold 12px sans-serif; }} .bar {{ font: 9px sans-serif; fill: #111; }}
.fault {{ font: 10px sans-serif; fill: #333; }} .tick {{ font: 10px sans-serif; }}
.viol {{ font: bold 14px sans-serif; fill: #d62728; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 2px 6px; }}
.scroll {{ overflow-x: auto; border: 1px solid #ddd; }}
</style></head><body>
<h2>raftlease chaos run: <span style="color:{colour}">{_esc(verdict)}</span></h2>
<p><code>{_esc(json.dumps(header))}</code></p>
<p>Fault categories: {legend}. Bars: holding intervals (client, token).
Red ticks: fenced accesses refused (by the cluster's answer or the resource's fence).
Red lines: violations (hover for details).</p>
<div class="scroll">{svg}</div>
<h3>Checkers</h3>
<table><tr><th>checker</th><th>valid</th><th>violations</th><th>stats</th></tr>
{"".join(rows)}</table>
<h3>Faults</h3><p>{_esc(dict(sorted(faults.items())))}</p>
</body></html>
"""
