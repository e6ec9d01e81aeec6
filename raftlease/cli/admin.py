"""Operators' commands: ``raftlease watch PREFIX``, ``raftlease sessions``,
``raftlease waiters KEY``, ``raftlease revoke KEY`` and ``raftlease reload [--all]``
(a node reads its auth and TLS files again; needs ``admin`` with auth).

Human lines by default, JSON with ``-o json`` or ``--json`` (``watch`` prints one JSON
object per line; it stops on SIGINT, SIGTERM or SIGHUP: common.SignalBox). What they
show is what every reader may see: owners, tokens, units, times; never a lease id or
a lease session id, which are capabilities (docs/security.md).
Exit codes as for the other client commands (0, 1 definite failure, 3 unknown
outcome, 2 usage). With auth on: ``watch`` and ``waiters`` need ``read`` on the
prefix or key, ``sessions`` needs ``read`` on every key, ``revoke`` needs ``admin`` on
the key (else ``PERMISSION_DENIED``, exit 1, nothing changed).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any

import click

from ..errors import RaftLeaseError
from ..models import WatchEvent
from .common import (
    DURATION,
    STOP_AND_HANGUP,
    SignalBox,
    client_options,
    connect,
    consistency_option,
    endpoints_option,
    exit_error,
    output_options,
    run_until_signal,
    safe,
)


def _event_dict(event: WatchEvent) -> dict[str, Any]:
    return {
        "type": event.type,
        "key": event.key,
        "owner": event.owner,
        "token": event.token,
        "revision": event.revision,
        "value": event.value,
        "units": event.units,
    }


def _event_line(event: WatchEvent) -> str:
    line = (
        f"{event.revision:>10} {event.type:9} {safe(event.key)}  owner {safe(event.owner)}"
        f"  token {event.token}"
    )
    if event.units != 1:
        line += f"  units {event.units}"
    if event.value:
        line += f"  value {safe(event.value)}"
    return line


@click.command()
@click.argument("prefix", default="")
@click.option("--from-revision", type=int, default=0, help="Start at this revision (0: now).")
@click.option("--count", type=int, default=0, help="Stop after this many events (0: never).")
@click.option(
    "--for",
    "duration",
    type=DURATION,
    default=None,
    help="Stop after this long (e.g. 30s); default: until Ctrl-C or --count.",
)
@output_options
@endpoints_option
def watch(
    prefix: str,
    from_revision: int,
    count: int,
    duration: float | None,
    as_json: bool,
    endpoints: str,
) -> None:
    """Stream changes to keys under PREFIX (every key by default), in revision order:
    grant, renew, release, expire, transfer, proclaim, revoke. Runs until Ctrl-C,
    --count events or --for; reconnects to another node on failure without missing
    or repeating an event."""
    if count < 0:
        raise click.UsageError("--count must be 0 or more")
    printed = 0

    async def stream(c: Any) -> None:
        nonlocal printed
        events = c.aio.watch(prefix, from_revision=from_revision)
        loop = asyncio.get_running_loop()
        deadline = None if duration is None else loop.time() + duration
        try:
            while not count or printed < count:
                left = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    event = await asyncio.wait_for(events.__anext__(), left)
                except TimeoutError:
                    return
                click.echo(json.dumps(_event_dict(event)) if as_json else _event_line(event))
                printed += 1
        finally:
            await events.aclose()

    with SignalBox(STOP_AND_HANGUP).installed() as box, connect(endpoints) as c:
        try:
            run_until_signal(c, stream(c), box)
        except RaftLeaseError as exc:
            exit_error(exc, as_json)
    if box.take() not in (None, signal.SIGINT, signal.SIGTERM):
        sys.exit(1)


@click.command()
@click.option("--limit", default=1000, show_default=True)
@consistency_option
@client_options
def sessions(limit: int, consistency: str, endpoints: str, as_json: bool, timeout: float) -> None:
    """List live lease sessions: owner, TTL, time left, attached leases and queued
    acquires. Session ids are not shown (they are capabilities)."""
    try:
        with connect(endpoints) as c:
            items = c.sessions(limit=limit, consistency=consistency, timeout=timeout)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    if as_json:
        rows = [
            {
                "owner": s.owner,
                "ttl": s.ttl,
                "remaining": round(s.remaining, 3),
                "leases": s.leases,
                "waiters": s.waiters,
            }
            for s in items
        ]
        click.echo(json.dumps({"ok": True, "sessions": rows}))
        return
    if not items:
        click.echo("no lease sessions")
    for s in items:
        click.echo(
            f"{safe(s.owner):30} ttl {s.ttl:g} s  {s.remaining:8.2f} s left  "
            f"{s.leases} lease(s)  {s.waiters} queued"
        )


@click.command()
@click.argument("key")
@click.option("--limit", default=1000, show_default=True)
@consistency_option
@client_options
def waiters(
    key: str, limit: int, consistency: str, endpoints: str, as_json: bool, timeout: float
) -> None:
    """Show the queue of KEY in grant order (position 1 is granted next): owner,
    units, priority and how long each will still wait."""
    try:
        with connect(endpoints) as c:
            items = c.waiters(key, limit=limit, consistency=consistency, timeout=timeout)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    if as_json:
        rows = [
            {
                "position": w.position,
                "owner": w.owner,
                "units": w.units,
                "priority": w.priority,
                "wait_left": round(w.wait_left, 3),
                "in_session": w.in_session,
            }
            for w in items
        ]
        click.echo(json.dumps({"ok": True, "key": key, "waiters": rows}))
        return
    if not items:
        click.echo(f"{safe(key)}: nobody waits")
    for w in items:
        extra = "  (in a lease session)" if w.in_session else ""
        click.echo(
            f"{w.position:>4}. {safe(w.owner):30} units {w.units}  priority {w.priority}  "
            f"waits {w.wait_left:.2f} s more{extra}"
        )


@click.command()
@click.argument("key")
@click.option("--lease-id", default=None, help="Only this lease (default: every lease).")
@click.option("--token", type=int, default=None, help="Only the lease with this fencing token.")
@client_options
def revoke(
    key: str,
    lease_id: str | None,
    token: int | None,
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """Admin: end every lease on KEY (or the one given by --lease-id or --token) and
    grant the key to the next waiter. The holder's next renewal fails and its
    ``raftlease lock`` stops its command. Needs the admin permission on KEY with auth."""
    if lease_id is not None and token is not None:
        raise click.UsageError("give --lease-id or --token, not both")
    try:
        with connect(endpoints) as c:
            tokens = c.revoke(key, lease_id=lease_id, token=token, timeout=timeout)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    if as_json:
        click.echo(json.dumps({"ok": True, "key": key, "revoked": len(tokens), "tokens": tokens}))
    else:
        listed = ", ".join(str(t) for t in tokens)
        click.echo(f"revoked {len(tokens)} lease(s) on {safe(key)} (token {listed})")


@click.command()
@click.option(
    "--all",
    "every",
    is_flag=True,
    help="Ask every node in --endpoints (default: only the first).",
)
@client_options
def reload(every: bool, endpoints: str, as_json: bool, timeout: float) -> None:
    """Admin: make a node read its auth file and client-port TLS files again, as
    SIGHUP does (tokens, roles, pinned shapes, certificates, client CAs). Each node
    reads its own files: with --all every node listed is asked, one by one. Exit 0
    when every node asked took its new files; 1 when one refused a file (its previous
    file stays in force; the reason is printed) or could not be asked."""
    targets = [e.strip() for e in endpoints.split(",") if e.strip()]
    if not targets:
        raise click.UsageError("--endpoints names no node")
    if not every:
        targets = targets[:1]
    rows: list[dict[str, Any]] = []
    with connect(targets) as c:
        for endpoint in targets:
            try:
                answer = c.reload(endpoint, timeout=timeout)
            except RaftLeaseError as exc:
                rows.append(
                    {
                        "endpoint": endpoint,
                        "reloaded": False,
                        "code": exc.code,
                        "error": exc.message,
                    }
                )
            else:
                rows.append({"endpoint": endpoint, **answer})
    everything = all(row.get("reloaded") for row in rows)
    if as_json:
        click.echo(json.dumps({"ok": everything, "nodes": rows}))
    else:
        for row in rows:
            where = f"{safe(row.get('node', '?'))} ({safe(row['endpoint'])})"
            if row.get("reloaded"):
                click.echo(f"{where}: reloaded")
            elif "code" in row:
                click.echo(f"{where}: not asked: {row['code']} {safe(row['error'])}")
            else:
                for why in row.get("errors") or ["refused"]:
                    click.echo(f"{where}: refused: {safe(why)}")
    if not everything:
        sys.exit(1)
