"""``acquire_many`` on a real 3-node cluster (issue 40): the blocking and asyncio
clients, the HTTP route and the CLI take several keys all or none, keep them alive
with one keep-alive and release them in one entry. The state machine's rules (and
the checks that catch a broken build) are in tests/unit/test_core_many.py."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from raftlease import AsyncClient, DeadlockError, Lease
from raftlease.cli import main as cli_main
from raftlease.errors import InvalidArgumentError, LeaseHeldError, SessionNotFoundError
from raftlease.testing import LocalCluster, wait_for
from tests.integration.test_admin_http import admin_of, running_admin_cluster
from tests.unit.test_http_api import call

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    yield from running_admin_cluster(3)


def test_all_or_none_through_both_clients(cluster: LocalCluster) -> None:
    with cluster.client() as c:
        single = c.acquire("many/b", owner="bob", ttl=30.0)
        with pytest.raises(LeaseHeldError) as refused:
            c.acquire_many(["many/a", "many/b", "many/c"], owner="alice", ttl=30.0)
        assert refused.value.definite and refused.value.detail["keys"] == ["many/b"]
        assert c.holder("many/a") is None and c.holder("many/c") is None  # nothing taken
        c.release(single)
        taken = c.acquire_many(["many/a", "many/b", "many/c"], owner="alice", ttl=30.0)
        assert taken.keys == ["many/a", "many/b", "many/c"]
        tokens = [lease.token for lease in taken.leases]
        assert tokens == sorted(tokens) and tokens[0] > single.token
        assert {k: c.holder(k).owner for k in taken.keys} == dict.fromkeys(taken.keys, "alice")  # type: ignore[union-attr]
        kept = c.renew_many(taken)
        assert kept.expires_at_ms >= taken.expires_at_ms and kept.valid
        c.release(taken.leases[2])  # one key alone
        assert c.holder("many/c") is None and c.holder("many/a") is not None
        assert c.release_many(taken) == 2
        assert all(c.holder(k) is None for k in taken.keys)
        with pytest.raises(SessionNotFoundError):
            c.release_many(taken)
        with pytest.raises(InvalidArgumentError):
            c.acquire_many(["many/a", "many/a"], owner="alice", ttl=30.0)

    async def asynchronous() -> None:
        async with AsyncClient(cluster.endpoints) as a:
            pool = await a.acquire_many({"many/gpu": 2, "many/disk": 1}, ttl=30.0, capacity=4)
            assert [lease.units for lease in pool.leases] == [2, 1]
            assert await a.release_many(pool) == 2

    asyncio.run(asynchronous())


def test_the_http_route_and_the_cli(cluster: LocalCluster) -> None:
    api = admin_of(cluster, cluster.leader_id())
    body: dict[str, Any] = {"keys": ["http/a", "http/b"], "owner": "web", "ttl": 30}
    status, got = call(api, "POST", "/v1/leases/acquire-many", body)
    assert status == 200 and [one["key"] for one in got["leases"]] == ["http/a", "http/b"]
    status, refused = call(api, "POST", "/v1/leases/acquire-many", body)
    assert status == 409 and refused["error"]["code"] == "LEASE_HELD"
    for bad in ({**body, "keys": []}, {**body, "keys": ["x", "x"]}, {**body, "keys": 3}):
        status, answer = call(api, "POST", "/v1/leases/acquire-many", bad)
        assert status == 400 and answer["error"]["definite"] is True, (bad, answer)
    status, _ = call(api, "POST", "/v1/sessions/close", {"session_id": got["lease_id"]})
    assert status == 200

    runner = CliRunner()
    where = ["--endpoints", ",".join(cluster.endpoints), "-o", "json"]
    out = runner.invoke(cli_main, ["acquire-many", "cli/a", "cli/b", "--ttl", "30s", *where])
    assert out.exit_code == 0, out.output
    taken = json.loads(out.output.strip().splitlines()[-1])
    assert [one["key"] for one in taken["leases"]] == ["cli/a", "cli/b"]
    again = runner.invoke(cli_main, ["acquire-many", "cli/b", "cli/c", "--ttl", "30s", *where])
    assert again.exit_code == 1
    out = runner.invoke(cli_main, ["release-many", taken["lease_id"], *where])
    assert out.exit_code == 0 and json.loads(out.output.strip())["released"] == 2


def test_a_set_waits_on_every_key_and_is_granted_whole(cluster: LocalCluster) -> None:
    """{A, B} held by x; y waits for {B, A} (blocking client, a thread); x's release
    hands both keys to y in one entry. Then the same through the asyncio client, a set
    refused DEADLOCK, the HTTP route and the CLI with a wait."""
    with cluster.client() as c:
        first = c.acquire_many(["w/a", "w/b"], owner="x", ttl=30.0)
        got: dict[str, Any] = {}
        waiter = threading.Thread(
            target=lambda: got.setdefault(
                "y", c.acquire_many(["w/b", "w/a"], owner="y", ttl=30.0, wait=20.0)
            )
        )
        waiter.start()
        wait_for(lambda: len(c.waiters("w/a")) == 1, 10, "the set queued on w/a")
        assert [q.owner for q in c.waiters("w/b")] == ["y"]
        assert c.holder("w/a").owner == "x"  # type: ignore[union-attr]
        c.release_many(first)
        waiter.join(timeout=20)
        taken = got["y"]
        assert taken.keys == ["w/b", "w/a"] and taken.valid
        assert min(lease.token for lease in taken.leases) > max(one.token for one in first.leases)
        assert {c.holder(k).owner for k in taken.keys} == {"y"}  # type: ignore[union-attr]
        # A set that would wait for someone who waits for it: DEADLOCK, at once.
        mine = c.acquire("w/c", owner="y", ttl=30.0)
        other = c.acquire("w/d", owner="z", ttl=30.0)
        blocked = threading.Thread(
            target=lambda: got.setdefault(
                "z", _caught(lambda: c.acquire("w/c", owner="z", ttl=30.0, wait=20.0))
            )
        )
        blocked.start()
        wait_for(lambda: len(c.waiters("w/c")) == 1, 10, "z queued on w/c")
        with pytest.raises(DeadlockError) as refused:
            c.acquire_many(["w/d", "w/e"], owner="y", ttl=30.0, wait=20.0)
        assert refused.value.definite and {s["owner"] for s in refused.value.cycle} == {"y", "z"}
        c.release(mine)
        blocked.join(timeout=20)
        assert isinstance(got["z"], Lease)
        for lease in (got["z"], other):
            c.release(lease)
        c.release_many(taken)

    async def asynchronous() -> None:
        async with AsyncClient(cluster.endpoints) as a:
            held = await a.acquire("w/f", owner="h", ttl=30.0)
            pending = asyncio.ensure_future(
                a.acquire_many(["w/f", "w/g"], owner="s", ttl=30.0, wait=20.0)
            )
            while not await a.waiters("w/g"):
                await asyncio.sleep(0.02)
            assert await a.holder("w/g") is None  # promised to the set, not held
            await a.release(held)
            taken = await pending
            assert taken.keys == ["w/f", "w/g"]
            await a.release_many(taken)
            with pytest.raises(LeaseHeldError):  # the wait runs out: withdrawn
                blocker = await a.acquire("w/h", owner="h", ttl=30.0)
                await a.acquire_many(["w/h", "w/i"], owner="s", ttl=30.0, wait=0.3)
            assert await a.waiters("w/i") == []
            await a.release(blocker)

    asyncio.run(asynchronous())

    api = admin_of(cluster, cluster.leader_id())
    body: dict[str, Any] = {"keys": ["hw/a", "hw/b"], "owner": "web", "ttl": 30, "wait": 5}
    status, got_http = call(api, "POST", "/v1/leases/acquire-many", body)
    assert status == 200 and [one["key"] for one in got_http["leases"]] == ["hw/a", "hw/b"]
    status, refused_http = call(api, "POST", "/v1/leases/acquire-many", {**body, "wait": 0.3})
    assert status == 409 and refused_http["error"]["code"] == "LEASE_HELD"
    call(api, "POST", "/v1/sessions/close", {"session_id": got_http["lease_id"]})
    runner = CliRunner()
    where = ["--endpoints", ",".join(cluster.endpoints), "-o", "json"]
    out = runner.invoke(
        cli_main, ["acquire-many", "cw/a", "cw/b", "--ttl", "30s", "--wait", "5s", *where]
    )
    assert out.exit_code == 0, out.output
    taken_cli = json.loads(out.output.strip().splitlines()[-1])
    runner.invoke(cli_main, ["release-many", taken_cli["lease_id"], *where])


def _caught(call_it: Any) -> Any:
    try:
        return call_it()
    except Exception as exc:
        return exc
