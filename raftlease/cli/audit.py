"""``raftlease audit``: the replicated audit trail (docs/audit.md).

    raftlease audit show [KEY] [--principal P] [--since SEQ] [--limit N] [--refusals]
    raftlease audit export > trail.jsonl        # one node's whole trail, JSON lines
    raftlease audit verify [FILE]               # the hash chain of FILE, or of every node

Needs ``admin`` with auth. ``show`` and ``export`` ask the first node of
``--endpoints`` that answers; ``verify`` without FILE asks every node, checks each
one's chain and that nodes at the same applied index hold the same head. Exit 0 when
everything verifies, 1 when a chain breaks (a changed, missing or added record), a
file is malformed or the nodes at one applied index disagree, 3 when no node answers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import RaftLeaseError
from ..limits import MAX_AUDIT_RECORDS
from .common import client_options, connect, exit_error, safe

#: The first line of an export.
HEADER = "raftlease-audit"


def _endpoints(endpoints: str) -> list[str]:
    return [e.strip() for e in endpoints.split(",") if e.strip()]


def _first(endpoints: str, timeout: float, **args: Any) -> dict[str, Any]:
    """The answer of the first node that answers. Raises the last error."""
    last: RaftLeaseError | None = None
    with connect(endpoints) as c:
        for endpoint in _endpoints(endpoints):
            try:
                return c.audit(endpoint, timeout=timeout, **args)
            except RaftLeaseError as exc:
                last = exc
    assert last is not None
    raise last


@click.group()
def audit() -> None:
    """Who owned what: the audit trail every node holds (docs/audit.md)."""


@audit.command("show")
@click.argument("key", required=False)
@click.option("--principal", default=None, help="Only records this principal held or made.")
@click.option("--since", type=int, default=0, help="Only records from this sequence number.")
@click.option(
    "--refusals",
    is_flag=True,
    help="The refusal ring (NOT_OWNER, STALE_ATTEMPT, PERMISSION_DENIED) instead.",
)
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_AUDIT_RECORDS),
    default=1000,
    show_default=True,
    help="At most this many records.",
)
@client_options
def audit_show(
    key: str | None,
    principal: str | None,
    since: int,
    refusals: bool,
    limit: int,
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """The records of KEY (all keys without it), oldest first: sequence number, log
    time (ms), what happened, key, fencing token, owner, the holder's principal and
    the principal whose request did it ("-": the leader's own entry, e.g. expiry)."""
    try:
        answer = _first(
            endpoints,
            timeout,
            key=key,
            principal=principal,
            since=since,
            limit=limit,
            refusals=refusals,
        )
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    if as_json:
        click.echo(json.dumps({"ok": True, **answer}))
        return
    for seq, now, kind, rkey, token, owner, holder, by, _rev in answer["records"]:
        click.echo(
            f"{seq:>8} {now:>12} {kind:13} {safe(rkey)}  token {token}  owner {safe(owner)}"
            f"  principal {safe(holder) or '-'}  by {safe(by) or '-'}"
        )


@audit.command("export")
@client_options
def audit_export(endpoints: str, as_json: bool, timeout: float) -> None:
    """One node's whole trail as JSON lines: a header line (``base``, ``head``, the
    node and its applied index), then one record per line. ``audit verify FILE``
    checks it."""
    try:
        answer = _first(endpoints, timeout, limit=MAX_AUDIT_RECORDS)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    header = {k: answer[k] for k in ("base", "head", "node", "applied_index", "first")}
    click.echo(json.dumps({"format": HEADER, **header}))
    for record in answer["records"]:
        click.echo(json.dumps(record, ensure_ascii=False))


def _verify_file(path: Path) -> tuple[bool, str]:
    from ..server.audit import verify_chain  # pure (core/audit.py); no node needed

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        header = json.loads(lines[0])
        if not isinstance(header, dict) or header.get("format") != HEADER:
            return False, "not an audit export (no header line)"
        records = [json.loads(line) for line in lines[1:] if line.strip()]
        ok_shape = all(
            isinstance(r, list) and len(r) == 9 and isinstance(r[0], int) for r in records
        )
        if not ok_shape:
            return False, "a record line is not a 9-field record"
        broken = verify_chain(str(header["base"]), records, str(header["head"]))
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        return False, f"unreadable: {exc}"
    if broken is not None:
        return False, f"the hash chain breaks at record line {broken + 2}"
    return True, f"{len(records)} records verify from base to head {header['head']}"


@audit.command("verify")
@click.argument("file", required=False, type=click.Path(path_type=Path))
@client_options
def audit_verify(file: Path | None, endpoints: str, as_json: bool, timeout: float) -> None:
    """Check the hash chain of an export FILE, or of every node in --endpoints (and
    that nodes at the same applied index hold the same head). Exit 1 on any break."""
    if file is not None:
        ok, message = _verify_file(file)
        click.echo(json.dumps({"ok": ok, "message": message}) if as_json else message)
        sys.exit(0 if ok else 1)
    from ..server.audit import verify_chain

    results: list[dict[str, Any]] = []
    with connect(endpoints) as c:
        for endpoint in _endpoints(endpoints):
            try:
                answer = c.audit(endpoint, limit=MAX_AUDIT_RECORDS, timeout=timeout)
            except RaftLeaseError as exc:
                results.append({"endpoint": endpoint, "reachable": False, "error": str(exc)})
                continue
            broken = verify_chain(answer["base"], answer["records"], answer["head"])
            results.append(
                {
                    "endpoint": endpoint,
                    "reachable": True,
                    "node": answer["node"],
                    "applied_index": answer["applied_index"],
                    "records": len(answer["records"]),
                    "head": answer["head"],
                    "verified": broken is None,
                }
            )
    answered = [r for r in results if r["reachable"]]
    heads: dict[int, set[str]] = {}
    for r in answered:
        heads.setdefault(r["applied_index"], set()).add(r["head"])
    agree = all(len(h) == 1 for h in heads.values())
    ok = bool(answered) and agree and all(r["verified"] for r in answered)
    if as_json:
        click.echo(json.dumps({"ok": ok, "agree": agree, "nodes": results}))
    else:
        for r in results:
            if not r["reachable"]:
                click.echo(f"{r['endpoint']:22} unreachable: {r['error']}")
                continue
            state = "verifies" if r["verified"] else "BROKEN"
            click.echo(
                f"{r['node']:6} {r['endpoint']:22} applied {r['applied_index']:>8} "
                f"records {r['records']:>6} head {r['head'][:16]} {state}"
            )
        if not agree:
            click.echo("nodes at the same applied index hold different heads")
    sys.exit(0 if ok else (3 if not answered else 1))
