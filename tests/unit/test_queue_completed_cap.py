"""The count bound on retained completed tasks (``max_completed_tasks``, issue 15).

A completed task is kept for its retention (up to 30 days); without a count bound any
principal allowed to put, claim and complete could grow every replica's memory and
snapshot for that long. The leader stamps ``max_completed_tasks`` into every
``task_complete`` entry (``max_completed``); after a completion, while more completed
tasks are retained than that, across all queues, the state machine drops the oldest
by ``(finished_at, put order)``, as retention would (no event, no revision).

Unit-level on ``LeaseStore`` (hand-made entries, as the leader proposes them), plus
the config check, the leader's stamp, and one small real cluster.

The unit half of these tests (no process); the integration half is
tests/integration/test_queue_completed_cap.py.
"""

from __future__ import annotations

import copy
import itertools
import random
from pathlib import Path
from typing import Any

import msgpack
import pytest

from raftlease import errors
from raftlease.config import NodeConfig
from raftlease.core import LeaseStore
from raftlease.errors import ConfigError
from raftlease.limits import DEFAULT_COMPLETED_TASKS
from raftlease.server.dispatch import draw_task_ids

Entry = dict[str, Any]
_seq = itertools.count(1)
#: Attempts that never expire within a test.
LONG = 10**9


def mut(op: str, now: int, queue: str = "q", **fields: Any) -> Entry:
    """A mutating task entry with a fresh (cid, seq)."""
    n = next(_seq)
    return {"op": op, "now": now, "cid": f"c{n}", "seq": 1, "ack": 1, "queue": queue, **fields}


def put(now: int, tid: str, queue: str = "q", **fields: Any) -> Entry:
    return mut("task_put", now, queue, tid=tid, payload="{}", **fields)


def claim(now: int, aid: str, queue: str = "q") -> Entry:
    return mut("task_claim", now, queue, aid=aid, worker="w", ttl=LONG)


def done(now: int, tid: str, aid: str, queue: str = "q", cap: int | None = None) -> Entry:
    fields: Entry = {"tid": tid, "aid": aid, "result": '"ok"'}
    if cap is not None:
        fields["max_completed"] = cap
    return mut("task_complete", now, queue, **fields)


def ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["ok"] is True, result
    return result


def completed(store: LeaseStore) -> set[str]:
    return {t.tid for t in store.tasks.tasks.values() if t.status == "completed"}


def restored(store: LeaseStore) -> LeaseStore:
    """A replica loaded from ``store``'s snapshot, through msgpack as a real dump is."""
    packed = msgpack.packb(store.to_plain(), use_bin_type=True)
    return LeaseStore.from_plain(msgpack.unpackb(packed, raw=False, strict_map_key=False))


def check_counters(store: LeaseStore) -> None:
    """Every counter the drops touch agrees with the task records."""
    tq = store.tasks
    tasks = list(tq.tasks.values())
    assert tq.completed == sum(t.status == "completed" for t in tasks)
    assert tq.open == sum(t.status != "completed" for t in tasks)
    for name, queue in tq.queues.items():
        mine = [t for t in tasks if t.queue == name]
        for status in ("ready", "delayed", "claimed", "dead", "completed"):
            assert queue.counts.get(status, 0) == sum(t.status == status for t in mine)
        # The dedup map never names a dropped task.
        assert all(tq.tasks[tid].queue == name for tid in queue.dedup.values())
    # No queue of a task is forgotten; no empty queue is kept.
    assert {t.queue for t in tasks} <= set(tq.queues)


def finish_all(store: LeaseStore, now: int, tids: list[str], cap: int | None) -> None:
    """Claim and complete ``tids`` (each the queue's oldest ready task), in order."""
    for tid in tids:
        got = ok(store.apply(claim(now, f"A-{tid}")))
        assert got["tid"] == tid
        ok(store.apply(done(now, tid, f"A-{tid}", cap=cap)))
        if cap is not None:
            assert len(completed(store)) <= cap
        check_counters(store)


# ---------------------------------------------------------------------- the rule


