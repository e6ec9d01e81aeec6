"""Weighted fair shares between tenants (fairness keys) of a task queue, in the pure
state machine (core/queue.py ``_best_ready``/``_charge``; docs/queues.md, "Fair
shares").

Every test drives ``LeaseStore.apply`` with hand-made entries, as the leader would
propose them (log time, drawn ids, the ``aging`` stamp)."""

from __future__ import annotations

import copy
import random
from typing import Any

import msgpack
import pytest

from raftlease.core import LeaseStore
from raftlease.core.task_records import READY
from raftlease.limits import MAX_QUEUE_TENANTS
from tests.unit.test_core_tasks import claim, code, done, fail, mut, ok, put

pytestmark = pytest.mark.timeout(60)

Entry = dict[str, Any]


def backlog(weights: dict[str, int], claims: int, per_tenant: int = 20) -> dict[str, int]:
    """Tenants with ``weights``, each kept at ``per_tenant`` ready tasks (a put for
    every task claimed: a permanent backlog), ``claims`` claims each completed at
    once. The claims each tenant got."""
    s = LeaseStore()
    n = 0
    owner: dict[str, str] = {}
    for name, weight in sorted(weights.items()):
        for _ in range(per_tenant):
            n += 1
            key = {"fairness_key": name} if name else {}
            ok(s.apply(put(0, f"t{n}", weight=weight, aging=1000, **key)))
            owner[f"t{n}"] = name
    got = dict.fromkeys(weights, 0)
    for k in range(1, claims + 1):
        now = k
        tid = ok(s.apply(claim(now, f"a{k}")))["tid"]
        ok(s.apply(done(now, tid, f"a{k}")))
        tenant = owner[tid]
        got[tenant] += 1
        n += 1
        key = {"fairness_key": tenant} if tenant else {}
        ok(s.apply(put(now, f"t{n}", aging=1000, **key)))
        owner[f"t{n}"] = tenant
    return got


def test_two_tenants_3_to_1_get_75_and_25_percent_of_2000_claims() -> None:
    """The issue's figure, in the state machine: a permanent backlog for both, weights
    3:1. Stride scheduling is exact up to one claim: 1500 and 500."""
    got = backlog({"alpha": 3, "beta": 1}, 2000)
    assert abs(got["alpha"] / 2000 - 0.75) <= 0.05 and abs(got["beta"] / 2000 - 0.25) <= 0.05
    assert abs(got["alpha"] - 1500) <= 1 and abs(got["beta"] - 500) <= 1


def test_three_tenants_share_by_weight_and_the_default_tenant_is_one_of_them() -> None:
    """Tasks without a key are the default tenant "" (weight 1): a tenant like any."""
    got = backlog({"": 1, "b": 2, "c": 5}, 800)
    assert got == {"": 100, "b": 200, "c": 500}


def test_equal_weights_alternate_and_ties_go_to_the_smaller_name() -> None:
    s = LeaseStore()
    for i in range(3):
        ok(s.apply(put(0, f"b{i}", fairness_key="b")))
        ok(s.apply(put(0, f"a{i}", fairness_key="a")))
    order = [ok(s.apply(claim(1, f"x{k}")))["tid"] for k in range(6)]
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_within_a_tenant_the_aged_priority_order_holds() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "lo", fairness_key="a", priority=0, aging=1000)))
    ok(s.apply(put(0, "hi", fairness_key="a", priority=5, aging=1000)))
    ok(s.apply(put(0, "b", fairness_key="b", priority=-5, aging=1000)))
    order = [ok(s.apply(claim(1, f"x{k}")))["tid"] for k in range(3)]
    # a's best (hi) first (a < b at equal pass), then b's turn, whatever its priority.
    assert order == ["hi", "b", "lo"]


