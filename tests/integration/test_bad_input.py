"""Hostile input against a live 3-node cluster: broken framing, garbage bytes and
well-framed but invalid requests, sent over raw sockets to the leader and to a follower.

Broken framing must be answered with one error frame (id None) and then the connection
closed; a well-framed bad request must be answered with a definite error naming the
problem while the connection stays open. Throughout, no node may die and the leases
created before the attack must be exactly unchanged.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import secrets
import socket
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import msgpack
import pytest

from raftlease import Client, Holder, Lease
from raftlease.errors import RaftLeaseError
from raftlease.protocol import HEADER, FrameDecoder, encode_frame
from raftlease.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PREFIX = "badinput/"
#: Long enough that no baseline lease can expire while the module runs.
TTL = 900.0
#: Every socket operation gives up after this long (the test never sleeps to guess).
IO_TIMEOUT = 10.0
MAX_FRAME = 1 << 20  # the node default; the test cluster does not change it
#: Codes a node answers when leadership is moving; only the domain checks retry on them.
LEADERSHIP_CODES = {"NOT_LEADER", "UNAVAILABLE", "LEADER_CHANGED", "TIMEOUT"}


# -------------------------------------------------------------------- raw client


class RawConnection:
    """A blocking socket speaking the frame protocol by hand."""

    def __init__(self, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        self.addr = addr
        self.sock = socket.create_connection((host, int(port)), timeout=IO_TIMEOUT)
        self.sock.settimeout(IO_TIMEOUT)
        self.decoder = FrameDecoder(max_frame=64 * MAX_FRAME)
        self.inbox: list[dict[str, Any]] = []
        self.closed_by_peer = False
        self._ids = itertools.count(1000)

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def next_id(self) -> int:
        return next(self._ids)

    def send(self, message: Any) -> None:
        self.sock.sendall(encode_frame(message))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        """Read once; False when the peer closed the connection."""
        try:
            data = self.sock.recv(1 << 16)
        except ConnectionResetError:
            data = b""
        if not data:
            self.closed_by_peer = True
            return False
        self.inbox.extend(self.decoder.feed(data))
        return True

    def next_frame(self) -> dict[str, Any]:
        while not self.inbox:
            if not self._fill():
                raise AssertionError(f"{self.addr} closed the connection instead of answering")
        return self.inbox.pop(0)

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one frame and return the single response to it."""
        self.send(message)
        return self.next_frame()

    def frames_until_closed(self) -> list[dict[str, Any]]:
        """Everything the peer sends until it closes the connection."""
        while self._fill():
            pass
        frames, self.inbox = self.inbox, []
        return frames

    def assert_open(self) -> None:
        """The connection still serves requests (a ping is answered)."""
        rid = self.next_id()
        response = self.request({"id": rid, "op": "ping"})
        assert response["id"] == rid
        assert response["ok"] is True, response
        assert response["result"]["node"]


def assert_error(response: dict[str, Any], rid: int | None, code: str, text: str = "") -> None:
    assert response.get("ok") is False, response
    assert response.get("code") == code, response
    assert response.get("id") == rid, response
    assert response.get("definite") is True, response
    message = response.get("message")
    assert isinstance(message, str), response
    assert message.strip(), response
    assert text in message, response


def assert_closed_after_one_error(conn: RawConnection, code: str, text: str = "") -> None:
    frames = conn.frames_until_closed()
    assert conn.closed_by_peer
    assert len(frames) == 1, frames
    assert_error(frames[0], None, code, text)


# ------------------------------------------------------------------- fixtures


def snapshot(holder: Holder | None) -> tuple[str, str, int, float] | None:
    """The parts of a holder that must not change (not ``remaining``)."""
    if holder is None:
        return None
    return (holder.key, holder.owner, holder.token, holder.ttl)


@dataclass(frozen=True)
class Baseline:
    leases: list[Lease]
    listing: list[tuple[str, str, int, float] | None]
    holders: dict[str, tuple[str, str, int, float] | None]

    @property
    def held(self) -> Lease:
        return self.leases[0]


@pytest.fixture(scope="module")
def baseline(shared_cluster: LocalCluster) -> Iterator[Baseline]:
    shared_cluster.wait_for_leader()
    with Client(shared_cluster.endpoints) as c:
        leases = [c.acquire(f"{PREFIX}held-{i}", owner=f"owner-{i}", ttl=TTL) for i in range(3)]
        listing = [snapshot(h) for h in c.leases(PREFIX)]
        holders = {lease.key: snapshot(c.holder(lease.key)) for lease in leases}
    assert [item[0] for item in listing if item] == sorted(lease.key for lease in leases)
    assert all(holders[lease.key] == (lease.key, lease.owner, lease.token, TTL) for lease in leases)
    yield Baseline(leases, listing, holders)
    with Client(shared_cluster.endpoints) as c:
        for lease in leases:
            with contextlib.suppress(RaftLeaseError):
                c.release(lease, timeout=5.0)


