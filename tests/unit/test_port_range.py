"""``raftlease.testing.cluster.worker_port_range``: each pytest-xdist worker draws its
test clusters' ports from a slice of its own (scripts/test runs two workers), so that two
workers never probe the same free block at the same moment and both bind it."""

from __future__ import annotations

import itertools

import pytest

from raftlease.testing.cluster import FULL_PORT_RANGE, PORT_RANGE, worker_port_range


def xdist(worker: str, count: str) -> dict[str, str]:
    return {"PYTEST_XDIST_WORKER": worker, "PYTEST_XDIST_WORKER_COUNT": count}


def test_outside_xdist_the_whole_range() -> None:
    assert worker_port_range(environ={}) == FULL_PORT_RANGE == (20000, 32000)


def test_two_workers_split_the_range_without_overlap() -> None:
    gw0 = worker_port_range(environ=xdist("gw0", "2"))
    gw1 = worker_port_range(environ=xdist("gw1", "2"))
    assert gw0 == (20000, 26000) and gw1 == (26000, 32000)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7])
def test_any_number_of_workers_gets_disjoint_slices_inside_the_range(count: int) -> None:
    slices = [worker_port_range(environ=xdist(f"gw{i}", str(count))) for i in range(count)]
    for (_, high), (next_low, _) in itertools.pairwise(slices):
        assert high <= next_low
    assert slices[0][0] >= FULL_PORT_RANGE[0] and slices[-1][1] <= FULL_PORT_RANGE[1]
    # free_port_block needs room for a block and its +100 and +200 companions.
    assert all(high - low > 1000 for low, high in slices)


@pytest.mark.parametrize(
    "env", [xdist("master", "2"), xdist("gw2", "2"), xdist("gw0", ""), xdist("gwx", "2")]
)
def test_anything_else_gets_the_whole_range(env: dict[str, str]) -> None:
    assert worker_port_range(environ=env) == FULL_PORT_RANGE


def test_this_process_uses_its_own_slice() -> None:
    assert worker_port_range() == PORT_RANGE
