"""The audit trail on a real cluster (issue 39, docs/audit.md): a key's history as the
clients made it (grants, release, expiry, with tokens and owners), identical on every
node, exported and verified by ``raftlease audit verify``, which exits 1 when one byte
of the export changes. The pure half is tests/unit/test_audit.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
