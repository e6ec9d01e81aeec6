"""``raftlease node``: run one node of a cluster until SIGINT/SIGTERM (the node
handles both itself: server/node.py).

The server stack is imported only when the command runs: every ``raftlease`` command
loads this module, and a client command must not load the server.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ..config import NodeConfig, load_toml
from ..errors import ConfigError
from .common import LOG_FORMATS, parse_member, parse_setting, safe


@click.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--id", "node_id", help="This node's id (must be one of the members).")
@click.option(
    "--member",
    "members",
    multiple=True,
    metavar="ID,RAFT,CLIENT",
    help="A cluster member (repeat for each, this node included).",
)
@click.option(
    "--data-dir", type=click.Path(file_okay=False), help="Journal and snapshot directory."
)
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="Any config field.")
@click.option("--log-level", default="INFO", show_default=True)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    envvar="RAFTLEASE_LOG_FORMAT",
    help="key=value text, or one JSON object a line with the same fields.",
)
# Hidden: LocalCluster's (raftlease up, tests) way to leave no orphan node behind a
# launcher killed with SIGKILL (server/launcher.py). An option, not an environment
# variable: nothing inherits it by accident, and `ps` shows why a node stopped.
@click.option("--parent-pid", type=click.IntRange(min=1), default=None, hidden=True)
def node(
    config_file: str | None,
    node_id: str | None,
    members: tuple[str, ...],
    data_dir: str | None,
    settings: tuple[str, ...],
    log_level: str,
    log_format: str,
    parent_pid: int | None,
) -> None:
    """Run one node of a cluster (until SIGINT/SIGTERM)."""
    # Here, not at the top: importing raftlease.server loads the whole server stack,
    # which the client commands (this module is loaded for every command) must not.
    from ..server import run_node
    from ..server.logs import setup_logging

    setup_logging(log_level, log_format)
    overrides: dict[str, Any] = dict(parse_setting(s) for s in settings)
    if node_id:
        overrides["node_id"] = node_id
    if members:
        overrides["nodes"] = [parse_member(m) for m in members]
    if data_dir:
        # Relative to where the command runs (a data_dir inside the file is relative
        # to the file).
        overrides["data_dir"] = str(Path(data_dir).resolve())
    try:
        if config_file:
            config = load_toml(config_file, **overrides)
        else:
            config = NodeConfig.create(**overrides)
    except ConfigError as exc:
        raise click.UsageError(f"invalid configuration: {exc.message}") from None
    except TypeError as exc:
        raise click.UsageError(f"invalid configuration: {exc}") from None
    try:
        run_node(config, parent_pid=parent_pid)
    except ConfigError as exc:  # files named by the config (auth, TLS, peer TLS)
        click.echo(f"error: {safe(exc.message)}", err=True)
        sys.exit(2)
