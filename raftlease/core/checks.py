"""Structural validation of log entries: field types, sizes and ranges, checked
before an entry touches the state (a malformed entry changes nothing).

The state machine keeps its own check (it must not trust the wire), driven by the
operations table (``operations.TABLE``) where it checks what the wire parser checks:
which operations mutate, which name a lease or a session, and the static bounds of
their integer fields. Bounds the wire takes from the node's config are checked here
against the hard caps of ``limits`` instead."""

from __future__ import annotations

from typing import Any

from ..limits import (
    MAX_FAIRNESS_KEY_BYTES,
    MAX_FAIRNESS_WEIGHT,
    MAX_ID_CHARS,
    MAX_KEY_BYTES,
    MAX_LIST,
    MAX_MANY_KEYS,
    MAX_OWNER_BYTES,
    MAX_TTL_MS,
    MAX_VALUE_BYTES,
)

# MAX_PRIORITY: waiter and task priorities accepted (higher is served first, FIFO
# within a priority); one constant, the table's.
from ..operations import MAX_PRIORITY as MAX_PRIORITY
from ..operations import TABLE, core_bounds, ops_reading, ops_with
from .budget import BUDGET_MUTATING_OPS, BUDGET_READ_OPS, check_gate
from .progress import valid_progress

#: Most requests one batch entry may carry.
MAX_BATCH = 4096

_MUTATING = frozenset(op.name for op in TABLE if op.mutates)

#: Operations on one lease, named by ``key`` and ``lid``: the mutating ones that need
#: write on the key.
LEASE_OPS = ops_with("key_write") & _MUTATING


SESSION_OPS = ops_with("session")

#: Operations on a set of keys (``acquire_many``): write on every key of the set.
MANY_OPS = ops_with("keys_write") & _MUTATING


#: Operators' operations (``admin`` permission with auth): ``revoke`` ends the leases
#: on a key (all, or the one named by ``lid`` or ``token``) and wakes its waiters.
ADMIN_OPS = ops_with("key_admin") & _MUTATING

#: Cooperative preemption (``request_yield``, core/preempt.py): the ``preempt``
#: permission (or ``admin``) on the key with auth.
PREEMPT_OPS = ops_with("key_preempt") & _MUTATING


#: Leased task queues (core/queue.py, issue 12): mutations (the table's mutating
#: operations on a queue), and reads through the log (``task_claim_status`` is the
#: leader's own read for the ``await_claim`` long-poll, never a client's).
TASK_MUTATING_OPS = ops_reading("queue") & _MUTATING
TASK_READ_OPS = frozenset({"task_get", "task_stats", "task_dead", "task_claim_status"})
TASK_OPS = TASK_MUTATING_OPS | TASK_READ_OPS


#: Every mutating operation of the table: each carries ``cid``, ``seq``, ``ack``.
#: Shared budgets (core/budget.py, issue 42) keep their own lists there.
MUTATING_OPS = (
    LEASE_OPS
    | MANY_OPS
    | SESSION_OPS
    | ADMIN_OPS
    | PREEMPT_OPS
    | TASK_MUTATING_OPS
    | BUDGET_MUTATING_OPS
)
assert MUTATING_OPS == _MUTATING, "a mutating operation the state machine does not know"


READ_OPS = frozenset(
    {"holder", "leases", "fence", "lease_status", "waiters", "sessions"}
    | TASK_READ_OPS
    | BUDGET_READ_OPS
)


#: Static bounds from the table (the wire's own): the dedup envelope's numbers, an
#: acquire's priority and capacity, a fence's and a revoke's token.
_SEQ = core_bounds("acquire", "seq")
_PRIORITY = core_bounds("acquire", "priority")
_CAPACITY = core_bounds("acquire", "capacity")
_FENCE_TOKEN = core_bounds("fence", "token")
_REVOKE_TOKEN = core_bounds("revoke", "token")


