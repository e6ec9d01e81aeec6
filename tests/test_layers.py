"""The layer arrows of ARCHITECTURE.md §1, enforced: each module imports only the
modules below it (an import-linter-style contract, written as an AST walk so it needs
no extra tool). A client process must not need the server's dependencies."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

PACKAGE = Path(__file__).resolve().parent.parent / "raftlease"

#: module -> the raftlease modules it may import (directly or lazily).
ALLOWED: dict[str, set[str]] = {
    "limits": set(),
    "errors": set(),
    "clock": set(),
    "config": {"errors", "limits"},
    "core": {"limits"},
    "protocol": {"errors", "limits"},
    "leadership": {"clock"},
    "replication": {"clock", "config", "core", "leadership", "errors"},
    "client": {"errors", "protocol", "locks", "sessions", "election"},
    "keepalive": {"errors"},
    "locks": {"errors", "client", "keepalive", "sessions"},
    "sessions": {"errors", "client", "keepalive", "locks"},
    "election": {"errors", "client"},
    "fencing": {"errors"},
    "server": {"__init__", "clock", "config", "core", "errors", "protocol", "replication"},
    "testing": {"client", "config", "errors"},
    "cli": {"__init__", "client", "config", "errors", "server", "testing"},
    "__main__": {"cli"},
    "__init__": {"client", "errors", "fencing", "election", "locks", "sessions"},
}

#: Third-party modules a layer must never import.
FORBIDDEN_THIRD_PARTY: dict[str, set[str]] = {
    "client": {"pysyncobj"},
    "locks": {"pysyncobj"},
    "keepalive": {"pysyncobj"},
    "sessions": {"pysyncobj"},
    "election": {"pysyncobj"},
    "protocol": {"pysyncobj"},
    "core": {"pysyncobj", "msgpack"},
}


def internal_imports(source: str) -> tuple[set[str], set[str]]:
    """(raftlease modules, top-level third-party packages) that ``source`` imports."""
    internal: set[str] = set()
    external: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            package_level = (node.level > 0 and not node.module) or node.module == "raftlease"
            if package_level:  # from . import x / from raftlease import x
                internal.update(
                    alias.name if (PACKAGE / f"{alias.name}.py").exists() else "__init__"
                    for alias in node.names
                )
            elif node.level > 0 and node.module:  # from .x import y
                internal.add(node.module.split(".")[0])
            elif node.module and node.module.split(".")[0] == "raftlease":
                internal.add(node.module.split(".")[1])
            elif node.module:
                external.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top == "raftlease":
                    parts = alias.name.split(".")
                    internal.add(parts[1] if len(parts) > 1 else "__init__")
                else:
                    external.add(top)
    return internal, external


def test_every_module_has_a_contract() -> None:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules == set(ALLOWED), "add the new module to ALLOWED with its layer"


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_module_imports_only_lower_layers(module: str) -> None:
    internal, external = internal_imports((PACKAGE / f"{module}.py").read_text())
    internal.discard(module)
    assert internal <= ALLOWED[module], f"{module} imports {sorted(internal - ALLOWED[module])}"
    banned = external & FORBIDDEN_THIRD_PARTY.get(module, set())
    assert not banned, f"{module} must not import {sorted(banned)}"


def test_the_checker_sees_a_violation() -> None:
    internal, external = internal_imports(
        "from .server import NodeServer\nimport pysyncobj.node\nfrom raftlease import core\n"
    )
    assert internal == {"server", "core"}
    assert "pysyncobj" in external
    assert not {"server", "core"} <= ALLOWED["client"], "the contract would reject it"
