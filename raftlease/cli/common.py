"""What every ``raftlease`` command shares: the client options and how they are
inherited from the root group, the client and its credentials, failures as exit
codes, durations, and the one signal policy of the long-running commands.

Exit codes of the client commands: 0 success, 1 a definite failure (the request did
not take effect), 3 an unknown outcome (timeout or leadership change after all
retries), 2 usage errors.

**Client options** (``client_options``, ``endpoints_option``, ``timeout_option``,
``output_options``): ``--endpoints``, ``--timeout``, ``-o/--output text|json`` and
``--json`` (the same as ``-o json``) are taken after the subcommand and also before it,
on the root group (``raftlease --endpoints X status``). The subcommand's own argument
wins; then the root's; then the environment (``RAFTLEASE_ENDPOINTS``,
``RAFTLEASE_TIMEOUT``, ``RAFTLEASE_OUTPUT``); then the command's own default (``snapshot
save`` waits 300 s by default, the others 15 s). Credentials come from the environment
only, never from the command line, where ``ps`` would show them (``credentials``).

**Signals** (``SignalBox``): a long-running command (``up``, ``top``, ``lock``, ``elect``,
``watch``) installs its own handlers for SIGINT and SIGTERM (``lock``, ``elect`` and
``watch`` SIGHUP too) for as long as it runs, whatever it inherited: a shell starts a
background job (``raftlease up &``) with SIGINT ignored, and Python then installs no
``KeyboardInterrupt`` handler, so a command that relied on it could not be stopped with
SIGINT, and one that relied on SIGTERM's default left its nodes or its lease behind.
The box either records the signal and wakes an asyncio wait (``run_until_signal``:
``lock``, ``elect``, ``watch``) or, for a command blocked in a plain loop (``up``,
``top``), raises ``KeyboardInterrupt`` once on the main thread so that the command
unwinds through its clean stop; a second signal during that stop is only recorded.
``raftlease mcp`` takes SIGINT and SIGTERM through the MCP server's own receiver
(mcp_server.run_stdio), and ``raftlease node`` through the node's (server/node.py).

Nothing here imports the client or the server at module level: every command loads
this module, and ``raftlease node`` must load neither the client nor the recipes
(tests/fitness/test_layers.py), nor a client command the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import os
import signal
import ssl
import sys
import unicodedata
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import fields
from types import FrameType
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar

import click
from click.core import ParameterSource

from ..config import NodeConfig
from ..errors import RaftLeaseError
from ..models import default_owner

if TYPE_CHECKING:
    from ..client import Client as BlockingClient

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_ENDPOINTS = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"

#: The node's log formats (server/logs.LOG_FORMATS, which a test compares): spelled
#: here because importing raftlease.server loads the whole server stack, which no
#: client command may load.
LOG_FORMATS = ("text", "json")

#: ``-o/--output``: today's lines for people, or JSON (one object, one a line for streams).
OUTPUTS = ("text", "json")


# ------------------------------------------------------------------ values


class Duration(click.ParamType[float]):
    """A duration option: ``250ms``, ``30s``, ``5m``, ``1h`` or a plain number of
    seconds (``1.5``); converts to float seconds. Anything else (``inf``, ``nan``, an
    unknown unit, and a negative unless ``negative``) is a usage error naming the
    value. ``negative=True`` is for TTLs, whose range the node checks (a definite
    ``INVALID_ARGUMENT``, exit 1, as before durations had units)."""

    name = "duration"
    UNITS: ClassVar[dict[str, float]] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

    def __init__(self, negative: bool = False) -> None:
        self.negative = negative

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
        else:
            text = str(value).strip().lower()
            unit = next((u for u in ("ms", "s", "m", "h") if text.endswith(u)), "")
            number = text[: len(text) - len(unit)].strip() if unit else text
            try:
                seconds = float(number) * self.UNITS.get(unit, 1.0)
            except ValueError:
                seconds = math.nan
        if not math.isfinite(seconds) or (seconds < 0 and not self.negative):
            self.fail(
                f"{value!r} is not a duration: use a number of seconds or 250ms, 30s, 5m, 1h",
                param,
                ctx,
            )
        return seconds


DURATION = Duration()
#: A TTL: the node checks its range.
TTL = Duration(negative=True)


def owner_option(func: F) -> F:
    """``--owner``, defaulting to ``hostname:pid``: a label for readers and logs, not
    a credential (the lease id proves ownership)."""
    return click.option(
        "--owner",
        default=default_owner,
        show_default="hostname:pid",
        help="Who takes it: a label shown to readers, not a credential.",
    )(func)


consistency_option = click.option(
    "--consistency",
    type=click.Choice(["linearizable", "log", "stale"]),
    default="linearizable",
    show_default=True,
    help="linearizable: leader lease or log; log: always the Raft log; stale: any node.",
)


def parse_member(text: str) -> dict[str, str]:
    """``ID,RAFT_HOST:PORT,CLIENT_HOST:PORT`` (``node --member``, ``snapshot restore
    --member``). Raises ``click.BadParameter``."""
    parts = text.split(",")
    if len(parts) != 3:
        raise click.BadParameter(f"{text!r}: expected ID,RAFT_HOST:PORT,CLIENT_HOST:PORT")
    return {"id": parts[0], "raft": parts[1], "client": parts[2]}


_BOOLEANS = {"true": True, "yes": True, "on": True, "1": True}
_BOOLEANS.update({"false": False, "no": False, "off": False, "0": False})


def parse_setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` (``--set``): a boolean field takes true/false, yes/no, on/off or
    1/0; other values become an int or float where they parse as one, else stay text.
    Raises ``click.BadParameter``."""
    key, sep, raw = text.partition("=")
    if not sep:
        raise click.BadParameter(f"{text!r}: expected KEY=VALUE")
    if any(f.name == key.strip() and f.type in (bool, "bool") for f in fields(NodeConfig)):
        if raw.strip().lower() not in _BOOLEANS:
            raise click.BadParameter(
                f"{text!r}: {key.strip()} is true or false (also yes/no, on/off, 1/0)"
            )
        return key.strip(), _BOOLEANS[raw.strip().lower()]
    value: Any = raw
    for cast in (int, float):
        try:
            value = cast(raw)
            break
        except ValueError:
            continue
    return key.strip(), value


