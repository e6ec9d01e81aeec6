"""The state machine's wait queues, handoff, transfer and fence check."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

from raftlease.core import LeaseStore

pytestmark = pytest.mark.timeout(60)

_seq = iter(range(1, 10**9))


def acquire(
    now: int,
    key: str = "k",
    owner: str = "a",
    lid: str = "L",
    ttl: int = 1000,
    wait: int = 0,
    priority: int = 0,
) -> dict[str, Any]:
    return {
        "op": "acquire",
        "now": now,
        "cid": f"c-{lid}",
        "seq": next(_seq),
        "ack": 1,
        "key": key,
        "owner": owner,
        "lid": lid,
        "ttl": ttl,
        "wait": wait,
        "priority": priority,
    }


def release(now: int, lid: str, key: str = "k") -> dict[str, Any]:
    return {
        "op": "release",
        "now": now,
        "cid": f"r-{lid}",
        "seq": next(_seq),
        "ack": 1,
        "key": key,
        "lid": lid,
    }


def status(s: LeaseStore, lid: str, key: str = "k") -> dict[str, Any]:
    return s.lease_status(key, lid)


def test_waiters_are_granted_in_arrival_order_on_release() -> None:
    s = LeaseStore()
    first = s.apply(acquire(0, owner="a", lid="A"))
    assert first["ok"] and "queued" not in first
    for i, lid in enumerate(["B", "C", "D"], start=1):
        r = s.apply(acquire(10 * i, owner=lid.lower(), lid=lid, wait=5000))
        assert r["queued"] is True and r["position"] == i
    assert status(s, "C") == {"state": "waiting", "position": 2, "deadline": 5020}
    tokens = [first["token"]]
    for holder, nxt in (("A", "B"), ("B", "C"), ("C", "D")):
        r = s.apply(release(100 + len(tokens), holder))
        assert r["ok"]
        granted = [e for e in s.events if e["type"] == "grant"]
        assert [e["lease_id"] for e in granted] == [nxt], "handoff in the same entry"
        assert s.holder("k")["owner"] == nxt.lower()
        tokens.append(granted[0]["token"])
        assert status(s, nxt)["state"] == "held"
    assert tokens == sorted(tokens) and len(set(tokens)) == 4
    assert s.queues == {} and s.waiting == {}


def test_priority_first_then_fifo() -> None:
    s = LeaseStore()
    s.apply(acquire(0, lid="H"))
    s.apply(acquire(1, lid="low1", wait=9000, priority=0))
    s.apply(acquire(2, lid="high1", wait=9000, priority=5))
    s.apply(acquire(3, lid="low2", wait=9000, priority=0))
    s.apply(acquire(4, lid="high2", wait=9000, priority=5))
    order = []
    holder = "H"
    for t in range(10, 15):
        s.apply(release(t, holder))
        granted = [e["lease_id"] for e in s.events if e["type"] == "grant"]
        if not granted:
            break
        holder = granted[0]
        order.append(holder)
    assert order == ["high1", "high2", "low1", "low2"]


def test_expiry_of_the_holder_hands_over_and_late_waiters_leave() -> None:
    s = LeaseStore()
    s.apply(acquire(0, lid="A", ttl=100))
    s.apply(acquire(1, lid="B", wait=50))  # gives up at t=51
    s.apply(acquire(2, lid="C", wait=1000, ttl=300))
    s.apply({"op": "tick", "now": 60})
    assert [e["reason"] for e in s.events if e["type"] == "dequeue"] == ["deadline"]
    assert status(s, "B") == {"state": "gone"}
    s.apply({"op": "tick", "now": 100})  # A expires at 100: C is granted in that entry
    assert [e["type"] for e in s.events] == ["expire", "grant"]
    held = status(s, "C")
    assert held["state"] == "held" and held["expires_at"] == 400


def test_a_free_key_is_granted_at_once_even_with_wait() -> None:
    s = LeaseStore()
    r = s.apply(acquire(0, lid="A", wait=1000))
    assert r["ok"] and "queued" not in r and s.holder("k")["owner"] == "a"


def test_cancel_a_queued_acquire_by_releasing_it() -> None:
    s = LeaseStore()
    s.apply(acquire(0, lid="A"))
    s.apply(acquire(1, lid="B", wait=1000))
    s.apply(acquire(2, lid="C", wait=1000))
    r = s.apply(release(3, "B"))
    assert r == {"ok": True, "key": "k", "cancelled": True}
    s.apply(release(4, "A"))
    assert s.holder("k")["owner"] == "a" and status(s, "C")["state"] == "held"


def test_no_wait_acquire_reports_the_queue_length() -> None:
    s = LeaseStore()
    s.apply(acquire(0, lid="A"))
    s.apply(acquire(1, lid="B", wait=1000))
    r = s.apply(acquire(2, lid="X"))
    assert r["code"] == "LEASE_HELD" and r["detail"]["waiting"] == 1


def test_transfer_hands_over_atomically_with_a_new_token() -> None:
    s = LeaseStore()
    old = s.apply(acquire(0, lid="A", owner="alice", ttl=1000))
    s.apply(acquire(1, lid="W", wait=5000))
    r = s.apply(
        {
            "op": "transfer",
            "now": 5,
            "cid": "t",
            "seq": 1,
            "ack": 1,
            "key": "k",
            "lid": "A",
            "owner": "bob",
            "new_lid": "B2",
        }
    )
    assert r["ok"] and r["owner"] == "bob" and r["lease_id"] == "B2"
    assert r["token"] > old["token"] and r["expires_at"] == 1005
    assert [e["type"] for e in s.events] == ["transfer", "grant"]
    assert status(s, "A")["state"] == "gone"
    assert status(s, "W")["state"] == "waiting", "waiters keep their place"
    stranger = s.apply(
        {
            "op": "transfer",
            "now": 6,
            "cid": "t",
            "seq": 2,
            "ack": 1,
            "key": "k",
            "lid": "A",
            "owner": "eve",
            "new_lid": "E",
        }
    )
    assert stranger["code"] == "NOT_OWNER"


def test_fence_check() -> None:
    s = LeaseStore()
    r = s.apply(acquire(0, lid="A"))
    token = r["token"]
    assert s.fence("k", token) == {"key": "k", "current": True, "holder_token": token}
    assert s.fence("k", token - 1)["current"] is False
    s.apply(release(1, "A"))
    assert s.fence("k", token) == {"key": "k", "current": False, "holder_token": None}
    via_log = s.apply({"op": "fence", "now": 2, "key": "k", "token": token})
    assert via_log["ok"] and via_log["current"] is False


@pytest.mark.parametrize(
    "bad",
    [{"wait": -1}, {"wait": 1.5}, {"wait": True}, {"priority": 10**6}, {"priority": "hi"}],
)
def test_bad_wait_or_priority_is_rejected_unchanged(bad: dict[str, Any]) -> None:
    s = LeaseStore()
    s.apply(acquire(0, lid="A"))
    before = s.to_plain()
    r = s.apply({**acquire(1, lid="B", wait=10), **bad})
    assert r["code"] == "BAD_REQUEST"
    assert s.to_plain() == before


def test_queues_survive_snapshot_and_replay_is_deterministic() -> None:
    rng = random.Random(7)
    log = []
    now = 0
    lids = [f"L{i}" for i in range(12)]
    for _ in range(300):
        now += rng.randrange(0, 40)
        lid = rng.choice(lids)
        kind = rng.random()
        if kind < 0.5:
            log.append(
                acquire(
                    now,
                    key=rng.choice("xy"),
                    lid=lid,
                    ttl=rng.randrange(20, 200),
                    wait=rng.choice([0, 50, 500]),
                    priority=rng.randrange(-1, 2),
                )
            )
        elif kind < 0.8:
            log.append(release(now, lid, key=rng.choice("xy")))
        else:
            log.append({"op": "tick", "now": now})
    whole, split = LeaseStore(), None
    results_whole = []
    results_split = []
    revisions: list[int] = []
    for i, entry in enumerate(log):
        results_whole.append(whole.apply(entry))
        revisions += [e["revision"] for e in whole.events if "revision" in e]
        if i == 150:
            plain = msgpack.unpackb(msgpack.packb(whole.to_plain()), strict_map_key=False)
            split = LeaseStore.from_plain(plain)
    assert split is not None
    for entry in log[151:]:
        results_split.append(split.apply(entry))
    assert results_split == results_whole[151:]
    assert split.to_plain() == whole.to_plain()
    # Every change has its own revision, in order (what watches will stream).
    assert revisions == sorted(set(revisions)) and revisions
    # And at most one holder per key, with waiters never left behind on a free key.
    for key, queue in whole.queues.items():
        assert queue and key in whole.holders


def test_batch_applies_each_request_in_order_with_the_batch_stamp() -> None:
    s, one_by_one = LeaseStore(), LeaseStore()
    subs = [
        acquire(0, key="b1", lid="X1"),
        acquire(0, key="b1", lid="X2", wait=100),
        release(0, "X1", key="b1"),
    ]
    for sub in subs:
        sub.pop("now")
    r = s.apply({"op": "batch", "now": 50, "term": 3, "entries": subs})
    assert r["ok"] and len(r["results"]) == 3
    assert r["results"][1]["queued"] is True
    assert [e["type"] for e in s.events] == ["grant", "release", "grant"]
    assert s.holder("b1")["token"] == 3 and s.now == 50 and s.term == 3
    expected = [one_by_one.apply({**sub, "now": 50, "term": 3}) for sub in subs]
    assert r["results"] == expected and s.to_plain() == one_by_one.to_plain()


@pytest.mark.parametrize("entries", [[], "nope", [{"op": "batch", "entries": []}], [None]], ids=str)
def test_bad_batches_change_nothing_or_refuse_the_bad_part(entries: Any) -> None:
    s = LeaseStore()
    before = s.to_plain()
    r = s.apply({"op": "batch", "now": 5, "term": 1, "entries": entries})
    if isinstance(entries, list) and entries:
        assert r["ok"] and all(x["code"] == "BAD_REQUEST" for x in r["results"])
    else:
        assert r["code"] == "BAD_REQUEST"
    assert s.to_plain() == before
