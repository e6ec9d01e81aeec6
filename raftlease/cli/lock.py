"""``raftlease lock KEY -- COMMAND`` and ``raftlease elect NAME -- COMMAND``: run a
command while this process holds a lease (or leads an election), and stop it when
the lease can no longer be trusted.

What the command can rely on (docs/cli-lock.md):

* it starts only once the lease is granted (the fair blocking acquire, up to
  ``--wait``), without a shell, in its own process group (``start_new_session``);
* its environment has ``RAFTLEASE_KEY``, ``RAFTLEASE_TOKEN`` (the fencing token: pass
  it to whatever the lease protects, which must refuse lower tokens) and
  ``RAFTLEASE_LEASE_ID`` (renew or release it with the CLI); the caller's bearer token,
  if any, moves to ``RAFTLEASE_AUTH_TOKEN`` so the CLI inside still authenticates;
* while it runs, the lease is renewed every ``ttl / 3`` (``recipes.keepalive``). When
  the cluster says the lease is gone (revoked, expired), when validity ran out on this
  host's clock, or when renewals fail and less than ``--grace`` of validity is left,
  the whole process group gets SIGTERM, and SIGKILL ``--grace`` seconds later;
* SIGINT/SIGTERM sent to ``raftlease lock`` itself is forwarded to the group (SIGKILL
  follows after ``--grace``); a signal while still waiting for the key withdraws the
  queued acquire;
* with ``--progress-timeout``, ``RAFTLEASE_PROGRESS_FILE`` names a file the command
  writes or touches as its work advances; a command that leaves it alone that long
  loses the lease (``stalled``) and is stopped (``ProgressFile``);
* the lease is released on every exit path (unless the cluster already ended it).

Exit status: the command's own (128 + N if signal N killed it), or one of ``EXIT_*``
below. Signals: common.SignalBox (SIGINT, SIGTERM, SIGHUP). Runs on the main
thread (signal handlers need it); the keep-alive runs on a
daemon thread, the client's requests on its event-loop thread.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

import click

from ..errors import LeaseHeldError, RaftLeaseError, UnavailableError
from ..models import Lease
from .common import (
    DURATION,
    STOP_AND_HANGUP,
    SignalBox,
    connect,
    endpoints_option,
    exit_error,
    owner_option,
    run_until_signal,
    safe,
    timeout_option,
)

#: The key was not granted within ``--wait`` (also: held, with ``--wait 0``).
EXIT_NOT_ACQUIRED = 124
#: The lease (or the lead) was lost while the command ran; the command was stopped.
EXIT_LEASE_LOST = 125
#: The command exists but could not be started (not executable, bad format...).
EXIT_CANNOT_RUN = 126
#: The command was not found.
EXIT_NOT_FOUND = 127

#: How often the supervisor checks the child, the lease and pending signals.
POLL_INTERVAL = 0.05


def child_env(
    key: str, lease: Lease, yield_file: str | None = None, progress_file: str | None = None
) -> dict[str, str]:
    """The command's environment: ours, plus the lease's key, fencing token and id.
    ``RAFTLEASE_TOKEN`` is the CLI's bearer-token variable too: the caller's bearer
    token (if any) moves to ``RAFTLEASE_AUTH_TOKEN``, which the CLI prefers.
    ``RAFTLEASE_YIELD_FILE`` (``lock`` only): a file, empty until someone asks the
    holder to yield (``request_yield``), then one line per request.
    ``RAFTLEASE_PROGRESS_FILE`` (``lock --progress-timeout`` only): a file the command
    writes or touches whenever its work advances (``ProgressFile``)."""
    env = dict(os.environ)
    auth = env.get("RAFTLEASE_AUTH_TOKEN", env.get("RAFTLEASE_TOKEN", ""))
    env.update(
        RAFTLEASE_KEY=key,
        RAFTLEASE_TOKEN=str(lease.token),
        RAFTLEASE_LEASE_ID=lease.lease_id,
        RAFTLEASE_AUTH_TOKEN=auth,
    )
    if yield_file is not None:
        env["RAFTLEASE_YIELD_FILE"] = yield_file
    if progress_file is not None:
        env["RAFTLEASE_PROGRESS_FILE"] = progress_file
    return env


class ProgressFile:
    """``lock --progress-timeout``: the command reports progress by writing to (or
    touching) ``$RAFTLEASE_PROGRESS_FILE``; each renewal sends the file's modification
    time (ns) as the progress figure once it moved from when the file was made, so
    a command that stops touching it for ``--progress-timeout`` loses the lease
    (``stalled``, docs/design.md §4g) and is stopped like any lost lease (exit 125).
    Read from the keep-alive thread; a missing file reports nothing."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._made = self._mtime()

    def _mtime(self) -> int | None:
        try:
            return os.stat(self.path).st_mtime_ns
        except OSError:
            return None

    def figure(self) -> int | None:
        """The progress figure to send (None: no progress reported yet)."""
        mtime = self._mtime()
        return None if mtime is None or mtime == self._made else mtime


