"""The targets a run is judged against: the data is in ``targets.toml``, the checks
(one evaluator per ``kind``) are here.

``evaluate`` turns a result document into the rows of result["targets"]: ``target``
(label), ``figure`` (what was measured, as text), ``met`` (True, False, or None for
"not applicable") and ``note``, plus ``issue`` when the target names the issue it
comes from (the report's heading lists them; no ``issue`` means issue 6). It reads
only the result, so a saved bench.json can
be judged again after the targets change (``scripts/bench --render ... --retarget``).
Pure functions; no raftlease import.
"""

from __future__ import annotations

import statistics
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .anchors import table as anchors_table
from .context import (
    DURABILITY_MODES,
    NON_THROUGHPUT_GROUPS,
    PROFILES,
    Result,
    audit_round_ratios,
    audit_share_estimate,
    cert_round_figures,
    durability_entry,
    first_variant,
    peer_round_ratios,
    raw_pipelined,
    security_entry,
)

#: The targets of the report, next to this module.
TARGETS_FILE = Path(__file__).with_name("targets.toml")

#: The single-threaded mode of the throughput workloads.
ONE_THREAD = "1 thread"

#: One [[target]] table of targets.toml.
Spec = Mapping[str, Any]
#: One row of result["targets"].
Row = dict[str, Any]


@dataclass(frozen=True)
class Judged:
    """What the evaluators read: the result and its throughput modes."""

    result: Result
    #: The concurrent modes (e.g. "16 threads", "async 256"), in profile order.
    concurrent: list[str]

    @property
    def workloads(self) -> dict[str, Any]:
        workloads: dict[str, Any] = self.result.get("workloads", {})
        return workloads

    @property
    def all_modes(self) -> list[str]:
        return [ONE_THREAD, *self.concurrent]

    def rate(self, group: str, mode: str) -> float:
        """Median ops/s of ``group`` in ``mode``; 0.0 if not measured or failed."""
        try:
            return float(self.workloads[group][mode]["ops_per_s"]["median"])
        except (KeyError, TypeError):
            return 0.0

    def best_concurrent(self, group: str) -> tuple[str, float]:
        """The concurrent mode of ``group`` with the highest rate, and that rate."""
        mode = max(self.concurrent, key=lambda m: self.rate(group, m), default="")
        return mode, self.rate(group, mode)

    @property
    def durability(self) -> dict[str, Any] | None:
        """The durability phase's section (None if the run had none)."""
        section = self.result.get("durability")
        return section if isinstance(section, dict) else None

    def durable_rate(self, durability: str, group: str, mode: str) -> float:
        """Median ops/s of ``group`` in ``mode`` on the ``durability`` cluster; 0.0
        if not measured or failed."""
        entry = durability_entry(self.result, durability, group, mode)
        return 0.0 if entry is None else float(entry["ops_per_s"]["median"])

    def durable_best_concurrent(self, durability: str, group: str) -> tuple[str, float]:
        """The concurrent mode of ``group`` with the highest rate on the
        ``durability`` cluster, and that rate."""
        mode = max(
            self.concurrent, key=lambda m: self.durable_rate(durability, group, m), default=""
        )
        return mode, self.durable_rate(durability, group, mode)


Evaluator = Callable[[Spec, Judged], Row | None]


def _row(spec: Spec, figure: str, met: bool | None, note: str | None = None) -> Row:
    label = str(spec["name"])
    row: Row = {
        "target": label,
        "figure": figure,
        "met": met,
        "note": str(spec.get("note", "")) if note is None else note,
    }
    if "issue" in spec:
        row["issue"] = int(spec["issue"])
    return row


# ----------------------------------------------------------------- evaluators


def _ran(j: Judged, *groups: str) -> bool:
    """Whether every one of ``groups`` ran in this result (``--only`` may leave any
    out: its targets then have no row, not a "0/s: not met")."""
    return all(group in j.workloads for group in groups)


def _rate(spec: Spec, j: Judged) -> Row | None:
    if not _ran(j, spec["group"]):
        return None
    rate = j.rate(spec["group"], spec["mode"])
    return _row(spec, f"{rate:,.0f}/s", rate >= spec["min_per_s"])


def _best_concurrent_rate(spec: Spec, j: Judged) -> Row | None:
    if not _ran(j, spec["group"]):
        return None
    mode, rate = j.best_concurrent(spec["group"])
    return _row(spec, f"{rate:,.0f}/s ({mode})", rate >= spec["min_per_s"])


