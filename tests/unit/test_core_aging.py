"""Priority aging of task queues in the pure state machine (core/queue.py,
core/task_records.py ``task_rank``; docs/queues.md, "Order").

Every test drives ``LeaseStore.apply`` with hand-made entries, the ``aging`` stamp
written as the leader writes it (``server/dispatch.py``: ms per priority level)."""

from __future__ import annotations

import copy
import math
from typing import Any

import msgpack
import pytest

from raftlease.config import NodeConfig, local_cluster
from raftlease.core import LeaseStore
from raftlease.core.snapshot import ENTRY_FORMAT, SNAPSHOT_VERSION
from raftlease.core.task_records import STRICT_AGING_MS, task_rank
from raftlease.errors import ConfigError
from raftlease.server.dispatch import draw_task_ids
from tests.unit.test_core_tasks import claim, code, fail, ok, put

pytestmark = pytest.mark.timeout(60)

Entry = dict[str, Any]


def make(**overrides: Any) -> NodeConfig:
    """A node's config with ``overrides`` (this file runs in scripts/mutate's copy,
    which holds the core's test files only, so not tests/unit/test_config.py's)."""
    values: dict[str, Any] = {"node_id": "n1", "nodes": local_cluster(3, 7001)}
    return NodeConfig.create(**{**values, "data_dir": "/var/lib/rl", **overrides})


def flood(aging: int | None, steps: int = 200) -> tuple[list[Entry], int | None]:
    """A priority-0 task ``x`` put at log time 0 behind a backlog of 20 priority-5
    tasks, then every 100 ms one more priority-5 put and one claim. The entries, and
    the number of the claim (1-based) that took ``x``, or None if none did."""
    stamp: dict[str, Any] = {} if aging is None else {"aging": aging}
    entries = [put(0, f"b{i}", priority=5, **stamp) for i in range(20)]
    entries.append(put(0, "x", priority=0, **stamp))
    for k in range(1, steps + 1):
        entries.append(put(100 * k, f"f{k}", priority=5, **stamp))
        entries.append(claim(100 * k, f"a{k}"))
    store = LeaseStore()
    taken = None
    for entry in entries:
        result = ok(store.apply(copy.deepcopy(entry)))
        if entry["op"] == "task_claim" and result.get("tid") == "x" and taken is None:
            taken = int(entry["aid"][1:])
    return entries, taken


def test_a_low_priority_task_is_claimed_within_the_aging_bound_under_a_flood() -> None:
    """With a step of 1 s, x (priority 0, ready at 0, rank 0) goes before every
    priority-5 task put after 5 s (rank t - 5000 > 0; one put at exactly 5 s ties and
    loses to x's earlier put). Ahead of it: the 20 of the backlog and the 49 puts at
    0.1 .. 4.9 s, so it is the 70th claim, at 7 s: within the documented bound of
    (5 - 0) * step plus the time to claim what ranked ahead of it."""
    _, taken = flood(1000)
    assert taken == 70


def test_without_aging_the_same_flood_starves_it() -> None:
    """The claim the bound is about: with strict priority (an entry without the stamp,
    as before aging, or a step of 0) x is never claimed while priority-5 tasks keep
    coming; so the test above fails if aging is lost."""
    assert flood(None)[1] is None
    assert flood(0)[1] is None


@pytest.mark.parametrize("step", [1, 250, 1000, 60_000])
def test_the_wait_bound_holds_for_every_step(step: int) -> None:
    """x ranks ahead of every priority-5 task that becomes ready after 5 steps."""
    later = task_rank(5, 5 * step + 1, step)
    assert task_rank(0, 0, step) < later
    assert task_rank(0, 0, step) > task_rank(5, 5 * step - 1, step)


def test_without_a_stamp_the_rank_is_the_strict_order_of_earlier_builds() -> None:
    """An entry written before aging ranks ``(-priority, put order)`` exactly: the
    rank ignores the ready time, so an old log replays to the same claims."""
    assert task_rank(3, 12345, None) == task_rank(3, 0, None) == -3 * STRICT_AGING_MS
    assert task_rank(4, 10**9, None) < task_rank(3, 0, None)
    # A step of 0 is strict priority too (then the earlier ready time).
    assert task_rank(1, 10**12, 0) < task_rank(0, 0, 0)
    assert task_rank(0, 5, 0) < task_rank(0, 6, 0)


def test_a_delay_is_not_waiting() -> None:
    """A put's delay does not age it: its rank counts from the end of the delay, so a
    delayed low priority does not jump a fresh high priority when it becomes ready."""
    s = LeaseStore()
    ok(s.apply(put(0, "late", priority=0, delay=60_000, aging=1000)))
    ok(s.apply(put(60_000, "fresh", priority=1, aging=1000)))
    assert ok(s.apply(claim(60_000, "a1")))["tid"] == "fresh"


