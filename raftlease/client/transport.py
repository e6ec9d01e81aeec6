"""Finding the leader and retrying: one ``Transport`` per client.

It keeps one connection per node, sends each request to the node it believes leads,
follows ``NOT_LEADER`` redirects, and retries through elections and dead nodes until
the call's deadline. A mutating request is retried under the same client id and
sequence number, which the cluster deduplicates, so a retry never applies twice.

Threads: the event loop, except that the blocking client's direct lane
(client/direct.py) reads ``target``, ``sequencer``, ``deadline``,
``attempt_timeout``, ``tls`` and ``token`` and calls ``check_size`` from a calling
thread (each a single read of a value the loop replaces whole; the sequencer locks).
Errors: every failure is a ``RaftLeaseError``; ``definite`` says whether the request
certainly did not take effect.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    ClientExpiredError,
    ConnectionLostError,
    InvalidArgumentError,
    LeaderChangedError,
    NotLeaderError,
    OverloadedError,
    PermissionDeniedError,
    QuotaExceededError,
    RaftLeaseError,
    TimeoutError_,
    UnauthenticatedError,
    UnavailableError,
    from_response,
)
from ..protocol import DEFAULT_MAX_FRAME, encode_frame
from .connection import Connection, RequestSequencer

log = logging.getLogger("raftlease.client")

#: Definite refusals a node may give one try and not another (its connection quota,
#: a token an auth reload dropped, a permission): after a try that may have applied,
#: they do not say the request did not (``Transport.call``).
NODE_REFUSALS = (QuotaExceededError, UnauthenticatedError, PermissionDeniedError)

DEFAULT_DEADLINE = 15.0
DEFAULT_ATTEMPT_TIMEOUT = 3.0
#: The longest wait between two tries of one request (jittered 0.75-1.25x). Low, so
#: that during an election the next try comes soon after the new leader is up: it is
#: part of every failover's time (measured: SIGKILL of the leader to the next acquire
#: 0.58 s median with 0.1 here). A try of a leaderless cluster costs each node one
#: short NOT_LEADER / UNAVAILABLE answer.
MAX_BACKOFF = 0.05


def overload_pause(retry_after: float | None, remaining: float, draw: float) -> float | None:
    """Seconds to wait after an ``OVERLOADED`` answer before trying the same node
    again, or None to give up now. The pause is the ``retry_after`` the node asked for
    (1 s if none), jittered by ``draw`` (0 <= draw < 1) to 0.5-1.5x so that a refused
    crowd does not come back together; never the short backoff of an election (a
    crowd retrying every 50 ms would be load of its own). None when less than
    ``retry_after`` would be left after it: a loaded node answers slowly, and a try
    that times out leaves the outcome unknown where the refusal was definite."""
    wait = retry_after if retry_after is not None and retry_after > 0 else 1.0
    pause = wait * (0.5 + draw)
    return pause if remaining - pause >= wait else None


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one try of a request on ``target`` ended: ``unsent`` (no connection, so
    nothing can have applied), ``lost`` (connection lost or no answer in time: maybe
    applied) or the node's ``response``. ``refused`` (with ``unsent``): the node
    refused the try's own connection (the blocking client's lane, client/direct.py),
    not the request: the next try is made at once, on the client's connection,
    without a back-off and without moving to another endpoint. It goes to the
    transport's current target: the refusing node, unless another call learned of
    a new leader meanwhile. ``busy`` (with ``lost``): no answer in time, but the
    connection received others' answers after this try was sent: the node is slow,
    not gone."""

    target: str
    response: dict[str, Any] = field(default_factory=dict)
    unsent: RaftLeaseError | None = None
    lost: RaftLeaseError | None = None
    refused: bool = False
    busy: bool = False

    def unknown(self) -> RaftLeaseError | None:
        """The error saying this try's outcome is unknown (the request may have
        applied): the lost connection, or an indefinite error answer; None if the try
        succeeded or certainly did not apply."""
        if self.lost is not None:
            return self.lost
        if self.unsent is not None or not self.response or self.response.get("ok"):
            return None
        error = from_response(self.response)
        return None if error.definite else error


