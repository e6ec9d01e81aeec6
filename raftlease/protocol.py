"""Wire protocol, sans-IO: length-prefixed msgpack frames and request validation.

A frame is a 4-byte big-endian unsigned length followed by that many bytes of msgpack.
Each frame carries one map. Requests have ``id`` (an integer the client chooses, echoed
in the response so many requests can be in flight on one connection) and ``op``; the
other fields depend on the operation (see ``OPS``). Responses are
``{"id", "ok": True, "result": {...}}`` or
``{"id", "ok": False, "code", "message", "definite", "detail"?}``.

Nothing here touches a socket or a clock (h11's rule: "contains no IO code whatsoever");
the server and the client feed bytes in and take frames out.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .errors import (
    BadRequestError,
    FrameTooLargeError,
    InvalidArgumentError,
    RaftLeaseError,
)
from .limits import (
    MAX_CAPACITY,
    MAX_DEAD_LIST,
    MAX_ID_CHARS,
    MAX_QUEUE_NAME_BYTES,
    MAX_TASK_ATTEMPTS,
    MAX_TASK_BACKOFF_MS,
    MAX_TASK_CAP_BYTES,
    MAX_TASK_CAPABILITIES,
    MAX_TASK_DEDUP_BYTES,
    MAX_TASK_DELAY_MS,
    MAX_TASK_ERROR_BYTES,
    MAX_TASK_PAYLOAD_BYTES,
    MAX_TASK_REQUIRES,
    MAX_TASK_RESULT_BYTES,
    MAX_VALUE_BYTES,
)

HEADER = struct.Struct(">I")
#: Default frame limit; servers take theirs from config.
DEFAULT_MAX_FRAME = 1 << 20

#: Read consistency modes: leader lease (falls back to the log), always the log,
#: or any node's local state labelled with its age.
CONSISTENCY_MODES = ("linearizable", "log", "stale")

#: Operations and whether they mutate state (and so carry a client id, seq and ack).
OPS: dict[str, bool] = {
    "acquire": True,
    "renew": True,
    "release": True,
    "transfer": True,
    "proclaim": True,
    "session_open": True,
    "session_keepalive": True,
    "session_close": True,
    "revoke": True,
    "holder": False,
    "waiters": False,
    "sessions": False,
    "leases": False,
    "fence": False,
    "await_lease": False,
    # Leased task queues (docs/queues.md): mutations, reads, and two long-polls.
    "task_put": True,
    "task_claim": True,
    "task_claim_cancel": True,
    "task_heartbeat": True,
    "task_complete": True,
    "task_fail": True,
    "task_release": True,
    "task_retry": True,
    "task_purge": True,
    "task_get": False,
    "task_stats": False,
    "task_dead": False,
    "await_claim": False,
    "await_task": False,
    "watch": False,
    "status": False,
    "ping": False,
    "auth": False,
    # Backups (docs/disaster-recovery.md): an admin read answered by the leader.
    "snapshot": False,
    # Membership (docs/membership.md): admin operations, answered by the leader.
    "member_list": False,
    "member_add": False,
    "member_remove": False,
    # Operators (docs/security.md): the node reached reads its auth and TLS files again.
    "reload": False,
}

#: Longest member id accepted by ``member_add``.
MAX_MEMBER_ID = 64


class ProtocolError(RaftLeaseError):
    """The byte stream itself is broken (bad length, undecodable msgpack); the
    connection must be closed."""

    code = "BAD_REQUEST"
    definite = True


def encode_frame(message: dict[str, Any]) -> bytes:
    body: bytes = msgpack.packb(message, use_bin_type=True)
    return HEADER.pack(len(body)) + body


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
class Limits:
    """Request limits enforced before anything is proposed (from the node config)."""

    max_key_bytes: int = 512
    max_owner_bytes: int = 256
    min_ttl: float = 0.5
    max_ttl: float = 3600.0
    max_wait: float = 3600.0
    max_list: int = 10_000


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


def _utf8_len(value: str, name: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"field {name!r} is not valid UTF-8 text") from None


def _str_field(message: dict[str, Any], name: str, max_bytes: int) -> str:
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


def _int_field(message: dict[str, Any], name: str, low: int, high: int) -> int:
    value = message.get(name)
    if value is None:
        raise BadRequestError(f"missing field {name!r}")
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequestError(f"field {name!r} must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidArgumentError(f"field {name!r} must be from {low} to {high}, got {value}")
    return value


def _ttl_ms(message: dict[str, Any], limits: Limits, required: bool) -> int | None:
    value = message.get("ttl")
    if value is None:
        if required:
            raise BadRequestError("missing field 'ttl'")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequestError(
            f"field 'ttl' must be a number of seconds, not {type(value).__name__}"
        )
    seconds = _as_float(value)
    if not math.isfinite(seconds) or not limits.min_ttl <= seconds <= limits.max_ttl:
        raise InvalidArgumentError(
            f"ttl {value!r} s is outside the allowed range {limits.min_ttl}..{limits.max_ttl} s"
        )
    return round(seconds * 1000)


def _seconds_ms(message: dict[str, Any], name: str, low: float, high: float) -> int:
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


#: Operations on one key.
KEYED_OPS = frozenset(
    {
        "acquire",
        "renew",
        "release",
        "holder",
        "transfer",
        "fence",
        "await_lease",
        "proclaim",
        "revoke",
        "waiters",
    }
)


def _member_args(op: str, message: dict[str, Any], args: dict[str, Any]) -> None:
    """``member_add``: ``member_id``, ``raft`` and ``client`` (host:port), an optional
    ``timeout`` (seconds to wait for the new member to catch up, default 30).
    ``peer_key`` (a public key of the handshake that mutual TLS replaced) is refused
    with a message saying so, rather than ignored.
    ``member_remove``: ``member_id`` (the id or the raft address)."""
    member_id = _str_field(message, "member_id", MAX_MEMBER_ID)
    if any(not (c.isalnum() or c in "-_.:[]") for c in member_id):
        raise InvalidArgumentError(
            f"member_id {member_id!r} may hold only letters, digits and - _ . : [ ]"
        )
    args["member_id"] = member_id
    if op == "member_remove":
        return
    for name in ("raft", "client"):
        addr = _str_field(message, name, 300)
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise InvalidArgumentError(f"field {name!r} must be host:port, got {addr!r}")
        args[name] = addr
    if args["raft"] == args["client"]:
        raise InvalidArgumentError("fields 'raft' and 'client' must be different addresses")
    args["timeout"] = (
        _seconds_ms(message, "timeout", 0.0, 600.0) / 1000.0 if "timeout" in message else 30.0
    )
    if "peer_key" in message:
        raise InvalidArgumentError(
            "field 'peer_key' is no longer used: members authenticate with certificates "
            "of the cluster CA (raftlease certs node ID); drop it"
        )


def _value_field(message: dict[str, Any]) -> str:
    value = message.get("value")
    if not isinstance(value, str):
        raise BadRequestError(f"field 'value' must be a string, not {type(value).__name__}")
    if _utf8_len(value, "value") > MAX_VALUE_BYTES:
        raise InvalidArgumentError(f"field 'value' is longer than {MAX_VALUE_BYTES} bytes")
    return value


def _acquire_args(message: dict[str, Any], limits: Limits, args: dict[str, Any]) -> None:
    """An acquire's own fields: a TTL, or a lease session to attach to (whose TTL it
    then lives by); a wait and priority; and for shared keys capacity and units."""
    if message.get("session") is not None:
        args["session"] = _str_field(message, "session", MAX_ID_CHARS)
        if message.get("ttl") is not None:
            raise InvalidArgumentError(
                "give 'ttl' or 'session', not both: an attached lease lives by its session"
            )
    else:
        args["ttl"] = _ttl_ms(message, limits, required=True)
    if message.get("wait") is not None:
        args["wait"] = _seconds_ms(message, "wait", 0.0, limits.max_wait)
    if message.get("priority") is not None:
        args["priority"] = _int_field(message, "priority", -1000, 1000)
    if message.get("capacity") is not None:
        args["capacity"] = _int_field(message, "capacity", 1, MAX_CAPACITY)
    if message.get("units") is not None:
        args["units"] = _int_field(message, "units", 1, args.get("capacity", 1))


#: Task queue operations (``_task_args`` validates their fields).
TASK_OPS = frozenset(
    op for op in OPS if op.startswith("task_") or op in ("await_claim", "await_task")
)
#: Those naming a task (``task_id``), and those naming an attempt (``attempt_id``).
_TASK_ID_OPS = frozenset(
    {
        "task_heartbeat",
        "task_complete",
        "task_fail",
        "task_release",
        "task_retry",
        "task_purge",
        "task_get",
        "await_task",
    }
)
_ATTEMPT_OPS = frozenset(
    {
        "task_heartbeat",
        "task_complete",
        "task_fail",
        "task_release",
        "task_claim_cancel",
        "await_claim",
    }
)


def _text_field(message: dict[str, Any], name: str, max_bytes: int) -> str:
    """A string that may be empty (a payload, a result, an error text)."""
    value = message.get(name)
    if not isinstance(value, str):
        raise BadRequestError(f"field {name!r} must be a string, not {type(value).__name__}")
    size = _utf8_len(value, name)
    if size > max_bytes:
        raise InvalidArgumentError(f"field {name!r} is {size} bytes; the limit is {max_bytes}")
    return value


def _labels(message: dict[str, Any], name: str, most: int) -> dict[str, str]:
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


def _task_args(op: str, message: dict[str, Any], limits: Limits, args: dict[str, Any]) -> None:
    """The fields of a task queue operation, into the core's names and units
    (seconds become integer milliseconds; ``task_id`` is ``tid``, ``attempt_id``
    ``aid``, ``capabilities`` ``caps``, ``lease_ttl`` ``ttl``)."""
    args["queue"] = _str_field(message, "queue", min(MAX_QUEUE_NAME_BYTES, limits.max_key_bytes))
    if op in _TASK_ID_OPS:
        args["tid"] = _str_field(message, "task_id", MAX_ID_CHARS)
    if op in _ATTEMPT_OPS:
        args["aid"] = _str_field(message, "attempt_id", MAX_ID_CHARS)
    if op in ("await_claim", "await_task"):
        args["timeout"] = _seconds_ms(message, "timeout", 0.0, 60.0) / 1000.0
    given = {name for name, value in message.items() if value is not None}
    if op == "task_put":
        args["payload"] = _text_field(message, "payload", MAX_TASK_PAYLOAD_BYTES)
        if "priority" in given:
            args["priority"] = _int_field(message, "priority", -1000, 1000)
        if "max_attempts" in given:
            args["max_attempts"] = _int_field(message, "max_attempts", 1, MAX_TASK_ATTEMPTS)
        if "dedup_key" in given:
            args["dedup_key"] = _str_field(message, "dedup_key", MAX_TASK_DEDUP_BYTES)
        if "requires" in given:
            args["requires"] = _labels(message, "requires", MAX_TASK_REQUIRES)
        days = MAX_TASK_DELAY_MS / 1000.0
        for name, low, high in (
            ("delay", 0.0, days),
            ("deadline", 0.001, days),
            ("retention", 0.0, days),
            ("backoff", 0.0, MAX_TASK_BACKOFF_MS / 1000.0),
        ):
            if name in given:
                args[name] = _seconds_ms(message, name, low, high)
        for name, core in (("lease_ttl", "ttl"), ("progress_timeout", "progress_timeout")):
            if name in given:
                args[core] = _seconds_ms(message, name, limits.min_ttl, limits.max_ttl)
    elif op == "task_claim":
        args["worker"] = _str_field(message, "worker", limits.max_owner_bytes)
        if "capabilities" in given:
            args["caps"] = _labels(message, "capabilities", MAX_TASK_CAPABILITIES)
        if "wait" in given:
            args["wait"] = _seconds_ms(message, "wait", 0.0, limits.max_wait)
        if "session" in given:
            args["session"] = _str_field(message, "session", MAX_ID_CHARS)
            if "lease_ttl" in given:
                raise InvalidArgumentError(
                    "give 'lease_ttl' or 'session', not both: an attached claim lives by "
                    "its session"
                )
        elif "lease_ttl" in given:
            args["ttl"] = _seconds_ms(message, "lease_ttl", limits.min_ttl, limits.max_ttl)
    elif op == "task_heartbeat" and "progress" in given:
        progress = message["progress"]
        if isinstance(progress, bool) or not isinstance(progress, int | float):
            raise BadRequestError("field 'progress' must be a number")
        if not math.isfinite(_as_float(progress)) or abs(progress) > 2**62:
            raise InvalidArgumentError("field 'progress' must be a finite number")
        args["progress"] = progress
    elif op == "task_complete" and "result" in given:
        args["result"] = _text_field(message, "result", MAX_TASK_RESULT_BYTES)
    elif op == "task_fail":
        if "error" in given:
            args["error"] = _text_field(message, "error", MAX_TASK_ERROR_BYTES)
        if "retry_after" in given:
            args["retry_after"] = _seconds_ms(
                message, "retry_after", 0.0, MAX_TASK_DELAY_MS / 1000.0
            )
    elif op == "task_dead" and "limit" in given:
        args["limit"] = _int_field(message, "limit", 1, MAX_DEAD_LIST)


def parse_request(message: dict[str, Any], limits: Limits) -> Request:
    """Validate a decoded frame into a ``Request``.

    Raises ``BadRequestError`` / ``InvalidArgumentError`` with a message naming the
    field; the caller answers with that error and keeps the connection open.
    """
    rid = request_id(message)
    if rid is None:
        raise BadRequestError("field 'id' must be a non-negative integer")
    op = message.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise BadRequestError(f"unknown operation {op!r}; expected one of {sorted(OPS)}")
    args: dict[str, Any] = {}
    if op in KEYED_OPS:
        args["key"] = _str_field(message, "key", limits.max_key_bytes)
    if op in ("acquire", "transfer", "session_open"):
        args["owner"] = _str_field(message, "owner", limits.max_owner_bytes)
    if op in ("acquire", "proclaim") and (op == "proclaim" or message.get("value") is not None):
        args["value"] = _value_field(message)
    if op in ("session_keepalive", "session_close"):
        args["sid"] = _str_field(message, "session_id", MAX_ID_CHARS)
    if op in ("session_open", "session_keepalive"):
        ttl = _ttl_ms(message, limits, required=op == "session_open")
        if ttl is not None:
            args["ttl"] = ttl
    if op == "acquire":
        _acquire_args(message, limits, args)
    elif op in ("renew", "release", "transfer", "await_lease", "proclaim"):
        args["lid"] = _str_field(message, "lease_id", MAX_ID_CHARS)
        if op in ("renew", "transfer"):
            ttl = _ttl_ms(message, limits, required=False)
            if ttl is not None:
                args["ttl"] = ttl
        if op == "await_lease":
            args["timeout"] = _seconds_ms(message, "timeout", 0.0, 60.0) / 1000.0
    elif op == "fence":
        args["token"] = _int_field(message, "token", 0, 2**62)
    elif op == "revoke":
        # All leases on the key, or the one named by its lease id or its token.
        if message.get("lease_id") is not None and message.get("token") is not None:
            raise InvalidArgumentError("give 'lease_id' or 'token' to revoke, not both")
        if message.get("lease_id") is not None:
            args["lid"] = _str_field(message, "lease_id", MAX_ID_CHARS)
        if message.get("token") is not None:
            args["token"] = _int_field(message, "token", 1, 2**62)
    if op in TASK_OPS:
        _task_args(op, message, limits, args)
    if op == "auth":
        args["token"] = _str_field(message, "token", 1024)
    if op in ("holder", "leases", "fence", "waiters", "sessions"):
        consistency = message.get("consistency", "linearizable")
        if consistency not in CONSISTENCY_MODES:
            raise InvalidArgumentError(
                f"consistency {consistency!r} is not one of {list(CONSISTENCY_MODES)}"
            )
        args["consistency"] = consistency
    if op in ("leases", "watch"):
        prefix = message.get("prefix", "")
        if not isinstance(prefix, str):
            raise BadRequestError("field 'prefix' must be a string")
        if _utf8_len(prefix, "prefix") > limits.max_key_bytes:
            raise InvalidArgumentError("field 'prefix' is longer than the key limit")
        args["prefix"] = prefix
    if op in ("leases", "waiters", "sessions"):
        args["limit"] = (
            _int_field(message, "limit", 1, limits.max_list)
            if "limit" in message
            else min(1000, limits.max_list)
        )
    if op == "watch":
        args["from_revision"] = (
            _int_field(message, "from_revision", 0, 2**62) if "from_revision" in message else 0
        )
    if op in ("member_add", "member_remove"):
        _member_args(op, message, args)
    if op == "snapshot" and message.get("snapshot") is not None:
        # No id: take a snapshot; with one: read its body from ``offset``.
        args["snapshot"] = _str_field(message, "snapshot", MAX_ID_CHARS)
        args["offset"] = _int_field(message, "offset", 0, 2**62)
    if not OPS[op]:
        return Request(id=rid, op=op, args=args)
    cid = _str_field(message, "cid", 128)
    seq = _int_field(message, "seq", 1, 2**62)
    ack = _int_field(message, "ack", 1, 2**62)
    if seq < ack:
        raise InvalidArgumentError(f"seq {seq} is below ack {ack}")
    return Request(id=rid, op=op, args=args, cid=cid, seq=seq, ack=ack)


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