def addresses(cluster: LocalCluster) -> dict[str, str]:
    leader = str(cluster.wait_for_leader()["client"])
    follower = next(e for e in cluster.endpoints if e != leader)
    return {"leader": leader, "follower": follower}


def assert_node_serves(addr: str) -> None:
    """A fresh connection to ``addr`` is answered (the node survived)."""
    with RawConnection(addr) as conn:
        conn.assert_open()


# ------------------------------------------------------------- broken framing

ROLES = ["leader", "follower"]


@pytest.mark.parametrize("role", ROLES)
def test_frame_header_of_100_mb(shared: LocalCluster, baseline: Baseline, role: str) -> None:
    addr = addresses(shared)[role]
    with RawConnection(addr) as conn:
        conn.assert_open()
        conn.send_raw(HEADER.pack(100 * 1024 * 1024))
        assert_closed_after_one_error(conn, "FRAME_TOO_LARGE", str(100 * 1024 * 1024))
    assert_node_serves(addr)


@pytest.mark.parametrize("role", ROLES)
def test_frame_just_above_the_limit(shared: LocalCluster, baseline: Baseline, role: str) -> None:
    addr = addresses(shared)[role]
    with RawConnection(addr) as conn:
        conn.send_raw(HEADER.pack(MAX_FRAME + 1) + b"\x80" * 100)
        assert_closed_after_one_error(conn, "FRAME_TOO_LARGE", str(MAX_FRAME + 1))
    assert_node_serves(addr)


BROKEN_BODIES = [
    pytest.param(b"\xc1", "undecodable", id="undecodable-msgpack"),
    pytest.param(b"\x82\xa2id\x01", "undecodable", id="truncated-map"),
    pytest.param(b"", "undecodable", id="empty-body"),
    pytest.param(msgpack.packb({"id": 1, "op": "ping"}) + b"\x00", "undecodable", id="extra"),
    pytest.param(b"\x81\x01\xa4ping", "undecodable", id="integer-map-key"),
    pytest.param(b"\x81\xa2op\xa3\xed\xa0\x80", "undecodable", id="invalid-utf8"),
    pytest.param(b"\xdf\xff\xff\xff\xff", "undecodable", id="map-of-4G-entries"),
    pytest.param(msgpack.packb([{"id": 1, "op": "ping"}]), "map", id="list-not-map"),
    pytest.param(msgpack.packb(7), "map", id="int-not-map"),
    pytest.param(msgpack.packb("ping"), "map", id="str-not-map"),
    pytest.param(msgpack.packb(None), "map", id="nil-not-map"),
]


@pytest.mark.parametrize(("body", "text"), BROKEN_BODIES)
@pytest.mark.parametrize("role", ROLES)
def test_broken_body_gets_bad_request_then_close(
    shared: LocalCluster, baseline: Baseline, role: str, body: bytes, text: str
) -> None:
    addr = addresses(shared)[role]
    with RawConnection(addr) as conn:
        conn.assert_open()
        conn.send_raw(HEADER.pack(len(body)) + body)
        assert_closed_after_one_error(conn, "BAD_REQUEST", text)
    assert_node_serves(addr)


@pytest.mark.parametrize("role", ROLES)
def test_http_request_is_refused(shared: LocalCluster, baseline: Baseline, role: str) -> None:
    addr = addresses(shared)[role]
    with RawConnection(addr) as conn:
        # "GET " read as a length is about 1.2 GB.
        conn.send_raw(b"GET / HTTP/1.1\r\nHost: raftlease\r\n\r\n")
        assert_closed_after_one_error(conn, "FRAME_TOO_LARGE")
    assert_node_serves(addr)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("role", ROLES)
def test_random_garbage(shared: LocalCluster, baseline: Baseline, role: str, seed: int) -> None:
    addr = addresses(shared)[role]
    garbage = random.Random(seed).randbytes(4096)
    with RawConnection(addr) as conn:
        conn.send_raw(garbage)
        # Whatever the garbage announced, the node gets no more bytes: it must end the
        # connection, sending at most one error frame.
        conn.sock.shutdown(socket.SHUT_WR)
        frames = conn.frames_until_closed()
        assert conn.closed_by_peer
        (length,) = HEADER.unpack_from(garbage)
        if length > MAX_FRAME:
            assert len(frames) == 1, frames
            assert_error(frames[0], None, "FRAME_TOO_LARGE", str(length))
        else:
            assert len(frames) <= 1, frames
            for frame in frames:
                assert_error(frame, None, "BAD_REQUEST")
    assert_node_serves(addr)


@pytest.mark.parametrize("role", ROLES)
def test_truncated_frame_then_eof(shared: LocalCluster, baseline: Baseline, role: str) -> None:
    addr = addresses(shared)[role]
    with RawConnection(addr) as conn:
        conn.send_raw(encode_frame({"id": 1, "op": "ping", "pad": "x" * 500})[:-10])
        conn.sock.shutdown(socket.SHUT_WR)
        # Half a frame and then end of stream: nothing to answer, the node just closes.
        assert conn.frames_until_closed() == []
        assert conn.closed_by_peer
    assert_node_serves(addr)


