"""What one benchmark run shares: its profile, constants, the result document being
built, progress lines on stderr, and the frozen copy of the raftlease code it runs.

Nothing here imports raftlease when the module loads: ``freeze_raftlease`` has to run
before the first ``import raftlease`` of the process, and ``scripts/bench --render``
needs no raftlease at all.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import hashlib
import importlib.metadata
import importlib.util
import itertools
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raftlease.client import Lease

#: The result of a run: the document written to bench.json (JSON types only), with
#: the top-level keys meta, raw, workloads, targets, methods, then raw_conf, durability
#: and node_log_alerts when those phases ran (a result saved before the durability
#: phase existed has no durability key; everything that reads it takes it as optional).
Result = dict[str, Any]

#: TTLs (seconds) of the leases the workloads create.
TTL_FRESH = 30.0
TTL_POOL = 120.0
TTL_MEMORY = 3600.0

#: Workload groups run on the main cluster, in order (``--only`` names).
#: ``certs`` (issue 39) measures signing there and the audit's share after it
#: (workloads/certs.py).
MAIN_GROUPS = ("acquire", "renew", "release", "holder", "certs", "handoff", "failover")
GROUPS = ("raw", "durability", "security", *MAIN_GROUPS, "memory", "tasks", "scale")

#: Values of raftlease's ``NodeConfig.durability`` the durability phase can compare
#: (written here, not imported: ``scripts/bench`` checks ``--durability`` before the
#: frozen copy of raftlease is made, and ``--render`` imports no raftlease).
DURABILITY_MODES = ("fsync", "none")
#: The throughput groups the durability phase measures in each mode, in order.
DURABILITY_GROUPS = ("acquire", "renew")

#: Groups that are not throughput tables (no ops/s row, no election count under load).
NON_THROUGHPUT_GROUPS = ("failover", "memory", "snapshot", "task memory", "scale")

#: Bounds on error loops: a workload stops after this many failed calls.
MAX_ERRORS = 2000

#: Start of the run (monotonic); progress lines and meta.elapsed_s count from here.
T0 = time.monotonic()


class BenchTimeout(Exception):
    """The run hit its time limit or was asked to stop (SIGTERM); raised on the main
    thread by the runner's signal handler, it ends the run through the normal
    clean-up. A workload that isolates its own failures must let it through."""


def progress(message: str) -> None:
    """One progress line on stderr, stamped with the seconds since the run started.
    Called from the main thread and from workload threads (one ``print`` each)."""
    print(f"[{time.monotonic() - T0:7.1f} s] {message}", file=sys.stderr, flush=True)


def isolated(
    workloads: dict[str, Any],
    label: str,
    group: str,
    fn: Callable[[], None],
    on_failure: Callable[[], object] | None = None,
) -> bool:
    """Run one workload ``group`` so that its failure does not end the run: an
    exception other than ``BenchTimeout`` or ``KeyboardInterrupt`` is recorded as
    ``workloads[group]["error"]`` (the modes measured before it are kept), shown on
    stderr after ``label``, and ``on_failure`` is called (to save the nodes' logs).
    Returns True if ``fn`` returned. Main thread; blocks while ``fn`` runs."""
    try:
        fn()
        return True
    except (BenchTimeout, KeyboardInterrupt):
        raise
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
        workloads.setdefault(group, {})["error"] = message
        progress(f"{label}{group}: FAILED: {message}")
        if on_failure is not None:
            on_failure()
        return False


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec``, or "-" when it was not measured."""
    return "-" if value is None else format(value, spec)


# ------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class Profile:
    """Sizes and durations of one kind of run (the full one or ``--quick``)."""

    name: str
    repeat: int
    duration: float  # seconds per measured repetition
    warmup: float  # seconds of warm-up per workload
    threads: int
    async_tasks: int
    raw_inflight: tuple[int, ...]
    renew_pool: int
    handoff_clients: int
    failover_reps: int
    memory_leases: int
    preload_inflight: int
    snapshot_compaction_entries: int
    snapshot_compaction_time: float
    snapshot_steady: float
    max_seconds: float
    settle: float  # max seconds to wait for a quiet machine before each repetition
    #: The durability modes measured side by side, in run order (``--durability``).
    durability: tuple[str, ...] = DURABILITY_MODES
    #: Tries of the storage probe (write + the node's journal sync of one page).
    sync_probe: int = 200
    #: Ready tasks the task-queue memory phase queues (workloads/tasks.py).
    queued_tasks: int = 100_000
    #: Seconds after the lease load before the memory phase reads RSS again
    #: ("settled": a log compaction, compaction_min_time 30 s, and two heap trims,
    #: heap_trim_interval 30 s, have run); 0 skips it.
    memory_settle: float = 65.0
    #: etcd / ZooKeeper clusters measured beside raftlease (``--anchors``; issue 16).
    anchors: tuple[str, ...] = ()
    #: The security phase (issue 11: client TLS + auth against none, two clusters)
    #: runs in this profile; without it, only when ``--only`` names it.
    security: bool = True
    #: Rounds of the security phase's peer TLS comparison (issue 35): each round a
    #: plain-peers cluster then a peer-TLS one, measured back to back, so that a
    #: drift of the machine's load shows in one round, not as a cost.
    peer_rounds: int = 6
    #: The scale phase (issue 16; workloads/scale.py): agents with a lease session of
    #: ``scale_ttl`` s holding one lease each, over ``scale_processes`` client
    #: processes, ramped in ``scale_steps`` steps, then held ``scale_hold`` s.
    scale_agents: int = 20_000
    scale_processes: int = 4
    scale_ttl: float = 10.0
    scale_steps: int = 10
    scale_hold: float = 60.0
    #: The certs group (issue 39; workloads/certs.py): ``cert_rounds`` alternating
    #: rounds of 1-thread acquire without and with a holder key on the main cluster;
    #: ``audit_rounds`` rounds of an audit-off test build's cluster against a default
    #: one (0: none, the audit's share is then only estimated); the state machine's
    #: ``cert_apply_pairs`` acquire+release pairs with and without the trail, best of
    #: ``cert_apply_tries``; ``cert_verify_seconds`` of verification on one core.
    cert_rounds: int = 6
    audit_rounds: int = 4
    cert_apply_pairs: int = 20_000
    cert_apply_tries: int = 6
    cert_verify_seconds: float = 2.0

    @property
    def concurrent_modes(self) -> list[str]:
        """Names of the concurrent modes of the throughput workloads (besides
        "1 thread"), as they appear in the result."""
        return [f"{self.threads} threads", f"async {self.async_tasks}"]


FULL = Profile(
    name="full",
    repeat=5,
    duration=3.0,
    warmup=1.0,
    threads=16,
    async_tasks=256,
    raw_inflight=(100, 1000),
    renew_pool=2000,
    handoff_clients=8,
    failover_reps=5,
    memory_leases=100_000,
    preload_inflight=512,
    snapshot_compaction_entries=20_000,
    snapshot_compaction_time=3.0,
    snapshot_steady=15.0,
    # The durability phase adds two clusters' worth of acquire and renew to the
    # ~30 min of the other phases; the settle waits can stretch every repetition.
    # The scale phase adds a ramp (~1-2 min) and a 60 s hold.
    max_seconds=5700.0,
    settle=10.0,
)

QUICK = Profile(
    name="quick",
    repeat=2,
    duration=0.25,
    warmup=0.1,
    threads=16,
    async_tasks=256,
    raw_inflight=(100, 1000),
    renew_pool=300,
    handoff_clients=8,
    failover_reps=1,
    memory_leases=5_000,
    preload_inflight=512,
    snapshot_compaction_entries=1_000,
    snapshot_compaction_time=1.0,
    snapshot_steady=3.0,
    max_seconds=150.0,
    settle=0.0,
    sync_probe=50,
    queued_tasks=2_000,
    memory_settle=0.0,
    # Two more clusters would not fit tests/integration/test_bench.py's limit; --only security runs
    # it.
    security=False,
    peer_rounds=1,
    # A smoke run of the scale phase (~10 s): one step, a shorter TTL so that a few
    # keep-alive intervals fit; not judged (the target names 20,000 agents, TTL 10 s).
    scale_agents=300,
    scale_processes=2,
    scale_ttl=6.0,
    scale_steps=1,
    scale_hold=4.0,
    # The certs group in ~3 s on the main cluster: two signing rounds, a small state
    # machine measurement, no audit-off clusters (two more clusters would not fit).
    cert_rounds=2,
    audit_rounds=0,
    cert_apply_pairs=1_000,
    cert_apply_tries=2,
    cert_verify_seconds=0.2,
)

#: By ``Profile.name``, as recorded in meta.profile (a saved result names its profile).
PROFILES = {p.name: p for p in (FULL, QUICK)}


# ------------------------------------------------------------------- context


class Context:
    """The state the workloads of one run share: profile, output directory, the
    ``--only`` selection and the result being built.

    Workloads run one after another on the main thread and write the result there;
    their load threads only call ``key``, which is safe from any thread (``next`` on
    an ``itertools.count`` is atomic under the GIL)."""

    def __init__(self, profile: Profile, out: Path, only: set[str] | None = None) -> None:
        self.profile = profile
        self.out = out
        self.only = only
        self._keys = itertools.count()
        #: Leases created by the renew workload, reused by the holder reads.
        self.renew_pool: list[Lease] = []
        #: Put before each measurement's progress line (a scoped context's cluster).
        self.label = ""
        self.result: Result = {
            "meta": {},
            "raw": {},
            "workloads": {},
            "targets": [],
            "methods": {},
        }
        self._workloads: dict[str, Any] = self.result["workloads"]

    @property
    def workloads(self) -> dict[str, Any]:
        """Where ``record`` puts entries: result["workloads"], or a scoped context's
        own section."""
        return self._workloads

    def scoped(self, workloads: dict[str, Any], label: str) -> Context:
        """A context for workloads run on another cluster (the durability phase):
        it shares this one's profile, result (raw figures, methods) and key counter, but
        records its entries in ``workloads`` instead of result["workloads"], has its
        own renew pool, wants every group, and starts its progress lines with ``label``."""
        child = copy.copy(self)
        child._workloads = workloads
        child.renew_pool = []
        child.only = None
        child.label = label
        return child

    def key(self, prefix: str) -> str:
        """A key no earlier call of this run returned."""
        return f"bench/{prefix}/{next(self._keys)}"

    def wanted(self, group: str) -> bool:
        return self.only is None or group in self.only

    def record(self, group: str, mode: str, entry: dict[str, Any]) -> None:
        self.workloads.setdefault(group, {})[mode] = entry

    def method(self, name: str, text: str) -> None:
        """The report's description of how ``name`` was measured."""
        self.result["methods"][name] = text


# ------------------------------------------------------ reading the result


def first_variant(workloads: dict[str, Any], group: str) -> dict[str, Any] | None:
    """The first measured variant of ``group`` (None if absent or failed)."""
    for value in workloads.get(group, {}).values():
        if isinstance(value, dict):
            return value
    return None


def raw_sync(result: Result) -> float:
    """Raw PySyncObj's median ops/s with one synchronous thread (0.0 if not run)."""
    entry = result["raw"].get("sync_1thread")
    return float(entry["ops_per_s"]["median"]) if entry else 0.0


def durability_entry(
    result: Result, durability: str, group: str, mode: str
) -> dict[str, Any] | None:
    """The entry of ``group`` in ``mode`` measured on the ``durability`` cluster of the
    durability phase (None if that phase, mode or workload was not run or failed)."""
    try:
        entry = result["durability"]["clusters"][durability]["workloads"][group][mode]
    except (KeyError, TypeError):
        return None
    return entry if isinstance(entry, dict) else None


def security_entry(result: Result, cluster: str, group: str, mode: str) -> dict[str, Any] | None:
    """The entry of ``group`` in ``mode`` measured on the ``cluster`` ("insecure" or
    "secure") of the security phase (None if that phase, cluster or workload was not
    run or failed)."""
    try:
        entry = result["security"]["clusters"][cluster]["workloads"][group][mode]
    except (KeyError, TypeError):
        return None
    return entry if isinstance(entry, dict) else None


def peer_round_ratios(result: Result, group: str, mode: str) -> list[float]:
    """The security phase's peer TLS rounds: per round, the peer-TLS cluster's median
    rate of ``group`` in ``mode`` over the plain-peers cluster's (rounds where either
    was not measured are left out; empty without the rounds)."""
    try:
        rounds = result["security"]["peer_rounds"]["rounds"]
    except (KeyError, TypeError):
        return []
    ratios = []
    for pair in rounds:
        try:
            tls = pair["insecure"]["workloads"][group][mode]["ops_per_s"]["median"]
            plain = pair["plain-peers"]["workloads"][group][mode]["ops_per_s"]["median"]
        except (KeyError, TypeError):
            continue
        if plain:
            ratios.append(float(tls) / float(plain))
    return ratios


def _arm_entry(arm: Any, group: str, mode: str) -> dict[str, Any] | None:
    """The entry of ``group`` in ``mode`` of one arm of a certs round (None if absent
    or failed)."""
    try:
        entry = arm["workloads"][group][mode]
    except (KeyError, TypeError):
        return None
    return entry if isinstance(entry, dict) else None


def cert_round_figures(result: Result) -> list[dict[str, float]]:
    """The certs group's signing rounds (workloads/certs.py): per round where both
    arms were measured, ``p50_ratio`` (certified p50 latency / plain p50),
    ``rate_ratio`` (certified throughput / plain) and ``errors`` (of the certified
    arm: failed calls and answers without a certificate). Empty without the rounds."""
    try:
        signing = result["certs"]["signing"]
        rounds, mode = signing["rounds"], signing["mode"]
    except (KeyError, TypeError):
        return []
    out = []
    for pair in rounds:
        plain = _arm_entry(pair.get("plain"), "acquire", mode)
        signed = _arm_entry(pair.get("certified"), "acquire", mode)
        if plain is None or signed is None:
            continue
        p50, rate = float(plain["p50_ms"]), float(plain["ops_per_s"]["median"])
        if p50 <= 0 or rate <= 0:
            continue
        out.append(
            {
                "p50_ratio": float(signed["p50_ms"]) / p50,
                "rate_ratio": float(signed["ops_per_s"]["median"]) / rate,
                "errors": float(signed.get("errors", 0)),
            }
        )
    return out


def audit_round_ratios(result: Result) -> list[float]:
    """The certs group's audit rounds: per round, the default build's median acquire
    throughput over the audit-off build's, in the rounds' mode (rounds where either
    was not measured are left out; empty without the rounds)."""
    try:
        section = result["certs"]["audit_rounds"]
        rounds, mode = section["rounds"], section["mode"]
    except (KeyError, TypeError):
        return []
    ratios = []
    for pair in rounds:
        on = _arm_entry(pair.get("audited"), "acquire", mode)
        off = _arm_entry(pair.get("unaudited"), "acquire", mode)
        if on is None or off is None or not off["ops_per_s"]["median"]:
            continue
        ratios.append(float(on["ops_per_s"]["median"]) / float(off["ops_per_s"]["median"]))
    return ratios


#: Node processes of every cluster the benchmark starts: each applies every entry.
CLUSTER_NODES = 3


def audit_share_estimate(result: Result) -> dict[str, Any] | None:
    """The audit's share of acquire throughput estimated from two measurements of the
    run: the state machine's audit cost per acquire+release pair (certs.apply; two
    records, where an acquire alone makes one) times the ``CLUSTER_NODES`` nodes that
    each apply it, over the smallest server CPU per acquire (all nodes, µs) the run
    measured (acquire on the main cluster, the signing rounds' plain arm, the audit
    rounds' default build). Both choices overstate the share: an upper bound while
    the cores are the bottleneck. None without the two figures."""
    try:
        audit_us = float(result["certs"]["apply"]["audit_us"])
    except (KeyError, TypeError):
        return None
    entries: list[tuple[str, dict[str, Any]]] = []
    for mode, entry in (result.get("workloads", {}).get("acquire") or {}).items():
        if isinstance(entry, dict):
            entries.append((f"acquire [{mode}]", entry))
    certs = result["certs"]
    for section, arm in (("signing", "plain"), ("audit_rounds", "audited")):
        block = certs.get(section) or {}
        for n, pair in enumerate(block.get("rounds") or [], 1):
            entry = _arm_entry(pair.get(arm), "acquire", str(block.get("mode")))
            if entry is not None:
                entries.append((f"{section} round {n} {arm} [{block.get('mode')}]", entry))
    costs = [
        (float(e["cpu_us_per_op"]["servers"]), where)
        for where, e in entries
        if float((e.get("cpu_us_per_op") or {}).get("servers", 0.0)) > 0
    ]
    if not costs:
        return None
    servers_us, where = min(costs)
    return {
        "share": CLUSTER_NODES * max(0.0, audit_us) / servers_us,
        "audit_us_per_pair": audit_us,
        "servers_us_per_acquire": servers_us,
        "from": where,
    }


def raw_pipelined(result: Result) -> float:
    """Raw PySyncObj's best median ops/s pipelined (0.0 if not run)."""
    return max(
        (
            float(v["ops_per_s"]["median"])
            for k, v in result["raw"].items()
            if k.startswith("pipelined")
        ),
        default=0.0,
    )


# ------------------------------------------------------- code and machine


def freeze_raftlease() -> dict[str, str]:
    """Copy the raftlease package to a temporary directory and import it from there,
    in this process and (through PYTHONPATH) in every node process started later, so
    that edits to the working tree during a long run cannot mix two versions of the
    code in one measurement (e.g. a node restarted by the failover workload).

    Must run before anything in this process imports raftlease. Returns the
    meta.code record: the source directory, a hash of every ``.py`` file of the
    package (subpackages included) and the git HEAD. The copy is removed at exit."""
    spec = importlib.util.find_spec("raftlease")
    if spec is None or not spec.submodule_search_locations:
        return {}
    src = Path(next(iter(spec.submodule_search_locations)))
    frozen = Path(tempfile.mkdtemp(prefix="raftlease-bench-src-"))
    # copytree copies subpackages too; caches would only make the copy slower.
    shutil.copytree(src, frozen / "raftlease", ignore=shutil.ignore_patterns("__pycache__"))
    atexit.register(shutil.rmtree, frozen, ignore_errors=True)
    sys.path.insert(0, str(frozen))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(frozen), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    # Node processes run ``python -m raftlease``, which puts their working directory
    # first on sys.path, ahead of PYTHONPATH: started from the repository root they
    # would import the working tree, not the copy. Python >= 3.11 leaves it out.
    os.environ["PYTHONSAFEPATH"] = "1"
    package = frozen / "raftlease"
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        # The path inside the package (not just the name): two subpackages may both
        # have an __init__.py. For top-level files it is the name, as before.
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    info = {"source": str(src), "sha256": digest.hexdigest()[:16]}
    with contextlib.suppress(Exception):
        info["git_head"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    return info


def loadavg() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages ([] if unreadable)."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def run_meta(profile: Profile, code: dict[str, str]) -> dict[str, Any]:
    """meta at the start of a run: profile, time, versions, CPUs, load, code."""
    # Imported here, not at the top: after freeze_raftlease this is the frozen copy.
    import raftlease

    meta: dict[str, Any] = {
        "profile": profile.name,
        "repeat": profile.repeat,
        "duration_s": profile.duration,
        "warmup_s": profile.warmup,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "python": platform.python_version(),
        "raftlease": raftlease.__version__,
        "cpus": os.cpu_count(),
        "loadavg_start": loadavg(),
        "settings": "raftlease NodeConfig defaults (main and memory clusters; the "
        "durability clusters set durability and nothing else)",
        "code": code,
    }
    with contextlib.suppress(Exception):
        meta["pysyncobj"] = importlib.metadata.version("pysyncobj")
    return meta
