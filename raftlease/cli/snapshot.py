"""``raftlease snapshot save | inspect | restore``: backups and disaster recovery
(docs/disaster-recovery.md).

``save`` takes a consistent snapshot from the leader over the client port (or, with
``--from-data-dir``, rebuilds it offline from a stopped node's files); ``inspect``
verifies a file's checksum and prints its header; ``restore`` seeds the data directory
of one node of a NEW cluster with it. Exit codes as the other commands: 0 done, 1
refused or failed (the message says why), 3 unknown outcome (timeout), 2 usage.

The client and the server's backup code are imported only inside the commands: every
``raftlease`` command loads this module (cli/root.py registers it), and ``raftlease
node`` must not load the client stack nor a client command the server's.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from ..config import NodeConfig, load_toml
from ..errors import ConfigError, RaftLeaseError
from ..limits import TOKEN_RESERVE_STEP
from .common import (
    connect,
    endpoints_option,
    exit_error,
    output_options,
    parse_member,
    parse_setting,
    safe,
    timeout_option,
)

if TYPE_CHECKING:
    from ..client import Client as BlockingClient

#: server.backup.DEFAULT_TOKEN_JUMP (that module is imported only when a command runs:
#: every other command of the CLI must not load the server stack).
DEFAULT_TOKEN_JUMP = 256 * TOKEN_RESERVE_STEP


@click.group()
def snapshot() -> None:
    """Save, inspect and restore snapshots of the whole lease state."""


def _refuse(message: str, as_json: bool) -> NoReturn:
    if as_json:
        click.echo(json.dumps({"ok": False, "message": message}))
    else:
        click.echo(f"error: {safe(message)}", err=True)
    sys.exit(1)


def _show_header(header: dict[str, Any]) -> None:
    names = (
        "format",
        "layout",
        "cluster_id",
        "source",
        "node",
        "index",
        "term",
        "revision",
        "ceiling",
        "token_headroom",
        "log_time_ms",
        "leases",
        "lease_sessions",
        "waiters",
        "created_utc",
        "raftlease_version",
        "body_bytes",
        "body_sha256",
        "dump_index",
        "known_committed",
    )
    for name in names:
        if name in header:
            click.echo(f"  {name:18} {safe(header[name])}")


@snapshot.command()
@click.argument("file", type=click.Path(dir_okay=False))
@endpoints_option
@timeout_option(
    300.0,
    help="For the whole save (5m, 600s); also how long one answer may take (taking a "
    "snapshot of a big state takes seconds).",
)
@click.option(
    "--from-data-dir",
    "data_dir",
    type=click.Path(file_okay=False, exists=True),
    help="Rebuild the state offline from a STOPPED node's data directory instead.",
)
@click.option(
    "--committed-only",
    is_flag=True,
    help="With --from-data-dir: stop at the commit index the node saved (default: "
    "every entry in its journal).",
)
@click.option(
    "--crashed",
    is_flag=True,
    help="With --from-data-dir: the node died without a clean stop (its 'running' "
    "marker is there) and its process is gone.",
)
@output_options
def save(
    file: str,
    endpoints: str,
    timeout: float,
    data_dir: str | None,
    committed_only: bool,
    crashed: bool,
    as_json: bool,
) -> None:
    """Write a snapshot of the whole state to FILE (atomically: temporary file, fsync,
    rename). From the leader it holds every write acknowledged before the command
    started; with auth on it needs the admin permission (RAFTLEASE_TOKEN)."""
    from ..server.backup import SnapshotError, save_from_data_dir

    out = Path(file)
    if data_dir is not None:
        try:
            header = save_from_data_dir(
                Path(data_dir),
                out,
                committed_only=committed_only,
                node=Path(data_dir).name,
                crashed=crashed,
            )
        except (SnapshotError, OSError) as exc:
            _refuse(f"cannot save from {data_dir}: {exc}", as_json)
    else:
        header = _save_from_leader(out, endpoints, timeout, as_json)
    if as_json:
        click.echo(json.dumps({"ok": True, "file": str(out), "header": header}))
        return
    click.echo(f"saved {out}: log index {header['index']}, {header['leases']} leases")
    _show_header(header)


def _save_client(endpoints: Sequence[str] | str, timeout: float) -> BlockingClient:
    """The CLI's client (credentials from the environment) whose single attempt may
    take the whole ``timeout``: the leader answers the first request only once the
    state is written, and a retry of it would find that export busy."""
    return connect(endpoints, deadline=timeout, attempt_timeout=timeout)


def _save_from_leader(out: Path, endpoints: str, timeout: float, as_json: bool) -> dict[str, Any]:
    """Take the snapshot on the leader, fetch its body in chunks from that node, check
    its length and SHA-256 against what the node wrote, write the file."""
    from ..server.backup import make_header, write_snapshot

    deadline = time.monotonic() + timeout
    progress = not as_json
    parts: list[bytes] = []
    try:
        if progress:
            click.echo("taking a snapshot on the leader...", err=True)
        with _save_client(endpoints, timeout) as c:
            started = time.monotonic()
            meta = c.call("snapshot", {}, mutating=False, timeout=timeout)
            # The export lives on the node that answered: read every chunk from it.
            source = c.aio.transport.target
        size, sid = int(meta["size"]), str(meta["snapshot"])
        if progress:
            click.echo(
                f"snapshot taken on {safe(meta['node'])} ({source}) at log index "
                f"{meta['index']} in {time.monotonic() - started:.2f} s; fetching {size} bytes",
                err=True,
            )
        received, shown = 0, 0.0
        with _save_client([source], timeout) as single:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    _refuse("the snapshot was not fetched before --timeout", as_json)
                args = {"snapshot": sid, "offset": received}
                chunk = single.call("snapshot", args, mutating=False, timeout=left)
                data = bytes(chunk["data"])
                parts.append(data)
                received += len(data)
                done = bool(chunk["done"]) or not data
                if progress and size and (received / size - shown >= 0.1 or done):
                    shown = received / size
                    click.echo(f"  fetched {received} of {size} bytes ({shown:.0%})", err=True)
                if done:
                    break
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    body = b"".join(parts)
    if len(body) != size:
        _refuse(f"fetched {len(body)} of {size} bytes; nothing was written", as_json)
    header = make_header(
        body, int(meta["index"]), int(meta["term"]), source="leader", node=str(meta["node"])
    )
    if header["body_sha256"] != meta["sha256"]:
        _refuse(
            "the fetched snapshot's checksum differs from the node's; nothing was written", as_json
        )
    try:
        write_snapshot(out, header, body)
    except OSError as exc:
        _refuse(f"cannot write {out}: {exc}", as_json)
    return header


@snapshot.command()
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@output_options
def inspect(file: str, as_json: bool) -> None:
    """Verify FILE's checksum and print its header."""
    from ..server.backup import SnapshotError, read_snapshot

    try:
        header, _ = read_snapshot(Path(file))
    except (SnapshotError, OSError) as exc:
        _refuse(str(exc), as_json)
    if as_json:
        click.echo(json.dumps({"ok": True, "checksum": "ok", "header": header}))
        return
    click.echo(f"{file}: checksum OK")
    _show_header(header)


