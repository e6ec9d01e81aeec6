"""Linearizability of one key's lease register: a Wing–Gong / Lowe search with
memoization (the algorithm Porcupine implements), in Python.

The model (one key): ``holder`` (a token or None), ``E`` (the earliest real time the
holder's lease may expire) and ``last`` (the highest token granted so far). Operations:

* ``grant(T)``: needs no holder and ``T > last``; the holder becomes ``T``.
* ``renew(T)``: needs holder ``T``; moves ``E``.
* ``release(T)``: needs holder ``T``; no holder after.
* ``observe(T)`` / ``observe(None)``: a read, or an error that names the holder
  (``LEASE_HELD``, ``NOT_OWNER``) or says there is none (``LEASE_NOT_FOUND``): needs
  exactly that holder (and owner).
* expiry (uncertain): the holder may vanish at any time at or after ``E``, and need
  not vanish then (a lease may outlive its TTL, e.g. across a leader change).

Every operation takes effect at one instant within ``[inv, ret]``, instants are
non-decreasing along the linearization, and an op that returned before another was
invoked comes first. Operations whose outcome is unknown (``info``) are *optional*:
they may take effect or not. The search state carries the earliest time ``lb`` at which
the next operation may take effect, so expiry can be placed only where time allows.

To keep the search small the history is cut at quiescent points (no operation in
flight); each segment is searched exhaustively from the set of states the previous
one could end in. ``budget`` caps the states explored: when it runs out the answer is
``"unknown"``, never a pass.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

State = tuple[int | None, float, int]  # (holder token, earliest expiry, last token)
INITIAL: State = (None, 0.0, 0)
NEG_INF = -math.inf


@dataclass
class LOp:
    """One operation of the model. ``token`` is the lease's token (grant/renew/
    release) or the observed one (observe; None = no holder). ``expiry`` is the
    earliest expiry a grant or renew sets. ``group``: variants of one unknown
    operation (an ``info`` acquire that may explain several tokens) share a group;
    taking one consumes them all."""

    kind: str
    inv: float
    ret: float
    token: int | None
    owner: str | None = None
    expiry: float = 0.0
    optional: bool = False
    group: str = ""
    src: str = ""
    note: str = ""

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "op": self.src,
            "inv": round(self.inv, 4),
            "ret": None if math.isinf(self.ret) else round(self.ret, 4),
            "token": self.token,
        }
        if self.owner is not None:
            out["owner"] = self.owner
        if self.optional:
            out["optional"] = True
        if self.note:
            out["note"] = self.note
        return out


@dataclass
class Outcome:
    valid: bool | str  # True, False or "unknown"
    explored: int = 0
    segments: int = 0
    seconds: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)


def step(op: LOp, state: State, owners: dict[int, str]) -> State | None:
    """The model's transition for ``op`` from ``state`` (None: not allowed)."""
    holder, _, last = state
    kind = op.kind
    if kind == "grant":
        assert op.token is not None
        if holder is None and op.token > last:
            return (op.token, op.expiry, op.token)
        return None
    if kind == "renew":
        return (holder, op.expiry, last) if holder is not None and holder == op.token else None
    if kind == "release":
        return (None, 0.0, last) if holder is not None and holder == op.token else None
    if kind == "observe":
        if op.token is None:
            return state if holder is None else None
        if holder == op.token and (op.owner is None or owners.get(op.token) == op.owner):
            return state
        return None
    raise ValueError(f"unknown model op {kind!r}")


def segments(ops: list[LOp]) -> list[list[LOp]]:
    """Cut ``ops`` (any order) at quiescent points: between two consecutive ops by
    invocation when every op before has returned before the next one is invoked."""
    ordered = sorted(ops, key=lambda o: (o.inv, o.ret))
    out: list[list[LOp]] = []
    current: list[LOp] = []
    horizon = NEG_INF
    for op in ordered:
        if current and horizon < op.inv:
            out.append(current)
            current = []
        current.append(op)
        horizon = max(horizon, op.ret)
    if current:
        out.append(current)
    return out


