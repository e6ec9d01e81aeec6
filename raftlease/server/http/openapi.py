"""The HTTP API's routes and its OpenAPI document (docs/http-api.md).

``ROUTES`` says which protocol operation each ``/v1/`` resource runs; ``op_fields``
describes each operation's request fields with the limits ``protocol.parse_request``
enforces, built from the same constants and the node's ``protocol.Limits``. The HTTP
layer never validates a field itself: it turns JSON (or a query string) into the
native request map and calls ``parse_request``; this table only documents what that
function accepts, and ``tests/test_http_api.py`` checks the two agree, field by
field, in both directions, for every operation reachable over HTTP.

Pure: no I/O, no clock. Event loop only (built once per node, then read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..._version import __version__
from ...errors import CODES
from ...limits import MAX_CAPACITY, MAX_ID_CHARS, MAX_VALUE_BYTES
from ...protocol import CONSISTENCY_MODES, OPS, Limits

#: HTTP status of each wire code (docs/http-api.md has the same table).
STATUS: dict[str, int] = {
    "BAD_REQUEST": 400,
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "LEASE_NOT_FOUND": 404,
    "SESSION_NOT_FOUND": 404,
    "TASK_NOT_FOUND": 404,
    "LEASE_HELD": 409,
    "NOT_OWNER": 409,
    "CAPACITY_MISMATCH": 409,
    "STALE_ATTEMPT": 409,
    "TASK_DEAD": 409,
    "SESSION_EXPIRED": 410,
    "COMPACTED": 410,
    "FRAME_TOO_LARGE": 413,
    "TOO_MANY_PENDING": 429,
    "QUOTA_EXCEEDED": 429,
    "INTERNAL": 500,
    "CONFIG": 500,
    "CONNECTION_LOST": 502,
    "NOT_LEADER": 503,
    "UNAVAILABLE": 503,
    "LEADER_CHANGED": 503,
    "TIMEOUT": 504,
}


@dataclass(frozen=True, slots=True)
class Field:
    """One request field as ``parse_request`` accepts it. ``kind``: ``key`` (a
    non-empty string of at most ``high`` UTF-8 bytes), ``text`` (a string that may be
    empty, at most ``high`` bytes), ``integer``/``number`` (``low``..``high``; a
    number of seconds for durations), ``enum`` (one of ``choices``), ``labels`` (a map
    of at most ``high`` names to strings)."""

    name: str
    kind: str
    required: bool = False
    low: float = 0
    high: float = 0
    choices: tuple[str, ...] = ()
    doc: str = ""


@dataclass(frozen=True, slots=True)
class Route:
    """A resource: ``method`` and ``path`` run ``op``. ``rename`` maps an HTTP field
    name to the protocol's (an election's ``name`` is the lease ``key``); ``poll``
    names the long-poll the handler runs after the op (``lease``, ``claim``)."""

    method: str
    path: str
    op: str
    summary: str
    tag: str
    rename: tuple[tuple[str, str], ...] = ()
    poll: str = ""


ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/leases/acquire", "acquire", "Acquire a lease (wait: long-poll)", "leases",
          poll="lease"),
    Route("POST", "/v1/leases/renew", "renew", "Renew a held lease", "leases"),
    Route("POST", "/v1/leases/release", "release", "Release a lease", "leases"),
    Route("POST", "/v1/leases/transfer", "transfer", "Hand a lease to a new owner", "leases"),
    Route("GET", "/v1/leases/holder", "holder", "Who holds a key", "leases"),
    Route("GET", "/v1/leases", "leases", "Leases held under a prefix", "leases"),
    Route("GET", "/v1/leases/fence", "fence", "Is a token the current holder's", "leases"),
    Route("GET", "/v1/leases/waiters", "waiters", "Queued acquires of a key", "leases"),
    Route("POST", "/v1/sessions/open", "session_open", "Open a lease session", "sessions"),
    Route("POST", "/v1/sessions/keepalive", "session_keepalive", "Keep a session alive",
          "sessions"),
    Route("POST", "/v1/sessions/close", "session_close", "Close a session (releases its leases)",
          "sessions"),
    Route("POST", "/v1/elections/campaign", "acquire", "Campaign (long-poll until elected)",
          "elections", rename=(("name", "key"),), poll="lease"),
    Route("GET", "/v1/elections/leader", "holder", "The elected leader", "elections",
          rename=(("name", "key"),)),
    Route("POST", "/v1/elections/proclaim", "proclaim", "Publish a new value as leader",
          "elections", rename=(("name", "key"),)),
    Route("POST", "/v1/elections/resign", "release", "Give the lead up", "elections",
          rename=(("name", "key"),)),
    Route("GET", "/v1/watch", "watch", "Stream changes (NDJSON or server-sent events)", "watch"),
    Route("GET", "/v1/status", "status", "This node's status", "cluster"),
)  # fmt: skip

#: Queue resources, offered when the protocol has the task operations.
QUEUE_ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/queues/put", "task_put", "Put a task", "queues"),
    Route("POST", "/v1/queues/claim", "task_claim", "Claim a task (wait: long-poll)", "queues",
          poll="claim"),
    Route("POST", "/v1/queues/heartbeat", "task_heartbeat", "Heartbeat a claimed task", "queues"),
    Route("POST", "/v1/queues/complete", "task_complete", "Complete a task", "queues"),
    Route("POST", "/v1/queues/fail", "task_fail", "Fail an attempt", "queues"),
    Route("POST", "/v1/queues/release", "task_release", "Give a claimed task back", "queues"),
    Route("GET", "/v1/queues/stats", "task_stats", "A queue's counts", "queues"),
    Route("GET", "/v1/queues/task", "task_get", "One task's state", "queues"),
)  # fmt: skip


def all_routes() -> tuple[Route, ...]:
    """The routes whose operation the protocol knows (queues only once it has them)."""
    return tuple(r for r in ROUTES + QUEUE_ROUTES if r.op in OPS)


def _seconds(name: str, low: float, high: float, required: bool = False, doc: str = "") -> Field:
    return Field(name, "number", required, low, high, doc=doc or "seconds")


def op_fields(op: str, limits: Limits) -> list[Field]:
    """The request fields of ``op`` (without ``id``, ``op`` and the dedup ids, which
    the HTTP layer sets), as ``parse_request`` validates them under ``limits``."""
    key = Field("key", "key", True, high=limits.max_key_bytes)
    lease_id = Field("lease_id", "key", True, high=MAX_ID_CHARS, doc="from the grant")
    owner = Field("owner", "key", True, high=limits.max_owner_bytes, doc="a label")
    ttl = _seconds("ttl", limits.min_ttl, limits.max_ttl)
    consistency = Field("consistency", "enum", choices=CONSISTENCY_MODES)
    listing = Field("limit", "integer", low=1, high=limits.max_list)
    prefix = Field("prefix", "text", high=limits.max_key_bytes)
    fields: dict[str, list[Field]] = {
        "acquire": [
            key,
            owner,
            Field(
                "ttl",
                "number",
                False,
                limits.min_ttl,
                limits.max_ttl,
                doc="seconds; required unless session is given",
            ),
            Field("session", "key", high=MAX_ID_CHARS, doc="a lease session id (not with ttl)"),
            _seconds("wait", 0.0, limits.max_wait, doc="seconds to wait in the key's queue"),
            Field("priority", "integer", low=-1000, high=1000),
            Field("capacity", "integer", low=1, high=MAX_CAPACITY),
            Field("units", "integer", low=1, high=MAX_CAPACITY, doc="at most capacity"),
            Field("value", "text", high=MAX_VALUE_BYTES),
        ],
        "renew": [key, lease_id, ttl],
        "release": [key, lease_id],
        "transfer": [key, lease_id, owner, ttl],
        "proclaim": [key, lease_id, Field("value", "text", True, high=MAX_VALUE_BYTES)],
        "holder": [key, consistency],
        "leases": [prefix, listing, consistency],
        "fence": [key, Field("token", "integer", True, 0, 2**62), consistency],
        "waiters": [key, listing, consistency],
        "session_open": [owner, _seconds("ttl", limits.min_ttl, limits.max_ttl, True)],
        "session_keepalive": [Field("session_id", "key", True, high=MAX_ID_CHARS), ttl],
        "session_close": [Field("session_id", "key", True, high=MAX_ID_CHARS)],
        "watch": [prefix, Field("from_revision", "integer", low=0, high=2**62)],
        "status": [],
    }
    if op.startswith("task_"):
        return _task_fields(op, limits)
    return list(fields[op])


def _task_fields(op: str, limits: Limits) -> list[Field]:
    """The queue operations' fields (``protocol._task_args``)."""
    # Imported here: the queue limits arrived with the task queues (issue 12).
    from ...limits import (
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
    )

    queue = Field("queue", "key", True, high=min(MAX_QUEUE_NAME_BYTES, limits.max_key_bytes))
    task_id = Field("task_id", "key", True, high=MAX_ID_CHARS)
    attempt_id = Field("attempt_id", "key", True, high=MAX_ID_CHARS)
    days = MAX_TASK_DELAY_MS / 1000.0
    fields: dict[str, list[Field]] = {
        "task_put": [
            queue,
            Field("payload", "text", True, high=MAX_TASK_PAYLOAD_BYTES),
            Field("priority", "integer", low=-1000, high=1000),
            Field("max_attempts", "integer", low=1, high=MAX_TASK_ATTEMPTS),
            Field("dedup_key", "key", high=MAX_TASK_DEDUP_BYTES),
            Field("requires", "labels", high=MAX_TASK_REQUIRES),
            _seconds("delay", 0.0, days),
            _seconds("deadline", 0.001, days),
            _seconds("retention", 0.0, days),
            _seconds("backoff", 0.0, MAX_TASK_BACKOFF_MS / 1000.0),
            _seconds("lease_ttl", limits.min_ttl, limits.max_ttl),
            _seconds("progress_timeout", limits.min_ttl, limits.max_ttl),
        ],
        "task_claim": [
            queue,
            Field("worker", "key", True, high=limits.max_owner_bytes),
            Field("capabilities", "labels", high=MAX_TASK_CAPABILITIES),
            _seconds("wait", 0.0, limits.max_wait),
            Field("session", "key", high=MAX_ID_CHARS, doc="not with lease_ttl"),
            _seconds("lease_ttl", limits.min_ttl, limits.max_ttl),
        ],
        "task_heartbeat": [
            queue,
            task_id,
            attempt_id,
            Field("progress", "number", low=-(2**62), high=2**62),
        ],
        "task_complete": [
            queue,
            task_id,
            attempt_id,
            Field("result", "text", high=MAX_TASK_RESULT_BYTES),
        ],
        "task_fail": [
            queue,
            task_id,
            attempt_id,
            Field("error", "text", high=MAX_TASK_ERROR_BYTES),
            _seconds("retry_after", 0.0, days),
        ],
        "task_release": [queue, task_id, attempt_id],
        "task_stats": [queue],
        "task_get": [queue, task_id],
    }
    return list(fields[op])


