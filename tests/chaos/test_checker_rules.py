"""Checks that can fail: each rule of the chaos checkers on a hand-made bad history.

A checker that has never failed on the bug it exists for proves nothing. Each test
below feeds ``checker.check`` (or one checker) a small history that breaks one rule
and shows the verdict is a failure, or ``unknown`` where the history is malformed or
incomplete: never a pass. The histories are otherwise complete (a healed fault with
progress after it, replicas that agree), so the verdict comes from the rule under test.

Rules (issue "Checks that can fail"):

1. an ``ok`` acquire without a token makes the history malformed (unknown);
2. a completion with no matching invocation is reported (unknown);
3. an ``ok`` renew without ``valid_until`` or ``ttl`` is malformed (unknown);
4. a shared key is one whose holders were granted with capacity > 1, not one a
   refused acquire asked about (its stale-read and linearizability checks stay on);
5. no final state, no replay, or a partial replay is unknown; replicas whose whole
   state differs at one index diverged (and the offline replay reads PySyncObj's
   formats as PySyncObj writes them);
6. a fault that never healed, or no heal measured, is not a liveness pass;
7. the fenced resource's rules judge raftlease's answers: a repeated token, a lower
   token after a higher one, a replaced holder called current, a live holder denied;
and the volume check fails a run that did nothing.
"""

from __future__ import annotations

import gzip
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

SUITE = Path(__file__).resolve().parents[2] / "jepsen-style"
sys.path.insert(0, str(SUITE))

import checker  # noqa: E402
import replay  # noqa: E402
import watch_checker  # noqa: E402
from workload import FencedStore, History  # noqa: E402

from raftlease.core import LeaseStore  # noqa: E402

pytestmark = pytest.mark.timeout(60)

RHO, MARGIN = 0.01, 0.05
Event = dict[str, Any]


class Hist:
    """A hand-made history (times in seconds from 0; a 1 s lease acquired by an op
    invoked at ``t`` is trusted until ``t + 0.94``)."""

    def __init__(self, **meta: Any) -> None:
        self.events: list[Event] = [
            {"type": "meta", "t": 0.0, "rho": RHO, "margin": MARGIN, "liveness_bound": 5.0, **meta}
        ]
        self.n = 0

    def add(self, event: Event) -> Event:
        event["i"] = len(self.events)
        self.events.append(event)
        return event

    def op(
        self,
        p: str,
        f: str,
        key: str,
        inv: float,
        ret: float | None,
        type: str = "ok",
        args: dict[str, Any] | None = None,
        value: dict[str, Any] | None = None,
        error: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> str:
        self.n += 1
        op = f"{p}:{self.n}"
        base = {"op": op, "process": p, "f": f, "key": key}
        self.add({**base, "type": "invoke", "t": inv, "value": args or {}})
        if ret is not None:
            done: Event = {**base, "type": type, "t": ret, "value": value or {}}
            if error:
                done["error"] = error
            if detail:
                done["detail"] = detail
            self.add(done)
        return op

    def acquire(
        self,
        p: str,
        key: str,
        inv: float,
        ret: float,
        token: int | None,
        ttl: float = 1.0,
        capacity: int | None = None,
    ) -> str:
        args: dict[str, Any] = {"ttl": ttl, "owner": p}
        if capacity is not None:
            args.update(capacity=capacity, units=1)
        value: dict[str, Any] = {
            "owner": p,
            "ttl": ttl,
            "valid_until": inv + ttl * (1 - RHO) - MARGIN,
        }
        if token is not None:
            value["token"] = token
        return self.op(p, "acquire", key, inv, ret, args=args, value=value)

    def read(
        self,
        p: str,
        key: str,
        inv: float,
        ret: float,
        token: int | None = None,
        owner: str | None = None,
    ) -> str:
        holder = None if token is None else {"token": token, "owner": owner}
        return self.op(p, "read", key, inv, ret, value={"holder": holder, "consistency": "log"})

    def release(self, p: str, key: str, inv: float, ret: float, token: int) -> str:
        return self.op(p, "release", key, inv, ret, args={"token": token})

    def fenced(
        self,
        p: str,
        key: str,
        t: float,
        token: int,
        accepted: bool,
        f: str = "write",
        highest: int = 0,
        cluster: bool | None = None,
        asked: tuple[float, float] | None = None,
        refused_by: str | None = None,
    ) -> None:
        """A fenced access as ``workload.FencedStore`` records it; ``cluster``: the
        cluster's answer to the write's ``fence`` call made during ``asked``."""
        event: Event = {
            "type": "fenced",
            "t": t,
            "process": p,
            "key": key,
            "token": token,
            "f": f,
            "accepted": accepted,
            "highest": highest,
            "before": 0,
            "value": 1 if f == "write" else None,
            "after": 1 if accepted and f == "write" else 0,
            "for_write": f == "write",
        }
        if cluster is not None:
            inv, ret = asked or (t - 0.005, t - 0.001)
            event["cluster"] = {"inv": inv, "ret": ret, "current": cluster}
        if refused_by is not None:
            event["refused_by"] = refused_by
        self.add(event)

    def fault(self, kind: str, start: float, stop: float | None, fid: int) -> None:
        self.add({"type": "nemesis", "f": "start", "fault": kind, "id": fid, "t": start})
        if stop is not None:
            self.add({"type": "nemesis", "f": "stop", "fault": kind, "id": fid, "t": stop})

    def final(self, digests: dict[str, str] | None = None, replay: bool = True) -> None:
        digests = digests or {n: "d" * 64 for n in ("n1", "n2", "n3")}
        event: Event = {
            "type": "final",
            "t": 99.0,
            "converged": True,
            "waited": 15.0,
            "nodes": {
                n: {"applied_index": 50, "revision": 7, "log_time": 1, "leases": 0, "sessions": 0}
                for n in digests
            },
        }
        if replay:
            event["replay"] = {
                "index": 50,
                "nodes": {n: {"index": 50, "digest": d} for n, d in digests.items()},
                "log_conflicts": [],
                "problems": [],
            }
        self.add(event)

    def complete(self, final: bool = True) -> Hist:
        """A fault healed after everything else with progress after it, and (unless
        ``final`` is False) a final state in which the replicas agree."""
        end = max(e["t"] for e in self.events)
        self.fault("kill-follower", end + 1.0, end + 1.5, fid=99)
        self.read("z", "zz", end + 1.6, end + 1.61)
        if final:
            self.final()
        return self

    def check(self, **kwargs: Any) -> dict[str, Any]:
        return checker.check(self.events, **kwargs)


def verdicts(result: dict[str, Any]) -> dict[str, Any]:
    return {name: r["valid"] for name, r in result["checkers"].items()}


def problems(result: dict[str, Any]) -> list[str]:
    return [p["kind"] for p in result["checkers"]["history"]["unknown"]]


def test_a_complete_correct_history_passes() -> None:
    """The baseline the tests below break: every checker passes it."""
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    h.release("a", "k", 0.3, 0.31, token=1)
    h.acquire("b", "k", 0.4, 0.41, token=2)
    h.read("c", "k", 0.5, 0.51, token=2, owner="b")
    result = h.complete().check()
    assert verdicts(result) == dict.fromkeys(verdicts(result), True), result
    assert result["valid"] is True


# ----------------------------------------------------- 1-3: malformed histories


def test_rule1_ok_acquire_without_a_token_is_unknown_not_a_pass() -> None:
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=None)
    h.acquire("b", "k", 0.5, 0.51, token=None)  # overlaps a's window: invisible without tokens
    result = h.complete().check()
    assert result["valid"] == "unknown", verdicts(result)
    assert problems(result) == ["ok acquire without a token"] * 2
    # The same two holders with their tokens: a violation.
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    h.acquire("b", "k", 0.5, 0.51, token=2)
    assert h.complete().check()["checkers"]["mutual_exclusion"]["valid"] is False


