"""Membership changes over PySyncObj's single-server changes (docs/membership.md).

PySyncObj (``dynamicMembershipChange=True``) replicates a change as a log entry that
takes effect on every node when it is *appended* (Raft dissertation §4.1): the leader
changes its peer set in ``_checkCommandsToApply`` before it sends the entry, followers
when they append it, and a truncation of the entry reverses it. A snapshot carries the
member set (``__loadDumpFile`` -> ``__updateClusterConfiguration``). Every change of
the set goes through the transport's ``addNode``/``dropNode`` (transport.py), which
is where the leader lease is re-counted over the new majority.

What this module corrects or adds at our seam (tests/fitness/test_membership_contract.py):

* **One change at a time.** PySyncObj means to refuse a change while another is not
  yet applied, but never sets ``__changeClusterIDx``: a second change is accepted at
  once. ``Membership.begin`` refuses while our own change is in flight and while the
  leader's log holds an uncommitted membership entry (one of a previous leader).
* **Who a member is.** A PySyncObj node is only a Raft address; each node we hand it
  (``member_node``) also carries the member's id and client address (``rl_id``,
  ``rl_client``), pickled with it into the change entry and the snapshot, so every
  node can redirect clients to a member it never had in its config file.
* **The configuration on disk.** Every change of the member set this node sees is
  written to ``<data_dir>/members.json`` (atomically, with fsync); a restarted node
  starts from that file rather than from its config file's ``nodes``, then replays
  its log, which holds the same changes (replaying one that is already in effect is a
  no-op in PySyncObj).

Threads: ``refresh`` runs on PySyncObj's tick thread (an on-tick callback); ``members``
and ``pending`` read one immutable attribute and are safe from any thread; ``begin``
and ``finish`` take a lock.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pysyncobj.node import TCPNode

from ..config import NodeAddress
from ..errors import ConfigError, UnavailableError
from .names import names

log = logging.getLogger("raftlease.replication")

#: Where a node keeps the member set it last saw (inside its data directory).
MEMBERS_FILE = "members.json"
#: Written when this node learns that its removal committed; it then refuses to start.
REMOVED_FILE = "removed"
#: PySyncObj's command type byte of a membership entry (``_COMMAND_TYPE.MEMBERSHIP``).
MEMBERSHIP_COMMAND = 2


class DialNode(TCPNode):  # type: ignore[misc]
    """A peer identified by its raft address but dialled at ``dial`` (for example a
    fault-injecting proxy; by default the raft address itself). PySyncObj identifies
    nodes by ``address`` (sent on connect, compared to decide who dials) and dials
    ``ip``/``port``: we change only the latter, and resolve the host name with
    ``names.NameCache`` instead of PySyncObj's blocking ten-minute cache."""

    def __init__(self, address: str, dial: str, **extra: Any) -> None:
        super().__init__(address, **extra)
        host, _, port = dial.rpartition(":")
        self._dial_host = host.strip("[]")
        self._dial_port = int(port)

    @property
    def dial_target(self) -> str:
        return f"{self._dial_host}:{self._dial_port}"

    @property
    def ip(self) -> str | None:
        # Off the tick thread, and short-lived (names.py): None until the name has
        # resolved once, and PySyncObj then dials again after connection_retry.
        return names.ip(self._dial_host)

    @property
    def port(self) -> int:
        return self._dial_port


def dialled(node: Any, dial: dict[str, str]) -> DialNode:
    """``node`` as this node dials it: at ``dial[raft]`` if given, else its raft
    address, keeping its member attributes. A node from another member's snapshot or
    change entry may carry that member's dial address: never use it."""
    target = dial.get(str(node.id), str(node.id))
    if isinstance(node, DialNode) and node.dial_target == target:
        return node
    # (Entries of older builds may carry ``rl_pub``, a peer key of the handshake that
    # mutual TLS replaced: not copied, not used.)
    extra = {k: getattr(node, k) for k in ("rl_id", "rl_client") if hasattr(node, k)}
    return DialNode(str(node.id), target, **extra)


def member_node(member: NodeAddress, cls: type[TCPNode] = TCPNode, **extra: Any) -> TCPNode:
    """A PySyncObj node for ``member`` that carries its id and client address.
    ``cls``/``extra``: a subclass and its arguments (replica.DialNode)."""
    node = cls(member.raft, **extra)
    node.rl_id = member.id
    node.rl_client = member.client
    return node


