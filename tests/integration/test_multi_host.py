"""docs/deployment.md, "Several hosts", followed step by step on three hosts made of
network namespaces (10.0.0.11-13, the docs' own addresses: the namespaces are cut off
from this machine's network), a client host (10.0.0.100) and an admin workspace.

The ```sh blocks marked ``# step: NAME`` are read from the docs, never copied here:

- ``issue``, ``auth``, ``config``, ``add n4``: run as written (``sh -e``) in the admin
  workspace, which has a ``cluster`` link to this checkout's cluster/ and a
  ``raftlease`` on PATH that runs this checkout.
- ``host n1``: for each host, the files the paragraph before it names (``ca/nN.pem``
  with the host's id) are copied to a folder of the host's, and the block runs there
  as root inside the host, with n1 replaced by the host's id ("on n2 and n3 the same
  with their own files and id"). The host has its own /etc/raftlease and
  /etc/systemd/system (writable in this step only), /opt and /var/lib/raftlease; the
  rest of / is read-only, so a line writing anywhere else would fail. Every line runs
  as written except these (``TRANSLATIONS``):

  ===========================================  ==========================================
  line                                          done instead
  ===========================================  ==========================================
  ``useradd --system --home-dir H --shell S U`` passwd and group files with U (uid and
                                                gid 10001, home H, shell S) bound at the
                                                host's /etc/passwd and /etc/group, so the
                                                later ``install -g raftlease`` really
                                                gives the files that group
  ``python3 -m venv V && V/bin/pip install      ``V/bin/raftlease``: a script running this
  ./raftlease``                                 checkout, bound into the host
  ``systemctl daemon-reload``                   nothing (the unit is read at start)
  ``systemctl enable --now U@ID``               the unit the block installed in the host's
                                                /etc/systemd/system, started as systemd
                                                would (deploy_support.Service: ExecStart
                                                with %i, User/Group, Environment=, UMask=,
                                                StateDirectory=, ProtectSystem=strict,
                                                Restart=on-failure with RestartSec= and
                                                RestartPreventExitStatus=)
  ===========================================  ==========================================

- ``check`` and ``join n4``: run as written in the client host, in the admin
  workspace (it has ``ca/``); ``join n4`` with the variables ``check`` exports.

Then the cluster is exercised while a client on the client host keeps acquiring: the
leader's node is SIGKILLed and "systemd" restarts it; a follower's host is cut off
and comes back without an election (PreVote: the term stays); a fourth host n4 is set
up with the same steps ("a config that lists the current members and itself") and
joined, and a write commits with one of the first three stopped. The nodes never
write under /etc/raftlease (compared file by file at the end).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from raftlease.testing import wait_for
from raftlease.testing.hosts import Host, HostNetwork
from tests.deploy_support import (
    DOCS,
    ROOT,
    SYSTEMD_PATH,
    Prober,
    Service,
    Step,
    Unit,
    accounts,
    backticked,
    bind_root,
    doc_steps,
    host_network,
    owner_mode,
    run_block,
    run_in,
    seconds,
    tree_state,
    write_shim,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

SUBNET = "10.0.0.0/24"
CLIENT_ADDRESS = "10.0.0.100"
#: The uid and gid ``useradd --system`` gives the service's user here.
SERVICE_UID = 10001
#: How long a host stays cut off: more than twice election_timeout_max (2.5 s in
#: multi-host.example.toml), so its election timer fires while it cannot hear the
#: leader. This sleep is the fault's length.
ISOLATION = 6.0
#: Longest time the client may go without a successful acquire while a majority is
#: up: a failover (election timeout up to 2.5 s, then the client's retries) plus the
#: slack of a loaded 2-core machine.
FAILOVER_BOUND = 12.0

#: The host step's lines that cannot run in a network namespace, by pattern (the
#: module docstring says what each becomes); every other line runs as written.
TRANSLATIONS = {
    "useradd": re.compile(r"useradd --system --home-dir (\S+) --shell (\S+) (\S+)"),
    "venv": re.compile(r"python3 -m venv (\S+) && \1/bin/pip install \./raftlease"),
    "daemon-reload": re.compile(r"systemctl daemon-reload"),
    "enable": re.compile(r"systemctl enable --now (\S+)@(\S+)"),
}


@dataclass
class Machine:
    """One host set up by the docs' host step: its binds (its own file system), the
    files copied to it and the services it started."""

    host: Host
    binds: dict[str, Path] = field(default_factory=dict)
    services: dict[str, Service] = field(default_factory=dict)
    etc_before: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for own in ("/etc/raftlease", "/etc/systemd/system"):
            self.binds[own] = self.host.path(own, make=True)

    def install(self, step: Step, node_id: str, files: dict[str, Path]) -> None:
        """``files``: the copied files by name, in the folder the block runs in."""
        staging = self.host.path("/root/copied", make=True)
        for name, source in files.items():
            shutil.copy(source, staging / name)
        lines = re.sub(r"\bn1\b", node_id, step.body).strip().splitlines()
        pending: list[str] = []
        for line in lines:
            kind = next((k for k, p in TRANSLATIONS.items() if p.fullmatch(line)), None)
            if kind is None:
                pending.append(line)
                continue
            self.shell(pending, staging)
            pending = []
            self.translated(kind, TRANSLATIONS[kind].fullmatch(line))
        self.shell(pending, staging)
        self.etc_before = tree_state(self.host.path("/etc/raftlease"))

    def shell(self, lines: list[str], cwd: Path) -> None:
        if lines:
            run_in(
                self.host,
                "\n".join(lines),
                env={"PATH": SYSTEMD_PATH, "HOME": "/root"},
                cwd=str(cwd),
                binds=self.binds,
                read_only=["/"],
                writable=["/etc/raftlease", "/etc/systemd/system"],
            )

    def translated(self, kind: str, match: re.Match[str] | None) -> None:
        assert match is not None
        if kind == "useradd":
            home, shell, user = match.groups()
            files = accounts(self.host.path("/root/accounts"), user, SERVICE_UID, home, shell)
            self.binds.update(files)
        elif kind == "venv":
            venv = match[1]
            write_shim(self.host.path(f"{venv}/bin/raftlease"))
            self.binds[bind_root(venv)] = self.host.path(bind_root(venv))
        elif kind == "enable":
            self.start_unit(*match.groups())

    def start_unit(self, unit_name: str, instance: str) -> Service:
        """``systemctl start UNIT@INSTANCE`` with the unit installed on this host."""
        unit_file = self.host.path(f"/etc/systemd/system/{unit_name}@.service")
        service = Service(
            self.host,
            Unit.parse(unit_file.read_text()),
            instance,
            {k: v for k, v in self.binds.items() if k != "/etc/systemd/system"},
            self.host.root / "journal" / f"{unit_name}@{instance}.log",
        )
        service.log.parent.mkdir(exist_ok=True)
        self.services[instance] = service
        service.start()
        return service


class Cluster:
    """The hosts, the admin workspace and the client's view of the cluster."""

    def __init__(self, net: HostNetwork, admin: Path, steps: dict[str, Step]) -> None:
        self.net = net
        self.admin = admin
        self.steps = steps
        self.machines: dict[str, Machine] = {}
        self.client = net.add_host("client", CLIENT_ADDRESS)
        bin_dir = admin.parent / "bin"
        write_shim(bin_dir / "raftlease")
        path = f"{bin_dir}:{SYSTEMD_PATH}"
        self.env = {"PATH": path, "HOME": str(admin), "PYTHONPATH": str(ROOT)}
        self.client_env = self.env | exports(steps["check"].body)

    def cli(self, *args: str, endpoints: str | None = None, check: bool = True) -> str:
        env = self.client_env | ({"RAFTLEASE_ENDPOINTS": endpoints} if endpoints else {})
        command = shlex.join(["raftlease", *args])
        done = run_in(self.client, command, env=env, cwd=str(self.admin), check=check)
        return done.stdout.decode()

    def statuses(self, endpoints: str | None = None) -> list[dict[str, Any]]:
        import json

        done = run_in(
            self.client,
            shlex.join(["raftlease", "status", "--json", "--timeout", "3"]),
            env=self.client_env | ({"RAFTLEASE_ENDPOINTS": endpoints} if endpoints else {}),
            cwd=str(self.admin),
            check=False,
        )
        text = done.stdout.decode().strip()
        return list(json.loads(text)["nodes"]) if text.startswith("{") else []

    def agreed(self, endpoints: str | None = None, count: int = 3) -> dict[str, Any] | None:
        """The leader's status if ``count`` nodes answer and all follow it (``leader``
        is its client address), else None; ``id`` is its id, ``nodes`` every status."""
        up = [s for s in self.statuses(endpoints) if s.get("reachable")]
        leaders = {s["leader"] for s in up}
        if len(up) < count or len(leaders) != 1 or None in leaders:
            return None
        leader = next((s for s in up if s["client"] == s["leader"]), None)
        if leader is None or leader["role"] != "leader":
            return None
        return {**leader, "id": leader["node"], "nodes": {s["node"]: s for s in up}}

    def wait_agreed(self, what: str, timeout: float = 30.0, **kw: Any) -> dict[str, Any]:
        return wait_for(lambda: self.agreed(**kw), timeout, what, interval=0.2)

    def setup_host(self, node_id: str, address: str, config: str | None = None) -> Machine:
        """The docs' step 2 on a new host: copy the files its paragraph names, run the
        block with the host's id."""
        step = self.steps["host n1"]
        shown = re.search(r"shown for (\w+) on ([\d.]+)", step.prose)
        assert shown and shown.groups() == ("n1", member_hosts(self.steps["issue"])["n1"])
        files = {}
        for name in backticked(step.prose.split("then as root")[0]):
            source = self.admin / name.replace("nN", node_id)
            assert source.is_file(), f"the docs say to copy {name}; {source} is missing"
            files[source.name] = source
        if config is not None:
            edited = self.admin / f"{node_id}-multi-host.toml"
            edited.write_text(config)
            files["multi-host.toml"] = edited
        machine = Machine(self.net.add_host(node_id, address))
        self.machines[node_id] = machine
        machine.install(step, node_id, files)
        return machine

    def services(self) -> dict[str, Service]:
        return {i: s for m in self.machines.values() for i, s in m.services.items()}


