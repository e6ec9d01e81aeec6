"""Progress-aware plain leases on a real 3-node cluster (issue 41; docs/design.md §4g).

A lease renewed on time but without progress past its ``progress_timeout`` ends
(``stalled``: a watch event, the next renewal refused, the key free); one whose holder
reports rising progress keeps it for several timeouts. The same through the lock
recipe (``held.progress``) and ``raftlease lock --progress-timeout -- cmd`` (a command
that stops touching ``$RAFTLEASE_PROGRESS_FILE`` is stopped, exit 125). No renewal is
promised past the progress deadline, and the planted ``progress_from_memory`` build,
which would, is caught. The state machine's rules are in
tests/unit/test_core_lease_progress.py."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import pytest
from click.testing import CliRunner

from raftlease.cli import main
from raftlease.cli.lock import EXIT_LEASE_LOST
from raftlease.errors import LeaseNotFoundError, NotOwnerError
from raftlease.testing import LocalCluster, wait_for
from tests.integration.test_watch import Collector
from tests.unit.test_planted_bugs import promised_past_progress

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TTL = 1.0
TIMEOUT = 1.5


def test_a_lease_renewed_without_progress_stalls_and_a_progressing_one_keeps_it(
    shared: LocalCluster,
) -> None:
    with shared.client() as c:
        start = c.read("progress/a/stuck").revision
        watch = Collector(shared.endpoints, "progress/a/", from_revision=int(start) + 1)
        try:
            stuck = c.acquire("progress/a/stuck", owner="s", ttl=TTL, progress_timeout=TIMEOUT)
            moving = c.acquire("progress/a/moving", owner="m", ttl=TTL, progress_timeout=TIMEOUT)
            began = time.monotonic()
            ended: float | None = None
            figure = 0
            # Renewed every ttl/4 for 3 progress timeouts: in time for the TTL, always.
            while time.monotonic() - began < 3 * TIMEOUT:
                figure += 1
                moving = c.renew(moving, progress=figure)
                if ended is None:
                    try:
                        stuck = c.renew(stuck)
                    except (LeaseNotFoundError, NotOwnerError):
                        ended = time.monotonic() - began
                time.sleep(TTL / 4)
            assert ended is not None and TIMEOUT - 0.3 < ended < TIMEOUT + TTL, ended
            assert c.holder("progress/a/stuck") is None
            holder = c.holder("progress/a/moving")
            assert holder is not None and holder.token == moving.token
            watch.wait_for(
                lambda evs: any(e.type == "stalled" and e.key == "progress/a/stuck" for e in evs),
                "a stalled event",
            )
            assert not any(
                e.type == "stalled" and e.key == "progress/a/moving" for e in watch.events
            )
            c.release(moving)
        finally:
            watch.close()


def test_a_session_attached_lease_stalls_without_progress_and_keeps_with_it(
    shared: LocalCluster,
) -> None:
    """Progress-aware leases in a lease session: the session's keep-alives (every
    ttl/3, from the leader's memory) keep both leases, but never past their progress
    deadline; the one whose holder reports progress (``session.progress``) lives on,
    the other ends ``stalled`` while the session lives, and its holder's view of it
    (``remaining``) ran out no later than the cluster ended it."""
    with shared.client() as c, c.session(owner="s", ttl=TTL) as session:
        stuck = session.acquire("progress/s/stuck", progress_timeout=TIMEOUT)
        moving = session.acquire("progress/s/moving", progress_timeout=TIMEOUT)
        assert stuck.progress_until is not None and stuck.remaining <= TIMEOUT
        began = time.monotonic()
        figure = 0
        while time.monotonic() - began < 3 * TIMEOUT:
            figure += 1
            moving = session.progress(moving, figure)
            time.sleep(TTL / 4)
        assert stuck.remaining == 0.0  # trusted no longer than its progress deadline
        wait_for(lambda: c.holder("progress/s/stuck") is None, 10, "the stalled lease gone")
        holder = c.holder("progress/s/moving")
        assert holder is not None and holder.token == moving.token and moving.remaining > 0
        with pytest.raises((LeaseNotFoundError, NotOwnerError)):
            session.progress(stuck, figure + 1)
        assert session.valid


def promises(cluster: LocalCluster, key: str) -> tuple[int, list[int]]:
    """A progress-aware lease (TTL 5 s, progress_timeout 4 s) renewed three times
    without progress, then once with: its progress deadline (log time, ms) and the
    expiries the renewals without progress promised."""
    with cluster.client() as c:
        lease = c.acquire(key, owner="s", ttl=5.0, progress_timeout=4.0)
        cap = lease.expires_at_ms  # the grant's log time + 4 s: below the TTL's 5 s
        promised = [c.renew(lease).expires_at_ms for _ in range(3)]
        moved = c.renew(lease, progress=1)  # progress: a later deadline
        assert cap < moved.expires_at_ms
        c.release(moved)
    return cap, promised


def test_a_renewal_is_never_promised_past_the_progress_deadline(shared: LocalCluster) -> None:
    """The safety half: a renewal answered from the leader's memory would promise
    ``now + ttl`` while the log ends the lease at its progress deadline, and the key
    could go to another before the holder's ``valid_until``. Every renewal of such a
    lease goes through the log, whose answer is capped (docs/design.md §4g)."""
    assert promised_past_progress(*promises(shared, "progress/safe")) == []


def test_the_planted_progress_from_memory_build_is_caught(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    """``progress_from_memory`` (raftlease/testing/hooks.py): the leader answers those
    renewals from memory; the same check reports their promises past the deadline."""
    cluster = cluster_factory(hooks={"planted_bug": "progress_from_memory"})
    assert promised_past_progress(*promises(cluster, "progress/planted")) != []


def test_the_lock_recipe_reports_progress_and_loses_the_lock_when_it_stops(
    shared: LocalCluster,
) -> None:
    with shared.client() as c:
        with c.lock("progress/b", owner="r", ttl=TTL, progress_timeout=TIMEOUT) as held:
            began = time.monotonic()
            for step in range(12):  # 3 s of progress: twice the timeout
                held.progress(step)
                time.sleep(0.25)
                assert held.valid and not held.lost.is_set()
            stopped = time.monotonic()
            wait_for(lambda: held.lost.is_set(), 10, "the lock lost once progress stopped")
            assert time.monotonic() - stopped > TIMEOUT - 0.5
            assert time.monotonic() - began > 3.0
        assert c.holder("progress/b") is None


def test_raftlease_lock_stops_a_command_that_stops_touching_its_progress_file(
    shared: LocalCluster,
) -> None:
    script = (
        "import os, time\n"
        "path = os.environ['RAFTLEASE_PROGRESS_FILE']\n"
        "for _ in range(8):\n"
        "    os.utime(path)\n"
        "    time.sleep(0.25)\n"
        "time.sleep(30)\n"  # stuck: the lease stalls, the command is stopped
    )
    began = time.monotonic()
    result = CliRunner().invoke(
        main,
        ["lock", "progress/c", "--ttl", "1", "--progress-timeout", "1.5", "--grace", "1",
         "--endpoints", ",".join(shared.endpoints), "--", sys.executable, "-c", script],
    )  # fmt: skip
    took = time.monotonic() - began
    assert result.exit_code == EXIT_LEASE_LOST, result.output
    assert 2.0 + TIMEOUT - 0.5 < took < 15, took
