"""The reference docs describe what is built: each list here comes from the code, and
the docs are checked against it (parsed, never run; no cluster).

Checked: every ``NodeConfig`` field has a row in docs/configuration.md's *Fields* table,
and a default stated there equals the code's; every metric family the node exports
has a row, with its type, in docs/operations.md's *Metrics* tables, and no
``raftlease_...`` name in the docs is one the code does not have; every wire code
(``raftlease.errors.CODES``) is documented, listed under its HTTP status in
docs/http-api.md and in README.md's list of client error codes; every ``raftlease``
command and subcommand (the click group, walked) is mentioned in README.md or docs/.

Not repeated here: tests/unit/test_http_api.py checks that ``openapi.STATUS`` covers every
wire code and that the OpenAPI document matches the protocol; this file checks the
markdown against them.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import click
import pytest
from prometheus_client.metrics_core import Metric

from raftlease.cli import main as cli_main
from raftlease.config import NodeConfig
from raftlease.core.budget import Budgets
from raftlease.core.queue import TaskQueues
from raftlease.errors import CODES, ConfigError
from raftlease.replication import Replica
from raftlease.server import metrics as metrics_module
from raftlease.server.http.openapi import STATUS
from raftlease.server.metrics import NodeMetrics, NodeView

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
CONFIGURATION = DOCS / "configuration.md"
OPERATIONS = DOCS / "operations.md"
HTTP_API = DOCS / "http-api.md"

#: A metric name in prose or a table (``raftlease_lease_*_total`` is a pattern, not a name).
METRIC_NAME = re.compile(r"\braftlease_[a-z0-9_]*[a-z0-9](?![a-z0-9_]*\*)")
#: A standard collector's metric (prometheus-client's process and Python collectors).
STANDARD_METRIC = re.compile(r"\b(?:process|python)_[a-z0-9_]*[a-z0-9]")
#: A wire code written as code in markdown.
CODE_SPAN = re.compile(r"`([A-Z][A-Z_]+)`")


# ------------------------------------------------------------------ markdown


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def section(path: Path, heading: str) -> str:
    """The text under the line ``heading`` (e.g. ``## Fields``) up to the next heading
    of the same or a higher level; fails naming the file if there is no such heading."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = path.read_text().splitlines()
    assert heading in lines, f"{rel(path)} has no {heading!r} heading"
    out: list[str] = []
    for line in lines[lines.index(heading) + 1 :]:
        hashes = len(line) - len(line.lstrip("#"))
        if 0 < hashes <= level and line[hashes : hashes + 1] == " ":
            break
        out.append(line)
    return "\n".join(out)


def cells(row: str) -> list[str]:
    """The cells of one markdown table row; a ``|`` inside a code span is text."""
    out: list[str] = []
    current: list[str] = []
    in_code = False
    for char in row.strip().removeprefix("|").removesuffix("|"):
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            out.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    out.append("".join(current).strip())
    return out


def tables(text: str) -> Iterator[list[dict[str, str]]]:
    """Each markdown table in ``text``: its rows as {header: cell}."""
    block: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith("|"):
            block.append(line)
            continue
        if len(block) >= 2:
            header = [cell.lower() for cell in cells(block[0])]
            rows = [cells(row) for row in block[1:] if not re.fullmatch(r"[\s|:-]+", row)]
            yield [dict(zip(header, row, strict=False)) for row in rows]
        block = []


def table_rows(path: Path, heading: str, *columns: str) -> list[dict[str, str]]:
    """Rows of every table under ``heading`` that has all of ``columns``."""
    rows = [
        row
        for table in tables(section(path, heading))
        for row in table
        if all(column in row for column in columns)
    ]
    assert rows, f"{rel(path)} has no table with columns {columns} under {heading!r}"
    return rows


# ------------------------------------------------------------ 1. settings

#: No ``NodeConfig`` field is skipped: it holds no private or test-only hook fields
#: (clock control and planted bugs live in the test build, raftlease.testing.node, and
#: a config naming them is refused). ``dial``, the fault-injection seam, is still a key
#: a TOML file may set, so it is documented like every other field.
REQUIRED = "required"


def code_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return REQUIRED


def documented_settings() -> dict[str, str]:
    """Field name -> the default cell of its row (one row may name several fields)."""
    out: dict[str, str] = {}
    for row in table_rows(CONFIGURATION, "## Fields", "field", "default"):
        for name in re.findall(r"`([a-z_][a-z0-9_]*)`", row["field"]):
            out[name] = row["default"]
    return out


def test_every_setting_is_documented_with_its_default() -> None:
    documented = documented_settings()
    fields = {f.name: f for f in dataclasses.fields(NodeConfig)}
    problems = [
        f"{rel(CONFIGURATION)}: setting {name!r} (NodeConfig) has no row in the Fields table"
        for name in fields
        if name not in documented
    ]
    problems += [
        f"{rel(CONFIGURATION)}: documents setting {name!r}, which NodeConfig does not have"
        for name in documented
        if name not in fields
    ]
    for name, cell in documented.items():
        if name not in fields or cell.strip() in ("", "-", "—"):
            continue  # no default stated
        expected = code_default(fields[name])
        text = cell.strip().strip("`")
        if text == REQUIRED or expected == REQUIRED:
            if text != expected:
                problems.append(
                    f"{rel(CONFIGURATION)}: {name!r} default is {cell}, NodeConfig's is "
                    f"{expected if expected == REQUIRED else repr(expected)}"
                )
            continue
        try:
            stated = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            problems.append(f"{rel(CONFIGURATION)}: {name!r} default {cell} is not a TOML value")
            continue
        if stated != expected or isinstance(stated, bool) != isinstance(expected, bool):
            problems.append(
                f"{rel(CONFIGURATION)}: {name!r} default is {cell}, NodeConfig's is {expected!r}"
            )
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------- 2. metrics


class FakeGuard:
    def snapshot(self) -> dict[str, Any]:
        return {
            "lease_remaining": 0.3,
            "heard_from_leader_ago": 0.01,  # present: the family is exported
            "drift_alarm": False,
            "drift": {"n2": {"rate_error": 0.0, "alarm": False}},
            "votes_refused": 0,
            "early_elections": 0,
        }


class FakeReplica:
    """What ``NodeCollector`` reads from a replica, with every optional family present
    (a follower that has heard a leader and has written a snapshot)."""

    def __init__(self) -> None:
        self.store = SimpleNamespace(
            leases={},
            lease_sessions={},
            waiting={},
            holders={},
            clients={},
            revision=1,
            ceiling=100,
            now=0,
            expired_total=0,
            term=1,
            tasks=TaskQueues(),  # task-queue families are exported even without queues
            budgets=Budgets(),  # server/budget_metrics.py reads them
        )
        self.guard = FakeGuard()

    def term(self) -> int:
        return 1

    def commit_index(self) -> int:
        return 1

    def last_applied(self) -> int:
        return 1

    def last_log_index(self) -> int:
        return 1

    def is_leader(self) -> bool:
        return False

    def leader_raft_addr(self) -> str | None:
        return "127.0.0.1:7102"

    def connected_peers(self) -> list[str]:
        return ["n2"]

    def members(self) -> tuple[Any, ...]:
        return ()

    def snapshot_status(self) -> dict[str, Any]:
        return {"snapshots_written": 1, "snapshot_failures": 0, "last_snapshot_seconds": 0.1}

    def durability_status(self) -> dict[str, Any]:
        return {"journal_syncs": 1, "journal_synced_entries": 1}


def exported_families(data_dir: Path) -> dict[str, Metric]:
    """Exposition name -> family, from a real ``NodeMetrics`` registry reading a fake
    replica (counters are exposed as ``<name>_total``)."""
    config = NodeConfig.create(
        node_id="n1",
        nodes=[
            {"id": "n1", "raft": "127.0.0.1:7101", "client": "127.0.0.1:7001"},
            {"id": "n2", "raft": "127.0.0.1:7102", "client": "127.0.0.1:7002"},
        ],
        data_dir=data_dir,
    )
    config.dump_file.write_bytes(b"snapshot")  # the snapshot file families need one
    replica = cast(Replica, FakeReplica())
    view = NodeView(
        config, replica=lambda: replica, connections=lambda: 0, lease_reads=lambda: False
    )
    try:
        families = list(NodeMetrics(view).registry.collect())
    except AttributeError as exc:
        raise AssertionError(f"NodeCollector reads what FakeReplica lacks: {exc}") from None
    return {f.name + ("_total" if f.type == "counter" else ""): f for f in families}


def names_in_metrics_module() -> set[str]:
    """Every ``raftlease_...`` string literal in server/metrics.py."""
    source = Path(metrics_module.__file__).read_text()
    return {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"raftlease_[a-z0-9_]+", node.value)
    }


