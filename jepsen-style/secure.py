"""TLS and authentication for the chaos suite (issue 11): ``run.py --secure``.

``make(directory)`` writes, with ``raftlease.testing.certs``, a local CA, the client
port's certificate for 127.0.0.1, one bearer token per harness principal and an auth
file with one role each (files mode 0600, directory 0700):

* ``lease-worker``: read, write on ``k``, ``sem``, ``pool`` (so lease sessions too),
  shape on ``sem`` and ``pool`` (it creates the shared keys), priority up to 10: the
  lease threads and the client process;
* ``queue-worker``: read, write on ``queue:``: queue producers, workers, worker
  processes and the final reads;
* ``resource``: read on ``k``: the fenced resource's ``fence`` calls;
* ``canceller``: read, write on ``x``: the client that waits and gives up
  (``cancel_workload.py``);
* ``many-agent``: read, write, preempt on ``m``, priority up to 5: the agents that take
  sets of keys and ask holders to yield (``many_workload.py``, ``run.py --many on``);
* ``watcher``: read on every key: the watcher's stream of every change
  (``watch_workload.py``; a watch on the prefix ``""`` needs read there);
* ``nemesis``: read, write, admin on every key: status, ``test_clock``, membership.

Where the harness's clients find it: ``install`` puts the path of a JSON file (CA file
and tokens, mode 0600) in the environment variable ``RAFTLEASE_CHAOS_SECURITY``, which
child processes (the client process, queue worker processes) inherit, so no token is
ever on a command line. ``client_options(principal)`` is then what a
``raftlease.Client`` needs (``tls``, ``token``), and ``{}`` when the variable is unset
(``--insecure``): every harness client calls it, so one switch covers them all.

``probe(...)`` is the run's proof that authentication was really on: a request on a
TLS connection that sent no token must be answered ``UNAUTHENTICATED`` and one from the
``resource`` principal asking for admin ``PERMISSION_DENIED``; both are recorded as
``probe`` events and ``check_security`` judges them (a secure run without probes is
``unknown``, a probe answered otherwise is a violation).

Blocking file and socket I/O; thread-safe (``client_options`` reads a file written
before any thread starts, and caches it under a lock).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raftlease.protocol import FrameDecoder, encode_frame
from raftlease.server.auth import token_digest
from raftlease.testing.certs import issue, make_ca

ENV = "RAFTLEASE_CHAOS_SECURITY"

#: principal -> (role's permissions as (prefix, actions) pairs, max_priority).
PRINCIPALS: dict[str, tuple[tuple[tuple[str, tuple[str, ...]], ...], int]] = {
    "lease-worker": (
        (
            # Bare string prefixes (k1..k4, sem1, pool1): permission prefixes match on
            # path boundaries unless they end in * (docs/security.md).
            ("k*", ("read", "write")),
            ("sem*", ("read", "write", "shape")),
            ("pool*", ("read", "write", "shape")),
        ),
        10,
    ),
    "queue-worker": ((("queue:", ("read", "write")),), 0),
    "resource": ((("k*", ("read",)),), 0),
    "canceller": ((("x*", ("read", "write")),), 0),
    # preempt and priority 5: the yield rounds (many_workload.py, request_yield).
    "many-agent": ((("m*", ("read", "write", "preempt")),), 5),
    "watcher": ((("", ("read",)),), 0),
    "nemesis": ((("", ("read", "write", "admin")),), 0),
}

_lock = threading.Lock()
_cache: dict[str, Any] | None = None


def _write(path: Path, data: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(data)
    return path


def _auth_toml(tokens: dict[str, str]) -> str:
    lines = ["# The chaos suite's principals (jepsen-style/secure.py). Tokens as SHA-256."]
    for name, (permissions, max_priority) in PRINCIPALS.items():
        perms = ", ".join(
            f"{{ prefix = {json.dumps(prefix)}, actions = {json.dumps(list(actions))} }}"
            for prefix, actions in permissions
        )
        lines += [f"[roles.{name}]", f"permissions = [{perms}]", f"max_priority = {max_priority}"]
    for name in PRINCIPALS:
        lines += [
            "[[principals]]",
            f'name = "{name}"',
            f'token_sha256 = "{token_digest(tokens[name])}"',
            f'roles = ["{name}"]',
        ]
    return "\n".join(lines) + "\n"


def make(directory: Path) -> tuple[dict[str, str], Path]:
    """Write the CA, the node certificate, the auth file and the clients' file into
    ``directory``. Returns (the nodes' TLS and auth settings, the clients' file)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca = make_ca(directory, "raftlease chaos CA")
    cert, key = issue(ca, directory, "raftlease-node", ("127.0.0.1", "localhost"))
    tokens = {name: secrets.token_urlsafe(32) for name in PRINCIPALS}
    auth = _write(directory / "auth.toml", _auth_toml(tokens))
    clients = _write(
        directory / "clients.json", json.dumps({"ca": str(ca.cert_file), "tokens": tokens})
    )
    settings = {
        "tls_cert_file": str(cert),
        "tls_key_file": str(key),
        "tls_client_ca_file": str(ca.cert_file),
        "auth_file": str(auth),
    }
    return settings, clients


def install(clients_file: Path) -> None:
    """Make every harness client of this process and its children secure."""
    global _cache
    os.environ[ENV] = str(clients_file)
    with _lock:
        _cache = None


