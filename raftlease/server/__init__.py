"""The asyncio front of one node: connections, dispatch, batching, watches.

* ``node``: ``NodeServer`` (connections, request dispatch, leader-lease and stale
  reads, long-polls, the leader's housekeeping ticks, status) and ``run_node``;
* ``proposer``: batching of proposals into one log entry per event-loop turn;
* ``log_clock``: the leader's log-time stamps;
* ``watch``: the watch history and subscribers.
"""

from .log_clock import LogClock
from .node import LOG_TIME_REFRESH, NodeServer, ServerHooks, run_node
from .proposer import MAX_BATCH_BYTES, MAX_BATCH_ENTRIES, Proposer, split_batches
from .watch import WATCH_HISTORY, WatchHub

__all__ = [
    "LOG_TIME_REFRESH",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_ENTRIES",
    "WATCH_HISTORY",
    "LogClock",
    "NodeServer",
    "Proposer",
    "ServerHooks",
    "WatchHub",
    "run_node",
    "split_batches",
]