def test_rule2_completion_without_an_invocation_is_reported() -> None:
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    h.add(  # b's grant of k, its invocation lost: pairing would drop it
        {
            "type": "ok",
            "op": "b:77",
            "process": "b",
            "f": "acquire",
            "key": "k",
            "t": 0.51,
            "value": {"token": 2, "ttl": 1.0, "valid_until": 1.44},
        }
    )
    result = h.complete().check()
    assert result["valid"] == "unknown", verdicts(result)
    assert problems(result) == ["completion without an invocation"]
    assert result["checkers"]["history"]["unknown"][0]["event"]["op"] == "b:77"


def test_rule2_second_completion_and_completion_before_invocation_are_reported() -> None:
    h = Hist()
    op = h.acquire("a", "k", 1.0, 1.01, token=1)
    h.add({"type": "info", "op": op, "process": "a", "f": "acquire", "key": "k", "t": 1.2})
    h.op("b", "read", "k", 2.0, 1.5, value={"holder": None})
    kinds = problems(h.complete().check())
    assert "second completion" in kinds and "completion before its invocation" in kinds


def test_rule3_ok_renew_without_valid_until_or_ttl_is_unknown() -> None:
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    # The renew says nothing of its window: it would get an empty holding interval and
    # b's grant at 1.2 would look fine whatever the renew really gave a.
    h.op("a", "renew", "k", 0.8, 0.81, args={"token": 1}, value={"token": 1})
    h.acquire("b", "k", 1.2, 1.21, token=2)
    result = h.complete().check()
    assert result["valid"] == "unknown", verdicts(result)
    assert problems(result) == ["ok renew without valid_until or ttl (no holding window)"]


def test_unknown_operations_and_malformed_events_are_reported() -> None:
    h = Hist()
    h.op("a", "steal", "k", 0.0, 0.01)
    h.add({"type": "fenced", "t": 0.1, "process": "a", "key": "k", "f": "write"})  # no token
    h.add({"type": "keepalive", "t": 0.2, "process": "a"})
    h.add({"type": "nemesis", "f": "stop", "fault": "bridge", "id": 5, "t": 0.3})
    kinds = problems(h.complete().check())
    assert {
        "unknown operation",
        "malformed fenced access",
        "malformed keepalive",
        "fault stop without a start",
    } <= set(kinds)


def test_a_history_without_meta_is_unknown() -> None:
    h = Hist()
    h.events.pop(0)
    h.acquire("a", "k", 0.0, 0.01, token=1)
    assert problems(h.complete().check()) == ["no meta event"]


# ------------------------------------------------------------ 4: shared keys


def test_rule4_a_refused_capacity_request_does_not_make_a_plain_key_shared() -> None:
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    h.op(  # someone asks for k as a semaphore of 2, and is refused
        "x",
        "acquire",
        "k",
        0.05,
        0.06,
        type="fail",
        args={"ttl": 1.0, "owner": "x", "capacity": 2, "units": 1},
        error="CAPACITY_MISMATCH",
    )
    h.release("a", "k", 0.1, 0.11, token=1)
    h.acquire("b", "k", 0.2, 0.21, token=4)
    h.read("r", "k", 0.5, 0.51, token=1, owner="a")  # stale: b's grant (token 4) completed at 0.21
    result = h.complete().check()
    assert result["shared_keys"] == {}
    assert result["checkers"]["no_lost_grant"]["valid"] is False
    assert result["checkers"]["linearizable"]["valid"] is False
    assert result["checkers"]["linearizable"]["skipped_shared_keys"] == []


def test_rule4_a_key_granted_with_capacity_above_one_is_shared() -> None:
    h = Hist()
    h.acquire("a", "s", 0.0, 0.01, token=1, capacity=2)
    h.acquire("b", "s", 0.2, 0.21, token=2, capacity=2)
    h.read("r", "s", 0.3, 0.31, token=2, owner="b")  # names the newest holder only
    result = h.complete().check()
    assert result["shared_keys"] == {"s": 2}
    assert result["valid"] is True, verdicts(result)
    # Granted, not asked: an unanswered acquire with capacity 2 shares nothing.
    ops = checker.pair_ops(
        [
            {
                "type": "invoke",
                "op": "x:1",
                "process": "x",
                "f": "acquire",
                "key": "k",
                "t": 0.0,
                "value": {"ttl": 1.0, "capacity": 2},
            }
        ]
    )
    assert checker.shared_keys(ops) == {}


