"""Wire protocol, sans-IO: length-prefixed msgpack frames and request validation.

A frame is a 4-byte big-endian unsigned length followed by that many bytes of msgpack.
Each frame carries one map. Requests have ``id`` (an integer the client chooses, echoed
in the response so many requests can be in flight on one connection) and ``op``; the
other fields depend on the operation (see ``operations.TABLE``). Responses are
``{"id", "ok": True, "result": {...}}`` or
``{"id", "ok": False, "code", "message", "definite", "detail"?}``.

Nothing here touches a socket or a clock (h11's rule: "contains no IO code whatsoever");
the server and the client feed bytes in and take frames out.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .errors import (
    BadRequestError,
    FrameTooLargeError,
    InvalidArgumentError,
    RaftLeaseError,
)
from .limits import MAX_TASK_CAP_BYTES
from .operations import (
    BY_NAME,
    CONSISTENCY_MODES,
    ENVELOPE,
    MAX_MEMBER_ID,
    TABLE,
    Field,
    Limits,
    Rule,
    ops_reading,
    resolve,
)

HEADER = struct.Struct(">I")
#: Default frame limit; servers take theirs from config.
DEFAULT_MAX_FRAME = 1 << 20

#: Operations and whether they mutate state (and so carry a client id, seq and ack),
#: from the one table of operations (``operations.TABLE``).
OPS: dict[str, bool] = {op.name: op.mutates for op in TABLE}


class ProtocolError(RaftLeaseError):
    """The byte stream itself is broken (bad length, undecodable msgpack); the
    connection must be closed."""

    code = "BAD_REQUEST"
    definite = True


def encode_frame(message: dict[str, Any]) -> bytes:
    body: bytes = msgpack.packb(message, use_bin_type=True)
    return HEADER.pack(len(body)) + body


class FrameBatcher:
    """Frames written to one stream within one event-loop turn leave in one write,
    while the stream is busy.

    With ``batching`` on (its owner sets it: a node when one read brought several
    requests, a client when several of its calls are in flight), the frames of a turn
    are held and written together by ``flush``, which the first of them schedules with
    ``call_soon`` (so it runs once the turn's other ready callbacks have). A connection
    carrying many calls at once (an ``AsyncClient`` running thousands of agents, a
    node answering it) then makes one send system call per turn instead of one per
    frame, and the peer one wake-up and one read; the busier, the larger the batches.
    With ``batching`` off every frame is written at once and nothing is scheduled: a
    lone call pays no extra loop turn (measured: the scheduled flush alone cost a
    1-thread acquire about 5 %). Order is kept: frames leave in the order written.

    ``write`` is the stream's writer (it must drop data once the stream is closing);
    ``call_soon`` the event loop's. Threads: the event loop's only. Raises nothing of
    its own: what ``write`` raises."""

    __slots__ = ("_call_soon", "_frames", "_turn", "_write", "batching")

    def __init__(
        self, write: Callable[[bytes], None], call_soon: Callable[[Callable[[], None]], object]
    ) -> None:
        self._write = write
        self._call_soon = call_soon
        self._frames: list[bytes] = []
        self._turn = False
        self.batching = False

    def write(self, frame: bytes) -> None:
        if self._turn:
            self._frames.append(frame)  # joined at the end of the turn
        elif self.batching:
            self._turn = True
            self._frames.append(frame)
            self._call_soon(self.flush)
        else:
            self._write(frame)

    def flush(self) -> None:
        """Write the frames held since the turn's first (also before a close)."""
        self._turn = False
        frames = self._frames
        if frames:
            self._frames = []
            self._write(frames[0] if len(frames) == 1 else b"".join(frames))


class FrameDecoder:
    """Accumulates bytes and yields complete decoded frames.

    ``feed`` raises ``FrameTooLargeError`` if a frame header announces more than
    ``max_frame`` bytes and ``ProtocolError`` if a body is not a msgpack map; either way
    the stream cannot be resynchronised and the caller must close the connection.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes of a frame started but not complete (0 between frames)."""
        return len(self._buf)

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        self._buf += data
        while True:
            if len(self._buf) < HEADER.size:
                return
            (length,) = HEADER.unpack_from(self._buf)
            if length > self.max_frame:
                raise FrameTooLargeError(
                    f"frame of {length} bytes exceeds the limit of {self.max_frame} bytes"
                )
            end = HEADER.size + length
            if len(self._buf) < end:
                return
            body = bytes(self._buf[HEADER.size : end])
            del self._buf[:end]
            yield decode_body(body)


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"undecodable frame: {type(exc).__name__}") from exc
    if not isinstance(message, dict):
        raise ProtocolError("a frame must hold a map")
    return message