def test_a_tenant_back_from_idling_gets_no_burst_of_claims() -> None:
    """b idles while a gets 50 claims; when b has tasks again it starts at the queue's
    virtual time, so with equal weights the two alternate (no 50 claims for b)."""
    s = LeaseStore()
    for i in range(60):
        ok(s.apply(put(0, f"a{i}", fairness_key="a")))
    for k in range(50):
        ok(s.apply(claim(1, f"x{k}")))
    for i in range(10):
        ok(s.apply(put(2, f"b{i}", fairness_key="b")))
    order = [ok(s.apply(claim(3, f"y{k}")))["tid"][0] for k in range(10)]
    # b starts at the virtual time (a's 50th claim's start, one stride behind a): it
    # goes first, then they alternate (a wins the ties: the smaller name).
    assert "".join(order) == "bababababa"


def test_a_new_tenant_starts_at_the_virtual_time_not_ahead_of_one_waiting_there() -> None:
    """After claims a, b, a, b, a (weight 1 each: a at pass 3e6, b at 2e6, the virtual
    time 2e6), z's first put places it at 2e6, where b already waits: the tie goes to
    b (the smaller name), then z; a newcomer does not jump the queue with pass 0."""
    s = LeaseStore()
    for i in range(5):
        ok(s.apply(put(0, f"a{i}", fairness_key="a")))
        ok(s.apply(put(0, f"b{i}", fairness_key="b")))
    first = [ok(s.apply(claim(1, f"x{k}")))["tid"][0] for k in range(5)]
    assert "".join(first) == "ababa"
    for i in range(3):
        ok(s.apply(put(2, f"z{i}", fairness_key="z")))
    assert s.tasks.queues["q"].tenants["z"].vpass == 2_000_000
    then = [ok(s.apply(claim(3, f"y{k}")))["tid"][0] for k in range(5)]
    assert "".join(then) == "bzabz"


def test_a_tenant_whose_tasks_the_worker_cannot_run_does_not_block_the_others() -> None:
    """a is first in turn but needs a GPU; a CPU worker gets b's task, and a keeps its
    turn for the next worker that can run it."""
    s = LeaseStore()
    ok(s.apply(put(0, "a0", fairness_key="a", requires={"gpu": "1"})))
    ok(s.apply(put(0, "a1", fairness_key="a", requires={"gpu": "1"})))
    ok(s.apply(put(0, "b0", fairness_key="b")))
    ok(s.apply(put(0, "b1", fairness_key="b")))
    assert ok(s.apply(claim(1, "c1")))["tid"] == "b0"
    assert ok(s.apply(claim(1, "g1", caps={"gpu": "1"})))["tid"] == "a0"
    assert ok(s.apply(claim(1, "c2")))["tid"] == "b1"
    assert ok(s.apply(claim(1, "c3"))).get("claimed") is False  # only a1 left: GPU only
    assert ok(s.apply(claim(1, "g2", caps={"gpu": "1"})))["tid"] == "a1"


def test_a_task_handed_to_a_waiting_claim_counts_as_its_tenants_claim() -> None:
    s = LeaseStore()
    ok(s.apply(claim(0, "w1", wait=10_000)))
    ok(s.apply(put(1, "a0", fairness_key="a")))  # handed to w1 at once: a's turn
    assert s.tasks.current["a0"] == "w1"
    ok(s.apply(put(2, "a1", fairness_key="a")))
    ok(s.apply(put(2, "b0", fairness_key="b")))
    assert ok(s.apply(claim(3, "x")))["tid"] == "b0"  # b is behind a now


def test_the_latest_put_that_names_a_weight_sets_it() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "a0", fairness_key="a", weight=4)))
    ok(s.apply(put(0, "a1", fairness_key="a")))  # no weight: unchanged
    assert s.tasks.queues["q"].tenants["a"].weight == 4
    ok(s.apply(put(0, "a2", fairness_key="a", weight=2)))
    assert s.tasks.queues["q"].tenants["a"].weight == 2
    ok(s.apply(put(0, "d", weight=7)))  # the default tenant has a weight too
    assert s.tasks.queues["q"].tenants[""].weight == 7


