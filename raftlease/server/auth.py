"""Who a client is and what it may do (docs/security.md, "Clients").

The auth file (``auth_file`` in the node's config, TOML) names roles and principals:

    [roles.agent]
    max_priority = 10                      # highest wait-queue priority it may ask for
    permissions = [{ prefix = "gpu/", actions = ["read", "write"] }]

    [roles.ops]
    permissions = [{ prefix = "", actions = ["read", "write", "admin"] }]

    [[principals]]
    name = "agent-7"
    token_sha256 = "<sha256 hex of the bearer token>"   # never the token itself
    roles = ["agent"]

    [[principals]]
    name = "node-exporter"                 # a client certificate whose CN is this name
    roles = ["ops"]

A connection authenticates with an ``auth`` request carrying a bearer token (compared
by hash, in constant time), or by a client certificate the node's CA signed (its
common name is the principal's name). Actions: ``read`` (holder, leases, fence, watch,
await_lease, waiters; ``sessions`` needs read on the prefix ""), ``write`` (acquire,
renew, release, transfer, proclaim; lease sessions need write on some prefix),
``admin`` (``revoke`` on the key's prefix; ``snapshot``, the membership operations and
control operations on the whole key space), ``shape`` (with ``write``: be the first to
acquire a shared key, fixing its capacity; ``admin`` implies it; decided in the state
machine from a flag the leader stamps, since only it knows whether the key has a shape),
``preempt`` (``request_yield``: ask the key's holders granted below the asker's priority
to yield by a deadline; ``admin`` implies it and asks every holder).
A prefix operation (``leases``, ``watch``) needs the permission on a prefix that
contains the one asked.

Prefixes match on path boundaries (issue 37), not as bare strings: a permission's
prefix grants the keys (and prefixes) equal to it or continuing it after a separator
(``/`` or ``:``); a prefix that itself ends in a separator (``gpu/``, ``queue:``) grants
everything under it, and ``""`` everything. So ``queue:sec`` grants the queue ``sec``
(and ``sec/...``), never ``secrets-payroll``, and ``team-a`` never ``team-ab``. A bare
string prefix must be asked for: a trailing ``*`` (``k*`` grants ``k1`` and ``kz``).

Shapes can be pinned (docs/security.md, "Pinned shapes"): ``[[shapes]]`` with a
``key`` (that key only) or a ``prefix`` (every key under it) and a ``capacity``. An
acquire of a pinned key with another capacity is refused ``CAPACITY_MISMATCH`` by the
leader before it is proposed, and the pinned capacity needs no ``shape`` permission.
An exact key wins over any prefix, and a longer prefix over a shorter one:

    [[shapes]]
    prefix = "gpu/pools/a100/"
    capacity = 8

Pure apart from ``load_auth`` (reads the file). Event loop only.
"""

from __future__ import annotations

import hashlib
import hmac
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, PermissionDeniedError, UnauthenticatedError
from ..limits import MAX_BUDGET_AMOUNT, MAX_CAPACITY, MAX_KEY_BYTES
from ..operations import BY_NAME
from ..protocol import Request

ACTIONS = frozenset({"read", "write", "admin", "shape", "preempt"})
#: Task queues (docs/queues.md): read or write on the key ``queue:<name>`` (so a
#: prefix ``queue:rollouts`` grants one queue, ``queue:`` every queue). Which
#: operation needs which permission is in the operations table (``operations.TABLE``).
QUEUE_KEY_PREFIX = "queue:"
#: A budget's operations need the permission on ``budget:<key>`` (docs/budgets.md): a
#: budget and a lease of the same key are different things, granted separately.
BUDGET_KEY_PREFIX = "budget:"
#: What ``status`` answers a caller without ``admin`` when there is an auth file: the
#: fields a client needs to find the leader and a probe to see health (the status
#: operation's required results in the operations table). The rest (peers and their
#: certificates, connections, sessions, the log) needs ``admin``, on every status
#: surface: native ``status``, ``/v1/status`` and the admin endpoint's ``/status``.
STATUS_OPEN_FIELDS = frozenset(r.name for r in BY_NAME["status"].results if r.always)
#: The characters that end a path segment of a key (``prefix_grants``).
SEPARATORS = "/:"