@pytest.mark.parametrize("seed", [5, 6])
@pytest.mark.parametrize("role", ROLES)
def test_random_garbage_body_in_a_valid_frame(
    shared: LocalCluster, baseline: Baseline, role: str, seed: int
) -> None:
    addr = addresses(shared)[role]
    body = random.Random(seed).randbytes(64)
    with RawConnection(addr) as conn:
        conn.send_raw(HEADER.pack(len(body)) + body)
        assert_closed_after_one_error(conn, "BAD_REQUEST")
    assert_node_serves(addr)


# ------------------------------------------------------- well-framed, bad fields


def session(cid: str, seq: int, ack: int = 1) -> dict[str, Any]:
    return {"cid": cid, "seq": seq, "ack": ack}


def bad_requests(key: str, cid: str, min_ttl: float) -> list[tuple[str, dict[str, Any], str, str]]:
    """(label, request without id, expected code, text the message must hold). Each
    request breaks one field of an otherwise valid request."""
    seqs = itertools.count(1)

    def acquire(**fields: Any) -> dict[str, Any]:
        msg = {"op": "acquire", "key": key, "owner": "mallory", "ttl": 5.0}
        msg.update(session(cid, next(seqs)))
        msg.update(fields)
        return {k: v for k, v in msg.items() if v is not DROP}

    def renew(**fields: Any) -> dict[str, Any]:
        msg = {"op": "renew", "key": key, "lease_id": "f" * 32, **session(cid, next(seqs))}
        msg.update(fields)
        return {k: v for k, v in msg.items() if v is not DROP}

    def release(**fields: Any) -> dict[str, Any]:
        msg = {"op": "release", "key": key, "lease_id": "f" * 32, **session(cid, next(seqs))}
        msg.update(fields)
        return {k: v for k, v in msg.items() if v is not DROP}

    def proclaim(**fields: Any) -> dict[str, Any]:
        msg = {"op": "proclaim", "key": key, "lease_id": "f" * 32, "value": "v"}
        msg.update(session(cid, next(seqs)))
        msg.update(fields)
        return {k: v for k, v in msg.items() if v is not DROP}

    def session_op(op: str, **fields: Any) -> dict[str, Any]:
        return {"op": op, **session(cid, next(seqs)), **fields}

    def holder(**fields: Any) -> dict[str, Any]:
        msg = {"op": "holder", "key": key, **fields}
        return {k: v for k, v in msg.items() if v is not DROP}

    def leases(**fields: Any) -> dict[str, Any]:
        msg = {"op": "leases", "prefix": PREFIX, **fields}
        return {k: v for k, v in msg.items() if v is not DROP}

    BAD, INV = "BAD_REQUEST", "INVALID_ARGUMENT"
    cases: list[tuple[str, dict[str, Any], str, str]] = [
        ("unknown op", {"op": "explode", "key": key}, BAD, "unknown operation 'explode'"),
        ("internal op tick", {"op": "tick"}, BAD, "unknown operation 'tick'"),
        (
            "internal op extend",
            {"op": "extend", "leases": [["forged", 2**40]]},
            BAD,
            "unknown operation 'extend'",
        ),
        ("missing op", {"key": key}, BAD, "unknown operation None"),
        ("int op", {"op": 3}, BAD, "unknown operation 3"),
        ("list op", {"op": ["acquire"]}, BAD, "unknown operation"),
        ("map op", {"op": {"acquire": 1}}, BAD, "unknown operation"),
        ("bytes op", {"op": b"ping"}, BAD, "unknown operation"),
    ]
    for name, make in (("acquire", acquire), ("renew", renew), ("release", release)):
        cases += [
            (f"{name} key missing", make(key=DROP), BAD, "missing field 'key'"),
            (f"{name} key empty", make(key=""), INV, "'key' must not be empty"),
            (f"{name} key 513 B", make(key="k" * 513), INV, "'key' is 513 bytes"),
            (f"{name} key 100 KB", make(key="k" * 100_000), INV, "'key' is 100000 bytes"),
            (f"{name} key int", make(key=12), BAD, "'key' must be a string"),
            (f"{name} key bytes", make(key=key.encode()), BAD, "'key' must be a string"),
            (f"{name} key nil", make(key=None), BAD, "missing field 'key'"),
            (f"{name} cid missing", make(cid=DROP), BAD, "missing field 'cid'"),
            (f"{name} cid int", make(cid=5), BAD, "'cid' must be a string"),
            (f"{name} cid empty", make(cid=""), INV, "'cid' must not be empty"),
            (f"{name} cid 129", make(cid="c" * 129), INV, "'cid'"),
            (f"{name} seq missing", make(seq=DROP), BAD, "missing field 'seq'"),
            (f"{name} seq zero", make(seq=0), INV, "'seq'"),
            (f"{name} seq bool", make(seq=True), BAD, "'seq'"),
            (f"{name} seq float", make(seq=2.0), BAD, "'seq'"),
            (f"{name} seq huge", make(seq=2**64 - 1), INV, "'seq'"),
            (f"{name} ack missing", make(ack=DROP), BAD, "missing field 'ack'"),
            (f"{name} ack negative", make(ack=-1), INV, "'ack'"),
            (f"{name} ack string", make(ack="1"), BAD, "'ack'"),
            (f"{name} seq < ack", make(seq=1, ack=2), INV, "seq 1 is below ack 2"),
        ]
    cases += [
        ("owner missing", acquire(owner=DROP), BAD, "missing field 'owner'"),
        ("owner empty", acquire(owner=""), INV, "'owner' must not be empty"),
        ("owner 257 B", acquire(owner="o" * 257), INV, "'owner' is 257 bytes"),
        ("owner 100 KB", acquire(owner="o" * 100_000), INV, "'owner' is 100000 bytes"),
        ("owner int", acquire(owner=1), BAD, "'owner' must be a string"),
        ("owner list", acquire(owner=["o"]), BAD, "'owner' must be a string"),
        ("ttl missing", acquire(ttl=DROP), BAD, "missing field 'ttl'"),
        ("ttl zero", acquire(ttl=0), INV, "ttl 0 s"),
        ("ttl negative", acquire(ttl=-10), INV, "ttl -10 s"),
        ("ttl NaN", acquire(ttl=math.nan), INV, "ttl nan s"),
        ("ttl inf", acquire(ttl=math.inf), INV, "ttl inf s"),
        ("ttl -inf", acquire(ttl=-math.inf), INV, "ttl -inf s"),
        ("ttl bool", acquire(ttl=True), BAD, "'ttl' must be a number"),
        ("ttl string", acquire(ttl="5"), BAD, "'ttl' must be a number"),
        ("ttl above max", acquire(ttl=3600.5), INV, "ttl 3600.5 s"),
        ("ttl 1e300", acquire(ttl=1e300), INV, "ttl 1e+300 s"),
        ("ttl 2**64-1", acquire(ttl=2**64 - 1), INV, "ttl"),
        ("ttl below min", acquire(ttl=min_ttl / 2), INV, f"ttl {min_ttl / 2!r} s"),
        ("renew ttl zero", renew(ttl=0), INV, "ttl 0 s"),
        ("renew ttl NaN", renew(ttl=math.nan), INV, "ttl nan s"),
        ("renew ttl string", renew(ttl="1"), BAD, "'ttl' must be a number"),
        ("renew lease_id missing", renew(lease_id=DROP), BAD, "missing field 'lease_id'"),
        ("renew lease_id empty", renew(lease_id=""), INV, "'lease_id' must not be empty"),
        ("renew lease_id int", renew(lease_id=7), BAD, "'lease_id' must be a string"),
        ("renew lease_id 100 KB", renew(lease_id="L" * 100_000), INV, "'lease_id'"),
        ("release lease_id missing", release(lease_id=DROP), BAD, "missing field 'lease_id'"),
        ("release lease_id bytes", release(lease_id=b"L"), BAD, "'lease_id' must be a string"),
        ("holder key missing", holder(key=DROP), BAD, "missing field 'key'"),
        ("holder key 100 KB", holder(key="k" * 100_000), INV, "'key' is 100000 bytes"),
        ("holder key map", holder(key={"k": 1}), BAD, "'key' must be a string"),
        ("leases prefix int", leases(prefix=5), BAD, "'prefix' must be a string"),
        ("leases prefix nil", leases(prefix=None), BAD, "'prefix' must be a string"),
        ("leases prefix 100 KB", leases(prefix="p" * 100_000), INV, "'prefix'"),
        ("leases limit zero", leases(limit=0), INV, "'limit' must be from 1 to"),
        ("leases limit negative", leases(limit=-1), INV, "'limit'"),
        ("leases limit huge", leases(limit=10**12), INV, "'limit'"),
        ("leases limit string", leases(limit="10"), BAD, "'limit' must be an integer"),
        ("leases limit bool", leases(limit=True), BAD, "'limit' must be an integer"),
        ("capacity zero", acquire(capacity=0), INV, "'capacity'"),
        ("capacity 10**7", acquire(capacity=10**7), INV, "'capacity'"),
        ("capacity string", acquire(capacity="2"), BAD, "'capacity' must be an integer"),
        ("units above capacity", acquire(capacity=2, units=3), INV, "'units'"),
        ("units bool", acquire(units=True), BAD, "'units' must be an integer"),
        ("fairness key int", acquire(fairness_key=3), BAD, "fairness_key"),
        ("fairness key 129 B", acquire(fairness_key="k" * 129), INV, "fairness_key"),
        ("acquire weight zero", acquire(weight=0), INV, "'weight'"),
        ("acquire weight float", acquire(weight=2.5), BAD, "'weight'"),
        ("value 100 KB", acquire(value="v" * 100_000), INV, "'value'"),
        ("value int", acquire(value=5), BAD, "'value' must be a string"),
        ("session int", acquire(ttl=DROP, session=5), BAD, "'session' must be a string"),
        ("session and ttl", acquire(session="s" * 32), INV, "not both"),
        ("proclaim value missing", proclaim(value=DROP), BAD, "'value'"),
        ("proclaim value map", proclaim(value={"a": 1}), BAD, "'value' must be a string"),
        ("open ttl NaN", session_op("session_open", owner="m", ttl=math.nan), INV, "ttl nan"),
        ("open owner missing", session_op("session_open", ttl=5.0), BAD, "'owner'"),
        ("keepalive id missing", session_op("session_keepalive"), BAD, "'session_id'"),
        ("close id int", session_op("session_close", session_id=3), BAD, "'session_id'"),
        ("holder consistency", holder(consistency="eventual"), INV, "consistency"),
        ("leases consistency", leases(consistency=1), INV, "consistency"),
    ]

    # Issue 13: revoke (an admin write: every case here is malformed, so nothing of
    # the baseline may end) and the waiters/sessions reads.
    def revoke(**fields: Any) -> dict[str, Any]:
        msg = {"op": "revoke", "key": key, **session(cid, next(seqs)), **fields}
        return {k: v for k, v in msg.items() if v is not DROP}

    cases += [
        ("revoke key missing", revoke(key=DROP), BAD, "missing field 'key'"),
        ("revoke key int", revoke(key=3), BAD, "'key' must be a string"),
        ("revoke key 100 KB", revoke(key="k" * 100_000), INV, "'key' is 100000 bytes"),
        ("revoke lease_id int", revoke(lease_id=3), BAD, "'lease_id' must be a string"),
        ("revoke lease_id empty", revoke(lease_id=""), INV, "'lease_id' must not be empty"),
        ("revoke token float", revoke(token=1.5), BAD, "'token' must be an integer"),
        ("revoke token bool", revoke(token=True), BAD, "'token' must be an integer"),
        ("revoke token zero", revoke(token=0), INV, "'token'"),
        ("revoke id and token", revoke(lease_id="f" * 32, token=3), INV, "not both"),
        ("revoke cid missing", revoke(cid=DROP), BAD, "missing field 'cid'"),
        ("revoke seq < ack", revoke(seq=1, ack=2), INV, "seq 1 is below ack 2"),
        ("waiters key int", {"op": "waiters", "key": 5}, BAD, "'key' must be a string"),
        ("waiters limit zero", {"op": "waiters", "key": key, "limit": 0}, INV, "'limit'"),
        ("sessions limit string", {"op": "sessions", "limit": "3"}, BAD, "'limit'"),
    ]

    # Issue 12: task queues (payloads and results over 16 KiB, absurd priorities,
    # TTLs, delays and attempt counts, malformed capability maps, missing ids).
    def task(op: str, **fields: Any) -> dict[str, Any]:
        msg: dict[str, Any] = {"op": op, "queue": f"{PREFIX}q"}
        if op in ("task_complete", "task_fail", "task_heartbeat", "task_release"):
            msg.update(task_id="T" * 24, attempt_id="f" * 32)
        if op == "task_put":
            msg["payload"] = "{}"
        if op == "task_claim":
            msg["worker"] = "mallory"
        if op.startswith("task_") and op not in ("task_get", "task_stats", "task_dead"):
            msg.update(session(cid, next(seqs)))
        msg.update(fields)
        return {k: v for k, v in msg.items() if v is not DROP}

    big = "x" * (16 * 1024 + 1)
    cases += [
        ("task put payload map", task("task_put", payload={"a": 1}), BAD, "'payload'"),
        ("task put payload 16 KiB+1", task("task_put", payload=big), INV, "'payload'"),
        ("task put priority 10^9", task("task_put", priority=10**9), INV, "'priority'"),
        ("task put ttl 10^12 s", task("task_put", lease_ttl=1e12), INV, "lease_ttl"),
        ("task put ttl nan", task("task_put", lease_ttl=math.nan), INV, "lease_ttl"),
        ("task put delay 10^12 s", task("task_put", delay=1e12), INV, "delay"),
        ("task put delay negative", task("task_put", delay=-5), INV, "delay"),
        ("task put attempts 10^6", task("task_put", max_attempts=10**6), INV, "max_attempts"),
        ("task put attempts zero", task("task_put", max_attempts=0), INV, "max_attempts"),
        ("task put requires list", task("task_put", requires=["gpu"]), BAD, "'requires'"),
        ("task put fairness key int", task("task_put", fairness_key=3), BAD, "fairness_key"),
        (
            "task put fairness key 129 B",
            task("task_put", fairness_key="k" * 129),
            INV,
            "fairness_key",
        ),
        ("task put weight zero", task("task_put", weight=0), INV, "'weight'"),
        ("task put weight 10^9", task("task_put", weight=10**9), INV, "'weight'"),
        ("task put weight float", task("task_put", weight=2.5), BAD, "'weight'"),
        ("task put deadline zero", task("task_put", deadline=0), INV, "deadline"),
        ("task queue empty", task("task_put", queue=""), INV, "'queue'"),
        ("task queue int", task("task_stats", queue=3), BAD, "'queue'"),
        ("task claim worker missing", task("task_claim", worker=DROP), BAD, "'worker'"),
        ("task claim caps int", task("task_claim", capabilities={"gpu": 1}), BAD, "capab"),
        ("task claim wait 10^9", task("task_claim", wait=1e9), INV, "wait"),
        ("task complete result big", task("task_complete", result=big), INV, "'result'"),
        ("task complete no attempt", task("task_complete", attempt_id=DROP), BAD, "attempt_id"),
        ("task fail error int", task("task_fail", error=3), BAD, "'error'"),
        ("task beat progress inf", task("task_heartbeat", progress=math.inf), INV, "progress"),
        ("task dead limit 0", task("task_dead", limit=0), INV, "'limit'"),
        ("await_task no timeout", task("await_task", task_id="T"), BAD, "'timeout'"),
    ]
    # A production node has no clock control: the test build's operation is unknown.
    cases.append(("test_clock unknown", {"op": "test_clock", "jump": 3600.0}, BAD, "unknown"))
    cases.append(
        ("test_stall unknown", {"op": "test_stall", "seconds": 5, "turn": 1}, BAD, "unknown")
    )
    return cases