#: ``--timeout`` of ``lock`` and ``elect``: seconds each request to the cluster may
#: take, retries included (a cluster that is down fails the command this fast).
CLUSTER_TIMEOUT = 15.0


def unreachable(exc: RaftLeaseError, timeout: float) -> NoReturn:
    """Exit on a refusal or unknown outcome (``exit_error``: 1 or 3); when no node
    answered at all, say so in one line with the --timeout that ran out (exit 1)."""
    if isinstance(exc, UnavailableError):
        click.echo(
            f"error: no node of the cluster answered within --timeout {timeout:g} s: {safe(exc)}",
            err=True,
        )
        sys.exit(1)
    exit_error(exc, False)


def exit_status(returncode: int) -> int:
    """A child's exit status as a shell reports it: 128 + N if signal N killed it."""
    return 128 - returncode if returncode < 0 else returncode


class Supervisor:
    """Runs the command in its own process group and stops it (SIGTERM, then SIGKILL
    after ``grace``) when ``lost()`` names a reason or a signal arrives. Main thread."""

    def __init__(self, argv: tuple[str, ...], env: dict[str, str], grace: float) -> None:
        self.argv = argv
        self.env = env
        self.grace = grace
        self.proc: subprocess.Popen[bytes] | None = None
        self.kill_at = math.inf
        self.lost_reason: str | None = None

    def start(self) -> int | None:
        """Start the command; None, or the exit status to use if it cannot start."""
        try:
            self.proc = subprocess.Popen(self.argv, env=self.env, start_new_session=True)
        except FileNotFoundError as exc:
            click.echo(f"raftlease: command not found: {safe(exc.filename)}", err=True)
            return EXIT_NOT_FOUND
        except OSError as exc:
            click.echo(f"raftlease: cannot run {safe(self.argv[0])}: {safe(exc)}", err=True)
            return EXIT_CANNOT_RUN
        return None

    def _signal_group(self, signum: int) -> None:
        assert self.proc is not None
        # The group id is the child's pid (start_new_session); the group may outlive
        # the child (its own children), so signal it even after the child is gone.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def _stop(self, signum: int, valid_for: float = math.inf) -> None:
        self._signal_group(signum)
        # SIGKILL after the grace, but never after the validity left: a renewal that
        # hangs fails only at its timeout, when less than the grace may be left, and
        # past the validity the cluster may already have granted the key to another.
        self.kill_at = min(self.kill_at, time.monotonic() + min(self.grace, valid_for))

    def run(
        self,
        lost: Callable[[], str | None],
        box: SignalBox,
        valid_for: Callable[[], float] = lambda: math.inf,
        asked: Callable[[], None] = lambda: None,
    ) -> int:
        """Wait for the command; returns its exit status. ``valid_for``: seconds of
        ownership left on this host's clock (the SIGKILL of a stop for a lost lease
        comes no later than that). ``asked``: tells the command of a yield request
        learnt since the last call (``LeaseKeeper.tell_yield``)."""
        assert self.proc is not None
        while True:
            try:
                returncode = self.proc.wait(timeout=POLL_INTERVAL)
                break
            except subprocess.TimeoutExpired:
                pass
            asked()
            signum = box.take()
            if signum is not None:
                self._stop(signum)  # forwarded as is: SIGINT stays SIGINT
            if self.lost_reason is None:
                self.lost_reason = lost()
                if self.lost_reason is not None:
                    left = max(0.0, valid_for())
                    click.echo(
                        f"raftlease: {self.lost_reason}; stopping the command "
                        f"(SIGTERM, SIGKILL after {min(self.grace, left):.3g} s)",
                        err=True,
                    )
                    self._stop(signal.SIGTERM, left)
            if time.monotonic() >= self.kill_at:
                self._signal_group(signal.SIGKILL)
                self.kill_at = math.inf
        if self.lost_reason is not None:
            # Nothing of the group may keep working once the lease is gone.
            self._signal_group(signal.SIGKILL)
        return exit_status(returncode)