def _concurrent_vs_raw_pipelined(spec: Spec, j: Judged) -> Row | None:
    if not _ran(j, spec["group"]):
        return None
    _, rate = j.best_concurrent(spec["group"])
    raw_pipe = raw_pipelined(j.result)
    ratio = rate / raw_pipe if raw_pipe else 0.0
    return _row(
        spec,
        f"{100 * ratio:.0f} % ({rate:,.0f} vs {raw_pipe:,.0f}/s)",
        ratio >= spec["min_ratio"],
    )


def _as_fast_as(spec: Spec, j: Judged) -> Row | None:
    if not _ran(j, spec["group"], spec["baseline"]):
        return None
    parts = []
    ok = True
    for mode in j.all_modes:
        r, a = j.rate(spec["group"], mode), j.rate(spec["baseline"], mode)
        parts.append(f"{mode}: {r / a if a else 0:.2f}x")
        ok = ok and a > 0 and r >= spec["min_ratio"] * a
    return _row(spec, "; ".join(parts), ok)


def _read_speedup(spec: Spec, j: Judged) -> Row | None:
    fast, slow = spec["fast"], spec["slow"]
    # ``plain``: the group of a client without consistency modes (then ``missing``).
    if not any(_ran(j, group) for group in (fast, slow, spec["plain"])):
        return None  # no holder reads in this run
    if fast not in j.workloads or slow not in j.workloads:
        return _row(spec, spec["missing"], None)
    parts = []
    for mode in j.all_modes:
        f, s = j.rate(fast, mode), j.rate(slow, mode)
        parts.append(f"{mode}: {f / s if s else 0:.1f}x")
    best_fast = max(j.rate(fast, m) for m in j.all_modes)
    best_slow = max(j.rate(slow, m) for m in j.all_modes)
    return _row(
        spec,
        f"best {best_fast:,.0f} vs {best_slow:,.0f}/s = "
        f"{best_fast / best_slow if best_slow else 0:.1f}x ({'; '.join(parts)})",
        best_slow > 0 and best_fast >= spec["min_ratio"] * best_slow,
    )


def _handoff(spec: Spec, j: Judged) -> Row | None:
    handoffs = [e for e in j.workloads.get("handoff", {}).values() if isinstance(e, dict)]
    if not handoffs:
        return None
    handoff = max(handoffs, key=lambda e: float(e["ops_per_s"]["median"]))
    rate = float(handoff["ops_per_s"]["median"])
    fair = handoff["fairness"]
    fair_ok = fair["jain_index"] >= spec["min_jain"] and (
        fair["min_share_x_n"] >= spec["min_share_x_n"]
    )
    return _row(
        spec,
        f"{rate:,.0f}/s ({handoff['mode']}); Jain {fair['jain_index']:.3f}, min share x n "
        f"{fair['min_share_x_n']:.2f}, longest streak "
        f"{fair['longest_same_client_streak']:.0f}",
        rate >= spec["min_per_s"] and fair_ok,
    )


def _failover(spec: Spec, j: Judged) -> Row | None:
    fo = first_variant(j.workloads, "failover")
    if not fo:
        return None
    median = float(fo["time_to_success_s"]["median"])
    return _row(spec, f"{median:.3f} s", median < spec["max_s"])


def _no_elections(spec: Spec, j: Judged) -> Row | None:
    measured = [
        e
        for group, modes in j.workloads.items()
        if group not in NON_THROUGHPUT_GROUPS
        for e in modes.values()
        if isinstance(e, dict)
    ]
    if not measured:
        return None  # no throughput workload ran: "0 term changes" would pass vacuously
    elections = sum(int(e.get("elections", 0)) for e in measured)
    # A negative count (a node's term unreadable at the end) is not a pass either.
    return _row(
        spec,
        f"{elections} term change(s) during workloads 1-5",
        0 <= elections <= spec["max_elections"],
    )


