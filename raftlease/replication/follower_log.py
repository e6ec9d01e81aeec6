"""The follower side of ``append_entries``, planned purely (no PySyncObj state is
touched here): what PySyncObj's own handler must be given so that it does what Raft
§5.3 and §7 say. ``transport.LeaseTransport`` applies the plans.


PySyncObj's follower handling of ``append_entries`` (syncobj.py, SyncObj.
__onMessageReceived) has defects that ``LeaseTransport`` corrects before the message
reaches it (docs/pysyncobj.md trap 5, jepsen-style/README.md findings 1 and 2; the
snapshot path is corrected by ``LeaseTransport._snapshot_message``):

B. When ``prevLogIdx`` matches but is below the log end it deletes everything after
   ``prevLogIdx`` and appends the message's entries, conflict or not. Raft (§5.3)
   deletes only from the first conflicting entry (same index, other term). With
   several messages in flight (no batching, 64 KiB per message) a late or repeated
   message shortens the log below what the follower already acknowledged.
A. Its rejections are absolute: ``prevLogIdx`` outside the log is answered "reset,
   next = log end + 1", a term mismatch at ``prevLogIdx`` "reset, next =
   prevLogIdx", and the leader sets its next index to whichever arrives last. A
   follower whose last entries conflict with the leader's (a deposed leader's
   uncommitted tail) answers the first probe "next = P" and the message sent behind
   it "next = log end + 1", which undoes the step back: the leader probes the same
   index forever. Only a snapshot (once the leader's compacted log start passes the
   follower's end) or a change of leader ends it.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from typing import Any, NamedTuple

from pysyncobj import pickle as pysyncobj_pickle


class Conflict(NamedTuple):
    """What a follower knows about its log against the leader of ``term``: its entry
    at ``at`` (of term ``our_term``) is not the leader's, so the leader should probe
    from ``hint`` (<= ``at``) while that entry is still there."""

    term: int
    at: int
    our_term: int
    hint: int


class AppendPlan(NamedTuple):
    """How to hand an ``append_entries`` to PySyncObj: ``message`` to pass on (the
    original or a rewrite), ``reply_next`` to put in PySyncObj's reply instead of its
    ``next_node_idx`` (None: leave it), the follower's ``conflict`` knowledge, and
    whether PySyncObj will accept the message (False: it rejects it)."""

    message: dict[str, Any]
    reply_next: int | None
    conflict: Conflict | None
    accepted: bool = True


def plan_append_entries(
    log: Sequence[Any], commit_index: int, message: dict[str, Any], conflict: Conflict | None
) -> AppendPlan:
    """Plan a follower's handling of a current-term ``append_entries`` that carries
    ``prevLogIdx``, so that PySyncObj's own code does what Raft §5.3 says.

    ``log`` is PySyncObj's log (entries ``(command, index, term)``, contiguous, from
    the compacted log start), ``commit_index`` the follower's. Pure: it reads ``log``
    and returns the plan. Cases, with what PySyncObj does with the plan:

    - ``prevLogIdx`` in the log with the same term (accepted): entries already in the
      log with the same term are dropped from the message and ``prevLogIdx`` moves
      past them, so PySyncObj deletes only from a real conflict. A message that adds
      nothing is passed with ``prevLogIdx`` = log end (nothing deleted) and its reply
      is set back to what the message verified (end of its entries + 1), its
      ``commit_index`` capped there (Raft: min(leaderCommit, last new entry)).
    - term mismatch at ``prevLogIdx``: rejected as before, but the reply asks the
      leader to probe from the first entry of our conflicting term (never at or below
      our commit index), and the conflict is remembered.
    - ``prevLogIdx`` outside the log, or None (the leader has no entry there: our log
      is longer than its): rejected as before; the reply is log end + 1, lowered to
      what the leader can hold (its commit index + 1) when ``prevLogIdx`` is None,
      and to a remembered conflict's hint while that conflict stands, so a rejection
      of a message sent behind a probe no longer undoes the step back (bug A).
    """
    first, last = log[0][1], log[-1][1]

    def term_at(index: int) -> int:
        return int(log[index - first][2])

    term = message["term"]
    if (
        conflict is not None
        and conflict.term == term
        and first <= conflict.at <= last
        and term_at(conflict.at) == conflict.our_term
    ):
        standing: Conflict | None = conflict
    else:
        standing = None
    prev = message.get("prevLogIdx")
    if not isinstance(prev, int) or prev < first or prev > last:
        # PySyncObj: rejected, "reset, next = last + 1".
        nxt = last + 1
        if prev is None:
            leader_commit = message.get("commit_index")
            held = max(commit_index, leader_commit if isinstance(leader_commit, int) else 0)
            nxt = min(nxt, max(held + 1, first + 1))
        if standing is not None:
            nxt = min(nxt, standing.hint)
        return AppendPlan(message, nxt if nxt != last + 1 else None, standing, False)
    if term_at(prev) != message.get("prevLogTerm"):
        # PySyncObj: rejected, "reset, next = prev". Probe from the first entry of our
        # term there instead (bounded by what is certainly the leader's: committed
        # entries and the compacted start), and remember it.
        our_term = term_at(prev)
        floor = max(commit_index + 1, first + 1)
        hint = prev
        while hint > floor and term_at(hint - 1) == our_term:
            hint -= 1
        hint = min(prev, max(hint, floor))
        if standing is not None:
            hint = min(hint, standing.hint)
        conflict = Conflict(term, prev, our_term, hint)
        return AppendPlan(message, hint if hint != prev else None, conflict, False)
    if "transmission" in message:
        return AppendPlan(message, None, standing)  # one large entry: left to PySyncObj
    entries = message.get("entries") or []
    if any(
        not isinstance(e, tuple | list) or len(e) != 3 or e[1] != prev + 1 + i
        for i, e in enumerate(entries)
    ):
        return AppendPlan(message, None, standing)  # not the shape we know: untouched
    skip = 0
    while (
        skip < len(entries)
        and entries[skip][1] <= last
        and term_at(entries[skip][1]) == entries[skip][2]
    ):
        skip += 1
    if skip < len(entries):
        # New entries from entries[skip]: appended at the log end, or replacing ours
        # from a real conflict (PySyncObj deletes from there).
        if skip == 0:
            return AppendPlan(message, None, standing)
        at = prev + skip
        rewritten = dict(message, prevLogIdx=at, prevLogTerm=term_at(at), entries=entries[skip:])
        return AppendPlan(rewritten, None, standing)
    end = prev + len(entries)  # every entry is already ours: nothing to delete
    if end == last and not entries:
        return AppendPlan(message, None, standing)
    rewritten = dict(message, prevLogIdx=last, prevLogTerm=term_at(last), entries=[])
    leader_commit = message.get("commit_index")
    if end < last and isinstance(leader_commit, int) and leader_commit > end:
        rewritten["commit_index"] = end
    return AppendPlan(rewritten, end + 1 if end < last else None, standing)


def snapshot_is_behind(log: Sequence[Any], dump: bytes) -> bool:
    """True if a snapshot received from the leader (PySyncObj's gzip+pickle dump: data,
    last entry, the entry before, cluster) ends inside ``log``, at an entry of the same
    term, before the log end. PySyncObj would install it anyway and clear the log
    (``__loadDumpFile(clearJournal=True)``), dropping entries the follower may already
    have acknowledged; Raft (§7) keeps the entries that follow it. Undecodable: False
    (PySyncObj handles it as before)."""
    try:
        entry = pysyncobj_pickle.loads(gzip.decompress(dump))[1]
        index, term = int(entry[1]), int(entry[2])
    except Exception:
        return False
    first, last = log[0][1], log[-1][1]
    if index >= last:
        return False
    if index < first:
        return True  # older than our own compacted (committed) start
    return bool(log[index - first][2] == term)
