"""Per-principal quotas on task queues (issue 37): ``max_tasks_per_principal`` and
``max_queues_per_principal``.

A security probe put 20,000 tasks of 4 KiB over 20 queues from one principal (250-260
MiB more on every node): only each queue was bounded (``max_queue_tasks``), not its
principal, and queues were unbounded in number. The leader now stamps both quotas into
every authenticated put (``tasks_quota``, ``queues_quota``) and the state machine
decides: what counts is every task the principal put that is not completed (ready,
delayed, claimed or dead: a dead task is kept until purged or retried), and the
distinct queues holding them. Completed tasks are bounded by ``max_completed_tasks``
instead. Counted incrementally, derived from the task records (so a restored snapshot
counts the same). An entry without a stamp (unauthenticated, or from an older build's
log) is not limited.

Unit-level on ``LeaseStore`` (hand-made entries, as the leader proposes them), plus
the config check and the leader's stamp.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import msgpack
import pytest

from raftlease import errors
from raftlease.config import NodeConfig
from raftlease.core import LeaseStore
from raftlease.errors import ConfigError, QuotaExceededError
from raftlease.limits import DEFAULT_PRINCIPAL_QUEUES, DEFAULT_PRINCIPAL_TASKS
from raftlease.server.dispatch import draw_task_ids

pytestmark = pytest.mark.timeout(60)

Entry = dict[str, Any]
_seq = itertools.count(1)
#: Attempts that never expire within a test.
LONG = 10**9
#: Fields of the snapshot that a refused entry may move (the dedup record, the
#: applied index and log time), as in tests/unit/test_security_quotas.py.
MOVED = ("sessions", "applied", "now")


def mut(op: str, now: int, queue: str, principal: str | None, **fields: Any) -> Entry:
    """A mutating task entry with a fresh (cid, seq), authenticated as ``principal``."""
    n = next(_seq)
    entry: Entry = {"op": op, "now": now, "cid": f"c{n}", "seq": 1, "ack": 1, "queue": queue}
    if principal is not None:
        entry["principal"] = principal
    return entry | fields


def put(
    now: int,
    tid: str,
    principal: str | None = "p",
    queue: str = "q",
    tasks: int | None = 3,
    queues: int | None = 100,
    **fields: Any,
) -> Entry:
    """A put as the leader stamps it: the principal's quotas (None: no stamp)."""
    entry = mut("task_put", now, queue, principal, tid=tid, payload="{}", **fields)
    if tasks is not None:
        entry["tasks_quota"] = tasks
    if queues is not None:
        entry["queues_quota"] = queues
    return entry


def claim(now: int, aid: str, queue: str = "q", principal: str | None = "w") -> Entry:
    return mut("task_claim", now, queue, principal, aid=aid, worker="w", ttl=LONG)


def done(now: int, tid: str, aid: str, queue: str = "q", principal: str | None = "w") -> Entry:
    return mut("task_complete", now, queue, principal, tid=tid, aid=aid, result='"ok"')


def fail(now: int, tid: str, aid: str, queue: str = "q", principal: str | None = "w") -> Entry:
    return mut("task_fail", now, queue, principal, tid=tid, aid=aid, error="boom")


def ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["ok"] is True, result
    return result


def refused(result: dict[str, Any]) -> dict[str, Any]:
    assert result["ok"] is False and result["code"] == "QUOTA_EXCEEDED", result
    return dict(result["detail"])


def restored(store: LeaseStore) -> LeaseStore:
    """A replica loaded from ``store``'s snapshot, through msgpack as a real dump is."""
    packed = msgpack.packb(store.to_plain(), use_bin_type=True)
    return LeaseStore.from_plain(msgpack.unpackb(packed, raw=False, strict_map_key=False))


def check_counts(store: LeaseStore) -> None:
    """The incremental counters equal a recount from the task records."""
    tq = store.tasks
    held: dict[str, int] = {}
    queues: dict[str, dict[str, int]] = {}
    for task in tq.tasks.values():
        if task.principal and task.status != "completed":
            held[task.principal] = held.get(task.principal, 0) + 1
            mine = queues.setdefault(task.principal, {})
            mine[task.queue] = mine.get(task.queue, 0) + 1
    assert tq.held_by == held
    assert tq.queues_by == queues
    assert tq.open == sum(t.status != "completed" for t in tq.tasks.values())


def unchanged(store: LeaseStore, before: dict[str, Any]) -> None:
    after = store.to_plain()
    assert {k: v for k, v in after.items() if k not in MOVED} == {
        k: v for k, v in before.items() if k not in MOVED
    }