@dataclass(frozen=True, slots=True)
class Resume:
    """A call whose first try was made outside ``Transport.call`` (client/direct.py):
    its deadline (``time.monotonic`` seconds), client id and sequence number, and
    that try's outcome."""

    deadline: float
    ids: RequestSequencer | None
    seq: int
    target: str
    outcome: Outcome


def unknown_outcome(exc: BaseException) -> bool:
    """Did the call that raised ``exc`` end without knowing whether it applied?
    (cancelled, interrupted, or an indefinite error such as ``TIMEOUT``)"""
    if isinstance(exc, RaftLeaseError):
        return not exc.definite
    return isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit)


@dataclass(slots=True)
class Pin:
    """A mutating call's client id and sequence number, kept past the call so that it
    can be sent again as the same request (``Transport.call(pin=...)``): after an
    unknown outcome, sending it again under the same (cid, seq) returns what the
    cluster answered the first time if it applied (the dedup table keeps the answer
    while the seq is not acknowledged), or applies it once now. A withdrawal learns
    the id the cluster drew for a queued acquire or claim this way. ``end`` it as
    soon as possible: while it is open the client acknowledges none of its later
    requests either."""

    ids: RequestSequencer | None = None
    seq: int = 0

    def end(self) -> None:
        if self.ids is not None:
            self.ids.end(self.seq)


