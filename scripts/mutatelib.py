"""Mutation testing of the state machine: do the core's tests notice a one-token change?

The code of ``scripts/mutate`` (a launcher, so that ruff lints this file with the rest):

    scripts/mutate [--count N | --all | --survivors REPORT] [--seed S] [--module FILE ...]
                   [--tests FILE ...] [--jobs J] [--timeout S] [--out FILE]
                   [--fail-under PCT] [--list] [--equivalents]

Every mutant is one change of one token in one module of ``raftlease/core/`` (or the
``--module`` files), of four kinds:

* ``compare``: a comparison flipped: ``<`` to ``<=`` and to ``>=`` (boundary and
  negation; likewise ``<=``, ``>``, ``>=``), ``==``/``!=``, ``in``/``not in``,
  ``is``/``is not``;
* ``constant``: an integer literal moved by one (``n`` to ``n + 1`` and ``n - 1``);
* ``boolop``: ``and`` swapped with ``or``;
* ``not``: a ``not`` dropped.

Annotations and f-strings are left alone. The change is made in the source text at the
token's position (line numbers stay, and the report quotes the line), never in
``raftlease/`` itself: each worker copies the package, the test files,
``tests/conftest.py`` and ``pyproject.toml`` to a temporary directory and runs ``python
-m pytest -p no:cacheprovider -x -q TESTS`` there, with ``PYTHONPATH`` pointing at the
copy, one mutant at a time. Pytest runs inside the copy because it puts the rootdir of a
test package first on ``sys.path``: run from the working tree it would import the
unmutated package. Before any mutant, a canary (the copy with a core module that raises
on import) must fail and the unmutated copy must pass. Bytecode is never written, so a
mutant cannot be run from a stale ``.pyc`` of the same size and second.

A mutant is *killed* when a test fails (or collection fails), *timed out* (counted as
killed) past ``--timeout``, and *survives* when every test passes. The mutants in the
``EQUIVALENT`` table cannot change behaviour (each with its reason; CONTRIBUTING.md,
"Mutation testing", lists the same, ``--equivalents`` prints it): they still run, and the
score is (killed + timed out) / (mutants - equivalent - errors). The sample is
deterministic: every mutant of the selected modules is enumerated in a fixed order and
``random.Random(seed).sample`` picks ``--count`` of them; ``--all`` runs every one.

Progress goes to stderr, the summary (score, every survivor with file:line and the
mutation) to stdout, the whole result to the JSON report (``--out``). Exit status 0; 1
when the score is below ``--fail-under``; 2 when the canary or the unmutated run fails.
Not run in CI: ``--all`` (1354 mutants on 2026-12-06) takes about two hours one at a
time; a sample of 180 about half an hour.

Threads: ``--jobs`` worker threads, each running one pytest child process at a time in
its own copy; a child that outlives the timeout is killed (it is ours).

One file of about 700 lines on purpose: enumeration, runner and report are one small
tool with one job, and this description and the equivalent-mutant table belong with it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import hashlib
import io
import itertools
import json
import os
import platform
import queue
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tokenize
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "raftlease" / "core"

#: The core's pure unit and property tests (no node process, no clock, no sleep), the
#: fastest and most exact first (``-x`` stops at the first failure, so a killed mutant
#: costs little): tests/unit/test_core_mutants.py (written against survivors of this
#: script), then the example tests, then the random workloads and property tests. The task
#: queue (queue.py, task_state.py, task_records.py) and the pooled units of state.py are
#: tested by test_core_tasks.py, test_pool_units.py, test_queue_completed_cap.py and
#: test_core_task_properties.py, added to this list on 2026-12-06: the list predated
#: those modules, so their mutants ran only against tests that barely touch them. So
#: did the ``extend`` entry (keep-alives from the leader's memory, store.py), whose rules
#: only the unit half of test_memory_keepalives.py applies (it also tests the leader's
#: pending set, server/keepalive.py: pure too, and fast).
#: Priority aging (task_records.task_rank) and the queues' counters the metrics read
#: have their own files, test_core_aging.py and test_queue_metrics.py (2026-12-06);
#: fair shares between tenants (queue.py ``_best_ready``/``_charge``) test_core_fair.py
#: (2026-12-07); fair shares between tenants waiting on a key (store.py
#: ``_next_waiter``/``_charge``) test_core_fair_waiters.py (2026-12-07). Issue 41's
#: checkpoints, effect journal and dependencies (task_state.py, effects.py, deps.py)
#: test_core_checkpoints.py, test_core_effects.py, test_core_deps.py (2026-12-07); the
#: effect journal under plain leases (lease_effects.py) test_core_lease_effects.py.
#: test_core_memory.py is left out: it measures memory with tracemalloc, not behaviour.
DEFAULT_TESTS = (
    "tests/unit/test_core_mutants.py",
    "tests/unit/test_core.py",
    "tests/unit/test_core_tasks.py",
    "tests/unit/test_core_aging.py",
    "tests/unit/test_core_fair.py",
    "tests/unit/test_core_fair_waiters.py",
    "tests/unit/test_core_deadlock.py",
    "tests/unit/test_core_many_wait.py",
    "tests/unit/test_core_preempt.py",
    "tests/unit/test_core_checkpoints.py",
    "tests/unit/test_core_effects.py",
    "tests/unit/test_core_lease_effects.py",
    "tests/unit/test_core_deps.py",
    "tests/unit/test_queue_metrics.py",
    "tests/unit/test_core_queue.py",
    "tests/unit/test_core_budgets.py",
    "tests/unit/test_pool_units.py",
    "tests/unit/test_queue_completed_cap.py",
    "tests/unit/test_memory_keepalives.py",
    "tests/unit/test_core_shared.py",
    "tests/unit/test_core_task_properties.py",
    "tests/unit/test_core_properties.py",
    # core/audit.py and core/certkeys.py (issue 39), added after the last score.
    "tests/unit/test_audit.py",
    "tests/unit/test_certificates.py",
    # The holder key bound at the grant (issue 39's security fix), also after it.
    "tests/unit/test_cert_holder_binding.py",
)

#: A comparison's replacements: the boundary moved, then the comparison negated.
COMPARE_SWAPS: dict[str, tuple[str, ...]] = {
    "<": ("<=", ">="),
    "<=": ("<", ">"),
    ">": (">=", "<="),
    ">=": (">", "<"),
    "==": ("!=",),
    "!=": ("==",),
    "in": ("not in",),
    "not in": ("in",),
    "is": ("is not",),
    "is not": ("is",),
}

STATUSES = ("killed", "timeout", "survived", "equivalent", "error")

CANARY = "scripts/mutate canary: the tests import the copy"

#: Mutants left alive on purpose. An entry is ``module function `fragment` original ->
#: replacement`` (``*``: any), then its reason, indented. It matches the mutants of that
#: function whose token lies inside the fragment of the line. The invariants cited are
#: checked after every step of the random workloads of tests/unit/test_core_shared.py
#: (``check_invariants``): capacity and used entries exist exactly for the keys with
#: holders or waiters, and the head of a queue does not fit (so a key with a queue is
#: held).
EQUIVALENT_TABLE = """
checks.py utf8_size `2**63` 2 -> 3
    3**63, like 2**63, is far above every byte limit (at most 4096): a string UTF-8
    cannot encode is refused as oversized either way.