# ----------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class Request:
    """A validated request. ``args`` holds the operation's own validated fields."""

    id: int
    op: str
    args: dict[str, Any] = field(default_factory=dict)
    cid: str | None = None
    seq: int | None = None
    ack: int | None = None
    #: The authenticated principal that sent it (set by the node, never by the wire).
    principal: str = ""


def request_id(message: dict[str, Any]) -> int | None:
    """The request id if it is usable for an error response, else None."""
    rid = message.get("id")
    if isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid < 2**63:
        return rid
    return None


#: Operations on one key, on a task queue, naming a task and naming an attempt: the
#: operations whose table entry reads ``key``, ``queue``, ``task_id``, ``attempt_id``.
KEYED_OPS = ops_reading("key")
TASK_OPS = ops_reading("queue")
_TASK_ID_OPS = ops_reading("task_id")
_ATTEMPT_OPS = ops_reading("attempt_id")


def _utf8_len(value: str, name: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"field {name!r} is not valid UTF-8 text") from None


def _str_field(message: Mapping[str, Any], name: str, max_bytes: int) -> str:
    value = message.get(name)
    if value is None:
        raise BadRequestError(f"missing field {name!r}")
    if not isinstance(value, str):
        raise BadRequestError(f"field {name!r} must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidArgumentError(f"field {name!r} must not be empty")
    size = _utf8_len(value, name)
    if size > max_bytes:
        raise InvalidArgumentError(f"field {name!r} is {size} bytes; the limit is {max_bytes}")
    return value


def _int_field(message: Mapping[str, Any], name: str, low: int, high: int) -> int:
    value = message.get(name)
    if value is None:
        raise BadRequestError(f"missing field {name!r}")
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequestError(f"field {name!r} must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidArgumentError(f"field {name!r} must be from {low} to {high}, got {value}")
    return value


def _ttl_ms(message: Mapping[str, Any], name: str, low: float, high: float) -> int:
    value = message.get(name)
    if value is None:
        raise BadRequestError(f"missing field {name!r}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequestError(
            f"field {name!r} must be a number of seconds, not {type(value).__name__}"
        )
    seconds = _as_float(value)
    if not math.isfinite(seconds) or not low <= seconds <= high:
        raise InvalidArgumentError(
            f"{name} {value!r} s is outside the allowed range {low}..{high} s"
        )
    return round(seconds * 1000)


def _seconds_ms(message: Mapping[str, Any], name: str, low: float, high: float) -> int:
    value = message.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequestError(f"field {name!r} must be a number of seconds")
    if not math.isfinite(_as_float(value)) or not low <= value <= high:
        raise InvalidArgumentError(f"{name} {value!r} s is outside {low}..{high} s")
    return round(float(value) * 1000)


def _as_float(value: int | float) -> float:
    """``value`` as a float; an integer too large for one (a JSON body can carry
    thousands of digits, where ``float()`` raises ``OverflowError``) becomes inf, which
    every caller refuses as out of range."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _text_field(message: Mapping[str, Any], name: str, max_bytes: int) -> str:
    """A string that may be empty (a payload, a result, an error text)."""
    value = message.get(name)
    if not isinstance(value, str):
        raise BadRequestError(f"field {name!r} must be a string, not {type(value).__name__}")
    size = _utf8_len(value, name)
    if size > max_bytes:
        raise InvalidArgumentError(f"field {name!r} is {size} bytes; the limit is {max_bytes}")
    return value


def _value_field(message: Mapping[str, Any], name: str, max_bytes: int) -> str:
    """A lease's published value: a string that may be empty."""
    value = message.get(name)
    if not isinstance(value, str):
        raise BadRequestError(f"field {name!r} must be a string, not {type(value).__name__}")
    if _utf8_len(value, name) > max_bytes:
        raise InvalidArgumentError(f"field {name!r} is longer than {max_bytes} bytes")
    return value


def _labels(message: Mapping[str, Any], name: str, most: int) -> dict[str, str]:
    """A task's ``requires`` or a claim's ``capabilities``: names to string values."""
    value = message.get(name)
    if not isinstance(value, dict):
        raise BadRequestError(f"field {name!r} must be a map, not {type(value).__name__}")
    if len(value) > most:
        raise InvalidArgumentError(f"field {name!r} has {len(value)} items; the limit is {most}")
    for k, v in value.items():
        if not isinstance(k, str) or not k or not isinstance(v, str):
            raise BadRequestError(f"field {name!r} must map non-empty names to strings")
        if _utf8_len(k, name) > MAX_TASK_CAP_BYTES or _utf8_len(v, name) > MAX_TASK_CAP_BYTES:
            raise InvalidArgumentError(
                f"field {name!r}: names and values are at most {MAX_TASK_CAP_BYTES} bytes"
            )
    return dict(value)


def _progress(message: Mapping[str, Any], name: str, most: int) -> int | float:
    """A heartbeat's progress: a finite number, at most ``most`` either way."""
    progress = message[name]
    if isinstance(progress, bool) or not isinstance(progress, int | float):
        raise BadRequestError(f"field {name!r} must be a number")
    if not math.isfinite(_as_float(progress)) or abs(progress) > most:
        raise InvalidArgumentError(f"field {name!r} must be a finite number")
    return progress


def _number(message: Mapping[str, Any], name: str, low: float, high: float) -> int | float:
    """A finite number in ``low..high`` (a budget's refill rate)."""
    value = message.get(name)
    if value is None:
        raise BadRequestError(f"missing field {name!r}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequestError(f"field {name!r} must be a number, not {type(value).__name__}")
    if not math.isfinite(_as_float(value)) or not low <= value <= high:
        raise InvalidArgumentError(f"field {name!r} must be a number from {low} to {high}")
    return value


def _choice(message: Mapping[str, Any], name: str, choices: tuple[str, ...]) -> str:
    value = message.get(name)
    if value not in choices:
        raise InvalidArgumentError(f"{name} {value!r} is not one of {list(choices)}")
    return str(value)


def _prefix(message: Mapping[str, Any], name: str, max_bytes: int) -> str:
    """A key prefix: a string that may be empty."""
    value = message.get(name)
    if not isinstance(value, str):
        raise BadRequestError(f"field {name!r} must be a string")
    if _utf8_len(value, name) > max_bytes:
        raise InvalidArgumentError(f"field {name!r} is longer than the key limit")
    return value


def _address(message: Mapping[str, Any], name: str, max_bytes: int) -> str:
    addr = _str_field(message, name, max_bytes)
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidArgumentError(f"field {name!r} must be host:port, got {addr!r}")
    return addr


def _keyset(
    message: Mapping[str, Any], name: str, max_key: int, most: int, capacity: int
) -> list[list[Any]]:
    """A set of keys: a list of distinct keys (one unit each) or a map of key to
    units (1 to ``capacity``), 1 to ``most`` of them; ``[key, units]`` pairs out."""
    value = message.get(name)
    if isinstance(value, list):
        pairs: list[tuple[Any, Any]] = [(key, 1) for key in value]
    elif isinstance(value, dict):
        pairs = list(value.items())
    else:
        raise BadRequestError(
            f"field {name!r} must be a list of keys or a map of key to units, "
            f"not {type(value).__name__}"
        )
    if not 0 < len(pairs) <= most:
        raise InvalidArgumentError(f"field {name!r} must hold 1 to {most} keys, not {len(pairs)}")
    out: list[list[Any]] = []
    seen: set[str] = set()
    for key, units in pairs:
        if not isinstance(key, str):
            raise BadRequestError(f"field {name!r}: keys must be strings")
        if not key or _utf8_len(key, name) > max_key:
            raise InvalidArgumentError(
                f"field {name!r}: keys must be non-empty and at most {max_key} bytes"
            )
        if not isinstance(units, int) or isinstance(units, bool):
            raise BadRequestError(f"field {name!r}: units must be integers")
        if not 1 <= units <= capacity:
            raise InvalidArgumentError(
                f"field {name!r}: units must be from 1 to the capacity {capacity}, got {units}"
            )
        if key in seen:
            raise InvalidArgumentError(f"field {name!r} names {key!r} twice")
        seen.add(key)
        out.append([key, units])
    return out


def _read(spec: Field, message: Mapping[str, Any], limits: Limits, args: Mapping[str, Any]) -> Any:
    """The value of one field as the core takes it (``spec.kind`` says how it is read).
    Raises ``BadRequestError`` (absent, wrong type) or ``InvalidArgumentError`` (out
    of bounds, empty, not UTF-8)."""
    name, kind = spec.wire, spec.kind
    low, high = resolve(spec.low, limits, args), resolve(spec.high, limits, args)
    if kind == "string":
        text = _str_field(message, name, high)
        if spec.pattern and re.fullmatch(spec.pattern, text) is None:
            raise InvalidArgumentError(f"field {name!r} must match {spec.pattern}")
        return text
    if kind == "integer":
        return _int_field(message, name, low, high)
    if kind == "seconds":
        ms = _seconds_ms(message, name, low, high)
        return ms / 1000.0 if spec.unit == "s" else ms
    if kind == "ttl":
        return _ttl_ms(message, name, low, high)
    if kind == "text":
        return _text_field(message, name, high)
    if kind == "value":
        return _value_field(message, name, high)
    if kind == "labels":
        return _labels(message, name, high)
    if kind == "progress":
        return _progress(message, name, high)
    if kind == "enum":
        return _choice(message, name, spec.choices)
    if kind == "prefix":
        return _prefix(message, name, high)
    if kind == "number":
        return _number(message, name, low, high)
    if kind == "keyset":
        keys = _keyset(message, name, low, high, args.get("capacity", 1))
        if spec.pattern:
            for key, _units in keys:
                if re.fullmatch(spec.pattern, key) is None:
                    raise InvalidArgumentError(f"field {name!r}: keys must match {spec.pattern}")
        return keys
    return _address(message, name, high)


def read_fields(
    steps: tuple[Field | Rule, ...],
    message: Mapping[str, Any],
    limits: Limits,
    args: dict[str, Any],
) -> None:
    """Read ``steps`` (an operation's fields and rules, in the table's order) from
    ``message`` into ``args`` under the core's names. Raises ``BadRequestError`` /
    ``InvalidArgumentError`` for the first field or rule that fails."""
    for step in steps:
        if isinstance(step, Rule):
            step.check(message, args)
            continue
        if step.needs:
            if step.needs not in args:
                continue
        elif not step.required:
            absent = (
                message.get(step.wire) is None
                if step.given == "not_none"
                else step.wire not in message
            )
            if absent:
                if step.default is not None:
                    args[step.core] = resolve(step.default, limits)
                continue
        args[step.core] = _read(step, message, limits, args)


def parse_request(message: dict[str, Any], limits: Limits) -> Request:
    """Validate a decoded frame into a ``Request``: the fields and rules of its
    operation's entry in ``operations.TABLE``, then (for a mutating one) the dedup
    envelope ``cid``, ``seq``, ``ack``.

    Raises ``BadRequestError`` / ``InvalidArgumentError`` with a message naming the
    field; the caller answers with that error and keeps the connection open.
    """
    rid = request_id(message)
    if rid is None:
        raise BadRequestError("field 'id' must be a non-negative integer")
    op = message.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise BadRequestError(f"unknown operation {op!r}; expected one of {sorted(OPS)}")
    spec = BY_NAME[op]
    args: dict[str, Any] = {}
    read_fields(spec.steps, message, limits, args)
    if not spec.mutates:
        return Request(id=rid, op=op, args=args)
    envelope: dict[str, Any] = {}
    read_fields(ENVELOPE, message, limits, envelope)
    return Request(
        id=rid, op=op, args=args, cid=envelope["cid"], seq=envelope["seq"], ack=envelope["ack"]
    )


def ok_response(rid: int, result: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "ok": True, "result": result}


def error_response(rid: int | None, err: RaftLeaseError) -> dict[str, Any]:
    response: dict[str, Any] = {
        "id": rid,
        "ok": False,
        "code": err.code,
        "message": err.message,
        "definite": err.definite,
    }
    if err.detail:
        response["detail"] = err.detail
    return response


__all__ = [
    "CONSISTENCY_MODES",
    "DEFAULT_MAX_FRAME",
    "HEADER",
    "KEYED_OPS",
    "MAX_MEMBER_ID",
    "OPS",
    "TASK_OPS",
    "FrameDecoder",
    "Limits",
    "ProtocolError",
    "Request",
    "decode_body",
    "encode_frame",
    "error_response",
    "ok_response",
    "parse_request",
    "read_fields",
    "request_id",
]