# ---------------------------------------------------------------------- the rule


def test_a_put_at_the_task_quota_is_refused_definitely_and_changes_nothing() -> None:
    s = LeaseStore()
    for i in range(3):
        ok(s.apply(put(10, f"T{i}", tasks=3, delay=i * 1000)))  # ready and delayed
    assert s.tasks.held_by == {"p": 3}
    before = s.to_plain()
    revision, events = s.revision, len(s.events)
    entry = put(11, "T3", tasks=3)
    got = s.apply(dict(entry))
    assert refused(got) == {
        "quota": 3,
        "setting": "max_tasks_per_principal",
        "principal": "p",
        "tasks": 3,
    }
    assert "max_tasks_per_principal" in got["message"] and "p" in got["message"]
    # The wire code is the existing quota error: definite (nothing was applied).
    assert errors.error_class(got["code"]) is QuotaExceededError
    assert QuotaExceededError.definite is True
    unchanged(s, before)
    assert s.revision == revision and "T3" not in s.tasks.tasks
    assert len(s.events) <= events  # no event for a refusal
    check_counts(s)
    # A retry (same cid and seq) is answered from the dedup table: the same refusal.
    assert s.apply(dict(entry)) == got


def test_another_principal_and_unauthenticated_puts_are_not_limited_by_it() -> None:
    s = LeaseStore()
    for i in range(2):
        ok(s.apply(put(10, f"P{i}", principal="p", tasks=2)))
    refused(s.apply(put(11, "P2", principal="p", tasks=2)))
    # Another principal has its own count.
    for i in range(2):
        ok(s.apply(put(12, f"R{i}", principal="r", tasks=2)))
    refused(s.apply(put(13, "R2", principal="r", tasks=2)))
    # No principal (no auth file): never counted, never refused by it, even if stamped.
    for i in range(5):
        ok(s.apply(put(14, f"U{i}", principal=None, tasks=1, queues=1, queue=f"u{i}")))
    assert s.tasks.held_by == {"p": 2, "r": 2}
    assert set(s.tasks.queues_by) == {"p", "r"}
    check_counts(s)


def test_completing_frees_a_slot_a_dead_task_holds_it_until_purged_or_retried() -> None:
    s = LeaseStore()
    ok(s.apply(put(10, "A", tasks=2, max_attempts=1)))
    ok(s.apply(put(10, "B", tasks=2, max_attempts=1)))
    refused(s.apply(put(11, "C", tasks=2)))
    # Completing A frees its slot (completed tasks are bounded by max_completed_tasks).
    assert ok(s.apply(claim(12, "a1")))["tid"] == "A"
    ok(s.apply(done(13, "A", "a1")))
    assert s.tasks.held_by == {"p": 1}
    ok(s.apply(put(14, "C", tasks=2)))
    refused(s.apply(put(15, "D", tasks=2)))
    # B fails its only attempt: dead-lettered, but still held in memory until purged,
    # so it still counts (else dead tasks would grow without bound).
    assert ok(s.apply(claim(16, "b1")))["tid"] == "B"
    assert ok(s.apply(fail(17, "B", "b1")))["status"] == "dead"
    assert s.tasks.held_by == {"p": 2}
    refused(s.apply(put(18, "D", tasks=2)))
    # Retried: ready again, still counted once.
    ok(s.apply(mut("task_retry", 19, "q", "p", tid="B")))
    assert s.tasks.held_by == {"p": 2}
    check_counts(s)
    # Dead again, then purged: the slot is free.
    assert ok(s.apply(claim(20, "b2")))["tid"] == "B"
    ok(s.apply(fail(21, "B", "b2")))
    ok(s.apply(mut("task_purge", 22, "q", "p", tid="B")))
    assert s.tasks.held_by == {"p": 1}
    ok(s.apply(put(23, "D", tasks=2)))
    check_counts(s)
    # The completed task's retention ends (default 1 h) and the count bound on
    # completed tasks drops others: neither frees a slot a second time.
    ok(s.apply(mut("task_stats", 3_700_000, "q", None)))
    assert "A" not in s.tasks.tasks
    assert s.tasks.held_by == {"p": 2}
    check_counts(s)


def test_a_deadline_dead_letters_without_freeing_the_slot() -> None:
    s = LeaseStore()
    ok(s.apply(put(10, "A", tasks=1, deadline=100)))
    ok(s.apply(mut("task_stats", 200, "q", None)))  # log time passes the deadline
    assert s.tasks.tasks["A"].status == "dead"
    assert refused(s.apply(put(201, "B", tasks=1)))["tasks"] == 1
    check_counts(s)