DROP = object()

#: Requests whose id is unusable: answered with id None, connection kept.
BAD_IDS: list[tuple[str, dict[str, Any]]] = [
    ("missing id", {"op": "ping"}),
    ("bool id", {"id": True, "op": "ping"}),
    ("negative id", {"id": -1, "op": "ping"}),
    ("float id", {"id": 1.0, "op": "ping"}),
    ("string id", {"id": "1", "op": "ping"}),
    ("nil id", {"id": None, "op": "ping"}),
    ("2**63 id", {"id": 2**63, "op": "ping"}),
    ("bool id on acquire", {"id": False, "op": "acquire", "key": "x", "owner": "o", "ttl": 1}),
    ("bytes keys", {b"id": 1, b"op": b"ping"}),
]


def min_ttl_of(cluster: LocalCluster) -> float:
    return float(cluster.settings.get("min_ttl", 0.5))


@pytest.mark.parametrize("role", ROLES)
def test_hostile_requests_on_one_connection(
    shared: LocalCluster, baseline: Baseline, role: str
) -> None:
    addr = addresses(shared)[role]
    cid = "mallory-" + secrets.token_hex(8)
    cases = bad_requests(baseline.held.key, cid, min_ttl_of(shared))
    with RawConnection(addr) as conn:
        for label, message in BAD_IDS:
            response = conn.request(message)
            assert_error(response, None, "BAD_REQUEST", "'id'")
            assert conn.inbox == [], label
        for label, message, code, text in cases:
            rid = conn.next_id()
            response = conn.request({"id": rid, **message})
            try:
                assert_error(response, rid, code, text)
            except AssertionError as exc:
                raise AssertionError(f"case {label!r}: {exc}") from None
        # Only broken framing closes a connection: this one still works.
        conn.assert_open()
        rid = conn.next_id()
        status = conn.request({"id": rid, "op": "status"})
        assert status["ok"] is True, status
        assert status["result"]["client"] == addr
    assert not conn.closed_by_peer


