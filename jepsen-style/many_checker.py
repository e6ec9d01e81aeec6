"""The checker of the set-taking agents (issue 40, ``many_workload.py``).

Every attempt has an owner of its own, so a holder seen in a read is one attempt.
``check_many`` judges:

* **partial_grant**: a set granted (``ok``) with tokens for other keys than it asked;
* **partial_visibility**: a read shows a set's owner holding a non-empty part of its set
  but not all of it (a set is granted, released and expires in one entry each, so a
  consistent read shows all of it or none);
* **partial_watch**: the watcher (``watch_workload.py``, when it runs) was delivered
  grants to a set's owner for a non-empty part of its set but not all of it, where every
  revision around them was delivered (a stream's gap is not judged);
* **mutual_exclusion**: two grants of one key (sets and singles alike) whose certain
  holding intervals overlap (from the grant's ``ok`` until its release is invoked or
  ``ttl * (1 - 2 rho)`` after its acquire was invoked), or a read showing two holders of a
  key;
* **tokens**: per key, a grant acknowledged before another was invoked has the smaller
  token, and no token is given to two grants;
* **stuck**: a waiting acquire that ended (or had not ended at the history's end) later
  than ``wait + bound`` after it was invoked;
* **deadlock_named**: a ``DEADLOCK`` refusal whose cycle is not a closed cycle of at least
  two edges, does not name the refused owner, or names an owner that had no acquire of
  the key it is said to wait for in flight;
* **undetected_deadlock**: two waits, each by an owner certainly holding the key the other
  waits for, both still waiting together for ``cycle_window`` seconds or more outside the
  fault windows (a fault's start to its heal plus ``settle``): the cycle was not refused;
* **yields** (cooperative preemption, ``many-yield``): after a request answered at ``t``
  asking the holder of token ``T`` on a key to yield within ``d`` seconds, (a) nothing
  is accepted with ``T`` (a renewal, a release, a read showing it) that was invoked after
  a grant of the key with a larger token was acknowledged; (b) nothing shows the old
  lease alive (the same operations) when invoked later than ``t + d + yield_bound``,
  unless a fault window overlaps that stretch (then ``unresolved``, not a failure: log
  time may lag wall time across a failover); (c) the waiter that asked ends its wait:
  granted, or refused definitely; refused while its wait reached past ``t + d +
  yield_bound`` with no fault window over it, or never ended, is a failure. While a
  request is in flight the holder's certain holding ends at the request's invocation
  (the cluster may end the lease from then on).

Malformed events, or a history with no set granted or no read, make the verdict
``unknown``, never a pass.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

Event = dict[str, Any]

#: The operations of the set-taking agents (judged here, not by the lease checkers).
MANY_FS = frozenset({"many-acquire", "many-release", "many-read", "many-renew", "many-yield"})


@dataclass(frozen=True)
class ManyParams:
    rho: float = 0.01
    #: Seconds beyond its wait a waiting acquire may take to end (faults, withdrawal).
    bound: float = 10.0
    #: How long two waits of a cycle may be seen waiting together before it is a miss.
    cycle_window: float = 1.0
    #: Seconds after a heal still counted as the fault's.
    settle: float = 3.0
    #: Seconds past a yield request's deadline (wall time from its answer) the old lease
    #: may still be seen alive, and the waiter may still be waiting.
    yield_bound: float = 2.0


def has_many(events: Iterable[Event]) -> bool:
    return any(e.get("f") in MANY_FS and e.get("type") == "invoke" for e in events)


@dataclass
class _Op:
    inv: Event
    end: Event | None

    @property
    def value(self) -> dict[str, Any]:
        v = self.inv.get("value")
        return v if isinstance(v, dict) else {}

    @property
    def t0(self) -> float:
        return float(self.inv["t"])

    @property
    def t1(self) -> float:
        return float(self.end["t"]) if self.end is not None else float("inf")


def _ops(events: Iterable[Event], bad: list[Event]) -> list[_Op]:
    invokes: dict[str, Event] = {}
    done: dict[str, Event] = {}
    for e in events:
        if e.get("f") not in MANY_FS:
            continue
        op = e.get("op")
        if not isinstance(op, str) or not isinstance(e.get("t"), int | float):
            bad.append(e)
        elif e.get("type") == "invoke":
            value = e.get("value")
            if (
                not isinstance(value, dict)
                or (
                    e["f"] == "many-acquire"
                    and not (
                        isinstance(value.get("owner"), str)
                        and isinstance(value.get("keys"), list)
                        and value["keys"]
                        and isinstance(value.get("wait"), int | float)
                        and isinstance(value.get("ttl"), int | float)
                    )
                )
                or (
                    e["f"] == "many-renew"
                    and not (
                        isinstance(value.get("owner"), str)
                        and isinstance(value.get("key"), str)
                        and isinstance(value.get("token"), int)
                    )
                )
                or (
                    e["f"] == "many-yield"
                    and not (
                        isinstance(value.get("owner"), str)
                        and isinstance(value.get("key"), str)
                        and isinstance(value.get("holder"), str)
                        and isinstance(value.get("token"), int)
                        and isinstance(value.get("deadline"), int | float)
                    )
                )
            ):
                bad.append(e)
            else:
                invokes[op] = e
        elif e.get("type") in ("ok", "fail", "info"):
            done[op] = e
        else:
            bad.append(e)
    for op, e in done.items():
        if op not in invokes:
            bad.append(e)
    return [_Op(inv, done.get(op)) for op, inv in invokes.items()]


def _fault_windows(events: list[Event], settle: float, end: float) -> list[tuple[float, float]]:
    starts: dict[Any, float] = {}
    windows: list[tuple[float, float]] = []
    for e in events:
        if e.get("type") != "nemesis":
            continue
        if e.get("f") == "start":
            starts[e.get("id")] = float(e["t"])
        elif e.get("f") == "stop" and e.get("id") in starts:
            windows.append((starts.pop(e.get("id")), float(e["t"]) + settle))
    windows += [(t, end) for t in starts.values()]
    return windows


def _clear(lo: float, hi: float, windows: list[tuple[float, float]]) -> float:
    """The longest stretch of [lo, hi] outside every window."""
    cuts = sorted((max(a, lo), min(b, hi)) for a, b in windows if b > lo and a < hi)
    best, at = 0.0, lo
    for a, b in cuts:
        best = max(best, a - at)
        at = max(at, b)
    return max(best, hi - at)


def check_many(events: list[Event], params: ManyParams | None = None) -> dict[str, Any]:
    """See the module docstring. ``{"valid", "violations", "violation_count",
    "unknown", "stats"}`` as every checker."""
    p = params or ManyParams()
    for e in events:
        if e.get("type") == "meta" and isinstance(e.get("rho"), int | float):
            p = replace(p, rho=float(e["rho"]))
    bad: list[Event] = []
    ops = _ops(events, bad)
    last = max((float(e["t"]) for e in events if isinstance(e.get("t"), int | float)), default=0)
    violations: list[dict[str, Any]] = []

    def violation(rule: str, message: str, **fields: Any) -> None:
        violations.append({"rule": rule, "message": message, **fields})

    acquires = [op for op in ops if op.inv["f"] == "many-acquire"]
    releases: dict[str, float] = {}
    for op in ops:
        if op.inv["f"] == "many-release" and isinstance(op.value.get("owner"), str):
            releases.setdefault(op.value["owner"], op.t0)
    for op in ops:
        if op.inv["f"] == "many-yield":
            # The cluster may end the asked holder's lease from the request on.
            holder = op.value["holder"]
            releases[holder] = min(releases.get(holder, float("inf")), op.t0)
    sets: dict[str, list[str]] = {}
    # key -> (ok time, invoke time, certain end, token, owner) of every grant.
    grants: dict[str, list[tuple[float, float, float, int, str]]] = defaultdict(list)
    set_grants = deadlocks = 0
    for op in acquires:
        v, end = op.value, op.end
        owner, keys = v["owner"], [str(k) for k in v["keys"]]
        if v.get("set"):
            sets[owner] = keys
        if end is None:
            if last > op.t0 + v["wait"] + p.bound:
                violation("stuck", f"{owner}'s acquire of {keys} never ended", owner=owner)
            continue
        if v["wait"] > 0 and op.t1 - op.t0 > v["wait"] + p.bound:
            violation(
                "stuck",
                f"{owner}'s acquire of {keys} with wait {v['wait']} took {op.t1 - op.t0:.1f} s",
                owner=owner,
            )
        if end["type"] == "ok":
            tokens = (end.get("value") or {}).get("tokens")
            if not isinstance(tokens, dict):
                bad.append(end)
                continue
            if sorted(tokens) != sorted(keys):
                violation(
                    "partial_grant",
                    f"{owner} asked for {sorted(keys)} and was granted {sorted(tokens)}",
                    owner=owner,
                )
            set_grants += bool(v.get("set"))
            until = min(releases.get(owner, float("inf")), op.t0 + v["ttl"] * (1 - 2 * p.rho))
            for key, token in tokens.items():
                grants[key].append((op.t1, op.t0, until, int(token), owner))
        elif end.get("error") == "DEADLOCK":
            deadlocks += 1
            _judge_cycle(op, acquires, violation)
    for key, held in grants.items():
        held.sort()
        for i, (ok_a, _inv_a, until_a, tok_a, own_a) in enumerate(held):
            for ok_b, inv_b, until_b, tok_b, own_b in held[i + 1 :]:
                if ok_b < until_a and ok_a < until_b:
                    violation(
                        "mutual_exclusion",
                        f"{own_a} and {own_b} both held {key} at {ok_b:.3f}",
                        key=key,
                    )
                if tok_a == tok_b:
                    violation("tokens", f"{own_a} and {own_b} both got token {tok_a} on {key}")
                elif ok_a < inv_b and tok_b < tok_a:
                    violation(
                        "tokens",
                        f"{key}: {own_b}'s token {tok_b} after {own_a}'s {tok_a}",
                        key=key,
                    )
    reads = 0
    for op in ops:
        if op.inv["f"] != "many-read" or op.end is None or op.end["type"] != "ok":
            continue
        holders = (op.end.get("value") or {}).get("holders")
        if not isinstance(holders, list) or not all(isinstance(h, dict) for h in holders):
            bad.append(op.end)
            continue
        reads += 1
        seen: dict[str, set[str]] = defaultdict(set)
        per_key: dict[str, list[str]] = defaultdict(list)
        for h in holders:
            seen[str(h.get("owner"))].add(str(h.get("key")))
            per_key[str(h.get("key"))].append(str(h.get("owner")))
        for key, owners in per_key.items():
            if len(owners) > 1:
                violation("mutual_exclusion", f"a read shows {owners} holding {key}", key=key)
        for owner, keys_seen in seen.items():
            want = set(sets.get(owner, ()))
            if want and keys_seen & want and not want <= keys_seen:
                violation(
                    "partial_visibility",
                    f"a read at {op.t0:.3f} shows {owner} holding {sorted(keys_seen)} of its "
                    f"set {sorted(want)}",
                    owner=owner,
                    read=op.inv["op"],
                )
    watched = _watch_partial(events, sets, violation)
    yield_stats = _yields(events, ops, acquires, p, last, violation)
    missed = _undetected(events, acquires, releases, p, last)
    violations += missed
    stats = {
        "set_grants": set_grants,
        "acquires": len(acquires),
        "reads": reads,
        "deadlocks_refused": deadlocks,
        "sets_watched": watched,
        **yield_stats,
        # Violations per rule (the list below keeps the first 50 only).
        "by_rule": dict(sorted(Counter(v["rule"] for v in violations).items())),
    }
    valid: bool | str = True
    if violations:
        valid = False
    elif bad or not set_grants or not reads:
        valid = "unknown"
    return {
        "valid": valid,
        "violations": violations[:50],
        "violation_count": len(violations),
        "unknown": bad[:20],
        "stats": stats,
    }


def _watch_partial(events: list[Event], sets: dict[str, list[str]], violation: Any) -> int:
    """Judge what the watcher was delivered (module docstring: partial_watch); returns
    how many sets were judged."""
    revisions: set[int] = set()
    granted: dict[str, dict[str, int]] = defaultdict(dict)
    for e in events:
        if e.get("type") != "watch" or e.get("f") != "events":
            continue
        for w in e.get("events") or ():
            if not isinstance(w, dict) or not isinstance(w.get("revision"), int):
                continue
            revisions.add(w["revision"])
            if w.get("type") == "grant" and w.get("owner") in sets:
                granted[str(w["owner"])][str(w.get("key"))] = w["revision"]
    judged = 0
    for owner, keys in granted.items():
        want = sets[owner]
        lo, hi = min(keys.values()) - len(want), max(keys.values()) + len(want)
        if not all(r in revisions for r in range(max(lo, 1), hi + 1)):
            continue
        judged += 1
        if set(keys) != set(want):
            violation(
                "partial_watch",
                f"the watcher saw {owner} granted {sorted(keys)} of its set {sorted(want)}",
                owner=owner,
            )
    return judged


def _judge_cycle(op: _Op, acquires: list[_Op], violation: Any) -> None:
    """A DEADLOCK refusal names a real cycle (module docstring)."""
    assert op.end is not None
    owner = op.value["owner"]
    cycle = (op.end.get("value") or {}).get("cycle")
    edges = cycle if isinstance(cycle, list) else []
    if len(edges) < 2 or not all(isinstance(e, dict) for e in edges):
        violation("deadlock_named", f"{owner} refused DEADLOCK without a cycle", owner=owner)
        return
    nxt = [e.get("held_by", e.get("queued_behind")) for e in edges]
    closed = all(nxt[i] == edges[(i + 1) % len(edges)].get("owner") for i in range(len(edges)))
    if not closed or owner not in {e.get("owner") for e in edges}:
        violation("deadlock_named", f"{owner}'s DEADLOCK names no closed cycle through it: {edges}")
        return
    for edge in edges:
        waiting = any(
            other.value["owner"] == edge.get("owner")
            and edge.get("waits_for") in other.value["keys"]
            and other.t0 <= op.t1
            and other.t1 >= op.t0
            for other in acquires
        )
        if not waiting:
            violation(
                "deadlock_named",
                f"{owner}'s DEADLOCK says {edge.get('owner')} waited for "
                f"{edge.get('waits_for')}, which no acquire in flight did",
                owner=owner,
            )


def _undetected(
    events: list[Event],
    acquires: list[_Op],
    releases: dict[str, float],
    p: ManyParams,
    last: float,
) -> list[dict[str, Any]]:
    """Cycles of two waits left standing (module docstring: undetected_deadlock)."""
    windows = _fault_windows(events, p.settle, last)
    # owner -> (key, from, until) of every certain holding by a granted acquire.
    holds: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
    waits: list[_Op] = []
    for op in acquires:
        v = op.value
        if op.end is not None and op.end["type"] == "ok":
            until = min(releases.get(v["owner"], float("inf")), op.t0 + v["ttl"] * (1 - 2 * p.rho))
            for key in (op.end.get("value") or {}).get("tokens") or {}:
                holds[v["owner"]].append((str(key), op.t1, until))
        if v["wait"] > 0 and len(v["keys"]) == 1:
            waits.append(op)
    by_owner: dict[str, list[_Op]] = defaultdict(list)
    for op in waits:
        by_owner[op.value["owner"]].append(op)

    def held(owner: str, key: str, lo: float) -> float:
        """Until when ``owner`` certainly held ``key`` from ``lo`` on (``lo`` if not)."""
        return max((u for k, a, u in holds.get(owner, ()) if k == key and a <= lo), default=lo)

    out: list[dict[str, Any]] = []
    for x in waits:
        kx, ox = x.value["keys"][0], x.value["owner"]
        for hx, ax, _ in holds.get(ox, ()):
            for y in waits:
                oy = y.value["owner"]
                if oy <= ox or y.value["keys"][0] != hx or kx not in [h[0] for h in holds[oy]]:
                    continue
                lo = max(x.t0, y.t0, ax)
                hi = min(x.t1, y.t1, last, held(ox, hx, lo), held(oy, kx, lo))
                if hi > lo and _clear(lo, hi, windows) >= p.cycle_window:
                    out.append(
                        {
                            "rule": "undetected_deadlock",
                            "owners": [ox, oy],
                            "keys": [hx, kx],
                            "from": lo,
                            "seconds": round(hi - lo, 3),
                            "message": (
                                f"{ox} held {hx} and waited for {kx} while {oy} held {kx} and "
                                f"waited for {hx}, for {hi - lo:.1f} s without a DEADLOCK"
                            ),
                        }
                    )
    return out


def _yields(
    events: list[Event],
    ops: list[_Op],
    acquires: list[_Op],
    p: ManyParams,
    last: float,
    violation: Any,
) -> dict[str, int]:
    """Yield requests honoured (module docstring: yields); returns their counts."""
    windows = _fault_windows(events, p.settle, last)

    def faulty(lo: float, hi: float) -> bool:
        return any(a < hi and b > lo for a, b in windows)

    stats = {
        "yield_requests": 0,
        "yields_learnt": 0,
        "yields_released": 0,
        "yields_ended": 0,
        "yields_unresolved": 0,
    }
    for req in ops:
        if req.inv["f"] != "many-yield" or req.end is None or req.end["type"] == "fail":
            continue  # refused definitely: nobody was asked
        v = req.value
        key, token, holder, asker = v["key"], v["token"], v["holder"], v["owner"]
        asked = req.end["type"] == "ok"
        stats["yield_requests"] += asked
        # When a grant of the key with a larger token was first acknowledged.
        nxt = min(
            (
                op.t1
                for op in acquires
                if op.end is not None
                and op.end["type"] == "ok"
                and isinstance((op.end.get("value") or {}).get("tokens"), dict)
                and int(op.end["value"]["tokens"].get(key, -1)) > token
            ),
            default=float("inf"),
        )
        limit = req.t1 + float(v["deadline"]) + p.yield_bound if asked else float("inf")
        # Every operation that found the old lease alive: (what, invoked at).
        alive: list[tuple[str, float]] = []
        learnt = False
        for op in ops:
            f, ov, end = op.inv["f"], op.value, op.end
            if end is None or end["type"] != "ok":
                if f == "many-renew" and ov.get("owner") == holder and end is not None:
                    stats["yields_ended"] += end["type"] == "fail" and op.t0 >= req.t0
                continue
            if f == "many-renew" and ov.get("owner") == holder and ov.get("key") == key:
                if ov.get("token") == token:
                    alive.append(("a renewal", op.t0))
                    if (end.get("value") or {}).get("yield_deadline_ms") is not None:
                        learnt = True
            elif f == "many-release" and ov.get("owner") == holder and key in ov.get("keys", ()):
                alive.append(("a release", op.t0))
                stats["yields_released"] += op.t0 >= req.t0
            elif f == "many-read":
                for h in (end.get("value") or {}).get("holders") or ():
                    if isinstance(h, dict) and h.get("key") == key and h.get("token") == token:
                        alive.append(("a read", op.t0))
        stats["yields_learnt"] += learnt
        for what, at in alive:
            if at > nxt:
                violation(
                    "yields",
                    f"{what} of {key} with token {token} invoked at {at:.3f} was accepted "
                    f"after a larger token was granted at {nxt:.3f}",
                    key=key,
                    owner=holder,
                )
            elif at > limit:
                if faulty(limit - p.yield_bound, at):
                    stats["yields_unresolved"] += 1
                else:
                    violation(
                        "yields",
                        f"{what} at {at:.3f} found {holder}'s lease on {key} alive "
                        f"{at - limit + p.yield_bound:.1f} s past its yield deadline",
                        key=key,
                        owner=holder,
                    )
        if not asked:
            continue
        for op in acquires:
            if op.value["owner"] != asker or key not in op.value["keys"]:
                continue
            reach = op.t0 + float(op.value["wait"])
            if op.end is None:
                if last > max(limit, reach) + p.bound:
                    violation(
                        "yields", f"{asker} asked for {key} and never stopped waiting", key=key
                    )
                else:
                    stats["yields_unresolved"] += 1
            elif op.end["type"] == "info":
                stats["yields_unresolved"] += 1
            elif op.end["type"] == "fail" and reach > limit:
                if faulty(op.t0, op.t1):
                    stats["yields_unresolved"] += 1
                else:
                    violation(
                        "yields",
                        f"{asker} asked {holder} to yield {key} and was refused "
                        f"{op.end.get('error')} although its wait outlasted the deadline",
                        key=key,
                        owner=asker,
                    )
    return stats
