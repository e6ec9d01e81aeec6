"""The root of the ``raftlease`` command: the click group, its global options, and the
registration of every command (etcdctl's root command does the same). Each command
module defines its commands and knows nothing of this one.

Exit codes, client options before or after the subcommand, ``-o json`` and the
``RAFTLEASE_*`` variables: cli/common.py and docs/cli.md.
"""

from __future__ import annotations

import click

from .._version import __version__
from . import (
    admin,
    audit,
    budget,
    certs,
    lease,
    lock,
    mcp,
    member,
    node,
    queue,
    snapshot,
    status,
    top,
    up,
)
from .common import DEFAULT_ENDPOINTS, DURATION, OUTPUTS


@click.group()
@click.version_option(__version__, prog_name="raftlease")
# The client options, accepted here too (`raftlease --endpoints X status`). Only a
# value given here on the command line is passed on: a subcommand's own argument wins
# over it, and the environment and each command's own default come after it
# (common.inherited), so these carry no envvar and no default of their own.
@click.option(
    "--endpoints",
    default=None,
    help=f"Comma-separated client addresses, for every subcommand that takes them "
    f"(env RAFTLEASE_ENDPOINTS; default {DEFAULT_ENDPOINTS}).",
)
@click.option(
    "--timeout",
    type=DURATION,
    default=None,
    help="Deadline of the subcommand's request (30s, 5m), retries included (env "
    "RAFTLEASE_TIMEOUT; default: the subcommand's).",
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(OUTPUTS),
    default=None,
    help="text or json, for every subcommand that prints results (env RAFTLEASE_OUTPUT).",
)
@click.option("--json", "as_json", is_flag=True, help="The same as -o json.")
def main(endpoints: str | None, timeout: float | None, output: str | None, as_json: bool) -> None:
    """raftlease: Raft-replicated leases with fencing tokens.

    Client options (--endpoints, --timeout, -o/--output, --json) may come before the
    subcommand or after it; after it wins."""


for command in (
    node.node,
    up.up,
    lease.acquire,
    lease.acquire_many,
    lease.release_many,
    lease.renew,
    lease.release,
    lease.holder,
    lease.leases,
    status.status,
    status.cert_keys,
    admin.watch,
    admin.sessions,
    admin.waiters,
    admin.revoke,
    admin.reload,
    lock.lock,
    lock.elect,
    member.member,
    queue.queue,
    budget.budget,
    snapshot.snapshot,
    certs.certs,
    audit.audit,
    top.top,
    mcp.mcp,
):
    main.add_command(command)


__all__ = ["main"]
