"""The command line's shared behaviour (raftlease/cli/common.py, docs/cli.md): client
options before or after the subcommand, ``-o/--output text|json``, the ``RAFTLEASE_*``
variables, the import arrows inside the cli/ package, and the one signal policy of the
long-running commands (SIGINT and SIGTERM stop them even when SIGINT was inherited
ignored, as a shell's background job inherits it)."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
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
from raftlease.testing import LocalCluster, free_port_block, wait_for

pytestmark = pytest.mark.timeout(120)

CLI = Path(__file__).resolve().parent.parent / "raftlease" / "cli"


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


@pytest.mark.integration
def test_json_output_of_the_lease_queue_and_member_commands(shared: LocalCluster) -> None:
    eps = ",".join(shared.endpoints)
    key = "cli-options/job"
    acquired = run_cli(
        "--endpoints", eps, "-o", "json", "acquire", key, "--owner", "a", "--ttl", "30"
    )
    assert acquired.returncode == 0, acquired.stderr
    lease = json.loads(acquired.stdout)
    assert lease["ok"] and lease["key"] == key and lease["owner"] == "a" and lease["token"] > 0

    # RAFTLEASE_ENDPOINTS is where the command goes when no --endpoints is given.
    env = {"RAFTLEASE_ENDPOINTS": eps}
    held = json.loads(run_cli("holder", key, "-o", "json", env=env).stdout)
    assert (
        held["ok"] and held["holder"]["owner"] == "a" and held["holder"]["token"] == lease["token"]
    )
    # ... and RAFTLEASE_OUTPUT chooses JSON for every command.
    renewed = run_cli("renew", key, lease["lease_id"], env={**env, "RAFTLEASE_OUTPUT": "json"})
    assert renewed.returncode == 0, renewed.stderr
    body = json.loads(renewed.stdout)
    assert (body["ok"], body["key"], body["ttl"]) == (True, key, 30.0) and body["valid_for"] > 0
    status = json.loads(run_cli("-o", "json", "status", env=env).stdout)
    assert status["ok"] and len(status["nodes"]) == 3
    members = json.loads(run_cli("member", "list", "--output", "json", env=env).stdout)
    assert [m["id"] for m in members["members"]] == ["n1", "n2", "n3"]

    put = json.loads(
        run_cli("-o", "json", "queue", "put", "cli-options-q", '{"n": 1}', env=env).stdout
    )
    assert put["ok"] and put["queue"] == "cli-options-q"
    claim = run_cli("-o", "json", "queue", "claim", "cli-options-q", "--worker", "w", env=env)
    task = json.loads(claim.stdout)
    assert task["claimed"] and task["task_id"] == put["task_id"] and task["payload"] == {"n": 1}
    attempt = {**env, "RAFTLEASE_ATTEMPT_ID": task["attempt_id"]}
    done = run_cli("queue", "complete", "cli-options-q", task["task_id"], "-o", "json", env=attempt)
    assert json.loads(done.stdout) == {
        "ok": True,
        "queue": "cli-options-q",
        "task_id": put["task_id"],
    }

    released = run_cli("-o", "json", "release", key, lease["lease_id"], env=env)
    assert json.loads(released.stdout) == {"ok": True, "key": key}
    # text stays what it was.
    assert run_cli("holder", key, env=env).stdout.strip() == f"{key}: free"


# ------------------------------------------------------------- signals


def _ignore_sigint() -> None:
    """In the child before exec: SIGINT ignored, as a shell starts a background job."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Lines:
    """A child's stdout lines, read on a daemon thread, waited for with deadlines."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None
        stream = proc.stdout

        def pump() -> None:
            for line in stream:
                self._queue.put(line)
            self._queue.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def wait_for(self, pattern: str, timeout: float, count: int = 1) -> str:
        """The text read so far once ``pattern`` has appeared ``count`` times; raises
        AssertionError at the deadline or at the end of the output."""
        deadline = time.monotonic() + timeout
        while sum(bool(re.search(pattern, line)) for line in self.seen) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"{pattern!r} not seen within {timeout} s:\n{''.join(self.seen)}"
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, f"output ended before {pattern!r}:\n{''.join(self.seen)}"
            self.seen.append(line)
        return "".join(self.seen)

    def rest(self, timeout: float) -> str:
        """Everything up to the end of the output (within ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
        return "".join(self.seen)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_for_good(proc: subprocess.Popen[str], pids: list[int]) -> None:
    """On the way out of a test, even a failed one: no process of it left running."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_up_with_sigint_inherited_ignored_stops_every_node(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """``raftlease up &`` in a script: SIGINT arrives ignored; SIGINT (and SIGTERM)
    must still stop every node, exit 0, and leave no node process behind."""
    port = free_port_block(3)
    cmd = [sys.executable, "-m", "raftlease", "up", "--port", str(port), "--no-admin"]
    cmd += ["--data-dir", str(tmp_path / "up")]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_ignore_sigint,
    )
    pids: list[int] = []
    try:
        lines = Lines(proc)
        text = lines.wait_for("press Ctrl-C", 90)
        pids = [int(p) for p in re.findall(r"pid (\d+)", text)]
        assert len(pids) == 3, text
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0, lines.rest(5)
        assert "all nodes stopped" in lines.rest(10)
        wait_for(lambda: not any(map(_alive, pids)), 10, "every node process to exit")
    finally:
        _stop_for_good(proc, pids)


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_top_and_watch_with_sigint_inherited_ignored_stop_with_0(
    shared: LocalCluster, sig: signal.Signals
) -> None:
    eps = ",".join(shared.endpoints)
    prefix = f"cli-options/{sig.name}/"

    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "raftlease", "--endpoints", eps, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_ignore_sigint,
        )

    top = start("top", "--interval", "0.3", "--prefix", prefix)
    try:
        lines = Lines(top)
        lines.wait_for("^raftlease top", 60, count=2)  # refreshing
        top.send_signal(sig)
        assert top.wait(timeout=30) == 0, lines.rest(5)
    finally:
        _stop_for_good(top, [])

    watch = start("watch", prefix, "-o", "json")
    try:
        lines = Lines(watch)
        with shared.client() as c:
            # The watch starts at the revision it finds: acquire until it reports one.
            def seen() -> bool:
                c.release(c.acquire(prefix + "k", owner="w", ttl=10))
                with contextlib.suppress(AssertionError):
                    lines.wait_for('"grant"', 0.5)
                    return True
                return False

            wait_for(seen, 60, "the watch to report a grant")
        assert json.loads(lines.seen[0])["key"] == prefix + "k"
        watch.send_signal(sig)
        assert watch.wait(timeout=30) == 0, lines.rest(5)
    finally:
        _stop_for_good(watch, [])
