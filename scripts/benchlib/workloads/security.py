"""The cost of client TLS and authentication (issue 11): acquire on one 3-node cluster
without them, then on one with TLS on the client port, an auth file and a bearer
token, one cluster after the other in the same run, plus a micro-benchmark of the
peer cipher.

Peer authentication cannot be turned off (every node proves its identity with a signed
hello and seals every Raft frame with its connection's ``ConnectionCipher``), so both
clusters pay it; its own
cost is measured apart, as the time to seal and open one frame in this process.

Everything here blocks the main thread for the whole phase. A failure is recorded in
result["security"] (per cluster, or per workload within one) and the next cluster
still runs; only ``BenchTimeout`` and ``KeyboardInterrupt`` end the phase.

result["security"] holds ``modes`` (in run order: insecure, secure), ``groups``,
``peer_cipher`` (the micro-benchmark) and ``clusters``: per mode its ``settings``
(what the cluster had besides the NodeConfig defaults; file paths left out),
``workloads`` (group -> concurrency mode -> the same entries as result["workloads"]),
for the secure one ``probes`` (the codes it answered a client without a token and
the principal outside its prefix: UNAUTHENTICATED, PERMISSION_DENIED), and ``error``
when the cluster itself failed.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from raftlease.client import Client
from raftlease.errors import RaftLeaseError
from raftlease.server.auth import token_digest
from raftlease.testing import LocalCluster
from raftlease.testing.certs import secure_bundle

from ..cluster import log_alerts, save_failure_logs
from ..context import TTL_FRESH, BenchTimeout, Context, progress
from ..measure import percentile
from ..raw import PAYLOAD_BYTES
from . import durability, throughput

#: The clusters, in run order.
MODES = ("insecure", "secure")
#: The measured groups.
GROUPS = ("acquire",)
#: The principal the secure cluster's clients authenticate as.
PRINCIPAL = "bench"
#: Leases one principal may hold on the secure cluster: far above what the acquire
#: workload creates (its leases live TTL_FRESH s), so the quota is checked on every
#: acquire, as in production, but never refuses one.
LEASE_QUOTA = 10_000_000
#: Frame sizes of the peer-cipher micro-benchmark: one acquire's entry, and a batch.
CIPHER_SIZES = (PAYLOAD_BYTES, 16_384)

METHOD = (
    "Two 3-node clusters, one after the other, with the NodeConfig defaults (the same "
    "durability: {durability}): 'insecure' with nothing else, 'secure' with TLS on the "
    "client port (the certificate of testing.certs.secure_bundle, clients verify it "
    "against its CA), an auth file with one principal whose role may read and write "
    "the prefix bench/ (not admin, so every request is checked against the prefix) and "
    "a bearer token sent on each new connection; max_leases_per_principal is raised to "
    "{quota:,} there so that the quota is counted on every acquire but never refuses "
    "one. On each: acquire of fresh keys with 1 thread, {threads} threads on one Client "
    "and an AsyncClient with {tasks} tasks, with the same warm-up, repetitions and "
    "settle as everywhere. 'secure / insecure' divides the median throughputs of the "
    "same mode. Peer authentication (a signed hello per connection, every Raft frame "
    "sealed with AES-128-GCM by its connection's ConnectionCipher) is always on, so "
    "both clusters pay it; its cost is the micro-benchmark: {tries:,} seal + open of "
    "one frame per size in the benchmark process, p50 per frame."
)


def security(ctx: Context) -> None:
    """The security phase: the peer-cipher micro-benchmark, then one cluster per mode
    of ``MODES``, in that order (each stopped before the next starts)."""
    p = ctx.profile
    tries = max(200, p.sync_probe * 10)
    section: dict[str, Any] = {
        "modes": list(MODES),
        "groups": list(GROUPS),
        "peer_cipher": peer_cipher(tries),
        "clusters": {},
    }
    ctx.result["security"] = section
    for size, figure in section["peer_cipher"]["sizes"].items():
        progress(
            f"security: peer cipher, {size} B frame: seal {figure['seal_us']:.1f} µs, "
            f"open {figure['open_us']:.1f} µs (p50 of {tries})"
        )
    with tempfile.TemporaryDirectory(prefix="raftlease-bench-tls-") as tmp:
        for mode in MODES:
            record: dict[str, Any] = {"workloads": {}}
            section["clusters"][mode] = record
            one_mode(ctx, mode, record, Path(tmp))
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


def one_mode(ctx: Context, mode: str, record: dict[str, Any], tmp: Path) -> None:
    """One cluster; fills ``record`` (see the module doc)."""
    name = f"security {mode}"
    cluster: LocalCluster
    if mode == "secure":
        cluster, record["settings"] = _secure_cluster(tmp / "tls")
    else:
        cluster, record["settings"] = LocalCluster(3), {}
    progress(f"{name}: starting a 3-node cluster ({record['settings'] or 'NodeConfig defaults'})")
    with cluster:
        try:
            cluster.start()
            time.sleep(0.5)
            if isinstance(cluster, _TokenCluster):
                record["probes"] = probes(cluster)
                progress(f"{name}: probes: {record['probes']}")
            scoped = ctx.scoped(record["workloads"], f"{name}: ")
            with cluster.client() as client:
                for group in GROUPS:
                    try:
                        throughput.acquire(scoped, cluster, client)
                    except (BenchTimeout, KeyboardInterrupt):
                        raise
                    except Exception as exc:
                        message = f"{type(exc).__name__}: {exc}"
                        scoped.workloads.setdefault(group, {})["error"] = message
                        progress(f"{name}: {group}: FAILED: {message}")
                        save_failure_logs(ctx.out, f"{name} {group}", cluster)
        except (BenchTimeout, KeyboardInterrupt):
            raise
        except Exception as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"
            progress(f"{name}: FAILED: {record['error']}")
            path = save_failure_logs(ctx.out, name, cluster)
            progress(f"{name}: node logs saved in {path.parent}")
        finally:
            ctx.result.setdefault("node_log_alerts", {})[name] = log_alerts(cluster)


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


def peer_cipher(tries: int) -> dict[str, Any]:
    """Time ``tries`` seals and opens of one frame per size of ``CIPHER_SIZES`` with
    the cipher every Raft frame after the hellos goes through: a ``ConnectionCipher``
    over the cluster's ``PeerCipher`` (keys from a fresh secret and a random
    connection key). Blocks for the loop (a few ms); raises nothing but what the
    cipher raises."""
    cipher = ConnectionCipher(PeerCipher(secrets.token_hex(32)), os.urandom(32))
    sizes: dict[str, Any] = {}
    for size in CIPHER_SIZES:
        data = os.urandom(size)
        seal: list[float] = []
        opened: list[float] = []
        for i in range(tries):
            t0 = time.perf_counter()
            token = cipher.encrypt_at_time(data, i)
            t1 = time.perf_counter()
            plain = cipher.decrypt(token)
            t2 = time.perf_counter()
            if plain != data:  # a wrong round trip would make the figure meaningless
                raise RuntimeError("ConnectionCipher round trip changed the frame")
            seal.append(t1 - t0)
            opened.append(t2 - t1)
        sizes[str(size)] = {
            "seal_us": percentile(seal, 0.5) * 1e6,
            "open_us": percentile(opened, 0.5) * 1e6,
            "seal_p99_us": percentile(seal, 0.99) * 1e6,
            "open_p99_us": percentile(opened, 0.99) * 1e6,
        }
    return {"tries": tries, "cipher": "ConnectionCipher", "sizes": sizes}