def check_ops(
    ops: list[LOp],
    owners: dict[int, str],
    budget: int = 500_000,
    segment_budget: int = 200_000,
    time_limit: float = 60.0,
) -> Outcome:
    """Is there a linearization of ``ops`` (one key) under the lease model?"""
    started = time.monotonic()
    starts: set[State] = {INITIAL}
    explored = 0
    parts = segments(ops)
    for number, part in enumerate(parts):
        left = min(segment_budget, budget - explored)
        remaining_time = time_limit - (time.monotonic() - started)
        ends, used, report = _search(part, starts, owners, left, remaining_time)
        explored += used
        if ends is None:
            return Outcome(
                "unknown",
                explored,
                number + 1,
                time.monotonic() - started,
                {
                    "reason": report.get("reason", "search budget exhausted"),
                    "segment": number,
                    "segment_ops": len(part),
                    "at": round(part[0].inv, 4),
                },
            )
        if not ends:
            report.update({"segment": number, "segment_ops": len(part)})
            return Outcome(False, explored, number + 1, time.monotonic() - started, report)
        starts = ends
    return Outcome(True, explored, len(parts), time.monotonic() - started)


def _search(
    ops: list[LOp], starts: set[State], owners: dict[int, str], budget: int, time_limit: float
) -> tuple[set[State] | None, int, dict[str, Any]]:
    """Exhaustive search of one segment. Returns (end states, states explored, report);
    end states None means the budget ran out (unknown); empty means no linearization."""
    n = len(ops)
    ops = sorted(ops, key=lambda o: o.inv)
    required = 0
    for i, op in enumerate(ops):
        if not op.optional:
            required |= 1 << i
    groups: dict[str, int] = {}
    for i, op in enumerate(ops):
        if op.group:
            groups[op.group] = groups.get(op.group, 0) | (1 << i)
    take = [groups[op.group] if op.group else 1 << i for i, op in enumerate(ops)]
    req_by_ret = sorted((i for i in range(n) if not ops[i].optional), key=lambda i: ops[i].ret)
    optional_idx = [i for i in range(n) if ops[i].optional]

    def dead(mask: int, lb: float) -> int:
        extra = 0
        for i in optional_idx:
            if ops[i].ret < lb:
                extra |= 1 << i
        return mask | extra

    deadline = time.monotonic() + max(0.1, time_limit)
    ends: set[State] = set()
    visited: set[tuple[int, State, float]] = set()
    stack: list[tuple[int, State, float]] = [(0, s, NEG_INF) for s in starts]
    explored = 0
    deepest = (-1, 0, INITIAL, NEG_INF)
    while stack:
        mask, state, lb = stack.pop()
        key = (dead(mask, lb), state, lb)
        if key in visited:
            continue
        visited.add(key)
        explored += 1
        if explored > budget or (explored % 4096 == 0 and time.monotonic() > deadline):
            return None, explored, {"reason": "search budget exhausted"}
        done = mask & required
        if done == required:
            ends.add(state)
        depth = done.bit_count()
        if depth > deepest[0]:
            deepest = (depth, mask, state, lb)
        # The two earliest deadlines among required ops not yet taken.
        m1 = m2 = math.inf
        arg1 = -1
        for i in req_by_ret:
            if not mask >> i & 1:
                if arg1 < 0:
                    m1, arg1 = ops[i].ret, i
                else:
                    m2 = ops[i].ret
                    break
        bound = m2 if arg1 >= 0 else math.inf
        holder, expiry, last = state
        for i in range(n):
            op = ops[i]
            if op.inv > bound:
                break
            if mask >> i & 1:
                continue
            limit = min(op.ret, m2 if i == arg1 else m1)
            new_mask = mask | take[i]
            at = max(lb, op.inv)
            if at <= limit:
                nxt = step(op, state, owners)
                if nxt is not None:
                    stack.append((new_mask, nxt, at))
            if holder is not None:
                at = max(lb, op.inv, expiry)
                if at <= limit:
                    nxt = step(op, (None, 0.0, last), owners)
                    if nxt is not None:
                        stack.append((new_mask, nxt, at))
    if ends:
        return ends, explored, {}
    _, mask, state, lb = deepest
    pending = [ops[i] for i in req_by_ret if not mask >> i & 1]
    return (
        ends,
        explored,
        {
            "reason": "no linearization",
            "stuck_state": {
                "holder": state[0],
                "earliest_expiry": state[1],
                "last_token": state[2],
            },
            "start_states": [
                {"holder": s[0], "earliest_expiry": round(s[1], 4), "last_token": s[2]}
                for s in sorted(starts, key=repr)
            ][:5],
            "linearized": mask.bit_count(),
            "stuck_ops": [o.describe() for o in pending[:6]],
            "segment_window": [round(ops[0].inv, 4), round(max(o.ret for o in ops), 4)],
        },
    )
