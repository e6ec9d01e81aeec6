"""An elected coordinator that fails over: agents campaign for one lock; the holder
coordinates while its lease is valid; everyone watches the key to see who leads.

    python examples/elected_coordinator.py --endpoints ... --agents 3 --rounds 2

Each round the current coordinator steps down (as if it crashed: it stops renewing),
and the next agent in the fair queue takes over with a higher fencing token.
"""

from __future__ import annotations

import argparse
import threading

from raftlease import Client

KEY = "election/coordinator"


def agent(endpoints: str, name: str, rounds: int, log: list[tuple[str, int]]) -> None:
    with Client(endpoints) as c:
        for _ in range(rounds):
            # Campaign: wait in the queue until elected.
            with c.lock(KEY, owner=name, ttl=2.0, wait=60.0) as held:
                log.append((name, held.token))
                # ... coordinate while held.valid ... then step down.


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", default="127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003")
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    leaders: list[tuple[str, int]] = []
    seen: list[str] = []

    def observe() -> None:
        with Client(args.endpoints) as c:
            for event in c.watch(KEY):
                if event.type == "grant":
                    seen.append(event.owner)
                if len(seen) >= args.agents * args.rounds:
                    return

    observer = threading.Thread(target=observe, daemon=True)
    observer.start()
    agents = [
        threading.Thread(target=agent, args=(args.endpoints, f"agent-{i}", args.rounds, leaders))
        for i in range(args.agents)
    ]
    for t in agents:
        t.start()
    for t in agents:
        t.join()
    observer.join(timeout=10)
    tokens = [t for _, t in leaders]
    assert tokens == sorted(tokens), "each new coordinator has a higher token"
    print(f"coordinators in order: {[n for n, _ in leaders]}; observed: {seen}")


if __name__ == "__main__":
    main()
