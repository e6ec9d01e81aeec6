"""Per-principal task quotas (issue 37) on one real node with an auth file, and on
the same node a budget gate (issue 42, docs/budgets.md "Budget gates").

The integration half (a real node process: the leader's stamp, the wire error); the
unit half, with the whole description, is tests/unit/test_principal_task_quotas.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from raftlease import Client, QuotaExceededError
from raftlease.testing import LocalCluster
from tests.integration.test_security_caps import ADMIN_TOKEN, AGENT_TOKEN, OTHER_TOKEN, auth_file

Factory = Callable[..., LocalCluster]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_principals_puts_stop_at_its_task_and_queue_quotas(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    path = auth_file(tmp_path)
    # Budget gates ride this node (docs/budgets.md): agent-8's acquires draw 3 units
    # from the budget gate/b, its claims 2.
    gate = 'budget = { key = "gate/b", per_acquire = 3, per_claim = 2 }\n'
    path.write_text(path.read_text().replace('name = "agent-8"\n', 'name = "agent-8"\n' + gate))
    cluster = cluster_factory(
        1,
        auth_file=str(path),
        max_tasks_per_principal=3,
        max_queues_per_principal=2,
    )
    with (
        Client(cluster.endpoints, token=AGENT_TOKEN) as agent,
        Client(cluster.endpoints, token=OTHER_TOKEN) as other,
    ):
        a, b, c = agent.queue("a"), agent.queue("b"), agent.queue("c")
        a.put({"n": 1})
        b.put({"n": 2})
        with pytest.raises(QuotaExceededError) as refused:
            c.put({"n": 3})
        assert refused.value.definite
        assert refused.value.detail == {
            "quota": 2,
            "setting": "max_queues_per_principal",
            "principal": "agent-7",
            "queues": 2,
            "queue": "c",
        }
        assert c.stats().ready == 0  # nothing applied
        a.put({"n": 4})  # a queue it already uses: no new queue slot
        with pytest.raises(QuotaExceededError) as refused:
            a.put({"n": 5})
        assert refused.value.detail["setting"] == "max_tasks_per_principal"
        assert refused.value.detail["tasks"] == 3
        assert a.stats().ready == 2
        # Another principal is not affected.
        other.queue("a").put({"n": 6})
        # Completing a task frees its slot.
        task = a.claim(worker="w", lease_ttl=30)
        assert task is not None
        task.complete()
        a.put({"n": 7})
        # agent-8 is gated: each grant draws from gate/b in the granting entry.
        with Client(cluster.endpoints, token=ADMIN_TOKEN[0]) as admin:
            admin.budget_set("gate/b", capacity=5, refill_per_s=0)
            other.acquire("gpu/gated-1", owner="o", ttl=30)
            assert admin.budget_get("gate/b").level == 2.0
            with pytest.raises(QuotaExceededError) as refused:
                other.acquire("gpu/gated-2", owner="o", ttl=30)
            assert refused.value.definite and refused.value.detail["budget"] == "gate/b"
            assert refused.value.detail["cost"] == 3 and refused.value.detail["level"] == 2.0
            assert other.holder("gpu/gated-2") is None  # nothing granted
            assert other.queue("a").claim(worker="w", lease_ttl=30) is not None
            assert admin.budget_get("gate/b").level == 0.0
            agent.acquire("gpu/free", owner="o", ttl=30)  # agent-7 is not gated
            assert admin.budget_get("gate/b").level == 0.0
