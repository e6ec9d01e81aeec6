"""The test hooks a test build of a node accepts (``raftlease.testing.node``), and how
``LocalCluster`` passes them on its command line. Nothing here is reachable from a
production ``raftlease node``: its config has no such field and its operation table
no such operation.

Hooks (a dict, as ``LocalCluster(hooks=...)`` takes it):

* ``clock_control: True``: the node runs on an adjustable clock and answers the
  ``test_clock`` control operation (``{"op": "test_clock", "rate": r, "jump": s}``:
  set the clock's rate, jump it forward), as the chaos suite's clock faults need;
* ``planted_bug: NAME``: a deliberately broken build the test suite must catch
  (``PLANTED_BUGS``; jepsen-style/README.md lists which checker catches each). It
  implies ``clock_control``.
"""

from __future__ import annotations

from typing import Any

#: Planted bugs: name -> what is broken.
PLANTED_BUGS: dict[str, str] = {
    "fast_log_clock": "the leader's log time runs 3x fast, so leases end early",
    "skip_vote_promise": "followers never refuse a vote, so a new leader can be elected "
    "while the old one still serves lease reads",
}

HOOK_KEYS = ("clock_control", "planted_bug")


def hook_arguments(hooks: dict[str, Any]) -> list[str]:
    """The test node's command-line arguments for ``hooks``. Raises ``ValueError`` on
    an unknown hook or planted bug (before any process starts)."""
    unknown = sorted(set(hooks) - set(HOOK_KEYS))
    if unknown:
        raise ValueError(f"unknown test hooks {unknown}; known: {list(HOOK_KEYS)}")
    args: list[str] = []
    bug = hooks.get("planted_bug") or ""
    if bug:
        if bug not in PLANTED_BUGS:
            raise ValueError(f"unknown planted bug {bug!r}; known: {sorted(PLANTED_BUGS)}")
        args += ["--planted-bug", bug]
    if hooks.get("clock_control") or bug:
        args.append("--clock-control")
    return args