class LeaseKeeper:
    """Renews one lease every ``ttl / 3`` on a daemon thread (``KeepAliveState``) and
    says when the command must stop: ``lost()`` is a reason or None."""

    def __init__(
        self, client: Any, lease: Lease, grace: float, progress: ProgressFile | None = None
    ) -> None:
        # Here, not at the top: `raftlease node` loads this module and must not load
        # the recipes (tests/fitness/test_layers.py).
        from ..recipes.keepalive import KeepAliveState

        self.client = client
        self.progress = progress
        self.lease = lease
        self.grace = grace
        self.state = KeepAliveState(f"lock {lease.key}", lease.ttl, noun="lease")
        self.state.renewed(lease.trusted_until)
        #: The yield deadline last told to the command (once per request).
        self._yield_told: int | None = None
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread = threading.Thread(
            target=self.state.keep_alive_thread,
            args=(self._renew, self._stop, self._lost),
            name=f"raftlease-lock-{lease.key}",
            daemon=True,
        )
        self._thread.start()

    def _renew(self, timeout: float) -> None:
        figure = self.progress.figure() if self.progress is not None else None
        self.lease = self.client.renew(self.lease, timeout=timeout, progress=figure)
        self.state.renewed(self.lease.trusted_until)

    def tell_yield(self, supervisor: Supervisor, path: str, signum: int | None) -> None:
        """Main thread, from the supervisor's loop: a yield request learnt in a renewal
        answer and not told yet is appended to ``path`` (``RAFTLEASE_YIELD_FILE``:
        one line, ``deadline_ms=<log time> seconds_left=<s> by=<asker>``), then
        ``signum`` (``--yield-signal``, if any) goes to the command's group."""
        lease = self.lease
        deadline = lease.yield_deadline_ms
        if deadline is None or deadline == self._yield_told:
            return
        self._yield_told = deadline
        left = max(0.0, (deadline - lease.expires_at_ms) / 1000.0 + lease.remaining)
        line = f"deadline_ms={deadline} seconds_left={left:.3f} by={lease.yield_by}\n"
        with open(path, "a", encoding="utf-8") as out:
            out.write(line)
        click.echo(
            f"raftlease: {safe(lease.yield_by)} asks this holder of {safe(lease.key)} to "
            f"yield within about {left:.1f} s (then the cluster ends the lease)",
            err=True,
        )
        if signum is not None and supervisor.proc is not None:
            supervisor._signal_group(signum)

    def lost(self) -> str | None:
        state = self.state
        if state.lost_reason is not None:
            return f"lease on {safe(self.lease.key)} lost: {safe(state.lost_reason)}"
        if not state.valid:
            return f"lease on {safe(self.lease.key)} ran out on this host's clock"
        if state.jeopardy and state.remaining <= self.grace:
            return (
                f"lease on {safe(self.lease.key)} about to lapse: renewals fail and "
                f"{state.remaining:.2f} s are left"
            )
        return None

    def valid_for(self) -> float:
        """Seconds of validity left on this host's clock, by the last renewal (0 once
        run out), while renewals fail or hang; unbounded once the cluster ended the
        lease (a revoke: the SIGTERM's grace is the command's time to clean up)."""
        if self.state.lost_reason is not None:
            return math.inf
        return max(0.0, self.state.remaining)

    def release(self) -> None:
        """Stop renewing and release the lease (unless the cluster already ended it).
        Best effort: if the cluster cannot be reached, the lease expires after its TTL."""
        self._stop.set()
        self._thread.join(timeout=self.state.interval() + 10)
        if not self.state.gone:
            with contextlib.suppress(RaftLeaseError):
                self.client.release(self.lease, timeout=5.0)


