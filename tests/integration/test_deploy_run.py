"""docker-compose.yml and cluster/kubernetes/raftlease.yaml run as processes: no
container runtime, but each container or pod is a host of raftlease.testing.hosts
(its own address and name, the compose network or the cluster network being the
harness's bridge) running the file's command with its mounts, user and environment
(tests/container_support.py says how an image's container is made).

Compose: named volumes are folders that start with the owner and mode of the image's
directory at their target (uid 10001, as Docker copies them), each service is a host
named after it, its entrypoint and command in exec form (``$$`` is a literal ``$``),
its volumes bound (``:ro`` read-only), as the image's USER. The one-shot ``certs``
runs first and must exit 0 (service_completed_successfully), then n1..n3; a leader
must be agreed (the ``cli`` service's entrypoint with ``status --json``, on a host of
its own), the image's HEALTHCHECK must pass inside a node, and ``docker compose run
--rm cli acquire ...`` must succeed. ``certs`` run again changes no file.

Kubernetes: the Secrets are made by the docs' ``kubernetes secrets`` step (``kubectl
create secret generic`` writes a folder per Secret, ``kubectl apply`` is recorded),
the StatefulSet's pods are hosts raftlease-0..2 with the headless Service's names
(``raftlease-N.raftlease`` and the cluster FQDN), the ConfigMap and Secrets mounted as
files (defaultMode, owned by root and the pod's fsGroup), runAsUser, a read-only root
file system but for the PersistentVolumeClaim, and ``$(POD_NAME)`` in the command.
The readiness and liveness probes (HTTPS GET, certificate not verified, from a
kubelet host) answer 200 on every pod. Then raftlease-1 is deleted and comes back at
a new IP under the same names with its volume: its peers find it (names are
re-resolved), and a write commits with raftlease-0 stopped.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from raftlease.testing import wait_for
from raftlease.testing.hosts import Host, HostNetwork
from tests.container_support import (
    PROBE,
    Container,
    Image,
    Mount,
    compose_literal,
    expand_k8s,
    make_dir,
    volume_dir,
    write_kubectl,
)
from tests.deploy_support import (
    DOCS,
    PY,
    ROOT,
    SYSTEMD_PATH,
    doc_steps,
    host_network,
    run_block,
    run_in,
    tree_state,
    write_shim,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: How long a cluster may take to agree on a leader from its nodes' start.
LEADER_DEADLINE = 40.0


def content(path: Path) -> dict[str, tuple[int, int, int, int, str]]:
    """``tree_state`` without times: what a run that "changes nothing" keeps equal."""
    return {k: (v[0], v[1], v[2], v[3], v[5]) for k, v in tree_state(path).items()}


# ----------------------------------------------------------------- compose


@dataclass
class Compose:
    """``docker compose`` for one project folder (the compose file, the Dockerfile and
    the files the services mount), on ``net``."""

    root: Path
    net: HostNetwork
    base: Path

    def __post_init__(self) -> None:
        self.file = yaml.safe_load((self.root / "docker-compose.yml").read_text())
        self.image = Image.parse(self.root / "Dockerfile")
        self.services: dict[str, Any] = self.file["services"]
        self.runs = 0

    def one_shots(self) -> list[str]:
        """Services others wait for with condition service_completed_successfully."""
        needed = {
            name
            for service in self.services.values()
            for name, why in (service.get("depends_on") or {}).items()
            if why.get("condition") == "service_completed_successfully"
        }
        return sorted(needed)

    def long_running(self) -> list[str]:
        """What ``up`` starts and keeps running: no profile, not a one-shot."""
        skip = set(self.one_shots())
        return [n for n, s in self.services.items() if n not in skip and not s.get("profiles")]

    def host(self, name: str) -> Host:
        service = self.services[name]
        assert service.get("hostname", name) == name, "a hostname other than the service's"
        assert service["networks"] == list(self.file["networks"]), name
        return self.net.hosts.get(name) or self.net.add_host(name)

    def container(self, name: str) -> Container:
        service = self.services[name]
        mounts = []
        for spec in service.get("volumes", []):
            source, target, *options = spec.split(":")
            if source.startswith((".", "/")):
                path = (self.root / source).resolve()
                assert path.exists(), f"{name} mounts {source}, which does not exist"
            else:
                assert source in self.file["volumes"], f"{source} is not a declared volume"
                path = volume_dir(self.base / "volumes", source, self.image, target)
            mounts.append(Mount(target, path, options == ["ro"]))
        self.runs += 1
        for target in self.image.volumes:  # the image's VOLUMEs left: anonymous volumes
            if target not in [m.target for m in mounts]:
                anonymous = f"{name}-{self.runs}-{target.strip('/').replace('/', '-')}"
                mounts.append(
                    Mount(target, volume_dir(self.base / "anon", anonymous, self.image, target))
                )
        environment = service.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(item.split("=", 1) for item in environment)
        env = {k: compose_literal(str(v)) for k, v in environment.items()}
        return Container(self.host(name), self.image, mounts, env, user=service.get("user"))

    def argv(self, name: str, command: list[str] | None = None) -> list[str]:
        """Entrypoint and command: a service's entrypoint drops the image's CMD."""
        service = self.services[name]
        entrypoint = service.get("entrypoint", self.image.entrypoint)
        if command is None:
            command = service.get("command", [] if "entrypoint" in service else self.image.cmd)
        assert isinstance(entrypoint, list) and isinstance(command, list), "exec form only"
        return [compose_literal(str(a)) for a in [*entrypoint, *command]]

    def run(
        self, name: str, *command: str, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[bytes]:
        """``docker compose run --rm NAME COMMAND`` (or the one-shot's own command)."""
        argv = self.argv(name, list(command) if command else None)
        return self.container(name).run(argv, timeout=timeout)

    def up(self) -> dict[str, subprocess.Popen[bytes]]:
        for name in self.one_shots():
            done = self.run(name)
            output = (done.stdout + done.stderr).decode(errors="replace")
            assert done.returncode == 0, f"one-shot {name} exited {done.returncode}:\n{output}"
        procs = {}
        for name in self.long_running():
            log = self.base / f"{name}.log"
            procs[name] = self.container(name).popen(self.argv(name), log)
        return procs

    def logs(self) -> str:
        return "\n".join(
            f"----- {log.name} -----\n{log.read_text()[-3000:]}"
            for log in sorted(self.base.glob("*.log"))
        )


def agreed_leader(statuses: list[dict[str, Any]], count: int) -> str | None:
    """The leader's client address if ``count`` nodes answer and all follow it."""
    up = [s for s in statuses if s.get("reachable")]
    leaders = {s.get("leader") for s in up}
    if len(up) < count or len(leaders) != 1 or None in leaders:
        return None
    leader = leaders.pop()
    return leader if any(s["client"] == leader and s["role"] == "leader" for s in up) else None


def alive(procs: dict[str, subprocess.Popen[bytes]], logs: Callable[[], str]) -> None:
    dead = {name: p.returncode for name, p in procs.items() if p.poll() is not None}
    assert not dead, f"exited: {dead}\n{logs()}"


def compose_cluster_serves(root: Path, base: Path, net: HostNetwork) -> None:
    """The compose file of ``root`` up, a leader, the healthcheck, an acquire, and its
    one-shots again without a change. Fails with the services' logs."""
    compose = Compose(root, net, base)
    procs = compose.up()
    assert sorted(procs) == ["n1", "n2", "n3"]
    cli = "cli"

    def leader() -> str | None:
        alive(procs, compose.logs)
        done = compose.run(cli, "status", "--json", "--timeout", "3")
        text = done.stdout.decode().strip()
        return agreed_leader(json.loads(text)["nodes"], 3) if text.startswith("{") else None

    wait_for(leader, LEADER_DEADLINE, "the compose nodes to agree on a leader", interval=0.3)
    node = compose.container("n1")
    health = node.run(compose.image.healthcheck, timeout=10)
    assert health.returncode == 0, health.stderr.decode()
    done = compose.run(cli, "acquire", "demo/x", "--owner", "me", "--ttl", "30s")
    assert done.returncode == 0 and b"acquired demo/x for me" in done.stdout, done.stderr
    # What the one-shots write: the volumes they mount (the nodes write their own).
    names = {
        spec.split(":")[0]
        for shot in compose.one_shots()
        for spec in compose.services[shot]["volumes"]
    }
    volumes = [base / "volumes" / name for name in sorted(names)]
    before = {v.name: content(v) for v in volumes}
    assert all(before.values())
    for name in compose.one_shots():
        assert compose.run(name).returncode == 0
    assert {v.name: content(v) for v in volumes} == before, "the one-shots changed files"
    alive(procs, compose.logs)


def test_docker_compose_file_runs(tmp_path: Path) -> None:
    with host_network(tmp_path / "hosts", "10.201.7.0/24") as net:
        compose_cluster_serves(ROOT, tmp_path / "compose", net)


# -------------------------------------------------------------- kubernetes


def manifest() -> dict[tuple[str, str], Any]:
    path = ROOT / "cluster" / "kubernetes" / "raftlease.yaml"
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(path.read_text())}


