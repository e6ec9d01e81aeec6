"""The count bound on retained completed tasks (``max_completed_tasks``, issue 15).

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_queue_completed_cap.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from raftlease import TaskNotFoundError
from raftlease.testing import LocalCluster


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_cluster_retains_at_most_max_completed_tasks(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    small = cluster_factory(max_completed_tasks=2)
    with small.client() as c:
        q = c.queue("t-completed-cap")
        tids = [q.put(i) for i in range(3)]
        for tid in tids:
            task = q.claim(worker="w")
            assert task is not None and task.task_id == tid
            task.complete(tid)
        with pytest.raises(TaskNotFoundError):
            q.get(tids[0])  # the oldest completed task was dropped
        assert [q.get(tid).status for tid in tids[1:]] == ["completed", "completed"]
        assert q.stats().completed == 2
