"""Scale (issue 16): many agents, each with a lease session holding one lease, kept
alive every ttl/3 by a few client processes, on a fresh 3-node cluster.

The parent (the bench process, main thread) starts the cluster, then
``scale_processes`` agent processes (``agents_main`` below, each one ``AsyncClient``
multiplexing its share of the agents as asyncio tasks) and drives them over their
stdin / stdout with one JSON object per line:

- ramp: in ``scale_steps`` steps up to ``scale_agents`` agents; after each step's
  agents are open, every keep-alive of one observation window (1.25 keep-alive
  intervals, so every agent sends at least one) is timed, and the step is judged by
  ``ramp_verdict``: a lost session, an agent that could not open, a keep-alive p99
  above ttl/3 or too few keep-alives completed stop the ramp, and the agents of the
  failed step are closed again (``shrink``), so the hold runs at the largest level
  that passed;
- hold: ``scale_hold`` seconds at that level, every keep-alive timed, with the CPU
  of every node and agent process, the nodes' journal syncs and, at the end, each
  node's RSS and the leader's count of live sessions and leases.

An agent opens its session with ``AsyncClient.session`` and stops the recipe's own
keep-alive task at once (``stop_keepalive``): it sends the keep-alives itself with
``AsyncSession.keepalive`` on the recipe's schedule (every ttl/3 counted from the
previous send, each bounded by ttl/3) so that each one can be timed, and classifies a
failure with the recipe's ``renew_failed`` (lost = the cluster says the session is
gone, or validity ran out). The first keep-alive of agent i comes ``frac(i * phi)`` of
an interval after its open, so the keep-alives are spread evenly over the interval
without a random number.

Everything is bounded: steps in count, each wait for an agent process in time
(``_Agents.collect``), the hold in time, and each agent process exits on its own
after ``max_seconds`` or when its stdin closes (the parent died). The agent processes
are always stopped by pid (``_Agents.stop``), on success, error, timeout or Ctrl-C.
``scale`` blocks for the whole phase; the pure parts (``summarize``, ``merge``,
``ramp_verdict``, ``levels``) are tested in tests/unit/test_bench_scale.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from raftlease.client import AsyncClient
from raftlease.errors import RaftLeaseError
from raftlease.gc_pauses import FreezeSurvivors
from raftlease.recipes.sessions import AsyncSession
from raftlease.testing import LocalCluster

from ..cluster import CpuProbe, counter_delta, journal_counters, log_alerts, max_term, node_rss
from ..context import Context, progress
from ..measure import percentile

#: The golden ratio's fraction: agent i's first keep-alive comes frac(i * PHI) of an
#: interval after its open (a low-discrepancy sequence: evenly spread, no randomness).
PHI = (math.sqrt(5) - 1) / 2
#: Opens (session_open + acquire) in flight per agent process.
OPEN_CONCURRENCY = 32
#: A step's observation window, in keep-alive intervals (> 1: every agent sends one).
WINDOW_INTERVALS = 1.25
#: A step fails when fewer than this share of the keep-alives due in its window
#: completed (the rest are queued somewhere: the cluster is not keeping up).
MIN_DONE_SHARE = 0.75
#: Seconds to wait for an agent process's answer to a report / shrink / stop.
ANSWER_TIMEOUT = 60.0
#: Opening a step's agents may take 15 s plus this many seconds per agent.
OPEN_SECONDS_PER_AGENT = 0.01
#: How an agent process starts: the scripts directory on sys.path, then
#: ``agents_main``; raftlease comes from PYTHONPATH (the run's frozen copy).
BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from benchlib.workloads.scale import agents_main; sys.exit(agents_main(sys.argv[2]))"
)
SCRIPTS_DIR = Path(__file__).resolve().parents[2]

METHOD = (
    "A fresh 3-node cluster with the NodeConfig defaults (durability fsync, keepalives "
    "memory). {procs} "
    "agent processes, each one AsyncClient running its share of the agents as asyncio "
    "tasks; an agent = a lease session (TTL {ttl:g} s) holding one lease on its own key, "
    "kept alive every ttl/3 = {interval:.2f} s counted from the previous send (each "
    "keep-alive bounded by ttl/3, as the session recipe does; first keep-alive spread "
    "over the interval). The leader answers a keep-alive from memory and writes the "
    "newest promises into the log in batches (docs/design.md 9a). Ramp: "
    "{steps} step(s) up to {agents:,} agents; after a step's agents are open, every "
    "keep-alive of a {window:.1f} s window is timed; the ramp stops at a lost session, "
    "an agent that could not open, p99 > ttl/3, or fewer than {done:.0%} of the "
    "keep-alives due completed, and the failed step's agents are closed. Hold: "
    "{hold:g} s at the level reached, every keep-alive timed (client-side latency of "
    "session_keepalive, which the agent process's client sends in "
    "session_keepalive_many batches: those due in one event-loop turn or while two "
    "batches are on the wire). Lost = the cluster said the session is gone or the agent's "
    "validity ran out (no fault is injected). CPU from /proc/<pid>/stat over the hold; "
    "share = CPU seconds / hold seconds (1.0 = one core of the machine's "
    "{cpus}). RSS per node at the end of the hold."
)


# ---------------------------------------------------------------- pure parts


def summarize(latencies: list[float]) -> dict[str, Any]:
    """Count and p50 / p99 / max (ms) of keep-alive latencies given in seconds."""
    return {
        "keepalives": len(latencies),
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "max_ms": max(latencies, default=0.0) * 1000,
    }


def levels(agents: int, steps: int) -> list[int]:
    """The agent counts the ramp steps reach, increasing, the last one ``agents``."""
    steps = max(1, min(steps, agents))
    return [round(agents * (s + 1) / steps) for s in range(steps)]


def shares(total: int, processes: int) -> list[int]:
    """``total`` agents over ``processes`` processes, as evenly as possible."""
    return [total // processes + (1 if k < total % processes else 0) for k in range(processes)]


#: The counters an agent process reports cumulatively (``merge`` sums them).
COUNTERS = (
    "opened",
    "open_errors",
    "failed",
    "lost",
    "closed",
    "alive",
    # The client's keep-alive batcher (client/keepalive_batch.py): requests it sent
    # and the keep-alives they carried (their ratio: the mean batch).
    "keepalive_requests",
    "keepalives_batched",
)


def merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from every agent process's: counters and kinds summed, latencies
    (seconds) concatenated."""
    out: dict[str, Any] = {c: sum(int(r.get(c, 0)) for r in reports) for c in COUNTERS}
    out["latencies"] = [x for r in reports for x in r.get("latencies", [])]
    for kinds in ("failed_kinds", "lost_kinds", "open_error_kinds"):
        merged: dict[str, int] = {}
        for r in reports:
            for k, v in r.get(kinds, {}).items():
                merged[k] = merged.get(k, 0) + int(v)
        out[kinds] = merged
    return out


def delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, int]:
    """How much each cumulative counter grew between two merged reports."""
    return {c: int(after.get(c, 0)) - int(before.get(c, 0)) for c in COUNTERS if c != "alive"}


def window_figures(
    latencies: list[float], agents: int, seconds: float, interval: float
) -> dict[str, Any]:
    """A window's figures: latency summary, keep-alives/s, and the keep-alives due
    (``agents`` each sending one per ``interval``) over ``seconds``."""
    figures = summarize(latencies)
    figures["seconds"] = seconds
    figures["per_s"] = len(latencies) / seconds if seconds > 0 else 0.0
    figures["due"] = agents * seconds / interval if interval > 0 else 0.0
    figures["due_per_s"] = agents / interval if interval > 0 else 0.0
    return figures


def ramp_verdict(step: dict[str, Any], interval: float) -> str | None:
    """Why the ramp must stop after ``step`` (None: it held). ``step`` has the
    step's ``agents`` and the counters' growth since the previous step (``lost``,
    ``open_errors``) plus its window's figures (``window_figures``)."""
    agents = int(step["agents"])
    if step.get("open_timeout"):
        return (
            f"opening the agents of the step to {agents:,} took longer than "
            f"{step['open_timeout']:.0f} s"
        )
    if step.get("lost"):
        return f"{step['lost']} session(s) lost at {agents:,} agents"
    if step.get("open_errors"):
        # Why, by code (the ramp stops at the first step with any, so the cumulative
        # kinds are this step's): OVERLOADED is the leader's admission control.
        kinds = step.get("open_error_kinds") or {}
        why = ", ".join(f"{code} {count:,}" for code, count in sorted(kinds.items()))
        return f"{step['open_errors']} agent(s) could not open at {agents:,} agents" + (
            f" ({why})" if why else ""
        )
    if not step.get("keepalives"):
        return f"no keep-alive completed in the window at {agents:,} agents"
    if step["p99_ms"] > interval * 1000:
        return (
            f"keep-alive p99 {step['p99_ms']:,.0f} ms > ttl/3 {interval * 1000:,.0f} ms "
            f"at {agents:,} agents"
        )
    if step["keepalives"] < MIN_DONE_SHARE * step["due"]:
        return (
            f"only {step['keepalives']:,} of the ~{step['due']:,.0f} keep-alives due in "
            f"the window completed at {agents:,} agents ({step['per_s']:,.0f}/s of "
            f"{step['due_per_s']:,.0f}/s due)"
        )
    return None


