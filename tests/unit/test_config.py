"""Unit tests of node configuration (``raftlease.config``): ``NodeConfig.create``
validation and cross-checks, ``load_toml``, ``local_cluster``, and the ``raftlease node``
command refusing a bad configuration."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from raftlease.cli import main
from raftlease.config import NodeAddress, NodeConfig, load_toml, local_cluster, parse_addr
from raftlease.errors import ConfigError

pytestmark = pytest.mark.timeout(60)

NODES = local_cluster(3, 7001)


def make(**overrides: Any) -> NodeConfig:
    values: dict[str, Any] = {"node_id": "n1", "nodes": NODES, "data_dir": "/var/lib/rl"}
    values.update(overrides)
    return NodeConfig.create(**values)


def config_error(**overrides: Any) -> str:
    with pytest.raises(ConfigError) as info:
        make(**overrides)
    assert info.value.code == "CONFIG"
    assert info.value.definite
    return info.value.message


# ------------------------------------------------------------- a good config


def test_defaults_are_valid() -> None:
    config = make()
    assert config.node_id == "n1"
    assert config.data_dir == Path("/var/lib/rl")
    assert config.nodes == NODES
    assert config.self_node == NodeAddress("n1", "127.0.0.1:7101", "127.0.0.1:7001")
    assert [p.id for p in config.peers] == ["n2", "n3"]
    assert config.journal_file == Path("/var/lib/rl/raft.journal")
    assert config.dump_file == Path("/var/lib/rl/raft.dump")
    assert config.client_addr_for_raft("127.0.0.1:7102") == "127.0.0.1:7002"
    assert config.client_addr_for_raft("127.0.0.1:9999") is None


def test_nodes_may_be_dicts() -> None:
    nodes = [{"id": n.id, "raft": n.raft, "client": n.client} for n in NODES]
    assert make(nodes=nodes).nodes == NODES


def test_single_node_cluster_is_valid() -> None:
    config = make(nodes=NODES[:1])
    assert config.peers == ()


def test_with_changes_validates() -> None:
    config = make()
    assert config.with_changes(heartbeat_interval=0.1).heartbeat_interval == 0.1
    with pytest.raises(ConfigError, match="heartbeat_interval"):
        config.with_changes(heartbeat_interval=0.2)


# --------------------------------------------------------------- cross-checks


@pytest.mark.parametrize(
    ("overrides", "values"),
    [
        pytest.param(
            {"election_timeout_min": 2.5, "election_timeout_max": 1.5},
            ("election_timeout_min (2.5)", "election_timeout_max (1.5)"),
            id="election-min-above-max",
        ),
        pytest.param(
            {"election_timeout_min": 1.25, "election_timeout_max": 1.25},
            ("election_timeout_min (1.25)", "election_timeout_max (1.25)"),
            id="election-min-equals-max",
        ),
        pytest.param(
            {"heartbeat_interval": 0.2, "election_timeout_min": 0.45},
            ("heartbeat_interval (0.2)", "election_timeout_min (0.45)"),
            id="heartbeat-too-long",
        ),
        pytest.param(
            {"connection_timeout": 0.9, "election_timeout_max": 1.1},
            ("connection_timeout (0.9)", "election_timeout_max (1.1)"),
            id="connection-timeout-below-election-max",
        ),
        pytest.param(
            {"connection_timeout": 1.1, "election_timeout_max": 1.1},
            ("connection_timeout (1.1)", "election_timeout_max (1.1)"),
            id="connection-timeout-equals-election-max",
        ),
        pytest.param(
            {"leader_fallback": 0.7, "election_timeout_max": 0.9},
            ("leader_fallback (0.7)", "election_timeout_max (0.9)"),
            id="leader-fallback-below-election-max",
        ),
        pytest.param(
            {"min_ttl": 10.5, "max_ttl": 5.5},
            ("min_ttl (10.5)", "max_ttl (5.5)"),
            id="min-ttl-above-max-ttl",
        ),
        pytest.param(
            {"min_ttl": 0.1, "clock_drift": 0.45, "heartbeat_interval": 0.06},
            ("min_ttl (0.1)", "clock_drift (0.45)", "heartbeat_interval (0.06)"),
            id="min-ttl-too-short-for-clock-drift",
        ),
        pytest.param(
            {"min_ttl": 0.07, "heartbeat_interval": 0.08},
            ("min_ttl (0.07)", "clock_drift (0.01)", "heartbeat_interval (0.08)"),
            id="min-ttl-too-short-for-heartbeat",
        ),
    ],
)
def test_cross_check_names_both_values(overrides: dict[str, Any], values: tuple[str, ...]) -> None:
    message = config_error(**overrides)
    for value in values:
        assert value in message, f"{value!r} not in {message!r}"


def test_cross_checks_accept_their_boundaries() -> None:
    # Each relation's boundary value is allowed on the side the rule says.
    make(heartbeat_interval=0.124, election_timeout_min=0.375, election_timeout_max=0.5)
    # Exactly a third is refused: PySyncObj asserts raftMinTimeout > 3 * period.
    assert "heartbeat_interval (0.125)" in config_error(
        heartbeat_interval=0.125, election_timeout_min=0.375, election_timeout_max=0.5
    )
    assert "compaction_min_entries" in config_error(compaction_min_entries=1)
    make(leader_fallback=1.0, election_timeout_max=1.0)
    make(connection_timeout=1.01, election_timeout_max=1.0)
    make(min_ttl=7.0, max_ttl=7.0)
    make(clock_drift=0.0)
    make(clock_drift=0.49)
    make(max_ttl=365 * 24 * 3600)
    make(max_frame=1024)


def test_min_ttl_window_uses_clock_drift() -> None:
    # The trusted window is min_ttl * (1 - clock_drift), which must exceed one heartbeat:
    # 0.1 * 0.6 = 0.06 > 0.05 passes, 0.1 * 0.51 = 0.051 <= 0.06 does not.
    make(min_ttl=0.1, clock_drift=0.4)
    message = config_error(min_ttl=0.1, clock_drift=0.49, heartbeat_interval=0.06)
    assert "min_ttl (0.1)" in message
    assert "clock_drift (0.49)" in message


@pytest.mark.parametrize("drift", [0.5, 0.75, -0.01, -1.0, math.nan, math.inf])
def test_clock_drift_out_of_range(drift: float) -> None:
    message = config_error(clock_drift=drift)
    assert "clock_drift" in message
    assert repr(drift) in message


def test_max_ttl_above_a_year() -> None:
    message = config_error(max_ttl=365 * 24 * 3600 + 1)
    assert "max_ttl (31536001)" in message
    assert "one year" in message


def test_max_frame_minimum() -> None:
    message = config_error(max_frame=1023)
    assert "max_frame (1023)" in message
    assert "1024" in message


@pytest.mark.parametrize(
    "name",
    [
        "election_timeout_min",
        "election_timeout_max",
        "heartbeat_interval",
        "connection_retry",
        "connection_timeout",
        "leader_fallback",
        "min_ttl",
        "max_ttl",
        "request_timeout",
        "compaction_min_time",
    ],
)
@pytest.mark.parametrize("value", [0, -1, -0.5, math.nan, math.inf, "1", None])
def test_times_must_be_positive_numbers(name: str, value: Any) -> None:
    message = config_error(**{name: value})
    assert name in message
    assert repr(value) in message
    assert "positive" in message


@pytest.mark.parametrize("name", ["max_frame", "max_key_bytes", "max_owner_bytes", "max_list"])
@pytest.mark.parametrize("value", [0, -5, 2.0, "1024"])
def test_sizes_must_be_positive_integers(name: str, value: Any) -> None:
    message = config_error(**{name: value})
    assert name in message
    assert repr(value) in message


@pytest.mark.parametrize(
    "name", ["max_waiters_per_principal", "max_watches_per_principal", "max_watches_per_node"]
)
@pytest.mark.parametrize("value", [0, -1, 2.0, "8", True])
def test_waiter_and_watch_quotas_must_be_positive_integers(name: str, value: Any) -> None:
    message = config_error(**{name: value})
    assert name in message
    assert repr(value) in message


# ------------------------------------------------------------------- members


def test_heap_trim_interval_is_zero_or_positive() -> None:
    assert make(heap_trim_interval=0).heap_trim_interval == 0
    assert make(heap_trim_interval=2.5).heap_trim_interval == 2.5
    for bad in (-1, math.inf, math.nan, "30", True):
        assert "heap_trim_interval" in config_error(heap_trim_interval=bad)


def test_gc_unfreeze_interval_is_zero_or_positive() -> None:
    assert make().gc_unfreeze_interval == 600.0
    assert make(gc_unfreeze_interval=0).gc_unfreeze_interval == 0
    for bad in (-1, math.inf, math.nan, "600", True):
        assert "gc_unfreeze_interval" in config_error(gc_unfreeze_interval=bad)


def test_switch_interval_is_zero_or_a_bounded_number_of_seconds() -> None:
    assert make().switch_interval == 0.001
    assert make(switch_interval=0).switch_interval == 0
    assert make(switch_interval=0.005).switch_interval == 0.005
    for bad in (-1, 0.00001, 0.2, math.inf, math.nan, "0.001", True):
        assert "switch_interval" in config_error(switch_interval=bad)


def test_keepalives_is_memory_or_log() -> None:
    assert make().keepalives == "memory"  # the default: keep-alives from memory
    assert make(keepalives="log").keepalives == "log"
    for bad in ("Memory", "", "fsync", 1, None):
        assert "keepalives must be one of memory, log" in config_error(keepalives=bad)


def test_no_nodes() -> None:
    assert "at least one node" in config_error(nodes=[])


def test_duplicate_ids() -> None:
    nodes = [NODES[0], NodeAddress("n1", "127.0.0.1:7102", "127.0.0.1:7002")]
    message = config_error(nodes=nodes)
    assert "node ids must be unique" in message
    assert "'n1', 'n1'" in message


@pytest.mark.parametrize(
    "nodes",
    [
        pytest.param(
            [NODES[0], NodeAddress("n2", "127.0.0.1:7101", "127.0.0.1:7002")], id="same-raft"
        ),
        pytest.param(
            [NODES[0], NodeAddress("n2", "127.0.0.1:7102", "127.0.0.1:7001")], id="same-client"
        ),
        pytest.param(
            [NODES[0], NodeAddress("n2", "127.0.0.1:7002", "127.0.0.1:7002")],
            id="raft-equals-client",
        ),
        pytest.param(
            [NODES[0], NodeAddress("n2", "127.0.0.1:7001", "127.0.0.1:7102")],
            id="raft-equals-other-client",
        ),
    ],
)
def test_duplicate_addresses(nodes: list[NodeAddress]) -> None:
    message = config_error(nodes=nodes)
    assert "must be distinct" in message


@pytest.mark.parametrize(
    ("addr", "problem"),
    [
        ("localhost", "must look like host:port"),
        (":7001", "has no host"),
        ("[]:7001", "has no host"),
        ("host:http", "non-numeric port"),
        ("host:", "non-numeric port"),
        ("host:0", "outside 1..65535"),
        ("host:65536", "outside 1..65535"),
        ("host:-1", "outside 1..65535"),
    ],
)
@pytest.mark.parametrize("which", ["raft", "client"])
def test_bad_host_port(addr: str, problem: str, which: str) -> None:
    good = NODES[1]
    bad = NodeAddress(
        "n2",
        addr if which == "raft" else good.raft,
        addr if which == "client" else good.client,
    )
    message = config_error(nodes=[NODES[0], bad])
    assert problem in message
    assert repr(addr) in message
    assert f"{which} address of node 'n2'" in message


def test_parse_addr() -> None:
    assert parse_addr("127.0.0.1:7001") == ("127.0.0.1", 7001)
    assert parse_addr("[::1]:65535") == ("::1", 65535)
    assert parse_addr("example.org:1") == ("example.org", 1)
    with pytest.raises(ConfigError, match="listen address"):
        parse_addr("nope", "listen address")


def test_node_id_not_among_nodes() -> None:
    message = config_error(node_id="n9")
    assert "'n9'" in message
    assert "['n1', 'n2', 'n3']" in message


@pytest.mark.parametrize(
    "raw",
    [
        {"id": "n1", "raft": "127.0.0.1:7101"},
        {"id": "n1", "raft": "127.0.0.1:7101", "client": "127.0.0.1:7001", "x": 1},
        "n1,127.0.0.1:7101,127.0.0.1:7001",
        ("n1", "127.0.0.1:7101", "127.0.0.1:7001"),
    ],
    ids=["missing-client", "extra-key", "string", "tuple"],
)
def test_malformed_node_entry(raw: Any) -> None:
    message = config_error(nodes=[raw])
    assert "each node needs exactly id, raft and client" in message


def test_unknown_keys_are_named() -> None:
    message = config_error(election_timeout=1.0, hearbeat_interval=0.1)
    assert "unknown configuration keys" in message
    assert "election_timeout" in message
    assert "hearbeat_interval" in message


@pytest.mark.parametrize("missing", ["node_id", "data_dir"])
def test_required_settings(missing: str) -> None:
    values: dict[str, Any] = {"node_id": "n1", "nodes": NODES, "data_dir": "/d"}
    del values[missing]
    with pytest.raises(ConfigError, match=f"missing required setting '{missing}'"):
        NodeConfig.create(**values)


def test_production_config_has_no_test_hooks() -> None:
    """Planted bugs and clock control come only through the test build of a node
    (``raftlease.testing.node``); a production config cannot name them."""
    assert "unknown configuration keys: planted_bug" in config_error(planted_bug="fast_log_clock")
    assert "unknown configuration keys: test_hooks" in config_error(test_hooks=True)


def test_dial_must_name_peers_with_valid_addresses() -> None:
    assert make(dial={"n2": "127.0.0.1:9102"}).dial == {"n2": "127.0.0.1:9102"}
    for target in ("n1", "n9"):
        message = config_error(dial={target: "127.0.0.1:9102"})
        assert f"dial names {target!r}" in message
        assert "'n1'" in message
    message = config_error(dial={"n2": "nowhere"})
    assert "dial address for 'n2'" in message
    assert "'nowhere'" in message
    assert "dial must be a table" in config_error(dial=["n2"])


# ------------------------------------------- formerly product bugs (now fixed)


def test_clock_drift_must_be_a_number() -> None:
    assert "clock_drift" in config_error(clock_drift="0.1")


@pytest.mark.parametrize(
    "overrides",
    [{"max_key_bytes": 8192}, {"max_owner_bytes": 8192}, {"max_list": 200_000}],
    ids=["key", "owner", "list"],
)
def test_request_limits_cannot_exceed_state_machine_caps(overrides: dict[str, Any]) -> None:
    config_error(**overrides)


@pytest.mark.parametrize("value", [0, -1])
def test_max_connections_must_be_positive(value: int) -> None:
    assert "max_connections" in config_error(max_connections=value)


# ------------------------------------------------------------------ load_toml

TOML_NODES = "\n".join(
    f'[[nodes]]\nid = "{n.id}"\nraft = "{n.raft}"\nclient = "{n.client}"\n' for n in NODES
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_load_toml_valid_file(tmp_path: Path) -> None:
    path = write(
        tmp_path / "conf" / "n2.toml",
        'node_id = "n2"\ndata_dir = "data/n2"\nheartbeat_interval = 0.1\n'
        f"max_list = 50\nmin_ttl = 1\n\n{TOML_NODES}",
    )
    config = load_toml(path)
    assert config.node_id == "n2"
    assert config.nodes == NODES
    assert config.heartbeat_interval == 0.1
    assert config.max_list == 50
    assert config.min_ttl == 1
    assert config.self_node.client == "127.0.0.1:7002"
    # Relative data_dir is resolved against the file's directory, not the cwd.
    assert config.data_dir == tmp_path / "conf" / "data" / "n2"
    assert load_toml(str(path)) == config


def test_load_toml_absolute_data_dir_kept(tmp_path: Path) -> None:
    data = tmp_path / "elsewhere"
    path = write(tmp_path / "n1.toml", f'node_id = "n1"\ndata_dir = "{data}"\n{TOML_NODES}')
    assert load_toml(path).data_dir == data


def test_load_toml_overrides_replace_file_values(tmp_path: Path) -> None:
    path = write(
        tmp_path / "n1.toml", f'node_id = "n1"\ndata_dir = "d"\nmin_ttl = 2.0\n{TOML_NODES}'
    )
    config = load_toml(path, node_id="n3", min_ttl=None, max_ttl=99.0)
    assert config.node_id == "n3"
    assert config.min_ttl == 2.0  # None overrides are ignored
    assert config.max_ttl == 99.0


def test_load_toml_validates(tmp_path: Path) -> None:
    path = write(
        tmp_path / "n1.toml",
        f'node_id = "n1"\ndata_dir = "d"\nelection_timeout_min = 2.0\n{TOML_NODES}',
    )
    with pytest.raises(ConfigError) as info:
        load_toml(path)
    assert "election_timeout_min (2.0)" in info.value.message
    assert "election_timeout_max (1.0)" in info.value.message


def test_load_toml_unknown_key(tmp_path: Path) -> None:
    path = write(tmp_path / "n1.toml", f'node_id = "n1"\ndata_dir = "d"\nturbo = 1\n{TOML_NODES}')
    with pytest.raises(ConfigError, match="unknown configuration keys: turbo"):
        load_toml(path)


def test_load_toml_missing_data_dir(tmp_path: Path) -> None:
    path = write(tmp_path / "n1.toml", f'node_id = "n1"\n{TOML_NODES}')
    with pytest.raises(ConfigError, match="missing required setting 'data_dir'"):
        load_toml(path)


def test_load_toml_invalid_toml(tmp_path: Path) -> None:
    path = write(tmp_path / "broken.toml", 'node_id = "n1\ndata_dir = \n')
    with pytest.raises(ConfigError) as info:
        load_toml(path)
    assert "is not valid TOML" in info.value.message
    assert str(path) in info.value.message


def test_load_toml_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_toml(path)
    assert "does not exist" in info.value.message
    assert str(path) in info.value.message


# --------------------------------------------------------------- local_cluster


def test_local_cluster_addresses() -> None:
    assert local_cluster(3, 7001) == (
        NodeAddress("n1", "127.0.0.1:7101", "127.0.0.1:7001"),
        NodeAddress("n2", "127.0.0.1:7102", "127.0.0.1:7002"),
        NodeAddress("n3", "127.0.0.1:7103", "127.0.0.1:7003"),
    )
    assert local_cluster() == local_cluster(3, 7001)


def test_local_cluster_explicit_raft_port_and_host() -> None:
    nodes = local_cluster(2, 9000, raft_port=9500, host="10.0.0.1")
    assert nodes == (
        NodeAddress("n1", "10.0.0.1:9500", "10.0.0.1:9000"),
        NodeAddress("n2", "10.0.0.1:9501", "10.0.0.1:9001"),
    )
    # Adjacent but not overlapping blocks are fine.
    assert local_cluster(3, 9000, raft_port=9003)[0].raft == "127.0.0.1:9003"
    assert local_cluster(3, 9003, raft_port=9000)[2].raft == "127.0.0.1:9002"


def test_local_cluster_makes_a_valid_config() -> None:
    nodes = local_cluster(5, 20000)
    for node in nodes:
        assert make(nodes=nodes, node_id=node.id).self_node == node


@pytest.mark.parametrize(
    ("count", "client_port", "raft_port"),
    [(3, 7001, 7001), (3, 7001, 7003), (3, 7003, 7001), (200, 7001, None)],
)
def test_local_cluster_overlap(count: int, client_port: int, raft_port: int | None) -> None:
    with pytest.raises(ConfigError, match="overlap"):
        local_cluster(count, client_port, raft_port)


@pytest.mark.parametrize("count", [0, -1])
def test_local_cluster_needs_a_node(count: int) -> None:
    with pytest.raises(ConfigError, match="at least one node"):
        local_cluster(count)


def test_load_toml_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'node_id = "n\xe91"\n')
    with pytest.raises(ConfigError, match="latin1"):
        load_toml(path)


# ------------------------------------------------------------------------ CLI

MEMBERS = [arg for n in NODES for arg in ("--member", f"{n.id},{n.raft},{n.client}")]


def run_node_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["node", *args])
    assert not isinstance(result.exception, ConfigError | TypeError), result.exception
    return result.exit_code, result.output


def test_cli_node_refuses_bad_set(tmp_path: Path) -> None:
    code, output = run_node_cli(
        "--id", "n1", *MEMBERS, "--data-dir", str(tmp_path), "--set", "election_timeout_min=2"
    )
    assert code == 2
    assert "invalid configuration" in output
    assert "election_timeout_min (2)" in output
    assert "election_timeout_max (1.0)" in output
    assert "Traceback" not in output


def test_cli_node_refuses_bad_config_file_values(tmp_path: Path) -> None:
    path = write(tmp_path / "n1.toml", f'node_id = "n1"\ndata_dir = "d"\n{TOML_NODES}')
    code, output = run_node_cli("--config", str(path), "--set", "leader_fallback=0.5")
    assert code == 2
    assert "leader_fallback (0.5)" in output
    assert "election_timeout_max (1.0)" in output


def test_cli_node_refuses_missing_settings() -> None:
    code, output = run_node_cli("--set", "election_timeout_min=2")
    assert code == 2
    assert "invalid configuration" in output
    assert "node_id" in output


def test_cli_node_refuses_unknown_setting(tmp_path: Path) -> None:
    code, output = run_node_cli("--id", "n1", *MEMBERS, "--data-dir", str(tmp_path), "--set", "x=1")
    assert code == 2
    assert "unknown configuration keys: x" in output


def test_cli_node_refuses_setting_without_value(tmp_path: Path) -> None:
    code, output = run_node_cli(
        "--id", "n1", *MEMBERS, "--data-dir", str(tmp_path), "--set", "min_ttl"
    )
    assert code == 2
    assert "KEY=VALUE" in output


def test_cli_node_refuses_malformed_member() -> None:
    code, output = run_node_cli("--id", "n1", "--member", "n1,127.0.0.1:7101", "--data-dir", "d")
    assert code == 2
    assert "ID,RAFT_HOST:PORT,CLIENT_HOST:PORT" in output


def test_cli_node_refuses_id_not_a_member(tmp_path: Path) -> None:
    code, output = run_node_cli("--id", "n7", *MEMBERS, "--data-dir", str(tmp_path))
    assert code == 2
    assert "'n7'" in output


def test_cli_node_refuses_missing_and_invalid_files(tmp_path: Path) -> None:
    code, output = run_node_cli("--config", str(tmp_path / "missing.toml"))
    assert code == 2
    assert "does not exist" in output
    broken = write(tmp_path / "broken.toml", "node_id = [\n")
    code, output = run_node_cli("--config", str(broken))
    assert code == 2
    assert "not valid TOML" in output


# ------------------------------------------------------------ admin endpoint


def test_admin_address_is_off_by_default_and_validated() -> None:
    assert make().admin_address == ""
    assert make(admin_address="127.0.0.1:7201").admin_address == "127.0.0.1:7201"
    assert make(admin_address="localhost:7201").admin_address == "localhost:7201"
    assert "admin_address" in config_error(admin_address="127.0.0.1")
    assert "outside 1..65535" in config_error(admin_address="127.0.0.1:0")
    assert "non-numeric" in config_error(admin_address="127.0.0.1:http")
    assert "admin_address" in config_error(admin_address=7201)
    # Not a port the node already uses for Raft or clients.
    assert "also a raft or client address" in config_error(admin_address=NODES[1].client)
    assert "also a raft or client address" in config_error(admin_address=NODES[0].raft)


def test_admin_address_beyond_loopback_is_protected_mode() -> None:
    message = config_error(admin_address="0.0.0.0:7201")
    assert "protected mode" in message and "0.0.0.0:7201" in message
    assert make(admin_address="0.0.0.0:7201", insecure=True).admin_address == "0.0.0.0:7201"
    secured = make(
        admin_address="10.0.0.5:7201",
        tls_cert_file="/etc/rl/node.pem",
        tls_key_file="/etc/rl/node.key",
        auth_file="/etc/rl/auth.toml",
    )
    assert secured.admin_address == "10.0.0.5:7201"
    # TLS alone is not enough: the metrics would be readable by anyone.
    message = config_error(
        admin_address="10.0.0.5:7201", tls_cert_file="/c.pem", tls_key_file="/c.key"
    )
    assert "protected mode" in message


@pytest.mark.parametrize("name", ["peer_secret_file", "peer_keys_dir"])
def test_a_removed_peer_setting_is_refused_naming_what_replaced_it(
    tmp_path: Path, name: str
) -> None:
    with pytest.raises(
        ConfigError, match=f"{name} was removed: .*peer_ca_file|{name} was removed: .*certificate"
    ):
        NodeConfig.create(
            node_id="n1",
            nodes=[{"id": "n1", "raft": "127.0.0.1:7101", "client": "127.0.0.1:7001"}],
            data_dir=tmp_path,
            **{name: "x"},
        )


def test_id_in_a_file_setting_is_the_node_id(tmp_path: Path) -> None:
    config = NodeConfig.create(
        node_id="n2",
        nodes=[
            {"id": "n1", "raft": "127.0.0.1:7101", "client": "127.0.0.1:7001"},
            {"id": "n2", "raft": "127.0.0.1:7102", "client": "127.0.0.1:7002"},
        ],
        data_dir=tmp_path,
        peer_cert_file="certs/{id}.pem",
        peer_key_file="certs/{id}.key",
    )
    assert (config.peer_cert_file, config.peer_key_file) == ("certs/n2.pem", "certs/n2.key")


def test_max_peer_frame_must_hold_a_large_entry(tmp_path: Path) -> None:
    nodes = [{"id": "n1", "raft": "127.0.0.1:7101", "client": "127.0.0.1:7001"}]
    with pytest.raises(ConfigError, match="max_peer_frame"):
        NodeConfig.create(
            node_id="n1", nodes=nodes, data_dir=tmp_path, max_frame=1 << 20, max_peer_frame=1 << 20
        )


def test_overload_lag_is_zero_or_a_sane_number_of_seconds() -> None:
    assert make().overload_lag == 0.2
    assert make(overload_lag=0).overload_lag == 0
    assert make(overload_lag=0.05).overload_lag == 0.05
    for bad in (-1, 0.001, 61, float("nan"), float("inf"), True, "0.2"):
        assert "overload_lag" in config_error(overload_lag=bad)
