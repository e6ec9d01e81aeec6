"""Safety and liveness checkers over a chaos-suite history.

The history is a list of events (``workload.History``): client operations as
``invoke`` then ``ok`` / ``fail`` / ``info`` (paired by ``op``), fenced-resource
accesses (``fenced``) and faults (``nemesis``). All times are one monotonic clock.

Checkers (each returns ``{"valid": True | False | "unknown", "violations": [...]}``).
A checker that cannot see part of the history, or had nothing to judge, must not
pass: that is ``unknown`` (a warning, never a pass).

0. ``history``: the history is fit to judge (``history_problems``): every completion
   has its invocation, every ``ok`` acquire and renew has an integer token and a
   holding window (``valid_until`` or a positive ``ttl``), reads name their holder,
   fenced accesses are complete and carry tokens their process was granted, and so
   on. Anything else is ``unknown``: what the other checkers skip cannot fail them.
1. ``mutual_exclusion``: a client holds a lease from the ``ok`` of its acquire (or
   renew) until its own ``valid_until`` (``send + ttl*(1-rho) - margin``) or the
   invocation of its release, whichever is first. Holding intervals of different leases
   on one plain key must never overlap; on a shared key (one whose holders were
   *granted* with ``capacity`` > 1: a semaphore or pool) they may, as long as the units
   of the intervals that overlap at any instant never add up to more than the
   capacity. A lease attached to a lease session (acquire invoke value ``session``)
   has no TTL of its own: it is held from the acquire's ok to the largest
   ``valid_until`` of its session the client recorded (the ok value and ``keepalive``
   events observed before the release invocation), cut at the release invocation.
2. ``fencing``: per key, a grant that completed before another was invoked has the
   smaller token; no token is handed to two grants (tokens are the store-wide revision,
   so this is checked across keys, shared keys included); the fenced resource accepted
   tokens in non-decreasing order, never one below the highest it had seen, and no
   accepted write overwrote a value its writer had not read (lost update). The
   resource asks the cluster before each write (``Client.fence``) and records the
   answer, which is judged against the grants and reads the history holds: the
   cluster never calls a replaced (or a lower, later) token current, never denies a
   holder whose lease was certainly live, and its current token is never below one
   the resource already accepted.
3. ``no_lost_grant``: a read (or an error naming the holder) that began after a grant
   completed never shows an older token, and shows that grant (or a newer one) while
   the grant's holder still certainly holds it. Plain keys only. An attached lease is
   certainly held up to its session's largest recorded ``valid_until`` (observed before
   the read began): the cluster accepted that keep-alive, so the session lived until
   then and keeps the lease at least to ``send + ttl*(1-rho) - margin``.
4. ``linearizable``: per key, the operations are linearizable under the lease model
   of ``linearizability.py`` (uncertain expiry, ``info`` ops optional). A search that
   runs out of budget answers ``"unknown"``. Plain keys only. An attached lease's
   earliest expiry is not TTL-based but its mutual-exclusion end (the session's largest
   recorded ``valid_until`` before the release invocation); an unanswered attached
   acquire, whose window is unknown, may expire at any time. A grant's holder is the
   owner the cluster returned (the ok value's ``owner``; an unanswered acquire: the
   owner it asked for), which is what reads and refusals name: not the process that
   asked.
5. ``liveness``: after every heal some operation completes (an ``ok``, or a refusal
   decided by the state machine) within ``liveness_bound`` seconds. A fault that never
   healed, or a history with no heal measured, is ``unknown``.
6. ``replicas``: after the run, with clients stopped, every node catches up to one
   applied index, and the replicas' whole states, rebuilt offline from each stopped
   node's data directory at one committed index (``replay.py``), are identical, and so
   are the committed log entries they share. No final state, or no (or a partial)
   replay, is ``unknown``.
7. ``rejoin`` (PreVote): a member cut off from every other (the ``isolate-follower``
   fault) never raises its term while cut off (its term just before the heal equals
   its term before the cut): no majority grants it a pre-vote, so its return cannot
   depose the leader. The leader keeping its term after the heal is counted
   (``leader_kept``) but not judged: an unrelated election on a loaded machine could
   move it. A run without that fault has nothing to judge (``True``, ``faults`` 0).
8. ``watch`` (a run that recorded or declared a watcher): each watch stream delivers
   revisions in order, none below its start, with no gap but a new term's jump, and
   the history's acknowledged grants and claims as they were (``watch_checker.py``).
9. ``withdrawn`` (a run with cancelling clients, ``cancel_workload.py``): no grant
   to, and no place in a queue for, a waiter whose client withdrew before the read
   that would show it (``cancel_checker.py``).

10. ``membership`` (the ``membership-missed`` fault): a member that was down while a
   member was added, restarted from its own data directory, learns the new member from
   the log (``learned`` in the heal's stop event) within the nemesis's wait. A heal
   that recorded nothing (it failed before) is ``unknown``. A run without that fault
   has nothing to judge (``True``, ``faults`` 0).

``check(events)`` runs all of them; the overall verdict is False if any is False,
else "unknown" if any is unknown, else True. ``volume_stats`` measures what the run
did (grants and contention per key, reads during faults, refused late writes, heals,
fault kinds) and ``check_volume`` holds it to ``VolumeRequirements``: with them,
``check`` calls a run that fell short ``unknown``, since it proved nothing.
"""

from __future__ import annotations

import bisect
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from cancel_checker import CANCEL_FS, check_withdrawn, has_cancels
from linearizability import LOp, check_ops
from many_checker import MANY_FS, check_many, has_many
from queue_checker import QUEUE_FS, check_queues, has_queues
from secure import check_security
from watch_checker import check_watch, has_watches

Event = dict[str, Any]
MAX_REPORTED = 50
DOMAIN_CODES = frozenset({"LEASE_HELD", "NOT_OWNER", "LEASE_NOT_FOUND"})


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Params:
    rho: float = 0.01
    margin: float = 0.05
    liveness_bound: float = 10.0
    lin_budget: int = 500_000
    lin_segment_budget: int = 200_000
    lin_time_limit: float = 60.0

    @classmethod
    def from_meta(cls, events: Iterable[Event], **overrides: Any) -> Params:
        values: dict[str, Any] = {}
        for event in events:
            if event.get("type") == "meta":
                for name in ("rho", "margin", "liveness_bound"):
                    if name in event:
                        values[name] = event[name]
                break
        values.update(overrides)
        return cls(**values)


@dataclass
class Op:
    """A client operation: its invocation and completion."""

    id: str
    process: str
    f: str
    key: str
    inv: float
    ret: float = math.inf
    type: str = "info"  # ok | fail | info
    args: dict[str, Any] = field(default_factory=dict)
    value: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    #: An acquire attached to a lease session (``args["session"]``): the ``keepalive``
    #: events its process recorded for that session, as ``(t, valid_until)`` by time.
    keepalives: list[tuple[float, float]] = field(default_factory=list)

    @property
    def session(self) -> str | None:
        """The lease session an acquire attached its lease to (None: a TTL lease)."""
        session = self.args.get("session") if self.f == "acquire" else None
        return str(session) if session is not None else None

    @property
    def token(self) -> int | None:
        """The lease's token (None if it has none, or not an integer: the ``history``
        checker reports that)."""
        token = self.value.get("token", self.args.get("token"))
        return token if _is_int(token) else None

    def brief(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "op": self.id,
            "process": self.process,
            "f": self.f,
            "key": self.key,
            "type": self.type,
            "inv": round(self.inv, 4),
            "ret": None if math.isinf(self.ret) else round(self.ret, 4),
        }
        if self.token is not None:
            out["token"] = self.token
        if self.error:
            out["error"] = self.error
        if self.detail:
            out["detail"] = self.detail
        if self.f == "read" and self.type == "ok":
            out["saw"] = self.value.get("holder")
            if "consistency" in self.value:
                out["consistency"] = self.value["consistency"]
                out["served_by"] = self.value.get("served_by")
        return out


