"""The HTTP API's routes and its OpenAPI document (docs/http-api.md).

The routes, each operation's request fields and its result fields come from the one
table of operations (``operations.TABLE``, through ``op_schemas``), which
``protocol.parse_request`` reads too. The HTTP layer never validates a field itself:
it turns JSON (or a query string) into the native request map and calls
``parse_request``; this document only says what that function accepts and what each
operation answers, and ``tests/unit/test_http_api.py`` checks the two agree, field by
field, in both directions, for every operation reachable over HTTP.

Pure: no I/O, no clock. Event loop only (built once per node, then read).
"""

from __future__ import annotations

from typing import Any

from ..._version import __version__
from ...errors import CODES
from ...limits import MAX_TASK_CAP_BYTES
from ...operations import BY_NAME, ArgRef, Route
from ...protocol import OPS, Limits
from .op_schemas import Field, all_routes, op_fields, result_schema

#: Body fields the HTTP layer sets itself, refused in a body (http_api.RESERVED).
RESERVED = frozenset({"id", "op", "cid", "seq", "ack", "token_auth"})

#: HTTP status of each wire code (docs/http-api.md has the same table).
STATUS: dict[str, int] = {
    "BAD_REQUEST": 400,
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "LEASE_NOT_FOUND": 404,
    "SESSION_NOT_FOUND": 404,
    "TASK_NOT_FOUND": 404,
    "BUDGET_NOT_FOUND": 404,
    "RESERVATION_NOT_FOUND": 404,
    "LEASE_HELD": 409,
    "NOT_OWNER": 409,
    "HOLDER_KEY_MISMATCH": 409,
    "CAPACITY_MISMATCH": 409,
    "DEADLOCK": 409,
    "STALE_ATTEMPT": 409,
    "TASK_DEAD": 409,
    "TASK_STATE": 409,
    "AMOUNT_OVER_CAPACITY": 409,
    "SESSION_EXPIRED": 410,
    "COMPACTED": 410,
    "FRAME_TOO_LARGE": 413,
    "TOO_MANY_PENDING": 429,
    "QUOTA_EXCEEDED": 429,
    "BUDGET_EXHAUSTED": 429,
    "INTERNAL": 500,
    "CONFIG": 500,
    "CONNECTION_LOST": 502,
    "NOT_LEADER": 503,
    "UNAVAILABLE": 503,
    "OVERLOADED": 503,
    "LEADER_CHANGED": 503,
    "TIMEOUT": 504,
}

__all__ = ["STATUS", "Field", "Route", "all_routes", "document", "op_fields"]


def _schema(spec: Field) -> dict[str, Any]:
    out: dict[str, Any]
    if spec.kind == "key":
        out = {"type": "string", "minLength": 1, "maxLength": int(spec.high)}
        out["x-max-utf8-bytes"] = int(spec.high)
        if spec.pattern:
            out["pattern"] = spec.pattern
    elif spec.kind == "text":
        out = {"type": "string", "maxLength": int(spec.high), "x-max-utf8-bytes": int(spec.high)}
    elif spec.kind == "integer":
        out = {"type": "integer", "minimum": int(spec.low), "maximum": int(spec.high)}
    elif spec.kind == "number":
        out = {"type": "number", "minimum": spec.low, "maximum": spec.high}
    elif spec.kind == "enum":
        out = {"type": "string", "enum": list(spec.choices), "default": spec.choices[0]}
    elif spec.kind == "keyset":
        # A list of distinct keys, or a map of key to units (at most the capacity).
        key = {
            "type": "string",
            "minLength": 1,
            "maxLength": int(spec.low),
            "x-max-utf8-bytes": int(spec.low),
        }
        if spec.pattern:
            key["pattern"] = spec.pattern
        out = {
            "oneOf": [
                {
                    "type": "array",
                    "items": key,
                    "minItems": 1,
                    "maxItems": int(spec.high),
                    "uniqueItems": True,
                },
                {
                    "type": "object",
                    "minProperties": 1,
                    "maxProperties": int(spec.high),
                    "propertyNames": key,
                    # Units of each key: at most the body's capacity (1 when absent).
                    "additionalProperties": {
                        "type": "integer",
                        "minimum": 1,
                        "x-maximum-field": "capacity",
                    },
                },
            ],
            "x-max-utf8-bytes": int(spec.low),
        }
    else:  # labels: non-empty names to strings, each at most MAX_TASK_CAP_BYTES
        cap = MAX_TASK_CAP_BYTES
        out = {
            "type": "object",
            "maxProperties": int(spec.high),
            "propertyNames": {"minLength": 1, "maxLength": cap},
            "additionalProperties": {"type": "string", "maxLength": cap},
            "x-max-utf8-bytes": cap,
        }
    if spec.doc:
        out["description"] = spec.doc
    if "x-max-utf8-bytes" in out:
        # JSON Schema's maxLength counts characters; the server counts UTF-8 bytes.
        what = {"labels": "names and values are each", "keyset": "keys are each"}.get(spec.kind, "")
        note = (
            f"{what} at most {out['x-max-utf8-bytes']} bytes of UTF-8 (the server counts "
            "bytes; maxLength, in characters, is only an upper bound)"
        ).strip()
        out["description"] = f"{spec.doc}; {note}" if spec.doc else note
    return out


