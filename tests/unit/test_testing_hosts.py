"""``raftlease.testing.hosts``: hosts as network namespaces on one machine. The
integration tests need root, ``ip`` and ``unshare``; without them they skip, except
under CI=true, where they fail (as the browser test does without chromium), so that
the multi-host tests built on this harness cannot vanish silently. The unit tests at
the end need nothing.

The unit half of these tests (no process); the integration half is
tests/integration/test_testing_hosts.py."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from raftlease.testing import hosts as hosts_module
from raftlease.testing.hosts import (
    HostNetwork,
    HostsTable,
    HostsUnavailable,
    hosts_file_text,
    require,
)

# ------------------------------------------------------------ no root needed


def test_the_hosts_file_lists_every_name() -> None:
    table = HostsTable("10.201.5.0/24")
    assert table.add("n1") == "10.201.5.10"
    assert table.add("n2", aliases=["raftlease-1.raftlease"]) == "10.201.5.11"
    assert table.add("client", "10.201.5.3") == "10.201.5.3"
    entry = table.alias("n1", ["raftlease-0.raftlease", "seed"])
    assert table.line_for(entry) == "10.201.5.10\traftlease-0.raftlease seed\n"
    assert table.text() == hosts_file_text(table.entries)
    assert table.text().splitlines() == [
        "# written by raftlease.testing.hosts",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "10.201.5.10\tn1",
        "10.201.5.11\tn2 raftlease-1.raftlease",
        "10.201.5.3\tclient",
        "10.201.5.10\traftlease-0.raftlease seed",
    ]
    # The text is the lines appended so far: the file can grow in place.
    assert "".join(table.line_for(e) for e in table.entries) == "".join(
        line + "\n" for line in table.text().splitlines()[3:]
    )


def test_removed_hosts_are_commented_out_in_place() -> None:
    table = HostsTable("10.201.5.0/24")
    table.add("n1", aliases=["raftlease-0.raftlease"])
    table.add("n2")
    table.alias("n1", ["seed"])
    written = bytearray(table.text().encode())
    indexes = table.remove("n1")
    assert indexes == [0, 2]
    for index in indexes:  # what remove_host writes: one byte each
        assert written[table.offset(index) : table.offset(index) + 3] == b"10."
    for index in indexes:
        written[table.offset(index)] = ord("#")
    # Names and the address are free again; a new entry is an appended line.
    assert table.add("n1", "10.201.5.10", aliases=["raftlease-0.raftlease", "seed"])
    written += table.line_for(table.entries[-1]).encode()
    assert written.decode() == table.text()
    assert table.text().splitlines()[3:] == [
        "#0.201.5.10\tn1 raftlease-0.raftlease",
        "10.201.5.11\tn2",
        "#0.201.5.10\tseed",
        "10.201.5.10\tn1 raftlease-0.raftlease seed",
    ]
    with pytest.raises(KeyError):
        table.remove("n9")
    with pytest.raises(IndexError):
        table.offset(4)


@pytest.mark.parametrize(
    ("name", "address", "aliases"),
    [
        ("n1", None, ()),  # taken
        ("n9", None, ["n1"]),  # an alias taken by a host name
        ("n9", None, ["x", "x"]),
        ("localhost", None, ()),
        ("bad_name", None, ()),
        ("n9/x", None, ()),
        ("-n9", None, ()),
        ("n" * 64, None, ()),
        ("n9", "10.201.5.10", ()),  # address taken
        ("n9", "10.201.6.1", ()),  # outside the subnet
        ("n9", "10.201.5.255", ()),  # broadcast
        ("n9", "10.201.5.0", ()),
    ],
)
def test_bad_names_and_addresses_are_refused(
    name: str, address: str | None, aliases: list[str]
) -> None:
    table = HostsTable("10.201.5.0/24")
    table.add("n1")
    with pytest.raises(ValueError):
        table.add(name, address, aliases)
    assert [e[1][0] for e in table.entries] == ["n1"]


def test_addresses_run_out_cleanly() -> None:
    table = HostsTable("10.201.5.0/29")  # 6 host addresses
    got = [table.add(f"h{i}") for i in range(6)]
    assert len(set(got)) == 6
    with pytest.raises(ValueError, match="no free address"):
        table.add("h6")


def test_names_are_unique_per_instance_and_fit(tmp_path: Path) -> None:
    first, second = HostNetwork(tmp_path / "1"), HostNetwork(tmp_path / "2")
    assert first.prefix != second.prefix
    assert all(str(os.getpid()) in net.prefix for net in (first, second))
    names = [first.switch_namespace, second.switch_namespace]
    names += [net.namespace_for(i, "n1") for net in (first, second) for i in range(3)]
    assert len(set(names)) == len(names)
    # Interface names (at most 15 characters), each within its own namespace.
    for link in [first.port_name(999), "eth0", "sink0", "sink1", "br0"]:
        assert re.fullmatch(r"[a-z0-9]{1,15}", link)
    assert first.hosts_path != second.hosts_path and first.stage_dir != second.stage_dir
    assert not first.started and not (tmp_path / "1").exists()  # nothing before start


def test_missing_requirements_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts_module.shutil, "which", lambda tool: None)
    with pytest.raises(HostsUnavailable, match=r"ip \(iproute2\), unshare \(util-linux\)"):
        require()
    monkeypatch.undo()
    if sys.platform.startswith("linux"):
        monkeypatch.setattr(hosts_module.shutil, "which", lambda tool: f"/bin/{tool}")
        monkeypatch.setattr(hosts_module.os, "geteuid", lambda: 1000)
        with pytest.raises(HostsUnavailable, match="root"):
            require()


def test_unknown_hosts_are_refused(tmp_path: Path) -> None:
    net = HostNetwork(tmp_path)
    with pytest.raises(KeyError):
        net.partition("a", "b")
    with pytest.raises(KeyError):
        net.isolate("a")
