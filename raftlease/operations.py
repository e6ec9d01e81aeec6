"""The one table of operations (docs/architecture.md): for each operation of the
wire protocol its name, whether it mutates (and so carries ``cid``, ``seq`` and
``ack``), its request fields in the order they are checked (wire name, the core's
name, kind, bounds, required or optional, default, a one-line doc), the cross-field
rules between them, the permission it needs, its HTTP routes and its result fields.

Everything that used to write an operation's fields by hand reads this table instead:
the wire parser (``protocol.parse_request``), the state machine's entry checks
(``core/checks.py``), the permission check (``server/auth.py``) and the OpenAPI
document with its request and response schemas (``server/op_schemas.py``). A new
operation or field is one entry here; ``tests/test_operations.py`` checks that every
reader agrees with it.

Ground floor: imports only ``errors`` and ``limits`` (and the stdlib), so every layer,
the pure core included, may read it. Pure data and small pure functions: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from .errors import BadRequestError, InvalidArgumentError
from .limits import (
    MAX_CAPACITY,
    MAX_DEAD_LIST,
    MAX_ID_CHARS,
    MAX_QUEUE_NAME_BYTES,
    MAX_TASK_ATTEMPTS,
    MAX_TASK_BACKOFF_MS,
    MAX_TASK_CAPABILITIES,
    MAX_TASK_DEDUP_BYTES,
    MAX_TASK_DELAY_MS,
    MAX_TASK_ERROR_BYTES,
    MAX_TASK_PAYLOAD_BYTES,
    MAX_TASK_REQUIRES,
    MAX_TASK_RESULT_BYTES,
    MAX_VALUE_BYTES,
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
#: host:port.
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

    @property
    def core(self) -> str:
        """The name of this field in the core's arguments and log entries."""
        return self.arg or self.wire


