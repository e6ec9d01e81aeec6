"""Per-principal task quotas (issue 37) on one real node with an auth file.

The integration half (a real node process: the leader's stamp, the wire error); the
unit half, with the whole description, is tests/unit/test_principal_task_quotas.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from raftlease import Client, QuotaExceededError
from raftlease.testing import LocalCluster
from tests.integration.test_security_caps import AGENT_TOKEN, OTHER_TOKEN, auth_file

Factory = Callable[..., LocalCluster]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_principals_puts_stop_at_its_task_and_queue_quotas(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    cluster = cluster_factory(
        1,
        auth_file=str(auth_file(tmp_path)),
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
