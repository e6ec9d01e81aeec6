"""The raftlease benchmark as a package; ``scripts/bench`` is its command.

Modules, from the bottom up:

- ``context``: profiles, constants, the result document being built, progress lines,
  and the frozen copy of raftlease a run measures (no raftlease import at load time);
- ``cluster``: node processes from the outside (CPU/RSS from /proc, waits, log alerts);
- ``monitor``: per-node status pollers and the stall analysis of their samples;
- ``measure``: timed load loops (threads, asyncio tasks), repetitions, percentiles;
- ``raw``: the raw-PySyncObj baseline (node process and its parent-side cluster);
- ``certcost``: the in-process parts of the certs group, shared with
  scripts/cert_bench (certified acquire, the state machine with and without the audit
  trail, verification per core);
- ``workloads``: what is measured (throughput, certs, handoff, failover,
  memory/snapshot, tasks, scale);
- ``anchors``: etcd and ZooKeeper clusters measured beside raftlease (``--anchors``);
- ``targets`` (+ ``targets.toml``): the targets a run is judged against, as data;
- ``report``: result JSON -> Markdown (needs no cluster and no raftlease);
- ``runner``: one whole run: order, failure isolation, signals, output files.

Importing this package imports nothing else, so ``benchlib.report`` can render a
saved result without raftlease.
"""
