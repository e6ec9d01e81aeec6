"""Agents claim planning subtasks with fencing: a planner splits a goal into subtasks,
agent processes claim them through lease sessions, and one agent freezes mid-work.

    python examples/planning_agents.py                       # starts its own local cluster
    python examples/planning_agents.py --endpoints 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003

The planner puts ``--subtasks`` subtasks under ``plan/<run>/task-<i>``. Each of
``--agents`` agent processes opens one lease session (``--ttl``) and try-acquires free
subtasks attached to it (at most ``--claims`` at a time), works on each, writes the
result to a shared result store guarded by a ``FencedResource`` (the write carries the
lease's fencing token), then releases the subtask's lease; the store knows which subtasks
are done and agents skip those.

The crash: agent-0 checks that its session is valid, then freezes (SIGSTOP: a
stop-the-world pause, so no keep-alive either) just before writing its first result.
Its session expires; the cluster releases every subtask attached to it in one log
entry, and the other agents claim and finish them with higher tokens. Then agent-0 is
resumed (SIGCONT) and makes its late write with its old token: the fenced store
rejects it. Exit status 0 only if every check in the summary holds.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import random
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.managers import BaseManager
from typing import Any

from raftlease import Client, FencedResource, LeaseHeldError, RaftLeaseError, StaleTokenError
from raftlease.testing import TEST_SETTINGS, LocalCluster

#: Bound on the whole run after the agents start (the work itself takes a few seconds).
AGENT_BUDGET = 20.0


class ResultStore:
    """The shared result store (run in a manager process). Every write passes the
    fence: a token lower than one already accepted for the subtask is refused."""

    def __init__(self, keys: list[str]) -> None:
        self._lock = threading.Lock()
        self._keys = list(keys)
        self._fence = FencedResource()
        self._accepted: list[tuple[str, str, int, str]] = []  # key, agent, token, result
        self._rejected: list[tuple[str, str, int, str]] = []  # key, agent, token, reason
        self._claims: list[tuple[str, str, int]] = []  # agent, key, token
        self._ready: set[str] = set()
        self._go = False
        self._crash: dict[str, Any] | None = None
        self._errors: list[str] = []

    def write(self, key: str, agent: str, token: int, result: str) -> tuple[bool, str]:
        with self._lock:
            try:
                self._fence.check(key, token)
            except StaleTokenError as exc:
                self._rejected.append((key, agent, token, exc.message))
                return False, exc.message
            self._accepted.append((key, agent, token, result))
            return True, ""

    def done_keys(self) -> list[str]:
        with self._lock:
            return sorted({key for key, *_ in self._accepted})

    def is_done(self, key: str) -> bool:
        with self._lock:
            return any(k == key for k, *_ in self._accepted)

    def all_done(self) -> bool:
        with self._lock:
            return {k for k, *_ in self._accepted} >= set(self._keys)

    def claimed(self, agent: str, key: str, token: int) -> None:
        with self._lock:
            self._claims.append((agent, key, token))

    def ready(self, agent: str) -> None:
        with self._lock:
            self._ready.add(agent)

    def ready_count(self) -> int:
        with self._lock:
            return len(self._ready)

    def start(self) -> None:
        self._go = True

    def started(self) -> bool:
        return self._go

    def crashing(self, agent: str, pid: int, key: str, token: int, held: list[str]) -> None:
        with self._lock:
            self._crash = {"agent": agent, "pid": pid, "key": key, "token": token, "held": held}

    def crash(self) -> dict[str, Any] | None:
        with self._lock:
            return dict(self._crash) if self._crash else None

    def error(self, message: str) -> None:
        with self._lock:
            self._errors.append(message)

    def report(self) -> dict[str, Any]:
        with self._lock:
            return {
                "accepted": list(self._accepted),
                "rejected": list(self._rejected),
                "claims": list(self._claims),
                "crash": dict(self._crash) if self._crash else None,
                "errors": list(self._errors),
            }


class StoreManager(BaseManager):
    pass


StoreManager.register("ResultStore", ResultStore)


def task_keys(run: str, count: int) -> list[str]:
    return [f"plan/{run}/task-{i:02d}" for i in range(count)]


def short(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def wait_until(condition: Callable[[], Any], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


# ------------------------------------------------------------------------- agents


def agent(
    endpoints: str,
    run: str,
    name: str,
    subtasks: int,
    claims: int,
    ttl: float,
    work: float,
    crash: bool,
    store: Any,
) -> None:
    """One agent process: claim free subtasks on its session, work, write, release."""
    keys = task_keys(run, subtasks)
    prefix = f"plan/{run}/"
    rng = random.Random(name)
    deadline = time.monotonic() + AGENT_BUDGET
    try:
        with Client(endpoints) as c, c.session(owner=name, ttl=ttl) as session:
            store.ready(name)
            if not wait_until(store.started, AGENT_BUDGET / 2):
                return
            mine: list[Any] = []  # leases claimed and not yet written
            while time.monotonic() < deadline and not store.all_done():
                if session.lost.is_set():
                    return  # the cluster dropped our session: our claims are gone
                if len(mine) < claims:  # claim free subtasks, a few at a time
                    held = {h.key for h in c.leases(prefix)}
                    done = set(store.done_keys())
                    free = [k for k in keys if k not in held and k not in done]
                    rng.shuffle(free)
                    for key in free:
                        if len(mine) >= claims:
                            break
                        try:
                            lease = session.acquire(key)  # try-acquire, attached to the session
                        except LeaseHeldError:
                            continue
                        if store.is_done(key):  # finished and released since we looked
                            c.release(lease)
                            continue
                        mine.append(lease)
                        store.claimed(name, key, lease.token)
                if not mine:
                    time.sleep(0.1)
                    continue
                lease = mine.pop(0)
                time.sleep(work)  # "plan" the subtask
                result = f"plan for {short(lease.key)} by {name}"
                if not session.valid:
                    return  # never write once our session may be gone
                if crash:
                    # Freeze between the validity check and the write, as a long GC
                    # pause or a swapped-out VM would: no keep-alives while stopped.
                    held_keys = [lease.key] + [m.key for m in mine]
                    store.crashing(name, os.getpid(), lease.key, lease.token, held_keys)
                    crash = False
                    os.kill(os.getpid(), signal.SIGSTOP)
                accepted, _ = store.write(lease.key, name, lease.token, result)
                if not accepted:
                    return  # fenced out: a newer holder already wrote this subtask
                with contextlib.suppress(RaftLeaseError):
                    c.release(lease)
    except Exception as exc:
        store.error(f"{name}: {type(exc).__name__}: {exc}")
        raise


# ------------------------------------------------------------------------ planner


def observe(endpoints: str, prefix: str, start: int, events: list[Any], stop: list[int]) -> None:
    """Record every change under the run's prefix until the planner's end marker."""
    with Client(endpoints) as c:
        for event in c.watch(prefix, from_revision=start):
            events.append(event)
            if stop and event.revision >= stop[0]:
                return


def run_agents(endpoints: str, args: argparse.Namespace) -> int:
    run = args.run or secrets.token_hex(3)
    prefix = f"plan/{run}/"
    keys = task_keys(run, args.subtasks)
    crasher = "agent-0"
    print(
        f"planner: goal split into {args.subtasks} subtasks under {prefix}; "
        f"{args.agents} agents, session ttl {args.ttl} s, at most {args.claims} claims each"
    )
    ctx = multiprocessing.get_context("spawn")
    manager = StoreManager(ctx=ctx)
    manager.start()
    procs: list[Any] = []
    events: list[Any] = []
    stop: list[int] = []
    try:
        store: Any = manager.ResultStore(keys)  # type: ignore[attr-defined]
        with Client(endpoints) as c:
            start = c.read(prefix + "end", consistency="log").revision or 0
            watcher = threading.Thread(
                target=observe, args=(endpoints, prefix, start + 1, events, stop), daemon=True
            )
            watcher.start()
            for i in range(args.agents):
                name = f"agent-{i}"
                options = (args.subtasks, args.claims, args.ttl, args.work, name == crasher)
                p = ctx.Process(
                    target=agent, args=(endpoints, run, name, *options, store), name=name
                )
                p.start()
                procs.append(p)
            if not wait_until(lambda: store.ready_count() == args.agents, 30.0):
                print("FAILED: the agents did not all open their sessions")
                return 1
            store.start()

            # The crasher freezes at its first write; under load that can be late, so
            # wait for it as long as it may run (a fixed window could miss it and
            # leave it stopped until the end, to be killed and reported as failed).
            frozen, others = procs[0], procs[1:]  # agent-0 is the crasher
            wait_until(lambda: store.crash() is not None or not frozen.is_alive(), AGENT_BUDGET)
            crash = store.crash()
            if crash is not None:
                held = ", ".join(short(k) for k in crash["held"])
                print(
                    f"crash: {crasher} (pid {crash['pid']}) froze holding {held}, just before "
                    f"writing {short(crash['key'])} with token {crash['token']}"
                )
                # Resume it only once others have finished what it held, so that its
                # late write meets a fence that has seen the newer tokens.
                if not wait_until(
                    lambda: (
                        set(crash["held"]) <= set(store.done_keys())
                        or not any(p.is_alive() for p in others)
                    ),
                    AGENT_BUDGET,
                ):
                    print(f"  its subtasks were not all finished by others in {AGENT_BUDGET} s")
                os.kill(crash["pid"], signal.SIGCONT)
                print(f"resume: {crasher} continues (SIGCONT) and makes its late write")
            deadline = time.monotonic() + AGENT_BUDGET
            for p in procs:
                p.join(timeout=max(0.1, deadline - time.monotonic()))
            end = c.acquire(prefix + "end", owner="planner", ttl=5.0)
            stop.append(end.token)
            c.release(end)
            watcher.join(timeout=10)
        report = store.report()
    finally:
        for p in procs:
            if p.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.join(timeout=5)
        manager.shutdown()
    return summarize(keys, crasher, report, events, procs)


def summarize(
    keys: list[str], crasher: str, report: dict[str, Any], events: list[Any], procs: list[Any]
) -> int:
    accepted: dict[str, list[tuple[str, int]]] = {k: [] for k in keys}
    for key, name, token, _ in report["accepted"]:
        accepted.setdefault(key, []).append((name, token))
    crash = report["crash"]
    held = set(crash["held"]) if crash else set()
    expired = [e for e in events if e.type == "expire" and e.owner == crasher]

    print("claims (subtask@token, in the order each agent took them):")
    by_agent: dict[str, list[str]] = {}
    for name, key, token in report["claims"]:
        by_agent.setdefault(name, []).append(f"{short(key)}@{token}")
    for name in sorted(by_agent):
        print(f"  {name}: {' '.join(by_agent[name])}")
    if expired:
        revisions = [e.revision for e in expired]
        print(
            f"expiry: {crasher}'s session expired; the cluster released "
            f"{', '.join(short(e.key) for e in expired)} in one log entry "
            f"(revisions {min(revisions)}-{max(revisions)}, nothing in between)"
        )
    for key in sorted(held):
        redo = [f"{n} (token {t})" for n, t in accepted.get(key, []) if n != crasher]
        print(f"reclaim: {short(key)} was finished by {', '.join(redo) or 'nobody'}")
    for key, name, token, reason in report["rejected"]:
        print(f"rejected: stale write of {short(key)} by {name} with token {token}: {reason}")

    print(f"results ({len(keys)} subtasks):")
    for key in keys:
        writes = accepted.get(key, [])
        who = "; ".join(f"{n} token {t}" for n, t in writes) or "NOT DONE"
        note = f"  (reclaimed from {crasher})" if key in held else ""
        print(f"  {short(key)}: {who}{note}")

    late = [
        r
        for r in report["rejected"]
        if crash and r[1] == crasher and r[0] == crash["key"] and r[2] == crash["token"]
    ]
    revisions = sorted(e.revision for e in expired)
    checks = [
        (
            "every subtask done exactly once",
            all(len(accepted.get(k, [])) == 1 for k in keys),
        ),
        (
            "no two accepted writes for one subtask",
            all(len(w) <= 1 for w in accepted.values()),
        ),
        (f"{crasher} crashed holding subtasks", bool(held)),
        (f"{crasher}'s late write was rejected by the fence", bool(late)),
        (
            f"{crasher}'s subtasks were completed by others",
            bool(held) and all(accepted.get(k) and accepted[k][0][0] != crasher for k in held),
        ),
        (
            f"{crasher}'s subtasks were released together (consecutive revisions)",
            bool(held)
            and {e.key for e in expired} == held
            and revisions == list(range(revisions[0], revisions[0] + len(revisions))),
        ),
        ("no agent failed", not report["errors"] and all(p.exitcode == 0 for p in procs)),
    ]
    for message in report["errors"]:
        print(f"error: {message}")
    for p in procs:
        if p.exitcode != 0:  # None: still running when the planner gave up on it
            print(f"error: {p.name} exited with code {p.exitcode}")
    print("checks:")
    for what, ok in checks:
        print(f"  [{'ok' if ok else 'FAIL'}] {what}")
    if all(ok for _, ok in checks):
        print("OK")
        return 0
    print("FAILED")
    return 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--endpoints", default="", help="a running cluster (default: start a local one)"
    )
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--subtasks", type=int, default=12)
    parser.add_argument("--claims", type=int, default=3, help="subtasks an agent holds at once")
    parser.add_argument("--ttl", type=float, default=1.5, help="session TTL in seconds")
    parser.add_argument("--work", type=float, default=0.3, help="seconds of work per subtask")
    parser.add_argument("--run", default="", help="run id in the keys (default: random)")
    args = parser.parse_args()
    if args.agents < 2 or args.subtasks < 1 or args.claims < 1:
        parser.error("need at least 2 agents, 1 subtask and 1 claim")
    if args.endpoints:
        sys.exit(run_agents(args.endpoints, args))
    with LocalCluster(3, settings=TEST_SETTINGS) as cluster:
        cluster.start()
        print(f"started a local 3-node cluster: {','.join(cluster.endpoints)}")
        code = run_agents(",".join(cluster.endpoints), args)
    sys.exit(code)


if __name__ == "__main__":
    main()
