"""``session_keepalive_many`` on the leader (server/dispatch.py ``keepalive_many``)
against a real ``LeaseStore``, without a cluster: one batch walks a bounded number of
attached leases, the sessions past the bound come back ``single`` (their own
keep-alive is bounded like any single one), and sessions without leases are never
held back. On real nodes: tests/integration/test_keepalive_batch.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raftlease.clock import SystemClock
from raftlease.config import NodeConfig
from raftlease.core import LeaseStore
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


def _dispatcher(tmp_path: Path, store: LeaseStore) -> tuple[Dispatcher, _Proposer]:
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
        require_leader=lambda: None,
        lease_read_allowed=lambda: True,
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
    answers = dispatcher.keepalive_many(request)
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
    (answer,) = dispatcher.keepalive_many(request)["sessions"]
    assert answer["leases"] == 3 and not answer.get("single")
