"""The Dockerfile and docker-compose.yml agree with the config format and the CLI
(issue 13, "Ship it"). Parsed, never run (tests/integration/test_deploy_run.py runs their
commands and mounts as processes).

Checked: every config file the compose file mounts exists and loads with
``raftlease.config.load_toml``; service names, hostnames, ids and ports match between
the services and the configs (and every config lists the same members); each node's
data directory is a volume of its own; the certificates are one volume made by a
one-shot service and mounted read-only by the nodes, at the paths the configs name,
and the CA key's volume is never mounted into a node; published ports are on the
host's loopback only (the configs' ``insecure = true`` depends on it); the image runs
as a non-root user a real CLI command with the config path the compose file mounts,
and its healthcheck asks the admin endpoint the configs enable.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from raftlease.cli import main
from raftlease.config import NodeConfig, load_toml, parse_addr
from tests.container_support import instructions

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
NODE_SERVICES = ("n1", "n2", "n3")


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    return instructions(DOCKERFILE)


def instruction(name: str) -> list[str]:
    return [rest for word, rest in dockerfile() if word == name]


def exec_form(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), text
    return value


def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def node_config(service: dict[str, Any]) -> tuple[NodeConfig, str]:
    """The config file a node service mounts at the image's config path, loaded."""
    config_path = exec_form(instruction("CMD")[-1])[-1]
    for volume in service["volumes"]:
        source, target, *mode = volume.split(":")
        if target == config_path:
            assert mode == ["ro"], f"{volume}: mount the config read-only"
            path = (ROOT / source).resolve()
            assert path.is_file(), f"{source} does not exist"
            return load_toml(path), source
    raise AssertionError(f"no volume mounts a config at {config_path}")