def exports(body: str) -> dict[str, str]:
    """The variables a block's ``export`` lines set."""
    env: dict[str, str] = {}
    for line in body.splitlines():
        if line.startswith("export "):
            for assignment in shlex.split(line[len("export ") :]):
                key, _, value = assignment.partition("=")
                env[key] = value
    return env


def member_hosts(step: Step) -> dict[str, str]:
    """id -> --host of each ``raftlease certs node ID ... --host H`` line."""
    found = re.findall(r"raftlease certs node (\S+) .*--host (\S+)", step.body)
    return dict(found)


def test_several_hosts_as_the_docs_say(tmp_path: Path) -> None:
    steps = doc_steps(DOCS.read_text())
    admin = tmp_path / "admin"
    admin.mkdir()
    (admin / "cluster").symlink_to(ROOT / "cluster")
    with host_network(tmp_path / "hosts", SUBNET) as net:
        cluster = Cluster(net, admin, steps)
        try:
            _run(cluster, steps, tmp_path)
        finally:
            for machine in cluster.machines.values():
                for service in machine.services.values():
                    service.abandon()  # host_network's close kills them
                    if service.log.exists():
                        print(f"----- {service.log} -----")
                        print("\n".join(service.log.read_text().splitlines()[-40:]))


def _run(cluster: Cluster, steps: dict[str, Step], tmp_path: Path) -> None:
    # 1. Certificates, the auth file and the config, on the admin workstation.
    for name in ("issue", "auth", "config"):
        run_block(steps[name].body, cluster.admin, cluster.env)
    assert (cluster.admin / "ca" / "ca.key").exists() and (cluster.admin / "auth.toml").exists()

    # 2. Each host.
    addresses = member_hosts(steps["issue"])
    assert addresses == {"n1": "10.0.0.11", "n2": "10.0.0.12", "n3": "10.0.0.13"}
    for node_id, address in addresses.items():
        machine = cluster.setup_host(node_id, address)
        etc = machine.host.path("/etc/raftlease")
        assert owner_mode(etc) == (0, SERVICE_UID, "0o750")
        assert owner_mode(etc / "node.key") == (0, SERVICE_UID, "0o640")
        assert owner_mode(etc / "node.toml") == (0, SERVICE_UID, "0o640")
        assert owner_mode(etc / "ca.pem") == (0, 0, "0o644")
        assert machine.services[node_id].running()

    # 3. Check, as written, once the members agree on a leader.
    first = cluster.wait_agreed("the three members to agree on a leader")
    done = run_in(cluster.client, steps["check"].body, env=cluster.env, cwd=str(cluster.admin))
    out = done.stdout.decode()
    leader_line = [line for line in out.splitlines() if line.startswith(first["id"] + " ")]
    assert leader_line and leader_line[0].split()[2:3] == ["leader"], out
    named = [line for line in out.splitlines() if line.endswith(f"  {first['leader']}")]
    assert len(named) == 3, out  # every member names it
    assert "acquired demo/gpu-0 for ops" in out, out

    _a_configuration_error_exits_2_for_good(cluster.machines["n1"])
    prober = Prober(cluster.client, cluster.client_env, tmp_path / "prober.log", str(cluster.admin))
    prober.start()
    begin = time.time()
    _a_node_dies_and_systemd_restarts_it(cluster, prober, first)
    _a_host_cut_off_rejoins_without_an_election(cluster, prober, addresses)
    _a_fourth_member_joins(cluster, prober, steps)

    # Throughout: served, and nothing written under any host's /etc/raftlease.
    gap = prober.longest_gap(begin, time.time())
    print(f"longest time without an acquire, whole run: {gap:.2f} s")
    assert gap < FAILOVER_BOUND, f"no acquire for {gap:.1f} s"
    for node_id, machine in cluster.machines.items():
        assert tree_state(machine.host.path("/etc/raftlease")) == machine.etc_before, node_id
        data = machine.host.path(f"/var/lib/raftlease/{node_id}")
        assert owner_mode(data) == (SERVICE_UID, SERVICE_UID, "0o700")
        assert any(data.iterdir()), f"{node_id} wrote nothing to its data directory"
        journal = machine.services[node_id].log.read_text()
        assert "Traceback" not in journal and "level=ERROR" not in journal, journal


