#!/usr/bin/env python3
"""Check the SPIN model of the lease layer (model/lease.pml, issue 43).

Every honest configuration must verify: SPIN's search completes (no depth limit hit,
no memory limit, no time limit) with 0 errors. Every planted-bug variant must be
refuted by an assertion of the property it breaks. Each run generates pan.c in its own
temporary directory (spin -a), compiles it (gcc -O2 -DSAFETY [-DBFS]) and runs it with a
time limit; the exit status is 0 only if all of them came out as expected.

    python3 model/check.py            # the CI tier (model/README.md lists what it covers)
    python3 model/check.py --full     # the larger configurations too
    python3 model/check.py --json     # one JSON object instead of the table
    python3 model/check.py --only keys-direct  # runs by name, whatever their tier

``keys-direct`` (two keys searched directly, which does not finish) runs only when named:
two keys are verified by the key reduction instead (model/README.md, "Two keys").

Run it under `nice` on a shared machine: the runs are one at a time, each single-threaded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

MODEL = Path(__file__).resolve().parent / "lease.pml"

# pan's options. -m: the DFS stack depth (the deepest honest search goes to ~75k steps;
# a search that hits the limit is reported as incomplete, never as verified). -w: 2^w
# hash slots. MEMLIM (MB) stops pan before it takes more than a shared machine can give;
# a search stopped that way is incomplete too.
PAN_DEPTH = 2_000_000
PAN_HASH_LOG2 = 24
MEMLIM_MB = 4096

# How pan's assertion failure names the property: the assertion's expression, as
# preprocessed (the comments naming P1..P5 in lease.pml do not reach pan's output).
PROPERTY_OF_ASSERTION: tuple[tuple[str, str], ...] = (
    ("cvr[", "P1"),  # assert(j == c || cvr[CV(j, k)] == 0)
    ("ctok[", "P2"),  # assert(rev + 1 > ctok[k])
    ("(a==nd)", "P3"),  # assert(a == nd)
    ("tdone", "P5"),  # assert(tdone == 0)
    ("(tatt==watt[", "P5"),  # assert(tatt == watt[c])
    ("]==cterm)", "R"),  # assert(term[L] == cterm): the premise of the key reduction
)


@dataclass(frozen=True)
class Config:
    """One exhaustive configuration of the honest model (or the base of a variant)."""

    name: str
    defines: tuple[str, ...]
    covers: str
    full_only: bool = False  # only with --full (too slow for the default CI budget)
    measure_only: bool = False  # only when named with --only: no verdict expected
    opt: str = "2"  # gcc -O level: 0 where the search is shorter than compiling at -O2


@dataclass(frozen=True)
class Variant:
    """A planted bug: the model with -DPLANTED_<name>, which SPIN must refute."""

    name: str
    config: str  # the smallest configuration (of CONFIGS) that refutes it
    bfs: bool  # breadth-first: the shortest counterexample, when it is shallow
    expect: str  # the property whose assertion must fail
    extra: tuple[str, ...] = ()


CONFIGS: tuple[Config, ...] = (
    Config(
        "lease",
        ("-DMAXT=1", "-DMAXREV=3"),
        "one leader, one key: grants, handoff to a waiter, renewals, releases, expiry, "
        "keep-alives from memory and their flush, lease reads, the log clock",
        opt="1",  # -O1: 13 s in all here (6 s searching), against 34-38 s at -O2
    ),
    Config(
        "elect",
        ("-DMAXT=2", "-DMAXREV=1"),
        "one election: vote promise, leader lease, term extension, read barrier, "
        "deposed leaders, stale views (P3 across a change of leader)",
        opt="1",  # -O1: 21 s in all here (15.5 s searching), against 32-42 s at -O2
    ),
    Config(
        "tasks",
        ("-DTASKS", "-DMAXT=1", "-DMAXREV=0"),
        "one task: claims, attempt expiry (log time), completion; no elections",
        opt="0",
    ),
    Config(
        "faults",
        ("-DFAULTS", "-DMAXT=2", "-DMAXREV=1"),
        "a clock that runs slow beyond the bound, the drift alarm, one election",
        full_only=True,
    ),
    Config(
        "keys",
        ("-DMAXT=1", "-DMAXREV=2"),
        "two keys (any number), by the key reduction (model/README.md, 'Two keys'): the "
        "one-key image of -DK=2 -DMAXT=1 -DMAXREV=2; every key's grants, keep-alives and "
        "lease reads with another key's entries, promises and reads interleaved",
        opt="1",  # -O1: 17 s in all here, against 24 s at -O0 and 30-60 s at -O2
    ),
    Config(
        "keys-direct",
        ("-DK=2", "-DMAXT=1", "-DMAXREV=2"),
        "two keys searched directly: does not finish (model/README.md); run only when "
        "named with --only, to measure",
        full_only=True,
        measure_only=True,
    ),
    Config(
        "elect-2grants",
        ("-DMAXT=2", "-DMAXREV=2"),
        "one election with two grants: P1 across a change of leader",
        full_only=True,
    ),
    Config(
        "terms3",
        ("-DMAXT=3", "-DMAXREV=1"),
        "two elections, one grant",
        full_only=True,
    ),
)

VARIANTS: tuple[Variant, ...] = (
    Variant("FAST_LOG_CLOCK", "lease", bfs=True, expect="P1"),
    Variant("SKIP_VOTE_PROMISE", "elect", bfs=True, expect="P3"),
    Variant("SKIP_READ_BARRIER", "elect", bfs=True, expect="P3"),
    Variant("IGNORE_DRIFT_ALARM", "faults", bfs=True, expect="P3"),
    Variant("NO_TERM_EXTENSION", "elect-2grants", bfs=True, expect="P1"),
    Variant("ACCEPT_STALE_ATTEMPT", "tasks", bfs=True, expect="P5"),
    Variant("UNWRITTEN_KEEPALIVES", "lease", bfs=True, expect="P1"),
)


@dataclass
class Result:
    """One pan run, as parsed from its output."""

    kind: str  # "config" or "variant"
    name: str
    defines: list[str]
    search: str  # "dfs" or "bfs"
    states: int | None = None
    depth: int | None = None
    errors: int | None = None
    seconds: float | None = None  # pan's own elapsed time
    wall: float = 0.0  # spin + gcc + pan
    complete: bool = False
    violated: str | None = None  # the property of the failed assertion
    assertion: str | None = None
    ok: bool = False
    note: str = ""
    tail: list[str] = field(default_factory=list)


def _int(pattern: str, text: str) -> int | None:
    match = re.search(pattern, text)
    return int(match.group(1)) if match else None


def parse_pan(out: str, result: Result) -> None:
    """Fill in what pan's summary says (states stored, depth, errors, time)."""
    result.states = _int(r"(\d+) states, stored", out)
    result.depth = _int(r"depth reached (\d+)", out)
    result.errors = _int(r"errors: (\d+)", out)
    seconds = re.search(r"pan: elapsed time ([\d.e+]+) seconds", out)
    result.seconds = float(seconds.group(1)) if seconds else None
    assertion = re.search(r"assertion violated (.*) \(at depth (\d+)\)", out)
    if assertion:
        result.assertion = assertion.group(1).strip()
        result.depth = int(assertion.group(2))
        for needle, prop in PROPERTY_OF_ASSERTION:
            if needle in result.assertion:
                result.violated = prop
                break
    # A search is complete only if pan finished it: no depth or memory limit, no
    # interruption (pan says "Search not completed" for each of those, and for a stop
    # at the first error, which only variants expect).
    result.complete = (
        result.states is not None
        and "Search not completed" not in out
        and "max search depth too small" not in out
        and "out of memory" not in out
        and "Interrupted" not in out
    )


