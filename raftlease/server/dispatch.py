"""From a validated request to a log entry: what the leader adds before it proposes.

Randomness is drawn here, never in the state machine (core), and so are the quotas
the state machine decides with.
"""

from __future__ import annotations

import secrets
from typing import Any

from ..config import NodeConfig


def draw_task_ids(config: NodeConfig, op: str, entry: dict[str, Any]) -> None:
    """A put's task id, a claim's attempt id (a capability: only the claimer receives
    it). A put also carries the queue's task quota (``max_queue_tasks``), a completion
    the count bound on retained completed tasks (``max_completed_tasks``), both decided
    by the state machine."""
    if op == "task_put":
        entry["tid"] = secrets.token_hex(12)
        entry["quota"] = min(config.max_queue_tasks, 2**31)
    elif op == "task_claim":
        entry["aid"] = secrets.token_hex(16)
    elif op == "task_complete":
        entry["max_completed"] = min(config.max_completed_tasks, 2**31)
