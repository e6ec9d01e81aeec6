"""Test helpers shipped in the package (hashicorp/raft's ``MakeCluster`` idea, with
real processes on 127.0.0.1): ``LocalCluster`` and friends (``cluster``), and the test
build of a node with injected hooks (``node``, ``hooks``). ``raftlease up``, the
benchmark and the chaos suite use ``LocalCluster`` too.
"""

from .cluster import (
    PORT_RANGE,
    TEST_SETTINGS,
    LocalCluster,
    free_port_block,
    port_free,
    running_cluster,
    wait_for,
)
from .hooks import PLANTED_BUGS, hook_arguments

__all__ = [
    "PLANTED_BUGS",
    "PORT_RANGE",
    "TEST_SETTINGS",
    "LocalCluster",
    "free_port_block",
    "hook_arguments",
    "port_free",
    "running_cluster",
    "wait_for",
]
