"""``raftlease watch``, ``sessions``, ``waiters`` and ``revoke`` (issue 13) on real node
processes, human and ``--json`` output, revoke refused without the admin permission
when auth is on; and the CLI ergonomics: durations, the owner default, booleans in
``node --set``.

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_cli_admin.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from raftlease import (
    AsyncClient,
    Client,
    Lease,
    LeaseHeldError,
    LeaseNotFoundError,
    RaftLeaseError,
)
from raftlease.server.auth import token_digest
from raftlease.testing import LocalCluster, wait_for
from raftlease.testing.certs import secure_bundle

pytestmark = pytest.mark.timeout(120)

Factory = Callable[..., LocalCluster]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "raftlease", *args]
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=full_env)


def eps(cluster: LocalCluster) -> str:
    return ",".join(cluster.endpoints)


# ------------------------------------------------------------------ watch


@pytest.mark.integration
def test_watch_streams_events_in_json_and_human_lines(shared: LocalCluster) -> None:
    prefix = "cli-admin/watch/"
    with Client(shared.endpoints) as c:
        start = c.read(prefix + "a", consistency="log").revision or 0
        lease = c.acquire(prefix + "a", owner="w1", ttl=30)
        # A new TTL: a log write at once (a renewal with the same TTL is answered from
        # the leader's memory and its event comes when it is written, design.md 9a).
        lease = c.renew(lease, ttl=31)
        c.release(lease)
        c.acquire(prefix + "b", owner="w2", ttl=30, value="v")
        c.revoke(prefix + "b")
    args = ("watch", prefix, "--from-revision", str(start + 1), "--endpoints", eps(shared))
    out = run(*args, "--count", "5", "--json")
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(e["type"], e["key"]) for e in events] == [
        ("grant", prefix + "a"),
        ("renew", prefix + "a"),
        ("release", prefix + "a"),
        ("grant", prefix + "b"),
        ("revoke", prefix + "b"),
    ]
    revisions = [e["revision"] for e in events]
    assert revisions == sorted(revisions) and len(set(revisions)) == 5
    assert events[3]["owner"] == "w2" and events[3]["value"] == "v"
    assert all("lease_id" not in e for e in events)
    human = run(*args, "--count", "2")
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert len(lines) == 2
    assert re.search(r"\d+ grant\s+cli-admin/watch/a\s+owner w1\s+token \d+", lines[0]), lines
    assert "renew" in lines[1]


@pytest.mark.integration
def test_watch_for_a_duration_ends_quietly_when_nothing_happens(shared: LocalCluster) -> None:
    start = time.monotonic()
    out = run("watch", "cli-admin/quiet/", "--for", "1s", "--endpoints", eps(shared))
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    assert time.monotonic() - start >= 0.9


# --------------------------------------------------------- sessions, waiters


@pytest.mark.integration
def test_sessions_lists_owners_and_counts_never_the_session_id(shared: LocalCluster) -> None:
    with Client(shared.endpoints) as c, c.session(owner="cli-admin-sess", ttl=20) as session:
        session.acquire("cli-admin/sess/1")
        session.acquire("cli-admin/sess/2")
        out = run("sessions", "--json", "--endpoints", eps(shared))
        assert out.returncode == 0, out.stderr
        rows = [r for r in json.loads(out.stdout)["sessions"] if r["owner"] == "cli-admin-sess"]
        assert len(rows) == 1
        assert rows[0]["leases"] == 2 and rows[0]["waiters"] == 0 and rows[0]["ttl"] == 20
        assert 0 < rows[0]["remaining"] <= 20
        assert session.session_id not in out.stdout
        human = run("sessions", "--endpoints", eps(shared))
        assert human.returncode == 0, human.stderr
        assert re.search(r"cli-admin-sess\s+ttl 20 s\s+[\d.]+ s left\s+2 lease\(s\)", human.stdout)
        assert session.session_id not in human.stdout


@pytest.fixture
def queued(shared: LocalCluster) -> Iterator[tuple[Client, str, Lease, list[threading.Thread]]]:
    """A held key with two queued acquires (bob, then carol at priority 3, who goes
    first), made by threads; every lease is released at teardown."""
    key = "cli-admin/queue-" + os.urandom(3).hex()
    c = Client(shared.endpoints)
    held = c.acquire(key, owner="alice", ttl=60)
    granted: list[Lease] = []

    def wait_in_line(owner: str, priority: int) -> None:
        with contextlib.suppress(LeaseHeldError):
            granted.append(c.acquire(key, owner=owner, ttl=60, wait=60, priority=priority))

    threads = [threading.Thread(target=wait_in_line, args=("bob", 0), daemon=True)]
    threads[0].start()
    wait_for(lambda: len(c.waiters(key)) == 1, 30, "bob to queue")
    threads.append(threading.Thread(target=wait_in_line, args=("carol", 3), daemon=True))
    threads[1].start()
    wait_for(lambda: len(c.waiters(key)) == 2, 30, "carol to queue")
    try:
        yield c, key, held, threads
    finally:
        # Revoke until every waiter was granted (and revoked) and the key is free.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            any(t.is_alive() for t in threads) or c.holder(key) is not None
        ):
            with contextlib.suppress(RaftLeaseError):
                c.revoke(key)
            for t in threads:
                t.join(timeout=0.2)
        c.close()


@pytest.mark.integration
def test_waiters_shows_the_queue_in_grant_order(
    shared: LocalCluster, queued: tuple[Client, str, Lease, list[threading.Thread]]
) -> None:
    _, key, _, _ = queued
    out = run("waiters", key, "--json", "--endpoints", eps(shared))
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["waiters"]
    assert [(r["position"], r["owner"], r["priority"], r["units"]) for r in rows] == [
        (1, "carol", 3, 1),
        (2, "bob", 0, 1),
    ]
    assert all(0 < r["wait_left"] <= 60 for r in rows)
    assert not re.search(r"[0-9a-f]{32}", out.stdout), "a lease id leaked"
    human = run("waiters", key, "--endpoints", eps(shared))
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0].lstrip().startswith("1. carol") and "priority 3" in lines[0]
    assert lines[1].lstrip().startswith("2. bob")
    free = run("waiters", "cli-admin/nobody", "--endpoints", eps(shared))
    assert "nobody waits" in free.stdout


# ------------------------------------------------------------------ revoke


@pytest.mark.integration
def test_revoke_ends_the_lease_and_wakes_the_next_waiter(
    shared: LocalCluster, queued: tuple[Client, str, Lease, list[threading.Thread]]
) -> None:
    c, key, held, _ = queued
    out = run("revoke", key, "--json", "--endpoints", eps(shared))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "ok": True,
        "key": key,
        "revoked": 1,
        "tokens": [held.token],
    }
    # carol (priority 3) is granted in the entry that revoked alice's lease.
    holder = wait_for(lambda: c.holder(key), 30, "the next holder")
    assert holder.owner == "carol" and holder.token > held.token
    with pytest.raises(Exception) as info:
        c.renew(held)
    assert getattr(info.value, "code", "") in ("NOT_OWNER", "LEASE_NOT_FOUND")
    # One lease by token (human output), then nothing left to revoke: exit 1.
    human = run("revoke", key, "--token", str(holder.token), "--endpoints", eps(shared))
    assert human.returncode == 0, human.stderr
    assert f"revoked 1 lease(s) on {key} (token {holder.token})" in human.stdout
    bob = wait_for(lambda: c.holder(key), 30, "bob")
    assert bob.owner == "bob"
    forged = run("revoke", key, "--lease-id", "f" * 32, "--json", "--endpoints", eps(shared))
    assert forged.returncode == 1
    assert json.loads(forged.stdout)["code"] == "LEASE_NOT_FOUND"
    assert c.holder(key).owner == "bob"  # type: ignore[union-attr]
    both = run("revoke", key, "--lease-id", "x", "--token", "3", "--endpoints", eps(shared))
    assert both.returncode == 2


@pytest.mark.integration
def test_revoke_needs_the_admin_permission_when_auth_is_on(
    cluster_factory: Factory, tmp_path: Path
) -> None:
    bundle = secure_bundle(tmp_path / "tls")
    agent_token = "agent-token-for-revoke-0123456789"
    bundle.auth_file.write_text(
        bundle.auth_file.read_text()
        + textwrap.dedent(
            f"""
            [roles.worker]
            permissions = [{{ prefix = "jobs/", actions = ["read", "write"] }}]

            [[principals]]
            name = "worker-1"
            token_sha256 = "{token_digest(agent_token)}"
            roles = ["worker"]
            """
        )
    )
    cluster = cluster_factory(3, **bundle.node_settings())
    ca = str(bundle.ca_file)
    with Client(cluster.endpoints, tls=ca, token=agent_token) as worker:
        lease = worker.acquire("jobs/1", owner="worker-1", ttl=30)
    env = {"RAFTLEASE_CA_FILE": ca, "RAFTLEASE_TOKEN": agent_token}
    denied = run("revoke", "jobs/1", "--json", "--endpoints", eps(cluster), env=env)
    assert denied.returncode == 1, denied.stderr
    assert json.loads(denied.stdout)["code"] == "PERMISSION_DENIED"
    listing = run("sessions", "--json", "--endpoints", eps(cluster), env=env)
    assert json.loads(listing.stdout)["code"] == "PERMISSION_DENIED"  # not read on every key
    with Client(cluster.endpoints, tls=ca, token=bundle.admin_token) as admin:
        assert admin.holder("jobs/1") is not None, "a refused revoke changed the state"
    env["RAFTLEASE_TOKEN"] = bundle.admin_token
    allowed = run("revoke", "jobs/1", "--json", "--endpoints", eps(cluster), env=env)
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["tokens"] == [lease.token]
    # The bearer token also comes from RAFTLEASE_AUTH_TOKEN, which wins (what a command
    # under ``raftlease lock`` sees: there RAFTLEASE_TOKEN is the fencing token).
    env.update(RAFTLEASE_TOKEN="17", RAFTLEASE_AUTH_TOKEN=agent_token)
    waiting = run("waiters", "jobs/1", "--json", "--endpoints", eps(cluster), env=env)
    assert waiting.returncode == 0, waiting.stderr


@pytest.mark.integration
def test_async_client_revoke_waiters_and_sessions(shared: LocalCluster) -> None:
    key = "cli-admin/async"

    async def scenario() -> None:
        async with AsyncClient(shared.endpoints) as ac:
            held = await ac.acquire(key, owner="a1", ttl=30)
            waiter = asyncio.ensure_future(ac.acquire(key, owner="a2", ttl=30, wait=30))
            deadline = time.monotonic() + 30
            while not await ac.waiters(key):
                assert time.monotonic() < deadline, "the waiter never queued"
                await asyncio.sleep(0.05)
            (queued,) = await ac.waiters(key)
            assert (queued.position, queued.owner, queued.in_session) == (1, "a2", False)
            async with ac.session(owner="a-sess", ttl=10):
                assert any(s.owner == "a-sess" for s in await ac.sessions())
            assert await ac.revoke(key, lease_id=held.lease_id) == [held.token]
            granted = await asyncio.wait_for(waiter, 30)
            assert granted.owner == "a2" and granted.token > held.token
            with pytest.raises(LeaseNotFoundError):
                await ac.revoke(key, token=held.token)
            await ac.release(granted)

    asyncio.run(scenario())


@pytest.mark.integration
def test_owner_defaults_to_hostname_and_pid(shared: LocalCluster) -> None:
    host = socket.gethostname()
    out = run("acquire", "cli-admin/owner", "--ttl", "30s", "--json", "--endpoints", eps(shared))
    assert out.returncode == 0, out.stderr
    owner = json.loads(out.stdout)["owner"]
    assert re.fullmatch(re.escape(host) + r":\d+", owner), owner
    with Client(shared.endpoints) as c:
        c.revoke("cli-admin/owner")
        mine = f"{host}:{os.getpid()}"
        lease = c.acquire("cli-admin/owner2", ttl=5)
        assert lease.owner == mine
        c.release(lease)
        with c.lock("cli-admin/owner3", ttl=5) as held:
            assert held.lease is not None and held.lease.owner == mine
        with c.session(ttl=5) as session:
            assert session.owner == mine