# ----------------------------------------------------------------- 5: replicas


def test_rule5_no_final_state_is_unknown() -> None:
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    result = h.complete(final=False).check()
    assert result["checkers"]["replicas"]["valid"] == "unknown"
    assert result["valid"] == "unknown"


def test_rule5_a_final_state_without_the_whole_state_compared_is_unknown() -> None:
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    h.complete(final=False)
    h.final(replay=False)  # live counters agree, but the whole state was never compared
    result = h.check()
    assert result["checkers"]["replicas"]["valid"] == "unknown"
    assert result["checkers"]["replicas"]["unknown"][0]["kind"].startswith("whole state")


def test_rule5_replicas_with_different_whole_states_diverged() -> None:
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    h.complete(final=False)
    # The four status counters agree; the states do not (a lease's owner, say).
    h.final(digests={"n1": "a" * 64, "n2": "b" * 64, "n3": "a" * 64})
    replicas = h.check()["checkers"]["replicas"]
    assert replicas["valid"] is False
    v = replicas["violations"][0]
    assert v["kind"] == "replicas diverged" and v["compared"] == "whole state"


def test_rule5_a_replay_that_missed_a_node_or_hit_a_problem_is_unknown() -> None:
    for change in ("missing", "problem"):
        h = Hist()
        h.acquire("a", "k", 0.0, 0.01, token=1)
        h.complete(final=False)
        h.final()
        rebuilt = h.events[-1]["replay"]
        if change == "missing":
            del rebuilt["nodes"]["n3"]
        else:
            rebuilt["problems"].append("n2: unreadable dump")
        assert h.check()["checkers"]["replicas"]["valid"] == "unknown", change


# Offline replay of real PySyncObj files: written with PySyncObj's own journal class and
# its dump layout, read back by replay.py (which never writes).

APPLY_ENTRY_ID = 7  # PySyncObj's id of the replicated method (any int: one method)


def _command(entry: dict[str, Any]) -> bytes:
    """A regular command as ``@replicated`` encodes it: type byte 0, then the pickled
    call ``(method_id, (msgpack entry bytes,))`` (PySyncObj pickles with protocol 2)."""
    data = msgpack.packb(entry, use_bin_type=True)
    return b"\x00" + pickle.dumps((APPLY_ENTRY_ID, (data,)), 2)


def _entries(owner_b: str = "b") -> list[dict[str, Any]]:
    base = {"cid": "c" * 32, "ack": 1, "term": 1}
    return [
        {"op": "tick", "term": 1, "now": 0},
        {
            **base,
            "op": "acquire",
            "key": "k1",
            "owner": "a",
            "ttl": 5000,
            "seq": 1,
            "lid": "1" * 32,
            "now": 10,
        },
        {
            **base,
            "op": "acquire",
            "key": "k2",
            "owner": owner_b,
            "ttl": 5000,
            "seq": 2,
            "lid": "2" * 32,
            "now": 20,
        },
        {"op": "tick", "term": 1, "now": 30},
    ]


def _write_node(
    directory: Path,
    entries: list[dict[str, Any]],
    dump_after: int = 0,
    commit_index: int | None = None,
    last_term: int = 1,
) -> None:
    """A node's data directory: journal index 1 and 2 are no-ops (as PySyncObj starts
    a log and a leader its term), then ``entries``; with ``dump_after``, a full dump of
    the state after that many entries and the journal compacted to start at it."""
    from pysyncobj.journal import FileJournal
    from pysyncobj.node import TCPNode

    directory.mkdir(parents=True)
    log = [(b"\x01", 1, 0), (b"\x01", 2, 1)]
    log += [(_command(e), 3 + n, 1) for n, e in enumerate(entries)]
    log[-1] = (log[-1][0], log[-1][1], last_term)
    if dump_after:
        store = LeaseStore()
        for e in entries[:dump_after]:
            store.apply(e)
        last = log[1 + dump_after]
        data = [{"_SyncObj__enabledCodeVersion": 0}, msgpack.packb(store.to_plain())]
        dump = (data, last, log[dump_after], {TCPNode("127.0.0.1:1")})
        with gzip.open(directory / "raft.dump", "wb") as f:
            pickle.dump(dump, f, 2)
        log = log[dump_after:]  # compacted: starts at the dump's last two entries
    journal = FileJournal(str(directory / "raft.journal"))
    for command, index, term in log:
        journal.add(command, index, term)
    journal.setRaftCommitIndex(log[-1][1] if commit_index is None else commit_index)
    journal.onOneSecondTimer()  # stores the meta file
    journal._destroy()


def test_replay_reads_pysyncobj_files_and_finds_one_state(tmp_path: Path) -> None:
    _write_node(tmp_path / "n1", _entries())
    _write_node(tmp_path / "n2", _entries(), dump_after=3)  # from a dump, then one entry
    _write_node(tmp_path / "n3", _entries(), dump_after=4)  # all in the dump
    from pysyncobj.journal import FileJournal

    journal = FileJournal(str(tmp_path / "n1" / "raft.journal"))
    try:
        assert replay.read_journal(tmp_path / "n1" / "raft.journal") == [
            journal[i] for i in range(len(journal))
        ]
    finally:
        journal._destroy()
    out = replay.compare(tmp_path, ["n1", "n2", "n3"], {"n1": 6, "n2": 6, "n3": None})
    assert out["problems"] == [] and out["index"] == 6
    assert len({n["digest"] for n in out["nodes"].values()}) == 1, out
    expected = LeaseStore()
    for e in _entries():
        expected.apply(e)
    assert out["nodes"]["n1"]["digest"] == replay.digest(replay.canonical(expected.to_plain()))
    assert [out["nodes"][n]["replayed"] for n in ("n1", "n2", "n3")] == [4, 1, 0]


