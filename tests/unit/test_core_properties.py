"""Property tests of ``raftlease.core.LeaseStore`` against a small reference model.

Hypothesis generates logs as a Raft leader would build them from several clients:
acquire/renew/release/holder/leases/tick over three keys, small TTLs, a leader clock
that mostly moves forward (sometimes a stale stamp, sometimes a deposed leader's entry
from an older term), retried requests that reuse their ``(cid, seq)`` because the
response was lost, and a sprinkling of malformed entries.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import msgpack
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from raftlease import errors
from raftlease.core import CLIENT_IDLE_MS, LeaseStore
from raftlease.limits import MAX_TTL_MS, TOKEN_RESERVE_STEP

pytestmark = pytest.mark.timeout(60)

# Example count, randomization and database come from the loaded profile
# (tests/conftest.py: derandomized "ci" by default, "explore" to search).
SETTINGS = settings(
    # No explain phase: its tracing makes a failing run slow enough to hit the timeout.
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
)

KEYS = ("a", "b", "c")
MUTATING = ("acquire", "renew", "release")
#: Outcomes of a mutating entry that was refused without being applied or cached.
NOT_APPLIED = frozenset({"NOT_LEADER", "SESSION_EXPIRED", "BAD_REQUEST", "TOO_MANY_PENDING"})
OWNERS = ("alice", "bob", "carol")
CLIENTS = 3
MAX_STEPS = 60

Entry = dict[str, Any]
Result = dict[str, Any]
T = TypeVar("T")


# ------------------------------------------------------------------------- model


class ModelLease(NamedTuple):
    owner: str
    lease_id: str
    token: int
    expires_at: int
    ttl: int


@dataclass
class ModelSession:
    last_seen: int
    results: dict[int, Result] = field(default_factory=dict)
    acked: int = 1  # the highest ack seen: every seq below it was answered


class Model:
    """The lease semantics written as plainly as possible: no heap, no ordering tricks.

    Results have the store's shape minus the free-text ``message``.
    """

    def __init__(self) -> None:
        self.now = 0
        self.term = 0
        self.revision = 0
        self.ceiling = 0
        self.applied = 0
        self.expired = 0
        self.leases: dict[str, ModelLease] = {}
        self.sessions: dict[str, ModelSession] = {}

    def public(self, key: str) -> dict[str, Any] | None:
        lease = self.leases.get(key)
        if lease is None:
            return None
        return {
            "key": key,
            "owner": lease.owner,
            "token": lease.token,
            "ttl": lease.ttl,
            "expires_at": lease.expires_at,
            "remaining": lease.expires_at - self.now,
        }

    def apply(self, entry: Entry) -> Result:
        """Apply a well-formed entry."""
        term = entry.get("term", 0)
        if term < self.term:  # stamped by a deposed leader: refused, nothing changes
            return {"ok": False, "code": "NOT_LEADER"}
        if entry["op"] == "acquire" and entry["lid"] in {x.lease_id for x in self.leases.values()}:
            # A lease id the state knows (even one due to expire in this entry) is
            # refused, changing nothing, unless this is a retry answered before.
            known = self.sessions.get(entry["cid"])
            if known is None or entry["seq"] not in known.results:
                return {"ok": False, "code": "BAD_REQUEST"}
        if term > self.term or self.ceiling == 0:
            # A new term moves past every token the old terms could have handed out.
            self.revision = max(self.revision, self.ceiling)
            self.ceiling = self.revision + 3 * len(self.leases) + 8 + TOKEN_RESERVE_STEP
        self.applied += 1
        self.term = term
        self.now = max(self.now, entry["now"])
        for key in [k for k, lease in self.leases.items() if lease.expires_at <= self.now]:
            del self.leases[key]
            self.revision += 1
            self.expired += 1
        for cid in [
            c for c, s in self.sessions.items() if s.last_seen + CLIENT_IDLE_MS <= self.now
        ]:
            del self.sessions[cid]

        op = entry["op"]
        if op == "tick":
            return {"ok": True, "now": self.now}
        if op == "holder":
            holder = self.public(entry["key"])
            return {"ok": True, "holder": holder, "now": self.now, "revision": self.revision}
        if op == "leases":
            prefix = entry.get("prefix", "")
            limit = entry.get("limit", 1000)
            keys = sorted(k for k in self.leases if k.startswith(prefix))[:limit]
            return {"ok": True, "leases": [self.public(k) for k in keys], "now": self.now}

        cid, seq, ack = entry["cid"], entry["seq"], entry["ack"]
        session = self.sessions.get(cid)
        if session is None:
            if ack > 1:
                return {"ok": False, "code": "SESSION_EXPIRED"}
            session = self.sessions[cid] = ModelSession(self.now)
        session.last_seen = self.now
        session.acked = max(session.acked, ack)
        session.results = {s: r for s, r in session.results.items() if s >= session.acked}
        if seq < session.acked:  # answered and acknowledged long ago: a late copy
            return {"ok": False, "code": "BAD_REQUEST"}
        if seq in session.results:
            return session.results[seq]
        result = self._mutate(op, entry)
        session.results[seq] = result
        return result

    def _mutate(self, op: str, entry: Entry) -> Result:
        key = entry["key"]
        lease = self.leases.get(key)
        if op == "acquire":
            if lease is not None:
                detail = {
                    "owner": lease.owner,
                    "token": lease.token,
                    "remaining": (lease.expires_at - self.now) / 1000.0,
                    "waiting": 0,  # this model never queues (wait is 0)
                }
                return {"ok": False, "code": "LEASE_HELD", "detail": detail}
            self.revision += 1
            ttl = entry["ttl"]
            lease = ModelLease(entry["owner"], entry["lid"], self.revision, self.now + ttl, ttl)
            self.leases[key] = lease
            return self._granted(key, lease)
        if lease is None:
            return {"ok": False, "code": "LEASE_NOT_FOUND"}
        if lease.lease_id != entry["lid"]:
            detail = {"owner": lease.owner, "token": lease.token}
            return {"ok": False, "code": "NOT_OWNER", "detail": detail}
        self.revision += 1
        if op == "release":
            del self.leases[key]
            return {"ok": True, "key": key, "token": lease.token, "revision": self.revision}
        ttl = entry.get("ttl") or lease.ttl
        lease = lease._replace(ttl=ttl, expires_at=self.now + ttl)
        self.leases[key] = lease
        return self._granted(key, lease)

    def _granted(self, key: str, lease: ModelLease) -> Result:
        return {
            "ok": True,
            "key": key,
            "owner": lease.owner,
            "token": lease.token,
            "lease_id": lease.lease_id,
            "ttl": lease.ttl,
            "expires_at": lease.expires_at,
            "now": self.now,
            "revision": self.revision,
        }


def strip(result: Result) -> Result:
    return {k: v for k, v in result.items() if k != "message"}


# -------------------------------------------------------------------- generation


@dataclass
class Step:
    entry: Any
    malformed: bool


@dataclass
class Client:
    """What a client library keeps: its session, its unanswered requests, its leases."""

    name: str
    generation: int = 0
    next_seq: int = 1
    outstanding: dict[int, Entry] = field(default_factory=dict)
    lids: list[tuple[str, str]] = field(default_factory=list)

    @property
    def cid(self) -> str:
        return f"{self.name}.{self.generation}"

    def ack(self) -> int:
        """Every seq below this has been answered."""
        return min(self.outstanding, default=self.next_seq)


def _malformed(now: int, term: int) -> list[Any]:
    good: Entry = {
        "op": "acquire",
        "now": now,
        "term": term,
        "key": "a",
        "owner": "mallory",
        "ttl": 10,
        "lid": "LM",
        "cid": "mal",
        "seq": 1,
        "ack": 1,
    }

    def bad(**changes: Any) -> Entry:
        return {**good, **changes}

    missing_lid = dict(good)
    del missing_lid["lid"]
    return [
        None,
        ["acquire"],
        "tick",
        {"now": now},
        {"op": "steal", "now": now},
        {"op": ["tick"], "now": now},
        {"op": "tick"},
        {"op": "tick", "now": -1},
        {"op": "tick", "now": float(now)},
        {"op": "tick", "now": True},
        {"op": "tick", "now": now, "term": -1},
        bad(ttl=0),
        bad(ttl=-1),
        bad(ttl=1.0),
        bad(ttl=math.nan),
        bad(ttl=True),
        bad(ttl=MAX_TTL_MS + 1),
        bad(key=""),
        bad(key="k" * 5000),
        bad(owner=""),
        bad(owner=7),
        bad(cid=""),
        bad(seq=0),
        bad(seq=True),
        bad(ack=0),
        missing_lid,
        {**good, "op": "renew", "ttl": 0},
        {"op": "holder", "now": now, "key": ""},
        {"op": "leases", "now": now, "prefix": 3},
        {"op": "leases", "now": now, "limit": 0},
    ]


CLOCK_STEPS = (0, 0, 1, 1, 2, 3, 5, 8, 13, 21)
KINDS: tuple[str, ...] = (
    *["acquire"] * 5,
    *["renew"] * 3,
    *["release"] * 2,
    *["retry"] * 4,
    *["late"] * 2,
    *["holder"] * 2,
    "tick",
    "leases",
    "malformed",
    "restart",
)


class Dice:
    """Turns one drawn integer into many small choices.

    Generation cost is dominated by Hypothesis draws, so each log entry is built from a
    single drawn integer. Hypothesis favours small integers, which would leave every
    later choice at 0, so the value is scrambled first (the splitmix64 finaliser, a
    bijection on 64 bits that keeps 0 at 0: a shrunk seed still picks the first option
    of every choice, an acquire on key "a" with no clock movement).
    """

    MASK = 2**64 - 1

    def __init__(self, value: int) -> None:
        z = value & self.MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self.MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self.MASK
        self.value = z ^ (z >> 31)

    def roll(self, sides: int) -> int:
        self.value, face = divmod(self.value, sides)
        return face

    def pick(self, options: Sequence[T]) -> T:
        return options[self.roll(len(options))]

    def chance(self, one_in: int) -> bool:
        return self.roll(one_in) == 0


def build_log(seeds: list[int], jumps: bool) -> list[Step]:
    """A log as a leader would build it; ``jumps`` adds idle gaps that evict sessions."""
    clients = [Client(f"c{i}") for i in range(CLIENTS)]
    clock = 0
    term = 1
    lid_counter = 0
    steps: list[Step] = []
    sent: list[Entry] = []  # every mutating entry so far, for late duplicates
    for seed in seeds:
        dice = Dice(seed)
        kind = dice.pick(KINDS)
        client = dice.pick(clients)
        clock += dice.pick(CLOCK_STEPS)
        if jumps and dice.chance(60):
            clock += CLIENT_IDLE_MS + dice.roll(11) - 5
        if dice.chance(20):
            term += 1
        now, entry_term = clock, term
        stamp = dice.roll(10)
        if stamp == 1:  # a stamp a little behind log time
            now = max(0, clock - 1 - dice.roll(60))
        elif stamp == 2 and term > 1:  # a deposed leader whose clock runs ahead
            now, entry_term = clock + dice.roll(201), term - 1
        header = {"now": now, "term": entry_term}

        if kind == "retry":
            waiting = [c for c in clients if c.outstanding]
            if not waiting:
                kind = "tick"
            else:
                client = dice.pick(waiting)
                seq = dice.pick(sorted(client.outstanding))
                body = client.outstanding[seq]
                entry = {**body, **header, "cid": client.cid, "seq": seq, "ack": client.ack()}
                if dice.chance(2):
                    del client.outstanding[seq]  # this time the answer arrives
                sent.append(entry)
                steps.append(Step(entry, malformed=False))
                continue
        if kind == "late":
            # A copy of an earlier request reaches the log late (a deposed leader's
            # proposal, a network duplicate), with the ack it was sent with: verbatim,
            # or re-stamped by the current leader.
            if not sent:
                kind = "tick"
            else:
                entry = dice.pick(sent)
                if dice.chance(2):
                    entry = {**entry, **header}
                steps.append(Step(entry, malformed=False))
                continue
        if kind == "tick":
            steps.append(Step({"op": "tick", **header}, malformed=False))
        elif kind == "holder":
            steps.append(Step({"op": "holder", "key": dice.pick(KEYS), **header}, False))
        elif kind == "leases":
            extra: Entry = {}
            if dice.chance(2):
                extra["prefix"] = dice.pick(["", "a", "b", "z"])
            if dice.chance(2):
                extra["limit"] = 1 + dice.roll(4)
            steps.append(Step({"op": "leases", **extra, **header}, malformed=False))
        elif kind == "malformed":
            steps.append(Step(dice.pick(_malformed(now, entry_term)), malformed=True))
        elif kind == "restart":  # the client process restarts with a fresh session
            client.generation += 1
            client.next_seq = 1
            client.outstanding.clear()
            client.lids.clear()
            steps.append(Step({"op": "tick", **header}, malformed=False))
        else:
            lid_counter += 1
            if kind == "acquire":
                key = dice.pick(KEYS)
                lid = f"L{lid_counter}"
                client.lids.append((key, lid))
                owner = dice.pick(OWNERS)
                ttl = 1 + dice.roll(50)
                body = {"op": "acquire", "key": key, "owner": owner, "ttl": ttl, "lid": lid}
            else:
                if client.lids and not dice.chance(4):
                    key, lid = dice.pick(client.lids[-3:])
                else:  # a lease id that is not this key's (a stranger, or a stale one)
                    key, lid = dice.pick(KEYS), f"X{lid_counter}"
                body = {"op": kind, "key": key, "lid": lid}
                if kind == "renew" and dice.chance(2):
                    body["ttl"] = 1 + dice.roll(50)
            seq, ack = client.next_seq, client.ack()
            client.next_seq += 1
            entry = {**body, **header, "cid": client.cid, "seq": seq, "ack": ack}
            if dice.chance(2):  # the answer is lost; the client will retry
                client.outstanding[seq] = body
            sent.append(entry)
            steps.append(Step(entry, malformed=False))
    return steps


_SEED = st.integers(0, 2**64 - 1)
# Draw the length first: a plain st.lists averages only a handful of elements.
_SEEDS = st.integers(1, MAX_STEPS).flatmap(lambda n: st.lists(_SEED, min_size=n, max_size=n))


def scenarios(jumps: bool) -> st.SearchStrategy[list[Step]]:
    return _SEEDS.map(lambda seeds: build_log(seeds, jumps))


def run(store: LeaseStore, steps: list[Step]) -> list[Result]:
    return [store.apply(step.entry) for step in steps]


def through_msgpack(store: LeaseStore) -> LeaseStore:
    packed = msgpack.packb(store.to_plain())
    return LeaseStore.from_plain(msgpack.unpackb(packed, strict_map_key=False))


# -------------------------------------------------------------------- properties


@SETTINGS
@given(steps=scenarios(jumps=True))
def test_store_agrees_with_the_model_and_tokens_increase(steps: list[Step]) -> None:
    """(a) at most one holder per key, the model's; (b) fencing tokens increase."""
    store, model = LeaseStore(), Model()
    seen: set[tuple[str, int]] = set()
    grants: list[int] = []
    last_token: dict[str, int] = {}
    for step in steps:
        if step.malformed:
            before = store.to_plain()
            result = store.apply(step.entry)
            assert result["ok"] is False and result["code"] == "BAD_REQUEST", result
            assert store.to_plain() == before
            continue
        result = store.apply(step.entry)
        assert strip(result) == model.apply(step.entry), step.entry
        if not result["ok"]:
            assert result["code"] in errors.CODES

        entry = step.entry
        if entry["op"] in MUTATING and result.get("code") not in NOT_APPLIED:
            request = (entry["cid"], entry["seq"])
            if entry["op"] == "acquire" and result["ok"] and request not in seen:
                grants.append(result["token"])
            seen.add(request)

        assert (store.now, store.term, store.revision) == (model.now, model.term, model.revision)
        assert (store.applied, store.expired_total) == (model.applied, model.expired)
        assert {c: (s.acked, sorted(s.results)) for c, s in store.clients.items()} == {
            c: (s.acked, sorted(s.results)) for c, s in model.sessions.items()
        }
        listed = store.list_leases(limit=100)
        assert len({x["key"] for x in listed}) == len(listed)
        for key in KEYS:
            public = store.holder(key)
            assert public == model.public(key)
            if public is not None:
                assert public["token"] >= last_token.get(key, 0)
                last_token[key] = public["token"]
    assert all(a < b for a, b in itertools.pairwise(grants)), grants