checks.py utf8_size `2**63` 63 -> *
    2**62 and 2**64, like 2**63, are far above every byte limit (at most 4096).
checks.py check_args `entry.get("wait", 0)` 0 -> 1
    The default only lets an absent 'wait' pass validation, and 0 and 1 both pass;
    the store reads its own default.
checks.py check_args `entry.get("priority", 0)` 0 -> *
    The default only lets an absent 'priority' pass validation, and -1, 0 and 1 all
    pass; the store reads its own default.
checks.py check_args `entry.get("limit", 1000)` 1000 -> *
    The default only lets an absent 'limit' pass validation, and 999, 1000 and 1001 all
    pass; the store reads its own default.
dedup.py ClientTable.admit `ack > record.acked` > -> >=
    With ack equal to acked the block drops the results below ack, and there are none:
    they were dropped when acked rose to ack, and a seq below acked is never stored.
records.py ClientRecord `acked: int = 1` 1 -> 0
    The default is used only by ClientTable.admit for a new client id, admitted only
    with ack 1 (a higher ack is SESSION_EXPIRED), which sets acked to 1 at once.
state.py StoreState._add_holder `self.used.get(key, 0)` 0 -> *
    Reached only for a key with a capacity entry, and every key with one has a used
    entry (``_fix_capacity`` and the snapshot restore set both).
store.py LeaseStore._advance `if now > self.now:` > -> >=
    When the stamp equals log time the assignment writes the same value.