def _a_configuration_error_exits_2_for_good(machine: Machine) -> None:
    """A node that cannot start as configured stops at once with a message naming why
    (exit status 2), and the unit does not restart it (RestartPreventExitStatus=2):
    here n2's unit started on n1's host, which does not have n2's address."""
    wrong = machine.start_unit("raftlease", "n2")
    wrong.wait_finished(30)
    assert (wrong.exits, wrong.starts) == ([2], 1)
    assert "error: cannot listen on the client address 10.0.0.12:7001" in wrong.log.read_text()
    del machine.services["n2"]


def _a_node_dies_and_systemd_restarts_it(
    cluster: Cluster, prober: Prober, first: dict[str, Any]
) -> None:
    """The leader's node is SIGKILLed: another leads, the unit restarts the node after
    RestartSec, it replays its journal and catches up."""
    victim = cluster.services()[first["id"]]
    killed_at = time.time()
    victim.kill(signal.SIGKILL)
    victim.wait_started(2, 30)
    assert victim.exits == [-signal.SIGKILL]
    assert time.time() - killed_at >= seconds(victim.spec("RestartSec"))
    after = cluster.wait_agreed("the restarted node to follow the new leader")
    assert after["term"] > first["term"]
    prober.wait_success(FAILOVER_BOUND, "an acquire after the failover")
    _caught_up(cluster, first["id"])
    gap = prober.longest_gap(killed_at, time.time())
    print(f"longest time without an acquire, leader killed: {gap:.2f} s")
    assert gap < FAILOVER_BOUND, f"no acquire for {gap:.1f} s around the kill"