@pytest.mark.parametrize("role", ROLES)
def test_hostile_requests_pipelined(shared: LocalCluster, baseline: Baseline, role: str) -> None:
    """The same requests all in flight at once, written in one go; answers are matched
    by id (they may come back in any order)."""
    addr = addresses(shared)[role]
    cid = "mallory-" + secrets.token_hex(8)
    cases = bad_requests(baseline.held.key, cid, min_ttl_of(shared))
    with RawConnection(addr) as conn:
        expected: dict[int, tuple[str, str, str]] = {}
        stream = bytearray()
        for _label, message in BAD_IDS:
            stream += encode_frame(message)
        for label, message, code, text in cases:
            rid = conn.next_id()
            expected[rid] = (label, code, text)
            stream += encode_frame({"id": rid, **message})
        conn.send_raw(bytes(stream))
        anonymous = 0
        for _ in range(len(BAD_IDS) + len(cases)):
            response = conn.next_frame()
            rid = response.get("id")
            if rid is None:
                anonymous += 1
                assert_error(response, None, "BAD_REQUEST", "'id'")
                continue
            label, code, text = expected.pop(rid)
            try:
                assert_error(response, rid, code, text)
            except AssertionError as exc:
                raise AssertionError(f"case {label!r}: {exc}") from None
        assert anonymous == len(BAD_IDS)
        assert expected == {}
        conn.assert_open()