store.py LeaseStore._advance `len(deadlines) > 64` > -> >=
    Rebuilds the expiry heap sooner: memory only (stale entries are skipped when popped,
    the heap is not in the snapshot), and the bound on stale entries still holds
    (rebuilding later breaks it: tests/unit/test_core_mutants.py).
store.py LeaseStore._advance `> 64` 64 -> 63
    Rebuilds the expiry heap sooner, as above.
store.py LeaseStore._advance `64 and len` and -> or
    Rebuilds the expiry heap sooner, as above.
store.py LeaseStore._advance `len(deadlines) > 4 * len` > -> >=
    Rebuilds the expiry heap sooner, as above.
store.py LeaseStore._advance `4 * len(self.leases)` 4 -> 3
    Rebuilds the expiry heap sooner, as above.
store.py LeaseStore._acquire `entry.get("wait", 0)` 0 -> -1
    An absent 'wait' is then -1 instead of 0: both are <= 0, no waiting.
store.py LeaseStore._apply_one `valid_int(entry.get("fv", 1)` 1 -> 2
    The default only lets an absent 'fv' pass validation, and 1 and 2 both pass; what
    the format means is read with its own default (a new term's first entry).
store.py LeaseStore._grant `units: int = 1` 1 -> *
    Every caller of _grant passes units.
snapshot.py restore `plain[0] for plain` 0 -> *
    Layout 2's upgrade lists the keys of its leases and waiters with capacity 1, and
    the restore keeps no capacity-1 row (capacity 1 is implicit): the listed keys are
    never read, and another column of a layout-2 row (seven scalars) is as hashable.
snapshot.py restore `w[0] for w` 0 -> *
    The same, for the waiters' keys.
queue.py TaskQueues.advance `len(heap) > 64` > -> >=
    Rebuilds the attempts' expiry heap sooner: memory only (stale items are skipped
    when popped; the heap is derived from the attempts, not in the snapshot), and the
    bound on stale items still holds (rebuilding later breaks it:
    tests/unit/test_core_mutants.py).
queue.py TaskQueues.advance `> 64` 64 -> 63
    Rebuilds the attempts' expiry heap sooner, as above.
queue.py TaskQueues.advance `64 and len` and -> or
    Rebuilds the attempts' expiry heap sooner, as above.
queue.py TaskQueues.advance `len(heap) > 4 * len` > -> >=
    Rebuilds the attempts' expiry heap sooner, as above.
queue.py TaskQueues.advance `4 * len(self.attempts)` 4 -> 3
    Rebuilds the attempts' expiry heap sooner, as above.
task_records.py Attempt `progress_at: int = 0` 0 -> *
    Never read: the one construction (a claim) passes progress_at, and a snapshot row
    (``Attempt.to_plain``) carries it.
task_records.py TaskRecord `ready_at: int = 0` 0 -> *
    Never read: the one construction (a put) passes ready_at, and a snapshot row
    (``TaskRecord.to_plain``, the same fields since task queues came) carries it.
task_state.py TaskState._move `counts.get(old, 0)` 0 -> *
    Never read: ``old`` is the status of a task of the queue, and every task is
    counted under its status (a queue is forgotten only when all its counts are 0).
task_state.py TaskState._move `totals.get(old, 0)` 0 -> *
    Never read: ``old`` is the status of a task, and every task is counted under its
    status in ``by_state`` too (``_move`` moves both counts together).
task_records.py TaskRecord `rank: int = 0` 0 -> *
    Never read: the one construction (a put) passes rank, and a snapshot row carries
    it (layout 6) or ``TaskRecord.from_plain`` computes it (layout 5).
task_records.py <module> `2**42` 2 -> 3
    3**42, like 2**42, is far above every difference of two ready times plus any
    aged priority (at most 1000 * one day): the strict step orders by priority first
    either way.
task_records.py <module> `2**42` 42 -> *
    2**41 (69 years) and 2**43, like 2**42, are far above every difference of two
    ready times plus any aged priority: the strict step orders by priority first.
task_state.py TaskState.stats `age > oldest` > -> >=
    The largest age is kept either way: on a tie the two are equal.
state.py <module> `SHARED_MAX = 4096` 4096 -> 4095
    Forgets the shared copies sooner: memory only (an equal copy is shared or not,
    never another value), and the bound still holds (a later one breaks it:
    tests/unit/test_core_mutants.py).