def mounts(service: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
    """target -> (source, options) of a service's volumes."""
    out: dict[str, tuple[str, list[str]]] = {}
    for volume in service["volumes"]:
        source, target, *mode = volume.split(":")
        out[target] = (source, mode)
    return out


def test_the_image_runs_a_real_node_command_as_a_non_root_user() -> None:
    (base,) = instruction("FROM")
    assert base == "python:3.11-slim"
    users = instruction("USER")
    assert users and users[-1].split(":")[0] not in ("root", "0")
    entrypoint = exec_form(instruction("ENTRYPOINT")[-1])
    assert entrypoint == ["raftlease", "node"]
    assert "node" in main.commands  # type: ignore[attr-defined]
    command = exec_form(instruction("CMD")[-1])
    assert command[0] == "--config"
    # The entrypoint with its arguments parses as the real CLI command (--help stops
    # before anything runs).
    result = CliRunner().invoke(main, [*entrypoint[1:], *command, "--help"])
    assert result.exit_code == 0, result.output
    assert "--config" in result.output
    assert "pip install ." in " ".join(instruction("RUN"))
    # The data directory the configs use is a declared volume.
    declared = {v for text in instruction("VOLUME") for v in exec_form(text)}
    data_dirs = {str(node_config(compose()["services"][s])[0].data_dir) for s in NODE_SERVICES}
    assert data_dirs <= declared


def test_the_healthcheck_asks_the_admin_endpoint_the_configs_enable() -> None:
    (check,) = instruction("HEALTHCHECK")
    assert "/livez" in check
    url_port = int(check.split("http://127.0.0.1:")[1].split("/")[0])
    for name in NODE_SERVICES:
        config, _ = node_config(compose()["services"][name])
        assert config.admin_address, "the healthcheck needs the admin endpoint"
        host, port = parse_addr(config.admin_address)
        # It binds every interface of the container, so 127.0.0.1 inside reaches it.
        assert (host, port) == ("0.0.0.0", url_port)
    exposed = {int(p) for text in instruction("EXPOSE") for p in shlex.split(text)}
    assert url_port in exposed


def test_compose_services_agree_with_their_configs() -> None:
    data = compose()
    services = data["services"]
    configs = {name: node_config(services[name])[0] for name in NODE_SERVICES}
    members = {(n.id, n.raft, n.client) for n in configs["n1"].nodes}
    assert {m[0] for m in members} == set(NODE_SERVICES)
    exposed = {int(p) for text in instruction("EXPOSE") for p in shlex.split(text)}
    for name, config in configs.items():
        service = services[name]
        assert config.node_id == name == service["hostname"]
        assert {(n.id, n.raft, n.client) for n in config.nodes} == members
        raft_host, raft_port = parse_addr(config.self_node.raft)
        client_host, client_port = parse_addr(config.self_node.client)
        # The other nodes reach it by its service name on the compose network.
        assert raft_host == client_host == name
        assert {raft_port, client_port} <= exposed
        # Published: the client and admin ports, on the host's loopback only.
        published = {}
        for spec in service["ports"]:
            host_ip, host_port, container_port = str(spec).split(":")
            assert host_ip == "127.0.0.1", f"{name}: {spec} is published beyond loopback"
            published[int(container_port)] = int(host_port)
        assert client_port in published
        assert parse_addr(config.admin_address)[1] in published
        # The configs accept an unauthenticated port only on that private network.
        assert config.insecure and not config.tls_cert_file and not config.auth_file
        assert service["networks"] == ["raftlease"]
    host_ports = [p for s in NODE_SERVICES for p in services[s]["ports"]]
    assert len(host_ports) == len(set(host_ports)), "two services publish one host port"
    assert "raftlease" in data["networks"]


def test_each_node_has_its_own_data_volume_and_reads_the_certificates_read_only() -> None:
    """Each node: a data volume of its own; the certificates' volume mounted read-only
    where its config's peer files are; the CA's volume (its key) never mounted into a
    node; and it starts only after the one-shot "certs" service completed."""
    data = compose()
    services = data["services"]
    volumes = set(data["volumes"])
    cert_volumes = set()
    data_volumes = []
    for name in NODE_SERVICES:
        service = services[name]
        config, _ = node_config(service)
        mounted = mounts(service)
        source, options = mounted[str(config.data_dir)]
        assert source in volumes and options == [], f"{name}: data dir on a named rw volume"
        data_volumes.append(source)
        files = {
            Path(f)
            for f in (
                config.peer_ca_file,
                config.peer_cert_file,
                config.peer_key_file,
                config.peer_crl_file,
            )
        }
        parents = {f.parent for f in files}
        assert len(parents) == 1, f"{name}: peer files in one folder"
        source, options = mounted[str(parents.pop())]
        assert source in volumes and options == ["ro"], f"{name}: certificates read-only"
        cert_volumes.add(source)
        assert Path(config.peer_cert_file).name == f"{name}.pem"
        assert service["depends_on"]["certs"]["condition"] == "service_completed_successfully"
    assert len(set(data_volumes)) == len(NODE_SERVICES), "one data volume per node"
    assert len(cert_volumes) == 1
    maker = services["certs"]
    made = mounts(maker)
    ca_volumes = {s for s, _ in made.values()} - cert_volumes
    assert len(ca_volumes) == 1, "the one-shot service keeps the CA in a volume of its own"
    for name in NODE_SERVICES:
        assert not ca_volumes & {s for s, _ in mounts(services[name]).values()}, (
            f"{name} mounts the CA's volume: a node could mint certificates"
        )
    # The one-shot issues each node's certificate for its service name (the name its
    # peers dial), into the volume the nodes mount.
    script = "\n".join(maker["command"])
    assert "raftlease certs init" in script and "raftlease certs node" in script
    assert "--host $$id" in script and " ".join(NODE_SERVICES) in script


def test_the_cli_service_uses_the_nodes_client_addresses() -> None:
    services = compose()["services"]
    endpoints = services["cli"]["environment"]["RAFTLEASE_ENDPOINTS"].split(",")
    config, _ = node_config(services["n1"])
    assert endpoints == [n.client for n in config.nodes]
    assert services["cli"]["entrypoint"] == ["raftlease"]


def test_dockerignore_keeps_data_and_secrets_out_of_the_image() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", "data", "raftlease-data"} <= ignored
