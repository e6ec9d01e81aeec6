"""A self-contained HTML page with an SVG timeline of a chaos run.

The title and heading say what the run was (seed, profile, nodes, from the history's
``meta`` event) and its verdict in words: ``PASSED (every checker valid)``,
``FAILED: mutual_exclusion, fencing`` or ``UNKNOWN: liveness``.

One lane per key shows who held it when (a bar per holding interval, coloured by
client, labelled with the fencing token); overlapping bars stack, so a double holder
is visible at a glance. A shared key's lane is labelled with its capacity (its holders
may stack up to it) and each bar's tooltip gives the units it holds. Faults are shaded
bands across every lane, coloured by category (any kind, a category without a colour
gets one from its name); each fault's label heads its band, in label rows above the
lanes packed so that no two labels overlap (``layout_labels``). Refused fenced writes
are small red ticks, and every violation is a red line with its description as a
tooltip. Under the timeline, a table of the checkers (verdict, violation count,
statistics as ``name: value``, the first violations in words) and one of the faults
(kind, start, duration, detail in words). Hover anything for details. Every text from
the history is escaped; no JavaScript, no network.
"""

from __future__ import annotations

import html
import math
import zlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from checker import Params, leases, pair_ops, shared_keys

Event = dict[str, Any]

CATEGORY_COLOURS = {
    "network": "#9ecae1",
    "process": "#fdae6b",
    "client": "#c7e9c0",
    "clock": "#dadaeb",
    "membership": "#d9b38c",
    "overlap": "#fcbba1",
}
ROW = 16
LANE_GAP = 10
LEFT = 70
#: Fault labels: rows of LABEL_ROW px from LABEL_TOP, each label a monospace text
#: forced (``textLength``) to LABEL_CHAR px a character, so its box is known exactly.
LABEL_TOP = 6
LABEL_ROW = 13
LABEL_FONT = 10
LABEL_CHAR = 6.2
LABEL_PAD = 2.0
LABEL_GAP = 4.0
LABEL_CHARS = 40


def category_colour(category: str) -> str:
    """The band colour of a fault category; a category without one (a new kind's) gets
    a pale colour of its own from its name, the same on every run."""
    if category in CATEGORY_COLOURS:
        return CATEGORY_COLOURS[category]
    hue = zlib.crc32(category.encode("utf-8", "replace")) % 360
    return f"hsl({hue},45%,80%)"


@dataclass(frozen=True)
class Fault:
    """One fault of the run: its nemesis ``start`` and (if it healed) ``stop``."""

    id: str
    kind: str
    category: str
    start: float
    stop: float | None
    detail: Any
    heal: Any


def _num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def fault_list(events: list[Event], categories: dict[str, str]) -> list[Fault]:
    """Every fault the nemesis started, in start order, whatever its kind (a kind
    ``categories`` does not know is in category ``other``); one that never stopped
    has ``stop`` None."""
    nemesis = [e for e in events if e.get("type") == "nemesis" and _num(e.get("t"))]
    starts: dict[str, Event] = {}
    stops: dict[str, Event] = {}
    order: list[str] = []
    for e in sorted(nemesis, key=lambda e: e["t"]):
        ident = str(e.get("id"))
        if e.get("f") == "start" and ident not in starts:
            starts[ident] = e
            order.append(ident)
        elif e.get("f") == "stop" and ident in starts and ident not in stops:
            stops[ident] = e
    out = []
    for ident in order:
        s, healed = starts[ident], stops.get(ident)
        kind = str(s.get("fault", "?"))
        out.append(
            Fault(
                id=ident,
                kind=kind,
                category=str(categories.get(kind) or "other"),
                start=float(s["t"]),
                stop=None if healed is None else float(healed["t"]),
                detail=s.get("detail"),
                heal=None if healed is None else healed.get("detail"),
            )
        )
    return out


