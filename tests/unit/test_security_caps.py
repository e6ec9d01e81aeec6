"""The last quotas of issue 11: long-polls per principal and per node, queued acquires
from everyone (``max_waiters_total``), and connections that have not authenticated
(``max_unauthenticated_connections``, ``auth_timeout``, ``max_connections_per_address``).

The waiter cap is replicated: the leader stamps it into each acquire and the state
machine counts every queued acquire (derived from the wait queues, so a restored
snapshot counts the same). The long-poll and connection limits are node-local. Every
refusal is ``QUOTA_EXCEEDED`` (definite) with the state unchanged.

The unit half of these tests (no process); the integration half is
tests/integration/test_security_caps.py.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlease import QuotaExceededError
from raftlease.config import NodeConfig
from raftlease.core import LeaseStore
from raftlease.errors import ConfigError
from raftlease.server.reads import PollSlots

# ------------------------------------------------------------------ config


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "name",
    [
        "max_long_polls_per_principal",
        "max_long_polls_per_node",
        "max_waiters_total",
        "max_unauthenticated_connections",
        "max_connections_per_address",
    ],
)
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "8"])
def test_caps_must_be_positive_integers(tmp_path: Path, name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=name):
        NodeConfig.create(
            node_id="n1",
            nodes=[{"id": "n1", "raft": "127.0.0.1:1", "client": "127.0.0.1:2"}],
            data_dir=tmp_path,
            **{name: value},
        )


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "10"])
def test_auth_timeout_must_be_a_positive_number(tmp_path: Path, value: Any) -> None:
    with pytest.raises(ConfigError, match="auth_timeout"):
        NodeConfig.create(
            node_id="n1",
            nodes=[{"id": "n1", "raft": "127.0.0.1:1", "client": "127.0.0.1:2"}],
            data_dir=tmp_path,
            auth_timeout=value,
        )


@pytest.mark.timeout(30)
def test_defaults_leave_room_for_local_use(tmp_path: Path) -> None:
    config = NodeConfig.create(
        node_id="n1",
        nodes=[{"id": "n1", "raft": "127.0.0.1:1", "client": "127.0.0.1:2"}],
        data_dir=tmp_path,
    )
    # Without an auth file every connection counts per address: the benchmark (16
    # threads and an AsyncClient) and the chaos suite (9 clients) use one address.
    assert config.max_connections_per_address == 256
    assert config.max_unauthenticated_connections == 64 and config.auth_timeout == 10.0
    assert config.max_long_polls_per_principal == 1_000
    assert config.max_long_polls_per_node == 4_096
    assert config.max_waiters_total == 100_000


# ------------------------------------------------------------------ long-poll slots


@pytest.mark.timeout(30)
def test_poll_slots_count_per_principal_and_node_and_free_on_every_exit() -> None:
    slots = PollSlots(per_principal=2, per_node=3)
    with contextlib.ExitStack() as held:
        held.enter_context(slots.hold("a"))
        held.enter_context(slots.hold("a"))
        with pytest.raises(QuotaExceededError, match="max_long_polls_per_principal"):
            held.enter_context(slots.hold("a"))
        held.enter_context(slots.hold(None))  # unauthenticated: the node's count only
        assert slots.total == 3 and slots.by_principal == {"a": 2}
        with pytest.raises(QuotaExceededError, match="max_long_polls_per_node") as full:
            held.enter_context(slots.hold("b"))
        assert full.value.definite and full.value.detail == {"quota": 3}
    assert slots.total == 0 and slots.by_principal == {}
    # An error (or a cancellation) inside the block frees the slot too.
    with pytest.raises(RuntimeError), slots.hold("a"):
        raise RuntimeError("the poll failed")
    assert slots.total == 0 and slots.by_principal == {}


# ------------------------------------------------------------------ waiters_total (core)


def _acquire(
    n: int, now: int, key: str, principal: str, wait: int, cap: int | None
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "op": "acquire",
        "now": now,
        "key": key,
        "owner": principal or "anon",
        "ttl": 60_000,
        "wait": wait,
        "lid": f"L{n}",
        "cid": f"c-{principal or 'anon'}",
        "seq": n,
        "ack": 1,
    }
    if principal:
        entry["principal"] = principal
    if cap is not None:
        entry["waiters_total"] = cap
    return entry


def _copy(store: LeaseStore) -> LeaseStore:
    packed = msgpack.packb(store.to_plain())
    return LeaseStore.from_plain(msgpack.unpackb(packed, strict_map_key=False))


MOVED = ("sessions", "applied", "now")

ACTIONS = st.lists(
    st.one_of(
        st.tuples(
            st.just("acquire"),
            st.integers(0, 3),  # key
            st.sampled_from(["", "p", "q"]),  # principal ("" = no authentication)
            st.sampled_from([0, 500, 5_000]),  # wait (ms)
        ),
        st.tuples(st.just("release"), st.integers(0, 3), st.just(""), st.just(0)),
        st.tuples(st.just("tick"), st.integers(0, 3), st.just(""), st.sampled_from([100, 1_000])),
    ),
    max_size=40,
)


@pytest.mark.timeout(120)
@given(actions=ACTIONS, cap=st.integers(1, 4), restore_at=st.integers(0, 40))
def test_state_machine_caps_queued_acquires_from_everyone(
    actions: list[tuple[str, int, str, int]], cap: int, restore_at: int
) -> None:
    """Oracle: an acquire under the cap decides exactly as the same acquire without
    a cap, except that one which would queue while ``cap`` acquires are queued is
    refused (QUOTA_EXCEEDED, state unchanged). A replica restored from a snapshot
    at any point decides every later entry the same (the count is derived)."""
    store = LeaseStore()
    now = 1_000
    seq = 0
    granted: dict[str, list[str]] = {}  # key -> lease ids granted on it (in order)
    twin: LeaseStore | None = None
    for step, (kind, k, principal, amount) in enumerate(actions):
        if step == restore_at:
            twin = _copy(store)
        key = f"k{k}"
        seq += 1
        if kind == "tick":
            now += amount
            entry: dict[str, Any] = {"op": "tick", "now": now}
        elif kind == "release":
            if not granted.get(key):
                continue
            lid = granted[key].pop(0)
            entry = {
                "op": "release",
                "now": now,
                "key": key,
                "lid": lid,
                "cid": "c-rel",
                "seq": seq,
                "ack": 1,
            }
        else:
            entry = _acquire(seq, now, key, principal, amount, cap)
            uncapped = _copy(store).apply(
                {k2: v for k2, v in entry.items() if k2 != "waiters_total"}
            )
            queued_before = len(store.waiting)
            before = store.to_plain()
        result = store.apply(entry)
        if twin is not None:
            assert twin.apply(entry) == result
        if kind == "acquire":
            if uncapped.get("queued") and queued_before >= cap:
                assert result["code"] == "QUOTA_EXCEEDED", result
                assert result["detail"] == {"quota": cap}
                after = store.to_plain()
                assert {k2: v for k2, v in after.items() if k2 not in MOVED} == {
                    k2: v for k2, v in before.items() if k2 not in MOVED
                }
            else:
                assert result == uncapped
            if result.get("ok"):
                granted.setdefault(key, []).append(entry["lid"])
        assert len(store.waiting) <= cap
        assert sum(len(q) for q in store.queues.values()) == len(store.waiting)
    if twin is not None:
        assert twin.to_plain() == store.to_plain()


@pytest.mark.timeout(30)
def test_a_bad_stamped_cap_is_refused_before_anything_changes() -> None:
    store = LeaseStore()
    assert store.apply(_acquire(1, 1_000, "k", "p", 0, 1))["ok"]
    before = store.to_plain()
    for bad in (0, -1, True, "3", 2**40):
        answer = store.apply(_acquire(2, 1_000, "k", "p", 5_000, 1) | {"waiters_total": bad})
        assert answer["code"] == "BAD_REQUEST" and "waiters_total" in answer["message"]
    after = store.to_plain()
    assert {k: v for k, v in after.items() if k not in MOVED} == {
        k: v for k, v in before.items() if k not in MOVED
    }