def test_the_queue_quota_counts_distinct_queues_holding_open_tasks() -> None:
    s = LeaseStore()
    ok(s.apply(put(10, "A1", queue="a", queues=2)))
    ok(s.apply(put(10, "B1", queue="b", queues=2)))
    before = s.to_plain()
    got = s.apply(put(11, "C1", queue="c", queues=2))
    assert refused(got) == {
        "quota": 2,
        "setting": "max_queues_per_principal",
        "principal": "p",
        "queues": 2,
        "queue": "c",
    }
    unchanged(s, before)
    assert "c" not in s.tasks.queues
    # A queue it already holds tasks in takes no new slot.
    ok(s.apply(put(12, "A2", queue="a", queues=2)))
    # Another principal may use a third queue (and the same ones).
    ok(s.apply(put(12, "X", principal="x", queue="c", queues=2)))
    ok(s.apply(put(12, "Y", principal="x", queue="a", queues=2)))
    refused(s.apply(put(12, "C2", queue="c", queues=2)))  # c is x's slot, not p's
    # Once every task p has in b is completed, b's slot is free.
    assert ok(s.apply(claim(13, "b1", queue="b")))["tid"] == "B1"
    ok(s.apply(done(14, "B1", "b1", queue="b")))
    assert s.tasks.queues_by["p"] == {"a": 2}
    ok(s.apply(put(15, "C3", queue="c", queues=2)))
    assert s.tasks.queues_by["p"] == {"a": 2, "c": 1}
    check_counts(s)


def test_a_dedup_duplicate_at_the_quota_is_answered_not_refused() -> None:
    s = LeaseStore()
    first = ok(s.apply(put(10, "A", tasks=1, dedup_key="k")))
    again = ok(s.apply(put(11, "B", tasks=1, dedup_key="k")))
    assert again["duplicate"] is True and again["tid"] == first["tid"] == "A"
    assert s.tasks.held_by == {"p": 1}


def test_a_restored_snapshot_counts_the_same_and_refuses_the_same() -> None:
    s = LeaseStore()
    for i in range(3):
        ok(s.apply(put(10, f"T{i}", tasks=4, queues=2, queue="a" if i else "b")))
    ok(s.apply(put(10, "O", principal="o", tasks=4, queues=2)))
    assert ok(s.apply(claim(11, "c1", queue="b")))["tid"] == "T0"
    ok(s.apply(done(12, "T0", "c1", queue="b")))
    twin = restored(s)
    assert twin.tasks.held_by == s.tasks.held_by == {"p": 2, "o": 1}
    assert twin.tasks.queues_by == s.tasks.queues_by == {"p": {"a": 2}, "o": {"q": 1}}
    check_counts(twin)
    # The same entries give the same results on both (a refusal and a grant).
    for entry in (
        put(13, "N1", queue="c", tasks=4, queues=1),
        put(13, "N2", queue="c", tasks=4, queues=2),
        put(13, "N3", queue="d", tasks=4, queues=2),
        put(13, "N4", queue="a", tasks=3, queues=2),
        put(13, "N5", queue="a", tasks=4, queues=2),
    ):
        assert s.apply(dict(entry)) == twin.apply(dict(entry))
    assert s.to_plain() == twin.to_plain()
    assert twin.tasks.held_by == s.tasks.held_by == {"p": 4, "o": 1}


def test_entries_without_the_stamps_replay_as_before_but_are_counted() -> None:
    s = LeaseStore()
    # An older build's log: a principal but no stamps. Nothing limits these puts.
    for i in range(5):
        ok(s.apply(put(10, f"T{i}", tasks=None, queues=None, queue=f"q{i}")))
    assert s.tasks.held_by == {"p": 5} and len(s.tasks.queues_by["p"]) == 5
    # The first stamped put (a newer leader) sees what the old ones left.
    assert refused(s.apply(put(11, "N", tasks=5)))["tasks"] == 5
    assert refused(s.apply(put(11, "N", tasks=10, queues=5)))["queues"] == 5
    ok(s.apply(put(11, "N", tasks=10, queues=5, queue="q0")))
    # One stamp alone limits only its own quota.
    ok(s.apply(put(12, "M", tasks=None, queues=6, queue="new")))
    check_counts(s)


@pytest.mark.parametrize("field", ["tasks_quota", "queues_quota"])
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "8", 2**31 + 1])
def test_a_malformed_stamp_is_refused_before_anything_changes(field: str, value: Any) -> None:
    s = LeaseStore()
    before = s.to_plain()
    got = s.apply(put(10, "A") | {field: value})
    assert got["ok"] is False and got["code"] == "BAD_REQUEST", got
    assert "A" not in s.tasks.tasks
    unchanged(s, before)


