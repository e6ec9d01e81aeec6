"""The watch checker over a chaos-suite history (issue 37).

A watcher (``watch_workload.WatchRecorder``) records what ``raftlease`` watch streams
delivered to it, as ``watch`` events (jepsen-style/README.md, *Watch streams*):

* ``{"f": "start", "stream", "process", "prefix", "from_revision"}``: a stream was
  opened (``from_revision`` 0: "from now").
* ``{"f": "events", "stream", "events": [{revision, type, key, owner, token, units}]}``:
  what it delivered since the last such event, in delivery order.
* ``{"f": "end", "stream", "reason", "error"}``: it ended: ``stopped`` (the run
  ended), ``rotate`` (the watcher closed it to resume from its next revision in a new
  stream), ``limit`` (the recording's bound), or ``error`` (the client saw
  ``error``: ``COMPACTED``, ...). A stream ends only so; the next one starts afresh.

What a stream must show (``check_watch``; ``{"valid", "violations", "unknown",
"stats"}`` like every checker):

* **order**: revisions strictly increase (a repeat or a step back is a violation);
* **start**: a stream from revision ``R`` delivers nothing below ``R``;
* **no gap** (prefix ``""``: every change of the store is an event): each revision is
  the previous one plus one (the first: ``R``), except where a new leader's term
  jumped the revision to the fencing-token ceiling (``raftlease.core.store``,
  ``_new_epoch``: no key changes there, so no event). A jump lands exactly on the
  revision before the next event, and the landings of a cluster's terms are at least
  ``TOKEN_RESERVE_STEP`` apart, the first at least that far above 0 (each term's
  ceiling is set ``headroom + TOKEN_RESERVE_STEP`` above the revision it starts from,
  and only grows). So a gap whose landing is within ``TOKEN_RESERVE_STEP`` of 0 or of
  another gap's landing (in any stream) is no jump: the stream skipped changes;
* **the history's writes**: an acknowledged grant (``ok`` acquire: its token is the
  revision that granted it) or claim (``ok`` ``q.claim``: likewise) inside a range
  a stream covered, on a key under its prefix, is delivered at that revision as that
  write (a ``grant`` of that key, token and owner the cluster returned; a
  ``task_claim`` of that queue's task by that worker); and a delivered ``grant`` or
  ``task_claim`` names its own revision as its token;
* **the leases it shows** (prefix ``""``): a plain key (none granted with ``capacity``
  > 1 in the history) is granted only after the lease the stream last saw granted on
  it ended (release, expire, transfer, revoke: every removal is an event), and a lease
  ends once: a skipped release or expiry shows two holders.

A malformed ``watch`` event, an ``events`` or ``end`` of a stream never started, a
stream never ended, or a run that declared a watcher (``meta`` ``watch``) and
delivered nothing is ``unknown``: never a pass.

Pure functions over lists; no I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard

from raftlease.limits import TOKEN_RESERVE_STEP

Event = dict[str, Any]
MAX_REPORTED = 50
#: The least distance between two revisions a new term may jump to (and from 0 to the
#: first): see the module docstring.
JUMP_SPACING = TOKEN_RESERVE_STEP
END_REASONS = frozenset({"stopped", "rotate", "limit", "error"})


class WOp(Protocol):
    """What the checker reads of a paired operation (``checker.Op``)."""

    id: str
    process: str
    f: str
    key: str
    inv: float
    ret: float
    type: str
    args: dict[str, Any]
    value: dict[str, Any]


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class Stream:
    """One watch stream as the watcher recorded it."""

    id: str
    process: str
    prefix: str
    from_revision: int
    start_t: float
    rows: list[dict[str, Any]] = field(default_factory=list)
    end: Event | None = None

    @property
    def contiguous(self) -> bool:
        """Every change of the store is under the prefix (so every revision but a
        term's jump is delivered)."""
        return self.prefix == ""

    def covered(self) -> tuple[int, int] | None:
        """The revisions the stream vouches for: from its start (``R``, or its first
        delivered revision when it started "from now") to its last delivered one."""
        if not self.rows:
            return None
        first = self.from_revision if self.from_revision > 0 else self.rows[0]["revision"]
        return first, self.rows[-1]["revision"]


def has_watches(events: Iterable[Event]) -> bool:
    """Whether the run recorded (or declared) a watcher: then ``watch`` is judged."""
    for event in events:
        if event.get("type") == "watch":
            return True
        if event.get("type") == "meta" and event.get("watch"):
            return True
    return False


def _row_ok(row: Any) -> bool:
    return (
        isinstance(row, dict)
        and _is_int(row.get("revision"))
        and isinstance(row.get("type"), str)
        and isinstance(row.get("key"), str)
        and _is_int(row.get("token"))
    )


def streams(events: Iterable[Event], unknown: list[Event]) -> list[Stream]:
    """The recorded streams, in the order they started; what cannot be read goes to
    ``unknown``."""
    out: dict[str, Stream] = {}
    for e in events:
        if e.get("type") != "watch":
            continue
        sid, what = e.get("stream"), e.get("f")
        if not isinstance(sid, str):
            unknown.append({"kind": "watch event without a stream id", "event": e})
            continue
        if what == "start":
            prefix, start = e.get("prefix"), e.get("from_revision")
            if not isinstance(prefix, str) or not _is_int(start) or start < 0 or sid in out:
                unknown.append({"kind": "malformed (or repeated) stream start", "event": e})
                continue
            out[sid] = Stream(sid, str(e.get("process")), prefix, start, float(e.get("t", 0.0)))
            continue
        stream = out.get(sid)
        if stream is None:
            unknown.append({"kind": f"watch {what} of a stream never started", "stream": sid})
            continue
        if stream.end is not None:
            unknown.append({"kind": "watch event after its stream ended", "stream": sid})
            continue
        if what == "events":
            rows = e.get("events")
            if not isinstance(rows, list) or not all(_row_ok(r) for r in rows):
                unknown.append({"kind": "malformed watch events", "stream": sid})
                continue
            stream.rows.extend(rows)
        elif what == "end":
            if e.get("reason") not in END_REASONS:
                unknown.append({"kind": "stream end without a known reason", "event": e})
            stream.end = e
        else:
            unknown.append({"kind": "unknown watch event", "event": e})
    for stream in out.values():
        if stream.end is None:
            cut = "stream never ended (recording cut short)"
            unknown.append({"kind": cut, "stream": stream.id})
    return list(out.values())


def _known_writes(ops: Iterable[WOp]) -> dict[int, dict[str, Any]]:
    """Revisions the history proves, with the change each one was: an ``ok`` acquire's
    token is the revision of its grant, an ``ok`` claim's token the revision of its
    ``task_claim``."""
    out: dict[int, dict[str, Any]] = {}
    for op in ops:
        if op.type != "ok":
            continue
        token = op.value.get("token")
        if not _is_int(token):
            continue
        if op.f == "acquire":
            owner = op.value.get("owner", op.args.get("owner"))
            out[token] = {"type": "grant", "key": op.key, "owner": owner, "op": op.id}
        elif op.f == "q.claim" and isinstance(op.value.get("task"), str):
            out[token] = {
                "type": "task_claim",
                "key": f"queue:{op.key}/{op.value['task']}",
                "owner": op.args.get("worker"),
                "op": op.id,
            }
    return out


#: Watch event types that end a lease (every removal in ``core.store`` emits one).
LEASE_ENDS = frozenset({"release", "expire", "transfer", "revoke"})


def shared_keys(ops: Iterable[WOp]) -> set[str]:
    """Keys a lease was granted on with ``capacity`` > 1 (as ``checker.shared_keys``):
    several holders at once are allowed there."""
    out = set()
    for op in ops:
        capacity = op.args.get("capacity", 1)
        if op.f == "acquire" and op.type == "ok" and _is_int(capacity) and capacity > 1:
            out.add(op.key)
    return out


def _replay_leases(stream: Stream, shared: set[str], bad: Any) -> None:
    """A contiguous stream shows every change after its start, so the leases it saw
    granted must behave: a plain key is granted only once its last lease (granted in
    the stream) ended, and a lease ends once. A stream that skipped a release or an
    expiry shows a second holder; one that repeated an end shows it twice. Leases
    granted before the stream started are not known, so they are never judged."""
    live: dict[str, set[int]] = defaultdict(set)
    ended: set[int] = set()
    for row in stream.rows:
        kind, key, token = row["type"], row["key"], row["token"]
        if kind == "grant":
            if live[key] and key not in shared:
                bad(
                    "grant on a plain key its stream shows held",
                    stream,
                    revision=row["revision"],
                    key=key,
                    held_by=sorted(live[key]),
                )
            live[key].add(token)
        elif kind in LEASE_ENDS:
            if token in ended:
                bad("lease ended twice in one stream", stream, revision=row["revision"], row=row)
            ended.add(token)
            live[key].discard(token)
        elif kind in ("renew", "proclaim") and token in ended:
            bad(f"{kind} of a lease its stream showed ended", stream, row=row)


def _gaps(stream: Stream) -> list[tuple[int, int]]:
    """``(a, b)``: revisions strictly between ``a`` and ``b`` are missing from a
    contiguous stream (``a`` delivered, or the revision before its start; ``b``
    delivered next)."""
    out = []
    prev = stream.from_revision - 1 if stream.from_revision > 0 else None
    for row in stream.rows:
        rev = row["revision"]
        if prev is not None and rev > prev + 1:
            out.append((prev, rev))
        prev = rev if prev is None else max(prev, rev)
    return out


def check_watch(events: list[Event], ops: Iterable[WOp]) -> dict[str, Any]:
    """Every rule of the module docstring over every recorded stream."""
    violations: list[dict[str, Any]] = []
    unknown: list[dict[str, Any]] = []
    recorded = streams(events, unknown)
    ops = list(ops)
    writes = _known_writes(ops)
    shared = shared_keys(ops)

    def bad(kind: str, stream: Stream, **detail: Any) -> None:
        violations.append({"kind": kind, "stream": stream.id, "prefix": stream.prefix, **detail})

    landings: dict[int, tuple[Stream, int, int]] = {}  # landing -> (stream, a, b)
    delivered = matched = 0
    for stream in recorded:
        delivered += len(stream.rows)
        prev: int | None = None
        by_rev: dict[int, dict[str, Any]] = {}
        for row in stream.rows:
            rev = row["revision"]
            if stream.from_revision > 0 and rev < stream.from_revision:
                bad("revision before the stream's start", stream, revision=rev)
            if prev is not None and rev == prev:
                bad("revision delivered twice", stream, revision=rev)
            elif prev is not None and rev < prev:
                bad("revision went backwards", stream, revision=rev, after=prev)
            prev = rev if prev is None else max(prev, rev)
            by_rev.setdefault(rev, row)
            if row["type"] in ("grant", "task_claim") and row["token"] != rev:
                bad(f"{row['type']} whose token is not its revision", stream, row=row)
        if stream.contiguous:
            _replay_leases(stream, shared, bad)
            for a, b in _gaps(stream):
                proved = sorted(r for r in writes if a < r < b)
                if proved:
                    bad(
                        "stream skipped changes the history shows",
                        stream,
                        after=a,
                        next=b,
                        missing=[{"revision": r, **writes[r]} for r in proved[:5]],
                    )
                landings.setdefault(b - 1, (stream, a, b))
        span = stream.covered()
        if span is None:
            continue
        lo, hi = span
        for rev, write in writes.items():
            if not (lo <= rev <= hi) or not write["key"].startswith(stream.prefix):
                continue
            got = by_rev.get(rev)
            if got is None:
                if not stream.contiguous:  # a contiguous stream's gap is reported above
                    missing = "acknowledged write missing from the stream"
                    bad(missing, stream, revision=rev, write=write)
                continue
            expected = (write["type"], write["key"], rev, write["owner"])
            if (got["type"], got["key"], got["token"], got.get("owner")) != expected:
                bad(
                    "event does not match the acknowledged write at its revision",
                    stream,
                    revision=rev,
                    write=write,
                    row=got,
                )
            else:
                matched += 1
    # Jumps: sorted landings (with 0, where the first term starts) must be spread at
    # least JUMP_SPACING apart; a gap landing closer to another is no term change.
    previous = 0
    previous_gap: tuple[Stream, int, int] | None = None
    jumps = 0
    for landing in sorted(landings):
        stream, a, b = landings[landing]
        if landing - previous < JUMP_SPACING:
            other = previous_gap
            bad(
                "gap no term change explains: revisions skipped",
                stream,
                after=a,
                next=b,
                missing=b - a - 1,
                epoch_start_before=previous,
                other_gap=None if other is None else {"stream": other[0].id, "after": other[1]},
            )
            continue  # the earlier landing stays the reference
        jumps += 1
        previous, previous_gap = landing, landings[landing]
    meta = next((e for e in events if e.get("type") == "meta"), {})
    if not recorded or not delivered:
        unknown.append({"kind": "no watch event delivered: nothing to judge"})
    ends: dict[str, int] = defaultdict(int)
    for stream in recorded:
        if stream.end is not None:
            reason = str(stream.end.get("reason"))
            if reason == "error":
                reason = f"error:{stream.end.get('error')}"
            ends[reason] += 1
    valid: bool | str = not violations
    if valid and unknown:
        valid = "unknown"
    stats = {
        "declared": bool(meta.get("watch")),
        "streams": len(recorded),
        "events": delivered,
        "term_jumps": jumps,
        "writes_matched": matched,
        "ends": dict(sorted(ends.items())),
        "last_revision": max((s.rows[-1]["revision"] for s in recorded if s.rows), default=None),
    }
    return {
        "valid": valid,
        "violation_count": len(violations),
        "violations": violations[:MAX_REPORTED],
        "unknown": unknown[:MAX_REPORTED],
        "stats": stats,
    }