queue.py TaskQueues._best_ready `heap[0] < best` < -> <=
    The tops of two ready heaps never compare equal: stale items are popped first, a
    live item carries its task's put order (never reused), and a task's items sit in
    the heap of its own requirements only.
queue.py TaskQueues._make_ready `len(heap) > 64` > -> >=
    Rebuilds a ready heap sooner: memory only (stale items are skipped when popped
    and change no read; the heaps are not in the snapshot), and the bound on stale
    items still holds (rebuilding later breaks it: tests/unit/test_core_mutants.py).
queue.py TaskQueues._make_ready `> 64` 64 -> 63
    Rebuilds a ready heap sooner, as above.
queue.py TaskQueues._make_ready `64 and len` and -> or
    Rebuilds a ready heap sooner, as above.
queue.py TaskQueues._make_ready `len(heap) > 4 * max` > -> >=
    Rebuilds a ready heap sooner, as above.
queue.py TaskQueues._make_ready `4 * max` 4 -> 3
    Rebuilds a ready heap sooner, as above.
queue.py TaskQueues._make_ready `max(1, queue.counts.get(READY, 0))` * -> *
    With 0 or 2 in place of the 1, the product differs only with at most one ready
    task, where it is at most 8 and the first test (above 64) decides alone; the READY
    count is present (the caller has just counted the task in), so its default is
    never read, and max(1, ...) would hide a default of -1 or 1 anyway.
queue.py TaskQueues._finish `len(self._completed) > 64` > -> >=
    Rebuilds the completed-task heap sooner: memory only (stale items are skipped when
    popped; the heap is derived from the records, not in the snapshot), and the bound
    on stale items still holds (rebuilding later breaks it:
    tests/unit/test_core_mutants.py).
queue.py TaskQueues._finish `> 64` 64 -> 63
    Rebuilds the completed-task heap sooner, as above.
queue.py TaskQueues._finish `64 and len` and -> or
    Rebuilds the completed-task heap sooner, as above.
queue.py TaskQueues._finish `len(self._completed) > 2` > -> >=
    Rebuilds the completed-task heap sooner, as above.
queue.py TaskQueues._finish `2 * self.completed` 2 -> 1
    Rebuilds the completed-task heap sooner, as above.
"""


@dataclasses.dataclass(frozen=True)
class Equivalent:
    """A mutant that cannot change behaviour (one entry of ``EQUIVALENT_TABLE``)."""

    module: str
    function: str
    fragment: str
    original: str
    replacement: str
    reason: str


def parse_equivalents(table: str) -> tuple[Equivalent, ...]:
    """``EQUIVALENT_TABLE`` as records. Raises ``ValueError`` on a malformed line."""
    head = re.compile(r"^(\S+) (\S+) `([^`]+)` (\S+) -> (\S+)$")
    out: list[Equivalent] = []
    for line in table.strip("\n").splitlines():
        if line.startswith("    ") and out:
            last = out[-1]
            reason = f"{last.reason} {line.strip()}".strip()
            out[-1] = dataclasses.replace(last, reason=reason)
            continue
        match = head.match(line)
        if match is None:
            raise ValueError(f"EQUIVALENT_TABLE: cannot read {line!r}")
        module, function, fragment, original, replacement = match.groups()
        out.append(Equivalent(module, function, fragment, original, replacement, ""))
    return tuple(out)


EQUIVALENT = parse_equivalents(EQUIVALENT_TABLE)


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One token changed: ``path`` (relative to the repository), 1-based ``line``,
    0-based character ``col`` and ``end`` of the replaced text on that line."""

    path: str
    line: int
    col: int
    end: int
    kind: str
    original: str
    replacement: str
    function: str
    text: str  # the source line, stripped
    indent: int  # characters stripped from its start

    @property
    def ident(self) -> str:
        return f"{self.path}:{self.line}:{self.col + 1}"

    def describe(self) -> str:
        return f"{self.path}:{self.line}: `{self.original}` -> `{self.replacement}`"

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        old = lines[self.line - 1]
        lines[self.line - 1] = old[: self.col] + self.replacement + old[self.end :]
        return "".join(lines)


@dataclasses.dataclass
class Outcome:
    status: str  # killed, timeout, survived, error
    seconds: float
    killed_by: str = ""
    output: str = ""

    @property
    def tail(self) -> str:
        return "\n".join(self.output.splitlines()[-15:])