# ---------------------------------------------------------- client options


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE


def inherited(ctx: click.Context, name: str, value: T) -> T:
    """The value of client option ``name`` for the command of ``ctx``: its own
    command-line argument, else the root group's (``raftlease --endpoints X status``),
    else ``value`` as this command got it (environment, then its own default)."""
    if _given(ctx, name):
        return value
    root = ctx.find_root()
    if root is not ctx and name in root.params and _given(root, name):
        return root.params[name]  # type: ignore[no-any-return]
    return value


def json_wanted(ctx: click.Context, output: str, as_json: bool) -> bool:
    """Whether the command of ``ctx`` prints JSON: ``--json`` or ``-o`` given to it,
    else given to the root group, else ``RAFTLEASE_OUTPUT`` or the default (text)."""
    for where in (ctx, ctx.find_root()):
        if "output" not in where.params:
            continue
        if _given(where, "as_json") and where.params["as_json"]:
            return True
        if _given(where, "output"):
            return bool(where.params["output"] == "json")
    return as_json or output == "json"


def _resolving(func: F, names: tuple[str, ...]) -> F:
    """``func`` with the client options ``names`` resolved by ``inherited`` before it
    runs (a wrapper: click has set every parameter's source by then)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        for name in names:
            kwargs[name] = inherited(ctx, name, kwargs[name])
        return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def endpoints_option(func: F) -> F:
    """``--endpoints`` (env ``RAFTLEASE_ENDPOINTS``), also taken before the subcommand."""
    func = _resolving(func, ("endpoints",))
    return click.option(
        "--endpoints",
        envvar="RAFTLEASE_ENDPOINTS",
        default=DEFAULT_ENDPOINTS,
        show_default=True,
        help="Comma-separated client addresses (env RAFTLEASE_ENDPOINTS).",
    )(func)


def timeout_option(
    default: float = 15.0, help: str = "Deadline (30s, 5m, or seconds), retries included."
) -> Callable[[F], F]:
    """``--timeout`` with this command's default (env ``RAFTLEASE_TIMEOUT``), also
    taken before the subcommand."""

    def decorate(func: F) -> F:
        func = _resolving(func, ("timeout",))
        return click.option(
            "--timeout",
            type=DURATION,
            default=default,
            show_default=True,
            envvar="RAFTLEASE_TIMEOUT",
            help=f"{help.rstrip('.')} (env RAFTLEASE_TIMEOUT).",
        )(func)

    return decorate


def output_options(func: F) -> F:
    """``-o/--output text|json`` and ``--json`` (= ``-o json``; env ``RAFTLEASE_OUTPUT``),
    also taken before the subcommand; the command gets ``as_json: bool``."""

    @functools.wraps(func)
    def wrapper(*args: Any, output: str, as_json: bool, **kwargs: Any) -> Any:
        wanted = json_wanted(click.get_current_context(), output, as_json)
        return func(*args, as_json=wanted, **kwargs)

    decorated: Any = click.option(
        "--json", "as_json", is_flag=True, help="Print JSON (the same as -o json)."
    )(wrapper)
    return click.option(  # type: ignore[no-any-return]
        "-o",
        "--output",
        type=click.Choice(OUTPUTS),
        default="text",
        show_default=True,
        envvar="RAFTLEASE_OUTPUT",
        help="text: lines for people; json: one JSON object (one a line for streams). "
        "Env RAFTLEASE_OUTPUT.",
    )(decorated)


def client_options(func: F) -> F:
    """``--endpoints``, ``-o/--output`` and ``--json``, ``--timeout`` (15 s): the options
    of a command that asks the cluster once and prints the result."""
    return endpoints_option(output_options(timeout_option()(func)))


# ------------------------------------------------------------------ client


def credentials() -> tuple[str | None, ssl.SSLContext | str | bool | None]:
    """(bearer token, tls) from the environment, as ``connect`` uses them (and
    ``raftlease mcp``, which builds a client of its own):
    ``RAFTLEASE_AUTH_TOKEN`` (when set, even empty), else ``RAFTLEASE_TOKEN``, is the
    bearer token (under ``raftlease lock``, ``RAFTLEASE_TOKEN`` is the fencing token
    and the bearer token is in ``RAFTLEASE_AUTH_TOKEN``); ``RAFTLEASE_CA_FILE`` (or
    ``RAFTLEASE_TLS=1`` for the system's CAs) turns on TLS; ``RAFTLEASE_CERT_FILE``
    and ``RAFTLEASE_KEY_FILE`` add a client certificate (its common name is the
    principal). Raises ``click.UsageError`` if the certificate files cannot be used."""
    if "RAFTLEASE_AUTH_TOKEN" in os.environ:
        token = os.environ["RAFTLEASE_AUTH_TOKEN"] or None
    else:
        token = os.environ.get("RAFTLEASE_TOKEN") or None
    ca_file = os.environ.get("RAFTLEASE_CA_FILE") or None
    tls: ssl.SSLContext | str | bool | None = (
        ca_file or (os.environ.get("RAFTLEASE_TLS") == "1") or None
    )
    cert_file = os.environ.get("RAFTLEASE_CERT_FILE") or None
    key_file = os.environ.get("RAFTLEASE_KEY_FILE") or None
    if cert_file or key_file:
        if not (cert_file and key_file):
            raise click.UsageError("RAFTLEASE_CERT_FILE and RAFTLEASE_KEY_FILE go together")
        try:
            context = ssl.create_default_context(cafile=ca_file)
            context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise click.UsageError(
                f"cannot use the client certificate {cert_file} with {key_file}: {exc}"
            ) from None
        tls = context
    return token, tls


def connect(endpoints: Sequence[str] | str, **options: Any) -> BlockingClient:
    """A blocking client for a command, its credentials from the environment
    (``credentials``), never from the command line; ``options`` go to ``Client``
    (``attempt_timeout``, ``deadline``). Raises ``click.UsageError`` (credentials)."""
    # Imported when a client command runs: `raftlease node` loads this module and must
    # not load the client and recipe stack it never uses.
    from ..client import Client

    token, tls = credentials()
    return Client(endpoints, token=token, tls=tls, **options)


def with_client(
    endpoints: Sequence[str] | str, as_json: bool, use: Callable[[BlockingClient], T]
) -> T:
    """``use(client)`` on a client from ``connect``, closed after; a cluster error is
    reported and exits (``exit_error``: 1 definite, 3 unknown outcome). Blocks the
    calling thread. Raises ``SystemExit`` on an error, ``click.UsageError``
    (credentials)."""
    try:
        with connect(endpoints) as client:
            return use(client)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)


# ----------------------------------------------------------------- output


def safe(text: object) -> str:
    """``text`` for a terminal: control and format characters (escape sequences,
    bidirectional overrides) in keys, owners, values or messages are shown escaped,
    never interpreted. JSON output needs no such care (json.dumps escapes them)."""
    out = []
    for ch in str(text):
        if unicodedata.category(ch) in ("Cc", "Cf"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def exit_error(exc: RaftLeaseError, as_json: bool) -> NoReturn:
    """Report ``exc`` (JSON on stdout, or a line on stderr) and exit: 1 if definite
    (nothing took effect), 3 if the outcome is unknown. Raises ``SystemExit``."""
    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": False,
                    "code": exc.code,
                    "message": exc.message,
                    "definite": exc.definite,
                    "detail": exc.detail,
                }
            )
        )
    else:
        click.echo(f"error: {safe(exc)}", err=True)
    sys.exit(1 if exc.definite else 3)


# ---------------------------------------------------------------- signals

#: What every long-running command stops on.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)
#: ``lock``, ``elect`` and ``watch`` stop on SIGHUP too (a closed terminal).
STOP_AND_HANGUP: tuple[signal.Signals, ...] = (*STOP_SIGNALS, signal.SIGHUP)


class SignalBox:
    """The long-running commands' signal policy (module docstring): ``signals``
    handled by this process for as long as ``installed`` lasts, whatever it inherited
    (a background job inherits SIGINT ignored). Each one is recorded in ``pending``;
    ``on_signal`` runs in the handler (on the main thread) to wake a wait on another
    thread; with ``interrupt`` the first one also raises ``KeyboardInterrupt`` on the
    main thread (a command blocked in a plain loop unwinds through its clean stop,
    which a second signal does not interrupt). Restores the old handlers on exit.
    Install it on the main thread (``signal.signal`` refuses any other)."""

    def __init__(
        self, signals: Sequence[signal.Signals] = STOP_SIGNALS, interrupt: bool = False
    ) -> None:
        self.signals = tuple(signals)
        self.interrupt = interrupt
        self.pending: list[int] = []
        self.received = 0
        self.on_signal: Callable[[], None] | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.pending.append(signum)
        self.received += 1
        if self.on_signal is not None:
            self.on_signal()
        if self.interrupt and self.received == 1:
            raise KeyboardInterrupt

    def take(self) -> int | None:
        """The oldest signal not yet taken, or None."""
        return self.pending.pop(0) if self.pending else None

    @contextlib.contextmanager
    def installed(self) -> Iterator[SignalBox]:
        for sig in self.signals:
            self._old[int(sig)] = signal.signal(sig, self._handle)
        try:
            yield self
        finally:
            for signum, old in self._old.items():
                signal.signal(signum, old)


def run_wait(client: Any, coro: Coroutine[Any, Any, T], what: str, grace: float) -> T:
    """Run a waiting call (``acquire --wait``, ``queue claim --wait``) under the signal
    policy: SIGINT or SIGTERM cancels it, which withdraws its waiter (the client's
    cancellation, given ``grace`` seconds: the command's --timeout), then exits 128 +
    the signal (130, 143) with one line on stderr."""
    with SignalBox(STOP_SIGNALS).installed() as box:
        result = run_until_signal(client, coro, box, grace)
        if box.pending:
            signum = box.take() or signal.SIGINT
            click.echo(
                f"raftlease: {signal.Signals(signum).name}: stopped waiting for {safe(what)}; "
                "the wait was withdrawn",
                err=True,
            )
            raise SystemExit(128 + signum)
    return result  # type: ignore[return-value]


def run_until_signal(
    client: Any, coro: Coroutine[Any, Any, T], box: SignalBox, grace: float | None = None
) -> T | None:
    """Run ``coro`` on the blocking client's loop; None if a signal arrived first (the
    coroutine is then cancelled and has finished its cleanup, e.g. withdrawn a queued
    acquire, before this returns; the cleanup gets ``grace`` seconds, by default the
    client's deadline, and a second signal cancels it at once). Blocks the calling
    (main) thread; raises what ``coro`` raises."""
    loop = client.portal.loop
    if grace is None:
        grace = float(getattr(client.aio, "deadline", 15.0))
    stop = asyncio.Event()
    running: list[asyncio.Future[T]] = []

    async def runner() -> T | None:
        task = asyncio.ensure_future(coro)
        running.append(task)
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.wait({task}, timeout=grace)
        task.cancel()  # no-op once done
        with contextlib.suppress(asyncio.CancelledError, RaftLeaseError):
            await task
        return None

    def wake() -> None:
        if stop.is_set():  # a second signal: stop the clean-up as well
            for task in running:
                task.cancel()
        stop.set()

    box.on_signal = lambda: loop.call_soon_threadsafe(wake)
    try:
        if box.pending:
            coro.close()
            return None
        return client.portal.run(runner())  # type: ignore[no-any-return]
    finally:
        box.on_signal = None