def _a_host_cut_off_rejoins_without_an_election(
    cluster: Cluster, prober: Prober, addresses: dict[str, str]
) -> None:
    """A follower's host is cut off from every other (the client included) for longer
    than its election timeout: it asks for pre-votes without raising its term, the
    client keeps acquiring through the others, and once healed the node follows the
    same leader in the same term."""
    leader = cluster.wait_agreed("a leader before the partition")
    cut = next(i for i in sorted(leader["nodes"]) if i != leader["id"])
    cut_at = time.time()
    cluster.net.isolate(cut)
    time.sleep(ISOLATION)  # the fault's length (see ISOLATION)
    own = run_in(  # the cut-off node, asked on its own host
        cluster.net.host(cut),
        f"raftlease status --json --endpoints {addresses[cut]}:7001 --timeout 3",
        env=cluster.client_env,
        cwd=str(cluster.admin),
        check=False,
    )
    (alone,) = _json(own.stdout.decode())["nodes"]
    assert (alone["term"], alone["pre_vote_rounds"] > 0) == (leader["term"], True), (
        f"{cut} cut off for {ISOLATION} s: term {alone['term']} (leader's {leader['term']}), "
        f"pre-vote rounds {alone['pre_vote_rounds']}, role {alone.get('role')}; {alone}"
    )
    isolated_gap = prober.longest_gap(cut_at, time.time())
    cluster.net.heal_all()
    healed = cluster.wait_agreed(f"{cut} to follow the leader again", timeout=20)
    assert (healed["id"], healed["term"]) == (leader["id"], leader["term"])
    assert healed["nodes"][cut]["term"] == leader["term"]
    _caught_up(cluster, cut)
    print(f"longest time without an acquire, {cut} cut off: {isolated_gap:.2f} s")
    assert isolated_gap < FAILOVER_BOUND / 2, f"no acquire for {isolated_gap:.1f} s"