@SETTINGS
@given(steps=scenarios(jumps=False))
def test_a_retried_request_is_never_applied_twice(steps: list[Step]) -> None:
    """(e) a duplicate ``(cid, seq)`` gets the first result back and changes nothing."""
    store = LeaseStore()
    first: dict[tuple[str, int], Result] = {}
    fresh_changes = 0
    jumps = 0
    granted_tokens: list[int] = []
    for step in steps:
        entry = step.entry
        mutating = not step.malformed and entry["op"] in MUTATING
        request = (entry["cid"], entry["seq"]) if mutating else None
        revision, leases = store.revision, store.to_plain()["leases"]
        expired, term, ceiling = store.expired_total, store.term, store.ceiling
        result = store.apply(entry)
        if store.term > term:  # a new term's first entry jumps past the old ceiling
            jumps += max(0, ceiling - revision)
            revision = max(revision, ceiling)
        if request is None:
            continue
        if request in first or result.get("code") in NOT_APPLIED:
            # A copy of an applied request gets its first result back, or is refused
            # (a late copy of an acknowledged one, a deposed leader's): either way
            # nothing but expiry (log time moving on) may change the state.
            if request in first and result.get("code") not in ("BAD_REQUEST", "NOT_LEADER"):
                assert result == first[request]
            assert store.revision - revision == store.expired_total - expired
            if store.expired_total == expired:
                assert store.to_plain()["leases"] == leases
        else:
            first[request] = result
            if result["ok"]:
                fresh_changes += 1
                if entry["op"] == "acquire":
                    granted_tokens.append(result["token"])
    assert store.revision == fresh_changes + store.expired_total + jumps
    assert len(granted_tokens) == len(set(granted_tokens))


