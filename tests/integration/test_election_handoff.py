"""Election observers see one leader to the next, no ``None`` inside a handoff
(issue 37; etcd-io/etcd#18163 is the same complaint about etcd).

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_election_handoff.py.
"""

from __future__ import annotations

import threading

import pytest

from raftlease import Leader
from raftlease.testing import LocalCluster, wait_for


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_observers_see_no_vacancy_inside_a_handoff(shared_cluster: LocalCluster) -> None:
    cluster = shared_cluster
    name = "handoff/coordinator"
    seen: list[Leader | None] = []
    done = threading.Event()

    def observer() -> None:
        with cluster.client() as oc:
            for leader in oc.election(name).observe():
                seen.append(leader)
                if done.is_set() and leader is None:
                    return

    thread = threading.Thread(target=observer, daemon=True)
    thread.start()
    wait_for(lambda: len(seen) >= 1 or None, 20, "the observer started")
    with (
        cluster.client() as c1,
        cluster.client() as c2,
        c1.session(owner="a1", ttl=10.0) as s1,
        c2.session(owner="a2", ttl=10.0) as s2,
    ):
        e1, e2 = c1.election(name), c2.election(name)
        e1.campaign("a1", session=s1)
        elected: list[object] = []
        campaign = threading.Thread(
            target=lambda: elected.append(e2.campaign("a2", session=s2)), daemon=True
        )
        campaign.start()
        wait_for(lambda: len(c1.waiters(name)) == 1 or None, 20, "a2 queued")
        e1.resign()  # the lead passes to a2 in the same log entry
        campaign.join(20)
        assert elected, "a2 was not elected"
        wait_for(lambda: any(x is not None and x.value == "a2" for x in seen) or None, 20, "a2")
        done.set()
        e2.resign()  # nobody waits: a real vacancy
    thread.join(20)
    values = [leader.value if leader else None for leader in seen]
    assert values == [None, "a1", "a2", None], values
    revisions = [leader.revision or 0 for leader in seen if leader is not None]
    assert revisions == sorted(revisions)