#: Entries only a leader proposes (never accepted from a client): ``tick`` moves log
#: time; ``reserve`` moves the fencing-token ceiling ahead; ``extend`` writes the
#: keep-alives the leader answered from memory (server/keepalive.py) into the log;
#: ``certkey`` makes a new certificate signing key current (core/certkeys.py).
LEADER_OPS = frozenset({"tick", "reserve", "extend", "certkey"})

#: Most leases and sessions in one ``extend`` entry (about 45 bytes each, so an entry
#: stays below the proposer's 32 KiB batch size).
MAX_EXTEND = 600
#: Most client ids in one ``extend`` entry (up to 131 bytes each, packed).
MAX_EXTEND_CIDS = 200


ALL_OPS = MUTATING_OPS | READ_OPS | LEADER_OPS


def utf8_size(value: str) -> int:
    """Encoded size of ``value``; a string UTF-8 cannot encode (a lone surrogate) counts
    as oversized, so it is rejected instead of raising ``UnicodeEncodeError``."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return 2**63


def utf8_prefix(value: str, max_bytes: int) -> str:
    """The longest prefix of ``value`` whose UTF-8 encoding is at most ``max_bytes``:
    cut at a character boundary (a limit in bytes, as the wire checks it, not in
    characters: 256 characters of CJK text are 768 bytes)."""
    return value.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")


def valid_str(value: Any, max_bytes: int) -> bool:
    return isinstance(value, str) and len(value) > 0 and utf8_size(value) <= max_bytes


def valid_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check_args(op: str, entry: dict[str, Any]) -> str | None:
    """Why ``entry`` (of a known ``op``) is malformed, or None. Structural only: it
    reads the entry, never the state."""
    if op in MUTATING_OPS:
        if not valid_str(entry.get("cid"), MAX_ID_CHARS):
            return "'cid' must be a non-empty string"
        if not valid_int(entry.get("seq"), *_SEQ):
            return "'seq' must be a positive integer"
        if not valid_int(entry.get("ack"), *_SEQ):
            return "'ack' must be a positive integer"
    if op in LEASE_OPS:
        if not valid_str(entry.get("key"), MAX_KEY_BYTES):
            return "'key' must be a non-empty string"
        if not valid_str(entry.get("lid"), MAX_ID_CHARS):
            return "'lid' must be a non-empty string"
    if op in SESSION_OPS and not valid_str(entry.get("sid"), MAX_ID_CHARS):
        return "'sid' must be a non-empty string"
    if op in ("acquire", "acquire_many", "transfer", "session_open") and not valid_str(
        entry.get("owner"), MAX_OWNER_BYTES
    ):
        return "'owner' must be a non-empty string"
    if op == "acquire_many":
        problem = check_many(entry)
        if problem is not None:
            return problem
    if "session_quota" in entry and not valid_int(entry["session_quota"], 1, 2**31):
        return "'session_quota' must be a positive integer"
    if "quota" in entry and not valid_int(entry["quota"], 1, 2**31):
        return "'quota' must be a positive integer"
    if "wait_quota" in entry and not valid_int(entry["wait_quota"], 1, 2**31):
        return "'wait_quota' must be a positive integer"
    if "waiters_total" in entry and not valid_int(entry["waiters_total"], 1, 2**31):
        return "'waiters_total' must be a positive integer"
    if "shaper" in entry and entry["shaper"] is not False:
        return "'shaper' must be false when present"
    if "gate_budget" in entry or "gate_cost" in entry:
        # A budget gate (docs/budgets.md): stamped by the leader on acquires and
        # claims only, from the auth file.
        if op not in ("acquire", "task_claim"):
            return "a budget gate ('gate_budget', 'gate_cost') only goes with acquire or task_claim"
        problem = check_gate(entry)
        if problem is not None:
            return problem
    if "principal" in entry and not valid_str(entry["principal"], MAX_OWNER_BYTES):
        return "'principal' must be a non-empty string"
    if "value" in entry and not (
        isinstance(entry["value"], str) and utf8_size(entry["value"]) <= MAX_VALUE_BYTES
    ):
        return f"'value' must be a string of at most {MAX_VALUE_BYTES} bytes"
    if op == "acquire":
        ttl = entry.get("ttl")
        if "session" in entry:
            if not valid_str(entry["session"], MAX_ID_CHARS):
                return "'session' must be a non-empty string"
            if ttl is not None:
                return "'ttl' must be absent: an attached lease lives as long as its session"
        elif not valid_int(ttl, 1, MAX_TTL_MS):
            return "'ttl' must be a positive integer of milliseconds"
        if not valid_int(entry.get("wait", 0), 0, MAX_TTL_MS):
            return "'wait' must be a non-negative integer of milliseconds"
        if not valid_int(entry.get("priority", 0), *_PRIORITY):
            return f"'priority' must be an integer from {_PRIORITY[0]} to {_PRIORITY[1]}"
        capacity = entry.get("capacity", 1)
        if not valid_int(capacity, *_CAPACITY):
            return f"'capacity' must be an integer from {_CAPACITY[0]} to {_CAPACITY[1]}"
        if not valid_int(entry.get("units", 1), 1, capacity):
            return "'units' must be an integer from 1 to the key's capacity"
        # Fair shares between tenants waiting on the key (docs/design.md §4d).
        tenant = entry.get("fairness_key", "-")
        if not valid_str(tenant, MAX_FAIRNESS_KEY_BYTES):
            return (
                f"'fairness_key' must be a non-empty string of at most "
                f"{MAX_FAIRNESS_KEY_BYTES} bytes"
            )
        if "weight" in entry and not valid_int(entry["weight"], 1, MAX_FAIRNESS_WEIGHT):
            return f"'weight' must be an integer from 1 to {MAX_FAIRNESS_WEIGHT}"
        # Progress-aware plain leases (docs/design.md §4g); an attached one is capped
        # under its session's keep-alives and reports progress by renew.
        if "progress_timeout" in entry and not valid_int(entry["progress_timeout"], 1, MAX_TTL_MS):
            return "'progress_timeout' must be a positive integer of milliseconds"
    elif op == "transfer":
        if not valid_str(entry.get("new_lid"), MAX_ID_CHARS):
            return "'new_lid' must be a non-empty string"
        ttl = entry.get("ttl")
        if ttl is not None and not valid_int(ttl, 1, MAX_TTL_MS):
            return "'ttl' must be a positive integer of milliseconds or absent"
    elif op == "proclaim":
        if not isinstance(entry.get("value"), str):
            return "'value' must be a string"
    elif op in ("session_open", "session_keepalive"):
        ttl = entry.get("ttl")
        if (op == "session_open" or ttl is not None) and not valid_int(ttl, 1, MAX_TTL_MS):
            return "'ttl' must be a positive integer of milliseconds"
    elif op in ("fence", "lease_status"):
        if not valid_str(entry.get("key"), MAX_KEY_BYTES):
            return "'key' must be a non-empty string"
        if op == "fence" and not valid_int(entry.get("token"), *_FENCE_TOKEN):
            return "'token' must be a non-negative integer"
        if op == "lease_status" and not valid_str(entry.get("lid"), MAX_ID_CHARS):
            return "'lid' must be a non-empty string"
    elif op == "renew":
        ttl = entry.get("ttl")
        if ttl is not None and not valid_int(ttl, 1, MAX_TTL_MS):
            return "'ttl' must be a positive integer of milliseconds or absent"
        if "progress" in entry and not valid_progress(entry["progress"]):
            return "'progress' must be a finite number (an integer within ±2**62)"
    elif op == "holder":
        if not valid_str(entry.get("key"), MAX_KEY_BYTES):
            return "'key' must be a non-empty string"
    elif op in ("revoke", "waiters"):
        if not valid_str(entry.get("key"), MAX_KEY_BYTES):
            return "'key' must be a non-empty string"
        if "lid" in entry and not valid_str(entry["lid"], MAX_ID_CHARS):
            return "'lid' must be a non-empty string or absent"
        if "token" in entry and not valid_int(entry["token"], *_REVOKE_TOKEN):
            return "'token' must be a positive integer or absent"
        if "lid" in entry and "token" in entry:
            return "give 'lid' or 'token', not both"
        if op == "waiters" and not valid_int(entry.get("limit", 1000), 1, MAX_LIST):
            return "'limit' must be an integer from 1 to 100000"
    elif op == "request_yield":
        if not valid_str(entry.get("key"), MAX_KEY_BYTES):
            return "'key' must be a non-empty string"
        if not valid_int(entry.get("deadline"), 0, MAX_TTL_MS):
            return "'deadline' must be a non-negative integer of milliseconds"
        if not valid_int(entry.get("priority", 0), *_PRIORITY):
            return f"'priority' must be an integer from {_PRIORITY[0]} to {_PRIORITY[1]}"
        if "override" in entry and entry["override"] is not True:
            return "'override' must be true when present"
    elif op == "sessions":
        if not valid_int(entry.get("limit", 1000), 1, MAX_LIST):
            return "'limit' must be an integer from 1 to 100000"
    elif op == "extend":
        for field in ("leases", "sessions"):
            items = entry.get(field, [])
            if not isinstance(items, list) or len(items) > MAX_EXTEND:
                return f"'{field}' must be a list of at most {MAX_EXTEND} [id, until] pairs"
            for item in items:
                if not (
                    isinstance(item, list)
                    and len(item) == 2
                    and valid_str(item[0], MAX_ID_CHARS)
                    and valid_int(item[1], 0, 2**62)
                ):
                    return f"'{field}' must hold [id, until] pairs"
        cids = entry.get("cids", [])
        if not isinstance(cids, list) or len(cids) > MAX_EXTEND_CIDS:
            return f"'cids' must be a list of at most {MAX_EXTEND_CIDS} client ids"
        if not all(valid_str(cid, MAX_ID_CHARS) for cid in cids):
            return "'cids' must hold client ids"
    elif op == "leases":
        prefix = entry.get("prefix", "")
        if not isinstance(prefix, str) or utf8_size(prefix) > MAX_KEY_BYTES:
            return "'prefix' must be a string"
        if not valid_int(entry.get("limit", 1000), 1, MAX_LIST):
            return "'limit' must be an integer from 1 to 100000"
    return None


def check_many(entry: dict[str, Any]) -> str | None:
    """Why an ``acquire_many`` entry is malformed, or None: a set of 1 to
    ``MAX_MANY_KEYS`` distinct keys as ``[key, units]`` pairs, units within the
    capacity; a lease id (the set's, also its lease session's id), a TTL, a priority."""
    if not valid_str(entry.get("lid"), MAX_ID_CHARS):
        return "'lid' must be a non-empty string"
    if not valid_int(entry.get("ttl"), 1, MAX_TTL_MS):
        return "'ttl' must be a positive integer of milliseconds"
    if not valid_int(entry.get("wait", 0), 0, MAX_TTL_MS):
        return "'wait' must be a non-negative integer of milliseconds"
    if not valid_int(entry.get("priority", 0), *_PRIORITY):
        return f"'priority' must be an integer from {_PRIORITY[0]} to {_PRIORITY[1]}"
    capacity = entry.get("capacity", 1)
    if not valid_int(capacity, *_CAPACITY):
        return f"'capacity' must be an integer from {_CAPACITY[0]} to {_CAPACITY[1]}"
    items = entry.get("keys")
    if not isinstance(items, list) or not 0 < len(items) <= MAX_MANY_KEYS:
        return f"'keys' must be a list of 1 to {MAX_MANY_KEYS} [key, units] pairs"
    seen: set[str] = set()
    for item in items:
        if not (
            isinstance(item, list)
            and len(item) == 2
            and valid_str(item[0], MAX_KEY_BYTES)
            and valid_int(item[1], 1, capacity)
        ):
            return "'keys' must hold [key, units] pairs, units from 1 to the capacity"
        if item[0] in seen:
            return f"'keys' names {item[0]!r} twice"
        seen.add(item[0])
    return None