@SETTINGS
@given(steps=scenarios(jumps=True))
def test_replaying_the_log_gives_the_same_state_and_results(steps: list[Step]) -> None:
    """(c) the state machine is deterministic."""
    one, two = LeaseStore(), LeaseStore()
    results_one = run(one, steps)
    results_two = run(two, steps)
    assert results_two == results_one
    assert two.to_plain() == one.to_plain()
    assert msgpack.packb(two.to_plain()) == msgpack.packb(one.to_plain())


@SETTINGS
@given(steps=scenarios(jumps=True), cut=st.integers(0, MAX_STEPS))
def test_snapshot_and_restore_anywhere_changes_nothing(steps: list[Step], cut: int) -> None:
    """(d) restoring a msgpack snapshot mid-log and applying the rest is invisible."""
    cut = min(cut, len(steps))
    straight = LeaseStore()
    expected = run(straight, steps)

    head = LeaseStore()
    assert run(head, steps[:cut]) == expected[:cut]
    restored = through_msgpack(head)
    assert restored.to_plain() == head.to_plain()
    assert restored.next_deadline() == (
        min(lease.expires_at for lease in head.leases.values()) if head.leases else None
    )
    assert run(restored, steps[cut:]) == expected[cut:]
    assert restored.to_plain() == straight.to_plain()


