"""The chaos workload: concurrent lease clients, a fenced resource and the history.

* ``History`` records every event as one JSON line. Times are ``time.monotonic()``
  (CLOCK_MONOTONIC, one clock for every thread and every process on the machine), so
  the harness, its client threads and the separate client process share one reference.
* ``FencedStore`` is the resource the leases protect: per key it keeps a value, fenced
  by ``raftlease.FencedResource`` (refuses a token below the highest accepted) and, for
  a write, by the cluster's own answer (``Client.fence``: is this token the current
  holder's?). Every access (accepted or refused, and by whom) goes into the history.
  ``FencedStoreServer`` puts it on a 127.0.0.1 port for the client process.
* ``Worker`` is one client: it acquires, renews, releases and reads a small key set
  with short TTLs and, while it trusts its lease, does a fenced read-modify-write of
  the key's value. Each operation is recorded as ``invoke`` then ``ok``, ``fail`` (only
  when the error is definite: ``err.definite``) or ``info`` (outcome unknown).
  Sometimes it takes units of a *shared* key (a semaphore or pool: ``capacity`` and
  ``units`` go into the acquire's invoke value) and renews and releases it the same
  way, but makes no fenced accesses under it: several holders at once are the point.
* A ``Worker`` with ``session_ttl`` holds its plain-key leases through a lease session
  (``client.session``): it opens one when it has none (again after one is lost),
  acquires attached to it (invoke value ``session``: the session id prefix; ok value
  ``valid_until``: the session's at that moment), never renews them and uses them while
  the session's window lasts. The session's background keep-alive cannot be hooked, so
  the worker polls ``session.valid_until`` before every use and records each increase
  as a ``keepalive`` event (``process``, ``session``, ``valid_until``, ``t`` = when it
  was observed); it trusts a lease only up to the largest value it has recorded, so
  the checkers' window is never shorter than the client's.

Threads: ``History`` and ``FencedStore`` are thread-safe. A ``Worker`` runs in its own
thread (``WorkerThread``) or as the main loop of ``proc_client.py``; it stops at
``stop`` or ``end`` and each call is bounded by the client deadline.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import secure

from raftlease import Client, FencedResource, Lease, Session, StaleTokenError
from raftlease.errors import RaftLeaseError

Event = dict[str, Any]

#: Codes the state machine itself answers: their arrival proves the log made progress.
DOMAIN_CODES = frozenset({"LEASE_HELD", "NOT_OWNER", "LEASE_NOT_FOUND"})


class History:
    """Append-only event log, mirrored line by line to ``path`` (crash-safe)."""

    def __init__(self, path: Path | None = None) -> None:
        self._lock = threading.Lock()
        self.events: list[Event] = []
        self.counts: dict[str, int] = {"invoke": 0, "ok": 0, "fail": 0, "info": 0}
        self.last_progress = time.monotonic()
        self._file = open(path, "w", buffering=1) if path else None  # noqa: SIM115

    def append(self, event: Event) -> Event:
        event.setdefault("t", time.monotonic())
        with self._lock:
            event["i"] = len(self.events)
            self.events.append(event)
            kind = event.get("type")
            if kind in self.counts:
                self.counts[kind] += 1
            if kind == "ok" or (kind == "fail" and event.get("error") in DOMAIN_CODES):
                self.last_progress = max(self.last_progress, event["t"])
            if self._file is not None:
                self._file.write(json.dumps(event, sort_keys=True) + "\n")
        return event

    def snapshot(self) -> list[Event]:
        with self._lock:
            return list(self.events)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class Store(Protocol):
    def access(
        self,
        process: str,
        key: str,
        token: int,
        f: str,
        value: int | None = None,
        for_write: bool = False,
    ) -> tuple[bool, int]: ...


#: Asks the cluster whether ``token`` is the current holder's of ``key``
#: (``raftlease.Client.fence``); raises ``RaftLeaseError`` when it cannot tell.
ClusterFence = Callable[[str, int], bool]


class FencedStore:
    """A fenced resource: per key a value, fenced by raftlease itself.

    Every access goes through ``raftlease.FencedResource`` (the library's fence: it
    refuses a token below the highest it has accepted for the key, and an accepted
    access raises that mark). A write also asks the cluster first (``cluster``:
    ``Client.fence(key, token)``) and is refused unless the cluster answers that the
    token is the current holder's. So what the resource accepts is decided by
    raftlease's answers, and the history records them: a raftlease that handed out a
    repeated or lower token, or called a replaced holder current, shows up in the
    checker's fencing rules, not only a bug in this class. Reads ask only the local
    fence (a cluster call per read would double the load; a stale read changes
    nothing, and the write of a read-modify-write is the one that asks).

    Accesses to one key are serialized (one lock per key, held across the cluster
    call, so no other access to the key comes between the answer and the write). A
    write records the value it replaced, so the checker can spot a lost update; the
    event records ``refused_by`` (``"cluster"`` or ``"resource"``) and the cluster's
    answer (``cluster``: ``inv``, ``ret``, ``current`` or ``error``). Returns
    ``(accepted, value after)``. ``for_write`` marks the read of a read-modify-write.
    """

    def __init__(self, history: History, cluster: ClusterFence | None = None) -> None:
        self.history = history
        self.cluster = cluster
        self.fence = FencedResource()
        self._locks_lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self.values: dict[str, int] = {}

    @property
    def max_token(self) -> dict[str, int]:
        return dict(self.fence.highest)

    def _lock(self, key: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(key, threading.Lock())

    def access(
        self,
        process: str,
        key: str,
        token: int,
        f: str,
        value: int | None = None,
        for_write: bool = False,
    ) -> tuple[bool, int]:
        with self._lock(key):
            answer: dict[str, Any] | None = None
            refused_by: str | None = None
            if f == "write" and self.cluster is not None:
                answer = {"inv": time.monotonic()}
                try:
                    answer["current"] = bool(self.cluster(key, token))
                except RaftLeaseError as err:
                    answer["error"] = err.code
                except Exception as exc:  # the cluster could not tell: refuse
                    answer["error"] = type(exc).__name__
                answer["ret"] = time.monotonic()
                if answer.get("current") is not True:
                    refused_by = "cluster"
            highest = max(self.fence.highest.get(key, 0), 0)
            before = self.values.get(key, 0)
            if refused_by is None:
                try:
                    self.fence.check(key, token)
                except StaleTokenError:
                    refused_by = "resource"
            accepted = refused_by is None
            if accepted and f == "write" and value is not None:
                self.values[key] = value
            after = self.values.get(key, 0)
            event: Event = {
                "type": "fenced",
                "f": f,
                "process": process,
                "key": key,
                "token": token,
                "accepted": accepted,
                "highest": highest,
                "before": before,
                "value": value,
                "after": after,
                "for_write": for_write or f == "write",
            }
            if refused_by is not None:
                event["refused_by"] = refused_by
            if answer is not None:
                event["cluster"] = answer
            self.history.append(event)
            return accepted, after


class FencedStoreServer:
    """``FencedStore`` on a TCP port of 127.0.0.1: one JSON request per line,
    ``{"process","key","token","f","value"}`` -> ``{"accepted","value"}``."""

    def __init__(self, store: FencedStore, port: int) -> None:
        outer = store

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for line in self.rfile:
                    req = json.loads(line)
                    accepted, value = outer.access(
                        req["process"],
                        req["key"],
                        int(req["token"]),
                        req["f"],
                        req.get("value"),
                        bool(req.get("for_write")),
                    )
                    self.wfile.write(
                        (json.dumps({"accepted": accepted, "value": value}) + "\n").encode()
                    )

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
        )

    def start(self) -> FencedStoreServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


class RemoteStore:
    """Client of ``FencedStoreServer`` (used by the client process)."""

    def __init__(self, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        self._sock = socket.create_connection((host, int(port)), timeout=10)
        self._file = self._sock.makefile("rwb")

    def access(
        self,
        process: str,
        key: str,
        token: int,
        f: str,
        value: int | None = None,
        for_write: bool = False,
    ) -> tuple[bool, int]:
        req = {
            "process": process,
            "key": key,
            "token": token,
            "f": f,
            "value": value,
            "for_write": for_write,
        }
        self._file.write((json.dumps(req) + "\n").encode())
        self._file.flush()
        reply = json.loads(self._file.readline())
        return bool(reply["accepted"]), int(reply["value"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
            self._sock.close()


@dataclass(frozen=True)
class WorkloadConfig:
    keys: tuple[str, ...] = ("k1", "k2", "k3", "k4")
    #: Shared keys: ``(key, capacity, units to draw from)``. A semaphore of 2 (one unit
    #: each) and a pool of 3 (one or two units), so holders overlap and keys fill up.
    shared_keys: tuple[tuple[str, int, tuple[int, ...]], ...] = (
        ("sem1", 2, (1,)),
        ("pool1", 3, (1, 1, 2)),
    )
    #: Chance that a step without a lease targets a shared key instead of a plain one.
    shared_share: float = 0.25
    ttls: tuple[float, ...] = (1.0, 1.5, 2.0)
    deadlines: tuple[float, ...] = (1.5, 3.0, 4.0)
    attempt_timeout: float = 1.0
    clock_drift: float = 0.01
    margin: float = 0.05
    think: tuple[float, float] = (0.01, 0.12)
    #: Read modes drawn for holder reads (``linearizable`` may be served by the leader
    #: lease, ``log`` always goes through the Raft log).
    read_modes: tuple[str, ...] = ("linearizable", "linearizable", "log")
    max_ops: int = 100_000
    #: How many of the client threads hold their plain-key leases through a lease
    #: session (attached leases, kept alive by the session, never renewed) instead of
    #: a TTL of their own; and the sessions' TTL.
    session_workers: int = 2
    session_ttl: float = 1.5

    @property
    def capacities(self) -> dict[str, int]:
        return {key: capacity for key, capacity, _ in self.shared_keys}


def short(lease_id: str) -> str:
    return lease_id[:8]


class Worker:
    """One lease client. ``emit`` records an event; ``store`` is the fenced resource.

    ``pause_window`` > 0 makes the worker announce (``marker`` event) each fenced
    write it is about to do and wait that long first, without re-checking its lease:
    the moment a stop-the-world pause (SIGSTOP, GC) hurts most. The nemesis stops the
    client process in that window; the fenced resource must then refuse the write.
    """

    def __init__(
        self,
        name: str,
        client: Client,
        store: Store,
        emit: Callable[[Event], Any],
        config: WorkloadConfig,
        seed: int,
        pause_window: float = 0.0,
        session_ttl: float | None = None,
    ) -> None:
        self.name = name
        self.client = client
        self.store = store
        self.emit = emit
        self.config = config
        self.rng = random.Random(seed)
        self.pause_window = pause_window
        self.lease: Lease | None = None
        self.ops = 0
        self.has_read = hasattr(client, "read")
        #: Lease session of a session worker (``session_ttl`` set), the largest
        #: ``valid_until`` of it recorded so far, and an attached lease whose release
        #: is still to be confirmed (retried, so it does not stay held by the session).
        self.session_ttl = session_ttl
        self.session: Session | None = None
        self.session_seen = 0.0
        self.unreleased: Lease | None = None

    # ------------------------------------------------------------ recording

    def _op(self, f: str, key: str, value: dict[str, Any], call: Callable[[], Any]) -> Any:
        """Run one client call, recording invoke and completion. Returns the call's
        result, or the ``RaftLeaseError`` it raised."""
        self.ops += 1
        op = f"{self.name}:{self.ops}"
        base = {"op": op, "process": self.name, "f": f, "key": key}
        self.emit({**base, "type": "invoke", "value": value, "t": time.monotonic()})
        try:
            result = call()
        except RaftLeaseError as err:
            done: dict[str, Any] = {
                **base,
                "type": "fail" if err.definite else "info",
                "error": err.code,
                "message": err.message[:200],
                "t": time.monotonic(),
            }
            detail = {k: v for k, v in err.detail.items() if k in ("owner", "token")}
            if detail:
                done["detail"] = detail
            self.emit(done)
            return err
        except Exception as exc:  # a client bug: unknown outcome, keep going
            self.emit({**base, "type": "info", "error": type(exc).__name__, "t": time.monotonic()})
            return exc
        self.emit({**base, "type": "ok", "value": self._describe(f, result), "t": time.monotonic()})
        return result

    @staticmethod
    def _describe(f: str, result: Any) -> dict[str, Any]:
        if isinstance(result, Lease):
            out: dict[str, Any] = {
                "token": result.token,
                "owner": result.owner,
                "lease": short(result.lease_id),
                "ttl": result.ttl,
                # An attached lease: the session's window at this moment.
                "valid_until": result.trusted_until,
                "expires_at_ms": result.expires_at_ms,
            }
            if result.session is not None:
                out["session"] = short(result.session.session_id)
            return out
        if f == "read":
            holder = getattr(result, "holder", result)
            out = {"holder": None}
            if holder is not None:
                out["holder"] = {"owner": holder.owner, "token": holder.token}
            for name in ("consistency", "served_by"):
                if hasattr(result, name):
                    out[name] = getattr(result, name)
            if getattr(result, "capacity", 1) > 1:  # a shared key: every holder
                out["capacity"] = result.capacity
                out["used"] = result.used
                out["holders"] = [
                    {"owner": h.owner, "token": h.token, "units": h.units} for h in result.holders
                ]
            return out
        return {}

    # ------------------------------------------------------------------ ops

    def step(self) -> None:
        """One workload step: a call plus, when holding, a fenced access."""
        cfg, rng = self.config, self.rng
        timeout = rng.choice(cfg.deadlines)
        if self.session_ttl is not None:
            if not self._session_ready(timeout):
                return
            if self.unreleased is not None:
                self._retry_release(timeout)
                return
        lease = self.lease
        if lease is not None and not self._trusted(lease):
            self._forget()  # lapsed on our clock: never trust it again
            lease = None
        if lease is None:
            shared = bool(cfg.shared_keys) and rng.random() < cfg.shared_share
            if shared:
                key, capacity, choices = rng.choice(cfg.shared_keys)
                units = rng.choice(choices)
            else:
                key, capacity, units = rng.choice(cfg.keys), 1, 1
            if rng.random() < 0.3:
                self._read(key, timeout)
                return
            session = None if shared else self.session
            if session is not None:
                # Attached to the session: no TTL of its own (plain keys only).
                result = self._op(
                    "acquire",
                    key,
                    {"owner": self.name, "session": short(session.session_id)},
                    lambda: session.acquire(key, timeout=timeout),
                )
            else:
                ttl = rng.choice(cfg.ttls)
                args: dict[str, Any] = {"ttl": ttl, "owner": self.name}
                if shared:
                    args.update(capacity=capacity, units=units)
                result = self._op(
                    "acquire",
                    key,
                    args,
                    lambda: self.client.acquire(
                        key,
                        owner=self.name,
                        ttl=ttl,
                        capacity=capacity,
                        units=units,
                        timeout=timeout,
                    ),
                )
            if isinstance(result, Lease):
                self.lease = result
                if not shared:
                    self._fenced(result, write=False)
            return
        roll = rng.random()
        ident = {"token": lease.token, "lease": short(lease.lease_id)}
        if roll < 0.45:
            # No fenced access under a shared key: its holders share it by design, so
            # the store's one-writer-at-a-time rules do not apply (just hold it).
            if lease.key not in cfg.capacities:
                self._fenced(lease, write=True)
        elif roll < 0.8:
            if lease.session is not None:
                # Attached: the session's keep-alive keeps it (renewing it is
                # refused); just keep using it.
                self._fenced(lease, write=False)
                return
            renewed = self._op(
                "renew", lease.key, ident, lambda: self.client.renew(lease, timeout=timeout)
            )
            if isinstance(renewed, Lease):
                self.lease = renewed
            elif isinstance(renewed, RaftLeaseError) and renewed.definite:
                self.lease = None  # refused: it is gone (or someone else's now)
        else:
            # Stop trusting the lease before asking to release it, whatever the answer.
            self.lease = None
            self._release(lease, timeout)

    def _release(self, lease: Lease, timeout: float) -> None:
        ident = {"token": lease.token, "lease": short(lease.lease_id)}
        result = self._op(
            "release", lease.key, ident, lambda: self.client.release(lease, timeout=timeout)
        )
        if lease.session is not None:
            # An attached lease not certainly released would stay held as long as the
            # session lives: retry until the cluster answers.
            done = result is None or (
                isinstance(result, RaftLeaseError) and result.code in DOMAIN_CODES
            )
            self.unreleased = None if done else lease

    def _retry_release(self, timeout: float) -> None:
        lease, session = self.unreleased, self.session
        assert lease is not None and lease.session is not None
        if session is None or lease.session.session_id != session.session_id:
            self.unreleased = None  # its session was lost: the lease went with it
            return
        self._release(lease, timeout)

    def _forget(self) -> None:
        """Stop trusting the current lease. An attached one is also released (else the
        session would keep it alive)."""
        lease, self.lease = self.lease, None
        if lease is not None and lease.session is not None:
            self.unreleased = lease

    # ------------------------------------------------------------- sessions

    def _session_ready(self, timeout: float) -> bool:
        """A session worker's session: the current one (its keep-alive polled), or a
        new one if it has none or it was lost. False if none could be opened."""
        session = self.session
        if session is not None:
            if not session.lost.is_set():
                self._poll_session()
                return True
            self.emit(
                {
                    "type": "session",
                    "f": "lost",
                    "process": self.name,
                    "session": short(session.session_id),
                    "reason": str(session.lost_reason)[:200],
                    "t": time.monotonic(),
                }
            )
            self.session = None
            if self.lease is not None and self.lease.session is not None:
                self.lease = None  # gone with its session
        assert self.session_ttl is not None
        session = self.client.session(owner=self.name, ttl=self.session_ttl)
        try:
            session.open(timeout=timeout)
        except RaftLeaseError as err:
            self.emit(
                {
                    "type": "session",
                    "f": "open-failed",
                    "process": self.name,
                    "error": err.code,
                    "t": time.monotonic(),
                }
            )
            return False
        self.session, self.session_seen = session, 0.0
        self.emit(
            {
                "type": "session",
                "f": "open",
                "process": self.name,
                "session": short(session.session_id),
                "ttl": self.session_ttl,
                "t": time.monotonic(),
            }
        )
        self._poll_session()
        return True

    def _poll_session(self) -> None:
        """Record the session's ``valid_until`` if it grew since last seen (its
        keep-alive ran): a ``keepalive`` event at the time it was observed."""
        session = self.session
        if session is None:
            return
        seen = session.valid_until
        if seen > self.session_seen:
            self.session_seen = seen
            self.emit(
                {
                    "type": "keepalive",
                    "process": self.name,
                    "session": short(session.session_id),
                    "valid_until": seen,
                    "t": time.monotonic(),
                }
            )

    def _trusted(self, lease: Lease) -> bool:
        """Whether to trust ``lease`` now. An attached lease: only while its session is
        the current one and up to the largest ``valid_until`` recorded (polled first)."""
        if lease.session is None:
            return lease.valid
        session = self.session
        if session is None or lease.session.session_id != session.session_id:
            return False
        self._poll_session()
        return lease.valid and time.monotonic() < self.session_seen

    def _read(self, key: str, timeout: float) -> None:
        if self.has_read:
            mode = self.rng.choice(self.config.read_modes)
            self._op(
                "read",
                key,
                {"consistency": mode},
                lambda: self.client.read(key, consistency=mode, timeout=timeout),
            )
        else:
            self._op("read", key, {}, lambda: self.client.holder(key, timeout=timeout))

    def _fenced(self, lease: Lease, write: bool) -> None:
        """A fenced read, or a read-modify-write, of the key's value under ``lease``."""
        if write and self.pause_window > 0:
            self.emit(
                {
                    "type": "marker",
                    "f": "about-to-write",
                    "process": self.name,
                    "key": lease.key,
                    "token": lease.token,
                    "t": time.monotonic(),
                }
            )
            time.sleep(self.pause_window)
        elif not self._trusted(lease):
            self._forget()
            return
        ok, value = self.store.access(self.name, lease.key, lease.token, "read", for_write=write)
        if not ok:
            self._forget()  # fenced off: a newer holder exists
            return
        if write:
            ok, _ = self.store.access(self.name, lease.key, lease.token, "write", value + 1)
            if not ok:
                self._forget()

    def run(self, stop: threading.Event, end: float) -> None:
        low, high = self.config.think
        while not stop.is_set() and time.monotonic() < end and self.ops < self.config.max_ops:
            self.step()
            stop.wait(self.rng.uniform(low, high))


class WorkerThread(threading.Thread):
    """A ``Worker`` on its own thread with its own ``raftlease.Client``."""

    def __init__(
        self,
        name: str,
        endpoints: Sequence[str],
        store: Store,
        history: History,
        config: WorkloadConfig,
        seed: int,
        stop: threading.Event,
        end: float,
        session_ttl: float | None = None,
    ) -> None:
        super().__init__(name=f"worker-{name}", daemon=True)
        self.worker_name = name
        self.endpoints = list(endpoints)
        self.store = store
        self.history = history
        self.config = config
        self.seed = seed
        self.stop_event = stop
        self.end = end
        self.session_ttl = session_ttl
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(
                self.endpoints,
                deadline=max(self.config.deadlines),
                attempt_timeout=self.config.attempt_timeout,
                clock_drift=self.config.clock_drift,
                margin=self.config.margin,
                **secure.client_options("lease-worker"),
            ) as client:
                Worker(
                    self.worker_name,
                    client,
                    self.store,
                    self.history.append,
                    self.config,
                    self.seed,
                    session_ttl=self.session_ttl,
                ).run(self.stop_event, self.end)
        except BaseException as exc:  # reported by the harness
            self.error = exc