@pytest.mark.timeout(60)
def test_the_oldest_completed_task_is_dropped_first_and_the_bound_always_holds() -> None:
    s = LeaseStore()
    for i in range(6):
        ok(s.apply(put(0, f"T{i}", dedup_key=f"d{i}")))
    # T0..T2 finish at 10, 20, 30; then T3 at 40 makes four: T0 (the oldest) goes.
    for i, now in zip(range(4), (10, 20, 30, 40), strict=True):
        finish_all(s, now, [f"T{i}"], cap=3)
    assert completed(s) == {"T1", "T2", "T3"}
    revision = s.revision
    # A get of the dropped task answers as for retention; its dedup key is free again.
    got = s.apply({"op": "task_get", "now": 41, "queue": "q", "tid": "T0"})
    assert got["ok"] is False and got["code"] == "TASK_NOT_FOUND"
    assert got["code"] in errors.CODES
    again = ok(s.apply(put(42, "T0b", dedup_key="d0")))
    assert again["tid"] == "T0b" and not again.get("duplicate")
    assert ok(s.apply(put(42, "T9", dedup_key="d1")))["duplicate"] is True  # T1 is kept
    assert s.revision == revision + 1  # only the put's (and nothing for the get)
    # The next completions go on dropping the oldest.
    finish_all(s, 50, ["T4"], cap=3)
    assert completed(s) == {"T2", "T3", "T4"}
    stats = ok(s.apply({"op": "task_stats", "now": 51, "queue": "q"}))["stats"]
    assert stats["completed"] == 3 and stats["ready"] == 2


@pytest.mark.timeout(60)
def test_a_drop_emits_no_event_and_no_revision() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "A")))
    ok(s.apply(put(0, "B")))
    finish_all(s, 1, ["A"], cap=1)
    ok(s.apply(claim(2, "AB")))
    before_revision = s.revision
    ok(s.apply(done(3, "B", "AB", cap=1)))
    # Exactly the completion's event and revision (``events``: this entry's): A left
    # silently.
    assert s.revision == before_revision + 1
    assert [e["type"] for e in s.events] == ["task_complete"]
    assert completed(s) == {"B"}


@pytest.mark.timeout(60)
def test_ties_in_finish_time_are_broken_by_put_order() -> None:
    s = LeaseStore()
    for tid in ("P1", "P2", "P3"):
        ok(s.apply(put(0, tid)))
    aids = {tid: f"A-{tid}" for tid in ("P1", "P2", "P3")}
    for tid in ("P1", "P2", "P3"):
        assert ok(s.apply(claim(1, aids[tid])))["tid"] == tid
    # Completed at the same log time in reverse put order: P1, put first, is the
    # oldest and goes first, although it completed last.
    ok(s.apply(done(5, "P3", aids["P3"], cap=2)))
    ok(s.apply(done(5, "P2", aids["P2"], cap=2)))
    answer = ok(s.apply(done(5, "P1", aids["P1"], cap=2)))
    assert answer["tid"] == "P1"  # the completion itself was accepted and answered
    assert completed(s) == {"P2", "P3"}
    check_counters(s)


@pytest.mark.timeout(60)
def test_the_bound_spans_every_queue_and_a_lower_stamp_drops_the_excess_at_once() -> None:
    s = LeaseStore()
    for i, queue in enumerate(("a", "b", "c", "a", "b", "c")):
        ok(s.apply(put(0, f"T{i}", queue=queue)))
    for i, queue in enumerate(("a", "b", "c", "a", "b")):
        assert ok(s.apply(claim(10 + i, f"A{i}", queue=queue)))["tid"] == f"T{i}"
        ok(s.apply(done(10 + i, f"T{i}", f"A{i}", queue=queue, cap=10)))
    assert completed(s) == {"T0", "T1", "T2", "T3", "T4"}
    # The node's setting was lowered to 2: the next completion drops the three oldest.
    ok(s.apply(claim(20, "A5", queue="c")))
    ok(s.apply(done(20, "T5", "A5", queue="c", cap=2)))
    assert completed(s) == {"T4", "T5"}
    check_counters(s)
    # Queue "a" held only completed tasks, all dropped: it is forgotten.
    assert "a" not in s.tasks.queues