def exposed_names(families: dict[str, Metric]) -> set[str]:
    """Every series name a scrape can carry (a histogram's buckets, sum and count)."""
    out = set(families)
    for name, family in families.items():
        if family.type == "histogram":
            out |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return out


def test_every_metric_is_documented_with_its_type(tmp_path: Path) -> None:
    families = exported_families(tmp_path)
    # The fake must bring out every family metrics.py names (some are conditional).
    unseen = sorted(
        name for name in names_in_metrics_module() if not {name, f"{name}_total"} & set(families)
    )
    assert not unseen, f"server/metrics.py names {unseen}, which FakeReplica does not bring out"
    rows: dict[str, str] = {}
    for row in table_rows(OPERATIONS, "## Metrics", "metric", "type"):
        # raftlease's own, and the client library's standard process_* and python_*.
        found = METRIC_NAME.search(row["metric"]) or STANDARD_METRIC.search(row["metric"])
        if found:
            rows[found.group()] = row["type"].strip()
    problems = []
    for name, family in sorted(families.items()):
        if name not in rows:
            problems.append(f"{rel(OPERATIONS)}: metric {name} ({family.type}) has no row")
        elif rows[name] != family.type:
            problems.append(
                f"{rel(OPERATIONS)}: metric {name} is documented as a {rows[name]}, "
                f"the node exports a {family.type}"
            )
    assert not problems, "\n".join(problems)


