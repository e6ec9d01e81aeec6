"""The running ``raftlease up``: it watches its nodes, reports each one that ends
(its pid, how it ended, who keeps serving and who leads now) and runs the commands
typed on its standard input, so that a new user can watch a failover and bring the
node back without another terminal:

* ``status``: each node's pid (or how it ended), role, term, applied index, leader;
* ``kill ID``: SIGKILL node ID (try a failover);
* ``restart ID``: start node ID again (a running one is first stopped cleanly), then
  say when it has caught up with what the leader had committed;
* ``help``; ``quit`` (as Ctrl-C). Anything else gets a one-line help.

A dead node does not stop the others. When every node is down ``up`` says so and
waits for ``restart`` (or Ctrl-C); only when its standard input is closed as well, so
that nothing could ever restart them, does it exit, with status 1.

Threads: the caller's (main) thread only, nothing in the background. ``run`` blocks:
it polls the nodes every ``POLL`` seconds and waits for input in between (``select``
on the descriptor and ``os.read``: no reader thread, which would hold
``sys.stdin``'s lock at exit). Each step blocks for about a second at most (one status
round trip to every node), except ``restart`` of a running node: its clean stop, up
to 10 s. Ctrl-C and SIGTERM arrive as ``KeyboardInterrupt`` (``up``'s
``common.SignalBox``) and propagate to ``up``, which stops every node.

Input is read from a terminal only while ``up`` is its foreground process: a
background job (``raftlease up &``) reading it would be stopped by SIGTTIN. End of
input (Ctrl-D, ``< /dev/null``) ends the commands, not the cluster.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from ..errors import RaftLeaseError

if TYPE_CHECKING:  # the test cluster loads the client: `raftlease node` must not
    from ..testing.cluster import LocalCluster

#: Seconds between two looks at the nodes (and the longest wait for input).
POLL = 0.5
#: How long after a node ends ``up`` looks for an agreed leader to name.
LEADER_WAIT = 5.0
#: How long after ``restart`` it watches the node catch up.
CATCH_UP_WAIT = 60.0
#: Timeout of each status request (the watches above; ``status`` waits 1 s).
STATUS_TIMEOUT = 0.5
#: A line longer than this (no newline in sight) is taken as it is.
MAX_LINE = 4096

COMMANDS = "status, kill ID, restart ID, help, quit"
HELP = """\
commands (type one, then Enter):
  status       each node: pid or how it ended, role, term, applied index, leader
  kill ID      SIGKILL node ID: the others elect a leader among themselves
  restart ID   start node ID again (a running one is stopped cleanly first)
  help         this list
  quit         stop every node and exit (as Ctrl-C)"""


@dataclass
class _Rejoin:
    """A restarted node, watched until it has applied ``target``: the commit index of
    the first leader agreed on after its restart."""

    pid: int
    deadline: float
    target: int | None = None


class UpConsole:
    """See the module docstring. ``echo`` prints one line (``click.echo``: stdout,
    flushed); ``stdin_fd`` is where commands come from."""

    def __init__(
        self,
        cluster: LocalCluster,
        echo: Callable[[str], None] = click.echo,
        stdin_fd: int = 0,
    ) -> None:
        self.cluster = cluster
        self.echo = echo
        self._fd: int | None = stdin_fd if _is_open(stdin_fd) else None
        self._tty = self._fd is not None and os.isatty(self._fd)
        self._buffer = b""
        self._lines: deque[str] = deque()
        #: node id -> the pid whose end was reported (each end is reported once).
        self._reported: dict[str, int] = {}
        #: Until when (monotonic) to look for a leader to name after a node ended.
        self._leader_due: float | None = None
        self._rejoins: dict[str, _Rejoin] = {}

    # ---------------------------------------------------------------- loop

    def run(self) -> int:
        """Supervise until ``quit`` (returns 0) or until every node is down with no
        input left to restart one (returns 1). Blocks; raises ``KeyboardInterrupt``
        on Ctrl-C / SIGTERM (``up``'s ``SignalBox``)."""
        self.echo(f"commands: {COMMANDS} (type help for more)")
        if self._fd is None:
            self.echo("no standard input: no commands; Ctrl-C stops the cluster")
        while True:
            self._check_nodes()
            self._follow_up()
            if self._fd is None and not self._running():
                self.echo(
                    "every node is down and standard input is closed: nothing can restart them"
                )
                return 1
            line = self._next_line(POLL)
            if line is not None and not self._command(line):
                return 0

    def _running(self) -> list[str]:
        return [n.id for n in self.cluster.nodes if self.cluster.is_running(n.id)]

    def _check_nodes(self) -> None:
        """Report each node that has ended since the last look, once."""
        for node in self.cluster.nodes:
            proc = self.cluster.procs.get(node.id)
            if proc is None or proc.poll() is None or self._reported.get(node.id) == proc.pid:
                continue
            self._reported[node.id] = proc.pid
            self._rejoins.pop(node.id, None)
            self._report_end(node.id, proc.pid, int(proc.returncode))

    def _report_end(self, node_id: str, pid: int, returncode: int) -> None:
        running = self._running()
        total = len(self.cluster.nodes)
        majority = total // 2 + 1
        if not running:
            others = "every node is down: nothing serves"
        elif len(running) >= majority:
            others = f"{_names(running)} keep{'s' if len(running) == 1 else ''} serving"
        else:
            others = (
                f"{_names(running)} cannot serve without a majority ({majority} of {total} nodes)"
            )
        self.echo(
            f"node {node_id} (pid {pid}) {ended(returncode)}; {others}. "
            f'Type "restart {node_id}" to start it again.'
        )
        if returncode > 0:  # it stopped by itself: its log says why
            self.echo(f"  its log: {self.cluster.log_path(node_id)}")
        if not running:
            self.echo(
                f'  restart {majority} of them ("restart ID") to serve again, or Ctrl-C to '
                "quit; up keeps waiting"
            )
        self._leader_due = time.monotonic() + LEADER_WAIT if len(running) >= majority else None

    def _follow_up(self) -> None:
        """Name the new leader after a node ended, and say when a restarted node has
        caught up: one status round trip, only while either is pending."""
        if self._leader_due is None and not self._rejoins:
            return
        now = time.monotonic()
        statuses = self._statuses(STATUS_TIMEOUT)
        leader = agreed_leader(statuses)
        if self._leader_due is not None:
            if leader is not None:
                self.echo(f"leader now: {_leader_text(leader)}")
                self._leader_due = None
            elif now >= self._leader_due:
                self.echo(f'no leader agreed within {LEADER_WAIT:g} s; type "status" to look')
                self._leader_due = None
        by_client = {s.get("client"): s for s in statuses}
        for node_id, rejoin in list(self._rejoins.items()):
            mine = by_client.get(self.cluster.node(node_id).client, {})
            if leader is not None and rejoin.target is None:
                rejoin.target = int(leader.get("commit_index", 0))
            if (
                leader is not None
                and rejoin.target is not None
                and mine.get("reachable")
                and mine.get("leader") == leader["client"]
                and int(mine.get("applied_index", -1)) >= rejoin.target
            ):
                role = (
                    "the leader"
                    if mine.get("client") == leader["client"]
                    else f"{mine.get('role')} of {leader['node']}"
                )
                self.echo(
                    f"{node_id} (pid {rejoin.pid}) caught up: {role}, applied index "
                    f"{mine.get('applied_index')}"
                )
                del self._rejoins[node_id]
            elif now >= rejoin.deadline:
                self.echo(
                    f"{node_id} has not caught up within {CATCH_UP_WAIT:g} s; its log: "
                    f"{self.cluster.log_path(node_id)}"
                )
                del self._rejoins[node_id]

    def _statuses(self, timeout: float) -> list[dict[str, Any]]:
        try:
            return self.cluster.statuses(timeout)
        except (RaftLeaseError, OSError):
            return []

    # ------------------------------------------------------------ commands

    def _command(self, line: str) -> bool:
        """Run one typed line; False for ``quit``."""
        words = line.split()
        if not words:
            return True
        name, args = words[0].lower(), words[1:]
        if name in ("help", "?") and not args:
            self.echo(HELP)
        elif name == "status" and not args:
            self._status()
        elif name == "kill" and len(args) == 1:
            self._kill(args[0])
        elif name == "restart" and len(args) == 1:
            self._restart(args[0])
        elif name in ("quit", "exit") and not args:
            self.echo("stopping nodes...")
            return False
        else:
            self.echo(f"unknown command {line.strip()!r}; commands: {COMMANDS}")
        return True

    def _known(self, node_id: str) -> str | None:
        ids = [n.id for n in self.cluster.nodes]
        if node_id in ids:
            return node_id
        self.echo(f"no node {node_id!r}; nodes: {', '.join(ids)}")
        return None

    def _status(self) -> None:
        by_client = {s.get("client"): s for s in self._statuses(1.0)}
        for node in self.cluster.nodes:
            proc = self.cluster.procs.get(node.id)
            if proc is None:
                self.echo(f"  {node.id:4} not started")
                continue
            if proc.poll() is not None:
                self.echo(
                    f"  {node.id:4} down: pid {proc.pid} {ended(int(proc.returncode))}; "
                    f'"restart {node.id}" starts it'
                )
                continue
            s = by_client.get(node.client, {})
            if not s.get("reachable"):
                self.echo(f"  {node.id:4} pid {proc.pid:<7} not answering: {s.get('error', '?')}")
                continue
            self.echo(
                f"  {node.id:4} pid {proc.pid:<7} {s.get('role', '?'):9} term {s.get('term')}  "
                f"applied {s.get('applied_index')}  leader {s.get('leader') or '-'}"
            )

    def _kill(self, name: str) -> None:
        node_id = self._known(name)
        if node_id is None:
            return
        if not self.cluster.is_running(node_id):
            self.echo(f'{node_id} is not running; "restart {node_id}" starts it')
            return
        self.echo(f"sending SIGKILL to {node_id} (pid {self.cluster.pid(node_id)})")
        self.cluster.kill_node(node_id)  # SIGKILL and reap: at once
        self._check_nodes()

    def _restart(self, name: str) -> None:
        node_id = self._known(name)
        if node_id is None:
            return
        if self.cluster.is_running(node_id):
            pid = self.cluster.pid(node_id)
            self.echo(f"stopping {node_id} (pid {pid}, SIGTERM)...")
            try:
                code = self.cluster.stop_node(node_id)
            except RuntimeError as exc:  # it was then killed
                self.echo(f"{exc}: killed it")
            else:
                self.echo(f"{node_id} stopped (exit status {code})")
            # An end asked for, not one to report.
            self._reported[node_id] = pid
        try:
            proc = self.cluster.start_node(node_id)
        except (OSError, RuntimeError) as exc:
            self.echo(f"cannot start {node_id}: {exc}")
            return
        self.echo(
            f"{node_id} started again: pid {proc.pid}, log {self.cluster.log_path(node_id)}; "
            "it catches up from the leader"
        )
        self._rejoins[node_id] = _Rejoin(proc.pid, time.monotonic() + CATCH_UP_WAIT)

    # --------------------------------------------------------------- input

    def _next_line(self, timeout: float) -> str | None:
        """The next typed line, waiting at most ``timeout`` for one; None if none."""
        if self._lines:
            return self._lines.popleft()
        fd = self._fd
        if fd is None or not self._foreground():
            time.sleep(timeout)
            return None
        try:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            data = os.read(fd, MAX_LINE)
        except BlockingIOError:
            return None
        except (OSError, ValueError):  # a terminal hung up, a descriptor closed
            data = b""
        if not data:
            self._end_of_input()
        else:
            self._buffer += data
            *complete, self._buffer = self._buffer.split(b"\n")
            if len(self._buffer) > MAX_LINE:
                complete.append(self._buffer)
                self._buffer = b""
            self._lines.extend(_decode(raw) for raw in complete)
        return self._lines.popleft() if self._lines else None

    def _end_of_input(self) -> None:
        if self._buffer:  # a last line without its newline
            self._lines.append(_decode(self._buffer))
            self._buffer = b""
        self._fd = None
        self.echo("standard input closed: no more commands; Ctrl-C stops the cluster")

    def _foreground(self) -> bool:
        """Whether reading the input cannot stop this process (SIGTTIN): it is no
        terminal, or this process group owns the terminal."""
        if not self._tty or self._fd is None:
            return True
        try:
            return os.tcgetpgrp(self._fd) == os.getpgrp()
        except OSError:  # hung up: let the read find out
            return True


def ended(returncode: int) -> str:
    """How a process ended, from ``Popen.returncode``: "was killed by SIGKILL",
    "exited with status 2", "exited with status 0 (a clean stop)"."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    if returncode == 0:
        return "exited with status 0 (a clean stop)"
    return f"exited with status {returncode}"


def agreed_leader(statuses: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The status of the one leader every reachable node agrees on, or None (as
    ``LocalCluster.leader``, from statuses already fetched)."""
    reachable = [s for s in statuses if s.get("reachable")]
    leaders = [s for s in reachable if s.get("role") == "leader"]
    if len(leaders) != 1 or any(s.get("leader") != leaders[0]["client"] for s in reachable):
        return None
    return leaders[0]


def _leader_text(leader: dict[str, Any]) -> str:
    return f"{leader['node']} ({leader['client']}), term {leader['term']}"


def _names(ids: list[str]) -> str:
    return ids[0] if len(ids) == 1 else ", ".join(ids[:-1]) + " and " + ids[-1]


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").rstrip("\r")


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
