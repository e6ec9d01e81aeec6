"""The fast loop (``-m "not integration"``) starts no node process: tests using a
cluster fixture are marked ``integration`` by conftest.py, and a test that is not so
marked fails at the ``Popen`` that would start a node (conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from raftlease.testing import wait_for
from tests.conftest import SERIAL_FILES, pytest_collection_modifyitems, starts_a_node

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("argv", "node"),
    [
        ([sys.executable, "-m", "raftlease", "node", "--config", "n1.toml"], True),
        (["/usr/local/bin/raftlease", "up", "--nodes", "3"], True),
        ([sys.executable, "-m", "raftlease.testing.node", "--config", "x"], True),
        (["unshare", "--net", "hostexec", "python3", "-m", "raftlease", "node"], True),
        ("python3 -m raftlease up --demo", True),
        ([sys.executable, "-m", "raftlease", "status"], False),
        ([sys.executable, "-c", "import raftlease"], False),
        (["ruff", "check", "node"], False),
    ],
)
def test_node_command_lines_are_recognised(argv: object, node: bool) -> None:
    assert starts_a_node(argv) is node


def test_a_test_not_marked_integration_cannot_start_a_node() -> None:
    # Never runs anything: the guard refuses before the process is made.
    with pytest.raises(AssertionError, match="not marked integration"):
        subprocess.Popen([sys.executable, "-c", "pass", "raftlease", "node"])
    done = subprocess.run([sys.executable, "-c", "print('fine')"], capture_output=True, text=True)
    assert done.stdout == "fine\n"


class _Item:
    def __init__(self, fixturenames: list[str]) -> None:
        self.fixturenames = fixturenames
        self.markers: list[str] = []

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.markers.append(marker.name)


def test_a_test_using_a_cluster_fixture_is_marked_integration() -> None:
    items = [_Item(["tmp_path", name]) for name in ("cluster", "shared", "cluster_factory")]
    plain = _Item(["tmp_path", "monkeypatch"])
    pytest_collection_modifyitems([*items, plain])  # type: ignore[list-item]
    assert [item.markers for item in items] == [["integration"]] * 3
    assert plain.markers == []


def test_a_child_started_with_dies_with_pytest_stops_when_its_parent_exits() -> None:
    """``DIES_WITH_PYTEST`` (tests/process_support.py): the child of a parent that
    exits (as pytest does when a thread-mode timeout ends the run) gets SIGTERM."""
    root = Path(__file__).resolve().parents[2]
    parent = (
        "import subprocess, sys\n"
        f"sys.path.insert(0, {str(root)!r})\n"
        "from tests.process_support import DIES_WITH_PYTEST\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " preexec_fn=DIES_WITH_PYTEST)\n"
        "print(child.pid, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", parent], capture_output=True, text=True, timeout=20, check=True
    )
    pid = int(done.stdout)

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A zombie until init reaps it: gone as far as running goes.
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"

    wait_for(gone, timeout=10, what="the orphaned child to stop")


def test_every_test_file_lives_in_a_folder_of_its_kind() -> None:
    """tests/unit, tests/integration, tests/chaos or tests/fitness (CONTRIBUTING.md):
    a new test file at the top of tests/ would escape the folder's marker and the
    fast loop's command."""
    tests = Path(__file__).resolve().parent.parent
    kinds = {"unit", "integration", "chaos", "fitness"}
    assert {p.name for p in tests.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == (
        kinds
    )
    stray = sorted(p.name for p in tests.glob("test_*.py"))
    assert not stray, f"test files outside the kind folders: {stray}"


def test_a_test_of_a_serial_file_is_marked_serial() -> None:
    """scripts/test runs the tests marked ``serial`` alone, after the others."""
    tests = Path(__file__).resolve().parents[1]
    serial, other = _Item([]), _Item([])
    serial.path = tests / next(iter(SERIAL_FILES))  # type: ignore[attr-defined]
    other.path = Path(__file__)  # type: ignore[attr-defined]
    pytest_collection_modifyitems([serial, other])  # type: ignore[list-item]
    assert (serial.markers, other.markers) == (["serial"], [])