def test_a_retry_after_a_quota_change_is_the_same_request() -> None:
    """The stamps are node config, not the client's: left out of the dedup
    fingerprint, so a retry through a leader with other quotas gets the first answer."""
    s = LeaseStore()
    first = put(10, "A", tasks=5, queues=5)
    got = ok(s.apply(first))
    retry = dict(first) | {"tid": "A2", "tasks_quota": 9, "queues_quota": 1, "now": 11}
    assert s.apply(retry) == got
    assert s.tasks.held_by == {"p": 1}


def test_counts_match_the_records_under_random_operations() -> None:
    """Every path that makes or ends an open task (put, claim, complete, fail to dead,
    expiry, deadline, retry, purge, retention) keeps the counters equal to a recount,
    never lets a stamped quota be passed, and a restored twin stays identical."""
    rng = random.Random(37)
    s = LeaseStore()
    twin = restored(s)
    principals = ["p", "r", None]
    queues = ["a", "b", "c", "d"]
    now = 0
    tid_n = itertools.count()
    aid_n = itertools.count()
    for step in range(1500):
        now += rng.choice((0, 1, 50, 500, 40_000))
        kind = rng.random()
        queue = rng.choice(queues)
        entry: Entry
        if kind < 0.4:
            entry = put(
                now,
                f"T{next(tid_n)}",
                principal=rng.choice(principals),
                queue=queue,
                tasks=rng.choice((3, 5, None)),
                queues=rng.choice((2, 3, None)),
                max_attempts=rng.choice((1, 2)),
                retention=rng.choice((0, 100_000)),
                deadline=rng.choice((0, 60_000)),
            )
            if entry["deadline"] == 0:
                del entry["deadline"]
        elif kind < 0.65:
            entry = mut("task_claim", now, queue, "w", aid=f"A{next(aid_n)}", worker="w")
            entry["ttl"] = rng.choice((30_000, LONG))
        elif kind < 0.85 and s.tasks.attempts:
            attempt = rng.choice(sorted(s.tasks.attempts.values(), key=lambda a: a.aid))
            task = s.tasks.tasks[attempt.tid]
            op = rng.choice(("task_complete", "task_fail", "task_release"))
            entry = mut(op, now, task.queue, "w", tid=task.tid, aid=attempt.aid)
        else:
            dead_or_done = sorted(
                t.tid for t in s.tasks.tasks.values() if t.status in ("dead", "completed")
            )
            if not dead_or_done:
                continue
            tid = rng.choice(dead_or_done)
            op = rng.choice(("task_retry", "task_purge"))
            entry = mut(op, now, s.tasks.tasks[tid].queue, "p", tid=tid)
        held = dict(s.tasks.held_by)
        mine = {k: set(v) for k, v in s.tasks.queues_by.items()}
        result = s.apply(dict(entry))
        assert twin.apply(dict(entry)) == result
        if entry["op"] == "task_put" and result["ok"] and not result.get("duplicate"):
            p = entry.get("principal")
            if p and "tasks_quota" in entry:
                assert held.get(p, 0) < entry["tasks_quota"]
            if p and "queues_quota" in entry and entry["queue"] not in mine.get(p, set()):
                assert len(mine.get(p, set())) < entry["queues_quota"]
        check_counts(s)
        if step % 250 == 0:
            twin = restored(s)
            check_counts(twin)
    assert s.to_plain() == twin.to_plain()


# -------------------------------------------------------- config and the stamp


NODES = [{"id": "n1", "raft": "127.0.0.1:1", "client": "127.0.0.1:2"}]


@pytest.mark.parametrize("name", ["max_tasks_per_principal", "max_queues_per_principal"])
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "8"])
def test_the_quotas_must_be_positive_integers(tmp_path: Path, name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"{name} must be a positive integer"):
        NodeConfig.create(node_id="n1", nodes=NODES, data_dir=tmp_path, **{name: value})


