"""Schemathesis hooks for tests/integration/test_schemathesis.py (loaded by name from
tests/integration/schemathesis.toml, ``hooks``).

Two limits of the OpenAPI document are beyond JSON Schema, and the document states them
in extensions beside the nearest schema it can give:

* ``x-max-utf8-bytes``: the server counts a string's UTF-8 bytes, JSON Schema's
  ``maxLength`` counts characters (and is given as the same number, an upper bound);
* ``x-maximum-field``: a bound taken from another field of the same body (an acquire's
  ``units`` is at most its ``capacity``; the document gives the field's absence as an
  ``if``/``then``; the units of each key of ``acquire_many``'s map are at most its
  ``capacity``, 1 when absent);
* ``x-integer-bits``: every integer of a body, nested ones in fields the server
  ignores too, is within 64 bits (the document's fields have their own bounds).

These hooks drop generated requests that break either, so that their refusal is not
counted as a schema-valid request refused (a string over its bytes is refused in every
mode, so no negative case is lost that the server would take).

Before each call (every phase), two valid values are changed, each kept valid:

* an ``Idempotency-Key`` is made unique (a suffix, within 128 characters): a key used
  before for another request is refused 422, rightly, for the key's history, and
  schemathesis draws short keys ("0") again and again, so most requests would never
  reach validation;
* a long-poll (``wait`` on acquire, campaign, claim) lasts up to ``wait`` seconds, up
  to an hour: a valid ``wait`` is shortened to ``LONGEST_WAIT`` so that each request
  ends within the run's request timeout (an invalid one is left as generated)."""

from __future__ import annotations

import itertools
import re
from collections.abc import MutableMapping
from typing import Any

import schemathesis

#: Seconds a generated long-poll may wait.
LONGEST_WAIT = 0.5
#: A valid Idempotency-Key (http_api._IDEMPOTENCY_KEY) and the suffixes that make each unique.
_KEY = re.compile(r"[\x21-\x7e]{1,128}")
_SERIAL = itertools.count(1)


def _definition(ctx: Any) -> dict[str, Any]:
    operation = getattr(ctx, "operation", None)
    raw = getattr(getattr(operation, "definition", None), "raw", None)
    return raw if isinstance(raw, dict) else {}


def _body_schema(ctx: Any) -> dict[str, Any]:
    content = _definition(ctx).get("requestBody", {}).get("content", {})
    schema = content.get("application/json", {}).get("schema", {})
    return schema if isinstance(schema, dict) else {}


def _too_long(value: Any, schema: dict[str, Any]) -> bool:
    """``value`` breaks its schema's ``x-max-utf8-bytes`` (of a labels map: a name or
    a value does; of a key set: one of its keys does)."""
    most = schema.get("x-max-utf8-bytes")
    if not isinstance(most, int):
        return False
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass")) > most
    if isinstance(value, dict):
        return any(_too_long(str(k), schema) or _too_long(v, schema) for k, v in value.items())
    if isinstance(value, list):  # a key set given as a list: each key
        return any(_too_long(v, schema) for v in value)
    return False


def _wide_integer(value: Any) -> bool:
    """``value`` holds an integer beyond 64 bits (signed or unsigned), at any depth: one
    sent as JSON digits (a float such as 1e30 is sent, and taken, as a float)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not -(2**63) <= value < 2**64
    if isinstance(value, dict):
        return any(_wide_integer(v) for v in value.values())
    if isinstance(value, list):
        return any(_wide_integer(v) for v in value)
    return False


def _map_over_bound(value: dict[Any, Any], schema: dict[str, Any], body: dict[str, Any]) -> bool:
    """A map field (a set of keys and their units) one of whose values is above the
    ``x-maximum-field`` of its schema's map branch (``capacity``: 1 when absent)."""
    for branch in schema.get("oneOf", []):
        values = branch.get("additionalProperties") if isinstance(branch, dict) else None
        other = values.get("x-maximum-field") if isinstance(values, dict) else None
        if not other:
            continue
        bound = body.get(other, 1)
        if isinstance(bound, int | float) and any(
            isinstance(v, int | float) and v > bound for v in value.values()
        ):
            return True
    return False


@schemathesis.hook
def filter_body(ctx: Any, body: Any) -> bool:
    if not isinstance(body, dict):
        return True
    schema = _body_schema(ctx)
    if schema.get("x-integer-bits") == 64 and _wide_integer(body):
        return False
    props = schema.get("properties", {})
    for name, schema in props.items():
        if not isinstance(schema, dict) or name not in body:
            continue
        if _too_long(body[name], schema):
            return False
        if isinstance(body[name], dict) and _map_over_bound(body[name], schema, body):
            return False
        other = schema.get("x-maximum-field")
        value, bound = body[name], body.get(other, None) if other else None
        if other and bound is None:
            continue  # the document's if/then covers the field's absence
        if isinstance(value, int | float) and isinstance(bound, int | float) and value > bound:
            return False
    return True


@schemathesis.hook
def filter_query(ctx: Any, query: Any) -> bool:
    if not isinstance(query, dict):
        return True
    for parameter in _definition(ctx).get("parameters", []):
        name = parameter.get("name")
        in_query = parameter.get("in") == "query" and name in query
        if in_query and _too_long(query[name], parameter.get("schema", {})):
            return False
    return True


@schemathesis.hook
def before_call(ctx: Any, case: Any, kwargs: Any) -> None:
    headers = case.headers
    # A case's headers are a case-insensitive mapping (requests'), not a dict.
    key = headers.get("Idempotency-Key") if isinstance(headers, MutableMapping) else None
    if isinstance(key, str) and _KEY.fullmatch(key):
        suffix = f".{next(_SERIAL)}"
        headers["Idempotency-Key"] = key[: 128 - len(suffix)] + suffix
    body = case.body
    if isinstance(body, dict):
        wait = body.get("wait")
        schema = _body_schema(ctx).get("properties", {}).get("wait", {})
        number = isinstance(wait, int | float) and not isinstance(wait, bool)
        if number and LONGEST_WAIT < wait <= schema.get("maximum", 0):
            body["wait"] = LONGEST_WAIT
