"""Cooperative preemption on a real 3-node cluster (issue 40; docs/design.md §4f).

A low-priority holder keeps renewing and ignores a ``request_yield``: it learns of
the request in its next keep-alive answer (the lock recipe's ``on_yield_requested``
fires), and at the deadline (log time) the cluster ends its lease itself and grants
the waiting higher-priority acquire in the same entry, with a new token; the old
token is fenced. The state machine's rules are in tests/unit/test_core_preempt.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from raftlease import Lease
from raftlease.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_an_ignored_yield_request_ends_the_lease_at_the_deadline(shared: LocalCluster) -> None:
    with shared.client() as c:
        asked: list[Lease] = []
        got: dict[str, Any] = {}
        with c.lock("yield/k", owner="low", ttl=1.5, on_yield_requested=asked.append) as held:
            old = held.token
            waiter = threading.Thread(
                target=lambda: got.setdefault(
                    "high", c.acquire("yield/k", owner="high", ttl=30.0, wait=20.0, priority=5)
                )
            )
            waiter.start()
            wait_for(lambda: len(c.waiters("yield/k")) == 1, 10, "the high acquire queued")
            sent = time.monotonic()
            assert c.request_yield("yield/k", deadline=2.0, priority=5, owner="high") == 1
            # Learnt within one keep-alive interval (ttl / 3 = 0.5 s), well before 2 s.
            wait_for(lambda: asked, 5, "on_yield_requested")
            learnt = time.monotonic() - sent
            assert asked[0].yield_by == "high" and asked[0].yield_deadline_ms is not None
            assert held.yield_requested
            # Ignored: the cluster ends the lease at the deadline and grants the waiter.
            waiter.join(timeout=15)
            granted = time.monotonic() - sent
            new: Lease = got["high"]
            assert new.token > old
            assert not c.fence("yield/k", old) and c.fence("yield/k", new.token)
            wait_for(lambda: held.lost.is_set(), 5, "the low holder sees its lease gone")
        assert learnt < 1.5, learnt
        assert 1.5 < granted < 6.0, granted
        # In log time: the grant's entry is the first at or after the deadline, one
        # housekeeping tick later (a heartbeat, 0.05 s here; loose for a loaded machine).
        deadline_ms = asked[0].yield_deadline_ms
        assert deadline_ms is not None
        granted_at_ms = new.expires_at_ms - round(new.ttl * 1000)
        assert 0 <= granted_at_ms - deadline_ms <= 1000, granted_at_ms - deadline_ms
        c.release(new)


def test_raftlease_lock_tells_the_command_through_its_yield_file(
    shared: LocalCluster, tmp_path: Any
) -> None:
    """``raftlease lock -- cmd``: the command finds a line in ``$RAFTLEASE_YIELD_FILE``
    once a yield is requested (and checkpoints, here: copies it and exits)."""
    from click.testing import CliRunner

    from raftlease.cli import main as cli_main

    out = tmp_path / "seen"
    script = (
        'while [ ! -s "$RAFTLEASE_YIELD_FILE" ]; do sleep 0.05; done; '
        f'cat "$RAFTLEASE_YIELD_FILE" > {out}'
    )
    where = ["--endpoints", ",".join(shared.endpoints)]

    def ask() -> None:
        with shared.client() as c:
            wait_for(lambda: c.holder("yield/cli"), 10, "the lock is held")
            c.request_yield("yield/cli", deadline=5.0, priority=1, owner="boss")

    asker = threading.Thread(target=ask)
    asker.start()
    result = CliRunner().invoke(
        cli_main,
        [
            "lock",
            "yield/cli",
            "--ttl",
            "1.5",
            "--owner",
            "worker",
            *where,
            "--",
            "sh",
            "-c",
            script,
        ],
    )
    asker.join(timeout=10)
    assert result.exit_code == 0, result.output
    assert "by=boss" in out.read_text() and "deadline_ms=" in out.read_text()


def test_a_session_learns_of_a_request_to_its_attached_lease(shared: LocalCluster) -> None:
    with shared.client() as c:
        told: list[list[dict[str, Any]]] = []
        with c.session(owner="s", ttl=1.5, on_yield_requested=told.append) as session:
            lease = session.acquire("yield/session")
            assert c.request_yield("yield/session", deadline=30.0, priority=1) == 1
            wait_for(lambda: told, 5, "the session's on_yield_requested")
            assert told[0][0]["key"] == "yield/session" and told[0][0]["token"] == lease.token
