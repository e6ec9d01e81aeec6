"""Keep-alives answered from the leader's memory (server/keepalive.py) and written
into the log later by ``extend`` entries (core/store.py); a new term's first entry
extends every lease and session by its TTL.

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_memory_keepalives.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from raftlease.errors import InvalidArgumentError
from raftlease.testing import LocalCluster, wait_for
from tests.integration.test_leader_lease import STEADY
from tests.unit.test_planted_bugs import status_of

pytestmark = pytest.mark.timeout(120)


# ------------------------------------------------------------- a real cluster


def _leader_status(cluster: LocalCluster) -> dict[str, Any]:
    status = status_of(cluster.node(cluster.leader_id()).client)
    assert status is not None
    return status


@pytest.mark.integration
def test_renewals_and_session_keepalives_are_answered_from_memory(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    # Every renewal below must be answered from memory, which the leader does only
    # while its leader lease is valid: STEADY timers, so that a heartbeat stalled on a
    # loaded machine does not end the lease (then one renewal goes through the log).
    cluster = cluster_factory(**STEADY)
    with cluster.client() as c:
        lease = c.acquire("mem/k", owner="a", ttl=2.0)
        start = _leader_status(cluster)
        assert start["keepalives"] == "memory"
        for _ in range(20):
            renewed = c.renew(lease)
        # Twenty renewals, no log write of their own: the revision did not move.
        after = _leader_status(cluster)
        assert after["keepalives_in_memory"] - start["keepalives_in_memory"] == 20
        assert after["revision"] == start["revision"]
        assert renewed.expires_at_ms > lease.expires_at_ms
        assert renewed.valid_until > lease.valid_until
        # Half a TTL before the logged expiry the leader writes the latest promise.
        wait_for(
            lambda: _leader_status(cluster)["keepalives_written"] > start["keepalives_written"],
            10,
            "the keep-alive written into the log",
        )
        read = c.read("mem/k")
        assert read.holder is not None and read.holder.token == lease.token
        # A new TTL is a log write, as before.
        revision = _leader_status(cluster)["revision"]
        longer = c.renew(lease, ttl=3.0)
        assert longer.ttl == 3.0 and _leader_status(cluster)["revision"] > revision

        session = c.session(owner="s", ttl=2.0).open()
        try:
            attached = c.acquire("mem/in-session", session=session)
            before = _leader_status(cluster)["keepalives_in_memory"]
            session.keepalive()
            session.keepalive()
            assert _leader_status(cluster)["keepalives_in_memory"] >= before + 2
            # A renew of an attached lease is still refused, by the log.
            with pytest.raises(InvalidArgumentError):
                c.renew(attached)
        finally:
            session.close()


@pytest.mark.integration
def test_keepalives_log_renews_through_the_log(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(keepalives="log")
    with cluster.client() as c:
        lease = c.acquire("log/k", owner="a", ttl=2.0)
        start = _leader_status(cluster)
        assert start["keepalives"] == "log"
        for _ in range(3):
            c.renew(lease)
        after = _leader_status(cluster)
        assert after["keepalives_in_memory"] == 0
        assert after["revision"] == start["revision"] + 3