# ------------------------------------------------ well-formed, wrong ownership


def leader_request(
    cluster: LocalCluster, conn: RawConnection, message: dict[str, Any], cid: str, seqs: Any
) -> tuple[RawConnection, dict[str, Any]]:
    """Send a mutating or read request to the leader on ``conn``. If leadership moved
    (the answer is a leadership code), reconnect to the new leader and resend with a
    fresh seq; returns the connection in use and the final answer."""
    for _ in range(5):
        rid = conn.next_id()
        body = {"id": rid, **message}
        if "cid" in body:
            body.update(session(cid, next(seqs)))
        response = conn.request(body)
        assert response.get("id") == rid, response
        if response.get("ok") or response.get("code") not in LEADERSHIP_CODES:
            return conn, response
        conn.sock.close()
        conn = RawConnection(addresses(cluster)["leader"])
    raise AssertionError(f"no stable leader to answer {message}: last {response}")


def test_strangers_cannot_touch_held_leases(shared: LocalCluster, baseline: Baseline) -> None:
    cid = "stranger-" + secrets.token_hex(8)
    seqs = itertools.count(1)
    held = baseline.held
    fake_id = secrets.token_hex(16)
    assert fake_id != held.lease_id
    unknown = f"{PREFIX}nobody-home-{secrets.token_hex(4)}"
    conn = RawConnection(addresses(shared)["leader"])
    try:
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("renew with a made-up lease id", {"op": "renew", "key": held.key}, "NOT_OWNER"),
            ("renew with a new ttl", {"op": "renew", "key": held.key, "ttl": 1.0}, "NOT_OWNER"),
            ("release with a made-up lease id", {"op": "release", "key": held.key}, "NOT_OWNER"),
            ("renew of an unknown key", {"op": "renew", "key": unknown}, "LEASE_NOT_FOUND"),
            ("release of an unknown key", {"op": "release", "key": unknown}, "LEASE_NOT_FOUND"),
            (
                "proclaim with a made-up lease id",
                {"op": "proclaim", "key": held.key, "value": "evil"},
                "NOT_OWNER",
            ),
            (
                "acquire as a semaphore of another capacity",
                {"op": "acquire", "key": held.key, "owner": "m", "ttl": 5, "capacity": 2},
                "CAPACITY_MISMATCH",
            ),
            (
                "acquire attached to a made-up session",
                {"op": "acquire", "key": unknown, "owner": "m", "session": fake_id},
                "SESSION_NOT_FOUND",
            ),
            (
                "keep-alive of a made-up session",
                {"op": "session_keepalive", "session_id": fake_id},
                "SESSION_NOT_FOUND",
            ),
            (
                "close of a made-up session",
                {"op": "session_close", "session_id": fake_id},
                "SESSION_NOT_FOUND",
            ),
            # Issue 13: a revoke naming a lease that is not there ends nothing.
            (
                "revoke with a made-up lease id",
                {"op": "revoke", "key": held.key},
                "LEASE_NOT_FOUND",
            ),
            ("revoke of an unknown key", {"op": "revoke", "key": unknown}, "LEASE_NOT_FOUND"),
        ]
        for label, message, code in cases:
            full = {**message, "lease_id": fake_id, "cid": cid}
            conn, response = leader_request(shared, conn, full, cid, seqs)
            try:
                assert_error(response, response["id"], code)
            except AssertionError as exc:
                raise AssertionError(f"case {label!r}: {exc}") from None
            if code == "NOT_OWNER":
                assert response["detail"]["owner"] == held.owner
                assert response["detail"]["token"] == held.token
                assert fake_id not in response["message"]
                assert held.lease_id not in str(response)
        # Someone else's acquire of a held key, even under the holder's owner name.
        for owner in ("mallory", held.owner):
            message = {"op": "acquire", "key": held.key, "owner": owner, "ttl": 5, "cid": cid}
            conn, response = leader_request(shared, conn, message, cid, seqs)
            assert_error(response, response["id"], "LEASE_HELD", held.owner)
            detail = response["detail"]
            assert detail["owner"] == held.owner
            assert detail["token"] == held.token
            assert 0 < detail["remaining"] <= TTL
            assert held.lease_id not in str(response)
        conn.assert_open()
    finally:
        conn.sock.close()


