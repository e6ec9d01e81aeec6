"""Backups and disaster recovery (issue 13, "Save and restore it";
docs/disaster-recovery.md).

The snapshot file (header, checksum, refusals) and the restore transform are tested
directly; the rest on real node processes: ``raftlease snapshot save`` from a leader,
every node killed, ``raftlease snapshot restore`` into a NEW cluster (other data
directories, other ports) that PySyncObj starts from the seeded full dump; and the
majority-lost procedure, saving offline from a survivor's data directory.

The unit half of these tests (no process); the integration half is
tests/integration/test_backup.py.
"""

from __future__ import annotations

import ast
import gzip
import json
import pickle
import socket
from pathlib import Path
from typing import Any

import msgpack
import pytest
from pysyncobj import pickle as pysyncobj_pickle

from raftlease.config import NodeAddress, NodeConfig
from raftlease.core import LeaseStore
from raftlease.core.snapshot import for_new_cluster
from raftlease.errors import BadRequestError, InvalidArgumentError
from raftlease.limits import TOKEN_RESERVE_STEP
from raftlease.protocol import Limits, parse_request
from raftlease.replication.backup import read_data_dir, write_seed_dump
from raftlease.replication.snapshot_rows import pack_snapshot
from raftlease.server.backup import (
    DEFAULT_TOKEN_JUMP,
    SnapshotError,
    make_header,
    read_snapshot,
    restore_data_dir,
    write_snapshot,
)
from raftlease.testing import free_port_block

LID = "a" * 32


def _entry(op: str, now: int, term: int = 1, seq: int = 1, **fields: Any) -> dict[str, Any]:
    return {"op": op, "now": now, "term": term, "cid": "c1", "seq": seq, "ack": seq, **fields}


def _store() -> LeaseStore:
    """A state with a plain lease, a lease session with an attached lease, and a
    queued acquire."""
    store = LeaseStore()
    assert store.apply(_entry("acquire", 1000, key="k/a", owner="alice", ttl=5000, lid=LID))["ok"]
    opened = store.apply(_entry("session_open", 1000, seq=2, owner="bob", ttl=3000, sid="s" * 32))
    assert opened["ok"]
    attached = store.apply(
        _entry("acquire", 1000, seq=3, key="k/b", owner="bob", session="s" * 32, lid="b" * 32)
    )
    assert attached["ok"]
    queued = store.apply(
        _entry("acquire", 1200, seq=4, key="k/a", owner="carol", ttl=5000, wait=9000, lid="c" * 32)
    )
    assert queued["ok"] and queued.get("queued"), queued
    return store


def _body(store: LeaseStore) -> bytes:
    body: bytes = msgpack.packb(store.to_plain(), use_bin_type=True)
    return body


def _config(data_dir: Path, node_id: str = "n1") -> NodeConfig:
    nodes = [
        {"id": f"n{i}", "raft": f"127.0.0.1:{21100 + i}", "client": f"127.0.0.1:{21000 + i}"}
        for i in (1, 2, 3)
    ]
    return NodeConfig.create(node_id=node_id, nodes=nodes, data_dir=data_dir)


# ------------------------------------------------------------- the file


