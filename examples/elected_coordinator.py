"""An elected coordinator that fails over.

Each agent is its own process: it opens a lease session, campaigns in the election
"coordinator" with its address as the value, and coordinates while it leads. This
script starts the agents, observes the election, and SIGKILLs whoever leads, round
after round. The dead leader's keep-alives stop, its session expires, and the next
candidate in the queue is elected in the log entry that expires it, with a higher
fencing token.

    python examples/elected_coordinator.py --endpoints ... --agents 3 --rounds 2

Exits 0 only if every round elected a new, live agent with a higher token, and the
observer saw each change in order.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time

from raftlease import Client, Leader

ELECTION = "election/coordinator"


def run_agent(endpoints: str, name: str, ttl: float) -> None:
    """One agent process: campaign, then coordinate until killed (at most 60 s)."""
    with Client(endpoints) as c, c.session(owner=name, ttl=ttl) as session:
        lease = c.election(ELECTION).campaign(f"{name}.local:7000", session=session)
        print(json.dumps({"elected": name, "token": lease.token}), flush=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and session.valid:
            time.sleep(0.05)  # coordinate: hand lease.token to every write


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", default="127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003")
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ttl", type=float, default=1.5, help="agent session TTL, seconds")
    parser.add_argument("--agent", help=argparse.SUPPRESS)  # internal: run one agent
    args = parser.parse_args()
    if args.agent:
        run_agent(args.endpoints, args.agent, args.ttl)
        return 0
    if args.rounds >= args.agents:
        parser.error("--rounds must be below --agents (each round kills one agent)")

    procs = {
        f"agent-{i}": subprocess.Popen(
            [
                *(sys.executable, __file__, "--endpoints", args.endpoints),
                *("--agent", f"agent-{i}", "--ttl", str(args.ttl)),
            ]
        )
        for i in range(args.agents)
    }
    failures: list[str] = []
    leaders: list[Leader] = []
    try:
        with Client(args.endpoints) as c:
            changes = c.election(ELECTION).observe()
            killed_at: float | None = None
            for leader in changes:  # the leader now, then every change in order
                if leader is None:
                    print("  no leader")
                    continue
                print(f"  leader {leader.owner} at {leader.value} (token {leader.token})")
                if leaders and leader.token <= leaders[-1].token:
                    failures.append(f"token went from {leaders[-1].token} to {leader.token}")
                if procs[leader.owner].poll() is not None:
                    failures.append(f"{leader.owner} was elected although it is dead")
                if killed_at is not None:
                    print(f"  failover took {time.monotonic() - killed_at:.2f} s")
                leaders.append(leader)
                if len(leaders) > args.rounds:
                    break
                print(f"killing {leader.owner} (SIGKILL)")
                procs[leader.owner].send_signal(signal.SIGKILL)
                killed_at = time.monotonic()
            changes.close()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
    order = [leader.owner for leader in leaders]
    if len(set(order)) != len(order):
        failures.append(f"an agent led twice: {order}")
    print(f"coordinators in order: {order}; tokens {[leader.token for leader in leaders]}")
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
