"""Unit tests of the sans-IO wire protocol (``raftlease.protocol``) and of the error
registry it answers with (``raftlease.errors``). No sockets, no clocks."""

from __future__ import annotations

import math
import re
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlease import core, errors
from raftlease.core.checks import LEADER_OPS
from raftlease.errors import (
    BadRequestError,
    FrameTooLargeError,
    InternalError,
    InvalidArgumentError,
    LeaseHeldError,
    RaftLeaseError,
)
from raftlease.protocol import (
    _ATTEMPT_OPS,
    _TASK_ID_OPS,
    CONSISTENCY_MODES,
    DEFAULT_MAX_FRAME,
    HEADER,
    KEYED_OPS,
    OPS,
    TASK_OPS,
    FrameDecoder,
    Limits,
    ProtocolError,
    Request,
    decode_body,
    encode_frame,
    error_response,
    ok_response,
    parse_request,
    request_id,
)

pytestmark = pytest.mark.timeout(60)

LIMITS = Limits()


def frame_of_body(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


# ------------------------------------------------------------------ encode_frame


def test_encode_frame_header_is_big_endian_body_length() -> None:
    message = {"id": 7, "op": "ping"}
    frame = encode_frame(message)
    body = msgpack.packb(message, use_bin_type=True)
    assert HEADER.size == 4
    assert frame[:4] == len(body).to_bytes(4, "big")
    assert frame[4:] == body


def test_encode_frame_round_trip_keeps_types() -> None:
    message: dict[str, Any] = {
        "id": 2**63 - 1,
        "op": "acquire",
        "key": "ключ/é",
        "blob": b"\x00\xff",
        "ttl": 1.25,
        "nested": {"a": [1, 2, None, True]},
    }
    frames = list(FrameDecoder().feed(encode_frame(message)))
    assert frames == [message]
    assert isinstance(frames[0]["blob"], bytes)
    assert isinstance(frames[0]["ttl"], float)


scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
)
messages = st.dictionaries(
    st.text(max_size=10),
    st.recursive(
        scalar,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
        ),
        max_leaves=10,
    ),
    max_size=6,
)


@settings(max_examples=100, deadline=None)
@given(
    batch=st.lists(messages, min_size=1, max_size=5),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
)
def test_frames_survive_any_split_of_the_stream(
    batch: list[dict[str, Any]], cuts: list[int]
) -> None:
    stream = b"".join(encode_frame(m) for m in batch)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    decoder = FrameDecoder()
    out: list[dict[str, Any]] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    assert out == batch


# ------------------------------------------------------------------ FrameDecoder


def test_decoder_frames_fed_byte_by_byte() -> None:
    first = {"id": 1, "op": "ping"}
    second = {"id": 2, "op": "holder", "key": "a" * 300}
    stream = encode_frame(first) + encode_frame(second)
    boundary = len(encode_frame(first))
    decoder = FrameDecoder()
    seen: list[tuple[int, dict[str, Any]]] = []
    for i in range(len(stream)):
        for message in decoder.feed(stream[i : i + 1]):
            seen.append((i + 1, message))
    # Each frame appears exactly when its last byte arrives, not before.
    assert seen == [(boundary, first), (len(stream), second)]


def test_decoder_several_frames_in_one_feed() -> None:
    batch = [{"id": i, "op": "ping"} for i in range(10)]
    decoder = FrameDecoder()
    assert list(decoder.feed(b"".join(encode_frame(m) for m in batch))) == batch
    # Nothing is left over.
    assert list(decoder.feed(b"")) == []


def test_decoder_keeps_partial_tail_for_the_next_feed() -> None:
    a, b = encode_frame({"id": 1}), encode_frame({"id": 2})
    decoder = FrameDecoder()
    assert list(decoder.feed(a + b[:3])) == [{"id": 1}]
    assert list(decoder.feed(b[3:-1])) == []
    assert list(decoder.feed(b[-1:])) == [{"id": 2}]


def test_decoder_header_above_max_frame_raises_before_the_body_arrives() -> None:
    decoder = FrameDecoder(max_frame=1000)
    header = HEADER.pack(100 * 1024 * 1024)
    # Three bytes of a header are not yet a header.
    assert list(decoder.feed(header[:3])) == []
    with pytest.raises(FrameTooLargeError) as info:
        list(decoder.feed(header[3:]))
    assert info.value.code == "FRAME_TOO_LARGE"
    assert info.value.definite
    assert str(100 * 1024 * 1024) in info.value.message
    assert "1000" in info.value.message


def test_decoder_default_limit_and_exact_limit() -> None:
    assert FrameDecoder().max_frame == DEFAULT_MAX_FRAME
    frame = encode_frame({"id": 1, "op": "holder", "key": "x" * 100})
    body_len = len(frame) - HEADER.size
    assert list(FrameDecoder(max_frame=body_len).feed(frame)) == [
        {"id": 1, "op": "holder", "key": "x" * 100}
    ]
    with pytest.raises(FrameTooLargeError):
        list(FrameDecoder(max_frame=body_len - 1).feed(frame))


def test_decoder_yields_good_frames_before_a_bad_one() -> None:
    good = {"id": 1, "op": "ping"}
    decoder = FrameDecoder(max_frame=1024)
    frames = decoder.feed(encode_frame(good) + HEADER.pack(1 << 30))
    assert next(frames) == good
    with pytest.raises(FrameTooLargeError):
        next(frames)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\xc1", id="never-used-byte"),
        pytest.param(b"\x82\xa1", id="truncated-map"),
        pytest.param(b"", id="empty-body"),
        pytest.param(b"\x80\x80", id="extra-data"),
        pytest.param(b"\x81\x01\x02", id="integer-map-key"),
        pytest.param(b"\x81\xa1k\xa3\xed\xa0\x80", id="invalid-utf8-string"),
        pytest.param(b"\xdf\xff\xff\xff\xff", id="map-announcing-4G-entries"),
    ],
)
def test_decoder_undecodable_body_raises_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        list(FrameDecoder().feed(frame_of_body(body)))
    assert isinstance(info.value, RaftLeaseError)
    assert info.value.code == "BAD_REQUEST"
    assert info.value.definite
    assert "undecodable" in info.value.message


@pytest.mark.parametrize(
    "value",
    [[1, 2, 3], 42, "text", None, b"bytes", True, 1.5],
    ids=["list", "int", "str", "nil", "bin", "bool", "float"],
)
def test_decoder_non_map_body_raises_protocol_error(value: Any) -> None:
    body = msgpack.packb(value, use_bin_type=True)
    with pytest.raises(ProtocolError) as info:
        list(FrameDecoder().feed(frame_of_body(body)))
    assert info.value.code == "BAD_REQUEST"
    assert "map" in info.value.message
    with pytest.raises(ProtocolError):
        decode_body(body)


# ------------------------------------------------------------- good requests

SESSION = {"cid": "client-1", "seq": 5, "ack": 3}


def test_parse_acquire() -> None:
    msg = {"id": 1, "op": "acquire", "key": "k", "owner": "o", "ttl": 1.5, **SESSION}
    assert parse_request(msg, LIMITS) == Request(
        id=1,
        op="acquire",
        args={"key": "k", "owner": "o", "ttl": 1500},
        cid="client-1",
        seq=5,
        ack=3,
    )