@pytest.mark.timeout(30)
def test_snapshot_file_verifies_its_checksum_and_refuses_newer_formats(tmp_path: Path) -> None:
    store = _store()
    body = _body(store)
    header = make_header(body, 41, 3, source="leader", node="n1", created=0.0)
    assert (header["revision"], header["ceiling"], header["leases"], header["waiters"]) == (
        store.revision,
        store.ceiling,
        2,
        1,
    )
    assert header["token_headroom"] == store.token_headroom()
    path = tmp_path / "s.snap"
    write_snapshot(path, header, body)
    assert read_snapshot(path) == (header, body)
    assert not list(tmp_path.glob(".*tmp")), "the temporary file is renamed away"

    raw = path.read_bytes()
    flipped = tmp_path / "flipped.snap"
    flipped.write_bytes(raw[:-3] + bytes([raw[-3] ^ 1]) + raw[-2:])
    with pytest.raises(SnapshotError, match="checksum mismatch"):
        read_snapshot(flipped)
    cut = tmp_path / "cut.snap"
    cut.write_bytes(raw[:-10])
    with pytest.raises(SnapshotError, match="truncated"):
        read_snapshot(cut)
    newer = tmp_path / "newer.snap"
    write_snapshot(newer, {**header, "format": 2}, body)
    with pytest.raises(SnapshotError, match="snapshot format 2, newer"):
        read_snapshot(newer)
    layout = tmp_path / "layout.snap"
    write_snapshot(layout, {**header, "layout": 999}, body)
    with pytest.raises(SnapshotError, match="layout 999, newer"):
        read_snapshot(layout)
    other = tmp_path / "other.snap"
    other.write_bytes(b"PK\x03\x04 not a snapshot")
    with pytest.raises(SnapshotError, match="not a raftlease snapshot"):
        read_snapshot(other)
    bad_headers = ({**header, "index": -1}, {**header, "index": 2**64}, {**header, "term": None})
    for bad in (*bad_headers, {**header, "body_sha256": None}):
        odd = tmp_path / "odd.snap"
        write_snapshot(odd, bad, body)
        with pytest.raises(SnapshotError, match="header"):
            read_snapshot(odd)


@pytest.mark.timeout(30)
def test_restore_transform_continues_tokens_and_gives_leases_their_ttl_again() -> None:
    store = _store()
    plain = store.to_plain()
    before = json.dumps(plain, sort_keys=True)
    fresh = for_new_cluster(plain, DEFAULT_TOKEN_JUMP)
    assert json.dumps(plain, sort_keys=True) == before, "the input is not changed"
    assert fresh["term"] == 0
    assert fresh["ceiling"] == store.ceiling + DEFAULT_TOKEN_JUMP
    restored = LeaseStore.from_plain(fresh)
    # Holders, lease ids and tokens are kept.
    assert {(r.key, r.owner, r.token, r.lease_id) for r in restored.leases.values()} == {
        (r.key, r.owner, r.token, r.lease_id) for r in store.leases.values()
    }
    # Each lease lives a whole TTL from the saved log time (the new leader continues
    # log time from there); an attached lease follows its renewed session.
    now = store.now
    session = restored.lease_sessions["s" * 32]
    assert session.expires_at == now + 3000
    assert restored.leases[LID].expires_at == now + 5000
    assert restored.leases["b" * 32].expires_at == session.expires_at
    assert restored.waiting["c" * 32].deadline == store.waiting["c" * 32].deadline
    # The new cluster's first entry (term 1) jumps past the saved ceiling + the jump.
    granted = restored.apply(
        _entry("acquire", now + 10, seq=5, key="k/new", owner="dan", ttl=5000, lid="d" * 32)
    )
    assert granted["ok"] and granted["token"] > store.ceiling + DEFAULT_TOKEN_JUMP
    # The holder renews with the lease id it already has.
    renewed = restored.apply(_entry("renew", now + 20, seq=6, key="k/a", lid=LID))
    assert renewed["ok"] and renewed["token"] == store.leases[LID].token
    with pytest.raises(ValueError, match="below one step"):
        for_new_cluster(plain, TOKEN_RESERVE_STEP - 1)


@pytest.mark.timeout(30)
def test_restore_transform_gives_task_attempts_their_ttl_again() -> None:
    store = LeaseStore()
    task = {"queue": "q", "ttl": 4000, "cid": "t", "ack": 1}
    put = store.apply({"op": "task_put", "now": 100, "seq": 1, "tid": "T", "payload": "{}", **task})
    assert put["ok"], put
    got = store.apply({"op": "task_claim", "now": 200, "seq": 2, "aid": "A", "worker": "w", **task})
    assert got["ok"], got
    attempt = store.tasks.attempts["A"]
    # Later log time, as when the snapshot is taken well after the claim.
    assert store.apply({"op": "tick", "now": 3000})["ok"]
    restored = LeaseStore.from_plain(for_new_cluster(store.to_plain(), DEFAULT_TOKEN_JUMP))
    again = restored.tasks.attempts["A"]
    assert (again.worker, again.token) == (attempt.worker, attempt.token)
    assert again.expires_at == 3000 + attempt.ttl_ms > attempt.expires_at
    assert again.progress_at == 3000


