"""Processes a test starts that must not outlive the test run.

A test that starts ``raftlease up`` (which starts three nodes) and is cut short (a
pytest-timeout in thread mode ends the whole run with ``os._exit``, a CI job killed)
used to leave ``up`` and its nodes running for good: the nodes watch ``up``, but
nothing made ``up`` watch pytest. ``DIES_WITH_PYTEST`` asks Linux to send the child
SIGTERM when the thread that started it exits (``prctl(PR_SET_PDEATHSIG)``); ``up``
stops its nodes on SIGTERM.
"""

from __future__ import annotations

import ctypes
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Run in the child between fork and exec (``Popen(preexec_fn=...)``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


DIES_WITH_PYTEST: Callable[[], None] = _die_with_parent