# ------------------------------------------------------------- the parent


class _Agents:
    """The agent processes, driven over pipes: ``send`` a command to each,
    ``collect`` the answers (bounded waits), ``stop`` them by pid. A reader thread
    per process turns its stdout lines into messages on a queue."""

    def __init__(self, ctx: Context) -> None:
        self.logs = ctx.out / "logs"
        self.procs: list[subprocess.Popen[str]] = []
        self.queues: list[queue.Queue[dict[str, Any]]] = []
        self._log_files: list[IO[str]] = []

    def start(self, cluster: LocalCluster, ctx: Context, ttl: float) -> None:
        """Start ``scale_processes`` agent processes (not waiting for them: "ready"
        comes through ``collect``). Call ``stop`` whatever this raises: the processes
        started before a failure are in ``procs``."""
        p = ctx.profile
        self.logs.mkdir(parents=True, exist_ok=True)
        for k in range(p.scale_processes):
            args = {
                "endpoints": cluster.endpoints,
                "index": k,
                "ttl": ttl,
                "max_seconds": p.max_seconds,
            }
            log_file = (self.logs / f"scale-agents-{k}.log").open("w")
            self._log_files.append(log_file)
            proc = subprocess.Popen(
                [sys.executable, "-c", BOOT, str(SCRIPTS_DIR), json.dumps(args)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
            )
            self.procs.append(proc)
            q: queue.Queue[dict[str, Any]] = queue.Queue()
            self.queues.append(q)
            threading.Thread(
                target=_read_lines, args=(proc, q), name=f"scale-agents-{k}", daemon=True
            ).start()

    @property
    def pids(self) -> dict[str, int]:
        return {f"agents-{k}": proc.pid for k, proc in enumerate(self.procs)}

    def send(self, commands: list[dict[str, Any]]) -> None:
        """One command per process (in process order)."""
        for proc, command in zip(self.procs, commands, strict=True):
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(command) + "\n")
            proc.stdin.flush()

    def collect(self, event: str, timeout: float) -> list[dict[str, Any]]:
        """Every process's next message, which must be ``event``, within ``timeout``
        seconds in all. A late "grown" (of a grow the parent stopped waiting for) is
        skipped. Raises RuntimeError (a process exited or said something else) or
        TimeoutError."""
        deadline = time.monotonic() + timeout
        out = []
        for k, q in enumerate(self.queues):
            while True:
                try:
                    message = q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise TimeoutError(
                        f"agent process {k} did not answer {event!r} within {timeout:.0f} s"
                    ) from None
                if message.get("event") != "grown" or event == "grown":
                    break
            if message.get("event") != event:
                raise RuntimeError(
                    f"agent process {k}: expected {event!r}, got {str(message)[:300]} "
                    f"(log: {self.logs / f'scale-agents-{k}.log'})"
                )
            out.append(message)
        return out

    def ask(self, command: dict[str, Any], event: str, timeout: float) -> list[dict[str, Any]]:
        """The same command to every process, then their answers."""
        self.send([command] * len(self.procs))
        return self.collect(event, timeout)

    def stop(self) -> None:
        """Stop every agent process: "stop", then SIGTERM and SIGKILL by pid, each
        after a bounded wait. Never raises."""
        for proc in self.procs:
            with contextlib.suppress(Exception):
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({"cmd": "stop"}) + "\n")
                proc.stdin.close()
        deadline = time.monotonic() + 10.0
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=5.0)
        for f in self._log_files:
            with contextlib.suppress(OSError):
                f.close()


