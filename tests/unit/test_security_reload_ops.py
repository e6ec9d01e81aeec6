"""Issue 11: shapes pinned in the auth file, ``reload`` as an admin operation, and a
client CA removed without a restart. Real node processes (certificates made by
``raftlease.testing.certs``); the auth file's loader is also tested on its own.

The unit half of these tests (no process); the integration half is
tests/integration/test_security_reload_ops.py."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from raftlease.errors import ConfigError
from raftlease.server.auth import load_auth
from raftlease.testing.certs import agent_role

AGENT_TOKEN = "agent-token-shapes-0123456789abcdef"

AGENT = agent_role({"agent-7": AGENT_TOKEN})  # read and write on gpu/, no shape permission

SHAPES = textwrap.dedent(
    """
    [[shapes]]
    prefix = "gpu/pools/"
    capacity = 8

    [[shapes]]
    prefix = "gpu/pools/a100/"         # longer: wins over gpu/pools/
    capacity = 4

    [[shapes]]
    key = "gpu/pools/a100/small"       # exact: wins over any prefix
    capacity = 2
    """
)


# ------------------------------------------------------------ the loader alone


@pytest.mark.timeout(30)
def test_the_loader_reads_shapes_and_refuses_a_malformed_table(tmp_path: Path) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(AGENT + SHAPES)
    policy = load_auth(path)
    assert policy.pinned_capacity("gpu/pools/h100/0") == 8
    assert policy.pinned_capacity("gpu/pools/a100/big") == 4
    assert policy.pinned_capacity("gpu/pools/a100/small") == 2
    assert policy.pinned_capacity("gpu/pools/a100/small/x") == 4  # a key, not a prefix
    assert policy.pinned_capacity("gpu/free") is None
    bad = {
        "shapes = 3": "array of tables",
        "shapes = [1]": "must be a table",
        '[[shapes]]\nprefix = "a/"': "capacity",
        '[[shapes]]\nprefix = "a/"\ncapacity = 0': "capacity",
        '[[shapes]]\nprefix = "a/"\ncapacity = true': "capacity",
        '[[shapes]]\nprefix = "a/"\ncapacity = 1_000_001': "capacity",
        "[[shapes]]\ncapacity = 2": "exactly one of key and prefix",
        '[[shapes]]\nkey = "a"\nprefix = "a"\ncapacity = 2': "exactly one of key and prefix",
        '[[shapes]]\nkey = ""\ncapacity = 2': "non-empty",
        "[[shapes]]\nprefix = 5\ncapacity = 2": "must be a string",
        '[[shapes]]\nprefix = "a/"\ncapacity = 2\nunits = 1': "unknown fields",
        '[[shapes]]\nkey = "a"\ncapacity = 2\n[[shapes]]\nkey = "a"\ncapacity = 3': "twice",
    }
    for table, why in bad.items():
        path.write_text(table + "\n" + AGENT)  # top-level keys before any table
        with pytest.raises(ConfigError, match=why):
            load_auth(path)