def test_replay_finds_a_replica_that_applied_another_entry(tmp_path: Path) -> None:
    _write_node(tmp_path / "n1", _entries())
    _write_node(tmp_path / "n2", _entries(owner_b="mallory"))  # index 5 differs
    _write_node(tmp_path / "n3", _entries(), dump_after=3)
    out = replay.compare(tmp_path, ["n1", "n2", "n3"], {"n1": 6, "n2": 6, "n3": 6})
    assert out["problems"] == []
    digests = {n: v["digest"] for n, v in out["nodes"].items()}
    assert digests["n1"] == digests["n3"] != digests["n2"]
    assert [c["index"] for c in out["log_conflicts"]] == [5]
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    h.complete(final=False)
    h.final()
    h.events[-1]["replay"] = out
    assert h.check()["checkers"]["replicas"]["valid"] is False


def test_replay_rebuilds_at_a_dump_taken_after_the_others_reported(tmp_path: Path) -> None:
    """n3 dumped index 6 after n1 and n2 said they had applied 5 (the leader writes on
    until the nodes stop): the replicas are compared at 6, the dump's committed index,
    since every node holding entry 6 has it in the same term."""
    _write_node(tmp_path / "n1", _entries(), commit_index=5)
    _write_node(tmp_path / "n2", _entries(), commit_index=5)
    _write_node(tmp_path / "n3", _entries(), dump_after=4)
    out = replay.compare(tmp_path, ["n1", "n2", "n3"], {"n1": 5, "n2": 5, "n3": None})
    assert out["problems"] == [] and out["index"] == 6, out
    assert len({n["digest"] for n in out["nodes"].values()}) == 1, out


def test_replay_does_not_move_to_a_dump_whose_entry_the_logs_disagree_on(tmp_path: Path) -> None:
    """Entry 6 in another term on n2: the logs may hold a stale tail, so no index
    replaces the committed one and the comparison is a problem (unknown)."""
    _write_node(tmp_path / "n1", _entries(), commit_index=5)
    _write_node(tmp_path / "n2", _entries(), commit_index=5, last_term=2)
    _write_node(tmp_path / "n3", _entries(), dump_after=4)
    out = replay.compare(tmp_path, ["n1", "n2", "n3"], {"n1": 5, "n2": 5, "n3": None})
    assert out["problems"] and out["problems"][0].startswith("cannot rebuild"), out


def test_replay_of_a_node_it_cannot_read_is_a_problem(tmp_path: Path) -> None:
    _write_node(tmp_path / "n1", _entries())
    (tmp_path / "n2").mkdir()
    (tmp_path / "n2" / "raft.journal").write_bytes(b"not a journal")
    out = replay.compare(tmp_path, ["n1", "n2"], {"n1": 6, "n2": 6})
    assert out["problems"] and out["problems"][0].startswith("n2:") and out["nodes"] == {}


# ----------------------------------------------------------------- 6: liveness


def test_rule6_a_fault_that_never_healed_is_not_a_liveness_pass() -> None:
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    h.complete()
    h.fault("split-majority", 20.0, None, fid=7)  # still on when the history ends
    live = h.check()["checkers"]["liveness"]
    assert live["valid"] == "unknown"
    assert any(u.get("kind", "").startswith("never healed") for u in live["unknown"])


def test_rule6_no_heal_measured_is_not_a_liveness_pass() -> None:
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    h.final()
    live = h.check()["checkers"]["liveness"]
    assert live["valid"] == "unknown" and live["stats"]["heals_measured"] == 0
    h = Hist()
    h.fault("kill-leader", 0.0, None, fid=1)  # started, never healed, nothing else
    h.final()
    assert h.check()["checkers"]["liveness"]["valid"] == "unknown"


# ------------------------------------------------------- 7: the fenced resource


def test_rule7_a_repeated_token_fails_the_resource_check() -> None:
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=5)
    h.acquire("b", "k", 0.02, 0.03, token=5)  # raftlease granted token 5 twice
    h.fenced("a", "k", 0.1, 5, True, cluster=True)
    h.fenced("b", "k", 0.2, 5, True, cluster=True)
    fencing = h.complete().check()["checkers"]["fencing"]
    kinds = {v["kind"] for v in fencing["violations"]}
    assert "two clients used one token" in kinds and "token handed out twice" in kinds


def test_rule7_a_lower_token_after_a_higher_one_fails_the_resource_check() -> None:
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=7)
    h.fenced("a", "k", 0.1, 7, True, cluster=True)
    h.release("a", "k", 0.2, 0.21, token=7)
    h.acquire("b", "k", 0.3, 0.31, token=3)  # raftlease: lower than a's
    # The cluster calls b's token current; the resource, which saw 7, refuses it.
    h.fenced("b", "k", 0.4, 3, False, highest=7, cluster=True, refused_by="resource")
    fencing = h.complete().check()["checkers"]["fencing"]
    kinds = [v["kind"] for v in fencing["violations"]]
    assert "the cluster's current token is below one the resource already accepted" in kinds


def test_rule7_a_stale_holders_write_accepted_fails_the_resource_check() -> None:
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)  # a trusts it until 0.94
    h.acquire("b", "k", 1.0, 1.01, token=2)  # a's lease ended; b holds k
    # a, paused past its lease, writes at 1.5 and the cluster calls token 1 current
    # (b had not touched the resource yet, so a max-token fence alone lets it in).
    h.fenced("a", "k", 1.5, 1, True, cluster=True, asked=(1.4, 1.45))
    fencing = h.complete().check()["checkers"]["fencing"]
    assert fencing["valid"] is False
    v = fencing["violations"][0]
    assert v["kind"].startswith("stale holder's write accepted") and v["newer"]["token"] == 2