def test_a_tenant_with_no_open_task_is_forgotten() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "a0", fairness_key="a", weight=9)))
    ok(s.apply(claim(1, "x")))
    ok(s.apply(done(2, "a0", "x")))
    assert "a" not in s.tasks.queues["q"].tenants
    info = ok(s.apply({"op": "task_get", "now": 3, "queue": "q", "tid": "a0"}))["task"]
    assert info["fairness_key"] == "a"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("fairness_key", 7),
        ("fairness_key", ""),
        ("fairness_key", "k" * 129),
        ("fairness_key", None),
        ("weight", 0),
        ("weight", 1001),
        ("weight", -1),
        ("weight", True),
        ("weight", 2.0),
        ("weight", "3"),
        ("weight", 2**70),
    ],
)
def test_a_hostile_key_or_weight_is_refused_and_changes_nothing(field: str, value: Any) -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "a0", fairness_key="a")))
    before = s.to_plain()
    assert code(s.apply(put(1, "x", **{field: value}))) == "BAD_REQUEST"
    after = s.to_plain()
    # Only log time and the applied count move (as for any refused entry).
    for plain in (before, after):
        plain.pop("now"), plain.pop("applied"), plain.pop("sessions")
    assert after == before


def test_a_queue_holds_at_most_1000_tenants_and_the_next_is_refused_unchanged() -> None:
    s = LeaseStore()
    for i in range(MAX_QUEUE_TENANTS - 1):
        ok(s.apply(put(0, f"t{i}", fairness_key=f"k{i}")))
    ok(s.apply(put(0, "d")))  # the default tenant counts too
    before = s.tasks.to_plain()
    result = s.apply(put(1, "over", fairness_key="new"))
    assert code(result) == "QUOTA_EXCEEDED" and result["detail"]["quota"] == MAX_QUEUE_TENANTS
    assert s.tasks.to_plain() == before
    ok(s.apply(put(1, "more", fairness_key="k3")))  # an existing tenant: fine
    ok(s.apply(claim(2, "x")))  # "" goes first (smallest name at pass 0)
    ok(s.apply(done(3, "d", "x")))  # "" has no open task left: a place is free
    ok(s.apply(put(4, "now", fairness_key="new")))


def test_without_fairness_keys_every_claim_takes_the_old_order() -> None:
    """A property test against the order before fair shares: a claim takes the ready
    task with the smallest (rank, put order) whose requirements the claim's
    capabilities satisfy, on random histories of puts (priorities, delays,
    requirements), claims, failures, releases and completions with no fairness key."""
    rng = random.Random(42)
    caps_choices: list[dict[str, str]] = [{}, {"gpu": "1"}, {"gpu": "1", "os": "l"}]
    for _ in range(20):
        s = LeaseStore()
        live: list[tuple[str, str]] = []  # (tid, aid) of claimed tasks
        now = 0
        for step in range(120):
            now += rng.randrange(0, 400)
            roll = rng.random()
            if roll < 0.45:
                fields: dict[str, Any] = {"priority": rng.randrange(-3, 4), "aging": 1000}
                if rng.random() < 0.2:
                    fields["delay"] = rng.randrange(1, 900)
                if rng.random() < 0.3:
                    fields["requires"] = dict(rng.choice(caps_choices[1:]))
                ok(s.apply(put(now, f"t{step}", **fields)))
            elif roll < 0.8:
                caps = rng.choice(caps_choices)
                entry = claim(now, f"a{step}", caps=caps)
                # What the old order takes: a read at the same log time first moves
                # time (delayed tasks due by now become ready), as the claim would.
                ok(s.apply({"op": "task_stats", "now": now, "queue": "q"}))
                ready = [
                    (t.rank, t.seq, t.tid)
                    for t in s.tasks.tasks.values()
                    if t.status == READY and all(caps.get(k) == v for k, v in t.requires)
                ]
                got = ok(s.apply(entry))
                if ready:
                    assert got["tid"] == min(ready)[2]
                    live.append((got["tid"], f"a{step}"))
                else:
                    assert got["claimed"] is False
            elif live:
                tid, aid = live.pop(rng.randrange(len(live)))
                kind = rng.choice(("done", "fail", "release"))
                if kind == "done":
                    s.apply(done(now, tid, aid))
                elif kind == "fail":
                    s.apply(fail(now, tid, aid, retry_after=rng.randrange(0, 500)))
                else:
                    s.apply(mut("task_release", now, tid=tid, aid=aid))


