"""The HTTP admin endpoint on real node processes: /metrics (parsed with the
Prometheus parser), /livez, /readyz, /status, JSON logs, hostile HTTP input, and the
secured endpoint (HTTPS and an admin token)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from raftlease import LeaseHeldError
from raftlease.cli import main
from raftlease.server.logs import TEXT_LOG_FORMAT, JsonLogFormatter, iso_utc
from raftlease.testing import LocalCluster
from raftlease.testing.certs import secure_bundle
from raftlease.testing.cluster import free_port_block, wait_for
from tests.conftest import FAST_SETTINGS, _show_logs_on_failure

pytestmark = pytest.mark.integration


def admin_cluster(
    count: int = 3, node_extra: dict[str, dict[str, Any]] | None = None, **settings: Any
) -> LocalCluster:
    """A cluster whose node i serves its admin endpoint 200 above its client port
    (``node_extra``: more settings of single nodes)."""
    base = free_port_block(count)  # keeps base+200.. free as well
    nodes = {
        f"n{i + 1}": {
            "admin_address": f"127.0.0.1:{base + 200 + i}",
            **(node_extra or {}).get(f"n{i + 1}", {}),
        }
        for i in range(count)
    }
    return LocalCluster(
        count, client_port=base, settings={**FAST_SETTINGS, **settings}, node_settings=nodes
    )


def running_admin_cluster(
    count: int = 3, hooks: dict[str, Any] | None = None, **settings: Any
) -> Iterator[LocalCluster]:
    """A started ``admin_cluster`` (with ``settings``; ``hooks``: the test build's,
    ``raftlease.testing.hooks``) for a (module) fixture to ``yield from``; stopped and
    closed after."""
    c = admin_cluster(count, **settings)
    c.hooks = dict(hooks or {})
    try:
        c.start()
        yield c
    finally:
        c.stop()
        c.close()


def admin_of(cluster: LocalCluster, node_id: str) -> str:
    return str(cluster.node_settings[node_id]["admin_address"])


def get(
    addr: str,
    path: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    scheme: str = "http",
    context: ssl.SSLContext | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request; HTTP errors are answers too."""
    request = urllib.request.Request(
        f"{scheme}://{addr}{path}", method=method, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def scrape(addr: str) -> dict[str, float]:
    """Every sample of /metrics, keyed ``name{label="value",...}`` (labels sorted)."""
    status, headers, body = get(addr, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def promtool_check(addr: str) -> None:
    """``promtool check metrics`` finds nothing to lint in this node's /metrics (names,
    units, suffixes, help texts: Prometheus's conventions). promtool comes from Debian's
    prometheus package (scripts/test extracts it); without it the check is skipped,
    except under CI=true, where it fails."""
    tool = shutil.which("promtool")
    if tool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing (scripts/test installs it as root with apt-get)")
        return
    status, _, body = get(addr, "/metrics")
    assert status == 200
    lint = subprocess.run(
        [tool, "check", "metrics"], input=body, capture_output=True, timeout=30, check=False
    )
    report = (lint.stdout + lint.stderr).decode(errors="replace")
    assert lint.returncode == 0 and not report.strip(), report


def raw(addr: str, data: bytes, timeout: float = 15.0) -> bytes:
    """Send raw bytes; return what comes back until the server closes (or b"")."""
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
    return b"".join(chunks)


def status_code(reply: bytes) -> int | None:
    match = re.match(rb"HTTP/1\.[01] (\d{3})", reply)
    return int(match.group(1)) if match else None


@pytest.fixture(scope="module")
def admin_shared() -> Iterator[LocalCluster]:
    # Two queues shown one by one: the queue-metrics test shows the rest summed.
    c = admin_cluster(metrics_max_queues=2)
    try:
        c.start()
        yield c
    finally:
        c.close()


@pytest.fixture
def shared_admin(
    request: pytest.FixtureRequest, admin_shared: LocalCluster
) -> Iterator[LocalCluster]:
    yield admin_shared
    _show_logs_on_failure(request, admin_shared)


@pytest.fixture
def fresh(request: pytest.FixtureRequest) -> Iterator[list[LocalCluster]]:
    """Clusters a test makes and starts itself; closed (logs shown on failure) after."""
    made: list[LocalCluster] = []
    try:
        yield made
    finally:
        for c in made:
            _show_logs_on_failure(request, c)
            c.close()


# ----------------------------------------------------------------- metrics


@pytest.mark.timeout(120)
def test_metrics_parse_and_move_with_grants_renewals_expiries_and_refusals(
    shared_admin: LocalCluster,
) -> None:
    cluster = shared_admin

    def leader_samples() -> tuple[dict[str, Any], dict[str, float]] | None:
        # The node status names as leader, scraped, and still leading in the scrape.
        leader = cluster.leader()
        if leader is None:
            return None
        samples = scrape(admin_of(cluster, str(leader["node"])))
        return (leader, samples) if samples.get("raftlease_raft_is_leader") == 1 else None

    leader, samples = wait_for(leader_samples, timeout=30, what="a leader's scrape")
    for name in (
        "raftlease_leases_live",
        "raftlease_lease_sessions_live",
        "raftlease_waiters_queued",
        "raftlease_raft_term",
        "raftlease_raft_commit_index",
        "raftlease_raft_applied_index",
        "raftlease_leader_lease_remaining_seconds",
        "raftlease_clock_drift_alarm",
        "raftlease_client_connections",
        "raftlease_journal_syncs_total",
    ):
        assert name in samples, name
    assert samples["raftlease_raft_term"] >= leader["term"]
    # The standard process and Python collectors, and what this node runs.
    assert samples["process_open_fds"] > 0 and samples["process_resident_memory_bytes"] > 0
    assert any(name.startswith("raftlease_build_info{") for name in samples)
    assert any(name.startswith("python_info{") for name in samples)

    # Request metrics are counted by the node that answered (the leader, unless an
    # election moved it): summed over nodes. Lease events are counted by every node
    # that applied them: the furthest node's count.
    summed = (
        'raftlease_request_errors_total{code="LEASE_HELD",op="acquire"}',
        'raftlease_reads_total{served="log"}',
        'raftlease_request_duration_seconds_count{op="acquire"}',
    )

    def cluster_view() -> dict[str, float]:
        scrapes = [scrape(admin_of(cluster, n.id)) for n in cluster.nodes]
        names = {name for one in scrapes for name in one}
        return {
            name: (sum if name in summed else max)(one.get(name, 0.0) for one in scrapes)
            for name in names
        }

    before = cluster_view()
    with cluster.client() as c:
        lease = c.acquire("metrics/a", owner="agent-a", ttl=5.0)
        lease = c.renew(lease)  # from the leader's memory (keepalives = memory)
        c.renew(lease, ttl=6.0)  # a new TTL: a log write, a renewal applied at once
        with pytest.raises(LeaseHeldError):
            c.acquire("metrics/a", owner="agent-b", ttl=5.0)
        c.holder("metrics/a", consistency="log")
        c.holder("metrics/a", consistency="stale")
        c.release(lease)
        c.acquire("metrics/short", owner="agent-c", ttl=0.3)  # left to expire
        wait_for(lambda: c.holder("metrics/short") is None, timeout=30, what="expiry")
    # Every write above was synced to each journal (fsync durability): timed.
    wait_for(
        lambda: all(
            scrape(admin_of(cluster, n.id)).get("raftlease_journal_sync_duration_seconds_count", 0)
            > 0
            for n in cluster.nodes
        ),
        timeout=15,
        what="every node's journal syncs to be timed",
    )

    def moved() -> dict[str, float] | None:
        now = cluster_view()
        grew = all(
            now.get(name, 0) >= before.get(name, 0) + step
            for name, step in (
                ("raftlease_lease_grants_total", 2),
                # The first renewal is answered from the leader's memory (keepalives =
                # memory): counted there; the second, with a new TTL, is applied.
                ("raftlease_keepalives_from_memory_total", 1),
                ("raftlease_lease_renewals_total", 1),
                ("raftlease_lease_releases_total", 1),
                ("raftlease_lease_expiries_total", 1),
                (summed[0], 1),
                (summed[1], 1),
                (summed[2], 3),
            )
        )
        return now if grew else None

    after = wait_for(moved, timeout=30, what="counters to move")
    assert after["raftlease_raft_applied_index"] > before["raftlease_raft_applied_index"]
    assert after["raftlease_apply_batch_requests_count"] > 0
    assert after["raftlease_proposal_commit_seconds_count"] > 0
    assert after["raftlease_apply_duration_seconds_count"] > 0
    # A stale read is answered by whichever node the client asked: somewhere.
    stale = sum(
        scrape(admin_of(cluster, n.id)).get('raftlease_reads_total{served="stale"}', 0)
        for n in cluster.nodes
    )
    assert stale >= 1

    # Lease events follow applied entries: every node counts the same grants.
    def followers_caught_up() -> bool:
        counts = {
            scrape(admin_of(cluster, n.id)).get("raftlease_lease_grants_total")
            for n in cluster.nodes
        }
        return len(counts) == 1

    wait_for(followers_caught_up, timeout=30, what="every node to count the same grants")
    # No label carries a key or an owner.
    for node in cluster.nodes:
        text = get(admin_of(cluster, node.id), "/metrics")[2].decode()
        assert "metrics/a" not in text and "agent-a" not in text


@pytest.mark.timeout(60)
def test_queue_metrics_by_state_with_counters_and_bounded_labels(
    shared_admin: LocalCluster,
) -> None:
    """Task-queue metrics (docs/operations.md, "Task queues"): depths by state, the
    oldest ready task's wait and the event counters, the same on every node (read from
    the replicated state); beyond metrics_max_queues (2 here) a queue has no series of
    its own and is summed under queue="_other"."""
    cluster = shared_admin
    with cluster.client() as c:
        main = c.queue("qm-main")
        # Their priorities make the claims below take them in this order.
        done_id = main.put("a", priority=3)
        dead_id = main.put("b", priority=2, max_attempts=1)
        late_id = main.put("c", priority=1, max_attempts=3, backoff=60.0)
        main.put("d", priority=0)  # stays ready
        first = main.claim(worker="w1", lease_ttl=30.0)
        assert first is not None and first.task_id == done_id
        first.complete("ok")
        second = main.claim(worker="w1", lease_ttl=30.0)
        assert second is not None and second.task_id == dead_id
        second.fail("boom")  # its only attempt: dead-lettered
        third = main.claim(worker="w1", lease_ttl=0.2)  # no heartbeats: it expires
        assert third is not None and third.task_id == late_id
        for name, count in (("qm-side-1", 2), ("qm-side-2", 1)):
            for i in range(count):
                c.queue(name).put(i)

    def label(queue: str, state: str) -> str:
        return f'raftlease_queue_tasks{{queue="{queue}",state="{state}"}}'

    expected = {
        label("qm-main", "ready"): 1,
        label("qm-main", "delayed"): 1,  # the expired attempt's backoff (60 s)
        label("qm-main", "claimed"): 0,
        label("qm-main", "dead"): 1,
        label("qm-main", "completed"): 1,
        label("qm-side-1", "ready"): 2,
        'raftlease_queue_claims_total{queue="qm-main"}': 3,
        'raftlease_queue_completions_total{queue="qm-main"}': 1,
        'raftlease_queue_expiries_total{queue="qm-main"}': 1,
        'raftlease_queue_retries_total{queue="qm-main"}': 1,
        'raftlease_queue_dead_letters_total{queue="qm-main"}': 1,
        'raftlease_queue_waiting_claims{queue="qm-main"}': 0,
    }

    def settled() -> list[dict[str, float]] | None:
        scrapes = [scrape(admin_of(cluster, n.id)) for n in cluster.nodes]
        good = all(all(one.get(k) == v for k, v in expected.items()) for one in scrapes)
        return scrapes if good else None

    scrapes = wait_for(settled, timeout=20, what="every node's queue metrics")
    for one in scrapes:
        # The third queue (fewest open tasks) is only in "_other".
        assert not any('queue="qm-side-2"' in name for name in one)
        assert one[label("_other", "ready")] >= 1
        assert one['raftlease_queue_oldest_ready_age_seconds{queue="qm-main"}'] >= 0
        assert 'raftlease_queue_oldest_ready_age_seconds{queue="_other"}' not in one
        # All queues, since the cluster began: at least this test's events.
        for name, least in (
            ("raftlease_task_claims_total", 3),
            ("raftlease_task_completions_total", 1),
            ("raftlease_task_expiries_total", 1),
            ("raftlease_task_retries_total", 1),
            ("raftlease_task_dead_letters_total", 1),
        ):
            assert one[name] >= least, name
    # The queue families pass Prometheus's own lint, on every node.
    for node in cluster.nodes:
        promtool_check(admin_of(cluster, node.id))


@pytest.mark.timeout(120)
def test_snapshot_metrics_after_a_log_compaction(fresh: list[LocalCluster]) -> None:
    cluster = admin_cluster(1, compaction_min_entries=20, compaction_min_time=0.5)
    fresh.append(cluster)
    cluster.start()
    addr = admin_of(cluster, "n1")
    with cluster.client() as c:
        for i in range(40):
            c.acquire(f"snap/{i}", owner="agent", ttl=30.0)

    def snapshotted() -> dict[str, float] | None:
        samples = scrape(addr)
        return samples if samples.get("raftlease_snapshots_total", 0) >= 1 else None

    samples = wait_for(snapshotted, timeout=60, what="a snapshot")
    assert samples["raftlease_snapshot_size_bytes"] > 0
    assert samples["raftlease_snapshot_last_duration_seconds"] >= 0
    assert samples["raftlease_snapshot_last_write_timestamp_seconds"] > 0
    assert samples["raftlease_snapshot_failures_total"] == 0
    assert samples["raftlease_leases_live"] == 40


@pytest.mark.timeout(120)
def test_heap_trims_are_counted(fresh: list[LocalCluster]) -> None:
    """The node returns its free heap pages every ``heap_trim_interval`` (server/heap.py)
    and says so in its metrics; with 0 it never does."""
    cluster = admin_cluster(3, heap_trim_interval=0.2, node_extra={"n3": {"heap_trim_interval": 0}})
    fresh.append(cluster)
    cluster.start()
    on, off = admin_of(cluster, "n1"), admin_of(cluster, "n3")

    def trimmed() -> dict[str, float] | None:
        samples = scrape(on)
        return samples if samples.get("raftlease_heap_trims_total", 0) >= 2 else None

    samples = wait_for(trimmed, timeout=60, what="two heap trims")
    assert 0 <= samples["raftlease_heap_trim_seconds"] < 1.0
    assert scrape(off).get("raftlease_heap_trims_total") == 0


# ------------------------------------------------------------ health, status


@pytest.mark.timeout(60)
def test_livez_readyz_and_status_on_a_healthy_cluster(shared_admin: LocalCluster) -> None:
    cluster = shared_admin
    cluster.wait_for_leader()
    for node in cluster.nodes:
        addr = admin_of(cluster, node.id)
        assert get(addr, "/livez")[0] == 200
        wait_for(lambda a=addr: get(a, "/readyz")[0] == 200, timeout=30, what="ready")
        status, headers, body = get(addr, "/status")
        assert status == 200 and headers["Content-Type"].startswith("application/json")
        http_status = json.loads(body)
        with cluster.client() as c:
            native = c.node_status(node.client)
        assert set(http_status) == set(native)
        for field in ("node", "client", "raft", "version", "durability", "insecure"):
            assert http_status[field] == native[field], field
        assert http_status["node"] == node.id


@pytest.mark.timeout(150)
def test_readyz_is_503_before_a_leader_and_after_quorum_loss(
    fresh: list[LocalCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The nodes inherit the environment: they log JSON (checked below).
    monkeypatch.setenv("RAFTLEASE_LOG_FORMAT", "json")
    cluster = admin_cluster()
    fresh.append(cluster)
    cluster.start_node("n1")
    addr = admin_of(cluster, "n1")
    wait_for(lambda: _answers(addr), timeout=30, what="n1's admin endpoint")
    # Alone, n1 can elect nobody: live, not ready, and says why.
    code, _, body = get(addr, "/readyz")
    assert code == 503 and json.loads(body)["ready"] is False
    assert json.loads(body)["reason"]
    assert get(addr, "/livez")[0] == 200
    cluster.start_node("n2")
    cluster.start_node("n3")
    cluster.wait_for_leader()
    for node in cluster.nodes:
        a = admin_of(cluster, node.id)
        wait_for(lambda a=a: get(a, "/readyz")[0] == 200, timeout=30, what="ready")
    # Two of three gone: the survivor loses its leader and becomes unready.
    cluster.stop_node("n2")
    cluster.stop_node("n3")

    def unready() -> dict[str, Any] | None:
        code, _, body = get(addr, "/readyz")
        return json.loads(body) if code == 503 else None

    reason = wait_for(unready, timeout=30, what="n1 to report 503")
    assert reason["ready"] is False and reason["reason"]
    assert get(addr, "/livez")[0] == 200

    # JSON log lines: each a JSON object with the text format's fields.
    lines = cluster.log_path("n1").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert records, "no JSON log lines"
    for record in records:
        assert {"time", "level", "logger", "pid", "message"} <= set(record)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"])
    assert {r.get("node") for r in records[-5:]} == {"n1"}
    assert any("serving clients" in r["message"] for r in records)
    assert any(r["logger"] == "raftlease.server.admin" for r in records)


@pytest.mark.timeout(30)
def test_json_and_text_log_lines_carry_the_same_fields() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord(
        "raftlease.server", logging.WARNING, __file__, 1, "node %s: %s", ("n1", "x=1"), exc_info
    )
    text = logging.Formatter(TEXT_LOG_FORMAT).format(record)
    fields = json.loads(JsonLogFormatter().format(record))
    match = re.match(r"(\S+ \S+) level=(\S+) logger=(\S+) pid=(\d+) (.*)", text)
    assert match is not None
    # The same instant: text in local time (for a terminal), JSON in ISO 8601 UTC.
    local = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
    assert abs(local.timestamp() - record.created) < 0.001
    assert fields["time"] == iso_utc(record.created) and fields["time"].endswith("Z")
    assert datetime.fromisoformat(fields["time"]).timestamp() == pytest.approx(
        record.created, abs=0.001
    )
    assert fields["level"] == match.group(2) == "WARNING"
    assert fields["logger"] == match.group(3) == "raftlease.server"
    assert fields["pid"] == int(match.group(4))
    assert fields["message"] == match.group(5) == "node n1: x=1"
    assert "ValueError: boom" in fields["exc"] and "ValueError: boom" in text
    # An unknown format is a usage error.
    result = CliRunner().invoke(main, ["node", "--log-format", "xml"])
    assert result.exit_code == 2 and "xml" in result.output


def _answers(addr: str) -> bool:
    try:
        return get(addr, "/livez")[0] == 200
    except OSError:
        return False


# ------------------------------------------------------------ hostile input


@pytest.mark.timeout(120)
def test_bad_http_gets_a_definite_answer_and_the_node_stays_up(
    shared_admin: LocalCluster,
) -> None:
    cluster = shared_admin
    addr = admin_of(cluster, "n1")
    code, _, body = get(addr, "/nope")
    assert code == 404
    # The answer lists every route the port serves, the HTTP API and the UI included.
    assert {"/livez", "/readyz", "/metrics", "/status", "/v1/", "/ui/"} <= set(
        json.loads(body)["error"]["detail"]["routes"]
    )
    assert get(addr, "/metrics/../status")[0] in (200, 404)  # normalised or unknown
    code, headers, _ = get(addr, "/metrics", method="POST")
    assert code == 405 and "GET" in headers["Allow"]
    assert get(addr, "/status", method="DELETE")[0] == 405
    assert get(addr, "/livez", method="HEAD")[0] == 200
    # Garbage request line: 400 or closed, never a hang.
    reply = raw(addr, b"\x00\xffGARBAGE\r\n\r\n")
    assert status_code(reply) in (400, None)
    # A header far over the 8 KiB line limit.
    reply = raw(addr, b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
    assert status_code(reply) in (400, 431, None)
    # Too many headers.
    many = b"".join(b"X-%d: y\r\n" % i for i in range(200))
    reply = raw(addr, b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n" + many + b"\r\n")
    assert status_code(reply) in (400, 431, None)
    # A body on a GET, and a huge declared body.
    reply = raw(
        addr,
        b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n"
        b"Connection: close\r\n\r\nhello",
    )
    assert status_code(reply) == 413
    reply = raw(
        addr,
        b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99999999999\r\n"
        b"Connection: close\r\n\r\n",
    )
    assert status_code(reply) in (400, 413)
    # A slow client that never finishes its request is closed.
    started = time.monotonic()
    reply = raw(addr, b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n", timeout=60)
    assert status_code(reply) is None and 5 < time.monotonic() - started < 50
    # Still serving, on HTTP and on the client port.
    assert get(addr, "/livez")[0] == 200
    assert scrape(addr)["raftlease_node_up"] == 1
    with cluster.client() as c:
        assert c.node_status(cluster.node("n1").client)["node"] == "n1"


# ---------------------------------------------------------------- secured


@pytest.mark.timeout(120)
def test_secured_endpoint_serves_https_and_wants_an_admin_token(
    fresh: list[LocalCluster], tmp_path: Path
) -> None:
    bundle = secure_bundle(tmp_path / "tls")
    cluster = admin_cluster(1, **bundle.node_settings())
    fresh.append(cluster)
    cluster.start()
    addr = admin_of(cluster, "n1")
    context = ssl.create_default_context(cafile=str(bundle.ca_file))

    def https(path: str, token: str | None = None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return get(addr, path, headers=headers, scheme="https", context=context)[0]

    wait_for(lambda: https("/readyz") == 200, timeout=30, what="ready")
    assert https("/livez") == 200  # probes need no token
    assert https("/metrics") == 401
    assert https("/status", token="not-the-token") == 401
    assert https("/metrics", token=bundle.admin_token) == 200
    assert https("/status", token=bundle.admin_token) == 200
    # Plain HTTP to the TLS port gets no answer.
    assert status_code(raw(addr, b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n", timeout=20)) is None


# ------------------------------------------------------------ cross-origin reads


def _header(headers: dict[str, str], name: str) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == name.lower()), None)


@pytest.mark.timeout(60)
def test_cors_only_for_the_other_members_admin_origins(shared_admin: LocalCluster) -> None:
    """Another member's dashboard may read this endpoint (cors.py): its exact admin
    origin gets ``Access-Control-Allow-Origin`` and a preflight answer, with ``Vary:
    Origin``; a foreign origin (or this node's own, or a near miss) gets neither, and
    a request without an ``Origin`` is answered as ever."""
    cluster = shared_admin
    cluster.wait_for_leader()
    addr = admin_of(cluster, "n1")
    member = f"http://{admin_of(cluster, 'n2')}"
    preflight = {
        "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "authorization",
    }

    def asked(origin: str) -> tuple[int, dict[str, str], bytes]:
        return get(addr, "/ui/api/health", "OPTIONS", {"Origin": origin, **preflight})

    # n1 learns n2's admin address from n2's status (every 2 s until known).
    status, headers, _ = wait_for(
        lambda: (lambda r: r if r[0] == 204 else None)(asked(member)),
        timeout=30,
        what="n1 to learn n2's admin origin",
    )
    assert _header(headers, "Access-Control-Allow-Origin") == member
    assert _header(headers, "Vary") == "Origin"
    assert _header(headers, "Access-Control-Allow-Methods") == "GET, POST"
    assert _header(headers, "Access-Control-Allow-Headers") == "Authorization, Content-Type"
    assert _header(headers, "Access-Control-Allow-Credentials") is None

    # The reads themselves, a stream's headers included.
    for path in ("/ui/api/health", "/readyz", "/status"):
        status, headers, _ = get(addr, path, headers={"Origin": member})
        assert status == 200, path
        assert _header(headers, "Access-Control-Allow-Origin") == member, path
        assert "Origin" in (_header(headers, "Vary") or ""), path

    port = admin_of(cluster, "n2").rpartition(":")[2]
    for foreign in (
        "http://evil.example",
        f"http://evil.example:{port}",
        f"https://{admin_of(cluster, 'n2')}",  # another scheme
        f"http://localhost:{port}",  # another name: not exactly the admin address
        f"http://{addr}",  # this node's own origin: no cross-origin read needed
        "null",
    ):
        status, headers, _ = asked(foreign)
        assert status == 405, foreign
        assert _header(headers, "Access-Control-Allow-Origin") is None, foreign
        assert _header(headers, "Access-Control-Allow-Methods") is None, foreign
        status, headers, _ = get(addr, "/ui/api/health", headers={"Origin": foreign})
        assert status == 200 and _header(headers, "Access-Control-Allow-Origin") is None
        assert _header(headers, "Vary") == "Origin", foreign

    # Without an Origin: today's answer, no CORS header at all.
    status, headers, _ = get(addr, "/ui/api/health")
    assert status == 200
    assert not [k for k in headers if k.lower().startswith("access-control-")]
    assert _header(headers, "Vary") is None
    # The page's policy lets it connect to the other members' admin origins only.
    status, headers, _ = get(addr, "/ui/")
    policy = _header(headers, "Content-Security-Policy") or ""
    connect = next(p for p in policy.split("; ") if p.startswith("connect-src"))
    others = sorted(f"http://{admin_of(cluster, n)}" for n in ("n2", "n3"))
    assert connect == "connect-src 'self' " + " ".join(others)
    assert "*" not in policy
