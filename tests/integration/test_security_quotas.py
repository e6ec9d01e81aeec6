"""Quotas of queued acquires and watches (issue 11), on real node processes.

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_security_quotas.py.
"""

from __future__ import annotations

import json
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlease import Client, PermissionDeniedError, QuotaExceededError, WatchEvent
from raftlease.server.auth import token_digest
from raftlease.testing import LocalCluster
from raftlease.testing.certs import SecureBundle, secure_bundle
from tests.integration.test_admin_http import admin_cluster, admin_of

Factory = Callable[..., LocalCluster]

AGENT_TOKEN = "agent-token-quotas-0123456789"
OTHER_TOKEN = "other-token-quotas-0123456789"


def _bundle(tmp_path: Path) -> SecureBundle:
    """The secure bundle plus two agents on gpu/ (read and write)."""
    bundle = secure_bundle(tmp_path / "tls")
    bundle.add_agents({"agent-7": AGENT_TOKEN, "agent-8": OTHER_TOKEN})
    return bundle


def _queue(client: Client, key: str, owner: str) -> dict[str, Any]:
    """Send one queued acquire (wait 60 s) and return the node's answer at once
    (the low-level call does not long-poll for the grant)."""
    return client.call(
        "acquire", {"key": key, "owner": owner, "ttl": 30, "wait": 60}, mutating=True
    )


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_queued_acquires_stop_at_the_waiter_quota(cluster_factory: Factory, tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    cluster = cluster_factory(3, **bundle.node_settings(), max_waiters_per_principal=3)
    ca = str(bundle.ca_file)
    with (
        Client(cluster.endpoints, tls=ca, token=bundle.admin_token) as admin,
        Client(cluster.endpoints, tls=ca, token=AGENT_TOKEN) as agent,
        Client(cluster.endpoints, tls=ca, token=OTHER_TOKEN) as other,
    ):
        blockers = {f"gpu/{i}": admin.acquire(f"gpu/{i}", owner="ops", ttl=60) for i in range(5)}
        queued = [_queue(agent, f"gpu/{i}", "a") for i in range(3)]
        assert all(answer["queued"] for answer in queued)
        before = {key: [w.owner for w in admin.waiters(key)] for key in blockers}
        with pytest.raises(QuotaExceededError) as refused:
            _queue(agent, "gpu/3", "a")
        assert refused.value.definite
        # Nothing changed: gpu/3 has no waiter, every queue is as it was.
        assert {key: [w.owner for w in admin.waiters(key)] for key in blockers} == before
        assert admin.waiters("gpu/3") == []
        # An acquire that is granted at once needs no waiter slot.
        granted = agent.acquire("gpu/free", owner="a", ttl=30)
        assert granted.token > 0
        # Another principal still queues.
        assert _queue(other, "gpu/3", "b")["queued"]
        # A grant frees the slot: release gpu/0, agent's waiter there becomes a lease.
        admin.release(blockers["gpu/0"])
        deadline = time.monotonic() + 30
        while admin.holder("gpu/0") is None or admin.holder("gpu/0").owner != "a":
            assert time.monotonic() < deadline, "the queued acquire was never granted"
            time.sleep(0.05)
        assert _queue(agent, "gpu/4", "a")["queued"]
        with pytest.raises(QuotaExceededError):
            _queue(agent, "gpu/3", "a")
        # Every replica decided the same (the quota travels in the entry).
        for endpoint in cluster.endpoints:
            with Client([endpoint], tls=ca, token=bundle.admin_token) as one:
                owners = [w.owner for w in one.waiters("gpu/3", consistency="stale")]
                deadline = time.monotonic() + 30
                while owners != ["b"]:
                    assert time.monotonic() < deadline, (endpoint, owners)
                    time.sleep(0.05)
                    owners = [w.owner for w in one.waiters("gpu/3", consistency="stale")]


def _open_watch(client: Client) -> Iterator[WatchEvent]:
    """A watch on gpu/ from revision 1 whose first event has arrived (so the node
    counts it). Raises what the node answered (QuotaExceededError)."""
    stream = client.watch("gpu/", from_revision=1)
    next(stream)
    return stream


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_watches_stop_at_the_principal_and_node_quotas(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    bundle = _bundle(tmp_path)
    cluster = cluster_factory(
        1, **bundle.node_settings(), max_watches_per_principal=2, max_watches_per_node=3
    )
    ca = str(bundle.ca_file)
    opened: list[Client] = []

    def client(token: str) -> Client:
        made = Client(cluster.endpoints, tls=ca, token=token)
        opened.append(made)
        return made

    try:
        admin = client(bundle.admin_token)
        admin.acquire("gpu/x", owner="ops", ttl=60)  # one event in the history
        agent_a, agent_b, agent_c = client(AGENT_TOKEN), client(AGENT_TOKEN), client(AGENT_TOKEN)
        _open_watch(agent_a)
        _open_watch(agent_b)
        with pytest.raises(QuotaExceededError) as refused:
            _open_watch(agent_c)
        assert refused.value.definite
        assert "max_watches_per_principal" in str(refused.value)
        # Another principal gets the node's last watch; then the node is full.
        _open_watch(client(OTHER_TOKEN))
        with pytest.raises(QuotaExceededError) as full:
            _open_watch(client(OTHER_TOKEN))
        assert "max_watches_per_node" in str(full.value)
        # Requests other than watches are served as before.
        assert admin.holder("gpu/x") is not None
        # Closing a watcher's connection frees its slot (the node notices the close).
        agent_a.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                _open_watch(client(AGENT_TOKEN))
                break
            except QuotaExceededError:
                assert time.monotonic() < deadline, "the closed watch never freed its slot"
                time.sleep(0.1)
    finally:
        for made in opened:
            made.close()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_watches_without_auth_count_per_node(cluster_factory: Factory) -> None:
    cluster = cluster_factory(1, max_watches_per_node=1)
    with Client(cluster.endpoints) as first, Client(cluster.endpoints) as second:
        first.acquire("gpu/x", owner="ops", ttl=60)
        _open_watch(first)
        with pytest.raises(QuotaExceededError):
            _open_watch(second)
        assert second.holder("gpu/x") is not None


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_http_watches_count_toward_the_node_quota() -> None:
    cluster = admin_cluster(1, max_watches_per_node=1)
    cluster.start()
    try:
        with Client(cluster.endpoints) as client:
            client.acquire("gpu/x", owner="ops", ttl=60)
            _open_watch(client)
            # Refused as a plain answer before anything streams.
            url = f"http://{admin_of(cluster, 'n1')}/v1/watch?prefix=gpu/"
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(url, timeout=30).close()
            assert refused.value.code == 429
            assert json.loads(refused.value.read())["error"]["code"] == "QUOTA_EXCEEDED"
    finally:
        cluster.close()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_only_a_principal_with_shape_creates_a_pool(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    bundle = secure_bundle(tmp_path / "tls")
    bundle.auth_file.write_text(
        bundle.auth_file.read_text()
        + textwrap.dedent(
            f"""
            [roles.agent]
            permissions = [{{ prefix = "gpu/", actions = ["read", "write"] }}]

            [roles.pool-owner]
            permissions = [{{ prefix = "gpu/", actions = ["read", "write", "shape"] }}]

            [[principals]]
            name = "agent-7"
            token_sha256 = "{token_digest(AGENT_TOKEN)}"
            roles = ["agent"]

            [[principals]]
            name = "shaper"
            token_sha256 = "{token_digest(OTHER_TOKEN)}"
            roles = ["pool-owner"]
            """
        )
    )
    cluster = cluster_factory(3, **bundle.node_settings())
    ca = str(bundle.ca_file)
    with (
        Client(cluster.endpoints, tls=ca, token=AGENT_TOKEN) as agent,
        Client(cluster.endpoints, tls=ca, token=OTHER_TOKEN) as shaper,
        Client(cluster.endpoints, tls=ca, token=bundle.admin_token) as admin,
    ):
        # The squat: an agent fixing a wrong capacity on a free pool key is refused,
        # definite, and the key stays free (no holder, no shape).
        with pytest.raises(PermissionDeniedError) as refused:
            agent.acquire("gpu/pool", owner="a", ttl=30, capacity=1_000, units=1)
        assert refused.value.definite
        assert admin.holder("gpu/pool") is None and admin.leases("gpu/") == []
        # A plain lock needs no shape permission.
        assert agent.acquire("gpu/lock", owner="a", ttl=30).token > 0
        # The shaper fixes the shape; the agent then joins it (its capacity must match).
        first = shaper.acquire("gpu/pool", owner="s", ttl=30, capacity=4, units=1)
        joined = agent.acquire("gpu/pool", owner="a", ttl=30, capacity=4, units=2)
        assert first.token < joined.token
        # Once the pool is empty again its shape is gone: the agent cannot re-fix it.
        shaper.release(first)
        agent.release(joined)
        with pytest.raises(PermissionDeniedError):
            agent.acquire("gpu/pool", owner="a", ttl=30, capacity=2, units=1)
        # admin implies shape.
        assert admin.acquire("gpu/other", owner="o", ttl=30, capacity=3, units=1).token > 0
