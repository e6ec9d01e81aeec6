"""The vocabulary the operations table is written in (the package's docstring says
what the table is for): request fields (kind, bounds, required, default, doc) and the
bounds that come from a node's limits or another field (``LimitRef``, ``ArgRef``,
``resolve``), the cross-field rules (``Rule``) and the dedup envelope of a mutation,
the fields several operations share, result fields, HTTP routes, permissions and
``Operation`` itself with its constructor ``operation``.

Pure data and small pure functions; imports only ``errors`` and ``limits``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from ..errors import BadRequestError, InvalidArgumentError
from ..limits import (
    MAX_ID_CHARS,
    MAX_QUEUE_NAME_BYTES,
    MAX_TASK_DELAY_MS,
)

#: Read consistency modes: leader lease (falls back to the log), always the log,
#: or any node's local state labelled with its age.
CONSISTENCY_MODES = ("linearizable", "log", "stale")

#: Longest member id accepted by ``member_add``.
MAX_MEMBER_ID = 64

#: Waiter and task priorities accepted (higher is served first).
MAX_PRIORITY = 1000


@dataclass(frozen=True, slots=True)
class Limits:
    """Request limits enforced before anything is proposed (from the node config)."""

    max_key_bytes: int = 512
    max_owner_bytes: int = 256
    min_ttl: float = 0.5
    max_ttl: float = 3600.0
    max_wait: float = 3600.0
    max_list: int = 10_000


# ------------------------------------------------------------------- fields

#: How a field is read off the wire (``protocol`` has one reader per kind):
#: ``string`` a non-empty string of at most ``high`` UTF-8 bytes; ``integer`` an
#: integer in ``low..high``; ``seconds`` a number of seconds in ``low..high``, handed
#: on as integer milliseconds (``unit="ms"``) or as seconds rounded to the millisecond
#: (``unit="s"``); ``ttl`` a lease TTL in seconds within the node's TTL limits, handed
#: on in milliseconds; ``text`` a string that may be empty, at most ``high`` bytes;
#: ``value`` a lease's published value (the same, with its own message); ``labels`` a
#: map of at most ``high`` non-empty names to strings; ``progress`` a finite number;
#: ``enum`` one of ``choices``; ``prefix`` a key prefix (may be empty); ``address``
#: host:port; ``number`` a finite number in ``low..high`` (a budget's refill rate);
#: ``keyset`` a set of 1 to ``high`` distinct keys, a list of keys or a map of key to
#: units (1 to the ``capacity`` field), handed on as ``[key, units]`` pairs.
Kind = Literal[
    "string",
    "integer",
    "seconds",
    "ttl",
    "text",
    "value",
    "labels",
    "progress",
    "enum",
    "prefix",
    "address",
    "number",
    "keyset",
]

#: When an optional field is read: ``not_none`` when the message holds it with a
#: value other than nil, ``present`` whenever the message holds it (nil is then
#: refused as the wrong type). The two differ on the wire, and both are kept exactly.
Given = Literal["not_none", "present"]


@dataclass(frozen=True, slots=True)
class LimitRef:
    """A bound taken from the node's request ``Limits`` (``name``), at most ``cap``."""

    name: str
    cap: int | None = None

    def resolve(self, limits: Limits) -> Any:
        value = getattr(limits, self.name)
        return value if self.cap is None else min(self.cap, value)


@dataclass(frozen=True, slots=True)
class ArgRef:
    """A bound taken from another field of the same request (``units`` is at most
    the ``capacity`` asked for, 1 without one); ``cap`` is its widest value."""

    arg: str
    default: int
    cap: int


Bound = int | float | LimitRef | ArgRef


def resolve(bound: Bound, limits: Limits, args: Mapping[str, Any] | None = None) -> Any:
    """A bound's value under ``limits``; an ``ArgRef`` reads ``args`` (its widest value
    without them, for documents)."""
    if isinstance(bound, LimitRef):
        return bound.resolve(limits)
    if isinstance(bound, ArgRef):
        return bound.cap if args is None else args.get(bound.arg, bound.default)
    return bound