@pytest.mark.timeout(60)
def test_an_entry_without_the_stamp_uses_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    # The journal may hold completions written before the bound existed.
    assert DEFAULT_COMPLETED_TASKS == 50_000
    s = LeaseStore()
    for i in range(4):
        ok(s.apply(put(0, f"T{i}")))
    finish_all(s, 1, ["T0", "T1", "T2"], cap=None)
    assert completed(s) == {"T0", "T1", "T2"}  # far below 50 000
    # The same code path with a small default, to see it applied.
    from raftlease.core import queue as queue_module

    monkeypatch.setattr(queue_module, "DEFAULT_COMPLETED_TASKS", 2)
    finish_all(s, 2, ["T3"], cap=None)
    assert completed(s) == {"T2", "T3"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3", None, 2**31 + 1])
def test_a_malformed_stamp_is_refused_and_changes_nothing(bad: Any) -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "T")))
    ok(s.apply(claim(1, "A")))
    before = copy.deepcopy(s.to_plain())
    answer = s.apply({**done(2, "T", "A"), "max_completed": bad})
    assert answer["ok"] is False and answer["code"] == "BAD_REQUEST", answer
    assert "max_completed" in answer["message"]
    assert s.to_plain() == before


@pytest.mark.timeout(60)
def test_a_retried_completion_is_answered_from_the_dedup_table_under_another_stamp() -> None:
    # The stamp is node config, not the client's: a retry after the setting changed
    # (or through a leader with another setting) is the same request.
    s = LeaseStore()
    ok(s.apply(put(0, "T")))
    ok(s.apply(claim(1, "A")))
    entry = done(2, "T", "A", cap=5)
    first = ok(s.apply(dict(entry)))
    assert s.apply({**entry, "now": 3, "max_completed": 7}) == first


# ------------------------------------------------------------- snapshots, oracle