@pytest.mark.parametrize(
    ("ttl", "ms"),
    [(2, 2000), (0.5, 500), (3600, 3_600_000), (3600.0, 3_600_000), (1.0004, 1000), (0.7777, 778)],
)
def test_parse_acquire_ttl_to_milliseconds(ttl: float, ms: int) -> None:
    msg = {"id": 1, "op": "acquire", "key": "k", "owner": "o", "ttl": ttl, **SESSION}
    assert parse_request(msg, LIMITS).args["ttl"] == ms


def test_parse_renew_with_and_without_ttl() -> None:
    msg = {"id": 2, "op": "renew", "key": "k", "lease_id": "L", **SESSION}
    assert parse_request(msg, LIMITS) == Request(
        id=2, op="renew", args={"key": "k", "lid": "L"}, cid="client-1", seq=5, ack=3
    )
    assert parse_request({**msg, "ttl": 9}, LIMITS).args == {"key": "k", "lid": "L", "ttl": 9000}
    assert "ttl" not in parse_request({**msg, "ttl": None}, LIMITS).args


def test_parse_release() -> None:
    msg = {"id": 3, "op": "release", "key": "k", "lease_id": "L", **SESSION}
    assert parse_request(msg, LIMITS) == Request(
        id=3, op="release", args={"key": "k", "lid": "L"}, cid="client-1", seq=5, ack=3
    )


def test_parse_holder_ignores_session_fields() -> None:
    msg = {"id": 4, "op": "holder", "key": "k", **SESSION}
    request = parse_request(msg, LIMITS)
    assert (request.id, request.op, request.args["key"]) == (4, "holder", "k")
    assert (request.cid, request.seq, request.ack) == (None, None, None)
    assert set(request.args) <= {"key", "consistency"}


def test_parse_leases_defaults_and_explicit() -> None:
    request = parse_request({"id": 5, "op": "leases"}, LIMITS)
    assert (request.id, request.op, request.cid) == (5, "leases", None)
    assert (request.args["prefix"], request.args["limit"]) == ("", 1000)
    msg = {"id": 5, "op": "leases", "prefix": "a/", "limit": LIMITS.max_list}
    args = parse_request(msg, LIMITS).args
    assert (args["prefix"], args["limit"]) == ("a/", LIMITS.max_list)
    assert set(args) <= {"prefix", "limit", "consistency"}
    small = Limits(max_list=10)
    assert parse_request({"id": 5, "op": "leases"}, small).args["limit"] == 10


@pytest.mark.parametrize("op", ["holder", "leases"])
def test_parse_read_consistency(op: str) -> None:
    base = good(op)
    assert parse_request(base, LIMITS).args["consistency"] == "linearizable"
    for mode in CONSISTENCY_MODES:
        assert parse_request({**base, "consistency": mode}, LIMITS).args["consistency"] == mode
    for bad in ("eventual", "", "LOG", 1, ["log"]):
        with pytest.raises(InvalidArgumentError, match="consistency"):
            parse_request({**base, "consistency": bad}, LIMITS)


@pytest.mark.parametrize("op", ["status", "ping"])
def test_parse_status_and_ping(op: str) -> None:
    assert parse_request({"id": 6, "op": op, "junk": [1]}, LIMITS) == Request(id=6, op=op)


@pytest.mark.parametrize("rid", [0, 1, 2**63 - 1])
def test_parse_accepts_id_range(rid: int) -> None:
    assert parse_request({"id": rid, "op": "ping"}, LIMITS).id == rid
    assert request_id({"id": rid}) == rid


def test_parse_key_limit_counts_utf8_bytes() -> None:
    limits = Limits(max_key_bytes=8, max_owner_bytes=4)
    ok = {"id": 1, "op": "acquire", "key": "é" * 4, "owner": "ab", "ttl": 1, **SESSION}
    assert parse_request(ok, limits).args["key"] == "éééé"
    with pytest.raises(InvalidArgumentError, match="'key' is 10 bytes; the limit is 8"):
        parse_request({**ok, "key": "é" * 5}, limits)
    with pytest.raises(InvalidArgumentError, match="'owner' is 6 bytes; the limit is 4"):
        parse_request({**ok, "owner": "€€"}, limits)


def test_test_clock_is_not_a_production_operation() -> None:
    assert "test_clock" not in OPS
    with pytest.raises(BadRequestError, match="unknown operation 'test_clock'"):
        parse_request({"id": 1, "op": "test_clock", "rate": 2}, LIMITS)


def test_test_clock_control_fields() -> None:
    """The test build's clock control validates its own fields (and a bad one
    leaves the clock unchanged)."""
    from raftlease.clock import AdjustableClock
    from raftlease.testing.node import clock_control

    clock = AdjustableClock()
    control = clock_control(clock)
    assert control({"id": 1, "op": "test_clock", "rate": 2, "jump": 0})["rate"] == 2.0
    cases: list[tuple[str, Any, type[RaftLeaseError]]] = [
        ("rate", 0, InvalidArgumentError),
        ("rate", 100, InvalidArgumentError),
        ("rate", math.nan, InvalidArgumentError),
        ("rate", True, BadRequestError),
        ("jump", -1, InvalidArgumentError),
        ("jump", math.inf, InvalidArgumentError),
        ("jump", "1", BadRequestError),
    ]
    for name, value, exc in cases:
        with pytest.raises(exc, match=f"'{name}'"):
            control({"id": 1, "op": "test_clock", name: value})
        assert clock.rate == 2.0


def test_ops_table() -> None:
    # Every mutating wire operation is one the state machine deduplicates, and back.
    assert {op for op, mutating in OPS.items() if mutating} == core.MUTATING_OPS
    assert {"acquire", "renew", "release", "holder", "leases", "status", "ping"} <= set(OPS)
    # The state machine's internal expiry entry is never a client operation.
    assert "tick" not in OPS
    assert not LEADER_OPS & set(OPS)  # tick, reserve, extend: the leader's only


# -------------------------------------------------------------- bad requests


_LEASE_EFFECT_OPS = ("lease_effect_begin", "lease_effect_commit")