_command_argument = click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)


def _common(func: Any) -> Any:
    func = click.option(
        "--grace",
        type=DURATION,
        default=10.0,
        show_default=True,
        help="Between SIGTERM and SIGKILL when the lease is lost (or on a signal).",
    )(func)
    func = timeout_option(
        CLUSTER_TIMEOUT,
        "Deadline for each request to the cluster, retries included (not the wait for the key)",
    )(func)
    return endpoints_option(func)


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("key")
@_command_argument
@click.option("--ttl", type=DURATION, default=30.0, show_default=True, help="Lease TTL (30s).")
@click.option(
    "--wait",
    type=DURATION,
    default=300.0,
    show_default=True,
    help="How long to wait in the key's queue (5m); 0: fail at once if held.",
)
@click.option(
    "--yield-signal",
    type=click.Choice(["", "USR1", "USR2", "INT", "TERM", "HUP"]),
    default="",
    help="Also send this signal to the command when someone asks the holder to yield "
    "(request_yield); RAFTLEASE_YIELD_FILE gets a line either way.",
)
@click.option(
    "--progress-timeout",
    type=DURATION,
    default=None,
    help="Lose the lease (stalled; the command is stopped) when the command has not "
    "written or touched RAFTLEASE_PROGRESS_FILE for this long.",
)
@owner_option
@_common
def lock(
    key: str,
    command: tuple[str, ...],
    ttl: float,
    wait: float,
    owner: str,
    grace: float,
    yield_signal: str,
    progress_timeout: float | None,
    endpoints: str,
    timeout: float,
) -> None:
    """Run COMMAND (after --) while holding a lease on KEY.

    Exit status: the command's; 124 not acquired within --wait; 125 the lease was
    lost while it ran (the command was stopped); 126 the command could not be
    started; 127 not found; 1 or 3 a refusal or unknown outcome from the cluster (1
    also when no node answered within --timeout); 128 + N on signal N while waiting."""
    with (
        SignalBox(STOP_AND_HANGUP).installed() as box,
        connect(endpoints, deadline=timeout) as c,
    ):
        try:
            # --timeout bounds reaching the cluster; --wait, the time in the queue.
            acquiring = c.aio.acquire(
                key,
                owner=owner,
                ttl=ttl,
                wait=wait,
                timeout=timeout,
                progress_timeout=progress_timeout,
            )
            lease = run_until_signal(c, acquiring, box)
        except LeaseHeldError as exc:
            click.echo(f"raftlease: {safe(key)} not acquired: {safe(exc.message)}", err=True)
            sys.exit(EXIT_NOT_ACQUIRED)
        except RaftLeaseError as exc:
            unreachable(exc, timeout)
        if lease is None:  # a signal while waiting: the queued acquire was withdrawn
            sys.exit(128 + (box.take() or signal.SIGINT))
        progress: ProgressFile | None = None
        if progress_timeout is not None:
            handle, progress_path = tempfile.mkstemp(prefix="raftlease-progress-")
            os.close(handle)
            progress = ProgressFile(progress_path)
        keeper = LeaseKeeper(c, lease, grace, progress)
        handle, yield_file = tempfile.mkstemp(prefix="raftlease-yield-")
        os.close(handle)
        signum = getattr(signal, f"SIG{yield_signal}") if yield_signal else None
        try:
            env = child_env(key, lease, yield_file, progress.path if progress else None)
            supervisor = Supervisor(command, env, grace)
            status = supervisor.start()
            if status is None:
                status = supervisor.run(
                    keeper.lost,
                    box,
                    keeper.valid_for,
                    lambda: keeper.tell_yield(supervisor, yield_file, signum),
                )
                if supervisor.lost_reason is not None:
                    status = EXIT_LEASE_LOST
        finally:
            keeper.release()
            with contextlib.suppress(OSError):
                os.unlink(yield_file)
            if progress is not None:
                with contextlib.suppress(OSError):
                    os.unlink(progress.path)
    sys.exit(status)


