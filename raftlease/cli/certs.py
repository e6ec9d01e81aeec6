"""``raftlease certs``: a cluster CA and its certificates for those without a PKI
(as Consul's ``consul tls ca create`` / ``consul tls cert create``), with
``cryptography``'s x509 builder (pki.py; no openssl command needed).

    raftlease certs init --dir certs                       # ca.pem, ca.key
    raftlease certs node n1 --dir certs --host 10.0.0.11   # n1.pem, n1.key
    raftlease certs client agent-7 --dir certs --role agent --auth-file auth.toml
    raftlease certs revoke certs/n3.pem --dir certs        # certs/crl.pem
    raftlease certs show certs/n1.pem

Everything is local file work (blocking); nothing talks to a cluster. Exit status 2
for a usage error, a file that would be overwritten without ``--force``, or a file
that is not what it should be (the message says which and why).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from .. import pki
from ..errors import ConfigError
from .common import output_options, safe


def _dir_option(func: Any) -> Any:
    return click.option(
        "--dir",
        "directory",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("."),
        show_default=True,
        envvar="RAFTLEASE_CERTS_DIR",
        help="The CA's folder (ca.pem, ca.key); env RAFTLEASE_CERTS_DIR.",
    )(func)


def _days_option(default: int) -> Callable[[Any], Any]:
    return click.option(
        "--days",
        type=click.IntRange(1, 36500),
        default=default,
        show_default=True,
        help="Validity in days.",
    )


def _out_option(func: Any) -> Any:
    return click.option(
        "--out",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Where to write the certificate and key (default: the CA's folder).",
    )(func)


_force_option = click.option(
    "--force", is_flag=True, help="Replace files that exist (otherwise they are kept)."
)


def _die(message: str) -> NoReturn:
    click.echo(f"error: {safe(message)}", err=True)
    sys.exit(2)


def _load_ca(directory: Path) -> pki.Authority:
    try:
        return pki.load_ca(directory)
    except ConfigError as exc:
        _die(exc.message)


@click.group()
def certs() -> None:
    """Make the cluster's CA, member and client certificates, and revoke them
    (docs/deployment.md). Keep ca.key off the nodes."""


@certs.command("init")
@_dir_option
@click.option("--name", default="raftlease cluster CA", show_default=True, help="The CA's name.")
@_days_option(pki.CA_DAYS)
@_force_option
def certs_init(directory: Path, name: str, days: int, force: bool) -> None:
    """Make a new cluster CA: DIR/ca.pem (give it to every member and client),
    DIR/ca.key (mode 0600; it signs certificates: keep it on the machine that issues
    them, not on the nodes) and DIR/crl.pem (its revocation list, empty for now:
    give it to every member as peer_crl_file)."""
    try:
        ca = pki.make_ca(directory, name, days, force=force)
    except (FileExistsError, ConfigError) as exc:
        _die(exc.message if isinstance(exc, ConfigError) else str(exc))
    click.echo(f"CA certificate: {ca.cert_file}")
    click.echo(f"CA key:         {ca.key_file} (keep it private; not needed on the nodes)")
    click.echo(f"revocation list: {ca.cert_file.with_name(pki.CRL)} (empty; peer_crl_file)")


@certs.command("node")
@click.argument("node_id")
@_dir_option
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="A DNS name or IP address the node is reached at (repeat); lets the same "
    "certificate serve the client port.",
)
@_days_option(pki.CERT_DAYS)
@_out_option
@_force_option
def certs_node(
    node_id: str, directory: Path, hosts: tuple[str, ...], days: int, out: Path | None, force: bool
) -> None:
    """Issue member NODE_ID's certificate (it names the member:
    urn:raftlease:member:NODE_ID) and key: OUT/NODE_ID.pem and OUT/NODE_ID.key.
    Use them as peer_cert_file and peer_key_file (and, with --host, as tls_cert_file
    and tls_key_file of the client port)."""
    ca = _load_ca(directory)
    try:
        cert, key = pki.issue(
            ca, out or directory, node_id, hosts=hosts, member=True, days=days, force=force
        )
    except (FileExistsError, ConfigError) as exc:
        _die(exc.message if isinstance(exc, ConfigError) else str(exc))
    click.echo(f"member {node_id}: {cert} and {key}")
    if not hosts:
        click.echo(
            "note: no --host given: fine for peers (they check the member name), but the "
            "certificate cannot serve the client port to clients that check host names",
            err=True,
        )


@certs.command("client")
@click.argument("name")
@_dir_option
@click.option(
    "--role",
    "roles",
    multiple=True,
    help="A role of the auth file to give the principal NAME (repeat); with "
    "--auth-file it is added there, else the lines to add are printed.",
)
@click.option(
    "--auth-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The cluster's auth file to add the principal to (it must define the roles).",
)
@_days_option(pki.CERT_DAYS)
@_out_option
@_force_option
def certs_client(
    name: str,
    directory: Path,
    roles: tuple[str, ...],
    auth_file: Path | None,
    days: int,
    out: Path | None,
    force: bool,
) -> None:
    """Issue a client certificate for principal NAME (its common name; client use
    only, never a member's): OUT/NAME.pem and OUT/NAME.key. A node with
    tls_client_ca_file = this CA takes a connection that presents it as NAME, with
    the roles the auth file gives NAME."""
    if auth_file is not None and not roles:
        _die("--auth-file needs at least one --role to give the principal")
    ca = _load_ca(directory)
    if auth_file is not None:
        text = _with_principal(auth_file, name, roles)  # checked before anything is written
    try:
        cert, key = pki.issue(ca, out or directory, name, client=True, days=days, force=force)
    except (FileExistsError, ConfigError) as exc:
        _die(exc.message if isinstance(exc, ConfigError) else str(exc))
    click.echo(f"client {name}: {cert} and {key}")
    entry = _principal_entry(name, roles)
    if auth_file is not None:
        pki.write_file(auth_file, text.encode(), _mode(auth_file))
        click.echo(f"added principal {name} with roles {', '.join(roles)} to {auth_file}")
        click.echo("reload the nodes (SIGHUP, or `raftlease reload`) to apply it")
    elif roles:
        click.echo("add this to the cluster's auth file, then reload the nodes:\n" + entry)


def _principal_entry(name: str, roles: tuple[str, ...]) -> str:
    role_list = ", ".join(json.dumps(r) for r in roles)
    return f"\n[[principals]]\nname = {json.dumps(name)}\nroles = [{role_list}]\n"


def _mode(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return 0o600


def _with_principal(auth_file: Path, name: str, roles: tuple[str, ...]) -> str:
    """The auth file's text with principal ``name`` added (certificate only, no
    token), checked by the node's own loader; exits 2 if the file is unusable, names
    the principal already or lacks a role."""
    # Here, not at the top: importing raftlease.server loads the whole server stack.
    from ..server.auth import load_auth

    try:
        text = auth_file.read_text()
    except OSError as exc:
        _die(f"cannot read {auth_file}: {exc.strerror}")
    try:
        policy = load_auth(auth_file)
    except ConfigError as exc:
        _die(exc.message)
    if name in policy.principals:
        _die(f"{auth_file} already has a principal {name!r}: edit it there")
    new = text.rstrip("\n") + "\n" + _principal_entry(name, roles)
    probe = auth_file.with_name(f".{auth_file.name}.{os.getpid()}.check")
    try:
        pki.write_file(probe, new.encode(), 0o600)
        load_auth(probe)
    except ConfigError as exc:
        _die(f"the principal cannot be added: {exc.message}")
    finally:
        probe.unlink(missing_ok=True)
    return new


@certs.command("revoke")
@click.argument(
    "cert_files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path)
)
@_dir_option
@click.option(
    "--crl",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The revocation list to add them to (default: DIR/crl.pem; made if missing).",
)
def certs_revoke(cert_files: tuple[Path, ...], directory: Path, crl: Path | None) -> None:
    """Revoke certificates of this CA: add them to its revocation list. Copy the list
    to every member as peer_crl_file and reload them (SIGHUP): a member whose
    certificate is on it is cut off at once and refused from then on."""
    ca = _load_ca(directory)
    found = []
    for path in cert_files:
        try:
            found.append(pki.load_certificates(path)[0])
        except ConfigError as exc:
            _die(exc.message)
    target = crl or directory / pki.CRL
    try:
        count = pki.revoke(ca, found, target)
    except ConfigError as exc:
        _die(exc.message)
    for cert in found:
        click.echo(f"revoked {pki.describe_subject(cert)} (serial {cert.serial_number:x})")
    click.echo(
        f"{target}: {count} revoked; copy it to every member (peer_crl_file) and reload them"
    )


@certs.command("show")
@click.argument("cert_file", type=click.Path(dir_okay=False, path_type=Path))
@output_options
def certs_show(cert_file: Path, as_json: bool) -> None:
    """What a certificate says: subject, issuer, validity, the member it names, its
    host names and uses, its SHA-256 fingerprint."""
    try:
        certs_found = pki.load_certificates(cert_file)
    except ConfigError as exc:
        _die(exc.message)
    described = [pki.describe(c) for c in certs_found]
    if as_json:
        click.echo(json.dumps(described if len(described) > 1 else described[0], indent=2))
        return
    for info in described:
        for key, value in info.items():
            if isinstance(value, list):
                value = ", ".join(value) or "-"
            click.echo(f"{key:11} {safe(value)}")
        click.echo("")