@dataclass(frozen=True, slots=True)
class Field:
    """One request field. ``arg``: the name the core knows it by (``lease_id`` is
    ``lid``); ``required``: read always (its absence is an error); otherwise read when
    ``given``, or only once the field ``needs`` names was read. ``default``: the
    argument when the field is absent (a ``LimitRef`` for one from the limits)."""

    wire: str
    kind: Kind
    doc: str
    arg: str = ""
    required: bool = False
    given: Given = "not_none"
    low: Bound = 0
    high: Bound = 0
    unit: Literal["ms", "s"] = "ms"
    choices: tuple[str, ...] = ()
    default: Any = None
    needs: str = ""
    #: A ``string`` field's whole value (each key of a ``keyset``) must match this
    #: regular expression (the OpenAPI ``pattern``; parse_request refuses anything
    #: else INVALID_ARGUMENT).
    pattern: str = ""

    @property
    def core(self) -> str:
        """The name of this field in the core's arguments and log entries."""
        return self.arg or self.wire


@dataclass(frozen=True, slots=True)
class Rule:
    """A rule between fields that no single field expresses, checked at its place in
    the field order. ``check(message, args)`` raises ``BadRequestError`` or
    ``InvalidArgumentError``; ``args`` holds the fields read so far.

    ``exclusive``: fields of which at most one may be given (``one_needed``: exactly
    one), as the OpenAPI document states it (``oneOf``, or ``not`` both)."""

    name: str
    doc: str
    check: Callable[[Mapping[str, Any], dict[str, Any]], None]
    exclusive: tuple[str, ...] = ()
    one_needed: bool = False


def _given(message: Mapping[str, Any], name: str) -> bool:
    return message.get(name) is not None


def _ttl_or_session(message: Mapping[str, Any], args: dict[str, Any]) -> None:
    if _given(message, "session"):
        if _given(message, "ttl"):
            raise InvalidArgumentError(
                "give 'ttl' or 'session', not both: an attached lease lives by its session"
            )
    elif not _given(message, "ttl"):
        raise BadRequestError("missing field 'ttl'")


def _lease_ttl_or_session(message: Mapping[str, Any], args: dict[str, Any]) -> None:
    if _given(message, "session") and _given(message, "lease_ttl"):
        raise InvalidArgumentError(
            "give 'lease_ttl' or 'session', not both: an attached claim lives by its session"
        )


def _lease_id_or_token(message: Mapping[str, Any], args: dict[str, Any]) -> None:
    if _given(message, "lease_id") and _given(message, "token"):
        raise InvalidArgumentError("give 'lease_id' or 'token' to revoke, not both")


def _member_id_chars(message: Mapping[str, Any], args: dict[str, Any]) -> None:
    member_id = str(args["member_id"])
    if any(not (c.isalnum() or c in "-_.:[]") for c in member_id):
        raise InvalidArgumentError(
            f"member_id {member_id!r} may hold only letters, digits and - _ . : [ ]"
        )


def _raft_not_client(message: Mapping[str, Any], args: dict[str, Any]) -> None:
    if args["raft"] == args["client"]:
        raise InvalidArgumentError("fields 'raft' and 'client' must be different addresses")


def _peer_key_refused(message: Mapping[str, Any], args: dict[str, Any]) -> None:
    # Refused, not ignored: a caller still sending it expects a check that no longer
    # happens (mutual TLS replaced the handshake whose key it was).
    if "peer_key" in message:
        raise InvalidArgumentError(
            "field 'peer_key' is no longer used: members authenticate with certificates "
            "of the cluster CA (raftlease certs node ID); drop it"
        )


def _seq_not_below_ack(message: Mapping[str, Any], args: dict[str, Any]) -> None:
    if args["seq"] < args["ack"]:
        raise InvalidArgumentError(f"seq {args['seq']} is below ack {args['ack']}")


