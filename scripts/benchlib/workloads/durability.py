"""Durability modes side by side: acquire and renew on one 3-node cluster per value
of ``NodeConfig.durability`` ("fsync", "none"), one cluster after the other, with a
probe of what one sync costs on the storage the clusters write to.

Everything here blocks the main thread for the whole phase. A failure is recorded in
result["durability"] (per mode, or per workload within a mode) and the next mode
still runs; only ``BenchTimeout`` and ``KeyboardInterrupt`` end the phase.

result["durability"] holds ``modes`` (in run order), ``groups``, ``default`` (the
NodeConfig default), ``storage`` (file system and the sync probe), and ``clusters``:
per mode its ``settings``, ``workloads`` (group -> concurrency mode -> the same
entries as result["workloads"]), ``reported`` (what the nodes' status says about
durability, if anything) and ``error`` when the cluster itself failed.
"""

from __future__ import annotations

import dataclasses
import functools
import mmap
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raftlease.client import Client
from raftlease.config import NodeConfig
from raftlease.replication.durable import DurableJournal
from raftlease.testing import LocalCluster

from ..cluster import failure_recorded, group_recorded, node_rss
from ..context import DURABILITY_GROUPS, Context, progress
from ..measure import percentile
from ..raw import PAYLOAD_BYTES
from . import throughput

METHOD = (
    "Each durability mode runs on its own 3-node cluster with the NodeConfig defaults "
    "and only durability set, one cluster after the other in the order {order} "
    "(--durability none,fsync reverses it), right after the raw ceiling; each cluster "
    "is stopped before the next starts. On each: {groups}, as on the main cluster "
    "(1 thread, {threads} threads on one Client, an AsyncClient with {tasks} tasks; "
    "renew round robin over {pool} live leases), with the same warm-up, repetitions "
    "and settle. 'fsync / none' divides the median throughputs of the same workload "
    "and mode. 'vs raw' divides by raw PySyncObj, which never syncs its journal: its "
    "1-thread sync figure for 1 thread, its best pipelined figure otherwise. The "
    "storage probe times {tries} writes of {payload} bytes into a 1 MiB mmap'ed file "
    "in the directory the clusters keep their data in, each followed by msync and "
    "fdatasync: what one sync costs on this storage before any group commit."
)

_Workload = Callable[[Context, LocalCluster, Client], None]

#: The measured groups (context.DURABILITY_GROUPS) -> their workload on the main cluster.
WORKLOADS: dict[str, _Workload] = {
    "acquire": throughput.acquire,
    "renew": throughput.renew,
}


def supported() -> Any:
    """The default of ``NodeConfig.durability`` in the raftlease under test, or None
    when it has no such setting (a node would refuse the key in its config)."""
    for f in dataclasses.fields(NodeConfig):
        if f.name == "durability":
            return f.default
    return None


def durability(ctx: Context) -> None:
    """The durability phase: the storage probe, then one cluster per mode of
    ``profile.durability``, in that order."""
    p = ctx.profile
    section: dict[str, Any] = {
        "modes": list(p.durability),
        "groups": list(DURABILITY_GROUPS),
        "clusters": {},
    }
    ctx.result["durability"] = section
    default = supported()
    if default is None:
        section["error"] = "this raftlease has no durability setting (NodeConfig.durability)"
        progress(f"durability: skipped: {section['error']}")
        return
    section["default"] = default
    data_root = Path(tempfile.gettempdir())
    section["storage"] = {**storage(data_root), "sync_probe": sync_probe(data_root, p.sync_probe)}
    probe = section["storage"]["sync_probe"]
    progress(
        f"durability: data on {section['storage'].get('fs')} "
        f"({section['storage'].get('device')}); write+msync+fdatasync p50 "
        f"{probe['p50_ms']:.3f} ms, p99 {probe['p99_ms']:.3f} ms ({probe['tries']} tries)"
    )
    for mode in p.durability:
        record: dict[str, Any] = {"settings": {"durability": mode}, "workloads": {}}
        section["clusters"][mode] = record
        one_mode(ctx, mode, record)
    ctx.method(
        "durability",
        METHOD.format(
            order=", ".join(p.durability),
            groups=" and ".join(DURABILITY_GROUPS),
            threads=p.threads,
            tasks=p.async_tasks,
            pool=p.renew_pool,
            tries=p.sync_probe,
            payload=PAYLOAD_BYTES,
        ),
    )


