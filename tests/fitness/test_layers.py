"""The layer arrows of ARCHITECTURE §1 and docs/architecture.md, enforced with no
exception list: each package imports only the layers below it (an import-linter-style
contract, written as an AST walk so it needs no extra tool), only ``replication``
imports pysyncobj, and a client process can import the client without pysyncobj or
the server. Type-only imports count too: a circle is a design bug even for hints.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(__file__).resolve().parents[2] / "raftlease"

#: Shared ground: value types, the wire protocol, the operations table, errors,
#: config, clocks, limits, the garbage collector's freezing.
GROUND = {
    "_version",
    "errors",
    "limits",
    "clock",
    "config",
    "protocol",
    "models",
    "operations",
    "gc_pauses",
}

#: layer -> the raftlease layers it may import (directly, lazily or for types).
#: A layer is a subpackage, or a top-level module of ground or the entry points.
ALLOWED: dict[str, set[str]] = {
    "_version": set(),
    "errors": set(),
    "limits": set(),
    "clock": set(),
    "gc_pauses": set(),
    "config": {"errors", "limits"},
    # The one table of operations: read by the wire parser, the core, auth and OpenAPI.
    "operations": {"errors", "limits"},
    "protocol": {"errors", "limits", "operations"},
    "models": {"errors"},
    # The cluster's certificates (cryptography's x509 builder): below replication,
    # which checks peer certificates with it, and the commands that make them.
    "pki": {"errors"},
    # Lease certificates a resource checks offline (issue 39): self-contained, so a
    # resource embeds it alone; the server signs with it, the client proves with it.
    "verify": set(),
    "core": {"limits", "errors", "operations"},
    "replication": GROUND | {"core", "pki"},
    "server": GROUND | {"core", "replication", "verify"},
    "recipes": {"errors", "models", "verify"},
    "client": GROUND | {"recipes"},
    "testing": GROUND | {"client", "server", "replication", "core", "pki", "verify"},
    # The cli/ package: the commands drive the client, the recipes (lock's keep-alive),
    # the server (node, offline snapshots, the auth file), testing (up), pki (certs)
    # and the MCP server (mcp).
    "cli": GROUND | {"client", "recipes", "server", "testing", "pki", "mcp_server", "verify"},
    # raftlease mcp: the MCP server is a client of the cluster (asyncio client, sessions).
    "mcp_server": GROUND | {"client", "recipes"},
    "__main__": {"cli"},
    "__init__": {"_version", "client", "errors", "models", "recipes"},
}

#: Third-party packages each layer may import (the stdlib is always allowed).
THIRD_PARTY: dict[str, set[str]] = {
    "pki": {"cryptography"},
    "verify": {"cryptography", "msgpack"},
    # cryptography: which open peer connections a reload still admits (peer_tls.py).
    "replication": {"pysyncobj", "msgpack", "cryptography"},
    # aiohttp, prometheus_client: the admin endpoint and its metrics (server/admin.py);
    # cryptography: which open connections a reload's client CA file still trusts
    # (server/tls_reload.py).
    "server": {"msgpack", "aiohttp", "prometheus_client", "cryptography"},
    "protocol": {"msgpack"},
    # anyio: raftlease mcp runs the MCP server with it.
    "cli": {"click", "anyio"},
    # mcp (the official MCP SDK) and pydantic (its argument models): raftlease mcp;
    # typing_extensions (pydantic's own dependency): TypedDicts pydantic reads on
    # Python 3.11, the tools' typed results.
    "mcp_server": {"mcp", "pydantic", "anyio", "typing_extensions"},
}


def layer_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def layer_files() -> dict[str, list[Path]]:
    layers: dict[str, list[Path]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        layers.setdefault(layer_of(path), []).append(path)
    return layers


def imports_of(path: Path) -> tuple[set[str], set[str]]:
    """(raftlease layers, top-level third-party packages) that the file imports."""
    layer_dir = path.parent
    internal: set[str] = set()
    external: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level > 0:
                base = layer_dir
                for _ in range(node.level - 1):
                    base = base.parent
                if node.module:
                    target = base.joinpath(*node.module.split("."))
                    internal.add(_layer_for(target))
                else:
                    for alias in node.names:
                        internal.add(_layer_for(base / alias.name))
            elif node.module and node.module.split(".")[0] == "raftlease":
                parts = node.module.split(".")
                if len(parts) > 1:
                    internal.add(parts[1])
                else:
                    internal.update(_layer_for(PACKAGE / alias.name) for alias in node.names)
            elif node.module:
                external.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "raftlease":
                    internal.add(parts[1] if len(parts) > 1 else "__init__")
                else:
                    external.add(parts[0])
    return internal, external


def _layer_for(target: Path) -> str:
    """The layer a relative import resolves to (a module, a package, or a name that
    is neither, i.e. an attribute of the package: its ``__init__``)."""
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if candidate.is_file():
            return layer_of(candidate)
    return layer_of(target.parent / "__init__.py")


STDLIB = set(sys.stdlib_module_names)


def test_every_layer_has_a_contract() -> None:
    assert set(layer_files()) == set(ALLOWED), "add the new module or package to ALLOWED"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_lower_layers(layer: str) -> None:
    for path in layer_files()[layer]:
        internal, external = imports_of(path)
        internal.discard(layer)
        assert internal <= ALLOWED[layer], (
            f"{path.relative_to(PACKAGE)} imports {sorted(internal - ALLOWED[layer])}"
        )
        foreign = {name for name in external if name not in STDLIB and name != "__future__"}
        banned = foreign - THIRD_PARTY.get(layer, set()) - {"raftlease"}
        # The testing layer drives everything (and may use what it drives).
        if layer != "testing":
            assert not banned, f"{path.relative_to(PACKAGE)} must not import {sorted(banned)}"


def test_only_replication_imports_pysyncobj() -> None:
    users = {
        str(path.relative_to(PACKAGE))
        for paths in layer_files().values()
        for path in paths
        if "pysyncobj" in imports_of(path)[1]
    }
    assert users and all(user.startswith("replication/") for user in users), users


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """Self-check: a recipe importing client internals and pysyncobj is reported."""
    internal, _ = imports_of(PACKAGE / "recipes" / "locks.py")
    assert internal - {"recipes"} <= ALLOWED["recipes"]
    bad = tmp_path / "bad.py"
    bad.write_text("from raftlease.client.transport import Transport\nimport pysyncobj.node\n")
    internal, external = imports_of(bad)
    assert internal == {"client"} and "pysyncobj" in external
    assert "client" not in ALLOWED["recipes"], "the contract would reject it"


def _loaded_after(statement: str) -> set[str]:
    code = f"{statement}\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    return set(out.stdout.split())


def test_a_client_process_needs_no_pysyncobj_and_no_server() -> None:
    loaded = _loaded_after(
        "import raftlease.client, raftlease.recipes\nfrom raftlease import Client"
    )
    assert "raftlease.client" in loaded
    assert "pysyncobj" not in loaded
    assert not {m for m in loaded if m.split(".")[:2] in (["raftlease", "server"],)}
    for layer in ("server", "replication", "core"):
        assert f"raftlease.{layer}" not in loaded, layer


def test_a_node_process_loads_no_client_or_recipes() -> None:
    loaded = _loaded_after("import raftlease.cli, raftlease.server")
    assert "raftlease.server" in loaded
    for layer in ("client", "recipes"):
        assert f"raftlease.{layer}" not in loaded, layer


# ------------------------------------------------------------- file by file


def module_name(path: Path) -> str:
    """``raftlease/server/node.py`` -> ``server.node``; a package's ``__init__.py``
    -> the package (``server``; the top ``__init__.py`` -> ``__init__``)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _module_of(dotted: list[str]) -> str | None:
    """The module of ``raftlease.<dotted>`` (its file or its package), or None."""
    target = PACKAGE.joinpath(*dotted) if dotted else PACKAGE
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if dotted and candidate.is_file():
            return module_name(candidate)
    return "__init__" if not dotted else None