def test_the_defaults_and_the_leader_stamps_them_only_into_authenticated_puts(
    tmp_path: Path,
) -> None:
    config = NodeConfig.create(node_id="n1", nodes=NODES, data_dir=tmp_path)
    assert config.max_tasks_per_principal == DEFAULT_PRINCIPAL_TASKS == 10_000
    assert config.max_queues_per_principal == DEFAULT_PRINCIPAL_QUEUES == 1_000

    def stamp(config: NodeConfig, op: str, entry: Entry) -> Entry:
        draw_task_ids(config, op, entry)  # what the leader adds before proposing
        return entry

    entry = stamp(config, "task_put", {"op": "task_put", "queue": "q", "principal": "p"})
    assert entry["tasks_quota"] == 10_000 and entry["queues_quota"] == 1_000
    small = NodeConfig.create(
        node_id="n1",
        nodes=NODES,
        data_dir=tmp_path,
        max_tasks_per_principal=7,
        max_queues_per_principal=2,
    )
    # A client-sent value is overwritten: the stamp is the node's, never the client's.
    forged: Entry = {"op": "task_put", "principal": "p", "tasks_quota": 10**6}
    entry = stamp(small, "task_put", forged | {"queues_quota": 10**6})
    assert entry["tasks_quota"] == 7 and entry["queues_quota"] == 2
    # Unauthenticated: no stamp (and none a client could slip in).
    entry = stamp(small, "task_put", {"op": "task_put", "tasks_quota": 1, "queues_quota": 1})
    assert "tasks_quota" not in entry and "queues_quota" not in entry
    for op in ("task_claim", "task_complete", "task_fail", "task_release", "task_retry"):
        entry = stamp(config, op, {"op": op, "principal": "p"})
        assert "tasks_quota" not in entry and "queues_quota" not in entry


def waiting_claim(now: int, aid: str, queue: str, principal: str | None, **stamps: int) -> Entry:
    """A claim with ``wait`` as the leader stamps it (``waiters_total``, ``wait_quota``)."""
    entry = claim(now, aid, queue=queue, principal=principal) | {"wait": LONG}
    return entry | stamps


def test_waiting_claims_on_new_queue_names_stop_at_the_waiter_quotas() -> None:
    """A flood of waiting claims, each on a queue name of its own, grew the state for
    as long as the waits lasted: now a principal's waiting claims stop at its
    ``wait_quota`` and everyone's at ``waiters_total`` (QUOTA_EXCEEDED, nothing
    changed), a claim that leaves frees its slot, and a restored replica counts the
    same. A claim that finds a task needs no waiter slot."""
    store = LeaseStore()
    for i in range(3):
        ok(store.apply(waiting_claim(10 + i, f"a{i}", f"q{i}", "p", wait_quota=3)))
    before = store.to_plain()
    detail = refused(store.apply(waiting_claim(20, "a3", "q3", "p", wait_quota=3)))
    assert detail["quota"] == 3
    after = store.to_plain()
    assert {k: v for k, v in after.items() if k not in MOVED} == {
        k: v for k, v in before.items() if k not in MOVED
    }
    assert "q3" not in store.tasks.queues
    # Another principal is not locked out; everyone together stops at waiters_total.
    ok(store.apply(waiting_claim(21, "b0", "r0", "other", wait_quota=3, waiters_total=5)))
    ok(store.apply(waiting_claim(22, "n0", "r1", None, waiters_total=5)))
    detail = refused(store.apply(waiting_claim(23, "n1", "r2", None, waiters_total=5)))
    assert detail["quota"] == 5
    # A restored replica counts the same; a withdrawn claim frees its slot.
    replica = restored(store)
    assert replica.tasks.claims_by == store.tasks.claims_by == {"p": 3, "other": 1}
    cancel = mut("task_claim_cancel", 30, "q0", "p", aid="a0")
    ok(store.apply(cancel))
    assert store.tasks.claims_by["p"] == 2
    ok(store.apply(waiting_claim(31, "a4", "q4", "p", wait_quota=3)))
    # A claim that is granted at once needs no slot, whatever the quota.
    ok(store.apply(put(40, "T1", queue="q9")))
    got = ok(store.apply(waiting_claim(41, "a5", "q9", "p", wait_quota=3)))
    assert got.get("claimed") is not False, got


def test_the_leader_stamps_the_waiter_bounds_into_every_claim(tmp_path: Path) -> None:
    config = NodeConfig.create(
        node_id="n1", nodes=NODES, data_dir=tmp_path, max_waiters_per_principal=7
    )
    entry: Entry = {"op": "task_claim", "queue": "q", "principal": "p", "wait_quota": 10**6}
    draw_task_ids(config, "task_claim", entry)
    assert entry["wait_quota"] == 7 and entry["waiters_total"] == config.max_waiters_total
    anonymous: Entry = {"op": "task_claim", "queue": "q", "wait_quota": 1, "waiters_total": 9}
    draw_task_ids(config, "task_claim", anonymous)  # a client's values never survive
    assert "wait_quota" not in anonymous and anonymous["waiters_total"] == 100_000
