"""``raftlease top``: the live view's table in a terminal (docs/usage.md "Live view").

Every ``--interval`` it reads, through the ordinary client (read-only: no write is
ever sent), the status of every node, the live leases, the wait queue of each held
key, the lease sessions and the stats of each ``--queue``, and redraws one frame with
plain ANSI (home + clear: works over SSH, no curses). ``--once`` prints one frame and
exits (scripts, tests); ``-o json`` (``--json``) prints one snapshot as JSON and exits.

Keys, owners and values are hostile input: every one is printed through ``_safe``
(control and format characters escaped), never interpreted by the terminal. Nothing
shown carries a lease, session or attempt id (the reads used never reveal them).

Exit status: 0 (Ctrl-C or SIGTERM ends the refreshing view with 0 too, even with
SIGINT inherited ignored: common.SignalBox); with ``--once`` or
``--json``, 1 a definite error, 3 an unknown outcome, as the other client commands.
Threads: the command's own; each frame's reads block up to ``--timeout``.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import click

from ..errors import RaftLeaseError
from .common import DURATION, SignalBox, client_options, connect, exit_error, safe

if TYPE_CHECKING:
    from ..client import Client

#: Keys whose wait queue one frame reads (one request each).
MAX_WAITER_KEYS = 200
#: Waiters shown per key in the table (all of them in ``--json``, up to the limit).
SHOWN_WAITERS = 5
#: Home the cursor and clear the screen: a frame is redrawn in place.
CLEAR = "\x1b[H\x1b[2J"


def snapshot(
    c: Client, prefix: str, limit: int, queues: tuple[str, ...], timeout: float
) -> dict[str, Any]:
    """One reading of the cluster as plain data. Raises ``RaftLeaseError``."""
    nodes = c.cluster_status(timeout=min(timeout, 3.0))
    holders = c.leases(prefix, limit=limit, timeout=timeout)
    keys: dict[str, dict[str, Any]] = {}
    for h in holders:
        item = keys.setdefault(h.key, {"key": h.key, "holders": [], "waiters": []})
        item["holders"].append(
            {
                "owner": h.owner,
                "token": h.token,
                "remaining": round(h.remaining, 3),
                "units": h.units,
                **({"unit_indices": list(h.unit_indices)} if h.unit_indices else {}),
            }
        )
    for key in list(keys)[:MAX_WAITER_KEYS]:
        keys[key]["waiters"] = [
            {"position": w.position, "owner": w.owner, "units": w.units, "priority": w.priority}
            for w in c.waiters(key, limit=100, timeout=timeout)
        ]
    sessions = [asdict(s) for s in c.sessions(limit=limit, timeout=timeout)]
    stats = [asdict(c.queue(name).stats(timeout=timeout)) for name in queues]
    return {
        "nodes": [_node(s) for s in nodes],
        "keys": list(keys.values()),
        "sessions": sessions,
        "queues": stats,
    }


def _node(status: dict[str, Any]) -> dict[str, Any]:
    fields = (
        "reachable", "node", "client", "role", "term", "commit_index", "applied_index",
        "leader", "lease_reads", "drift_alarm", "loop_lag_ms", "overloaded", "error",
    )  # fmt: skip
    return {k: status[k] for k in fields if k in status}


def render(snap: dict[str, Any], width: int) -> list[str]:
    """The lines of one frame, each at most ``width`` characters."""
    lines = [f"raftlease top  {time.strftime('%H:%M:%S')}  (read-only; Ctrl-C quits)", ""]
    lines.append(
        f"{'node':6} {'client':22} {'role':10} {'term':>5} {'applied':>8} lease-reads drift "
        f"{'lag-ms':>6}"
    )
    for n in snap["nodes"]:
        if not n.get("reachable"):
            lines.append(f"{'?':6} {safe(n.get('client')):22} unreachable: {safe(n.get('error'))}")
            continue
        lines.append(
            f"{safe(n['node']):6} {safe(n['client']):22} {safe(n['role']):10} "
            f"{n.get('term', '-'):>5} {n.get('applied_index', '-'):>8} "
            f"{'yes' if n.get('lease_reads') else 'no':11} "
            f"{'ALARM' if n.get('drift_alarm') else 'ok':5} "
            # The event loop's lag (admin-only with an auth file: '-' otherwise), and
            # whether the node refuses new sessions for it (admission control).
            f"{n.get('loop_lag_ms', '-'):>6}"
            f"{'  OVERLOADED' if n.get('overloaded') else ''}"
        )
    lines += ["", f"{'key':30} {'holder':20} {'token':>8} {'left':>8} {'units':>5}  waiters"]
    if not snap["keys"]:
        lines.append("(no leases)")
    for item in snap["keys"]:
        waiters = item["waiters"]
        queue = ", ".join(f"{w['position']}. {safe(w['owner'])}" for w in waiters[:SHOWN_WAITERS])
        if len(waiters) > SHOWN_WAITERS:
            queue += f", +{len(waiters) - SHOWN_WAITERS}"
        for i, h in enumerate(item["holders"]):
            units = str(h["units"])
            if h.get("unit_indices"):
                units += " [" + ",".join(str(u) for u in h["unit_indices"]) + "]"
            lines.append(
                f"{safe(item['key']) if i == 0 else '':30} {safe(h['owner']):20} "
                f"{h['token']:>8} {h['remaining']:>7.1f}s {units:>5}  {queue if i == 0 else ''}"
            )
    if snap["sessions"]:
        lines += ["", f"{'session owner':30} {'ttl':>7} {'left':>8} {'leases':>6} {'queued':>6}"]
        for s in snap["sessions"]:
            lines.append(
                f"{safe(s['owner']):30} {s['ttl']:>6.1f}s {s['remaining']:>7.1f}s "
                f"{s['leases']:>6} {s['waiters']:>6}"
            )
    if snap["queues"]:
        lines += ["", f"{'queue':30} {'ready':>6} {'delayed':>7} {'claimed':>7} {'dead':>6}"]
        for q in snap["queues"]:
            lines.append(
                f"{safe(q['queue']):30} {q['ready']:>6} {q['delayed']:>7} "
                f"{q['claimed']:>7} {q['dead']:>6}"
            )
    return [line[:width] for line in lines]


def _width() -> int:
    """Lines are cut to a terminal's width; to a pipe or file they are whole."""
    return shutil.get_terminal_size((160, 40)).columns if sys.stdout.isatty() else 1 << 20