def good(op: str) -> dict[str, Any]:
    """A valid request for ``op``; bad cases change exactly one field."""
    base: dict[str, Any] = {"id": 11, "op": op}
    if op in KEYED_OPS:
        base["key"] = "k"
    if op == "acquire":
        base.update(owner="o", ttl=1.0)
    if op == "acquire_many":  # issue 40: several keys, all or none
        base.update(owner="o", ttl=1.0, keys=["a", "b"])
    if op in ("transfer", "session_open"):
        base["owner"] = "o2"
    if op in ("renew", "release", "transfer", "await_lease", "proclaim", *_LEASE_EFFECT_OPS):
        base["lease_id"] = "L"
    if op in _LEASE_EFFECT_OPS:  # issue 41: effects under a lease
        base["effect"] = "charge:1"
    if op == "proclaim":
        base["value"] = "10.0.0.7:8000"
    if op == "session_open":
        base["ttl"] = 5.0
    if op in ("session_keepalive", "session_close"):
        base["session_id"] = "S"
    if op == "session_keepalive_many":  # keep-alives of several sessions at once
        base["session_ids"] = ["a1", "b2"]
    if op == "fence":
        base["token"] = 3
    if op == "await_lease":
        base["timeout"] = 1.0
    if op == "request_yield":  # issue 40: cooperative preemption
        base["deadline"] = 5.0
    if op in TASK_OPS:  # issue 12: task queues
        base["queue"] = "q"
        if op in _TASK_ID_OPS:
            base["task_id"] = "T"
        if op in _ATTEMPT_OPS:
            base["attempt_id"] = "A"
        if op == "task_put":
            base["payload"] = "{}"
        if op == "task_claim":
            base["worker"] = "w"
        if op in ("task_effect_begin", "task_effect_commit"):  # issue 41: effects
            base["effect"] = "charge:1"
        if op in ("await_claim", "await_task"):
            base["timeout"] = 1.0
    if op.startswith("budget_") or op == "await_spend":  # issue 42: shared budgets
        if op == "budget_set":
            base.update(capacity=10, refill_per_s=0.5)
        if op in ("budget_spend", "budget_reserve"):
            base["amount"] = 2
        if op == "budget_settle":
            base.update(reservation_id="R", actual=1)
        if op in ("budget_cancel", "await_spend"):
            base["spend_id"] = "R"
        if op == "await_spend":
            base["timeout"] = 1.0
    if OPS[op]:
        base.update(cid="c", seq=2, ack=1)
    return base


MISSING = object()

# (case id, op, field, value or MISSING, error class, substring the message must hold)
BAD_CASES: list[tuple[str, str, str, Any, type[RaftLeaseError], str]] = [
    # id
    ("id-missing", "ping", "id", MISSING, BadRequestError, "'id'"),
    ("id-bool", "ping", "id", True, BadRequestError, "'id'"),
    ("id-false", "ping", "id", False, BadRequestError, "'id'"),
    ("id-negative", "ping", "id", -1, BadRequestError, "'id'"),
    ("id-2^63", "ping", "id", 2**63, BadRequestError, "'id'"),
    ("id-float", "ping", "id", 1.0, BadRequestError, "'id'"),
    ("id-string", "ping", "id", "1", BadRequestError, "'id'"),
    ("id-nil", "ping", "id", None, BadRequestError, "'id'"),
    # op
    ("op-unknown", "ping", "op", "explode", BadRequestError, "unknown operation 'explode'"),
    ("op-tick", "ping", "op", "tick", BadRequestError, "unknown operation 'tick'"),
    ("op-case", "ping", "op", "PING", BadRequestError, "unknown operation"),
    ("op-missing", "ping", "op", MISSING, BadRequestError, "unknown operation None"),
    ("op-int", "ping", "op", 5, BadRequestError, "unknown operation 5"),
    ("op-list", "ping", "op", ["ping"], BadRequestError, "unknown operation"),
    ("op-bytes", "ping", "op", b"ping", BadRequestError, "unknown operation"),
]
for _op in ("acquire", "renew", "release", "holder", "transfer", "fence", "await_lease",
            *_LEASE_EFFECT_OPS):  # fmt: skip
    BAD_CASES += [
        (f"{_op}-key-missing", _op, "key", MISSING, BadRequestError, "missing field 'key'"),
        (f"{_op}-key-nil", _op, "key", None, BadRequestError, "missing field 'key'"),
        (f"{_op}-key-empty", _op, "key", "", InvalidArgumentError, "'key' must not be empty"),
        (f"{_op}-key-long", _op, "key", "k" * 513, InvalidArgumentError, "'key' is 513 bytes"),
        (f"{_op}-key-int", _op, "key", 7, BadRequestError, "'key' must be a string, not int"),
        (f"{_op}-key-bytes", _op, "key", b"k", BadRequestError, "'key' must be a string"),
        (f"{_op}-key-list", _op, "key", ["k"], BadRequestError, "'key' must be a string"),
    ]
BAD_CASES += [
    ("owner-missing", "acquire", "owner", MISSING, BadRequestError, "missing field 'owner'"),
    ("owner-empty", "acquire", "owner", "", InvalidArgumentError, "'owner' must not be empty"),
    ("owner-long", "acquire", "owner", "o" * 257, InvalidArgumentError, "'owner' is 257 bytes"),
    ("owner-int", "acquire", "owner", 3, BadRequestError, "'owner' must be a string"),
    ("owner-map", "acquire", "owner", {"a": 1}, BadRequestError, "'owner' must be a string"),
    ("ttl-missing", "acquire", "ttl", MISSING, BadRequestError, "missing field 'ttl'"),
    ("ttl-nil", "acquire", "ttl", None, BadRequestError, "missing field 'ttl'"),
    ("ttl-zero", "acquire", "ttl", 0, InvalidArgumentError, "ttl 0 s"),
    ("ttl-zero-float", "acquire", "ttl", 0.0, InvalidArgumentError, "ttl 0.0 s"),
    ("ttl-negative", "acquire", "ttl", -5, InvalidArgumentError, "ttl -5 s"),
    ("ttl-nan", "acquire", "ttl", math.nan, InvalidArgumentError, "ttl nan s"),
    ("ttl-inf", "acquire", "ttl", math.inf, InvalidArgumentError, "ttl inf s"),
    ("ttl-minus-inf", "acquire", "ttl", -math.inf, InvalidArgumentError, "ttl -inf s"),
    ("ttl-bool", "acquire", "ttl", True, BadRequestError, "'ttl' must be a number"),
    ("ttl-string", "acquire", "ttl", "10", BadRequestError, "'ttl' must be a number"),
    ("ttl-list", "acquire", "ttl", [10], BadRequestError, "'ttl' must be a number"),
    ("ttl-above-max", "acquire", "ttl", 3600.001, InvalidArgumentError, "ttl 3600.001 s"),
    ("ttl-huge", "acquire", "ttl", 1e300, InvalidArgumentError, "ttl 1e+300 s"),
    ("ttl-huge-int", "acquire", "ttl", 2**64 - 1, InvalidArgumentError, "ttl"),
    ("ttl-below-min", "acquire", "ttl", 0.499, InvalidArgumentError, "ttl 0.499 s"),
    ("renew-ttl-zero", "renew", "ttl", 0, InvalidArgumentError, "ttl 0 s"),
    ("renew-ttl-bool", "renew", "ttl", False, BadRequestError, "'ttl' must be a number"),
    ("renew-ttl-nan", "renew", "ttl", math.nan, InvalidArgumentError, "ttl nan s"),
    ("renew-ttl-big", "renew", "ttl", 1e9, InvalidArgumentError, "ttl"),
]
for _op in ("renew", "release", "transfer", "await_lease", *_LEASE_EFFECT_OPS):
    BAD_CASES += [
        (f"{_op}-lid-missing", _op, "lease_id", MISSING, BadRequestError, "'lease_id'"),
        (f"{_op}-lid-empty", _op, "lease_id", "", InvalidArgumentError, "'lease_id'"),
        (f"{_op}-lid-int", _op, "lease_id", 1, BadRequestError, "'lease_id'"),
        (f"{_op}-lid-long", _op, "lease_id", "L" * 129, InvalidArgumentError, "'lease_id'"),
    ]
