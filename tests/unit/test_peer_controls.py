"""The test build's peer controls (``raftlease.testing.node.PeerControls``): what a
held peer's ``append_entries`` carry, and the election modes. The scenarios that use
them on real nodes are tests/integration/test_model_trails.py's."""

from __future__ import annotations

from typing import Any

import pytest

from raftlease.errors import BadRequestError
from raftlease.testing.node import PeerControls


class _Sync:
    raftCommitIndex = 7  # PySyncObj's name
    _SyncObj__raftElectionDeadline = 100.0
    _SyncObj__pipeNotifier = None


class _Transport:
    _syncObj = _Sync()


def controls() -> PeerControls:
    made = PeerControls()
    made.transport = _Transport()  # type: ignore[assignment]
    return made


def append(first: int, count: int, commit: int = 7) -> dict[str, Any]:
    entries = [(b"x", i, 1) for i in range(first, first + count)]
    return {
        "type": "append_entries",
        "term": 1,
        "commit_index": commit,
        "entries": entries,
        "prevLogIdx": first - 1,
        "prevLogTerm": 1,
    }


def test_an_unheld_peer_gets_the_message_and_its_entries_are_counted() -> None:
    c = controls()
    message = append(5, 3)
    assert c.outgoing("n2", message) is message
    assert c.hold({"peer": "n2", "what": "appends"})["sent"] == 7


def test_held_appends_are_heartbeats_that_commit_only_what_they_verify() -> None:
    c = controls()
    c.hold({"peer": "n2", "what": "appends"})
    message = append(5, 3, commit=9)
    out = c.outgoing("n2", message)
    assert out is not None and out is not message
    assert out["entries"] == [] and out["prevLogIdx"] == 4 and out["commit_index"] == 4
    assert message["entries"], "the leader's own message is not changed"
    assert c.outgoing("n3", message) is message, "another peer is not held"
    snapshot = {"type": "append_entries", "term": 1, "commit_index": 9, "serialized": None}
    assert c.outgoing("n2", snapshot) is None
    c.hold({"peer": "n2", "what": "nothing"})
    assert c.outgoing("n2", message) is message


def test_a_held_commit_stays_at_the_index_of_the_hold() -> None:
    c = controls()
    assert c.hold({"peer": "n2", "what": "commit"})["commit_index"] == 7
    out = c.outgoing("n2", append(8, 2, commit=9))
    assert out is not None and out["commit_index"] == 7 and len(out["entries"]) == 2
    same = append(8, 2, commit=6)
    assert c.outgoing("n2", same) is same


def test_election_modes() -> None:
    c = controls()
    sync = _Sync()
    c.before_tick(sync)
    assert sync._SyncObj__raftElectionDeadline == 100.0
    c.set_elections({"mode": "hold"})
    c.before_tick(sync)
    assert sync._SyncObj__raftElectionDeadline > 1000.0
    c.set_elections({"mode": "now"})
    c.before_tick(sync)
    assert sync._SyncObj__raftElectionDeadline == 0.0 and c.elections == "free"


@pytest.mark.parametrize(
    "message",
    [{"what": "appends"}, {"peer": "n2", "what": "everything"}, {"peer": 2, "what": "commit"}],
)
def test_a_bad_hold_is_refused(message: dict[str, Any]) -> None:
    with pytest.raises(BadRequestError):
        controls().hold(message)


def test_a_bad_election_mode_is_refused() -> None:
    with pytest.raises(BadRequestError):
        controls().set_elections({"mode": "soon"})