TTL_OR_SESSION = Rule(
    "ttl_or_session",
    "an acquire gives ttl or session, not both (an attached lease lives by its session)",
    _ttl_or_session,
    exclusive=("ttl", "session"),
    one_needed=True,
)
LEASE_TTL_OR_SESSION = Rule(
    "lease_ttl_or_session",
    "a claim gives lease_ttl or session, not both (an attached claim lives by its session)",
    _lease_ttl_or_session,
    exclusive=("lease_ttl", "session"),
)
LEASE_ID_OR_TOKEN = Rule(
    "lease_id_or_token",
    "a revoke names one lease by lease_id or by token, not both (neither: every lease)",
    _lease_id_or_token,
    exclusive=("lease_id", "token"),
)
MEMBER_ID_CHARS = Rule(
    "member_id_chars",
    "a member id holds only letters, digits and - _ . : [ ]",
    _member_id_chars,
)


#: A lease certificate's holder key (docs/certificates.md): the public half only.
HOLDER_KEY = Field(
    "holder_key",
    "string",
    "the holder's Ed25519 public key (64 lowercase hex characters): the answer then "
    "carries a lease certificate for it",
    high=64,
    pattern="^[0-9a-f]{64}$",
)
RAFT_NOT_CLIENT = Rule(
    "raft_not_client", "a member's raft and client addresses differ", _raft_not_client
)
PEER_KEY_REFUSED = Rule(
    "peer_key_refused",
    "peer_key (of the handshake mutual TLS replaced) is refused, not ignored",
    _peer_key_refused,
)
SEQ_NOT_BELOW_ACK = Rule(
    "seq_not_below_ack", "a request's seq is at least its ack", _seq_not_below_ack
)

#: The dedup envelope of every mutating request (Raft dissertation §6.3), read after
#: the operation's own fields; kept on the ``Request``, not in its arguments.
ENVELOPE: tuple[Field | Rule, ...] = (
    Field("cid", "string", "the client id (one per client process)", required=True, high=128),
    Field(
        "seq",
        "integer",
        "this request's number for its client id",
        required=True,
        low=1,
        high=2**62,
    ),
    Field("ack", "integer", "every seq below it was answered", required=True, low=1, high=2**62),
    SEQ_NOT_BELOW_ACK,
)

# ------------------------------------------------------------- the fields used

KEY = Field("key", "string", "the lease's key", required=True, high=LimitRef("max_key_bytes"))
OWNER = Field(
    "owner", "string", "a label: who holds it", required=True, high=LimitRef("max_owner_bytes")
)
LEASE_ID = Field(
    "lease_id", "string", "from the grant", arg="lid", required=True, high=MAX_ID_CHARS
)
TTL = Field("ttl", "ttl", "seconds; a new TTL", low=LimitRef("min_ttl"), high=LimitRef("max_ttl"))
SESSION_ID = Field(
    "session_id", "string", "from session_open", arg="sid", required=True, high=MAX_ID_CHARS
)
CONSISTENCY = Field(
    "consistency",
    "enum",
    "linearizable (leader lease, else the log), log, or stale (any node, labelled)",
    given="present",
    choices=CONSISTENCY_MODES,
    default=CONSISTENCY_MODES[0],
)
PREFIX = Field(
    "prefix",
    "prefix",
    "a key prefix (empty: every key)",
    given="present",
    high=LimitRef("max_key_bytes"),
    default="",
)
LIMIT = Field(
    "limit",
    "integer",
    "most items answered (default the smaller of 1000 and the node's max_list)",
    given="present",
    low=1,
    high=LimitRef("max_list"),
    default=LimitRef("max_list", cap=1000),
)
POLL_TIMEOUT = Field(
    "timeout", "seconds", "seconds to wait for a change", required=True, high=60.0, unit="s",
    low=0.0,
)  # fmt: skip
QUEUE = Field(
    "queue",
    "string",
    "the queue's name",
    required=True,
    high=LimitRef("max_key_bytes", cap=MAX_QUEUE_NAME_BYTES),
)
TASK_ID = Field("task_id", "string", "from the put", arg="tid", required=True, high=MAX_ID_CHARS)
ATTEMPT_ID = Field(
    "attempt_id", "string", "from the claim", arg="aid", required=True, high=MAX_ID_CHARS
)
PRIORITY = Field(
    "priority", "integer", "higher is served first", low=-MAX_PRIORITY, high=MAX_PRIORITY
)
WAIT = Field("wait", "seconds", "seconds to wait in the queue", low=0.0, high=LimitRef("max_wait"))
LEASE_TTL = Field(
    "lease_ttl",
    "seconds",
    "seconds an attempt lives without a heartbeat (not with session)",
    arg="ttl",
    low=LimitRef("min_ttl"),
    high=LimitRef("max_ttl"),
)
DAYS = MAX_TASK_DELAY_MS / 1000.0

