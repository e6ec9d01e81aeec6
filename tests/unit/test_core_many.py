"""``acquire_many`` in the pure state machine (issue 40): several keys, all or none, in
one log entry, living by one lease session.

The safety claims (never two owners of a key, tokens only grow per key, a set is
granted whole or not at all) are checked after every entry of a seeded random
workload by ``check_entry``, and each check is shown to catch a deliberately broken
state machine (``_GrantsTheFreeKeys``, ``_IgnoresHolders``)."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from raftlease.core import LeaseStore
from raftlease.core.store import many_lease_id
from raftlease.limits import MAX_MANY_KEYS

pytestmark = pytest.mark.timeout(60)

Entry = dict[str, Any]


def many(
    now: int,
    keys: list[str] | dict[str, int],
    lid: str = "M1",
    owner: str = "alice",
    ttl: int = 1000,
    cid: str = "c1",
    seq: int = 1,
    **extra: Any,
) -> Entry:
    pairs = [[k, 1] for k in keys] if isinstance(keys, list) else [[k, u] for k, u in keys.items()]
    return {
        "op": "acquire_many",
        "now": now,
        "keys": pairs,
        "owner": owner,
        "ttl": ttl,
        "lid": lid,
        "cid": cid,
        "seq": seq,
        "ack": 1,
        **extra,
    }


def one(now: int, key: str, lid: str, owner: str = "bob", cid: str = "c2", seq: int = 1) -> Entry:
    return {
        "op": "acquire",
        "now": now,
        "key": key,
        "owner": owner,
        "ttl": 1000,
        "lid": lid,
        "cid": cid,
        "seq": seq,
        "ack": 1,
    }


def close(now: int, sid: str, cid: str = "c1", seq: int = 2) -> Entry:
    return {"op": "session_close", "now": now, "sid": sid, "cid": cid, "seq": seq, "ack": 1}


def holder_of(store: LeaseStore, key: str) -> str | None:
    held = store.holder(key)
    return None if held is None else str(held["owner"])


# ---------------------------------------------------------------- behaviour


def test_a_free_set_is_granted_whole_in_one_entry_with_a_token_per_key() -> None:
    store = LeaseStore()
    store.apply(one(1, "z", "L0"))
    before = store.revision
    result = store.apply(many(2, ["a", "b", "c"]))
    assert result["ok"], result
    assert result["lease_id"] == result["session"] == "M1"
    assert [lease["key"] for lease in result["leases"]] == ["a", "b", "c"]
    tokens = [lease["token"] for lease in result["leases"]]
    assert tokens == [before + 1, before + 2, before + 3]  # one revision per key, in order
    assert [lease["lease_id"] for lease in result["leases"]] == [
        many_lease_id("M1", i) for i in range(3)
    ]
    grants = [e for e in store.events if e["type"] == "grant"]
    assert [e["key"] for e in grants] == ["a", "b", "c"]  # all in this one entry
    assert all(holder_of(store, k) == "alice" for k in "abc")


def test_one_busy_key_refuses_the_whole_set_and_changes_nothing() -> None:
    store = LeaseStore()
    store.apply(one(1, "b", "L0"))
    plain = store.to_plain()
    result = store.apply(many(2, ["a", "b", "c"]))
    assert not result["ok"] and result["code"] == "LEASE_HELD"
    assert result["detail"]["keys"] == ["b"]
    assert holder_of(store, "a") is None and holder_of(store, "c") is None
    assert "M1" not in store.lease_sessions
    assert not [e for e in store.events if e["type"] == "grant"]
    after = store.to_plain()
    # Only log time, the applied count and the client's dedup record moved.
    for field in ("leases", "lease_sessions", "waiters", "revision", "capacity"):
        assert after.get(field) == plain.get(field), field


def test_a_queued_single_acquire_is_not_overtaken_by_a_set() -> None:
    store = LeaseStore()
    store.apply(one(1, "a", "L0"))
    queued = {**one(2, "a", "L1", owner="carol", cid="c3"), "wait": 5000}
    assert store.apply(queued)["queued"]
    store.apply({"op": "release", "now": 3, "key": "a", "lid": "L0", "cid": "c2", "seq": 2,
                 "ack": 1})  # fmt: skip
    assert holder_of(store, "a") == "carol"  # the waiter got it, not a later set
    assert store.apply(many(4, ["a", "b"]))["code"] == "LEASE_HELD"
    assert holder_of(store, "b") is None


def test_the_set_lives_by_one_session_closed_or_expired_whole() -> None:
    store = LeaseStore()
    assert store.apply(many(1, ["a", "b"], ttl=100))["ok"]
    kept = store.apply({"op": "session_keepalive", "now": 90, "sid": "M1", "cid": "c1",
                        "seq": 2, "ack": 1})  # fmt: skip
    assert kept["ok"] and kept["leases"] == 2
    store.apply({"op": "tick", "now": 150})
    assert holder_of(store, "a") == holder_of(store, "b") == "alice"  # kept alive
    store.apply({"op": "tick", "now": 190})
    assert holder_of(store, "a") is None and holder_of(store, "b") is None
    ends = [e for e in store.events if e["type"] == "expire"]
    assert sorted(e["key"] for e in ends) == ["a", "b"]  # both in the same entry
    assert store.apply(many(200, ["a", "b"], lid="M2", seq=3))["ok"]
    closed = store.apply(close(201, "M2", seq=4))
    assert closed["released"] == 2
    assert sorted(e["key"] for e in store.events if e["type"] == "release") == ["a", "b"]


def test_one_key_of_a_set_may_be_released_alone() -> None:
    store = LeaseStore()
    result = store.apply(many(1, ["a", "b"]))
    lid_b = result["leases"][1]["lease_id"]
    out = store.apply({"op": "release", "now": 2, "key": "b", "lid": lid_b, "cid": "c1",
                       "seq": 2, "ack": 1})  # fmt: skip
    assert out["ok"]
    assert holder_of(store, "a") == "alice" and holder_of(store, "b") is None


def test_units_capacity_and_priority() -> None:
    store = LeaseStore()
    assert store.apply(many(1, {"gpu": 2, "disk": 1}, capacity=3))["ok"]
    mismatch = store.apply(many(2, {"gpu": 1}, lid="M2", seq=2))  # capacity 1 asked
    assert mismatch["code"] == "CAPACITY_MISMATCH" and mismatch["detail"]["key"] == "gpu"
    assert store.apply(many(3, {"gpu": 2}, lid="M3", seq=3, capacity=3))["code"] == "LEASE_HELD"
    got = store.apply(many(4, {"gpu": 1, "disk": 2}, lid="M4", seq=4, capacity=3))
    assert got["ok"] and store.units_used("gpu") == 3 and store.units_used("disk") == 3
    shaper = store.apply(many(5, ["new"], lid="M5", seq=5, capacity=2, shaper=False))
    assert shaper["code"] == "PERMISSION_DENIED"


def test_quotas_count_every_key_and_the_session() -> None:
    store = LeaseStore()
    base = {"principal": "p"}
    out = store.apply(many(1, ["a", "b", "c"], quota=2, **base))
    assert out["code"] == "QUOTA_EXCEEDED"
    assert store.apply(many(2, ["a", "b"], quota=2, seq=2, **base))["ok"]
    out = store.apply(many(3, ["x"], lid="M2", seq=3, session_quota=1, **base))
    assert out["code"] == "QUOTA_EXCEEDED"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"keys": []}, "'keys'"),
        ({"keys": [["a", 1], ["a", 1]]}, "twice"),
        ({"keys": [[f"k{i}", 1] for i in range(MAX_MANY_KEYS + 1)]}, "'keys'"),
        ({"keys": [["a", 2]]}, "units"),
        ({"keys": [["a"]]}, "pairs"),
        ({"keys": [[3, 1]]}, "pairs"),
        ({"keys": "a"}, "'keys'"),
        ({"lid": ""}, "'lid'"),
        ({"ttl": 0}, "'ttl'"),
        ({"priority": 10**6}, "'priority'"),
        ({"capacity": 0}, "'capacity'"),
        ({"owner": 5}, "'owner'"),
        ({"session_quota": 0}, "'session_quota'"),
    ],
)
def test_malformed_entries_are_refused_and_change_nothing(change: Entry, why: str) -> None:
    store = LeaseStore()
    store.apply(one(1, "z", "L0"))
    plain = store.to_plain()
    result = store.apply({**many(2, ["a"]), **change})
    assert result["code"] == "BAD_REQUEST" and why in result["message"], result
    assert store.to_plain() == plain


def test_a_reused_set_id_is_refused() -> None:
    store = LeaseStore()
    store.apply(one(1, "z", "L0"))
    assert store.apply(many(2, ["a"], lid="L0", seq=1))["code"] == "BAD_REQUEST"
    store.apply({"op": "acquire", "now": 3, "key": "q", "owner": "o", "ttl": 100,
                 "lid": "M9/0", "cid": "c5", "seq": 1, "ack": 1})  # fmt: skip
    assert store.apply(many(4, ["b"], lid="M9", seq=2))["code"] == "BAD_REQUEST"


def test_a_retried_set_is_answered_from_the_dedup_table_not_applied_twice() -> None:
    store = LeaseStore()
    first = store.apply(many(1, ["a", "b"], lid="M1"))
    revision = store.revision
    # A retry after a lost answer: same client id and seq, a fresh lease id drawn.
    again = store.apply(many(2, ["a", "b"], lid="M2"))
    assert again == first and store.revision == revision
    assert "M2" not in store.lease_sessions
    forged = store.apply(many(3, ["a", "c"], lid="M3"))  # another request, same seq
    assert forged["code"] == "BAD_REQUEST" and store.revision == revision


def test_a_set_survives_a_snapshot() -> None:
    store = LeaseStore()
    store.apply(many(1, ["a", "b"]))
    restored = LeaseStore.from_plain(store.to_plain())
    assert restored.to_plain() == store.to_plain()
    assert restored.apply(close(2, "M1"))["released"] == 2
    assert restored.holder("a") is None and restored.holder("b") is None


# ------------------------------------------------- the safety checks, and broken builds


class _GrantsTheFreeKeys(LeaseStore):
    """Broken on purpose: takes the free keys of a set and skips the busy ones."""

    def _acquire_many(self, entry: dict[str, Any]) -> dict[str, Any]:
        free = [pair for pair in entry["keys"] if self.holder(pair[0]) is None]
        if not free:
            return super()._acquire_many(entry)
        return super()._acquire_many({**entry, "keys": free})

    # The dispatch table holds functions, not method names: point it at the override.
    _MUTATIONS: ClassVar = {**LeaseStore._MUTATIONS, "acquire_many": _acquire_many}


class _IgnoresHolders(LeaseStore):
    """Broken on purpose: takes a held key too."""

    def units_used(self, key: str) -> int:
        return 0


def check_entry(store: LeaseStore, entry: Entry, result: dict[str, Any]) -> list[str]:
    """What this entry broke: two owners of a key, a token not above the key's last,
    a set granted in part (a key of it not granted, or granted outside it)."""
    problems: list[str] = []
    for key, held in store.holders.items():
        # Every key of the workload is a lock (capacity 1): one holder at most.
        if isinstance(held, dict) and len(held) > 1:
            problems.append(f"{key} has {len(held)} holders")
    last: dict[str, int] = store.__dict__.setdefault("_checked_tokens", {})
    for event in store.events:
        if event["type"] == "grant":
            if event["token"] <= last.get(event["key"], 0):
                problems.append(f"token of {event['key']} went back")
            last[event["key"]] = event["token"]
    if entry["op"] == "acquire_many":
        keys = [pair[0] for pair in entry["keys"]]
        ids = [many_lease_id(entry["lid"], i) for i in range(len(keys))]
        granted = [e["key"] for e in store.events if e["type"] == "grant" and e["lease_id"] in ids]
        if granted and granted != keys:
            problems.append(f"set {keys} granted as {granted}")
        if result.get("ok") and granted != keys:
            problems.append(f"set {keys} answered ok with {granted} granted")
    return problems


def run_workload(store: LeaseStore, seed: int, steps: int = 400) -> list[str]:
    """Agents take random sets of 1 to 4 of 6 keys in random orders (and single keys),
    and release them by closing the set or by one key; ``check_entry`` after each."""
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(6)]
    problems: list[str] = []
    sets: list[str] = []
    singles: list[tuple[str, str]] = []
    seq = {f"c{a}": 1 for a in range(4)}
    for step in range(steps):
        now = step * 10
        cid = f"c{rng.randrange(4)}"
        seq[cid] += 1
        roll = rng.random()
        if roll < 0.45:
            chosen = rng.sample(keys, rng.randint(1, 4))
            entry = many(now, chosen, lid=f"M{step}", owner=cid, cid=cid, seq=seq[cid])
        elif roll < 0.6:
            entry = one(now, rng.choice(keys), f"L{step}", owner=cid, cid=cid, seq=seq[cid])
        elif roll < 0.85 and sets:
            entry = close(now, sets.pop(rng.randrange(len(sets))), cid=cid, seq=seq[cid])
        elif singles:
            key, lid = singles.pop(rng.randrange(len(singles)))
            entry = {"op": "release", "now": now, "key": key, "lid": lid, "cid": cid,
                     "seq": seq[cid], "ack": 1}  # fmt: skip
        else:
            entry = {"op": "tick", "now": now}
        result = store.apply(entry)
        if result.get("ok") and entry["op"] == "acquire_many":
            sets.append(entry["lid"])
        if result.get("ok") and entry["op"] == "acquire":
            singles.append((entry["key"], entry["lid"]))
        problems += check_entry(store, entry, result)
    return problems


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_sets_keep_every_safety_rule(seed: int) -> None:
    store = LeaseStore()
    assert run_workload(store, seed) == []
    granted = store.__dict__["_checked_tokens"]
    assert len(granted) == 6  # the workload did take every key


def test_the_checks_catch_a_partial_grant() -> None:
    problems = run_workload(_GrantsTheFreeKeys(), 1)
    assert any("granted as" in p for p in problems), problems[:3]


def test_the_checks_catch_two_owners() -> None:
    problems = run_workload(_IgnoresHolders(), 1)
    assert any("holders" in p for p in problems), problems[:3]


# ------------------------------------------- reads on another thread see whole entries


def test_apply_marks_itself_in_progress_for_reads_on_other_threads() -> None:
    seen: list[int] = []

    class _Watching(LeaseStore):
        def _grant(self, *args: Any, **kwargs: Any) -> Any:
            seen.append(self.apply_seq)
            return super()._grant(*args, **kwargs)

    store = _Watching()
    before = store.apply_seq
    store.apply(many(1, ["a", "b"]))
    assert all(seq % 2 == 1 for seq in seen) and len(seen) == 2  # odd while applying
    assert store.apply_seq == before + 2  # even again after, moved
    store.apply({"op": "nonsense", "now": 2})  # refused entries count too
    assert store.apply_seq == before + 4


class _Clock:
    def stamp(self, term: int, now: int) -> int:
        return now


class _Replica:
    def __init__(self, store: LeaseStore) -> None:
        self.store = store

    def term(self) -> int:
        return 0

    def last_applied(self) -> int:
        return 1


def _reads(store: LeaseStore) -> Any:
    from raftlease.server.reads import Reads

    replica = _Replica(store)
    return Reads(
        SimpleNamespace(node_id="n1"),  # type: ignore[arg-type]
        _Clock(),  # type: ignore[arg-type]
        replica=lambda: replica,  # type: ignore[arg-type,return-value]
        keepalives=lambda: None,
        require_leader=lambda: None,
        require_replica=lambda: replica,  # type: ignore[arg-type,return-value]
        propose=None,  # type: ignore[arg-type]
    )


def test_a_leader_lease_read_that_overlaps_an_apply_goes_through_the_log() -> None:
    from raftlease.protocol import Request

    request = Request(id=1, op="leases", args={"prefix": "", "limit": 10})
    store = LeaseStore()
    store.apply(many(1, ["a", "b"]))
    answer = _reads(store).local_read(request, "lease")
    assert answer is not None and [h["key"] for h in answer["leases"]] == ["a", "b"]

    class _AppliedMeanwhile(LeaseStore):
        """Every read overlaps an entry applied on the apply thread."""

        def list_leases(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
            self.apply_seq += 2
            return super().list_leases(*args, **kwargs)

    busy = _AppliedMeanwhile()
    assert _reads(busy).local_read(request, "lease") is None  # the caller uses the log
    busy.apply_seq = 1  # an apply in progress: never read
    assert _reads(busy).local_read(request, "lease") is None
    from raftlease.errors import UnavailableError

    with pytest.raises(UnavailableError):
        _reads(busy).local_read(request, "stale")
