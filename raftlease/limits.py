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
