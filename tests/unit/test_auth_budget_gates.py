"""Budget gates in the auth file (docs/budgets.md, "Budget gates"; docs/security.md):
what ``load_auth`` accepts and refuses, and the leader's stamping of the gate on
acquires and claims (server/dispatch.py) down to the state machine's decision."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from raftlease.clock import SystemClock
from raftlease.config import NodeConfig
from raftlease.core import LeaseStore
from raftlease.errors import ConfigError, QuotaExceededError
from raftlease.protocol import Limits, parse_request
from raftlease.server.auth import AuthPolicy, load_auth
from raftlease.server.dispatch import Dispatcher
from raftlease.server.log_clock import LogClock

pytestmark = pytest.mark.timeout(30)

HEAD = """
[roles.agent]
permissions = [{ prefix = "", actions = ["read", "write"] }]
budget = { key = "llm/tpm", per_acquire = 2, per_claim = 5 }

[roles.free]
permissions = [{ prefix = "", actions = ["read", "write"] }]
"""


def _load(tmp_path: Path, text: str) -> AuthPolicy:
    path = tmp_path / "auth.toml"
    path.write_text(text)
    return load_auth(path)


def test_a_role_gate_applies_to_its_principals_and_a_principal_gate_overrides_it(
    tmp_path: Path,
) -> None:
    policy = _load(
        tmp_path,
        HEAD
        + """
[[principals]]
name = "a"
roles = ["agent"]

[[principals]]
name = "b"
roles = ["agent"]
budget = { key = "own", per_claim = 1 }

[[principals]]
name = "c"
roles = ["free"]
""",
    )
    a, b, c = (policy.principals[n] for n in "abc")
    assert a.gate("acquire") == ("llm/tpm", 2) and a.gate("task_claim") == ("llm/tpm", 5)
    assert a.gate("renew") is None
    assert b.gate("task_claim") == ("own", 1) and b.gate("acquire") is None
    assert c.gate("acquire") is None


@pytest.mark.parametrize(
    ("budget", "why"),
    [
        ('"llm"', "must be a table"),
        ('{ key = "", per_acquire = 1 }', "key must be"),
        ("{ per_acquire = 1 }", "key must be"),
        ('{ key = "k" }', "above 0"),
        ('{ key = "k", per_acquire = -1 }', "per_acquire"),
        ('{ key = "k", per_claim = 1.5 }', "per_claim"),
        ('{ key = "k", per_claim = true }', "per_claim"),
        ('{ key = "k", per_acquire = 10000000000000 }', "per_acquire"),
        ('{ key = "k", per_acquire = 1, cost = 2 }', "unknown fields"),
    ],
)
def test_a_malformed_gate_is_refused_naming_the_field(
    tmp_path: Path, budget: str, why: str
) -> None:
    text = f'[roles.r]\nbudget = {budget}\n\n[[principals]]\nname = "p"\nroles = ["r"]\n'
    with pytest.raises(ConfigError, match=why):
        _load(tmp_path, text)


def test_two_roles_with_different_budgets_need_the_principal_to_choose(tmp_path: Path) -> None:
    text = HEAD.replace("[roles.free]", '[roles.free]\nbudget = { key = "other", per_acquire = 1 }')
    with pytest.raises(ConfigError, match="2 different budgets"):
        _load(tmp_path, text + '[[principals]]\nname = "p"\nroles = ["agent", "free"]\n')


def _dispatcher(tmp_path: Path, policy: AuthPolicy, store: LeaseStore) -> Dispatcher:
    config = NodeConfig.create(
        node_id="n1",
        nodes=[{"id": "n1", "raft": "127.0.0.1:1", "client": "127.0.0.1:2"}],
        data_dir=tmp_path,
    )
    proposed: list[dict[str, Any]] = []

    async def propose(entry: dict[str, Any]) -> dict[str, Any]:
        proposed.append(entry)
        return store.apply({**entry, "now": 1000, "term": 1})

    dispatcher = Dispatcher(
        config,
        LogClock(SystemClock()),
        auth=lambda: policy,
        replica=lambda: None,
        proposer=lambda: None,
        require_leader=lambda: None,
        lease_read_allowed=lambda: False,
        propose=propose,
        metrics=None,
    )
    dispatcher.proposed = proposed  # type: ignore[attr-defined]
    return dispatcher


def test_the_leader_stamps_the_gate_and_the_state_machine_draws_or_refuses(
    tmp_path: Path,
) -> None:
    policy = _load(tmp_path, HEAD + '[[principals]]\nname = "a"\nroles = ["agent"]\n')
    store = LeaseStore()
    store.apply(
        {"op": "budget_set", "key": "llm/tpm", "capacity": 3, "refill": 0, "now": 1000}
        | {"term": 1, "cid": "op", "seq": 1, "ack": 1}
    )
    dispatcher = _dispatcher(tmp_path, policy, store)
    seq = iter(range(1, 100))

    def request(op: str, **args: Any) -> Any:
        n = next(seq)
        message = {"id": n, "op": op, "cid": "c", "seq": n, "ack": n, **args}
        return dataclasses.replace(parse_request(message, Limits()), principal="a")

    got = asyncio.run(dispatcher.write(request("acquire", key="k1", owner="o", ttl=5), None))
    assert got["key"] == "k1"
    assert dispatcher.proposed[-1]["gate_budget"] == "llm/tpm"  # type: ignore[attr-defined]
    assert dispatcher.proposed[-1]["gate_cost"] == 2  # type: ignore[attr-defined]
    assert store.budgets.budgets["llm/tpm"].level == 1_000_000
    with pytest.raises(QuotaExceededError) as refused:
        asyncio.run(dispatcher.write(request("acquire", key="k2", owner="o", ttl=5), None))
    assert refused.value.detail["budget"] == "llm/tpm" and refused.value.definite
    assert refused.value.detail["retry_after"] is None  # no refill: never
    assert "k2" not in {lease.key for lease in store.leases.values()}
