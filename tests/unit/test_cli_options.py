"""The command line's shared behaviour (raftlease/cli/common.py, docs/cli.md): client
options before or after the subcommand, ``-o/--output text|json``, the ``RAFTLEASE_*``
variables, the import arrows inside the cli/ package, and the one signal policy of the
long-running commands (SIGINT and SIGTERM stop them even when SIGINT was inherited
ignored, as a shell's background job inherits it).

The unit half of these tests (no process); the integration half is
tests/integration/test_cli_options.py."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from raftlease.cli import main
from raftlease.cli.common import (
    DEFAULT_ENDPOINTS,
    LOG_FORMATS,
    client_options,
    endpoints_option,
    output_options,
    timeout_option,
)
from raftlease.server.logs import LOG_FORMATS as NODE_LOG_FORMATS
from raftlease.testing import free_port_block

pytestmark = pytest.mark.timeout(120)

CLI = Path(__file__).resolve().parents[2] / "raftlease" / "cli"


# ------------------------------------------------- options, in-process


@click.command("probe-options")
@client_options
def _probe(endpoints: str, as_json: bool, timeout: float) -> None:
    """What a client command gets, as JSON."""
    click.echo(json.dumps({"endpoints": endpoints, "json": as_json, "timeout": timeout}))


@click.command("probe-long")
@endpoints_option
@timeout_option(300.0)
@output_options
def _probe_long(endpoints: str, timeout: float, as_json: bool) -> None:
    """A command with a default timeout of its own (as ``snapshot save``)."""
    click.echo(json.dumps({"endpoints": endpoints, "json": as_json, "timeout": timeout}))


@pytest.fixture
def probe() -> Iterator[None]:
    """The two probes registered on the real root for one test (removed after)."""
    for command in (_probe, _probe_long):
        main.add_command(command)
    try:
        yield
    finally:
        for command in (_probe, _probe_long):
            assert command.name is not None
            main.commands.pop(command.name, None)


def _got(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    clean = {k: None for k in os.environ if k.startswith("RAFTLEASE_")}
    result = CliRunner().invoke(main, args, env={**clean, **(env or {})})
    assert result.exit_code == 0, result.output
    got: dict[str, Any] = json.loads(result.output)
    return got


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["probe-options"], {"endpoints": DEFAULT_ENDPOINTS, "json": False, "timeout": 15.0}),
        (["--endpoints", "a:1", "probe-options"], {"endpoints": "a:1"}),
        (["probe-options", "--endpoints", "a:1"], {"endpoints": "a:1"}),
        (["--endpoints", "a:1", "probe-options", "--endpoints", "b:2"], {"endpoints": "b:2"}),
        (["--timeout", "5s", "probe-options"], {"timeout": 5.0}),
        (["--timeout", "5s", "probe-options", "--timeout", "250ms"], {"timeout": 0.25}),
        (["-o", "json", "probe-options"], {"json": True}),
        (["--output", "json", "probe-options"], {"json": True}),
        (["--json", "probe-options"], {"json": True}),
        (["probe-options", "-o", "json"], {"json": True}),
        (["probe-options", "--json"], {"json": True}),
        (["-o", "json", "probe-options", "-o", "text"], {"json": False}),
        (["--json", "probe-options", "-o", "text"], {"json": False}),
        (["-o", "text", "probe-options", "--json"], {"json": True}),
    ],
)
def test_client_options_before_or_after_the_subcommand(
    probe: None, args: list[str], expected: dict[str, Any]
) -> None:
    """The subcommand's own argument wins; the root's comes next."""
    got = _got(args)
    assert {k: got[k] for k in expected} == expected


def test_the_environment_comes_after_the_command_line(probe: None) -> None:
    env = {"RAFTLEASE_ENDPOINTS": "e:1", "RAFTLEASE_TIMEOUT": "7", "RAFTLEASE_OUTPUT": "json"}
    assert _got(["probe-options"], env) == {"endpoints": "e:1", "json": True, "timeout": 7.0}
    got = _got(["--endpoints", "a:1", "--timeout", "2", "-o", "text", "probe-options"], env)
    assert got == {"endpoints": "a:1", "json": False, "timeout": 2.0}
    got = _got(["probe-options", "--endpoints", "b:2", "-o", "text"], env)
    assert (got["endpoints"], got["json"]) == ("b:2", False)


def test_a_commands_own_default_holds_unless_a_timeout_is_given(probe: None) -> None:
    """The root's options carry no default of their own: ``snapshot save``'s 300 s
    stays unless a --timeout (or RAFTLEASE_TIMEOUT) is given."""
    assert _got(["probe-long"])["timeout"] == 300.0
    assert _got(["--timeout", "1m", "probe-long"])["timeout"] == 60.0
    assert _got(["probe-long"], {"RAFTLEASE_TIMEOUT": "9"})["timeout"] == 9.0
    assert _got(["-o", "json", "probe-long"])["json"] is True


def test_bad_global_values_are_usage_errors() -> None:
    result = CliRunner().invoke(main, ["--timeout", "soon", "status"])
    assert result.exit_code == 2 and "'soon' is not a duration" in result.output
    result = CliRunner().invoke(main, ["-o", "yaml", "status"])
    assert result.exit_code == 2 and "yaml" in result.output


def test_offline_commands_take_the_output_option_too(tmp_path: Path) -> None:
    """``-o json`` before the subcommand reaches a command that asks no cluster."""
    runner = CliRunner()
    made = runner.invoke(main, ["certs", "init", "--dir", str(tmp_path)])
    assert made.exit_code == 0, made.output
    shown = runner.invoke(main, ["-o", "json", "certs", "show", str(tmp_path / "ca.pem")])
    assert shown.exit_code == 0, shown.output
    assert "raftlease cluster CA" in json.loads(shown.output)["subject"]


def test_the_cli_spells_the_node_log_formats_as_the_node_does() -> None:
    assert LOG_FORMATS == NODE_LOG_FORMATS


# -------------------------------------------------- the package's arrows


#: cli/ module -> the cli/ modules it may import: root -> commands -> common.
NOT_COMMANDS = {"__init__", "__main__", "root", "common", "up_console"}
COMMANDS = {p.stem for p in CLI.glob("*.py")} - NOT_COMMANDS
ARROWS: dict[str, set[str]] = {
    "__init__": {"root"},
    "__main__": {"root"},
    "root": COMMANDS | {"common"},
    "common": set(),
    "up_console": set(),
    **{name: {"common"} for name in COMMANDS},
}
ARROWS["up"] |= {"up_console"}


def _cli_imports(path: Path) -> tuple[set[str], list[str]]:
    """(cli/ modules ``path`` imports, imports of raftlease.cli made inside functions)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("raftlease.cli"):
            found.add("<absolute>")
    inner = [
        ast.unparse(node)
        for func in ast.walk(tree)
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(func)
        if isinstance(node, ast.ImportFrom) and node.level == 1
    ]
    return found, inner


def test_the_cli_package_imports_root_then_commands_then_common() -> None:
    assert set(ARROWS) == {p.stem for p in CLI.glob("*.py")}, "a new cli/ module: add it"
    for name, allowed in ARROWS.items():
        found, inner = _cli_imports(CLI / f"{name}.py")
        assert found <= allowed, f"cli/{name}.py imports {sorted(found - allowed)}"
        assert not inner, f"cli/{name}.py imports cli/ modules inside functions: {inner}"


# ------------------------------------------ subprocesses, real clusters


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAFTLEASE_")}
    return subprocess.run(
        [sys.executable, "-m", "raftlease", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**clean, **(env or {})},
    )


def test_endpoints_before_the_subcommand_are_no_longer_refused() -> None:
    """The issue's example: `raftlease --endpoints X status` said "No such option"."""
    where = f"127.0.0.1:{free_port_block(1)}"
    out = run_cli("--endpoints", where, "status", "-o", "json")
    assert out.returncode == 1, out.stdout + out.stderr  # nobody answers there
    nodes = json.loads(out.stdout)["nodes"]
    assert [n["client"] for n in nodes] == [where] and nodes[0]["reachable"] is False