@dataclass
class StatefulSet:
    """The manifest's StatefulSet as pods on ``net``, in namespace ``default``."""

    net: HostNetwork
    base: Path
    objects: dict[tuple[str, str], Any]
    secrets: Path  # the folders kubectl made, one per Secret
    namespace: str = "default"

    def __post_init__(self) -> None:
        (self.set,) = [d for (kind, _), d in self.objects.items() if kind == "StatefulSet"]
        self.pod_spec = self.set["spec"]["template"]["spec"]
        (self.spec,) = self.pod_spec["containers"]
        self.image = Image.parse(ROOT / "Dockerfile")
        security = self.pod_spec["securityContext"]
        self.uid, self.gid = security["runAsUser"], security["runAsGroup"]
        self.fs_group = security["fsGroup"]
        assert security["runAsNonRoot"] and self.uid != 0
        # The harness runs a process with one group: the fsGroup must be that group.
        assert self.fs_group == self.gid
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.volumes = {v["name"]: self.volume(v) for v in self.pod_spec["volumes"]}

    def volume(self, volume: dict[str, Any]) -> Path:
        """A ConfigMap or Secret volume's files: defaultMode, root and the fsGroup."""
        if "configMap" in volume:
            data = self.objects["ConfigMap", volume["configMap"]["name"]]["data"]
            mode = volume["configMap"].get("defaultMode", 0o644)
        else:
            source = self.secrets / volume["secret"]["secretName"]
            data = {p.name: p.read_text() for p in source.iterdir()}
            mode = volume["secret"].get("defaultMode", 0o644)
        folder = make_dir(self.base / "volumes" / volume["name"], (0, self.fs_group, 0o755))
        for key, text in data.items():
            (folder / key).write_text(text)
            (folder / key).chmod(mode)
            shutil.chown(folder / key, 0, self.fs_group)
        return folder

    def names(self, index: int) -> tuple[str, list[str]]:
        pod = f"{self.set['metadata']['name']}-{index}"
        service = self.set["spec"]["serviceName"]
        return pod, [f"{pod}.{service}", f"{pod}.{service}.{self.namespace}.svc.cluster.local"]

    def start(self, index: int, address: str | None = None) -> Host:
        pod, aliases = self.names(index)
        host = self.net.add_host(pod, address, aliases)
        claims = {c["metadata"]["name"] for c in self.set["spec"]["volumeClaimTemplates"]}
        mounts = []
        for mount in self.spec["volumeMounts"]:
            name = mount["name"]
            if name in claims:  # the pod's own claim, kept across restarts; fsGroup'd
                source = make_dir(self.base / "pvc" / f"{name}-{pod}", (0, self.fs_group, 0o2775))
            else:
                source = self.volumes[name]
            mounts.append(Mount(mount["mountPath"], source, mount.get("readOnly", False)))
        env = {}
        for item in self.spec.get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
            else:
                field_path = item["valueFrom"]["fieldRef"]["fieldPath"]
                env[item["name"]] = {"metadata.name": pod, "metadata.namespace": self.namespace}[
                    field_path
                ]
        read_only_root = self.spec["securityContext"]["readOnlyRootFilesystem"]
        container = Container(
            host, self.image, mounts, env, f"{self.uid}:{self.gid}", read_only_root
        )
        command = self.spec.get("command", self.image.entrypoint)
        args = self.spec.get("args", [] if "command" in self.spec else self.image.cmd)
        merged = container.image.env | env
        argv = [expand_k8s(a, merged) for a in [*command, *args]]
        self.procs[pod] = container.popen(argv, self.base / f"{pod}.log")
        return host

    def probe_urls(self, host: Host) -> list[str]:
        ports = {p["name"]: p["containerPort"] for p in self.spec["ports"]}
        urls = []
        for probe in ("readinessProbe", "livenessProbe"):
            get = self.spec[probe]["httpGet"]
            port = ports.get(get["port"], get["port"])
            urls.append(f"{get['scheme'].lower()}://{host.address}:{port}{get['path']}")
        return urls

    def logs(self) -> str:
        return "\n".join(
            f"----- {log.name} -----\n{log.read_text()[-3000:]}"
            for log in sorted(self.base.glob("*.log"))
        )


