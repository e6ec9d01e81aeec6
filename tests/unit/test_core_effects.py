"""The effect journal of task attempts in the pure state machine (issue 41;
core/effects.py, docs/queues.md "Effects").

Begin records the intent (effect id, the attempt's token, the idempotency key) before
the external call; commit its result after. A later attempt sees ``committed`` (skip)
or ``in_progress`` by the earlier token (reconcile); only the current attempt may begin
or commit (``STALE_ATTEMPT`` otherwise); the table is bounded; it survives a snapshot.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from raftlease.core import LeaseStore
from raftlease.limits import MAX_EFFECT_RESULT_BYTES, MAX_TASK_EFFECTS
from tests.unit.test_core_tasks import claim, code, done, fail, info, mut, ok, put, read, tick

pytestmark = pytest.mark.timeout(60)


def begin(now: int, aid: str, effect: str = "charge", **fields: Any) -> dict[str, Any]:
    return mut("task_effect_begin", now, tid="T", aid=aid, effect=effect, **fields)


def commit(now: int, aid: str, effect: str = "charge", result: str = '"r1"') -> dict[str, Any]:
    return mut("task_effect_commit", now, tid="T", aid=aid, effect=effect, result=result)


def two_attempts(store: LeaseStore) -> tuple[int, int]:
    """Put T, claim it (A1), let A1 expire, claim again (A2): the two tokens."""
    ok(store.apply(put(0, "T", ttl=1000, backoff=0)))
    first = ok(store.apply(claim(10, "A1")))["token"]
    ok(store.apply(begin(20, "A1", key="idem-17")))
    ok(store.apply(tick(2000)))
    second = ok(store.apply(claim(2100, "A2")))["token"]
    return first, second


def test_a_new_effect_is_recorded_with_the_token_and_key_then_committed() -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "T")))
    token = ok(store.apply(claim(10, "A1")))["token"]
    began = ok(store.apply(begin(20, "A1", key="idem-17")))
    assert began == {"ok": True, "state": "new", "effect": "charge", "key": "idem-17",
                     "token": token}  # fmt: skip
    assert info(store, "T", 20)["effects"] == [
        {"effect": "charge", "state": "begun", "token": token, "attempt": 1, "key": "idem-17",
         "result": None}
    ]  # fmt: skip
    done_ = ok(store.apply(commit(30, "A1")))
    assert done_["already"] is False and done_["result"] == '"r1"'
    assert info(store, "T", 30)["effects"][0]["state"] == "committed"


def test_the_default_key_is_the_task_and_effect() -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "T")))
    ok(store.apply(claim(10, "A1")))
    assert ok(store.apply(begin(20, "A1")))["key"] == "T:charge"


def test_a_later_attempt_sees_the_earlier_intent_in_progress_and_takes_it_over() -> None:
    store = LeaseStore()
    first, second = two_attempts(store)
    seen = ok(store.apply(begin(2200, "A2", key="another")))
    assert seen["state"] == "in_progress" and seen["prior_token"] == first
    assert seen["prior_attempt"] == 1 and seen["token"] == second
    assert seen["key"] == "idem-17"  # the first intent's key, for every attempt
    # The zombie's commit is refused, definitely, and changes nothing.
    assert code(store.apply(commit(2300, "A1"))) == "STALE_ATTEMPT"
    assert info(store, "T", 2300)["effects"][0]["state"] == "begun"
    ok(store.apply(commit(2400, "A2", result='"reconciled"')))
    row = info(store, "T", 2400)["effects"][0]
    assert row["state"] == "committed" and row["token"] == second
    assert row["result"] == '"reconciled"'


def test_a_committed_effect_is_answered_with_its_result_to_every_later_attempt() -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "T", ttl=1000, backoff=0, max_attempts=5)))
    token = ok(store.apply(claim(10, "A1")))["token"]
    ok(store.apply(begin(20, "A1")))
    ok(store.apply(commit(30, "A1", result='{"receipt":9}')))
    ok(store.apply(fail(40, "T", "A1")))
    ok(store.apply(claim(50, "A2")))
    seen = ok(store.apply(begin(60, "A2")))
    assert seen["state"] == "committed" and seen["result"] == '{"receipt":9}'
    assert seen["token"] == token
    # A commit of it again keeps the first result.
    again = ok(store.apply(commit(70, "A2", result='"other"')))
    assert again["already"] is True and again["result"] == '{"receipt":9}'


def test_a_commit_of_an_effect_never_begun_or_begun_by_another_attempt_is_refused() -> None:
    store = LeaseStore()
    two_attempts(store)
    assert code(store.apply(commit(2200, "A2", effect="never"))) == "INVALID_ARGUMENT"
    # A1 began "charge"; A2 must begin (reconcile) before it commits.
    assert code(store.apply(commit(2200, "A2"))) == "INVALID_ARGUMENT"


def test_no_effect_call_after_the_task_is_completed() -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "T")))
    ok(store.apply(claim(10, "A1")))
    ok(store.apply(done(20, "T", "A1")))
    assert code(store.apply(begin(30, "A1"))) == "STALE_ATTEMPT"
    assert code(store.apply(commit(30, "A1"))) == "STALE_ATTEMPT"


def test_the_journal_is_bounded_per_task() -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "T")))
    ok(store.apply(claim(10, "A1")))
    for i in range(MAX_TASK_EFFECTS):
        ok(store.apply(begin(20, "A1", effect=f"e{i}")))
    refused = store.apply(begin(30, "A1", effect="one-more"))
    assert code(refused) == "QUOTA_EXCEEDED"
    assert refused["detail"]["setting"] == "max_task_effects"
    # A known one is still answered.
    assert ok(store.apply(begin(40, "A1", effect="e0")))["state"] == "in_progress"
    assert len(info(store, "T", 40)["effects"]) == MAX_TASK_EFFECTS


@pytest.mark.parametrize(
    ("op", "fields"),
    [
        ("task_effect_begin", {"effect": ""}),
        ("task_effect_begin", {"effect": "x" * 257}),
        ("task_effect_begin", {"effect": 7}),
        ("task_effect_begin", {"effect": "e", "key": ""}),
        ("task_effect_begin", {"effect": "e", "key": "k" * 257}),
        ("task_effect_commit", {"effect": "e", "result": "x" * (MAX_EFFECT_RESULT_BYTES + 1)}),
        ("task_effect_commit", {"effect": "e", "result": 5}),
        ("task_effect_commit", {}),
    ],
)
def test_bad_effect_entries_are_refused_and_change_nothing(op: str, fields: dict[str, Any]) -> None:
    store = LeaseStore()
    ok(store.apply(put(0, "T")))
    ok(store.apply(claim(10, "A1")))
    before = store.to_plain()
    assert code(store.apply(mut(op, 20, tid="T", aid="A1", **fields))) == "BAD_REQUEST"
    after = store.to_plain()
    assert {**after, "now": 0, "sessions": None} == {**before, "now": 0, "sessions": None}


def test_the_journal_survives_a_snapshot_and_goes_on_as_the_live_store() -> None:
    store = LeaseStore()
    two_attempts(store)
    plain = store.to_plain()
    row = plain["tasks"]["tasks"][0]
    assert row[27] == [["charge", "begun", row[27][0][2], 1, "idem-17", None]]
    restored = LeaseStore.from_plain(copy.deepcopy(plain))
    assert restored.to_plain() == plain
    for entry in (begin(2200, "A2"), commit(2300, "A2"), read("task_get", 2400, tid="T")):
        assert restored.apply(copy.deepcopy(entry)) == store.apply(copy.deepcopy(entry))
    assert restored.to_plain() == store.to_plain()
    # A retried dead task keeps its journal: its effects stay made.
    dead = LeaseStore()
    ok(dead.apply(put(0, "T", max_attempts=1)))
    ok(dead.apply(claim(10, "A1")))
    ok(dead.apply(begin(20, "A1")))
    ok(dead.apply(commit(30, "A1")))
    ok(dead.apply(fail(40, "T", "A1")))
    assert ok(dead.apply(read("task_dead", 50)))["dead"][0]["effects"][0]["state"] == "committed"
    ok(dead.apply(mut("task_retry", 60, tid="T")))
    ok(dead.apply(claim(70, "A2")))
    assert ok(dead.apply(begin(80, "A2")))["state"] == "committed"
