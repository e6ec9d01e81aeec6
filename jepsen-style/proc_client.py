"""A lease client in its own process, so the nemesis can SIGSTOP a real lease holder.

Child side (``python proc_client.py --endpoints ... --store ...``): runs one
``workload.Worker`` with a pause window before each fenced write, and prints every
history event as a JSON line on stdout. Its times are ``time.monotonic()``, the same
system-wide CLOCK_MONOTONIC the harness uses, so its events merge into one history.

Harness side (``ClientProcess``): starts the child, copies its events into the
``History`` from a reader thread, remembers the last ``about-to-write`` marker (the
moment to pause it) and stops it (SIGCONT first, then SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import secure
from workload import History, RemoteStore, Worker, WorkloadConfig

HERE = Path(__file__).resolve().parent


class ClientProcess:
    """Harness handle of the client process ``name``."""

    def __init__(
        self,
        name: str,
        endpoints: list[str],
        store_addr: str,
        history: History,
        seconds: float,
        seed: int,
        keys: tuple[str, ...],
        pause_window: float = 0.15,
        shared_keys: tuple[tuple[str, int, tuple[int, ...]], ...] = (),
    ) -> None:
        self.name = name
        self.history = history
        self.marker = threading.Event()
        self.last_marker: dict[str, Any] | None = None
        self.stopped = False
        self.lines = 0
        self.stderr_tail: list[str] = []
        args = [
            sys.executable,
            str(HERE / "proc_client.py"),
            "--name",
            name,
            "--endpoints",
            ",".join(endpoints),
            "--store",
            store_addr,
            "--seconds",
            str(seconds),
            "--seed",
            str(seed),
            "--keys",
            ",".join(keys),
            "--pause-window",
            str(pause_window),
            "--shared",
            json.dumps(shared_keys),
        ]
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._reader = threading.Thread(target=self._read, name=f"{name}-reader", daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            self.lines += 1
            if event.get("type") == "marker":
                self.last_marker = event
                self.marker.set()
                continue
            self.history.append(event)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr_tail = [*self.stderr_tail[-40:], raw.decode(errors="replace").rstrip()]

    def wait_for_marker(self, timeout: float) -> dict[str, Any] | None:
        """Wait for the next ``about-to-write`` marker; returns it or None."""
        self.marker.clear()
        if self.marker.wait(timeout):
            return self.last_marker
        return None

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.resume()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        self.stopped = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="chaos-suite lease client process")
    parser.add_argument("--name", required=True)
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keys", default="k1,k2,k3,k4")
    parser.add_argument("--pause-window", type=float, default=0.15)
    parser.add_argument(
        "--shared", default="[]", help='shared keys as JSON: [["sem1", 2, [1]], ...]'
    )
    args = parser.parse_args(argv)

    from raftlease import Client

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    lock = threading.Lock()

    def emit(event: dict[str, Any]) -> None:
        with lock:
            sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
            sys.stdout.flush()

    shared = tuple(
        (str(key), int(capacity), tuple(int(u) for u in units))
        for key, capacity, units in json.loads(args.shared)
    )
    config = WorkloadConfig(keys=tuple(args.keys.split(",")), shared_keys=shared)
    store = RemoteStore(args.store)
    try:
        with Client(
            args.endpoints.split(","),
            deadline=max(config.deadlines),
            attempt_timeout=config.attempt_timeout,
            clock_drift=config.clock_drift,
            margin=config.margin,
            **secure.client_options("lease-worker"),
        ) as client:
            worker = Worker(
                args.name, client, store, emit, config, args.seed, pause_window=args.pause_window
            )
            worker.run(stop, time.monotonic() + args.seconds)
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