def test_rule7_a_live_holder_denied_by_the_cluster_fails_the_resource_check() -> None:
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)  # certainly held until 0.94
    h.fenced("a", "k", 0.3, 1, False, cluster=False, refused_by="cluster", asked=(0.2, 0.25))
    fencing = h.complete().check()["checkers"]["fencing"]
    kinds = [v["kind"] for v in fencing["violations"]]
    assert kinds == ["the cluster denied a holder whose lease was certainly live"]
    # After its window, "not current" is the fence working: a late write refused.
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    h.fenced("a", "k", 1.5, 1, False, cluster=False, refused_by="cluster", asked=(1.4, 1.45))
    result = h.complete().check()
    assert result["checkers"]["fencing"]["valid"] is True
    assert result["volume"]["stats"]["late_writes_refused"] == 1


class FakeCluster:
    """Answers ``fence(key, token)`` like a cluster would; ``buggy`` calls every token
    current (a raftlease that never fences anyone off)."""

    def __init__(self, buggy: bool = False) -> None:
        self.current: dict[str, int] = {}
        self.buggy = buggy

    def fence(self, key: str, token: int) -> bool:
        return self.buggy or self.current.get(key) == token


def _grant(history: History, p: str, key: str, token: int, ttl: float = 1.0) -> None:
    """An ``ok`` acquire recorded now (the store's own events carry real times)."""
    inv = time.monotonic()
    base = {"op": f"{p}:{token}", "process": p, "f": "acquire", "key": key}
    history.append({**base, "type": "invoke", "t": inv, "value": {"ttl": ttl, "owner": p}})
    value = {"token": token, "ttl": ttl, "valid_until": inv + ttl * (1 - RHO) - MARGIN}
    history.append({**base, "type": "ok", "t": time.monotonic(), "value": value})


def test_rule7_the_resource_asks_the_cluster_so_its_answers_are_judged() -> None:
    for buggy in (False, True):
        history = History()
        history.append({"type": "meta", "rho": RHO, "margin": MARGIN, "fence": "cluster"})
        cluster = FakeCluster(buggy)
        store = FencedStore(history, cluster=cluster.fence)
        _grant(history, "a", "k", 1, ttl=0.1)  # trusted for 0.049 s
        cluster.current["k"] = 1
        assert store.access("a", "k", 1, "read", for_write=True)[0]
        assert store.access("a", "k", 1, "write", 1)[0]
        time.sleep(0.06)  # a's lease ends
        _grant(history, "b", "k", 2)
        cluster.current["k"] = 2
        # a was paused past its lease; b has not written yet, so only the cluster's
        # answer can refuse a's late write.
        accepted, _ = store.access("a", "k", 1, "write", 2)
        assert accepted is buggy
        last = history.events[-1]
        assert last["cluster"]["current"] is buggy
        if not buggy:
            assert last["refused_by"] == "cluster"
        fencing = checker.check(history.events)["checkers"]["fencing"]
        assert fencing["valid"] is (not buggy), fencing["violations"]
        if buggy:
            assert fencing["violations"][0]["kind"].startswith("stale holder's write accepted")


def test_the_resource_fence_is_raftleases_fenced_resource() -> None:
    history = History()
    store = FencedStore(history, cluster=lambda key, token: True)
    assert store.access("b", "k", 5, "write", 1)[0]
    accepted, _ = store.access("a", "k", 4, "write", 2)  # the cluster says yes, the fence no
    assert not accepted and history.events[-1]["refused_by"] == "resource"
    assert store.max_token == {"k": 5}


# ----------------------------------------------------------------------- volume


CI_LIKE = [{"kind": k} for k in ("isolate-leader", "kill-leader", "pause-client")]


def _volume(events: list[Event]) -> dict[str, Any]:
    req = checker.VolumeRequirements.from_meta(events, min_grants=2)
    ops = checker.pair_ops(events)
    params = checker.Params.from_meta(events)
    live = checker.check_liveness(ops, events, params)
    return checker.check_volume(checker.volume_stats(events, ops, params, live), req)


def test_volume_fails_an_empty_history() -> None:
    h = Hist(keys=["k1", "k2"], shared_keys={"sem1": 2}, schedule=CI_LIKE)
    volume = _volume(h.events)
    assert volume["valid"] is False
    short = {v["kind"] for v in volume["violations"]}
    assert {
        "operations that succeeded",
        "grants on k1",
        "grants on sem1",
        "contended holding intervals on k1",
        "reads answered during faults",
        "fault kinds executed",
        "heals",
        "refused late writes of the paused client",
    } <= short


def test_volume_fails_an_idle_run_whose_faults_healed() -> None:
    h = Hist(keys=["k1"], shared_keys={}, schedule=CI_LIKE)
    for n, spec in enumerate(CI_LIKE):  # the faults ran and healed; no client did anything
        h.fault(spec["kind"], 10.0 * n, 10.0 * n + 3, fid=n + 1)
    h.final()
    volume = _volume(h.events)
    assert volume["valid"] is False
    short = {v["kind"] for v in volume["violations"]}
    assert "fault kinds executed" not in short and "heals" not in short
    assert {"grants on k1", "heals with recovery measured", "reads answered during faults"} <= short
    # And through check(): a run short of its volume is unknown, never a pass.
    result = checker.check(h.events, volume=checker.VolumeRequirements.from_meta(h.events))
    assert result["valid"] in ("unknown", False) and result["volume"]["valid"] is False


def test_volume_passes_a_busy_history() -> None:
    """The volume check is not a check that always fails: a run that did everything."""
    h = Hist(keys=["k"], shared_keys={}, schedule=[{"kind": "pause-client"}])
    h.acquire("p1", "k", 0.0, 0.01, token=1)
    h.op(
        "c",
        "acquire",
        "k",
        0.2,
        0.21,
        type="fail",
        args={"ttl": 1.0, "owner": "c"},
        error="LEASE_HELD",
        detail={"token": 1, "owner": "p1"},
    )
    h.add(
        {
            "type": "nemesis",
            "f": "start",
            "fault": "pause-client",
            "id": 1,
            "t": 0.5,
            "detail": {"paused": "p1", "key": "k", "token": 1},
        }
    )
    h.read("c", "k", 0.6, 0.7, token=1, owner="p1")
    h.add({"type": "nemesis", "f": "stop", "fault": "pause-client", "id": 1, "t": 5.0})
    h.fenced("p1", "k", 5.1, 1, False, cluster=False, refused_by="cluster", asked=(5.0, 5.05))
    h.acquire("c", "k", 5.2, 5.21, token=2)
    h.final()
    volume = _volume(h.events)
    assert volume["valid"] is True, volume["violations"]
    stats = volume["stats"]
    assert stats["pause_client_writes_refused"] == 1 and stats["contended_per_key"] == {"k": 1}
    assert stats["heals_measured"] == stats["heals"] == 1


