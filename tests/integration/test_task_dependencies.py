"""Task dependencies on real nodes (issue 41; docs/queues.md, "Dependencies"): a
100-task random DAG worked by 4 async workers that crash (abandon the attempt, which
expires) 20 % of the time completes with every edge respected, each task completed
once: judged by ``queue_checker.check_dependencies`` on the cluster's own watch
events (each claim's revision is its token; each completion's revision). A dead
parent kills its child, with the reason. (The planted ``early_child`` build is caught
in tests/unit/test_planted_bugs.py, on the state machine alone.)
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from raftlease import AsyncClient
from raftlease.testing import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "jepsen-style"))

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_a_100_task_random_dag_under_worker_crashes_respects_every_edge(
    shared: LocalCluster,
) -> None:
    from queue_checker import check_dependencies

    rng = random.Random(41)
    name = "t-dag"
    events: list[dict[str, Any]] = []

    async def main() -> None:
        async with AsyncClient(shared.endpoints) as c:
            q = c.queue(name, lease_ttl=0.6, backoff=0.0, max_attempts=100)
            start = (await c.read("t-dag-probe")).revision
            assert start is not None
            done = asyncio.Event()
            completions = 0

            async def watch() -> None:
                nonlocal completions
                async for event in c.watch(f"queue:{name}/", from_revision=int(start) + 1):
                    tid = event.key.rsplit("/", 1)[1]
                    if event.type == "task_claim":
                        events.append({"f": "dag.claim", "task": tid, "token": event.revision})
                        assert event.token == event.revision
                    elif event.type == "task_complete":
                        events.append(
                            {"f": "dag.complete", "task": tid, "revision": event.revision}
                        )
                        completions += 1
                        if completions == 100:
                            done.set()
                            return

            watcher = asyncio.create_task(watch())
            ids: list[str] = []
            for i in range(100):
                parents = rng.sample(ids, min(len(ids), rng.randint(0, 3)))
                tid = await q.put({"n": i}, after=parents or None)
                ids.append(tid)
                events.append({"f": "dag.put", "task": tid, "after": parents})

            async def worker(seed: int) -> None:
                crash = random.Random(seed)
                while not done.is_set():
                    task = await q.claim(worker=f"w{seed}", wait=1.0)
                    if task is None:
                        continue
                    if crash.random() < 0.2:
                        continue  # crashed: no heartbeat, no completion; it expires
                    parents = task.parent_results
                    assert set(parents) <= set(task.after)
                    await task.complete({"parents": len(parents)})

            workers = [asyncio.create_task(worker(s)) for s in range(4)]
            await asyncio.wait_for(done.wait(), 90)
            for one in workers:
                one.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            await asyncio.wait_for(watcher, 10)

    asyncio.run(main())
    verdict = check_dependencies(events)
    assert verdict["valid"] is True, verdict
    stats = verdict["stats"]
    assert stats["tasks"] == 100 and stats["completed"] == 100 and stats["edges"] > 100
    assert stats["claims"] > 100, stats  # some workers crashed, their tasks were retried


def test_a_dead_parent_kills_its_child_with_the_reason(shared: LocalCluster) -> None:
    with shared.client() as c:
        q = c.queue("t-dag-dead")
        parent = q.put("p", max_attempts=1)
        child = q.put("c", after=[parent])
        assert q.get(child).waiting_on == (parent,)
        task = q.claim(worker="w")
        assert task is not None and task.task_id == parent
        task.fail("broken")
        info = q.get(child)
        assert info.status == "dead"
        assert info.dead_reason == f"parent {parent} is dead: failed 1 of 1 attempts"
