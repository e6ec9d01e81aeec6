"""The audit trail on a node (docs/audit.md): the ``audit`` operation's answer from
this node's state, and the chain check the CLI runs (``raftlease audit verify``),
from the pure core (core/audit.py).

Threads: the node's event loop (``audit_answer``); ``verify_chain`` is pure.
"""

from __future__ import annotations

from typing import Any

from ..core.audit import AuditTrail, verify_chain
from ..errors import UnavailableError
from ..limits import MAX_AUDIT_RECORDS
from ..replication import Replica

__all__ = ["audit_answer", "verify_chain"]


def audit_answer(replica: Replica, args: dict[str, Any], node_id: str) -> dict[str, Any]:
    """The ``audit`` operation's answer from this node's state (docs/audit.md): the
    records ``args`` select (``trail``, ``key``, ``principal``, ``since``, ``limit``), with the
    chain's ``base`` and ``head`` so a reader can verify them. Read between two
    applies (the store's ``apply_seq``), so records, base and head belong together;
    ``UnavailableError`` if every try overlapped one. Event loop; never blocks."""
    store = replica.store
    for _ in range(20):
        before = store.apply_seq
        if before % 2:
            continue
        # ``trail``: the ownership changes, or the refusal ring (docs/audit.md).
        trail = store.audit_refusals if args.get("trail") == "refusals" else store.audit
        every = trail.select(since=0, limit=MAX_AUDIT_RECORDS)
        base, head, seq = trail.base, trail.head, trail.seq
        applied = replica.last_applied()
        if store.apply_seq != before:
            continue
        selected = AuditTrail.filter(
            every,
            args.get("key"),
            args.get("principal"),
            int(args.get("since", 0)),
            int(args.get("limit", 1000)),
        )
        return {
            "records": selected,
            "base": base,
            "head": head,
            "first": every[0][0] if every else seq,
            "applied_index": applied,
            "node": node_id,
        }
    raise UnavailableError("the state changed under every try of this read; retry it")
