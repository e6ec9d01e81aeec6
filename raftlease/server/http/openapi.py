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
from ...operations import BY_NAME, Route
from ...protocol import OPS, Limits
from .op_schemas import Field, all_routes, op_fields, result_schema

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

__all__ = ["STATUS", "Field", "Route", "all_routes", "document", "op_fields"]


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
    if "x-max-utf8-bytes" in out:
        # JSON Schema's maxLength counts characters; the server counts UTF-8 bytes.
        note = (
            f"at most {int(spec.high)} bytes of UTF-8 (the server counts bytes; "
            "maxLength, in characters, is only an upper bound)"
        )
        out["description"] = f"{spec.doc}; {note}" if spec.doc else note
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


def _exclusive(route: Route, body: dict[str, Any]) -> None:
    """State the operation's exclusive fields (``Rule.exclusive``) in ``body``'s
    schema: ``oneOf`` when exactly one is needed ("``ttl`` or ``session``, not
    both"), else ``not`` all of them together."""
    for rule in BY_NAME[route.op].rules:
        names = [_renamed(route, name) for name in rule.exclusive]
        if not names or not all(name in body["properties"] for name in names):
            continue
        if rule.one_needed:
            body.setdefault("allOf", []).append(
                {
                    "oneOf": [{"required": [name]} for name in names],
                    "description": rule.doc,
                }
            )
        else:
            body.setdefault("allOf", []).append(
                {"not": {"required": names}, "description": rule.doc}
            )


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
                "200": {
                    "description": "the operation's result",
                    "content": {"application/json": {"schema": result_schema(route)}},
                },
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
            _exclusive(route, body)
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
            # One change per NDJSON line or server-sent event.
            event = {"schema": result_schema(route)}
            operation["responses"]["200"] = {
                "description": "a stream of changes",
                "content": {"application/x-ndjson": event, "text/event-stream": event},
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