# ------------------------------------------------------------------ results

JsonType = Literal["string", "integer", "number", "boolean", "object", "array", "null"]


@dataclass(frozen=True, slots=True)
class ResultField:
    """One field of an operation's result: its JSON type(s), a doc, and whether
    every successful answer has it (``always``; otherwise only some do)."""

    name: str
    type: JsonType | tuple[JsonType, ...]
    doc: str
    always: bool = False
    items: JsonType | None = None


def result(
    name: str, kind: str | tuple[JsonType, ...], doc: str, always: bool = False
) -> ResultField:
    """A ``ResultField``; ``kind`` ``"array:<type>"`` is an array of ``<type>``."""
    if isinstance(kind, tuple):
        return ResultField(name, kind, doc, always)
    outer, _, items = kind.partition(":")
    return ResultField(name, cast(JsonType, outer), doc, always, cast(JsonType, items or None))


NOW = result("now", "integer", "log time of the answer (ms)", True)
REVISION = result("revision", "integer", "the store's revision after it", True)
#: A lease as its grantee sees it (grant, renew, transfer, proclaim).
LEASE = (
    result("key", "string", "the key", True),
    result("owner", "string", "the holder's label", True),
    result("token", "integer", "the fencing token", True),
    result("lease_id", "string", "the lease id (a capability: renew and release with it)", True),
    result("ttl", "integer", "its TTL (ms)", True),
    result("expires_at", "integer", "log time it expires (ms)", True),
    NOW,
    REVISION,
    result("units", "integer", "units held of a shared key (absent: 1)"),
    result("unit_indices", "array:integer", "which units of the key it holds"),
    result("value", "string", "the value it publishes"),
    result("session", "string", "the lease session it is attached to"),
    result(
        "yield_requested",
        "object",
        "someone asked the holder to yield (request_yield): deadline (log time, ms) and "
        "by; at the deadline the cluster ends the lease",
    ),
    result(
        "certificate",
        "string",
        "the lease certificate for the request's holder_key "
        "(docs/certificates.md; absent without one)",
    ),
    result(
        "progress_timeout",
        "integer",
        "a progress-aware lease's progress_timeout (ms): it ends as stalled at "
        "progress_at plus this",
    ),
    result("progress_at", "integer", "log time of its last progress (its grant before any)"),
    result("progress", "number", "the last progress its holder reported"),
)
#: What every read with a consistency mode adds.
READ = (
    result("consistency", "string", "how it was served: lease, log or stale", True),
    result("served_by", "string", "the node that answered", True),
    result("applied_index", "integer", "the answering node's applied index (local reads)"),
    result("age", ("number", "null"), "seconds since it heard from a leader (local reads)"),
)
TID = result("tid", "string", "the task id", True)
#: A granted claim (task_claim, await_claim).
CLAIM = (
    result("queue", "string", "the queue"),
    result("tid", "string", "the task id"),
    result("aid", "string", "the attempt id (a capability: heartbeat and finish with it)"),
    result("payload", "string", "the task's payload"),
    result("token", "integer", "the attempt's fencing token"),
    result("attempt", "integer", "the attempt's number"),
    result("worker", "string", "the worker's label"),
    result("ttl", "integer", "the attempt's TTL (ms)"),
    result("expires_at", "integer", "log time the attempt expires (ms)"),
    result("progress_timeout", "integer", "ms without progress before it is stalled (0: none)"),
    result("session", "string", "the lease session it lives by (empty: none)"),
    result("deadline", "integer", "log time a waiting claim gives up (ms)"),
    result("checkpoint", "string", "the latest checkpoint of an earlier attempt (base64)"),
    result("checkpoint_attempt", "integer", "the number of the attempt that wrote it"),
    result("after", "array:string", "the task ids it ran after"),
    result("parent_results", "object", "their results (JSON text), by task id"),
    result(
        "certificate",
        "string",
        "the attempt's certificate for the request's holder_key (docs/certificates.md)",
    ),
)
MEMBERS = result("members", "array", "the members after the change", True)

