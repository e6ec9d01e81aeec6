"""The learner stage of ``member add`` (docs/membership.md, "Add a node"): the leader
streams the log to the joining node, which counts for no commit, vote or leader lease,
and appends the change only once the node has caught up; meanwhile one change at a
time still holds. On real node processes, plus the transport's rule for a learner's
messages checked in process.

The unit half of these tests (no process); the integration half is
tests/integration/test_membership_learner.py."""

from __future__ import annotations

from typing import Any

import pytest

from raftlease.replication.transport import LeaseTransport


class _Guard:
    def __init__(self) -> None:
        self.replies: list[str] = []
        self.appends: list[str] = []

    def on_reply(self, node_id: str, *_: Any) -> None:
        self.replies.append(node_id)

    def on_append_entries(self, node_id: str, *_: Any) -> None:
        self.appends.append(node_id)

    def refuse_vote(self) -> bool:
        return False

    def has_quorum(self) -> bool:
        return False


class _Sync:
    raftCurrentTerm = 5
    raftCommitIndex = 0

    def _isLeader(self) -> bool:
        return True


class _Node:
    def __init__(self, node_id: str) -> None:
        self.id = node_id

    def __hash__(self) -> int:
        return hash(self.id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Node) and other.id == self.id


@pytest.mark.timeout(30)
def test_a_learner_counts_for_no_lease_vote_or_term(monkeypatch: pytest.MonkeyPatch) -> None:
    """A learner's acknowledgement reaches PySyncObj (its match index) but not the
    leader-lease guard; its vote requests, term notices and entries are dropped, so it
    can neither extend the leader lease nor depose the leader (docs/leader-lease.md)."""
    passed: list[tuple[str, str]] = []

    def parent(self: Any, node: Any, message: Any) -> None:
        passed.append((node.id, message["type"]))

    monkeypatch.setattr(LeaseTransport.__mro__[1], "_onMessageReceived", parent, raising=True)
    transport: Any = object.__new__(LeaseTransport)
    learner = _Node("127.0.0.1:9")
    transport._leaving = {}
    transport._learners = {learner.id: learner}
    transport._nodes = set()
    transport._readonlyNodes = {learner}
    transport._syncObj = _Sync()
    guard = _Guard()
    transport.guard = guard
    ack = {"type": "next_node_idx", "next_node_idx": 3, "success": True, "reset": False}
    ack.update({"rl_et": 5, "rl_e": 1.0, "rl_t": 1.0})
    transport._onMessageReceived(learner, ack)
    assert passed == [(learner.id, "next_node_idx")] and guard.replies == []
    for message in (
        {"type": "request_vote", "term": 9, "last_log_index": 9, "last_log_term": 9},
        {"type": "request_vote", "term": 9, "last_log_index": 0, "last_log_term": 0, "rl_bump": 1},
        {"type": "append_entries", "term": 9, "commit_index": 0, "prevLogIdx": 0},
        {"type": "apply_command", "command": b"x", "request_id": 1},
    ):
        transport._onMessageReceived(learner, message)
    assert passed == [(learner.id, "next_node_idx")]
    assert guard.replies == [] and guard.appends == []
    # Not connected as a read-only node (or gone): not even the acknowledgement.
    transport._readonlyNodes = set()
    transport._onMessageReceived(learner, ack)
    assert passed == [(learner.id, "next_node_idx")]