def _read_lines(proc: subprocess.Popen[str], q: queue.Queue[dict[str, Any]]) -> None:
    """Reader thread: each stdout line of ``proc`` as a message; "eof" at the end."""
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            message = {"event": "garbage", "line": line[:300]}
        q.put(message if isinstance(message, dict) else {"event": "garbage"})
    q.put({"event": "eof", "returncode": proc.wait()})


def scale(ctx: Context) -> None:
    """The whole phase on its own cluster (see the module docstring); records
    result.workloads["scale"] and the cluster's log alerts. Blocks until done."""
    p = ctx.profile
    ttl = p.scale_ttl
    interval = ttl / 3
    progress(
        f"scale: a fresh 3-node cluster with default settings; {p.scale_agents:,} agents "
        f"(TTL {ttl:g} s) over {p.scale_processes} processes"
    )
    ctx.method(
        "scale",
        METHOD.format(
            procs=p.scale_processes,
            ttl=ttl,
            interval=interval,
            steps=len(levels(p.scale_agents, p.scale_steps)),
            agents=p.scale_agents,
            window=WINDOW_INTERVALS * interval,
            done=MIN_DONE_SHARE,
            hold=p.scale_hold,
            cpus=os.cpu_count(),
        ),
    )
    with LocalCluster(3) as cluster:
        cluster.start()
        cluster.wait_for_leader(30)
        term0 = max_term(cluster)
        agents = _Agents(ctx)
        try:
            agents.start(cluster, ctx, ttl)
            progress(
                "scale: agent processes started, pids "
                + " ".join(str(pid) for pid in agents.pids.values())
            )
            agents.collect("ready", 60.0)
            _ramp_and_hold(ctx, cluster, agents, ttl, term0)
        finally:
            agents.stop()
            ctx.result.setdefault("node_log_alerts", {})["scale"] = log_alerts(cluster)


