"""Failover: SIGKILL of the leader while a client loops acquire/release; the figure
is the time from the kill to the next call that succeeds.

Each repetition blocks: a client thread runs the loop, the main thread kills the
leader at a moment the loop is paused between two calls, a ``Monitor`` polls every
node's status to see when a new leader appears, and the killed node is restarted and
caught up before the next repetition.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any

from raftlease.errors import RaftLeaseError
from raftlease.testing import LocalCluster, wait_for

from ..cluster import wait_caught_up
from ..context import Context, fmt, progress
from ..measure import counts, spread
from ..monitor import Monitor

MODE = "SIGKILL leader"

#: Lines of each node's log kept for a repetition that took more than one term.
LOG_TAIL = 400

#: The client's deadline per call, seconds (issue 16 measures failover with 0.25 s,
#: the same deadline the etcd and ZooKeeper anchors get): a call that meets a dead
#: leader fails fast and the loop tries again, as an agent with a short deadline would.
DEADLINE = 0.25

METHOD = (
    "One thread (Client with deadline and attempt_timeout 0.25 s; a call that fails "
    "is retried by the loop at once) loops acquire(fresh key)/release. After "
    ">20 successes the loop pauses between two calls, the leader is SIGKILLed and "
    "the loop resumes at once (so no reply sent before the kill is counted); the "
    "figure is the time from the kill to the first call that completes "
    "successfully afterwards. 'new leader' is when "
    "a status poll (every 10 ms) first saw a leader with a higher term. The killed "
    "node is restarted and caught up between repetitions."
)


def failover(ctx: Context, cluster: LocalCluster) -> None:
    """``failover_reps`` kills; the entry is recorded after each, so a failure in a
    later repetition keeps the earlier ones."""
    p = ctx.profile
    reps: list[dict[str, Any]] = []
    progress(f"failover: {p.failover_reps} SIGKILLs of the leader")
    for rep in range(p.failover_reps):
        result = failover_once(ctx, cluster)
        if result["elections"] > 1:
            # More than one term: a split or lost vote, rare and worth a post-mortem;
            # the cluster's own directory is deleted when the run ends.
            logs = {n: cluster.log_path(n) for n in (str(a.id) for a in cluster.nodes)}
            result["logs"] = keep_logs(logs, ctx.out / "failover-logs", f"rep{rep + 1}")
        reps.append(result)
        record(ctx, reps)
        progress(
            f"failover rep {rep + 1}/{p.failover_reps}: killed {result['killed']}, next "
            f"success after {result['time_to_success_s']:.3f} s (new leader seen after "
            f"{fmt(result['time_to_new_leader_s'], '.3f')} s, "
            f"{result['elections']} term(s))"
        )
        cluster.start_node(result["killed"])
        wait_caught_up(cluster, timeout=60)
        time.sleep(0.5)
    ctx.method("failover", METHOD)


def keep_logs(logs: dict[str, Path], dest: Path, label: str, tail: int = LOG_TAIL) -> list[str]:
    """Copy the last ``tail`` lines of each node's log (``logs``: node id -> path) to
    ``dest/<label>-<node>.log``; returns the copies' paths relative to ``dest``'s
    parent (the run's output directory). A missing log is skipped."""
    dest.mkdir(parents=True, exist_ok=True)
    kept = []
    for node, path in sorted(logs.items()):
        if not path.exists():
            continue
        lines = path.read_text(errors="replace").splitlines()[-tail:]
        copy = dest / f"{label}-{node}.log"
        copy.write_text("\n".join(lines) + "\n")
        kept.append(str(copy.relative_to(dest.parent)))
    return kept


def record(ctx: Context, reps: list[dict[str, Any]]) -> None:
    """The failover entry of the repetitions so far."""
    times = [r["time_to_success_s"] for r in reps]
    elected_times = [r["time_to_new_leader_s"] for r in reps if r["time_to_new_leader_s"]]
    ctx.record(
        "failover",
        MODE,
        {
            "mode": MODE,
            "time_to_success_s": spread(times),
            "time_to_new_leader_s": spread(elected_times),
            "elections_per_failover": spread([float(r["elections"]) for r in reps]),
            "reps": reps,
            "primary": {"name": "time_to_success_s", "value": statistics.median(times)},
        },
    )


def failover_once(ctx: Context, cluster: LocalCluster) -> dict[str, Any]:
    """One kill of the leader; returns the repetition's record (killed node, time to
    the next success, time to a new leader if one was seen, terms, client errors)."""
    old = cluster.wait_for_leader(30)
    leader_id, old_term = str(old["node"]), int(old["term"])
    monitor = Monitor(cluster, interval=0.01)
    successes: list[float] = []
    errors: list[str] = []
    # hold: pause the loop between calls; held: it has paused; go: resume it.
    stop, hold, held, go = (threading.Event() for _ in range(4))

    def loop() -> None:
        with cluster.client(deadline=DEADLINE, attempt_timeout=DEADLINE) as c:
            while not stop.is_set():
                if hold.is_set() and not go.is_set():
                    # Between two calls: the kill happens now, so the next call is
                    # the first one that can only succeed on a new leader.
                    held.set()
                    go.wait(30)
                try:
                    lease = c.acquire(ctx.key("fo"), owner="fo-agent", ttl=5.0)
                    successes.append(time.monotonic())
                    c.release(lease)
                    successes.append(time.monotonic())
                except RaftLeaseError as exc:
                    errors.append(type(exc).__name__)

    worker = threading.Thread(target=loop, daemon=True)
    monitor.start()
    worker.start()
    t_kill = 0.0
    try:
        wait_for(lambda: len(successes) > 20, 20, "acquire/release before the kill")
        hold.set()
        wait_for(held.is_set, 20, "the client loop to pause between calls")
        t_kill = time.monotonic()
        cluster.kill_node(leader_id)
        go.set()
        first = wait_for(
            lambda: next((t for t in successes if t > t_kill), None),
            30,
            "a successful acquire/release after the kill",
        )
        wait_for(lambda: successes[-1] > first + 0.3, 10, "successes after the first")
    finally:
        stop.set()
        go.set()
        worker.join(timeout=20)
        monitor.stop()
    elected = monitor.first(lambda s: s["role"] == "leader" and s["term"] > old_term, after=t_kill)
    new_leader = cluster.wait_for_leader(30, exclude=leader_id)
    return {
        "killed": leader_id,
        "time_to_success_s": first - t_kill,
        "time_to_new_leader_s": (elected - t_kill) if elected else None,
        "elections": int(new_leader["term"]) - old_term,
        "client_errors": counts(errors),
    }
