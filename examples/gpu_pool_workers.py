"""RL workers lease simulation environments (or GPUs) from a small pool.

Each worker waits in the fair queue for any free environment, holds it with a
self-renewing lock, and writes its results through a fence, so a worker that stalls
past its lease can never overwrite the work of the one that replaced it.

    python examples/gpu_pool_workers.py --endpoints 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
"""

from __future__ import annotations

import argparse
import threading

from raftlease import Client, FencedResource, LeaseHeldError, StaleTokenError

ENVIRONMENTS = [f"sim-env/{i}" for i in range(3)]


def worker(endpoints: str, name: str, episodes: int, fence: FencedResource) -> int:
    done = 0
    with Client(endpoints) as c:
        while done < episodes:
            for env in ENVIRONMENTS:  # take the first environment that is free
                try:
                    held = c.lock(env, owner=name, ttl=5.0, wait=0.0)
                    with held:
                        fence.check(env, held.token)  # the environment's own guard
                        done += 1
                    break
                except (LeaseHeldError, StaleTokenError):
                    continue
            else:  # all busy: wait fairly for the first one
                with c.lock(ENVIRONMENTS[0], owner=name, ttl=5.0, wait=30.0) as held:
                    fence.check(ENVIRONMENTS[0], held.token)
                    done += 1
    return done


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", default="127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003")
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--episodes", type=int, default=5)
    args = parser.parse_args()
    fence = FencedResource()
    results: dict[str, int] = {}
    threads = [
        threading.Thread(
            target=lambda n=f"worker-{i}": results.__setitem__(
                n, worker(args.endpoints, n, args.episodes, fence)
            )
        )
        for i in range(args.workers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"episodes per worker: {results}; highest tokens: {fence.highest}")


if __name__ == "__main__":
    main()
