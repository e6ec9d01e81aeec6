"""The anchors in the report: raftlease beside etcd and ZooKeeper (issue 16), and
the checks of issue 16's targets. Pure functions of a result document; imports
neither raftlease nor the measuring modules (``scripts/bench --render`` uses it).

Every comparison is a factor where more than 1 means raftlease is better: raftlease
/ best anchor for throughput, best anchor / raftlease for times and CPU per call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..context import Result, raw_pipelined, raw_sync

#: Display names.
TITLES = {"etcd": "etcd", "zookeeper": "ZooKeeper"}

#: Throughput rows: label, raftlease group, {anchor: [its groups]}.
THROUGHPUT: list[tuple[str, str, dict[str, list[str]]]] = [
    ("acquire", "acquire", {"etcd": ["acquire"], "zookeeper": ["acquire"]}),
    ("renew", "renew", {"etcd": ["renew"], "zookeeper": ["renew"]}),
    ("release", "release", {"etcd": ["release"], "zookeeper": ["release"]}),
    (
        "read holder",
        "holder linearizable",
        {"etcd": ["holder linearizable", "holder serializable"], "zookeeper": ["holder get"]},
    ),
]

#: What an anchor's group is called in the table.
SHORT = {"holder linearizable": "lin", "holder serializable": "ser", "holder get": "get"}


def measured_systems(result: Result) -> dict[str, Any]:
    section = result.get("anchors")
    if not isinstance(section, dict):
        return {}
    systems: dict[str, Any] = section.get("systems", {})
    return systems


def _entry(workloads: Mapping[str, Any], group: str, mode: str) -> dict[str, Any] | None:
    try:
        entry = workloads[group][mode]
    except (KeyError, TypeError):
        return None
    return entry if isinstance(entry, dict) and "ops_per_s" in entry else None


def _rate(entry: dict[str, Any] | None) -> float | None:
    return None if entry is None else float(entry["ops_per_s"]["median"])


def anchor_rate(result: Result, anchor: str, group: str, mode: str) -> float | None:
    """Median ops/s of ``anchor``'s ``group`` in ``mode`` (None: not measured)."""
    return _rate(_entry(measured_systems(result).get(anchor, {}).get("workloads", {}), group, mode))


def raftlease_rate(result: Result, group: str, mode: str) -> float | None:
    return _rate(_entry(result.get("workloads", {}), group, mode))


def best_anchor(
    result: Result, against: list[tuple[str, str]], mode: str
) -> tuple[str, float] | None:
    """The best of (anchor, group) pairs in ``mode``: ("etcd lin", ops/s)."""
    best: tuple[str, float] | None = None
    for anchor, group in against:
        rate = anchor_rate(result, anchor, group, mode)
        if rate is not None and (best is None or rate > best[1]):
            label = TITLES.get(anchor, anchor) + (f" {SHORT[group]}" if group in SHORT else "")
            best = (label, rate)
    return best


def raftlease_handoff(result: Result) -> tuple[str, float] | None:
    """raftlease's handoff figure: the queued mode if measured, else the best."""
    modes = result.get("workloads", {}).get("handoff", {})
    rates = {m: _rate(e) for m, e in modes.items() if isinstance(e, dict) and "ops_per_s" in e}
    measured = {m: r for m, r in rates.items() if r is not None}
    if not measured:
        return None
    queued = [m for m in measured if "queued" in m]
    mode = queued[0] if queued else max(measured, key=lambda m: measured[m])
    return mode, measured[mode]


def failover_s(workloads: Mapping[str, Any]) -> float | None:
    for entry in workloads.get("failover", {}).values():
        if isinstance(entry, dict) and "time_to_success_s" in entry:
            return float(entry["time_to_success_s"]["median"])
    return None


