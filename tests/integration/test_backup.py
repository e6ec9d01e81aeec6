"""Backups and disaster recovery (issue 13, "Save and restore it";
docs/disaster-recovery.md).

The integration half (real node processes) of these tests; the unit half, with the whole
description and the helpers both halves use, is tests/unit/test_backup.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from raftlease import Client, PermissionDeniedError, UnauthenticatedError
from raftlease.server.auth import token_digest
from raftlease.server.backup import (
    CHUNK_BYTES,
    DEFAULT_TOKEN_JUMP,
    make_header,
    read_snapshot,
)
from raftlease.testing import TEST_SETTINGS, LocalCluster, wait_for
from raftlease.testing.certs import secure_bundle
from tests.integration.test_cluster import raw_request

# ------------------------------------------------- real node processes


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftlease", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def _restore_cluster(snap: Path, root: Path, *extra: str) -> LocalCluster:
    """A NEW cluster (its own ports and data directories), every node seeded from
    ``snap`` with the CLI, not started."""
    new = LocalCluster(3, data_dir=root, settings=dict(TEST_SETTINGS))
    members = [arg for n in new.nodes for arg in ("--member", f"{n.id},{n.raft},{n.client}")]
    for node in new.nodes:
        out = _cli(
            "snapshot",
            "restore",
            str(snap),
            "--id",
            node.id,
            "--data-dir",
            str(new.node_dir(node.id)),
            *members,
            *extra,
        )
        assert out.returncode == 0, out.stderr
        assert "new grants get tokens above" in out.stdout
    return new


def _leases(c: Client) -> list[tuple[str, str, int]]:
    return sorted((h.key, h.owner, h.token) for h in c.leases())


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_save_kill_everything_restore_into_a_new_cluster(tmp_path: Path) -> None:
    old = LocalCluster(3, data_dir=tmp_path / "old", settings=dict(TEST_SETTINGS))
    new: LocalCluster | None = None
    try:
        old.start()
        tokens: list[int] = []
        with old.client() as c:
            alice = c.acquire("dr/a", owner="alice", ttl=60.0)
            short = c.acquire("dr/short", owner="sam", ttl=10.0)
            bob = c.acquire("dr/b", owner="bob", ttl=60.0)
            gone = c.acquire("dr/gone", owner="gus", ttl=60.0)
            c.release(gone)
            tokens += [alice.token, short.token, bob.token, gone.token]
            wait_for(
                lambda: (h := c.holder("dr/short")) is not None and h.remaining < 5.0,
                30,
                "dr/short to have run down part of its TTL",
            )
            snap = tmp_path / "backup.snap"
            out = _cli(
                "snapshot", "save", str(snap), "--endpoints", ",".join(old.endpoints), "--json"
            )
            assert out.returncode == 0, out.stderr
            header = json.loads(out.stdout)["header"]
            saved_leases = _leases(c)
            left_at_save = c.holder("dr/short")
            assert left_at_save is not None
            # After the backup the old cluster goes on granting (these the new one
            # never hears of): a leader change, a reserve and grants.
            old.kill_node(old.leader_id())
            old.wait_for_leader(timeout=60)
            late = c.acquire("dr/late", owner="lucy", ttl=60.0)
            tokens.append(late.token)
        assert header["leases"] == 3 and header["source"] == "leader"
        assert header["revision"] >= max(tokens[:4])
        assert _cli("snapshot", "inspect", str(snap)).returncode == 0
        for node in old.nodes:  # the whole cluster is lost
            old.kill_node(node.id)

        new = _restore_cluster(snap, tmp_path / "new")
        assert {n.client for n in new.nodes}.isdisjoint(old.endpoints)
        # Refused a second time: the data directories now hold Raft state.
        again = _cli(
            "snapshot",
            "restore",
            str(snap),
            "--id",
            "n1",
            "--data-dir",
            str(new.node_dir("n1")),
            *[arg for n in new.nodes for arg in ("--member", f"{n.id},{n.raft},{n.client}")],
        )
        assert again.returncode == 1 and "already holds a node's Raft state" in again.stderr
        new.start(timeout=60)
        with new.client() as c:
            # The state is what was saved: every holder with its token.
            assert _leases(c) == saved_leases
            # A holder goes on with the lease id it had.
            renewed = c.renew(alice)
            assert (renewed.token, renewed.owner) == (alice.token, "alice")
            # A lease not renewed lives one TTL from the new cluster's start: more than
            # it had left when the backup was taken, then it expires.
            restored_short = c.holder("dr/short")
            assert restored_short is not None and restored_short.token == short.token
            assert restored_short.remaining > left_at_save.remaining
            # New grants: tokens above every token the old cluster handed out,
            # including those after the backup.
            fresh = c.acquire("dr/c", owner="carol", ttl=30.0)
            assert fresh.token > max(tokens)
            assert fresh.token > header["ceiling"] + DEFAULT_TOKEN_JUMP
            after = c.acquire("dr/late", owner="lena", ttl=30.0)
            assert after.token > fresh.token
            wait_for(lambda: c.holder("dr/short") is None, 30, "the restored lease to expire")
            assert c.fence("dr/b", bob.token)
        logs = new.logs()
        assert "restored snapshot: 3 leases" in logs, logs
    finally:
        old.close()
        if new is not None:
            new.close()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_majority_lost_save_from_a_survivors_data_dir(tmp_path: Path) -> None:
    old = LocalCluster(3, data_dir=tmp_path / "old", settings=dict(TEST_SETTINGS))
    new: LocalCluster | None = None
    try:
        old.start()
        with old.client() as c:
            leases = [c.acquire(f"mj/{i}", owner=f"w{i}", ttl=60.0) for i in range(20)]
            c.release(leases.pop())
            expected = _leases(c)
            leader = old.leader_id()
            # Every node has applied the last write before the majority is lost.
            index = max(s.get("commit_index", 0) for s in old.statuses())
            wait_for(
                lambda: all(s.get("applied_index", 0) >= index for s in old.statuses()),
                30,
                "every node to apply the last write",
            )
        survivor = next(n.id for n in old.nodes if n.id != leader)
        for node in old.nodes:  # the leader and one more are lost
            if node.id != survivor:
                old.kill_node(node.id)
        assert old.stop_node(survivor) == 0  # step 1: stop the survivors
        snap = tmp_path / "survivor.snap"
        out = _cli(
            "snapshot", "save", str(snap), "--from-data-dir", str(old.node_dir(survivor)), "--json"
        )
        assert out.returncode == 0, out.stderr
        header = json.loads(out.stdout)["header"]
        assert header["source"] == "data-dir" and header["leases"] == 19
        # A crashed node's directory is refused without --crashed.
        lost = _cli(
            "snapshot",
            "save",
            str(tmp_path / "x.snap"),
            "--from-data-dir",
            str(old.node_dir(leader)),
        )
        assert lost.returncode == 1 and "--crashed" in lost.stderr
        assert not (tmp_path / "x.snap").exists()
        crashed = _cli(
            "snapshot",
            "save",
            str(tmp_path / "x.snap"),
            "--from-data-dir",
            str(old.node_dir(leader)),
            "--crashed",
            "--json",
        )
        assert crashed.returncode == 0, crashed.stderr
        assert json.loads(crashed.stdout)["header"]["leases"] == 19

        new = _restore_cluster(snap, tmp_path / "new")
        new.start(timeout=60)
        with new.client() as c:
            assert _leases(c) == expected
            renewed = c.renew(leases[3])
            assert renewed.token == leases[3].token
            fresh = c.acquire("mj/new", owner="n", ttl=10.0)
            assert fresh.token > header["ceiling"] + DEFAULT_TOKEN_JUMP
    finally:
        old.close()
        if new is not None:
            new.close()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_offline_save_reads_pysyncobjs_own_dump_and_journal(tmp_path: Path) -> None:
    """After log compaction each node's state is its dump plus the journal after it:
    the offline reader rebuilds every node to the leases the leader saved."""
    settings = {**TEST_SETTINGS, "compaction_min_entries": 20, "compaction_min_time": 1.5}
    cluster = LocalCluster(3, data_dir=tmp_path / "c", settings=settings)
    try:
        cluster.start()
        with cluster.client() as c:
            for i in range(40):
                c.acquire(f"cmp/{i}", owner=f"o{i}", ttl=120.0)
            wait_for(
                lambda: all((cluster.node_dir(n.id) / "raft.dump").exists() for n in cluster.nodes),
                60,
                "every node to compact its log into a dump",
            )
            for i in range(40, 50):  # these are in the journals only (or a later dump)
                c.acquire(f"cmp/{i}", owner=f"o{i}", ttl=120.0)
            snap = tmp_path / "leader.snap"
            out = _cli("snapshot", "save", str(snap), "--endpoints", ",".join(cluster.endpoints))
            assert out.returncode == 0, out.stderr
            expected = _leases(c)
        cluster.stop()
        assert len(expected) == 50
        headers: dict[str, dict[str, Any]] = {}
        for node in cluster.nodes:
            path = tmp_path / f"{node.id}.snap"
            out = _cli(
                "snapshot",
                "save",
                str(path),
                "--from-data-dir",
                str(cluster.node_dir(node.id)),
                "--json",
            )
            assert out.returncode == 0, out.stderr
            header = headers[node.id] = json.loads(out.stdout)["header"]
            assert header["dump_index"] > 0, "rebuilt from a dump PySyncObj wrote"
            _, body = read_snapshot(path)
            rows = msgpack.unpackb(body, raw=False, strict_map_key=False)["leases"]
            assert sorted((r[0], r[2], r[3]) for r in rows) == expected, node.id
        # --committed-only stops at the commit index the node saved (a prefix).
        out = _cli(
            "snapshot",
            "save",
            str(tmp_path / "committed.snap"),
            "--from-data-dir",
            str(cluster.node_dir("n1")),
            "--committed-only",
            "--json",
        )
        assert out.returncode == 0, out.stderr
        committed = json.loads(out.stdout)["header"]
        assert committed["index"] <= committed["known_committed"]
        # Every entry after the commit index is left out, none before it.
        assert committed["index"] + committed["left_out_entries"] == headers["n1"]["index"]
    finally:
        cluster.close()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_snapshot_operation_refuses_bad_requests(tmp_path: Path) -> None:
    cluster = LocalCluster(3, data_dir=tmp_path / "c", settings=dict(TEST_SETTINGS))
    try:
        cluster.start()
        leader = cluster.wait_for_leader()["client"]
        follower = next(n.client for n in cluster.nodes if n.client != leader)
        answer = raw_request(follower, {"id": 1, "op": "snapshot"})
        assert answer["code"] == "NOT_LEADER" and answer["detail"]["leader"] == leader
        for bad, code in (
            ({"snapshot": "nope", "offset": 0}, "INVALID_ARGUMENT"),
            ({"snapshot": "nope"}, "BAD_REQUEST"),
            ({"snapshot": "nope", "offset": "0"}, "BAD_REQUEST"),
            ({"snapshot": "nope", "offset": -1}, "INVALID_ARGUMENT"),
            ({"snapshot": 7, "offset": 0}, "BAD_REQUEST"),
            ({"snapshot": "", "offset": 0}, "INVALID_ARGUMENT"),
        ):
            answer = raw_request(leader, {"id": 2, "op": "snapshot", **bad})
            assert answer["ok"] is False and answer["code"] == code, (bad, answer)
            assert answer["definite"] is True
        # A real one: chunks below the frame limit, offsets checked, gone once read.
        with cluster.client() as c:
            for i in range(300):
                c.acquire(f"big/{i:04}/" + "x" * 400, owner="o" * 200, ttl=60.0)
            meta = c.call("snapshot", {}, mutating=False)
            target = c.aio.transport.target
        assert meta["size"] > CHUNK_BYTES, "the body spans several chunks"
        busy = raw_request(target, {"id": 3, "op": "snapshot"})
        assert busy["code"] == "UNAVAILABLE", "one export at a time"
        beyond = raw_request(
            target,
            {"id": 4, "op": "snapshot", "snapshot": meta["snapshot"], "offset": meta["size"] + 1},
        )
        assert beyond["code"] == "INVALID_ARGUMENT"
        body, offset = b"", 0
        while True:
            chunk = raw_request(
                target, {"id": 5, "op": "snapshot", "snapshot": meta["snapshot"], "offset": offset}
            )["result"]
            assert len(chunk["data"]) <= CHUNK_BYTES
            body += chunk["data"]
            offset += len(chunk["data"])
            if chunk["done"]:
                break
        header = make_header(body, meta["index"], meta["term"], source="leader", node="n")
        assert header["body_sha256"] == meta["sha256"] and header["leases"] == 300
        gone = raw_request(
            target, {"id": 6, "op": "snapshot", "snapshot": meta["snapshot"], "offset": 0}
        )
        assert gone["code"] == "INVALID_ARGUMENT"
        node_dir = cluster.node_dir(meta["node"])
        assert not list(node_dir.glob("snapshot-export-*")), "the export file is removed"
    finally:
        cluster.close()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_snapshot_save_needs_the_admin_permission(tmp_path: Path) -> None:
    bundle = secure_bundle(tmp_path / "tls")
    reader = "reader-token-0123456789abcdef"
    bundle.auth_file.write_text(
        bundle.auth_file.read_text()
        + textwrap.dedent(
            f"""
            [roles.everything]
            permissions = [{{ prefix = "", actions = ["read", "write"] }}]

            [[principals]]
            name = "worker"
            token_sha256 = "{token_digest(reader)}"
            roles = ["everything"]
            """
        )
    )
    cluster = LocalCluster(
        3, data_dir=tmp_path / "c", settings={**TEST_SETTINGS, **bundle.node_settings()}
    )
    try:
        cluster.start()
        ca = str(bundle.ca_file)
        with Client(cluster.endpoints, tls=ca) as anonymous, pytest.raises(UnauthenticatedError):
            anonymous.call("snapshot", {}, mutating=False, timeout=5)
        with (
            Client(cluster.endpoints, tls=ca, token=reader) as worker,
            pytest.raises(PermissionDeniedError, match="admin only"),
        ):
            worker.call("snapshot", {}, mutating=False, timeout=5)
        env = {
            **os.environ,
            "RAFTLEASE_TOKEN": bundle.admin_token,
            "RAFTLEASE_CA_FILE": ca,
        }
        with Client(cluster.endpoints, tls=ca, token=bundle.admin_token) as admin:
            admin.acquire("sec/a", owner="a", ttl=30.0)
        snap = tmp_path / "s.snap"
        out = _cli(
            "snapshot", "save", str(snap), "--endpoints", ",".join(cluster.endpoints), env=env
        )
        assert out.returncode == 0, out.stderr
        header, _ = read_snapshot(snap)
        assert header["leases"] == 1
        denied = _cli(
            "snapshot",
            "save",
            str(tmp_path / "d.snap"),
            "--endpoints",
            ",".join(cluster.endpoints),
            env={**env, "RAFTLEASE_TOKEN": reader},
        )
        assert denied.returncode == 1 and "admin only" in denied.stderr
        assert not (tmp_path / "d.snap").exists()
    finally:
        cluster.close()


@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.skipif(
    not os.environ.get("RAFTLEASE_BENCH_SNAPSHOT"),
    reason="measurement: RAFTLEASE_BENCH_SNAPSHOT=100000 (leases) to run it",
)
def test_measure_a_big_snapshot(tmp_path: Path) -> None:
    """The figures in docs/disaster-recovery.md: fill N leases, save while a thread
    reads through the log, report the save time, the body size, the reads' latency
    and the leader's memory; no election may happen."""
    import asyncio
    import threading

    from raftlease import AsyncClient

    count = int(os.environ["RAFTLEASE_BENCH_SNAPSHOT"])
    cluster = LocalCluster(
        3, data_dir=tmp_path / "c", settings={**TEST_SETTINGS, "request_timeout": 10.0}
    )
    try:
        cluster.start()

        async def fill() -> None:
            async with AsyncClient(cluster.endpoints, deadline=60) as ac:
                slots = asyncio.Semaphore(400)

                async def one(i: int) -> None:
                    async with slots:
                        await ac.acquire(f"bench/{i:06}", owner=f"agent-{i % 1000}", ttl=3600)

                await asyncio.gather(*(one(i) for i in range(count)))

        asyncio.run(fill())
        leader = cluster.leader_id()
        term = cluster.leader()["term"]  # type: ignore[index]

        def rss_mib() -> int:
            status = Path(f"/proc/{cluster.pid(leader)}/status").read_text()
            line = next(x for x in status.splitlines() if x.startswith("VmRSS"))
            return int(line.split()[1]) // 1024

        before_rss = rss_mib()
        latencies: list[float] = []
        stop = threading.Event()

        def probe() -> None:
            with cluster.client() as c:
                while not stop.is_set():
                    started = time.monotonic()
                    c.read("bench/000001", consistency="log")
                    latencies.append(time.monotonic() - started)

        reader = threading.Thread(target=probe)
        reader.start()
        wait_for(lambda: len(latencies) > 50, 30, "reads before the save")
        baseline = len(latencies)
        started = time.monotonic()
        out = _cli(
            "snapshot",
            "save",
            str(tmp_path / "big.snap"),
            "--endpoints",
            ",".join(cluster.endpoints),
            "--json",
        )
        took = time.monotonic() - started
        stop.set()
        reader.join()
        assert out.returncode == 0, out.stderr
        header = json.loads(out.stdout)["header"]
        during = sorted(latencies[baseline:])
        print(
            f"\n{count} leases: save {took:.2f} s, body {header['body_bytes'] / 2**20:.1f} MiB; "
            f"log reads during: p50 {during[len(during) // 2] * 1000:.1f} ms, "
            f"p99 {during[int(len(during) * 0.99)] * 1000:.1f} ms, max {during[-1] * 1000:.1f} ms; "
            f"leader RSS {before_rss} -> {rss_mib()} MiB"
        )
        assert header["leases"] == count
        assert cluster.leader()["term"] == term, "an election during the save"  # type: ignore[index]
    finally:
        cluster.close()