def _ramp_and_hold(
    ctx: Context, cluster: LocalCluster, agents: _Agents, ttl: float, term0: int
) -> None:
    p = ctx.profile
    interval = ttl / 3
    window = WINDOW_INTERVALS * interval
    entry: dict[str, Any] = {
        "mode": f"{p.scale_agents} agents",
        "agents_requested": p.scale_agents,
        "processes": p.scale_processes,
        "ttl_s": ttl,
        "interval_s": interval,
        "steps": [],
        "stopped": None,
        "sustained": 0,
        "agents_reached": 0,
        "hold": None,
        "agent_pids": list(agents.pids.values()),
        "primary": {"name": "agents_sustained", "value": 0},
    }
    ctx.workloads["scale"] = {entry["mode"]: entry}
    probe = CpuProbe({**{n.id: cluster.pid(n.id) for n in cluster.nodes}, **agents.pids})
    previous = merge(agents.ask({"cmd": "report"}, "report", ANSWER_TIMEOUT))
    t_ramp = time.monotonic()
    level = 0
    for target in levels(p.scale_agents, p.scale_steps):
        step: dict[str, Any] = {"agents": target}
        t_open = time.monotonic()
        open_bound = 15.0 + (target - level) * OPEN_SECONDS_PER_AGENT
        agents.send([{"cmd": "grow", "to": n} for n in shares(target, p.scale_processes)])
        try:
            agents.collect("grown", open_bound)
        except TimeoutError:
            step["open_timeout"] = open_bound
        step["open_seconds"] = time.monotonic() - t_open
        if "open_timeout" not in step:
            # Latencies before the window (while the step's agents opened) are not
            # the window's: this report resets them (the counters are cumulative).
            agents.ask({"cmd": "report"}, "report", ANSWER_TIMEOUT)
            leader = cluster.leader_id()
            cpu_before = probe.sample()
            t_window = time.monotonic()
            time.sleep(window)
            report = merge(agents.ask({"cmd": "report"}, "report", ANSWER_TIMEOUT))
            seconds = time.monotonic() - t_window
            step.update(window_figures(report["latencies"], target, seconds, interval))
            step.update(_cpu_share(CpuProbe.delta(cpu_before, probe.sample()), seconds, leader))
            step.update(delta(report, previous))
            step["alive"] = report["alive"]
            step["lost_kinds"] = report["lost_kinds"]
            step["failed_kinds"] = report["failed_kinds"]
            step["open_error_kinds"] = report["open_error_kinds"]
            previous = report
        entry["agents_reached"] = max(entry["agents_reached"], int(step.get("alive", 0)))
        verdict = ramp_verdict(step, interval)
        step["verdict"] = verdict
        entry["steps"].append(step)
        progress(
            f"scale: step to {target:,} agents: opened in {step['open_seconds']:.1f} s; "
            + (
                f"{step['per_s']:,.0f} keep-alives/s (due {step['due_per_s']:,.0f}/s) "
                f"p50 {step['p50_ms']:.1f} ms p99 {step['p99_ms']:.1f} ms, "
                f"lost {step['lost']}, leader CPU {step['leader_cpu_share']:.0%}"
                if "p99_ms" in step
                else "no window"
            )
            + (f"; STOP: {verdict}" if verdict else "")
        )
        if verdict:
            entry["stopped"] = verdict
            # Back to the last level that held: the hold measures a sustained level.
            agents.send([{"cmd": "shrink", "to": n} for n in shares(level, p.scale_processes)])
            alive = sum(int(m["alive"]) for m in agents.collect("shrunk", ANSWER_TIMEOUT))
            if level > 0 and alive < level:
                # Sessions lost in the failed step are replaced by new agents, so the
                # hold runs at the level that held (or shows that it no longer does).
                entry["refill"] = _refill(agents, p.scale_processes, level, alive)
            previous = merge(agents.ask({"cmd": "report"}, "report", ANSWER_TIMEOUT))
            break
        level = target
        entry["sustained"] = level
    # The ramp: from the first grow to the end of the last step's window; the agents'
    # opening alone is the sum of the steps' open_seconds.
    entry["ramp_seconds"] = time.monotonic() - t_ramp
    entry["open_seconds"] = sum(float(s["open_seconds"]) for s in entry["steps"])
    entry["primary"]["value"] = entry["sustained"]
    if entry["sustained"]:
        previous = _hold(ctx, cluster, agents, entry)
    else:
        progress("scale: no level held; no hold window")
    # Lost at any time of the phase (ramp, shrink, hold), with no fault injected.
    entry["sessions_lost"] = int(previous["lost"])
    entry["lost_kinds"] = previous["lost_kinds"]
    entry["elections"] = max_term(cluster) - term0


def _refill(agents: _Agents, processes: int, level: int, alive: int) -> dict[str, Any]:
    """Open new agents until ``level`` are alive again (bounded like a step's opening);
    what it did, for the report."""
    bound = 15.0 + (level - alive) * OPEN_SECONDS_PER_AGENT
    t0 = time.monotonic()
    progress(f"scale: {alive:,} agents left of {level:,}; opening new ones back to {level:,}")
    agents.send([{"cmd": "fill", "to": n} for n in shares(level, processes)])
    try:
        after = sum(int(m["alive"]) for m in agents.collect("grown", bound))
    except TimeoutError:
        after = -1  # not known: the hold's start says how many are alive
    return {"from": alive, "to": after, "seconds": time.monotonic() - t0}


