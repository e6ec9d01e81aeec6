"""The effect journal under a plain lease on a real 3-node cluster (issue 41;
docs/design.md §4h, docs/usage.md "Effects under a lease").

A holder begins an effect, makes the call and is lost before its commit (its lease
expires); the key's next holder finds the effect in progress by the earlier token with
the idempotency key, its reconcile hook finds the call made and commits it; the zombie's
late commit is refused (NOT_OWNER, definite); a third holder skips the call. The same
through the async client. The state machine's rules are in
tests/unit/test_core_lease_effects.py; the planted build that skips the fence is caught
in tests/unit/test_planted_bugs.py."""

from __future__ import annotations

import asyncio

import pytest

from raftlease.client import AsyncClient
from raftlease.errors import InvalidArgumentError, LeaseNotFoundError, NotOwnerError
from raftlease.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_the_next_holder_reconciles_and_the_zombie_commit_is_refused(
    shared: LocalCluster,
) -> None:
    provider: dict[str, str] = {}  # idempotency key -> receipt: a counting fake provider
    calls: list[int] = []
    with shared.client() as c:
        first = c.acquire("effects/order-17", owner="a", ttl=1.0)
        with c.effect(first, "charge", idempotency_key="order-17") as e:
            assert e.state == "new" and e.key == "order-17" and e.token == first.token
            calls.append(first.token)
            provider[e.key] = "receipt-1"  # the call is made; the holder is then lost
        wait_for(lambda: c.holder("effects/order-17") is None, timeout=10, what="expiry")
        second = c.acquire("effects/order-17", owner="b", ttl=10.0)
        seen: list[tuple[int, str]] = []

        def reconcile(prior_token: int, key: str) -> str | None:
            seen.append((prior_token, key))
            return provider.get(key)

        with c.effect(second, "charge", reconcile=reconcile) as e:
            assert e.state == "committed" and e.reconciled and e.result == "receipt-1"
            assert e.prior_token == first.token
        assert seen == [(first.token, "order-17")]
        # The zombie's late begin and commit are refused, definitely.
        with pytest.raises(NotOwnerError), c.effect(first, "charge"):
            pass
        c.release(second)
        with pytest.raises(LeaseNotFoundError), c.effect(second, "mail"):
            pass
        third = c.acquire("effects/order-17", owner="c", ttl=10.0)
        with c.effect(third, "charge") as e:
            assert e.done and e.result == "receipt-1" and e.token == second.token
        c.release(third)
        pool = c.acquire("effects/pool", owner="p", ttl=10.0, capacity=2)
        with pytest.raises(InvalidArgumentError), c.effect(pool, "charge"):
            pass
        c.release(pool)
    assert calls == [first.token]


def test_the_async_client_commits_under_a_lease(shared: LocalCluster) -> None:
    async def run() -> None:
        async with AsyncClient(shared.endpoints) as c:
            lease = await c.acquire("effects/async", owner="a", ttl=10.0)
            async with c.effect(lease, "mail") as e:
                assert e.state == "new" and e.key == "effects/async:mail"
                await e.commit({"sent": 1})
            async with c.effect(lease, "mail") as again:
                assert again.done and again.result == {"sent": 1}
            await c.release(lease)

    asyncio.run(run())
