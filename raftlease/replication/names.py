"""Peer host names resolved off the tick thread.

PySyncObj resolves a peer's host name on its tick thread, each time it dials, through
a cache that keeps an answer for 10 minutes (``dnsCacheTime`` 600 s). Both are wrong
for names that move: a Kubernetes pod or a container that restarts comes back at a
new address, and its peers would dial the old one for ten minutes; and a lookup that
waits for a slow or unreachable DNS server stalls the tick thread (heartbeats, the
leader lease) for the resolver's whole timeout.

``NameCache`` answers at once from what it knows and refreshes in the background: a
name older than ``ttl`` seconds is looked up again by a short-lived daemon thread (one
per name at a time); until a name has resolved once, the dial is skipped (PySyncObj
dials again after ``connection_retry``). An address that is already an IP literal is
used as it is. A failed lookup keeps the last good answer and is logged once per
failure spell.

Threads: ``ip`` is called on the tick thread and never blocks; lookups run on their
own daemon threads; the cache is a dict whose entries are replaced whole (safe under
the GIL).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time

log = logging.getLogger("raftlease.replication")

#: Seconds a resolved address is used before it is looked up again (in the
#: background; the old answer serves meanwhile).
NAME_TTL = 5.0


class NameCache:
    def __init__(self, ttl: float = NAME_TTL) -> None:
        self.ttl = ttl
        self._known: dict[str, tuple[str, float]] = {}  # name -> (ip, when resolved)
        self._pending: set[str] = set()
        self._failing: set[str] = set()
        self._lock = threading.Lock()

    def ip(self, host: str) -> str | None:
        """The address to dial for ``host`` now (None: not resolved yet)."""
        try:
            ipaddress.ip_address(host)
            return host
        except ValueError:
            pass
        known = self._known.get(host)
        if known is None or time.monotonic() - known[1] > self.ttl:
            self._refresh(host)
        return known[0] if known is not None else None

    def _refresh(self, host: str) -> None:
        with self._lock:
            if host in self._pending:
                return
            self._pending.add(host)
        thread = threading.Thread(
            target=self._lookup, args=(host,), name=f"resolve {host}", daemon=True
        )
        thread.start()

    def _lookup(self, host: str) -> None:
        try:
            try:
                infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            except (OSError, UnicodeError) as exc:
                if host not in self._failing:
                    self._failing.add(host)
                    log.warning("cannot resolve peer host %s (%s): dialling it waits", host, exc)
                return
            # IPv4 first, as PySyncObj prefers; the first answer of a family, so the
            # same name dials the same address until it changes.
            addrs = [str(info[4][0]) for info in infos if info[0] == socket.AF_INET]
            addrs = addrs or [str(info[4][0]) for info in infos]
            if not addrs:
                return
            old = self._known.get(host)
            self._known[host] = (str(addrs[0]), time.monotonic())
            if host in self._failing:
                self._failing.discard(host)
                log.info("peer host %s resolves again (%s)", host, addrs[0])
            elif old is not None and old[0] != addrs[0]:
                log.info("peer host %s moved: %s -> %s", host, old[0], addrs[0])
        finally:
            with self._lock:
                self._pending.discard(host)


#: The one cache of a node process (every peer's name).
names = NameCache()