def test_follower_redirects_well_formed_requests(shared: LocalCluster, baseline: Baseline) -> None:
    where = addresses(shared)
    held = baseline.held
    cid = "stranger-" + secrets.token_hex(8)
    messages: list[dict[str, Any]] = [
        {"op": "renew", "key": held.key, "lease_id": "0" * 32, **session(cid, 1)},
        {"op": "release", "key": held.key, "lease_id": "0" * 32, **session(cid, 2)},
        {"op": "acquire", "key": held.key, "owner": "mallory", "ttl": 5, **session(cid, 3)},
        {"op": "holder", "key": held.key},
        {"op": "leases", "prefix": PREFIX},
    ]
    with RawConnection(where["follower"]) as conn:
        for message in messages:
            rid = conn.next_id()
            response = conn.request({"id": rid, **message})
            assert response["ok"] is False, response
            assert response["id"] == rid
            assert response["definite"] is True
            assert response["code"] in ("NOT_LEADER", "UNAVAILABLE"), response
            if response["code"] == "NOT_LEADER":
                assert response["detail"]["leader"] in shared.endpoints
                assert response["detail"]["leader"] != where["follower"]
        conn.assert_open()


def test_hostile_task_requests_leave_the_queue_unchanged(
    shared: LocalCluster, baseline: Baseline
) -> None:
    """Forged and old attempt ids, unknown task ids and queues, a retry of a task that
    is not dead: each a definite error code, and the queue exactly as before."""
    name = f"{PREFIX}tasks"
    with Client(shared.endpoints) as c:
        q = c.queue(name)
        held_id = q.put({"n": 1}, lease_ttl=TTL)
        other_id = q.put({"n": 2}, lease_ttl=TTL)
        held = q.claim(worker="honest")
        old = q.claim(worker="honest")
        assert held is not None and old is not None and held.task_id == held_id
        old.release()  # its attempt id is now old
        before = (q.get(held_id), q.get(other_id), replace(q.stats(), oldest_ready_age=None))
        cid = "mallory-" + secrets.token_hex(8)
        seqs = itertools.count(1)
        ids = {"queue": name, "task_id": held_id}
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("forged attempt", {"op": "task_complete", **ids, "attempt_id": "f" * 32}, "STALE"),
            (
                "old attempt",
                {
                    "op": "task_complete",
                    "queue": name,
                    "task_id": other_id,
                    "attempt_id": old.lease_id,
                },
                "STALE",
            ),
            ("forged heartbeat", {"op": "task_heartbeat", **ids, "attempt_id": "0" * 32}, "STALE"),
            (
                "old release",
                {
                    "op": "task_release",
                    "queue": name,
                    "task_id": other_id,
                    "attempt_id": old.lease_id,
                },
                "STALE",
            ),
            (
                "unknown task",
                {"op": "task_fail", "queue": name, "task_id": "nope", "attempt_id": held.lease_id},
                "TASK_NOT_FOUND",
            ),
            (
                "unknown queue",
                {
                    "op": "task_complete",
                    "queue": f"{PREFIX}none",
                    "task_id": held_id,
                    "attempt_id": held.lease_id,
                },
                "TASK_NOT_FOUND",
            ),
            ("get unknown", {"op": "task_get", "queue": name, "task_id": "nope"}, "TASK_NOT_FOUND"),
            (
                "purge unknown",
                {"op": "task_purge", "queue": name, "task_id": "nope"},
                "TASK_NOT_FOUND",
            ),
            ("retry not dead", {"op": "task_retry", **ids}, "TASK_STATE"),
            ("purge claimed", {"op": "task_purge", **ids}, "INVALID_ARGUMENT"),
        ]
        conn = RawConnection(addresses(shared)["leader"])
        try:
            for label, message, code in cases:
                if message["op"] not in ("task_get",):
                    message = {**message, "cid": cid, "seq": 0, "ack": 1}
                conn, response = leader_request(shared, conn, message, cid, seqs)
                assert response.get("ok") is False, (label, response)
                expected = "STALE_ATTEMPT" if code == "STALE" else code
                assert response["code"] == expected and response["definite"], (label, response)
        finally:
            conn.sock.close()
        after = (q.get(held_id), q.get(other_id), replace(q.stats(), oldest_ready_age=None))
        assert after == before  # (the oldest ready task's age grows, of course)
        held.complete("honest result")  # the real attempt still works
        assert q.wait_result(held_id, timeout=10) == "honest result"


# ------------------------------------------------------------------ aftermath


def test_cluster_unharmed(shared: LocalCluster, baseline: Baseline) -> None:
    """Runs last in this module: every node alive, the leases exactly as before the
    attack, and the service still works."""
    for node in shared.nodes:
        assert shared.is_running(node.id), f"node {node.id} died"
    statuses = shared.statuses(timeout=3.0)
    assert len(statuses) == len(shared.nodes)
    for status in statuses:
        assert status["reachable"], status
    shared.wait_for_leader()
    with Client(shared.endpoints) as c:
        assert [snapshot(h) for h in c.leases(PREFIX)] == baseline.listing
        for key, expected in baseline.holders.items():
            assert snapshot(c.holder(key)) == expected
        lease = c.acquire(f"{PREFIX}after-{secrets.token_hex(4)}", owner="honest", ttl=5.0)
        assert lease.token > max(item.token for item in baseline.leases)
        holder = c.holder(lease.key)
        assert holder is not None
        assert (holder.owner, holder.token) == ("honest", lease.token)
        c.release(lease)
        assert c.holder(lease.key) is None
        # The baseline leases still renew with their real lease ids.
        renewed = c.renew(baseline.held)
        assert renewed.token == baseline.held.token