def _schema(spec: Field) -> dict[str, Any]:
    out: dict[str, Any]
    if spec.kind == "key":
        out = {"type": "string", "minLength": 1, "maxLength": int(spec.high)}
        out["x-max-utf8-bytes"] = int(spec.high)
    elif spec.kind == "text":
        out = {"type": "string", "maxLength": int(spec.high), "x-max-utf8-bytes": int(spec.high)}
    elif spec.kind == "integer":
        out = {"type": "integer", "minimum": int(spec.low), "maximum": int(spec.high)}
    elif spec.kind == "number":
        out = {"type": "number", "minimum": spec.low, "maximum": spec.high}
    elif spec.kind == "enum":
        out = {"type": "string", "enum": list(spec.choices), "default": spec.choices[0]}
    else:  # labels
        out = {
            "type": "object",
            "maxProperties": int(spec.high),
            "additionalProperties": {"type": "string"},
        }
    if spec.doc:
        out["description"] = spec.doc
    return out


def _renamed(route: Route, name: str) -> str:
    for http_name, proto in route.rename:
        if proto == name:
            return http_name
    return name


def _error_response() -> dict[str, Any]:
    return {
        "description": "an error with its wire code (see the status table)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def document(limits: Limits) -> dict[str, Any]:
    """The OpenAPI 3.1 document of this node's HTTP API under ``limits``."""
    paths: dict[str, Any] = {}
    for route in all_routes():
        specs = op_fields(route.op, limits)
        props = {_renamed(route, f.name): _schema(f) for f in specs}
        required = [_renamed(route, f.name) for f in specs if f.required]
        operation: dict[str, Any] = {
            "operationId": route.path.strip("/").replace("/", "_") + "_" + route.method.lower(),
            "summary": route.summary,
            "tags": [route.tag],
            "x-raftlease-op": route.op,
            "responses": {
                "200": {"description": "the operation's result"},
                "default": _error_response(),
            },
        }
        if route.method == "GET":
            operation["parameters"] = [
                {"name": name, "in": "query", "required": name in required, "schema": schema}
                for name, schema in props.items()
            ]
        else:
            body: dict[str, Any] = {"type": "object", "properties": props}
            if required:
                body["required"] = required
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": body}},
            }
            if OPS[route.op]:
                operation["parameters"] = [
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": False,
                        "description": "a retry with the same key gets the first answer",
                        "schema": {"type": "string", "minLength": 1, "maxLength": 128},
                    }
                ]
        if route.op == "watch":
            operation["responses"]["200"] = {
                "description": "a stream of changes",
                "content": {"application/x-ndjson": {}, "text/event-stream": {}},
            }
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "raftlease HTTP API", "version": __version__},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["code", "message", "definite"],
                            "properties": {
                                "code": {"type": "string", "enum": sorted(CODES)},
                                "message": {"type": "string"},
                                "definite": {"type": "boolean"},
                                "detail": {"type": "object"},
                            },
                        }
                    },
                }
            },
        },
        "security": [{"bearer": []}, {}],
        "x-status-of-code": dict(sorted(STATUS.items())),
    }