def _memory(spec: Spec, j: Judged) -> Row | None:
    mem = first_variant(j.workloads, "memory")
    if not mem:
        return None
    full_size = mem["leases_requested"] >= spec["min_leases"]
    if spec.get("at_all_times") and not full_size:
        return None  # a smaller run says nothing of it (the row above shows its n/a)
    if spec.get("at_all_times"):
        # Issue 38: every figure the phase took counts, the peak during the load
        # (VmHWM), 1 s after it, settled and, when the snapshot phase ran, the peak of
        # the restart that loads the snapshot, whichever is highest on each node.
        names = ("peak_rss_mib", "rss_loaded_mib", "rss_settled_mib", "restart_peak_rss_mib")
        figures = [mem.get(name) or {} for name in names]
        nodes = sorted({node for figure in figures for node in figure})
        worst = {node: max(f.get(node, 0.0) for f in figures) for node in nodes}
        peak = max(worst.values(), default=0.0)
        figure = (
            f"max {peak:.0f} MiB ("
            + ", ".join(f"{k} {v:.0f}" for k, v in worst.items())
            + "; peak during the load, 1 s after it, settled"
            + (", restart)" if mem.get("restart_peak_rss_mib") else ")")
        )
    else:
        peak = max(mem["rss_loaded_mib"].values())
        figure = (
            f"max {peak:.0f} MiB ("
            + ", ".join(f"{k} {v:.0f}" for k, v in mem["rss_loaded_mib"].items())
            + ")"
        )
    row = _row(
        spec,
        figure,
        peak < spec["max_mib"] if full_size else None,
        "" if full_size else str(spec["note_small"]),
    )
    row["target"] = str(spec["name"]).format(leases=mem["leases_requested"])
    return row


def _snapshot_stall(spec: Spec, j: Judged) -> Row | None:
    snap = first_variant(j.workloads, "snapshot")
    if not snap:
        return None
    gap = float(snap["max_no_apply_certain_ms"])
    return _row(
        spec,
        f"{snap['snapshots_seen']} snapshots; longest interval without an apply "
        f"{gap:.0f} ms (upper bound {snap['max_no_apply_bound_ms']:.0f} ms; election "
        f"timeout min {snap['election_timeout_min_ms']:.0f} ms); "
        f"{snap['elections']} election(s)",
        gap < snap["election_timeout_min_ms"] and 0 <= snap["elections"] <= spec["max_elections"],
    )


def _durability_ratio(spec: Spec, j: Judged) -> Row | None:
    """fsync's best concurrent rate of ``group`` against none's (each its own best
    mode), with the ratio in every concurrent mode in the figure."""
    if j.durability is None:
        return None
    fsync, none = DURABILITY_MODES
    group = spec["group"]
    mode_f, rate_f = j.durable_best_concurrent(fsync, group)
    mode_n, rate_n = j.durable_best_concurrent(none, group)
    if not rate_f or not rate_n:
        have = [m for m in DURABILITY_MODES if j.durable_best_concurrent(m, group)[1]]
        measured = f"only {have[0]} measured" if have else "neither measured"
        return _row(spec, f"needs {fsync} and {none} ({measured})", None)
    per_mode = []
    for mode in j.concurrent:
        f, n = j.durable_rate(fsync, group, mode), j.durable_rate(none, group, mode)
        per_mode.append(f"{mode}: {f / n:.2f}" if f and n else f"{mode}: -")
    ratio = rate_f / rate_n
    return _row(
        spec,
        f"{100 * ratio:.0f} % ({fsync} {rate_f:,.0f}/s, {mode_f}; {none} {rate_n:,.0f}/s, "
        f"{mode_n}; per mode {', '.join(per_mode)})",
        ratio >= spec["min_ratio"],
    )


def _durability_p50(spec: Spec, j: Judged) -> Row | None:
    """The p50 latency of ``group`` in ``mode`` on one durability mode's cluster
    (``durability``, default fsync), against ``max_ms``; the other mode's beside it."""
    if j.durability is None:
        return None
    durability = str(spec.get("durability", DURABILITY_MODES[0]))
    entry = durability_entry(j.result, durability, spec["group"], spec["mode"])
    if entry is None:
        return _row(spec, f"{spec['group']} [{spec['mode']}] not measured with {durability}", None)
    figure = f"{entry['p50_ms']:.2f} ms (p99 {entry['p99_ms']:.2f} ms)"
    for other in DURABILITY_MODES:
        beside = durability_entry(j.result, other, spec["group"], spec["mode"])
        if other != durability and beside is not None:
            figure += f"; {other}: {beside['p50_ms']:.2f} ms"
    return _row(spec, figure, float(entry["p50_ms"]) < spec["max_ms"])


def _measured_rate(spec: Spec, j: Judged) -> Row | None:
    """``rate``, shown only when ``group`` was measured (a workload not every run has)."""
    if spec["group"] not in j.workloads:
        return None
    return _rate(spec, j)


