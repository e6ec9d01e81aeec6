"""``raftlease member list|add|remove|replace``: change the cluster's members while it
runs (docs/membership.md). Each change goes to the leader through the client port (the
client follows the leader's redirect); with an auth file it needs ``admin``.

Exit codes as for every client command: 0 done, 1 a definite failure (nothing
changed), 3 unknown outcome (run ``raftlease member list`` to see whether it
happened), 2 usage errors.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ..errors import RaftLeaseError
from .common import DURATION, client_options, connect, exit_error, safe


def _admin_client(endpoints: str, timeout: float) -> Any:
    """A client whose single attempt may last the whole deadline (an add waits for
    the new member to catch up before it answers). Token and TLS from the
    environment, as for every CLI command."""
    return connect(endpoints, attempt_timeout=max(3.0, timeout))


@click.group()
def member() -> None:
    """List, add, remove or replace cluster members (one change at a time)."""


@member.command("list")
@client_options
def member_list(endpoints: str, as_json: bool, timeout: float) -> None:
    """The members in the log of the node that answers (the first endpoint that does),
    the leader it knows, and the change in progress if it is the leader."""
    try:
        with _admin_client(endpoints, timeout) as c:
            result = c.call("member_list", {}, mutating=False, timeout=timeout)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    if as_json:
        click.echo(json.dumps({"ok": True, **result}))
        return
    for m in result["members"]:
        role = "leader" if m["leader"] else ""
        click.echo(
            f"{safe(m['id']):12} raft {safe(m['raft']):22} client {safe(m['client']):22} {role}"
        )
    if result.get("pending"):
        p = result["pending"]
        click.echo(f"change in progress: {p['kind']} {safe(p['member'])}")


def _change(
    op: str, args: dict[str, Any], endpoints: str, as_json: bool, timeout: float
) -> dict[str, Any]:
    try:
        with _admin_client(endpoints, timeout) as c:
            result: dict[str, Any] = c.call(op, args, mutating=False, timeout=timeout)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    return result


def _report(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"ok": True, **result}))
        return
    verb = "added" if result["kind"] == "add" else "removed"
    click.echo(f"{verb} {safe(result['member'])}; members now: {', '.join(result['members'])}")
    if result["kind"] == "add" and not result.get("caught_up"):
        click.echo(
            f"warning: {safe(result['member'])} has not caught up yet (replicated to index "
            f"{result.get('match_index')} of {result.get('target_index')}); wait for it "
            "before the next change",
            err=True,
        )
    if result["kind"] == "remove":
        click.echo(
            f"stop the process of {safe(result['member'])}: the cluster refuses it from now on",
            err=True,
        )


def _add_args(member_id: str, raft: str, client: str, catch_up: float) -> dict[str, Any]:
    """The ``member_add`` admin op's arguments (``add`` and ``replace``)."""
    return {"member_id": member_id, "raft": raft, "client": client, "timeout": catch_up}


@member.command("add")
@click.argument("member_id")
@click.option("--raft", "raft", required=True, help="The new member's Raft address host:port.")
@click.option("--client", "client", required=True, help="Its client address host:port.")
@click.option(
    "--catch-up",
    "catch_up",
    type=DURATION,
    default=30.0,
    show_default=True,
    help="How long the leader streams the log to the new node (a learner, counted for "
    "nothing) before it adds it; if it has not caught up by then, nothing changes.",
)
@client_options
def member_add(
    member_id: str,
    raft: str,
    client: str,
    catch_up: float,
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """Add MEMBER_ID. Start it first with a config listing the current members and
    itself, and a certificate of the cluster CA naming it (docs/membership.md); it is
    refused by the others until this commits."""
    args = _add_args(member_id, raft, client, catch_up)
    added = _change("member_add", args, endpoints, as_json, timeout + catch_up)
    if added.get("added") is False:
        # The learner stage ended at --catch-up: nothing changed (docs/membership.md).
        learner = added.get("learner") or {}
        if as_json:
            click.echo(json.dumps({"ok": False, **added}))
        else:
            click.echo(
                f"{safe(member_id)} did not catch up within {catch_up} s (at index "
                f"{learner.get('match_index')} of {learner.get('commit_index')}); not added",
                err=True,
            )
        sys.exit(1)
    _report(added, as_json)


@member.command("remove")
@click.argument("member_id")
@client_options
def member_remove(member_id: str, endpoints: str, as_json: bool, timeout: float) -> None:
    """Remove MEMBER_ID (its id or raft address). The leader cannot remove itself:
    stop it first so another node leads."""
    _report(
        _change("member_remove", {"member_id": member_id}, endpoints, as_json, timeout), as_json
    )


@member.command("replace")
@click.argument("old_id")
@click.argument("new_id")
@click.option("--raft", "raft", required=True, help="The new member's Raft address host:port.")
@click.option("--client", "client", required=True, help="Its client address host:port.")
@click.option("--catch-up", "catch_up", type=DURATION, default=30.0, show_default=True)
@client_options
def member_replace(
    old_id: str,
    new_id: str,
    raft: str,
    client: str,
    catch_up: float,
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """Replace OLD_ID by NEW_ID: add the new member, wait for it to catch up, then
    remove the old one (two changes; a failure in between leaves both members)."""
    args = _add_args(new_id, raft, client, catch_up)
    added = _change("member_add", args, endpoints, as_json, timeout + catch_up)
    if not added.get("caught_up"):
        if added.get("added") is False:
            click.echo(f"{safe(new_id)} did not catch up: not added", err=True)
        else:
            _report(added, as_json)
        click.echo(f"not removing {safe(old_id)} until {safe(new_id)} has caught up", err=True)
        sys.exit(1)
    removed = _change("member_remove", {"member_id": old_id}, endpoints, as_json, timeout)
    if as_json:
        click.echo(json.dumps({"ok": True, "added": added, "removed": removed}))
        return
    _report(added, False)
    _report(removed, False)
