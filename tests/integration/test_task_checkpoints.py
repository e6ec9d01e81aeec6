"""Task checkpoints on real nodes (issue 41; docs/queues.md, "Checkpoints"): a worker
SIGKILLed at 60 % of a checkpointed task, and the next attempt starts from its
checkpoint; the dead-letter view shows the last one. And the effect journal on the
async client ("Effects").

Waits are on conditions with deadlines; what is asserted exactly is the checkpoint
handed over and the work done from it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from raftlease.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: Ten steps; the worker saves a checkpoint after each, reports after the sixth and
#: then hangs there (killed at 60 %).
WORKER = textwrap.dedent(
    """
    import json, sys, time
    from raftlease import Client
    endpoints, queue = sys.argv[1].split(","), sys.argv[2]
    with Client(endpoints) as c:
        task = c.queue(queue).claim(worker="doomed", lease_ttl=2.0, wait=30.0)
        with task:
            start = json.loads(task.checkpoint) if task.checkpoint else 0
            for step in range(start + 1, 11):
                task.heartbeat(progress=step, checkpoint=json.dumps(step).encode())
                if step == 6:
                    print("AT", step, task.token, flush=True)
                    time.sleep(600)   # killed here, 60 % done
    """
)


def test_a_worker_killed_at_60_percent_hands_its_checkpoint_to_the_next_attempt(
    shared: LocalCluster, tmp_path: Path
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with shared.client() as c:
        q = c.queue("t-checkpoint")
        tid = q.put({"steps": 10}, max_attempts=3, backoff=0.1)
        proc = subprocess.Popen(
            [sys.executable, str(script), ",".join(shared.endpoints), "t-checkpoint"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().split()
            assert line[:2] == ["AT", "6"], line
            dead_token = int(line[2])
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        task = q.claim(worker="survivor", wait=30.0)
        assert task is not None and task.task_id == tid and task.token > dead_token
        assert task.attempt == 2
        assert task.checkpoint == b"6" and task.checkpoint_attempt == 1
        done = []
        with task:
            for step in range(int(task.checkpoint) + 1, 11):
                done.append(step)
                task.heartbeat(progress=step, checkpoint=str(step).encode())
            task.complete({"steps": done})
        assert q.wait_result(tid, timeout=10) == {"steps": [7, 8, 9, 10]}
        info = q.get(tid)
        assert [a.outcome for a in info.history] == ["expired", "completed"]
        assert info.checkpoint == b"10" and info.checkpoint_attempt == 2


def test_the_dead_letter_view_shows_the_last_checkpoint(shared: LocalCluster) -> None:
    with shared.client() as c:
        q = c.queue("t-checkpoint-dead")
        tid = q.put("x", max_attempts=1)
        task = q.claim(worker="w")
        assert task is not None and task.checkpoint is None
        task.heartbeat(checkpoint=b"\x00\xffhalf")
        task.fail("gave up")
        dead = q.dead()
        assert [d.task_id for d in dead] == [tid]
        assert dead[0].checkpoint == b"\x00\xffhalf" and dead[0].checkpoint_attempt == 1


def test_effects_on_the_async_client_skip_a_committed_effect_and_refuse_a_zombie(
    shared: LocalCluster,
) -> None:
    """The async form of the effect journal (the blocking form runs in
    tests/integration/test_effect_proof.py): a later attempt finds an effect committed
    (skip) or in progress (the reconcile hook gets the old token and key); the
    earlier attempt's commit is refused."""
    import asyncio

    from raftlease import AsyncClient, StaleAttemptError

    async def scenario() -> None:
        async with AsyncClient(shared.endpoints) as c:
            q = c.queue("t-effects-async")
            await q.put("x", max_attempts=3, backoff=0.0, lease_ttl=0.6)
            first = await q.claim(worker="w1")
            assert first is not None
            async with first.effect("mail", idempotency_key="m-1") as mail:
                assert mail.state == "new" and mail.key == "m-1"
                await mail.commit({"sent": 1})
            async with first.effect("charge") as charge:
                assert charge.state == "new"  # the call is made; the worker then stalls
            second = None
            while second is None:  # the first attempt expires (no heartbeats)
                second = await q.claim(worker="w2", wait=5.0, lease_ttl=30.0)
            seen: list[tuple[int, str]] = []

            async def reconcile(token: int, key: str) -> dict[str, int]:
                seen.append((token, key))
                return {"charged": 1}  # the provider shows the call was made

            async with second.effect("mail") as mail_again:
                assert mail_again.done and mail_again.result == {"sent": 1}
            async with second.effect("charge", reconcile=reconcile) as charge_again:
                assert charge_again.state == "committed" and charge_again.reconciled
                assert charge_again.prior_token == first.token
            assert seen == [(first.token, f"{first.task_id}:charge")]
            with pytest.raises(StaleAttemptError):
                await charge.commit({"charged": 2})
            await second.complete("done")
            info = await q.get(second.task_id)
            assert [(e["effect"], e["state"], e["result"]) for e in info.effects] == [
                ("mail", "committed", {"sent": 1}),
                ("charge", "committed", {"charged": 1}),
            ]

    asyncio.run(scenario())