# ---------------------------------------------------------------- enumeration


class _Finder(ast.NodeVisitor):
    """Walks one module and records mutation sites (with the enclosing function)."""

    def __init__(self, path: str, source: str) -> None:
        self.path = path
        self.lines = source.splitlines()
        self.tokens = [
            tok
            for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type in (tokenize.OP, tokenize.NAME, tokenize.NUMBER)
        ]
        self.scope: list[str] = []
        self.found: list[Mutant] = []

    # ast positions are UTF-8 byte offsets; tokenize's and the text's are characters.
    def _char(self, line: int, byte_col: int) -> int:
        return len(self.lines[line - 1].encode("utf-8")[:byte_col].decode("utf-8"))

    def _start(self, node: ast.expr) -> tuple[int, int]:
        return node.lineno, self._char(node.lineno, node.col_offset)

    def _end(self, node: ast.expr) -> tuple[int, int]:
        line = node.end_lineno if node.end_lineno is not None else node.lineno
        col = node.end_col_offset if node.end_col_offset is not None else node.col_offset
        return line, self._char(line, col)

    def _operator(self, after: ast.expr, before: ast.expr) -> tuple[int, int, int, str] | None:
        """The operator tokens between two operands (parentheses skipped): its line,
        start and end columns and its text, or None when it spans lines."""
        low, high = self._end(after), self._start(before)
        toks = [
            t
            for t in self.tokens
            if t.start >= low and t.end <= high and t.string not in ("(", ")")
        ]
        if not toks or toks[0].start[0] != toks[-1].end[0]:
            return None
        text = " ".join(t.string for t in toks)
        return toks[0].start[0], toks[0].start[1], toks[-1].end[1], text

    def _add(self, line: int, col: int, end: int, kind: str, original: str, new: str) -> None:
        source = self.lines[line - 1]
        self.found.append(
            Mutant(
                path=self.path,
                line=line,
                col=col,
                end=end,
                kind=kind,
                original=original,
                replacement=new,
                function=".".join(self.scope) or "<module>",
                text=source.strip(),
                indent=len(source) - len(source.lstrip()),
            )
        )

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        for deco in node.decorator_list:
            self.visit(deco)
        self.scope.append(node.name)
        for stmt in node.body:
            self.visit(stmt)
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                self.visit(base)
        else:
            for default in [*node.args.defaults, *node.args.kw_defaults]:
                if default is not None:
                    self.visit(default)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        # The annotation is not code that runs (``from __future__ import annotations``).
        if node.value is not None:
            self.visit(node.value)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        # Positions inside f-strings are not reliable before Python 3.12, and what an
        # f-string computes is message text.
        return

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        for i in range(len(node.ops)):
            site = self._operator(operands[i], operands[i + 1])
            if site is not None and site[3] in COMPARE_SWAPS:
                line, col, end, text = site
                for new in COMPARE_SWAPS[text]:
                    self._add(line, col, end, "compare", text, new)
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        for left, right in itertools.pairwise(node.values):
            site = self._operator(left, right)
            if site is not None and site[3] in ("and", "or"):
                line, col, end, text = site
                self._add(line, col, end, "boolop", text, "or" if text == "and" else "and")
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not):
            line, col = self._start(node)
            following = [t for t in self.tokens if t.start > (line, col)]
            if following and following[0].start[0] == line:
                # Drop "not " up to the operand's first token (a parenthesis included).
                self._add(line, col, following[0].start[1], "not", "not", "")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, int) and not isinstance(value, bool):
            (line, col), (end_line, end) = self._start(node), self._end(node)
            if line == end_line:
                text = self.lines[line - 1][col:end]
                for new in (value + 1, value - 1):
                    self._add(line, col, end, "constant", text, str(new))


def enumerate_mutants(paths: Sequence[Path]) -> list[Mutant]:
    """Every mutant of ``paths``, in file and position order; each one checked to parse
    and to change the module's AST (a change the parser would undo is no mutant)."""
    out: list[Mutant] = []
    for path in paths:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        dumped = ast.dump(tree)
        finder = _Finder(path.relative_to(ROOT).as_posix(), source)
        finder.visit(tree)
        for mutant in sorted(set(finder.found), key=_order):
            try:
                changed = ast.dump(ast.parse(mutant.apply(source))) != dumped
            except SyntaxError:
                changed = False
            if changed:
                out.append(mutant)
    return out