def test_two_replicas_and_a_restored_one_decide_the_same_order() -> None:
    """Determinism: the claim order depends only on the entries. A second store
    applying the same entries, and one restored (through msgpack, as a snapshot file
    is) from a snapshot taken in the middle of the flood, hand out the same tasks."""
    entries, taken = flood(1000, steps=120)
    assert taken == 70
    a, b = LeaseStore(), LeaseStore()
    half = len(entries) // 2
    for entry in entries[:half]:
        assert a.apply(copy.deepcopy(entry)) == b.apply(copy.deepcopy(entry))
    packed = msgpack.packb(a.to_plain(), use_bin_type=True)
    restored = LeaseStore.from_plain(msgpack.unpackb(packed, raw=False, strict_map_key=False))
    assert restored.to_plain() == a.to_plain()
    for entry in entries[half:]:
        one = a.apply(copy.deepcopy(entry))
        assert b.apply(copy.deepcopy(entry)) == one
        assert restored.apply(copy.deepcopy(entry)) == one, entry
    assert restored.to_plain() == a.to_plain() == b.to_plain()


def test_a_released_task_keeps_its_rank() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "old", priority=0, aging=1000)))
    first = ok(s.apply(claim(0, "a1")))
    ok(s.apply(put(4_000, "new", priority=5, aging=1000)))  # rank -1000 < 0: ahead
    ok(s.apply(put(6_000, "newer", priority=5, aging=1000)))  # rank 1000 > 0: behind
    release = {**fail(6_000, "old", first["aid"]), "op": "task_release"}
    release.pop("error")
    ok(s.apply(release))
    order = [ok(s.apply(claim(6_000, f"c{i}")))["tid"] for i in range(3)]
    assert order == ["new", "old", "newer"]


@pytest.mark.parametrize("bad", [-1, 24 * 3600 * 1000 + 1, True, 1.5, "10"])
def test_a_bad_aging_stamp_is_refused_and_changes_nothing(bad: Any) -> None:
    s = LeaseStore()
    before = s.to_plain()
    assert code(s.apply(put(0, "t", aging=bad))) == "BAD_REQUEST"
    assert s.to_plain() == before


def test_a_layout_5_snapshot_restores_with_strict_ranks() -> None:
    """A snapshot of the build before aging (layout 5: task rows without a rank)
    loads, and its tasks keep the strict priority order they were put with."""
    s = LeaseStore()
    ok(s.apply(put(0, "lo", priority=0)))
    ok(s.apply(put(0, "hi", priority=2)))
    plain = s.to_plain()
    plain["v"] = 5
    tasks = plain["tasks"]
    tasks.pop("totals")
    tasks["queues"] = [row[:3] for row in tasks["queues"]]
    tasks["tasks"] = [row[:23] for row in tasks["tasks"]]
    old = LeaseStore.from_plain(plain)
    assert old.tasks.tasks["lo"].rank == 0 and old.tasks.tasks["hi"].rank == -2 * STRICT_AGING_MS
    assert ok(old.apply(claim(1, "a2")))["tid"] == "hi"
    assert ok(old.apply(claim(1, "a3")))["tid"] == "lo"


def test_the_largest_step_is_accepted() -> None:
    s = LeaseStore()
    ok(s.apply(put(0, "t", aging=24 * 3600 * 1000)))
    assert s.tasks.tasks["t"].rank == 0


def test_the_leader_stamps_the_node_step_over_any_client_value() -> None:
    """The step comes from the leader's config, in ms, on every put (a client cannot
    choose it: the wire parser drops unknown fields, and this overwrites anyway)."""
    config = make(task_priority_aging=2.5)
    entry: dict[str, Any] = {"op": "task_put", "queue": "q", "payload": "{}", "aging": 1}
    draw_task_ids(config, "task_put", entry)
    assert entry["aging"] == 2500
    off: dict[str, Any] = {"op": "task_put", "queue": "q", "payload": "{}"}
    draw_task_ids(make(task_priority_aging=0), "task_put", off)
    assert off["aging"] == 0
    assert make().task_priority_aging == 10.0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("task_priority_aging", -1),
        ("task_priority_aging", 86401),
        ("task_priority_aging", math.inf),
        ("task_priority_aging", True),
        ("metrics_max_queues", -1),
        ("metrics_max_queues", 1001),
        ("metrics_max_queues", True),
        ("metrics_max_queues", 2.0),
    ],
)
def test_the_settings_refuse_values_out_of_range(name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=name):
        make(**{name: value})


def test_the_formats_are_the_documented_ones() -> None:
    """docs/membership.md ("Rolling upgrades") names them: entry format 6 (puts carry
    the aging step, format 3, and fairness keys and weights, format 4; acquires carry
    fairness keys and weights, format 5; deadlock detection, task checkpoints and
    certificate signing keys, format 6), snapshot layout 9 (task ranks and the queues'
    counters, layout 6; fair shares, layout 7; fair shares of wait queues, layout 8;
    deadlock refusals, task checkpoints, signing keys and the audit trail, layout 9)."""
    assert ENTRY_FORMAT == 6 and SNAPSHOT_VERSION == 9
