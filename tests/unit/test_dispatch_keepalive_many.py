"""``session_keepalive_many`` on the leader (server/dispatch.py ``keepalive_many``)
against a real ``LeaseStore``, without a cluster: one batch walks a bounded number of
attached leases, the sessions past the bound come back ``single`` (their own
keep-alive is bounded like any single one), sessions without leases are never
held back; a leader not yet able to answer from memory waits for it (bounded), and
one deposed meanwhile says NOT_LEADER. On real nodes: tests/integration/test_keepalive_batch.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from raftlease.clock import SystemClock
from raftlease.config import NodeConfig
from raftlease.core import LeaseStore
from raftlease.errors import NotLeaderError
from raftlease.protocol import Request
from raftlease.server import dispatch
from raftlease.server.dispatch import Dispatcher
from raftlease.server.keepalive import MemoryKeepalives
from raftlease.server.log_clock import LogClock
from tests.unit.test_core_lease_progress import _fresh_seq as _fresh_seq
from tests.unit.test_core_lease_progress import mut

pytestmark = pytest.mark.timeout(30)


class _Replica:
    """What the dispatcher asks a replica for: a leader of term 1 holding ``store``."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store

    def is_leader(self) -> bool:
        return True

    def term(self) -> int:
        return 1


class _Proposer:
    def __init__(self) -> None:
        self.keepalives = MemoryKeepalives()


def _dispatcher(
    tmp_path: Path,
    store: LeaseStore,
    lease: Callable[[], bool] = lambda: True,
    require_leader: Callable[[], None] = lambda: None,
) -> tuple[Dispatcher, _Proposer]:
    config = NodeConfig.create(
        node_id="n1",
        nodes=[{"id": "n1", "raft": "127.0.0.1:1", "client": "127.0.0.1:2"}],
        data_dir=tmp_path,
    )
    replica, proposer = _Replica(store), _Proposer()

    async def propose(entry: dict[str, Any]) -> Any:
        raise AssertionError(f"keepalive_many wrote to the log: {entry}")

    dispatcher = Dispatcher(
        config,
        LogClock(SystemClock()),
        auth=lambda: None,  # type: ignore[arg-type,return-value]
        replica=lambda: replica,  # type: ignore[arg-type,return-value]
        proposer=lambda: proposer,  # type: ignore[arg-type,return-value]
        require_leader=require_leader,
        lease_read_allowed=lease,
        propose=propose,
        metrics=None,
    )
    return dispatcher, proposer


def test_a_batch_walks_a_bounded_number_of_attached_leases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatch, "MAX_BATCH_ATTACHED", 5)
    store = LeaseStore()
    # s0..s3 carry 3 leases each; e0, e1 none.
    for s in range(4):
        sid = f"a{s}"
        assert store.apply(mut("session_open", "p", 0, sid=sid, owner="p", ttl=10_000))["ok"]
        for n in range(3):
            lease = mut("acquire", "p", 0, key=f"k{s}{n}", owner="p", lid=f"L{s}{n}", session=sid)
            assert store.apply(lease)["ok"]
    for sid in ("e0", "e1"):
        assert store.apply(mut("session_open", "p", 0, sid=sid, owner="p", ttl=10_000))["ok"]
    dispatcher, proposer = _dispatcher(tmp_path, store)
    sids = ["a0", "e0", "a1", "a2", "e1", "a3"]
    request = Request(
        id=1,
        op="session_keepalive_many",
        args={"session_ids": [[s, 1] for s in sids]},
        principal="",
    )
    answers = asyncio.run(dispatcher.keepalive_many(request))
    by_sid = {a["session_id"]: a for a in answers["sessions"]}
    assert [a["session_id"] for a in answers["sessions"]] == sids
    # a0 (3) is answered; a1 would make 6 > 5: single, and so are a2 and a3; the
    # sessions without leases are answered wherever they stand.
    single = {s for s, a in by_sid.items() if a.get("single")}
    assert single == {"a1", "a2", "a3"}
    assert by_sid["a0"]["leases"] == 3 and by_sid["e0"]["leases"] == 0
    assert by_sid["e1"]["leases"] == 0
    # Only the answered ones were promised (kept for the next extend entry).
    assert len(proposer.keepalives) == 3


def test_the_first_session_is_answered_whatever_it_carries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatch, "MAX_BATCH_ATTACHED", 2)
    store = LeaseStore()
    assert store.apply(mut("session_open", "p", 0, sid="b0", owner="p", ttl=10_000))["ok"]
    for n in range(3):
        lease = mut("acquire", "p", 0, key=f"k{n}", owner="p", lid=f"M{n}", session="b0")
        assert store.apply(lease)["ok"]
    dispatcher, _ = _dispatcher(tmp_path, store)
    request = Request(id=1, op="session_keepalive_many", args={"session_ids": [["b0", 1]]})
    (answer,) = asyncio.run(dispatcher.keepalive_many(request))["sessions"]
    assert answer["leases"] == 3 and not answer.get("single")


def _one_session(who: str = "p") -> LeaseStore:
    store = LeaseStore()
    assert store.apply(mut("session_open", who, 0, sid="c0", owner=who, ttl=10_000))["ok"]
    return store


def _ask(dispatcher: Dispatcher) -> dict[str, Any]:
    request = Request(id=1, op="session_keepalive_many", args={"session_ids": [["c0", 1]]})
    return asyncio.run(dispatcher.keepalive_many(request))


def test_a_leader_not_yet_able_to_answer_from_memory_waits_for_it(tmp_path: Path) -> None:
    """A new leader's lease and read barrier come a heartbeat round and a commit after
    its election: the batch waits for them instead of sending every session through
    the log (a write each, the storm that followed elections at 48,000 agents)."""
    asked = 0

    def lease() -> bool:
        nonlocal asked
        asked += 1
        return asked > 5  # valid from the fifth look on

    dispatcher, proposer = _dispatcher(tmp_path, _one_session(), lease)
    (answer,) = _ask(dispatcher)["sessions"]
    assert not answer.get("single") and answer["session_id"] == "c0"
    assert len(proposer.keepalives) == 1


def test_a_leader_that_stays_unable_answers_single_after_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatch, "MEMORY_WAIT", 0.05)
    dispatcher, proposer = _dispatcher(tmp_path, _one_session(), lambda: False)
    assert _ask(dispatcher)["sessions"] == [{"session_id": "c0", "single": True}]
    assert len(proposer.keepalives) == 0


def test_a_leader_deposed_while_it_waits_says_not_leader(tmp_path: Path) -> None:
    looks = 0

    def require_leader() -> None:
        nonlocal looks
        looks += 1
        if looks > 2:  # the first look, then one poll: deposed
            raise NotLeaderError("not the leader", {"leader": None})

    dispatcher, _ = _dispatcher(tmp_path, _one_session(), lambda: False, require_leader)
    with pytest.raises(NotLeaderError):
        _ask(dispatcher)
