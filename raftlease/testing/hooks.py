"""The test hooks a test build of a node accepts (``raftlease.testing.node``), and how
``LocalCluster`` passes them on its command line. Nothing here is reachable from a
production ``raftlease node``: its config has no such field and its operation table
no such operation.

Hooks (a dict, as ``LocalCluster(hooks=...)`` takes it):

* ``clock_control: True``: the node runs on an adjustable clock and answers the
  ``test_clock`` control operation (``{"op": "test_clock", "rate": r, "jump": s}``:
  set the clock's rate, jump it forward), as the chaos suite's clock faults need; it
  also answers the peer controls (``raftlease.testing.node.PeerControls``)
  ``test_hold`` (``{"op": "test_hold", "peer": id, "what": "appends" | "commit" |
  "nothing"}``: this node's ``append_entries`` to that peer carry no entries, or no
  commit index newer than now) and ``test_elections`` (``{"op": "test_elections",
  "mode": "hold" | "now" | "free"}``: this node never runs for election, runs now, or
  as its timers say), with which raftlease.testing.trails holds a counterexample's
  window open; and ``test_stall`` (``{"op": "test_stall", "seconds": s, "turn": t}``:
  for ``s`` seconds every turn of the node's event loop is held ``t`` seconds more,
  as past its capacity), with which tests/integration/test_overload.py drives the
  admission control;
* ``record_synced: True``: the node keeps a copy of what reached stable storage
  beside each data file (``durable.SyncRecorder``), so a simulated power loss
  (``raftlease.testing.power.cut_to_synced``) can cut its files back to it;
* ``plain_peers: True``: no TLS between the members (the benchmark's baseline for
  what peer TLS costs; ``LocalCluster`` then issues no certificates). Every node of
  the cluster must run so: a plain node and a TLS node cannot talk;
* ``no_audit: True``: the state machine keeps no audit trail (``SilentTrail``: its
  records are never made, hashed or kept; ``audit`` answers nothing), the benchmark's
  baseline for what the trail costs (scripts/bench ``--only certs``, issue 39). Every
  node of the cluster must run so, or the replicas differ in their trail;
* ``trace: True``: the node traces the events the SPIN model speaks of (its log
  clock's stamps, its lease-read decisions, the lease changes of each applied entry)
  to ``<data_dir>/trace.jsonl``
  (``raftlease.testing.trace``), which jepsen-style/trace_checker.py validates;
* ``planted_bug: NAME``: a deliberately broken build the test suite must catch
  (``PLANTED_BUGS``; jepsen-style/README.md lists which checker catches each, and
  tests/unit/test_planted_bugs.py and tests/integration/test_planted_bugs.py run each
  guard's check on the honest and the planted build). It implies ``clock_control``.
"""

from __future__ import annotations

from typing import Any

#: Planted bugs: name -> what is broken.
PLANTED_BUGS: dict[str, str] = {
    "fast_log_clock": "the leader's log time runs 3x fast, so leases end early",
    "skip_vote_promise": "followers never refuse a vote, so a new leader can be elected "
    "while the old one still serves lease reads",
    "ignore_drift_alarm": "the leader keeps serving lease reads while its drift alarm is "
    "raised (a peer's clock rate differs from its own by more than clock_drift)",
    "skip_read_barrier": "a new leader serves lease reads before it has applied an entry "
    "of its own term, so it can miss writes the previous leader acknowledged",
    "raw_follower_log": "followers handle append_entries as PySyncObj does, without the "
    "follower-log correction: a late or repeated message deletes entries the follower "
    "already acknowledged, and a deposed leader's tail can stall its catch-up",
    "skip_dedup": "the state machine ignores the dedup table's answers, so a retried "
    "mutating request (same cid and seq) is applied twice",
    "unsynced_acks": "the node runs with durability none and rejoins at once after a "
    "machine crash (no restart wait): a power loss forgets acknowledged grants",
    "accept_stale_attempt": "a task's heartbeat, completion, failure or release from an "
    "attempt that is no longer current is taken as the current attempt's: a zombie "
    "worker's late result replaces the live worker's",
    "unwritten_keepalives": "the leader answers renewals and session keep-alives from "
    "memory and never writes them into the log: a lease ends at its logged expiry while "
    "its holder was told it lives longer",
    "no_term_extension": "a new leader's first entry does not extend the live leases, so "
    "keep-alives the deposed leader answered from memory are forgotten",
    "partial_many_grant": "an acquire_many takes the free keys of its set and leaves out "
    "the busy ones, answering success, instead of refusing the whole set",
    "skip_deadlock_detection": "the state machine never looks for cycles of waits: an "
    "acquire that closes one queues, and the agents of the cycle wait on each other "
    "until their waits or leases run out",
    "skip_effect_check": "a task effect's begin ignores the journal (an earlier attempt's "
    "intent or commit) and answers new: a retried task makes an external call again",
    "skip_lease_effect_fence": "a lease effect's begin or commit is taken from any lease "
    "the key ever had, not only its live one: a zombie holder's late commit is accepted "
    "(issue 41, docs/design.md §4h)",
    "early_child": "a task put with 'after' is ready at once, before its parents "
    "complete: a child's claim comes before a parent's completion",
    "progress_from_memory": "the leader answers renewals of a progress-aware lease from "
    "memory: it promises now + ttl while the log ends the lease at its progress deadline, "
    "so the key can go to another before the holder's valid_until",
    "skip_pre_vote": "a node runs for election without asking for pre-votes, so a member "
    "that was cut off raises its term and, once it rejoins, deposes a healthy leader",
    "rebind_holder_key": "a renewal naming another lease certificate holder key rebinds "
    "the lease to it (as before issue 39's fix): whoever has the lease id gets a valid "
    "certificate for a key of its own",
}

HOOK_KEYS = (
    "clock_control",
    "planted_bug",
    "record_synced",
    "plain_peers",
    "trace",
    "no_audit",
)


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
    if hooks.get("record_synced") or bug == "unsynced_acks":
        args.append("--record-synced")
    if hooks.get("plain_peers"):
        args.append("--plain-peers")
    if hooks.get("trace"):
        args.append("--trace")
    if hooks.get("no_audit"):
        args.append("--no-audit")
    return args


#: Planted bugs of the resource side (a resource's verifier, not a node): name -> what
#: is broken. scripts/cert_proof (and tests/integration/test_cert_proof.py) must catch
#: each (docs/certificates.md, "Under faults").
RESOURCE_BUGS: dict[str, str] = {
    "skip_proof": "the resource's verifier does not check the proof of possession: "
    "anyone with a copy of a certificate writes as its holder",
    "skip_expiry": "the resource's verifier does not check not_after: a paused holder "
    "writes after its certificate ended",
}


def planted_verifier(name: str, keys: Any, **options: Any) -> Any:
    """A ``raftlease.verify.Verifier`` with the resource bug ``name`` planted (a test
    build of a resource; no production code path builds one). Raises ``KeyError`` for
    an unknown name."""
    from ..verify import Certificate, Verifier

    if name not in RESOURCE_BUGS:
        raise KeyError(f"unknown resource bug {name!r}; known: {sorted(RESOURCE_BUGS)}")

    class Planted(Verifier):
        def _check_expiry(self, cert: Certificate) -> None:
            if name != "skip_expiry":
                super()._check_expiry(cert)

        def _check_proof(
            self, cert: Certificate, proof: str, challenge: bytes, message: bytes
        ) -> None:
            if name != "skip_proof":
                super()._check_proof(cert, proof, challenge, message)

    return Planted(keys, **options)