BAD_CASES += [
    ("transfer-owner-missing", "transfer", "owner", MISSING, BadRequestError, "'owner'"),
    ("transfer-owner-int", "transfer", "owner", 5, BadRequestError, "'owner'"),
    ("fence-token-missing", "fence", "token", MISSING, BadRequestError, "'token'"),
    ("fence-token-negative", "fence", "token", -1, InvalidArgumentError, "'token'"),
    ("fence-token-float", "fence", "token", 1.5, BadRequestError, "'token'"),
    ("await-timeout-missing", "await_lease", "timeout", MISSING, BadRequestError, "'timeout'"),
    ("await-timeout-negative", "await_lease", "timeout", -1, InvalidArgumentError, "timeout"),
    ("await-timeout-huge", "await_lease", "timeout", 1e9, InvalidArgumentError, "timeout"),
    ("await-timeout-nan", "await_lease", "timeout", math.nan, InvalidArgumentError, "timeout"),
    ("acquire-wait-negative", "acquire", "wait", -1, InvalidArgumentError, "wait"),
    ("acquire-wait-string", "acquire", "wait", "5", BadRequestError, "'wait'"),
    ("acquire-priority-huge", "acquire", "priority", 10**6, InvalidArgumentError, "'priority'"),
    ("acquire-priority-float", "acquire", "priority", 1.5, BadRequestError, "'priority'"),
    ("watch-prefix-int", "watch", "prefix", 3, BadRequestError, "'prefix'"),
    ("watch-from-negative", "watch", "from_revision", -1, InvalidArgumentError, "from_revision"),
    ("watch-from-string", "watch", "from_revision", "1", BadRequestError, "from_revision"),
    ("prefix-int", "leases", "prefix", 1, BadRequestError, "'prefix'"),
    ("prefix-nil", "leases", "prefix", None, BadRequestError, "'prefix'"),
    ("prefix-bytes", "leases", "prefix", b"a", BadRequestError, "'prefix'"),
    ("prefix-long", "leases", "prefix", "p" * 513, InvalidArgumentError, "'prefix'"),
    ("limit-zero", "leases", "limit", 0, InvalidArgumentError, "'limit'"),
    ("limit-negative", "leases", "limit", -1, InvalidArgumentError, "'limit'"),
    ("limit-above-max", "leases", "limit", 10_001, InvalidArgumentError, "'limit'"),
    ("limit-string", "leases", "limit", "5", BadRequestError, "'limit'"),
    ("limit-bool", "leases", "limit", True, BadRequestError, "'limit'"),
    ("limit-float", "leases", "limit", 5.0, BadRequestError, "'limit'"),
    ("limit-nil", "leases", "limit", None, BadRequestError, "'limit'"),
]
BAD_CASES += [
    ("acquire-capacity-zero", "acquire", "capacity", 0, InvalidArgumentError, "'capacity'"),
    ("acquire-capacity-huge", "acquire", "capacity", 10**7, InvalidArgumentError, "'capacity'"),
    ("acquire-capacity-str", "acquire", "capacity", "2", BadRequestError, "'capacity'"),
    ("acquire-units-over-cap", "acquire", "units", 2, InvalidArgumentError, "'units'"),
    ("acquire-units-zero", "acquire", "units", 0, InvalidArgumentError, "'units'"),
    ("acquire-units-float", "acquire", "units", 1.0, BadRequestError, "'units'"),
    ("acquire-session-int", "acquire", "session", 7, BadRequestError, "'session'"),
    ("acquire-session-empty", "acquire", "session", "", InvalidArgumentError, "'session'"),
    ("acquire-session-and-ttl", "acquire", "session", "S", InvalidArgumentError, "'session'"),
    ("acquire-value-int", "acquire", "value", 3, BadRequestError, "'value'"),
    ("acquire-value-long", "acquire", "value", "v" * 4097, InvalidArgumentError, "'value'"),
    ("proclaim-value-missing", "proclaim", "value", MISSING, BadRequestError, "'value'"),
    ("proclaim-value-bytes", "proclaim", "value", b"x", BadRequestError, "'value'"),
    ("proclaim-value-long", "proclaim", "value", "v" * 4097, InvalidArgumentError, "'value'"),
    ("proclaim-key-missing", "proclaim", "key", MISSING, BadRequestError, "'key'"),
    ("proclaim-lid-missing", "proclaim", "lease_id", MISSING, BadRequestError, "'lease_id'"),
    ("open-owner-missing", "session_open", "owner", MISSING, BadRequestError, "'owner'"),
    ("open-owner-int", "session_open", "owner", 1, BadRequestError, "'owner'"),
    ("open-ttl-missing", "session_open", "ttl", MISSING, BadRequestError, "'ttl'"),
    ("open-ttl-zero", "session_open", "ttl", 0, InvalidArgumentError, "ttl 0 s"),
    ("open-ttl-nan", "session_open", "ttl", math.nan, InvalidArgumentError, "ttl nan s"),
    ("keepalive-ttl-str", "session_keepalive", "ttl", "1", BadRequestError, "'ttl'"),
    ("many-sids-missing", "session_keepalive_many", "session_ids", MISSING, BadRequestError,
     "'session_ids'"),
    ("many-sids-str", "session_keepalive_many", "session_ids", "S", BadRequestError,
     "'session_ids'"),
    ("many-sids-empty", "session_keepalive_many", "session_ids", [], InvalidArgumentError,
     "'session_ids'"),
    ("many-sids-too-many", "session_keepalive_many", "session_ids",
     [f"s{i}" for i in range(257)], InvalidArgumentError, "'session_ids'"),
    ("many-sids-twice", "session_keepalive_many", "session_ids", ["a", "a"],
     InvalidArgumentError, "'session_ids'"),
    ("many-sids-int", "session_keepalive_many", "session_ids", [1], BadRequestError,
     "'session_ids'"),
    ("many-sids-long", "session_keepalive_many", "session_ids", ["a" * 129],
     InvalidArgumentError, "'session_ids'"),
    ("many-sids-not-hex", "session_keepalive_many", "session_ids", ["a1", "S2"],
     InvalidArgumentError, "'session_ids'"),
]  # fmt: skip
for _op in ("session_keepalive", "session_close"):
    BAD_CASES += [
        (f"{_op}-sid-missing", _op, "session_id", MISSING, BadRequestError, "'session_id'"),
        (f"{_op}-sid-int", _op, "session_id", 5, BadRequestError, "'session_id'"),
        (f"{_op}-sid-long", _op, "session_id", "s" * 129, InvalidArgumentError, "'session_id'"),
    ]
# Issue 13: revoke (all leases on a key, or one by lease id or token) and waiters.
for _op in ("revoke", "waiters"):
    BAD_CASES += [
        (f"{_op}-key-missing", _op, "key", MISSING, BadRequestError, "missing field 'key'"),
        (f"{_op}-key-empty", _op, "key", "", InvalidArgumentError, "'key' must not be empty"),
        (f"{_op}-key-long", _op, "key", "k" * 513, InvalidArgumentError, "'key' is 513 bytes"),
        (f"{_op}-key-int", _op, "key", 7, BadRequestError, "'key' must be a string, not int"),
    ]
