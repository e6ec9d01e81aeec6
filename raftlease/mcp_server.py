"""``raftlease mcp``: the lease service as Model Context Protocol tools, over stdio.

An LLM agent (or any MCP host) starts ``raftlease mcp`` as a subprocess and gets tools
to claim keys, keep and release them, see who holds what and check fencing tokens.
Built on the official ``mcp`` SDK (``MCPServer``, stdio transport) and the asyncio
client (``AsyncClient``); every request goes through the cluster's native protocol,
so the cluster's validation and permissions apply exactly as for any other client.

Lifetime (the rule the whole module is built around): the claims of one MCP session
are attached to ONE lease session (``raftlease.recipes.sessions``) that this process
keeps alive every ``session_ttl / 3``. The lease session lives exactly as long as the
MCP session: when the host closes our stdin (end of the MCP session) the server
closes the lease session, which releases every claim at once; when the process dies
or hangs instead, the keep-alives stop and the cluster releases every claim after
``session_ttl``. Nothing is ever held forever by a dead agent. A lease session that
is lost while the MCP session goes on (keep-alives failed for a whole TTL) loses its
claims; they are reported in the next tool result (``lost_claims``) and as a log
message to the client, and the next ``claim`` opens a new lease session.

Threads: everything runs on the one asyncio event loop of the MCP server (anyio's
asyncio backend); tools run concurrently, one task per request. A tool call that the
client cancels is cancelled like an ``AsyncClient`` call (a waiting claim leaves the
key's queue). Errors: a tool never raises anything but ``ToolError``, whose text is a
JSON object ``{"code", "message", "definite"}`` with the cluster's wire code (or
``INVALID_ARGUMENT`` for arguments refused here); an unexpected exception is reported
by the SDK as a generic tool error and never ends the server.

Tools refuse what they cannot honour: every input schema is strict (an unknown
argument is refused, naming it and the accepted ones, never ignored), with the bounds
this server applies; an argument the schema refuses is reported in a short text for a
model (what is wrong, what is accepted), never pydantic's. Every tool has behaviour
hints and a typed output schema; the text content carries the same object.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import os
import re
import signal
import ssl
import time
import warnings
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, NotRequired, cast, get_args

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.types import (
    CallToolResult,
    EmptyResult,
    InputRequiredResult,
    LoggingLevel,
    SetLevelRequestParams,
    ToolAnnotations,
)
from pydantic import (
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    with_config,
)

# typing.TypedDict is not read by pydantic below Python 3.12 (nested in a result).
from typing_extensions import TypedDict

from ._version import __version__
from .client.aio import AsyncClient
from .client.aio_queue import AsyncTask
from .client.budgets import Reservation
from .client.effects import AsyncEffect
from .errors import RaftLeaseError
from .limits import (
    MAX_BUDGET_AMOUNT,
    MAX_CAPACITY,
    MAX_EFFECT_ID_BYTES,
    MAX_EFFECT_KEY_BYTES,
    MAX_EFFECT_RESULT_BYTES,
    MAX_ID_CHARS,
    MAX_KEY_BYTES,
    MAX_MANY_KEYS,
    MAX_QUEUE_NAME_BYTES,
    MAX_TASK_BACKOFF_MS,
    MAX_TASK_CAP_BYTES,
    MAX_TASK_CAPABILITIES,
    MAX_TASK_CHECKPOINT_BYTES,
    MAX_TASK_ERROR_BYTES,
    MAX_TASK_PARENTS,
    MAX_TASK_PAYLOAD_BYTES,
    MAX_TASK_RESULT_BYTES,
    MAX_VALUE_BYTES,
)
from .models import Holder, Lease, LeaseSet
from .operations import MAX_PRIORITY
from .recipes.sessions import AsyncSession

log = logging.getLogger("raftlease.mcp")

# ------------------------------------------------------------------ arguments
#
# Every tool's input schema is strict (``additionalProperties: false``: an argument
# the tool does not know is refused, never ignored), and its types too: no "12" -> 12,
# no true -> 1; a model's sloppy argument is refused, not guessed. Bounds are those
# this server applies. Strings are bounded twice: ``maxLength`` in the schema counts
# characters (JSON Schema cannot count bytes), and the tool refuses more UTF-8 bytes
# than the cluster takes; a limit in bytes is written so in each description.

#: Longest wait a claim or take_task may ask for (an agent that needs longer asks again).
MAX_WAIT = 3600.0
#: Most units a claim may take, and the largest capacity it may name (the server's).
MAX_UNITS = MAX_CAPACITY
#: Most leases one list_claims with a prefix returns.
MAX_LIST_LIMIT = 1000
#: Longest retry_after a fail_task may ask for (the queues' longest backoff).
MAX_RETRY_AFTER = MAX_TASK_BACKOFF_MS / 1000.0
#: Largest fencing token (tokens are signed 64-bit integers on the wire).
MAX_TOKEN = 2**63 - 1
#: Largest progress number the cluster records.
MAX_PROGRESS = float(2**62)
#: No NUL anywhere (both JSON Schema's ECMA-262 regexes and pydantic's read ``\x00``).
_NO_NUL = r"^[^\x00]*$"

Key = Annotated[
    StrictStr,
    Field(
        min_length=1,
        max_length=MAX_KEY_BYTES,
        pattern=_NO_NUL,
        description=(
            f"The lease key, e.g. gpus/node-4 or task/17: 1 to {MAX_KEY_BYTES} UTF-8 bytes, "
            "no NUL (the cluster's max_key_bytes, 512 by default, may be lower)."
        ),
    ),
]
BudgetKey = Annotated[
    StrictStr,
    Field(
        min_length=1,
        max_length=MAX_KEY_BYTES,
        pattern=_NO_NUL,
        description=(
            f"The budget's key, e.g. llm/tokens-per-minute: 1 to {MAX_KEY_BYTES} UTF-8 "
            "bytes, no NUL (an operator defines it with raftlease budget set)."
        ),
    ),
]
TaskId = Annotated[
    StrictStr,
    Field(
        min_length=1,
        max_length=MAX_ID_CHARS,
        description="A task_id returned by take_task in this MCP session.",
    ),
]
_CapName = Annotated[StrictStr, Field(min_length=1, max_length=MAX_TASK_CAP_BYTES)]
_CapValue = Annotated[StrictStr, Field(max_length=MAX_TASK_CAP_BYTES)]


ClaimWait = Annotated[
    StrictFloat,
    Field(
        ge=0,
        le=MAX_WAIT,
        allow_inf_nan=False,
        description=(
            f"Seconds to wait in the key's fair queue while someone else holds it, 0 to "
            f"{MAX_WAIT:g} (default 0: answer LEASE_HELD at once)."
        ),
    ),
]
TaskWait = Annotated[
    StrictFloat,
    Field(
        ge=0,
        le=MAX_WAIT,
        allow_inf_nan=False,
        description=(
            f"Seconds to wait for a task to become ready in the queue, 0 to {MAX_WAIT:g} "
            "(default 0: answer at once, with task null if none is ready)."
        ),
    ),
]
RetryAfter = Annotated[StrictFloat, Field(ge=0, le=MAX_RETRY_AFTER, allow_inf_nan=False)]

# The effect tools (begin_effect, commit_effect): under a task or a claim.
_TaskOrNone = Annotated[
    Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID_CHARS)] | None,
    Field(description="A task_id taken with take_task (give this or key, not both)."),
]
_KeyOrNone = Annotated[
    Annotated[StrictStr, Field(min_length=1, max_length=MAX_KEY_BYTES, pattern=_NO_NUL)] | None,
    Field(description="A key this session claimed (give this or task_id, not both)."),
]
_EffectId = Annotated[
    StrictStr,
    Field(
        min_length=1,
        max_length=MAX_EFFECT_ID_BYTES,
        pattern=_NO_NUL,
        description=(
            "The effect's id, e.g. charge:order-17: unique within the task (or the key), "
            f"1 to {MAX_EFFECT_ID_BYTES} UTF-8 bytes; the next holder uses the same id."
        ),
    ),
]

#: Arguments the SDK may receive as JSON text (hosts that send every object as a
#: string): only where a string can never be valid, so no string is reinterpreted.
_OBJECT_ARGUMENTS = frozenset({"capabilities"})
#: Units named in error messages.
_UNIT = {"wait": " seconds", "retry_after": " seconds"}
#: What to say about an unknown argument a model is likely to try.
_UNKNOWN_HINT = {
    "ttl": (
        "claims have no ttl of their own: they last as long as this MCP session (kept "
        "alive automatically, released when it ends)"
    ),
    "timeout": "the time to wait is 'wait', in seconds",
    "lease_id": "claims are named by their key; lease ids are never shown",
}


# ------------------------------------------------------------------ results
#
# Every tool has a typed output schema (structured content with named fields,
# additionalProperties false); the text content carries the same JSON object.


@with_config(ConfigDict(extra="forbid"))
class LostClaim(TypedDict):
    """A claim or a taken task lost since the previous tool result: stop using it."""

    key: NotRequired[Annotated[str, Field(description="The key of a lost claim.")]]
    queue: NotRequired[Annotated[str, Field(description="The queue of a lost task.")]]
    task_id: NotRequired[Annotated[str, Field(description="The id of a lost task.")]]
    token: Annotated[int, Field(description="Its fencing token, no longer current.")]
    reason: Annotated[str, Field(description="Why it was lost.")]


_LostClaims = Annotated[
    list[LostClaim],
    Field(description="Claims and tasks lost since the previous call (reported once)."),
]
_Token = Annotated[int, Field(description="The fencing token: pass it to the protected resource.")]
_ValidFor = Annotated[
    float, Field(description="Seconds this server still trusts it (kept alive automatically).")
]
_UnitIndices = Annotated[
    list[int],
    Field(description="Which units of a pool of capacity 2..1024 it holds (e.g. GPU indices)."),
]


@with_config(ConfigDict(extra="forbid"))
class ClaimView(TypedDict):
    """One claim this session holds."""

    key: str
    owner: Annotated[str, Field(description="The owner label readers see.")]
    token: _Token
    valid_for: _ValidFor
    units: Annotated[int, Field(description="Units of the key's capacity it holds.")]
    unit_indices: NotRequired[_UnitIndices]


@with_config(ConfigDict(extra="forbid"))
class ClaimResult(TypedDict):
    """The claim (a new one, or the one this session already held)."""

    key: str
    owner: Annotated[str, Field(description="The owner label readers see.")]
    token: _Token
    valid_for: _ValidFor
    units: Annotated[int, Field(description="Units of the key's capacity it holds.")]
    unit_indices: NotRequired[_UnitIndices]
    already_held: NotRequired[
        Annotated[bool, Field(description="True: this session held it already, same units.")]
    ]
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class RenewResult(TypedDict):
    """With `key`: that claim's fields. Without: `claims`, every claim still held."""

    key: NotRequired[str]
    owner: NotRequired[str]
    token: NotRequired[_Token]
    valid_for: NotRequired[_ValidFor]
    units: NotRequired[int]
    unit_indices: NotRequired[_UnitIndices]
    claims: NotRequired[
        Annotated[list[ClaimView], Field(description="Without key: each claim still held.")]
    ]
    yield_requested: NotRequired[_YieldRequested]
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class YieldRequest(TypedDict):
    key: str
    token: Annotated[int, Field(description="The asked claim's fencing token.")]
    seconds_left: Annotated[
        float, Field(description="About how long until the cluster ends the claim itself.")
    ]
    by: Annotated[str, Field(description="Who asked (their label).")]