def _order(m: Mutant) -> tuple[str, int, int, str]:
    return (m.path, m.line, m.col, m.replacement)


def equivalent_entry(m: Mutant) -> Equivalent | None:
    """The ``EQUIVALENT`` entry that matches ``m``, if any."""
    for eq in EQUIVALENT:
        if (
            m.path == f"raftlease/core/{eq.module}"
            and m.function == eq.function
            and eq.original in ("*", m.original)
            and eq.replacement in ("*", m.replacement)
            and _inside(eq.fragment, m)
        ):
            return eq
    return None


def _inside(fragment: str, m: Mutant) -> bool:
    """Does an occurrence of ``fragment`` in the mutant's line contain its token?"""
    low, high = m.col - m.indent, m.end - m.indent
    at = m.text.find(fragment)
    while at >= 0:
        if at <= low and high <= at + len(fragment):
            return True
        at = m.text.find(fragment, at + 1)
    return False


# ---------------------------------------------------------------- running


def make_copy(tests: Sequence[str]) -> Path:
    """A private copy of the package, the test files and the pytest configuration."""
    copy = Path(tempfile.mkdtemp(prefix="raftlease-mutate-"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "raftlease", copy / "raftlease", ignore=ignore)
    # tests/ is a package of packages (tests/unit/, ...): each folder's __init__.py
    # and conftest.py come along with its test files.
    folders = [str(Path(t).parent / n) for t in tests for n in ("__init__.py", "conftest.py")]
    for name in dict.fromkeys(("tests/__init__.py", "tests/conftest.py", *folders, *tests)):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    shutil.copy2(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def run_tests(copy: Path, tests: Sequence[str], timeout: float) -> Outcome:
    """Run the tests in ``copy`` in a child process (blocking); never raises on a
    failing or hanging run."""
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(copy), os.environ.get("PYTHONPATH")])),
        PYTHONDONTWRITEBYTECODE="1",
        HYPOTHESIS_PROFILE="ci",  # derandomized: the same examples for every mutant
    )
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-x", "-q", *tests]
    start = time.monotonic()
    try:
        proc = subprocess.run(
            cmd,
            cwd=copy,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:  # subprocess.run has killed the child
        return Outcome("timeout", time.monotonic() - start, f"no result in {timeout:.0f} s")
    seconds = time.monotonic() - start
    if proc.returncode == 0:
        return Outcome("survived", seconds, output=proc.stdout)
    if proc.returncode in (1, 2):  # tests failed; interrupted (a collection error)
        failed = re.search(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.MULTILINE)
        return Outcome("killed", seconds, failed.group(1) if failed else "", proc.stdout)
    return Outcome("error", seconds, f"pytest exit status {proc.returncode}", proc.stdout)


class Runner:
    """``jobs`` private copies; each run borrows one, writes its module, runs the tests
    and writes the original back. Thread-safe: one copy per running mutant."""

    def __init__(self, tests: Sequence[str], jobs: int) -> None:
        self.tests = list(tests)
        self.timeout = 600.0
        self.copies = [make_copy(tests) for _ in range(jobs)]
        self.free: queue.Queue[Path] = queue.Queue()
        for copy in self.copies:
            self.free.put(copy)

    def close(self) -> None:
        for copy in self.copies:
            shutil.rmtree(copy, ignore_errors=True)

    def run(self, path: str | None = None, change: Mutant | str | None = None) -> Outcome:
        """The tests with module ``path`` changed by ``change`` (a mutant, or text to
        append), or unchanged."""
        copy = self.free.get()
        try:
            if path is None or change is None:
                return run_tests(copy, self.tests, self.timeout)
            target = copy / path
            original = target.read_text(encoding="utf-8")
            text = change.apply(original) if isinstance(change, Mutant) else original + change
            target.write_text(text, encoding="utf-8")
            try:
                return run_tests(copy, self.tests, self.timeout)
            finally:
                target.write_text(original, encoding="utf-8")
        finally:
            self.free.put(copy)


def run_all(runner: Runner, chosen: Sequence[Mutant], jobs: int) -> list[Outcome]:
    """Every mutant's outcome, in the order of ``chosen`` (progress on stderr)."""
    outcomes: list[Outcome] = []
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        results = pool.map(lambda m: runner.run(m.path, m), chosen)
        for mutant, outcome in zip(chosen, results, strict=True):
            outcomes.append(outcome)
            note = f" by {outcome.killed_by}" if outcome.killed_by else ""
            progress(
                f"[{len(outcomes)}/{len(chosen)}] {outcome.status.upper():8} "
                f"{mutant.describe()} ({outcome.seconds:.1f} s){note}"
            )
    finally:
        # On Ctrl-C: the mutants not started are dropped, the running ones finish.
        pool.shutdown(wait=True, cancel_futures=True)
    return outcomes


# ---------------------------------------------------------------- command line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/mutate",
        description="mutation testing of raftlease/core/ (one token at a time, on a copy)",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--count", type=int, default=120, help="mutants sampled (default 120)")
    which.add_argument("--all", action="store_true", help="run every mutant")
    which.add_argument(
        "--survivors",
        metavar="REPORT",
        default=None,
        help="run again the mutants that survived or were equivalent in an earlier JSON "
        "report of the same modules (to check new tests quickly)",
    )
    parser.add_argument("--seed", type=int, default=1, help="sampling seed (default 1)")
    parser.add_argument(
        "--module",
        action="append",
        default=None,
        help="a module to mutate (path, or file name in raftlease/core/); repeatable; "
        "default: every file of raftlease/core/",
    )
    parser.add_argument(
        "--tests",
        nargs="+",
        default=None,
        help=f"test files, relative to the repository (default: {' '.join(DEFAULT_TESTS)})",
    )
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds a mutant's run may take before it counts as killed "
        "(default: 3 x the unmutated run + 30)",
    )
    parser.add_argument(
        "--out", default="mutate-out/report.json", help="JSON report (default: %(default)s)"
    )
    parser.add_argument(
        "--fail-under", type=float, default=None, help="exit 1 when the score (%%) is below"
    )
    parser.add_argument(
        "--list", action="store_true", help="print the selected mutants and exit (no test run)"
    )
    parser.add_argument(
        "--equivalents",
        action="store_true",
        help="print the equivalent mutants and their reasons as Markdown and exit",
    )
    args = parser.parse_args(argv)
    if args.count < 1 or args.jobs < 1:
        parser.error("--count and --jobs must be at least 1")
    return args