def file_imports(path: Path) -> set[str]:
    """The raftlease modules (files) that ``path`` imports, at the top, inside
    functions or for types alike: ``from .x import y`` -> ``x``, or ``x.y`` when ``y``
    is a submodule; ``from ..client import Client`` -> ``client`` (its ``__init__``)."""
    own = list(path.relative_to(PACKAGE).parent.parts)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        bases: list[list[str]] = []
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level > 0:
                base = own[: len(own) - (node.level - 1)]
            elif node.module and node.module.split(".")[0] == "raftlease":
                base = []
            else:
                continue
            module = node.module or ""
            if node.level == 0:
                module = ".".join(module.split(".")[1:])
            dotted = base + ([part for part in module.split(".") if part])
            bases.append(dotted)
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "raftlease":
                    bases.append(parts[1:])
        for dotted in bases:
            submodules = [sub for name in names if (sub := _module_of([*dotted, name])) is not None]
            found.update(submodules)
            if len(submodules) < len(names) or not names:
                module = _module_of(dotted)
                if module is not None:
                    found.add(module)
    found.discard(module_name(path))
    return found


def file_graph() -> dict[str, set[str]]:
    return {module_name(path): file_imports(path) for path in sorted(PACKAGE.rglob("*.py"))}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_two_layers_may_import_each_other() -> None:
    both = {
        tuple(sorted((a, b))) for a, allowed in ALLOWED.items() for b in allowed if a in ALLOWED[b]
    }
    assert not both, f"two-way allowances: {sorted(both)}"


def test_no_circle_of_files() -> None:
    """No file imports, directly or through others, a file that imports it back:
    inside a package as well as between packages. With no circle every arrow points
    down some order of the files; ``test_layer_imports_only_lower_layers`` fixes that
    order between packages."""
    found = circles(file_graph())
    assert not found, "circles of imports: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_file_checker_sees_a_circle(tmp_path: Path) -> None:
    """Self-check: the graph has the arrows the code has, and a circle is reported."""
    graph = file_graph()
    assert "core.store" in graph["core"] or "core.store" in graph["core.state"] | graph["core"]
    assert "replication.safe_pickle" in graph["replication.journal"]
    assert "models" in graph["client.blocking"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph["replication.safe_pickle"] = {"replication.journal"}
    assert ["replication.journal", "replication.safe_pickle"] in circles(graph)