@dataclass(frozen=True)
class LabelBox:
    """Where a fault's label is drawn: x0..x1 in its label row."""

    x0: float
    x1: float
    row: int
    text: str

    @property
    def y0(self) -> float:
        return LABEL_TOP + self.row * LABEL_ROW

    @property
    def y1(self) -> float:
        return self.y0 + LABEL_ROW - 1


def label_text(fault: Fault) -> str:
    text = f"#{fault.id} {fault.kind}"
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def layout_labels(items: list[tuple[float, str]]) -> list[LabelBox]:
    """Boxes for labels ``(x, text)``, in the given order: each starts at its x, is as
    wide as its text, and goes in the first row where it clears the row's last box by
    LABEL_GAP (greedy interval packing, left to right: as few rows as the widest pile
    of mutually overlapping labels needs). No two boxes overlap."""
    ends: list[float] = []  # right edge of the last box in each row
    boxes: dict[int, LabelBox] = {}
    for i in sorted(range(len(items)), key=lambda i: items[i][0]):
        x0, text = items[i]
        x1 = x0 + len(text) * LABEL_CHAR + 2 * LABEL_PAD
        row = next((r for r, end in enumerate(ends) if end + LABEL_GAP <= x0), len(ends))
        if row == len(ends):
            ends.append(x1)
        else:
            ends[row] = x1
        boxes[i] = LabelBox(x0, x1, row, text)
    return [boxes[i] for i in range(len(items))]


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
    times = [e["t"] for e in events if _num(e.get("t"))]
    if not times:
        return "<html><body>empty history</body></html>"
    meta = next((e for e in events if e.get("type") == "meta"), {})
    t0 = float(meta["t"]) if _num(meta.get("t")) else min(times)
    t1 = max(times)
    span = max(1.0, t1 - t0)
    scale = max(6.0, min(40.0, 1500.0 / span))
    width = LEFT + span * scale + 30

    def x(t: float) -> float:
        return float(LEFT + (min(max(t, t0), t1) - t0) * scale)

    faults = fault_list(events, categories)
    boxes = layout_labels([(x(f.start), label_text(f)) for f in faults])
    label_rows = 1 + max((b.row for b in boxes), default=0)
    lanes_top = LABEL_TOP + label_rows * LABEL_ROW + 6
    width = max([width, *(b.x1 + 10 for b in boxes)])
    lanes: list[str] = []
    body: list[str] = []
    y = lanes_top
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
    bands, labels = _fault_bands(faults, boxes, x, t0, bottom)
    marks = _violation_marks(results, x, t0, lanes_top, bottom)
    axis = _axis(t0, t1, x, bottom)
    svg_height = bottom + 30
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{svg_height}" '
        f'viewBox="0 0 {width:.0f} {svg_height}">'
        + "".join(lanes + bands + body + marks + axis + labels)
        + "</svg>"
    )
    return _page(svg, events, results, meta, faults, t0)


def _fault_bands(
    faults: list[Fault], boxes: list[LabelBox], x: Any, t0: float, bottom: float
) -> tuple[list[str], list[str]]:
    """A shaded band per fault, from its label (in its label row) down through every
    lane (a fault that never healed runs to the end, outlined dashed), and the labels,
    to draw over every band. A label has a white box under it so the bands behind it
    do not blur it, and its text is forced to the box's width, so labels laid out apart
    stay apart whatever the font."""
    bands, labels = [], []
    for f, box in zip(faults, boxes, strict=True):
        end = x(f.stop) if f.stop is not None else x(math.inf)
        healed = (
            f"{f.start - t0:.2f}-{f.stop - t0:.2f} s"
            if f.stop is not None
            else f"from {f.start - t0:.2f} s, never healed"
        )
        words = "; ".join(f"{k}: {v}" for k, v in pairs(f.detail)) if f.detail else ""
        heal = "; ".join(f"{k}: {v}" for k, v in pairs(f.heal)) if f.heal else ""
        tip = _esc(
            _clip(
                f"#{f.id} {f.kind} ({f.category}) {healed}"
                + (f"\n{words}" if words else "")
                + (f"\nheal: {heal}" if heal else ""),
                1500,
            )
        )
        colour = category_colour(f.category)
        outline = "" if f.stop is not None else ' stroke="#555" stroke-dasharray="3 2"'
        bands.append(
            f'<g class="fault-band"><title>{tip}</title>'
            f'<rect x="{box.x0:.1f}" y="{box.y0:.1f}" width="{max(1.0, end - box.x0):.1f}" '
            f'height="{bottom - box.y0:.1f}" fill="{colour}" opacity="0.45"{outline}/></g>'
        )
        text_width = box.x1 - box.x0 - 2 * LABEL_PAD
        labels.append(
            f'<g class="fault-label"><title>{tip}</title>'
            f'<rect class="label-box" x="{box.x0:.1f}" y="{box.y0:.1f}" '
            f'width="{box.x1 - box.x0:.1f}" height="{box.y1 - box.y0:.1f}" fill="#fff" '
            f'opacity="0.85" stroke="{colour}"/>'
            f'<text x="{box.x0 + LABEL_PAD:.1f}" y="{box.y0 + LABEL_FONT:.1f}" class="flabel" '
            f'textLength="{text_width:.1f}" lengthAdjust="spacingAndGlyphs">'
            f"{_esc(box.text)}</text></g>"
        )
    return bands, labels


