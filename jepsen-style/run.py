"""Run the raftlease chaos suite: a real cluster, faults, a recorded history, checkers.

    python jepsen-style/run.py --profile ci|long|smoke|soak [--minutes N] [--seed S]
                               [--out DIR] [--planted-bug fast_log_clock]
                               [--secure | --insecure] [--many on|off]

Starts ``--nodes`` node processes on 127.0.0.1 (``raftlease.testing.LocalCluster``,
test hooks on, short timers) with a fault proxy on every node pair, runs ``--clients``
client threads plus one client process against them while the nemesis applies the
profile's schedule, then checks the history. Writes ``DIR/history.jsonl``,
``DIR/results.json``, ``DIR/timeline.html`` and the node logs (``DIR/cluster``).
With ``--secure`` (the ``ci`` default) the client ports serve TLS and every client
authenticates with its own role's token (``secure.py``).
The ``soak`` profile (default 30 minutes) also samples every node's memory, fds,
threads, journal and dump every ``--sample-every`` seconds (``soak.py``) and judges
the series: results.json ``soak``.

Exit status: 0 when every checker (and a soak's resource verdict) passes; 1 on any
violation (or a soak verdict failed); 2 when a checker could not decide (unknown);
3 when the harness itself failed; 130 when SIGINT or SIGTERM stopped it (faults
healed and every node process stopped first; nothing is judged).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import checker  # noqa: E402
import nemesis  # noqa: E402
import replay  # noqa: E402
import secure  # noqa: E402
import soak  # noqa: E402
import timeline  # noqa: E402
import trace_checker  # noqa: E402
from cancel_workload import CancelConfig, Canceller  # noqa: E402
from many_workload import ManyAgents, ManyConfig  # noqa: E402
from proc_client import ClientProcess  # noqa: E402
from proxy import ProxyNet  # noqa: E402
from queue_workload import Crasher, QueueConfig, QueueThreads, final_reads  # noqa: E402
from watch_workload import WatchConfig, WatchRecorder  # noqa: E402
from workload import (  # noqa: E402
    FencedStore,
    FencedStoreServer,
    History,
    WorkerThread,
    WorkloadConfig,
)

from raftlease import AsyncClient, Client  # noqa: E402
from raftlease.config import local_cluster  # noqa: E402
from raftlease.testing import (  # noqa: E402
    PLANTED_BUGS,
    PORT_RANGE,
    TEST_SETTINGS,
    LocalCluster,
    port_free,
)

#: Node settings: the test timers of raftlease.testing.
NODE_SETTINGS: dict[str, Any] = {**TEST_SETTINGS, "clock_drift": 0.01}
#: After a heal, some operation must complete within this many seconds. The worst
#: path: an election (election_timeout_max, possibly twice when a rejoining node
#: forces another one), a node restart replaying its journal, connection retries
#: (connection_retry) and the client's backoff (0.5 s) and attempt timeout (1 s).
LIVENESS_BOUND = 8.0
WARMUP = 3.0
COOLDOWN = 3.0
#: Exit status of a run stopped by SIGINT or SIGTERM (the shell's 128 + SIGINT).
INTERRUPTED = 130
#: How long the fenced resource waits for the cluster's answer before a write
#: (``Client.fence``); no answer in time refuses the write.
FENCE_TIMEOUT = 1.0


def find_ports(nodes: int, seed: int) -> int:
    """A base port: clients base.., raft base+100.., proxies base+200.., store base+300,
    all free and below the ephemeral range."""
    pairs = nodes * (nodes - 1) // 2
    rng = random.Random(seed ^ os.getpid())
    low, high = PORT_RANGE
    for _ in range(200):
        base = rng.randrange(low, high - 400) // 10 * 10
        wanted = [
            *range(base, base + nodes),
            *range(base + 100, base + 100 + nodes),
            *range(base + 200, base + 200 + pairs),
            base + 300,
        ]
        if all(port_free(p) for p in wanted):
            return base
    raise RuntimeError(f"no free port block in {PORT_RANGE}")


class Progress:
    def __init__(self, history: History, t0: float) -> None:
        self.history = history
        self.t0 = t0

    def __call__(self, message: str) -> None:
        c = self.history.counts
        elapsed = time.monotonic() - self.t0
        print(
            f"[{elapsed:6.1f}s] {message}  (ops ok={c['ok']} fail={c['fail']} info={c['info']})",
            flush=True,
        )


def run(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    kinds = args.kinds.split(",") if args.kinds else None
    specs = nemesis.schedule(args.profile, seed, args.minutes, kinds)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or HERE / "runs" / f"{stamp}-{args.profile}-seed{seed}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    planned = sum(s.duration + s.recovery for s in specs) + WARMUP + COOLDOWN
    # Faults start late by what each one waits beyond its plan (a leader after a power
    # loss, a heal's own work), which grows with their number: a 30-minute soak fell
    # 2 of 295 faults short with a flat 120 s, and the volume rule then calls the run
    # unknown. The run may overrun its plan by 15 % (at least 120 s) before it skips
    # the rest of the schedule.
    budget = planned + max(120.0, 0.15 * planned)
    print(
        f"raftlease chaos suite: profile={args.profile} seed={seed} nodes={args.nodes} "
        f"clients={args.clients}+1 faults={len(specs)} planned={planned:.0f}s "
        f"planted_bug={args.planted_bug or '-'} secure={_secure(args)}\noutput: {out}",
        flush=True,
    )
    (out / "schedule.json").write_text(json.dumps([s.to_json() for s in specs], indent=1))

    base = find_ports(args.nodes, seed)
    addresses = local_cluster(args.nodes, base)
    pairs = args.nodes * (args.nodes - 1) // 2
    proxies = ProxyNet(addresses, [base + 200 + i for i in range(pairs)])
    settings = dict(NODE_SETTINGS)
    # TLS on the client port and an auth file with one role per harness principal
    # (secure.py); every harness client, in this process and its children, then
    # connects with TLS and its principal's token.
    secured = _secure(args)
    if secured:
        tls_auth, clients_file = secure.make(out / "secure")
        settings.update(tls_auth)
        secure.install(clients_file)
    if args.profile == "soak":
        # Compaction by entry count, so that restarts do not put off compaction and a
        # journal sawtooth does not decide the memory rule (soak.py).
        settings["compaction_min_entries"] = soak.COMPACTION_MIN_ENTRIES
    # The nodes run the test build (raftlease.testing.node): clock control for the
    # clock faults, shadows of what reached stable storage for the power-loss fault
    # (record_synced), the trace of the model's events that trace_checker.py validates
    # (trace), and the planted bug of a self-test run.
    hooks: dict[str, Any] = {"clock_control": True, "record_synced": True, "trace": True}
    if args.planted_bug:
        hooks["planted_bug"] = args.planted_bug
    cluster = LocalCluster(
        args.nodes,
        client_port=base,
        data_dir=out / "cluster",
        settings=settings,
        node_settings=proxies.dial_settings(),
        hooks=hooks,
    )
    history = History(out / "history.jsonl")
    config = WorkloadConfig(clock_drift=settings["clock_drift"])
    # The queue workload (issue 12) runs beside the lease workload unless --queue off;
    # "auto" runs it when the client has queues.
    with_queue = args.queue == "on" or (args.queue == "auto" and hasattr(Client, "queue"))
    qconfig = QueueConfig(
        clock_drift=settings["clock_drift"],
        margin=config.margin,
        # The soak's janitor purges finished tasks, so that the replicated state levels
        # off within the warm-up (soak.py, PURGE_AFTER).
        purge_after=soak.PURGE_AFTER if args.profile == "soak" else 0.0,
    )
    # One watcher records every change it is delivered (issue 37: watch_checker.py).
    wconfig = WatchConfig()
    # One client that waits for keys of its own and gives up (issue 37: cancel_checker.py).
    cconfig = CancelConfig()
    # Agents taking sets of keys with acquire_many, and induced cycles of waits (issue
    # 40: many_checker.py), with --many on.
    mconfig = ManyConfig() if args.many == "on" else None
    t0 = time.monotonic()
    say = Progress(history, t0)
    history.append(
        {
            "type": "meta",
            "t": t0,
            "profile": args.profile,
            "seed": seed,
            "nodes": args.nodes,
            "clients": args.clients,
            "keys": list(config.keys),
            "shared_keys": config.capacities,
            "ttls": list(config.ttls),
            "session_workers": [
                f"c{i + 1}" for i in range(min(args.clients, config.session_workers))
            ],
            "session_ttl": config.session_ttl,
            "rho": config.clock_drift,
            "margin": config.margin,
            "liveness_bound": LIVENESS_BOUND,
            "planted_bug": args.planted_bug or "",
            # TLS and authentication on (secure.py); the probes prove it.
            "secure": secured,
            # The fenced resource asks the cluster before every write (workload.py).
            "fence": "cluster",
            "queues": qconfig.meta() if with_queue else {},
            "watch": wconfig.meta(),
            "cancel": cconfig.meta(),
            "many": mconfig.meta() if mconfig is not None else {},
            "settings": settings,
            "schedule": [s.to_json() for s in specs],
        }
    )
    stop = threading.Event()
    workers: list[WorkerThread] = []
    proc: ClientProcess | None = None
    server: FencedStoreServer | None = None
    fence_client: Client | None = None
    nem: nemesis.Nemesis | None = None
    monitor: soak.Monitor | None = None
    queue_threads: QueueThreads | None = None
    crasher: Crasher | None = None
    watcher: WatchRecorder | None = None
    canceller: Canceller | None = None
    many: ManyAgents | None = None
    status = 0
    deadline = t0 + budget
    try:
        proxies.start()
        cluster.start(timeout=60)
        say(f"cluster up: leader {cluster.leader_id()}")
        endpoints = cluster.endpoints

        def watch_client() -> AsyncClient:
            return AsyncClient(
                endpoints,
                deadline=max(config.deadlines),
                attempt_timeout=config.attempt_timeout,
                **secure.client_options("watcher"),
            )

        # Started before any client, from revision 1: it sees the first term whole.
        watcher = WatchRecorder("watch1", watch_client, history.append, wconfig, stop)
        watcher.start()
        say(f"watcher: every change from revision 1, a new stream every {wconfig.rotate_every} s")

        def cancel_client() -> AsyncClient:
            return AsyncClient(
                endpoints,
                deadline=max(config.deadlines),
                attempt_timeout=config.attempt_timeout,
                **secure.client_options("canceller"),
            )

        canceller = Canceller("x1", cancel_client, history.append, cconfig, seed + 17, stop)
        canceller.start()
        say(f"canceller: up to {cconfig.attempts} waits on {list(cconfig.keys)}, given up")
        if mconfig is not None:

            def many_client() -> AsyncClient:
                return AsyncClient(
                    endpoints,
                    deadline=max(config.deadlines),
                    attempt_timeout=config.attempt_timeout,
                    **secure.client_options("many-agent"),
                )

            many = ManyAgents("s1", many_client, history.append, mconfig, seed + 19, stop)
            many.start()
            say(
                f"many: {mconfig.agents} agents taking sets of {list(mconfig.keys)}, "
                f"cycles induced on {list(mconfig.cycle_keys)}"
            )
        if args.profile == "soak":
            monitor = soak.Monitor(
                lambda: _node_processes(cluster), args.sample_every, deadline
            ).start()
            say(f"soak monitor: every node sampled every {args.sample_every} s")
        # The resource's own client: it asks the cluster whether a writer's token is
        # the current holder's, so what it accepts is raftlease's decision.
        fence_client = Client(
            cluster.endpoints,
            deadline=FENCE_TIMEOUT,
            attempt_timeout=FENCE_TIMEOUT,
            clock_drift=config.clock_drift,
            margin=config.margin,
            **secure.client_options("resource"),
        )
        asker = fence_client

        def ask(key: str, token: int) -> bool:
            return bool(asker.fence(key, token, timeout=FENCE_TIMEOUT))

        store = FencedStore(history, cluster=ask)
        server = FencedStoreServer(store, base + 300).start()
        end = t0 + 10 * planned + 600  # workers stop on ``stop``; this is a backstop
        for i in range(args.clients):
            worker = WorkerThread(
                f"c{i + 1}",
                cluster.endpoints,
                store,
                history,
                config,
                seed * 1000 + i,
                stop,
                end,
                # The first few threads hold their plain-key leases through a session.
                session_ttl=config.session_ttl if i < config.session_workers else None,
            )
            worker.start()
            workers.append(worker)
        proc = ClientProcess(
            "p1",
            cluster.endpoints,
            server.addr,
            history,
            budget + 60,  # the client process outlives the schedule, however late
            seed + 7,
            config.keys,
            shared_keys=config.shared_keys,
        )
        if with_queue:
            queue_threads = QueueThreads(
                cluster.endpoints, history, qconfig, seed + 11, stop
            ).start()
            crasher = Crasher(cluster.endpoints, history, qconfig, seed + 13, stop).start()
            say(
                f"queue workload: {qconfig.producers} producer(s), {qconfig.workers} worker "
                f"thread(s), {qconfig.processes} worker process(es) SIGKILLed now and then"
            )
        nem = nemesis.Nemesis(cluster, proxies, history, config.clock_drift, proc, say)
        time.sleep(WARMUP)
        say("warm-up done")
        for answer in secure.probe(cluster.endpoints, history.append):
            say(f"security probe {answer['probe']}: {answer.get('code') or answer.get('error')}")
        for n, spec in enumerate(specs):
            if time.monotonic() > deadline:
                say(f"time budget exhausted: skipping the last {len(specs) - n} faults")
                break
            nem.run(spec)
            stop.wait(spec.recovery)
            if time.monotonic() - history.last_progress > spec.recovery:
                snap = nem.snapshot(f"no progress {spec.recovery} s after healing {spec.kind}")
                time.sleep(1.0)
                nem.snapshot("one second later")
                say(f"WARNING: no progress since the heal; cluster: {json.dumps(snap['nodes'])}")
        nem.heal_all()
        stop.wait(COOLDOWN)
        say("schedule done; stopping clients")
    except KeyboardInterrupt:
        # SIGINT, or SIGTERM (main installs the handler): heal, stop the clients and
        # every node process, and skip the final reads, which would wait on a cluster
        # nobody wants any more. Nodes must never outlive the harness.
        say("interrupted: healing faults, stopping clients and nodes (no final reads)")
        status = INTERRUPTED
    except Exception:
        traceback.print_exc()
        status = 3
    finally:
        # From here on a signal must not cut the cleanup short and orphan the nodes:
        # it is only noted (and skips the final reads if they have not started).
        late = _defer_stop_signals()
        if status == INTERRUPTED:
            late.set()
        if monitor is not None:
            monitor.stop()  # the last sample is taken under load, before the clients stop
        stop.set()
        if nem is not None:
            with contextlib.suppress(Exception):
                nem.heal_all()
        for worker in workers:
            worker.join(timeout=15)
        if watcher is not None:
            watcher.join(timeout=15)
        if canceller is not None:
            canceller.join(timeout=30)
        if many is not None:
            many.join(timeout=30)
        if proc is not None:
            proc.stop()
        if queue_threads is not None:
            queue_threads.join()
        if crasher is not None:
            crasher.join()
        if queue_threads is not None and nem is not None and status == 0 and not late.is_set():
            # Every acknowledged put's end, read while the healed cluster still runs.
            counts = final_reads(cluster.endpoints, history, qconfig, queue_threads.acknowledged)
            say(f"queue final reads: {counts}")
        if fence_client is not None:
            with contextlib.suppress(Exception):
                fence_client.close()
        final: dict[str, Any] | None = None
        if nem is not None and status == 0 and not late.is_set():
            final = nem.final_state(record=False)
            say(f"replicas converged: {final['converged']}")
        with contextlib.suppress(Exception):
            cluster.stop()
        if final is not None:
            final["replay"] = _replay(cluster, final)
            history.append(final)
            rebuilt = final["replay"]
            say(
                f"replicas rebuilt offline at index {rebuilt['index']}: "
                f"{len({n['digest'] for n in rebuilt['nodes'].values()})} distinct state(s) "
                f"over {len(rebuilt['nodes'])} node(s); problems: {rebuilt['problems'] or '-'}"
            )
        proxies.stop()
        if server is not None:
            server.stop()
        history.close()
    if late.is_set():
        print(f"interrupted: nothing judged; the history so far is in {out / 'history.jsonl'}")
        return INTERRUPTED
    errors = [f"{w.worker_name}: {w.error!r}" for w in workers if w.error is not None]
    errors += [
        *(queue_threads.errors if queue_threads else []),
        *(crasher.errors if crasher else []),
        *(watcher.errors if watcher else []),
        *(canceller.errors if canceller else []),
        *(many.errors if many else []),
    ]
    if errors:
        print("worker errors:", *errors, sep="\n  ")
    events = checker.load_history(out / "history.jsonl")
    say(f"checking {len(events)} events")
    # Long enough profiles must show real volume, far below what a healthy run does
    # (ci --seed 1: 180+ grants and 120+ contended intervals per key, 790 reads during
    # faults), far above what an idle or broken workload does.
    busy = {"min_grants": 20, "min_contended": 10, "min_reads_during_faults": 50}
    overrides: dict[str, Any] = busy if args.profile != "smoke" else {}
    if {s.kind for s in specs} <= nemesis.NO_QUORUM:
        # Every fault leaves no quorum (e.g. --kinds power-loss): none can answer a read.
        overrides = {**overrides, "min_reads_during_faults": 0}
    need = checker.VolumeRequirements.from_meta(events, **overrides)
    try:
        results = checker.check(events, volume=need)
    except Exception:
        # A checker that crashes decided nothing: a harness failure, not a verdict.
        traceback.print_exc()
        return 3
    _check_trace(results, cluster)
    results["seed"] = seed
    results["profile"] = args.profile
    results["planted_bug"] = args.planted_bug or ""
    results["faults_run"] = sorted(
        {e["fault"] for e in events if e.get("type") == "nemesis" and e.get("f") == "start"}
    )
    results["wall_seconds"] = round(time.monotonic() - t0, 1)
    results["harness_errors"] = errors + (["harness failed (see output)"] if status == 3 else [])
    if monitor is not None:
        results["soak"] = {
            **soak.verdict(monitor.samples),
            "interval": args.sample_every,
            "minutes": nemesis.DEFAULT_MINUTES["soak"] if args.minutes is None else args.minutes,
            "faults": sum(
                1 for e in events if e.get("type") == "nemesis" and e.get("f") == "start"
            ),
            "series": soak.series(monitor.samples),
        }
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    categories = {k: v[0] for k, v in nemesis.KINDS.items()}
    (out / "timeline.html").write_text(timeline.render(events, results, categories))
    _summary(results, out)
    if status:
        return status
    resources = results.get("soak", {}).get("valid", True)
    if results["valid"] is False or resources is False:
        return 1
    if results["valid"] != "unknown" and resources is True and not errors:
        return 0
    return 2 if "unknown" in (results["valid"], resources) else 3


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM and SIGINT handler (main thread): stop the run as Ctrl-C does, so
    ``run``'s cleanup stops every node process instead of leaving them running. Set
    for SIGINT too, not left to Python's default: a run started as a background job
    inherits SIGINT ignored, and Ctrl-C must still stop it."""
    raise KeyboardInterrupt(f"signal {signum}")


