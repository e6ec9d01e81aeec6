"""Keep-alives of many lease sessions sent together (client/keepalive_batch.py) and
answered by the leader from memory (``session_keepalive_many``, server/dispatch.py),
on real node processes: the answers and errors are those of single keep-alives,
nothing is written to the log for them, a session the leader cannot answer from
memory goes through the log singly, and hostile requests are refused with a definite
code and no change. The batcher's own rules (grouping, timeouts, cancellation, an
earlier build's refusal) are unit-tested in tests/unit/test_keepalive_batch.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from raftlease import AsyncClient
from raftlease.errors import SessionNotFoundError
from raftlease.limits import MAX_KEEPALIVE_SESSIONS
from raftlease.recipes.sessions import AsyncSession
from raftlease.testing import LocalCluster
from tests.integration.test_cluster import raw_request
from tests.integration.test_leader_lease import STEADY
from tests.unit.test_planted_bugs import status_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SESSIONS = 40


def _leader_status(cluster: LocalCluster) -> dict[str, Any]:
    status = status_of(cluster.node(cluster.leader_id()).client)
    assert status is not None
    return status


async def _open(client: AsyncClient, count: int) -> list[AsyncSession]:
    sessions = [client.session(owner=f"agent-{i}", ttl=5.0) for i in range(count)]
    await asyncio.gather(*(s.open() for s in sessions))
    for s in sessions:
        await s.stop_keepalive()  # the test sends them
    return sessions


def test_batched_keepalives_answer_as_single_ones_from_memory(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    # STEADY: every keep-alive below must be answered from memory (a valid leader lease).
    cluster = cluster_factory(**STEADY)

    async def main() -> None:
        async with AsyncClient(cluster.endpoints) as client:
            batcher = client.keepalives
            assert batcher is not None
            sessions = await _open(client, SESSIONS)
            await client.acquire("batch/held", session=sessions[0])
            gone = sessions[-1]
            await gone.close()
            start = _leader_status(cluster)
            before = [s.valid_until for s in sessions[:-1]]
            batches = batcher.batches
            # All due at once, as a busy agents' process has them: a few requests.
            await asyncio.gather(*(s.keepalive() for s in sessions[:-1]))
            assert 1 <= batcher.batches - batches < SESSIONS // 4
            assert all(s.valid_until > b for s, b in zip(sessions[:-1], before, strict=True))
            after = _leader_status(cluster)
            # Answered from memory: counted there, and no log write of their own.
            assert after["keepalives_in_memory"] - start["keepalives_in_memory"] == SESSIONS - 1
            assert after["revision"] == start["revision"]
            # The answer of one is a single keep-alive's answer.
            one = await client.session_keepalive(sessions[0].session_id)
            single = await client.call(
                "session_keepalive", {"session_id": sessions[0].session_id}, mutating=True
            )
            assert set(one) == set(single)
            assert one["session_id"] == sessions[0].session_id and one["leases"] == 1
            # A closed session in a batch: the log's own answer, as for a single one.
            results = await asyncio.gather(
                gone.keepalive(), sessions[1].keepalive(), return_exceptions=True
            )
            assert isinstance(results[0], SessionNotFoundError), results
            assert results[1] is None
            for s in sessions[:-1]:
                await s.close()

    asyncio.run(main())


def test_keepalive_many_refuses_hostile_requests_and_answers_forged_ids_single(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(**STEADY)
    leader = cluster.node(cluster.leader_id()).client
    follower = next(n.client for n in cluster.nodes if n.client != leader)

    def ask(addr: str, args: Any) -> dict[str, Any]:
        message = {
            "id": 7,
            "op": "session_keepalive_many",
            "session_ids": args,
            "cid": "c" * 32,
            "seq": 1,
            "ack": 1,
        }
        return raw_request(addr, message)

    start = _leader_status(cluster)
    forged = ask(leader, ["ab" * 16, "0" * 128])
    assert forged["ok"], forged
    assert forged["result"]["sessions"] == [
        {"session_id": "ab" * 16, "single": True},
        {"session_id": "0" * 128, "single": True},
    ]
    for bad, code in (
        ([], "INVALID_ARGUMENT"),
        ([f"a{i}" for i in range(MAX_KEEPALIVE_SESSIONS + 1)], "INVALID_ARGUMENT"),
        (["a", "a"], "INVALID_ARGUMENT"),
        (["a" * 129], "INVALID_ARGUMENT"),
        (["nope"], "INVALID_ARGUMENT"),
        ("abc", "BAD_REQUEST"),
        ([1, 2], "BAD_REQUEST"),
        (None, "BAD_REQUEST"),
    ):
        answer = ask(leader, bad)
        assert not answer["ok"] and answer["code"] == code, (bad, answer)
    refused = ask(follower, ["ab" * 16])
    assert not refused["ok"] and refused["code"] == "NOT_LEADER", refused
    # Nothing changed and nothing was kept in memory for the forged ids.
    after = _leader_status(cluster)
    assert after["revision"] == start["revision"]
    assert after["keepalives_in_memory"] == start["keepalives_in_memory"]


def test_keepalives_through_the_log_are_sent_singly(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    # keepalives = "log": the leader answers none from memory; every session of a
    # batch comes back single and is kept alive by its own log write, and the client
    # stops batching for a while (each keep-alive would cost two requests).
    cluster = cluster_factory(keepalives="log")

    async def main() -> None:
        async with AsyncClient(cluster.endpoints) as client:
            sessions = await _open(client, 5)
            start = _leader_status(cluster)
            before = [s.valid_until for s in sessions]
            await asyncio.gather(*(s.keepalive() for s in sessions))
            assert all(s.valid_until > b for s, b in zip(sessions, before, strict=True))
            after = _leader_status(cluster)
            # Through the log (concurrent ones may share a batch entry).
            assert after["applied_index"] > start["applied_index"]
            assert after["keepalives_in_memory"] == 0
            batcher = client.keepalives
            assert batcher is not None and batcher.pauses == 1 and not batcher.enabled
            batches = batcher.batches
            await asyncio.gather(*(s.keepalive() for s in sessions))
            assert batcher.batches == batches
            for s in sessions:
                await s.close()

    asyncio.run(main())
