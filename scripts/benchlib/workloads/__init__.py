"""What the benchmark measures, one module per kind of workload:

- ``throughput``: the raw PySyncObj ceiling, then acquire, renew, release and holder
  reads, each with 1 thread, N threads on one Client, and an AsyncClient;
- ``durability``: acquire and renew again, on one cluster per durability mode
  ("fsync", "none"), with a probe of the storage's sync latency;
- ``certs``: what lease certificates and the audit trail cost (issue 39): 1-thread
  acquire without and with a holder key in alternating rounds, the state machine with
  and without the trail, an audit-off test build against the default, verification
  per core;
- ``handoff``: contended handoff of one lock between N clients, with fairness;
- ``failover``: SIGKILL of the leader while a client loops acquire/release;
- ``memory``: RSS with many live leases, then the snapshot stall on that cluster;
- ``tasks``: task queues (issue 12): put, claim, complete and end-to-end tasks/s with
  1 and N threads, then RSS with many queued tasks;
- ``scale``: many agents with a lease session each (issue 16), kept alive every ttl/3
  by a few agent processes: ramp, hold, keep-alive latency, sessions lost, RSS.

Each workload function takes the run's ``Context`` (and the cluster it runs on),
blocks until it is done, and records its entries in the result.
"""