BAD_CASES += [
    # Issue 39: lease certificates' holder key and the audit trail's reads.
    (
        "acquire-holder-key-upper",
        "acquire",
        "holder_key",
        "AB" * 32,
        InvalidArgumentError,
        "holder_key",
    ),
    ("acquire-holder-key-int", "acquire", "holder_key", 5, BadRequestError, "holder_key"),
    (
        "renew-holder-key-short",
        "renew",
        "holder_key",
        "ab" * 31,
        InvalidArgumentError,
        "holder_key",
    ),
    ("audit-key-int", "audit", "key", 5, BadRequestError, "'key'"),
    ("audit-principal-int", "audit", "principal", 5, BadRequestError, "'principal'"),
    ("audit-since-negative", "audit", "since", -1, InvalidArgumentError, "'since'"),
    ("audit-limit-zero", "audit", "limit", 0, InvalidArgumentError, "'limit'"),
    ("audit-limit-huge", "audit", "limit", 10**5, InvalidArgumentError, "'limit'"),
]
BAD_CASES += [
    ("revoke-lid-int", "revoke", "lease_id", 5, BadRequestError, "'lease_id'"),
    ("revoke-lid-empty", "revoke", "lease_id", "", InvalidArgumentError, "'lease_id'"),
    ("revoke-lid-long", "revoke", "lease_id", "L" * 129, InvalidArgumentError, "'lease_id'"),
    ("revoke-token-zero", "revoke", "token", 0, InvalidArgumentError, "'token'"),
    ("revoke-token-float", "revoke", "token", 1.5, BadRequestError, "'token'"),
    ("revoke-token-str", "revoke", "token", "3", BadRequestError, "'token'"),
    ("waiters-limit-zero", "waiters", "limit", 0, InvalidArgumentError, "'limit'"),
    ("sessions-limit-str", "sessions", "limit", "5", BadRequestError, "'limit'"),
    ("sessions-mode", "sessions", "consistency", "eventual", InvalidArgumentError, "consistency"),
]
# Issue 12: task queues. Every task op names its queue; most a task or an attempt.
for _op in sorted(TASK_OPS):
    BAD_CASES += [
        (f"{_op}-queue-missing", _op, "queue", MISSING, BadRequestError, "'queue'"),
        (f"{_op}-queue-empty", _op, "queue", "", InvalidArgumentError, "'queue'"),
        (f"{_op}-queue-long", _op, "queue", "q" * 300, InvalidArgumentError, "'queue'"),
        (f"{_op}-queue-int", _op, "queue", 3, BadRequestError, "'queue'"),
    ]
    if _op in _TASK_ID_OPS:
        BAD_CASES += [
            (f"{_op}-tid-missing", _op, "task_id", MISSING, BadRequestError, "'task_id'"),
            (f"{_op}-tid-long", _op, "task_id", "T" * 129, InvalidArgumentError, "'task_id'"),
        ]
    if _op in _ATTEMPT_OPS:
        BAD_CASES += [
            (f"{_op}-aid-missing", _op, "attempt_id", MISSING, BadRequestError, "'attempt_id'"),
            (f"{_op}-aid-list", _op, "attempt_id", ["A"], BadRequestError, "'attempt_id'"),
        ]
for _op in ("await_claim", "await_task"):
    BAD_CASES += [
        (f"{_op}-timeout-missing", _op, "timeout", MISSING, BadRequestError, "'timeout'"),
        (f"{_op}-timeout-huge", _op, "timeout", 1e9, InvalidArgumentError, "timeout"),
    ]