@pytest.mark.timeout(30)
def test_restore_refuses_a_data_dir_with_raft_state_unless_forced(tmp_path: Path) -> None:
    body = _body(_store())
    snap = tmp_path / "s.snap"
    write_snapshot(snap, make_header(body, 10, 2, source="leader", node="n1"), body)
    data = tmp_path / "n1"
    data.mkdir()
    (data / "node.toml").write_text("# the config may live here\n")
    report = restore_data_dir(snap, _config(data))
    assert (data / "raft.dump").exists() and (data / "node.toml").exists()
    # The seed holds the state in pieces, as a node's own dumps (freed as it loads).
    with gzip.open(data / "raft.dump", "rb") as f:
        consumer = pysyncobj_pickle.load(f)[0][1]
    assert isinstance(consumer, list) and all(isinstance(piece, bytes) for piece in consumer)
    assert report.first_token_above == _store().ceiling + DEFAULT_TOKEN_JUMP
    assert oct(data.stat().st_mode & 0o777) == "0o700"
    assert oct((data / "raft.dump").stat().st_mode & 0o777) == "0o600"
    with pytest.raises(SnapshotError, match=r"already holds a node's Raft state \(raft.dump\)"):
        restore_data_dir(snap, _config(data))
    (data / "raft.journal").write_bytes(b"old")
    forced = restore_data_dir(snap, _config(data), force=True)
    assert forced.removed == ("raft.dump", "raft.journal")
    assert not (data / "raft.journal").exists()
    # A damaged file is refused before anything in the directory is touched.
    bad = tmp_path / "bad.snap"
    raw = snap.read_bytes()
    bad.write_bytes(raw[:-1] + bytes([raw[-1] ^ 0xFF]))
    with pytest.raises(SnapshotError, match="checksum mismatch"):
        restore_data_dir(bad, _config(tmp_path / "n2"))
    assert not (tmp_path / "n2").exists()
    # An old cluster's member list would override the new members at start, and a
    # member removed from the old cluster left its mark (it would refuse to start):
    # both are Raft state of the old cluster.
    for node, name in (("n2", "members.json"), ("n3", "removed")):
        (tmp_path / f"old-{node}").mkdir()
        (tmp_path / f"old-{node}" / name).write_text("{}")
        with pytest.raises(SnapshotError, match=rf"\({name}\)"):
            restore_data_dir(snap, _config(tmp_path / f"old-{node}", node))
        forced = restore_data_dir(snap, _config(tmp_path / f"old-{node}", node), force=True)
        assert forced.removed == (name,)
    # --force never deletes a running node's files (its marker, its client port open).
    base = free_port_block(1)
    live_config = NodeConfig.create(
        node_id="n1",
        nodes=[{"id": "n1", "raft": f"127.0.0.1:{base + 100}", "client": f"127.0.0.1:{base}"}],
        data_dir=data,
    )
    with socket.socket() as live:
        live.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        live.bind(("127.0.0.1", base))
        live.listen(1)
        (data / "running").write_text("boot\n")
        with pytest.raises(SnapshotError, match="running"):
            restore_data_dir(snap, live_config, force=True)
        assert (data / "running").exists() and (data / "raft.dump").exists()


@pytest.mark.timeout(30)
def test_the_offline_reader_reads_a_seeded_dump(tmp_path: Path) -> None:
    store = _store()
    members = [NodeAddress("n1", "127.0.0.1:21101", "127.0.0.1:21001")]
    write_seed_dump(tmp_path, _body(store), 77, members)
    state = read_data_dir(tmp_path)
    assert (state.index, state.dump_index, state.replayed) == (77, 77, 0)
    assert state.store.to_plain() == store.to_plain()
    # In pieces, as a restore writes it now (and a node its own dumps): the same state.
    write_seed_dump(tmp_path, pack_snapshot(store.to_plain()), 78, members)
    state = read_data_dir(tmp_path)
    assert (state.index, state.dump_index) == (78, 78)
    assert state.store.to_plain() == store.to_plain()


