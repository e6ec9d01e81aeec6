"""Shared fixtures. Integration tests start real node processes on 127.0.0.1 through
``raftlease.testing.LocalCluster``; node logs are printed only when a test fails."""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from raftlease.testing import TEST_SETTINGS, LocalCluster

FAST_SETTINGS: dict[str, Any] = dict(TEST_SETTINGS)

# Hypothesis profiles (CONTRIBUTING.md). "ci", the default, is derandomized and keeps
# no example database: the same examples run on every machine and every run, so a
# submission never fails by chance; a failure found there fails every time. "explore"
# searches: random, many more examples, with the local database so that a failure
# found is replayed next time. Select with HYPOTHESIS_PROFILE=explore.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    max_examples=200,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "explore",
    derandomize=False,
    max_examples=5000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, "rep_" + report.when, report)


def _show_logs_on_failure(request: pytest.FixtureRequest, cluster: LocalCluster) -> None:
    failed = any(
        getattr(request.node, f"rep_{phase}", None) is not None
        and getattr(request.node, f"rep_{phase}").failed
        for phase in ("setup", "call")
    )
    if failed:
        print(f"\n===== node logs of the cluster in {cluster.data_dir} =====")
        print(cluster.logs())


def make_cluster(
    count: int = 3, hooks: dict[str, Any] | None = None, **settings: Any
) -> LocalCluster:
    """``hooks``: run the test build of the node with these hooks (``raftlease.testing.
    hooks``: ``{"clock_control": True}``, ``{"planted_bug": NAME}``)."""
    return LocalCluster(count, settings={**FAST_SETTINGS, **settings}, hooks=hooks)


