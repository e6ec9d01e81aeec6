"""The effect journal on plain leases (issue 41; core/lease_effects.py, docs/design.md
§4h): begin an external effect under a held lease, commit it after. Fenced by the key's
current live lease, like renew and release (``key_write`` on the key)."""

from __future__ import annotations

from ..limits import MAX_EFFECT_ID_BYTES, MAX_EFFECT_KEY_BYTES, MAX_EFFECT_RESULT_BYTES
from .schema import KEY, LEASE_ID, LEASES, Field, Operation, operation, result

EFFECT_ID = Field(
    "effect",
    "string",
    "the effect's id, unique within the key's journal",
    required=True,
    high=MAX_EFFECT_ID_BYTES,
)

LEASE_EFFECT_OPS: tuple[Operation, ...] = (
    operation(
        "lease_effect_begin",
        True,
        "key_write",
        "record the intent of an external effect under a held lease before making it; or "
        "learn that an earlier holder of the key committed it, or began it (reconcile)",
        (
            KEY,
            LEASE_ID,
            EFFECT_ID,
            Field(
                "idempotency_key",
                "string",
                "the idempotency key to hand the provider (default: key:effect id); the "
                "first intent's is kept",
                arg="ikey",
                high=MAX_EFFECT_KEY_BYTES,
            ),
        ),
        (
            result("state", "string", "new (make the call), committed (skip it: result) "
                   "or in_progress (an earlier holder began it: reconcile)", True),
            result("effect", "string", "the effect's id", True),
            result("key", "string", "the idempotency key", True),
            result("token", "integer", "the token that holds (or committed) the intent",
                   True),
            result("result", ("string", "null"), "the committed result (committed)"),
            result("prior_token", "integer", "the earlier holder's token (in_progress)"),
        ),
        (("POST", "/v1/leases/effect/begin", "Begin an external effect under a lease",
          LEASES),),
    ),
    operation(
        "lease_effect_commit",
        True,
        "key_write",
        "mark an effect this lease began (or took over) as done, with its result",
        (
            KEY,
            LEASE_ID,
            EFFECT_ID,
            Field("result", "text", "its result (JSON text)", high=MAX_EFFECT_RESULT_BYTES),
        ),
        (
            result("effect", "string", "the effect's id", True),
            result("already", "boolean", "true: it was committed before (result kept)", True),
            result("token", "integer", "the token that committed it", True),
            result("result", ("string", "null"), "the kept result", True),
        ),
        (("POST", "/v1/leases/effect/commit", "Commit an external effect under a lease",
          LEASES),),
    ),
)  # fmt: skip