@dataclass(frozen=True, slots=True)
class Rule:
    """A rule between fields that no single field expresses, checked at its place in
    the field order. ``check(message, args)`` raises ``BadRequestError`` or
    ``InvalidArgumentError``; ``args`` holds the fields read so far."""

    name: str
    doc: str
    check: Callable[[Mapping[str, Any], dict[str, Any]], None]


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
)
LEASE_TTL_OR_SESSION = Rule(
    "lease_ttl_or_session",
    "a claim gives lease_ttl or session, not both (an attached claim lives by its session)",
    _lease_ttl_or_session,
)
LEASE_ID_OR_TOKEN = Rule(
    "lease_id_or_token",
    "a revoke names one lease by lease_id or by token, not both (neither: every lease)",
    _lease_id_or_token,
)
MEMBER_ID_CHARS = Rule(
    "member_id_chars",
    "a member id holds only letters, digits and - _ . : [ ]",
    _member_id_chars,
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

_KEY = Field("key", "string", "the lease's key", required=True, high=LimitRef("max_key_bytes"))
_OWNER = Field(
    "owner", "string", "a label: who holds it", required=True, high=LimitRef("max_owner_bytes")
)
_LEASE_ID = Field(
    "lease_id", "string", "from the grant", arg="lid", required=True, high=MAX_ID_CHARS
)
_TTL = Field("ttl", "ttl", "seconds; a new TTL", low=LimitRef("min_ttl"), high=LimitRef("max_ttl"))
_SESSION_ID = Field(
    "session_id", "string", "from session_open", arg="sid", required=True, high=MAX_ID_CHARS
)
_CONSISTENCY = Field(
    "consistency",
    "enum",
    "linearizable (leader lease, else the log), log, or stale (any node, labelled)",
    given="present",
    choices=CONSISTENCY_MODES,
    default=CONSISTENCY_MODES[0],
)
_PREFIX = Field(
    "prefix",
    "prefix",
    "a key prefix (empty: every key)",
    given="present",
    high=LimitRef("max_key_bytes"),
    default="",
)
_LIMIT = Field(
    "limit",
    "integer",
    "most items answered (default the smaller of 1000 and the node's max_list)",
    given="present",
    low=1,
    high=LimitRef("max_list"),
    default=LimitRef("max_list", cap=1000),
)
_POLL_TIMEOUT = Field(
    "timeout", "seconds", "seconds to wait for a change", required=True, high=60.0, unit="s",
    low=0.0,
)  # fmt: skip
_QUEUE = Field(
    "queue",
    "string",
    "the queue's name",
    required=True,
    high=LimitRef("max_key_bytes", cap=MAX_QUEUE_NAME_BYTES),
)
_TASK_ID = Field("task_id", "string", "from the put", arg="tid", required=True, high=MAX_ID_CHARS)
_ATTEMPT_ID = Field(
    "attempt_id", "string", "from the claim", arg="aid", required=True, high=MAX_ID_CHARS
)
_PRIORITY = Field(
    "priority", "integer", "higher is served first", low=-MAX_PRIORITY, high=MAX_PRIORITY
)
_WAIT = Field("wait", "seconds", "seconds to wait in the queue", low=0.0, high=LimitRef("max_wait"))
_LEASE_TTL = Field(
    "lease_ttl",
    "seconds",
    "seconds an attempt lives without a heartbeat (not with session)",
    arg="ttl",
    low=LimitRef("min_ttl"),
    high=LimitRef("max_ttl"),
)
_DAYS = MAX_TASK_DELAY_MS / 1000.0

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


def _r(name: str, kind: str | tuple[JsonType, ...], doc: str, always: bool = False) -> ResultField:
    """A ``ResultField``; ``kind`` ``"array:<type>"`` is an array of ``<type>``."""
    if isinstance(kind, tuple):
        return ResultField(name, kind, doc, always)
    outer, _, items = kind.partition(":")
    return ResultField(name, cast(JsonType, outer), doc, always, cast(JsonType, items or None))


_NOW = _r("now", "integer", "log time of the answer (ms)", True)
_REVISION = _r("revision", "integer", "the store's revision after it", True)
#: A lease as its grantee sees it (grant, renew, transfer, proclaim).
_LEASE = (
    _r("key", "string", "the key", True),
    _r("owner", "string", "the holder's label", True),
    _r("token", "integer", "the fencing token", True),
    _r("lease_id", "string", "the lease id (a capability: renew and release with it)", True),
    _r("ttl", "integer", "its TTL (ms)", True),
    _r("expires_at", "integer", "log time it expires (ms)", True),
    _NOW,
    _REVISION,
    _r("units", "integer", "units held of a shared key (absent: 1)"),
    _r("unit_indices", "array:integer", "which units of the key it holds"),
    _r("value", "string", "the value it publishes"),
    _r("session", "string", "the lease session it is attached to"),
)
#: What every read with a consistency mode adds.
_READ = (
    _r("consistency", "string", "how it was served: lease, log or stale", True),
    _r("served_by", "string", "the node that answered", True),
    _r("applied_index", "integer", "the answering node's applied index (local reads)"),
    _r("age", ("number", "null"), "seconds since it heard from a leader (local reads)"),
)
_TID = _r("tid", "string", "the task id", True)
#: A granted claim (task_claim, await_claim).
_CLAIM = (
    _r("queue", "string", "the queue"),
    _r("tid", "string", "the task id"),
    _r("aid", "string", "the attempt id (a capability: heartbeat and finish with it)"),
    _r("payload", "string", "the task's payload"),
    _r("token", "integer", "the attempt's fencing token"),
    _r("attempt", "integer", "the attempt's number"),
    _r("worker", "string", "the worker's label"),
    _r("ttl", "integer", "the attempt's TTL (ms)"),
    _r("expires_at", "integer", "log time the attempt expires (ms)"),
    _r("progress_timeout", "integer", "ms without progress before it is stalled (0: none)"),
    _r("session", "string", "the lease session it lives by (empty: none)"),
    _r("deadline", "integer", "log time a waiting claim gives up (ms)"),
)
_MEMBERS = _r("members", "array", "the members after the change", True)

# ------------------------------------------------------------------- routes

Permission = Literal[
    "open",
    "authenticate",
    "session",
    "read_all",
    "key_read",
    "key_write",
    "key_admin",
    "queue_read",
    "queue_write",
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
    "key_admin": "admin on a prefix of the key",
    "queue_read": "read on the key queue:<name>",
    "queue_write": "write on the key queue:<name>",
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


def _op(
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
_QUEUED = frozenset({"key", "owner", "lease_id", "now"})
_LEASES = "leases"
_SESSIONS = "sessions"
_QUEUES = "queues"

TABLE: tuple[Operation, ...] = (
    _op(
        "acquire",
        True,
        "key_write",
        "take a lease on a key (or a share of a shared key); with wait, queue for it",
        (
            _KEY,
            _OWNER,
            Field("value", "value", "a value to publish with the lease", high=MAX_VALUE_BYTES),
            Field(
                "session",
                "string",
                "a lease session to attach to (not with ttl)",
                high=MAX_ID_CHARS,
            ),
            TTL_OR_SESSION,
            Field(
                "ttl",
                "ttl",
                "seconds; required unless session is given",
                low=LimitRef("min_ttl"),
                high=LimitRef("max_ttl"),
            ),
            _WAIT,
            _PRIORITY,
            Field(
                "capacity",
                "integer",
                "the key's capacity (a shared key: semaphore, pool)",
                low=1,
                high=MAX_CAPACITY,
            ),
            Field(
                "units",
                "integer",
                "units to take, at most capacity",
                low=1,
                high=ArgRef("capacity", default=1, cap=MAX_CAPACITY),
            ),
        ),
        (
            *(ResultField(f.name, f.type, f.doc, f.always and f.name in _QUEUED, f.items)
              for f in _LEASE),
            _r("queued", "boolean", "true: not granted yet, queued (wait)"),
            _r("position", "integer", "place in the key's queue (1: next)"),
            _r("deadline", "integer", "log time the queued acquire gives up (ms)"),
            _r("state", "string", "held (an HTTP long-poll's answer)"),
            _r("remaining", "number", "seconds left on the lease (an HTTP long-poll's answer)"),
        ),
        (
            ("POST", "/v1/leases/acquire", "Acquire a lease (wait: long-poll)", _LEASES, "lease"),
            ("POST", "/v1/elections/campaign", "Campaign (long-poll until elected)", "elections",
             "lease"),
        ),
    ),
    _op(
        "renew",
        True,
        "key_write",
        "extend a held lease by its TTL (or a new one)",
        (_KEY, _LEASE_ID, _TTL),
        _LEASE,
        (("POST", "/v1/leases/renew", "Renew a held lease", _LEASES),),
    ),
    _op(
        "release",
        True,
        "key_write",
        "end a held lease, or withdraw a queued acquire",
        (_KEY, _LEASE_ID),
        (
            _r("key", "string", "the key", True),
            _r("token", "integer", "the ended lease's fencing token"),
            _r("revision", "integer", "the store's revision after it"),
            _r("cancelled", "boolean", "true: it was a queued acquire, withdrawn"),
        ),
        (
            ("POST", "/v1/leases/release", "Release a lease", _LEASES),
            ("POST", "/v1/elections/resign", "Give the lead up", "elections"),
        ),
    ),
    _op(
        "transfer",
        True,
        "key_write",
        "hand a held lease to a new owner (a new lease id and token, atomically)",
        (_KEY, _OWNER, _LEASE_ID, _TTL),
        _LEASE,
        (("POST", "/v1/leases/transfer", "Hand a lease to a new owner", _LEASES),),
    ),
    _op(
        "proclaim",
        True,
        "key_write",
        "change the value a held lease publishes (the token stays)",
        (
            _KEY,
            Field("value", "value", "the new value", required=True, high=MAX_VALUE_BYTES),
            _LEASE_ID,
        ),
        _LEASE,
        (("POST", "/v1/elections/proclaim", "Publish a new value as leader", "elections"),),
    ),
    _op(
        "session_open",
        True,
        "session",
        "open a lease session: leases and claims attached to it live by its keep-alives",
        (
            _OWNER,
            Field(
                "ttl",
                "ttl",
                "seconds the session lives without a keep-alive",
                required=True,
                low=LimitRef("min_ttl"),
                high=LimitRef("max_ttl"),
            ),
        ),
        (
            _r("session_id", "string", "the session id (a capability)", True),
            _r("ttl", "integer", "its TTL (ms)", True),
            _r("expires_at", "integer", "log time it expires (ms)", True),
            _r("leases", "integer", "leases attached to it", True),
            _NOW,
        ),
        (("POST", "/v1/sessions/open", "Open a lease session", _SESSIONS),),
    ),
    _op(
        "session_keepalive",
        True,
        "session",
        "extend a lease session, and every lease attached to it, by its TTL",
        (_SESSION_ID, _TTL),
        (
            _r("session_id", "string", "the session id", True),
            _r("ttl", "integer", "its TTL (ms)", True),
            _r("expires_at", "integer", "log time it expires (ms)", True),
            _r("leases", "integer", "leases attached to it", True),
            _NOW,
        ),
        (("POST", "/v1/sessions/keepalive", "Keep a session alive", _SESSIONS),),
    ),
    _op(
        "session_close",
        True,
        "session",
        "close a lease session, releasing everything attached to it",
        (_SESSION_ID,),
        (
            _r("session_id", "string", "the session id", True),
            _r("released", "integer", "leases released with it", True),
        ),
        (("POST", "/v1/sessions/close", "Close a session (releases its leases)", _SESSIONS),),
    ),
    _op(
        "revoke",
        True,
        "key_admin",
        "an operator ends the leases on a key: all, or the one named by lease id or token",
        (
            _KEY,
            LEASE_ID_OR_TOKEN,
            Field("lease_id", "string", "the lease to end", arg="lid", high=MAX_ID_CHARS),
            Field("token", "integer", "the fencing token of the lease to end", low=1,
                  high=2**62),
        ),
        (
            _r("key", "string", "the key", True),
            _r("revoked", "integer", "leases ended", True),
            _r("tokens", "array:integer", "their fencing tokens", True),
            _REVISION,
        ),
    ),
    _op(
        "holder",
        False,
        "key_read",
        "who holds a key (never the lease id)",
        (_KEY, _CONSISTENCY),
        (
            _r("holder", ("object", "null"), "the newest holder (null: nobody); a shared "
               "key adds capacity, used and holders", True),
            _NOW,
            _REVISION,
            *_READ,
        ),
        (
            ("GET", "/v1/leases/holder", "Who holds a key", _LEASES),
            ("GET", "/v1/elections/leader", "The elected leader", "elections"),
        ),
    ),
    _op(
        "waiters",
        False,
        "key_read",
        "the wait queue of a key, in grant order (never a lease or session id)",
        (_KEY, _CONSISTENCY, _LIMIT),
        (
            _r("key", "string", "the key", True),
            _r("capacity", "integer", "the key's capacity", True),
            _r("used", "integer", "units held", True),
            _r("waiting", "integer", "queued acquires", True),
            _r("waiters", "array:object", "position, owner, units, priority, wait_left "
               "(ms), in_session", True),
            _NOW,
            *_READ,
        ),
        (("GET", "/v1/leases/waiters", "Queued acquires of a key", _LEASES),),
    ),
    _op(
        "sessions",
        False,
        "read_all",
        "live lease sessions, soonest expiry first (never a session id)",
        (_CONSISTENCY, _LIMIT),
        (
            _r("sessions", "array:object", "owner, ttl, remaining (ms), leases, waiters", True),
            _r("now", "integer", "log time of the answer (ms; local reads)"),
            *_READ,
        ),
    ),
    _op(
        "leases",
        False,
        "key_read",
        "the leases held under a prefix",
        (_CONSISTENCY, _PREFIX, _LIMIT),
        (
            _r("leases", "array:object", "key, owner, token, ttl, expires_at, remaining", True),
            _NOW,
            *_READ,
        ),
        (("GET", "/v1/leases", "Leases held under a prefix", _LEASES),),
    ),
    _op(
        "fence",
        False,
        "key_read",
        "is a fencing token a current holder's",
        (
            _KEY,
            Field("token", "integer", "the fencing token to check", required=True, high=2**62),
            _CONSISTENCY,
        ),
        (
            _r("key", "string", "the key", True),
            _r("current", "boolean", "the token is a live holder's", True),
            _r("holder_token", ("integer", "null"), "the newest holder's token", True),
            _NOW,
            *_READ,
        ),
        (("GET", "/v1/leases/fence", "Is a token the current holder's", _LEASES),),
    ),
    _op(
        "await_lease",
        False,
        "key_read",
        "long-poll a queued acquire until it is granted, gone, or the timeout passes",
        (_KEY, _LEASE_ID, _POLL_TIMEOUT),
        (
            _r("state", "string", "held, waiting or gone", True),
            *(ResultField(f.name, f.type, f.doc, False, f.items) for f in _LEASE),
            _r("position", "integer", "place in the key's queue (waiting)"),
            _r("deadline", "integer", "log time the queued acquire gives up (waiting)"),
        ),
    ),
    _op(
        "task_put",
        True,
        "queue_write",
        "put a task in a queue",
        (
            _QUEUE,
            Field("payload", "text", "the task (JSON text)", required=True,
                  high=MAX_TASK_PAYLOAD_BYTES),
            _PRIORITY,
            Field("max_attempts", "integer", "attempts before it is dead", low=1,
                  high=MAX_TASK_ATTEMPTS),
            Field("dedup_key", "string", "a put with a key already in the queue is answered "
                  "with the first task", high=MAX_TASK_DEDUP_BYTES),
            Field("requires", "labels", "capabilities a worker must offer",
                  high=MAX_TASK_REQUIRES),
            Field("delay", "seconds", "seconds before it is ready", low=0.0, high=_DAYS),
            Field("deadline", "seconds", "seconds after which it is dead", low=0.001,
                  high=_DAYS),
            Field("retention", "seconds", "seconds a finished task is kept", low=0.0,
                  high=_DAYS),
            Field("backoff", "seconds", "first retry delay in seconds (doubles)", low=0.0,
                  high=MAX_TASK_BACKOFF_MS / 1000.0),
            Field("lease_ttl", "seconds", "seconds an attempt lives without a heartbeat",
                  arg="ttl", low=LimitRef("min_ttl"), high=LimitRef("max_ttl")),
            Field("progress_timeout", "seconds", "seconds without progress before an "
                  "attempt is stalled", low=LimitRef("min_ttl"), high=LimitRef("max_ttl")),
        ),
        (
            _TID,
            _r("status", "string", "the task's state", True),
            _r("revision", "integer", "the store's revision after it (not on a duplicate)"),
            _r("duplicate", "boolean", "true: the dedup key's first task"),
        ),
        (("POST", "/v1/queues/put", "Put a task", _QUEUES),),
    ),
    _op(
        "task_claim",
        True,
        "queue_write",
        "claim the best ready task a worker's capabilities satisfy; with wait, queue",
        (
            _QUEUE,
            Field("worker", "string", "a label: who works on it", required=True,
                  high=LimitRef("max_owner_bytes")),
            Field("capabilities", "labels", "what the worker offers", arg="caps",
                  high=MAX_TASK_CAPABILITIES),
            _WAIT,
            Field("session", "string", "a lease session to attach to (not with lease_ttl)",
                  high=MAX_ID_CHARS),
            LEASE_TTL_OR_SESSION,
            _LEASE_TTL,
        ),
        (
            _r("claimed", "boolean", "true: a task was claimed", True),
            *_CLAIM,
            _r("queued", "boolean", "true: waiting for a task (wait)"),
            _r("now", "integer", "log time of the answer (ms)"),
            _r("state", "string", "the waiting claim's state (an HTTP long-poll's answer)"),
        ),
        (("POST", "/v1/queues/claim", "Claim a task (wait: long-poll)", _QUEUES, "claim"),),
    ),
    _op(
        "task_claim_cancel",
        True,
        "queue_write",
        "withdraw a waiting claim (a claim granted meanwhile gives its task back)",
        (_QUEUE, _ATTEMPT_ID),
        (
            _r("cancelled", "boolean", "false: no such waiting claim or attempt", True),
            _r("released", "string", "the task given back"),
        ),
    ),
    _op(
        "task_heartbeat",
        True,
        "queue_write",
        "extend a claimed task's attempt, with optional progress",
        (
            _QUEUE,
            _TASK_ID,
            _ATTEMPT_ID,
            Field("progress", "progress", "a progress figure (higher is further)",
                  low=-(2**62), high=2**62),
        ),
        (
            _TID,
            _r("token", "integer", "the attempt's fencing token", True),
            _r("expires_at", "integer", "log time the attempt expires (ms)", True),
            _r("ttl", "integer", "the attempt's TTL (ms)", True),
            _r("stalled", "boolean", "true: no progress within progress_timeout", True),
            _NOW,
        ),
        (("POST", "/v1/queues/heartbeat", "Heartbeat a claimed task", _QUEUES),),
    ),
    _op(
        "task_complete",
        True,
        "queue_write",
        "complete a claimed task, with an optional result",
        (
            _QUEUE,
            _TASK_ID,
            _ATTEMPT_ID,
            Field("result", "text", "the result (JSON text)", high=MAX_TASK_RESULT_BYTES),
        ),
        (_TID, _r("token", "integer", "the attempt's fencing token", True), _REVISION),
        (("POST", "/v1/queues/complete", "Complete a task", _QUEUES),),
    ),
    _op(
        "task_fail",
        True,
        "queue_write",
        "fail an attempt: the task is retried after a backoff, or dead",
        (
            _QUEUE,
            _TASK_ID,
            _ATTEMPT_ID,
            Field("error", "text", "why it failed", high=MAX_TASK_ERROR_BYTES),
            Field("retry_after", "seconds", "seconds before the retry (instead of the "
                  "backoff)", low=0.0, high=_DAYS),
        ),
        (
            _TID,
            _r("status", "string", "the task's state after it", True),
            _r("ready_at", ("integer", "null"), "log time it is ready again (delayed)", True),
            _REVISION,
        ),
        (("POST", "/v1/queues/fail", "Fail an attempt", _QUEUES),),
    ),
    _op(
        "task_release",
        True,
        "queue_write",
        "give a claimed task back (no attempt counted)",
        (_QUEUE, _TASK_ID, _ATTEMPT_ID),
        (_TID, _REVISION),
        (("POST", "/v1/queues/release", "Give a claimed task back", _QUEUES),),
    ),
    _op(
        "task_retry",
        True,
        "queue_write",
        "make a dead task ready again",
        (_QUEUE, _TASK_ID),
        (_TID, _r("status", "string", "the task's state after it", True), _REVISION),
    ),
    _op(
        "task_purge",
        True,
        "queue_write",
        "remove a dead or completed task",
        (_QUEUE, _TASK_ID),
        (_TID, _REVISION),
    ),
    _op(
        "task_get",
        False,
        "queue_read",
        "one task's state (never an attempt id)",
        (_QUEUE, _TASK_ID),
        (_r("task", "object", "the task", True), _NOW),
        (("GET", "/v1/queues/task", "One task's state", _QUEUES),),
    ),
    _op(
        "task_stats",
        False,
        "queue_read",
        "a queue's counts",
        (_QUEUE,),
        (_r("stats", "object", "counts by state, waiting claims, attempts, oldest ready "
            "age", True), _NOW),
        (("GET", "/v1/queues/stats", "A queue's counts", _QUEUES),),
    ),
    _op(
        "task_dead",
        False,
        "queue_read",
        "a queue's dead tasks, in death order",
        (
            _QUEUE,
            Field("limit", "integer", "most tasks answered", low=1, high=MAX_DEAD_LIST),
        ),
        (_r("dead", "array:object", "the dead tasks", True), _NOW),
    ),
    _op(
        "await_claim",
        False,
        "queue_write",
        "long-poll a waiting claim until it is granted, gone, or the timeout passes",
        (_QUEUE, _ATTEMPT_ID, _POLL_TIMEOUT),
        (_r("state", "string", "claimed, waiting or gone", True), *_CLAIM,
         _r("now", "integer", "log time of the answer (ms)")),
    ),
    _op(
        "await_task",
        False,
        "queue_read",
        "long-poll a task until it is completed or dead, or the timeout passes",
        (_QUEUE, _TASK_ID, _POLL_TIMEOUT),
        (_r("task", "object", "the task", True), _NOW),
    ),
    _op(
        "watch",
        False,
        "key_read",
        "stream the changes under a prefix, from a revision",
        (
            _PREFIX,
            Field("from_revision", "integer", "the first revision to send (0: from now)",
                  given="present", high=2**62, default=0),
        ),
        (
            _r("type", "string", "what happened (grant, renew, release, expire, ...)"),
            _r("key", "string", "the key"),
            _r("owner", "string", "the holder's label"),
            _r("token", "integer", "the lease's fencing token"),
            _r("revision", "integer", "the change's revision", True),
            _r("value", "string", "the lease's value"),
            _r("units", "integer", "units of a shared key"),
        ),
        (("GET", "/v1/watch", "Stream changes (NDJSON or server-sent events)", "watch"),),
    ),
    _op(
        "status",
        False,
        "open",
        "this node's status",
        (),
        (
            _r("node", "string", "this node's id", True),
            _r("client", "string", "its client address", True),
            _r("raft", "string", "its raft address", True),
            _r("role", "string", "leader, follower, candidate, learner or recovering", True),
            _r("ready", "boolean", "ready to serve", True),
            _r("leader", ("string", "null"), "the leader's client address", True),
            _r("version", "string", "the raftlease version", True),
            _r("term", "integer", "the raft term"),
            _r("commit_index", "integer", "the raft commit index"),
            _r("applied_index", "integer", "the applied index"),
            _r("log_time", "integer", "the last applied log time (ms)"),
            _r("revision", "integer", "the store's revision"),
            _r("leases", "integer", "live leases"),
            _r("lease_sessions", "integer", "live lease sessions"),
            _r("lease_reads", "boolean", "reads are served under the leader lease"),
        ),
        (("GET", "/v1/status", "This node's status", "cluster"),),
    ),
    _op(
        "ping",
        False,
        "open",
        "is the node up",
        (),
        (
            _r("node", "string", "this node's id", True),
            _r("version", "string", "the raftlease version", True),
        ),
    ),
    _op(
        "auth",
        False,
        "authenticate",
        "authenticate the connection with a bearer token",
        (Field("token", "string", "the bearer token", required=True, high=1024),),
        (
            _r("principal", ("string", "null"), "who the token is (null: auth is off)", True),
            _r("auth", "string", "off when the node has no auth file"),
        ),
    ),
    _op(
        "snapshot",
        False,
        "admin",
        "take a snapshot on the leader, or read a chunk of one",
        (
            Field("snapshot", "string", "the snapshot to read (absent: take one)",
                  high=MAX_ID_CHARS),
            Field("offset", "integer", "where to read from (with snapshot)", high=2**62,
                  needs="snapshot"),
        ),
        (
            _r("snapshot", "string", "the snapshot's id", True),
            _r("index", "integer", "its log index (taken)"),
            _r("term", "integer", "its term (taken)"),
            _r("size", "integer", "its size in bytes (taken)"),
            _r("sha256", "string", "its checksum (taken)"),
            _r("offset", "integer", "where the chunk starts (read)"),
            _r("data", "string", "the chunk (read; bytes over the native protocol)"),
            _r("done", "boolean", "the chunk is the last (read)"),
        ),
    ),
    _op(
        "member_list",
        False,
        "admin",
        "the cluster's members",
        (),
        (_r("members", "array:object", "id, raft, client, leader, self", True),),
    ),
    _op(
        "member_add",
        False,
        "admin",
        "add a member (as a learner until it caught up)",
        (
            Field("member_id", "string", "the new member's id", required=True,
                  high=MAX_MEMBER_ID),
            MEMBER_ID_CHARS,
            Field("raft", "address", "its raft address (host:port)", required=True, high=300),
            Field("client", "address", "its client address (host:port)", required=True,
                  high=300),
            RAFT_NOT_CLIENT,
            Field("timeout", "seconds", "seconds to wait for it to catch up", given="present",
                  low=0.0, high=600.0, unit="s", default=30.0),
            PEER_KEY_REFUSED,
        ),
        (
            _r("kind", "string", "add", True),
            _r("member", "string", "the member's id", True),
            _r("added", "boolean", "it was added"),
            _r("caught_up", "boolean", "it caught up within the timeout"),
            _MEMBERS,
        ),
    ),
    _op(
        "member_remove",
        False,
        "admin",
        "remove a member",
        (
            Field("member_id", "string", "the member's id or raft address", required=True,
                  high=MAX_MEMBER_ID),
            MEMBER_ID_CHARS,
        ),
        (_r("kind", "string", "remove", True), _r("member", "string", "its id", True),
         _MEMBERS),
    ),
    _op(
        "reload",
        False,
        "admin",
        "the node reached reads its auth and TLS files again",
        (),
        (
            _r("node", "string", "the node's id", True),
            _r("reloaded", "boolean", "every file was taken", True),
            _r("errors", "array:string", "why not", True),
        ),
    ),
)  # fmt: skip

#: The table by operation name.
BY_NAME: dict[str, Operation] = {op.name: op for op in TABLE}


def ops_with(permission: Permission) -> frozenset[str]:
    """The operations that need ``permission``."""
    return frozenset(op.name for op in TABLE if op.permission == permission)


def ops_reading(wire: str) -> frozenset[str]:
    """The operations with a field named ``wire`` on the wire."""
    return frozenset(op.name for op in TABLE if op.field(wire) is not None)


def core_bounds(op: str, wire: str) -> tuple[int, int]:
    """The bounds of field ``wire`` of ``op`` as the core checks its log entries: an
    integer's own, a number of seconds' in milliseconds (a mutating operation's fields
    include the dedup envelope's). For the state machine, which
    keeps its own check (it must not trust the wire) from the same table. Raises
    ``KeyError`` for an unknown operation or field and ``ValueError`` for bounds taken
    from the node's limits or another field (the core checks those against hard caps)."""
    operation = BY_NAME[op]
    spec = operation.field(wire)
    if spec is None and operation.mutates:
        spec = next((f for f in ENVELOPE if isinstance(f, Field) and f.wire == wire), None)
    if spec is None:
        raise KeyError(f"{op} has no field {wire!r}")
    if not all(isinstance(b, int | float) for b in (spec.low, spec.high)):
        raise ValueError(f"{op}.{wire} is bounded by the node's limits or another field")
    low, high = spec.low, spec.high
    assert isinstance(low, int | float) and isinstance(high, int | float)
    if spec.kind == "seconds":
        return round(low * 1000), round(high * 1000)
    if spec.kind != "integer":
        raise ValueError(f"{op}.{wire} is no integer or number of seconds")
    return int(low), int(high)
