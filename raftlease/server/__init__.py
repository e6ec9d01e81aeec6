"""The asyncio front of one node: connections, dispatch, batching, watches.

* ``node``: ``NodeServer``, which wires the collaborators it owns (and its lifecycle,
  request routing), ``ServerHooks`` and ``run_node``;
* ``connections``: the client port (connections, frames, authentication);
* ``dispatch``: a validated write to its log entry, keep-alives from memory;
* ``reads``: reads answered from memory and the one long-poll;
* ``status``, ``tls_reload``, ``housekeeping``: status, reloads, the leader's ticks;
* ``proposer``: batching of proposals into one log entry per event-loop turn;
* ``log_clock``: the leader's log-time stamps;
* ``watch``: the watch history and subscribers;
* ``http/``: the HTTP front (admin endpoint, HTTP API, OpenAPI, dashboard).
"""

from .housekeeping import LOG_TIME_REFRESH
from .log_clock import LogClock
from .node import NodeServer, ServerHooks, run_node
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
