"""``raftlease.core`` must stay pure: no clock, randomness, I/O, threads or Raft library.

The state machine runs on every replica and must give the same result from the same
log; anything that reads the environment would let replicas diverge. This walks the
module's AST (it does not import-trace, so code paths that never run are covered too).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

import raftlease.core

pytestmark = pytest.mark.timeout(60)

#: Top-level modules ``core`` may not import, directly or through a submodule.
BANNED_MODULES = frozenset(
    {
        "time",
        "random",
        "uuid",
        "os",
        "socket",
        "asyncio",
        "threading",
        "logging",
        "msgpack",
        "pysyncobj",
        "secrets",
        "datetime",
        # ways around the list above
        "importlib",
    }
)

#: Builtins that read the environment, do I/O or differ between processes
#: (``hash`` of a str is salted per process, ``id`` is an address).
BANNED_CALLS = frozenset(
    {"open", "print", "input", "hash", "id", "eval", "exec", "__import__", "breakpoint"}
)


def _top(module: str) -> str:
    return module.split(".", 1)[0]


def banned_imports(source: str) -> list[str]:
    """Names of banned modules imported anywhere in ``source`` (any nesting level)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names if _top(alias.name) in BANNED_MODULES)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and _top(node.module) in BANNED_MODULES:
                found.append(node.module)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "__import__"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and _top(node.args[0].value) in BANNED_MODULES
        ):
            found.append(node.args[0].value)
    return found


def banned_calls(source: str) -> list[str]:
    """Names of banned builtins that ``source`` calls or refers to."""
    return sorted(
        {
            node.id
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Name) and node.id in BANNED_CALLS
        }
    )


CORE_DIR = Path(inspect.getfile(raftlease.core)).resolve().parent


def core_source() -> str:
    """Every module of the ``raftlease.core`` package, concatenated."""
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(CORE_DIR.glob("*.py")))


def sibling_modules(source: str, package_dir: Path) -> list[Path]:
    """Files of the package's own modules that ``source`` imports relatively."""
    paths: list[Path] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = package_dir.joinpath(*([".."] * (node.level - 1)))
        names = [node.module] if node.module else [alias.name for alias in node.names]
        for name in names:
            stem = base.joinpath(*name.split("."))
            for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
                if candidate.is_file():
                    paths.append(candidate.resolve())
    return paths


def core_and_its_package_imports() -> dict[str, str]:
    """Source of core and, transitively, of every package module it imports: a module
    core relies on must be just as pure."""
    sources: dict[str, str] = {}
    pending = sorted(CORE_DIR.glob("*.py"))
    while pending:
        path = pending.pop()
        if str(path) in sources:
            continue
        source = path.read_text(encoding="utf-8")
        sources[str(path)] = source
        pending.extend(sibling_modules(source, path.parent))
    return sources


def test_core_imports_nothing_impure() -> None:
    assert banned_imports(core_source()) == []


def test_modules_core_imports_from_its_package_are_pure_too() -> None:
    sources = core_and_its_package_imports()
    found = {path: banned_imports(source) for path, source in sources.items()}
    assert {path: names for path, names in found.items() if names} == {}
    calls = {path: banned_calls(source) for path, source in sources.items()}
    assert {path: names for path, names in calls.items() if names} == {}


def test_sibling_modules_are_followed(tmp_path: Path) -> None:
    (tmp_path / "dirty.py").write_text("import time\n", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("", encoding="utf-8")
    source = "from .dirty import x\nfrom . import sub\nfrom .missing import y\n"
    paths = sibling_modules(source, tmp_path)
    assert paths == [
        (tmp_path / "dirty.py").resolve(),
        (tmp_path / "sub" / "__init__.py").resolve(),
    ]
    assert banned_imports(paths[0].read_text(encoding="utf-8")) == ["time"]


def test_core_uses_no_impure_builtins() -> None:
    assert banned_calls(core_source()) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import time", ["time"]),
        ("import time as clock", ["time"]),
        ("from time import monotonic", ["time"]),
        ("import os.path", ["os.path"]),
        ("from os import path", ["os"]),
        ("from datetime import datetime", ["datetime"]),
        ("import heapq, random", ["random"]),
        ("from pysyncobj.batteries import ReplDict", ["pysyncobj.batteries"]),
        ("import msgpack", ["msgpack"]),
        ("import uuid, secrets, socket", ["uuid", "secrets", "socket"]),
        ("import asyncio, threading, logging", ["asyncio", "threading", "logging"]),
        ("def f() -> None:\n    import random\n", ["random"]),
        ("if True:\n    from logging import getLogger\n", ["logging"]),
        ("class C:\n    def m(self) -> None:\n        import socket\n", ["socket"]),
        ("try:\n    import time\nexcept ImportError:\n    pass\n", ["time"]),
        ("clock = __import__('time')", ["time"]),
        ("import importlib", ["importlib"]),
        # not banned: prefixes, look-alikes, relative imports, the stdlib core uses
        ("import timeit", []),
        ("import randomness_helpers", []),
        ("from .time import x", []),
        ("import heapq\nfrom collections import OrderedDict", []),
        ("x = 'import time'", []),
    ],
)
def test_the_import_checker_finds_what_it_must(source: str, expected: list[str]) -> None:
    assert banned_imports(source) == expected


def test_the_import_checker_can_fail_on_core_itself() -> None:
    """Self-check: core's own source with one bad import added is reported."""
    polluted = core_source() + "\n\ndef _now() -> float:\n    import time\n\n    return 0.0\n"
    assert banned_imports(polluted) == ["time"]
    polluted = "import time\n" + core_source()
    assert banned_imports(polluted) == ["time"]


def test_the_builtin_checker_finds_what_it_must() -> None:
    source = textwrap.dedent(
        """
        def f(x: object) -> int:
            print(x)
            return hash(x) + id(x)
        """
    )
    assert banned_calls(source) == ["hash", "id", "print"]
    assert banned_calls("def f(x: str) -> int:\n    return len(x)\n") == []
