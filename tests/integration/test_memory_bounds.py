"""What a node holds in memory stays bounded under steady load (issue 15, chaos
finding 5): the watch history is capped by an estimate of its bytes as well as by its
length, so a node's RSS levels off instead of growing with every change until 100,000
of them are held (~50 MB of short keys; over 1 GB of 4 KiB keys, owners and values).

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_memory_bounds.py.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from raftlease import CompactedError
from raftlease.server.watch import (
    EVENT_OVERHEAD,
    WATCH_HISTORY_BYTES,
)
from raftlease.testing import LocalCluster

Factory = Callable[..., LocalCluster]


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_node_keeps_a_bounded_watch_history_under_steady_writes(
    cluster_factory: Factory,
) -> None:
    """Real nodes: 1,500 grants carrying 4 KiB values (and their releases) are more
    than the 4 MiB history holds, so a watch from revision 1 is COMPACTED while one
    from a recent revision is served; with the count bound alone (100,000) all of
    them were kept."""
    cluster = cluster_factory(3)
    value = "v" * 4000
    per_event = EVENT_OVERHEAD + 4000
    with cluster.client() as client:

        def cycle(i: int) -> int:
            lease = client.acquire(f"mem/{i % 50}-{i}", owner="filler", ttl=30.0, value=value)
            client.release(lease)
            return lease.token

        with ThreadPoolExecutor(8) as pool:
            tokens = list(pool.map(cycle, range(1_500)))
        assert len(set(tokens)) == 1_500
        with pytest.raises(CompactedError):
            for _ in client.watch("mem/", from_revision=1):
                break
        # The last grants still fit (a grant carries its value: ~4.4 KB estimated).
        kept = WATCH_HISTORY_BYTES // (per_event + 64)
        recent = sorted(tokens)[-min(kept // 4, 100)]
        for event in client.watch("mem/", from_revision=recent):
            assert event.revision >= recent
            break