class LeadershipKeeper:
    """While we lead: the session's keep-alive keeps the lead, and every ``ttl / 3``
    a fence check on the election key notices a lead ended on the cluster's side (a
    revoke) that the session's keep-alive does not see. Main thread."""

    def __init__(self, client: Any, session: Any, lease: Lease, grace: float) -> None:
        self.client = client
        self.session = session
        self.lease = lease
        self.grace = grace
        self.next_check = time.monotonic() + max(0.05, session.ttl / 3)

    def valid_for(self) -> float:
        """Seconds of leadership left on this host's clock, by the session's last
        keep-alive (0 once run out), while keep-alives fail or hang; unbounded once
        the session or the lead ended on the cluster (the grace is for clean-up)."""
        session = self.session
        if session.lost_reason is not None or session.lost.is_set():
            return math.inf
        return max(0.0, float(session.remaining))

    def lost(self) -> str | None:
        session = self.session
        name = safe(self.lease.key)
        if session.lost_reason is not None or session.lost.is_set():
            return f"leadership of {name} lost: session {safe(session.lost_reason)}"
        if not session.valid:
            return f"leadership of {name} ran out on this host's clock"
        if session.jeopardy and session.remaining <= self.grace:
            return f"leadership of {name} about to lapse: {session.remaining:.2f} s left"
        if time.monotonic() >= self.next_check:
            self.next_check = time.monotonic() + max(0.05, session.ttl / 3)
            with contextlib.suppress(RaftLeaseError):  # unreachable: the session decides
                if not self.client.fence(self.lease.key, self.lease.token, timeout=2.0):
                    return f"leadership of {name} ended on the cluster (revoked?)"
        return None


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("name")
@_command_argument
@click.option("--ttl", type=DURATION, default=10.0, show_default=True, help="Session TTL.")
@click.option(
    "--wait",
    type=DURATION,
    default=3600.0,
    show_default=True,
    help="How long to campaign before giving up.",
)
@click.option("--value", default=None, help="Published while leading (default: the owner).")
@owner_option
@_common
def elect(
    name: str,
    command: tuple[str, ...],
    ttl: float,
    wait: float,
    value: str | None,
    owner: str,
    grace: float,
    endpoints: str,
    timeout: float,
) -> None:
    """Run COMMAND (after --) while this process leads the election NAME.

    Campaigns (first come, first served), runs the command once elected, and stops it
    as ``lock`` does when the lead is lost. Exit status as for ``lock`` (124: not
    elected within --wait; 125: the lead was lost)."""
    with (
        SignalBox(STOP_AND_HANGUP).installed() as box,
        connect(endpoints, deadline=timeout) as c,
    ):
        try:
            session = c.session(owner=owner, ttl=ttl).open()
        except RaftLeaseError as exc:
            unreachable(exc, timeout)
        try:
            election = c.aio.election(name)
            try:
                lease = run_until_signal(
                    c, election.campaign(value or owner, session=session, wait=wait), box
                )
            except LeaseHeldError as exc:
                click.echo(f"raftlease: not elected: {safe(exc.message)}", err=True)
                sys.exit(EXIT_NOT_ACQUIRED)
            except RaftLeaseError as exc:
                unreachable(exc, timeout)
            if lease is None:
                sys.exit(128 + (box.take() or signal.SIGINT))
            keeper = LeadershipKeeper(c, session, lease, grace)
            supervisor = Supervisor(command, child_env(name, lease), grace)
            status = supervisor.start()
            if status is None:
                status = supervisor.run(keeper.lost, box, keeper.valid_for)
                if supervisor.lost_reason is not None:
                    status = EXIT_LEASE_LOST
        finally:
            session.close()  # releases the lead (and withdraws a campaign)
    sys.exit(status)