@click.command()
@click.option("--prefix", default="", help="Only keys starting with this.")
@click.option("--limit", default=1000, show_default=True, help="Most leases and sessions.")
@click.option(
    "--queue", "queues", multiple=True, help="Also show this queue's depths (repeatable)."
)
@click.option("--interval", type=DURATION, default=2.0, show_default=True, help="Refresh period.")
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@client_options
def top(
    prefix: str,
    limit: int,
    queues: tuple[str, ...],
    interval: float,
    once: bool,
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """Show who holds what, refreshing: nodes, keys with holder, token, time left,
    units and waiters, sessions, queues (read-only)."""
    interval = max(interval, 0.2)
    with connect(endpoints) as c:
        if as_json or once:
            try:
                snap = snapshot(c, prefix, limit, queues, timeout)
            except RaftLeaseError as exc:
                exit_error(exc, as_json)
            if as_json:
                click.echo(json.dumps({"ok": True, **snap}))
            else:
                click.echo("\n".join(render(snap, _width())))
            return
        tty = sys.stdout.isatty()
        # Ctrl-C or SIGTERM ends the view (exit 0), whatever this process inherited
        # (common.SignalBox: a background job inherits SIGINT ignored).
        with SignalBox(interrupt=True).installed():
            try:
                while True:
                    size = shutil.get_terminal_size((160, 40))
                    try:
                        lines = render(snapshot(c, prefix, limit, queues, timeout), _width())
                    except RaftLeaseError as exc:
                        lines = [f"raftlease top: {safe(exc)} (retrying)"]
                    if tty:
                        lines = lines[: size.lines - 1]  # a frame fits the screen
                    click.echo((CLEAR if tty else "") + "\n".join(lines))
                    time.sleep(interval)
            except KeyboardInterrupt:
                return