@dataclass
class Observation:
    """What an operation saw of a key's holder: a token and owner, or nobody."""

    op: Op
    token: int | None
    owner: str | None


def load_history(path: str | Path) -> list[Event]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _time_order(event: Event) -> tuple[float, int]:
    t, i = event.get("t"), event.get("i")
    return (float(t) if _is_num(t) else 0.0, i if _is_int(i) else 0)


def pair_ops(events: Iterable[Event]) -> list[Op]:
    """Pair invocations with completions. An invocation without one stays ``info``.
    An acquire attached to a lease session gets the ``keepalive`` events of that
    session (same process and session id) in ``Op.keepalives``. Events too malformed
    to pair (no op id, no time, a completion without an invocation) are left out
    here; ``history_problems`` reports every one of them."""
    ops: dict[str, Op] = {}
    keepalives: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for event in sorted(events, key=_time_order):
        kind = event.get("type")
        if kind in ("keepalive", "invoke", "ok", "fail", "info") and not _is_num(event.get("t")):
            continue
        if kind == "keepalive":
            if not _is_num(event.get("valid_until")):
                continue
            keepalives[(str(event.get("process")), str(event.get("session")))].append(
                (float(event["t"]), float(event["valid_until"]))
            )
        elif kind == "invoke":
            if not all(isinstance(event.get(k), str) for k in ("op", "process", "f", "key")):
                continue
            if event["op"] in ops:
                continue  # a second invocation of one id: reported, the first one kept
            ops[event["op"]] = Op(
                id=event["op"],
                process=event["process"],
                f=event["f"],
                key=event["key"],
                inv=float(event["t"]),
                args=dict(event.get("value") or {}),
            )
        elif kind in ("ok", "fail", "info"):
            op = ops.get(event.get("op", ""))
            if op is None or not math.isinf(op.ret):
                continue  # no invocation, or a second completion: both reported
            op.ret = float(event["t"])
            op.type = kind
            op.value = dict(event.get("value") or {})
            op.error = event.get("error")
            op.detail = dict(event.get("detail") or {})
    for op in ops.values():
        if op.session is not None:
            op.keepalives = keepalives.get((op.process, op.session), [])
    return sorted(ops.values(), key=lambda o: o.inv)


def shared_keys(ops: Iterable[Op], events: Iterable[Event] = ()) -> dict[str, int]:
    """Shared keys (semaphores, pools) and their capacity: the keys some lease was
    *granted* on with ``capacity`` > 1 (an ``ok`` acquire whose invoke asked for it;
    the cluster refuses a capacity that does not match the key's). Not a key someone
    only asked about (a refused or unanswered acquire with ``capacity`` 2 makes no
    lease share anything), nor one the run's ``meta`` merely declares: calling a plain
    key shared switches off its stale-read and linearizability checks. ``events`` is
    accepted for the callers that pass it and not used, for that reason."""
    del events
    out: dict[str, int] = {}
    for op in ops:
        if op.f != "acquire" or op.type != "ok":
            continue
        capacity = op.args.get("capacity", 1)
        if isinstance(capacity, int) and capacity > 1:
            out[op.key] = max(out.get(op.key, 1), capacity)
    return out


# ------------------------------------------------------- 0. a history to judge

#: The operations the workload records; any other ``f`` would be ignored by every
#: checker, so it makes the history malformed.
KNOWN_FS = frozenset({"acquire", "renew", "release", "read"})


def history_problems(events: list[Event], ops: list[Op]) -> list[dict[str, Any]]:
    """What makes the history unfit to judge: anything a checker would silently skip
    or misread, so that a pass would prove nothing. Each entry names the event or
    operation and what is wrong with it.

    * no ``meta`` event (the run's parameters);
    * an invocation without an ``op`` id, or one id invoked twice;
    * a completion with no matching invocation (pairing would drop it), a second
      completion, one for another process, operation or key, or one before its
      invocation;
    * an operation other than acquire, renew, release, read;
    * an ``ok`` acquire or renew without an integer ``token``, or without a holding
      window: neither ``valid_until`` nor a positive ``ttl`` (an attached acquire
      needs ``valid_until``: it has no TTL of its own);
    * a renew or release invoked without a ``token`` (it could not be matched to its
      lease);
    * an ``ok`` read without ``holder``, or with a holder without an integer token;
    * a fenced access without process, key, integer token, ``read``/``write`` or a
      boolean ``accepted``; an accepted one whose process was never granted that
      token on that key (an ``ok`` acquire completed before it); an accepted write
      the cluster did not confirm, in a run whose resource asks the cluster
      (``meta`` ``fence`` = ``"cluster"``);
    * a ``keepalive`` without process, session, numeric ``valid_until`` and ``t``;
    * a fault ``stop`` with no ``start`` of the same id.
    """
    problems: list[dict[str, Any]] = []

    def add(kind: str, **detail: Any) -> None:
        problems.append({"kind": kind, **detail})

    meta = next((e for e in events if e.get("type") == "meta"), None)
    if meta is None:
        add("no meta event")
    invokes: dict[str, Event] = {}
    for e in events:
        if e.get("type") != "invoke":
            continue
        op_id = e.get("op")
        if not isinstance(op_id, str) or not op_id:
            add("invocation without an op id", event=e)
        elif not (
            all(isinstance(e.get(k), str) for k in ("process", "f", "key")) and _is_num(e.get("t"))
        ):
            add("malformed invocation (process, f, key, t)", event=e)
        elif op_id in invokes:
            add("op id invoked twice", op=op_id)
        else:
            invokes[op_id] = e
    completed: set[str] = set()
    for e in events:
        if e.get("type") not in ("ok", "fail", "info"):
            continue
        op_id = e.get("op")
        inv = invokes.get(op_id) if isinstance(op_id, str) else None
        if inv is None:
            add("completion without an invocation", event=e)
            continue
        assert isinstance(op_id, str)
        if not _is_num(e.get("t")):
            add("completion without a time", op=op_id)
        if op_id in completed:
            add("second completion", op=op_id, event=e)
        completed.add(op_id)
        if any(e.get(k) != inv.get(k) for k in ("process", "f", "key") if k in e):
            add("completion does not match its invocation", op=op_id)
        if _is_num(e.get("t")) and _is_num(inv.get("t")) and e["t"] < inv["t"]:
            add("completion before its invocation", op=op_id)
    for op in ops:
        # queue ops: queue_checker; the cancelling clients' ops: cancel_checker
        if op.f not in KNOWN_FS and op.f not in QUEUE_FS and op.f not in CANCEL_FS | MANY_FS:
            add("unknown operation", op=op.id, f=op.f)
            continue
        if op.f in ("renew", "release") and not _is_int(op.args.get("token")):
            add(f"{op.f} invoked without a token", op=op.id)
        if op.type != "ok":
            continue
        if op.f in ("acquire", "renew"):
            token = op.value.get("token", op.args.get("token"))
            if not _is_int(token):
                add(f"ok {op.f} without a token", op=op.id)
            ttl = op.value.get("ttl", op.args.get("ttl"))
            has_window = _is_num(op.value.get("valid_until")) or (
                op.session is None and _is_num(ttl) and ttl > 0
            )
            if not has_window:
                add(f"ok {op.f} without valid_until or ttl (no holding window)", op=op.id)
        elif op.f == "read":
            if "holder" not in op.value:
                add("ok read without holder", op=op.id)
            else:
                holder = op.value["holder"]
                if holder is not None and not (
                    isinstance(holder, dict) and _is_int(holder.get("token"))
                ):
                    add("ok read with a malformed holder", op=op.id)
    granted: dict[tuple[str, str, int], float] = {}
    for op in ops:
        token = op.value.get("token")
        if op.f == "acquire" and op.type == "ok" and _is_int(token):
            ident = (op.process, op.key, token)
            granted[ident] = min(granted.get(ident, math.inf), op.ret)
    cluster_fenced = (meta or {}).get("fence") == "cluster"
    for e in events:
        kind = e.get("type")
        if kind == "fenced":
            fields_ok = (
                isinstance(e.get("process"), str)
                and isinstance(e.get("key"), str)
                and _is_int(e.get("token"))
                and e.get("f") in ("read", "write")
                and isinstance(e.get("accepted"), bool)
                and _is_num(e.get("t"))
            )
            if not fields_ok:
                add("malformed fenced access", event=e)
                continue
            if not e["accepted"]:
                continue
            when = granted.get((e["process"], e["key"], e["token"]))
            if when is None or when > e["t"]:
                add(
                    "resource accepted a token its process was not granted on that key",
                    event={k: e.get(k) for k in ("t", "process", "key", "token", "f")},
                )
            answer = e.get("cluster")
            if (
                cluster_fenced
                and e["f"] == "write"
                and not (isinstance(answer, dict) and answer.get("current") is True)
            ):
                add(
                    "accepted write the cluster did not confirm",
                    event={k: e.get(k) for k in ("t", "process", "key", "token")},
                )
        elif kind == "keepalive" and not (
            isinstance(e.get("process"), str)
            and isinstance(e.get("session"), str)
            and _is_num(e.get("valid_until"))
            and _is_num(e.get("t"))
        ):
            add("malformed keepalive", event=e)
    started = {e.get("id") for e in events if e.get("type") == "nemesis" and e.get("f") == "start"}
    for e in events:
        if e.get("type") == "nemesis" and e.get("f") == "stop" and e.get("id") not in started:
            add("fault stop without a start", id=e.get("id"), fault=e.get("fault"))
    return problems


