"""``raftlease mcp``: serve the lease tools to an MCP host over stdio (mcp_server.py).

The server talks MCP on stdout, so nothing else may be printed there: its logs go to
stderr. SIGINT and SIGTERM end the session (its claims released) through the MCP
server's own signal receiver (mcp_server.run_stdio), installed whatever this process
inherited, as common.SignalBox does for the other long-running commands. The ``mcp``
SDK is imported only when the command runs (``raftlease node`` never loads it);
without it installed the command says how to get it (exit 2).
"""

from __future__ import annotations

import logging
import sys

import click

from .common import DURATION, credentials, endpoints_option, owner_option, timeout_option


@click.command()
@owner_option
@endpoints_option
@click.option(
    "--session-ttl",
    type=DURATION,
    default=15.0,
    show_default=True,
    help="How long claims outlive this server if it dies or hangs (30s, 1m).",
)
@timeout_option(15.0, help="Deadline of each cluster request, retries included.")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
    help="Logs on stderr (stdout carries the protocol).",
)
def mcp(owner: str, endpoints: str, session_ttl: float, timeout: float, log_level: str) -> None:
    """Speak the Model Context Protocol on stdin/stdout: tools claim, renew, release,
    release_all, who_holds, list_claims, check_token, take_task, heartbeat,
    complete_task, fail_task. Claims and taken tasks live as long as the MCP session
    (released when stdin closes or on SIGTERM; after --session-ttl if this process
    dies).
    Credentials as for the other commands: RAFTLEASE_AUTH_TOKEN or RAFTLEASE_TOKEN,
    RAFTLEASE_CA_FILE or RAFTLEASE_TLS=1. See docs/mcp.md."""
    if session_ttl <= 0:
        raise click.BadParameter("must be positive", param_hint="--session-ttl")
    try:
        import anyio

        from ..mcp_server import McpOptions, run_stdio
    except ImportError as exc:  # the optional extra is missing
        click.echo(
            f"error: raftlease mcp needs the MCP SDK ({exc}): pip install 'raftlease[mcp]'",
            err=True,
        )
        sys.exit(2)
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, log_level.upper()),
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    token, tls = credentials()
    options = McpOptions(
        endpoints=[e.strip() for e in endpoints.split(",") if e.strip()],
        owner=owner,
        session_ttl=session_ttl,
        token=token,
        tls=tls,
        deadline=timeout,
    )
    anyio.run(run_stdio, options)