@snapshot.command()
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.option(
    "--config", "config_file", type=click.Path(dir_okay=False), help="The node's TOML config."
)
@click.option("--id", "node_id", help="The node's id (one of the members).")
@click.option(
    "--member",
    "members",
    multiple=True,
    metavar="ID,RAFT,CLIENT",
    help="A member of the NEW cluster (repeat).",
)
@click.option("--data-dir", type=click.Path(file_okay=False), help="The node's data directory.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="Any config field.")
@click.option("--force", is_flag=True, help="Delete Raft state already in the data directory.")
@click.option(
    "--token-jump",
    default=DEFAULT_TOKEN_JUMP,
    show_default=True,
    help="New fencing tokens start this far above the saved ceiling.",
)
@output_options
def restore(
    file: str,
    config_file: str | None,
    node_id: str | None,
    members: tuple[str, ...],
    data_dir: str | None,
    settings: tuple[str, ...],
    force: bool,
    token_jump: int,
    as_json: bool,
) -> None:
    """Seed one node of a NEW cluster with FILE. Run it for every node of the new
    cluster (same file, each node's own --id and --data-dir, the same members), then
    start the nodes. Refuses a damaged file, a newer format, and a data directory
    that already holds Raft state (unless --force)."""
    from ..server.backup import SnapshotError, restore_data_dir

    overrides: dict[str, Any] = dict(parse_setting(s) for s in settings)
    if node_id:
        overrides["node_id"] = node_id
    if members:
        overrides["nodes"] = [parse_member(m) for m in members]
    if data_dir:
        overrides["data_dir"] = str(Path(data_dir).resolve())
    try:
        config = (
            load_toml(config_file, **overrides) if config_file else NodeConfig.create(**overrides)
        )
    except ConfigError as exc:
        raise click.UsageError(f"invalid configuration: {exc.message}") from None
    except TypeError as exc:
        raise click.UsageError(f"invalid configuration: {exc}") from None
    try:
        report = restore_data_dir(Path(file), config, force=force, token_jump=token_jump)
    except (SnapshotError, OSError) as exc:
        _refuse(f"not restored: {exc}", as_json)
    result = {
        "ok": True,
        "data_dir": str(report.data_dir),
        "node": config.node_id,
        "members": [m.id for m in config.nodes],
        "index": report.index,
        "leases": report.leases,
        "saved_revision": report.saved_revision,
        "saved_ceiling": report.saved_ceiling,
        "first_token_above": report.first_token_above,
        "removed": list(report.removed),
    }
    if as_json:
        click.echo(json.dumps(result))
        return
    if report.removed:
        click.echo(f"--force: removed {', '.join(report.removed)} from {report.data_dir}")
    click.echo(
        f"seeded {report.data_dir} for node {safe(config.node_id)} of a new cluster "
        f"({', '.join(safe(m.id) for m in config.nodes)}) with log index {report.index}, "
        f"{report.leases} leases"
    )
    click.echo(
        f"fencing tokens: the saved revision was {report.saved_revision} and the saved "
        f"ceiling {report.saved_ceiling}; new grants get tokens above "
        f"{report.first_token_above} (ceiling + {token_jump})"
    )
    click.echo(
        "leases keep their holders, lease ids and tokens, and expire one TTL after the "
        "new cluster's first entry unless renewed. Seed every node from this same file "
        "before starting any of them, and give the new cluster its own CA (raftlease "
        "certs init): an old node started by mistake must not be able to join it."
    )
