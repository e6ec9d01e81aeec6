"""The ``no_audit`` test build (the benchmark's baseline for what the audit trail costs,
scripts/bench ``--only certs``): its store answers as the production store does and
keeps no audit record, also after a snapshot; the hook reaches the node's command line
and is refused beside a planted bug that is a store of its own. Not a planted bug: it
breaks no safety rule, so nothing must catch it; it must only be what it says.
"""

from __future__ import annotations

from typing import Any

import pytest

from raftlease.core import LeaseStore
from raftlease.testing import hook_arguments
from raftlease.testing.node import SilentTrail, UnauditedStore, build_hooks

pytestmark = pytest.mark.timeout(30)


def _entries() -> list[dict[str, Any]]:
    """Grants, a refusal (NOT_OWNER: a release with a wrong lease id) and releases."""
    out: list[dict[str, Any]] = []
    seq = 0
    for i in range(6):
        seq += 1
        out.append(
            {
                "op": "acquire",
                "now": 10 * i,
                "term": 1,
                "key": f"k{i % 2}",
                "owner": "o",
                "ttl": 5_000,
                "lid": f"L{i}",
                "cid": "c",
                "seq": seq,
                "ack": seq,
                "principal": "p",
            }
        )
        seq += 1
        out.append(
            {
                "op": "release",
                "now": 10 * i + 1,
                "term": 1,
                "key": f"k{i % 2}",
                "lid": f"L{i}" if i % 3 else "wrong",
                "cid": "c",
                "seq": seq,
                "ack": seq,
                "principal": "p",
            }
        )
    return out


def test_the_unaudited_store_answers_alike_and_keeps_no_trail() -> None:
    honest, silent = LeaseStore(), UnauditedStore()
    for entry in _entries():
        assert silent.apply(dict(entry)) == honest.apply(dict(entry)), entry
    assert honest.audit.records and honest.audit_refusals.records  # the scenario audits
    assert not silent.audit.records and not silent.audit_refusals.records
    assert silent.audit.seq == 1 and silent.audit.head == "00" * 32
    restored = UnauditedStore.from_plain(silent.to_plain())
    assert isinstance(restored.audit, SilentTrail)
    assert isinstance(restored.audit_refusals, SilentTrail)
    # Restored from a snapshot that has records, it still keeps none of them.
    from_honest = UnauditedStore.from_plain(honest.to_plain())
    assert not from_honest.audit.records and isinstance(from_honest.audit, SilentTrail)


def test_the_hook_reaches_the_command_line_and_the_store() -> None:
    assert hook_arguments({"no_audit": True}) == ["--no-audit"]
    assert hook_arguments({"no_audit": False}) == []
    assert build_hooks("", clock=False, no_audit=True).store_class is UnauditedStore
    assert build_hooks("", clock=False).store_class is LeaseStore
    with pytest.raises(ValueError, match="no_audit cannot be combined"):
        build_hooks("skip_dedup", no_audit=True)