BAD_CASES += [
    ("put-payload-missing", "task_put", "payload", MISSING, BadRequestError, "'payload'"),
    ("put-payload-map", "task_put", "payload", {"a": 1}, BadRequestError, "'payload'"),
    ("put-payload-big", "task_put", "payload", "x" * 20000, InvalidArgumentError, "'payload'"),
    ("put-priority-huge", "task_put", "priority", 10**6, InvalidArgumentError, "'priority'"),
    ("put-attempts-zero", "task_put", "max_attempts", 0, InvalidArgumentError, "'max_attempts'"),
    ("put-attempts-huge", "task_put", "max_attempts", 10**4, InvalidArgumentError, "attempts"),
    ("put-delay-negative", "task_put", "delay", -1, InvalidArgumentError, "delay"),
    ("put-delay-years", "task_put", "delay", 1e9, InvalidArgumentError, "delay"),
    ("put-ttl-tiny", "task_put", "lease_ttl", 0.001, InvalidArgumentError, "lease_ttl"),
    ("put-ttl-nan", "task_put", "lease_ttl", math.nan, InvalidArgumentError, "lease_ttl"),
    ("put-requires-list", "task_put", "requires", ["gpu"], BadRequestError, "'requires'"),
    ("put-requires-int", "task_put", "requires", {"gpu": 1}, BadRequestError, "'requires'"),
    ("put-dedup-empty", "task_put", "dedup_key", "", InvalidArgumentError, "'dedup_key'"),
    # Issue 42: fair shares. Hostile fairness keys and weights get definite codes.
    ("put-fair-int", "task_put", "fairness_key", 7, BadRequestError, "'fairness_key'"),
    ("put-fair-empty", "task_put", "fairness_key", "", InvalidArgumentError, "'fairness_key'"),
    ("put-fair-long", "task_put", "fairness_key", "t" * 129, InvalidArgumentError, "fairness_key"),
    ("put-weight-zero", "task_put", "weight", 0, InvalidArgumentError, "'weight'"),
    ("put-weight-huge", "task_put", "weight", 10**9, InvalidArgumentError, "'weight'"),
    ("put-weight-neg", "task_put", "weight", -3, InvalidArgumentError, "'weight'"),
    # Fair shares on the waiters of a key (docs/design.md §4d): the acquire's fields.
    ("acq-fair-int", "acquire", "fairness_key", 7, BadRequestError, "'fairness_key'"),
    ("acq-fair-empty", "acquire", "fairness_key", "", InvalidArgumentError, "'fairness_key'"),
    ("acq-fair-long", "acquire", "fairness_key", "t" * 129, InvalidArgumentError, "fairness_key"),
    ("acq-weight-zero", "acquire", "weight", 0, InvalidArgumentError, "'weight'"),
    ("acq-weight-huge", "acquire", "weight", 10**9, InvalidArgumentError, "'weight'"),
    ("acq-weight-str", "acquire", "weight", "3", BadRequestError, "'weight'"),
    ("put-weight-float", "task_put", "weight", 1.5, BadRequestError, "'weight'"),
    ("put-weight-bool", "task_put", "weight", True, BadRequestError, "'weight'"),
    ("put-weight-str", "task_put", "weight", "3", BadRequestError, "'weight'"),
    ("claim-worker-missing", "task_claim", "worker", MISSING, BadRequestError, "'worker'"),
    ("claim-worker-int", "task_claim", "worker", 9, BadRequestError, "'worker'"),
    ("claim-wait-negative", "task_claim", "wait", -1, InvalidArgumentError, "wait"),
    ("claim-caps-list", "task_claim", "capabilities", ["x"], BadRequestError, "capabilities"),
    ("beat-progress-str", "task_heartbeat", "progress", "3", BadRequestError, "'progress'"),
    ("beat-progress-inf", "task_heartbeat", "progress", math.inf, InvalidArgumentError, "progress"),
    ("done-result-big", "task_complete", "result", "r" * 20000, InvalidArgumentError, "'result'"),
    ("fail-error-int", "task_fail", "error", 5, BadRequestError, "'error'"),
    ("fail-after-neg", "task_fail", "retry_after", -1, InvalidArgumentError, "retry_after"),
    ("dead-limit-zero", "task_dead", "limit", 0, InvalidArgumentError, "'limit'"),
    # Issue 41: checkpoints and the effect journal.
    ("beat-cp-int", "task_heartbeat", "checkpoint", 5, BadRequestError, "'checkpoint'"),
    ("beat-cp-big", "task_heartbeat", "checkpoint", "A" * 20000, InvalidArgumentError,
     "'checkpoint'"),
    ("eff-begin-missing", "task_effect_begin", "effect", MISSING, BadRequestError, "'effect'"),
    ("eff-begin-empty", "task_effect_begin", "effect", "", InvalidArgumentError, "'effect'"),
    ("eff-begin-long", "task_effect_begin", "effect", "e" * 300, InvalidArgumentError,
     "'effect'"),
    ("eff-key-int", "task_effect_begin", "key", 3, BadRequestError, "'key'"),
    ("eff-key-long", "task_effect_begin", "key", "k" * 300, InvalidArgumentError, "'key'"),
    ("eff-commit-missing", "task_effect_commit", "effect", MISSING, BadRequestError,
     "'effect'"),
    ("eff-commit-int", "task_effect_commit", "effect", 4, BadRequestError, "'effect'"),
    ("eff-result-big", "task_effect_commit", "result", "r" * 2000, InvalidArgumentError,
     "'result'"),
    ("eff-result-int", "task_effect_commit", "result", 5, BadRequestError, "'result'"),
    # Issue 41: the effect journal under a lease.
    ("leff-begin-missing", "lease_effect_begin", "effect", MISSING, BadRequestError,
     "'effect'"),
    ("leff-begin-long", "lease_effect_begin", "effect", "e" * 300, InvalidArgumentError,
     "'effect'"),
    ("leff-commit-missing", "lease_effect_commit", "effect", MISSING, BadRequestError,
     "'effect'"),
    ("leff-ikey-int", "lease_effect_begin", "idempotency_key", 3, BadRequestError,
     "'idempotency_key'"),
    ("leff-ikey-long", "lease_effect_begin", "idempotency_key", "k" * 300,
     InvalidArgumentError, "'idempotency_key'"),
    ("leff-commit-int", "lease_effect_commit", "effect", 4, BadRequestError, "'effect'"),
    ("leff-result-big", "lease_effect_commit", "result", "r" * 2000, InvalidArgumentError,
     "'result'"),
    ("leff-result-int", "lease_effect_commit", "result", 5, BadRequestError, "'result'"),
    ("put-after-str", "task_put", "after", "T1", BadRequestError, "'after'"),
    ("put-after-empty", "task_put", "after", [], InvalidArgumentError, "'after'"),
    ("put-after-twice", "task_put", "after", ["T", "T"], InvalidArgumentError, "'after'"),
    ("put-after-many", "task_put", "after", [f"T{i}" for i in range(17)],
     InvalidArgumentError, "'after'"),
]  # fmt: skip
# Issue 42: shared budgets. Every budget op names its budget's key.
for _op in sorted(op for op in OPS if op.startswith("budget_") or op == "await_spend"):
    BAD_CASES += [
        (f"{_op}-key-missing", _op, "key", MISSING, BadRequestError, "'key'"),
        (f"{_op}-key-empty", _op, "key", "", InvalidArgumentError, "'key'"),
        (f"{_op}-key-long", _op, "key", "k" * 600, InvalidArgumentError, "'key'"),
        (f"{_op}-key-int", _op, "key", 3, BadRequestError, "'key'"),
    ]
for _op in ("budget_spend", "budget_reserve"):
    BAD_CASES += [
        (f"{_op}-amount-missing", _op, "amount", MISSING, BadRequestError, "'amount'"),
        (f"{_op}-amount-zero", _op, "amount", 0, InvalidArgumentError, "'amount'"),
        (f"{_op}-amount-negative", _op, "amount", -5, InvalidArgumentError, "'amount'"),
        (f"{_op}-amount-float", _op, "amount", 1.5, BadRequestError, "'amount'"),
        (f"{_op}-amount-nan", _op, "amount", math.nan, BadRequestError, "'amount'"),
        (f"{_op}-amount-bool", _op, "amount", True, BadRequestError, "'amount'"),
        (f"{_op}-amount-huge", _op, "amount", 10**40, InvalidArgumentError, "'amount'"),
        (f"{_op}-wait-negative", _op, "wait", -1, InvalidArgumentError, "wait"),
        (f"{_op}-wait-nan", _op, "wait", math.nan, InvalidArgumentError, "wait"),
    ]
