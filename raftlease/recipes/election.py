"""Leader election for agents (etcd's ``concurrency.Election``, made safe by
construction).

Recipes layer over a plain lock on the key ``name``, attached to a lease session:

* ``campaign(value, session=...)`` queues for the key (first come, first served,
  optional priority) and returns when elected; the returned ``Leadership`` carries the
  leader's fencing token; hand it to anything the leader writes to.
* ``leader()`` is who leads now (owner, value, token) or None.
* ``observe()`` yields the leader (or None) now and after every change, in log order:
  an election, a ``proclaim``, a resignation, an expiry. Each carries its revision. A
  handoff (the leader resigns or expires and the next candidate is elected in the same
  log entry) goes from one leader to the next with no ``None`` between; ``None`` only
  when the lead really is vacant.
* ``proclaim(value)`` publishes a new value (a new address) without losing the lead.
* ``resign()`` gives the lead up; the next candidate in the queue is elected in the
  same log entry.

A leader that dies stops sending keep-alives; its session expires after its TTL and
the next candidate is elected in the entry that expires it. There is never more than
one leader: leadership is a lease, and a successor is only elected once the previous
lease is released or expired in the replicated state.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator

from ..errors import InvalidArgumentError, RaftLeaseError
from ..models import LEASE_END_KINDS, AsyncLeaseClient, Attachable, Leader, Lease, LeaseClient

#: How long a campaign waits for the lead by default (the longest a node allows).
DEFAULT_CAMPAIGN_WAIT = 3600.0


class AsyncElection:
    """One election (a key) seen through an ``AsyncClient``."""

    def __init__(self, client: AsyncLeaseClient, name: str) -> None:
        if not name:
            raise InvalidArgumentError("an election needs a name")
        self._client = client
        self.name = name
        #: Our leadership lease while we lead (after ``campaign``).
        self.lease: Lease | None = None

    async def campaign(
        self,
        value: str,
        *,
        session: Attachable,
        wait: float = DEFAULT_CAMPAIGN_WAIT,
        priority: int = 0,
    ) -> Lease:
        """Block until elected (or ``wait`` seconds pass: ``LeaseHeldError``).
        Leadership lasts as long as ``session`` (or until ``resign``)."""
        self.lease = await self._client.acquire(
            self.name, session=session, value=value, wait=wait, priority=priority
        )
        return self.lease

    @property
    def is_leader(self) -> bool:
        """True while we hold the lead and its lease is valid on our clock."""
        return self.lease is not None and self.lease.valid

    async def leader(self, *, consistency: str = "linearizable") -> Leader | None:
        read = await self._client.read(self.name, consistency=consistency)
        if read.holder is None:
            return None
        holder = read.holder
        return Leader(holder.owner, holder.value, holder.token, read.revision)

    async def proclaim(self, value: str) -> None:
        if self.lease is None:
            raise InvalidArgumentError("not the leader: campaign first")
        self.lease = await self._client.proclaim(self.lease, value)

    async def resign(self) -> None:
        """Give up the lead (a no-op if we do not hold it)."""
        lease, self.lease = self.lease, None
        if lease is not None:
            try:
                await self._client.release(lease)
            except RaftLeaseError as exc:
                if not exc.definite:
                    raise

    async def observe(self) -> AsyncGenerator[Leader | None, None]:
        """The leader now, then after every change, in order (an async iterator).

        Starts from a read through the log, which gives the exact revision the answer
        reflects, and watches from the next revision: no change is missed or seen
        twice, across reconnects and leader changes (see ``AsyncClient.watch``)."""
        read = await self._client.read(self.name, consistency="log")
        current: Leader | None = None
        if read.holder is not None:
            current = Leader(read.holder.owner, read.holder.value, read.holder.token, read.revision)
        yield current
        start = (read.revision or 0) + 1
        async for event in self._client.watch(self.name, from_revision=start):
            if event.key != self.name:
                continue  # the watch is a prefix watch: "jobs" also matches "jobs-2"
            if event.type in ("grant", "proclaim"):
                current = Leader(event.owner, event.value, event.token, event.revision)
            elif event.type in LEASE_END_KINDS and event.type != "transfer":
                if event.type == "release" and event.handoff:
                    # A resignation that elects the next candidate in the same log
                    # entry (its grant follows): the lead was never vacant, so no
                    # None between the two (etcd-io/etcd#18163). An expiry still
                    # shows None: the leader died, and observers learn that.
                    continue
                current = None
            else:
                continue  # renew (no change) or transfer (its grant follows)
            yield current


class Election:
    """The same election through the blocking ``Client``."""

    def __init__(self, client: LeaseClient, name: str) -> None:
        self._portal = client.portal

        async def make() -> AsyncElection:
            return AsyncElection(client.aio, name)

        self._async = self._portal.run(make())
        self.name = name

    @property
    def lease(self) -> Lease | None:
        return self._async.lease

    @property
    def is_leader(self) -> bool:
        return self._async.is_leader

    def campaign(
        self,
        value: str,
        *,
        session: Attachable,
        wait: float = DEFAULT_CAMPAIGN_WAIT,
        priority: int = 0,
    ) -> Lease:
        return self._portal.run(
            self._async.campaign(value, session=session, wait=wait, priority=priority)
        )

    def leader(self, *, consistency: str = "linearizable") -> Leader | None:
        return self._portal.run(self._async.leader(consistency=consistency))

    def proclaim(self, value: str) -> None:
        self._portal.run(self._async.proclaim(value))

    def resign(self) -> None:
        self._portal.run(self._async.resign())

    def observe(self) -> Iterator[Leader | None]:
        """Blocking iterator over ``AsyncElection.observe``; break out to stop."""
        return self._portal.iterate(self._async.observe())