def one_mode(ctx: Context, mode: str, record: dict[str, Any]) -> None:
    """One durability mode on its own cluster; fills ``record`` (see the module doc)."""
    name = f"durability {mode}"
    progress(f"{name}: starting a 3-node cluster (NodeConfig defaults, durability = {mode!r})")
    with (
        LocalCluster(3, settings=dict(record["settings"])) as cluster,
        failure_recorded(ctx, name, record, cluster),
    ):
        cluster.start()
        time.sleep(0.5)
        record["idle_rss_mib"] = {
            node: mem.get("VmRSS", 0.0) for node, mem in node_rss(cluster).items()
        }
        record["reported"] = {
            str(s.get("node")): {k: v for k, v in s.items() if "durab" in k}
            for s in cluster.statuses()
            if s.get("reachable")
        }
        scoped = ctx.scoped(record["workloads"], f"{name}: ")
        with cluster.client() as client:
            for group in DURABILITY_GROUPS:
                group_recorded(
                    scoped,
                    name,
                    group,
                    cluster,
                    functools.partial(WORKLOADS[group], scoped, cluster, client),
                )


# ------------------------------------------------------------------ storage


def storage(path: Path) -> dict[str, Any]:
    """The mount that holds ``path`` (the longest matching mount point in
    /proc/mounts): file system type, device, mount point and options."""
    path = path.resolve()
    best: dict[str, Any] = {"path": str(path)}
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return best
    length = -1
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        device, mount, fs, options = parts[:4]
        mount = mount.replace("\\040", " ")
        mount_path = Path(mount)
        if (mount_path == path or mount_path in path.parents) and len(mount) > length:
            length = len(mount)
            best.update(fs=fs, device=device, mount=mount, options=options)
    return best


def sync_probe(directory: Path, tries: int) -> dict[str, Any]:
    """Time ``tries`` small writes into an mmap'ed file in ``directory``, each
    followed by the sync a node's journal does (``DurableJournal.sync``: one
    fdatasync on Linux, msync + fdatasync elsewhere): what a syncing append costs.
    Blocks for the probe (well under a second on a disk that syncs in ~1 ms)."""
    size = 1 << 20
    latencies: list[float] = []
    with tempfile.TemporaryDirectory(dir=directory, prefix="raftlease-bench-sync-") as tmp:
        fd = os.open(Path(tmp) / "probe", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, size)
            with mmap.mmap(fd, size) as m:
                # Allocate every page first and sync once: the probe times appends to
                # a journal file that exists already, as a running node's do.
                m[:] = b"\0" * size
                m.flush()
                os.fdatasync(fd)
                payload = b"x" * PAYLOAD_BYTES
                for i in range(tries):
                    offset = (i * PAYLOAD_BYTES) % (size - PAYLOAD_BYTES)
                    t0 = time.perf_counter()
                    m[offset : offset + PAYLOAD_BYTES] = payload
                    if DurableJournal.MSYNC:  # what a node's sync does (not on Linux)
                        m.flush()  # msync(MS_SYNC)
                    os.fdatasync(fd)
                    latencies.append(time.perf_counter() - t0)
        finally:
            os.close(fd)
    return {
        "tries": tries,
        "bytes": PAYLOAD_BYTES,
        "msync": DurableJournal.MSYNC,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "max_ms": max(latencies, default=0.0) * 1000,
    }