BAD_CASES += [
    ("bset-cap-missing", "budget_set", "capacity", MISSING, BadRequestError, "'capacity'"),
    ("bset-cap-zero", "budget_set", "capacity", 0, InvalidArgumentError, "'capacity'"),
    ("bset-cap-huge", "budget_set", "capacity", 10**13, InvalidArgumentError, "'capacity'"),
    ("bset-refill-missing", "budget_set", "refill_per_s", MISSING, BadRequestError, "refill"),
    ("bset-refill-nan", "budget_set", "refill_per_s", math.nan, InvalidArgumentError, "refill"),
    ("bset-refill-inf", "budget_set", "refill_per_s", math.inf, InvalidArgumentError, "refill"),
    ("bset-refill-neg", "budget_set", "refill_per_s", -1, InvalidArgumentError, "refill"),
    ("bset-refill-str", "budget_set", "refill_per_s", "1", BadRequestError, "refill"),
    ("bset-refill-huge", "budget_set", "refill_per_s", 10**400, InvalidArgumentError, "refill"),
    ("bres-ttl-zero", "budget_reserve", "ttl", 0, InvalidArgumentError, "ttl"),
    ("bsettle-rid-missing", "budget_settle", "reservation_id", MISSING, BadRequestError,
     "'reservation_id'"),
    ("bsettle-rid-long", "budget_settle", "reservation_id", "R" * 129, InvalidArgumentError,
     "'reservation_id'"),
    ("bsettle-actual-missing", "budget_settle", "actual", MISSING, BadRequestError, "'actual'"),
    ("bsettle-actual-neg", "budget_settle", "actual", -1, InvalidArgumentError, "'actual'"),
    ("bsettle-actual-float", "budget_settle", "actual", 0.5, BadRequestError, "'actual'"),
    ("bcancel-sid-missing", "budget_cancel", "spend_id", MISSING, BadRequestError, "'spend_id'"),
    ("bcancel-sid-int", "budget_cancel", "spend_id", 7, BadRequestError, "'spend_id'"),
    ("await-sid-missing", "await_spend", "spend_id", MISSING, BadRequestError, "'spend_id'"),
    ("await-timeout-missing", "await_spend", "timeout", MISSING, BadRequestError, "'timeout'"),
    ("await-timeout-huge", "await_spend", "timeout", 1e9, InvalidArgumentError, "timeout"),
]  # fmt: skip
# Issue 40: acquire_many's set of keys, refused field by field, every way it can be.
BAD_CASES += [
    ("many-keys-missing", "acquire_many", "keys", MISSING, BadRequestError, "'keys'"),
    ("many-keys-str", "acquire_many", "keys", "a", BadRequestError, "'keys'"),
    ("many-keys-int", "acquire_many", "keys", 3, BadRequestError, "'keys'"),
    ("many-keys-empty", "acquire_many", "keys", [], InvalidArgumentError, "'keys'"),
    ("many-keys-empty-map", "acquire_many", "keys", {}, InvalidArgumentError, "'keys'"),
    ("many-keys-too-many", "acquire_many", "keys", [f"k{i}" for i in range(17)],
     InvalidArgumentError, "1 to 16 keys"),
    ("many-keys-dup", "acquire_many", "keys", ["a", "a"], InvalidArgumentError, "twice"),
    ("many-keys-int-key", "acquire_many", "keys", ["a", 3], BadRequestError, "'keys'"),
    ("many-keys-empty-key", "acquire_many", "keys", ["a", ""], InvalidArgumentError, "'keys'"),
    ("many-keys-long-key", "acquire_many", "keys", ["k" * 600], InvalidArgumentError, "'keys'"),
    ("many-keys-units-str", "acquire_many", "keys", {"a": "1"}, BadRequestError, "'keys'"),
    ("many-keys-units-bool", "acquire_many", "keys", {"a": True}, BadRequestError, "'keys'"),
    ("many-keys-units-zero", "acquire_many", "keys", {"a": 0}, InvalidArgumentError, "'keys'"),
    ("many-keys-units-over", "acquire_many", "keys", {"a": 2}, InvalidArgumentError,
     "capacity 1"),
    ("many-owner-missing", "acquire_many", "owner", MISSING, BadRequestError, "'owner'"),
    ("many-owner-int", "acquire_many", "owner", 5, BadRequestError, "'owner'"),
    ("many-ttl-missing", "acquire_many", "ttl", MISSING, BadRequestError, "'ttl'"),
    ("many-ttl-zero", "acquire_many", "ttl", 0, InvalidArgumentError, "ttl"),
    ("many-ttl-str", "acquire_many", "ttl", "1", BadRequestError, "'ttl'"),
    ("many-priority-huge", "acquire_many", "priority", 10**6, InvalidArgumentError, "'priority'"),
    ("many-priority-float", "acquire_many", "priority", 1.5, BadRequestError, "'priority'"),
    ("many-capacity-zero", "acquire_many", "capacity", 0, InvalidArgumentError, "'capacity'"),
    ("many-capacity-str", "acquire_many", "capacity", "2", BadRequestError, "'capacity'"),
    ("many-wait-negative", "acquire_many", "wait", -1, InvalidArgumentError, "wait -1 s"),
    ("many-wait-str", "acquire_many", "wait", "1", BadRequestError, "'wait'"),
    ("yield-key-missing", "request_yield", "key", MISSING, BadRequestError, "'key'"),
    ("yield-key-empty", "request_yield", "key", "", InvalidArgumentError, "'key'"),
    ("yield-deadline-missing", "request_yield", "deadline", MISSING, BadRequestError,
     "'deadline'"),
    ("yield-deadline-negative", "request_yield", "deadline", -1, InvalidArgumentError,
     "deadline -1 s"),
    ("yield-deadline-str", "request_yield", "deadline", "5", BadRequestError, "'deadline'"),
    ("yield-priority-huge", "request_yield", "priority", 10**6, InvalidArgumentError,
     "'priority'"),
    ("yield-owner-int", "request_yield", "owner", 3, BadRequestError, "'owner'"),
]  # fmt: skip
for _op in sorted(op for op, mutating in OPS.items() if mutating):
    BAD_CASES += [
        (f"{_op}-cid-missing", _op, "cid", MISSING, BadRequestError, "missing field 'cid'"),
        (f"{_op}-cid-int", _op, "cid", 1, BadRequestError, "'cid' must be a string"),
        (f"{_op}-cid-empty", _op, "cid", "", InvalidArgumentError, "'cid'"),
        (f"{_op}-cid-long", _op, "cid", "c" * 129, InvalidArgumentError, "'cid'"),
        (f"{_op}-seq-missing", _op, "seq", MISSING, BadRequestError, "missing field 'seq'"),
        (f"{_op}-seq-zero", _op, "seq", 0, InvalidArgumentError, "'seq'"),
        (f"{_op}-seq-bool", _op, "seq", True, BadRequestError, "'seq'"),
        (f"{_op}-seq-float", _op, "seq", 2.0, BadRequestError, "'seq'"),
        (f"{_op}-seq-huge", _op, "seq", 2**62 + 1, InvalidArgumentError, "'seq'"),
        (f"{_op}-ack-missing", _op, "ack", MISSING, BadRequestError, "missing field 'ack'"),
        (f"{_op}-ack-zero", _op, "ack", 0, InvalidArgumentError, "'ack'"),
        (f"{_op}-ack-negative", _op, "ack", -1, InvalidArgumentError, "'ack'"),
        (f"{_op}-ack-string", _op, "ack", "1", BadRequestError, "'ack'"),
        (f"{_op}-seq-below-ack", _op, "ack", 3, InvalidArgumentError, "seq 2 is below ack 3"),
    ]


def with_field(op: str, name: str, value: Any) -> dict[str, Any]:
    message = good(op)
    if value is MISSING:
        message.pop(name, None)
    else:
        message[name] = value
    return message


@pytest.mark.parametrize(
    ("op", "name", "value", "exc", "text"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_CASES],
)
def test_parse_bad_request(
    op: str, name: str, value: Any, exc: type[RaftLeaseError], text: str
) -> None:
    parse_request(good(op), LIMITS)  # the base request is valid
    message = with_field(op, name, value)
    with pytest.raises(RaftLeaseError) as info:
        parse_request(message, LIMITS)
    err = info.value
    assert type(err) is exc, f"{type(err).__name__}: {err}"
    assert err.definite
    assert text in err.message
    # The message names the field (or the operation, for the op field).
    assert name in err.message or (name == "op" and "operation" in err.message)


def test_bad_request_cases_cover_every_op_with_fields() -> None:
    covered = {(case[1], case[2]) for case in BAD_CASES}
    for op in OPS:
        for name in good(op):
            if name == "op":
                continue
            assert (op, name) in covered or name == "id", (op, name)


