"""The one table of operations (raftlease/operations.py) and its readers agree.

Replaces the tests that regex-scanned protocol.py to keep three hand-written copies
of each operation's fields in step: the wire parser, the core's checks, auth and the
OpenAPI document now read the table, and this file checks each reader against it.
Unit tests only: no node process (results are checked against the state machine).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from raftlease import core
from raftlease.core import LeaseStore
from raftlease.errors import PermissionDeniedError, RaftLeaseError, UnauthenticatedError
from raftlease.operations import (
    BY_NAME,
    ENVELOPE,
    PERMISSIONS,
    TABLE,
    ArgRef,
    Field,
    Limits,
    Operation,
    Rule,
    resolve,
)
from raftlease.protocol import KEYED_OPS, OPS, TASK_OPS, Request, parse_request
from raftlease.server.auth import Principal, Role
from raftlease.server.http.op_schemas import all_routes, op_fields
from raftlease.server.http.openapi import document
from tests.unit.test_http_api import schema_accepts

pytestmark = pytest.mark.timeout(60)

LIMITS = Limits()
DOC = document(LIMITS)
DEDUP = {"cid": "c", "seq": 2, "ack": 1}


def valid(spec: Field) -> Any:
    """A value of ``spec`` that its kind and bounds accept."""
    low, high = resolve(spec.low, LIMITS, {}), resolve(spec.high, LIMITS, {})
    if spec.kind == "keyset":  # hex keys match every keyset's pattern too
        return ["ab", "cd"]
    if spec.pattern:  # a holder key: 64 hex characters
        return "ab" * 32
    if spec.kind in ("string", "text", "value", "prefix"):
        return "x"
    if spec.kind == "address":
        return "127.0.0.1:7001" if spec.wire == "raft" else "127.0.0.1:7002"
    if spec.kind == "enum":
        return spec.choices[-1]
    if spec.kind == "labels":
        return {"gpu": "a100"}
    if spec.kind == "integer":
        return max(low, min(1, high))
    if spec.kind == "progress":
        return 0.5
    return float(max(low, min(1.0, high)))  # seconds, ttl


def message(op: Operation, optional: str | None = None) -> dict[str, Any]:
    """A valid request for ``op`` built from the table: its required fields (those a
    rule asks for too), plus the optional field ``optional`` and what it needs."""
    out: dict[str, Any] = {"id": 1, "op": op.name}
    chosen = op.field(optional) if optional else None
    for spec in op.fields:
        if spec.required or spec.wire == optional:
            out[spec.wire] = valid(spec)
        if spec.needs and chosen is not None and spec.needs == chosen.core:
            out[spec.wire] = valid(spec)
        if chosen is not None and chosen.needs == spec.core:
            out[spec.wire] = valid(spec)
    if op.name == "acquire" and optional != "session":
        out["ttl"] = 5.0  # the ttl_or_session rule: one of them
    if op.name == "revoke" and optional == "token":
        out.pop("lease_id", None)
    if op.mutates:
        out.update(DEDUP)
    return out


def test_the_protocol_op_lists_come_from_the_table() -> None:
    assert {op.name: op.mutates for op in TABLE} == OPS
    assert len(BY_NAME) == len(TABLE)  # no operation twice
    assert {op for op, mutating in OPS.items() if mutating} == core.MUTATING_OPS
    assert {op.name for op in TABLE if op.field("key")} == KEYED_OPS
    assert {op.name for op in TABLE if op.field("queue")} == TASK_OPS


def test_every_operation_field_rule_and_result_is_documented() -> None:
    for op in TABLE:
        assert op.doc and op.permission in PERMISSIONS, op.name
        assert op.results, f"{op.name} lists no result fields"
        for spec in op.fields:
            assert spec.doc, (op.name, spec.wire)
            if spec.kind == "enum":
                assert spec.choices and spec.default in spec.choices
            if spec.needs:
                assert any(f.core == spec.needs for f in op.fields), (op.name, spec.wire)
        for rule in op.rules:
            assert rule.doc and rule.name, op.name
        for result in op.results:
            assert result.doc, (op.name, result.name)
        names = [r.name for r in op.results]
        assert len(names) == len(set(names)), f"{op.name} lists a result field twice"
    assert all(isinstance(step, Field | Rule) for step in ENVELOPE)


@pytest.mark.parametrize("op", TABLE, ids=lambda op: op.name)
def test_a_message_built_from_the_table_parses(op: Operation) -> None:
    """Round trip: the required fields, then each optional one, are accepted by
    parse_request, land in the arguments under the core's names, and (for an
    operation offered over HTTP) are accepted by the OpenAPI request schema."""
    variants = [None, *(f.wire for f in op.fields if not f.required and not f.needs)]
    for optional in variants:
        msg = message(op, optional)
        request = parse_request(msg, LIMITS)
        assert isinstance(request, Request) and request.op == op.name
        for spec in op.fields:
            if spec.wire in msg:
                assert spec.core in request.args, (op.name, spec.wire)
        for route in all_routes():
            if route.op == op.name:
                schemas = _request_schemas(route.path, route.method)
                for name, value in msg.items():
                    if name in ("id", "op", *DEDUP):
                        continue
                    http_name = {p: h for h, p in route.rename}.get(name, name)
                    assert schema_accepts(schemas[http_name], value), (route.path, name)


@pytest.mark.parametrize("op", TABLE, ids=lambda op: op.name)
def test_parse_request_reads_every_field_of_the_table(op: Operation) -> None:
    """A wrong type in any field is refused: the parser reads every field the table
    lists (the old regex test read protocol.py's source for this)."""
    for spec in op.fields:
        msg = message(op, spec.wire)
        msg[spec.wire] = [["not", "a", "scalar"]]
        with pytest.raises(RaftLeaseError):
            parse_request(msg, LIMITS)


def _request_schemas(path: str, method: str) -> dict[str, dict[str, Any]]:
    operation = DOC["paths"][path][method.lower()]
    if "requestBody" in operation:
        return dict(operation["requestBody"]["content"]["application/json"]["schema"]["properties"])
    return {p["name"]: p["schema"] for p in operation.get("parameters", []) if p["in"] == "query"}


def test_every_route_has_request_and_response_schemas_from_the_table() -> None:
    routes = all_routes()
    assert {r.op for r in routes} >= {"acquire", "holder", "task_put", "watch", "status"}
    for route in routes:
        op = BY_NAME[route.op]
        operation = DOC["paths"][route.path][route.method.lower()]
        assert operation["x-raftlease-op"] == route.op
        documented = set(_request_schemas(route.path, route.method))
        to_http = {proto: http for http, proto in route.rename}
        assert documented == {to_http.get(f.wire, f.wire) for f in op.fields}, route.path
        assert {f.name for f in op_fields(route.op, LIMITS)} == {f.wire for f in op.fields}
        content = operation["responses"]["200"]["content"]
        schema = next(iter(content.values()))["schema"]
        # A watch's line is a change or, ending the stream, an error.
        schema = schema["anyOf"][0] if "anyOf" in schema else schema
        assert set(schema["properties"]) >= {r.name for r in op.results}, route.path
        assert set(schema.get("required", [])) >= {r.name for r in op.results if r.always}


# ----------------------------------------------------------------------- auth


def _principal(actions: set[str]) -> Principal:
    role = Role("r", (("", frozenset(actions)),), max_priority=1000)
    return Principal("p", (role,))


@pytest.mark.parametrize("op", TABLE, ids=lambda op: op.name)
def test_auth_applies_the_permission_of_the_table(op: Operation) -> None:
    from raftlease.server.auth import AuthPolicy

    policy = AuthPolicy()
    request = parse_request(message(op), LIMITS)
    everything = _principal({"read", "write", "admin", "shape"})
    nobody = _principal(set())
    if op.permission == "open":
        policy.check(None, request)
        policy.check(nobody, request)
        return
    with pytest.raises(UnauthenticatedError):
        policy.check(None, request)
    with pytest.raises(PermissionDeniedError):
        policy.check(nobody, request)
    if op.permission == "authenticate":
        with pytest.raises(PermissionDeniedError):  # answered by the node, never checked
            policy.check(everything, request)
        return
    policy.check(everything, request)
    wanted = {"key_read": "read", "queue_read": "read", "read_all": "read"}.get(op.permission)
    if wanted is not None:
        policy.check(_principal({"read"}), request)  # read is enough
        with pytest.raises(PermissionDeniedError):
            policy.check(_principal({"write"}), request)


# -------------------------------------------------------------------- results

_ids = itertools.count(1)


def _entry(request: Request, now: int) -> dict[str, Any]:
    """The log entry the node would propose for ``request`` (server/node.py): its
    arguments, the dedup envelope, and the ids the leader draws."""
    entry: dict[str, Any] = {k: v for k, v in request.args.items() if k != "consistency"}
    entry.update(op=request.op, now=now)
    if request.cid is not None:
        entry.update(cid=request.cid, seq=request.seq, ack=request.ack)
    draws = {"acquire": "lid", "acquire_many": "lid", "transfer": "new_lid", "session_open": "sid"}
    draws |= {"task_put": "tid", "task_claim": "aid"}
    draws |= {"budget_spend": "rid", "budget_reserve": "rid"}
    if request.op in draws:
        entry[draws[request.op]] = f"id{next(_ids)}"
    return entry


def _check_result(op: str, result: dict[str, Any]) -> dict[str, Any]:
    assert result.get("ok") is True, (op, result)
    listed = {r.name for r in BY_NAME[op].results}
    answered = set(result) - {"ok"}
    assert answered <= listed, f"{op} answers fields the table does not list: {answered - listed}"
    # consistency and served_by are the node's, added to every read it answers.
    always = {r.name for r in BY_NAME[op].results if r.always} - {"consistency", "served_by"}
    assert always <= answered, f"{op} lacks result fields the table says it always has"
    return result


def test_the_state_machine_answers_the_result_fields_of_the_table() -> None:
    """Each operation answered through the log gives exactly fields the table lists,
    and every field the table says it always gives."""
    store = LeaseStore()
    now = itertools.count(1000, 10)
    seq = itertools.count(1)

    def run(op: str, **fields: Any) -> dict[str, Any]:
        msg: dict[str, Any] = {"id": 1, "op": op, **fields}
        if OPS[op]:
            s = next(seq)
            msg.update(cid="c", seq=s, ack=s)
        result = store.apply(_entry(parse_request(msg, LIMITS), next(now)))
        return _check_result(op, result)

    sid = run("session_open", owner="o", ttl=30.0)["session_id"]
    run("session_keepalive", session_id=sid)
    lid = run("acquire", key="k", owner="o", ttl=30.0)["lease_id"]
    run("acquire", key="k", owner="q", ttl=30.0, wait=5.0)  # queued
    run("acquire", key="s", owner="o", session=sid, value="v")
    run("renew", key="k", lease_id=lid)
    run("proclaim", key="k", lease_id=lid, value="10.0.0.1:80")
    for op in ("holder", "waiters"):
        run(op, key="k")
    run("fence", key="k", token=1)
    run("leases")
    run("sessions")
    new = run("transfer", key="k", lease_id=lid, owner="o2")["lease_id"]
    run("release", key="k", lease_id=new)
    run("revoke", key="s")
    run("session_close", session_id=sid)
    tid = run("task_put", queue="q", payload="{}")["tid"]
    claim = run("task_claim", queue="q", worker="w")
    aid = claim["aid"]
    run("task_heartbeat", queue="q", task_id=tid, attempt_id=aid, progress=1)
    run("task_fail", queue="q", task_id=tid, attempt_id=aid, error="e")
    run("task_put", queue="q", payload="{}", dedup_key="d")
    run("task_put", queue="q", payload="{}", dedup_key="d")  # a duplicate
    run("task_claim", queue="empty", worker="w")  # nothing to claim
    run("task_claim_cancel", queue="q", attempt_id="nobody")
    for op in ("task_get",):
        run(op, queue="q", task_id=tid)
    run("task_stats", queue="q")
    run("task_dead", queue="q")
    run("budget_set", key="b", capacity=10, refill_per_s=0.5)
    run("budget_set", key="b", capacity=10, refill_per_s=1)  # a change
    run("budget_get", key="b")
    run("budget_spend", key="b", amount=8)
    queued = run("budget_spend", key="b", amount=5, wait=5.0)
    run("budget_cancel", key="b", spend_id=queued["spend_id"])
    held = run("budget_reserve", key="b", amount=2, ttl=30.0)
    run("budget_settle", key="b", reservation_id=held["reservation_id"], actual=1)
    held = run("budget_reserve", key="b", amount=1)
    run("budget_cancel", key="b", spend_id=held["reservation_id"])
    run("budget_delete", key="b")


def test_units_are_bounded_by_the_capacity_asked() -> None:
    """The one bound taken from another field (``ArgRef``): units up to capacity."""
    units = BY_NAME["acquire"].field("units")
    assert units is not None and isinstance(units.high, ArgRef)
    base = {"id": 1, "op": "acquire", "key": "k", "owner": "o", "ttl": 5.0, **DEDUP}
    assert parse_request({**base, "capacity": 3, "units": 3}, LIMITS).args["units"] == 3
    with pytest.raises(RaftLeaseError, match="from 1 to 3, got 4"):
        parse_request({**base, "capacity": 3, "units": 4}, LIMITS)
