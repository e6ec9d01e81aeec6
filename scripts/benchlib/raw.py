"""The ceiling for the benchmark: raw PySyncObj no-op commits on 3 local processes.

Each node process (``python -m benchlib.raw node --config <node.toml>``, with
``scripts/`` on PYTHONPATH) runs one PySyncObj replica whose only replicated method is
a no-op taking a bytes payload of the size of a typical raftlease log entry. It uses
the same ``SyncObjConf`` as raftlease's replica: ``raftlease.replication.syncobj_conf``
builds it from the node's ``NodeConfig`` (so it follows any change there); only the
transport differs, raw runs PySyncObj's own TCP transport.

The parent drives each process with JSON lines on stdin and reads JSON lines from
stdout (stderr goes to the node's log file). The load runs *inside the leader's
process*, as "sync writes, 1 thread at the leader" and "pipelined, N in flight" in
docs/pysyncobj.md: ``sync`` (one thread, each call waits for its commit) and
``pipelined`` (one driver thread keeps ``inflight`` calls outstanding; callbacks fire
on the tick thread when the entry is applied at the leader).

``RawCluster`` is the parent side, used by the raw workload (workloads/throughput.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from raftlease.config import NodeConfig

from .measure import percentile

#: Bytes per no-op entry: about one msgpack-encoded raftlease acquire entry.
PAYLOAD_BYTES = 150

CONTROL_TIMEOUT = 120.0

#: The directory holding the benchlib package (put on the node processes' PYTHONPATH).
SCRIPTS_DIR = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------- node process


def _load_config(path: str) -> NodeConfig:
    """The node's config from the TOML a ``LocalCluster`` wrote (relative data_dir
    taken relative to the file), validated by ``NodeConfig.create``."""
    config_path = Path(path)
    raw = tomllib.loads(config_path.read_text())
    if "data_dir" in raw and not Path(raw["data_dir"]).is_absolute():
        raw["data_dir"] = config_path.parent / raw["data_dir"]
    return NodeConfig.create(**raw)


def _capture_conf(config: NodeConfig) -> tuple[Any, list[str], str]:
    """The SyncObjConf and peer list raftlease.replication uses for this node.

    Returns ``(conf, peers, how)``; the transport (raftlease's own) is not reused:
    raw runs PySyncObj's TCP transport."""
    from raftlease.replication import syncobj_conf

    conf = syncobj_conf(config)
    peers = [p.raft for p in config.peers]
    return conf, peers, "raftlease.replication.syncobj_conf (transport: PySyncObj's own)"


def _conf_summary(conf: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in sorted(vars(conf).items()):
        if isinstance(value, bool | int | float | str) or value is None:
            out[key] = value
    return out


class _NodeRunner:
    """One raw PySyncObj node plus the load generators run at the leader.

    Commands are handled one at a time on the process's main thread; PySyncObj's
    tick thread applies entries and runs the pipelined callbacks."""

    def __init__(self, config_path: str) -> None:
        # Imported here: only node processes need PySyncObj's classes.
        from pysyncobj import SyncObj, SyncObjConsumer, replicated

        class NoopConsumer(SyncObjConsumer):  # type: ignore[misc]
            @replicated  # type: ignore[untyped-decorator]
            def noop(self, data: bytes) -> int:
                return len(data)

        self.config = _load_config(config_path)
        conf, peers, self.conf_source = _capture_conf(self.config)
        self.conf = conf
        self.consumer = NoopConsumer()
        self.sync = SyncObj(self.config.self_node.raft, peers, conf, consumers=[self.consumer])
        self.payload = b"x" * PAYLOAD_BYTES

    def status(self) -> dict[str, Any]:
        st = self.sync.getStatus()
        return {
            "leader": st["state"] == 2,
            "leader_addr": str(st["leader"].id) if st["leader"] is not None else None,
            "term": int(st["raft_term"]),
            "commit": int(st["commit_idx"]),
            "applied": int(st["last_applied"]),
            "ready": bool(self.sync.isReady()),
            "pid": os.getpid(),
        }

    def conf_info(self) -> dict[str, Any]:
        return {
            "source": self.conf_source,
            "conf": _conf_summary(self.conf),
            "payload_bytes": PAYLOAD_BYTES,
        }

    def run_sync(self, duration: float, max_ops: int) -> dict[str, Any]:
        """One thread, each call blocking until its entry is committed."""
        latencies: list[float] = []
        errors = 0
        start = time.perf_counter()
        end = start + duration
        while len(latencies) < max_ops and time.perf_counter() < end:
            t0 = time.perf_counter()
            try:
                self.consumer.noop(self.payload, sync=True, timeout=5.0)
            except Exception:
                errors += 1
                if errors > 1000:
                    break
                continue
            latencies.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
        return _summary(latencies, errors, elapsed)

    def run_pipelined(self, duration: float, inflight: int, max_ops: int) -> dict[str, Any]:
        """This thread keeps ``inflight`` calls outstanding (a semaphore slot each,
        given back by the callback on PySyncObj's tick thread), then drains them."""
        from pysyncobj import FAIL_REASON

        slots = threading.Semaphore(inflight)
        lock = threading.Lock()
        latencies: list[float] = []
        errors = [0]

        def make_callback(t0: float) -> Any:
            def done(result: Any, reason: int) -> None:
                took = time.perf_counter() - t0
                with lock:
                    if reason == FAIL_REASON.SUCCESS:
                        latencies.append(took)
                    else:
                        errors[0] += 1
                slots.release()

            return done

        sent = 0
        start = time.perf_counter()
        end = start + duration
        while sent < max_ops and time.perf_counter() < end:
            if not slots.acquire(timeout=5.0):
                break
            sent += 1
            self.consumer.noop(self.payload, callback=make_callback(time.perf_counter()))
        # Drain: wait for every outstanding call (bounded).
        drained = 0
        drain_deadline = time.monotonic() + 10.0
        while drained < inflight and time.monotonic() < drain_deadline:
            if slots.acquire(timeout=0.5):
                drained += 1
        elapsed = time.perf_counter() - start
        with lock:
            return _summary(list(latencies), errors[0], elapsed)

    def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        cmd = command.get("cmd")
        if cmd == "status":
            return self.status()
        if cmd == "conf":
            return self.conf_info()
        if cmd == "sync":
            return self.run_sync(float(command["duration"]), int(command.get("max_ops", 10**9)))
        if cmd == "pipelined":
            return self.run_pipelined(
                float(command["duration"]),
                int(command["inflight"]),
                int(command.get("max_ops", 10**9)),
            )
        return {"error": f"unknown command {cmd!r}"}


def _summary(latencies: list[float], errors: int, elapsed: float) -> dict[str, Any]:
    ops = len(latencies)
    return {
        "ops": ops,
        "errors": errors,
        "elapsed": elapsed,
        "ops_per_s": ops / elapsed if elapsed > 0 else 0.0,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def node_main(config_path: str, max_lifetime: float) -> int:
    """A node process: answer one JSON line on stdout per JSON line on stdin until
    stdin closes (blocking reads on the main thread)."""
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    runner = _NodeRunner(config_path)
    # Bounded lifetime even if the parent dies without closing our stdin.
    signal.signal(signal.SIGALRM, lambda *_: os._exit(3))
    signal.alarm(int(max_lifetime))
    out = sys.stdout
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            reply = runner.handle(json.loads(line))
        except Exception as exc:
            reply = {"error": repr(exc)}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    runner.sync.destroy()
    return 0


# -------------------------------------------------------------- parent side


@dataclass
class RawNode:
    node_id: str
    proc: subprocess.Popen[str]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ask(self, command: dict[str, Any], timeout: float = CONTROL_TIMEOUT) -> dict[str, Any]:
        """Send one command, block (at most ``timeout`` s) for its one-line reply.
        Thread-safe: one command at a time per node."""
        with self.lock:
            stdin: IO[str] | None = self.proc.stdin
            stdout: IO[str] | None = self.proc.stdout
            if stdin is None or stdout is None or self.proc.poll() is not None:
                raise RuntimeError(f"raw node {self.node_id} is not running")
            stdin.write(json.dumps(command) + "\n")
            stdin.flush()
            result: dict[str, Any] = {}
            # readline has no timeout: read on a helper thread and bound the wait.
            reader = threading.Thread(
                target=lambda: result.update(line=stdout.readline()), daemon=True
            )
            reader.start()
            reader.join(timeout)
            line = result.get("line")
            if not line:
                raise RuntimeError(f"raw node {self.node_id} gave no answer to {command}")
            reply: dict[str, Any] = json.loads(line)
            if "error" in reply:
                raise RuntimeError(f"raw node {self.node_id}: {reply['error']}")
            return reply


class RawCluster:
    """Three raw PySyncObj node processes laid out like a ``LocalCluster`` (same
    config files, ports from a free block, journals in a temporary directory)."""

    def __init__(self, settings: dict[str, Any], max_lifetime: float = 3600.0) -> None:
        from raftlease.testing import LocalCluster

        # Only for layout (ports, TOML, data dirs): its own start() is never called.
        self.layout = LocalCluster(3, settings=settings)
        self.max_lifetime = max_lifetime
        self.nodes: dict[str, RawNode] = {}

    def start(self, timeout: float = 30.0) -> RawCluster:
        """Start the node processes and block until they elected a leader."""
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            # After the frozen raftlease copy (if any), so that copy stays first.
            "PYTHONPATH": os.pathsep.join(
                [*filter(None, [os.environ.get("PYTHONPATH")]), str(SCRIPTS_DIR)]
            ),
        }
        for node in self.layout.nodes:
            config = self.layout.write_config(node.id)
            log = open(self.layout.log_path(node.id), "ab")  # noqa: SIM115 - owned by child
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchlib.raw",
                    "node",
                    "--config",
                    str(config),
                    "--max-lifetime",
                    str(self.max_lifetime),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
                # Not the caller's directory: ``-m`` puts the working directory first
                # on sys.path, where a raftlease checkout would shadow the frozen copy.
                cwd=config.parent,
            )
            log.close()
            self.nodes[node.id] = RawNode(node.id, proc)
        self.wait_for_leader(timeout)
        return self

    def pids(self) -> dict[str, int]:
        return {node_id: n.proc.pid for node_id, n in self.nodes.items()}

    def statuses(self) -> dict[str, dict[str, Any]]:
        return {node_id: n.ask({"cmd": "status"}, 10.0) for node_id, n in self.nodes.items()}

    def wait_for_leader(self, timeout: float = 30.0) -> str:
        """Block until exactly one node leads and all are ready; its node id."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                statuses = self.statuses()
                leaders = [i for i, s in statuses.items() if s["leader"]]
                if len(leaders) == 1 and all(s["ready"] for s in statuses.values()):
                    return leaders[0]
            except RuntimeError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"raw cluster elected no leader within {timeout} s")
            time.sleep(0.1)

    def leader(self) -> RawNode:
        return self.nodes[self.wait_for_leader()]

    def close(self) -> None:
        """SIGTERM every node, wait (then SIGKILL), remove the data directory."""
        for node in self.nodes.values():
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes.values():
            try:
                node.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(timeout=10)
            for stream in (node.proc.stdin, node.proc.stdout):
                if stream is not None:
                    stream.close()
        self.layout.close()

    def __enter__(self) -> RawCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one raw PySyncObj node of the benchmark")
    sub = parser.add_subparsers(dest="command", required=True)
    node = sub.add_parser("node", help="run one raw PySyncObj node (driven over stdin)")
    node.add_argument("--config", required=True)
    node.add_argument("--max-lifetime", type=float, default=3600.0)
    args = parser.parse_args(argv)
    return node_main(args.config, args.max_lifetime)


if __name__ == "__main__":
    sys.exit(main())
