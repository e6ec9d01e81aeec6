"""Election observers see one leader to the next, no ``None`` inside a handoff
(issue 37; etcd-io/etcd#18163 is the same complaint about etcd).

A leader that resigns while a candidate waits hands the lead over in one log entry
(release, then the waiter's grant). Observers used to yield ``None`` between the two:
a "no leader" that never existed in the log. The watch hub now marks such an end
``handoff`` (``mark_handoffs``) and ``observe`` skips it; a real vacancy (a
resignation with nobody waiting) still shows ``None``.

The unit half of these tests (no process); the integration half is
tests/integration/test_election_handoff.py.
"""

from __future__ import annotations

from typing import Any

from raftlease.server.watch import mark_handoffs


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
