"""Reading PySyncObj's pickles without running code: an unpickler that constructs only
builtin containers (anything else a pickle names becomes an inert stand-in, never
imported or run), and the commit index a node saved in its journal's ``.meta`` file.

A data directory handed to an operator's tool (backup, restore, the journal's checks
at start) must not be able to run code. Shared by ``backup.py`` and ``journal.py``,
which is why it is a module of its own: each of them reads the other's files.

No I/O but the one file ``read_commit_index`` reads; no state.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

_BUILTINS = ("bytes", "bytearray", "set", "frozenset", "dict", "list", "tuple", "object")
_ALLOWED = {
    *((module, name) for module in ("builtins", "__builtin__") for name in _BUILTINS),
    ("_codecs", "encode"),
    ("copyreg", "_reconstructor"),
    ("copy_reg", "_reconstructor"),
}


class _Inert:
    """Stand-in for a class a pickle names that is not a builtin container."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that builds builtin containers only; any other class a pickle
    names becomes an ``_Inert`` stand-in (nothing is imported or run)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        return type(name, (_Inert,), {"origin": f"{module}.{name}"})


def safe_loads(data: bytes) -> Any:
    """Unpickle ``data`` with ``SafeUnpickler``; raises what ``pickle`` raises for
    bytes that are not a pickle."""
    return SafeUnpickler(io.BytesIO(data)).load()


class _StrictUnpickler(pickle.Unpickler):
    """An unpickler that builds builtin containers only and refuses any other class
    a pickle names (``UnpicklingError``): for bytes from the network."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a peer frame names {module}.{name}: refused")


def strict_loads(data: bytes | memoryview) -> Any:
    """Unpickle a peer frame: builtin values only (PySyncObj's messages are dicts,
    lists, tuples, strings, numbers and bytes); a frame naming any other class raises
    ``pickle.UnpicklingError`` before anything is built from it, so a peer, even one
    holding a certificate of the cluster CA, cannot run code by what it sends."""
    return _StrictUnpickler(io.BytesIO(data)).load()


def read_commit_index(path: Path) -> int | None:
    """The commit index a node saved in its journal's ``.meta`` file (None if absent
    or unreadable: it may lag the real one by a second)."""
    if not path.exists():
        return None
    try:
        meta = safe_loads(path.read_bytes())
        return int(meta["raftCommitIndex"])
    except Exception:
        return None