def node_address(node: Any, known: dict[str, NodeAddress]) -> NodeAddress:
    """The member a PySyncObj node stands for: its own attributes, else what this
    node knew of that Raft address, else the address itself as id (no client)."""
    raft = str(node.id)
    rl_id = getattr(node, "rl_id", None)
    rl_client = getattr(node, "rl_client", None)
    if isinstance(rl_id, str) and isinstance(rl_client, str):
        return NodeAddress(rl_id, raft, rl_client)
    if raft in known:
        return known[raft]
    return NodeAddress(raft, raft, "")


def read_members_file(path: Path) -> tuple[NodeAddress, ...] | None:
    """The member set saved in ``path`` (None if there is none). Raises
    ``ConfigError`` if the file is unreadable or malformed."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc}") from None
    try:
        raw = json.loads(text)
        members = tuple(
            NodeAddress(str(m["id"]), str(m["raft"]), str(m["client"])) for m in raw["members"]
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{str(path)!r} is not a member list ({exc})") from None
    if not members:
        raise ConfigError(f"{str(path)!r} lists no members")
    return members


def write_members_file(path: Path, members: Iterable[NodeAddress], index: int) -> None:
    """Save ``members`` (as of log index ``index``) atomically: temporary file,
    fsync, rename, fsync of the directory. Raises ``OSError``."""
    body = {
        "members": [{"id": m.id, "raft": m.raft, "client": m.client} for m in members],
        "log_index": index,
    }
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (json.dumps(body, indent=1) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_removed_file(path: Path, index: int) -> None:
    """Record that this node was removed at log index ``index`` (fsync). Raises
    ``OSError``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, f"removed at log index {index}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def membership_entries(entries: Iterable[Any]) -> list[tuple[str, str]]:
    """(kind, raft address) of each membership entry among PySyncObj log entries
    ``(command, index, term)``; kind is ``add`` or ``rem``."""
    found = []
    for entry in entries:
        command = entry[0]
        if isinstance(command, bytes) and command[:1] == bytes([MEMBERSHIP_COMMAND]):
            try:
                request = pickle.loads(command[1:])  # our own log
                found.append((str(request[0]), str(request[1])))
            except Exception:  # a malformed entry is PySyncObj's to ignore
                continue
    return found


#: The longest raft address a guest may give (a host name is at most 253 bytes).
MAX_GUEST_ADDRESS = 300


def newer_member(
    raft: Any,
    cert_ids: Iterable[str],
    members: Iterable[NodeAddress],
    me: NodeAddress,
    removed: Iterable[str] = (),
) -> str | None:
    """The member id to accept an incoming peer connection as when its first frame,
    ``raft``, names no member of this node's set: a member of a configuration newer
    than this node's log (added while this node was down or cut off). Accepted only on
    the evidence of its certificate (``cert_ids``: the member ids the verified
    certificate of the cluster CA names): exactly one id, which is neither this node
    nor a member of its set (a member claiming another address is an impostor, not a
    newcomer), and an address that is no member's; neither the id nor the address one
    this node's log removed (``removed``: ids and raft addresses; a removed member is
    refused, as before). None: refuse.

    Accepting such a node is what Raft asks (dissertation §4.1: a server takes
    AppendEntries from a leader outside its configuration and grants votes to such a
    candidate); the node's configuration itself changes only through the log entries
    that leader sends, which PySyncObj applies as they are appended."""
    if not isinstance(raft, str) or len(raft) > MAX_GUEST_ADDRESS:
        return None
    host, colon, port = raft.rpartition(":")
    # A raft address a DialNode can be built from (a malformed one raised on the
    # tick thread): a host, and a port of digits in 1..65535.
    if not host or not colon or not (port.isascii() and port.isdigit()):
        return None
    if not 0 < int(port) < 65536:
        return None
    ids = sorted(set(cert_ids))
    if len(ids) != 1:
        return None
    known = (*members, me)
    if ids[0] in {m.id for m in known} or raft in {m.raft for m in known}:
        return None
    gone = set(removed)
    if ids[0] in gone or raft in gone:
        return None
    return ids[0]