def test_kubernetes_manifest_runs(tmp_path: Path) -> None:
    steps = doc_steps(DOCS.read_text())
    admin = tmp_path / "admin"
    admin.mkdir()
    (admin / "cluster").symlink_to(ROOT / "cluster")
    bin_dir = tmp_path / "bin"
    write_shim(bin_dir / "raftlease")
    write_kubectl(bin_dir / "kubectl", PY)
    store = tmp_path / "kubectl"
    store.mkdir()
    env = {"PATH": f"{bin_dir}:{SYSTEMD_PATH}", "HOME": str(admin), "KUBECTL_STORE": str(store)}
    run_block(steps["auth"].body, admin, env)  # "auth.toml as in Several hosts"
    run_block(steps["kubernetes secrets"].body, admin, env)
    assert (store / "applied").read_text() == "cluster/kubernetes/raftlease.yaml\n"
    run_block("raftlease certs client ops --dir ca", admin, env)  # the test's own client

    with host_network(tmp_path / "hosts", "10.201.8.0/24") as net:
        pods = StatefulSet(net, tmp_path / "k8s", manifest(), store / "secrets")
        try:
            _serve_and_move_a_pod(pods, net, admin, env)
        except BaseException:
            print(pods.logs())
            raise


def _serve_and_move_a_pod(
    pods: StatefulSet, net: HostNetwork, admin: Path, env: dict[str, str]
) -> None:
    replicas = pods.set["spec"]["replicas"]
    hosts = [pods.start(i) for i in range(replicas)]
    kubelet = net.add_host("kubelet")
    client = net.add_host("client")
    service = pods.set["spec"]["serviceName"]
    endpoints = ",".join(f"{h.name}.{service}:7001" for h in hosts)
    client_env = env | {
        "RAFTLEASE_ENDPOINTS": endpoints,
        "RAFTLEASE_CA_FILE": "ca/ca.pem",
        "RAFTLEASE_CERT_FILE": "ca/ops.pem",
        "RAFTLEASE_KEY_FILE": "ca/ops.key",
    }
    mounted = {name: tree_state(path) for name, path in pods.volumes.items()}

    def cli(*args: str, check: bool = True) -> str:
        done = run_in(
            client, " ".join(["raftlease", *args]), env=client_env, cwd=str(admin), check=check
        )
        return done.stdout.decode()

    def probes(targets: list[Host]) -> dict[str, Any]:
        alive(pods.procs, pods.logs)
        urls = [u for h in targets for u in pods.probe_urls(h)]
        done = kubelet.run([PY, "-c", PROBE, json.dumps(urls)], timeout=30)
        return dict(json.loads(done.stdout.decode()))

    def leader(count: int = replicas) -> str | None:
        text = cli("status", "--json", "--timeout", "3", check=False).strip()
        return agreed_leader(json.loads(text)["nodes"], count) if text.startswith("{") else None

    def all_ok(targets: list[Host]) -> bool:
        return set(probes(targets).values()) == {200}

    wait_for(leader, LEADER_DEADLINE, "the pods to agree on a leader", interval=0.3)
    wait_for(lambda: all_ok(hosts), 30, "every pod's probes to answer 200", interval=0.3)
    assert "acquired demo/k8s for ops" in cli(
        "acquire", "demo/k8s", "--owner", "ops", "--ttl", "30s"
    )

    # raftlease-1 deleted (its processes killed, its names gone) and rescheduled at a
    # new IP under the same names, with its volume.
    moved = hosts[1]
    old_address = moved.address
    net.remove_host(moved.name)
    assert pods.procs.pop(moved.name).returncode == -signal.SIGKILL
    assert "acquired demo/k8s-2 for ops" in cli(
        "acquire", "demo/k8s-2", "--owner", "ops", "--ttl", "30s"
    )
    new_address = "10.201.8.77"
    assert new_address != old_address
    moved = pods.start(1, new_address)
    hosts[1] = moved
    wait_for(lambda: all_ok([moved]), 40, f"{moved.name}'s probes at {new_address}", interval=0.3)

    def taken_back() -> bool:
        text = cli("status", "--json", "--timeout", "3", check=False).strip()
        nodes = json.loads(text)["nodes"] if text.startswith("{") else []
        peers = {s.get("node"): set(s.get("connected_peers") or []) for s in nodes}
        names = {h.name for h in hosts}
        return agreed_leader(nodes, replicas) is not None and all(
            peers.get(name) == names - {name} for name in names
        )

    # Its peers dial its name, resolved again: every member connected to every other.
    began = time.monotonic()
    wait_for(taken_back, 40, f"the members to take {moved.name} back", interval=0.3)
    print(f"{moved.name} taken back {time.monotonic() - began:.1f} s after its start")

    # raftlease-0 stopped (SIGTERM, as a pod deleted): a write needs raftlease-1 and -2.
    first = pods.procs.pop(hosts[0].name)
    first.terminate()
    assert first.wait(timeout=30) == 0
    began = time.monotonic()

    def write() -> str:
        out = cli("acquire", "demo/moved", "--owner", "ops", "--ttl", "30s", check=False)
        return out if "acquired demo/moved for ops" in out else ""

    wait_for(write, 40, "a write without raftlease-0", interval=0.3)
    print(f"a write committed {time.monotonic() - began:.1f} s after raftlease-0 stopped")
    alive(pods.procs, pods.logs)
    assert {name: tree_state(path) for name, path in pods.volumes.items()} == mounted
    data = pods.base / "pvc" / f"data-{moved.name}" / "data"
    assert data.stat().st_uid == pods.uid and any(data.iterdir())