def _p50(spec: Spec, j: Judged) -> Row | None:
    """The p50 latency of ``group`` in ``mode`` against ``max_ms`` (no row when the
    group was not measured)."""
    entry = j.workloads.get(spec["group"], {}).get(spec["mode"])
    if spec["group"] not in j.workloads:
        return None
    if not isinstance(entry, dict):
        return _row(spec, f"{spec['group']} [{spec['mode']}] not measured", None)
    figure = f"{entry['p50_ms']:.2f} ms (p99 {entry['p99_ms']:.2f} ms)"
    return _row(spec, figure, float(entry["p50_ms"]) < spec["max_ms"])


def _task_memory(spec: Spec, j: Judged) -> Row | None:
    mem = first_variant(j.workloads, "task memory")
    if not mem:
        return None
    peak = max(mem["rss_loaded_mib"].values())
    full_size = mem["tasks_requested"] >= spec["min_tasks"]
    row = _row(
        spec,
        f"max {peak:.0f} MiB ("
        + ", ".join(f"{k} {v:.0f}" for k, v in mem["rss_loaded_mib"].items())
        + f"; {mem['ready_tasks']:,} ready)",
        peak < spec["max_mib"] if full_size else None,
        "" if full_size else str(spec["note_small"]),
    )
    row["target"] = str(spec["name"]).format(tasks=mem["tasks_requested"])
    return row


def _security_ratio(spec: Spec, j: Judged) -> Row | None:
    """One security cluster's median rate of ``group`` in ``mode`` over another's
    (the security phase), against ``min_ratio``: ``over`` (default "secure") divided
    by ``under`` (default "insecure"). No row without the phase."""
    if not isinstance(j.result.get("security"), dict):
        return None
    group, mode = spec["group"], spec["mode"]
    over, under = str(spec.get("over", "secure")), str(spec.get("under", "insecure"))
    top = security_entry(j.result, over, group, mode)
    base = security_entry(j.result, under, group, mode)
    if top is None or base is None or not base["ops_per_s"]["median"]:
        return _row(spec, f"{group} [{mode}] not measured on both clusters", None)
    rt, rb = float(top["ops_per_s"]["median"]), float(base["ops_per_s"]["median"])
    ratio = rt / rb
    return _row(
        spec,
        f"{100 * ratio:.0f} % ({over} {rt:,.0f}/s, {under} {rb:,.0f}/s; "
        f"cost {100 * (1 - ratio):.0f} %)",
        ratio >= spec["min_ratio"],
    )


def _peer_tls_rounds(spec: Spec, j: Judged) -> Row | None:
    """The median over the security phase's peer TLS rounds of (peer TLS / plain
    peers) for ``group`` in ``mode``, against ``min_ratio``; no row without the phase,
    n/a without rounds (a run saved before they existed)."""
    if not isinstance(j.result.get("security"), dict):
        return None
    group, mode = spec["group"], spec["mode"]
    ratios = peer_round_ratios(j.result, group, mode)
    if not ratios:
        return _row(spec, f"{group} [{mode}]: no peer TLS rounds measured", None)
    median = statistics.median(ratios)
    return _row(
        spec,
        f"{100 * median:.0f} % (median of {len(ratios)} rounds: "
        + ", ".join(f"{100 * r:.0f} %" for r in ratios)
        + f"; cost {100 * (1 - median):.0f} %)",
        median >= spec["min_ratio"],
    )


