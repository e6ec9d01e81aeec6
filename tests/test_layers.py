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

PACKAGE = Path(__file__).resolve().parent.parent / "raftlease"

#: Shared ground: value types, the wire protocol, errors, config, clocks, limits.
GROUND = {"_version", "errors", "limits", "clock", "config", "protocol", "models"}

#: layer -> the raftlease layers it may import (directly, lazily or for types).
#: A layer is a subpackage, or a top-level module of ground or the entry points.
ALLOWED: dict[str, set[str]] = {
    "_version": set(),
    "errors": set(),
    "limits": set(),
    "clock": set(),
    "config": {"errors", "limits"},
    "protocol": {"errors", "limits"},
    "models": {"errors"},
    # The cluster's certificates (cryptography's x509 builder): below replication,
    # which checks peer certificates with it, and the commands that make them.
    "pki": {"errors"},
    "core": {"limits", "errors"},
    "replication": GROUND | {"core", "pki"},
    "server": GROUND | {"core", "replication"},
    "recipes": {"errors", "models"},
    "client": GROUND | {"recipes"},
    "testing": GROUND | {"client", "server", "replication", "core", "cli", "pki"},
    "cli": GROUND | {"client", "server", "testing"},
    # raftlease certs: the CA and certificates, offline.
    "cli_certs": GROUND | {"cli", "pki", "server"},
    "cli_lock": GROUND | {"cli", "client", "recipes"},
    "cli_admin": GROUND | {"cli", "cli_lock", "client"},
    "cli_member": GROUND | {"cli"},
    "cli_queue": GROUND | {"cli", "client"},
    # raftlease top: read-only through the client the CLI builds.
    "cli_top": GROUND | {"cli", "client"},
    # Backups: the snapshot file and restore are server-side code run offline.
    "cli_snapshot": GROUND | {"cli", "client", "server"},
    # The running `raftlease up` (its console): the LocalCluster it supervises.
    "cli_up": GROUND | {"testing"},
    # raftlease mcp: the MCP server is a client of the cluster (asyncio client, sessions).
    "mcp_server": GROUND | {"client", "recipes"},
    "cli_mcp": GROUND | {"cli", "mcp_server"},
    "__main__": {"cli"},
    "__init__": {"_version", "client", "errors", "models", "recipes"},
}

# cli.py imports each cli_* module once, at its end, to register its commands.
ALLOWED["cli"] |= {name for name in ALLOWED if name.startswith("cli_")}

#: Third-party packages each layer may import (the stdlib is always allowed).
THIRD_PARTY: dict[str, set[str]] = {
    "pki": {"cryptography"},
    # cryptography: which open peer connections a reload still admits (peer_tls.py).
    "replication": {"pysyncobj", "msgpack", "cryptography"},
    # aiohttp, prometheus_client: the admin endpoint and its metrics (server/admin.py);
    # cryptography: which open connections a reload's client CA file still trusts
    # (server/tls_reload.py).
    "server": {"msgpack", "aiohttp", "prometheus_client", "cryptography"},
    "protocol": {"msgpack"},
    "cli": {"click"},
    "cli_snapshot": {"click"},
    "cli_lock": {"click"},
    "cli_admin": {"click"},
    "cli_member": {"click"},
    "cli_certs": {"click"},
    "cli_queue": {"click"},
    "cli_top": {"click"},
    "cli_up": {"click"},
    # mcp (the official MCP SDK) and pydantic (its argument models): raftlease mcp;
    # typing_extensions (pydantic's own dependency): TypedDicts pydantic reads on
    # Python 3.11, the tools' typed results.
    "mcp_server": {"mcp", "pydantic", "anyio", "typing_extensions"},
    "cli_mcp": {"click", "anyio"},
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