class Transport:
    """Connections, leader tracking and retries for one client (see module doc).

    ``deadline``: total seconds a call may take, retries included;
    ``attempt_timeout``: seconds one try may wait for an answer.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        deadline: float = DEFAULT_DEADLINE,
        attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT,
        tls: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        self.endpoints = list(endpoints)
        self._tls = tls
        self._token = token
        self.deadline = deadline
        self.attempt_timeout = attempt_timeout
        self.sequencer = RequestSequencer()
        #: The node this client believes leads (where the next request goes).
        self.target: str = self.endpoints[0]
        #: Leaders named by redirects that are not endpoints (warned about once each).
        self._unknown_leaders: set[str] = set()
        self._conns: dict[str, Connection] = {}
        self._connect_lock = asyncio.Lock()
        self._rotation = itertools.cycle(self.endpoints)

    @property
    def tls(self) -> ssl.SSLContext | None:
        """The TLS context of every connection (None: plain TCP)."""
        return self._tls

    @property
    def token(self) -> str | None:
        """The bearer token each new connection authenticates with (None: none)."""
        return self._token

    async def connection(self, addr: str, timeout: float) -> Connection:
        """The open connection to ``addr`` (made if needed). Raises
        ``ConnectionLostError`` if it cannot connect; nothing was sent then, which
        ``call`` counts as not applied (the class itself is indefinite, because a
        connection lost after sending is)."""
        async with self._connect_lock:
            conn = self._conns.get(addr)
            if conn is None or conn.closed:
                try:
                    conn = await Connection.open(addr, timeout, self._tls, self._token)
                except (OSError, TimeoutError) as exc:
                    raise ConnectionLostError(f"cannot connect to {addr}: {exc}") from None
                self._conns[addr] = conn
            return conn

    def _note_unknown_leader(self, leader: str) -> None:
        if leader not in self._unknown_leaders:
            self._unknown_leaders.add(leader)
            log.warning(
                "a node named leader %s, which is not among this client's endpoints %s: "
                "not followed (list every member's client address)",
                leader,
                self.endpoints,
            )

    def next_endpoint(self) -> str:
        """The next endpoint in rotation, never the current target while there is
        another: a retry after a failed attempt must not go back to the node that just
        failed it (against a hung node that would cost a second attempt timeout)."""
        endpoint = next(self._rotation)
        if endpoint == self.target and len(self.endpoints) > 1:
            endpoint = next(self._rotation)
        return endpoint

    async def close(self) -> None:
        conns, self._conns = self._conns, {}
        for conn in conns.values():
            await conn.close()

    def check_size(self, op: str, args: dict[str, Any]) -> None:
        """Refuse a request the server would reject as an oversized frame (it would
        close the connection every pipelined request shares) before sending it.
        Raises ``InvalidArgumentError``."""
        if sum(len(v) for v in args.values() if isinstance(v, str)) > 4096:
            size = len(encode_frame({"op": op, **args}))
            if size > DEFAULT_MAX_FRAME:
                raise InvalidArgumentError(
                    f"request of {size} bytes exceeds the frame limit of {DEFAULT_MAX_FRAME}"
                )

    async def call(
        self,
        op: str,
        args: dict[str, Any],
        *,
        mutating: bool,
        timeout: float | None = None,
        resume: Resume | None = None,
        pin: Pin | None = None,
    ) -> dict[str, Any]:
        """Send one request, retrying until the deadline. Returns the result map.

        ``resume``: the call's first attempt was made elsewhere (the blocking client's
        direct lane, client/direct.py) under ``resume.ids``/``resume.seq`` until
        ``resume.deadline``; this continues from its outcome, under the same client id
        and sequence number, so a retry is deduplicated as any other.

        ``pin`` (mutating calls): the first call with an empty ``Pin`` records its
        client id and seq there and leaves them open; a later call with that pin
        sends the same request again under them (``Pin``). The caller ends it."""
        outcome: Outcome | None = None
        if resume is None:
            deadline = time.monotonic() + (self.deadline if timeout is None else timeout)
            self.check_size(op, args)
            ids = self.sequencer if mutating else None  # the client id and seq it retries under
            if ids is not None and pin is not None and pin.ids is not None:
                ids, seq = pin.ids, pin.seq
            else:
                seq = ids.begin() if ids is not None else 0
                if pin is not None and ids is not None:
                    pin.ids, pin.seq = ids, seq
            target = self.target
        else:
            deadline, ids, seq = resume.deadline, resume.ids, resume.seq
            target, outcome = resume.target, resume.outcome
        backoff = 0.02
        last: RaftLeaseError | None = None
        maybe_applied = False
        # A leadership change seen on any attempt names the unknown outcome (a later
        # attempt's plain timeout would hide it).
        leader_changed = False
        try:
            while True:
                if outcome is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    outcome = await self._attempt(op, args, ids, seq, remaining)
                    target = outcome.target
                got, outcome = outcome, None
                if got.unsent is not None:  # never sent: nothing can have applied
                    last = got.unsent
                    if got.refused:
                        # Only a lane's first try is ever refused, so this goes on
                        # once: the node is fine, its quota for new connections is not.
                        continue
                    if (
                        not isinstance(last, ConnectionLostError)
                        and last.definite
                        and not maybe_applied
                    ):
                        raise last  # refused (quota, token): as definite as it says
                    # After a try that may have applied, a refusal of this try says
                    # nothing of that one: go on until an answer or the deadline.
                    self.target = self.next_endpoint()
                elif got.lost is not None:
                    # The request may have reached the node: outcome unknown.
                    maybe_applied = True
                    last = got.lost
                    # Elsewhere next, unless the client moved on already (another
                    # call's redirect or failure: a second move would skip the node
                    # it found) or the node answered others meanwhile (busy: slow,
                    # not gone; a shared client's calls hopping to a follower and
                    # redirected back would add load where there is too much).
                    if self.target == got.target and not got.busy:
                        self.target = self.next_endpoint()
                else:
                    response = got.response
                    if response.get("ok"):
                        result: dict[str, Any] = response.get("result") or {}
                        return result
                    last = from_response(response)
                    leader_changed = leader_changed or isinstance(last, LeaderChangedError)
                    if isinstance(last, NotLeaderError) and last.leader not in (None, target):
                        if str(last.leader) in self.endpoints:
                            self.target = str(last.leader)
                            continue  # redirect at once
                        # A leader we were not told about: a forged or stale hint
                        # (the lease we would get there could be anyone's). Go on
                        # through our own endpoints instead.
                        self._note_unknown_leader(str(last.leader))
                        if len(self.endpoints) == 1:
                            hint = (
                                f"{target} is not the leader and names {last.leader}, "
                                "which is not among this client's endpoints (a "
                                "redirect is followed only to a listed endpoint: list "
                                "every member's client address)"
                            )
                            if maybe_applied:
                                # An earlier try may have applied at the old leader:
                                # this answer is about this try only.
                                raise LeaderChangedError(f"{op}: outcome unknown; {hint}")
                            raise NotLeaderError(hint, {"leader": last.leader})
                    if isinstance(last, ClientExpiredError) and ids is not None:
                        # Our client id was evicted while idle: nothing of this
                        # request can have applied (applying refreshes the id's
                        # record). Continue under a fresh client id.
                        ids.end(seq)
                        ids = self._renew_ids(ids)
                        seq = ids.begin()
                        if pin is not None:
                            pin.ids, pin.seq = ids, seq
                        continue
                    # A refusal by the node itself (a quota, the token, a permission)
                    # is about this try; an earlier one may have applied. Only the
                    # state machine's answer, deduplicated by (cid, seq), speaks for
                    # every try: after a try that may have applied, keep trying for it.
                    retry = isinstance(last, NotLeaderError | UnavailableError) or (
                        maybe_applied and isinstance(last, NODE_REFUSALS)
                    )
                    if last.definite and not retry:
                        raise last
                    maybe_applied = maybe_applied or not last.definite
                    if isinstance(last, OverloadedError):
                        # The leader is past its capacity (admission control): the same
                        # node again, after the pause it asks for; or, without time
                        # for that, the refusal now (definite) rather than a doomed try.
                        pause = overload_pause(
                            last.retry_after, deadline - time.monotonic(), random.random()
                        )
                        if pause is None:
                            break
                        await asyncio.sleep(pause)
                        continue
                    # Not the leader, unavailable, or indefinite (commit timeout,
                    # leader change: maybe a deposed leader that cannot commit):
                    # retry, deduplicated by the client id and seq, on the next endpoint.
                    self.target = self.next_endpoint()
                await asyncio.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
                # Capped low: while a leader is being elected the next try should come
                # soon after it is (failover time is election + this backoff).
                backoff = min(backoff * 2, MAX_BACKOFF) * (0.75 + random.random() / 2)
        finally:
            if ids is not None and pin is None:
                ids.end(seq)
        if maybe_applied or last is None:
            cls: type[RaftLeaseError] = LeaderChangedError if leader_changed else TimeoutError_
            raise cls(f"{op} did not complete before its deadline; outcome unknown (last: {last})")
        if isinstance(last, OverloadedError):
            raise last  # definite: nothing applied, and the caller learns why
        raise UnavailableError(f"{op} failed before its deadline: {last}")

    async def _attempt(
        self,
        op: str,
        args: dict[str, Any],
        ids: RequestSequencer | None,
        seq: int,
        remaining: float,
    ) -> Outcome:
        """One try of a request on the current target."""
        target = self.target
        message: dict[str, Any] = {"op": op, **args}
        if ids is not None:
            message.update(cid=ids.cid, seq=seq, ack=ids.ack())
        attempt = min(remaining, self.attempt_timeout)
        try:
            conn = await self.connection(target, attempt)
        except RaftLeaseError as exc:
            # Lost, or refused (a connection quota, an unknown token): this try's
            # request was never sent.
            return Outcome(target, unsent=exc)
        sent = asyncio.get_running_loop().time()
        try:
            return Outcome(target, response=await conn.request(message, attempt))
        except TimeoutError_ as exc:
            return Outcome(target, lost=exc, busy=not conn.closed and conn.last_heard > sent)
        except ConnectionLostError as exc:
            return Outcome(target, lost=exc)
        except RaftLeaseError as exc:
            # The node refused the connection itself (a frame without a request id:
            # sent only before it read a request, or once every earlier one was
            # answered): not this request.
            return Outcome(target, unsent=exc)

    def _renew_ids(self, expired: RequestSequencer) -> RequestSequencer:
        if self.sequencer is expired:
            self.sequencer = RequestSequencer()
            log.warning(
                "client id %s expired on the cluster (idle too long); continuing as %s",
                expired.cid,
                self.sequencer.cid,
            )
        return self.sequencer

    async def node_status(self, endpoint: str, *, timeout: float = 2.0) -> dict[str, Any]:
        """The status of one node (no redirect, no retry)."""
        conn = await self.connection(endpoint, timeout)
        response = await conn.request({"op": "status"}, timeout)
        if not response.get("ok"):
            raise from_response(response)
        status: dict[str, Any] = response["result"]
        return status
