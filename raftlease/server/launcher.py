"""A node that stops when the process that launched it is gone (``raftlease node
--parent-pid PID``, a hidden option only ``LocalCluster`` passes: ``raftlease up``,
the tests, the benchmark and the chaos harness).

Why: a launcher killed with SIGKILL (an impatient ``kill -9`` of ``raftlease up``, a
pytest process ended by its timeout) runs no cleanup, and its nodes kept running with
no parent, holding their ports. ``PR_SET_PDEATHSIG`` is not enough: it fires when the
*thread* that forked the child exits, and the chaos harness and the tests restart
nodes from worker threads that end long before the launcher does. It is also
Linux-only. So the node watches instead, once a second on its event loop:

* if the launcher started it directly (the usual case: ``os.getppid()`` was ``PID``
  at the first check), the launcher is gone once the node's parent is no longer
  ``PID``: the kernel reparents an orphan at once, to init or a subreaper. Exact: a
  dead launcher that is not reaped yet (a zombie) or whose pid was reused is still
  gone;
* otherwise (the launcher died before the node's first check, or a wrapper script
  stands between them) ``PID`` must exist and not be a zombie (``/proc``, where
  there is one).

A production ``raftlease node`` without the option watches nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("raftlease.server")

#: Seconds between two checks, each one ``getppid`` (or one ``kill(pid, 0)``): a
#: node outlives its launcher by about this long plus its clean stop.
CHECK_INTERVAL = 1.0


def launcher_gone(pid: int, direct: bool) -> bool:
    """True once process ``pid`` is gone: with ``direct`` (it is this process's
    parent), once this process has another parent; otherwise once ``pid`` does not
    exist or is a zombie. Never raises."""
    if direct:
        return os.getppid() != pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # exists, another user's: not ours to judge, keep going
        return False
    return _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits for its parent to reap it (Linux
    ``/proc``; False where it cannot be told)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # "pid (comm) state ...": comm may hold spaces and parentheses; the state
    # follows the last ")".
    fields = stat.rpartition(")")[2].split()
    return bool(fields) and fields[0] in ("Z", "X")


async def watch_launcher(
    pid: int, on_gone: Callable[[], None], interval: float = CHECK_INTERVAL
) -> None:
    """Call ``on_gone`` (once) when process ``pid`` is gone (``launcher_gone``), then
    return. Event loop task; checks every ``interval`` seconds, the first at once;
    cancel it to stop watching. Raises nothing but ``CancelledError``."""
    direct = os.getppid() == pid
    if not direct:
        log.info("launcher %d is not (or no longer) this node's parent; watching its pid", pid)
    while not launcher_gone(pid, direct):
        await asyncio.sleep(interval)
    log.warning("the process that launched this node (pid %d) is gone; stopping", pid)
    on_gone()
