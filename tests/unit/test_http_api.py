"""The HTTP/JSON API (issue 14; docs/http-api.md).

Unit tests: the OpenAPI document agrees with ``protocol.parse_request`` (every
operation reachable over HTTP appears with every field it reads and its limits; a
sample of requests the schema rejects are rejected by parse_request and the other way
round). Integration tests drive real node processes over HTTP with urllib and raw
sockets: every resource, through a follower (forwarded to the leader), long-poll
acquire woken by a release, watch streams resumed from a revision (NDJSON and SSE),
idempotent retries, hostile input, and the security rules over HTTPS.

The unit half of these tests (no process); the integration half is
tests/integration/test_http_api.py.
"""

from __future__ import annotations

import json
import re
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from raftlease.errors import RaftLeaseError
from raftlease.protocol import OPS, Limits, parse_request
from raftlease.server.http.openapi import STATUS, all_routes, document, op_fields

LIMITS = Limits()
DOC = document(LIMITS)
HTTP_OPS = {route.op for route in all_routes()}
DEDUP = {"cid": "c", "seq": 1, "ack": 1}

# ------------------------------------------------------------------ the schema


def _schemas(route_op: str) -> tuple[dict[str, Any], list[str]]:
    """(properties, required) of an operation, as the document gives them."""
    for path in DOC["paths"].values():
        for operation in path.values():
            if operation["x-raftlease-op"] != route_op:
                continue
            if "requestBody" in operation:
                body = operation["requestBody"]["content"]["application/json"]["schema"]
                props = dict(body["properties"])
                required = list(body.get("required", []))
            else:
                props = {p["name"]: p["schema"] for p in operation.get("parameters", [])}
                required = [p["name"] for p in operation.get("parameters", []) if p["required"]]
            # Elections rename ``key`` to ``name``: compare under the protocol's names.
            if "name" in props:
                props["key"] = props.pop("name")
                required = ["key" if r == "name" else r for r in required]
            return props, required
    raise AssertionError(f"{route_op} is not in the document")


