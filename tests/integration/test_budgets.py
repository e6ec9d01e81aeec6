"""Shared budgets on a real 3-node cluster (docs/budgets.md): spend, wait, reserve
and settle through the blocking client and the HTTP API, two concurrent spenders
never granted more than the budget, and the decisions kept across a leader kill.

One module cluster (with admin endpoints, for HTTP); the leader kill runs last.
The unit half (the state machine) is tests/unit/test_core_budgets.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from raftlease.cli import main as cli_main
from raftlease.client import budgets
from raftlease.client.aio import AsyncClient
from raftlease.errors import (
    AmountOverCapacityError,
    BudgetExhaustedError,
    BudgetNotFoundError,
    ReservationNotFoundError,
)
from raftlease.testing import LocalCluster
from raftlease.testing.cluster import wait_for
from tests.integration.test_admin_http import (
    admin_of,
    promtool_check,
    running_admin_cluster,
    scrape,
)
from tests.unit.test_http_api import call

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    yield from running_admin_cluster(3)


def test_spend_wait_reserve_and_settle_through_the_client(cluster: LocalCluster) -> None:
    with cluster.client() as c:
        # No refill first: the refusal below cannot race a refill.
        info = c.budget_set("llm/tpm", capacity=10, refill_per_s=0)
        assert info.level == 10.0 and info.refill_per_s == 0.0
        assert c.spend("llm/tpm", 10).level == 0.0
        with pytest.raises(BudgetExhaustedError) as refused:
            c.spend("llm/tpm", 5)
        assert refused.value.definite and refused.value.detail["level"] == 0.0
        # A fast refill now: queued in the log, granted by the entry whose log time
        # the refill covers (a tenth of a second).
        assert c.budget_set("llm/tpm", capacity=10, refill_per_s=50.0).refill_per_s == 50.0
        assert c.spend("llm/tpm", 5, wait=5.0).amount == 5
        with pytest.raises(AmountOverCapacityError):
            c.spend("llm/tpm", 11, wait=5.0)
        with pytest.raises(BudgetNotFoundError):
            c.spend("nobody", 1)
        held = c.reserve("llm/tpm", 4, wait=5.0, ttl=30.0)
        settled = c.settle(held, 1)
        assert settled.reserved == 4 and settled.actual == 1
        with pytest.raises(ReservationNotFoundError):
            c.settle(held, 1)
        c.budget_delete("llm/tpm")
        with pytest.raises(BudgetNotFoundError):
            c.budget_get("llm/tpm")


def test_spend_and_reserve_over_http(cluster: LocalCluster) -> None:
    api = admin_of(cluster, cluster.leader_id())
    body = {"key": "http/b", "capacity": 4, "refill_per_s": 0}
    status, made = call(api, "POST", "/v1/budgets/set", body)
    assert status == 200 and made["created"] is True
    status, got = call(api, "POST", "/v1/budgets/spend", {"key": "http/b", "amount": 4})
    assert status == 200 and got["granted"] is True
    status, refused = call(api, "POST", "/v1/budgets/spend", {"key": "http/b", "amount": 2})
    assert status == 429 and refused["error"]["code"] == "BUDGET_EXHAUSTED"
    status, _ = call(api, "POST", "/v1/budgets/set", {**body, "refill_per_s": 40})
    assert status == 200
    status, waited = call(
        api, "POST", "/v1/budgets/spend", {"key": "http/b", "amount": 2, "wait": 5}
    )
    assert status == 200 and waited["granted"] is True and waited["state"] == "granted"
    assert isinstance(waited["granted_at"], int)  # the grant's log time (ms)
    status, held = call(
        api, "POST", "/v1/budgets/reserve", {"key": "http/b", "amount": 1, "wait": 5}
    )
    assert status == 200 and held["reservation_id"]
    settle = {"key": "http/b", "reservation_id": held["reservation_id"], "actual": 0}
    status, settled = call(api, "POST", "/v1/budgets/settle", settle)
    assert status == 200 and settled["reserved"] == 1
    status, read = call(api, "GET", "/v1/budgets/get?key=http/b")
    assert status == 200 and read["budget"]["capacity"] == 4
    # Hostile values: definite codes, nothing drawn.
    for bad, code in (
        ({"key": "http/b", "amount": -1}, 400),
        ({"key": "http/b", "amount": 1.5}, 400),
        ({"key": "http/b", "amount": "1"}, 400),
        ({"key": "x" * 5000, "amount": 1}, 400),
        ({"key": "http/b", "amount": 5}, 409),
        ({"key": "http/none", "amount": 1}, 404),
    ):
        status, answer = call(api, "POST", "/v1/budgets/spend", bad)
        assert status == code and answer["error"]["definite"] is True, (bad, answer)
    # The leader's /metrics: the budget's gauges and its decisions (docs/operations.md).
    metrics = scrape(api)
    promtool_check(api)  # the budget families pass Prometheus's own lint
    assert metrics['raftlease_budget_capacity{budget="http/b"}'] == 4.0
    assert metrics['raftlease_budget_refill_per_second{budget="http/b"}'] == 40.0
    assert metrics['raftlease_budget_waiting{budget="http/b"}'] == 0.0
    decided = 'raftlease_budget_decisions_total{budget="http/b",outcome="%s"}'
    # Refused: BUDGET_EXHAUSTED and AMOUNT_OVER_CAPACITY; the waited spend and the
    # reserve are queued or granted at once, as the refill has it by then.
    granted, queued = metrics[decided % "granted"], metrics.get(decided % "queued", 0.0)
    assert metrics[decided % "refused"] == 2 and granted >= 1 and granted + queued == 3


def test_the_budget_commands(cluster: LocalCluster) -> None:
    """In process (click's runner): what the shell gets, JSON and exit codes."""
    runner = CliRunner()
    where = ["--endpoints", ",".join(cluster.endpoints), "-o", "json"]

    def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        out = runner.invoke(cli_main, ["budget", *args, *where], env=env)
        return out.exit_code, json.loads(out.output.strip().splitlines()[-1])

    code, made = run("set", "cli/b", "--capacity", "5", "--refill", "0")
    assert code == 0 and made["budget"] == {
        "key": "cli/b",
        "capacity": 5,
        "refill_per_s": 0.0,
        "level": 5.0,
        "waiting": 0,
        "waiting_amount": 0,
        "reservations": 0,
        "reserved": 0,
    }
    code, spent = run("spend", "cli/b", "2")
    assert code == 0 and spent["granted"] is True and spent["level"] == 3.0
    code, held = run("reserve", "cli/b", "3", "--ttl", "30s")
    assert code == 0 and held["reservation_id"]
    env = {"RAFTLEASE_RESERVATION_ID": str(held["reservation_id"])}
    code, settled = run("settle", "cli/b", "1", env=env)
    assert code == 0 and settled["level"] == 2.0
    code, refused = run("spend", "cli/b", "3")
    assert code == 1 and refused["code"] == "BUDGET_EXHAUSTED" and refused["definite"] is True
    code, got = run("get", "cli/b")
    assert code == 0 and got["budget"]["level"] == 2.0
    assert run("delete", "cli/b")[0] == 0
    assert run("get", "cli/b")[1]["code"] == "BUDGET_NOT_FOUND"


def test_two_concurrent_spenders_never_get_more_than_the_budget(cluster: LocalCluster) -> None:
    """No refill: the budget is exactly 30 units, and two threads spending 1 to 3
    units at a time (waiting a little when it is empty) are granted at most that;
    all of it, since they only stop when a spend is refused."""
    with cluster.client() as c:
        c.budget_set("race/b", capacity=30, refill_per_s=0)
    granted: list[int] = []
    lock = threading.Lock()

    def spender(sizes: tuple[int, ...]) -> None:
        with cluster.client() as c:
            i = 0
            while True:
                amount = sizes[i % len(sizes)]
                i += 1
                try:
                    c.spend("race/b", amount, wait=0.2)
                except BudgetExhaustedError:
                    if amount == 1:
                        return
                    continue
                with lock:
                    granted.append(amount)

    threads = [threading.Thread(target=spender, args=(s,)) for s in ((1, 2), (3, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert sum(granted) == 30, granted
    with cluster.client() as c:
        assert c.budget_get("race/b").level == 0.0


def test_a_spend_granted_after_the_last_poll_is_answered_as_granted(
    cluster: LocalCluster,
) -> None:
    """The wait ends between a grant and the client's next poll: the withdrawal
    finds the spend granted, and the caller is told it was spent (it stays spent),
    never refused. (The HTTP front's withdrawal reads the same cancel answer.)"""
    with cluster.client() as c:
        c.budget_set("late/b", capacity=1, refill_per_s=20)

    async def queued_then_granted(client: AsyncClient) -> str:
        """A spend queued on the empty budget, then granted by the refill."""
        await client.spend("late/b", 1, wait=5.0)  # empty it: the next one queues
        answer = await client.call(
            "budget_spend", {"key": "late/b", "amount": 1, "wait": 5.0}, mutating=True
        )
        assert answer.get("queued"), answer
        rid = str(answer["spend_id"])
        status = await client.call(
            "await_spend", {"key": "late/b", "spend_id": rid, "timeout": 5.0}, mutating=False
        )
        assert status["state"] == "granted", status
        return rid

    async def through_the_client() -> dict[str, Any]:
        async with AsyncClient(cluster.endpoints) as client:
            rid = await queued_then_granted(client)
            # The wait is over before the first poll: only the withdrawal runs.
            return await budgets._await_spend(client, "late/b", rid, time.monotonic())

    answer = asyncio.run(through_the_client())
    assert answer["state"] == "granted" and answer["amount"] == 1, answer


def test_decisions_survive_a_leader_kill(cluster: LocalCluster) -> None:
    """Spent before the kill stays spent after it (no refill: nothing may come back);
    a spend queued before the kill is granted under the new leader (the queue is in
    the replicated state, and the refill runs on log time the new leader continues)."""
    with cluster.client() as c:
        c.budget_set("kill/fixed", capacity=6, refill_per_s=0)
        c.spend("kill/fixed", 6)
        c.budget_set("kill/q", capacity=2, refill_per_s=1.0)
        c.spend("kill/q", 2)
        outcome: list[object] = []

        def waiter() -> None:
            with cluster.client() as w:
                try:
                    outcome.append(w.spend("kill/q", 2, wait=20.0))
                except Exception as exc:  # reported by the assertion below
                    outcome.append(exc)

        thread = threading.Thread(target=waiter)
        thread.start()
        wait_for(lambda: c.budget_get("kill/q").waiting == 1, 10, "the spend to queue")
        old = cluster.wait_for_leader()
        cluster.kill_node(old["node"])
        cluster.wait_for_leader(timeout=30, exclude=old["node"])
        thread.join(30)
        assert len(outcome) == 1 and getattr(outcome[0], "amount", None) == 2, outcome
        with pytest.raises(BudgetExhaustedError):
            c.spend("kill/fixed", 1)
        assert c.budget_get("kill/fixed").level == 0.0