# ------------------------------------------------------------ rejoin (PreVote)


def _isolation(h: Hist, before: Any, at_heal: Any, kept: bool = True) -> None:
    h.add(
        {
            "type": "nemesis",
            "f": "start",
            "fault": "isolate-follower",
            "id": 7,
            "t": 0.05,
            "detail": {"victim": "n3", "victim_term_before": before},
        }
    )
    h.add(
        {
            "type": "nemesis",
            "f": "stop",
            "fault": "isolate-follower",
            "id": 7,
            "t": 0.2,
            "detail": {
                "victim": "n3",
                "victim_term_before": before,
                "victim_term_at_heal": at_heal,
                "leader": "n1",
                "leader_term": 2,
                "leader_kept": kept,
            },
        }
    )


def _rejoin_history(before: Any, at_heal: Any, kept: bool = True) -> dict[str, Any]:
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    _isolation(h, before, at_heal, kept)
    h.release("a", "k", 0.3, 0.31, token=1)
    h.acquire("b", "k", 0.4, 0.41, token=2)
    result: dict[str, Any] = h.complete().check()["checkers"]["rejoin"]
    return result


def test_rejoin_a_cut_off_member_that_raised_its_term_fails() -> None:
    """Without PreVote the cut-off member's term rises while it hears no one (and
    its return deposes the leader): the checker fails the run."""
    bad = _rejoin_history(before=2, at_heal=6, kept=False)
    assert bad["valid"] is False and bad["violations"][0]["term_at_heal"] == 6
    good = _rejoin_history(before=2, at_heal=2)
    assert good["valid"] is True and good["stats"] == {"faults": 1, "leader_kept": 1}
    # Its term not recorded (it did not answer): unknown, never a pass.
    assert _rejoin_history(before=2, at_heal=None)["valid"] == "unknown"


# ------------------------------------------- membership: a member that missed an add


def _membership_history(detail: dict[str, Any]) -> dict[str, Any]:
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    h.add({"type": "nemesis", "f": "start", "fault": "membership-missed", "id": 3, "t": 0.1})
    h.add(
        {
            "type": "nemesis",
            "f": "stop",
            "fault": "membership-missed",
            "id": 3,
            "t": 0.2,
            "detail": detail,
        }
    )
    h.release("a", "k", 0.3, 0.31, token=1)
    result: dict[str, Any] = h.complete().check()["checkers"]["membership"]
    return result


def test_membership_a_member_that_never_learned_the_add_fails() -> None:
    """Before guests and reverse dials, a member down during an add restarted refusing
    the new member (and with the old members gone, nobody was elected): the heal
    records ``learned: false`` and the checker fails the run."""
    bad = _membership_history({"restarted": ["n3"], "learned": False, "learn_s": 20.0})
    assert bad["valid"] is False and bad["violations"][0]["member"] == "n3"
    good = _membership_history({"restarted": ["n3"], "learned": True, "learn_s": 1.2})
    assert good["valid"] is True and good["stats"] == {"faults": 1}
    # A heal that failed before it could tell: unknown, never a pass.
    assert _membership_history({"errors": ["RuntimeError: ..."]})["valid"] == "unknown"


# ------------------------------------------- linearizable: the owner, not the process


def _acquire_for(
    h: Hist, p: str, owner: str, key: str, inv: float, ret: float, token: int, type: str = "ok"
) -> str:
    """Process ``p`` acquires ``key`` for ``owner`` (one client acting for several
    owners, or owners that are not process names); the cluster answers ``owner``."""
    value: dict[str, Any] = {
        "owner": owner,
        "token": token,
        "ttl": 1.0,
        "valid_until": inv + 1.0 * (1 - RHO) - MARGIN,
    }
    args = {"ttl": 1.0, "owner": owner}
    if type != "ok":
        return h.op(p, "acquire", key, inv, ret if type != "info" else None, type=type, args=args)
    return h.op(p, "acquire", key, inv, ret, args=args, value=value)


def test_linearizable_names_the_holder_by_the_owner_the_cluster_returned() -> None:
    """A read names the holder's owner as the cluster granted it; process ``c1``
    acquiring for ``svc-a`` is not a holder named ``c1``. Before the fix this clean
    history failed ``linearizable`` (the model expected owner ``c1``)."""
    h = Hist()
    _acquire_for(h, "c1", "svc-a", "k", 0.0, 0.01, token=1)
    h.read("r", "k", 0.1, 0.11, token=1, owner="svc-a")
    h.release("c1", "k", 0.3, 0.31, token=1)
    # An unanswered acquire for svc-b explains the token a later read shows.
    _acquire_for(h, "c2", "svc-b", "k", 0.4, 0.0, token=5, type="info")
    h.read("r", "k", 0.6, 0.61, token=5, owner="svc-b")
    result = h.complete().check()
    assert result["checkers"]["linearizable"]["valid"] is True, result["checkers"]["linearizable"]
    assert result["valid"] is True, verdicts(result)


def test_linearizable_still_fails_a_read_that_names_another_owner() -> None:
    """The rule still catches a wrong holder: the cluster granted token 1 to
    ``svc-a``; a read naming ``svc-b`` (or the process ``c1``) as its owner is no
    state the lease could have been in."""
    for seen in ("svc-b", "c1"):
        h = Hist()
        _acquire_for(h, "c1", "svc-a", "k", 0.0, 0.01, token=1)
        h.read("r", "k", 0.1, 0.11, token=1, owner=seen)
        result = h.complete().check()["checkers"]["linearizable"]
        assert result["valid"] is False, (seen, result)
    # And an unknown acquire by the same process for another owner explains nothing.
    h = Hist()
    _acquire_for(h, "c2", "svc-b", "k", 0.4, 0.0, token=5, type="info")
    h.read("r", "k", 0.6, 0.61, token=5, owner="c2")
    assert h.complete().check()["checkers"]["linearizable"]["valid"] is False


