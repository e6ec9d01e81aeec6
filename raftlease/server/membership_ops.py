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
import logging
import time
from typing import Any

from ..config import NodeAddress
from ..errors import RaftLeaseError, TimeoutError_
from ..protocol import Request
from ..replication import Replica
from ..replication.membership import Change

log = logging.getLogger("raftlease.server")

#: How often the leader looks at a new member's match index while it catches up.
CATCH_UP_POLL = 0.05


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
        if kind == "add":
            result.update(await _catch_up(replica, change.member.raft, args["timeout"]))
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
