"""Permission prefixes match on path boundaries (issue 37): a role on ``queue:sec``
granted the queue ``secrets-payroll`` too, since prefixes were bare strings."""

from __future__ import annotations

import pytest

from raftlease.errors import PermissionDeniedError
from raftlease.protocol import Limits, Request, parse_request
from raftlease.server.auth import AuthPolicy, Principal, Role, prefix_grants

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("prefix", "key", "granted"),
    [
        ("", "anything", True),
        ("", "", True),
        ("gpu/", "gpu/a100", True),
        ("gpu/", "gpu/", True),
        ("gpu/", "gpus/x", False),
        ("gpu", "gpu", True),
        ("gpu", "gpu/a100", True),
        ("gpu", "gpus", False),
        ("queue:sec", "queue:sec", True),
        ("queue:sec", "queue:sec/inner", True),
        ("queue:sec", "queue:secrets-payroll", False),
        ("queue:", "queue:secrets-payroll", True),
        ("team-a", "team-ab", False),
        ("team-a", "team-a:jobs", True),
        ("a/b", "a/", False),  # a narrower permission never covers a wider prefix
        ("k*", "k1", True),  # a trailing * asks for a bare string prefix
        ("k*", "k", True),
        ("k*", "j1", False),
        ("queue:sec*", "queue:secrets-payroll", True),
        ("*", "anything", True),
    ],
)
def test_prefix_grants_on_path_boundaries(prefix: str, key: str, granted: bool) -> None:
    assert prefix_grants(prefix, key) is granted


def _request(message: dict[str, object]) -> Request:
    return parse_request({"id": 1, "cid": "c", "seq": 1, "ack": 1, **message}, Limits())


def test_a_role_on_one_queue_does_not_grant_queues_that_share_its_letters() -> None:
    role = Role("payroll-reader", (("queue:sec", frozenset({"read", "write"})),))
    policy = AuthPolicy({"p": Principal("p", (role,))})
    who = policy.principals["p"]
    policy.check(who, _request({"op": "task_put", "queue": "sec", "payload": "{}"}))
    with pytest.raises(PermissionDeniedError, match="queue:secrets-payroll"):
        policy.check(who, _request({"op": "task_put", "queue": "secrets-payroll", "payload": "{}"}))


def test_a_prefix_operation_needs_the_permission_on_a_boundary() -> None:
    role = Role("gpu", (("gpu", frozenset({"read"})),))
    policy = AuthPolicy({"g": Principal("g", (role,))})
    who = policy.principals["g"]
    policy.check(who, _request({"op": "leases", "prefix": "gpu/"}))
    policy.check(who, _request({"op": "holder", "key": "gpu"}))
    for denied in ({"op": "leases", "prefix": "gp"}, {"op": "holder", "key": "gpus"}):
        with pytest.raises(PermissionDeniedError):
            policy.check(who, _request(denied))


def test_a_prefix_query_may_not_reach_keys_past_the_permission() -> None:
    """``leases``/``watch`` match keys as strings: a query for ``gpu`` would return
    ``gpus/...``, which a permission on ``gpu`` does not grant; ``gpu/`` is fine, and a
    bare string permission (``gpu*``) covers ``gpu``."""
    role = Role("gpu", (("gpu", frozenset({"read"})),))
    policy = AuthPolicy({"g": Principal("g", (role,))})
    who = policy.principals["g"]
    for op in ("leases", "watch"):
        policy.check(who, _request({"op": op, "prefix": "gpu/"}))
        policy.check(who, _request({"op": op, "prefix": "gpu:a"}))
        for query in ("gpu", "gp", ""):
            with pytest.raises(PermissionDeniedError):
                policy.check(who, _request({"op": op, "prefix": query}))
    star = AuthPolicy({"s": Principal("s", (Role("s", (("gpu*", frozenset({"read"})),)),))})
    star.check(star.principals["s"], _request({"op": "leases", "prefix": "gpu"}))
    slash = AuthPolicy({"t": Principal("t", (Role("t", (("gpu/", frozenset({"read"})),)),))})
    slash.check(slash.principals["t"], _request({"op": "leases", "prefix": "gpu/a"}))
    with pytest.raises(PermissionDeniedError):
        slash.check(slash.principals["t"], _request({"op": "leases", "prefix": "gpu"}))


def test_budgets_are_granted_on_budget_key_apart_from_leases_of_the_same_key() -> None:
    """A spender may spend (write) and read ``budget:llm/...`` but not define budgets
    (admin) nor take the lease ``llm/x``; a lease holder of ``llm/`` may not spend."""
    spender = Role("spender", (("budget:llm/", frozenset({"read", "write"})),))
    holder = Role("holder", (("llm/", frozenset({"read", "write", "admin"})),))
    policy = AuthPolicy({"s": Principal("s", (spender,)), "h": Principal("h", (holder,))})
    s, h = policy.principals["s"], policy.principals["h"]
    spend = {"op": "budget_spend", "key": "llm/tpm", "amount": 1}
    policy.check(s, _request(spend))
    policy.check(s, _request({"op": "budget_get", "key": "llm/tpm"}))
    define = {"op": "budget_set", "key": "llm/tpm", "capacity": 5, "refill_per_s": 1}
    for who, message in (
        (s, define),
        (s, {"op": "budget_spend", "key": "llmx", "amount": 1}),
        (s, {"op": "acquire", "key": "llm/tpm", "owner": "o", "ttl": 5}),
        (h, spend),
        (h, define),
    ):
        with pytest.raises(PermissionDeniedError):
            policy.check(who, _request(message))