def _hold(
    ctx: Context, cluster: LocalCluster, agents: _Agents, entry: dict[str, Any]
) -> dict[str, Any]:
    """The measured window at the sustained level; fills entry["hold"] and the
    end-of-phase figures, and returns the agents' merged report at its end."""
    p = ctx.profile
    interval = float(entry["interval_s"])
    leader = cluster.leader_id()
    probe = CpuProbe({**{n.id: cluster.pid(n.id) for n in cluster.nodes}, **agents.pids})
    progress(f"scale: holding {entry['sustained']:,} agents for {p.scale_hold:g} s")
    start = merge(agents.ask({"cmd": "report"}, "report", ANSWER_TIMEOUT))
    journal_before = journal_counters(cluster)
    cpu_before = probe.sample()
    t0 = time.monotonic()
    time.sleep(p.scale_hold)
    report = merge(agents.ask({"cmd": "report"}, "report", ANSWER_TIMEOUT))
    seconds = time.monotonic() - t0
    cpu = CpuProbe.delta(cpu_before, probe.sample())
    journal = counter_delta(journal_before, journal_counters(cluster))
    rss = node_rss(cluster)
    statuses = {str(s["node"]): s for s in cluster.statuses() if s.get("reachable")}
    alive = int(start["alive"])
    hold: dict[str, Any] = {"agents": alive, "alive_end": int(report["alive"])}
    hold.update(window_figures(report["latencies"], alive, seconds, interval))
    hold.update(delta(report, start))
    hold["failed_kinds"] = report["failed_kinds"]
    hold["lost_kinds"] = report["lost_kinds"]
    hold["cpu_s"] = cpu
    hold.update(_cpu_share(cpu, seconds, leader))
    if journal:
        hold["journal"] = journal
    entry["hold"] = hold
    entry["rss_end_mib"] = {k: v.get("VmRSS", 0.0) for k, v in rss.items()}
    leading = statuses.get(leader, {})
    entry["leader_end"] = {
        "lease_sessions": leading.get("lease_sessions"),
        "leases": leading.get("leases"),
    }
    progress(
        f"scale: held {alive:,} agents {seconds:.0f} s: {hold['per_s']:,.0f} keep-alives/s "
        f"(due {hold['due_per_s']:,.0f}/s) p50 {hold['p50_ms']:.1f} p99 {hold['p99_ms']:.1f} "
        f"max {hold['max_ms']:.0f} ms; lost {hold['lost']}; leader {leader} CPU "
        f"{hold['leader_cpu_share']:.0%} of a core; RSS MiB "
        + ", ".join(f"{k} {v:.0f}" for k, v in entry["rss_end_mib"].items())
    )
    return report


def _cpu_share(cpu: dict[str, float], seconds: float, leader: str) -> dict[str, Any]:
    """CPU seconds over a window as shares of one core, and the leader's."""
    share = {k: v / seconds for k, v in cpu.items()} if seconds > 0 else {}
    return {"leader": leader, "cpu_share": share, "leader_cpu_share": share.get(leader, 0.0)}


# ------------------------------------------------------- an agent process


class _Stats:
    """What an agent process reports: cumulative counters, kinds, and the keep-alive
    latencies since the last report. Event-loop only."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.counters = {c: 0 for c in COUNTERS if c != "alive"}
        self.kinds: dict[str, dict[str, int]] = {
            "failed_kinds": {},
            "lost_kinds": {},
            "open_error_kinds": {},
        }

    def count(self, counter: str, kinds: str | None = None, kind: str = "") -> None:
        self.counters[counter] += 1
        if kinds is not None:
            table = self.kinds[kinds]
            table[kind] = table.get(kind, 0) + 1

    def report(self, alive: int, client: AsyncClient) -> dict[str, Any]:
        latencies, self.latencies = self.latencies, []
        batcher = client.keepalives
        if batcher is not None:
            self.counters["keepalive_requests"] = batcher.batches
            self.counters["keepalives_batched"] = batcher.batched
        return {
            "event": "report",
            **self.counters,
            "alive": alive,
            **self.kinds,
            "latencies": [round(x, 6) for x in latencies],
        }


class _Agent:
    """One simulated agent: its session and its keep-alive task."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session
        self.task: asyncio.Task[None] | None = None
        self.lost = False


