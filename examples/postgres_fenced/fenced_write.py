"""A Postgres table as the resource a lease protects: the writer's lease certificate
and proof of possession are checked first (offline, ``raftlease.verify``), then the
write is one conditional UPDATE that carries the certificate's fencing token, so the
database itself refuses a write older than one it already took (docs/certificates.md).

    CREATE TABLE fenced_resource (
        key   text PRIMARY KEY,
        token bigint NOT NULL DEFAULT 0,   -- the highest fencing token written
        value bytea
    );
    UPDATE fenced_resource SET value = $3, token = $2
     WHERE key = $1 AND token <= $2;       -- 0 rows: a newer holder already wrote

Why both: the certificate check says the writer is the lease's holder now (a thief
with a copied certificate, an expired lease, a replayed request are refused); the
``token <= $2`` condition orders holders across every process that writes to the
table. A released or paused holder's certificate stays valid until its ``not_after``
(a release does not revoke it), and each service replica's verifier remembers only the
tokens it saw itself: the row's token is the fence they all share.

    python3 examples/postgres_fenced/fenced_write.py --dsn "host=/tmp/pg dbname=postgres" \\
        --endpoints 127.0.0.1:7101 --key gpu-0

runs one holder's write end to end (psycopg 3 from PyPI: ``pip install "psycopg[binary]"``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

from raftlease.recipes.verified import write_message
from raftlease.verify import Accepted, Verifier, load_keys

SCHEMA = """
CREATE TABLE IF NOT EXISTS fenced_resource (
    key   text PRIMARY KEY,
    token bigint NOT NULL DEFAULT 0,
    value bytea
)
"""

#: Makes the row on the first write to a key (token 0: any holder may write).
ENSURE_ROW = "INSERT INTO fenced_resource (key) VALUES (%(key)s) ON CONFLICT (key) DO NOTHING"

#: The fenced write: $1 key, $2 the certificate's token, $3 the value (psycopg sends
#: the parameters separately, as $1..$3 of a prepared statement: never in the text).
FENCED_UPDATE = (
    "UPDATE fenced_resource SET value = %(value)s, token = %(token)s"
    " WHERE key = %(key)s AND token <= %(token)s"
)


def fenced_write(
    conn: Any,
    verifier: Verifier,
    key: str,
    value: bytes,
    certificate: str,
    proof: str,
    challenge: bytes,
) -> tuple[Accepted, int]:
    """Check the certificate and proof for ``key`` (the proof covers ``key``, NUL,
    ``value``: ``raftlease.recipes.verified.write_message``), then write ``value``
    only if the row's token is not above the certificate's. Returns the accepted
    certificate and the rows changed: 1 written, 0 refused by the fence (a newer
    holder wrote first). Raises ``raftlease.verify.CertificateError`` (nothing
    written) or psycopg's errors. Blocks on the database; ``conn`` is a
    ``psycopg.Connection`` used by one thread at a time."""
    accepted = verifier.check(certificate, proof, challenge, write_message(key, value), key=key)
    params = {"key": key, "token": accepted.certificate.token, "value": value}
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(ENSURE_ROW, params)
        cur.execute(FENCED_UPDATE, params)
        changed: int = cur.rowcount
    return accepted, changed


def main() -> None:
    import psycopg

    from raftlease import Client
    from raftlease.verify import HolderKey

    parser = argparse.ArgumentParser(description="one fenced write to a Postgres table")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--endpoints", default="127.0.0.1:7101")
    parser.add_argument("--key", default="gpu-0")
    args = parser.parse_args()
    holder = HolderKey()  # the agent's own key pair: the private half stays here
    with Client(args.endpoints) as client, psycopg.connect(args.dsn) as conn:
        lease = client.acquire(args.key, ttl=30, holder_key=holder)
        # The resource is given the cluster's public keys once (`raftlease cert-keys`).
        keys = subprocess.run(
            [sys.executable, "-m", "raftlease", "cert-keys", "--endpoints", args.endpoints],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        conn.execute(SCHEMA)
        verifier = Verifier(load_keys(keys))
        challenge = verifier.challenge()
        value = b"written by the holder"
        proof = lease.prove(challenge, write_message(args.key, value))
        _, changed = fenced_write(
            conn, verifier, args.key, value, lease.certificate, proof, challenge
        )
        print(f"token {lease.token}: {changed} row(s) changed")
        client.release(lease)


if __name__ == "__main__":
    main()
