"""Hard caps shared by the state machine (which enforces them on every entry) and the
configuration (whose tighter, configurable request limits must sit inside them).
Bottom layer: imports nothing."""

MAX_KEY_BYTES = 4096
MAX_OWNER_BYTES = 4096
MAX_ID_CHARS = 128
#: Most leases one ``leases`` read may return.
MAX_LIST = 100_000
#: Longest TTL the state machine accepts (one year, in milliseconds).
MAX_TTL_MS = 365 * 24 * 3600 * 1000
#: Largest capacity of a shared key (semaphore slots, pool units, rwlock readers).
MAX_CAPACITY = 1_000_000
#: Largest value a lease may carry (an election candidate's address, say).
MAX_VALUE_BYTES = 4096
#: How far ahead of the revision a leader reserves fencing tokens, through the log
#: (docs/design.md, "Fencing tokens never repeat"). Tokens jump by about this much
#: at each leader change.
TOKEN_RESERVE_STEP = 1 << 24
#: Most leases and queued acquires one lease session may carry (a keep-alive renews
#: every attached lease in one entry).
MAX_SESSION_LEASES = 10_000
#: Audit records every node keeps (core/audit.py, docs/audit.md): the newest; older
#: ones fold into the hash chain's base. About 410 bytes each with its chain value
#: (tests/unit/test_core_memory.py: 4.1 MB full, with a key string of its own each).
MAX_AUDIT_RECORDS = 10_000
#: Refusal records every node keeps (``NOT_OWNER``, ``STALE_ATTEMPT``,
#: ``PERMISSION_DENIED`` decided by the state machine; docs/audit.md "Refusals"), in a
#: ring of their own so a flood of refused requests never evicts ownership history:
#: the newest are kept, about 410 bytes each (0.4 MB full).
MAX_AUDIT_REFUSALS = 1_000
#: Most keys one ``acquire_many`` takes at once: its grant is one log entry with one
#: revision per key, and its refusal names every busy key, so both stay small.
MAX_MANY_KEYS = 16
#: Most lease sessions one ``session_keepalive_many`` keeps alive: an answer of about
#: 120 bytes each (about 30 KiB in all, more for sessions asked to yield attached
#: leases) stays far below the frame limit, and one request's work on the leader's
#: event loop stays in the milliseconds (its sessions' attached leases are walked).
MAX_KEEPALIVE_SESSIONS = 256
#: Leased task queues (core/queue.py): the largest payload and result (UTF-8 bytes of
#: the JSON text the clients send), far below PySyncObj's 64 KiB ``transmission``
#: threshold (docs/pysyncobj.md trap 5); the longest error text one failure records;
#: the longest queue name (its watch keys are ``queue:<name>/<task id>``); the most
#: attempts a task may be given; the longest delay, deadline, retry-after and
#: retention (30 days); the most ``requires``/capability items and the size of one.
MAX_TASK_PAYLOAD_BYTES = 16 * 1024
MAX_TASK_RESULT_BYTES = 16 * 1024
MAX_TASK_ERROR_BYTES = 2048
MAX_QUEUE_NAME_BYTES = 256
MAX_TASK_ATTEMPTS = 100
MAX_TASK_DELAY_MS = 30 * 24 * 3600 * 1000
MAX_TASK_BACKOFF_MS = 300_000
MAX_TASK_REQUIRES = 16
MAX_TASK_CAPABILITIES = 64
MAX_TASK_CAP_BYTES = 128
MAX_TASK_DEDUP_BYTES = 512
#: Task checkpoints (docs/queues.md, "Checkpoints"): the most bytes one heartbeat's
#: ``checkpoint`` may carry, and their base64 text on the wire and in the log (JSON
#: and HTTP carry no bytes). Only the latest checkpoint of a task is kept.
MAX_TASK_CHECKPOINT_BYTES = 8 * 1024
MAX_TASK_CHECKPOINT_TEXT = 4 * ((MAX_TASK_CHECKPOINT_BYTES + 2) // 3)
#: The effect journal of a task (docs/queues.md, "Effects"): the most effects one task
#: records (a ``task_effect_begin`` of a new one beyond it is ``QUOTA_EXCEEDED``), the
#: longest effect id and idempotency key, and the largest result one commit keeps
#: (JSON text): at most 32 * ~1.6 KB per task, in every replica and snapshot.
MAX_TASK_EFFECTS = 32
MAX_EFFECT_ID_BYTES = 256
MAX_EFFECT_KEY_BYTES = 256
MAX_EFFECT_RESULT_BYTES = 1024
#: The effect journal of plain leases (core/lease_effects.py, docs/design.md §4h): one
#: journal per lease KEY, for its successive holders. The most effects one key records
#: (``MAX_KEY_EFFECTS``) and all keys together (``MAX_LEASE_EFFECTS``): a begin of a
#: new effect beyond either is ``QUOTA_EXCEEDED`` (at most 20,000 * ~1.6 KB = 32 MB in
#: every replica and snapshot, ~4 MB with short ids and results). A key's journal is
#: kept while the key is held, and dropped ``LEASE_EFFECT_RETENTION_MS`` of log time
#: (one hour) after its last lease ended unless it is held again by then.
MAX_KEY_EFFECTS = 32
MAX_LEASE_EFFECTS = 20_000
LEASE_EFFECT_RETENTION_MS = 3600 * 1000
#: Task dependencies (docs/queues.md, "Dependencies"): the most parents one put may
#: name (``after``); a child's claim carries their results (at most 16 x 16 KiB).
MAX_TASK_PARENTS = 16
#: Weighted fair shares (docs/queues.md, "Fair shares"): the longest fairness key (a
#: tenant's name), the largest weight (a weight is 1..this), and the most tenants
#: (distinct fairness keys with open tasks, the default one included) one queue holds:
#: a put that would add one more is refused ``QUOTA_EXCEEDED``.
MAX_FAIRNESS_KEY_BYTES = 128
MAX_FAIRNESS_WEIGHT = 1000
MAX_QUEUE_TENANTS = 1000
#: Tasks one queue may hold (ready, delayed, claimed or dead; completed ones are
#: bounded by their retention and by ``DEFAULT_COMPLETED_TASKS`` instead): the quota
#: the node sends with each put.
DEFAULT_QUEUE_TASKS = 250_000
#: Completed tasks the cluster retains, across all queues (``max_completed_tasks``):
#: the bound the leader stamps into each completion; a completion entry without the
#: stamp (written before the bound existed) uses this one.
DEFAULT_COMPLETED_TASKS = 50_000
#: Tasks one authenticated principal may hold that are not completed (ready, delayed,
#: claimed or dead; ``max_tasks_per_principal``), and queues it may hold them in
#: (``max_queues_per_principal``): the defaults of the quotas the leader stamps into
#: an authenticated put. A put without the stamps (unauthenticated, or written
#: before the quotas existed) is not limited by them.
DEFAULT_PRINCIPAL_TASKS = 10_000
DEFAULT_PRINCIPAL_QUEUES = 1_000
#: Most tasks one dead-letter read returns.
MAX_DEAD_LIST = 10_000
#: Shared budgets (core/budget.py, docs/budgets.md): the largest capacity, amount and
#: settled cost (whole units); the fastest refill (units per second); the most
#: budgets a cluster holds; the most waiting spends plus open reservations one budget
#: holds; how long (log-time ms) a granted or ended wait's outcome is kept for its
#: client's long-poll.
MAX_BUDGET_AMOUNT = 10**12
MAX_BUDGET_REFILL = 10**9
MAX_BUDGETS = 10_000
MAX_BUDGET_PENDING = 10_000
BUDGET_OUTCOME_MS = 60_000
#: Deadlock detection (core/deadlock.py, docs/design.md §4e): the most waits-for edges
#: (a queued acquire and one holder of its key) one search examines. An entry runs one
#: search per acquire that queues and one per grant on a key others wait for, so the
#: detector costs at most this much per such event; a cycle that a search cannot reach
#: within it is not detected (its waiters leave at their wait deadline, as before).
MAX_DEADLOCK_SEARCH = 4096
#: Queued acquires refused ``DEADLOCK`` after they queued (a grant closed the cycle)
#: whose outcome the cluster keeps for their long-poll (until their wait deadline, at
#: most this many: the oldest is forgotten first; its client then sees it gone).
MAX_DEADLOCK_REFUSALS = 1024
