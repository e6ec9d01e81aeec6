"""Training workers share the GPUs of one machine through a pool.

Each worker asks for 1 or 2 of the node's GPUs, waits in the pool's fair queue until
they are free, and is told WHICH devices it got (``held.unit_indices``, chosen by the
cluster: the lowest free ones). It runs its job with ``CUDA_VISIBLE_DEVICES`` set to
exactly those devices, so two jobs never share a GPU, and writes results through a
fence, so a worker that stalls past its lease cannot overwrite its successor's.

    python examples/gpu_pool_workers.py --endpoints 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
"""

from __future__ import annotations

import argparse
import os
import threading

from raftlease import Client, FencedResource

POOL = "gpus/node-0"
GPUS = 4

#: device -> the worker using it now (checked: a device is never handed out twice).
in_use: dict[int, str] = {}
in_use_lock = threading.Lock()


def run_job(name: str, env: dict[str, str], devices: tuple[int, ...]) -> None:
    """Stands in for ``subprocess.run(["python", "train.py"], env=env)``."""
    with in_use_lock:
        for device in devices:
            assert device not in in_use, f"GPU {device} given to {name} and {in_use[device]}"
            in_use[device] = name
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, devices))
    with in_use_lock:
        for device in devices:
            del in_use[device]


def worker(endpoints: str, name: str, jobs: int, gpus: int, fence: FencedResource) -> int:
    done = 0
    with Client(endpoints) as c:
        for _ in range(jobs):
            with c.pool(POOL, capacity=GPUS, units=gpus, owner=name, ttl=10.0, wait=60.0) as held:
                devices = held.unit_indices
                env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, devices))}
                run_job(name, env, devices)
                fence.check(f"{POOL}/results/{name}", held.token)  # the results store's guard
                done += 1
    return done


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", default="127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003")
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--episodes", type=int, default=5, help="jobs per worker")
    args = parser.parse_args()
    fence = FencedResource()
    results: dict[str, int] = {}
    threads = [
        threading.Thread(
            target=lambda n=f"worker-{i}", g=1 + i % 2: results.__setitem__(
                n, worker(args.endpoints, n, args.episodes, g, fence)
            )
        )
        for i in range(args.workers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results.values()) == args.workers * args.episodes, results
    print(f"jobs per worker: {results}; no GPU was ever given to two jobs at once")


if __name__ == "__main__":
    main()