# ------------------------------------------------------------------ watch streams

STEP = watch_checker.JUMP_SPACING


def _stream(
    h: Hist,
    sid: str,
    t: float,
    rows: list[tuple[int, str, str, str, int]],
    from_revision: int = 1,
    prefix: str = "",
    end: str | None = "stopped",
    error: str | None = None,
) -> None:
    """A watch stream as ``watch_workload.WatchRecorder`` records it: start, the
    delivered rows ``(revision, type, key, owner, token)`` in one batch, end."""
    h.add(
        {
            "type": "watch",
            "f": "start",
            "stream": sid,
            "process": "watch1",
            "prefix": prefix,
            "from_revision": from_revision,
            "t": t,
        }
    )
    h.add(
        {
            "type": "watch",
            "f": "events",
            "stream": sid,
            "t": t + 0.5,
            "events": [
                {"revision": r, "type": k, "key": key, "owner": o, "token": tok, "units": 1}
                for r, k, key, o, tok in rows
            ],
        }
    )
    if end is not None:
        done: Event = {"type": "watch", "f": "end", "stream": sid, "t": t + 1.0, "reason": end}
        if error is not None:
            done["error"] = error
        h.add(done)


def _watched() -> tuple[Hist, list[tuple[int, str, str, str, int]]]:
    """a holds k (token 1) and releases it (2); c holds k3 (3), which expires (4); a new
    leader's term jumps the revision to STEP + 100; b is granted k (STEP + 101) and it
    expires (STEP + 102). The history holds a's and b's acquires and a's release."""
    h = Hist(watch={"prefix": ""})
    h.acquire("a", "k", 0.0, 0.01, token=1)
    h.release("a", "k", 0.3, 0.31, token=1)
    h.acquire("b", "k", 0.4, 0.41, token=STEP + 101)
    rows = [
        (1, "grant", "k", "a", 1),
        (2, "release", "k", "a", 1),
        (3, "grant", "k3", "c", 3),
        (4, "expire", "k3", "c", 3),
        (STEP + 101, "grant", "k", "b", STEP + 101),
        (STEP + 102, "expire", "k", "b", STEP + 101),
    ]
    return h, rows


def _watch(h: Hist) -> dict[str, Any]:
    result: dict[str, Any] = h.complete().check()["checkers"]["watch"]
    return result


def test_watch_a_clean_stream_passes_and_its_jump_is_a_term_change() -> None:
    h, rows = _watched()
    _stream(h, "w:1", 0.0, rows[:2], end="rotate")
    _stream(h, "w:2", 1.5, rows[2:], from_revision=3)  # resumed from its next revision
    result = h.complete().check()
    assert result["valid"] is True, verdicts(result)
    watch = result["checkers"]["watch"]
    assert watch["stats"]["term_jumps"] == 1 and watch["stats"]["writes_matched"] == 2
    assert watch["stats"]["ends"] == {"rotate": 1, "stopped": 1}


def test_watch_a_stream_replayed_with_one_revision_dropped_fails() -> None:
    """A skipped change: the clean stream above with one revision taken out fails, and
    the violation says how the history can tell."""
    _, rows = _watched()
    gap = "gap no term change explains: revisions skipped"
    expected = {
        0: {"stream skipped changes the history shows", gap},  # a's acknowledged grant
        1: {gap, "grant on a plain key its stream shows held"},  # a's release
        2: {gap},  # c's grant: nothing in the history names it, but no term jumps there
        4: {"stream skipped changes the history shows"},  # b's grant, right after a jump
    }
    for drop, kinds in expected.items():
        h, _ = _watched()
        _stream(h, "w:1", 0.0, rows[:drop] + rows[drop + 1 :])
        result = _watch(h)
        assert result["valid"] is False, (drop, result)
        assert {v["kind"] for v in result["violations"]} == kinds, (drop, result["violations"])
    # What no history can show: the change just before a term's jump (the jump may have
    # come one revision earlier), or the last one (the stream may have ended there).
    for drop in (3, 5):
        h, _ = _watched()
        _stream(h, "w:1", 0.0, rows[:drop] + rows[drop + 1 :])
        assert _watch(h)["valid"] is True, drop


def test_watch_a_repeated_or_early_revision_fails() -> None:
    _, rows = _watched()
    h, _ = _watched()
    _stream(h, "w:1", 0.0, [rows[0], rows[1], rows[1], *rows[2:]])
    assert [v["kind"] for v in _watch(h)["violations"]] == [
        "revision delivered twice",
        "lease ended twice in one stream",
    ]
    # A stream from revision 2 that delivers revision 1.
    h, _ = _watched()
    _stream(h, "w:1", 0.0, rows, from_revision=2)
    assert [v["kind"] for v in _watch(h)["violations"]] == ["revision before the stream's start"]


def test_watch_two_jumps_closer_than_a_reserve_step_fail() -> None:
    """Term jumps land at least TOKEN_RESERVE_STEP apart: a second gap landing 50
    revisions after the first one skipped changes, in another stream too."""
    h, rows = _watched()
    _stream(h, "w:1", 0.0, rows)
    _stream(
        h,
        "w:2",
        2.0,
        [
            (STEP + 103, "grant", "k", "c", STEP + 103),
            (STEP + 153, "release", "k", "c", STEP + 103),
        ],
        from_revision=STEP + 103,
    )
    result = _watch(h)
    assert [v["kind"] for v in result["violations"]] == [
        "gap no term change explains: revisions skipped"
    ]
    assert result["violations"][0]["stream"] == "w:2"


