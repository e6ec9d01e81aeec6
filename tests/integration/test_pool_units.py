"""Pools that say which units you got (issue 14): a grant on a shared key of capacity
2..1024 names the unit indices it holds, chosen by the state machine (the lowest free
ones at grant), reused after release, kept across a transfer and a snapshot, and
assigned deterministically to leases of a snapshot written before indices existed.

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_pool_units.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from raftlease.testing import LocalCluster

# ------------------------------------------------------------------ real cluster


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_clients_recipes_and_cli_show_the_units(shared: LocalCluster) -> None:
    with shared.client() as c:
        first = c.acquire("units/gpus", owner="job-1", ttl=10.0, capacity=4, units=2)
        assert first.unit_indices == (0, 1)
        with c.pool("units/gpus", capacity=4, units=1, owner="job-2", ttl=10.0) as held:
            assert held.unit_indices == (2,)
            read = c.read("units/gpus")
            assert {h.owner: h.unit_indices for h in read.holders} == {
                "job-1": (0, 1),
                "job-2": (2,),
            }
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "raftlease",
                    "holder",
                    "units/gpus",
                    "--json",
                    "--endpoints",
                    ",".join(shared.endpoints),
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            shown = json.loads(out.stdout)
            assert sorted(h["unit_indices"] for h in shown["holders"]) == [[0, 1], [2]]
        c.release(first)
        again = c.acquire("units/gpus", owner="job-3", ttl=10.0, capacity=4, units=3)
        assert again.unit_indices == (0, 1, 2)  # released units are reused, lowest first
        c.release(again)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_watch_events_name_the_units(shared: LocalCluster) -> None:
    with shared.client() as c:
        start = c.read("units/watched").revision or 0
        lease = c.acquire("units/watched", owner="job-w", ttl=10.0, capacity=3, units=2)
        c.release(lease)
        events = []
        for event in c.watch("units/watched", from_revision=start + 1):
            events.append(event)
            if event.type == "release":
                break
        assert [(e.type, e.unit_indices) for e in events] == [
            ("grant", (0, 1)),
            ("release", (0, 1)),
        ]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_http_api_shows_the_units() -> None:
    from tests.integration.test_admin_http import admin_cluster, admin_of
    from tests.unit.test_http_api import call

    cluster = admin_cluster(3)
    cluster.start()
    try:
        api = admin_of(cluster, cluster.leader_id())
        body = {"key": "units/http", "owner": "h", "ttl": 10, "capacity": 4, "units": 3}
        status, grant = call(api, "POST", "/v1/leases/acquire", body)
        assert status == 200 and grant["unit_indices"] == [0, 1, 2], grant
        status, read = call(api, "GET", "/v1/leases/holder?key=units/http")
        assert status == 200, read
        assert [h["unit_indices"] for h in read["holder"]["holders"]] == [[0, 1, 2]], read
    finally:
        cluster.stop()
        cluster.close()


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_fair_shares_decide_the_next_waiter_on_a_real_cluster(shared: LocalCluster) -> None:
    """Fair shares between tenants waiting on a key (docs/design.md §4d): queued
    a1, a2 (tenant "a") then b1 ("b"); rank order alone would grant a1, a2, b1, fair
    shares grant a1 (tie by name), then b1 ("a" was charged), then a2."""
    key = "fair/sem"
    order: list[str] = []
    with shared.client() as c:
        holder = c.acquire(key, owner="h", ttl=10.0)

        def wait_turn(name: str, tenant: str) -> None:
            lease = c.acquire(key, owner=name, ttl=10.0, wait=20.0, fairness_key=tenant)
            order.append(name)
            c.release(lease)

        threads = []
        for queued, (name, tenant) in enumerate((("a1", "a"), ("a2", "a"), ("b1", "b")), 1):
            thread = threading.Thread(target=wait_turn, args=(name, tenant), daemon=True)
            thread.start()
            threads.append(thread)
            deadline = time.monotonic() + 10.0
            while len(c.waiters(key)) < queued:  # queued in this order
                assert time.monotonic() < deadline, "the acquire did not queue"
                time.sleep(0.02)
        c.release(holder)
        for thread in threads:
            thread.join(20.0)
    assert order == ["a1", "b1", "a2"]
