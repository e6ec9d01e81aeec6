"""Guards on what raftlease relies on in PySyncObj 0.3.17 (docs/pysyncobj.md).

An upgrade that changes any of these must fail here, loudly, before it can change
behaviour in production.
"""

from __future__ import annotations

import pickle
from typing import Any

import msgpack
import pysyncobj
import pytest
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConsumer
from pysyncobj.version import VERSION

from raftlease.core import LeaseStore
from raftlease.replication import _fail_reason_error, _StoreConsumer

pytestmark = pytest.mark.timeout(30)


def test_pinned_version() -> None:
    assert VERSION == "0.3.17", "pysyncobj changed: re-check docs/pysyncobj.md and this file"


def test_apis_we_call_exist() -> None:
    for name in (
        "_isLeader",
        "_getLeader",
        "isReady",
        "destroy_synchronous",
        "raftCurrentTerm",
        "raftCommitIndex",
        "raftLastApplied",
        "hasQuorum",
    ):
        assert hasattr(SyncObj, name), name
    assert hasattr(SyncObjConsumer, "_serialize") and hasattr(SyncObjConsumer, "_deserialize")
    assert hasattr(pysyncobj, "replicated")


def test_fail_reasons_map_to_definite_and_indefinite_errors() -> None:
    definite = {FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER, FAIL_REASON.REQUEST_DENIED}
    indefinite = {
        FAIL_REASON.NOT_LEADER,
        FAIL_REASON.LEADER_CHANGED,
        FAIL_REASON.DISCARDED,
        FAIL_REASON.UNKNOWN_OUTCOME,
    }
    for reason in definite:
        assert _fail_reason_error(reason).definite is True, reason
    for reason in indefinite:
        assert _fail_reason_error(reason).definite is False, reason


def _acquire_entry(now: int = 10) -> bytes:
    entry: dict[str, Any] = {
        "op": "acquire",
        "now": now,
        "term": 1,
        "cid": "c",
        "seq": 1,
        "ack": 1,
        "key": "k",
        "owner": "o",
        "ttl": 1000,
        "lid": "lid-1",
    }
    packed: bytes = msgpack.packb(entry)
    return packed


def test_apply_never_raises_even_if_the_state_machine_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # PySyncObj trap 1: an exception inside a replicated method wedges every node.
    consumer = _StoreConsumer(observer=None)

    def boom(entry: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(consumer.store, "apply", boom)
    result = consumer.apply_entry(_acquire_entry(), _doApply=True)
    assert result["ok"] is False and result["code"] == "INTERNAL"
    garbage = consumer.apply_entry(b"\xc1not msgpack", _doApply=True)
    assert garbage["ok"] is False and garbage["code"] == "INTERNAL"


def test_snapshot_is_msgpack_bytes_not_a_pickled_object() -> None:
    consumer = _StoreConsumer(observer=None)
    assert consumer.apply_entry(_acquire_entry(), _doApply=True)["ok"] is True
    data = pickle.loads(pickle.dumps(consumer._serialize()))
    assert type(data) is bytes
    assert b"raftlease" not in pickle.dumps(consumer._serialize())
    restored = _StoreConsumer(observer=None)
    restored._deserialize(data)
    assert restored.store.to_plain() == consumer.store.to_plain()
    assert isinstance(restored.store, LeaseStore)