@dataclass(frozen=True)
class Change:
    """A change this node proposed as leader: ``kind`` is ``add`` or ``remove``."""

    kind: str
    member: NodeAddress
    term: int


class Membership:
    """This node's view of the member set, and the one change it may have in flight."""

    def __init__(self, me: NodeAddress, initial: Iterable[NodeAddress], path: Path) -> None:
        self.me = me
        self.path = path
        self._known: dict[str, NodeAddress] = {m.raft: m for m in initial}
        self._known[me.raft] = me
        self._members: tuple[NodeAddress, ...] = tuple(
            sorted({m.raft: m for m in (*initial, me)}.values(), key=lambda m: m.id)
        )
        self._lock = threading.Lock()
        self._change: Change | None = None
        self.changes_seen = 0
        self._saved = False
        # The PySyncObj node objects the last refresh took, by identity (kept so their
        # ids stay theirs): the same objects give the same members, because a node's
        # rl_id and rl_client are set when it is made and _known changes only with the
        # member set, so refresh skips rebuilding them (it runs on every tick).
        self._seen: tuple[Any, ...] = ()
        self._seen_ids: frozenset[int] = frozenset()

    # ------------------------------------------------------------- reading

    def members(self) -> tuple[NodeAddress, ...]:
        """The member set as this node sees it (its log's latest, sorted by id)."""
        return self._members

    def client_for_raft(self, raft: str) -> str | None:
        for member in self._members:
            if member.raft == raft:
                return member.client or None
        known = self._known.get(raft)
        return known.client if known is not None and known.client else None

    def pending(self) -> Change | None:
        return self._change

    # ------------------------------------------------------------ tick thread

    def refresh(self, other_nodes: Iterable[Any], index: int | Callable[[], int]) -> bool:
        """Tick thread: take PySyncObj's peer set; if it changed, remember it and
        write it to disk. Returns True if it changed. ``index`` is the log index the
        saved set is recorded at, or a function giving it: called only when the set is
        saved (reading the log's last entry on every tick cost more than the check)."""
        nodes = tuple(other_nodes)
        ids = frozenset(map(id, nodes))
        if ids == self._seen_ids and self._saved:
            return False  # the objects of the last tick: nothing to rebuild
        if callable(index):
            index = index()
        self._seen, self._seen_ids = nodes, ids
        members = [node_address(n, self._known) for n in nodes]
        current = tuple(
            sorted({m.raft: m for m in (*members, self.me)}.values(), key=lambda m: m.id)
        )
        if current == self._members:
            if not self._saved:
                self._save(current, index)
            return False
        for member in current:
            self._known[member.raft] = member
        old = {m.id for m in self._members}
        new = {m.id for m in current}
        self._members = current
        self.changes_seen += 1
        log.warning(
            "membership changed at log index %d: %s (added %s, removed %s)",
            index,
            ", ".join(m.id for m in current),
            sorted(new - old) or "none",
            sorted(old - new) or "none",
        )
        self._save(current, index)
        return True

    def _save(self, members: tuple[NodeAddress, ...], index: int) -> None:
        self._saved = True  # once per change: a failing disk is reported, not retried
        try:
            write_members_file(self.path, members, index)
        except OSError as exc:  # the log still holds the change; say so loudly
            log.error("cannot save the member list to %s: %s", self.path, exc)

    # ----------------------------------------------------------- leader side

    def begin(self, change: Change, log_tail: Iterable[Any]) -> None:
        """Claim the one change slot for ``change``; raises ``UnavailableError``
        (definite) while another change is in flight, or if ``log_tail`` (the
        leader's entries after its commit index) holds an uncommitted one."""
        with self._lock:
            if self._change is not None:
                busy = self._change
                raise UnavailableError(
                    f"a membership change is in progress ({busy.kind} {busy.member.id}); "
                    "one change at a time: retry when it has finished",
                    {"pending": {"kind": busy.kind, "member": busy.member.id}},
                )
            uncommitted = membership_entries(log_tail)
            if uncommitted:
                kind, raft = uncommitted[-1]
                raise UnavailableError(
                    f"an uncommitted membership change ({kind} {raft}) is in the log; "
                    "retry when it has committed",
                    {"pending": {"kind": kind, "member": raft}},
                )
            self._change = change

    def finish(self, change: Change) -> None:
        with self._lock:
            if self._change is change:
                self._change = None