def _busy_store() -> LeaseStore:
    s = LeaseStore()
    for i in range(6):
        ok(s.apply(put(0, f"a{i}", fairness_key="a", weight=3, aging=1000)))
        ok(s.apply(put(0, f"b{i}", fairness_key="b", aging=1000, requires={"gpu": "1"})))
        ok(s.apply(put(0, f"d{i}", aging=1000)))
    for k in range(5):
        ok(s.apply(claim(1, f"x{k}", caps={"gpu": "1"})))
    return s


def test_a_snapshot_goes_on_exactly_as_the_live_store() -> None:
    live = _busy_store()
    plain = live.to_plain()
    restored = LeaseStore.from_plain(msgpack.unpackb(msgpack.packb(plain)))
    assert restored.to_plain() == plain
    for k in range(12):
        entry = claim(2 + k, f"y{k}", caps={"gpu": "1"} if k % 3 else {})
        assert restored.apply(copy.deepcopy(entry)) == live.apply(copy.deepcopy(entry))
    assert restored.to_plain() == live.to_plain()


def test_the_layout_7_rows_of_queues_and_tasks_field_for_field() -> None:
    """The queue's virtual time and its tenants' [name, weight, pass] (sorted by name)
    end its row; the task's fairness key ends its row."""
    s = LeaseStore()
    ok(s.apply(put(0, "t1", fairness_key="a", weight=3, aging=1000)))
    ok(s.apply(put(0, "t2", aging=1000)))
    # "" and "a" both start at pass 0: the smaller name, "", goes first.
    assert ok(s.apply(claim(0, "x")))["tid"] == "t2"
    tasks = s.to_plain()["tasks"]
    assert tasks["queues"] == [["q", 1, [], [], 0, [["", 1, 1_000_000], ["a", 3, 0]]]]
    assert next(r for r in tasks["tasks"] if r[0] == "t1") == [
        "t1", "q", "{}", 0, 1, [], 3, 30000, 0, 1000, 3600000, 0, "", 0, "ready", 0, 0, 0,
        [], None, 0, "", "", 0, "a", None, 0, [], [], [],  # layout 9: none of issue 41's
    ]  # fmt: skip
    assert LeaseStore.from_plain(copy.deepcopy(s.to_plain())).to_plain() == s.to_plain()
    assert ok(s.apply(claim(1, "y")))["tid"] == "t1"
    assert s.to_plain()["tasks"]["queues"][0][4:] == [0, [["", 1, 1_000_000], ["a", 3, 333_333]]]


def test_a_layout_6_snapshot_with_tasks_restores_them_into_the_default_tenant() -> None:
    """Layout 6 rows (no fairness key, no tenants, no virtual time) load as the default
    tenant at weight 1 and pass 0: the queue claims in the order it had."""
    s = LeaseStore()
    ok(s.apply(put(0, "p0", priority=1, aging=1000)))
    ok(s.apply(put(0, "p1", priority=3, aging=1000)))
    ok(s.apply(put(0, "p2", priority=2, aging=1000)))
    plain = s.to_plain()
    old = copy.deepcopy(plain)
    old["v"] = 6
    old["tasks"]["queues"] = [row[:4] for row in old["tasks"]["queues"]]
    old["tasks"]["tasks"] = [row[:24] for row in old["tasks"]["tasks"]]
    restored = LeaseStore.from_plain(old)
    assert restored.to_plain() == plain
    order = [ok(restored.apply(claim(1, f"x{k}")))["tid"] for k in range(3)]
    assert order == ["p1", "p2", "p0"]


