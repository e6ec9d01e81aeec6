"""The Postgres example (examples/postgres_fenced, issue 39) with certificates from a
real cluster and a throwaway Postgres server: after the certificate is verified, the
write is ``UPDATE ... WHERE key = $1 AND token <= $2``; a released holder whose
certificate is still valid writes through a service replica that never saw the newer
token, its verifier accepts, and the database changes 0 rows; the holder's write
changes 1. Skipped, with the reason, when no Postgres binaries are installed
(``apt-get install postgresql``)."""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from raftlease.recipes.verified import write_message
from raftlease.testing import LocalCluster, free_port_block
from raftlease.verify import CertificateError, HolderKey, Verifier

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "postgres_fenced" / "fenced_write.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fenced_write", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def postgres_bindir() -> Path | None:
    """A directory with initdb, pg_ctl and postgres: Debian's (newest first), else PATH."""
    found = shutil.which("initdb")
    for candidate in [
        *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True),
        *([os.path.dirname(os.path.realpath(found))] if found else []),
    ]:
        if all(os.access(os.path.join(candidate, b), os.X_OK) for b in ("initdb", "pg_ctl")):
            return Path(candidate)
    return None


@pytest.fixture
def postgres() -> Iterator[str]:
    """A throwaway server: initdb in a temporary directory, listening only on a unix
    socket there (its name from a port of this worker's slice), stopped and removed at
    the end. Postgres refuses to run as root: as root, it runs as the ``postgres``
    user (Debian's package makes it), else ``nobody``. Yields a libpq DSN."""
    bindir = postgres_bindir()
    if bindir is None:
        why = "no Postgres binaries (initdb, pg_ctl): apt-get install postgresql"
        if os.environ.get("CI") == "true":  # scripts/test installs it: missing is a failure
            pytest.fail(why)
        pytest.skip(why)
    as_user: dict[str, Any] = {}
    root = Path(tempfile.mkdtemp(prefix="raftlease-pg-"))
    if os.geteuid() == 0:
        name = "postgres" if _user_exists("postgres") else "nobody"
        entry = pwd.getpwnam(name)
        os.chown(root, entry.pw_uid, entry.pw_gid)
        as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    data = root / "data"
    port = free_port_block(1)
    started = False
    try:
        run = [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"]
        subprocess.run([*run, "-E", "UTF8", "--no-sync"], capture_output=True, check=True,
                       timeout=60, cwd=root, **as_user)  # fmt: skip
        options = f"-c listen_addresses='' -p {port} -k {root} -c fsync=off"
        out = subprocess.run(
            [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-o", options,
             "-w", "-t", "30", "start"],
            capture_output=True, text=True, timeout=60, cwd=root, **as_user,
        )  # fmt: skip
        started = out.returncode == 0
        assert started, out.stdout + out.stderr + _read(root / "log")
        yield f"host={root} port={port} user=postgres dbname=postgres"
    finally:
        if started:
            subprocess.run(
                [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True, timeout=60, cwd=root, **as_user,
            )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def cluster_keys(cluster: LocalCluster) -> dict[int, str]:
    with cluster.client() as c:
        statuses = [s for s in c.cluster_status() if s.get("reachable") and "cert_keys" in s]
    statuses.sort(key=lambda s: s.get("role") != "leader")
    return {int(kid): str(pub) for kid, pub in statuses[0]["cert_keys"]}


def test_a_stale_token_changes_no_row_and_the_holder_writes_one(
    shared: LocalCluster, postgres: str
) -> None:
    psycopg = pytest.importorskip("psycopg")
    fenced = load_example()
    key = "pg-fenced/gpu-0"

    def row(conn: Any) -> tuple[int, bytes]:
        found = conn.execute(
            "SELECT token, value FROM fenced_resource WHERE key = %s", (key,)
        ).fetchone()
        return int(found[0]), bytes(found[1])

    def write(conn: Any, verifier: Verifier, lease: Any, value: bytes) -> int:
        challenge = verifier.challenge()
        proof = lease.prove(challenge, write_message(key, value))
        _, changed = fenced.fenced_write(
            conn, verifier, key, value, lease.certificate, proof, challenge
        )
        return int(changed)

    with psycopg.connect(postgres, autocommit=True) as conn, shared.client() as c:
        conn.execute(fenced.SCHEMA)
        old = c.acquire(key, owner="old", ttl=30.0, holder_key=HolderKey())
        keys = cluster_keys(shared)
        # Two replicas of the service, one table: each verifier knows only the tokens
        # it accepted itself.
        replica_a, replica_b = Verifier(keys), Verifier(keys)
        assert write(conn, replica_a, old, b"old-1") == 1
        assert row(conn) == (old.token, b"old-1")

        c.release(old)  # its certificate stays valid until not_after: not revoked
        new = c.acquire(key, owner="new", ttl=30.0, holder_key=HolderKey())
        assert new.token > old.token
        assert write(conn, replica_a, new, b"new-1") == 1
        # Replica B never saw the new token: its verifier accepts the old holder, the
        # database's fence does not.
        assert write(conn, replica_b, old, b"old-late") == 0
        assert row(conn) == (new.token, b"new-1")

        # A thief with a copy of the holder's certificate: refused before SQL.
        challenge = replica_b.challenge()
        stolen = HolderKey().prove(new.certificate, challenge, write_message(key, b"x"))
        with pytest.raises(CertificateError) as refused:
            fenced.fenced_write(conn, replica_b, key, b"x", new.certificate, stolen, challenge)
        assert refused.value.code == "BAD_PROOF"
        # The holder again, through either replica (its own token: token <= token).
        assert write(conn, replica_b, new, b"new-2") == 1
        assert row(conn) == (new.token, b"new-2")
        c.release(new)

    # The example's own command line: one holder's write end to end.
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "--dsn", postgres, "--key", "pg-fenced/cli",
         "--endpoints", ",".join(shared.endpoints)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith(": 1 row(s) changed"), out.stdout