def _defer_stop_signals() -> threading.Event:
    """From the start of ``run``'s cleanup: SIGINT/SIGTERM no longer raise, they set
    the returned event (and say so), so the cleanup always reaches the nodes' stop.
    Main thread only (``signal.signal``). SIGKILL still ends the harness at once, and
    then the nodes are left behind."""
    late = threading.Event()

    def note(signum: int, frame: object) -> None:
        if not late.is_set():
            print(f"signal {signum}: stopping the nodes, then exiting", flush=True)
        late.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, note)
    return late


def _secure(args: argparse.Namespace) -> bool:
    """TLS and authentication on: ``--secure``/``--insecure``, else on for ``ci``."""
    return bool(args.secure) if args.secure is not None else args.profile == "ci"


def _node_processes(cluster: LocalCluster) -> dict[str, tuple[int | None, Path]]:
    """What the soak monitor samples: each node's pid (None while it is down) and data
    directory. Called on the monitor's thread; reads ``cluster.procs`` only."""
    out: dict[str, tuple[int | None, Path]] = {}
    for node in cluster.nodes:
        proc = cluster.procs.get(node.id)
        pid = proc.pid if proc is not None and proc.returncode is None else None
        out[node.id] = (pid, cluster.node_dir(node.id))
    return out


def _summary(results: dict[str, Any], out: Path) -> None:
    print("\n== results ==")
    for name, result in results["checkers"].items():
        line = f"{name:18} {result['valid']!s:8} violations={result['violation_count']}"
        print(line)
        for v in result["violations"][:3]:
            print("    ", json.dumps(v, default=str)[:400])
        for u in result.get("unknown", [])[:3]:
            print("     unknown:", json.dumps(u, default=str)[:300])
    print(f"ops: {results['ops']}")
    live = results["checkers"]["liveness"]["stats"]
    print(f"liveness: bound {live['bound']} s, max recovery {live['max_recovery']} s")
    volume = results["volume"]
    stats = volume["stats"]
    print(
        f"volume {volume['valid']!s:8} grants {stats['grants_per_key']} contended "
        f"{stats['contended_per_key']} reads during faults {stats['reads_during_faults']} "
        f"late writes refused {stats['late_writes_refused']} (paused client "
        f"{stats['pause_client_writes_refused']}) heals {stats['heals_measured']}/"
        f"{stats['heals']} kinds {len(stats['fault_kinds_executed'])}"
    )
    for v in volume["violations"][:10]:
        print("     short:", json.dumps(v, default=str)[:300])
    if "soak" in results:
        print(*soak.summary_lines(results["soak"]), sep="\n")
    resources = f"   resources (soak): {results['soak']['valid']}" if "soak" in results else ""
    print(f"VERDICT: {results['valid']}{resources}   ({results['wall_seconds']} s)   {out}")