# ------------------------------------------------------------------ never raises

_FIELDS = ("op", "now", "term", "key", "owner", "ttl", "lid", "cid", "seq", "ack", "prefix")
_ODD_TEXT = st.sampled_from(["", "\ud800", "a\udfff", "é" * 2100, "k" * 4097, "acquire"])
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    _ODD_TEXT,
    st.binary(max_size=4),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)
_TEMPLATES: dict[str, Entry] = {
    "acquire": {"key": "a", "owner": "o", "ttl": 20, "lid": "L2"},
    "renew": {"key": "a", "lid": "L", "ttl": 20},
    "release": {"key": "a", "lid": "L"},
    "holder": {"key": "a"},
    "leases": {"prefix": "", "limit": 5},
    "tick": {},
}


@st.composite
def _near_valid(draw: st.DrawFn) -> Entry:
    """A well-formed entry with zero to two fields replaced by odd values or removed."""
    op = draw(st.sampled_from(sorted(_TEMPLATES)))
    entry: Entry = {"op": op, "now": draw(st.integers(0, 100)), **_TEMPLATES[op]}
    if op in ("acquire", "renew", "release"):
        entry.update(cid="c1", seq=draw(st.integers(1, 3)), ack=draw(st.integers(1, 3)))
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(sorted({*entry, "term", "limit", "prefix", "ttl"})))
        if draw(st.integers(0, 4)) == 0:
            entry.pop(name, None)
        else:
            entry[name] = draw(st.one_of(_ODD_TEXT, _SCALARS, _VALUES))
    return entry


