"""The cluster's certificate signing keys (docs/certificates.md), replicated state.

A leader that needs a key (the first request for a lease certificate) or whose key
is older than the rotation period draws a new Ed25519 seed outside the state machine
and proposes a ``certkey`` entry carrying the seed (``secret``), its public key and the id it
expects the key to get (one more than the current). The state machine only stores
them: every node then signs with the same current key, and a resource verifies
with the public keys. An entry whose id is not the next (two leaders' rotations
raced, or the entry was replayed) changes nothing, so concurrent rotations never
make two "current" keys.

Bounded: at most ``MAX_CERT_KEYS`` keys (the current one and the newest retired);
the oldest retired key is dropped first, and certificates it signed stop verifying
(a renewal brings a fresh one). Members already hold every lease id; the seed is as
secret as they are (the journal, snapshots and backups contain it: docs/security.md).

Pure: no I/O, no clock, no randomness (the seed comes in the entry).
"""

from __future__ import annotations

from typing import Any

#: Most signing keys kept (the current one plus the newest retired ones).
MAX_CERT_KEYS = 4

_HEX = frozenset("0123456789abcdef")


def _hex32(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def check_certkey(entry: dict[str, Any]) -> str | None:
    """Why a ``certkey`` entry is malformed, or None."""
    kid = entry.get("kid")
    if isinstance(kid, bool) or not isinstance(kid, int) or not 1 <= kid <= 2**31:
        return "'kid' must be an integer from 1 to 2**31"
    # "secret", not "seed": every entry's "seed" is the proposer's random draw.
    if not _hex32(entry.get("secret")) or not _hex32(entry.get("pub")):
        return "'secret' and 'pub' must be 64 lowercase hex characters"
    return None


#: Operations whose entry may name the holder key a lease is bound to (``holder_key``).
HOLDER_KEY_OPS = frozenset(
    {"acquire", "renew", "transfer", "acquire_many", "task_claim", "task_heartbeat"}
)


def check_holder_key_field(op: str, entry: dict[str, Any]) -> str | None:
    """Why an entry's ``holder_key`` is malformed (not 64 lowercase hex characters, or
    on an operation that takes none), or None (absent or well formed)."""
    if "holder_key" not in entry:
        return None
    if op not in HOLDER_KEY_OPS:
        return f"'holder_key' only goes with {', '.join(sorted(HOLDER_KEY_OPS))}"
    if not _hex32(entry["holder_key"]):
        return "'holder_key' must be 64 lowercase hex characters (an Ed25519 public key)"
    return None


def holder_key_of(entry: dict[str, Any]) -> bytes | None:
    """The 32 raw bytes of a checked entry's ``holder_key``, or None without one."""
    value = entry.get("holder_key")
    return bytes.fromhex(value) if value is not None else None


class CertKeys:
    """The signing keys, oldest first: rows ``[kid, seed hex, public hex, log time
    created]``. The last row is the current key."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []

    def current(self) -> list[Any] | None:
        """The row of the key to sign with, or None before the first ``certkey``."""
        return self.rows[-1] if self.rows else None

    def next_kid(self) -> int:
        return self.rows[-1][0] + 1 if self.rows else 1

    def apply(self, entry: dict[str, Any], now: int) -> dict[str, Any]:
        """A checked ``certkey`` entry: the new current key if ``kid`` is the next
        id, else nothing changes (``rotated`` false)."""
        kid = entry["kid"]
        if kid != self.next_kid():
            return {"ok": True, "rotated": False, "kid": self.next_kid() - 1, "now": now}
        self.rows.append([kid, entry["secret"], entry["pub"], now])
        del self.rows[:-MAX_CERT_KEYS]
        return {"ok": True, "rotated": True, "kid": kid, "now": now}

    def public_keys(self) -> list[list[Any]]:
        """``[kid, public hex]`` of every key kept, oldest first (safe to publish)."""
        return [[row[0], row[2]] for row in self.rows]

    def to_plain(self) -> list[list[Any]]:
        return [list(row) for row in self.rows]

    @classmethod
    def from_plain(cls, rows: Any) -> CertKeys:
        keys = cls()
        keys.rows = [list(row) for row in rows]
        return keys