# ------------------------------------------------------------------- routes

Permission = Literal[
    "open",
    "authenticate",
    "session",
    "read_all",
    "key_read",
    "key_write",
    "keys_write",
    "key_admin",
    "key_preempt",
    "queue_read",
    "queue_write",
    "budget_read",
    "budget_write",
    "budget_admin",
    "admin",
]

#: What each permission class asks of a principal (server/auth.py applies it).
PERMISSIONS: dict[Permission, str] = {
    "open": "anyone, authenticated or not (health checks, finding the leader)",
    "authenticate": "the auth request itself: the node answers it before any check",
    "session": "write on some prefix (lease sessions hold leases anywhere)",
    "read_all": "read on the whole key space",
    "key_read": "read on a prefix of the key (or of the prefix asked)",
    "key_write": "write on a prefix of the key",
    "keys_write": "write on a prefix of every key of the set",
    "key_admin": "admin on a prefix of the key",
    "key_preempt": "preempt or admin on a prefix of the key",
    "queue_read": "read on the key queue:<name>",
    "queue_write": "write on the key queue:<name>",
    "budget_read": "read on the key budget:<key>",
    "budget_write": "write on the key budget:<key>",
    "budget_admin": "admin on the key budget:<key>",
    "admin": "admin on the whole key space",
}


@dataclass(frozen=True, slots=True)
class Route:
    """An HTTP resource: ``method`` and ``path`` run ``op``. ``rename`` maps an HTTP
    field name to the protocol's (an election's ``name`` is the lease ``key``);
    ``poll`` names the long-poll the handler runs after the op (``lease``, ``claim``)."""

    method: str
    path: str
    op: str
    summary: str
    tag: str
    rename: tuple[tuple[str, str], ...] = ()
    poll: str = ""


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation: see the module docstring. ``steps``: its fields and rules in
    the order they are checked (the first failure is the one answered)."""

    name: str
    mutates: bool
    permission: Permission
    doc: str
    steps: tuple[Field | Rule, ...] = ()
    results: tuple[ResultField, ...] = ()
    routes: tuple[Route, ...] = ()

    @property
    def fields(self) -> tuple[Field, ...]:
        return tuple(s for s in self.steps if isinstance(s, Field))

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(s for s in self.steps if isinstance(s, Rule))

    def field(self, wire: str) -> Field | None:
        return next((f for f in self.fields if f.wire == wire), None)


def operation(
    name: str,
    mutates: bool,
    permission: Permission,
    doc: str,
    steps: tuple[Field | Rule, ...],
    results: tuple[ResultField, ...],
    routes: tuple[tuple[str, ...], ...] = (),
    rename: tuple[tuple[str, str], ...] = (),
) -> Operation:
    """An ``Operation``; each route is ``(method, path, summary, tag[, poll])``, and a
    route tagged ``elections`` names the key ``name``."""
    built = tuple(
        Route(
            r[0],
            r[1],
            name,
            r[2],
            r[3],
            rename=(("name", "key"),) if r[3] == "elections" else rename,
            poll=r[4] if len(r) > 4 else "",
        )
        for r in routes
    )
    return Operation(name, mutates, permission, doc, steps, results, built)


# -------------------------------------------------------------------- table

#: The lease fields a queued acquire answers too.
QUEUED = frozenset({"key", "owner", "lease_id", "now"})
LEASES = "leases"
SESSIONS = "sessions"
QUEUES = "queues"
BUDGETS = "budgets"
