"""The cost of security: acquire on one 3-node cluster whose members talk without TLS
(``plain-peers``: the test build's ``plain_peers`` hook, never a production build),
then on one with peer TLS and nothing else (``insecure``: the defaults), then on one
that also has TLS on the client port, an auth file and a bearer token (``secure``),
one cluster after the other in the same run, plus a micro-benchmark of one TLS record
each way (what every Raft frame costs its two ends).

The ratios ``insecure / plain-peers`` (what mutual TLS between members costs) and
``secure / insecure`` (what client TLS and auth cost) are of the same concurrency
mode in the same run. Because clusters measured one after the other see the machine's
load drift (±15 % between two back-to-back runs on the shared 2-core machine), the peer
TLS cost is also measured in ``peer_rounds`` rounds (``Profile.peer_rounds``, 6 in the
full profile), each a plain-peers cluster and a peer-TLS one, plain first in even
rounds and TLS first in odd ones (``round_order``), acquire at 1 and ``threads``
threads: the issue-35 targets judge the median of the rounds' ratios.

Everything here blocks the main thread for the whole phase. A failure is recorded in
result["security"] (per cluster, or per workload within one) and the next cluster
still runs; only ``BenchTimeout`` and ``KeyboardInterrupt`` end the phase.

result["security"] holds ``modes`` (in run order: plain-peers, insecure, secure),
``groups``, ``peer_tls`` (the micro-benchmark), ``peer_rounds`` (``rounds``: per round
``{"plain-peers": workloads, "insecure": workloads}``, and the ``modes`` measured) and
``clusters``: per mode its ``settings``
(what the cluster had besides the NodeConfig defaults; file paths left out),
``workloads`` (group -> concurrency mode -> the same entries as result["workloads"]),
for the secure one ``probes`` (the codes it answered a client without a token and
the principal outside its prefix: UNAUTHENTICATED, PERMISSION_DENIED), and ``error``
when the cluster itself failed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import ssl
import tempfile
import time
from pathlib import Path
from typing import Any

from raftlease.client import Client
from raftlease.errors import RaftLeaseError
from raftlease.replication.peer_tls import TlsSession
from raftlease.server.auth import token_digest
from raftlease.testing import LocalCluster
from raftlease.testing.certs import ClusterCerts, secure_bundle

from ..cluster import failure_recorded, group_recorded
from ..context import TTL_FRESH, Context, progress
from ..measure import percentile
from ..raw import PAYLOAD_BYTES
from . import durability, throughput

#: The clusters, in run order.
MODES = ("plain-peers", "insecure", "secure")
#: The measured groups.
GROUPS = ("acquire",)
#: The principal the secure cluster's clients authenticate as.
PRINCIPAL = "bench"
#: Leases one principal may hold on the secure cluster: far above what the acquire
#: workload creates (its leases live TTL_FRESH s), so the quota is checked on every
#: acquire, as in production, but never refuses one.
LEASE_QUOTA = 10_000_000
#: Frame sizes of the peer TLS micro-benchmark: one acquire's entry, and a batch.
RECORD_SIZES = (PAYLOAD_BYTES, 16_384)

METHOD = (
    "Three 3-node clusters, one after the other, with the NodeConfig defaults (the same "
    "durability: {durability}): 'plain-peers' whose members talk without TLS (the test "
    "build's plain_peers hook: the baseline for what peer TLS costs, never a production "
    "build), 'insecure' with the defaults (mutual TLS 1.3 between members, nothing on "
    "the client port), 'secure' with TLS on the "
    "client port (the certificate of testing.certs.secure_bundle, clients verify it "
    "against its CA), an auth file with one principal whose role may read and write "
    "the prefix bench/ (not admin, so every request is checked against the prefix) and "
    "a bearer token sent on each new connection; max_leases_per_principal is raised to "
    "{quota:,} there so that the quota is counted on every acquire but never refuses "
    "one. On each: acquire of fresh keys with 1 thread, {threads} threads on one Client "
    "and an AsyncClient with {tasks} tasks, with the same warm-up, repetitions and "
    "settle as everywhere. 'insecure / plain-peers' and 'secure / insecure' divide the "
    "median throughputs of the same mode. The micro-benchmark: {tries:,} writes of one "
    "frame into a TLS 1.3 session and reads of it from its peer (ssl.SSLObject over "
    "memory buffers, as the nodes run it), per size, in the benchmark process, p50."
)


def security(ctx: Context) -> None:
    """The security phase: the peer TLS micro-benchmark, then one cluster per mode
    of ``MODES``, in that order (each stopped before the next starts)."""
    p = ctx.profile
    tries = max(200, p.sync_probe * 10)
    with tempfile.TemporaryDirectory(prefix="raftlease-bench-tls-") as tmp:
        section: dict[str, Any] = {
            "modes": list(MODES),
            "groups": list(GROUPS),
            "peer_tls": peer_tls_records(tries, Path(tmp) / "records"),
            "clusters": {},
        }
        ctx.result["security"] = section
        section["peer_rounds"] = {"modes": list(_round_modes(ctx)), "rounds": []}
        for size, figure in section["peer_tls"]["sizes"].items():
            progress(
                f"security: peer TLS, {size} B frame: write {figure['seal_us']:.1f} µs, "
                f"read {figure['open_us']:.1f} µs (p50 of {tries})"
            )
        for mode in MODES:
            record: dict[str, Any] = {"workloads": {}}
            section["clusters"][mode] = record
            one_mode(ctx, mode, record, Path(tmp))
        for n in range(p.peer_rounds):
            pair: dict[str, Any] = {}
            section["peer_rounds"]["rounds"].append(pair)
            for mode in round_order(n):
                record = {"workloads": {}}
                pair[mode] = record
                one_mode(
                    ctx, mode, record, Path(tmp), only=_round_modes(ctx), label=f" round {n + 1}"
                )
    ctx.method(
        "security",
        METHOD.format(
            durability=_durability_default(),
            quota=LEASE_QUOTA,
            threads=p.threads,
            tasks=p.async_tasks,
            tries=tries,
        ),
    )


def _durability_default() -> str:
    default = durability.supported()
    return "no durability setting" if default is None else f"durability = {default!r}"


class _TokenCluster(LocalCluster):
    """A LocalCluster whose clients (``client()``, ``statuses()``, and the bench's
    AsyncClient through ``client_options``) also send a bearer token."""

    def __init__(self, token: str, **kwargs: Any) -> None:
        super().__init__(3, **kwargs)
        self.token = token

    @property
    def client_options(self) -> dict[str, Any]:
        return {**super().client_options, "token": self.token}


def _secure_cluster(directory: Path) -> tuple[_TokenCluster, dict[str, Any]]:
    """The secure cluster (not started) and its settings as recorded (no paths).
    Writes the CA, certificates and auth file into ``directory`` (mode 0600)."""
    bundle = secure_bundle(directory)
    token = secrets.token_urlsafe(32)
    auth_file = directory / "bench-auth.toml"
    fd = os.open(auth_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(
            "[roles.bench]\n"
            'permissions = [{ prefix = "bench/", actions = ["read", "write"] }]\n\n'
            "[[principals]]\n"
            f'name = "{PRINCIPAL}"\n'
            f'token_sha256 = "{token_digest(token)}"\n'
            'roles = ["bench"]\n'
        )
    settings: dict[str, Any] = {
        **bundle.node_settings(),
        "auth_file": str(auth_file),
        "max_leases_per_principal": LEASE_QUOTA,
    }
    recorded = {
        "client_tls": True,
        "auth_file": f"1 principal ({PRINCIPAL}), role: read + write on bench/",
        "token": True,
        "max_leases_per_principal": LEASE_QUOTA,
    }
    return _TokenCluster(token, settings=settings), recorded


def round_order(n: int) -> tuple[str, str]:
    """The clusters of round ``n`` (from 0) in the order they run: plain peers first
    in even rounds, peer TLS first in odd ones (ABBA), so that a drift of the machine's
    load during the phase (a cache warming, a neighbour starting) favours neither."""
    return ("plain-peers", "insecure") if n % 2 == 0 else ("insecure", "plain-peers")


def _round_modes(ctx: Context) -> tuple[str, ...]:
    """The concurrency modes of the peer TLS rounds: 1 thread and ``threads``."""
    return ("1 thread", f"{ctx.profile.threads} threads")


def one_mode(
    ctx: Context,
    mode: str,
    record: dict[str, Any],
    tmp: Path,
    only: tuple[str, ...] | None = None,
    label: str = "",
) -> None:
    """One cluster; fills ``record`` (see the module doc). ``only``: the concurrency
    modes measured (all by default); ``label`` is added to its name in the logs."""
    name = f"security {mode}{label}"
    cluster: LocalCluster
    if mode == "secure":
        cluster, record["settings"] = _secure_cluster(tmp / "tls")
    elif mode == "plain-peers":
        cluster = LocalCluster(3, hooks={"plain_peers": True})
        record["settings"] = {"plain_peers": True}
    else:
        cluster, record["settings"] = LocalCluster(3), {}
    progress(f"{name}: starting a 3-node cluster ({record['settings'] or 'NodeConfig defaults'})")
    with cluster, failure_recorded(ctx, name, record, cluster):
        cluster.start()
        time.sleep(0.5)
        if isinstance(cluster, _TokenCluster):
            record["probes"] = probes(cluster)
            progress(f"{name}: probes: {record['probes']}")
        scoped = ctx.scoped(record["workloads"], f"{name}: ")
        with cluster.client() as client:
            for group in GROUPS:
                group_recorded(
                    scoped,
                    name,
                    group,
                    cluster,
                    lambda: throughput.acquire(scoped, cluster, client, only=only),
                )


def probes(cluster: _TokenCluster) -> dict[str, str]:
    """What the secure cluster answers a client without a token and the token's
    principal outside its prefix (the error codes; "accepted" if it did not refuse),
    so the run itself shows that authentication and authorization were on. Blocks for
    two calls; raises what a call raises other than a RaftLeaseError."""
    out: dict[str, str] = {}
    tls = {k: v for k, v in cluster.client_options.items() if k != "token"}
    cases = [
        ("no token", tls, "bench/probe"),
        ("token, key outside bench/", cluster.client_options, "probe/outside"),
    ]
    for label, options, key in cases:
        try:
            with Client(cluster.endpoints, **options) as client:
                client.acquire(key, owner="bench-probe", ttl=TTL_FRESH)
            out[label] = "accepted"
        except RaftLeaseError as exc:
            out[label] = str(getattr(exc, "code", type(exc).__name__))
    return out


def peer_tls_records(tries: int, directory: Path) -> dict[str, Any]:
    """Time ``tries`` frames of each size of ``RECORD_SIZES`` through a TLS 1.3 session
    between two members' contexts (``ClusterCerts``, the nodes' own ``TlsSession``):
    write on one side and move the record to the other (``seal_us``), read it there
    (``open_us``). The handshake is done first, in memory. Blocks for the loop (a few
    ms); raises ``RuntimeError`` if a frame comes back changed."""
    certs = ClusterCerts(directory)
    client = TlsSession(certs.peer_tls("n1").client, server_side=False)
    server = TlsSession(certs.peer_tls("n2").server, server_side=True)
    for _ in range(10):  # the handshake, flight by flight
        for me, other in ((client, server), (server, client)):
            with contextlib.suppress(ssl.SSLWantReadError):
                me.obj.do_handshake()
            other.incoming.write(me.outgoing.read())
    sizes: dict[str, Any] = {}
    for size in RECORD_SIZES:
        data = os.urandom(size)
        seal: list[float] = []
        opened: list[float] = []
        for _ in range(tries):
            t0 = time.perf_counter()
            client.obj.write(data)
            server.incoming.write(client.outgoing.read())
            t1 = time.perf_counter()
            plain = b""
            while len(plain) < size:
                plain += server.obj.read(size - len(plain))
            t2 = time.perf_counter()
            if plain != data:  # a wrong round trip would make the figure meaningless
                raise RuntimeError("a TLS round trip changed the frame")
            seal.append(t1 - t0)
            opened.append(t2 - t1)
        sizes[str(size)] = {
            "seal_us": percentile(seal, 0.5) * 1e6,
            "open_us": percentile(opened, 0.5) * 1e6,
            "seal_p99_us": percentile(seal, 0.99) * 1e6,
            "open_p99_us": percentile(opened, 0.99) * 1e6,
        }
    suite = client.obj.cipher()
    return {"tries": tries, "cipher": suite[0] if suite else "?", "sizes": sizes}