def _allow_null(schema: dict[str, Any]) -> None:
    schema["type"] = [schema["type"], "null"]
    if "enum" in schema:
        schema["enum"] = [*schema["enum"], None]
    schema["description"] = f"{schema.get('description', '')}; null: as if absent".lstrip("; ")


def _renamed(route: Route, name: str) -> str:
    for http_name, proto in route.rename:
        if proto == name:
            return http_name
    return name


def _error_response(description: str = "an error with its wire code") -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


#: Statuses the admin port answers itself, before an operation runs (docs/http-api.md).
_PORT_STATUS = {
    400: "a request line, header or query the port cannot take",
    401: "Authorization that is not 'Bearer <token>'",
    414: "a URL over 8,190 bytes (the connection is closed)",
    421: "a Host that is not a loopback name on a loopback port without an auth file",
    431: "a header over 8,190 bytes or more than 64 headers (the connection is closed)",
}
#: ... and to a POST's body.
_BODY_STATUS = {
    400: "a body that is not a JSON object, or that carries id, op, cid, seq or ack",
    408: "a body that did not arrive within 10 s (the connection is closed)",
    413: "a body above max_frame (the connection is closed)",
    415: "a Content-Type other than application/json",
}


def _error_responses(route: Route) -> dict[str, Any]:
    """Every error status ``route`` may answer, each with its wire codes (``STATUS``)
    and the port's own reasons: no ``default``, so a status the document does not
    name is a bug (tests/integration/test_schemathesis.py)."""
    reasons: dict[int, list[str]] = {}
    for code, status in STATUS.items():
        reasons.setdefault(status, []).append(code)
    port = {**_PORT_STATUS, **(_BODY_STATUS if route.method == "POST" else {})}
    for status, why in port.items():
        reasons.setdefault(status, []).append(why)
    return {str(status): _error_response("; ".join(reasons[status])) for status in sorted(reasons)}


def _given(name: str) -> dict[str, Any]:
    """``name`` is given: present and not null (``Rule``'s reading: null is absent)."""
    return {"required": [name], "properties": {name: {"not": {"type": "null"}}}}


def _exclusive(route: Route, body: dict[str, Any]) -> None:
    """State the operation's exclusive fields (``Rule.exclusive``) in ``body``'s
    schema: ``oneOf`` when exactly one is needed ("``ttl`` or ``session``, not
    both"), else no two of them together (null is absent, as the rule reads it)."""
    for rule in BY_NAME[route.op].rules:
        names = [_renamed(route, name) for name in rule.exclusive]
        if not names or not all(name in body["properties"] for name in names):
            continue
        if rule.one_needed:
            body.setdefault("allOf", []).append(
                {"oneOf": [_given(name) for name in names], "description": rule.doc}
            )
        else:
            pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
            body.setdefault("allOf", []).append(
                {
                    "allOf": [{"not": {"allOf": [_given(a), _given(b)]}} for a, b in pairs],
                    "description": rule.doc,
                }
            )