def _check_trace(results: dict[str, Any], cluster: LocalCluster) -> None:
    """Add the nodes' traces, validated against the model's rules (trace_checker.py),
    to ``results`` as the checker ``trace``, and fold its verdict into the run's. A
    checker that crashes is a problem (unknown), never a pass."""
    try:
        found = trace_checker.check_dir(cluster.data_dir, [n.id for n in cluster.nodes])
    except Exception as exc:
        traceback.print_exc()
        found = {
            "valid": "unknown",
            "violation_count": 0,
            "violations": [],
            "unknown": [f"trace check failed: {type(exc).__name__}: {exc}"],
        }
    results["checkers"]["trace"] = found
    if found["valid"] is False:
        results["valid"] = False
    elif found["valid"] == "unknown" and results["valid"] is True:
        results["valid"] = "unknown"


def _replay(cluster: LocalCluster, final: dict[str, Any]) -> dict[str, Any]:
    """Every stopped node's state machine rebuilt from its data directory at one
    committed index (``replay.compare``); any failure is a problem (unknown), never a
    pass. Also records how each node exited (a clean stop is status 0)."""
    applied = {
        nid: (st or {}).get("applied_index") for nid, st in (final.get("nodes") or {}).items()
    }
    try:
        out = replay.compare(cluster.data_dir, [n.id for n in cluster.nodes], applied)
    except Exception as exc:
        traceback.print_exc()
        out = {
            "index": None,
            "nodes": {},
            "log_conflicts": [],
            "problems": [f"replay failed: {type(exc).__name__}: {exc}"],
        }
    out["exit_codes"] = {nid: proc.returncode for nid, proc in cluster.procs.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=list(nemesis.PROFILES), default="ci")
    parser.add_argument("--minutes", type=float, default=None, help="length of the run")
    parser.add_argument("--seed", type=int, default=None, help="reproduce a schedule")
    parser.add_argument("--out", default=None, help="output directory")
    parser.add_argument(
        "--planted-bug",
        default="",
        choices=["", *sorted(PLANTED_BUGS)],
        help="run the nodes as a planted-bug test build (raftlease.testing.hooks)",
    )
    parser.add_argument("--nodes", type=int, default=5)
    security = parser.add_mutually_exclusive_group()
    security.add_argument(
        "--secure",
        dest="secure",
        action="store_true",
        default=None,
        help="TLS on the client port, tokens and roles for every client (default for ci)",
    )
    security.add_argument(
        "--insecure",
        dest="secure",
        action="store_false",
        help="plain TCP, no authentication (default for every profile but ci)",
    )
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--kinds", default="", help="comma-separated fault kinds (default all)")
    parser.add_argument(
        "--queue",
        choices=["auto", "on", "off"],
        default="auto",
        help="the task-queue workload beside the leases (auto: when the client has queues)",
    )
    parser.add_argument(
        "--many",
        choices=["on", "off"],
        default="off",
        help="agents taking sets of keys with acquire_many beside the leases (issue 40)",
    )
    parser.add_argument(
        "--sample-every",
        type=float,
        default=soak.SAMPLE_EVERY,
        help="soak profile: seconds between resource samples of every node",
    )
    args = parser.parse_args(argv)
    if args.sample_every <= 0:
        parser.error("--sample-every must be positive")
    if args.nodes < 3:
        parser.error("--nodes must be at least 3")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupt)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