def _check_tenants(s: LeaseStore) -> None:
    """The derived tenant state matches the task records: each tenant's count of
    ready tasks and of open ones, no tenant without an open task, and every
    backlogged tenant has a live turn at its pass."""
    for queue in s.tasks.queues.values():
        for tenant in queue.tenants.values():
            mine = [t for t in s.tasks.tasks.values() if t.queue == queue.name]
            mine = [t for t in mine if t.tenant == tenant.name]
            assert tenant.ready_n == sum(t.status == READY for t in mine)
            assert tenant.held == sum(t.status != "completed" for t in mine) > 0
            if tenant.ready_n:
                assert (tenant.vpass, tenant.name) in queue.turns
                assert tenant.vpass >= 0


def test_random_histories_with_tenants_keep_their_invariants_and_restore_exactly() -> None:
    """Random puts (keys, weights, requirements, delays, deadlines), claims (with and
    without capabilities, some waiting), completions, failures, releases and purges:
    after every entry the tenants' derived state matches the records, a claim without
    capabilities takes a task of the backlogged tenant with the smallest (pass, name),
    and a snapshot taken at any point goes on exactly as the live store."""
    rng = random.Random(7)
    keys = [None, "a", "b", "c"]
    checked = 0
    for _ in range(6):
        s = LeaseStore()
        live: list[tuple[str, str]] = []
        dead: list[str] = []
        restored: LeaseStore | None = None
        now = 0
        for step in range(150):
            now += rng.randrange(0, 300)
            roll = rng.random()
            if roll < 0.4:
                fields: dict[str, Any] = {"priority": rng.randrange(-2, 3), "aging": 1000}
                key = rng.choice(keys)
                if key is not None:
                    fields["fairness_key"] = key
                if rng.random() < 0.3:
                    fields["weight"] = rng.randrange(1, 6)
                if rng.random() < 0.2:
                    fields["requires"] = {"gpu": "1"}
                if rng.random() < 0.2:
                    fields["delay"] = rng.randrange(1, 600)
                if rng.random() < 0.1:
                    fields["deadline"] = rng.randrange(1, 900)
                entry = put(now, f"t{step}", max_attempts=2, **fields)
            elif roll < 0.75:
                caps = rng.choice([{}, {"gpu": "1"}])
                wait = {"wait": rng.randrange(1, 500)} if rng.random() < 0.2 else {}
                entry = claim(now, f"a{step}", caps=caps, **wait)
                if not caps and not wait:
                    ok(s.apply({"op": "task_stats", "now": now, "queue": "q"}))
                    if restored is not None:
                        restored.apply({"op": "task_stats", "now": now, "queue": "q"})
                    queue = s.tasks.queues.get("q")
                    backlogged = sorted(
                        (t.vpass, t.name)
                        for t in (queue.tenants.values() if queue else [])
                        if t.ready_n and any(not s.tasks.tasks[i[2]].requires for h in
                                             t.ready.values() for i in h
                                             if not s.tasks._stale_ready(i))
                    )  # fmt: skip
                    expected = backlogged[0][1] if backlogged else None
                else:
                    expected = None
            elif live:
                tid, aid = live.pop(rng.randrange(len(live)))
                kind = rng.choice(("task_complete", "task_fail", "task_release"))
                entry = mut(kind, now, tid=tid, aid=aid)
            elif dead:
                entry = mut("task_purge", now, tid=dead.pop())
            else:
                continue
            got = s.apply(copy.deepcopy(entry))
            if restored is not None:
                assert restored.apply(copy.deepcopy(entry)) == got
            if entry["op"] == "task_claim" and got.get("claimed"):
                live.append((got["tid"], entry["aid"]))
                if not entry.get("caps") and "wait" not in entry and expected is not None:
                    assert s.tasks.tasks[got["tid"]].tenant == expected
                    checked += 1
            dead = [t.tid for t in s.tasks.tasks.values() if t.status == "dead"]
            _check_tenants(s)
            if rng.random() < 0.05:
                restored = LeaseStore.from_plain(msgpack.unpackb(msgpack.packb(s.to_plain())))
                assert restored.to_plain() == s.to_plain()
        if restored is not None:
            assert restored.to_plain() == s.to_plain()
    assert checked > 50  # the rule was checked on many claims, not vacuously
