"""The audit trail on a real cluster (issue 39, docs/audit.md): a key's history as the
clients made it (grants, release, expiry, with tokens and owners), identical on every
node, exported and verified by ``raftlease audit verify``, which exits 1 when one byte
of the export changes. The pure half is tests/unit/test_audit.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from raftlease.errors import RaftLeaseError
from raftlease.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftlease", *args, "--endpoints", ",".join(cluster.endpoints)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_keys_history_is_the_same_on_every_node_and_verifies(
    shared: LocalCluster, tmp_path: Path
) -> None:
    with shared.client() as c:
        first = c.acquire("audit/k", owner="agent-a", ttl=5.0)
        c.release(first)
        second = c.acquire("audit/k", owner="agent-b", ttl=0.3)
        wait_for(lambda: c.read("audit/k").holder is None, 10.0, "the lease expired")
        expected = [
            ("grant", first.token, "agent-a"),
            ("release", first.token, "agent-a"),
            ("grant", second.token, "agent-b"),
            ("expire", second.token, "agent-b"),
        ]

        def same_everywhere() -> list[list[object]] | None:
            answers = [c.audit(e, key="audit/k") for e in shared.endpoints]
            records = [a["records"] for a in answers]
            if len(records[0]) == 4 and all(r == records[0] for r in records):
                return records[0]
            return None

        records = wait_for(same_everywhere, 15.0, "every node holds the key's four records")
    assert [(r[2], r[4], r[5]) for r in records] == expected
    times = [int(r[1]) for r in records]  # type: ignore[call-overload]
    assert times == sorted(times)

    shown = cli(shared, "audit", "show", "audit/k")
    assert shown.returncode == 0, shown.stderr
    assert [line.split()[2] for line in shown.stdout.splitlines()] == [e[0] for e in expected]

    # Without KEY: every key's records from --since (docs/audit.md), at most --limit.
    since = int(records[0][0])  # type: ignore[call-overload]
    every = cli(shared, "audit", "show", "--since", str(since), "--json")
    assert every.returncode == 0, every.stderr
    rows = json.loads(every.stdout)["records"]
    assert all(r[0] >= since for r in rows) and rows[0] == records[0]
    assert {tuple(r) for r in records} <= {tuple(r) for r in rows}
    two = cli(shared, "audit", "show", "--since", str(since), "--limit", "2", "--json")
    assert json.loads(two.stdout)["records"] == rows[:2]

    # A release under a lease id that is not the holder's: the refusal ring has it.
    with shared.client() as c:
        held = c.acquire("audit/refused", owner="agent-c", ttl=30.0)
        with pytest.raises(RaftLeaseError) as refused:
            c.release(dataclasses.replace(held, lease_id="not-the-lease"))
        assert refused.value.code == "NOT_OWNER"
        c.release(held)
    ring = cli(shared, "audit", "show", "audit/refused", "--refusals", "--json")
    assert ring.returncode == 0, ring.stderr
    assert [(r[2], r[4], r[5]) for r in json.loads(ring.stdout)["records"]] == [
        ("not_owner", held.token, "agent-c")
    ]

    exported = cli(shared, "audit", "export")
    assert exported.returncode == 0, exported.stderr
    path = tmp_path / "trail.jsonl"
    path.write_text(exported.stdout)
    assert cli(shared, "audit", "verify", str(path)).returncode == 0

    # One byte changed (an owner's letter) and the chain breaks: exit 1.
    text = exported.stdout
    at = text.index('"agent-a"') + 7
    path.write_text(text[:at] + ("b" if text[at] != "b" else "c") + text[at + 1 :])
    broken = cli(shared, "audit", "verify", str(path))
    assert broken.returncode == 1 and "breaks" in broken.stdout
    # A record line removed: exit 1 too.
    lines = text.splitlines()
    path.write_text("\n".join(lines[:2] + lines[3:]) + "\n")
    assert cli(shared, "audit", "verify", str(path)).returncode == 1

    # Every node's own chain verifies, and nodes at one applied index agree.
    def online() -> bool:
        return cli(shared, "audit", "verify").returncode == 0

    wait_for(online, 15.0, "audit verify of every node exits 0")


def test_every_node_reports_the_same_head(shared: LocalCluster) -> None:
    with shared.client() as c:
        c.release(c.acquire("audit/heads", owner="x", ttl=5.0))

    def agree() -> str | None:
        statuses = shared.statuses()
        heads = {(s.get("audit_seq"), s.get("audit_head")) for s in statuses}
        return statuses[0]["audit_head"] if len(statuses) == 3 and len(heads) == 1 else None

    wait_for(agree, 15.0, "every node applied the same records")


AGENT_TOKEN = "audit-agent-token-0123456789abcdef"


def test_get_v1_audit_is_admin_only_and_filters(tmp_path: Path) -> None:
    """``GET /v1/audit`` (docs/http-api.md): the admin reads a key's grant with the
    agent's principal, filtered by key, principal, since and limit; the agent itself
    is refused 403 PERMISSION_DENIED (the trail names every principal's keys)."""
    import ssl
    import urllib.error
    import urllib.request

    from raftlease.testing.certs import agent_role, secure_bundle
    from tests.integration.test_admin_http import admin_cluster, admin_of, get

    bundle = secure_bundle(tmp_path / "tls")
    bundle.auth_file.write_text(bundle.auth_file.read_text() + agent_role({"agent-7": AGENT_TOKEN}))
    cluster = admin_cluster(1, **bundle.node_settings())
    cluster.start()
    try:
        addr = admin_of(cluster, "n1")
        context = ssl.create_default_context(cafile=str(bundle.ca_file))
        admin = {"Authorization": f"Bearer {bundle.admin_token}"}
        agent = {"Authorization": f"Bearer {AGENT_TOKEN}"}
        wait_for(
            lambda: get(addr, "/readyz", scheme="https", context=context)[0] == 200, 30, "ready"
        )

        def acquire(key: str) -> dict[str, object]:
            body = json.dumps({"key": key, "owner": "w", "ttl": 30}).encode()
            request = urllib.request.Request(
                f"https://{addr}/v1/leases/acquire",
                data=body,
                method="POST",
                headers={**agent, "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10, context=context) as response:
                answer: dict[str, object] = json.loads(response.read())
                return answer

        first = acquire("gpu/0")
        acquire("gpu/1")

        def audit(query: str, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
            status, _, body = get(addr, f"/v1/audit{query}", headers=headers,
                                  scheme="https", context=context)  # fmt: skip
            return status, json.loads(body)

        status, answer = audit("?key=gpu/0", admin)
        assert status == 200
        records = answer["records"]
        assert isinstance(records, list)
        grants = [r for r in records if r[2] == "grant"]
        assert [(r[3], r[4], r[5], r[6], r[7]) for r in grants] == [
            ("gpu/0", first["token"], "w", "agent-7", "agent-7")
        ]
        assert answer["node"] == "n1" and isinstance(answer["head"], str)
        status, every = audit("?principal=agent-7", admin)
        assert status == 200 and {r[3] for r in every["records"]} == {"gpu/0", "gpu/1"}  # type: ignore[union-attr]
        later = grants[0][0] + 1
        status, since = audit(f"?principal=agent-7&since={later}", admin)
        assert status == 200 and [r[3] for r in since["records"]] == ["gpu/1"]  # type: ignore[union-attr]
        status, one = audit("?principal=agent-7&limit=1", admin)
        assert status == 200 and [r[3] for r in one["records"]] == ["gpu/0"]  # type: ignore[union-attr]
        status, refused = audit("?key=gpu/0", agent)
        assert status == 403 and refused["error"]["code"] == "PERMISSION_DENIED"  # type: ignore[index]
        assert audit("?limit=0", admin)[0] == 400
        # A refusal the state machine decides goes to the refusal ring, with who asked.
        body = json.dumps({"key": "gpu/0", "lease_id": "not-the-lease"}).encode()
        request = urllib.request.Request(
            f"https://{addr}/v1/leases/release",
            data=body,
            method="POST",
            headers={**agent, "Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(request, timeout=10, context=context)
            raise AssertionError("a release under another lease id was accepted")
        except urllib.error.HTTPError as err:
            assert err.code == 409 and json.loads(err.read())["error"]["code"] == "NOT_OWNER"
        status, ring = audit("?trail=refusals&key=gpu/0", admin)
        assert status == 200
        assert [(r[2], r[3], r[4], r[7]) for r in ring["records"]] == [  # type: ignore[union-attr]
            ("not_owner", "gpu/0", first["token"], "agent-7")
        ]
    finally:
        cluster.close()