def _violation_marks(
    results: dict[str, Any], x: Any, t0: float, top: float, bottom: float
) -> list[str]:
    out = []
    for name, result in _judged(results).items():
        for v in result.get("violations") or []:
            t = v.get("t") if isinstance(v, dict) else None
            if not _num(t):
                continue
            tip = f"{name}: {describe(v, t0)}"
            out.append(
                f'<g><title>{_esc(tip)}</title><line x1="{x(t):.1f}" x2="{x(t):.1f}" '
                f'y1="{top - 4}" y2="{bottom}" stroke="#d62728" stroke-width="2"/>'
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


#: How many statistics and violations a checker's row shows before "… and N more".
MAX_STATS = 16
MAX_VIOLATIONS = 3
MAX_TEXT = 300
VERDICT_COLOURS = {True: "#2ca02c", False: "#d62728"}
UNKNOWN_COLOUR = "#ff7f0e"


def _verdict_colour(valid: Any) -> str:
    return VERDICT_COLOURS.get(valid, UNKNOWN_COLOUR) if isinstance(valid, bool) else UNKNOWN_COLOUR


def _verdict_word(valid: Any) -> str:
    if valid is True:
        return "valid"
    if valid is False:
        return "INVALID"
    if valid is None:
        return "not judged"
    return "unknown"


def _judged(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every named result with a verdict: the checkers, then the volume check and the
    soak's resource verdict when the run had them."""
    out: dict[str, dict[str, Any]] = {}
    for name, result in (results.get("checkers") or {}).items():
        if isinstance(result, dict):
            out[str(name)] = result
    for name in ("volume", "soak"):
        extra = results.get(name)
        if isinstance(extra, dict) and extra.get("valid") is not None:
            out[name] = extra
    return out


def verdict(results: dict[str, Any]) -> tuple[Any, str]:
    """The run's verdict (True, False or "unknown") and its words: ``PASSED (every
    checker valid)``, ``FAILED: mutual_exclusion, fencing`` or ``UNKNOWN: liveness``.
    As ``run.py`` exits: a failed soak fails the run, an unknown one makes it unknown."""
    judged = _judged(results)
    valid = results.get("valid")
    soak = judged.get("soak", {}).get("valid", True)
    if valid is False or soak is False:
        failed = [n for n, r in judged.items() if r.get("valid") is False]
        return False, "FAILED: " + (", ".join(failed) or "no checker named")
    if valid is True and soak is True:
        return True, "PASSED (every checker valid)"
    # Not failed, so a result that is not valid here is undecided, or the volume check
    # (a run too small to prove anything is unknown, not failed).
    unknown = [n for n, r in judged.items() if r.get("valid") not in (True, None)]
    if valid not in (True, False, "unknown") and not unknown:
        return "unknown", "UNKNOWN: no verdict recorded"
    return "unknown", "UNKNOWN: " + (", ".join(unknown) or "no checker named")


def run_description(meta: Event, results: dict[str, Any]) -> str:
    """What the run was, from the history's ``meta`` event (``run.py`` records seed,
    profile and nodes there), else from ``results``: ``seed 1, profile ci, 3 nodes``."""
    parts = []
    seed = meta.get("seed", results.get("seed"))
    if seed is not None:
        parts.append(f"seed {seed}")
    profile = meta.get("profile", results.get("profile"))
    if profile:
        parts.append(f"profile {profile}")
    nodes = meta.get("nodes")
    if nodes is not None:
        parts.append(f"{nodes} nodes")
    bug = meta.get("planted_bug", results.get("planted_bug"))
    if bug:
        parts.append(f"planted bug {bug}")
    return ", ".join(str(p) for p in parts) or "no meta event"


def title(meta: Event, results: dict[str, Any]) -> str:
    """The page's title (unescaped): the run and its verdict in words."""
    return f"raftlease chaos run — {run_description(meta, results)} — {verdict(results)[1]}"


def _scalar(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        return f"{round(value, 3):g}" if abs(value) < 1e6 else f"{value:.0f}"
    return str(value)


def pairs(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """``value`` (checker statistics, a fault's detail, a violation) as readable
    ``(name, value)`` pairs: nested names joined by dots, a list of plain values
    joined by commas, a list of records counted."""
    if isinstance(value, dict):
        out: list[tuple[str, str]] = []
        for k, v in value.items():
            out.extend(pairs(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list | tuple):
        if all(not isinstance(v, dict | list | tuple) for v in value):
            text = ", ".join(_scalar(v) for v in value) if value else "none"
        else:
            text = f"{len(value)} records"
        return [(prefix or "value", text)]
    return [(prefix or "value", _scalar(value))]


def _clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _pairs_html(items: list[tuple[str, str]], limit: int, sep: str = "<br>") -> str:
    shown = [f"<b>{_esc(_clip(k, 80))}</b>: {_esc(_clip(v))}" for k, v in items[:limit]]
    if len(items) > limit:
        shown.append(f"… and {len(items) - limit} more")
    return sep.join(shown)


def describe(item: Any, t0: float) -> str:
    """A violation or an unknown reason in words (unescaped): its ``kind`` first, its
    time relative to the run's start, then its other fields as ``name: value``."""
    if not isinstance(item, dict):
        return _clip(_scalar(item))
    words = []
    if "kind" in item:
        words.append(_scalar(item["kind"]))
    t = item.get("t")
    if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t):
        words.append(f"at {t - t0:.3f} s")
    rest = {k: v for k, v in item.items() if k not in ("kind", "t")}
    words.extend(f"{k}: {v}" for k, v in pairs(rest))
    return _clip("; ".join(words), 600)


def checker_rows(results: dict[str, Any], t0: float) -> list[str]:
    """One ``<tr>`` per checker: name, verdict (coloured), violation count, its key
    statistics as ``name: value`` lines and its first violations (or the reasons it is
    unknown) in words."""
    rows = []
    for name, result in _judged(results).items():
        valid = result.get("valid")
        violations = result.get("violations") or []
        count = result.get("violation_count", len(violations))
        notes = [describe(v, t0) for v in violations[:MAX_VIOLATIONS]]
        if len(violations) > MAX_VIOLATIONS:
            notes.append(f"… and {len(violations) - MAX_VIOLATIONS} more")
        if valid not in (True, False, None):
            reasons = result.get("unknown") or []
            notes.extend(f"unknown: {describe(r, t0)}" for r in reasons[:MAX_VIOLATIONS])
        stats = result.get("stats")
        rows.append(
            f'<tr class="checker"><td>{_esc(name)}</td>'
            f'<td class="verdict" style="color:{_verdict_colour(valid)}">'
            f"{_esc(_verdict_word(valid))}</td>"
            f"<td>{_esc(count)}</td>"
            f"<td>{_pairs_html(pairs(stats), MAX_STATS) if stats else ''}</td>"
            f"<td>{'<br>'.join(_esc(n) for n in notes)}</td></tr>"
        )
    return rows


def fault_rows(faults: list[Fault], t0: float) -> list[str]:
    """One ``<tr>`` per fault: id, kind, category, start and duration (seconds into the
    run), and its detail at the start and at the heal in words."""
    rows = []
    for f in faults:
        duration = "never healed" if f.stop is None else f"{f.stop - f.start:.2f} s"
        detail = _pairs_html(pairs(f.detail), MAX_STATS, "; ") if f.detail else ""
        heal = _pairs_html(pairs(f.heal), MAX_STATS, "; ") if f.heal else ""
        words = detail + (f"<br><i>heal</i>: {heal}" if heal else "")
        rows.append(
            f'<tr class="fault"><td>{_esc(f.id)}</td><td>{_esc(f.kind)}</td>'
            f'<td><span style="background:{category_colour(f.category)};padding:1px 6px">'
            f"{_esc(f.category)}</span></td>"
            f"<td>{f.start - t0:.2f} s</td><td>{_esc(duration)}</td><td>{words}</td></tr>"
        )
    return rows


def _page(
    svg: str,
    events: list[Event],
    results: dict[str, Any],
    meta: Event,
    faults: list[Fault],
    t0: float,
) -> str:
    valid, words = verdict(results)
    colour = _verdict_colour(valid)
    what = run_description(meta, results)
    seen = sorted({f.category for f in faults})
    legend = " ".join(
        f"<span style='background:{category_colour(c)};padding:1px 6px'>{_esc(c)}</span>"
        for c in dict.fromkeys([*CATEGORY_COLOURS, *seen])
    )
    about = {k: meta[k] for k in ("clients", "keys", "shared_keys", "secure") if k in meta}
    errors = results.get("harness_errors") or []
    harness = (
        "<p style='color:#d62728'>Harness errors: "
        + "; ".join(_esc(_clip(str(e))) for e in errors[:10])
        + "</p>"
        if errors
        else ""
    )
    counts: dict[str, int] = defaultdict(int)
    for f in faults:
        counts[f.kind] += 1
    summary = ", ".join(f"{k} ×{n}" for k, n in sorted(counts.items())) or "none"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{_esc(title(meta, results))}</title>
<style>
body {{ font: 13px sans-serif; margin: 16px; }}
.lane {{ font: bold 12px sans-serif; }} .bar {{ font: 9px sans-serif; fill: #111; }}
.fault {{ font: 10px sans-serif; fill: #333; }} .tick {{ font: 10px sans-serif; }}
.flabel {{ font: {LABEL_FONT}px monospace; fill: #222; }}
.viol {{ font: bold 14px sans-serif; fill: #d62728; }}
table {{ border-collapse: collapse; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; vertical-align: top; text-align: left; }}
.verdict {{ font-weight: bold; }}
.scroll {{ overflow-x: auto; border: 1px solid #ddd; }}
</style></head><body>
<h2>raftlease chaos run — {_esc(what)} — <span style="color:{colour}">{_esc(words)}</span></h2>
{harness}<p>{_pairs_html(pairs(about), MAX_STATS, "; ")}</p>
<p>Fault categories: {legend}. Bars: holding intervals (client, token).
Red ticks: fenced accesses refused (by the cluster's answer or the resource's fence).
Red lines: violations. Each fault's label sits at the top of its band; hover anything
for details.</p>
<div class="scroll">{svg}</div>
<h3>Checkers</h3>
<table><tr><th>checker</th><th>verdict</th><th>violations</th><th>statistics</th>
<th>first violations</th></tr>
{"".join(checker_rows(results, t0))}</table>
<h3>Faults ({_esc(summary)})</h3>
<table><tr><th>#</th><th>kind</th><th>category</th><th>start</th><th>duration</th>
<th>detail</th></tr>
{"".join(fault_rows(faults, t0))}</table>
</body></html>
"""