def test_watch_an_event_that_is_not_the_acknowledged_write_fails() -> None:
    h, rows = _watched()
    _stream(h, "w:1", 0.0, [(1, "grant", "k", "b", 1), *rows[1:]])  # a got token 1
    result = _watch(h)
    assert [v["kind"] for v in result["violations"]] == [
        "event does not match the acknowledged write at its revision"
    ]
    # A grant whose token is not the revision that granted it.
    h, rows = _watched()
    _stream(h, "w:1", 0.0, [*rows, (STEP + 103, "grant", "k2", "c", 7)])
    assert [v["kind"] for v in _watch(h)["violations"]] == ["grant whose token is not its revision"]
    # A prefix stream may skip revisions (other keys), not an acknowledged grant under it.
    h, rows = _watched()
    _stream(h, "w:1", 0.0, [*rows[:4], rows[5]], prefix="k")  # b's grant skipped
    assert [v["kind"] for v in _watch(h)["violations"]] == [
        "acknowledged write missing from the stream"
    ]
    h, rows = _watched()
    _stream(h, "w:1", 0.0, [*rows[:2], *rows[4:]], prefix="k")  # nothing it can tell
    assert _watch(h)["valid"] is True


def test_watch_an_incomplete_recording_is_unknown() -> None:
    h, rows = _watched()
    _stream(h, "w:1", 0.0, rows, end=None)
    result = _watch(h)
    assert result["valid"] == "unknown"
    assert result["unknown"][0]["kind"] == "stream never ended (recording cut short)"
    # A run that declared its watcher and recorded nothing decided nothing.
    h, _ = _watched()
    assert _watch(h)["valid"] == "unknown"
    # A stream that ended with an error the client saw is fine (nothing was skipped).
    h, rows = _watched()
    _stream(h, "w:1", 0.0, rows[:2], end="error", error="COMPACTED")
    assert _watch(h)["valid"] is True
    # A history without a watcher has no watch checker.
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    assert "watch" not in h.complete().check()["checkers"]


# --------------------------------------- withdrawn waiters (issue 37, cancel_checker)


def _cancelled_wait(h: Hist, owner: str, key: str, inv: float, ret: float, withdrawn: bool) -> str:
    """A waiting acquire by process ``x`` that gave up (cancelled) and whose
    withdrawal the cluster answered (``withdrawn``) before ``ret``."""
    return h.op(
        "x",
        "wait-acquire",
        key,
        inv,
        ret,
        type="info",
        args={"owner": owner, "wait": 2.0, "patience": 0.1},
        value={"withdrawn": withdrawn},
        error="CANCELLED",
    )


def _cancel_read(
    h: Hist, key: str, inv: float, ret: float, holders: list[str], waiters: list[str]
) -> str:
    return h.op("x", "cancel-read", key, inv, ret, value={"holders": holders, "waiters": waiters})


def test_withdrawn_a_grant_after_the_withdrawal_fails() -> None:
    """The waiter x-w1 withdrew (answered at 0.2); a read begun at 0.3 shows it as
    the holder: a grant to a waiter whose client withdrew (a lease nobody has)."""
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    _cancelled_wait(h, "x-w1", "x1", 0.05, 0.2, withdrawn=True)
    _cancel_read(h, "x1", 0.3, 0.31, holders=["x-w1"], waiters=[])
    result = h.complete().check()
    assert result["checkers"]["withdrawn"]["valid"] is False, result["checkers"]["withdrawn"]
    assert result["valid"] is False
    assert result["checkers"]["withdrawn"]["violation_count"] == 1  # run.py prints it
    (violation,) = result["checkers"]["withdrawn"]["violations"]
    assert (violation["owner"], violation["seen_in"]) == ("x-w1", "holders")
    # The lease checkers know nothing of these keys and stay as they were.
    assert verdicts(result)["linearizable"] is True


def test_withdrawn_a_waiter_left_in_the_queue_fails() -> None:
    h = Hist()
    _cancelled_wait(h, "x-w1", "x1", 0.05, 0.2, withdrawn=True)
    _cancel_read(h, "x1", 0.3, 0.31, holders=["x-holder"], waiters=["x-w1"])
    result = h.complete().check()
    assert result["checkers"]["withdrawn"]["valid"] is False
    assert result["checkers"]["withdrawn"]["violations"][0]["seen_in"] == "waiters"


def test_withdrawn_a_raced_grant_seen_before_the_withdrawal_ended_passes() -> None:
    """A grant that raced the withdrawal may be seen while the client is still
    withdrawing (it releases it); after the withdrawal, the next waiter or nobody."""
    h = Hist()
    h.acquire("a", "k", 0.0, 0.01, token=1)
    _cancelled_wait(h, "x-w1", "x1", 0.05, 0.4, withdrawn=True)
    _cancel_read(h, "x1", 0.1, 0.12, holders=["x-w1"], waiters=[])  # began before 0.4
    _cancel_read(h, "x1", 0.5, 0.51, holders=["x-w2"], waiters=[])
    _cancel_read(h, "x2", 0.5, 0.51, holders=["x-w1"], waiters=[])  # another key
    result = h.complete().check()
    assert result["checkers"]["withdrawn"]["valid"] is True, result["checkers"]["withdrawn"]
    assert result["checkers"]["withdrawn"]["stats"]["judged"] == 1
    assert result["valid"] is True


def test_withdrawn_nothing_judged_or_malformed_is_unknown() -> None:
    h = Hist()
    # Not answered: not judged; and no read after an answered withdrawal.
    _cancelled_wait(h, "x-w1", "x1", 0.05, 0.2, withdrawn=False)
    _cancel_read(h, "x1", 0.3, 0.31, holders=["x-w1"], waiters=[])
    result = h.complete().check()
    assert result["checkers"]["withdrawn"]["valid"] == "unknown"
    h = Hist()
    h.op("x", "wait-acquire", "x1", 0.05, 0.2, type="info", args={"owner": "x-w1"})
    _cancel_read(h, "x1", 0.3, 0.31, holders=[], waiters=[])
    assert h.complete().check()["checkers"]["withdrawn"]["valid"] == "unknown"
