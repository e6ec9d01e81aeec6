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
* a reader that reads every live lease under ``m`` in one operation every 0.1-0.3 s.

Events (``invoke`` then ``ok``/``fail``/``info`` paired by ``op``, as workload.py):

* ``f: "many-acquire"``, invoke ``key`` (the first key) and value ``{"owner", "keys",
  "set", "wait", "ttl"}``; ``ok`` value ``{"tokens": {key: token}}``; ``fail`` (definite
  code) or ``info`` (unknown outcome) with ``error`` and, for ``DEADLOCK``, value
  ``{"cycle": [...]}`` (the refusal's detail);
* ``f: "many-release"``, value ``{"owner", "keys"}``;
* ``f: "many-read"``: ``ok`` value ``{"holders": [{"key", "owner", "token"}, ...]}``.

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
    #: Seconds per read or release call.
    call_timeout: float = 4.0

    def meta(self) -> dict[str, Any]:
        return {
            "keys": list(self.keys),
            "cycle_keys": list(self.cycle_keys),
            "agents": self.agents,
            "waits": list(self.waits),
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
    ) -> Lease | LeaseSet | None:
        """One recorded acquire; the grant, or None (refused, unknown: recorded)."""
        base = self._base("many-acquire", keys[0])
        value = {"owner": owner, "keys": keys, "set": many, "wait": wait, "ttl": ttl}
        self._record(base, "invoke", value=value)
        try:
            if many:
                got: Lease | LeaseSet = await client.acquire_many(
                    keys, owner=owner, ttl=ttl, wait=wait
                )
            else:
                got = await client.acquire(keys[0], owner=owner, ttl=ttl, wait=wait)
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
