"""The lease commands: ``raftlease acquire``, ``renew``, ``release``, ``holder`` and
``leases``, each one request to the cluster (blocking, up to ``--timeout``).

Output: lines for people, or JSON with ``-o json`` / ``--json`` (cli/common.py). Exit
codes: 0 done, 1 a definite failure (nothing took effect), 3 an unknown outcome, 2
usage. The lease id (the capability to renew or release) is printed only to the one
who acquired; ``renew`` and ``release`` take it from an argument, ``--lease-id-file``
or ``RAFTLEASE_LEASE_ID``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from ..errors import RaftLeaseError
from ..models import Holder, Lease, LeaseSet
from .common import (
    DURATION,
    TTL,
    client_options,
    connect,
    consistency_option,
    exit_error,
    owner_option,
    run_wait,
    safe,
)


def _lease_dict(lease: Lease) -> dict[str, Any]:
    return {
        "key": lease.key,
        "owner": lease.owner,
        "token": lease.token,
        "ttl": lease.ttl,
        "lease_id": lease.lease_id,
        "valid_for": round(lease.remaining, 3),
        **({"unit_indices": list(lease.unit_indices)} if lease.unit_indices else {}),
    }


def _holder_dict(holder: Holder) -> dict[str, Any]:
    return {
        "key": holder.key,
        "owner": holder.owner,
        "token": holder.token,
        "ttl": holder.ttl,
        "remaining": round(holder.remaining, 3),
        "units": holder.units,
        "value": holder.value,
        **({"unit_indices": list(holder.unit_indices)} if holder.unit_indices else {}),
    }


@click.command()
@click.argument("key")
@owner_option
@click.option("--ttl", type=TTL, required=True, help="Lease time to live (30s, 5m, 1.5).")
@click.option(
    "--wait", type=DURATION, default=0.0, help="Wait in the key's queue up to this long (5m)."
)
@click.option("--capacity", type=int, default=1, show_default=True, help="Shared key's size.")
@click.option("--units", type=int, default=1, show_default=True, help="Units this lease takes.")
@click.option("--value", default=None, help="A value to publish with the lease.")
@click.option(
    "--fairness-key", default=None, help="Its tenant while it waits (fair shares between tenants)."
)
@click.option("--weight", type=int, default=None, help="The tenant's weight on KEY: 1..1000.")
@click.option(
    "--progress-timeout",
    type=DURATION,
    default=None,
    help="End the lease (stalled) when renewals bring no higher --progress for this long.",
)
@client_options
def acquire(
    key: str,
    owner: str,
    ttl: float,
    wait: float,
    capacity: int,
    units: int,
    value: str | None,
    fairness_key: str | None,
    weight: int | None,
    progress_timeout: float | None,
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """Acquire KEY; prints the lease id needed to renew or release it.

    A shared key (a semaphore or pool) takes --capacity and --units; everyone using
    the key must give the same capacity. With --wait, --fairness-key names the
    tenant it waits for: backlogged tenants share the grants by --weight."""
    options: dict[str, Any] = dict(
        owner=owner,
        ttl=ttl,
        wait=wait,
        capacity=capacity,
        units=units,
        value=value,
        fairness_key=fairness_key,
        weight=weight,
        progress_timeout=progress_timeout,
    )
    try:
        with connect(endpoints) as c:
            if wait:
                # Reaching the cluster takes --timeout; the wait in the queue, --wait.
                # SIGINT/SIGTERM withdraw the wait (exit 130/143).
                coro = c.aio.acquire(key, timeout=timeout, **options)
                lease = run_wait(c, coro, f"key {key}", timeout)
            else:
                lease = c.acquire(key, timeout=timeout, **options)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    if as_json:
        click.echo(json.dumps({"ok": True, **_lease_dict(lease)}))
    else:
        click.echo(
            f"acquired {safe(lease.key)} for {safe(lease.owner)}: token {lease.token}, "
            f"ttl {lease.ttl:g} s\n"
            f"lease id: {lease.lease_id}"
            + (f"\nunits: {_units_text(lease.unit_indices)}" if lease.unit_indices else "")
        )


def _units_text(indices: Sequence[int]) -> str:
    return ",".join(str(i) for i in indices)


_lease_id_options = [
    click.argument("lease_id", required=False),
    click.option(
        "--lease-id-file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Read the lease id from this file (an argument is visible to other users in ps).",
    ),
]


def _lease_id(argument: str | None, path: Path | None) -> str:
    """The lease id from the argument, else ``--lease-id-file``, else the environment
    (``RAFTLEASE_LEASE_ID``). Exits with status 2 if none is given."""
    if argument:
        return argument
    if path is not None:
        try:
            text = path.read_text().strip()
        except OSError as exc:
            raise click.UsageError(f"cannot read --lease-id-file {path}: {exc}") from None
        if not text:
            raise click.UsageError(f"--lease-id-file {path} is empty")
        return text
    from_env = os.environ.get("RAFTLEASE_LEASE_ID", "").strip()
    if from_env:
        return from_env
    raise click.UsageError("give the lease id: LEASE_ID, --lease-id-file or RAFTLEASE_LEASE_ID")


def _shell_lease(key: str, lease_id: str) -> Lease:
    return Lease(
        key=key, owner="", token=0, ttl=0.0, lease_id=lease_id, valid_until=0.0, expires_at_ms=0
    )


@click.command()
@click.argument("key")
@_lease_id_options[0]
@_lease_id_options[1]
@click.option(
    "--ttl", type=TTL, default=None, help="New TTL, e.g. 30s (default: keep the lease's)."
)
@click.option(
    "--progress",
    type=float,
    default=None,
    help="A progress figure (higher is further): keeps a --progress-timeout lease.",
)
@client_options
def renew(
    key: str,
    lease_id: str | None,
    lease_id_file: Path | None,
    ttl: float | None,
    progress: float | None,
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """Renew the lease LEASE_ID on KEY (or the id in --lease-id-file, or in
    RAFTLEASE_LEASE_ID)."""
    secret = _lease_id(lease_id, lease_id_file)
    try:
        with connect(endpoints) as c:
            lease = c.renew(_shell_lease(key, secret), ttl=ttl, timeout=timeout, progress=progress)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    if as_json:
        click.echo(
            json.dumps(
                {"ok": True, "key": key, "ttl": lease.ttl, "valid_for": round(lease.remaining, 3)}
            )
        )
    else:
        click.echo(f"renewed {safe(key)}: valid for {lease.remaining:.2f} s")


@click.command()
@click.argument("key")
@_lease_id_options[0]
@_lease_id_options[1]
@client_options
def release(
    key: str,
    lease_id: str | None,
    lease_id_file: Path | None,
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """Release the lease LEASE_ID on KEY (or the id in --lease-id-file, or in
    RAFTLEASE_LEASE_ID)."""
    secret = _lease_id(lease_id, lease_id_file)
    try:
        with connect(endpoints) as c:
            c.release(_shell_lease(key, secret), timeout=timeout)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    click.echo(json.dumps({"ok": True, "key": key}) if as_json else f"released {safe(key)}")


@click.command()
@click.argument("key")
@consistency_option
@client_options
def holder(key: str, consistency: str, endpoints: str, as_json: bool, timeout: float) -> None:
    """Show who holds KEY."""
    try:
        with connect(endpoints) as c:
            read = c.read(key, consistency=consistency, timeout=timeout)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    h = read.holder
    label: dict[str, Any] = {
        "consistency": read.consistency,
        "served_by": read.served_by,
        "applied_index": read.applied_index,
        "age": read.age,
    }
    if read.capacity > 1:
        label.update(capacity=read.capacity, used=read.used)
        label["holders"] = [_holder_dict(item) for item in read.holders]
    if as_json:
        click.echo(json.dumps({"ok": True, "holder": _holder_dict(h) if h else None, **label}))
        return
    if h is None:
        click.echo(f"{safe(key)}: free")
    elif read.capacity > 1:
        click.echo(f"{safe(key)}: {read.used} of {read.capacity} units held")
        for item in read.holders:
            click.echo(
                f"  {safe(item.owner)}: {item.units} unit(s)"
                + (f" [{_units_text(item.unit_indices)}]" if item.unit_indices else "")
                + f", token {item.token}, {item.remaining:.2f} s left"
            )
    else:
        click.echo(
            f"{safe(key)}: held by {safe(h.owner)}, token {h.token}, {h.remaining:.2f} s left"
        )
    if read.consistency == "stale":
        age = "unknown" if read.age is None else f"{read.age:.3f} s"
        click.echo(
            f"(stale read from {read.served_by}: applied index {read.applied_index}, "
            f"may be {age} behind)"
        )


@click.command()
@click.option("--prefix", default="", help="Only keys starting with this.")
@click.option("--limit", default=1000, show_default=True)
@consistency_option
@client_options
def leases(
    prefix: str, limit: int, consistency: str, endpoints: str, as_json: bool, timeout: float
) -> None:
    """List live leases."""
    try:
        with connect(endpoints) as c:
            items = c.leases(prefix, limit=limit, consistency=consistency, timeout=timeout)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    if as_json:
        click.echo(json.dumps({"ok": True, "leases": [_holder_dict(h) for h in items]}))
        return
    if not items:
        click.echo("no leases")
    for h in items:
        click.echo(
            f"{safe(h.key):30} {safe(h.owner):20} token {h.token:<8} {h.remaining:8.2f} s left"
        )


def _set_shell(lease_id: str) -> LeaseSet:
    return LeaseSet(
        lease_id=lease_id, owner="", ttl=0.0, valid_until=0.0, expires_at_ms=0, leases=()
    )


@click.command("acquire-many")
@click.argument("keys", nargs=-1, required=True)
@owner_option
@click.option("--ttl", type=TTL, required=True, help="Time to live of the set (30s, 5m, 1.5).")
@click.option(
    "--wait",
    type=DURATION,
    default=0.0,
    help="Wait, queued on every key, until all are free, up to this long (5m).",
)
@click.option("--capacity", type=int, default=1, show_default=True, help="Every key's size.")
@client_options
def acquire_many(
    keys: tuple[str, ...],
    owner: str,
    ttl: float,
    wait: float,
    capacity: int,
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """Acquire every one of KEYS or none, in one log entry (at most 16); prints the
    set's id, needed to release the set (``release-many``). Without --wait exits 1 at
    once if any key is held; with it, waits until every key is free for the set (exit 1
    when the wait runs out, or DEADLOCK). A KEY written key=N takes N units of a shared
    key of --capacity."""
    wanted: dict[str, int] = {}
    for item in keys:
        name, sep, units = item.rpartition("=")
        name, count = (name, int(units)) if sep and name and units.isdigit() else (item, 1)
        if name in wanted:
            raise click.UsageError(f"key {name!r} is given twice")
        wanted[name] = count
    try:
        with connect(endpoints) as c:
            taken = c.acquire_many(
                wanted,
                owner=owner,
                ttl=ttl,
                wait=wait,
                capacity=capacity,
                timeout=timeout,
            )
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    if as_json:
        leases = [_lease_dict(lease) for lease in taken.leases]
        click.echo(json.dumps({"ok": True, "lease_id": taken.lease_id, "leases": leases}))
    else:
        tokens = ", ".join(f"{safe(lease.key)} token {lease.token}" for lease in taken.leases)
        click.echo(
            f"acquired {len(taken.leases)} keys for {safe(taken.owner)}, ttl {taken.ttl:g} s: "
            f"{tokens}\nlease id: {taken.lease_id}"
        )


@click.command("release-many")
@_lease_id_options[0]
@_lease_id_options[1]
@client_options
def release_many(
    lease_id: str | None,
    lease_id_file: Path | None,
    endpoints: str,
    as_json: bool,
    timeout: float,
) -> None:
    """Release every key of the set LEASE_ID (from ``acquire-many``) in one log entry."""
    secret = _lease_id(lease_id, lease_id_file)
    try:
        with connect(endpoints) as c:
            released = c.release_many(_set_shell(secret), timeout=timeout)
    except RaftLeaseError as exc:
        exit_error(exc, as_json)
    if as_json:
        click.echo(json.dumps({"ok": True, "released": released}))
    else:
        click.echo(f"released {released} keys")