def prefix_covers_query(prefix: str, query: str) -> bool:
    """Whether a permission on ``prefix`` covers EVERY key a ``leases``/``watch`` query
    for the string prefix ``query`` can return. Such a query matches keys as strings
    (``gpu`` returns ``gpus/...`` too), so on a path-bounded permission it must end at or
    below a boundary of the permission (``gpu/``, ``gpu:x``), not at the permission
    itself: ``gpu`` grants ``leases(prefix="gpu/")``, not ``leases(prefix="gpu")``."""
    if prefix.endswith("*"):
        return query.startswith(prefix[:-1])
    if not prefix or prefix[-1] in SEPARATORS:
        return query.startswith(prefix)
    return (
        query.startswith(prefix) and len(query) > len(prefix) and query[len(prefix)] in SEPARATORS
    )


def prefix_grants(prefix: str, key: str) -> bool:
    """Whether a permission on ``prefix`` covers ``key`` (a key, or the prefix a
    ``leases``/``watch`` asks for): on path boundaries, see the module docstring."""
    if prefix.endswith("*"):
        return key.startswith(prefix[:-1])  # asked for: a bare string prefix
    if not key.startswith(prefix):
        return False
    if not prefix or len(key) == len(prefix) or prefix[-1] in SEPARATORS:
        return True
    return key[len(prefix)] in SEPARATORS


@dataclass(frozen=True)
class BudgetGate:
    """A budget that a principal's grants draw from (docs/budgets.md, "Budget
    gates"): ``per_acquire`` units with each lease granted to it, ``per_claim`` with
    each task claimed (0: that kind is not gated)."""

    key: str
    per_acquire: int = 0
    per_claim: int = 0

    def cost(self, op: str) -> int:
        """What one ``op`` (``acquire`` or ``task_claim``) costs, 0 for not gated."""
        return {"acquire": self.per_acquire, "task_claim": self.per_claim}.get(op, 0)


@dataclass(frozen=True)
class Role:
    name: str
    #: (prefix, actions) pairs.
    permissions: tuple[tuple[str, frozenset[str]], ...]
    max_priority: int = 0
    budget: BudgetGate | None = None


@dataclass(frozen=True)
class Principal:
    name: str
    roles: tuple[Role, ...]
    token_sha256: str = ""
    #: Its own ``budget``, else the one of its roles that names one (at most one
    #: may: ``load_auth`` refuses two); None: its grants draw from no budget.
    budget: BudgetGate | None = None

    def gate(self, op: str) -> tuple[str, int] | None:
        """The budget key and cost that ``op`` (``acquire``, ``task_claim``) must
        draw for this principal, or None when it is not gated."""
        if self.budget is None or self.budget.cost(op) <= 0:
            return None
        return self.budget.key, self.budget.cost(op)

    def allows(self, action: str, key: str, prefix_op: bool = False) -> bool:
        """``action`` on ``key``; with ``prefix_op``, ``key`` is the string prefix of a
        ``leases``/``watch`` query and every key it can return must be granted."""
        grants = prefix_covers_query if prefix_op else prefix_grants
        for role in self.roles:
            for prefix, actions in role.permissions:
                if action in actions and grants(prefix, key):
                    return True
        return False

    def may_shape(self, key: str) -> bool:
        """May this principal fix the capacity ("shape") of the shared key ``key``
        (the first acquire of a semaphore or pool)? ``shape`` or ``admin`` on a
        prefix of it."""
        return self.allows("shape", key) or self.allows("admin", key)

    def may_write_somewhere(self) -> bool:
        return any("write" in actions for role in self.roles for _, actions in role.permissions)

    @property
    def max_priority(self) -> int:
        return max((role.max_priority for role in self.roles), default=0)


