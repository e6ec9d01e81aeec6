"""Election observers see one leader to the next, no ``None`` inside a handoff
(issue 37; etcd-io/etcd#18163 is the same complaint about etcd).

A leader that resigns while a candidate waits hands the lead over in one log entry
(release, then the waiter's grant). Observers used to yield ``None`` between the two:
a "no leader" that never existed in the log. The watch hub now marks such an end
``handoff`` (``mark_handoffs``) and ``observe`` skips it; a real vacancy (a
resignation with nobody waiting) still shows ``None``.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from raftlease import Leader
from raftlease.server.watch import mark_handoffs
from raftlease.testing import LocalCluster, wait_for


def _ev(kind: str, key: str, revision: int) -> dict[str, Any]:
    return {"type": kind, "key": key, "owner": "o", "token": revision, "revision": revision}


def test_an_end_followed_by_a_grant_of_the_same_key_in_one_entry_is_a_handoff() -> None:
    events = [
        _ev("release", "e", 3),
        _ev("release", "other", 4),
        _ev("grant", "e", 5),
        _ev("expire", "x", 6),
    ]
    mark_handoffs(events)
    assert [e.get("handoff", False) for e in events] == [True, False, False, False]
    # A grant before the end (another key's waiter) does not make it a handoff.
    events = [_ev("grant", "e", 1), _ev("release", "e", 2)]
    mark_handoffs(events)
    assert "handoff" not in events[1]


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
