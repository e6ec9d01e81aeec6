"""Agents that take sets of keys (issue 40): ``acquire_many`` with a wait, single-key
acquires on the same keys, induced cycles of waits, and reads that show who holds what.

``ManyAgents`` (``run.py --many on``) runs one asyncio client on its own thread, on keys
of its own (``ManyConfig.keys`` and ``cycle_keys``, prefix ``m``: no other worker uses
them, so the lease checkers never see these holders). Its coroutines share the client:

* ``agents`` agents, each in a loop until ``stop``: three times in four a random set of
  2-3 keys, in random order, with ``acquire_many(wait=)``, else one key with
  ``acquire(wait=)``; each attempt under an owner of its own (``<process>-a<n>-<i>``), so a
  read that shows an owner shows that one attempt. A grant is held 0.05-0.4 s and
  released (``release_many`` for a set, ``release`` for a key).
* one cycler that induces a cycle of two waits on ``cycle_keys`` (``m5``, ``m6``) every
  round: owner X takes ``m5`` and owner Y ``m6`` (no wait), then X waits for ``m6`` while Y
  waits for ``m5`` (hold-and-wait across separate acquires). The state machine must
  refuse one of them ``DEADLOCK`` in the entry that closes the cycle; then both release
  what they hold.
* a yielder (cooperative preemption, ``yield_keys``) every 2-4 s: a holder takes a key
  (priority 0) and renews it every ``renew_every``; a waiter queues on it at priority
  ``yield_priority`` and asks it to yield (``request_yield``) within ``yield_deadline``.
  One holder in two honours the request (releases once a renewal answer carries it);
  the other ignores it and renews until the cluster ends its lease (a renewal refused).
* a reader that reads every live lease under ``m`` in one operation every 0.1-0.3 s.

Events (``invoke`` then ``ok``/``fail``/``info`` paired by ``op``, as workload.py):

* ``f: "many-acquire"``, invoke ``key`` (the first key) and value ``{"owner", "keys",
  "set", "wait", "ttl"}``; ``ok`` value ``{"tokens": {key: token}}``; ``fail`` (definite
  code) or ``info`` (unknown outcome) with ``error`` and, for ``DEADLOCK``, value
  ``{"cycle": [...]}`` (the refusal's detail);
* ``f: "many-release"``, value ``{"owner", "keys"}``;
* ``f: "many-read"``: ``ok`` value ``{"holders": [{"key", "owner", "token"}, ...]}``;
* ``f: "many-renew"``, value ``{"owner", "key", "token"}``; ``ok`` value
  ``{"yield_deadline_ms"}`` (log time, ``None`` until a request reached the holder: the
  holder's learning of it);
* ``f: "many-yield"``, value ``{"owner" (the asker), "key", "holder", "token" (the
  holder's), "deadline" (seconds), "priority", "honour"}``; ``ok`` value ``{"asked"}``.
  The waiter's acquire carries ``"priority"`` in its value; the holder's end is its
  ``many-release`` or its refused ``many-renew``.

``many_checker.check_many`` judges them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raftlease import AsyncClient
from raftlease.errors import RaftLeaseError
from raftlease.models import Lease, LeaseSet

Event = dict[str, Any]


@dataclass(frozen=True)
class ManyConfig:
    keys: tuple[str, ...] = ("m1", "m2", "m3", "m4")
    #: The keys of the induced cycles (only the cycler uses them).
    cycle_keys: tuple[str, str] = ("m5", "m6")
    agents: int = 4
    waits: tuple[float, ...] = (1.0, 2.0, 3.0)
    ttl: float = 2.0
    hold: tuple[float, float] = (0.05, 0.4)
    #: The cycler's holds last this long (so a wait's cycle is certain while it lasts).
    cycle_ttl: float = 4.0
    cycle_wait: float = 2.0
    read_every: tuple[float, float] = (0.1, 0.3)
    #: The keys of the yield rounds (only the yielder uses them).
    yield_keys: tuple[str, ...] = ("m7", "m8")
    yield_every: tuple[float, float] = (2.0, 4.0)
    yield_deadline: float = 0.8
    yield_priority: int = 5
    renew_every: float = 0.2
    #: Seconds per read or release call.
    call_timeout: float = 4.0

    def meta(self) -> dict[str, Any]:
        return {
            "keys": list(self.keys),
            "cycle_keys": list(self.cycle_keys),
            "agents": self.agents,
            "waits": list(self.waits),
            "yield_keys": list(self.yield_keys),
            "yield_deadline": self.yield_deadline,
        }


class ManyAgents(threading.Thread):
    """The set-taking agents (module docstring). ``errors``: what stopped it early."""

    def __init__(
        self,
        name: str,
        make_client: Callable[[], AsyncClient],
        emit: Callable[[Event], Any],
        config: ManyConfig,
        seed: int,
        stop: threading.Event,
    ) -> None:
        super().__init__(name=f"many-{name}", daemon=True)
        self.process = name
        self.make_client = make_client
        self.emit = emit
        self.config = config
        self.rng = random.Random(seed)
        self.stop_event = stop
        self.ops = 0
        self.errors: list[str] = []

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by the harness
            self.errors.append(f"{self.process}: {exc!r}")

    async def _main(self) -> None:
        client = self.make_client()
        tasks = [
            *(
                asyncio.create_task(self._agent(client, n, random.Random(self.rng.random())))
                for n in range(self.config.agents)
            ),
            asyncio.create_task(self._cycler(client, random.Random(self.rng.random()))),
            asyncio.create_task(self._reader(client, random.Random(self.rng.random()))),
            asyncio.create_task(self._yielder(client, random.Random(self.rng.random()))),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, RaftLeaseError):
                    await task
            await client.close()

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds`` or until ``stop`` (checked every 50 ms)."""
        end = time.monotonic() + seconds
        while not self.stop_event.is_set() and (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.05))

    def _base(self, f: str, key: str) -> Event:
        self.ops += 1
        return {"op": f"{self.process}:{self.ops}", "process": self.process, "f": f, "key": key}

    def _record(self, base: Event, kind: str, **fields: Any) -> None:
        self.emit({**base, "type": kind, "t": time.monotonic(), **fields})

    async def _acquire(
        self,
        client: AsyncClient,
        owner: str,
        keys: list[str],
        *,
        many: bool,
        wait: float,
        ttl: float,
        priority: int = 0,
    ) -> Lease | LeaseSet | None:
        """One recorded acquire; the grant, or None (refused, unknown: recorded)."""
        base = self._base("many-acquire", keys[0])
        value: dict[str, Any] = {"owner": owner, "keys": keys, "set": many, "wait": wait}
        value["ttl"] = ttl
        if priority:
            value["priority"] = priority
        self._record(base, "invoke", value=value)
        try:
            if many:
                got: Lease | LeaseSet = await client.acquire_many(
                    keys, owner=owner, ttl=ttl, wait=wait
                )
            else:
                got = await client.acquire(
                    keys[0], owner=owner, ttl=ttl, wait=wait, priority=priority
                )
        except RaftLeaseError as exc:
            extra: dict[str, Any] = {}
            if exc.code == "DEADLOCK":
                extra["value"] = {"cycle": exc.detail.get("cycle")}
            self._record(base, "fail" if exc.definite else "info", error=exc.code, **extra)
            return None
        tokens = got.tokens if isinstance(got, LeaseSet) else {got.key: got.token}
        self._record(base, "ok", value={"tokens": tokens})
        return got

    async def _release(self, client: AsyncClient, owner: str, got: Lease | LeaseSet) -> None:
        keys = [lease.key for lease in got.leases] if isinstance(got, LeaseSet) else [got.key]
        base = self._base("many-release", keys[0])
        self._record(base, "invoke", value={"owner": owner, "keys": keys})
        try:
            if isinstance(got, LeaseSet):
                await client.release_many(got, timeout=self.config.call_timeout)
            else:
                await client.release(got, timeout=self.config.call_timeout)
        except RaftLeaseError as exc:
            self._record(base, "fail" if exc.definite else "info", error=exc.code)
        else:
            self._record(base, "ok", value={})

    async def _agent(self, client: AsyncClient, n: int, rng: random.Random) -> None:
        cfg = self.config
        i = 0
        while not self.stop_event.is_set():
            i += 1
            many = rng.random() < 0.75
            keys = rng.sample(cfg.keys, rng.choice((2, 3))) if many else [rng.choice(cfg.keys)]
            owner = f"{self.process}-a{n}-{i}"
            got = await self._acquire(
                client, owner, keys, many=many, wait=rng.choice(cfg.waits), ttl=cfg.ttl
            )
            if got is None:
                await self._pause(rng.uniform(0.05, 0.2))
                continue
            await self._pause(rng.uniform(*cfg.hold))
            await self._release(client, owner, got)

    async def _cycler(self, client: AsyncClient, rng: random.Random) -> None:
        cfg = self.config
        first, second = cfg.cycle_keys
        r = 0
        while not self.stop_event.is_set():
            r += 1
            x, y = f"{self.process}-cx{r}", f"{self.process}-cy{r}"
            held_x = await self._acquire(client, x, [first], many=False, wait=0, ttl=cfg.cycle_ttl)
            held_y = await self._acquire(client, y, [second], many=False, wait=0, ttl=cfg.cycle_ttl)
            waits: tuple[object, ...] | list[object] = ()
            if held_x is not None and held_y is not None:
                # The refused waiter gives back what it holds, so the other is granted.
                async def wait_then_release(owner: str, key: str, held: Lease | LeaseSet) -> None:
                    got = await self._acquire(
                        client, owner, [key], many=False, wait=cfg.cycle_wait, ttl=cfg.ttl
                    )
                    await self._release(client, owner, held)
                    if got is not None:
                        await self._release(client, owner, got)

                waits = await asyncio.gather(
                    wait_then_release(x, second, held_x),
                    wait_then_release(y, first, held_y),
                    return_exceptions=True,
                )
            else:
                for owner, held in ((x, held_x), (y, held_y)):
                    if held is not None:
                        await self._release(client, owner, held)
            for outcome in waits:
                if isinstance(outcome, BaseException) and not isinstance(outcome, RaftLeaseError):
                    raise outcome
            await self._pause(rng.uniform(0.1, 0.4))

    async def _renew(self, client: AsyncClient, owner: str, lease: Lease) -> Lease | None:
        """One recorded renewal; the renewed lease, or None (refused or unknown)."""
        base = self._base("many-renew", lease.key)
        value = {"owner": owner, "key": lease.key, "token": lease.token}
        self._record(base, "invoke", value=value)
        try:
            renewed = await client.renew(lease, timeout=self.config.call_timeout)
        except RaftLeaseError as exc:
            self._record(base, "fail" if exc.definite else "info", error=exc.code)
            return None
        self._record(base, "ok", value={"yield_deadline_ms": renewed.yield_deadline_ms})
        return renewed

    async def _hold(self, client: AsyncClient, owner: str, lease: Lease, honour: bool) -> None:
        """Renew ``lease`` until a renewal is refused; an honouring holder releases as
        soon as an answer carries a yield request. Bounded: released after ``ttl`` plus
        the deadline in any case (the waiter's wait is longer)."""
        cfg = self.config
        end = time.monotonic() + cfg.ttl + cfg.yield_deadline
        held: Lease | None = lease
        while held is not None and time.monotonic() < end:
            await asyncio.sleep(cfg.renew_every)
            held = await self._renew(client, owner, held)
            if held is not None and honour and held.yield_deadline_ms is not None:
                break
        if held is not None:
            await self._release(client, owner, held)

    async def _yielder(self, client: AsyncClient, rng: random.Random) -> None:
        cfg = self.config
        r = 0
        while not self.stop_event.is_set():
            await self._pause(rng.uniform(*cfg.yield_every))
            if self.stop_event.is_set():
                break
            r += 1
            key = rng.choice(cfg.yield_keys)
            holder, asker = f"{self.process}-yh{r}", f"{self.process}-yw{r}"
            held = await self._acquire(client, holder, [key], many=False, wait=0, ttl=cfg.ttl)
            if not isinstance(held, Lease):
                continue
            honour = rng.random() < 0.5
            hold = asyncio.create_task(self._hold(client, holder, held, honour))
            # The waiter's wait outlasts the deadline: it must be granted when the
            # holder yields or is ended (many_checker: yields).
            wait = cfg.ttl + cfg.yield_deadline + 2.0
            waiter = asyncio.create_task(
                self._acquire(
                    client,
                    asker,
                    [key],
                    many=False,
                    wait=wait,
                    ttl=cfg.ttl,
                    priority=cfg.yield_priority,
                )
            )
            try:
                await asyncio.sleep(0.05)  # usually queued by now; either order is valid
                base = self._base("many-yield", key)
                value = {
                    "owner": asker,
                    "key": key,
                    "holder": holder,
                    "token": held.token,
                    "deadline": cfg.yield_deadline,
                    "priority": cfg.yield_priority,
                    "honour": honour,
                }
                self._record(base, "invoke", value=value)
                try:
                    asked = await client.request_yield(
                        key,
                        deadline=cfg.yield_deadline,
                        priority=cfg.yield_priority,
                        owner=asker,
                        timeout=cfg.call_timeout,
                    )
                except RaftLeaseError as exc:
                    self._record(base, "fail" if exc.definite else "info", error=exc.code)
                else:
                    self._record(base, "ok", value={"asked": asked})
                await hold
                got = await waiter
                if got is not None:
                    await self._release(client, asker, got)
            finally:
                # Stopped mid-round (the harness cancels this task): end both with it.
                for task in (hold, waiter):
                    task.cancel()

    async def _reader(self, client: AsyncClient, rng: random.Random) -> None:
        cfg = self.config
        while not self.stop_event.is_set():
            await self._pause(rng.uniform(*cfg.read_every))
            base = self._base("many-read", cfg.keys[0])
            self._record(base, "invoke", value={})
            try:
                holders = await client.leases("m", timeout=cfg.call_timeout)
            except RaftLeaseError as exc:
                self._record(base, "fail" if exc.definite else "info", error=exc.code)
                continue
            self._record(
                base,
                "ok",
                value={
                    "holders": [{"key": h.key, "owner": h.owner, "token": h.token} for h in holders]
                },
            )