@dataclass(frozen=True)
class AuthPolicy:
    principals: dict[str, Principal] = field(default_factory=dict)
    #: Pinned shapes: exact keys, and (prefix, capacity) longest prefix first.
    shape_keys: dict[str, int] = field(default_factory=dict)
    shape_prefixes: tuple[tuple[str, int], ...] = ()

    def pinned_capacity(self, key: str) -> int | None:
        """The capacity the auth file pins for ``key`` (an exact ``key`` entry, else
        the longest ``prefix`` containing it), or None if it pins none."""
        pinned = self.shape_keys.get(key)
        if pinned is not None:
            return pinned
        for prefix, capacity in self.shape_prefixes:
            if key.startswith(prefix):
                return capacity
        return None

    def by_token(self, token: str) -> Principal:
        """The principal whose token this is; raises ``UnauthenticatedError``."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        found: Principal | None = None
        for principal in self.principals.values():
            # Constant time per comparison, and every principal is compared.
            if principal.token_sha256 and hmac.compare_digest(principal.token_sha256, digest):
                found = principal
        if found is None:
            raise UnauthenticatedError("unknown token")
        return found

    def by_certificate(self, common_name: str | None) -> Principal | None:
        return self.principals.get(common_name) if common_name else None

    def check(self, principal: Principal | None, request: Request) -> None:
        """Raise ``UnauthenticatedError`` or ``PermissionDeniedError`` unless
        ``principal`` may send ``request``."""
        op, args = request.op, request.args
        spec = BY_NAME.get(op)
        permission = spec.permission if spec is not None else None
        if permission == "open":
            return  # health and leader discovery: no secret in them
        if principal is None:
            raise UnauthenticatedError(
                f"{request.op} needs an authenticated connection: send auth with a token "
                "or connect with a client certificate"
            )
        if permission == "session":
            if not principal.may_write_somewhere():
                raise PermissionDeniedError(f"{principal.name} may not hold lease sessions")
            return
        if permission == "read_all":
            # Every session's owner, across all keys: read on the whole key space.
            if not principal.allows("read", ""):
                raise PermissionDeniedError(
                    f"{principal.name} may not list lease sessions (needs read on every key)"
                )
            return
        if permission in ("queue_read", "queue_write"):
            action = "read" if permission == "queue_read" else "write"
            target = QUEUE_KEY_PREFIX + str(args["queue"])
            if not principal.allows(action, target):
                raise PermissionDeniedError(
                    f"{principal.name} may not {action} queue {args['queue']!r} ({op}; "
                    f"needs {action} on {target!r})",
                    {"principal": principal.name, "action": action, "key": target},
                )
            return
        if permission in ("budget_read", "budget_write", "budget_admin"):
            action = permission.removeprefix("budget_")
            target = BUDGET_KEY_PREFIX + str(args["key"])
            if not principal.allows(action, target):
                raise PermissionDeniedError(
                    f"{principal.name} may not {action} budget {args['key']!r} ({op}; "
                    f"needs {action} on {target!r})",
                    {"principal": principal.name, "action": action, "key": target},
                )
            return
        if permission == "keys_write":
            # A set of keys (acquire_many): write on every one, or none is taken.
            for pair in args["keys"]:
                if not principal.allows("write", str(pair[0])):
                    raise PermissionDeniedError(
                        f"{principal.name} may not write {pair[0]!r} ({op})",
                        {"principal": principal.name, "action": "write", "key": pair[0]},
                    )
            priority = args.get("priority", 0)
            if priority > principal.max_priority:
                raise PermissionDeniedError(
                    f"{principal.name} may ask for priority up to {principal.max_priority}, "
                    f"not {priority}"
                )
            return
        if permission in ("key_read", "key_write", "key_admin"):
            action = {"key_read": "read", "key_write": "write", "key_admin": "admin"}[permission]
            query = "key" not in args and "prefix" in args
            target = args.get("key", args.get("prefix", ""))
            if not principal.allows(action, str(target), prefix_op=query):
                raise PermissionDeniedError(
                    f"{principal.name} may not {action} {target!r} ({op})",
                    {"principal": principal.name, "action": action, "key": target},
                )
            priority = args.get("priority", 0)
            if op == "acquire" and priority > principal.max_priority:
                raise PermissionDeniedError(
                    f"{principal.name} may ask for priority up to {principal.max_priority}, "
                    f"not {priority}"
                )
            return
        if permission == "key_preempt":
            # Cooperative preemption (request_yield): ``preempt`` or ``admin`` on the
            # key; without it no principal can reach another's lease this way.
            key = str(args["key"])
            if not (principal.allows("preempt", key) or principal.allows("admin", key)):
                raise PermissionDeniedError(
                    f"{principal.name} may not ask the holders of {key!r} to yield "
                    f"({op}; needs preempt or admin on it)",
                    {"principal": principal.name, "action": "preempt", "key": key},
                )
            priority = args.get("priority", 0)
            if priority > principal.max_priority:
                raise PermissionDeniedError(
                    f"{principal.name} may ask for priority up to {principal.max_priority}, "
                    f"not {priority}"
                )
            return
        if permission == "admin":
            # Membership, snapshots (every lease id) and reload (re-reads this very
            # policy and the node's TLS files): operators, on the whole key space.
            self.check_admin(principal, op)
            return
        raise PermissionDeniedError(f"{op} is not allowed here")

    def status_view(self, principal: Principal | None, status: dict[str, Any]) -> dict[str, Any]:
        """What ``status`` shows ``principal``: all of it with ``admin`` on every key,
        else only ``STATUS_OPEN_FIELDS`` (issue 37: ``/status`` needed an admin token
        while ``/v1/status`` and the native ``status`` answered 41 fields to anyone)."""
        if principal is not None and principal.allows("admin", ""):
            return status
        return {k: v for k, v in status.items() if k in STATUS_OPEN_FIELDS}

    def check_admin(self, principal: Principal | None, what: str) -> None:
        if principal is None:
            raise UnauthenticatedError(f"{what} needs an authenticated connection")
        if not principal.allows("admin", ""):
            raise PermissionDeniedError(f"{principal.name} may not {what} (admin only)")


def _fail(path: Path, why: str) -> ConfigError:
    return ConfigError(f"auth file {str(path)!r}: {why}")


def load_auth(path: Path) -> AuthPolicy:
    """Read and validate an auth file. Raises ``ConfigError`` naming the problem."""
    try:
        raw: dict[str, Any] = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _fail(path, f"cannot be read: {exc}") from None
    roles: dict[str, Role] = {}
    for name, spec in (raw.get("roles") or {}).items():
        if not isinstance(spec, dict):
            raise _fail(path, f"role {name!r} must be a table")
        permissions = []
        for perm in spec.get("permissions", []):
            if not isinstance(perm, dict) or not isinstance(perm.get("prefix"), str):
                raise _fail(path, f"role {name!r}: each permission needs a prefix string")
            actions = perm.get("actions")
            if not isinstance(actions, list) or not set(actions) <= ACTIONS or not actions:
                raise _fail(path, f"role {name!r}: actions must be some of {sorted(ACTIONS)}")
            permissions.append((perm["prefix"], frozenset(actions)))
        cap = spec.get("max_priority", 0)
        if not isinstance(cap, int) or isinstance(cap, bool) or not -1000 <= cap <= 1000:
            raise _fail(path, f"role {name!r}: max_priority must be an integer in -1000..1000")
        roles[name] = Role(name, tuple(permissions), cap, _load_gate(path, f"role {name!r}", spec))
    principals: dict[str, Principal] = {}
    for entry in raw.get("principals") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise _fail(path, "each [[principals]] needs a name")
        name = entry["name"]
        if name in principals:
            raise _fail(path, f"principal {name!r} is listed twice")
        digest = entry.get("token_sha256", "")
        if not isinstance(digest, str) or (
            digest and (len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest))
        ):
            raise _fail(path, f"principal {name!r}: token_sha256 must be 64 lowercase hex digits")
        if "token" in entry:
            raise _fail(path, f"principal {name!r}: store token_sha256, never the token")
        unknown = [r for r in entry.get("roles", []) if r not in roles]
        if unknown:
            raise _fail(path, f"principal {name!r} names unknown roles {unknown}")
        mine = tuple(roles[r] for r in entry.get("roles", []))
        gate = _load_gate(path, f"principal {name!r}", entry)
        if gate is None:
            gates = {role.budget for role in mine if role.budget is not None}
            if len(gates) > 1:
                raise _fail(
                    path,
                    f"principal {name!r}: its roles name {len(gates)} different budgets; "
                    "give the principal its own budget",
                )
            gate = next(iter(gates), None)
        principals[name] = Principal(name, mine, digest, gate)
    if not principals:
        raise _fail(path, "names no principals")
    keys, prefixes = _load_shapes(path, raw.get("shapes", []))
    return AuthPolicy(principals, keys, prefixes)


def _load_gate(path: Path, where: str, spec: dict[str, Any]) -> BudgetGate | None:
    """A role's or principal's ``budget = { key = "...", per_acquire = N, per_claim =
    N }``, or None without one. Raises ``ConfigError`` naming the bad field."""
    raw = spec.get("budget")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _fail(path, f"{where}: budget must be a table {{ key, per_acquire, per_claim }}")
    unknown = sorted(set(raw) - {"key", "per_acquire", "per_claim"})
    if unknown:
        raise _fail(path, f"{where}: budget has unknown fields {unknown}")
    key = raw.get("key")
    if not isinstance(key, str) or not key or len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise _fail(path, f"{where}: budget key must be a non-empty string")
    costs = []
    for name in ("per_acquire", "per_claim"):
        cost = raw.get(name, 0)
        if (
            not isinstance(cost, int)
            or isinstance(cost, bool)
            or not 0 <= cost <= MAX_BUDGET_AMOUNT
        ):
            raise _fail(
                path, f"{where}: budget {name} must be an integer from 0 to {MAX_BUDGET_AMOUNT}"
            )
        costs.append(cost)
    if not any(costs):
        raise _fail(path, f"{where}: budget needs per_acquire or per_claim above 0")
    return BudgetGate(key, costs[0], costs[1])


def _load_shapes(path: Path, raw: Any) -> tuple[dict[str, int], tuple[tuple[str, int], ...]]:
    """The ``[[shapes]]`` tables: each a ``key`` or a ``prefix`` (a string, not both)
    and a ``capacity`` (1..MAX_CAPACITY; 1 pins a plain lock). Raises ``ConfigError``."""
    if not isinstance(raw, list):
        raise _fail(path, "shapes must be an array of tables ([[shapes]])")
    keys: dict[str, int] = {}
    prefixes: dict[str, int] = {}
    for n, entry in enumerate(raw, start=1):
        where = f"shapes entry {n}"
        if not isinstance(entry, dict):
            raise _fail(path, f"{where} must be a table")
        unknown = sorted(set(entry) - {"key", "prefix", "capacity"})
        if unknown:
            raise _fail(path, f"{where}: unknown fields {unknown} (key or prefix, capacity)")
        if ("key" in entry) == ("prefix" in entry):
            raise _fail(path, f"{where} needs exactly one of key and prefix")
        kind = "key" if "key" in entry else "prefix"
        name = entry[kind]
        if not isinstance(name, str) or (kind == "key" and not name):
            raise _fail(
                path, f"{where}: {kind} must be a{' non-empty' if kind == 'key' else ''} string"
            )
        capacity = entry.get("capacity")
        if (
            not isinstance(capacity, int)
            or isinstance(capacity, bool)
            or not 1 <= capacity <= MAX_CAPACITY
        ):
            raise _fail(path, f"{where}: capacity must be an integer from 1 to {MAX_CAPACITY}")
        table = keys if kind == "key" else prefixes
        if name in table:
            raise _fail(path, f"{where}: {kind} {name!r} is pinned twice")
        table[name] = capacity
    ordered = tuple(sorted(prefixes.items(), key=lambda item: -len(item[0])))
    return keys, ordered


def token_digest(token: str) -> str:
    """What the auth file stores for ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()