def _relative_bounds(route: Route, body: dict[str, Any]) -> None:
    """State a bound taken from another field (``ArgRef``: ``units`` is at most
    ``capacity``, 1 without one) in ``body``'s schema: the default as an ``if``/``then``
    and the field named as ``x-maximum-field``. JSON Schema cannot compare two
    fields: ``x-maximum-field`` and ``x-max-utf8-bytes`` are the limits of the document
    that a validator does not check (tests/integration/schemathesis_hooks.py applies
    them to what schemathesis generates)."""
    for spec in BY_NAME[route.op].fields:
        bound = spec.high
        name = _renamed(route, spec.wire)
        if not isinstance(bound, ArgRef) or name not in body["properties"]:
            continue
        arg = _renamed(route, bound.arg)
        schema = body["properties"][name]
        schema["x-maximum-field"] = arg
        schema["description"] = (
            f"{schema.get('description', '')} (the field {arg}; {bound.default} without it)"
        ).lstrip()
        body.setdefault("allOf", []).append(
            {
                "if": {"not": _given(arg)},
                "then": {"properties": {name: {"maximum": bound.default}}},
                "description": f"{name} is at most {arg}, {bound.default} without it",
            }
        )


def document(limits: Limits) -> dict[str, Any]:
    """The OpenAPI 3.1 document of this node's HTTP API under ``limits``."""
    paths: dict[str, Any] = {}
    for route in all_routes():
        specs = op_fields(route.op, limits)
        props = {_renamed(route, f.name): _schema(f) for f in specs}
        if route.method != "GET":
            for spec in specs:
                if spec.nullable:  # null is the field's absence (a query has no null)
                    _allow_null(props[_renamed(route, spec.name)])
        required = [_renamed(route, f.name) for f in specs if f.required]
        operation: dict[str, Any] = {
            "operationId": route.path.strip("/").replace("/", "_") + "_" + route.method.lower(),
            "summary": route.summary,
            "tags": [route.tag],
            "x-raftlease-op": route.op,
            "responses": {
                "200": {
                    "description": "the operation's result",
                    "content": {"application/json": {"schema": result_schema(route)}},
                },
                **_error_responses(route),
            },
        }
        if route.method == "GET":
            operation["parameters"] = [
                {"name": name, "in": "query", "required": name in required, "schema": schema}
                for name, schema in props.items()
            ]
        else:
            # Open, as the server is: a field it does not know is ignored
            # (docs/http-api.md), except the names the HTTP layer sets. Any integer
            # in a body, in such a field too, is within 64 bits (parts.bounded_int),
            # which JSON Schema cannot say of every nested value: x-integer-bits.
            body: dict[str, Any] = {
                "type": "object",
                "properties": props,
                "propertyNames": {"not": {"enum": sorted(RESERVED)}},
                "x-integer-bits": 64,
                "description": "unknown fields are ignored; "
                f"{', '.join(sorted(RESERVED))} are refused (the HTTP layer sets them); "
                "every integer, nested ones too, is within 64 bits (signed or unsigned)",
            }
            if required:
                body["required"] = required
            _exclusive(route, body)
            _relative_bounds(route, body)
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
                        "schema": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 128,
                            "pattern": "^[!-~]{1,128}$",
                        },
                    }
                ]
                operation["responses"]["422"] = {
                    **_error_response(),
                    "description": "BAD_REQUEST: the Idempotency-Key was already used for "
                    "a different request (nothing applied; send a new key)",
                }
        if route.op == "watch":
            # One change (or, ending the stream, an error) per NDJSON line or
            # server-sent event; a server-sent event's fields as OpenAPI 3.1 tools
            # read them: its data is that JSON.
            item = {"anyOf": [result_schema(route), {"$ref": "#/components/schemas/Error"}]}
            sse = {
                "type": "object",
                "required": ["data"],
                "properties": {
                    "event": {"type": "string", "description": "sync, error or the change's type"},
                    "id": {"type": "string", "description": "the change's revision"},
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": item,
                    },
                },
            }
            operation["responses"]["200"] = {
                "description": "a stream of changes (Accept: text/event-stream for events)",
                "content": {
                    "application/x-ndjson": {"schema": item},
                    "text/event-stream": {"schema": sse},
                },
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