def _loaded() -> dict[str, Any] | None:
    global _cache
    path = os.environ.get(ENV)
    if not path:
        return None
    with _lock:
        if _cache is None:
            _cache = json.loads(Path(path).read_text())
        return _cache


def enabled() -> bool:
    return _loaded() is not None


def client_options(principal: str) -> dict[str, Any]:
    """``raftlease.Client`` options for ``principal`` (TLS trusting the run's CA and
    its token), or ``{}`` on an insecure run. Raises ``KeyError`` for an unknown
    principal of a secure run."""
    loaded = _loaded()
    if loaded is None:
        return {}
    return {"tls": loaded["ca"], "token": loaded["tokens"][principal]}


def _context() -> ssl.SSLContext | None:
    loaded = _loaded()
    return None if loaded is None else ssl.create_default_context(cafile=loaded["ca"])


def _exchange(sock: socket.socket, message: dict[str, Any], deadline: float) -> dict[str, Any]:
    sock.sendall(encode_frame(message))
    decoder = FrameDecoder()
    while time.monotonic() < deadline:
        data = sock.recv(65536)
        if not data:
            break
        for frame in decoder.feed(data):
            return dict(frame)
    raise OSError("no answer")


def raw_request(
    addr: str,
    message: dict[str, Any],
    timeout: float = 1.0,
    principal: str | None = "nemesis",
) -> dict[str, Any]:
    """One request to one node on a fresh connection (no redirect, no retry): over TLS
    and after an ``auth`` with ``principal``'s token on a secure run (``principal``
    None: no ``auth``). Raises ``OSError`` (``ssl.SSLError`` is one) when there is no
    answer within ``timeout``; a refused ``auth`` is returned as the answer."""
    host, _, port = addr.rpartition(":")
    deadline = time.monotonic() + timeout
    context = _context()
    with socket.create_connection((host, int(port)), timeout=timeout) as plain:
        plain.settimeout(timeout)
        sock = plain if context is None else context.wrap_socket(plain, server_hostname=host)
        with sock:
            loaded = _loaded()
            if loaded is not None and principal is not None:
                token = loaded["tokens"][principal]
                answer = _exchange(sock, {"id": 0, "op": "auth", "token": token}, deadline)
                if not answer.get("ok"):
                    return answer
            try:
                return _exchange(sock, message, deadline)
            except OSError as exc:
                raise OSError(f"no answer from {addr}: {exc}") from None


#: The probes: (name, principal (None: no token), request, the code it must get).
PROBES: tuple[tuple[str, str | None, dict[str, Any], str], ...] = (
    ("no-token", None, {"id": 1, "op": "holder", "key": "k1"}, "UNAUTHENTICATED"),
    ("read-only-admin", "resource", {"id": 1, "op": "test_clock"}, "PERMISSION_DENIED"),
)


def probe(
    addrs: list[str], emit: Callable[[dict[str, Any]], Any], wait: float = 10.0
) -> list[dict[str, Any]]:
    """Send every probe of ``PROBES`` to a node of ``addrs`` (the first that answers,
    retried until ``wait`` s: a node may be down for a fault) and ``emit`` one
    ``probe`` event each. Blocks; nothing on an insecure run."""
    if not enabled():
        return []
    events: list[dict[str, Any]] = []
    for name, principal, message, expect in PROBES:
        deadline = time.monotonic() + wait
        event: dict[str, Any] = {"type": "probe", "probe": name, "expect": expect}
        while True:
            addr = addrs[len(events) % len(addrs)]
            t = time.monotonic()
            try:
                answer = raw_request(addr, message, 2.0, principal)
            except OSError as exc:
                if time.monotonic() < deadline:
                    addrs = addrs[1:] + addrs[:1]
                    time.sleep(0.2)
                    continue
                event.update(t=t, node=addr, ok=None, code=None, error=str(exc))
                break
            event.update(t=t, node=addr, ok=bool(answer.get("ok")), code=answer.get("code"))
            break
        emit(event)
        events.append(event)
    return events


def check_security(events: list[dict[str, Any]]) -> dict[str, Any]:
    """``True`` on an insecure run (meta ``secure`` false: nothing to judge) or when
    every probe of a secure run got the code it expects and each of ``PROBES`` ran;
    ``False`` when a probe was served or refused otherwise (authentication or
    authorization was not on); ``"unknown"`` when a secure run has no answered probe."""
    meta = next((e for e in events if e.get("type") == "meta"), {})
    probes = [e for e in events if e.get("type") == "probe"]
    stats = {"secure": bool(meta.get("secure")), "probes": len(probes)}
    if not meta.get("secure"):
        return {"valid": True, "violations": [], "violation_count": 0, "stats": stats}
    violations = [
        {"kind": "probe not refused as expected", "event": e}
        for e in probes
        if e.get("ok") is True or (e.get("code") is not None and e.get("code") != e.get("expect"))
    ]
    answered = {e.get("probe") for e in probes if e.get("code") is not None or e.get("ok")}
    missing = [name for name, *_ in PROBES if name not in answered]
    valid: bool | str = False if violations else ("unknown" if missing else True)
    result: dict[str, Any] = {
        "valid": valid,
        "violations": violations[:50],
        "violation_count": len(violations),
        "stats": stats,
    }
    if missing and not violations:
        result["unknown"] = [{"kind": "no answered probe", "probes": missing}]
    return result