def agents_main(raw_args: str) -> int:
    """Entry point of an agent process (``BOOT``): ``raw_args`` is the JSON of
    endpoints, index, ttl and max_seconds. Reads commands on stdin, answers on
    stdout; exits on "stop", on stdin's end, or after max_seconds. SIGINT is ignored
    (the parent stops it by pid, also after a Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    args = json.loads(raw_args)
    # Thousands of sessions and their tasks: without it, full collections of ~0.5 s
    # every few seconds (raftlease/gc_pauses.py), as a node without it.
    FreezeSurvivors().install()
    with contextlib.suppress(asyncio.TimeoutError):
        asyncio.run(asyncio.wait_for(_agents(args), float(args["max_seconds"])))
    return 0


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def _agents(args: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    ttl = float(args["ttl"])
    interval = ttl / 3
    index = int(args["index"])
    stats = _Stats()
    agents: list[_Agent] = []
    opening = asyncio.Semaphore(OPEN_CONCURRENCY)

    async with AsyncClient(args["endpoints"]) as client:

        async def keep_alive(agent: _Agent, i: int) -> None:
            session = agent.session
            next_try = loop.time() + interval * ((i * PHI) % 1.0)
            while True:
                await asyncio.sleep(max(0.0, next_try - loop.time()))
                next_try = loop.time() + interval  # counted from this send, as the recipe
                t = time.perf_counter()
                try:
                    await session.keepalive(timeout=max(0.1, interval))
                except RaftLeaseError as exc:
                    stats.count("failed", "failed_kinds", exc.code)
                    if session.renew_failed(exc):
                        agent.lost = True
                        stats.count("lost", "lost_kinds", exc.code)
                        return
                    continue
                stats.latencies.append(time.perf_counter() - t)

        async def open_agent(i: int) -> None:
            async with opening:
                session = client.session(owner=f"scale-{index}-{i}", ttl=ttl)
                try:
                    await session.open(timeout=ttl)
                    await session.stop_keepalive()  # this agent sends them, timed
                    await session.acquire(f"bench/scale/{index}/{i}", timeout=ttl)
                except RaftLeaseError as exc:
                    stats.count("open_errors", "open_error_kinds", exc.code)
                    with contextlib.suppress(RaftLeaseError, RuntimeError):
                        await session.close(timeout=2.0)
                    return
                agent = _Agent(session)
                agent.task = asyncio.create_task(keep_alive(agent, i))
                agents.append(agent)
                stats.count("opened")

        async def close_agent(agent: _Agent) -> None:
            if agent.task is not None:
                agent.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await agent.task
            if not agent.lost:
                with contextlib.suppress(RaftLeaseError):
                    await agent.session.close(timeout=2.0)
                stats.count("closed")

        def alive() -> int:
            return sum(1 for a in agents if not a.lost)

        async def grow(start: int, want: int) -> None:
            await asyncio.gather(*(open_agent(i) for i in range(start, want)))
            _say({"event": "grown", "alive": alive()})

        _say({"event": "ready", "pid": os.getpid()})
        next_index = 0
        # The grow in progress: a task, so that a shrink (the parent gave up waiting
        # for it) is read and cancels it.
        growing: asyncio.Task[None] | None = None
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return  # the parent is gone
                command = json.loads(line)
                cmd = command.get("cmd")
                if cmd == "grow":
                    want = int(command["to"])
                    start, next_index = next_index, max(next_index, want)
                    growing = asyncio.create_task(grow(start, want))
                elif cmd == "fill":  # new agents until "to" are alive
                    need = max(0, int(command["to"]) - alive())
                    start, next_index = next_index, next_index + need
                    growing = asyncio.create_task(grow(start, start + need))
                elif cmd == "shrink":
                    if growing is not None and not growing.done():
                        growing.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await growing
                    keep = int(command["to"])
                    # The most recently opened go first (agents is in open order).
                    excess, agents[:] = agents[keep:], agents[:keep]
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(
                            asyncio.gather(*(close_agent(a) for a in excess)), ANSWER_TIMEOUT / 2
                        )
                    _say({"event": "shrunk", "alive": alive()})
                elif cmd == "report":
                    _say(stats.report(alive(), client))
                elif cmd == "stop":
                    return
        finally:
            if growing is not None:
                growing.cancel()
            for agent in agents:
                if agent.task is not None:
                    agent.task.cancel()
