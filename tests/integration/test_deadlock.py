"""Deadlock detection on a real 3-node cluster (issue 40; docs/design.md §4e).

Three agents each hold one key and each waits (a blocking ``acquire`` with ``wait``,
in a thread of its own) for the next agent's key. The acquire that closes the cycle
is refused ``DEADLOCK`` in the entry that would have queued it (at once, not at the
end of its wait), naming the cycle by owners and keys; exactly one agent gets it, and
the other two keep waiting: once the refused agent releases its key, the chain
unwinds and both are granted. On the planted build ``skip_deadlock_detection`` the
closing acquire queues, and the check (a cycle in the waits-for graph read back from
the cluster's ``waiters`` and ``holder`` reads) reports it. Serial (planted build;
tests/conftest.py ``SERIAL_FILES``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from raftlease import Client, DeadlockError, Lease
from raftlease.testing import LocalCluster, wait_for
from tests.integration.test_planted_bugs import hooks_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

AGENTS = ("a", "b", "c")


def waits_for_cycle(c: Client, keys: dict[str, str]) -> list[str]:
    """The check: a cycle among the agents in the waits-for graph as the cluster's
    reads show it (who holds each key, who waits on it). Empty when there is none."""
    holder = {key: (c.holder(key).owner if c.holder(key) else None) for key in keys.values()}
    edges: dict[str, str] = {}
    for key in keys.values():
        for waiting in c.waiters(key):
            if holder[key] and holder[key] != waiting.owner:
                edges[waiting.owner] = str(holder[key])
    for start in edges:
        seen, node = [start], edges[start]
        while node in edges and node not in seen:
            seen.append(node)
            node = edges[node]
        if node == start:
            return [f"cycle of waits left in the cluster: {' -> '.join([*seen, start])}"]
    return []


def run_cycle(cluster: LocalCluster, prefix: str) -> tuple[dict[str, Any], list[str]]:
    """a holds k-a, b holds k-b, c holds k-c; a waits for k-b, b for k-c, then c for
    k-a (the closing acquire). Returns what each waiting acquire ended with and the
    check's violations, read while the waits would still run."""
    keys = {agent: f"{prefix}/k-{agent}" for agent in AGENTS}
    outcome: dict[str, Any] = {}
    with cluster.client() as c:
        held: dict[str, Lease] = {
            agent: c.acquire(keys[agent], owner=agent, ttl=60.0) for agent in AGENTS
        }

        def wait(agent: str, key: str) -> None:
            try:
                outcome[agent] = c.acquire(key, owner=agent, ttl=60.0, wait=20.0)
            except Exception as exc:
                outcome[agent] = exc

        threads = []
        for agent, nxt in (("a", "b"), ("b", "c")):
            threads.append(threading.Thread(target=wait, args=(agent, keys[nxt])))
            threads[-1].start()
            target = keys[nxt]
            wait_for(lambda t=target: len(c.waiters(t)) == 1, 10, f"{agent} queued on {target}")  # type: ignore[misc]
        started = time.monotonic()
        closing = threading.Thread(target=wait, args=("c", keys["a"]))
        closing.start()
        threads.append(closing)
        # Honest: c is refused at once. Planted: c queues (the check sees the cycle).
        wait_for(
            lambda: "c" in outcome or len(c.waiters(keys["a"])) == 1, 10, "c refused or queued"
        )
        violations = waits_for_cycle(c, keys)
        if "c" in outcome:
            outcome["c_after"] = time.monotonic() - started
        # Unwind: the agents give their keys back (c's first), so every wait ends.
        for agent in ("c", "b", "a"):
            c.release(held[agent])
        for thread in threads:
            thread.join(timeout=30)
        for agent in AGENTS:
            got = outcome.get(agent)
            if isinstance(got, Lease):
                c.release(got)
    return outcome, violations


@pytest.mark.parametrize("build", ["honest", "skip_deadlock_detection"])
def test_an_induced_cycle_of_three_is_refused_in_the_entry_that_closes_it(
    cluster_factory: Callable[..., LocalCluster], build: str
) -> None:
    cluster = cluster_factory(hooks=hooks_for(build))
    outcome, violations = run_cycle(cluster, f"dl-{build}")
    if build != "honest":
        assert violations, "the planted build left no cycle for the check to see"
        return
    assert violations == []
    refused = [agent for agent in AGENTS if isinstance(outcome.get(agent), DeadlockError)]
    assert refused == ["c"], outcome
    error = outcome["c"]
    assert error.definite and error.code == "DEADLOCK"
    assert sorted(step["owner"] for step in error.cycle) == ["a", "b", "c"]
    assert "lease" not in str(error.detail).lower()
    # Refused in the entry that would have queued it, long before its 20 s wait.
    assert outcome["c_after"] < 10.0
    # The other two were granted once the refused agent released its key.
    assert isinstance(outcome["a"], Lease) and isinstance(outcome["b"], Lease)
