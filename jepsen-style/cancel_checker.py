"""The withdrawal checker over a chaos-suite history (issue 37): no grant to a waiter
whose client withdrew before the grant.

``cancel_workload.Canceller`` records waiting acquires (``wait-acquire``) that give
up, each under an owner used by no other acquire, with whether the cluster answered
its withdrawal (completion value ``withdrawn``), and reads of a key's holders and
queue (``cancel-read``). ``check_withdrawn``:

* **withdrawn**: a ``cancel-read`` invoked after the completion of a ``wait-acquire``
  that was not granted and whose withdrawal was answered (``withdrawn: True``) shows
  that acquire's owner neither among the key's holders (a grant after the withdrawal,
  or a raced grant the client did not release: a lease whose id nobody has) nor in its
  queue (a waiter left behind). A grant that raced the withdrawal is allowed only
  before the withdrawal completed: the client released it as part of withdrawing.

A withdrawal that was not answered (the cluster unreachable until the wait would
have ended) is not judged, only counted. Malformed events, or no read after any
answered withdrawal (nothing judged), make the verdict ``unknown``, never a pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Event = dict[str, Any]

#: The operations of the cancelling clients (judged here, not by the lease checkers).
CANCEL_FS = frozenset({"wait-acquire", "cancel-release", "cancel-read"})


def has_cancels(events: Iterable[Event]) -> bool:
    return any(e.get("f") in CANCEL_FS and e.get("type") == "invoke" for e in events)


def _ops(events: Iterable[Event], bad: list[Event]) -> list[tuple[Event, Event | None]]:
    """(invoke, completion or None) of every cancel operation, by invocation order."""
    invokes: dict[str, Event] = {}
    done: dict[str, Event] = {}
    for e in events:
        if e.get("f") not in CANCEL_FS:
            continue
        op = e.get("op")
        if not isinstance(op, str) or not isinstance(e.get("t"), int | float):
            bad.append(e)
        elif e.get("type") == "invoke":
            if not isinstance(e.get("key"), str) or not isinstance(e.get("value"), dict):
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
    return [(inv, done.get(op)) for op, inv in invokes.items()]


def check_withdrawn(events: list[Event]) -> dict[str, Any]:
    """See the module docstring. ``{"valid", "violations", "violation_count",
    "unknown", "stats"}`` as every checker (run.py's summary prints the count)."""
    bad: list[Event] = []
    ops = _ops(events, bad)
    # (key, owner, completion time) of every answered withdrawal.
    withdrawn: list[tuple[str, str, float]] = []
    unanswered = granted = 0
    for inv, end in ops:
        if inv["f"] != "wait-acquire" or end is None:
            continue
        owner = inv["value"].get("owner")
        if not isinstance(owner, str) or not owner:
            bad.append(inv)
            continue
        if end["type"] == "ok":
            granted += 1
            continue
        value = end.get("value")
        if not isinstance(value, dict) or not isinstance(value.get("withdrawn"), bool):
            bad.append(end)
        elif value["withdrawn"]:
            withdrawn.append((inv["key"], owner, float(end["t"])))
        else:
            unanswered += 1
    violations: list[dict[str, Any]] = []
    judged = 0
    for inv, end in ops:
        if inv["f"] != "cancel-read" or end is None or end["type"] != "ok":
            continue
        value = end.get("value")
        if not isinstance(value, dict) or not all(
            isinstance(value.get(name), list) for name in ("holders", "waiters")
        ):
            bad.append(end)
            continue
        for key, owner, at in withdrawn:
            if key != inv["key"] or inv["t"] <= at:
                continue
            judged += 1
            for where in ("holders", "waiters"):
                if owner in value[where]:
                    violations.append(
                        {
                            "rule": "withdrawn",
                            "key": key,
                            "owner": owner,
                            "withdrawn_at": at,
                            "read": inv["op"],
                            "read_at": inv["t"],
                            "seen_in": where,
                            "message": (
                                f"{owner} withdrew its wait for {key} at {at:.3f} yet a "
                                f"read begun at {inv['t']:.3f} shows it among the {where}"
                            ),
                        }
                    )
    stats = {
        "withdrawn": len(withdrawn),
        "unanswered": unanswered,
        "granted_before_giving_up": granted,
        "judged": judged,
    }
    valid: bool | str = True
    if violations:
        valid = False
    elif bad or not judged:
        valid = "unknown"
    return {
        "valid": valid,
        "violations": violations,
        "violation_count": len(violations),
        "unknown": bad[:20],
        "stats": stats,
    }
