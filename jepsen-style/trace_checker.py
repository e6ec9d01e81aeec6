"""Trace validation: each node's trace of a chaos run against the SPIN model's rules.

The nodes of a chaos run are test builds with the hook ``trace`` (raftlease/testing/
trace.py): each appends its log clock's stamps and its lease-read decisions to
``<data_dir>/trace.jsonl``. This checker replays those events against the transition
rules of model/lease.pml, so that a divergence between the code and the model fails
the run (issue 43). Rules, each per node and per process (a ``start`` event begins a
new one: the log clock and the terms start afresh):

* ``terms_monotone``: the Raft term of successive events never decreases (stamps and
  the view a lease read writes after its decision).
* ``stamps_monotone``: within one term the log clock's stamps never decrease (the
  model's ``alead`` only grows while anchored; re-anchoring moves it forward).
* ``stamp_not_behind_applied``: a stamp is never below the applied log time it was
  given (the model anchors at the applied log time, ``stamp``).
* ``stamp_rate``: within one term a stamp is at most the previous one plus the node
  clock's time between them (from just before the previous to just after this one),
  or the applied log time it was given when that is more (a re-anchor): log time runs
  no faster than the stamping node's clock (the model's ``RATE`` is 1).
* ``lease_read_allowed``: a read answered from local state (or a keep-alive from
  memory) satisfies ``read_allowed``: the node leads the term in which its leader lease
  was earned, the lease has not ended on its clock, no drift alarm is raised, and it
  has applied an entry of its own term (the read barrier). Checked on the snapshots
  taken just before and just after the decision; only both failing is a violation
  (the guard may change between a snapshot and the decision, never twice).
* ``one_lease_per_term``: no two nodes hold a leader lease in the same term.

Over the lease changes of applied entries (``lease`` events: grants, renewals, ends),
merged from every node and every process into one log by index (a restarted node
applies its journal again: the same changes at the same index):

* ``replicas_agree``: every node (and every process of one node) that applied the
  entry at a log index made the same changes at the same log time and revision.
* ``tokens_monotone``: in log order, the fencing tokens granted on a key strictly
  increase (and so never repeat).
* ``grant_when_free``: a grant happens only when the key has room at the entry's log
  time: the units of the leases live then (not ended, expiry after that time) plus
  the grant's fit the key's capacity (1 for a lock).
* ``expiry_not_early``: a lease expires no earlier than its expiry in log time.

The model's other properties (mutual exclusion, fencing, linearizable reads, one
completion) are checked on the history by checker.py; this one checks the steps that
no client sees.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

TRACE_FILE = "trace.jsonl"
#: Slack for int() truncation of the projection and clock reads (ms).
STAMP_SLACK_MS = 2
#: Violations kept in the result (all are counted).
MAX_REPORTED = 50


def _lease_ok(view: dict[str, Any] | None) -> str | None:
    """Why the model's read_allowed is false on ``view`` (None: it holds)."""
    if view is None:
        return "no replica"
    if view.get("size") == 1:
        return None  # a single node needs no lease (no one else can lead)
    if view["leader_term"] != view["term"]:
        return f"leader lease of term {view['leader_term']} in term {view['term']}"
    if view["lease_until"] is None or view["mono"] >= view["lease_until"]:
        return f"leader lease ended ({view['lease_until']} <= {view['mono']:.3f})"
    if view["alarm"]:
        return "drift alarm raised"
    if view["applied_term"] != view["term"]:
        return f"read barrier: applied term {view['applied_term']} < term {view['term']}"
    return None


def check_events(traces: dict[str, Iterable[dict[str, Any]]]) -> dict[str, Any]:
    """Validate each node's events (in file order). Returns ``valid`` (True, False, or
    "unknown" when there is no event at all or a trace was truncated), the violations
    (the first ``MAX_REPORTED``), their count, and ``stats``: events per kind and
    violations per rule."""
    traces = {node: list(events) for node, events in traces.items()}  # read twice
    violations: list[dict[str, Any]] = []
    counts: dict[str, int] = defaultdict(int)
    lease_terms: dict[int, set[str]] = defaultdict(set)
    truncated: list[str] = []

    def bad(rule: str, node: str, detail: str, event: dict[str, Any]) -> None:
        counts[f"violations:{rule}"] += 1
        violations.append({"rule": rule, "node": node, "detail": detail, "event": event})

    for node, events in traces.items():
        term = -1
        last: dict[str, Any] | None = None  # the previous stamp of this process
        for event in events:
            ev = event.get("ev")
            counts[str(ev)] += 1
            if ev == "start":
                term, last = -1, None
                continue
            if ev == "truncated":
                truncated.append(node)
                break
            if ev == "stamp":
                t = int(event["term"])
                if t < term:
                    bad("terms_monotone", node, f"term {term} -> {t}", event)
                term = max(term, t)
                if event["stamp"] < event["applied"]:
                    bad("stamp_not_behind_applied", node, "stamp below applied log time", event)
                if last is not None and last["term"] == t:
                    if event["stamp"] < last["stamp"]:
                        bad("stamps_monotone", node, f"{last['stamp']} -> {event['stamp']}", event)
                    allowed = last["stamp"] + (event["m1"] - last["m0"]) * 1000 + STAMP_SLACK_MS
                    if event["stamp"] > max(allowed, event["applied"]):
                        bad(
                            "stamp_rate",
                            node,
                            f"log time moved {event['stamp'] - last['stamp']} ms in "
                            f"{(event['m1'] - last['m0']) * 1000:.0f} ms of the node's clock",
                            event,
                        )
                last = event
            elif ev == "lease_read":
                before, after = event.get("before"), event.get("after")
                # The after view is written in order with the stamps (the before view
                # may predate a stamp of a new term written in between).
                if after is not None:
                    if after["term"] < term:
                        bad("terms_monotone", node, f"term {term} -> {after['term']}", event)
                    term = max(term, int(after["term"]))
                why_before, why_after = _lease_ok(before), _lease_ok(after)
                if why_before is not None and why_after is not None:
                    bad("lease_read_allowed", node, f"{why_before}; after: {why_after}", event)
                held = before if why_before is None else after
                if held is not None and held.get("size") != 1:
                    lease_terms[int(held["leader_term"])].add(node)
    for t, nodes in sorted(lease_terms.items()):
        if len(nodes) > 1:
            bad("one_lease_per_term", ",".join(sorted(nodes)), f"term {t}", {"term": t})
    _check_leases(traces, bad, counts)
    total = len(violations)
    valid: bool | str = total == 0
    if valid and (truncated or not any(counts.get(k) for k in ("stamp", "lease_read"))):
        valid = "unknown"
    return {
        "valid": valid,
        "violation_count": total,
        "violations": violations[:MAX_REPORTED],
        "stats": dict(counts),
        "truncated": truncated,
        "nodes": sorted(traces),
    }


