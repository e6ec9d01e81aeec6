"""What lease certificates and the audit trail cost (issue 39): the ``certs`` group.

* **Signing**, on the main cluster (``signing``): 1-thread acquire of fresh keys
  without a holder key (``plain``) and with one (``certified``: the client's
  ``HolderKey``; an answer without a certificate counts as an error), in
  ``Profile.cert_rounds`` rounds, plain first in even rounds and certified first in
  odd ones (``round_order``, ABBA as the security phase's peer TLS rounds), each arm
  with the usual warm-up and repetitions. The issue-39 target judges the median over
  the rounds of certified p50 / plain p50 (a noisy machine's drift shows in one
  round, not as a cost).
* **The audit's share** (``costs``, after the main cluster): the state machine alone
  applying acquire+release pairs with the trail and without it (``AuditTrail.add`` a
  no-op: certcost.apply_costs, the same code as scripts/cert_bench), then, when
  ``Profile.audit_rounds`` > 0 (the full profile), that many rounds of a cluster of
  the test build with the ``no_audit`` hook (its store keeps no trail) against one of
  the same test build without hooks, acquire at ``threads`` threads on each, in ABBA
  order. The target judges the median of those rounds' ratios; a run without them
  (``--quick``) is judged on the estimate of ``context.audit_share_estimate``.
* **Verification** on one core: ``Verifier.check`` and ``HolderKey.prove`` per second
  (certcost.verify_rates).

Everything blocks the main thread. result["certs"] holds ``signing`` (``mode``,
``rounds``: per round ``order`` and per arm ``{"workloads": ...}``), ``apply``,
``verify`` and, with audit rounds, ``audit_rounds`` (``mode``, ``rounds``: per round
``order`` and per arm ``settings`` and ``workloads``, or ``error`` when that cluster
failed). A failure inside one audit round's cluster is recorded there and the next
still runs; only ``BenchTimeout`` and ``KeyboardInterrupt`` end the group.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from raftlease.client import Client
from raftlease.testing import LocalCluster
from raftlease.verify import HolderKey

from ..certcost import apply_costs, certified_acquire, verify_rates
from ..cluster import failure_recorded
from ..context import TTL_FRESH, Context, progress
from ..measure import Run, SyncOp, Variant, measure, run_threads
from . import throughput

#: The arms of a signing round and of an audit round.
SIGNING_ARMS = ("plain", "certified")
AUDIT_ARMS = ("unaudited", "audited")
#: The concurrency mode of the signing rounds (the target names 1-thread latency).
SIGNING_MODE = "1 thread"

SIGNING_METHOD = (
    "On the main cluster, {rounds} rounds of 1-thread acquire of fresh keys (TTL "
    "{ttl:.0f} s) without a holder key ('plain') and with one ('certified': one "
    "HolderKey made by the client, its public half sent with each acquire; an answer "
    "without a certificate counts as an error), plain first in odd-numbered rounds "
    "and certified first in even-numbered ones, each arm with the usual warm-up and "
    "repetitions. The signing cost is the median over the rounds of certified p50 / "
    "plain p50."
)
AUDIT_METHOD = (
    "The state machine alone (this process, no cluster running): {pairs:,} acquires "
    "each with its release applied to a fresh LeaseStore with the audit trail and "
    "without it (AuditTrail.add a no-op), best of {tries} alternating tries each "
    "(scripts/benchlib/certcost.py, shared with scripts/cert_bench). {rounds} The "
    "estimate: the pair's audit cost (2 records; an acquire alone makes 1) x 3 nodes "
    "over the smallest server CPU per acquire (all nodes) the run measured, an upper "
    "bound while the cores are the bottleneck."
)
AUDIT_ROUNDS_METHOD = (
    "Then {n} rounds, each a 3-node cluster of the test build with the no_audit hook "
    "(its store keeps no audit trail; never a production build) and one of the same "
    "test build without hooks, acquire of fresh keys at {mode} on each, the audit-off "
    "cluster first in odd-numbered rounds; the target judges the median over the "
    "rounds of default / audit-off throughput."
)
AUDIT_NO_ROUNDS = "No audit-off clusters in this profile: the target is judged on the estimate."
VERIFY_METHOD = (
    "Verification on one core (this process): {seconds:g} s of challenge + "
    "HolderKey.prove + Verifier.check (certificate signature, expiry, challenge, proof "
    "of possession, token) on one certificate, then half as long of prove alone; a "
    "check's rate is the first loop's with the prove's time taken out."
)


def round_order(n: int, arms: tuple[str, str]) -> tuple[str, str]:
    """The arms of round ``n`` (from 0) in the order they run: ``arms`` as given in
    even rounds, reversed in odd ones (ABBA), so that a drift of the machine's load
    during the group favours neither."""
    return arms if n % 2 == 0 else (arms[1], arms[0])


def _section(ctx: Context) -> dict[str, Any]:
    section: dict[str, Any] = ctx.result.setdefault("certs", {})
    return section


def signing(ctx: Context, cluster: LocalCluster, client: Client) -> None:
    """The signing rounds on the main cluster's ``client`` (see the module doc)."""
    p = ctx.profile
    holder = HolderKey()
    rounds: list[dict[str, Any]] = []
    _section(ctx)["signing"] = {"mode": SIGNING_MODE, "rounds": rounds}

    def plain_op(c: Client, i: int) -> bool:
        certified_acquire(c, ctx.key("cert"), None, TTL_FRESH)
        return True

    def certified_op(c: Client, i: int) -> bool:
        certified_acquire(c, ctx.key("cert"), holder, TTL_FRESH)
        return True

    ops: dict[str, SyncOp] = {"plain": plain_op, "certified": certified_op}
    for n in range(p.cert_rounds):
        order = round_order(n, SIGNING_ARMS)
        pair: dict[str, Any] = {"order": list(order)}
        rounds.append(pair)
        for arm in order:
            pair[arm] = {"workloads": {}}
            scoped = ctx.scoped(pair[arm]["workloads"], f"certs round {n + 1} {arm}: ")
            measure(
                scoped, cluster, Variant("acquire", SIGNING_MODE, _one_thread(client, ops[arm]))
            )
    ctx.method("certs signing", SIGNING_METHOD.format(rounds=p.cert_rounds, ttl=TTL_FRESH))


