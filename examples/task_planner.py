"""A planner hands subtasks to agents through a leased task queue; agents crash
sometimes; the planner gathers every result exactly once.

    python examples/task_planner.py                       # starts its own local cluster
    python examples/task_planner.py --endpoints 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003

The planner splits a goal into ``--subtasks`` subtasks and puts each into the queue
``planner/<run>`` (a short ``lease_ttl`` so a crash is noticed quickly, up to
``--max-attempts`` attempts). ``--agents`` agent processes claim subtasks (``with
task:`` heartbeats in the background), work a little, and complete each with a result
that names the attempt's fencing token. Agents crash: agent-0 is SIGKILLed (by itself)
while holding its first subtask, and every agent crashes with probability ``--crash``
on each subtask after that (seeded by ``--seed``). The planner replaces crashed agents
(replacements do not crash). A crashed agent's attempt expires, the queue retries the
subtask after a backoff, and another agent finishes it with a higher token.

The planner awaits each result (``wait_result``) and checks: every subtask has exactly
one accepted result, computed correctly; the crashed attempts show up in the subtasks'
histories as expired and were retried by other agents; tokens grew. Exit status 0 only
if every check holds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from raftlease import Client, StaleAttemptError
from raftlease.testing import TEST_SETTINGS, LocalCluster

#: Bound on waiting for all the results.
BUDGET = 90.0


def agent(endpoints: list[str], queue: str, name: str, crash: float, seed: int) -> None:
    """An agent process: claim, work, complete, until no subtask came for a while."""
    rng = random.Random(f"{seed}:{name}")
    first = True
    with Client(endpoints) as c:
        q = c.queue(queue)
        for task in q.tasks(worker=name, wait=3.0):
            with task:
                doomed = (name == "agent-0" and first) or (not first and rng.random() < crash)
                first = False
                n = int(task.payload["subtask"])
                if doomed:
                    print(
                        f"CRASH {name} {task.task_id} {n} {task.attempt} {task.token}", flush=True
                    )
                    os.kill(os.getpid(), signal.SIGKILL)  # holding the task, mid-work
                time.sleep(rng.uniform(0.02, 0.15))  # the work
                result = {"subtask": n, "square": n * n, "by": name, "token": task.token}
                try:
                    task.complete(result=result)
                except StaleAttemptError:
                    # Too slow (the attempt expired and went to another agent): the
                    # queue refused this late result. Drop it and go on.
                    print(f"STALE {name} {task.task_id} {n} {task.attempt}", flush=True)
                    continue
                print(f"DONE {name} {task.task_id} {n} {task.attempt} {task.token}", flush=True)


class Agents:
    """Starts agent processes and replaces the ones that crashed (from a thread)."""

    def __init__(self, endpoints: list[str], queue: str, crash: float, seed: int) -> None:
        self.endpoints, self.queue, self.crash, self.seed = endpoints, queue, crash, seed
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.crashed: list[str] = []
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def spawn(self, crash: float) -> None:
        name = f"agent-{self.count}"
        self.count += 1
        args = ["--agent", name, "--queue", self.queue, "--endpoints", ",".join(self.endpoints)]
        args += ["--crash", str(crash), "--seed", str(self.seed)]
        self.procs[name] = subprocess.Popen(
            [sys.executable, __file__, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def start(self, count: int) -> None:
        for _ in range(count):
            self.spawn(self.crash)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            for name, proc in list(self.procs.items()):
                if proc.poll() == -signal.SIGKILL and name not in self.crashed:
                    self.crashed.append(name)
                    print(f"crash: {name} was killed holding a subtask; starting a replacement")
                    self.spawn(0.0)

    def stop(self) -> list[str]:
        """Stop every agent; their output lines."""
        self._stop.set()
        self._thread.join(timeout=5)
        lines: list[str] = []
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                out, _ = proc.communicate(timeout=10)
                lines += out.splitlines()
        return lines


def plan(endpoints: list[str], args: argparse.Namespace) -> bool:
    queue = f"planner/{secrets.token_hex(4)}"
    with Client(endpoints) as c:
        q = c.queue(queue, lease_ttl=1.0, max_attempts=args.max_attempts, backoff=0.2)
        ids = {q.put({"subtask": n}, dedup_key=f"subtask-{n}"): n for n in range(args.subtasks)}
        print(f"plan: {len(ids)} subtasks in queue {queue}")
        agents = Agents(endpoints, queue, args.crash, args.seed)
        agents.start(args.agents)
        results: dict[str, Any] = {}
        try:
            deadline = time.monotonic() + BUDGET
            for tid in ids:
                results[tid] = q.wait_result(tid, timeout=max(1.0, deadline - time.monotonic()))
        finally:
            lines = agents.stop()
        infos = {tid: q.get(tid) for tid in ids}
        stats = q.stats()
    crashes = [line.split() for line in lines if line.startswith("CRASH ")]
    done = [line.split() for line in lines if line.startswith("DONE ")]
    for _, name, _tid, n, attempt, token in crashes:
        print(f"  {name} crashed on subtask {n} (attempt {attempt}, token {token})")
    checks: list[tuple[str, bool]] = []
    checks.append(
        (
            "every subtask's result gathered exactly once",
            sorted(r["subtask"] for r in results.values()) == list(range(args.subtasks))
            and all(r["square"] == r["subtask"] ** 2 for r in results.values())
            # No agent saw two accepted completions of one subtask.
            and len({d[3] for d in done}) == len(done)
            and all(sum(h.outcome == "completed" for h in i.history) == 1 for i in infos.values()),
        )
    )
    crashed_tids = {c[2] for c in crashes}
    checks.append(
        (
            "crashed agents' subtasks were retried and finished by other agents",
            bool(crashes)
            and all(
                infos[tid].history[0].outcome == "expired"
                and results[tid]["by"] != infos[tid].history[0].worker
                for tid in crashed_tids
            ),
        )
    )
    checks.append(
        (
            "each accepted result carries a higher token than every earlier attempt",
            all(
                results[tid]["token"] == infos[tid].history[-1].token
                and all(h.token < results[tid]["token"] for h in infos[tid].history[:-1])
                for tid in ids
            ),
        )
    )
    checks.append(("nothing left in the queue", stats.ready + stats.claimed + stats.dead == 0))
    print(f"summary: {len(crashes)} crashes, {stats.attempts} attempts for {len(ids)} subtasks")
    for label, ok in checks:
        print(f"  [{'ok' if ok else 'FAILED'}] {label}")
    if not all(ok for _, ok in checks):
        print("agents said:", *lines, sep="\n  ")
        for tid, info in infos.items():
            print(
                f"  {tid} {info.status}: {[(h.worker, h.token, h.outcome) for h in info.history]}"
            )
    return all(ok for _, ok in checks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", default=None, help="Cluster (default: start one).")
    parser.add_argument("--subtasks", type=int, default=12)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--crash", type=float, default=0.2, help="Crash chance per subtask.")
    parser.add_argument("--max-attempts", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--agent", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--queue", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.agent is not None:
        agent(args.endpoints.split(","), args.queue, args.agent, args.crash, args.seed)
        return 0
    if args.endpoints:
        ok = plan(args.endpoints.split(","), args)
    else:
        with LocalCluster(3, settings=dict(TEST_SETTINGS)) as cluster:
            cluster.start()
            ok = plan(cluster.endpoints, args)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