def test_no_documented_metric_is_missing_from_the_code(tmp_path: Path) -> None:
    exposed = exposed_names(exported_families(tmp_path))
    # Outside the metrics reference a ``raftlease_`` name may be another identifier of
    # the code (the backup header's ``raftlease_version``): any string literal of it.
    literals = {
        node.value
        for path in (ROOT / "raftlease").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    problems = []
    for path in doc_files():
        allowed = exposed if path == OPERATIONS else exposed | literals
        for name in sorted(set(METRIC_NAME.findall(path.read_text())) - allowed):
            problems.append(f"{rel(path)}: names metric {name}, which the node does not export")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------- 3. error codes


def test_every_error_code_is_documented() -> None:
    documented = {code for path in doc_files() for code in CODE_SPAN.findall(path.read_text())}
    missing = sorted(CODES - documented)
    assert not missing, f"error codes in no doc (README.md or docs/): {missing}"


def test_the_http_status_table_lists_every_code_under_its_status() -> None:
    listed: dict[str, set[int]] = {}
    for row in table_rows(HTTP_API, "## Errors and status codes", "status", "codes"):
        for code in CODE_SPAN.findall(row["codes"]):
            listed.setdefault(code, set()).add(int(row["status"]))
    problems = [
        f"{rel(HTTP_API)}: {code} is not listed under HTTP {status} (openapi.STATUS)"
        for code, status in sorted(STATUS.items())
        if status not in listed.get(code, set())
    ]
    problems += [
        f"{rel(HTTP_API)}: lists {code}, which is not a wire code"
        for code in sorted(set(listed) - CODES)
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", ["README.md", "docs/usage.md"])
def test_the_readme_lists_every_code_a_client_can_see(doc: str) -> None:
    """README.md and docs/usage.md each list the codes in their **Errors** bullet."""
    text = (README.parent / doc).read_text()
    found = re.search(r"\*\*Errors\*\*.*?Codes:(.*?)\.\s", text, re.DOTALL)
    assert found, f"{doc}: the **Errors** bullet has no 'Codes: ...' list"
    listed = set(CODE_SPAN.findall(found.group(1)))
    # ConfigError (CONFIG) is raised where a configuration is loaded, never answered
    # over the client protocol, so the client's list leaves it out.
    expected = CODES - {ConfigError.code}
    problems = [f"{doc}: the Errors codes list lacks {c}" for c in sorted(expected - listed)]
    problems += [
        f"{doc}: the Errors codes list has {c}, which is not a wire code"
        for c in sorted(listed - CODES)
    ]
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ 4. CLI


def cli_commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of every command and subcommand; hidden ones are meant to stay
    undocumented (there are none today)."""
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if command is None or command.hidden:
            continue
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from cli_commands(command, (*path, name))


def test_every_cli_command_is_mentioned() -> None:
    assert isinstance(cli_main, click.Group)
    text = "\n".join(path.read_text() for path in doc_files())
    missing = [
        "raftlease " + " ".join(path)
        for path in cli_commands(cli_main)
        if not re.search(r"\braftlease\s+" + r"\s+".join(map(re.escape, path)) + r"(?![\w-])", text)
    ]
    assert not missing, f"commands mentioned in neither README.md nor docs/: {missing}"


# ------------------------------------------------------------ the file map

PACKAGE = ROOT / "raftlease"


def mapped_files() -> set[str]:
    """The files docs/architecture.md's file map names (paths under ``raftlease/``).
    In a cell, a name without a folder is in the folder of the name before it
    (``recipes/locks.py``, ``sessions.py``); ``server/ui/`` stands for its files."""
    named: set[str] = set()
    for row in table_rows(DOCS / "architecture.md", "## File map", "file"):
        folder = ""
        for name in re.findall(r"`([A-Za-z0-9_./]+)`", row["file"]):
            if "/" in name.rstrip("/"):
                folder = name.rsplit("/", 1)[0] + "/" if not name.endswith("/") else ""
            path = name if "/" in name or not folder else folder + name
            named.add(path)
    return named


def test_the_file_map_names_every_module() -> None:
    """docs/architecture.md's file map has a row for every module of the package (a
    package's ``__init__.py`` aside), and no row for a file that is gone."""
    named = mapped_files()
    modules = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py"
    }
    missing = sorted(modules - named)
    assert not missing, f"docs/architecture.md's file map lacks {missing}"
    gone = sorted(name for name in named if not (PACKAGE / name).exists() and name.endswith(".py"))
    assert not gone, f"docs/architecture.md's file map names files that do not exist: {gone}"


def test_the_readme_is_for_users_and_short() -> None:
    """At most 300 lines (the whole API is in docs/usage.md, every benchmark run in
    docs/performance.md), and its first lines are the two set-up commands."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail to docs/"
    block = lines[lines.index("```bash") + 1 : lines.index("```")]
    assert len(block) == 2 and "raftlease up" in block[0] and "scripts/test" in block[1]