def run_pan(
    defines: list[str], bfs: bool, timeout: float, opt: str, workdir: Path, result: Result
) -> str:
    """spin -a, gcc and pan in workdir; pan's output (stdout and stderr)."""
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    shutil.copy(MODEL, workdir / MODEL.name)
    subprocess.run(
        [*nice, "spin", "-a", *defines, MODEL.name],
        cwd=workdir,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    cflags = [f"-O{opt}", "-DSAFETY", f"-DMEMLIM={MEMLIM_MB}", "-w"]
    if bfs:
        cflags.append("-DBFS")
    subprocess.run(
        [*nice, "gcc", *cflags, "-o", "pan", "pan.c"],
        cwd=workdir,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # pan prints its summary on SIGINT, so a run out of time still says how far it got.
    proc = subprocess.Popen(
        [*nice, "./pan", f"-m{PAN_DEPTH}", f"-w{PAN_HASH_LOG2}"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException as err:
        if not isinstance(err, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)  # never leave a pan running behind us
            raise
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        result.note = f"time limit ({timeout:.0f} s)"
        out = (out or "") + "\nInterrupted\n"
    return out


def check_one(
    kind: str,
    name: str,
    defines: list[str],
    bfs: bool,
    timeout: float,
    expect: str | None,
    opt: str = "2",
) -> Result:
    """Run one configuration (expect None: must verify) or variant (must violate expect)."""
    result = Result(kind=kind, name=name, defines=defines, search="bfs" if bfs else "dfs")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="raftlease-model-") as tmp:
        try:
            out = run_pan(defines, bfs, timeout, opt, Path(tmp), result)
        except subprocess.CalledProcessError as err:
            result.note = f"{' '.join(map(str, err.cmd))} failed"
            result.tail = (str(err.stdout) + str(err.stderr)).splitlines()[-10:]
            result.wall = time.monotonic() - start
            return result
    result.wall = time.monotonic() - start
    parse_pan(out, result)
    if expect is None:
        result.ok = result.complete and result.errors == 0
        if not result.ok and not result.note:
            result.note = "errors" if result.errors else "search not complete"
    else:
        result.ok = result.violated == expect
        if not result.ok and not result.note:
            result.note = (
                f"violated {result.violated} ({result.assertion}), expected {expect}"
                if result.assertion
                else f"not refuted (expected {expect})"
            )
    if not result.ok:
        result.tail = out.strip().splitlines()[-12:]
    return result


def selected(full: bool, only: list[str] | None) -> tuple[list[Config], list[Variant]]:
    """The configurations and variants of this run (a variant brings its configuration)."""
    # Every variant runs by default: a refutation is found early even when the
    # exhaustive search of its configuration is too long for the default tier.
    configs = [c for c in CONFIGS if (full or not c.full_only) and not c.measure_only]
    variants = list(VARIANTS)
    if only:
        # A name picks its run whatever its tier: --only faults runs faults alone.
        configs = [c for c in CONFIGS if c.name in only]
        variants = [v for v in VARIANTS if v.name in only]
    return configs, variants


def _progress(r: Result) -> None:
    """One line per run on stderr as it ends: a long check shows where it is."""
    print(
        f"[check] {r.kind} {r.name}: {'ok' if r.ok else 'FAILED'} states={r.states} "
        f"depth={r.depth} pan={r.seconds}s wall={r.wall:.1f}s {r.violated or ''} {r.note}",
        file=sys.stderr,
        flush=True,
    )


def table(results: list[Result]) -> str:
    rows = [("kind", "name", "search", "states", "depth", "pan s", "wall s", "result")]
    for r in results:
        if r.kind == "config":
            verdict = "verified" if r.ok else f"FAILED: {r.note}"
        else:
            verdict = f"refuted: {r.violated}" if r.ok else f"FAILED: {r.note}"
        rows.append(
            (
                r.kind,
                r.name,
                r.search,
                f"{r.states:,}" if r.states is not None else "-",
                str(r.depth) if r.depth is not None else "-",
                f"{r.seconds:.2f}" if r.seconds is not None else "-",
                f"{r.wall:.1f}",
                verdict,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--full", action="store_true", help="the larger configurations too")
    parser.add_argument("--json", action="store_true", help="print JSON, not a table")
    parser.add_argument(
        "--timeout", type=float, default=360.0, help="seconds per pan run (default 360)"
    )
    parser.add_argument(
        "--only", nargs="+", metavar="NAME", help="only these configurations or variants"
    )
    parser.add_argument("--list", action="store_true", help="list what would run, and stop")
    # -O2 makes pan about twice as fast as -O0 but takes 10-40 s more to compile each
    # pan.c on a busy machine: worth it for the exhaustive searches, not for the variants,
    # whose counterexamples are found in well under a second.
    parser.add_argument(
        "--opt",
        choices=["0", "1", "2"],
        help="gcc -O level for pan (default: 2 for configurations, 0 for variants)",
    )
    args = parser.parse_args(argv)

    configs, variants = selected(args.full, args.only)
    if args.list:
        for c in configs:
            print(f"config  {c.name:14} {' '.join(c.defines):32} {c.covers}")
        for v in variants:
            print(f"variant {v.name:22} on {v.config} ({'bfs' if v.bfs else 'dfs'}): {v.expect}")
        return 0
    missing = [tool for tool in ("spin", "gcc") if shutil.which(tool) is None]
    if missing:
        print(f"model/check.py: {' and '.join(missing)} not found", file=sys.stderr)
        return 2

    by_name = {c.name: c for c in CONFIGS}
    results: list[Result] = []
    for c in configs:
        results.append(
            check_one(
                "config", c.name, list(c.defines), False, args.timeout, None, args.opt or c.opt
            )
        )
        _progress(results[-1])
    for v in variants:
        defines = [*by_name[v.config].defines, f"-DPLANTED_{v.name}", *v.extra]
        results.append(
            check_one("variant", v.name, defines, v.bfs, args.timeout, v.expect, args.opt or "0")
        )

        _progress(results[-1])
    ok = all(r.ok for r in results)
    if args.json:
        print(json.dumps({"ok": ok, "results": [asdict(r) for r in results]}, indent=2))
    else:
        print(table(results))
        for r in results:
            if not r.ok:
                print(f"\n{r.kind} {r.name} ({' '.join(r.defines)}): {r.note}")
                print("\n".join("    " + line for line in r.tail))
        total = sum(r.wall for r in results)
        print(f"\n{'OK' if ok else 'FAILED'}: {len(results)} runs, {total:.1f} s wall")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