def resolve_modules(names: Sequence[str] | None) -> list[Path]:
    if not names:
        return sorted(CORE.glob("*.py"))
    out = []
    for name in names:
        for candidate in (Path(name), ROOT / name, CORE / name):
            if candidate.is_file():
                out.append(candidate.resolve())
                break
        else:
            sys.exit(f"scripts/mutate: no module {name!r}")
    return out


def select(mutants: list[Mutant], args: argparse.Namespace) -> list[Mutant]:
    if args.survivors:
        rows = json.loads(Path(args.survivors).read_text(encoding="utf-8"))["mutants"]
        keep = {
            (r["file"], r["line"], r["col"], r["original"], r["replacement"])
            for r in rows
            if r["status"] in ("survived", "equivalent")
        }
        chosen = [
            m for m in mutants if (m.path, m.line, m.col + 1, m.original, m.replacement) in keep
        ]
        if len(chosen) != len(keep):
            sys.exit("scripts/mutate: the report's survivors are not all found: modules changed")
        return chosen
    if args.all or args.count >= len(mutants):
        return mutants
    return sorted(random.Random(args.seed).sample(mutants, args.count), key=_order)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def print_equivalents(mutants: Sequence[Mutant]) -> None:
    """The EQUIVALENT table as Markdown (for CONTRIBUTING.md), each entry with the
    file:line of the mutants it matches now."""
    for eq in EQUIVALENT:
        where = sorted({f"{m.line}" for m in mutants if equivalent_entry(m) is eq}, key=int)
        count = sum(equivalent_entry(m) is eq for m in mutants)
        lines = ",".join(where) or "(none: stale)"
        print(
            f"- `{eq.module}:{lines}` `{eq.function}`, `{eq.fragment}`: "
            f"`{eq.original}` -> `{eq.replacement}` ({count}). {eq.reason}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    modules = resolve_modules(args.module)
    if args.tests:
        missing = [t for t in args.tests if not (ROOT / t).is_file()]
        if missing:
            sys.exit(f"scripts/mutate: no test file {', '.join(missing)}")
        tests = list(args.tests)
    else:  # tests/unit/test_core_mutants.py may be absent in an older checkout
        tests = [t for t in DEFAULT_TESTS if (ROOT / t).is_file()]
    mutants = enumerate_mutants(modules)
    if args.equivalents:
        print_equivalents(mutants)
        return 0
    chosen = select(mutants, args)
    if args.list:
        for m in chosen:
            mark = " (equivalent)" if equivalent_entry(m) else ""
            print(f"{m.describe()}  [{m.kind}, {m.function}]{mark}")
        progress(f"{len(chosen)} of {len(mutants)} mutants")
        return 0

    started = datetime.datetime.now(datetime.UTC)
    clock = time.monotonic()
    runner = Runner(tests, args.jobs)
    try:
        progress(f"canary and unmutated run ({', '.join(tests)})")
        first = modules[0].relative_to(ROOT).as_posix()
        canary = runner.run(first, f"\nraise RuntimeError({CANARY!r})\n")
        if canary.status == "survived" or CANARY not in canary.output:
            progress(f"canary not noticed: the tests do not import {first} from the copy")
            progress(canary.tail)
            return 2
        baseline = runner.run()
        if baseline.status != "survived":
            progress(f"the unmutated tests do not pass:\n{baseline.tail}")
            return 2
        runner.timeout = args.timeout or 3 * baseline.seconds + 30
        progress(
            f"unmutated run {baseline.seconds:.1f} s; {len(chosen)} of {len(mutants)} "
            f"mutants, {args.jobs} at a time, timeout {runner.timeout:.0f} s each"
        )
        outcomes = run_all(runner, chosen, args.jobs)
    finally:
        runner.close()

    rows = [_row(m, o) for m, o in zip(chosen, outcomes, strict=True)]
    count = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    scored = len(rows) - count["equivalent"] - count["error"]
    score = 100.0 * (count["killed"] + count["timeout"]) / scored if scored else 100.0
    seconds = time.monotonic() - clock
    report: dict[str, Any] = {
        "command": ["scripts/mutate", *(sys.argv[1:] if argv is None else argv)],
        "started": started.isoformat(timespec="seconds"),
        "seconds": round(seconds, 1),
        "python": platform.python_version(),
        "selection": (
            "all"
            if len(chosen) == len(mutants)
            else f"survivors of {args.survivors}"
            if args.survivors
            else f"sample of {len(chosen)}, seed {args.seed}"
        ),
        "modules": {
            p.relative_to(ROOT).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            for p in modules
        },
        "tests": tests,
        "jobs": args.jobs,
        "unmutated_seconds": round(baseline.seconds, 2),
        "timeout_seconds": round(runner.timeout, 1),
        "summary": {"mutants": len(rows), "enumerated": len(mutants), **count},
        "score_percent": round(score, 1),
        "mutants": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    print(
        f"{len(rows)} mutants in {seconds:.0f} s: {count['killed']} killed, "
        f"{count['timeout']} timed out, {count['survived']} survived, "
        f"{count['equivalent']} equivalent, {count['error']} errors; "
        f"score {score:.1f} % of the non-equivalent"
    )
    for m, o in zip(chosen, outcomes, strict=True):
        listed = equivalent_entry(m) is not None
        if o.status in ("survived", "error") and not listed:
            print(f"  {o.status.upper()} {m.describe()} in {m.function}: {m.text}")
        elif o.status != "survived" and listed:
            print(f"  {o.status.upper()} but listed as equivalent (stale entry?): {m.describe()}")
    if len(chosen) == len(mutants):
        for eq in EQUIVALENT:
            if not any(equivalent_entry(m) is eq for m in mutants):
                print(
                    f"  an EQUIVALENT entry matches no mutant (stale?): {eq.module} {eq.fragment}"
                )
    print(f"report: {out}")
    if args.fail_under is not None and score < args.fail_under:
        return 1
    return 0


def _row(m: Mutant, o: Outcome) -> dict[str, Any]:
    """One mutant's line of the JSON report."""
    eq = equivalent_entry(m)
    status = "equivalent" if eq is not None and o.status == "survived" else o.status
    row: dict[str, Any] = {
        "id": m.ident,
        "file": m.path,
        "line": m.line,
        "col": m.col + 1,
        "function": m.function,
        "kind": m.kind,
        "original": m.original,
        "replacement": m.replacement,
        "source": m.text,
        "status": status,
        "seconds": round(o.seconds, 2),
        "killed_by": o.killed_by,
        "equivalent": eq.reason if eq is not None else None,
    }
    if status in ("survived", "error"):
        row["tail"] = o.tail
    return row
