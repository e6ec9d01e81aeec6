#!/usr/bin/env python3
"""The counterexamples of the planted-bug variants as sequences of model steps (issue 43).

For each variant of model/check.py, SPIN's breadth-first search finds the shortest run
that breaks its property; this script compiles the model with ``-DTRAIL`` (every action
prints one ``STEP`` line, and the node and client symmetry reductions are off so that a
number names one node or client along the whole run), has pan find the trail and
replays it (``pan -r``), and keeps the ``STEP`` lines. The result is written to
``model/trails/<VARIANT>.trail``, one step a line, which
``raftlease.testing.trails`` parses and tests/integration/test_model_trails.py
replays against real nodes (model/README.md, "Counterexamples on the real cluster").

    python3 model/trail.py                 # every variant: (re)write model/trails/
    python3 model/trail.py --check         # fail if a committed trail is not the model's
    python3 model/trail.py FAST_LOG_CLOCK  # one variant, printed

Run it under ``nice`` on a shared machine: one pan at a time, a few seconds each.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from check import CONFIGS, MODEL, VARIANTS, Variant

TRAILS = Path(__file__).resolve().parent / "trails"

#: -DTRAIL prints the steps; -DEXACT_CLOCKS keeps every clock at real time (a clock at
#: fault with -DFAULTS still runs slow), as on the real nodes, whose clocks drift by 1 %
#: at most: a counterexample that needs the model's wider band could not be replayed.
TRAIL_DEFINES = ("-DTRAIL", "-DEXACT_CLOCKS")

#: What a trail file starts with: what it is and how to make it again.
HEADER = (
    "# SPIN counterexample of -DPLANTED_{name} on `{config}` ({defines} -DEXACT_CLOCKS), "
    "made by model/trail.py\n"
)


def steps_of(replay: str) -> list[str]:
    """The ``STEP`` lines of a ``pan -r`` replay, without the word STEP."""
    return [line[5:].strip() for line in replay.splitlines() if line.startswith("STEP ")]


def trail_of(variant: Variant, timeout: float = 300.0) -> tuple[list[str], str]:
    """The steps of ``variant``'s shortest counterexample and the assertion it breaks.

    Blocks while spin, gcc and pan run (one after the other, under ``nice``); raises
    ``subprocess.CalledProcessError`` or ``subprocess.TimeoutExpired`` if one fails or
    takes longer than ``timeout``, and ``RuntimeError`` if pan finds no counterexample."""
    config = next(c for c in CONFIGS if c.name == variant.config)
    defines = [*config.defines, f"-DPLANTED_{variant.name}", *variant.extra, *TRAIL_DEFINES]
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    with tempfile.TemporaryDirectory(prefix="raftlease-trail-") as tmp:
        shutil.copy(MODEL, Path(tmp) / MODEL.name)

        def run(*argv: str) -> str:
            done = subprocess.run(
                [*nice, *argv], cwd=tmp, check=True, capture_output=True, text=True, timeout=timeout
            )
            return done.stdout + done.stderr

        run("spin", "-a", *defines, MODEL.name)
        run("gcc", "-O0", "-DSAFETY", "-DBFS", "-DMEMLIM=4096", "-w", "-o", "pan", "pan.c")
        search = run("./pan", "-m100000", "-w24")
        if "assertion violated" not in search:
            raise RuntimeError(f"{variant.name}: pan found no counterexample\n{search[-2000:]}")
        replay = run("./pan", "-r")
    violated = next(line for line in replay.splitlines() if "assertion violated" in line)
    return steps_of(replay), violated.split("assertion violated", 1)[1].strip()


def render(variant: Variant, steps: list[str], violated: str) -> str:
    config = next(c for c in CONFIGS if c.name == variant.config)
    head = HEADER.format(name=variant.name, config=config.name, defines=" ".join(config.defines))
    return head + f"# breaks {variant.expect}: {violated}\n" + "".join(s + "\n" for s in steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("names", nargs="*", metavar="VARIANT", help="print only these")
    parser.add_argument("--check", action="store_true", help="compare with model/trails/")
    args = parser.parse_args(argv)
    variants = [v for v in VARIANTS if not args.names or v.name in args.names]
    failed = False
    for v in variants:
        text = render(v, *trail_of(v))
        path = TRAILS / f"{v.name}.trail"
        if args.names and not args.check:
            print(text, end="")
        elif args.check:
            same = path.exists() and path.read_text() == text
            failed |= not same
            print(f"{v.name}: {'same' if same else 'DIFFERS from ' + str(path)}", file=sys.stderr)
        else:
            TRAILS.mkdir(exist_ok=True)
            path.write_text(text)
            print(f"{v.name}: {len(text.splitlines()) - 2} steps -> {path}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
