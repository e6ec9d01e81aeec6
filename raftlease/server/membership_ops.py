"""The client-port membership operations: ``member_list``, ``member_add``,
``member_remove`` (docs/membership.md). The replication side (one change at a time,
the member set on disk) is ``replication/membership.py``.

Threads: everything here runs on the node's event loop; the replica calls back on
PySyncObj's tick thread, and the callback hops to the loop. Cancellation: a request
cancelled (its connection gone) or timed out while its change is in flight leaves the
change to finish in Raft; the change slot is released when Raft reports the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from ..config import NodeAddress
from ..errors import RaftLeaseError, TimeoutError_, UnavailableError
from ..protocol import Request
from ..replication import Replica
from ..replication.membership import Change

log = logging.getLogger("raftlease.server")

#: How often the leader looks at a new member's match index while it catches up.
CATCH_UP_POLL = 0.05
#: The learner stage ends (the add is appended) once the learner's match index is
#: within this many entries of the leader's commit index.
LEARNER_MAX_LAG = 64
#: How often the leader logs a learner's progress.
LEARNER_PROGRESS_EVERY = 2.0


def member_list(replica: Replica, self_raft: str) -> dict[str, Any]:
    """This node's view of the member set (its log's latest), the leader it knows and
    the change it has in flight (a leader only)."""
    leader = replica.leader_raft_addr()
    pending = replica.membership.pending()
    return {
        "members": [
            {
                "id": m.id,
                "raft": m.raft,
                "client": m.client,
                "leader": m.raft == leader,
                "self": m.raft == self_raft,
            }
            for m in replica.members()
        ],
        "leader": next((m.id for m in replica.members() if m.raft == leader), None),
        "pending": None if pending is None else {"kind": pending.kind, "member": pending.member.id},
        "log_index": replica.last_log_index(),
    }


async def change_members(replica: Replica, request: Request, timeout: float) -> dict[str, Any]:
    """Propose one change on the leader and wait (up to ``timeout``) for it to
    commit; after an add, wait up to the request's ``timeout`` for the new member to
    have replicated the log up to the change (``caught_up``), holding the change slot
    meanwhile so no second change starts beside a member still catching up.

    An add first runs the learner stage (``_learn``): the leader streams the log to
    the new node, which counts for nothing, and appends the change only once the
    node is within ``LEARNER_MAX_LAG`` entries of the commit index. If it does not
    get there within the request's ``timeout``, nothing changes and the answer says
    ``added: false`` (a result, not an error: a client must not retry it).

    Raises ``NotLeaderError``, ``InvalidArgumentError``, ``UnavailableError``
    (definite: nothing changed), ``LeaderChangedError`` or ``TimeoutError_``
    (indeterminate: ``member_list`` tells whether it happened)."""
    args = request.args
    if request.op == "member_add":
        kind = "add"
        member = NodeAddress(args["member_id"], args["raft"], args["client"])
    else:
        kind = "remove"
        member = NodeAddress(args["member_id"], args["member_id"], "")
    loop = asyncio.get_running_loop()
    learning: dict[str, Any] | None = None
    if kind == "add":
        learning = await _learn(replica, member, float(args["timeout"]), timeout)
        if "change" not in learning:
            return {
                "kind": kind,
                "member": member.id,
                "added": False,
                "caught_up": False,
                "learner": learning,
                "members": [m.id for m in replica.members()],
            }
    done: asyncio.Future[Change] = loop.create_future()

    def settle(change: Change | None, err: RaftLeaseError | None) -> None:
        # Event loop. A caller that gave up no longer owns the slot: release it.
        if done.done():
            if change is not None:
                replica.membership.finish(change)
            return
        if err is not None:
            done.set_exception(err)
        else:
            assert change is not None
            done.set_result(change)

    def on_tick(change: Change | None, err: RaftLeaseError | None) -> None:
        loop.call_soon_threadsafe(settle, change, err)

    if learning is not None:
        replica.commit_learner(learning.pop("change"), on_tick)
    else:
        replica.change_members(kind, member, on_tick)
    try:
        change = await asyncio.wait_for(asyncio.shield(done), timeout)
    except TimeoutError:
        done.cancel()
        raise TimeoutError_(
            f"the {kind} of {member.id} did not commit within {timeout} s; it may still "
            "happen: see `raftlease member list`"
        ) from None
    try:
        result: dict[str, Any] = {"kind": kind, "member": change.member.id}
        if learning is not None:
            result["added"] = True
            result["learner"] = learning
            left = max(1.0, float(args["timeout"]) - learning["learner_s"])
            result.update(await _catch_up(replica, change.member.raft, left))
        log.warning("membership: %s %s committed", kind, change.member.id)
        result["members"] = [m.id for m in replica.members()]
        return result
    finally:
        replica.membership.finish(change)


async def _catch_up(replica: Replica, raft: str, timeout: float) -> dict[str, Any]:
    """Wait until the new member's match index reaches the commit index seen now (the
    change entry and everything before it: through a snapshot if the log was
    compacted)."""
    target = replica.commit_index()
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    while True:
        match = replica.match_index(raft) or 0
        if match >= target:
            return {
                "caught_up": True,
                "match_index": match,
                "catch_up_s": round(time.monotonic() - started, 3),
            }
        if time.monotonic() >= deadline or not replica.is_leader():
            return {"caught_up": False, "match_index": match, "target_index": target}
        await asyncio.sleep(CATCH_UP_POLL)


async def _learn(
    replica: Replica, member: NodeAddress, catch_up: float, timeout: float
) -> dict[str, Any]:
    """The learner stage of an add: claim the change slot, have the leader stream
    the log to ``member`` (a read-only node that counts for no commit, vote or
    lease),
    and wait up to ``catch_up`` seconds until its match index is within
    ``LEARNER_MAX_LAG`` of the commit index, logging its progress. Returns the
    stage's figures with the ``change`` (its slot still claimed: the caller appends
    it), or without it if the deadline passed first. Raises as ``change_members``;
    on any failure, the deadline or cancellation the learner is dropped and the slot
    released (nothing changed)."""
    loop = asyncio.get_running_loop()
    started: asyncio.Future[Change] = loop.create_future()

    def settle(change: Change | None, err: RaftLeaseError | None) -> None:
        # Event loop. A caller that gave up no longer owns the slot: release it.
        if started.done():
            if change is not None:
                replica.drop_learner(change)
            return
        if err is not None:
            started.set_exception(err)
        else:
            assert change is not None
            started.set_result(change)

    def on_tick(change: Change | None, err: RaftLeaseError | None) -> None:
        loop.call_soon_threadsafe(settle, change, err)

    replica.change_members("add", member, on_tick, learn=True)
    try:
        change = await asyncio.wait_for(asyncio.shield(started), timeout)
    except TimeoutError:
        started.cancel()
        raise TimeoutError_(f"the add of {member.id} did not start within {timeout} s") from None
    begun = time.monotonic()
    deadline = begun + catch_up
    logged = begun
    try:
        while True:
            match = replica.learner_match(member.raft)
            commit = replica.commit_index()
            now = time.monotonic()
            if match is not None and match >= commit - LEARNER_MAX_LAG:
                log.warning(
                    "membership: learner %s caught up (index %d of %d) in %.1f s",
                    member.id,
                    match,
                    commit,
                    now - begun,
                )
                return {
                    "change": change,
                    "match_index": match,
                    "commit_index": commit,
                    "learner_s": round(now - begun, 3),
                }
            if not replica.is_leader():
                raise UnavailableError(
                    f"leadership changed while {member.id} caught up as a learner; nothing "
                    "changed: retry"
                )
            if now >= deadline:
                log.warning(
                    "membership: learner %s did not catch up within %.1f s (index %s of "
                    "%d): not added",
                    member.id,
                    catch_up,
                    match,
                    commit,
                )
                await _release(replica, change)
                return {
                    "match_index": match,
                    "commit_index": commit,
                    "learner_s": round(now - begun, 3),
                }
            if now - logged >= LEARNER_PROGRESS_EVERY:
                logged = now
                log.warning(
                    "membership: learner %s at index %s of %d (%.0f s)",
                    member.id,
                    "none (not connected)" if match is None else match,
                    commit,
                    now - begun,
                )
            await asyncio.sleep(CATCH_UP_POLL)
    except BaseException:
        replica.drop_learner(change)
        raise


async def _release(replica: Replica, change: Change) -> None:
    """Drop the learner of ``change`` and wait (up to 5 s) until its slot is free,
    so that the answer is not followed by a refusal of the next change."""
    loop = asyncio.get_running_loop()
    released: asyncio.Future[None] = loop.create_future()

    def free() -> None:  # event loop
        if not released.done():
            released.set_result(None)

    def on_tick() -> None:
        loop.call_soon_threadsafe(free)

    replica.drop_learner(change, on_tick)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(released), 5.0)