def schema_accepts(schema: dict[str, Any], value: Any) -> bool:
    """The subset of JSON Schema the document uses."""
    if "oneOf" in schema:  # a set of keys (acquire_many): a list, or a map to units
        return sum(schema_accepts(one, value) for one in schema["oneOf"]) == 1
    kind = schema.get("type")
    if isinstance(kind, list):  # [kind, "null"]: an optional field's null is its absence
        if value is None:
            return "null" in kind
        enum = [e for e in schema.get("enum", []) if e is not None]
        schema = {**schema, "type": kind[0], **({"enum": enum} if enum else {})}
        kind = kind[0]
    if kind == "string":
        if not isinstance(value, str):
            return False
        if "enum" in schema and value not in schema["enum"]:
            return False
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            return False
        size = len(value.encode())
        return schema.get("minLength", 0) <= len(value) and size <= schema.get(
            "x-max-utf8-bytes", 1 << 30
        )
    if kind in ("integer", "number"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if kind == "integer" and not isinstance(value, int):
            return False
        return bool(schema["minimum"] <= value <= schema["maximum"])
    if kind == "array":
        return (
            isinstance(value, list)
            and schema["minItems"] <= len(value) <= schema["maxItems"]
            and len(set(map(repr, value))) == len(value)
            and all(schema_accepts(schema["items"], item) for item in value)
        )
    if kind == "object" and "propertyNames" in schema and "minProperties" in schema:
        return (
            isinstance(value, dict)
            and schema["minProperties"] <= len(value) <= schema["maxProperties"]
            and all(
                schema_accepts(schema["propertyNames"], k)
                and schema_accepts({"type": "integer", "minimum": 1, "maximum": 1}, v)
                for k, v in value.items()
            )
        )
    if kind == "object":
        return (
            isinstance(value, dict)
            and len(value) <= schema["maxProperties"]
            and all(isinstance(k, str) and k and isinstance(v, str) for k, v in value.items())
        )
    raise AssertionError(f"unknown schema {schema}")


def valid_value(schema: dict[str, Any]) -> Any:
    if "oneOf" in schema:  # a set of keys
        return ["a", "b"]
    kind = schema["type"]
    kind = kind[0] if isinstance(kind, list) else kind
    if kind == "string":
        if "pattern" in schema:  # the one patterned field: a holder key (64 hex)
            return "ab" * 32
        return schema["enum"][0] if "enum" in schema else "x"
    if kind == "integer":
        return max(1, int(schema["minimum"]))
    if kind == "number":
        return float(schema["minimum"])
    return {}


def probes(schema: dict[str, Any]) -> list[Any]:
    """Values on both sides of each limit, and of wrong types."""
    if "oneOf" in schema:  # a set of keys: counts, duplicates, units, key sizes
        most, size = schema["oneOf"][0]["maxItems"], schema["x-max-utf8-bytes"]
        return [
            [],
            {},
            ["a"],
            {"a": 1},
            {"a": 2},
            {"a": 0},
            {"a": "1"},
            ["a", "a"],
            ["", "b"],
            ["k" * size],
            ["k" * (size + 1)],
            [f"k{i}" for i in range(most)],
            [f"k{i}" for i in range(most + 1)],
            [1],
            "a",
            3,
            True,
        ]
    kind = schema["type"]
    kind = kind[0] if isinstance(kind, list) else kind
    wrong: list[Any] = [None, True, [], {"a": "b"}, "12", 3, 2.5]
    if kind == "string":
        if "enum" in schema:
            return [*schema["enum"], "fastest", *wrong]
        most = schema["x-max-utf8-bytes"]
        patterned = ["ab" * 32, "AB" * 32, "ab" * 31, "ab" * 33] if "pattern" in schema else []
        return ["", "k", "k" * most, "k" * (most + 1), "é" * (most // 2 + 1), *patterned, *wrong]
    if kind in ("integer", "number"):
        low, high = schema["minimum"], schema["maximum"]
        return [low, high, low - 1, high + 1, (low + high) / 2, float("nan"), *wrong]
    most = schema["maxProperties"]
    return [
        {},
        {f"k{i}": "v" for i in range(most)},
        {f"k{i}": "v" for i in range(most + 1)},
        *wrong,
    ]


def base_message(op: str) -> dict[str, Any]:
    props, required = _schemas(op)
    message: dict[str, Any] = {"id": 1, "op": op}
    message.update({name: valid_value(props[name]) for name in required})
    if op == "acquire":
        message["ttl"] = 5.0  # required unless session is given (a cross-field rule)
    if OPS[op]:
        message.update(DEDUP)
    return message


def accepted(message: dict[str, Any]) -> bool:
    try:
        parse_request(message, LIMITS)
    except RaftLeaseError:
        return False
    return True


#: Rules between fields that a per-field schema does not express (each is in the
#: field's description and in docs/http-api.md): ttl or session on an acquire, units
#: up to capacity, lease_ttl or session on a claim.
CROSS_FIELD = {("acquire", "session"), ("acquire", "units"), ("task_claim", "session")}


def test_every_http_operation_is_documented_with_its_fields() -> None:
    documented = {op["x-raftlease-op"] for path in DOC["paths"].values() for op in path.values()}
    assert documented == HTTP_OPS
    assert {"acquire", "renew", "release", "transfer", "holder", "leases", "fence"} <= HTTP_OPS
    assert {"session_open", "session_keepalive", "session_close", "watch", "proclaim"} <= HTTP_OPS
    for op in HTTP_OPS:
        props, required = _schemas(op)
        assert set(props) == {f.name for f in op_fields(op, LIMITS)}
        # A message with exactly the required fields is accepted ...
        assert accepted(base_message(op)), op
        # ... and without any one of them it is not.
        for name in required:
            message = base_message(op)
            del message[name]
            assert not accepted(message), (op, name)
        # Every documented field is read by parse_request: a wrong type is refused.
        for name in props:
            message = {**base_message(op), name: [["not", "a", "scalar"]]}
            assert not accepted(message), f"{op} ignores its documented field {name!r}"


def test_schema_and_parse_request_agree_on_limits() -> None:
    """For every field of every operation: values on both sides of each limit and of
    the wrong type are accepted by the schema exactly when parse_request accepts
    them (cross-field rules aside)."""
    checked = 0
    for op in sorted(HTTP_OPS):
        props, _ = _schemas(op)
        for name, schema in props.items():
            if (op, name) in CROSS_FIELD:
                continue
            for value in probes(schema):
                message = base_message(op)
                message[name] = value
                if value is None:
                    continue  # absent, for the protocol
                by_schema = schema_accepts(schema, value)
                assert by_schema == accepted(message), (op, name, value, by_schema)
                checked += 1
    assert checked > 300


def test_the_status_table_covers_every_wire_code() -> None:
    from raftlease.errors import CODES

    assert set(STATUS) == set(CODES)
    assert STATUS["UNAUTHENTICATED"] == 401 and STATUS["PERMISSION_DENIED"] == 403
    assert set(DOC["components"]["schemas"]["Error"]["properties"]["error"]["required"]) == {
        "code",
        "message",
        "definite",
    }


# ------------------------------------------------------------- HTTP helpers


def call(
    addr: str,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
    timeout: float = 30.0,
) -> tuple[int, dict[str, Any]]:
    """(status, decoded JSON body) of one request."""
    data = json.dumps(body).encode() if body is not None else None
    all_headers = {"Content-Type": "application/json"} if data is not None else {}
    all_headers.update(headers or {})
    scheme = "https" if context is not None else "http"
    request = urllib.request.Request(
        f"{scheme}://{addr}{path}", data=data, method=method, headers=all_headers
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


# ------------------------------------------------------- the TypeScript example

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "typescript" / "lease.ts"


def _tokens_balance(source: str) -> None:
    """A small tokenizer: strings, template literals and comments end; brackets
    balance outside them."""
    stack: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    i = 0
    while i < len(source):
        ch = source[i]
        if source.startswith("//", i):
            i = source.index("\n", i)
        elif source.startswith("/*", i):
            i = source.index("*/", i) + 2
        elif ch in "\"'`":
            j = i + 1
            while source[j] != ch:
                assert ch == "`" or source[j] != "\n", f"unterminated string at {i}"
                j += 2 if source[j] == "\\" else 1
            i = j + 1
        else:
            if ch in "([{":
                stack.append(ch)
            elif ch in ")]}":
                assert stack and stack.pop() == pairs[ch], f"unbalanced {ch!r} at {i}"
            i += 1
    assert not stack, f"unclosed {stack}"


def erase_types(source: str) -> str:
    """TypeScript to JavaScript for the annotation forms lease.ts uses, no others:
    interfaces, ``name: Type`` on declarations, parameters and class fields, and
    return types. The result must pass ``node --check``."""
    source = re.sub(r"^interface \w+ \{\n(?:.*\n)*?\}\n", "", source, flags=re.M)
    source = re.sub(r"^(\s*)(const|let) (\w+): [^=;\n]+(=|;)", r"\1\2 \3 \4", source, flags=re.M)
    source = source.replace(" ;", ";")
    source = re.sub(r"^\s+\w+: [\w<>|, ]+;\n", "", source, flags=re.M)

    def signature(match: re.Match[str]) -> str:
        line = re.sub(r"(\w+): [\w<>|\[\] ]+(?=[,)])", r"\1", match.group(0))
        return re.sub(r"\): [^{]+\{", ") {", line)

    return re.sub(r"^\s*(async function|function|constructor).*\{$", signature, source, flags=re.M)


def test_the_typescript_example_is_plausible() -> None:
    source = EXAMPLE.read_text()
    _tokens_balance(source)
    for resource in ("/v1/leases/acquire", "/v1/leases/renew", "/v1/leases/release"):
        assert resource in source and any(r.path == resource for r in all_routes())
    assert "Idempotency-Key" in source and "fetch(" in source
    script = erase_types(source)
    _tokens_balance(script)
    assert "interface " not in script and not re.search(r"\w: (string|number|any)\b", script)


def _body_schema(path: str) -> dict[str, Any]:
    content = DOC["paths"][path]["post"]["requestBody"]["content"]
    return dict(content["application/json"]["schema"])


def test_exclusive_fields_and_byte_limits_are_in_the_schema_not_only_prose() -> None:
    """Issue 44: "ttl or session, not both" lived only in prose, and string limits
    said characters where the server counts UTF-8 bytes. The document now states the
    rule (oneOf / not) so a schema-valid body is one parse_request accepts, and each
    byte limit says it is one."""
    import jsonschema

    acquire = _body_schema("/v1/leases/acquire")
    base = {"key": "k", "owner": "o"}

    def valid(schema: dict[str, Any], body: dict[str, Any]) -> bool:
        return jsonschema.Draft202012Validator(schema).is_valid(body)

    def parses(op: str, body: dict[str, Any]) -> bool:
        try:
            parse_request({**body, "id": 1, "op": op, "cid": "c", "seq": 1, "ack": 1}, LIMITS)
        except RaftLeaseError:
            return False
        return True

    for body in ({"ttl": 5}, {"session": "s1"}, {"ttl": 5, "session": "s1"}, {}):
        assert valid(acquire, {**base, **body}) == parses("acquire", {**base, **body}), body
    assert not valid(acquire, {**base, "ttl": 5, "session": "s1"})
    claim = _body_schema("/v1/queues/claim")
    both = {"queue": "q", "worker": "w", "lease_ttl": 5, "session": "s1"}
    assert not valid(claim, both) and not parses("task_claim", both)
    assert valid(claim, {"queue": "q", "worker": "w"})
    key = acquire["properties"]["key"]
    assert key["x-max-utf8-bytes"] == key["maxLength"] and "bytes of UTF-8" in key["description"]


def test_an_integral_json_number_is_an_integer_as_json_schema_counts_it() -> None:
    # "type": "integer" admits 86.0 and 1e3; the body's integer fields take them.
    from raftlease.server.http.parts import bounded_int, integral_float

    def loads(text: str) -> Any:
        return json.loads(text, parse_int=bounded_int, parse_float=integral_float)

    body = loads('{"units": 86.0, "capacity": 1e3, "ttl": 2.5, "big": 1e300, "zero": -0.0}')
    assert body == {"units": 86, "capacity": 1000, "ttl": 2.5, "big": 1e300, "zero": 0}
    assert type(body["units"]) is int and type(body["big"]) is float
    request = parse_request(
        {"id": 1, "op": "acquire", "key": "k", "owner": "o", "ttl": 5, "cid": "c", "seq": 1,
         "ack": 1, **loads('{"capacity": 4.0, "units": 2.0}')},
        LIMITS,
    )  # fmt: skip
    assert request.args["units"] == 2


def test_the_document_names_the_fields_the_http_layer_sets() -> None:
    from raftlease.server.http import http_api, openapi

    assert openapi.RESERVED == http_api.RESERVED
    body = DOC["paths"]["/v1/leases/acquire"]["post"]["requestBody"]["content"]
    assert set(body["application/json"]["schema"]["propertyNames"]["not"]["enum"]) == set(
        http_api.RESERVED
    )


# ------------------------------------------------------------ long-poll endings


def test_a_spend_granted_after_the_last_poll_is_answered_granted_over_http() -> None:
    """The HTTP front's half of tests/integration/test_budgets.py's race: the wait ends
    (the last poll said ``queued``), then the withdrawal finds the spend granted. The
    answer must be the grant (the units stay spent), never BUDGET_EXHAUSTED. The race
    cannot be timed on a real node, so the handler runs here on its own, its
    ``run`` answering as the state machine does (core/budget.py's cancel answer)."""
    import asyncio
    from types import SimpleNamespace

    from raftlease.server.http.http_api import HttpApi

    calls: list[str] = []

    async def run(op: str, fields: dict[str, Any], caller: Any, key: str | None = None) -> Any:
        calls.append(op)
        if op == "await_spend":
            return {"state": "queued"}
        assert op == "budget_cancel", op
        return {"granted": True, "amount": 2, "granted_at": 1234}

    api = HttpApi.__new__(HttpApi)
    api.run = run  # type: ignore[method-assign]
    api._tasks = set()
    request = SimpleNamespace(transport=SimpleNamespace(is_closing=lambda: False))
    queued = {"key": "b", "spend_id": "s1", "amount": 2}

    async def main() -> dict[str, Any]:
        return await api._await_spend(request, {"wait": 0.05}, queued, None)  # type: ignore[arg-type]

    answer = asyncio.run(main())
    assert calls[-1] == "budget_cancel" and "await_spend" in calls, calls
    assert answer["granted"] is True and answer["state"] == "granted", answer
    assert answer["amount"] == 2 and answer["granted_at"] == 1234, answer
