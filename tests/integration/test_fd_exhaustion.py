"""A node that runs out of file descriptors keeps its Raft port (issue 11).

PySyncObj closes its listener for good when ``accept`` fails (EMFILE), so a peer that
restarts afterwards could never reconnect. Our transport binds the listener again, once
a second, as soon as descriptors are free (``replication/transport.py``). This test does
it to a real node process: it lowers the follower's descriptor limit with ``prlimit``,
fills it with client connections, makes the Raft listener's accept fail, frees the
descriptors, and shows that a restarted peer is served by that follower again.
"""

from __future__ import annotations

import os
import resource
import socket
import time
from collections.abc import Callable
from contextlib import ExitStack

import pytest
from pysyncobj import pickle as pysyncobj_pickle

from raftlease.testing import LocalCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

Factory = Callable[..., LocalCluster]


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _log(cluster: LocalCluster, node_id: str) -> str:
    return cluster.log_path(node_id).read_text(errors="replace")


def _raft_port_accepts(addr: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(addr, timeout=2):
            return True
    except OSError:
        return False


#: Timers for this test: the leader is stopped (SIGSTOP) while the victim has no
#: descriptors, so that no entry (the leader's tick, once a second) moves the victim's
#: commit index, and no election its term, either of which it would have to write.
#: Elections are kept off for far longer than that stop lasts on a loaded machine.
PATIENT = {
    "election_timeout_min": 10.0,
    "election_timeout_max": 12.0,
    "leader_fallback": 12.0,
    "connection_timeout": 24.0,
}


#: Seconds ``node_id``'s meta file must stay unchanged (three of PySyncObj's
#: one-second timers; far below PATIENT's election timeouts).
QUIET = 3.0


def _settle(cluster: LocalCluster, node_id: str) -> None:
    """Wait until ``node_id`` has nothing left to write to its term/vote/commit file.
    Out of descriptors, that write fails, and a node whose meta write fails stops (by
    design: exit 72); what this test is about is the listener. Right after an election
    the victim may not yet have heard of the new term (seen in CI: the leader 0.1 s
    old when the descriptors ran out, and the victim stopped on the term's write); and
    every commit index it learns is saved within a second (PySyncObj's one-second
    timer; seen under load: the leader's next tick moved it while the victim was out
    of descriptors). Call it with the leader stopped, so that it stays settled."""
    meta = cluster.node_dir(node_id) / "raft.journal.meta"

    def settled() -> bool:
        status = cluster.node_status(node_id)
        if not meta.exists():
            return False
        saved = pysyncobj_pickle.loads(meta.read_bytes())
        return bool(
            saved.get("currentTerm") == status["term"]
            and saved.get("raftCommitIndex") == status["commit_index"]
        )

    wait_for(settled, 30, f"{node_id}'s term and commit index saved")
    # Equal values are not enough: PySyncObj marks its meta unsaved at every
    # append_entries a follower receives, changed or not, and writes it at its next
    # one-second timer (seen: an append the leader sent just before its SIGSTOP
    # arrived after the check, and the write a second later failed with EMFILE). With
    # the leader stopped no append comes any more, so the file stops changing within
    # about a second: wait until it has been unchanged for QUIET seconds.
    seen: list[tuple[tuple[int, int], float]] = []

    def quiet() -> bool:
        st = meta.stat()
        now = time.monotonic()
        if not seen or seen[-1][0] != (st.st_ino, st.st_mtime_ns):
            seen.append(((st.st_ino, st.st_mtime_ns), now))
        return now - seen[-1][1] >= QUIET

    wait_for(quiet, 60, f"{node_id}'s term and vote file to stay unchanged for {QUIET} s")


def test_a_node_out_of_descriptors_binds_its_raft_port_again(cluster_factory: Factory) -> None:
    cluster = cluster_factory(3, **PATIENT)
    led = cluster.wait_for_leader()
    leader = str(led["node"])
    # PySyncObj's higher address dials the lower one: the victim is the follower with
    # the lower Raft address, so the restarted peer must come in through its listener.
    followers = sorted((n for n in cluster.nodes if n.id != leader), key=lambda n: _addr(n.raft)[1])
    victim, peer = followers[0].id, followers[1].id
    with cluster.client() as c:
        c.acquire("before-emfile", owner="a", ttl=60)  # an entry of the leader's term
    wait_for(
        lambda: cluster.node_status(victim)["term"] == led["term"],
        30,
        f"{victim} to follow {leader}'s term",
    )
    cluster.pause_node(leader)  # resumed once the victim has descriptors again
    _settle(cluster, victim)
    pid = cluster.pid(victim)
    raft = _addr(cluster.node(victim).raft)
    client = _addr(cluster.node(victim).client)
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    limit = _open_fds(pid) + 16
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, hard))
    try:
        with ExitStack() as hogs:
            # Client connections take the node's last descriptors (its event loop
            # accepts each one); then one more connection to the Raft port makes
            # PySyncObj's accept fail with EMFILE, and it unbinds its listener.
            for _ in range(40):
                hogs.enter_context(socket.create_connection(client, timeout=2))
            wait_for(lambda: _open_fds(pid) >= limit, 30, "the node to run out of descriptors")
            wait_for(
                lambda: not _raft_port_accepts(raft),
                30,
                "PySyncObj to unbind the Raft listener after a failed accept",
            )
            assert cluster.is_running(victim)
        wait_for(lambda: _open_fds(pid) < limit - 4, 30, "the victim's descriptors freed")
        cluster.resume_node(leader)
        # Descriptors free again: the listener is bound again within about a second.
        wait_for(lambda: _raft_port_accepts(raft), 30, "the Raft port to accept again")
        # The warning is logged just after the bind, and its write can queue behind another
        # thread's (asyncio's EMFILE tracebacks): wait for the line, do not read once.
        wait_for(
            lambda: (
                "raft listener was unbound (accept failed); bound again" in _log(cluster, victim)
            ),
            30,
            "the rebind warning in the victim's log",
        )
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        cluster.resume_node(leader)  # (again, if the test failed while it was stopped)
    # A peer that restarts now must reach the victim again: with the leader stopped,
    # the victim and the restarted peer are the majority that elects and commits.
    cluster.kill_node(peer)
    cluster.start_node(peer)
    cluster.kill_node(leader)
    attempts = iter(range(1000))
    with cluster.client() as c:
        lease = wait_for(
            # A fresh key per try: an attempt that timed out may still have been granted.
            lambda: c.acquire(f"after-emfile-{next(attempts)}", owner="a", ttl=5, timeout=2.0),
            60,
            "a grant committed by the victim and the restarted peer alone",
        )
    assert lease.token > 0