def _one_thread(client: Client, op: SyncOp) -> Callable[[float], Run]:
    # A function per arm (not a lambda in the loop, which would see the last arm).
    return lambda seconds: run_threads(client, 1, op, seconds)


def costs(ctx: Context) -> None:
    """The state machine's audit cost and verification on one core (no cluster
    running), then the audit rounds when the profile has them (see the module doc)."""
    p = ctx.profile
    section = _section(ctx)
    progress(f"certs: state machine, {p.cert_apply_pairs:,} acquire+release pairs x 2")
    apply = apply_costs(p.cert_apply_pairs, p.cert_apply_tries)
    section["apply"] = apply
    progress(
        f"certs: apply {apply['without_audit_us']:.1f} µs without the audit trail, "
        f"{apply['with_audit_us']:.1f} µs with it (per acquire+release)"
    )
    verify = verify_rates(p.cert_verify_seconds)
    section["verify"] = verify
    progress(
        f"certs: Verifier.check {verify['check_per_s']:,.0f}/s, HolderKey.prove "
        f"{verify['prove_per_s']:,.0f}/s on one core"
    )
    mode = f"{p.threads} threads"
    if p.audit_rounds > 0:
        rounds: list[dict[str, Any]] = []
        section["audit_rounds"] = {"mode": mode, "rounds": rounds}
        for n in range(p.audit_rounds):
            order = round_order(n, AUDIT_ARMS)
            pair: dict[str, Any] = {"order": list(order)}
            rounds.append(pair)
            for arm in order:
                pair[arm] = {"workloads": {}}
                audit_arm(ctx, arm, pair[arm], mode, f"certs round {n + 1} {arm}")
    rounds_text = (
        AUDIT_ROUNDS_METHOD.format(n=p.audit_rounds, mode=mode)
        if p.audit_rounds > 0
        else AUDIT_NO_ROUNDS
    )
    ctx.method(
        "certs audit",
        AUDIT_METHOD.format(pairs=p.cert_apply_pairs, tries=p.cert_apply_tries, rounds=rounds_text),
    )
    ctx.method("certs verify", VERIFY_METHOD.format(seconds=p.cert_verify_seconds))


def audit_arm(ctx: Context, arm: str, record: dict[str, Any], mode: str, name: str) -> None:
    """One cluster of an audit round: the test build with (``unaudited``) or without
    (``audited``) the no_audit hook; acquire in ``mode``. Fills ``record``; a failure
    is recorded there (``error``) with the cluster's node logs saved."""
    # Both arms run the test build (a hook dict, even one that turns nothing on,
    # starts it), so the store is the only difference between them.
    hooks = {"no_audit": arm == "unaudited"}
    record["settings"] = dict(hooks)
    cluster = LocalCluster(3, hooks=hooks)
    progress(f"{name}: starting a 3-node cluster (test build, no_audit={hooks['no_audit']})")
    with cluster, failure_recorded(ctx, name, record, cluster):
        cluster.start()
        time.sleep(0.5)
        scoped = ctx.scoped(record["workloads"], f"{name}: ")
        with cluster.client() as client:
            throughput.acquire(scoped, cluster, client, only=(mode,))