_YieldRequested = Annotated[
    list[YieldRequest],
    Field(
        description=(
            "Claims someone with a higher priority asks this session to give up: finish "
            "or checkpoint and release them before seconds_left runs out, when the "
            "cluster ends them itself."
        )
    ),
]


@with_config(ConfigDict(extra="forbid"))
class ClaimManyResult(TypedDict):
    """Every key of the set, claimed together (all or none)."""

    claims: Annotated[list[ClaimView], Field(description="One claim per key, in order.")]
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class RequestYieldResult(TypedDict):
    key: str
    asked: Annotated[int, Field(description="Holders asked to yield.")]
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class ReleaseResult(TypedDict):
    key: str
    token: Annotated[int, Field(description="The released claim's fencing token.")]
    released: Annotated[bool, Field(description="Always true (a failure is a tool error).")]
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class ReleaseFailure(TypedDict):
    key: str
    code: Annotated[str, Field(description="The cluster's error code.")]
    definite: Annotated[bool, Field(description="False: the release may have happened.")]


@with_config(ConfigDict(extra="forbid"))
class ReleaseAllResult(TypedDict):
    released: Annotated[list[str], Field(description="The keys released.")]
    failed: NotRequired[
        Annotated[list[ReleaseFailure], Field(description="Claims that could not be released.")]
    ]
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class LeaseView(TypedDict):
    """A live lease (anyone's). Never its lease id."""

    key: str
    owner: str
    token: Annotated[int, Field(description="Its fencing token.")]
    remaining: Annotated[float, Field(description="Seconds until it expires if not renewed.")]
    units: int
    value: NotRequired[Annotated[str, Field(description="The value it publishes.")]]
    unit_indices: NotRequired[_UnitIndices]


@with_config(ConfigDict(extra="forbid"))
class HolderView(LeaseView):
    """A holder of the key, and whether it is this session's own claim. Never its
    lease id."""

    mine: Annotated[bool, Field(description="True for this session's own claim.")]


@with_config(ConfigDict(extra="forbid"))
class WhoHoldsResult(TypedDict):
    key: str
    held: Annotated[bool, Field(description="False: nobody holds it.")]
    holders: list[HolderView]
    capacity: NotRequired[Annotated[int, Field(description="A shared key's capacity.")]]
    used: NotRequired[Annotated[int, Field(description="Units of a shared key in use.")]]
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class ListClaimsResult(TypedDict):
    """Without `prefix`: `claims` and `session_valid_for`. With it: `prefix`, `leases`."""

    claims: NotRequired[
        Annotated[list[ClaimView], Field(description="This session's claims, each checked.")]
    ]
    session_valid_for: NotRequired[
        Annotated[float, Field(description="Seconds the lease session is trusted for.")]
    ]
    prefix: NotRequired[str]
    leases: NotRequired[
        Annotated[list[LeaseView], Field(description="Every live lease under prefix.")]
    ]
    yield_requested: NotRequired[_YieldRequested]
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class SpendResult(TypedDict):
    key: str
    amount: Annotated[int, Field(description="The units drawn.")]
    granted: Annotated[bool, Field(description="Always true: a refusal is a tool error.")]
    level: NotRequired[
        Annotated[float, Field(description="The budget's level right after (units).")]
    ]
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class ReserveResult(TypedDict):
    key: str
    amount: Annotated[int, Field(description="The units reserved (drawn now).")]
    reservation_id: Annotated[
        str, Field(description="Pass it to settle_budget with the actual cost.")
    ]
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class SettleResult(TypedDict):
    key: str
    reserved: Annotated[int, Field(description="The units that were reserved.")]
    actual: Annotated[int, Field(description="The actual cost recorded.")]
    level: Annotated[
        float, Field(description="The budget's level right after (units; negative: debt).")
    ]
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class CheckTokenResult(TypedDict):
    key: str
    token: int
    current: Annotated[bool, Field(description="Is it the fencing token of a current holder?")]
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class AuditResult(TypedDict):
    records: Annotated[
        list[list[int | str]],
        Field(
            description=(
                "[seq, log time (ms), type, key, token, owner, principal, by, revision], "
                "oldest first (docs/audit.md): `principal` holds the lease, `by` made the change."
            )
        ),
    ]
    base: Annotated[str, Field(description="The chain value before the oldest record kept.")]
    head: Annotated[str, Field(description="The chain value after the newest record.")]
    first: Annotated[int, Field(description="The oldest kept record's seq.")]
    applied_index: Annotated[int, Field(description="The answering node's applied index.")]
    node: Annotated[str, Field(description="The answering node's id.")]
    lost_claims: NotRequired[_LostClaims]


_AttemptToken = Annotated[int, Field(description="The attempt's fencing token.")]


@with_config(ConfigDict(extra="forbid"))
class TakeTaskResult(TypedDict):
    """A task taken, or `task: null` when none was ready."""

    queue: str
    task: NotRequired[Annotated[None, Field(description="Present (null) when none was ready.")]]
    task_id: NotRequired[str]
    token: NotRequired[_AttemptToken]
    attempt: NotRequired[Annotated[int, Field(description="Which attempt this is (1 first).")]]
    valid_for: NotRequired[_ValidFor]
    payload: NotRequired[Annotated[Any, Field(description="The task's payload, a JSON value.")]]
    checkpoint: NotRequired[
        Annotated[
            str,
            Field(
                description="The checkpoint an earlier attempt saved with heartbeat (resume "
                "from it), as UTF-8 text."
            ),
        ]
    ]
    checkpoint_base64: NotRequired[
        Annotated[str, Field(description="That checkpoint, base64, when it is not UTF-8 text.")]
    ]
    checkpoint_attempt: NotRequired[
        Annotated[int, Field(description="The attempt that saved the checkpoint.")]
    ]
    parent_results: NotRequired[
        Annotated[
            dict[str, Any],
            Field(
                description="The results of the tasks this one was put after (put_task's "
                "`after`), by task id."
            ),
        ]
    ]
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class TaskResult(TypedDict):
    """The taken task, still this session's."""

    queue: str
    task_id: str
    token: _AttemptToken
    attempt: Annotated[int, Field(description="Which attempt this is (1 first).")]
    valid_for: _ValidFor
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class CompleteResult(TypedDict):
    queue: str
    task_id: str
    token: _AttemptToken
    completed: Annotated[bool, Field(description="Always true (a failure is a tool error).")]
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class FailResult(TypedDict):
    queue: str
    task_id: str
    token: _AttemptToken
    failed: Annotated[bool, Field(description="Always true (a failure is a tool error).")]
    lost_claims: NotRequired[_LostClaims]


_EffectToken = Annotated[
    int, Field(description="The fencing token that holds (or committed) the effect's intent.")
]


@with_config(ConfigDict(extra="forbid"))
class EffectResult(TypedDict):
    """An effect begun or committed under a taken task or a claim (docs/mcp.md)."""

    effect: str
    state: Annotated[
        str,
        Field(
            description="new: make the call now, then commit_effect; committed: it was made "
            "(skip the call, `result` is its result); in_progress: an earlier holder began "
            "it and did not commit (ask the provider with `idempotency_key` whether it was "
            "made: commit_effect with what it says, or make the call)."
        ),
    ]
    idempotency_key: NotRequired[
        Annotated[
            str,
            Field(
                description="begin_effect: hand this to the provider (the same for every holder)."
            ),
        ]
    ]
    token: _EffectToken
    task_id: NotRequired[str]
    key: NotRequired[str]
    result: NotRequired[Annotated[Any, Field(description="The committed result, a JSON value.")]]
    already: NotRequired[
        Annotated[bool, Field(description="commit_effect: it had been committed before.")]
    ]
    prior_token: NotRequired[
        Annotated[int, Field(description="in_progress: the earlier holder's token.")]
    ]
    prior_attempt: NotRequired[
        Annotated[int, Field(description="in_progress under a task: the earlier attempt.")]
    ]
    lost_claims: NotRequired[_LostClaims]


@with_config(ConfigDict(extra="forbid"))
class PutTaskResult(TypedDict):
    queue: str
    task_id: Annotated[str, Field(description="The task's id (to name it in `after`).")]
    lost_claims: NotRequired[_LostClaims]


@dataclass(frozen=True)
class McpOptions:
    """How ``raftlease mcp`` reaches the cluster and keeps its claims.

    ``token``/``tls`` are the CLI's credentials (``RAFTLEASE_AUTH_TOKEN`` or
    ``RAFTLEASE_TOKEN``, ``RAFTLEASE_CA_FILE`` / ``RAFTLEASE_TLS``, a client
    certificate from ``RAFTLEASE_CERT_FILE`` / ``RAFTLEASE_KEY_FILE``); ``owner`` the label
    readers see; ``session_ttl`` how long the claims outlive a dead MCP server."""

    endpoints: list[str]
    owner: str
    session_ttl: float = 15.0
    token: str | None = None
    tls: ssl.SSLContext | str | bool | None = None
    deadline: float = 15.0


def _tool_error(code: str, message: str, definite: bool = True) -> ToolError:
    return ToolError(json.dumps({"code": code, "message": message, "definite": definite}))