def check_history(events: list[Event], ops: list[Op]) -> dict[str, Any]:
    """``True`` when the history is fit to judge, else ``"unknown"`` with the problems
    (``history_problems``): a malformed history is never a pass, whatever the other
    checkers found in the part they could read."""
    problems = history_problems(events, ops)
    result = _result([], {"events": len(events), "ops": len(ops), "problems": len(problems)})
    result["unknown"] = problems[:MAX_REPORTED]
    if problems:
        result["valid"] = "unknown"
    return result


def observations(ops: Iterable[Op]) -> list[Observation]:
    """Every completed op that tells who held its key (reads in a linearizable mode,
    and refusals that name the holder or say there is none)."""
    out = []
    for op in ops:
        if op.f == "read" and op.type == "ok":
            if op.value.get("consistency") == "stale":
                continue
            if "holder" not in op.value:
                continue  # malformed: reported by the history checker, not read as "nobody"
            holder = op.value["holder"]
            if holder is None:
                out.append(Observation(op, None, None))
            elif isinstance(holder, dict) and _is_int(holder.get("token")):
                out.append(Observation(op, holder["token"], holder.get("owner")))
        elif op.type == "fail" and op.error in ("LEASE_HELD", "NOT_OWNER"):
            if _is_int(op.detail.get("token")):
                out.append(Observation(op, op.detail["token"], op.detail.get("owner")))
        elif op.type == "fail" and op.error == "LEASE_NOT_FOUND":
            out.append(Observation(op, None, None))
    return out


@dataclass
class LeaseView:
    """One granted lease as its client saw it."""

    grant: Op
    renews: list[Op] = field(default_factory=list)
    release_inv: float = math.inf
    release: Op | None = None

    @property
    def token(self) -> int:
        token = self.grant.token
        assert token is not None
        return token

    @property
    def units(self) -> int:
        """Units of the key's capacity the lease takes (1 for a plain lease)."""
        return int(self.grant.args.get("units", 1))

    @property
    def capacity(self) -> int:
        """The capacity the grant was asked for (1 for a plain lease)."""
        return int(self.grant.args.get("capacity", 1))

    @property
    def attached(self) -> bool:
        """Attached to a lease session: no TTL of its own, kept by the session."""
        return self.grant.session is not None

    def session_valid_until(self, before: float = math.inf) -> float:
        """An attached lease: the largest ``valid_until`` of its session the client
        recorded (the acquire's ok value, and ``keepalive`` events observed before
        ``before`` and before the release invocation): the client's own trusted window.
        The cluster keeps the session (and so the lease) at least that long unless it
        is released: each value is ``send + ttl*(1-rho) - margin`` of an open or
        keep-alive the cluster accepted, which it could not have if the session had
        ended in between."""
        best = _valid_until(self.grant, params=None) if self.grant.ret < before else -math.inf
        for t, valid_until in self.grant.keepalives:
            if t < before and t < self.release_inv:
                best = max(best, valid_until)
        return best

    def intervals(self, params: Params) -> list[tuple[float, float]]:
        """Holding intervals: from each ok (acquire or renew) to its valid_until,
        cut at the release invocation. An attached lease: one interval, from the
        acquire's ok to its session's largest recorded ``valid_until``."""
        if self.attached:
            start, end = self.grant.ret, min(self.session_valid_until(), self.release_inv)
            return [(start, end)] if end > start else []
        out = []
        for op in [self.grant, *self.renews]:
            start = op.ret
            end = _valid_until(op, params)
            end = min(end, self.release_inv)
            if end > start:
                out.append((start, end))
        return out

    def certainly_live_until(self, before: float, params: Params) -> float:
        """The latest valid_until among this lease's oks that completed before ``before``
        (an attached lease: among its session's recorded values, see
        ``session_valid_until``)."""
        if self.attached:
            return self.session_valid_until(before)
        best = -math.inf
        for op in [self.grant, *self.renews]:
            if op.ret < before:
                best = max(best, _valid_until(op, params))
        return best


def _valid_until(op: Op, params: Params | None) -> float:
    recorded = op.value.get("valid_until")
    if isinstance(recorded, int | float):
        return float(recorded)
    if params is None or op.session is not None:
        return -math.inf  # an attached lease records its session's window, or none
    ttl = float(op.value.get("ttl", op.args.get("ttl", 0.0)))
    return op.inv + ttl * (1 - params.rho) - params.margin


def leases(ops: Iterable[Op]) -> dict[str, list[LeaseView]]:
    """Per key, the leases granted to clients (ok acquires) with their ok renewals and
    the first release each client invoked on them."""
    by_id: dict[tuple[str, str, int], LeaseView] = {}
    out: dict[str, list[LeaseView]] = defaultdict(list)
    for op in sorted(ops, key=lambda o: o.inv):
        token = op.token
        if token is None:
            continue
        ident = (op.process, op.key, token)
        if op.f == "acquire" and op.type == "ok":
            view = LeaseView(op)
            by_id[ident] = view
            out[op.key].append(view)
        elif op.f == "renew" and op.type == "ok" and ident in by_id:
            by_id[ident].renews.append(op)
        elif op.f == "release" and ident in by_id and by_id[ident].release is None:
            by_id[ident].release = op
            by_id[ident].release_inv = op.inv
    return out


def _result(violations: list[dict[str, Any]], stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "valid": not violations,
        "violation_count": len(violations),
        "violations": violations[:MAX_REPORTED],
        "stats": stats,
    }


# ------------------------------------------------------------ 1. mutual exclusion