def test_request_id_only_for_usable_ids() -> None:
    assert request_id({"id": 5}) == 5
    for bad in (None, True, -1, 2**63, 1.0, "5", [5]):
        assert request_id({"id": bad}) is None
    assert request_id({}) is None


def test_limits_come_from_the_caller() -> None:
    tight = Limits(max_key_bytes=3, max_owner_bytes=2, min_ttl=1.0, max_ttl=2.0, max_list=5)
    msg = {"id": 1, "op": "acquire", "key": "abc", "owner": "ab", "ttl": 1.0, **SESSION}
    assert parse_request(msg, tight).args == {"key": "abc", "owner": "ab", "ttl": 1000}
    with pytest.raises(InvalidArgumentError, match="'key'"):
        parse_request({**msg, "key": "abcd"}, tight)
    with pytest.raises(InvalidArgumentError, match=re.escape("1.0..2.0")):
        parse_request({**msg, "ttl": 2.5}, tight)
    with pytest.raises(InvalidArgumentError, match="'limit' must be from 1 to 5, got 6"):
        parse_request({"id": 1, "op": "leases", "limit": 6}, tight)


@pytest.mark.parametrize("op", ["holder", "leases"])
def test_parse_lone_surrogate_is_a_request_error(op: str) -> None:
    field = "key" if op == "holder" else "prefix"
    with pytest.raises((BadRequestError, InvalidArgumentError)):
        parse_request({"id": 1, "op": op, field: "\ud800"}, LIMITS)


# --------------------------------------------------------------- responses


def test_ok_response_shape() -> None:
    assert ok_response(9, {"a": 1}) == {"id": 9, "ok": True, "result": {"a": 1}}


def test_error_response_shape_without_detail() -> None:
    response = error_response(3, BadRequestError("field 'key' is wrong"))
    assert response == {
        "id": 3,
        "ok": False,
        "code": "BAD_REQUEST",
        "message": "field 'key' is wrong",
        "definite": True,
    }


def test_error_response_shape_with_detail_and_no_id() -> None:
    err = LeaseHeldError("held", {"owner": "bob", "token": 4, "remaining": 1.5})
    response = error_response(None, err)
    assert response == {
        "id": None,
        "ok": False,
        "code": "LEASE_HELD",
        "message": "held",
        "definite": True,
        "detail": {"owner": "bob", "token": 4, "remaining": 1.5},
    }


def test_error_response_of_indefinite_error_and_default_message() -> None:
    response = error_response(1, errors.TimeoutError_())
    assert response["definite"] is False
    assert response["code"] == "TIMEOUT"
    assert response["message"] == "TIMEOUT"


def test_protocol_error_response() -> None:
    response = error_response(None, ProtocolError("a frame must hold a map"))
    assert response["code"] == "BAD_REQUEST"
    assert response["definite"] is True
    assert "detail" not in response


def test_error_response_round_trips_through_a_frame() -> None:
    err = LeaseHeldError("k is held", {"owner": "bob", "token": 12, "remaining": 0.5})
    (decoded,) = FrameDecoder().feed(encode_frame(error_response(7, err)))
    back = errors.from_wire(decoded["code"], decoded["message"], decoded.get("detail"))
    assert isinstance(back, LeaseHeldError)
    assert (back.owner, back.token, back.remaining) == ("bob", 12, 0.5)
    assert back.message == "k is held"


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("code", sorted(errors.CODES))
def test_every_code_maps_back_to_its_class(code: str) -> None:
    cls = errors.error_class(code)
    assert issubclass(cls, RaftLeaseError)
    assert cls.code == code
    err = errors.from_wire(code, "something happened", {"k": 1})
    assert type(err) is cls
    assert err.code == code
    assert err.message == "something happened"
    assert err.detail == {"k": 1}
    assert err.definite is cls.definite
    assert code in str(err)
    # The wire form of the error names the same code.
    assert error_response(1, err)["code"] == code


def test_codes_are_distinct_upper_case_and_complete() -> None:
    classes = [
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, RaftLeaseError) and obj is not RaftLeaseError
    ]
    assert {cls.code for cls in classes} == set(errors.CODES)
    for code in errors.CODES:
        assert code == code.upper()
        assert " " not in code


def test_definite_flags() -> None:
    indefinite = {"TIMEOUT", "LEADER_CHANGED", "CONNECTION_LOST", "INTERNAL"}
    for code in errors.CODES:
        assert errors.error_class(code).definite is (code not in indefinite), code


def test_unknown_code_is_internal() -> None:
    assert errors.error_class("NO_SUCH_CODE") is InternalError
    err = errors.from_wire("NO_SUCH_CODE", "boom")
    assert isinstance(err, InternalError)
    assert err.definite is False
    assert err.message == "boom"
    assert err.detail == {}


def test_protocol_error_is_a_bad_request_code() -> None:
    assert ProtocolError.code == "BAD_REQUEST"
    assert issubclass(ProtocolError, RaftLeaseError)
    assert errors.error_class(ProtocolError.code) is BadRequestError


@pytest.mark.timeout(30)
def test_frame_batcher_writes_at_once_unless_batching_then_once_per_turn() -> None:
    """Not batching: every frame written at once, nothing scheduled. Batching: a turn's
    frames held and written in one write by the flush the first scheduled, in order;
    no empty write; an explicit flush (before a close) writes what is held at once;
    a frame after the flush starts a new turn."""
    from raftlease.protocol import FrameBatcher

    writes: list[bytes] = []
    scheduled: list[Any] = []
    batcher = FrameBatcher(writes.append, scheduled.append)
    batcher.write(b"0")
    batcher.write(b"1")
    assert writes == [b"0", b"1"] and scheduled == []
    writes.clear()
    batcher.batching = True
    batcher.write(b"a")
    batcher.write(b"b")
    batcher.write(b"c")
    assert writes == [] and len(scheduled) == 1  # held for the end of the turn
    scheduled.pop()()
    assert writes == [b"abc"]
    batcher.flush()  # nothing held: no empty write
    assert writes == [b"abc"]
    batcher.write(b"d")
    assert writes == [b"abc"] and len(scheduled) == 1
    batcher.flush()
    assert writes == [b"abc", b"d"]
    scheduled.pop()()  # the turn's own flush then finds nothing
    assert writes == [b"abc", b"d"]
    batcher.batching = False  # a turn already open still collects its frames
    batcher.write(b"e")
    assert writes == [b"abc", b"d", b"e"]


@pytest.mark.timeout(30)
def test_frames_batched_on_a_real_loop_decode_in_order() -> None:
    """On an event loop: many frames written in one turn arrive as the same frames,
    in the same order, through the decoder."""
    import asyncio

    from raftlease.protocol import FrameBatcher, FrameDecoder, encode_frame

    async def main() -> list[bytes]:
        writes: list[bytes] = []
        batcher = FrameBatcher(writes.append, asyncio.get_running_loop().call_soon)
        batcher.batching = True
        for i in range(100):
            batcher.write(encode_frame({"id": i}))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return writes

    writes = asyncio.run(main())
    assert len(writes) == 1
    frames = list(FrameDecoder(1 << 20).feed(b"".join(writes)))
    assert [f["id"] for f in frames] == list(range(100))