#: Lease, session and attempt ids (the leader draws 128 random bits, 32 hex digits):
#: bearer capabilities, never shown to the model (docs/mcp.md).
_ID = re.compile(r"\b[0-9a-f]{32}\b")
#: Detail fields that carry such ids.
_ID_FIELDS = frozenset({"lease_id", "session", "session_id", "sid", "aid", "attempt"})


def _from_raftlease(exc: RaftLeaseError) -> ToolError:
    # The cluster's messages may name this agent's own lease session (a full session,
    # SESSION_NOT_FOUND, "not yours"): its id is what would let anyone who reads the
    # transcript keep the agent's claims alive after it died, or close them.
    message = _ID.sub("<id withheld>", exc.message)
    body: dict[str, Any] = {"code": exc.code, "message": message, "definite": exc.definite}
    # A LEASE_HELD detail says who holds it; nothing in a detail is a capability.
    if exc.detail:
        body["detail"] = {k: v for k, v in exc.detail.items() if k not in _ID_FIELDS}
    return ToolError(json.dumps(body, default=str))


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise _tool_error("INVALID_ARGUMENT", "key must be a non-empty string")
    _check_bytes("key", key, MAX_KEY_BYTES)
    if "\x00" in key:
        raise _tool_error("INVALID_ARGUMENT", "key must not contain the NUL character")
    return key


def _check_seconds(name: str, value: float, high: float) -> float:
    if isinstance(value, bool) or not math.isfinite(value) or value < 0 or value > high:
        raise _tool_error("INVALID_ARGUMENT", f"{name} must be between 0 and {high:g} seconds")
    return float(value)


def _check_units(name: str, value: int, low: int) -> int:
    """A whole number of budget units from ``low`` to ``MAX_BUDGET_AMOUNT`` (the
    schema says so too; this holds for callers that skip it)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not low <= value <= MAX_BUDGET_AMOUNT
    ):
        raise _tool_error("INVALID_ARGUMENT", f"{name} must be {low} to {MAX_BUDGET_AMOUNT}")
    return value


def _check_bytes(name: str, value: str, most: int) -> str:
    """The byte limits the schema cannot state (its maxLength counts characters)."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise _tool_error("INVALID_ARGUMENT", f"{name} is not valid UTF-8 text") from None
    if size > most:
        raise _tool_error(
            "INVALID_ARGUMENT",
            f"{name} is {size} UTF-8 bytes; at most {most} are accepted: shorten it",
        )
    return value


def _check_count(name: str, value: int, high: int = MAX_UNITS) -> int:
    if isinstance(value, bool) or not 1 <= value <= high:
        raise _tool_error("INVALID_ARGUMENT", f"{name} must be an integer from 1 to {high}")
    return value


def _units_of(lease: Lease | Holder) -> list[int] | None:
    """The unit indices a pool grant holds (``unit_indices``); None for a plain lock
    or a key too large to index."""
    return list(lease.unit_indices) if lease.unit_indices else None


def _holder_view(holder: Holder) -> dict[str, Any]:
    view: dict[str, Any] = {
        "key": holder.key,
        "owner": holder.owner,
        "token": holder.token,
        "remaining": round(holder.remaining, 3),
        "units": holder.units,
    }
    if holder.value:
        view["value"] = holder.value
    if (indices := _units_of(holder)) is not None:
        view["unit_indices"] = indices
    return view