@pytest.mark.timeout(30)
def test_the_dump_counts_as_committed_when_the_saved_commit_index_lags(tmp_path: Path) -> None:
    """PySyncObj saves the commit index in raft.journal.meta about once a second, so a
    node stopped right after a compaction can hold a dump past it (CI saw dump 54,
    saved commit index 44). The dump holds only applied entries: it is committed, and
    ``committed_only`` must not report a commit index below what it rebuilt."""
    store = _store()
    members = [NodeAddress("n1", "127.0.0.1:21101", "127.0.0.1:21001")]
    write_seed_dump(tmp_path, _body(store), 54, members)
    (tmp_path / "raft.journal.meta").write_bytes(
        pickle.dumps({"raftCommitIndex": 44, "currentTerm": 1, "votedForNodeId": None})
    )
    state = read_data_dir(tmp_path, committed_only=True)
    assert (state.index, state.dump_index, state.known_committed) == (54, 54, 54)
    assert state.index <= state.known_committed


@pytest.mark.timeout(60)
def test_the_cli_loads_the_backup_code_only_when_a_snapshot_command_runs() -> None:
    from raftlease.cli import snapshot as cli_snapshot

    assert cli_snapshot.DEFAULT_TOKEN_JUMP == DEFAULT_TOKEN_JUMP
    # Every raftlease command imports cli/snapshot.py (through cli/root.py): no module-level import
    # of the server stack (or the client) there.
    tree = ast.parse(Path(cli_snapshot.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
    modules = {n.module for n in top}
    assert not {m for m in modules if m and m.split(".")[0] in ("server", "client")}, modules


@pytest.mark.timeout(60)
def test_cli_inspect_and_restore_from_a_config_file(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from raftlease.cli import main

    body = _body(_store())
    snap = tmp_path / "s.snap"
    write_snapshot(snap, make_header(body, 10, 2, source="leader", node="n1"), body)
    runner = CliRunner()
    shown = runner.invoke(main, ["snapshot", "inspect", str(snap), "--json"])
    assert shown.exit_code == 0 and json.loads(shown.output)["header"]["leases"] == 2
    raw = snap.read_bytes()
    damaged = tmp_path / "damaged.snap"
    damaged.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    refused = runner.invoke(main, ["snapshot", "inspect", str(damaged)])
    assert refused.exit_code == 1 and "checksum mismatch" in refused.output
    # The docker configs name every member; --data-dir overrides their volume path.
    config = Path(__file__).resolve().parents[2] / "cluster" / "docker" / "n2.toml"
    args = ["snapshot", "restore", str(snap), "--config", str(config), "--json"]
    done = runner.invoke(main, [*args, "--data-dir", str(tmp_path / "n2")])
    assert done.exit_code == 0, done.output
    result = json.loads(done.output)
    assert (result["node"], result["members"]) == ("n2", ["n1", "n2", "n3"])
    again = runner.invoke(main, [*args, "--data-dir", str(tmp_path / "n2")])
    assert again.exit_code == 1 and "already holds" in again.output
    refused = runner.invoke(main, [*args, "--data-dir", str(tmp_path / "x"), "--token-jump", "5"])
    assert refused.exit_code == 1 and "--token-jump must be at least" in refused.output


@pytest.mark.timeout(30)
def test_snapshot_requests_are_validated_before_anything_runs() -> None:
    limits = Limits()
    assert parse_request({"id": 1, "op": "snapshot"}, limits).args == {}
    args = parse_request({"id": 1, "op": "snapshot", "snapshot": "ab", "offset": 5}, limits).args
    assert args == {"snapshot": "ab", "offset": 5}
    for bad, error, text in (
        ({"snapshot": "ab"}, BadRequestError, "'offset'"),
        ({"snapshot": "ab", "offset": True}, BadRequestError, "'offset'"),
        ({"snapshot": "ab", "offset": 1.5}, BadRequestError, "'offset'"),
        ({"snapshot": "ab", "offset": -1}, InvalidArgumentError, "'offset'"),
        ({"snapshot": "ab", "offset": 2**63}, InvalidArgumentError, "'offset'"),
        ({"snapshot": ["ab"], "offset": 0}, BadRequestError, "'snapshot'"),
        ({"snapshot": "x" * 129, "offset": 0}, InvalidArgumentError, "'snapshot'"),
    ):
        with pytest.raises(error, match=text):
            parse_request({"id": 1, "op": "snapshot", **bad}, limits)
