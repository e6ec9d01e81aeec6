"""The HTTP API's view of the operations table (``operations.TABLE``): its routes,
each operation's request fields as the OpenAPI document and the query-string reader
describe them, and each operation's result as a JSON schema.

Nothing here decides what a field accepts: ``protocol.parse_request`` reads the same
table entries; this module only says it in OpenAPI's terms. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...operations import BY_NAME, TABLE, Limits, Route, resolve
from ...operations.tasks import ATTEMPT_ROW, TASK_VIEW

#: How each field kind of the table is described over HTTP: ``key`` (a non-empty
#: string of at most ``high`` UTF-8 bytes), ``text`` (a string that may be empty),
#: ``integer``/``number`` (``low``..``high``; a number of seconds for durations),
#: ``enum``, ``labels`` (a map of names to strings), ``keyset`` (1 to ``high`` keys of
#: at most ``low`` bytes: a list, or a map of key to units).
_HTTP_KIND = {
    "string": "key",
    "address": "key",
    "text": "text",
    "value": "text",
    "prefix": "text",
    "integer": "integer",
    "seconds": "number",
    "ttl": "number",
    "progress": "number",
    "number": "number",
    "enum": "enum",
    "labels": "labels",
    "keyset": "keyset",
}


@dataclass(frozen=True, slots=True)
class Field:
    """One request field as ``parse_request`` accepts it, in the OpenAPI document's
    kinds (see ``_HTTP_KIND``): bounds resolved under the node's limits."""

    name: str
    kind: str
    required: bool = False
    low: float = 0
    high: float = 0
    choices: tuple[str, ...] = ()
    doc: str = ""
    #: Optional and read only when not null (``given="not_none"``): a JSON null is
    #: taken as the field's absence.
    nullable: bool = False
    #: A regular expression the whole string must match ("" for none).
    pattern: str = ""


def all_routes() -> tuple[Route, ...]:
    """Every HTTP resource, in the table's order."""
    return tuple(route for op in TABLE for route in op.routes)


def op_fields(op: str, limits: Limits) -> list[Field]:
    """The request fields of ``op`` (without ``id``, ``op`` and the dedup ids, which
    the HTTP layer sets), as ``parse_request`` validates them under ``limits``.
    Raises ``KeyError`` for an operation the table does not have."""
    return [
        Field(
            spec.wire,
            _HTTP_KIND[spec.kind],
            spec.required,
            resolve(spec.low, limits),
            resolve(spec.high, limits),
            spec.choices,
            spec.doc,
            not spec.required and spec.given == "not_none" and not spec.needs,
            spec.pattern,
        )
        for spec in BY_NAME[op].fields
    ]


def _json_type(kind: str | tuple[str, ...]) -> str | list[str]:
    return kind if isinstance(kind, str) else list(kind)


def result_schema(route: Route) -> dict[str, Any]:
    """The JSON schema of a successful answer of ``route``: the result fields of its
    operation (``required``: those every answer has). Open to fields the table does
    not list (``status`` carries many node figures), so a newer node's answer still
    validates. Raises ``KeyError`` for an operation the table does not have."""
    props: dict[str, Any] = {}
    required: list[str] = []
    for result in BY_NAME[route.op].results:
        schema: dict[str, Any] = {"type": _json_type(result.type), "description": result.doc}
        if result.items is not None:
            schema["items"] = {"type": result.items}
        props[result.name] = schema
        if result.always:
            required.append(result.name)
    if route.tag == "queues":
        # The HTTP layer (http_api.HttpApi) repeats the native result's short names
        # under the request fields' names.
        for short, name in (("tid", "task_id"), ("aid", "attempt_id")):
            if short in props:
                props[name] = {**props[short], "description": f"the same as {short}"}
                if short in required:
                    required.append(name)
    if route.op == "task_get":
        props["task"] = {**task_schema(), "description": props["task"]["description"]}
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


def _typed(kind: str | tuple[str, ...], doc: str) -> dict[str, Any]:
    return {"type": _json_type(kind), "description": doc}


def task_schema() -> dict[str, Any]:
    """The schema of ``task_get``'s ``task`` over HTTP: ``TASK_VIEW``'s fields,
    ``task_id`` beside ``tid``, and each history row an object of ``ATTEMPT_ROW``'s
    named fields (``named_task``)."""
    props = {name: _typed(kind, doc) for name, kind, doc in TASK_VIEW}
    props["task_id"] = {**props["tid"], "description": "the same as tid"}
    row = {name: _typed(kind, doc) for name, kind, doc in ATTEMPT_ROW}
    props["history"]["items"] = {
        "type": "object",
        "properties": row,
        "required": [name for name, _, _ in ATTEMPT_ROW],
    }
    return {"type": "object", "properties": props, "required": [*props]}


def named_task(task: dict[str, Any]) -> dict[str, Any]:
    """``task_get``'s native ``task`` as the HTTP API answers it: ``task_id`` beside
    ``tid`` and each history row's positional array as an object (``ATTEMPT_ROW``)."""
    names = [name for name, _, _ in ATTEMPT_ROW]
    history = [
        dict(zip(names, row, strict=False)) if isinstance(row, list) else row
        for row in task.get("history", [])
    ]
    return {**task, "task_id": task.get("tid"), "history": history}