@pytest.mark.timeout(60)
def test_a_restored_replica_drops_exactly_the_same_tasks() -> None:
    s = LeaseStore()
    tids = [f"T{i:02d}" for i in range(40)]
    for i, tid in enumerate(tids):
        ok(s.apply(put(0, tid, retention=100 if i % 5 == 0 else LONG // 10)))
    # Finish times with ties; some tasks purged or dropped by retention, so the live
    # store's heap holds stale items that a restored one does not.
    for i, tid in enumerate(tids[:30]):
        ok(s.apply(claim(10 + i // 3, f"A{tid}")))
        ok(s.apply(done(10 + i // 3, tid, f"A{tid}", cap=25)))
    ok(s.apply(mut("task_purge", 30, tid="T29")))
    ok(s.apply({"op": "tick", "now": 115}))  # some with retention 100 are gone
    twin = restored(s)
    assert twin.to_plain() == s.to_plain()
    later: list[Entry] = []
    for i, tid in enumerate(tids[30:]):
        later += [claim(200 + i, f"A{tid}"), done(200 + i, tid, f"A{tid}", cap=12 - i)]
    later.append(mut("task_purge", 300, tid="T39"))
    for entry in later:
        assert twin.apply(copy.deepcopy(entry)) == s.apply(copy.deepcopy(entry)), entry
        assert twin.events == s.events
        assert twin.to_plain() == s.to_plain()
        check_counters(twin)
    assert len(completed(s)) == 2  # 12 - 9 = 3 after the last completion, T39 purged


class Oracle:
    """Which completed tasks are retained, the obvious way: a dict and a min()."""

    def __init__(self) -> None:
        #: tid -> (finished_at, put order, drop time by retention)
        self.done: dict[str, tuple[int, int, int]] = {}

    def advance(self, now: int) -> None:
        for tid in [t for t, (_, _, drop_at) in self.done.items() if drop_at <= now]:
            del self.done[tid]

    def complete(self, tid: str, now: int, order: int, retention: int, cap: int) -> None:
        self.done[tid] = (now, order, now + retention)
        while len(self.done) > cap:
            del self.done[min(self.done, key=lambda t: self.done[t][:2])]


def run_random_history(seed: int, steps: int) -> None:
    rng = random.Random(seed)
    s, twin, oracle = LeaseStore(), LeaseStore(), Oracle()
    now, order = 0, 0
    put_order: dict[str, tuple[int, int]] = {}  # tid -> (put order, retention)
    live: list[tuple[str, str, str]] = []  # (queue, tid, aid)
    queues = ("q0", "q1", "q2")
    for step in range(steps):
        now += rng.choice((0, 0, 1, 3, 20))
        oracle.advance(now)  # what this entry's advance drops (retention over)
        queue = rng.choice(queues)
        kind = rng.random()
        if kind < 0.35:
            tid = f"T{step}"
            retention = rng.choice((0, 5, 40, LONG // 10))
            fields: Entry = {"retention": retention}
            if rng.random() < 0.3:
                fields["dedup_key"] = f"d{rng.randrange(8)}"
            entry = put(now, tid, queue=queue, **fields)
        elif kind < 0.6:
            entry = claim(now, f"A{step}", queue=queue)
        elif kind < 0.9 and live:
            queue, tid, aid = live.pop(rng.randrange(len(live)))
            cap = rng.choice((1, 2, 3, 5, 8, 13))
            entry = done(now, tid, aid, queue=queue, cap=cap)
        elif kind < 0.95 and oracle.done:
            tid = rng.choice(sorted(oracle.done))
            entry = mut("task_purge", now, s.tasks.tasks[tid].queue, tid=tid)
        else:
            entry = {"op": "tick", "now": now}
        answer = s.apply(copy.deepcopy(entry))
        assert twin.apply(copy.deepcopy(entry)) == answer, (seed, step, entry)
        op = entry["op"]
        if op == "task_put" and answer.get("ok") and not answer.get("duplicate"):
            order += 1
            put_order[entry["tid"]] = (order, entry["retention"])
        elif op == "task_claim" and answer.get("claimed"):
            live.append((queue, answer["tid"], answer["aid"]))
        elif op == "task_complete":
            ok(answer)
            seq, retention = put_order[entry["tid"]]
            oracle.complete(entry["tid"], now, seq, retention, entry["max_completed"])
        elif op == "task_purge":
            ok(answer)
            del oracle.done[entry["tid"]]
        assert completed(s) == set(oracle.done), (seed, step, entry)
        check_counters(s)
        assert twin.events == s.events
        if step % 97 == 0:
            # The twin is now a replica restored from a snapshot: same choices after.
            twin = restored(s)
        if step % 25 == 0:
            assert twin.to_plain() == s.to_plain(), (seed, step)
    assert twin.to_plain() == s.to_plain()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(6))
def test_random_histories_agree_with_the_oracle_live_and_restored(seed: int) -> None:
    run_random_history(seed, 1_500)


@pytest.mark.timeout(120)
def test_the_heap_is_compacted_when_stale_items_pile_up() -> None:
    # Purges and retention leave stale heap items; the heap is rebuilt from the
    # records before it grows past twice the retained count (and 64).
    s = LeaseStore()
    for i in range(600):
        tid = f"T{i}"
        ok(s.apply(put(i, tid, retention=3)))
        ok(s.apply(claim(i, f"A{i}")))
        ok(s.apply(done(i, tid, f"A{i}", cap=1_000)))
        assert len(s.tasks._completed) <= max(64, 2 * s.tasks.completed) + 1
        check_counters(s)
    assert s.tasks.completed <= 4


# -------------------------------------------------------- config and the stamp


NODES = [{"id": "n1", "raft": "127.0.0.1:1", "client": "127.0.0.1:2"}]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "8"])
def test_max_completed_tasks_must_be_a_positive_integer(tmp_path: Path, value: Any) -> None:
    with pytest.raises(ConfigError, match="max_completed_tasks must be a positive integer"):
        NodeConfig.create(node_id="n1", nodes=NODES, data_dir=tmp_path, max_completed_tasks=value)


@pytest.mark.timeout(30)
def test_the_default_bound_and_the_leader_stamps_it_into_every_completion(
    tmp_path: Path,
) -> None:
    config = NodeConfig.create(node_id="n1", nodes=NODES, data_dir=tmp_path)
    assert config.max_completed_tasks == DEFAULT_COMPLETED_TASKS == 50_000

    def stamp(config: NodeConfig, op: str, entry: Entry) -> Entry:
        # What the leader adds before proposing (server/dispatch.py).
        draw_task_ids(config, op, entry)
        return entry

    entry: Entry = {"op": "task_complete", "queue": "q", "tid": "T", "aid": "A"}
    assert stamp(config, "task_complete", entry)["max_completed"] == 50_000
    small = NodeConfig.create(node_id="n1", nodes=NODES, data_dir=tmp_path, max_completed_tasks=7)
    # A client-sent value is overwritten: the stamp is the node's, never the client's.
    entry = {"op": "task_complete", "tid": "T", "aid": "A", "max_completed": 10**6}
    assert stamp(small, "task_complete", entry)["max_completed"] == 7
    for op in ("task_put", "task_claim", "task_fail", "task_release", "task_heartbeat"):
        assert "max_completed" not in stamp(config, op, {"op": op})