def acquire_cpu_us(workloads: Mapping[str, Any]) -> float | None:
    """Server CPU (all three processes) per acquire at 1 thread, microseconds."""
    entry = _entry(workloads, "acquire", "1 thread")
    if entry is None or "cpu_us_per_op" not in entry:
        return None
    return float(entry["cpu_us_per_op"]["servers"])


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def factor_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def comparison_rows(result: Result) -> list[dict[str, Any]]:
    """One row per workload and thread count: raftlease, each anchor, the best
    anchor, raftlease's factor to it, and the raw PySyncObj ceiling."""
    systems = measured_systems(result)
    threads = [m for m in ("1 thread", "16 threads")]
    rows: list[dict[str, Any]] = []
    for label, group, against in THROUGHPUT:
        pairs = [(a, g) for a, groups in against.items() for g in groups]
        for mode in threads:
            rl = raftlease_rate(result, group, mode)
            cells = {
                a: " / ".join(
                    f"{SHORT[g]} {_fmt(anchor_rate(result, a, g, mode))}"
                    if g in SHORT and len(groups) > 1
                    else _fmt(anchor_rate(result, a, g, mode))
                    for g in groups
                )
                for a, groups in against.items()
                if a in systems
            }
            best = best_anchor(result, pairs, mode)
            ceiling = raw_sync(result) if mode == "1 thread" else raw_pipelined(result)
            rows.append(
                {
                    "workload": f"{label} (ops/s)",
                    "mode": mode,
                    "raftlease": _fmt(rl),
                    "anchors": cells,
                    "best": f"{best[0]} {_fmt(best[1])}" if best else "-",
                    "factor": _div(rl, best[1]) if best else None,
                    "raw": ceiling or None,
                    "vs_raw": _div(rl, ceiling or None),
                }
            )
    handoff = raftlease_handoff(result)
    h_anchor = {
        a: _rate(next(iter(s.get("workloads", {}).get("handoff", {}).values()), None))
        for a, s in systems.items()
        if isinstance(next(iter(s.get("workloads", {}).get("handoff", {}).values()), None), dict)
    }
    h_best = max(h_anchor.items(), key=lambda kv: kv[1] or 0.0, default=None)
    rows.append(
        {
            "workload": "handoff, one lock (grants/s)",
            "mode": f"{handoff[0]}" if handoff else "-",
            "raftlease": _fmt(handoff[1] if handoff else None),
            "anchors": {a: _fmt(v) for a, v in h_anchor.items()},
            "best": f"{TITLES[h_best[0]]} {_fmt(h_best[1])}" if h_best else "-",
            "factor": _div(handoff[1] if handoff else None, h_best[1] if h_best else None),
            "raw": None,
            "vs_raw": None,
        }
    )
    for label, mode, fn, spec in (
        ("failover: SIGKILL leader -> next acquire (s)", "median", failover_s, ".3f"),
        ("server CPU per acquire, 3 processes (us)", "1 thread", acquire_cpu_us, ",.0f"),
    ):
        rl_v = fn(result.get("workloads", {}))
        vals = {a: fn(s.get("workloads", {})) for a, s in systems.items()}
        measured = {a: v for a, v in vals.items() if v is not None}
        low = min(measured.items(), key=lambda kv: kv[1], default=None)
        rows.append(
            {
                "workload": label,
                "mode": mode,
                "raftlease": _fmt(rl_v, spec),
                "anchors": {a: _fmt(v, spec) for a, v in vals.items()},
                "best": f"{TITLES[low[0]]} {_fmt(low[1], spec)}" if low else "-",
                # Lower is better here: the factor is best / raftlease.
                "factor": _div(low[1] if low else None, rl_v),
                "raw": None,
                "vs_raw": None,
            }
        )
    return rows


def measured_rows(result: Result) -> list[dict[str, Any]]:
    """``comparison_rows`` without the workloads this run did not measure (--only)."""
    return [
        row
        for row in comparison_rows(result)
        if row["raftlease"] != "-"
        or any(any(ch.isdigit() for ch in cell) for cell in row["anchors"].values())
    ]


def render(result: Result) -> list[str]:
    """The report's anchors section (no lines when the run had no anchors phase)."""
    section = result.get("anchors")
    if not isinstance(section, dict):
        return []
    systems = measured_systems(result)
    lines = ["", "## raftlease beside etcd and ZooKeeper (same run)", ""]
    if section.get("raftlease_durability"):
        lines.append(
            "- **raftlease**: the main cluster, NodeConfig defaults (durability = "
            f"{section['raftlease_durability']!r})"
        )
    for name, reason in section.get("skipped", {}).items():
        lines.append(f"- **{TITLES.get(name, name)} skipped**: {reason}")
    for name, system in systems.items():
        lines.append(
            f"- **{TITLES.get(name, name)} {system.get('version', '?')}**"
            + (f": FAILED: {system['error']}" if system.get("error") else "")
        )
        for group, modes in system.get("workloads", {}).items():
            if isinstance(modes, dict) and "error" in modes:
                lines.append(f"  - {group}: FAILED: {modes['error']}")
    if not systems:
        lines += ["", "No anchor was measured."]
        return lines
    names = list(systems)
    lines += [
        "",
        "Factor = raftlease / best anchor for throughput, best anchor / raftlease for "
        "times and CPU: above 1 means raftlease is better. Ceiling = raw PySyncObj in "
        "the same run (1-thread sync commits; best pipelined for 16 threads).",
        "",
        "| workload | mode | raftlease | "
        + " | ".join(TITLES.get(n, n) for n in names)
        + " | best anchor | raftlease factor | raw PySyncObj | raftlease / raw |",
        "|---|---|---:|" + "---:|" * len(names) + "---|---:|---:|---:|",
    ]
    for row in measured_rows(result):
        lines.append(
            f"| {row['workload']} | {row['mode']} | {row['raftlease']} | "
            + " | ".join(row["anchors"].get(n, "-") for n in names)
            + f" | {row['best']} | {factor_text(row['factor'])} | {_fmt(row['raw'])} "
            f"| {factor_text(row['vs_raw'])} |"
        )
    fo = [
        (n, s["workloads"]["failover"]["SIGKILL leader"])
        for n, s in systems.items()
        if isinstance(s.get("workloads", {}).get("failover", {}).get("SIGKILL leader"), dict)
    ]
    if fo:
        lines += [""]
        lines += [
            f"{TITLES.get(n, n)} failover ({e['deadline_s']} s client deadline): "
            + ", ".join(f"{r['time_to_success_s']:.3f} s" for r in e["reps"])
            + "."
            for n, e in fo
        ]
    return lines


