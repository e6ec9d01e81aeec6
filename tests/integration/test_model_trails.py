"""The SPIN model's counterexamples, replayed on real nodes (issue 43).

Each planted-bug variant of model/lease.pml that SPIN refutes leaves its shortest
counterexample in model/trails/ (model/trail.py); raftlease.testing.trails maps its
steps to client calls, waits and a leader kill on a real cluster. Replayed on the
matching planted build it must break the same property; on the honest build it must
not. ``IGNORE_DRIFT_ALARM``'s deposed leader reads with its clock stopped: it runs on
a cluster whose peers dial through the chaos suite's proxy, which cuts that leader
off. ``SKIP_VOTE_PROMISE`` (a deposed leader whose clock keeps time reads) and
``SKIP_READ_BARRIER`` (a barely elected leader reads) hold their windows open with the
test build's peer controls (``test_hold``, ``test_elections``; trails.py's ``plan``),
so that the planted build breaks P3 on every run. Their hand-written scenarios, with
the same controls, are in tests/integration/test_planted_bugs.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from raftlease.testing import LocalCluster
from raftlease.testing.hooks import PLANTED_BUGS
from raftlease.testing.trails import TRAILS, Replay, Trail, load, replay, unsupported
from tests.integration.test_planted_bugs import SLOW_RAFT, proxied_cluster

pytestmark = pytest.mark.timeout(60)

#: The variants replayed, with the model unit of time (seconds) each is replayed at:
#: 0.3 s (a 1.8 s TTL) where no election is in the trail, 0.4 s for the keep-alive
#: (it must reach the leader within 2 units, before the logged expiry, on a loaded
#: machine); 0.8 s where the leader is
#: killed, so that the logged expiry (6 units, 4.8 s) plus an election (log time stands
#: still from the last tick to the new leader's first entry) still falls inside the
#: holder's validity (the renewal at 4 units plus 5, 7.9 s), where the planted build
#: grants: 2.4 s inside it on this machine, with the election taking 0.5 s.
REPLAYED = {
    "FAST_LOG_CLOCK": 0.3,
    "UNWRITTEN_KEEPALIVES": 0.4,
    "ACCEPT_STALE_ATTEMPT": 0.3,
    "NO_TERM_EXTENSION": 0.8,
}
#: The trails that kill a node; the others replay on the honest build on one shared
#: cluster (their keys and queues are named after the variant).
ELECTS = {"NO_TERM_EXTENSION"}
#: Replayed on a proxied cluster (model unit 0.3 s): the deposed leader is cut off,
#: not killed, and reads. PySyncObj's own step-down (leader_fallback, on real time,
#: not on the stopped clock) is put off past the replay's end, as in the hand-written
#: scenario of the vote promise.
CUT = {"IGNORE_DRIFT_ALARM": 0.3}
#: Replayed with the test build's peer controls (``test_hold``, ``test_elections``):
#: the windows a deposed leader's clock-keeping lease or a new leader's uncommitted
#: entry opens are held open, not hit by timing. ``SKIP_VOTE_PROMISE`` on a proxied
#: cluster (its deposed leader is cut off and reads) with S = 2 s (``SLOW_RAFT``): the
#: three units before its election (0.7 s each) end the candidate's own vote promise,
#: and the deposed leader's lease, earned on the voter's acknowledgements, lasts up to
#: S after the cut, wide enough for the election, the grant and reads on a loaded
#: machine; ``leader_fallback`` 15 s as for ``IGNORE_DRIFT_ALARM``.
#: ``SKIP_READ_BARRIER`` on a plain cluster (its deposed leader is killed) at 0.8 s: a
#: 4.8 s TTL covers the kill, the election and the reads.
HELD = {"SKIP_VOTE_PROMISE": 0.7, "SKIP_READ_BARRIER": 0.8}
#: Not replayed (``unsupported`` would say why): none now.
NOT_REPLAYED: set[str] = set()


def test_every_trail_is_replayed_or_says_why_not() -> None:
    """Every variant has a trail, a planted build of that name, and is replayed here
    or refused by ``unsupported`` (which the README's list must match)."""
    variants = {p.stem for p in TRAILS.glob("*.trail")}
    assert variants == set(REPLAYED) | set(CUT) | set(HELD) | NOT_REPLAYED
    for name in variants:
        assert name.lower() in PLANTED_BUGS, name
        trail = load(name)
        assert trail.breaks in {"P1", "P3", "P5"} and trail.steps, trail
        assert (unsupported(trail) is None) == (name not in NOT_REPLAYED), (
            name,
            unsupported(trail),
        )


def _judge(seen: Replay, trail: Trail, build: str, premises: bool = True) -> str:
    """The replay's verdict: its premises held (the window was really open; the trails
    without a read have none to check), the honest build broke no property, the planted
    one broke the trail's own. Returns the replay's story (its log)."""
    story = "\n".join(seen.log)
    if premises:
        assert seen.premises == [], (seen.premises, story)
    if build == "honest":
        assert seen.violations == [], (seen.violations, story)
    else:
        assert seen.violations, f"the planted build broke no property:\n{story}"
        assert all(v.startswith(trail.breaks) for v in seen.violations), seen.violations
    return story


@pytest.mark.integration
@pytest.mark.parametrize("build", ["honest", "planted"])
@pytest.mark.parametrize("variant", sorted(REPLAYED))
def test_a_counterexample_fails_on_its_planted_build_only(
    request: pytest.FixtureRequest, variant: str, build: str
) -> None:
    """The trail breaks its property (P1 or P5, as in the model) on the planted build
    and no property on the honest one."""
    trail = load(variant)
    assert any(s.kind == "ELECT" for s in trail.steps) == (variant in ELECTS)
    if build == "honest" and variant not in ELECTS:
        cluster: LocalCluster = request.getfixturevalue("shared")
    else:
        factory: Callable[..., LocalCluster] = request.getfixturevalue("cluster_factory")
        hooks = {"clock_control": True} if build == "honest" else {"planted_bug": variant.lower()}
        cluster = factory(hooks=hooks)
    seen = replay(trail, cluster, REPLAYED[variant])
    _judge(seen, trail, build, premises=False)


@pytest.mark.integration
@pytest.mark.parametrize("build", ["honest", "planted"])
@pytest.mark.parametrize("variant", sorted(CUT))
def test_a_cut_off_leader_counterexample_fails_on_its_planted_build_only(
    request: pytest.FixtureRequest, variant: str, build: str
) -> None:
    """The trail's deposed leader, its clock stopped after its drift alarm and cut off
    while the others elect and grant, answers a lease read without the grant (P3) on
    the planted build, and no read from its lease on the honest one."""
    trail = load(variant)
    hooks = {"clock_control": True} if build == "honest" else {"planted_bug": variant.lower()}
    with proxied_cluster(request, hooks, leader_fallback=15.0) as p:
        seen = replay(trail, p.cluster, CUT[variant], net=p.proxies)
    _judge(seen, trail, build)


@pytest.mark.integration
@pytest.mark.parametrize("build", ["honest", "planted"])
@pytest.mark.parametrize("variant", sorted(HELD))
def test_a_held_window_counterexample_fails_on_its_planted_build_only(
    request: pytest.FixtureRequest, variant: str, build: str
) -> None:
    """``SKIP_VOTE_PROMISE``: the candidate, cut off from the leader from the start
    (the leader's appends held, so its log is the voter's), runs for election while
    the leader, cut off from both at the election, still holds the lease the voter's
    acknowledgements earned it; ``SKIP_READ_BARRIER``: the follower that will lead
    acknowledges the grant but never learns its commit, and once elected earns its
    lease on heartbeats while its own entry never commits. The planted build answers
    a lease read without the grant (P3); the honest one refuses the vote (the grant
    comes after the lease) or the read (the barrier)."""
    trail = load(variant)
    hooks = {"clock_control": True} if build == "honest" else {"planted_bug": variant.lower()}
    if variant == "SKIP_VOTE_PROMISE":
        with proxied_cluster(request, hooks, leader_fallback=15.0, **SLOW_RAFT) as p:
            seen = replay(trail, p.cluster, HELD[variant], net=p.proxies)
    else:
        factory: Callable[..., LocalCluster] = request.getfixturevalue("cluster_factory")
        seen = replay(trail, factory(hooks=hooks), HELD[variant])
    print(_judge(seen, trail, build))
