"""Output backpressure on the client port (issue 37): a connection whose peer does
not read its answers stops being read once its unsent output passes
``max_conn_output``, so the node's memory stays bounded and other clients are
served meanwhile. Before, an authorised reader that sent 200 ``leases(limit=10000)``
and never read grew a follower from 65 to 1,449 MiB and stalled other reads 7-8 s."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from raftlease import AsyncClient
from raftlease.protocol import FrameDecoder, encode_frame
from raftlease.testing import LocalCluster, wait_for
from tests.integration.test_admin_http import admin_cluster, admin_of

LEASES = 1000
VALUE = "v" * 4000  # each answer of all leases: ~4.5 MB


def rss_mib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("VmRSS"))
    return int(line.split()[1]) // 1024


def fill(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.endpoints, deadline=60) as client:
            slots = asyncio.Semaphore(100)

            async def one(i: int) -> None:
                async with slots:
                    await client.acquire(f"bp/{i:05}", owner=f"o{i}", ttl=3600, value=VALUE)

            await asyncio.gather(*(one(i) for i in range(LEASES)))

    asyncio.run(main())


def answered(cluster: LocalCluster, op: str) -> int:
    """How many ``op`` requests node n1 has answered (its metrics)."""
    url = f"http://{admin_of(cluster, 'n1')}/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    prefix = f'raftlease_request_duration_seconds_count{{op="{op}"}} '
    line = next((x for x in text.splitlines() if x.startswith(prefix)), prefix + "0")
    return int(float(line[len(prefix) :]))


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_peer_that_never_reads_cannot_grow_the_node_and_others_are_served() -> None:
    cluster = admin_cluster(1)
    cluster.start()
    try:
        check_a_peer_that_never_reads(cluster)
    finally:
        cluster.close()


def check_a_peer_that_never_reads(cluster: LocalCluster) -> None:
    fill(cluster)
    pid = cluster.pid("n1")
    before = rss_mib(pid)
    host, _, port = cluster.nodes[0].client.rpartition(":")
    with socket.create_connection((host, int(port))) as hog:
        hog.sendall(
            b"".join(
                encode_frame({"id": i, "op": "leases", "prefix": "", "limit": 10000})
                for i in range(1, 201)
            )
        )
        # The node answers until the unsent output passes max_conn_output (8 MiB: two
        # or three answers of ~4.5 MB), then answers no more; another client's reads
        # are answered promptly all the while.
        latencies: list[float] = []
        counts: list[int] = []
        with cluster.client() as other:

            def stopped() -> bool:
                started = time.monotonic()
                assert other.holder("bp/00007") is not None
                latencies.append(time.monotonic() - started)
                counts.append(answered(cluster, "leases"))
                last = counts[-20:]  # 1 s and more without another answer
                return len(last) == 20 and last[0] >= 1 and last[0] == last[-1]

            wait_for(stopped, 25, "the node to stop answering a peer that does not read")
        assert counts[-1] < 10, f"{counts[-1]} answers built for a peer that reads none"
        growth = rss_mib(pid) - before
        assert growth < 250, f"RSS grew {growth} MiB for a peer that does not read"
        assert max(latencies) < 3.0, f"another client's read took {max(latencies):.1f} s"
        # Reading again resumes the answers: nothing was lost, only paused.
        hog.settimeout(60)
        decoder = FrameDecoder(1 << 26)
        answers: list[dict[str, Any]] = []
        while len(answers) < 5:
            data = hog.recv(1 << 20)
            assert data, "the node closed the connection of a peer that resumed reading"
            answers.extend(decoder.feed(data))
        assert [a["id"] for a in answers[:5]] == [1, 2, 3, 4, 5]
        assert all(len(a["result"]["leases"]) == LEASES for a in answers[:5])