class ClaimBook:
    """The claims of one MCP session and the lease session that keeps them.

    One instance per ``raftlease mcp`` process (one MCP session over stdio). All
    methods run on the server's event loop; ``close`` is called once, at the end of
    the MCP session."""

    def __init__(self, options: McpOptions) -> None:
        self.options = options
        self.client = AsyncClient(
            options.endpoints, deadline=options.deadline, token=options.token, tls=options.tls
        )
        self.session: AsyncSession | None = None
        self.claims: dict[str, Lease] = {}
        #: Keys with a claim in flight (a second claim of the same key is refused).
        self._claiming: set[str] = set()
        #: Claims lost since the last tool result, reported (once) in the next one.
        self._lost: list[dict[str, Any]] = []
        #: Task attempts taken from queues by this session, by task id.
        self.tasks: dict[str, AsyncTask] = {}
        #: Tools run concurrently: two first claims must not open two lease sessions.
        self._opening = asyncio.Lock()
        #: Closing lease sessions given up as lost (see ``_collect_session_loss``).
        self._closing: set[asyncio.Task[None]] = set()
        #: Budget reservations made by this session and not yet settled, by id: only
        #: they can be settled here (a reservation id is a capability).
        self.reservations: dict[str, Reservation] = {}
        #: The capacity each claim was made with (a Lease does not carry it).
        self._capacity: dict[str, int] = {}
        #: The least severe log level the client takes (``logging/setLevel``).
        self.log_level = "debug"
        #: Sets of keys claimed together (``claim_many``), by the set's id: the set
        #: and the task keeping it alive (its own lease session's keep-alive).
        self.sets: dict[str, tuple[LeaseSet, asyncio.Task[None]]] = {}
        #: Yield requests learnt from keep-alive answers, by the asked claim's token:
        #: (key, deadline on this host's monotonic clock, asker).
        self._yields: dict[int, tuple[str, float, str]] = {}

    def set_log_level(self, level: str) -> None:
        self.log_level = level

    # ------------------------------------------------------------- lifetime

    async def _live_session(self) -> AsyncSession:
        """The lease session, opened on first use and opened anew after a loss."""
        async with self._opening:
            self._collect_session_loss()
            if self.session is None:
                session = self.client.session(
                    owner=self.options.owner,
                    ttl=self.options.session_ttl,
                    on_yield_requested=self._asked_to_yield,
                )
                try:
                    await session.open()
                except RaftLeaseError as exc:
                    raise _from_raftlease(exc) from None
                self.session = session
                log.info("lease session %s opened", session.session_id[:8])
            return self.session

    def _collect_session_loss(self) -> None:
        """Move the claims of a lost lease session to the lost list."""
        session = self.session
        if session is None or session.valid:
            return
        reason = session.lost_reason or "session no longer valid"
        for key, lease in sorted(self.claims.items()):
            if lease.session is session:
                self._lose(key, lease, f"lease session lost: {reason}")
        for task_id, task in sorted(self.tasks.items()):
            if task.session == session.session_id:
                self._lose_task(task_id, task, f"lease session lost: {reason}")
        self.session = None
        # Reported lost, so it must end: a late keep-alive answer could otherwise
        # revive it (and its claims) behind our back. Stop its keep-alive and close
        # it on the cluster, in the background (the cluster may be unreachable).
        closing = asyncio.get_running_loop().create_task(session.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    def _lose(self, key: str, lease: Lease, reason: str) -> None:
        self.claims.pop(key, None)
        self._lost.append({"key": key, "token": lease.token, "reason": reason})
        log.warning("claim of %r (token %d) lost: %s", key, lease.token, reason)

    def _lose_task(self, task_id: str, task: AsyncTask, reason: str) -> None:
        self.tasks.pop(task_id, None)
        self._lost.append(
            {"queue": task.queue, "task_id": task_id, "token": task.token, "reason": reason}
        )
        log.warning("task %s (token %d) lost: %s", task_id, task.token, reason)

    def _asked_to_yield(self, requests: list[dict[str, Any]]) -> None:
        """The lease session's keep-alive answer names claims asked to yield
        (``request_yield``): kept for the next ``renew``/``list_claims`` answer."""
        for one in requests:
            # Log-time ms until the deadline as of the keep-alive answer, counted on
            # our clock from now: an estimate (the cluster's deadline is what counts).
            now = one.get("now")
            deadline = int(one["deadline"])
            left = (deadline - int(now)) / 1000.0 if isinstance(now, int) else 0.0
            self._yields[int(one["token"])] = (
                str(one["key"]),
                time.monotonic() + left,
                str(one.get("by", "")),
            )

    def _yield_views(self) -> list[dict[str, Any]]:
        """The yield requests of claims still held, with the seconds left."""
        now = time.monotonic()
        held = {lease.token: key for key, lease in self.claims.items()}
        return [
            {"key": key, "token": token, "seconds_left": round(max(0.0, at - now), 3), "by": by}
            for token, (key, at, by) in sorted(self._yields.items())
            if held.get(token) == key
        ]

    async def close(self) -> None:
        """End of the MCP session: close the lease session (releasing every claim at
        once and giving every taken task back; if the cluster cannot be reached they
        expire after the session TTL) and the client. Never raises a cluster error."""
        session, self.session = self.session, None
        self.claims.clear()
        self.tasks.clear()
        sets, self.sets = list(self.sets.values()), {}
        try:
            for lease_set, keeper in sets:
                keeper.cancel()
                with contextlib.suppress(RaftLeaseError):
                    await self.client.release_many(lease_set, timeout=5.0)
            if session is not None:
                await session.close()
            if self._closing:
                await asyncio.gather(*self._closing, return_exceptions=True)
        finally:
            await self.client.close()

    # ------------------------------------------------------------- results

    def _claim_view(self, lease: Lease) -> dict[str, Any]:
        view: dict[str, Any] = {
            "key": lease.key,
            "owner": lease.owner,
            "token": lease.token,
            "valid_for": round(lease.remaining, 3),
            "units": lease.units,
        }
        if (indices := _units_of(lease)) is not None:
            view["unit_indices"] = indices
        return view

    async def result(self, ctx: Context | None, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` plus the claims lost since the last result (also sent as a log
        message where the client takes them)."""
        self._collect_session_loss()
        if self._lost:
            lost, self._lost = self._lost, []
            body["lost_claims"] = lost
            if ctx is not None and _LOG_LEVELS.index(self.log_level) <= _LOG_LEVELS.index(
                "warning"
            ):
                await _notify_lost(ctx, lost)
        return body

    # ------------------------------------------------------------- tools

    async def claim(
        self, key: str, wait: float, units: int, capacity: int, value: str | None
    ) -> dict[str, Any]:
        _check_key(key)
        wait = _check_seconds("wait", wait, MAX_WAIT)
        capacity = _check_count("capacity", capacity)
        units = _check_count("units", units, capacity)
        if value is not None:
            _check_bytes("value", value, MAX_VALUE_BYTES)
        self._collect_session_loss()
        held = self.claims.get(key)
        if held is not None and held.valid:
            return {**self._claim_view(held), **self._same_claim(key, held, units, capacity, value)}
        if key in self._claiming:
            raise _tool_error("INVALID_ARGUMENT", f"a claim of {key!r} is already in progress")
        self._claiming.add(key)
        try:
            session = await self._live_session()
            try:
                lease = await session.acquire(
                    key, wait=wait, units=units, capacity=capacity, value=value
                )
            except RaftLeaseError as exc:
                raise _from_raftlease(exc) from None
            self.claims[key] = lease
            self._capacity[key] = capacity
            return self._claim_view(lease)
        finally:
            self._claiming.discard(key)

    def _same_claim(
        self, key: str, held: Lease, units: int, capacity: int, value: str | None
    ) -> dict[str, Any]:
        """A claim of a key this session holds: the held claim if it is the one asked
        for, else a definite error saying what is held and how to change it (units are
        never changed in place, so a silent ``already_held`` would leave the model
        believing it holds what it asked for)."""
        had = self._capacity.get(key, 1)
        if (held.units, had) != (units, capacity):
            raise _tool_error(
                "INVALID_ARGUMENT",
                f"this session already holds {key!r} with {held.units} of {had} units "
                f"(token {held.token}), not {units} of {capacity}; to change that, release "
                f"{key!r} and claim it again, or claim with units={held.units} and "
                f"capacity={had} to get the claim it holds",
            )
        if value is not None and value != held.value:
            raise _tool_error(
                "INVALID_ARGUMENT",
                f"this session already holds {key!r} (token {held.token}) publishing another "
                f"value; to publish this one, release {key!r} and claim it again",
            )
        return {"already_held": True}

    async def _verify(self, key: str, lease: Lease) -> bool:
        """Is our claim of ``key`` still the cluster's (not revoked or expired)?"""
        try:
            current = await self.client.fence(key, lease.token)
        except RaftLeaseError as exc:
            raise _from_raftlease(exc) from None
        if not current:
            self._lose(key, lease, "no longer held (revoked or expired)")
        return current

    async def renew(self, key: str | None) -> dict[str, Any]:
        """A keep-alive of the lease session now, then the claim(s) it keeps."""
        if key is not None:
            _check_key(key)
            if key not in self.claims:
                self._collect_session_loss()
                raise _tool_error(
                    "LEASE_NOT_FOUND",
                    f"this session holds no claim of {key!r} (list_claims shows what it holds)",
                )
        self._collect_session_loss()
        session = self.session
        if session is None:
            if key is not None:
                raise _tool_error(
                    "LEASE_NOT_FOUND",
                    f"this session holds no claim of {key!r} (list_claims shows what it holds)",
                )
            return {"claims": []}
        try:
            await session.keepalive()
        except RaftLeaseError as exc:
            # Gone on the cluster (or out of validity): its claims are lost now.
            if session.renew_failed(exc):
                self._collect_session_loss()
            raise _from_raftlease(exc) from None
        keys = [key] if key is not None else sorted(self.claims)
        views = []
        for name in keys:
            lease = self.claims.get(name)
            if lease is not None and await self._verify(name, lease):
                views.append(self._claim_view(lease))
        asked = [y for y in self._yield_views() if key is None or y["key"] == key]
        if key is not None:
            if not views:
                raise _tool_error(
                    "LEASE_NOT_FOUND", f"the claim of {key!r} was lost: stop using it"
                )
            return {**views[0], **({"yield_requested": asked} if asked else {})}
        return {"claims": views, **({"yield_requested": asked} if asked else {})}

    async def release(self, key: str) -> dict[str, Any]:
        _check_key(key)
        self._collect_session_loss()
        lease = self.claims.get(key)
        if lease is None:
            raise _tool_error(
                "LEASE_NOT_FOUND",
                f"this session holds no claim of {key!r} (list_claims shows what it holds)",
            )
        try:
            await self.client.release(lease)
        except RaftLeaseError as exc:
            if exc.definite:
                # Gone already (expired, revoked): it is not ours any more either way.
                self._lose(key, lease, f"already gone at release ({exc.code})")
            raise _from_raftlease(exc) from None
        self.claims.pop(key, None)
        return {"key": key, "token": lease.token, "released": True}

    async def release_all(self) -> dict[str, Any]:
        self._collect_session_loss()
        released, failed = [], []
        for key, lease in sorted(self.claims.items()):
            try:
                await self.client.release(lease)
                released.append(key)
            except RaftLeaseError as exc:
                failed.append({"key": key, "code": exc.code, "definite": exc.definite})
                if exc.definite:
                    self._lose(key, lease, f"already gone at release ({exc.code})")
                continue
            self.claims.pop(key, None)
        body: dict[str, Any] = {"released": released}
        if failed:
            body["failed"] = failed
        return body

    async def who_holds(self, key: str) -> dict[str, Any]:
        _check_key(key)
        try:
            read = await self.client.read(key)
        except RaftLeaseError as exc:
            raise _from_raftlease(exc) from None
        mine = self.claims.get(key)
        holders = []
        for holder in read.holders:
            view = _holder_view(holder)
            view["mine"] = mine is not None and mine.token == holder.token
            holders.append(view)
        body: dict[str, Any] = {"key": key, "held": bool(holders), "holders": holders}
        if read.capacity != 1:
            body.update(capacity=read.capacity, used=read.used)
        return body

    async def list_claims(self, prefix: str | None, limit: int) -> dict[str, Any]:
        """This session's claims (each checked with the cluster), or with ``prefix``
        every live lease under it."""
        self._collect_session_loss()
        if prefix is not None:
            _check_bytes("prefix", prefix, MAX_KEY_BYTES)
            limit = _check_count("limit", limit, MAX_LIST_LIMIT)
            try:
                holders = await self.client.leases(prefix, limit=limit)
            except RaftLeaseError as exc:
                raise _from_raftlease(exc) from None
            return {"prefix": prefix, "leases": [_holder_view(h) for h in holders]}
        views = []
        for key, lease in sorted(self.claims.items()):
            if await self._verify(key, lease):
                views.append(self._claim_view(lease))
        body: dict[str, Any] = {"claims": views}
        if self.session is not None:
            body["session_valid_for"] = round(self.session.remaining, 3)
        asked = self._yield_views()
        if asked:
            body["yield_requested"] = asked
        return body

    async def claim_many(self, keys: list[str], wait: float) -> dict[str, Any]:
        """Claim every key of ``keys`` together, all or none (``acquire_many``, waiting
        up to ``wait`` as one waiter on every key); the set lives by a lease session
        of its own, kept alive here, and its keys are claims like any other."""
        for key in keys:
            _check_key(key)
        wait = _check_seconds("wait", wait, MAX_WAIT)
        self._collect_session_loss()
        held = [key for key in keys if key in self.claims or key in self._claiming]
        if held:
            raise _tool_error(
                "INVALID_ARGUMENT",
                f"this session already holds (or is claiming) {held}: release them first",
            )
        self._claiming.update(keys)
        try:
            try:
                lease_set = await self.client.acquire_many(
                    keys, owner=self.options.owner, ttl=self.options.session_ttl, wait=wait
                )
            except RaftLeaseError as exc:
                raise _from_raftlease(exc) from None
            for lease in lease_set.leases:
                self.claims[lease.key] = lease
                self._capacity[lease.key] = 1
            keeper = asyncio.get_running_loop().create_task(self._keep_set(lease_set.lease_id))
            self.sets[lease_set.lease_id] = (lease_set, keeper)
            return {"claims": [self._claim_view(lease) for lease in lease_set.leases]}
        finally:
            self._claiming.difference_update(keys)

    async def _keep_set(self, lid: str) -> None:
        """Keep a claimed set alive (``renew_many`` every ttl / 3) while any of its
        keys is still claimed here; then close it. A set gone on the cluster loses
        its claims (reported once, as any lost claim)."""
        while True:
            lease_set, _task = self.sets[lid]
            await asyncio.sleep(max(0.05, lease_set.ttl / 3))
            mine = [k for k in lease_set.keys if self.claims.get(k) in lease_set.leases]
            if not mine:
                with contextlib.suppress(RaftLeaseError):
                    await self.client.release_many(lease_set, timeout=5.0)
                self.sets.pop(lid, None)
                return
            try:
                kept = await self.client.renew_many(lease_set)
            except RaftLeaseError as exc:
                if exc.definite:
                    for key in mine:
                        lease = self.claims.get(key)
                        if lease is not None:
                            self._lose(key, lease, f"its set is gone ({exc.code})")
                    self.sets.pop(lid, None)
                    return
                continue
            for lease in kept.leases:
                if lease.key in mine:
                    self.claims[lease.key] = lease
            self.sets[lid] = (kept, self.sets[lid][1])

    async def request_yield(self, key: str, deadline: float, priority: int) -> dict[str, Any]:
        """Ask the holders of ``key`` below ``priority`` to yield within ``deadline``
        seconds (``request_yield``); needs the preempt (or admin) permission."""
        _check_key(key)
        deadline = _check_seconds("deadline", deadline, MAX_WAIT)
        try:
            asked = await self.client.request_yield(
                key, deadline=deadline, priority=priority, owner=self.options.owner
            )
        except RaftLeaseError as exc:
            raise _from_raftlease(exc) from None
        return {"key": key, "asked": asked}

    # ------------------------------------------------------------- queues

    def _task_view(self, task: AsyncTask) -> dict[str, Any]:
        # An attempt attached to the lease session lives by its keep-alives.
        session = self.session
        attached = session is not None and task.session == session.session_id
        remaining = session.remaining if attached and session is not None else task.remaining
        return {
            "queue": task.queue,
            "task_id": task.task_id,
            "token": task.token,
            "attempt": task.attempt,
            "valid_for": round(remaining, 3),
        }

    def _task(self, task_id: str) -> AsyncTask:
        if not isinstance(task_id, str) or not task_id or len(task_id) > 128:
            raise _tool_error("INVALID_ARGUMENT", "task_id must be a task id from take_task")
        self._collect_session_loss()
        task = self.tasks.get(task_id)
        if task is None:
            raise _tool_error(
                "TASK_NOT_FOUND", f"this session holds no task {task_id!r}: take one with take_task"
            )
        return task

    async def take_task(
        self, queue: str, wait: float, capabilities: dict[str, str] | None
    ) -> dict[str, Any]:
        if not queue:
            raise _tool_error("INVALID_ARGUMENT", "queue must not be empty")
        _check_bytes("queue", queue, MAX_QUEUE_NAME_BYTES)
        wait = _check_seconds("wait", wait, MAX_WAIT)
        for name, offered in (capabilities or {}).items():
            _check_bytes("a capabilities name", name, MAX_TASK_CAP_BYTES)
            _check_bytes(f"capabilities[{name!r}]", offered, MAX_TASK_CAP_BYTES)
        session = await self._live_session()
        try:
            task = await self.client.queue(queue).claim(
                wait=wait, capabilities=capabilities, session=session
            )
        except RaftLeaseError as exc:
            raise _from_raftlease(exc) from None
        if task is None:
            return {"queue": queue, "task": None}
        self.tasks[task.task_id] = task
        out = {**self._task_view(task), "payload": task.payload}
        if task.checkpoint is not None:
            # Handed on from the attempt that saved it (docs/queues.md, "Checkpoints").
            try:
                out["checkpoint"] = task.checkpoint.decode("utf-8")
            except UnicodeDecodeError:
                out["checkpoint_base64"] = base64.b64encode(task.checkpoint).decode("ascii")
            out["checkpoint_attempt"] = task.checkpoint_attempt
        if task.parent_results:
            out["parent_results"] = dict(task.parent_results)
        return out

    async def put_task(
        self, queue: str, payload: Any, after: list[str] | None, priority: int
    ) -> dict[str, Any]:
        """Put a task in ``queue`` (after the tasks ``after`` names: docs/queues.md,
        "Dependencies"); its id."""
        if not queue:
            raise _tool_error("INVALID_ARGUMENT", "queue must not be empty")
        _check_bytes("queue", queue, MAX_QUEUE_NAME_BYTES)
        if after is not None:
            if len(after) > MAX_TASK_PARENTS:
                raise _tool_error(
                    "INVALID_ARGUMENT", f"after names at most {MAX_TASK_PARENTS} task ids"
                )
            for tid in after:
                if not isinstance(tid, str) or not tid or len(tid) > MAX_ID_CHARS:
                    raise _tool_error("INVALID_ARGUMENT", "after must hold task ids")
        try:
            text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise _tool_error("INVALID_ARGUMENT", f"payload must be a JSON value: {exc}") from None
        _check_bytes("payload (as JSON text)", text, MAX_TASK_PAYLOAD_BYTES)
        try:
            tid = await self.client.queue(queue).put(payload, after=after, priority=priority)
        except RaftLeaseError as exc:
            raise _from_raftlease(exc) from None
        return {"queue": queue, "task_id": tid}

    def _effect_of(
        self, effect: str, task_id: str | None, key: str | None, idempotency_key: str | None
    ) -> tuple[AsyncEffect, dict[str, Any]]:
        """The effect under the task attempt or the claim named (exactly one), and
        what the result names its holder by."""
        if (task_id is None) == (key is None):
            raise _tool_error(
                "INVALID_ARGUMENT",
                "name exactly one of task_id (a task taken with take_task) or key (a key "
                "this session claimed)",
            )
        if task_id is not None:
            task = self._task(task_id)
            return task.effect(effect, idempotency_key=idempotency_key), {"task_id": task_id}
        assert key is not None
        _check_key(key)
        self._collect_session_loss()
        lease = self.claims.get(key)
        if lease is None:
            raise _tool_error(
                "LEASE_NOT_FOUND",
                f"this session holds no claim of {key!r} (list_claims shows what it holds)",
            )
        return self.client.effect(lease, effect, idempotency_key=idempotency_key), {"key": key}

    async def effect(
        self,
        op: str,
        effect: str,
        task_id: str | None,
        key: str | None,
        idempotency_key: str | None = None,
        result: Any = None,
    ) -> dict[str, Any]:
        """Begin or commit (``op``) an effect under a taken task or a claim, through
        the clients' effect journal (client/effects.py; docs/mcp.md)."""
        if not effect:
            raise _tool_error("INVALID_ARGUMENT", "effect must not be empty")
        _check_bytes("effect", effect, MAX_EFFECT_ID_BYTES)
        if idempotency_key is not None:
            if not idempotency_key:
                raise _tool_error("INVALID_ARGUMENT", "idempotency_key must not be empty")
            _check_bytes("idempotency_key", idempotency_key, MAX_EFFECT_KEY_BYTES)
        if op == "commit":
            text = json.dumps(result, separators=(",", ":"), ensure_ascii=False)
            _check_bytes("result (as JSON text)", text, MAX_EFFECT_RESULT_BYTES)
        made, named = self._effect_of(effect, task_id, key, idempotency_key)
        try:
            if op == "begin":
                async with made:
                    pass  # entering records the intent; the agent makes the call
            else:
                await made.commit(result)
        except RaftLeaseError as exc:
            task = self.tasks.get(task_id) if task_id is not None else None
            if task is not None and task_id is not None and task.lost.is_set():
                self._lose_task(task_id, task, f"no longer current ({exc.code})")
            raise _from_raftlease(exc) from None
        out: dict[str, Any] = {
            "effect": effect,
            "state": made.state or "",
            "token": int(made.token or 0),
            **named,
        }
        if op == "begin":
            out["idempotency_key"] = made.key
            if made.prior_token is not None:
                out["prior_token"] = int(made.prior_token)
            if made.prior_attempt is not None:
                out["prior_attempt"] = int(made.prior_attempt)
        else:
            out["already"] = made.already
        if made.done:
            out["result"] = made.result
        return out

    async def heartbeat(
        self, task_id: str, progress: float | None, checkpoint: str | None = None
    ) -> dict[str, Any]:
        task = self._task(task_id)
        if progress is not None and not math.isfinite(progress):
            raise _tool_error("INVALID_ARGUMENT", "progress must be a finite number")
        saved = None
        if checkpoint is not None:
            _check_bytes("checkpoint", checkpoint, MAX_TASK_CHECKPOINT_BYTES)
            saved = checkpoint.encode("utf-8")
        try:
            await task.heartbeat(progress, checkpoint=saved)
        except RaftLeaseError as exc:
            if task.lost.is_set():
                self._lose_task(task_id, task, f"no longer current ({exc.code})")
            raise _from_raftlease(exc) from None
        return self._task_view(task)

    async def finish_task(
        self,
        task_id: str,
        how: str,
        result: Any = None,
        error: str = "",
        retry_after: float | None = None,
    ) -> dict[str, Any]:
        task = self._task(task_id)
        try:
            if how == "completed":
                await task.complete(result)
            else:
                _check_bytes("error", error, MAX_TASK_ERROR_BYTES)
                if retry_after is not None:
                    retry_after = _check_seconds("retry_after", retry_after, MAX_RETRY_AFTER)
                await task.fail(error, retry_after=retry_after)
        except RaftLeaseError as exc:
            if task.lost.is_set():
                self._lose_task(task_id, task, f"no longer current ({exc.code})")
            raise _from_raftlease(exc) from None
        self.tasks.pop(task_id, None)
        return {"queue": task.queue, "task_id": task_id, "token": task.token, how: True}

    async def spend_budget(self, key: str, amount: int, wait: float) -> dict[str, Any]:
        """Draw ``amount`` units from the shared budget ``key`` (docs/budgets.md),
        waiting up to ``wait`` seconds in its FIFO queue; a cancelled call withdraws
        the wait. Raises a tool error with the cluster's code (BUDGET_EXHAUSTED, ...)."""
        _check_key(key)
        _check_units("amount", amount, 1)
        wait = _check_seconds("wait", wait, MAX_WAIT)
        try:
            done = await self.client.spend(key, amount, wait=wait)
        except RaftLeaseError as exc:
            raise _from_raftlease(exc) from None
        body: dict[str, Any] = {"key": key, "amount": done.amount, "granted": True}
        if done.level is not None:
            body["level"] = done.level
        return body

    async def reserve_budget(
        self, key: str, amount: int, wait: float, ttl: float
    ) -> dict[str, Any]:
        """Reserve an estimate of ``amount`` units of the budget ``key`` (drawn now,
        waiting up to ``wait`` seconds as ``spend_budget``), kept by this session for
        ``settle_budget``; not settled within ``ttl`` seconds it is settled at
        ``amount``. A cancelled call withdraws the wait. Raises a tool error with the
        cluster's code (BUDGET_EXHAUSTED, ...)."""
        _check_key(key)
        _check_units("amount", amount, 1)
        wait = _check_seconds("wait", wait, MAX_WAIT)
        ttl = _check_seconds("ttl", ttl, MAX_WAIT)
        if ttl < 1:
            raise _tool_error("INVALID_ARGUMENT", f"ttl must be 1 to {MAX_WAIT:g} seconds")
        try:
            held = await self.client.reserve(key, amount, wait=wait, ttl=ttl)
        except RaftLeaseError as exc:
            raise _from_raftlease(exc) from None
        self.reservations[held.reservation_id] = held
        return {"key": key, "amount": held.amount, "reservation_id": held.reservation_id}

    async def settle_budget(self, reservation_id: str, actual: int) -> dict[str, Any]:
        """Record the ``actual`` cost of a reservation this session made: less than
        reserved returns the difference, more draws the extra (into debt). Raises a
        tool error RESERVATION_NOT_FOUND for an id this session does not hold (or one
        settled at its TTL meanwhile), or the cluster's code."""
        _check_units("actual", actual, 0)
        held = self.reservations.get(reservation_id)
        if held is None:
            raise _tool_error(
                "RESERVATION_NOT_FOUND",
                "this session holds no open reservation with that id (settled already, "
                "or never made here)",
            )
        try:
            done = await self.client.settle(held, actual)
        except RaftLeaseError as exc:
            if exc.code == "RESERVATION_NOT_FOUND":
                self.reservations.pop(reservation_id, None)  # past its TTL: settled
            raise _from_raftlease(exc) from None
        self.reservations.pop(reservation_id, None)
        return {
            "key": done.key,
            "reserved": done.reserved,
            "actual": done.actual,
            "level": done.level,
        }

    async def check_token(self, key: str, token: int) -> dict[str, Any]:
        _check_key(key)
        if isinstance(token, bool) or not 0 <= token < 2**63:
            raise _tool_error("INVALID_ARGUMENT", "token must be a non-negative integer")
        try:
            current = await self.client.fence(key, token)
        except RaftLeaseError as exc:
            raise _from_raftlease(exc) from None
        return {"key": key, "token": token, "current": current}

    async def audit(
        self, key: str | None, principal: str | None, since: int, limit: int
    ) -> dict[str, Any]:
        """The audit trail as the first endpoint that answers holds it (docs/audit.md),
        filtered like ``Client.audit``. Needs ``admin`` with auth (the cluster answers
        PERMISSION_DENIED otherwise); raises ``ToolError`` with the last node's error."""
        if key is not None:
            _check_key(key)
        last: RaftLeaseError | None = None
        for endpoint in self.options.endpoints:
            try:
                return await self.client.audit(
                    endpoint, key=key, principal=principal, since=since, limit=limit
                )
            except RaftLeaseError as exc:
                if exc.code in ("PERMISSION_DENIED", "UNAUTHENTICATED", "INVALID_ARGUMENT"):
                    raise _from_raftlease(exc) from None  # the same on every node
                last = exc
        assert last is not None  # endpoints is never empty
        raise _from_raftlease(last) from None


async def _notify_lost(ctx: Context, lost: list[dict[str, Any]]) -> None:
    """A warning log message to the client (MCP logging: deprecated by the newest
    protocol revision, still delivered to clients that take it). Best effort."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            await ctx.warning({"lost_claims": lost}, logger_name="raftlease")
    except Exception:  # a client that refuses log messages must not fail the call
        log.debug("could not send the lost-claims log message", exc_info=True)


# ------------------------------------------------------------------ refusals

#: The protocol's log levels, least severe first.
_LOG_LEVELS: tuple[str, ...] = get_args(LoggingLevel)

_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "dict_type": "an object mapping names to strings",
    "bool_type": "true or false",
    "finite_number": "a finite number",
    "list_type": "a list",
}
_RANGE_ERRORS = frozenset({"greater_than_equal", "less_than_equal", "greater_than", "less_than"})


def _shown(value: Any) -> str:
    """How a refused value is named in a message: numbers as they are, anything else
    by its JSON type (a string may be long, or carry what a transcript should not)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if abs(value) < 10**20 else f"{value:.6g}"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.6g}"
    for kind, name in ((str, "a string"), (dict, "an object"), (list, "an array")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _property(schema: dict[str, Any], name: str) -> dict[str, Any]:
    """The argument's schema, its non-null branch merged in (bounds live there)."""
    prop: dict[str, Any] = dict(schema.get("properties", {}).get(name, {}))
    for branch in prop.pop("anyOf", []):
        if branch.get("type") != "null":
            prop.update(branch)
    return prop


def _refusal(tool: str, schema: dict[str, Any], error: Mapping[str, Any]) -> str:
    """One refused argument, said for a model: what is wrong and what is accepted."""
    loc = [str(part) for part in error["loc"]]
    name = loc[0] if loc else "arguments"
    if "[key]" in loc:
        where = f"each name in {name}"
    elif len(loc) > 1:
        where = f"{name}[{loc[1]!r}]"
    else:
        where = name
    kind, given = error["type"], error.get("input")
    prop = _property(schema, name)
    unit = _UNIT.get(name, "")
    if kind == "extra_forbidden":
        accepted = ", ".join(schema.get("properties", {}))
        hint = f": {_UNKNOWN_HINT[name]}" if name in _UNKNOWN_HINT else ""
        takes = f"It accepts: {accepted}." if accepted else "It takes no arguments."
        return f"{tool} has no argument {name!r}{hint}. {takes}"
    if kind == "missing":
        return f"{name} is required."
    if kind in _RANGE_ERRORS and len(loc) == 1:
        low, high = _shown(prop.get("minimum")), _shown(prop.get("maximum"))
        return f"{where} must be from {low} to {high}{unit}, not {_shown(given)}."
    if kind == "string_too_short":
        return f"{where} must not be empty."
    if kind == "string_too_long":
        most = error.get("ctx", {}).get("max_length")
        return f"{where} is too long: at most {most} characters."
    if kind == "too_long":
        most = error.get("ctx", {}).get("max_length")
        return f"{where} has too many entries: at most {most}."
    if kind == "too_short":
        least = error.get("ctx", {}).get("min_length")
        return f"{where} has too few entries: at least {least}."
    if kind == "string_pattern_mismatch":
        return f"{where} must not contain the NUL character."
    if kind in _EXPECTED:
        expected = _EXPECTED[kind] + (f" of{unit}" if unit else "")
        return f"{where} must be {expected}, not {_shown(given)}."
    return f"{where}: {error['msg']}."


def _refused_arguments(tool: str, schema: dict[str, Any], exc: ValidationError) -> ToolError:
    """A schema violation as the tool error every refusal uses, never pydantic's text
    (its URL, its model names, the refused value echoed back)."""
    said: list[str] = []
    for error in exc.errors(include_url=False):
        text = _refusal(tool, schema, error)
        if text not in said:
            said.append(text)
    message = " ".join(said[:3]) + " Correct the arguments and call again."
    return ToolError(
        f"Error executing tool {tool}: "
        + json.dumps({"code": "INVALID_ARGUMENT", "message": message, "definite": True})
    )


class _ArgumentsAsGiven(FuncMetadata):
    """The SDK's argument handling, except that a string is reinterpreted as JSON only
    for an object argument (``_OBJECT_ARGUMENTS``): a value, prefix or result that
    happens to read as JSON ("null", "[1]") stays the string the model sent."""

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        objects = {name: value for name, value in data.items() if name in _OBJECT_ARGUMENTS}
        return {**data, **super().pre_parse_json(objects)}


def _strict_tool(fn: Callable[..., Any], hints: ToolAnnotations) -> Tool:
    """``fn`` as a tool whose arguments are refused when unknown (the SDK's argument
    model ignores them), with typed structured output and ``hints``."""
    tool = Tool.from_function(fn, annotations=hints, structured_output=True)
    loose = tool.fn_metadata
    strict = cast(
        "type[ArgModelBase]",
        type(
            loose.arg_model.__name__,
            (loose.arg_model,),
            {"model_config": ConfigDict(extra="forbid"), "__module__": __name__},
        ),
    )
    tool.fn_metadata = _ArgumentsAsGiven(
        arg_model=strict,
        output_schema=loose.output_schema,
        output_model=loose.output_model,
        wrap_output=loose.wrap_output,
    )
    tool.parameters = strict.model_json_schema(by_alias=True)
    return tool


def _hints(
    title: str, *, read_only: bool, destructive: bool = False, idempotent: bool = True
) -> ToolAnnotations:
    """A tool's behaviour hints (all tools act on this one cluster: a closed world)."""
    return ToolAnnotations(
        title=title,
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=False,
    )


class _Server(MCPServer[Any]):
    """``MCPServer`` whose argument refusals are written for a model, and which
    declares the logging capability (it sends the lost-claims warning)."""

    def __init__(self, schemas: dict[str, dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._schemas = schemas

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        context: Context[Any, Any] | None = None,
    ) -> CallToolResult | InputRequiredResult:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError) and not isinstance(exc, UnexpectedToolError):
                raise _refused_arguments(name, self._schemas.get(name, {}), cause) from cause
            raise

    def serve_log_level(self, on_level: Callable[[str], None]) -> None:
        """Serve ``logging/setLevel``: the SDK declares the logging capability exactly
        when that request has a handler (the protocol asks a server that sends log
        messages to declare it, and to honour the level a client sets)."""

        async def set_level(_: Any, params: SetLevelRequestParams) -> EmptyResult:
            on_level(params.level)
            return EmptyResult()

        self._lowlevel_server.add_request_handler(
            "logging/setLevel", SetLevelRequestParams, set_level
        )


def build_server(options: McpOptions) -> tuple[MCPServer[Any], ClaimBook]:
    """The MCP server and its claim book (not started: ``run_stdio``)."""
    book = ClaimBook(options)

    @asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
        try:
            yield {}
        finally:
            # The MCP session ended (stdin EOF, or SIGTERM cancelled the server):
            # release everything now. Shielded, so a cancellation does not skip it;
            # bounded, so an unreachable cluster does not keep the process (the
            # claims then expire after the session TTL).
            with anyio.CancelScope(shield=True), anyio.move_on_after(10.0):
                await book.close()

    async def claim(
        key: Key,
        ctx: Context,
        wait: ClaimWait = 0.0,
        units: Annotated[
            StrictInt,
            Field(
                ge=1,
                le=MAX_UNITS,
                description=f"Units of the pool to take, 1 to {MAX_UNITS} and at most capacity.",
            ),
        ] = 1,
        capacity: Annotated[
            StrictInt,
            Field(
                ge=1,
                le=MAX_CAPACITY,
                description=(
                    f"The pool's or semaphore's size, 1 to {MAX_CAPACITY} (default 1: a "
                    "lock); every claim of the key must name the same."
                ),
            ),
        ] = 1,
        value: Annotated[
            Annotated[StrictStr, Field(max_length=MAX_VALUE_BYTES)] | None,
            Field(
                description=(
                    f"Text to publish with the claim (readers see it), at most "
                    f"{MAX_VALUE_BYTES} UTF-8 bytes."
                )
            ),
        ] = None,
    ) -> ClaimResult:
        """Claim (acquire) `key` for this agent, waiting up to `wait` seconds in the
        key's fair queue if someone else holds it. For a pool or semaphore give its
        `capacity` and the `units` you need. Returns the fencing `token` (pass it to
        the protected resource), `valid_for` (seconds), and for pools `unit_indices`
        (e.g. GPU indices for CUDA_VISIBLE_DEVICES). The claim lasts as long as this
        MCP session: there is no ttl. Claiming a key this session holds returns that
        claim (`already_held`) if units, capacity and value match, and an error saying
        what it holds otherwise. Error LEASE_HELD: someone else holds it (detail says
        who)."""
        body = await book.claim(key, wait, units, capacity, value)
        return cast(ClaimResult, await book.result(ctx, body))

    async def renew(
        ctx: Context,
        key: Annotated[
            Key | None,
            Field(description="The claim to renew (default: every claim of this session)."),
        ] = None,
    ) -> RenewResult:
        """Refresh this session's claims now (they are also kept alive automatically)
        and check with the cluster that they are still held. With `key`, that claim
        only: returns its token and `valid_for`; without, `claims`. Error
        LEASE_NOT_FOUND: the claim is gone (stop using it)."""
        return cast(RenewResult, await book.result(ctx, await book.renew(key)))

    async def release(key: Key, ctx: Context) -> ReleaseResult:
        """Release this session's claim of `key` (the next waiter gets it at once).
        Error LEASE_NOT_FOUND: this session holds no claim of it."""
        return cast(ReleaseResult, await book.result(ctx, await book.release(key)))

    async def release_all(ctx: Context) -> ReleaseAllResult:
        """Release every claim this session holds. Returns the keys released (and
        `failed` for any that could not be)."""
        return cast(ReleaseAllResult, await book.result(ctx, await book.release_all()))

    async def who_holds(key: Key, ctx: Context) -> WhoHoldsResult:
        """Who holds `key` now: owner, fencing token, remaining seconds, units (and
        `mine` for this session's own claim). `held` is false when it is free.
        Changes nothing."""
        return cast(WhoHoldsResult, await book.result(ctx, await book.who_holds(key)))

    async def list_claims(
        ctx: Context,
        prefix: Annotated[
            Annotated[StrictStr, Field(max_length=MAX_KEY_BYTES)] | None,
            Field(
                description=(
                    "List every live lease whose key starts with this (anyone's), instead "
                    f"of this session's claims; at most {MAX_KEY_BYTES} UTF-8 bytes."
                )
            ),
        ] = None,
        limit: Annotated[
            StrictInt,
            Field(
                ge=1,
                le=MAX_LIST_LIMIT,
                description=f"Most leases to list with prefix, 1 to {MAX_LIST_LIMIT}.",
            ),
        ] = 100,
    ) -> ListClaimsResult:
        """This session's claims (each checked with the cluster), or, with `prefix`,
        every live lease whose key starts with it (anyone's, up to `limit`). Changes
        nothing."""
        return cast(ListClaimsResult, await book.result(ctx, await book.list_claims(prefix, limit)))

    async def check_token(
        key: Key,
        token: Annotated[
            StrictInt,
            Field(ge=0, le=MAX_TOKEN, description="A fencing token from a claim."),
        ],
        ctx: Context,
    ) -> CheckTokenResult:
        """Is `token` the fencing token of a current holder of `key`? A protected
        resource asks this before accepting work from a claim holder. Changes
        nothing."""
        return cast(CheckTokenResult, await book.result(ctx, await book.check_token(key, token)))

    async def audit(
        ctx: Context,
        key: Annotated[
            Annotated[StrictStr, Field(min_length=1, max_length=MAX_KEY_BYTES)] | None,
            Field(description=f"Only this key's records; at most {MAX_KEY_BYTES} UTF-8 bytes."),
        ] = None,
        principal: Annotated[
            Annotated[StrictStr, Field(max_length=MAX_ID_CHARS)] | None,
            Field(description="Only records this principal held or made (as `principal` or `by`)."),
        ] = None,
        since: Annotated[
            StrictInt,
            Field(ge=0, le=2**62, description="Only records from this sequence number (`seq`)."),
        ] = 0,
        limit: Annotated[
            StrictInt,
            Field(ge=1, le=MAX_LIST_LIMIT, description=f"Most records, 1 to {MAX_LIST_LIMIT}."),
        ] = 100,
    ) -> AuditResult:
        """Who owned what: the cluster's audit trail (grants, releases, expiries,
        transfers, revocations, task claims and completions, with the principals),
        oldest first, as one node holds it. Needs the admin permission with auth
        (PERMISSION_DENIED otherwise). Changes nothing."""
        body = await book.audit(key, principal, since, limit)
        return cast(AuditResult, await book.result(ctx, body))

    async def take_task(
        queue: Annotated[
            StrictStr,
            Field(
                min_length=1,
                max_length=MAX_QUEUE_NAME_BYTES,
                description=(
                    f"The task queue's name, 1 to {MAX_QUEUE_NAME_BYTES} UTF-8 bytes (the "
                    "cluster's max_key_bytes may be lower)."
                ),
            ),
        ],
        ctx: Context,
        wait: TaskWait = 0.0,
        capabilities: Annotated[
            Annotated[
                dict[_CapName, _CapValue],
                Field(max_length=MAX_TASK_CAPABILITIES),
            ]
            | None,
            Field(
                description=(
                    "What this agent offers, names to strings (tasks may require some): "
                    f"at most {MAX_TASK_CAPABILITIES} entries, each name and value at most "
                    f"{MAX_TASK_CAP_BYTES} UTF-8 bytes."
                )
            ),
        ] = None,
    ) -> TakeTaskResult:
        """Take the next ready task from `queue`, waiting up to `wait` seconds for one
        to become ready. Returns `task_id`, `payload`, the attempt's fencing `token`
        and `valid_for`; `task` is null when none was ready. Each call takes another
        task. The attempt lasts as long as this MCP session: finish it with
        complete_task or fail_task."""
        return cast(
            TakeTaskResult, await book.result(ctx, await book.take_task(queue, wait, capabilities))
        )

    async def heartbeat(
        task_id: TaskId,
        ctx: Context,
        progress: Annotated[
            Annotated[StrictFloat, Field(ge=-MAX_PROGRESS, le=MAX_PROGRESS, allow_inf_nan=False)]
            | None,
            Field(description="Progress to record with the task, any number (e.g. a fraction)."),
        ] = None,
        checkpoint: Annotated[
            Annotated[StrictStr, Field(max_length=MAX_TASK_CHECKPOINT_BYTES)] | None,
            Field(
                description="The work's state so far, as text (at most 8 KiB of UTF-8): "
                "replicated, and handed to the next attempt's take_task if this one fails "
                "or is lost."
            ),
        ] = None,
    ) -> TaskResult:
        """Report that a taken task is still being worked on (with optional
        `progress` and `checkpoint`: once this returns, the checkpoint is kept). Error
        STALE_ATTEMPT: the task was given to someone else (stop working on it; the
        checkpoint was not kept)."""
        return cast(
            TaskResult, await book.result(ctx, await book.heartbeat(task_id, progress, checkpoint))
        )

    async def complete_task(
        task_id: TaskId,
        ctx: Context,
        result: Annotated[
            Any,
            Field(
                description=(
                    "The task's result, any JSON value (a string stays a string), at most "
                    f"{MAX_TASK_RESULT_BYTES} bytes as JSON text."
                )
            ),
        ] = None,
    ) -> CompleteResult:
        """Finish a taken task with `result`. Error STALE_ATTEMPT: this attempt is
        no longer current (its result is refused; exactly one completion counts)."""
        body = await book.finish_task(task_id, "completed", result)
        return cast(CompleteResult, await book.result(ctx, body))

    async def fail_task(
        task_id: TaskId,
        ctx: Context,
        error: Annotated[
            StrictStr,
            Field(
                max_length=MAX_TASK_ERROR_BYTES,
                description=f"What went wrong, at most {MAX_TASK_ERROR_BYTES} UTF-8 bytes.",
            ),
        ] = "",
        retry_after: Annotated[
            RetryAfter | None,
            Field(
                description=(
                    f"Seconds before the task may be retried, 0 to {MAX_RETRY_AFTER:g} "
                    "(default: the queue's backoff)."
                )
            ),
        ] = None,
    ) -> FailResult:
        """Give up on a taken task: it is retried later (or dead-lettered once out of
        attempts)."""
        body = await book.finish_task(task_id, "failed", error=error, retry_after=retry_after)
        return cast(FailResult, await book.result(ctx, body))

    async def spend_budget(
        key: BudgetKey,
        amount: Annotated[
            StrictInt,
            Field(
                ge=1,
                le=MAX_BUDGET_AMOUNT,
                description=f"Whole units to draw (tokens, requests), 1 to {MAX_BUDGET_AMOUNT}.",
            ),
        ],
        ctx: Context,
        wait: Annotated[
            StrictFloat,
            Field(
                ge=0,
                le=MAX_WAIT,
                allow_inf_nan=False,
                description=(
                    f"Seconds to wait in the budget's first-come queue until its refill "
                    f"covers the amount, 0 to {MAX_WAIT:g} (default 0: answer "
                    "BUDGET_EXHAUSTED at once, with retry_after)."
                ),
            ),
        ] = 0.0,
    ) -> SpendResult:
        """Draw `amount` units from the shared budget `key` (an LLM provider's tokens
        or requests per minute, shared by every agent), decided by the cluster: never
        more than the budget. Refused with BUDGET_EXHAUSTED when it cannot grant within
        `wait`, AMOUNT_OVER_CAPACITY, BUDGET_NOT_FOUND. Not idempotent: each call
        draws again."""
        body = await book.spend_budget(key, amount, wait)
        return cast(SpendResult, await book.result(ctx, body))

    async def reserve_budget(
        key: BudgetKey,
        amount: Annotated[
            StrictInt,
            Field(
                ge=1,
                le=MAX_BUDGET_AMOUNT,
                description=(
                    f"Whole units to reserve now (an estimate), 1 to {MAX_BUDGET_AMOUNT}."
                ),
            ),
        ],
        ctx: Context,
        wait: Annotated[
            StrictFloat,
            Field(
                ge=0,
                le=MAX_WAIT,
                allow_inf_nan=False,
                description=(
                    f"Seconds to wait in the budget's first-come queue, 0 to {MAX_WAIT:g} "
                    "(default 0: answer BUDGET_EXHAUSTED at once, with retry_after)."
                ),
            ),
        ] = 0.0,
        ttl: Annotated[
            StrictFloat,
            Field(
                ge=1,
                le=MAX_WAIT,
                allow_inf_nan=False,
                description=(
                    "Seconds until an unsettled reservation is settled at its amount "
                    f"(1 to {MAX_WAIT:g}, default 300)."
                ),
            ),
        ] = 300.0,
    ) -> ReserveResult:
        """Reserve an estimate of `amount` units of the shared budget `key` before a
        call whose cost is known only afterwards (an LLM call's tokens); then call
        settle_budget with the actual cost. Refused as spend_budget. Not idempotent."""
        body = await book.reserve_budget(key, amount, wait, ttl)
        return cast(ReserveResult, await book.result(ctx, body))

    async def settle_budget(
        reservation_id: Annotated[
            StrictStr,
            Field(
                min_length=1,
                max_length=MAX_ID_CHARS,
                description="The reservation_id reserve_budget returned in this session.",
            ),
        ],
        actual: Annotated[
            StrictInt,
            Field(
                ge=0,
                le=MAX_BUDGET_AMOUNT,
                description=f"The actual cost in whole units, 0 to {MAX_BUDGET_AMOUNT}.",
            ),
        ],
        ctx: Context,
    ) -> SettleResult:
        """Settle a reservation with its actual cost: less than reserved gives the
        difference back to the budget, more draws the extra. RESERVATION_NOT_FOUND
        once settled (or past its ttl, then settled at the reserved amount)."""
        body = await book.settle_budget(reservation_id, actual)
        return cast(SettleResult, await book.result(ctx, body))

    async def claim_many(
        keys: Annotated[
            list[Key],
            Field(
                min_length=1,
                max_length=MAX_MANY_KEYS,
                description=f"1 to {MAX_MANY_KEYS} distinct keys to claim together.",
            ),
        ],
        ctx: Context,
        wait: ClaimWait = 0.0,
    ) -> ClaimManyResult:
        """Claim several keys at once, all or none, in one step on the cluster: never
        part of them (so two agents taking the same keys in different orders cannot
        deadlock). With `wait`, waits as one waiter on every key until all are free
        for it. Each key becomes a claim of this session (its own fencing `token`);
        release them one by one or with release_all. Errors: LEASE_HELD (detail
        `keys`: the busy ones) when not all are free within `wait`; DEADLOCK if
        waiting would close a cycle of waits."""
        if len(set(keys)) != len(keys):
            raise _tool_error("INVALID_ARGUMENT", "keys must be distinct")
        body = await book.claim_many(list(keys), wait)
        return cast(ClaimManyResult, await book.result(ctx, body))

    async def request_yield(
        key: Key,
        deadline: Annotated[
            StrictFloat,
            Field(
                ge=0,
                le=MAX_WAIT,
                allow_inf_nan=False,
                description=(
                    f"Seconds, 0 to {MAX_WAIT:g}, the holders get to give `key` up before "
                    "the cluster ends their claims itself and grants the next waiter."
                ),
            ),
        ],
        ctx: Context,
        priority: Annotated[
            StrictInt,
            Field(
                ge=-MAX_PRIORITY,
                le=MAX_PRIORITY,
                description="Your priority: only holders granted below it are asked.",
            ),
        ] = 0,
    ) -> RequestYieldResult:
        """Ask the holders of `key` to give it up within `deadline` seconds (they see
        it in their next keep-alive answer; at the deadline the cluster ends their
        claims and grants the next waiter, e.g. your own waiting claim). Needs the
        preempt (or admin) permission on the key with auth, and a `priority` above
        the holders'. Errors: PERMISSION_DENIED, LEASE_NOT_FOUND (nobody holds it)."""
        body = await book.request_yield(key, deadline, priority)
        return cast(RequestYieldResult, await book.result(ctx, body))

    async def begin_effect(
        effect: _EffectId,
        ctx: Context,
        task_id: _TaskOrNone = None,
        key: _KeyOrNone = None,
        idempotency_key: Annotated[
            Annotated[StrictStr, Field(min_length=1, max_length=MAX_EFFECT_KEY_BYTES)] | None,
            Field(
                description=(
                    "The idempotency key to hand the provider (at most "
                    f"{MAX_EFFECT_KEY_BYTES} UTF-8 bytes; default: task id or key, ':', "
                    "effect id); the first begin's is kept."
                )
            ),
        ] = None,
    ) -> EffectResult:
        """Call BEFORE an action outside the cluster that must not happen twice
        (charging a card, sending a mail), under a task you took or a key you claimed.
        state new: do it now (hand the provider `idempotency_key`), then commit_effect.
        state committed: it was already done, skip it (`result` is its result).
        state in_progress: an earlier holder began it and was lost before committing:
        ask the provider (with `idempotency_key`) whether it happened; commit_effect with
        what it says, or do it. Errors STALE_ATTEMPT, NOT_OWNER, LEASE_NOT_FOUND: the
        task or claim is no longer yours (do not do the action); QUOTA_EXCEEDED: 32
        effects per task or key."""
        body = await book.effect("begin", effect, task_id, key, idempotency_key=idempotency_key)
        return cast(EffectResult, await book.result(ctx, body))

    async def commit_effect(
        effect: _EffectId,
        ctx: Context,
        task_id: _TaskOrNone = None,
        key: _KeyOrNone = None,
        result: Annotated[
            Any,
            Field(
                description=(
                    "What the action returned (a receipt), any JSON value, at most "
                    f"{MAX_EFFECT_RESULT_BYTES} bytes as JSON text: later holders read it "
                    "instead of acting again."
                )
            ),
        ] = None,
    ) -> EffectResult:
        """Call AFTER the action begin_effect announced: records that it was done,
        with its `result`. Errors STALE_ATTEMPT, NOT_OWNER, LEASE_NOT_FOUND: the task or
        claim is no longer yours (the commit is refused; the next holder will
        reconcile); INVALID_ARGUMENT: this task or claim did not begin the effect."""
        body = await book.effect("commit", effect, task_id, key, result=result)
        return cast(EffectResult, await book.result(ctx, body))

    async def put_task(
        queue: Annotated[
            StrictStr,
            Field(
                min_length=1,
                max_length=MAX_QUEUE_NAME_BYTES,
                description=f"The task queue's name, 1 to {MAX_QUEUE_NAME_BYTES} UTF-8 bytes.",
            ),
        ],
        ctx: Context,
        payload: Annotated[
            Any,
            Field(
                description=(
                    "The task's payload, any JSON value, at most "
                    f"{MAX_TASK_PAYLOAD_BYTES} bytes as JSON text."
                )
            ),
        ] = None,
        after: Annotated[
            Annotated[
                list[Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID_CHARS)]],
                Field(max_length=MAX_TASK_PARENTS),
            ]
            | None,
            Field(
                description=(
                    f"Up to {MAX_TASK_PARENTS} task ids of this queue: the task is ready only "
                    "once every one completed (take_task then shows their results), and "
                    "dead if one dies."
                )
            ),
        ] = None,
        priority: Annotated[
            StrictInt,
            Field(
                ge=-MAX_PRIORITY,
                le=MAX_PRIORITY,
                description="Higher is taken first (default 0).",
            ),
        ] = 0,
    ) -> PutTaskResult:
        """Put a task in `queue` for any worker (or agent) to take; returns its
        `task_id`. With `after`, a plan step runs only after the steps it depends on
        completed. Errors TASK_NOT_FOUND (an `after` id the queue does not hold),
        QUOTA_EXCEEDED (the queue is full)."""
        body = await book.put_task(queue, payload, after, priority)
        return cast(PutTaskResult, await book.result(ctx, body))

    tools = [
        _strict_tool(claim, _hints("Claim a key", read_only=False)),
        _strict_tool(claim_many, _hints("Claim several keys together", read_only=False)),
        _strict_tool(
            request_yield, _hints("Ask holders to yield a key", read_only=False, idempotent=False)
        ),
        _strict_tool(renew, _hints("Renew claims", read_only=False)),
        _strict_tool(release, _hints("Release a claim", read_only=False, destructive=True)),
        _strict_tool(release_all, _hints("Release every claim", read_only=False, destructive=True)),
        _strict_tool(who_holds, _hints("Who holds a key", read_only=True)),
        _strict_tool(list_claims, _hints("List claims or leases", read_only=True)),
        _strict_tool(check_token, _hints("Check a fencing token", read_only=True)),
        _strict_tool(audit, _hints("Read the audit trail", read_only=True)),
        _strict_tool(take_task, _hints("Take a task", read_only=False, idempotent=False)),
        _strict_tool(heartbeat, _hints("Heartbeat a task", read_only=False)),
        _strict_tool(complete_task, _hints("Complete a task", read_only=False, destructive=True)),
        _strict_tool(fail_task, _hints("Fail a task", read_only=False, destructive=True)),
        _strict_tool(begin_effect, _hints("Begin an external effect", read_only=False)),
        _strict_tool(commit_effect, _hints("Commit an external effect", read_only=False)),
        _strict_tool(put_task, _hints("Put a task", read_only=False, idempotent=False)),
        _strict_tool(
            spend_budget, _hints("Spend from a budget", read_only=False, idempotent=False)
        ),
        _strict_tool(
            reserve_budget, _hints("Reserve from a budget", read_only=False, idempotent=False)
        ),
        _strict_tool(
            settle_budget, _hints("Settle a reservation", read_only=False, idempotent=False)
        ),
    ]
    server = _Server(
        {tool.name: tool.parameters for tool in tools},
        name="raftlease",
        version=__version__,
        instructions=(
            "Leases on a raftlease cluster. claim a key before using what it protects and "
            "pass its fencing token to that resource; claims last as long as this MCP "
            "session (they are released when it ends, or expire after "
            f"{options.session_ttl:g} s if this server dies). Results carry lost_claims "
            "when a claim was lost since the previous call: stop using those."
        ),
        lifespan=lifespan,
        log_level="WARNING",
        tools=tools,
    )
    server.serve_log_level(book.set_log_level)
    return server, book


async def run_stdio(options: McpOptions) -> None:
    """Serve one MCP session on stdin/stdout until stdin closes (or SIGTERM/SIGINT);
    then release every claim. Blocks (a coroutine for ``anyio.run``)."""
    server, book = build_server(options)
    started = time.monotonic()

    async def on_signals() -> None:
        # SIGTERM/SIGINT (a host stopping us) end the session like stdin EOF does:
        # claims are released at once instead of waiting out the session TTL. The
        # SDK reads stdin in a worker thread that no cancellation interrupts, so
        # after the release the process exits directly (nothing else is pending:
        # every claim is gone and stdout carries no answer worth waiting for).
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("signal %d: ending the MCP session", signum)
                with anyio.CancelScope(shield=True), anyio.move_on_after(10.0):
                    await book.close()
                log.info("MCP session ended after %.1f s", time.monotonic() - started)
                logging.shutdown()
                os._exit(0)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(on_signals)
            await server.run_stdio_async()
            group.cancel_scope.cancel()
    finally:
        log.info("MCP session ended after %.1f s", time.monotonic() - started)


__all__ = ["MAX_WAIT", "ClaimBook", "McpOptions", "build_server", "run_stdio"]