def _a_fourth_member_joins(cluster: Cluster, prober: Prober, steps: dict[str, Step]) -> None:
    """ "Adding a member": n4's certificate, step 2 on a new host with a config that
    lists the current members and itself, the join; then four members serve and a
    write commits with one of the first three stopped (three of four: n4 counts)."""
    run_block(steps["add n4"].body, cluster.admin, cluster.env)
    n4_address = member_hosts(steps["add n4"])["n4"]
    join = re.search(r"--raft (\S+) --client (\S+)", steps["join n4"].body)
    assert join and join[1].startswith(n4_address + ":")
    listing = f'\n[[nodes]]\nid = "n4"\nraft = "{join[1]}"\nclient = "{join[2]}"\n'
    config = (cluster.admin / "multi-host.toml").read_text() + listing
    cluster.setup_host("n4", n4_address, config=config)
    four = f"{cluster.client_env['RAFTLEASE_ENDPOINTS']},{join[2]}"
    wait_for(lambda: _reachable(cluster, join[2]), 30, "n4 to answer", interval=0.2)
    run_in(cluster.client, steps["join n4"].body, env=cluster.client_env, cwd=str(cluster.admin))
    joined = cluster.wait_agreed("four members serving", endpoints=four, count=4)
    members = cluster.cli("member", "list", "--json", endpoints=four)
    assert sorted(m["id"] for m in _json(members)["members"]) == ["n1", "n2", "n3", "n4"]
    # As the docs say, the client is told of n4: it follows a redirect only to one of
    # its endpoints, and n4 may lead once one of the first three stops.
    prober.restart({**cluster.client_env, "RAFTLEASE_ENDPOINTS": four})

    # The leader stopped, if it is one of the first three: a new one needs n4's vote.
    services = cluster.services()
    stopped = joined["id"] if joined["id"] != "n4" else "n1"
    starts = services[stopped].starts
    stopped_at = time.time()
    assert services[stopped].stop() == 0
    assert services[stopped].starts == starts  # a clean stop is not restarted
    rest = ",".join(e for e in four.split(",") if e != joined["nodes"][stopped]["client"])
    cluster.wait_agreed(f"a leader without {stopped}", endpoints=rest, count=3)
    out = cluster.cli("acquire", "demo/four", "--owner", "ops", "--ttl", "30s", endpoints=rest)
    assert "acquired demo/four for ops" in out
    prober.wait_success(FAILOVER_BOUND, f"an acquire without {stopped}")
    gap = prober.longest_gap(stopped_at, time.time())
    print(f"longest time without an acquire, {stopped} stopped: {gap:.2f} s")
    assert gap < FAILOVER_BOUND


def _json(text: str) -> dict[str, Any]:
    import json

    value = json.loads(text)
    assert isinstance(value, dict)
    return value


def _reachable(cluster: Cluster, endpoint: str) -> bool:
    return any(s.get("reachable") for s in cluster.statuses(endpoint))


def _caught_up(cluster: Cluster, node_id: str) -> None:
    """Wait until ``node_id`` applied what the leader had committed when asked."""
    target = cluster.wait_agreed("a leader")["commit_index"]

    def applied() -> bool:
        view = cluster.agreed()
        return view is not None and view["nodes"][node_id]["applied_index"] >= target

    wait_for(applied, 30, f"{node_id} to catch up to index {target}", interval=0.2)


def test_the_translation_table_matches_the_docs() -> None:
    """Every line of the host step runs as written or matches exactly one translation,
    and each translation is used: a changed line is noticed here first."""
    step = doc_steps(DOCS.read_text())["host n1"]
    used = []
    for line in step.body.strip().splitlines():
        kinds = [k for k, p in TRANSLATIONS.items() if p.fullmatch(line)]
        assert len(kinds) <= 1, line
        used += kinds
        if not kinds:
            assert line.split()[0] == "install", f"a line neither run nor translated: {line}"
    assert sorted(used) == sorted(TRANSLATIONS)
    assert os.path.basename(ROOT / "cluster" / "raftlease@.service") in step.body
