"""Clients that give up (issue 37): waiting acquires that are cancelled, and the reads
that show whether a withdrawn waiter was granted anyway.

A ``Canceller`` runs one asyncio client on its own thread, on keys of its own
(``CancelConfig.keys``: no other worker uses them, so the lease checkers, which know
nothing of these waits, never see their holders). Its coroutines share the client:

* one holder per key that keeps it busy (acquire with a wait, hold 0.2-1.5 s,
  release), so that most waits really queue, and a release hands the key to the next
  waiter;
* a waiter that, a bounded number of times (``attempts``) until ``stop``, asks for a
  key with a wait under an owner nobody else ever uses (``<process>-w<n>``), and gives
  up after a random patience by cancelling the call. A cancelled call withdraws its
  waiter (``raftlease.client.aio``); whether the cluster acknowledged the withdrawal is
  taken from the client's withdrawal step (``AsyncClient._withdraw_until``, wrapped
  here: a chaos harness may look inside). A call that ends by itself (granted, the wait
  over, an unknown outcome) is recorded as it ended; a grant is released at once.
  After every attempt that was not granted it reads the key's holder and queue in
  one operation (``cancel-read``).

Events (ops: ``invoke`` then ``ok``/``fail``/``info`` paired by ``op``, as workload.py):

* ``f: "wait-acquire"``, invoke value ``{"owner", "wait", "patience"}``; ``ok`` value
  ``{"token", "owner"}`` (granted before the patience ran out); otherwise ``info``
  (``error`` ``CANCELLED`` or an indefinite code) or ``fail`` (a definite code, e.g.
  ``LEASE_HELD``: the wait ended), each with value ``{"withdrawn": bool}``: True when
  a withdrawal was sent and the cluster answered it before the call returned;
* ``f: "cancel-release"``: the release of a grant (value ``{"token"}``);
* ``f: "cancel-read"``: ``ok`` value ``{"holders": [owner...], "waiters": [owner...]}``.

``cancel_checker.check_withdrawn`` judges them: no grant to (and no place in the queue
for) a waiter whose client withdrew before the read began.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from raftlease import AsyncClient
from raftlease.errors import RaftLeaseError

Event = dict[str, Any]


@dataclass(frozen=True)
class CancelConfig:
    keys: tuple[str, ...] = ("x1", "x2")
    #: How long each wait may last, and after how long the client gives up.
    waits: tuple[float, ...] = (1.0, 2.0, 4.0)
    patience: tuple[float, float] = (0.02, 1.5)
    #: The holder's lease TTL and how long it keeps a key.
    ttl: float = 2.0
    hold: tuple[float, float] = (0.2, 1.5)
    #: Bounds: waiting acquires in all, and seconds per read.
    attempts: int = 400
    read_timeout: float = 4.0

    def meta(self) -> dict[str, Any]:
        return {"keys": list(self.keys), "attempts": self.attempts, "waits": list(self.waits)}


class Canceller(threading.Thread):
    """The cancelling client (module docstring). ``errors``: what stopped it early."""

    def __init__(
        self,
        name: str,
        make_client: Callable[[], AsyncClient],
        emit: Callable[[Event], Any],
        config: CancelConfig,
        seed: int,
        stop: threading.Event,
    ) -> None:
        super().__init__(name=f"cancel-{name}", daemon=True)
        self.process = name
        self.make_client = make_client
        self.emit = emit
        self.config = config
        self.rng = random.Random(seed)
        self.stop_event = stop
        self.ops = 0
        self.attempts = 0
        self.errors: list[str] = []
        #: What each withdrawal of the current attempt came to (True: answered).
        self._withdrawals: list[bool] = []

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by the harness
            self.errors.append(f"{self.process}: {exc!r}")

    async def _main(self) -> None:
        client = self.make_client()
        withdraw = client._withdraw_until

        async def recorded(send: Callable[[float], Awaitable[object]], until: float) -> bool:
            answered = await withdraw(send, until)
            self._withdrawals.append(answered)
            return answered

        client._withdraw_until = recorded  # type: ignore[method-assign]
        # One holder per key, so that most waits really queue behind a holder.
        holders = [asyncio.create_task(self._hold(client, key)) for key in self.config.keys]
        try:
            while not self.stop_event.is_set() and self.attempts < self.config.attempts:
                await self._attempt(client)
        finally:
            for holder in holders:
                holder.cancel()
            for holder in holders:
                with contextlib.suppress(asyncio.CancelledError, RaftLeaseError):
                    await holder
            await client.close()

    def _record(self, base: Event, kind: str, **fields: Any) -> None:
        self.emit({**base, "type": kind, "t": time.monotonic(), **fields})

    def _base(self, f: str, key: str) -> Event:
        self.ops += 1
        return {"op": f"{self.process}:{self.ops}", "process": self.process, "f": f, "key": key}

    async def _hold(self, client: AsyncClient, key: str) -> None:
        cfg, rng = self.config, random.Random(self.rng.random())
        owner = f"{self.process}-holder"
        while not self.stop_event.is_set():
            try:
                lease = await client.acquire(key, owner=owner, ttl=cfg.ttl, wait=cfg.ttl)
                await asyncio.sleep(rng.uniform(*cfg.hold))
                await client.release(lease)
            except RaftLeaseError:
                await asyncio.sleep(0.1)

    async def _attempt(self, client: AsyncClient) -> None:
        cfg, rng = self.config, self.rng
        self.attempts += 1
        key = rng.choice(cfg.keys)
        owner = f"{self.process}-w{self.attempts}"
        wait = rng.choice(cfg.waits)
        patience = rng.uniform(*cfg.patience)
        base = self._base("wait-acquire", key)
        self._withdrawals = []
        self._record(base, "invoke", value={"owner": owner, "wait": wait, "patience": patience})
        call = asyncio.create_task(client.acquire(key, owner=owner, ttl=cfg.ttl, wait=wait))
        done, _ = await asyncio.wait({call}, timeout=patience)
        if not done:
            call.cancel()
        try:
            lease = await call
        except asyncio.CancelledError:
            self._record(base, "info", error="CANCELLED", value=self._withdrawn())
        except RaftLeaseError as exc:
            kind = "fail" if exc.definite else "info"
            self._record(base, kind, error=exc.code, value=self._withdrawn())
        else:
            self._record(base, "ok", value={"token": lease.token, "owner": lease.owner})
            release = self._base("cancel-release", key)
            self._record(release, "invoke", value={"token": lease.token})
            try:
                await client.release(lease)
            except RaftLeaseError as exc:
                self._record(release, "fail" if exc.definite else "info", error=exc.code)
            else:
                self._record(release, "ok", value={})
            return
        await self._read(client, key)

    def _withdrawn(self) -> dict[str, Any]:
        answered = bool(self._withdrawals) and all(self._withdrawals)
        return {"withdrawn": answered}

    async def _read(self, client: AsyncClient, key: str) -> None:
        base = self._base("cancel-read", key)
        self._record(base, "invoke", value={})
        timeout = self.config.read_timeout
        try:
            holders = [h for h in await client.leases(key, timeout=timeout) if h.key == key]
            waiters = await client.waiters(key, timeout=timeout)
        except RaftLeaseError as exc:
            self._record(base, "fail" if exc.definite else "info", error=exc.code)
            return
        self._record(
            base,
            "ok",
            value={"holders": [h.owner for h in holders], "waiters": [w.owner for w in waiters]},
        )
