"""What ``raftlease status`` shows of one node (the ``status`` operation, the admin
endpoint's ``/status``, the dashboard's cluster view): its role, term and indexes,
the leader it knows, its state's size, its limits in use, its security and its
leader-lease and durability state; a short form while it waits out an unclean stop.

Threads: the node's event loop; reads memory only (what the tick thread changes is
read one value at a time).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .. import gc_pauses
from .._version import __version__
from ..clock import Clock
from ..config import NodeConfig
from ..core.snapshot import ENTRY_FORMAT, SNAPSHOT_VERSION
from ..replication import Replica
from ..replication.snapshot_rows import SNAPSHOT_CONTAINER
from .auth import AuthPolicy
from .keepalive import MemoryKeepalives
from .overload import LoopLag
from .restart import LastStop


class NodeStatus:
    """The status of one node. Owned by ``NodeServer``, which hands it what it reads:
    ``replica`` (None while the node starts), ``require_replica`` (raises
    ``UnavailableError`` then), the long-polls parked, the unauthenticated client
    connections, whether lease reads are allowed (reads.py), the keep-alives answered
    from memory (None before the proposer exists), the auth policy in force, how the
    last run ended and until when (monotonic) the node waits out an unclean stop."""

    def __init__(
        self,
        config: NodeConfig,
        clock: Clock,
        *,
        replica: Callable[[], Replica | None],
        require_replica: Callable[[], Replica],
        long_polls: Callable[[], int],
        unauthenticated: Callable[[], int],
        lease_reads: Callable[[], bool],
        keepalives: Callable[[], MemoryKeepalives | None],
        auth: Callable[[], AuthPolicy | None],
        last_stop: Callable[[], LastStop],
        recovering_until: Callable[[], float | None],
        overload: LoopLag | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self._replica = replica
        self._require_replica = require_replica
        self._long_polls = long_polls
        self._unauthenticated = unauthenticated
        self._lease_reads = lease_reads
        self._keepalives = keepalives
        self._overload = overload
        self._auth = auth
        self._last_stop = last_stop
        self._recovering_until = recovering_until

    def status(self) -> dict[str, Any]:
        """This node's status (``raftlease status``, ``/status``). Raises
        ``UnavailableError`` while the node starts (not while it waits out an unclean
        stop: it then says so)."""
        if self._replica() is None and self._recovering_until() is not None:
            return self._recovering_status()
        replica = self._require_replica()
        leader = replica.leader_raft_addr()
        store = replica.store
        return {
            "node": self.config.node_id,
            "client": self.config.self_node.client,
            "raft": self.config.self_node.raft,
            # Where its dashboard is (the live view links other nodes' pages by it).
            "admin": self.config.admin_address or None,
            "role": replica.role(),
            "term": replica.term(),
            "commit_index": replica.commit_index(),
            "applied_index": replica.last_applied(),
            "last_log_index": replica.last_log_index(),
            "leader": replica.membership.client_for_raft(leader) if leader else None,
            "ready": replica.is_ready(),
            # Snapshot and journal loaded at start (until then the node answers
            # nothing from its state: UNAVAILABLE).
            "restored": replica.restored(),
            "log_time": store.now,
            "revision": store.revision,
            "leases": len(store.leases),
            # Client ids in the dedup table; "sessions" is their old name, kept for
            # compatibility (lease sessions are "lease_sessions").
            "clients": len(store.clients),
            "sessions": len(store.clients),
            "lease_sessions": len(store.lease_sessions),
            # Long-polls parked on this node now (max_long_polls_per_node), and client
            # connections not authenticated (all of them without an auth file).
            "long_polls": self._long_polls(),
            "unauthenticated_connections": self._unauthenticated(),
            "version": __version__,
            # What this build applies (docs/membership.md, "Rolling upgrades").
            "formats": {
                "entry": ENTRY_FORMAT,
                "snapshot": SNAPSHOT_VERSION,
                "snapshot_container": SNAPSHOT_CONTAINER,
            },
            "connected_peers": replica.connected_peers(),
            "lease_reads": self._lease_reads(),
            "keepalives": self.config.keepalives,
            **self._keepalive_counts(),
            "clock_rate": getattr(self.clock, "rate", 1.0),
            # Full collections scan only what was promoted since (gc_pauses.py); None:
            # gc_unfreeze_interval = 0, CPython's default collector.
            "gc_freeze": freezer.describe() if (freezer := gc_pauses.current()) else None,
            # The GIL's switch interval in effect (switch_interval; Python's is 0.005).
            "switch_interval": sys.getswitchinterval(),
            **self._overload_status(),
            "token_ceiling": store.ceiling,
            # The lease certificate verification keys, [kid, public hex], oldest
            # first (docs/certificates.md; ``raftlease cert-keys``).
            "cert_keys": store.cert_keys.public_keys(),
            # The audit trail's chain value and next sequence number (docs/audit.md):
            # equal on every node at the same applied index.
            "audit_head": store.audit.head,
            "audit_seq": store.audit.seq,
            "client_tls": bool(self.config.tls_cert_file),
            "client_auth": self._auth() is not None,
            "insecure": self.config.insecure,
            # This member's peer certificate (serial, expiry) and the CA and
            # revocation counts in force: what a SIGHUP reload took.
            "peer_tls": replica.peer_tls.describe() if replica.peer_tls else None,
            "last_stop": self._last_stop().value,
            **replica.durability_status(),
            **replica.election_status(),
            **replica.guard.snapshot(),
        }

    def _overload_status(self) -> dict[str, Any]:
        """The event loop's lag (ms, median of the last second), whether the node
        refuses new lease sessions for it, and how many it refused since start
        (server/overload.py)."""
        over = self._overload
        if over is None:
            return {"loop_lag_ms": 0.0, "overloaded": False, "overload_refused": 0}
        return {
            "loop_lag_ms": round(over.lag * 1000, 1),
            "overloaded": over.overloaded,
            "overload_refused": over.refused,
        }

    def _keepalive_counts(self) -> dict[str, int]:
        """Keep-alives answered from memory since start, pairs of them written by
        ``extend`` entries, and those not written yet (server/keepalive.py)."""
        keep = self._keepalives()
        if keep is None:
            return {"keepalives_in_memory": 0, "keepalives_written": 0, "keepalives_pending": 0}
        return {
            "keepalives_in_memory": keep.answered,
            "keepalives_written": keep.written,
            "keepalives_pending": len(keep),
        }

    def _recovering_status(self) -> dict[str, Any]:
        until = self._recovering_until()
        assert until is not None
        return {
            "node": self.config.node_id,
            "client": self.config.self_node.client,
            "raft": self.config.self_node.raft,
            "admin": self.config.admin_address or None,
            "role": "recovering",
            "ready": False,
            "leader": None,
            "version": __version__,
            "durability": self.config.durability,
            "last_stop": self._last_stop().value,
            "recovering_for": max(0.0, until - self.clock.monotonic()),
        }
