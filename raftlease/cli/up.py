"""``raftlease up``: a local cluster of real node processes for trying raftlease, kept
running (and watched: up_console.py) until Ctrl-C, SIGTERM or ``quit``; ``--demo`` runs
a short lease demo against it.

Signals: SIGINT and SIGTERM stop every node and exit 0, whatever this process
inherited (common.SignalBox). The nodes stop by themselves if this process is killed
(even with SIGKILL: ``--parent-pid``, server/launcher.py). Main thread; blocks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from ..config import local_cluster
from ..errors import ConfigError, LeaseHeldError
from .common import LOG_FORMATS, SignalBox, connect
from .up_console import UpConsole


@click.command()
@click.option("--nodes", "count", default=3, show_default=True, help="Number of nodes.")
@click.option("--port", default=7001, show_default=True, help="First client port.")
@click.option(
    "--data-dir",
    default="./raftlease-data",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the nodes keep their journals.",
)
@click.option("--demo/--no-demo", default=False, help="Run a short lease demo once it is up.")
@click.option(
    "--exit-after-demo", is_flag=True, help="Stop the cluster after the demo (for scripts)."
)
@click.option(
    "--secure",
    is_flag=True,
    help="TLS and authentication on the client port: makes a CA, certificates, an admin "
    "token and an auth file in DATA_DIR/secure and prints how to use them.",
)
@click.option(
    "--admin-port",
    type=int,
    default=None,
    help="First admin (HTTP: /metrics, /readyz, ...) port; default: 200 above --port.",
)
@click.option("--admin/--no-admin", default=True, help="Serve each node's admin endpoint.")
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    help="The nodes' log lines: key=value text or JSON.",
)
def up(
    count: int,
    port: int,
    data_dir: str,
    demo: bool,
    exit_after_demo: bool,
    secure: bool,
    admin_port: int | None,
    admin: bool,
    log_format: str,
) -> None:
    """Start a local cluster of COUNT nodes and keep it running until Ctrl-C.

    A node that ends is reported and the others keep serving; commands typed while it
    runs: status, kill ID, restart ID, help, quit. The nodes stop by themselves if
    this process is killed (even with SIGKILL)."""
    # Here, not at the top: the test cluster loads the client, which `raftlease node`
    # (this module is loaded for every command) must not.
    from ..testing.cluster import LocalCluster, port_free

    try:
        members = local_cluster(count, port)
    except ConfigError as exc:
        raise click.UsageError(exc.message) from None
    # The nodes inherit the environment: `raftlease node` reads its --log-format there.
    os.environ["RAFTLEASE_LOG_FORMAT"] = log_format
    admin_base = admin_port if admin_port is not None else port + 200
    admin_addrs = {m.id: f"127.0.0.1:{admin_base + i}" for i, m in enumerate(members)}
    taken = {a for m in members for a in (m.raft, m.client)}
    if admin and (taken & set(admin_addrs.values()) or not 0 < admin_base < 65536 - count):
        raise click.UsageError(
            f"admin ports {admin_base}..{admin_base + count - 1} overlap the client or raft "
            "ports or leave 1..65535; choose --admin-port"
        )
    # Every port free first: a node whose port is taken exits at start, but the
    # cluster already listening there would answer the leader wait and the demo,
    # which would then report success against someone else's cluster.
    wanted = [(f"{m.id} clients", m.client) for m in members]
    wanted += [(f"{m.id} raft", m.raft) for m in members]
    if admin:
        wanted += [(f"{i} admin", a) for i, a in admin_addrs.items()]
    busy = [f"{a} ({what})" for what, a in wanted if not port_free(int(a.rpartition(":")[2]))]
    if busy:
        raise click.UsageError(
            f"port(s) in use on 127.0.0.1: {', '.join(busy)}. Another cluster (an earlier "
            "`raftlease up`?) or program listens there: stop it, or choose --port "
            "(clients PORT.., raft PORT+100..) and --admin-port"
        )
    root = Path(data_dir).resolve()
    settings: dict[str, Any] = {}
    client_env: dict[str, str] = {}
    if secure:
        from ..testing.certs import secure_bundle

        bundle = secure_bundle(root / "secure")
        settings = bundle.node_settings()
        client_env = {"RAFTLEASE_CA_FILE": str(bundle.ca_file)}
        os.environ.update(client_env)
        os.environ["RAFTLEASE_TOKEN"] = bundle.admin_token  # for the demo in this process
    node_settings = {i: {"admin_address": a} for i, a in admin_addrs.items()} if admin else {}
    cluster = LocalCluster(
        count, client_port=port, data_dir=root, settings=settings, node_settings=node_settings
    )
    click.echo(f"starting {count} nodes, data in {cluster.data_dir}")
    scheme = "https" if secure else "http"
    # SIGINT and SIGTERM (Ctrl-C, kill, timeout, a container or service stop) stop the
    # nodes, whatever this process inherited (common.SignalBox): SIGTERM left to its
    # default ended this process and left every node running, and SIGINT inherited
    # ignored (a background job) could not stop it at all.
    with SignalBox(interrupt=True).installed():
        try:
            cluster.start(wait=False)
            for n in cluster.nodes:
                where = f"  admin {scheme}://{admin_addrs[n.id]}" if admin else ""
                click.echo(
                    f"  {n.id}: clients {n.client}  raft {n.raft}{where}  "
                    f"pid {cluster.pid(n.id)}  log {cluster.log_path(n.id)}"
                )
            try:
                leader = cluster.wait_for_leader(timeout=30)
            except TimeoutError as exc:
                click.echo(f"error: {exc}\n{cluster.logs(20)}", err=True)
                sys.exit(1)
            gone = [n.id for n in cluster.nodes if not cluster.is_running(n.id)]
            if gone:  # whoever answered, it was not this cluster (a port taken meanwhile?)
                click.echo(
                    f"error: node(s) {', '.join(gone)} exited at start\n{cluster.logs(20)}",
                    err=True,
                )
                sys.exit(1)
            click.echo(f"leader: {leader['node']} ({leader['client']}), term {leader['term']}")
            endpoints = ",".join(cluster.endpoints)
            click.echo(f"endpoints: {endpoints}")
            if admin:  # the live view (server/dashboard.py) on every node's admin endpoint
                click.echo(f"dashboard: {scheme}://{admin_addrs[cluster.nodes[0].id]}/ui/")
            click.echo(f"peers: mutual TLS with a throwaway CA in {cluster.certs.directory}")
            if not secure:
                # One line (issue 37): the zero-configuration cluster trusts every local
                # process with everything, membership and snapshots included.
                click.echo(
                    "trust: no client authentication: every process on this machine may do "
                    "everything (any lease, members, snapshots); secure it with "
                    "`raftlease up --secure` (TLS, tokens, roles)"
                )
            if secure:
                click.echo(
                    "secure: TLS and authentication on; files in "
                    f"{root / 'secure'} (auth.toml: roles and principals). To use the CLI:\n"
                    f"  export RAFTLEASE_ENDPOINTS={endpoints}\n"
                    f"  export RAFTLEASE_CA_FILE={bundle.ca_file}\n"
                    f'  export RAFTLEASE_TOKEN="$(cat {bundle.token_file})"\n'
                    "From Python: Client(endpoints, tls=CA_FILE, token=TOKEN), or a client "
                    f"certificate: {bundle.client_cert} and {bundle.client_key}."
                )
            if demo:
                _demo(cluster.endpoints)
            if exit_after_demo:
                return
            click.echo("cluster running; press Ctrl-C to stop every node")
            # A node that ends is reported and can be restarted: the others keep serving,
            # so a new user can watch a failover (up_console.py).
            code = UpConsole(cluster).run()
            if code:
                sys.exit(code)
        except KeyboardInterrupt:
            click.echo("\nstopping nodes...")
        finally:
            cluster.stop()
            click.echo("all nodes stopped")


def _demo(endpoints: list[str]) -> None:
    with connect(endpoints) as c:
        lease = c.acquire("demo/gpu-0", owner="agent-a", ttl=5.0)
        click.echo(f"demo: agent-a acquired demo/gpu-0, fencing token {lease.token}")
        try:
            c.acquire("demo/gpu-0", owner="agent-b", ttl=5.0)
        except LeaseHeldError as exc:
            click.echo(f"demo: agent-b was refused: {exc.message} (token {exc.token})")
        holder = c.holder("demo/gpu-0")
        click.echo(f"demo: holder is {holder.owner if holder else None}")
        c.release(lease)
        lease_b = c.acquire("demo/gpu-0", owner="agent-b", ttl=5.0)
        click.echo(
            f"demo: after release agent-b acquired it, token {lease_b.token} > {lease.token}"
        )
        c.release(lease_b)

        # One session keeps several leases alive; closing it releases them all.
        with c.session(owner="agent-c", ttl=3.0) as session:
            gpus = [session.acquire(f"demo/gpu-{i}") for i in (1, 2)]
            session.acquire("demo/pool", capacity=4, units=3)
            read = c.read("demo/pool")
            click.echo(
                f"demo: agent-c's session holds {len(gpus)} GPUs and {read.used} of "
                f"{read.capacity} pool units, kept alive by one keep-alive"
            )
            try:
                c.acquire("demo/pool", owner="agent-d", ttl=5.0, capacity=4, units=2)
            except LeaseHeldError as exc:
                click.echo(f"demo: agent-d asking for 2 more units was refused: {exc.message}")
        freed = [c.holder(f"demo/gpu-{i}") for i in (1, 2)] + [c.holder("demo/pool")]
        click.echo(f"demo: session closed, everything released: {freed == [None] * 3}")

        # Leader election: campaign with a value; observers read who leads.
        election = c.election("demo/coordinator")
        with c.session(owner="agent-e", ttl=3.0) as session:
            elected = election.campaign("10.0.0.5:7000", session=session, wait=5.0)
            leader = election.leader()
            click.echo(
                f"demo: {leader.owner if leader else None} leads at "
                f"{leader.value if leader else None}, token {elected.token}"
            )
            election.resign()
    click.echo("demo: OK")