def _scale(spec: Spec, j: Judged) -> Row | None:
    """Issue 16's scale target, both halves: ``min_agents`` agents sustained with a
    hold p99 keep-alive latency under ``max_p99_ms`` and no session lost (the scale
    phase), and under ``max_mib`` RSS per node with ``min_leases`` live leases (the
    memory phase's figures). A half is n/a when its phase did not run or ran smaller
    (the quick profile); the row is met only when both are, not met when either is
    not. Shown when the run has the scale phase, or the ``section`` it was listed
    under before the phase existed (anchors). With ``agents_only`` (issue 38's 50,000
    agents) the row judges the agents half alone and is shown only when the scale
    phase ran."""
    entry = first_variant(j.workloads, "scale")
    ran = "scale" in j.workloads
    agents_only = bool(spec.get("agents_only"))
    if not ran and (agents_only or spec["section"] not in j.result):
        return None
    parts: list[str] = []
    agents_ok: bool | None = None
    if entry is None:
        parts.append("agents: the scale phase " + ("failed" if ran else "did not run"))
    else:
        hold = entry.get("hold") or {}
        p99 = hold.get("p99_ms")
        lost = int(entry.get("sessions_lost", 0))
        parts.append(
            f"agents: {entry['sustained']:,} of {entry['agents_requested']:,} sustained, "
            + ("no hold" if p99 is None else f"hold p99 {p99:.0f} ms")
            + f", {lost} session(s) lost"
            + (f" (ramp stopped: {entry['stopped']})" if entry.get("stopped") else "")
        )
        if entry["agents_requested"] >= spec["min_agents"]:
            agents_ok = (
                entry["sustained"] >= spec["min_agents"]
                and p99 is not None
                and p99 < spec["max_p99_ms"]
                and lost == 0
            )
        else:
            parts[-1] += f" ({entry['agents_requested']:,} requested: n/a)"
    if agents_only:
        return _row(spec, parts[0], agents_ok)
    rss_ok: bool | None = None
    mem = first_variant(j.workloads, "memory")
    if mem is None:
        parts.append("RSS: the memory phase did not run")
    else:
        # Judged settled (after the log compaction that follows the load), when the
        # run waited for it, with the figure 1 s after the load beside it (issue 38's
        # own target, "< 100 MiB at all times", judges the higher of the two).
        loaded = max(mem["rss_loaded_mib"].values())
        settled_by = mem.get("rss_settled_mib") or {}
        if settled_by:
            peak = max(settled_by.values())
            parts.append(
                f"RSS: max {peak:.0f} MiB per node settled with "
                f"{mem['leases_requested']:,} leases ({loaded:.0f} MiB 1 s after the load; "
                "memory phase)"
            )
        else:
            peak = loaded
            parts.append(
                f"RSS: max {peak:.0f} MiB per node with {mem['leases_requested']:,} leases "
                "(memory phase, 1 s after the load; not settled)"
            )
        if mem["leases_requested"] >= spec["min_leases"]:
            rss_ok = peak < spec["max_mib"]
        else:
            parts[-1] += " (n/a)"
    halves = (agents_ok, rss_ok)
    met = False if False in halves else (True if halves == (True, True) else None)
    return _row(spec, "; ".join(parts), met)


def _certs(j: Judged) -> dict[str, Any] | None:
    section = j.result.get("certs")
    return section if isinstance(section, dict) else None


def _pct(ratio: float) -> str:
    """A ratio as the signed percentage it adds (1.117 -> "+11.7 %")."""
    return f"{100 * (ratio - 1):+.1f} %"


def _cert_signing(spec: Spec, j: Judged) -> Row | None:
    """Issue 39: the median over the certs group's signing rounds of certified p50 /
    plain p50 against ``1 + max_cost``; not met either when a certified acquire
    failed or came back without a certificate. No row without the group."""
    if _certs(j) is None:
        return None
    rounds = cert_round_figures(j.result)
    if not rounds:
        return _row(spec, "no signing round measured both arms", None)
    median = statistics.median(r["p50_ratio"] for r in rounds)
    errors = int(sum(r["errors"] for r in rounds))
    figure = (
        f"{_pct(median)} (median of {len(rounds)} rounds: "
        + ", ".join(_pct(r["p50_ratio"]) for r in rounds)
        + f"; throughput certified / plain, median "
        f"{statistics.median(r['rate_ratio'] for r in rounds):.2f})"
    )
    if errors:
        figure += f"; {errors} certified acquire(s) failed or came back without a certificate"
    return _row(spec, figure, median <= 1 + float(spec["max_cost"]) and errors == 0)


def _audit_cost(spec: Spec, j: Judged) -> Row | None:
    """Issue 39: the audit trail's cost in acquire throughput, at most ``max_cost``:
    judged on the median of the audit rounds (default build / audit-off build) when
    the run has them, else on the estimate (``context.audit_share_estimate``), and
    the figure says which. No row without the group; n/a with neither."""
    if _certs(j) is None:
        return None
    limit = float(spec["max_cost"])
    estimate = audit_share_estimate(j.result)
    est_text = (
        ""
        if estimate is None
        else f"estimate {100 * estimate['share']:.1f} % (3 x {estimate['audit_us_per_pair']:.1f} "
        f"µs per acquire+release in the state machine / {estimate['servers_us_per_acquire']:.0f} "
        f"µs server CPU per acquire, {estimate['from']})"
    )
    ratios = audit_round_ratios(j.result)
    if ratios:
        median = statistics.median(ratios)
        figure = (
            f"cost {100 * (1 - median):.1f} %: default / audit-off build {median:.2f} (median of "
            f"{len(ratios)} rounds: " + ", ".join(f"{r:.2f}" for r in ratios) + ")"
        )
        if est_text:
            figure += f"; {est_text}"
        return _row(spec, figure, median >= 1 - limit)
    if estimate is None:
        return _row(spec, "neither audit rounds nor an estimate measured", None)
    return _row(spec, f"{est_text}; no audit-off rounds in this run", estimate["share"] <= limit)