Bad = Callable[[str, str, str, dict[str, Any]], None]


def _check_leases(
    traces: dict[str, Iterable[dict[str, Any]]], bad: Bad, counts: dict[str, int]
) -> None:
    """The rules over applied lease changes (``lease`` events; ``traces`` must be
    re-iterable, as lists are)."""
    log: dict[int, tuple[str, dict[str, Any]]] = {}
    disagree: set[int] = set()
    for node, events in traces.items():
        for event in events:
            if event.get("ev") == "truncated":
                break
            if event.get("ev") != "lease":
                continue
            index = int(event["i"])
            seen = log.get(index)
            if seen is None:
                log[index] = (node, event)
                continue
            other = seen[1]
            same = (other["at"], other["rev"], other["ch"]) == (
                event["at"],
                event["rev"],
                event["ch"],
            )
            if not same and index not in disagree:
                disagree.add(index)
                bad(
                    "replicas_agree",
                    f"{seen[0]},{node}",
                    f"log index {index}: {other['ch']} at {other['at']} (rev {other['rev']}) "
                    f"vs {event['ch']} at {event['at']} (rev {event['rev']})",
                    event,
                )
    last_token: dict[str, int] = {}
    # key -> lease hash -> [units, until]
    live: dict[str, dict[str, list[Any]]] = defaultdict(dict)
    for index in sorted(log):
        node, event = log[index]
        at = event["at"]
        for kind, key, lease, token, owner, units, capacity, until in event["ch"]:
            counts[f"lease:{kind}"] += 1
            holders = live[key]
            if kind == "grant":
                if key in last_token and token <= last_token[key]:
                    bad(
                        "tokens_monotone",
                        node,
                        f"key {key!r}: token {token} after {last_token[key]} (index {index})",
                        event,
                    )
                last_token[key] = max(token, last_token.get(key, token))
                used = sum(u for u, end in holders.values() if end is None or end > at)
                # A lease granted and ended in one entry (until None) took no room
                # after it, and its recorded capacity may be the freed key's default.
                if until is not None and used + units > capacity:
                    bad(
                        "grant_when_free",
                        node,
                        f"key {key!r}: {units} unit(s) to {owner!r} at log time {at} "
                        f"(index {index}) while {used} of {capacity} are held",
                        event,
                    )
                holders[lease] = [units, until]
            elif kind == "renew":
                if lease in holders:
                    holders[lease][1] = until
            else:
                holders.pop(lease, None)
                if kind == "expire" and until is not None and at < until:
                    bad(
                        "expiry_not_early",
                        node,
                        f"key {key!r}: lease expired at log time {at}, its expiry is "
                        f"{until} (index {index})",
                        event,
                    )
            if not holders:
                live.pop(key, None)


def read_trace(path: Path) -> list[dict[str, Any]]:
    """A trace file's events; a torn last line (a node killed mid-write) is dropped."""
    out: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def check_dir(data_dir: Path, node_ids: Iterable[str]) -> dict[str, Any]:
    """Validate ``<data_dir>/<node>/trace.jsonl`` of every node (a node without a trace
    is listed under ``missing``; all missing: unknown)."""
    traces: dict[str, Iterable[dict[str, Any]]] = {}
    missing = []
    for node in node_ids:
        path = Path(data_dir) / node / TRACE_FILE
        if path.exists():
            traces[node] = read_trace(path)
        else:
            missing.append(node)
    result = check_events(traces)
    result["missing"] = missing
    if missing and result["valid"] is True:
        result["valid"] = "unknown"
    return result
