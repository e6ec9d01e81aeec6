"""The figures users read, written from a saved run (``scripts/bench --publish``).

README.md, docs/performance.md and docs/certificates.md hold their measured figures
between marker lines (``<!-- bench:NAME:start -->`` ... ``<!-- bench:NAME:end -->``);
``publish`` replaces what is between them with text rendered from one or more
bench.json files, each block stamped with its run's date, machine and commit. A block
is written from the result that has its section (anchors, security, certs); a result
that feeds no block, and a file that lacks a block's markers, are errors, so a figure
is never silently left stale.
Pure text work: imports neither raftlease nor the measuring modules.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import report
from .anchors import table as anchors_table
from .context import Result, peer_round_ratios

ROOT = Path(__file__).resolve().parent.parent.parent


class PublishError(Exception):
    """A result or a file cannot be published (the message says which and why)."""


def stamp(result: Result) -> str:
    """When, where and on what code a run measured: the first line of every block."""
    meta = result.get("meta", {})
    load = meta.get("loadavg_start") or ["?"]
    # The load at the end tells a reader whether other work shared the machine
    # (the bench itself keeps about 2 busy).
    end = meta.get("loadavg_end")
    until = f", {end[0]} at the end" if end else ""
    git = str(meta.get("code", {}).get("git_head", "?"))[:7]
    command = meta.get("argv")
    how = f", `{' '.join(['scripts/bench', *command])}`" if command is not None else ""
    return (
        f"Measured {meta.get('started', '?')} on {meta.get('cpus', '?')} CPUs (load "
        f"average {load[0]} at the start{until}), git {git}, {meta.get('profile', '?')} profile"
        f"{how}: {meta.get('repeat', '?')} repetitions of {meta.get('duration_s', '?')} s "
        "after a warm-up, everything fsyncs (raftlease's default, etcd's WAL, ZooKeeper "
        "`forceSync=yes`)."
    )


def figures_summary(result: Result) -> list[str] | None:
    """README: raftlease beside etcd and ZooKeeper, one compact table."""
    if not isinstance(result.get("anchors"), dict):
        return None
    systems = list(anchors_table.measured_systems(result))
    # An anchors phase that measured nothing (a run with --only of groups the anchors
    # do not have, e.g. certs) must not replace the published table with an empty one.
    if not systems or not anchors_table.measured_rows(result):
        return None
    titles = [anchors_table.TITLES.get(n, n) for n in systems]
    lines = [
        stamp(result),
        "",
        "| workload | mode | raftlease | "
        + " | ".join(titles)
        + " | raftlease vs the best (>1 = better) |",
        "|---|---|---:|" + "---:|" * len(systems) + "---:|",
    ]
    for row in anchors_table.measured_rows(result):
        lines.append(
            f"| {row['workload']} | {row['mode']} | {row['raftlease']} | "
            + " | ".join(row["anchors"].get(n, "-") for n in systems)
            + f" | {anchors_table.factor_text(row['factor'])} |"
        )
    return lines


def anchors_full(result: Result) -> list[str] | None:
    """docs/performance.md: the report's anchors section and the issue 16 targets."""
    if not anchors_table.measured_systems(result) or not anchors_table.measured_rows(result):
        return None  # as in figures_summary: nothing measured, nothing published
    return _run_block(result, anchors_table.render(result), issue=16)


def peer_tls_summary(result: Result) -> list[str] | None:
    """README: what peer TLS costs, one line from the alternating rounds."""
    d = result.get("security")
    modes = ((d or {}).get("peer_rounds") or {}).get("modes") or []
    parts = []
    for mode in modes:
        ratios = peer_round_ratios(result, "acquire", mode)
        if ratios:
            parts.append(f"{statistics.median(ratios):.2f} at {mode}")
    if not parts:
        return None
    meta = result.get("meta", {})
    git = str(meta.get("code", {}).get("git_head", "?"))[:7]
    return [
        "Mutual TLS between members: acquire throughput with it / without it, median of "
        f"{len((d or {}).get('peer_rounds', {}).get('rounds') or [])} alternating rounds: "
        + ", ".join(parts)
        + f" (measured {meta.get('started', '?')}, git {git})."
    ]


def security_full(result: Result) -> list[str] | None:
    """docs/performance.md: the report's security section and the issue 35 targets."""
    return _run_block(result, report.security_section(result), issue=35)


def certs_full(result: Result) -> list[str] | None:
    """docs/certificates.md: the report's certs section and the issue 39 targets."""
    return _run_block(result, report.certs_section(result), issue=39)


def _run_block(result: Result, section: list[str], issue: int) -> list[str] | None:
    """A report section under the run's stamp, without its heading, then the targets
    of ``issue`` as the run judged them (None when the run had no such section)."""
    body = [line for line in section if not line.startswith("## ")]
    while body and not body[0]:
        body.pop(0)
    if not body:
        return None
    lines = [stamp(result), "", *body]
    rows = [t for t in result.get("targets", []) if t.get("issue") == issue]
    if rows:
        lines += ["", f"Targets of issue {issue} in this run:", ""]
        lines += [f"- {t['target']}: {t['figure']}: {_verdict(t.get('met'))}" for t in rows]
    return lines


def _verdict(met: object) -> str:
    return "met" if met is True else "**not met**" if met is False else "n/a"


@dataclass(frozen=True)
class Block:
    path: Path
    name: str
    render: Callable[[Result], list[str] | None]


BLOCKS = (
    Block(ROOT / "README.md", "figures", figures_summary),
    Block(ROOT / "README.md", "peer-tls", peer_tls_summary),
    Block(ROOT / "docs" / "performance.md", "anchors-run", anchors_full),
    Block(ROOT / "docs" / "performance.md", "security-run", security_full),
    Block(ROOT / "docs" / "certificates.md", "certs-run", certs_full),
)


def replace_block(text: str, name: str, lines: list[str]) -> str:
    """``text`` with the lines between block ``name``'s markers replaced by ``lines``.

    Raises PublishError when the markers are missing, repeated or out of order."""
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    pattern = re.compile(re.escape(start) + r"\n.*?" + re.escape(end), re.DOTALL)
    if text.count(start) != 1 or text.count(end) != 1 or not pattern.search(text):
        raise PublishError(f"no single {start} ... {end} pair")
    return pattern.sub(lambda _: "\n".join([start, *lines, end]), text)


def publish(
    results: list[tuple[str, Result]], blocks: tuple[Block, ...] = BLOCKS, root: Path = ROOT
) -> list[str]:
    """Write every block some result feeds (a later result wins) and return what was
    written, one line each (paths relative to ``root``). Nothing is written unless
    every block can be.

    Raises PublishError when a result feeds no block or a file lacks a block's markers."""
    texts: dict[Path, str] = {}
    done: list[str] = []
    for label, result in results:
        fed = False
        for block in blocks:
            lines = block.render(result)
            if lines is None:
                continue
            fed = True
            text = texts.get(block.path)
            if text is None:
                text = block.path.read_text()
            try:
                texts[block.path] = replace_block(text, block.name, lines)
            except PublishError as exc:
                raise PublishError(f"{block.path.name}: {exc}") from None
            done.append(f"{block.path.relative_to(root)} [{block.name}] from {label}")
        if not fed:
            raise PublishError(
                f"{label} has no section any published block shows (anchors, security or certs)"
            )
    for path, text in texts.items():
        path.write_text(text)
    return done
