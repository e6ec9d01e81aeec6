"""``raftlease status``: each node's role, term and indexes, as the nodes listed in
``--endpoints`` report them (one status request to each, at most 3 s)."""

from __future__ import annotations

import json
import sys

import click

from .common import client_options, connect


@click.command()
@client_options
def status(endpoints: str, as_json: bool, timeout: float) -> None:
    """Show each node in --endpoints: reachable, role, term, commit and applied index,
    leader. Only the nodes listed are asked: list every member's client address to
    see them all ("raftlease member list" shows the member set)."""
    with connect(endpoints) as c:
        statuses = c.cluster_status(timeout=min(timeout, 3.0))
    if as_json:
        click.echo(json.dumps({"ok": True, "nodes": statuses}))
    else:
        click.echo(
            f"{'node':6} {'address':22} {'role':10} {'term':>5} {'commit':>8} "
            f"{'applied':>8} {'leases':>7}  leader"
        )
        for s in statuses:
            if not s.get("reachable"):
                click.echo(f"{'?':6} {s['client']:22} unreachable: {s.get('error')}")
                continue
            # With an auth file, a node shows the rest only to an admin (security.md).
            term, commit, applied, leases = (
                s.get(k, "-") for k in ("term", "commit_index", "applied_index", "leases")
            )
            click.echo(
                f"{s['node']:6} {s['client']:22} {s['role']:10} {term:>5} "
                f"{commit:>8} {applied:>8} {leases:>7}  "
                f"{s['leader'] or '-'}"
            )
        if any(s.get("reachable") and "term" not in s for s in statuses):
            click.echo("(-: shown with an admin token only; set RAFTLEASE_TOKEN)")
    leaders = {s.get("leader") for s in statuses if s.get("reachable")}
    if not any(s.get("reachable") for s in statuses) or None in leaders:
        sys.exit(1)


@click.command("cert-keys")
@client_options
def cert_keys(endpoints: str, as_json: bool, timeout: float) -> None:
    """Print the cluster's lease certificate verification keys (docs/certificates.md):
    one ``<key id> <public key hex>`` line each, oldest first, as the leader (else the
    first node that answers) reports them; a resource gives them to
    ``raftlease.verify.Verifier`` (``load_keys`` reads this output). With an auth
    file only an admin sees them. Exit 1 when no node answers or no key exists yet
    (the first acquire with a holder key makes one)."""
    with connect(endpoints) as c:
        statuses = c.cluster_status(timeout=min(timeout, 3.0))
    answered = [s for s in statuses if s.get("reachable") and "cert_keys" in s]
    answered.sort(key=lambda s: s.get("role") != "leader")
    keys = [[int(kid), str(pub)] for kid, pub in answered[0]["cert_keys"]] if answered else []
    if as_json:
        click.echo(json.dumps({"ok": bool(keys), "keys": keys}))
    else:
        for kid, pub in keys:
            click.echo(f"{kid} {pub}")
    if not keys:
        click.echo("no lease certificate key yet (or no node answered)", err=True)
        sys.exit(1)