def _cert_verify(spec: Spec, j: Judged) -> Row | None:
    """Issue 39: verification throughput per core recorded (no bound: met when both
    rates were measured). No row without the group."""
    certs = _certs(j)
    if certs is None:
        return None
    verify = certs.get("verify") or {}
    check, prove = float(verify.get("check_per_s", 0)), float(verify.get("prove_per_s", 0))
    if check <= 0 or prove <= 0:
        return _row(spec, "not measured", False if "verify" in certs else None)
    return _row(spec, f"Verifier.check {check:,.0f}/s, HolderKey.prove {prove:,.0f}/s", True)


def _not_measured(spec: Spec, j: Judged) -> Row | None:
    """A target the benchmark cannot judge yet: an n/a row with ``figure`` as its
    text, shown only when the result has the ``section`` the target belongs to."""
    if spec["section"] not in j.result:
        return None
    return _row(spec, str(spec["figure"]), None)


#: ``kind`` in targets.toml -> its evaluator.
EVALUATORS: dict[str, Evaluator] = {
    "rate": _rate,
    "best_concurrent_rate": _best_concurrent_rate,
    "concurrent_vs_raw_pipelined": _concurrent_vs_raw_pipelined,
    "as_fast_as": _as_fast_as,
    "read_speedup": _read_speedup,
    "handoff": _handoff,
    "failover": _failover,
    "no_elections": _no_elections,
    "memory": _memory,
    "snapshot_stall": _snapshot_stall,
    "durability_ratio": _durability_ratio,
    "durability_p50": _durability_p50,
    "not_measured": _not_measured,
    "security_ratio": _security_ratio,
    "peer_tls_rounds": _peer_tls_rounds,
    "measured_rate": _measured_rate,
    "p50": _p50,
    "task_memory": _task_memory,
    "scale": _scale,
    # Issue 39: lease certificates and the audit trail (workloads/certs.py).
    "cert_signing": _cert_signing,
    "audit_cost": _audit_cost,
    "cert_verify": _cert_verify,
    # Issue 16: raftlease beside etcd and ZooKeeper (anchors/table.py).
    **anchors_table.EVALUATORS,
}


# ------------------------------------------------------------------- public


def load_specs(path: Path = TARGETS_FILE) -> list[Spec]:
    """The [[target]] tables of ``path``, checked for a known kind and a name."""
    with path.open("rb") as f:
        specs: list[Spec] = tomllib.load(f).get("target", [])
    for i, spec in enumerate(specs, 1):
        if spec.get("kind") not in EVALUATORS:
            raise ValueError(f"{path}: target {i} has unknown kind {spec.get('kind')!r}")
        if not spec.get("name"):
            raise ValueError(f"{path}: target {i} ({spec['kind']}) has no name")
    return specs


def concurrent_modes(result: Result) -> list[str]:
    """The concurrent modes of a saved result: those of the profile it names, else
    the acquire modes it holds other than one thread."""
    profile = PROFILES.get(str(result.get("meta", {}).get("profile")))
    if profile is not None:
        return profile.concurrent_modes
    acquire = result.get("workloads", {}).get("acquire", {})
    return [m for m, e in acquire.items() if m != ONE_THREAD and isinstance(e, dict)]


def evaluate(
    result: Result, concurrent: list[str] | None = None, specs: list[Spec] | None = None
) -> list[Row]:
    """The target rows for ``result``, in the order of ``specs`` (default: the
    targets file); a target whose workload did not run has no row."""
    judged = Judged(result, concurrent if concurrent is not None else concurrent_modes(result))
    rows = []
    for spec in load_specs() if specs is None else specs:
        row = EVALUATORS[spec["kind"]](spec, judged)
        if row is not None:
            rows.append(row)
    return rows