_ENTRIES = st.one_of(
    _VALUES,
    st.dictionaries(
        st.sampled_from((*_FIELDS, "limit")),
        st.one_of(_VALUES, st.integers(0, 3), st.sampled_from(["a", "c1"])),
    ),
    _near_valid(),
    _near_valid(),
)


@SETTINGS
@given(entries=st.lists(_ENTRIES, max_size=10))
@example(
    entries=[
        {"op": ["tick"], "now": 1},
        {"op": {"tick": 1}, "now": 1},
        {"op": "holder", "now": 1, "key": "\ud800"},
        {"op": "leases", "now": 1, "prefix": "a\udfff"},
        {"op": "acquire", "now": 1, **_TEMPLATES["acquire"], "cid": "c2", "seq": 1, "ack": 1}
        | {"owner": "\ud83d"},
    ]
)
# Found by the randomized search (it failed one CI run in two): an acquire reusing the
# lease id "L" of the live lease below, from another client and from the same client
# with an older seq. It was refused with BAD_REQUEST after log time, ``applied`` and
# the client's dedup table had moved; a refused entry now changes nothing.
@example(
    entries=[
        {"op": "acquire", "now": 5, **_TEMPLATES["acquire"], "lid": "L"}
        | {"cid": "c2", "seq": 1, "ack": 1},
        {"op": "acquire", "now": 6, **_TEMPLATES["acquire"], "lid": "L"}
        | {"cid": "c1", "seq": 2, "ack": 1},
        {"op": "acquire", "now": 60, **_TEMPLATES["acquire"], "lid": "L"}
        | {"cid": "c1", "seq": 3, "ack": 1},
    ]
)
def test_apply_never_raises_and_bad_requests_change_nothing(entries: list[Any]) -> None:
    store = LeaseStore()
    store.apply(
        {"op": "acquire", "now": 1, "key": "a", "owner": "o", "ttl": 50, "lid": "L"}
        | {"cid": "c1", "seq": 1, "ack": 1}
    )
    for entry in entries:
        before = store.to_plain()
        result = store.apply(entry)
        assert isinstance(result, dict)
        assert isinstance(result.get("ok"), bool)
        if not result["ok"]:
            assert result["code"] in errors.CODES
            if result["code"] == "BAD_REQUEST" and "acknowledged" not in result["message"]:
                assert store.to_plain() == before
        msgpack.packb(result)  # every result can go back over the wire
    assert through_msgpack(store).to_plain() == store.to_plain()
