"""The benchmark's certs group (issue 39), without a cluster: the ratios its rounds give,
the estimate of the audit's share, the issue-39 targets judged from a hand-made result,
its report section and published block, the ABBA order of its rounds, and the
in-process measurements it shares with scripts/cert_bench.

The cluster side runs in tests/integration/test_bench.py's quick run.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib import context, publish, report, targets  # noqa: E402 - found through scripts/

pytestmark = pytest.mark.timeout(60)


def _entry(rate: float, p50: float, servers_us: float = 400.0, errors: int = 0) -> dict[str, Any]:
    return {
        "mode": "m",
        "ops_per_s": {"median": rate, "spread_pct": 4.0},
        "p50_ms": p50,
        "p99_ms": 2 * p50,
        "errors": errors,
        "cpu_us_per_op": {"client": 100.0, "servers": servers_us},
    }


def _arm(entry: dict[str, Any], mode: str = "1 thread") -> dict[str, Any]:
    return {"workloads": {"acquire": {mode: entry}}}


@pytest.fixture
def certified() -> dict[str, Any]:
    """A result with the certs group: three signing rounds (p50 +10 %, +20 %, +5 %),
    two audit rounds (0.95, 0.99) and the in-process figures."""
    signing = []
    for n, (plain, signed) in enumerate([(1.0, 1.1), (1.0, 1.2), (2.0, 2.1)]):
        signing.append(
            {
                "order": list(("plain", "certified") if n % 2 == 0 else ("certified", "plain")),
                "plain": _arm(_entry(1000.0, plain, servers_us=900.0)),
                "certified": _arm(_entry(900.0, signed, servers_us=950.0)),
            }
        )
    audit = [
        {
            "order": ["unaudited", "audited"],
            "unaudited": _arm(_entry(2000.0, 5.0), "16 threads"),
            "audited": _arm(_entry(1900.0, 5.2, servers_us=450.0), "16 threads"),
        },
        {
            "order": ["audited", "unaudited"],
            "unaudited": _arm(_entry(2000.0, 5.0), "16 threads"),
            "audited": _arm(_entry(1980.0, 5.1, servers_us=500.0), "16 threads"),
        },
    ]
    return {
        "meta": {
            "profile": "full",
            "started": "2026-12-07 06:40:00 UTC",
            "cpus": 2,
            "loadavg_start": [0.4, 0.3, 0.2],
            "repeat": 3,
            "duration_s": 3.0,
            "code": {"git_head": "abcdef0123456"},
            "argv": ["--only", "certs"],
        },
        "raw": {},
        "workloads": {},
        "certs": {
            "signing": {"mode": "1 thread", "rounds": signing},
            "apply": {
                "pairs": 20000,
                "tries": 6,
                "without_audit_us": 25.0,
                "with_audit_us": 30.0,
                "audit_us": 5.0,
                "records_per_pair": 2,
            },
            "verify": {"seconds": 2.0, "check_per_s": 3500.0, "prove_per_s": 27000.0},
            "audit_rounds": {"mode": "16 threads", "rounds": audit},
        },
        "targets": [],
        "methods": {},
    }


def _issue39(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in targets.evaluate(result, ["16 threads"]) if t.get("issue") == 39]


def test_round_figures_are_per_round_ratios(certified: dict[str, Any]) -> None:
    figures = context.cert_round_figures(certified)
    assert [round(f["p50_ratio"], 3) for f in figures] == [1.1, 1.2, 1.05]
    assert [round(f["rate_ratio"], 3) for f in figures] == [0.9, 0.9, 0.9]
    assert [round(r, 3) for r in context.audit_round_ratios(certified)] == [0.95, 0.99]
    # A round whose arm failed is left out, not counted as 0.
    certified["certs"]["signing"]["rounds"][1]["certified"] = {"error": "boom", "workloads": {}}
    assert len(context.cert_round_figures(certified)) == 2
    assert context.cert_round_figures({"meta": {}}) == []
    assert context.audit_round_ratios({"meta": {}}) == []


def test_the_estimate_takes_the_smallest_server_cpu_per_acquire(
    certified: dict[str, Any],
) -> None:
    estimate = context.audit_share_estimate(certified)
    assert estimate is not None
    # 3 nodes x 5 µs over the 450 µs of audit round 1's default build.
    assert estimate["servers_us_per_acquire"] == 450.0
    assert estimate["share"] == pytest.approx(15 / 450)
    assert estimate["from"] == "audit_rounds round 1 audited [16 threads]"
    del certified["certs"]["apply"]
    assert context.audit_share_estimate(certified) is None


def test_issue_39_targets_are_judged(certified: dict[str, Any]) -> None:
    signing, audit, verify = _issue39(certified)
    # Median of +10 %, +20 %, +5 %: +10 %, within 15 %.
    assert signing["met"] is True and signing["figure"].startswith("+10.0 % (median of 3")
    # Median of 0.95 and 0.99: 0.97, a 3 % cost.
    assert audit["met"] is True and audit["figure"].startswith("cost 3.0 %: default")
    assert "estimate 3.3 %" in audit["figure"]
    assert verify["met"] is True and "Verifier.check 3,500/s" in verify["figure"]


def test_issue_39_targets_fail_when_the_figures_break_them(certified: dict[str, Any]) -> None:
    slow = copy.deepcopy(certified)
    for pair in slow["certs"]["signing"]["rounds"]:
        pair["certified"]["workloads"]["acquire"]["1 thread"]["p50_ms"] *= 1.2
    assert _issue39(slow)[0]["met"] is False
    # A certified acquire that failed or came back without a certificate fails the row.
    missing = copy.deepcopy(certified)
    missing["certs"]["signing"]["rounds"][0]["certified"]["workloads"]["acquire"]["1 thread"][
        "errors"
    ] = 2
    row = _issue39(missing)[0]
    assert row["met"] is False and "2 certified acquire(s) failed" in row["figure"]
    costly = copy.deepcopy(certified)
    for pair in costly["certs"]["audit_rounds"]["rounds"]:
        pair["audited"]["workloads"]["acquire"]["16 threads"]["ops_per_s"]["median"] = 1700.0
    assert _issue39(costly)[1]["met"] is False


def test_without_audit_rounds_the_estimate_is_judged(certified: dict[str, Any]) -> None:
    """The quick profile has no audit-off clusters: the row says it judged the estimate."""
    del certified["certs"]["audit_rounds"]
    audit = _issue39(certified)[1]
    # 3 x 5 µs over the 900 µs of the signing rounds' plain arm.
    assert audit["met"] is True
    assert audit["figure"].startswith("estimate 1.7 %")
    assert audit["figure"].endswith("no audit-off rounds in this run")
    certified["certs"]["apply"]["audit_us"] = 40.0  # 3 x 40 / 900 = 13 %
    assert _issue39(certified)[1]["met"] is False


def test_no_certs_group_no_rows(certified: dict[str, Any]) -> None:
    del certified["certs"]
    assert _issue39(certified) == []


def test_the_report_has_a_certs_section(certified: dict[str, Any]) -> None:
    certified["certs"]["audit_rounds"]["rounds"][1]["audited"] = {
        "error": "RuntimeError: no leader",
        "workloads": {},
    }
    certified["targets"] = targets.evaluate(certified, ["16 threads"])
    text = report.render_markdown(certified)
    assert "## Lease certificates and the audit trail: their cost" in text
    assert "| 1 | plain then certified | 1,000 (4 %) | 900 (4 %) |" in text
    assert "| 2 | certified then plain |" in text
    assert "Median over 3 rounds: p50 certified / plain 1.100 (+10.0 %)" in text
    assert "25.0 µs without the trail, 30.0 µs with it: 5.0 µs for the trail" in text
    assert "round 1 (unaudited then audited), acquire 16 threads" in text
    assert "Verifier.check 3,500/s" in text and "HolderKey.prove 27,000/s" in text
    assert "- **certs round 2 audited**: RuntimeError: no leader" in text
    assert "## Targets (issue 39)" in text


def test_the_certs_block_is_published(tmp_path: Path, certified: dict[str, Any]) -> None:
    certified["targets"] = targets.evaluate(certified, ["16 threads"])
    doc = tmp_path / "certificates.md"
    doc.write_text("# x\n<!-- bench:certs-run:start -->\nstale\n<!-- bench:certs-run:end -->\n")
    blocks = (publish.Block(doc, "certs-run", publish.certs_full),)
    written = publish.publish([("c.json", certified)], blocks, root=tmp_path)
    assert written == ["certificates.md [certs-run] from c.json"]
    text = doc.read_text()
    assert "stale" not in text and "Measured 2026-12-07 06:40:00 UTC" in text
    assert "Targets of issue 39 in this run:" in text
    assert "- lease certificates: signing adds <= 15 % to 1-thread acquire latency" in text
    assert "## Lease certificates" not in text  # the doc has its own heading


def test_rounds_alternate_which_arm_runs_first() -> None:
    from benchlib.workloads.certs import AUDIT_ARMS, SIGNING_ARMS, round_order

    for arms in (SIGNING_ARMS, AUDIT_ARMS):
        orders = [round_order(n, arms) for n in range(6)]
        assert all(set(o) == set(arms) for o in orders)
        firsts = [o[0] for o in orders]
        assert firsts.count(arms[0]) == firsts.count(arms[1]) == 3
        assert firsts[:2] == [arms[0], arms[1]]


def test_the_quick_profile_keeps_the_group_small() -> None:
    quick, full = context.QUICK, context.FULL
    assert quick.audit_rounds == 0 and quick.cert_rounds == 2
    assert quick.cert_apply_pairs * quick.cert_apply_tries <= 2_000
    assert full.cert_rounds % 2 == 0 and full.audit_rounds % 2 == 0  # ABBA: even
    assert "certs" in context.MAIN_GROUPS


def test_in_process_measurements() -> None:
    """certcost, shared with scripts/cert_bench: figures positive, the audit trail's
    ``add`` restored afterwards, a certified answer without a certificate an error."""
    from benchlib import certcost

    import raftlease.core.audit as audit_module
    from raftlease.errors import RaftLeaseError
    from raftlease.verify import HolderKey

    before = audit_module.AuditTrail.add
    costs = certcost.apply_costs(50, 2)
    assert audit_module.AuditTrail.add is before
    assert costs["without_audit_us"] > 0 and costs["with_audit_us"] > 0
    rates = certcost.verify_rates(0.02)
    assert rates["check_per_s"] > 0 and rates["prove_per_s"] > 0

    class Answer:
        certificate = ""

    class FakeClient:
        def acquire(self, key: str, **kwargs: Any) -> Answer:
            return Answer()

    fake: Any = FakeClient()
    assert certcost.certified_acquire(fake, "k", None, 1.0).certificate == ""
    with pytest.raises(RaftLeaseError, match="without a certificate"):
        certcost.certified_acquire(fake, "k", HolderKey(), 1.0)