# ------------------------------------------------------------------ targets

Spec = Mapping[str, Any]


def _row(spec: Spec, figure: str, met: bool | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "target": str(spec["name"]),
        "figure": figure,
        "met": met,
        "note": str(spec.get("note", "")),
    }
    if "issue" in spec:
        row["issue"] = int(spec["issue"])
    return row


def _missing(spec: Spec, result: Result, anchors: list[str]) -> dict[str, Any] | None:
    """The n/a row when a needed anchor did not run (None: all ran)."""
    section = result.get("anchors", {})
    skipped = section.get("skipped", {})
    systems = measured_systems(result)
    gone = [a for a in anchors if a not in systems]
    if not gone:
        return None
    why = "; ".join(
        f"{TITLES.get(a, a)}: {skipped.get(a, 'not requested (--anchors)')}" for a in gone
    )
    return _row(spec, f"not measured ({why})", None)


def _pairs(spec: Spec) -> list[tuple[str, str]]:
    out = []
    for item in spec["against"]:
        anchor, _, group = str(item).partition(":")
        out.append((anchor, group or str(spec["group"])))
    return out


def eval_ratio(spec: Spec, j: Any) -> dict[str, Any] | None:
    """kind "anchor_ratio": raftlease ``group`` in ``mode`` >= ``min_ratio`` x the
    best of ``against`` ("anchor:group" items) in the same mode. With ``section``, the
    row is shown only when the result has that section, and, when the run had no
    anchors phase, as n/a with the text ``absent``."""
    result: Result = j.result
    if "section" in spec and spec["section"] not in result:
        return None
    if "anchors" not in result:
        return _row(spec, str(spec["absent"]), None) if "absent" in spec else None
    pairs = _pairs(spec)
    missing = _missing(spec, result, [a for a, _ in pairs])
    if missing is not None:
        return missing
    mode = str(spec["mode"])
    rl = raftlease_rate(result, str(spec.get("raftlease_group", spec["group"])), mode)
    best = best_anchor(result, pairs, mode)
    if rl is None or best is None:
        return _row(spec, "not measured (workload missing or failed)", None)
    ratio = rl / best[1]
    return _row(
        spec,
        f"{ratio:.2f}x ({rl:,.0f}/s vs {best[0]} {best[1]:,.0f}/s)",
        ratio >= float(spec["min_ratio"]),
    )


def eval_failover(spec: Spec, j: Any) -> dict[str, Any] | None:
    """kind "anchor_failover": raftlease's median <= ``max_s`` and below ``under``'s."""
    result: Result = j.result
    if "anchors" not in result:
        return None
    under = str(spec["under"])
    missing = _missing(spec, result, [under])
    if missing is not None:
        return missing
    rl = failover_s(result.get("workloads", {}))
    other = failover_s(measured_systems(result)[under].get("workloads", {}))
    if rl is None or other is None:
        return _row(spec, "not measured (failover missing or failed)", None)
    return _row(
        spec,
        f"{rl:.3f} s (ZooKeeper {other:.3f} s)" if under == "zookeeper" else f"{rl:.3f} s",
        rl <= float(spec["max_s"]) and rl < other,
    )


def eval_cpu(spec: Spec, j: Any) -> dict[str, Any] | None:
    """kind "anchor_cpu": raftlease's server CPU per acquire at 1 thread <= ``than``'s."""
    result: Result = j.result
    if "anchors" not in result:
        return None
    than = str(spec["than"])
    missing = _missing(spec, result, [than])
    if missing is not None:
        return missing
    rl = acquire_cpu_us(result.get("workloads", {}))
    other = acquire_cpu_us(measured_systems(result)[than].get("workloads", {}))
    if rl is None or other is None:
        return _row(spec, "not measured (acquire missing or failed)", None)
    return _row(spec, f"{rl:,.0f} us vs {TITLES.get(than, than)} {other:,.0f} us", rl <= other)


#: The evaluators of issue 16's kinds (targets.EVALUATORS includes them).
EVALUATORS: dict[str, Callable[[Spec, Any], dict[str, Any] | None]] = {
    "anchor_ratio": eval_ratio,
    "anchor_failover": eval_failover,
    "anchor_cpu": eval_cpu,
}