def check_mutual_exclusion(
    ops: list[Op], params: Params, shared: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """Plain keys: no two leases' holding intervals overlap. Shared keys (``shared``:
    key -> capacity; default: from the acquires' ``capacity``): the units of the
    intervals that overlap never add up to more than the capacity."""
    shared = shared_keys(ops) if shared is None else shared
    violations: list[dict[str, Any]] = []
    count = 0
    shared_stats: dict[str, Any] = {}
    for key, views in sorted(leases(ops).items()):
        spans = sorted(
            ((start, end, view) for view in views for start, end in _union(view.intervals(params))),
            key=lambda s: (s[0], s[1]),
        )
        count += len(spans)
        if key in shared:
            found, shared_stats[key] = _over_capacity(key, spans, shared[key])
            violations.extend(found)
            continue
        active: list[tuple[float, float, LeaseView]] = []
        reported: set[tuple[int, int]] = set()
        for start, end, view in spans:
            active = [a for a in active if a[1] > start]
            for a_start, a_end, other in active:
                pair = (min(other.token, view.token), max(other.token, view.token))
                if other.token != view.token and pair not in reported:
                    reported.add(pair)
                    violations.append(
                        {
                            "key": key,
                            "t": start,
                            "overlap": round(min(a_end, end) - start, 4),
                            "first": {
                                "process": other.grant.process,
                                "token": other.token,
                                "holding": [round(a_start, 4), round(a_end, 4)],
                                "grant": other.grant.id,
                            },
                            "second": {
                                "process": view.grant.process,
                                "token": view.token,
                                "holding": [round(start, 4), round(end, 4)],
                                "grant": view.grant.id,
                            },
                        }
                    )
            active.append((start, end, view))
    return _result(violations, {"holding_intervals": count, "shared": shared_stats})


def _over_capacity(
    key: str, spans: list[tuple[float, float, LeaseView]], capacity: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Sweep a shared key's holding intervals (half-open: an interval ending at t and
    one starting at t do not overlap). At every instant the units held must fit in the
    capacity: the smallest one any current holder was granted with (a grant without
    ``capacity`` is a plain one, capacity 1). One violation per stretch of time spent
    over capacity, naming the holders at its peak."""
    points = sorted(
        [(s[0], 1, n) for n, s in enumerate(spans)] + [(s[1], 0, n) for n, s in enumerate(spans)]
    )
    active: dict[int, tuple[float, float, LeaseView]] = {}
    violations: list[dict[str, Any]] = []
    episode: dict[str, Any] | None = None
    max_units = max_holders = 0
    full = 0.0
    last = points[0][0] if points else 0.0
    for t, starts, n in points:
        used = sum(v.units for _, _, v in active.values())
        if used >= capacity:
            full += t - last
        last = t
        if starts:
            active[n] = spans[n]
        else:
            del active[n]
        used = sum(v.units for _, _, v in active.values())
        limit = min([capacity, *(v.capacity for _, _, v in active.values())])
        max_units = max(max_units, used)
        max_holders = max(max_holders, len(active))
        if used > limit and (episode is None or used > episode["units_held"]):
            since = t if episode is None else episode["t"]
            episode = {
                "key": key,
                "t": since,
                "capacity": limit,
                "units_held": used,
                "holders": [
                    {
                        "process": v.grant.process,
                        "token": v.token,
                        "units": v.units,
                        "holding": [round(a, 4), round(b, 4)],
                        "grant": v.grant.id,
                    }
                    for a, b, v in sorted(active.values(), key=lambda s: (s[0], s[1]))
                ],
            }
        elif used <= limit and episode is not None:
            episode["overlap"] = round(t - episode["t"], 4)
            violations.append(episode)
            episode = None
    stats = {
        "capacity": capacity,
        "holding_intervals": len(spans),
        "max_units_held": max_units,
        "max_holders": max_holders,
        "seconds_full": round(full, 3),
    }
    return violations, stats


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


# ---------------------------------------------------------------------- 2. fencing


def check_fencing(
    ops: list[Op], events: list[Event], params: Params, shared: Mapping[str, int] | None = None
) -> dict[str, Any]:
    shared = shared_keys(ops, events) if shared is None else shared
    violations: list[dict[str, Any]] = []
    grants_by_key: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        if op.f == "acquire" and op.type == "ok" and op.token is not None:
            grants_by_key[op.key].append(op)
    # Grant tokens: every grant, shared keys included (each holder of a shared key gets
    # its own token), and store-wide: a token is the store revision of its grant, so
    # two grants never share one, not even on different keys.
    owner_of: dict[int, Op] = {}
    for g in ops:
        token = g.token
        if g.f != "acquire" or g.type != "ok" or token is None:
            continue
        first = owner_of.setdefault(token, g)
        if first is not g and (first.process != g.process or first.key != g.key):
            violations.append(
                {
                    "key": g.key,
                    "kind": "token handed out twice",
                    "t": g.ret,
                    "token": token,
                    "grants": [first.brief(), g.brief()],
                }
            )
    for key, grants in grants_by_key.items():
        by_ret = sorted(grants, key=lambda o: o.ret)
        rets = [g.ret for g in by_ret]
        prefix: list[Op] = []
        for g in by_ret:
            if not prefix or (g.token or 0) > (prefix[-1].token or 0):
                prefix.append(g)
            else:
                prefix.append(prefix[-1])
        for b in grants:
            n = bisect.bisect_left(rets, b.inv)
            if n and (prefix[n - 1].token or 0) >= (b.token or 0):
                a = prefix[n - 1]
                violations.append(
                    {
                        "key": key,
                        "kind": "token not increasing in real-time order",
                        "t": b.ret,
                        "earlier": a.brief(),
                        "later": b.brief(),
                    }
                )
    # The fenced store's rules (one token at a time, no lost update) model a single
    # holder: several holders of a shared key at once would break them by design. The
    # workload makes no fenced access under a shared key; any that appears is skipped.
    accesses = [e for e in fenced_events(events) if e["key"] not in shared]
    highest: dict[str, tuple[int, str]] = {}
    accepted = rejected = 0
    for e in sorted(accesses, key=lambda e: e.get("i", 0)):
        key, token, proc = e["key"], e["token"], e["process"]
        if not e["accepted"]:
            rejected += 1
            continue
        accepted += 1
        top = highest.get(key)
        if top is not None and token < top[0]:
            violations.append(
                {
                    "key": key,
                    "kind": "resource accepted a lower token",
                    "t": e["t"],
                    "token": token,
                    "process": proc,
                    "highest": top[0],
                }
            )
        elif top is not None and token == top[0] and proc != top[1]:
            violations.append(
                {
                    "key": key,
                    "kind": "two clients used one token",
                    "t": e["t"],
                    "token": token,
                    "processes": [top[1], proc],
                }
            )
        if top is None or token >= top[0]:
            highest[key] = (token, proc)
        if e["f"] == "write" and e.get("value") is not None and e["before"] != e["value"] - 1:
            violations.append(
                {
                    "key": key,
                    "kind": "lost update",
                    "t": e["t"],
                    "token": token,
                    "process": proc,
                    "read": e["value"] - 1,
                    "overwrote": e["before"],
                }
            )
    answered = _against_cluster_answers(ops, accesses, params, shared)
    violations.extend(answered.pop("violations"))
    stale = _stale_accesses(ops, accesses, params)  # accesses: plain keys only
    return _result(
        violations,
        {
            "grants": sum(len(g) for g in grants_by_key.values()),
            "resource_accepted": accepted,
            "resource_rejected": rejected,
            **answered,
            **stale,
        },
    )


def fenced_events(events: Iterable[Event]) -> list[Event]:
    """The well-formed fenced accesses (the ``history`` checker reports the others)."""
    return [
        e
        for e in events
        if e.get("type") == "fenced"
        and isinstance(e.get("process"), str)
        and isinstance(e.get("key"), str)
        and _is_int(e.get("token"))
        and e.get("f") in ("read", "write")
        and isinstance(e.get("accepted"), bool)
        and _is_num(e.get("t"))
    ]


def _against_cluster_answers(
    ops: list[Op], accesses: list[Event], params: Params, shared: Mapping[str, int]
) -> dict[str, Any]:
    """The resource asks the cluster before each write (``Client.fence``: is this
    token the current holder's?) and records the answer; judge raftlease by it. The
    answer is linearizable: it took effect at one instant of the call ``[inv, ret]``.

    * *stale holder's write accepted*: the cluster called a token current although a
      grant of a higher token on the key (or a read that saw one) had completed
      before the call began: the older lease had ended by then, for good (if the
      writer's own grant began after that, raftlease handed out a lower token later);
    * *current token below one already used*: the cluster called a token current but
      the resource had already accepted a higher one for the key (it refused the
      write): raftlease handed out a lower token after a higher one;
    * *holder denied while its lease was certainly live*: the cluster said "not
      current" (an answer, not an error) to the writer's own token during a call that
      lay wholly inside the writer's certain holding window (``certainly_live_until``
      of what completed before the call, and before its release): a lost grant.
    """
    violations: list[dict[str, Any]] = []
    seen: dict[str, list[tuple[float, int, Op]]] = defaultdict(list)
    for op in ops:
        if op.key in shared:
            continue
        if op.f == "acquire" and op.type == "ok" and op.token is not None:
            seen[op.key].append((op.ret, op.token, op))
    for o in observations(op for op in ops if op.key not in shared):
        if o.token is not None:
            seen[o.op.key].append((o.op.ret, o.token, o.op))
    newest: dict[str, tuple[list[float], list[tuple[int, Op]]]] = {}
    for key, rows in seen.items():
        rows.sort(key=lambda r: r[0])
        best: list[tuple[int, Op]] = []
        for _, token, op in rows:
            best.append((token, op) if not best or token > best[-1][0] else best[-1])
        newest[key] = ([r[0] for r in rows], best)
    views = {(v.grant.process, key, v.token): v for key, vs in leases(ops).items() for v in vs}
    asked = confirmed = denied = errors = 0
    for e in accesses:
        answer = e.get("cluster")
        if not isinstance(answer, dict) or not (
            _is_num(answer.get("inv")) and _is_num(answer.get("ret"))
        ):
            continue
        asked += 1
        key, token = e["key"], e["token"]
        where = {"key": key, "t": e["t"], "token": token, "process": e["process"]}
        if answer.get("current") is True:
            confirmed += 1
            rets, best = newest.get(key, ([], []))
            n = bisect.bisect_left(rets, answer["inv"])
            if n and best[n - 1][0] > token:
                newer = best[n - 1][1]
                own = views.get((e["process"], key, token))
                # The writer's own grant began after the higher token was known: not a
                # replaced holder but a lower token handed out later.
                lower = own is not None and own.grant.inv > newer.ret
                if not e["accepted"]:
                    kind = "the cluster called a replaced or lower token current"
                elif lower:
                    kind = "the cluster called current a token granted after a higher one"
                else:
                    kind = (
                        "stale holder's write accepted: the cluster called a replaced token current"
                    )
                violations.append(
                    {
                        **where,
                        "kind": kind,
                        "asked": [round(answer["inv"], 4), round(answer["ret"], 4)],
                        "newer": newer.brief(),
                    }
                )
            if (
                not e["accepted"]
                and e.get("refused_by", "resource") == "resource"
                and _is_int(e.get("highest"))
                and e["highest"] > token
            ):
                violations.append(
                    {
                        **where,
                        "kind": "the cluster's current token is below one the resource "
                        "already accepted",
                        "highest": e["highest"],
                    }
                )
        elif answer.get("current") is False:
            denied += 1
            view = views.get((e["process"], key, token))
            if view is None:
                continue
            live = view.certainly_live_until(answer["inv"], params)
            if answer["ret"] < min(live, view.release_inv):
                violations.append(
                    {
                        **where,
                        "kind": "the cluster denied a holder whose lease was certainly live",
                        "asked": [round(answer["inv"], 4), round(answer["ret"], 4)],
                        "certainly_held_until": round(live, 4),
                        "grant": view.grant.brief(),
                    }
                )
        else:
            errors += 1
    return {
        "violations": violations,
        "cluster_asked": asked,
        "cluster_confirmed": confirmed,
        "cluster_denied": denied,
        "cluster_errors": errors,
    }


def _stale_accesses(ops: list[Op], accesses: list[Event], params: Params) -> dict[str, Any]:
    """Accesses made outside the client's own holding interval (a paused client):
    how many the resource refused (the fence worked) or accepted (nobody newer had
    touched the resource yet, which is harmless)."""
    spans: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for key, views in leases(ops).items():
        for view in views:
            spans[(view.grant.process, key, view.token)] = view.intervals(params)
    refused = accepted = writes_refused = 0
    for e in accesses:
        ivs = spans.get((e["process"], e["key"], e["token"]), [])
        if not any(s <= e["t"] < end for s, end in ivs):
            if e["accepted"]:
                accepted += 1
            else:
                refused += 1
                writes_refused += bool(e["f"] == "write" or e.get("for_write"))
    return {
        "late_accesses_refused": refused,
        "late_accesses_accepted": accepted,
        # Refused attempts to write late (a write, or the read of a read-modify-write).
        "late_writes_refused": writes_refused,
    }


# -------------------------------------------------------------- 3. no lost grant


def check_no_lost_grant(
    ops: list[Op], params: Params, shared: Mapping[str, int] | None = None
) -> dict[str, Any]:
    shared = shared_keys(ops) if shared is None else shared
    violations = []
    views_by_key = leases(ops)
    obs_by_key: dict[str, list[Observation]] = defaultdict(list)
    # Plain keys only: the rule "a read after a grant shows that grant or a newer one"
    # assumes a single holder. A read of a shared key names only its newest holder, and
    # a refusal (LEASE_HELD when it is full) any one of several: an older token there
    # is no stale read.
    for o in observations(op for op in ops if op.key not in shared):
        obs_by_key[o.op.key].append(o)
    checked = 0
    for key, obs in obs_by_key.items():
        views = sorted(views_by_key.get(key, []), key=lambda v: v.grant.ret)
        rets = [v.grant.ret for v in views]
        best: list[LeaseView] = []
        for v in views:
            best.append(v if not best or v.token > best[-1].token else best[-1])
        for o in obs:
            checked += 1
            n = bisect.bisect_left(rets, o.op.inv)
            if n == 0:
                continue
            newest = best[n - 1]
            if o.token is not None and o.token < newest.token:
                violations.append(
                    {
                        "key": key,
                        "kind": "stale read: older token than a completed grant",
                        "t": o.op.ret,
                        "read": o.op.brief(),
                        "grant": newest.grant.brief(),
                    }
                )
                continue
            for v in views[:n]:
                if o.token is not None and o.token >= v.token:
                    continue
                live = v.certainly_live_until(o.op.inv, params)
                if o.op.ret < min(live, v.release_inv):
                    violations.append(
                        {
                            "key": key,
                            "kind": "acknowledged grant lost",
                            "t": o.op.ret,
                            "read": o.op.brief(),
                            "grant": v.grant.brief(),
                            "certainly_held_until": round(live, 4),
                        }
                    )
                    break
    return _result(violations, {"observations": checked, "skipped_shared_keys": sorted(shared)})


# ------------------------------------------------------------ 4. linearizability


def model_ops(
    ops: list[Op], params: Params
) -> dict[str, tuple[list[LOp], dict[int, str], list[str]]]:
    """Translate the history into model operations per key. Returns
    ``key -> (ops, owner of each token, notes)``."""
    out: dict[str, tuple[list[LOp], dict[int, str], list[str]]] = {}
    by_key: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    slack = 1 - params.rho

    def granted_owner(op: Op) -> str:
        # The holder is who the cluster says it granted to (the ok value's ``owner``,
        # which reads and refusals name too), not the process that asked: one process
        # may acquire for several owners, and owners need not be process names. An
        # unanswered acquire has no answer: the owner it asked for.
        for owner in (op.value.get("owner"), op.args.get("owner")):
            if isinstance(owner, str):
                return owner
        return op.process  # a history that records no owner at all (older runs)

    def earliest_expiry(op: Op) -> float:
        # An attached acquire has no TTL: with no ok value, its lease may expire at
        # any time (its session's window is unknown); see ``attached_expiry``.
        ttl = float(op.value.get("ttl", op.args.get("ttl", 0.0))) if op.session is None else 0.0
        return op.inv + ttl * slack - params.margin

    for key, kops in by_key.items():
        lops: list[LOp] = []
        owners: dict[int, str] = {}
        notes: list[str] = []
        expiry_of: dict[int, float] = {}
        # An attached lease (lease session) has no TTL-based expiry: keep-alives extend
        # it. Its earliest expiry is the largest session valid_until its client recorded
        # before releasing (it cannot end earlier unless released; it may end any time
        # after, or much later), exactly its mutual-exclusion window.
        attached_expiry = {
            (v.grant.id): v.session_valid_until() for v in leases(kops).get(key, []) if v.attached
        }
        for op in kops:
            if op.f == "acquire" and op.type == "ok" and op.token is not None:
                owners[op.token] = granted_owner(op)
                expiry_of[op.token] = attached_expiry.get(op.id, earliest_expiry(op))
                lops.append(
                    LOp(
                        "grant",
                        op.inv,
                        op.ret,
                        op.token,
                        owners[op.token],
                        expiry_of[op.token],
                        src=op.id,
                    )
                )
        for op in kops:
            token = op.token
            if op.f == "renew" and op.type == "ok" and token is not None:
                exp = op.inv + float(op.value.get("ttl", 0.0)) * slack - params.margin
                expiry_of[token] = max(expiry_of.get(token, -math.inf), exp)
                lops.append(LOp("renew", op.inv, op.ret, token, expiry=exp, src=op.id))
            elif op.f == "release" and op.type == "ok" and token is not None:
                lops.append(LOp("release", op.inv, op.ret, token, src=op.id))
        for op in kops:
            if op.f == "release" and op.type == "info" and op.token is not None:
                until = expiry_of.get(op.token, -math.inf)
                if until > op.inv:  # after that, releasing is the same as expiring
                    lops.append(
                        LOp(
                            "release",
                            op.inv,
                            until,
                            op.token,
                            optional=True,
                            src=op.id,
                            note="info: may or may not have happened",
                        )
                    )
        obs = observations(kops)
        for o in obs:
            lops.append(LOp("observe", o.op.inv, o.op.ret, o.token, o.owner, src=o.op.id))
        # Tokens seen but granted to nobody who heard back: an ``info`` acquire by the
        # owner may explain them (it then happened before the first sighting).
        first_seen: dict[int, Observation] = {}
        for o in sorted(obs, key=lambda o: o.op.ret):
            if o.token is not None and o.token not in owners:
                first_seen.setdefault(o.token, o)
        for token, o in sorted(first_seen.items()):
            owners.setdefault(token, o.owner or "?")
            cands = [
                a
                for a in kops
                if a.f == "acquire"
                and a.type == "info"
                and granted_owner(a) == o.owner
                and a.inv < o.op.ret
            ]
            for a in cands:
                lops.append(
                    LOp(
                        "grant",
                        a.inv,
                        o.op.ret,
                        token,
                        o.owner,
                        earliest_expiry(a),
                        optional=True,
                        group=a.id,
                        src=a.id,
                        note=f"info acquire, may explain token {token}",
                    )
                )
            if not cands:
                failed = [
                    a.id
                    for a in kops
                    if a.f == "acquire"
                    and a.type == "fail"
                    and granted_owner(a) == o.owner
                    and a.inv < o.op.ret
                    and a.error not in DOMAIN_CODES
                ]
                notes.append(
                    f"token {token} (owner {o.owner}) was seen by {o.op.id} but no acquire "
                    "could have produced it"
                    + (f"; {o.owner}'s acquires {failed} failed definitely" if failed else "")
                )
        out[key] = (lops, owners, notes)
    return out


def check_linearizable(
    ops: list[Op], params: Params, shared: Mapping[str, int] | None = None
) -> dict[str, Any]:
    shared = shared_keys(ops) if shared is None else shared
    violations = []
    unknown = []
    stats: dict[str, Any] = {}
    # Plain keys only: the model of linearizability.py is a single-holder lease (a grant
    # needs no holder), which a shared key with two holders at once would violate by
    # design. Their safety is the capacity rule of mutual_exclusion.
    single = [op for op in ops if op.key not in shared]
    for key, (lops, owners, notes) in sorted(model_ops(single, params).items()):
        outcome = check_ops(
            lops,
            owners,
            budget=params.lin_budget,
            segment_budget=params.lin_segment_budget,
            time_limit=params.lin_time_limit,
        )
        stats[key] = {
            "ops": len(lops),
            "segments": outcome.segments,
            "explored": outcome.explored,
            "seconds": round(outcome.seconds, 3),
            "result": outcome.valid,
        }
        if outcome.valid is False:
            t = outcome.detail.get("segment_window", [None])[0]
            violations.append({"key": key, "t": t, "notes": notes, **outcome.detail})
        elif outcome.valid == "unknown":
            unknown.append({"key": key, **outcome.detail})
    result = _result(violations, stats)
    if not violations and unknown:
        result["valid"] = "unknown"
    result["unknown"] = unknown
    result["skipped_shared_keys"] = sorted(shared)
    return result


# ---------------------------------------------------------------- 5. liveness


def check_liveness(ops: list[Op], events: list[Event], params: Params) -> dict[str, Any]:
    """After every heal some operation completes within the bound. Passes only when
    recovery was measured: a fault that never healed (a ``start`` with no ``stop``)
    or a run with no heal at all (nothing measured) is ``unknown``, never a pass."""
    bound = params.liveness_bound
    progress = sorted(
        op.ret for op in ops if op.type == "ok" or (op.type == "fail" and op.error in DOMAIN_CODES)
    )
    faults = sorted(
        (
            e
            for e in events
            if e.get("type") == "nemesis"
            and e.get("f") in ("start", "stop")
            and _is_num(e.get("t"))
        ),
        key=lambda e: e["t"],
    )
    end = max((e["t"] for e in events if _is_num(e.get("t"))), default=0.0)
    violations = []
    unknown = []
    recoveries = []
    stopped = {e.get("id") for e in faults if e["f"] == "stop"}
    for e in faults:
        if e["f"] == "start" and e.get("id") not in stopped:
            unknown.append(
                {
                    "fault": e.get("fault"),
                    "id": e.get("id"),
                    "started": round(e["t"], 4),
                    "kind": "never healed: recovery not measured",
                }
            )
    for n, e in enumerate(faults):
        if e["f"] != "stop":
            continue
        heal = e["t"]
        nxt = next((f["t"] for f in faults[n + 1 :] if f["f"] == "start"), end)
        i = bisect.bisect_left(progress, heal)
        first = progress[i] if i < len(progress) else math.inf
        took = first - heal
        entry = {"fault": e.get("fault"), "id": e.get("id"), "healed": round(heal, 4)}
        if took <= bound:
            recoveries.append({**entry, "recovered_in": round(took, 3)})
        elif nxt - heal >= bound:
            violations.append(
                {
                    **entry,
                    "t": heal,
                    "kind": f"no progress within {bound} s",
                    "first_progress_after": None if math.isinf(took) else round(took, 3),
                }
            )
        else:
            unknown.append({**entry, "window": round(nxt - heal, 3)})
    heals = len(recoveries) + len(violations) + sum(1 for u in unknown if "window" in u)
    if not recoveries and not violations:
        unknown.append({"kind": "no heal measured: liveness was not tested", "heals": heals})
    result = _result(
        violations,
        {
            "bound": bound,
            "heals": heals,
            "heals_measured": len(recoveries),
            "never_healed": sum(1 for u in unknown if "started" in u),
            "max_recovery": max((r["recovered_in"] for r in recoveries), default=None),
            "recoveries": recoveries,
        },
    )
    if not violations and unknown:
        result["valid"] = "unknown"
    result["unknown"] = unknown
    return result


# ------------------------------------------------------------ 6. replicas agree


def check_replicas(events: list[Event]) -> dict[str, Any]:
    """Once the clients have stopped and the faults are healed, every node must catch
    up to one applied index, and the replicas must hold one whole state there.

    The ``final`` event carries both: ``converged`` and each node's live status (as the
    nodes reported it), and ``replay``: each stopped node's state machine rebuilt from
    its own data directory at one committed index (``replay.py``), with a digest of the
    whole state, and the committed log entries two nodes hold that differ. A replica
    that applied a different entry at some index (its log was rewritten under it), or
    that holds anything else differently, shows up here. ``unknown`` (never a pass)
    when there is no final state, no replay, or the replay could not compare every
    node of the run."""
    final = next((e for e in reversed(events) if e.get("type") == "final"), None)
    if final is None:
        result = _result([], {"recorded": False})
        result.update(valid="unknown", unknown=[{"kind": "no final state recorded"}])
        return result
    nodes = {k: v for k, v in (final.get("nodes") or {}).items() if v}
    violations: list[dict[str, Any]] = []
    unknown: list[dict[str, Any]] = []
    t = final.get("t")
    if not final.get("converged"):
        violations.append(
            {
                "kind": f"replicas did not catch up within {final.get('waited')} s of quiet",
                # The short facts first: a printed violation is cut at a line's end.
                "missing": final.get("missing") or {},
                "target": final.get("target"),
                "applied": {
                    nid: (st or {}).get("applied_index")
                    for nid, st in (final.get("nodes") or {}).items()
                },
                "t": t,
                "nodes": final.get("nodes"),
            }
        )
    # The live status counters (cheap, and available even when a replay is not).
    by_index: dict[Any, dict[str, Any]] = defaultdict(dict)
    for nid, st in nodes.items():
        by_index[st.get("applied_index")][nid] = st
    for index, group in by_index.items():
        states = {
            nid: tuple(st.get(k) for k in ("revision", "log_time", "leases", "sessions"))
            for nid, st in group.items()
        }
        if len(set(states.values())) > 1:
            violations.append(
                {
                    "kind": "replicas diverged",
                    "compared": "status counters",
                    "t": t,
                    "applied_index": index,
                    "states": states,
                }
            )
    replay = final.get("replay")
    expected = _run_nodes(events, final)
    compared: dict[str, Any] = {}
    if not isinstance(replay, dict):
        unknown.append({"kind": "whole state not compared: no replay of the nodes' data"})
    else:
        unknown.extend({"kind": "replay", "problem": p} for p in replay.get("problems") or [])
        compared = {
            nid: st
            for nid, st in (replay.get("nodes") or {}).items()
            if isinstance(st, dict) and isinstance(st.get("digest"), str)
        }
        missing = sorted(set(expected) - set(compared))
        if missing or not compared:
            unknown.append({"kind": "replicas not rebuilt", "nodes": missing})
        digests = {nid: st["digest"] for nid, st in compared.items()}
        if len(set(digests.values())) > 1:
            violations.append(
                {
                    "kind": "replicas diverged",
                    "compared": "whole state",
                    "t": t,
                    "index": replay.get("index"),
                    "digests": {nid: d[:16] for nid, d in digests.items()},
                    "states": {
                        nid: {k: st.get(k) for k in ("revision", "leases", "dump_index")}
                        for nid, st in compared.items()
                    },
                }
            )
        for conflict in replay.get("log_conflicts") or []:
            violations.append({"kind": "committed log entries differ", "t": t, **conflict})
    result = _result(
        violations,
        {
            "recorded": True,
            "nodes": len(nodes),
            "replayed": len(compared),
            "index": replay.get("index") if isinstance(replay, dict) else None,
            "entries_compared": replay.get("entries_compared") if isinstance(replay, dict) else 0,
        },
    )
    if not violations and unknown:
        result["valid"] = "unknown"
    result["unknown"] = unknown
    return result


def check_rejoin(events: list[Event]) -> dict[str, Any]:
    """The ``rejoin`` checker (module doc, 7): over the ``isolate-follower`` faults'
    heal events. A heal that recorded no terms (the victim did not answer its status)
    is ``unknown``."""
    violations: list[dict[str, Any]] = []
    unknown: list[dict[str, Any]] = []
    faults = kept = 0
    for event in events:
        if event.get("type") != "nemesis" or event.get("f") != "stop":
            continue
        if event.get("fault") != "isolate-follower":
            continue
        faults += 1
        detail = event.get("detail") or {}
        before, at_heal = detail.get("victim_term_before"), detail.get("victim_term_at_heal")
        if detail.get("leader_kept"):
            kept += 1
        if not (_is_int(before) and _is_int(at_heal)):
            unknown.append({"kind": "no terms recorded for the cut-off member", "event": event})
        elif at_heal > before:
            violations.append(
                {
                    "kind": "a member cut off from every other raised its term",
                    "victim": detail.get("victim"),
                    "term_before": before,
                    "term_at_heal": at_heal,
                    "leader_kept": detail.get("leader_kept"),
                    "t": event.get("t"),
                }
            )
    result = _result(violations, {"faults": faults, "leader_kept": kept})
    if unknown and not violations:
        result.update(valid="unknown", unknown=unknown)
    return result


def check_membership(events: list[Event]) -> dict[str, Any]:
    """The ``membership`` checker (module doc, 10): over the ``membership-missed``
    faults' heal events."""
    violations: list[dict[str, Any]] = []
    unknown: list[dict[str, Any]] = []
    faults = 0
    for event in events:
        if event.get("type") != "nemesis" or event.get("f") != "stop":
            continue
        if event.get("fault") != "membership-missed":
            continue
        faults += 1
        detail = event.get("detail") or {}
        learned = detail.get("learned")
        if learned is False:
            violations.append(
                {
                    "kind": "a member down during an add never learned the new member",
                    "member": (detail.get("restarted") or [None])[0],
                    "waited_s": detail.get("learn_s"),
                    "t": event.get("t"),
                }
            )
        elif learned is not True:
            unknown.append({"kind": "the heal recorded no outcome", "event": event})
    result = _result(violations, {"faults": faults})
    if unknown and not violations:
        result.update(valid="unknown", unknown=unknown)
    return result


def _run_nodes(events: list[Event], final: Event) -> list[str]:
    """The nodes of the run: the final event's, or ``n1..nN`` from the meta's count."""
    if final.get("nodes"):
        return sorted(final["nodes"])
    meta = next((e for e in events if e.get("type") == "meta"), {})
    count = meta.get("nodes")
    return [f"n{i + 1}" for i in range(count)] if _is_int(count) else []


# -------------------------------------------------- volume: did anything happen?


@dataclass(frozen=True)
class VolumeRequirements:
    """What a run must have done for its verdict to mean anything: a checker that saw
    no contention, no fault and no late write passes for want of a chance to fail.

    ``keys``: each granted at least ``min_grants`` times; ``plain_keys``: each with at
    least ``min_contended`` holding intervals that met another client's acquire
    attempt (an acquire invoked on the key by another process while it was held);
    at least ``min_reads_during_faults`` reads answered while a fault was on; every
    fault kind of ``kinds`` executed (started, not skipped, and healed); at least
    ``min_heals`` heals, each with its recovery measured; at least
    ``min_pause_client_refused`` refused late writes by the client process after a
    ``pause-client`` fault; at least ``min_ok_ops`` operations that succeeded."""

    keys: tuple[str, ...] = ()
    plain_keys: tuple[str, ...] = ()
    min_grants: int = 1
    min_contended: int = 1
    min_reads_during_faults: int = 1
    kinds: tuple[str, ...] = ()
    min_heals: int = 1
    min_pause_client_refused: int = 0
    min_ok_ops: int = 1

    @classmethod
    def from_meta(cls, events: Iterable[Event], **overrides: Any) -> VolumeRequirements:
        """The requirements of the run the ``meta`` event describes: its keys, the
        fault kinds of its schedule, a refused late write if it paused the client."""
        meta = next((e for e in events if e.get("type") == "meta"), {})
        plain = tuple(str(k) for k in meta.get("keys") or ())
        shared = tuple(str(k) for k in meta.get("shared_keys") or {})
        kinds = tuple(sorted({str(s.get("kind")) for s in meta.get("schedule") or ()}))
        values: dict[str, Any] = {
            "keys": plain + shared,
            "plain_keys": plain,
            "kinds": kinds,
            "min_heals": max(1, len(meta.get("schedule") or ())),
            "min_pause_client_refused": 1 if "pause-client" in kinds else 0,
        }
        values.update(overrides)
        return cls(**values)


def _fault_windows(events: Iterable[Event]) -> list[tuple[float, float, Event]]:
    """``(start, stop, start event)`` of every fault that started and healed."""
    starts: dict[Any, Event] = {}
    out = []
    for e in sorted(
        (e for e in events if e.get("type") == "nemesis" and _is_num(e.get("t"))),
        key=_time_order,
    ):
        if e.get("f") == "start":
            starts[e.get("id")] = e
        elif e.get("f") == "stop" and e.get("id") in starts:
            s = starts.pop(e.get("id"))
            out.append((float(s["t"]), float(e["t"]), s))
    return out


def volume_stats(
    events: list[Event], ops: list[Op], params: Params, liveness: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """How much the run did: grants per key, contended holding intervals per key,
    reads answered during faults, refused late writes (and those of the paused client
    process), heals and measured recoveries, fault kinds executed."""
    grants: dict[str, int] = defaultdict(int)
    attempts: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for op in ops:
        if op.f == "acquire":
            attempts[op.key].append((op.inv, op.process))
            if op.type == "ok":
                grants[op.key] += 1
    contended: dict[str, int] = defaultdict(int)
    intervals: dict[str, int] = defaultdict(int)
    for key, views in leases(ops).items():
        rows = sorted(attempts[key])
        invs = [r[0] for r in rows]
        for view in views:
            for start, end in _union(view.intervals(params)):
                intervals[key] += 1
                lo, hi = bisect.bisect_left(invs, start), bisect.bisect_left(invs, end)
                if any(rows[j][1] != view.grant.process for j in range(lo, hi)):
                    contended[key] += 1
    windows = _fault_windows(events)
    during = 0
    for op in ops:
        if op.f == "read" and op.type == "ok":
            during += any(start <= op.ret <= stop for start, stop, _ in windows)
    accesses = fenced_events(events)
    stale = _stale_accesses(ops, accesses, params)
    refused = accepted = unwritten = 0
    for start, _, s in windows:
        detail = s.get("detail") or {}
        if s.get("fault") != "pause-client" or "paused" not in detail or "token" not in detail:
            continue
        later = [
            e
            for e in accesses
            if e["process"] == detail["paused"]
            and e["key"] == detail.get("key")
            and e["token"] == detail["token"]
            and e["t"] > start
        ]
        first = min(later, key=lambda e: e["t"], default=None)
        if first is None:
            unwritten += 1
        elif first["accepted"] and all(e["accepted"] for e in later):
            accepted += 1
        else:
            refused += 1
    executed = sorted(
        {str(s.get("fault")) for _, _, s in windows if "skipped" not in (s.get("detail") or {})}
    )
    live = (liveness or {}).get("stats", {})
    ok_ops = sum(1 for op in ops if op.type == "ok")
    return {
        "ok_ops": ok_ops,
        "grants_per_key": dict(sorted(grants.items())),
        "holding_intervals_per_key": dict(sorted(intervals.items())),
        "contended_per_key": dict(sorted(contended.items())),
        "reads_during_faults": during,
        "late_writes_refused": stale["late_writes_refused"],
        "late_accesses_accepted": stale["late_accesses_accepted"],
        "pause_client_writes_refused": refused,
        "pause_client_writes_accepted": accepted,
        "pause_client_no_write": unwritten,
        "faults": len(windows),
        "heals": live.get("heals", len(windows)),
        "heals_measured": live.get("heals_measured", 0),
        "fault_kinds_executed": executed,
    }


def check_volume(stats: Mapping[str, Any], req: VolumeRequirements) -> dict[str, Any]:
    """``valid`` False (with what fell short) unless the run did what ``req`` asks."""
    short: list[dict[str, Any]] = []

    def need(kind: str, got: Any, want: Any) -> None:
        short.append({"kind": kind, "got": got, "need": want})

    if stats["ok_ops"] < req.min_ok_ops:
        need("operations that succeeded", stats["ok_ops"], req.min_ok_ops)
    for key in req.keys:
        got = stats["grants_per_key"].get(key, 0)
        if got < req.min_grants:
            need(f"grants on {key}", got, req.min_grants)
    for key in req.plain_keys:
        got = stats["contended_per_key"].get(key, 0)
        if got < req.min_contended:
            need(f"contended holding intervals on {key}", got, req.min_contended)
    during = stats["reads_during_faults"]
    if during < req.min_reads_during_faults:
        need("reads answered during faults", during, req.min_reads_during_faults)
    missing = sorted(set(req.kinds) - set(stats["fault_kinds_executed"]))
    if missing:
        need("fault kinds executed", stats["fault_kinds_executed"], sorted(req.kinds))
    if stats["heals"] < req.min_heals:
        need("heals", stats["heals"], req.min_heals)
    if stats["heals_measured"] < max(req.min_heals, stats["heals"]):
        need("heals with recovery measured", stats["heals_measured"], stats["heals"])
    if stats["pause_client_writes_refused"] < req.min_pause_client_refused:
        need(
            "refused late writes of the paused client",
            stats["pause_client_writes_refused"],
            req.min_pause_client_refused,
        )
    return {"valid": not short, "violations": short, "stats": dict(stats), "required": req.__dict__}


# ------------------------------------------------------------------ everything


def check(
    events: list[Event],
    params: Params | None = None,
    volume: VolumeRequirements | None = None,
) -> dict[str, Any]:
    """Every checker. The verdict is False if any is False, else ``"unknown"`` if any
    is unknown (the ``history`` checker is unknown on a malformed history), else
    True. With ``volume``, a run that fell short of it is ``"unknown"`` too (it proved
    nothing); its stats are in ``volume`` either way."""
    params = params or Params.from_meta(events)
    every_op = pair_ops(events)
    # The lease checkers judge lease operations; queue operations (issue 12) go to
    # queue_checker, and count as progress for liveness.
    # The cancelling clients' waits (issue 37) go to cancel_checker, on keys of their own.
    # The set-taking agents (issue 40) go to many_checker, on keys of their own.
    ops = [op for op in every_op if op.f not in QUEUE_FS and op.f not in CANCEL_FS | MANY_FS]
    shared = shared_keys(ops)
    results = {
        "history": check_history(events, every_op),
        "mutual_exclusion": check_mutual_exclusion(ops, params, shared),
        "fencing": check_fencing(ops, events, params, shared),
        "no_lost_grant": check_no_lost_grant(ops, params, shared),
        "linearizable": check_linearizable(ops, params, shared),
        "liveness": check_liveness(every_op, events, params),
        "replicas": check_replicas(events),
        "rejoin": check_rejoin(events),
        "membership": check_membership(events),
        # A secure run (meta ``secure``) proves auth was on by its probes (secure.py).
        "security": check_security(events),
    }
    if has_queues(events, every_op):
        results.update(check_queues(events, every_op, params))
    if has_watches(events):
        # What a watcher was delivered, against itself and the acknowledged writes
        # (watch_checker.py, issue 37).
        results["watch"] = check_watch(events, every_op)
    if has_cancels(events):
        # No grant to a waiter whose client withdrew (cancel_checker.py, issue 37).
        results["withdrawn"] = check_withdrawn(events)
    if has_many(events):
        # Sets all-or-nothing, exclusion and tokens across sets and singles, no
        # deadlock left standing (many_checker.py, issue 40).
        results["many"] = check_many(events)
    verdicts = [r["valid"] for r in results.values()]
    valid: bool | str = True
    if any(v is False for v in verdicts):
        valid = False
    elif any(v == "unknown" for v in verdicts):
        valid = "unknown"
    stats = volume_stats(events, ops, params, results["liveness"])
    volume_result: dict[str, Any] = {"valid": None, "violations": [], "stats": stats}
    if volume is not None:
        volume_result = check_volume(stats, volume)
        if not volume_result["valid"] and valid is True:
            valid = "unknown"
    counts: dict[str, int] = defaultdict(int)
    for op in every_op:
        counts[f"{op.f}:{op.type}"] += 1
    return {
        "valid": valid,
        "checkers": results,
        "volume": volume_result,
        "params": params.__dict__,
        "shared_keys": shared,
        "ops": dict(sorted(counts.items())),
    }
