"""Shared fixtures. Integration tests start real node processes on 127.0.0.1 through
``raftlease.testing.LocalCluster``; node logs are printed only when a test fails."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
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
