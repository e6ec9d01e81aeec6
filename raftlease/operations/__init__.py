"""The one table of operations (docs/architecture.md): for each operation of the
wire protocol its name, whether it mutates (and so carries ``cid``, ``seq`` and
``ack``), its request fields in the order they are checked (wire name, the core's
name, kind, bounds, required or optional, default, a one-line doc), the cross-field
rules between them, the permission it needs, its HTTP routes and its result fields.

Everything that used to write an operation's fields by hand reads this table instead:
the wire parser (``protocol.parse_request``), the state machine's entry checks
(``core/checks.py``), the permission check (``server/auth.py``) and the OpenAPI
document with its request and response schemas (``server/op_schemas.py``). A new
operation or field is one entry here; ``tests/unit/test_operations.py`` checks that every
reader agrees with it.

Ground floor: imports only ``errors`` and ``limits`` (and the stdlib), so every layer,
the pure core included, may read it. Pure data and small pure functions: no I/O.

The table is a package by subject, each a tuple of ``Operation`` in the order the wire
protocol has always listed them: ``leases.py``, ``tasks.py``, ``cluster.py``, then
``budgets.py`` (shared budgets, added last); the
vocabulary they are written in (fields, bounds, rules, results, routes, permissions)
is ``schema.py``.
"""

from __future__ import annotations

from .budgets import BUDGET_OPS
from .cluster import CLUSTER_OPS
from .lease_effects import LEASE_EFFECT_OPS
from .leases import LEASE_OPS
from .schema import (
    CONSISTENCY_MODES,
    ENVELOPE,
    MAX_MEMBER_ID,
    MAX_PRIORITY,
    PERMISSIONS,
    ArgRef,
    Field,
    LimitRef,
    Limits,
    Operation,
    Permission,
    ResultField,
    Route,
    Rule,
    resolve,
)
from .tasks import TASK_OPS

#: Every operation, in the wire protocol's order.
TABLE: tuple[Operation, ...] = (
    LEASE_OPS + TASK_OPS + CLUSTER_OPS + BUDGET_OPS + LEASE_EFFECT_OPS  # issue 41
)

#: The table by operation name.
BY_NAME: dict[str, Operation] = {op.name: op for op in TABLE}


def ops_with(permission: Permission) -> frozenset[str]:
    """The operations that need ``permission``."""
    return frozenset(op.name for op in TABLE if op.permission == permission)


def ops_reading(wire: str) -> frozenset[str]:
    """The operations with a field named ``wire`` on the wire."""
    return frozenset(op.name for op in TABLE if op.field(wire) is not None)


def core_bounds(op: str, wire: str) -> tuple[int, int]:
    """The bounds of field ``wire`` of ``op`` as the core checks its log entries: an
    integer's own, a number of seconds' in milliseconds (a mutating operation's fields
    include the dedup envelope's). For the state machine, which
    keeps its own check (it must not trust the wire) from the same table. Raises
    ``KeyError`` for an unknown operation or field and ``ValueError`` for bounds taken
    from the node's limits or another field (the core checks those against hard caps)."""
    operation = BY_NAME[op]
    spec = operation.field(wire)
    if spec is None and operation.mutates:
        spec = next((f for f in ENVELOPE if isinstance(f, Field) and f.wire == wire), None)
    if spec is None:
        raise KeyError(f"{op} has no field {wire!r}")
    if not all(isinstance(b, int | float) for b in (spec.low, spec.high)):
        raise ValueError(f"{op}.{wire} is bounded by the node's limits or another field")
    low, high = spec.low, spec.high
    assert isinstance(low, int | float) and isinstance(high, int | float)
    if spec.kind == "seconds":
        return round(low * 1000), round(high * 1000)
    if spec.kind != "integer":
        raise ValueError(f"{op}.{wire} is no integer or number of seconds")
    return int(low), int(high)


__all__ = [
    "BY_NAME",
    "CONSISTENCY_MODES",
    "ENVELOPE",
    "MAX_MEMBER_ID",
    "MAX_PRIORITY",
    "PERMISSIONS",
    "TABLE",
    "ArgRef",
    "Field",
    "LimitRef",
    "Limits",
    "Operation",
    "Permission",
    "ResultField",
    "Route",
    "Rule",
    "core_bounds",
    "ops_reading",
    "ops_with",
    "resolve",
]