@pytest.fixture
def cluster_factory(request: pytest.FixtureRequest) -> Iterator[Callable[..., LocalCluster]]:
    """``cluster_factory(count=3, hooks=None, **settings)`` starts a cluster with extra
    settings (and test hooks); every cluster made is stopped at teardown, with its logs
    shown if the test failed."""
    made: list[LocalCluster] = []

    def factory(
        count: int = 3, hooks: dict[str, Any] | None = None, **settings: Any
    ) -> LocalCluster:
        c = make_cluster(count, hooks, **settings)
        made.append(c)
        c.start()
        return c

    try:
        yield factory
    finally:
        for c in made:
            _show_logs_on_failure(request, c)
            c.close()


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A fresh 3-node cluster for one test (use when the test kills or restarts nodes)."""
    c = make_cluster()
    try:
        c.start()
        yield c
    finally:
        _show_logs_on_failure(request, c)
        c.close()


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[LocalCluster]:
    """One 3-node cluster shared by a module's tests that do not disturb nodes.
    Tests must use keys of their own."""
    c = make_cluster()
    try:
        c.start()
        yield c
    finally:
        c.close()


@pytest.fixture
def shared(request: pytest.FixtureRequest, shared_cluster: LocalCluster) -> Iterator[LocalCluster]:
    yield shared_cluster
    _show_logs_on_failure(request, shared_cluster)


# ------------------------------------------------------- the fast loop starts no node

#: The words of a command line that starts a node process (``raftlease node``, the
#: ``raftlease up`` cluster, a node inside a network namespace of the hosts harness).
_NODE_COMMANDS = ("node", "up")


def starts_a_node(args: object) -> bool:
    """Whether a ``Popen`` command line runs ``raftlease node`` or ``raftlease up``
    (``python -m raftlease node ...``, the test build ``raftlease.testing.node`` or the
    ``raftlease`` script, also behind the hosts harness's ``unshare``/``hostexec``)."""
    argv: Sequence[object] = (
        str(args).split() if isinstance(args, str | bytes | os.PathLike) else list(args)  # type: ignore[call-overload]
    )
    words = [os.path.basename(str(a)) for a in argv]
    return "raftlease.testing.node" in words or any(
        word == "raftlease" and following in _NODE_COMMANDS
        for word, following in itertools.pairwise(words)
    )


#: Fixtures that start a cluster: a test using one is an integration test whatever
#: its file says (the marker was once set by hand and missed some).
CLUSTER_FIXTURES = frozenset({"cluster", "shared", "shared_cluster", "cluster_factory"})


#: Files whose tests run ``serial``: scripts/test runs the rest on two pytest-xdist
#: workers at once (``-m "not serial"``), then these alone, one at a time, as before.
#: A file is here when its tests measure time or memory, need a quiet machine to make
#: their point, or touch something shared by the whole machine. A new file of that kind
#: belongs here; when in doubt, here (CONTRIBUTING.md, "Running things").
SERIAL_FILES: dict[str, str] = {
    # The chaos suite: real runs judged on elections and heals within deadlines, a
    # planted-bug build that must fail, and a run stopped by signals, its processes
    # found by scanning /proc.
    "chaos/test_chaos.py": "chaos runs: timing of faults and heals, planted bug",
    "chaos/test_chaos_interrupt.py": "signals a chaos run, scans /proc for its nodes",
    "chaos/test_many_chaos.py": "chaos runs with key sets: planted build, fault timing",
    # The benchmark: its clusters, etcd and ZooKeeper anchors and scale phase load the
    # machine on purpose; test_bench_scale.py counts processes in /proc.
    "integration/test_bench.py": "benchmark: loads both cores",
    "integration/test_bench_anchors.py": "benchmark anchors: etcd, ZooKeeper, their own ports",
    "integration/test_bench_scale.py": "benchmark scale phase: loads both cores, scans /proc",
    # Planted bugs must be caught: a detection that depends on a race lost under load
    # would fail the honest build or pass the planted one.
    "integration/test_planted_bugs.py": "planted-bug detection",
    "integration/test_model_trails.py": "SPIN counterexamples on planted builds, timed",
    "integration/test_deadlock.py": "planted build (skip_deadlock_detection)",
    "integration/test_preempt.py": "timing: a yield learnt in a keep-alive, ended at its deadline",
    "integration/test_lease_progress.py": "timing: a lease stalls after its progress_timeout",
    "integration/test_effect_proof.py": "effect proof: planted build, kills a leader",
    "integration/test_durability.py": "planted build, recovery wait measured in seconds",
    "integration/test_partitions.py": "partitions and a planted build (skip_pre_vote)",
    # Leader leases, clock drift and elections against the clock.
    "integration/test_leader_lease.py": "leader-lease reads, pauses and clock drift",
    "integration/test_failover_early.py": "failover timing: election at the promise end",
    "integration/test_memory_keepalives.py": "answers from memory only while the lease holds",
    # Descriptors and memory of real node processes.
    "integration/test_fd_exhaustion.py": "prlimit on a node, fills its descriptors",
    "integration/test_memory_bounds.py": "RSS of nodes under steady load",
    "integration/test_output_backpressure.py": "node memory and other clients' latency",
    # (its RSS measurement runs only by hand, RAFTLEASE_BENCH_SNAPSHOT): the restored
    # lease must have more time left than at the save, counted from the new cluster's
    # start, a few seconds on a loaded machine.
    "integration/test_backup.py": "restored TTL compared with the time left at the save",
    "integration/test_peer_tls_cluster.py": "RSS of the leader during a flood",
    "integration/test_security_caps.py": "RSS after 2,000 connections, connection limits",
    # The hosts harness: network namespaces, bridges, mounts, CI=true behaviour.
    "integration/test_testing_hosts.py": "network namespaces (hosts harness)",
    "integration/test_multi_host.py": "network namespaces, systemd RestartSec timing",
    "integration/test_deploy_run.py": "network namespaces (compose, kubernetes as hosts)",
    # Chromium: a heavy process of its own, DOM conditions within deadlines.
    "integration/test_dashboard_browser.py": "chromium",
    "integration/test_dashboard_views.py": "chromium",
    "integration/test_dashboard_truth.py": "chromium, SIGSTOPped nodes, badge deadlines",
    # Issue 39: the resource-side chaos checker times writes against certificate
    # windows and runs a fault loop; its planted resource must fail.
    "integration/test_cert_proof.py": "resource-side chaos: timing, faults, planted bug",
}

_TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a cluster fixture ``integration``, and every test of
    ``SERIAL_FILES`` ``serial``, before ``-m`` selects (tryfirst: pytest's own
    deselection runs in this hook too)."""
    missing = [f for f in SERIAL_FILES if not os.path.isfile(os.path.join(_TESTS, f))]
    if missing:  # a renamed file would silently run in parallel
        raise pytest.UsageError(f"tests/conftest.py SERIAL_FILES names no file: {missing}")
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        path = getattr(item, "path", None)
        if path and os.path.relpath(path, _TESTS).replace(os.sep, "/") in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)


#: The test being set up or run when it is not marked ``integration`` (else None).
_UNIT_ITEM: pytest.Item | None = None
_REAL_POPEN_INIT = subprocess.Popen.__init__


def _guarded_popen_init(self: subprocess.Popen[bytes], args: Any, *rest: Any, **kw: Any) -> None:
    """``Popen.__init__`` refusing to start a node while a test that is not marked
    ``integration`` is set up or run: the fast loop (``-m "not integration"``) promises
    no node process, and the marker is what selects it. Installed for the whole
    session: a module-scoped fixture (a shared cluster) starts inside the first test's
    setup, before any function fixture could patch anything."""
    item = _UNIT_ITEM
    if item is not None and starts_a_node(args):
        raise AssertionError(
            f"{item.nodeid} starts a node process ({args!r}) but is not marked "
            "integration: add @pytest.mark.integration (or pytestmark)"
        )
    _REAL_POPEN_INIT(self, args, *rest, **kw)


subprocess.Popen.__init__ = _guarded_popen_init  # type: ignore[method-assign]


def _track(item: pytest.Item) -> Iterator[None]:
    global _UNIT_ITEM
    _UNIT_ITEM = None if item.get_closest_marker("integration") is not None else item
    try:
        yield
    finally:
        _UNIT_ITEM = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _track(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _track(item)
