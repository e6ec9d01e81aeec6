"""PySyncObj's TCP transport with the leader-lease protocol and the follower-log
corrections (the seam where our Raft behaviour differs from PySyncObj's).

Runs on PySyncObj's tick thread.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import random
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from pysyncobj import FAIL_REASON
from pysyncobj.monotonic import monotonic as raft_clock
from pysyncobj.syncobj import _RAFT_STATE
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
from pysyncobj.tcp_server import SERVER_STATE
from pysyncobj.transport import TCPTransport

from ..config import NodeAddress
from .durable import DurableJournal, SyncRecorder, install
from .follower_log import AppendPlan, Conflict, plan_append_entries, snapshot_is_behind
from .leadership import LeaseGuard
from .membership import DialNode, dialled, newer_member
from .peer_tls import PeerTLS, TlsSession
from .peers import MAX_PEER_FRAME, PEER_MESSAGE_TYPES, BoundedTcpConnection, refusals
from .prevote import MESSAGE_TYPES as PRE_VOTE_TYPES
from .prevote import REQUEST as PRE_VOTE_REQUEST
from .prevote import PreVote

log = logging.getLogger("raftlease.replication")

#: Incoming peer connections that have not yet named a member, at most.
MAX_UNIDENTIFIED_PEERS = 32
#: What a member of a newer configuration (a guest, ``_accept_guest``) may send us:
#: its (pre-)vote requests and, once it leads, its log; never answers to requests we
#: never sent it.
GUEST_MESSAGE_TYPES = frozenset({"append_entries", "request_vote", PRE_VOTE_REQUEST})
#: Guests at most at once (one per member id its certificate names; a newer
#: configuration has few members we lack): beyond, a new one is refused.
MAX_GUESTS = 8
#: How long a leader keeps a removed member's connection for the removal notice to
#: commit, and how long it repeats the notice once it did.
REMOVAL_NOTICE_WAIT = 10.0
#: How long a member above our address (which PySyncObj leaves to dial us) may stay
#: unconnected before we dial it ourselves: it may not know us (``_dial_silent_members``).
#: Several of its own dial periods (``connectionRetryTime``), so that a member that
#: knows us has always dialled first.
REVERSE_DIAL_AFTER = 5.0
REMOVAL_NOTICE_REPEAT = 1.0
#: A follower rejecting every append_entries of the leader for this long is logged.
REJECTING_WARN_AFTER = 5.0


#: An election brought forward (``LeaseTransport._leader_gone``) waits, past the end of
#: the vote promise, ``EARLY_FIRST`` of the promise plus one ``EARLY_SLOT`` per rank
#: (the follower's place, by node id, among the members other than the gone leader)
#: plus up to ``EARLY_JITTER``, all shares of the promise. The first slot is late
#: enough that a follower that heard the last heartbeat a moment later has ended its
#: own promise too when the first vote request comes; the slots are far enough apart
#: (100 ms with the defaults) that the next follower runs only if the one before could
#: not win, so two followers do not split the vote by running at the same moment (with
#: one random spread for all, two that ran within a few ms of each other did, and the
#: retry cost a full random election timeout); the jitter covers members whose views
#: of the membership differ for a moment.
EARLY_FIRST = 1 / 16
EARLY_SLOT = 1 / 4
EARLY_JITTER = 1 / 32


def early_election_delay(promise_left: float, promise: float, rank: int = 0) -> float:
    """Seconds from now to an election brought forward by the follower of ``rank``
    (0 runs first): the promise's rest, then its slot. Never less than
    ``promise_left`` plus ``EARLY_FIRST`` of the promise."""
    slot = EARLY_FIRST + max(0, rank) * EARLY_SLOT + random.uniform(0.0, EARLY_JITTER)
    return promise_left + slot * promise


def election_rank(me: str, members: list[str], gone: str) -> int:
    """``me``'s place, by node id, among ``members`` (this node included or not)
    other than the gone leader ``gone``: the order in which the survivors bring
    their elections forward. The same on every survivor that sees the same members."""
    return sorted({m for m in members if m != gone} | {me}).index(me)


class LeaseTransport(TCPTransport):  # type: ignore[misc]
    """PySyncObj's TCP transport plus the leader-lease protocol (see leadership.py).

    Outgoing ``append_entries`` carry the leader's clock at sending (``rl_s``); replies
    (``next_node_idx``) echo the stamp of the last accepted ``append_entries`` of the
    current leader (``rl_et``, ``rl_e``) and carry the follower's clock (``rl_t``).
    ``request_vote`` is dropped, in both directions, while this node's vote promise
    holds, and by a leader while a majority acknowledges it (so a node that cannot
    hear the leader cannot depose it). A node whose term grew while it was cut off
    answers the leader's stale-term ``append_entries`` with a term notice after the
    heal, the leader steps down and the cluster re-elects (liveness).
    ``apply_command`` (PySyncObj forwarding a proposal to the leader) is never sent.
    On a follower, a current-term ``append_entries`` is corrected before PySyncObj
    handles it (``plan_append_entries``, ``_snapshot_message``: no truncation without
    a conflict, rejections that keep the leader's step back, no commit or snapshot
    install the message does not justify).
    Durability (durable.py): the constructor puts a ``DurableJournal`` in place of
    PySyncObj's journal; a follower syncs it before every ``next_node_idx`` it sends
    (its acknowledgement), a leader at the end of each tick (after sending, so its
    sync overlaps the followers') and before its commit index moves.
    Peers (peers.py, peer_tls.py): every connection runs mutual TLS 1.3 with the
    cluster CA; a dialer counts the member connected, and an acceptor takes the
    connection as a member, only once the verified certificate names that member
    (``_onTlsVerified``, ``_onIncomingMessageReceived``); ``reload_tls`` swaps the
    contexts and closes the connections a reload no longer admits.
    Runs on the tick thread. ``guard``, ``durability``, ``recorder`` and ``peer_tls``
    are bound by ``Replica`` through a subclass.
    """

    guard: LeaseGuard
    durability: ClassVar[str] = "fsync"
    #: Test builds only (hook ``record_synced``).
    recorder: ClassVar[SyncRecorder | None] = None
    journal: DurableJournal
    #: False only in a test build's planted bug (``raftlease.testing.node``): hand
    #: ``append_entries`` to PySyncObj uncorrected.
    follower_log_correction: ClassVar[bool] = True
    #: Where this node dials a peer instead of its raft address (raft -> host:port).
    dial: ClassVar[dict[str, str]] = {}
    #: Called (tick thread) with the log index of this node's removal when its leader
    #: tells it the removal committed (``rl_removed``). Bound by ``Replica``.
    on_removed: ClassVar[Callable[[int], None] | None] = None
    #: This node's peer TLS (peer_tls.py). Bound by ``Replica``; None only in a test
    #: build's plain-peer baseline (``plain_peers``), never in production.
    peer_tls: ClassVar[PeerTLS | None] = None
    #: Test build only (the benchmark's baseline): peers without TLS.
    plain_peers: ClassVar[bool] = False
    #: The longest peer frame accepted (``max_peer_frame``). Bound by ``Replica``.
    max_peer_frame: ClassVar[int] = MAX_PEER_FRAME
    #: False only in a test build's planted bug (``skip_pre_vote``): run for election
    #: without asking for pre-votes (prevote.py).
    pre_vote: ClassVar[bool] = True
    _bumped: dict[str, float]
    #: Follower side: see plan_append_entries.
    _conflict: Conflict | None
    _reply_next: int | None
    _snapshot_in: bytearray | None
    _rejecting: tuple[float, float] | None  # (since, last warned)
    #: The highest term of a ``request_vote`` dropped under our vote promise, and when
    #: (our clock); (0, 0.0) when none is pending (``_adopt_dropped_term``).
    _dropped_vote: tuple[int, float]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._tls = self.peer_tls
        if self._tls is None and not self.plain_peers:
            raise ValueError("a peer transport needs its peer TLS (peer_tls)")
        self._bumped = {}
        self._conflict = None
        self._reply_next = None
        self._snapshot_in = None
        self._rejecting = None
        self._dropped_vote = (0, 0.0)
        self._last_rebind = float("-inf")
        self._unknown_since: dict[Any, float] = {}
        self._kept: dict[str, Any] = {}  # removed in our log but leading us (dropNode)
        self._wake_timer: threading.Timer | None = None  # at most one pending (_wake_at)
        # Members whose connection is up now (_onNodeConnected): a close of one of
        # them is a signal to a node that has heard no leader yet (_leader_gone); a
        # failed dial is not.
        self._up: set[str] = set()
        # Leader: removed members told once their removal commits (_settle_leaving):
        # id -> (node, index of the change, deadline, telling until).
        self._leaving: dict[str, tuple[Any, int, float, float | None]] = {}
        # Leader: members being added, streamed the log before their change (learner
        # stage, start_learner): raft address -> node, and when we last dialled it.
        self._learners: dict[str, Any] = {}
        self._learner_dialled: dict[str, float] = {}
        # Dialer: our outgoing connections whose TLS handshake has not yet proven that
        # the acceptor is the member we dialled: connection -> when it connected.
        # PySyncObj's messages to that member are refused (``send``) meanwhile.
        self._unproven: dict[Any, float] = {}
        # Acceptor: the member ids the verified certificate of each incoming
        # connection names, until its first frame says which member it is.
        self._verified: dict[Any, list[str]] = {}
        # Follower side: members of a configuration newer than our log's (added while
        # we were down), accepted on their certificate's word (``newer_member``) as
        # guests: raft address -> node. Only their vote and pre-vote requests and
        # append_entries are taken; once our log adds them (addNode) they are members.
        self._guests: dict[str, Any] = {}
        # Ids and raft addresses of members our log removed (dropNode), never guests.
        self._removed: set[str] = set()
        # Members above our address that have not connected to us: since when, and
        # when we last dialled them ourselves (``_dial_silent_members``).
        self._guest_heard: dict[str, float] = {}  # guest -> last guest message
        # Connections to close on the next tick (not from inside their own handler).
        self._close_later: list[Any] = []
        # Members above our address that have dialled us since we started: they know
        # us, so we never dial them ourselves (_dial_silent_members).
        self._dialled_us: set[str] = set()
        self._silent_since: dict[str, float] = {}
        self._reverse_dialled: dict[str, float] = {}
        super().__init__(*args, **kwargs)
        self.prevote = PreVote(self, self.guard)
        sync = self._syncObj
        self.journal = install(sync, self.durability, self.recorder)
        sync.addOnTickCallback(self.journal.sync_if_dirty)

    def send(self, node: Any, message: Any) -> bool:
        if not self._proven(node):
            return False  # PySyncObj sends as soon as TCP connects: not before TLS proved it
        if isinstance(message, dict):
            kind = message.get("type")
            if kind == "append_entries":
                message["rl_s"] = self.guard.stamp_outgoing(message["term"])
            elif kind == "next_node_idx":
                # The follower's acknowledgement: what it appended is on disk first.
                self.journal.sync_if_dirty()
                if self._reply_next is not None:
                    # PySyncObj's reply to the append_entries being handled (plan).
                    message["next_node_idx"] = self._reply_next
                    self._reply_next = None
                echo = self.guard.echo_for(node.id)
                if echo is not None:
                    message["rl_et"], message["rl_e"] = echo
                message["rl_t"] = self.guard.clock.monotonic()
            elif kind == "request_vote" and self.guard.refuse_vote():
                return False  # our own promise also forbids running for election
            elif kind == "apply_command":
                # PySyncObj forwards a proposal to the leader when this node lost
                # leadership between our check and the tick thread. Never forward: the
                # entry was stamped with our (now stale) log time. Fail it at once,
                # definitely (it was not sent), through PySyncObj's own reply path.
                request_id = message.get("request_id")
                if request_id is not None:
                    super()._onMessageReceived(
                        node,
                        {
                            "type": "apply_command_response",
                            "request_id": request_id,
                            "error": FAIL_REASON.REQUEST_DENIED,
                        },
                    )
                return False
        return bool(super().send(node, message))

    # ------------------------------------------------------------ peers (peers.py)

    def _bound(self, conn: Any) -> Any:
        if type(conn) is TcpConnection:
            conn.__class__ = BoundedTcpConnection
        return conn

    def addNode(self, node: Any) -> None:
        # Called for the configured peers at start and, with dynamic membership, at
        # the moment PySyncObj applies a change (appended add, reversed remove, a
        # snapshot's member set): the new peer is accepted from now on, and the
        # leader lease is counted over the new majority (LeaseGuard.reconfigure).
        self._removed.discard(str(node.id))
        self._removed.discard(str(getattr(node, "rl_id", "")))
        kept = self._kept.pop(node.id, None) or self._leaving.pop(node.id, None)
        if kept is None and node.id in self._learners:
            self._drop_guest(node.id)  # ours as a learner: its guest connection goes
            self._promote_learner(node)
        elif kept is None and node.id in self._guests:
            self._promote_guest(node)
        elif kept is None:
            self._add_dialled(node)
        self.guard.reconfigure(len(self._syncObj.otherNodes) + 1)

    def _add_dialled(self, node: Any) -> None:
        """PySyncObj's plain addNode (a connection object if we are the one that
        dials), with that connection bounded like every other."""
        super().addNode(dialled(node, self.dial))
        conn = self._connections.get(node)
        if conn is not None:
            self._bound(conn)

    def dropNode(self, node: Any) -> None:
        # A removed member: its connection is closed, and it is refused from now on
        # (_onIncomingMessageReceived), like any stranger.
        sync = self._syncObj
        self._silent_since.pop(node.id, None)  # a re-added member starts afresh
        self._reverse_dialled.pop(node.id, None)
        self._dialled_us.discard(str(node.id))
        if node.id in self._learners and node not in self._nodes:
            self.stop_learner(node.id)  # shutdown: destroy drops the read-only nodes too
            return
        leader = sync._getLeader()
        removed = node not in sync.otherNodes  # else: shutdown (destroy drops every node)
        if removed:
            self._removed.add(str(node.id))
            member_id = getattr(node, "rl_id", None)
            if isinstance(member_id, str):
                self._removed.add(member_id)
        if self._leaving.pop(node.id, None) is not None or self._kept.pop(node.id, None):
            super().dropNode(node)  # dropped again (shutdown): close it now
        elif removed and sync._isLeader():
            # PySyncObj's leader applies the change before it appends the entry (at the
            # next index) and would close the connection now: the removed node would
            # never learn it was removed. Keep the connection (taking nothing from it)
            # until the removal commits, tell the node, then close it.
            index = int(sync._SyncObj__raftLog[-1][1]) + 1
            deadline = self.guard.clock.monotonic() + REMOVAL_NOTICE_WAIT
            self._leaving[node.id] = (node, index, deadline, None)
        elif removed and leader is not None and node == leader and not sync._isLeader():
            # A follower catching up appends an old removal of the node that now leads
            # it (removed, then added again: a host replaced under the same address).
            # A leader never removes itself, so a later entry adds it back; Raft has
            # followers take the leader's entries whatever their configuration
            # (dissertation §4.1). PySyncObj would close the leader's connection and
            # refuse it: this follower could never read the entry that re-adds it.
            # Keep the connection while it leads us (_settle_kept).
            log.info("keeping leader %s's connection across an old removal in the log", node.id)
            self._kept[node.id] = node
        else:
            super().dropNode(node)
        self.guard.reconfigure(len(sync.otherNodes) + 1)

    def _settle_leaving(self) -> None:
        """Leader: tell each removed member, once its removal committed, with frames
        on the connection kept for it (each tick for ``REMOVAL_NOTICE_REPEAT`` s, so a
        reconnect in between does not lose it), then close that connection. Without a
        commit in time, or after losing leadership, close it untold."""
        if not self._leaving:
            return
        sync = self._syncObj
        now = self.guard.clock.monotonic()
        for node_id, (node, index, deadline, until) in list(self._leaving.items()):
            done = until is not None and now >= until
            if done or not sync._isLeader() or (until is None and now > deadline):
                del self._leaving[node_id]
                super().dropNode(node)
            elif sync.raftCommitIndex >= index and self._proven(node):
                notice = {"type": "rl_removed", "index": index, "term": sync.raftCurrentTerm}
                super().send(node, notice)
                if until is None:
                    self._leaving[node_id] = (node, index, deadline, now + REMOVAL_NOTICE_REPEAT)

    def _settle_kept(self) -> None:
        """Drop a kept node (dropNode) once it no longer leads this node and is still
        not a member."""
        if not self._kept:
            return
        sync = self._syncObj
        leader = sync._getLeader()
        members = sync.otherNodes
        for node_id, node in list(self._kept.items()):
            if node in members:
                del self._kept[node_id]
            elif sync._isLeader() or leader is None or leader.id != node_id:
                del self._kept[node_id]
                super().dropNode(node)

    # ------------------------------------------------- learners (membership.py)

    def start_learner(self, node: Any) -> None:
        """Tick thread, leader: stream the log (a snapshot first when the log is
        compacted) to ``node``, a member about to be added, before its change. It is
        one of PySyncObj's read-only nodes: it gets ``append_entries`` and has a match
        index, but never counts for a commit, a vote or the leader lease (none of its
        messages but ``next_node_idx`` is taken, and that one not by the guard). Its
        connection is accepted only while it is a learner of this leader, after the
        same checks as a member's (its certificate, its address)."""
        learner = dialled(node, self.dial)
        self._drop_guest(learner.id)  # we lead: no guests (and not under its key)
        leaving = self._leaving.pop(learner.id, None)
        if leaving is not None:
            # Removed, and now added again (a host replaced under its address): the
            # connection kept for the removal notice goes; the learner gets its own.
            TCPTransport.dropNode(self, leaving[0])
        self._learners[learner.id] = learner
        if self._shouldConnect(learner):
            self._connections[learner] = self._outgoing(learner)
        self._dial_learners()

    def _outgoing(self, node: Any) -> Any:
        """A new, not yet connected, outgoing connection to ``node``, wired as
        PySyncObj's addNode wires one (TLS starts once TCP connects), bounded."""
        sync = self._syncObj
        conf = sync.conf
        conn = TcpConnection(
            poller=sync._poller,
            timeout=conf.connectionTimeout,
            sendBufferSize=conf.sendBufferSize,
            recvBufferSize=conf.recvBufferSize,
            keepalive=conf.tcp_keepalive,
        )
        conn.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, conn))
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))
        return self._bound(conn)

    def stop_learner(self, raft: str) -> None:
        """Tick thread: stop streaming to learner ``raft`` (its add was abandoned, or
        this node no longer leads) and close its connection."""
        learner = self._learners.pop(raft, None)
        self._learner_dialled.pop(raft, None)
        if learner is None:
            return
        conn = self._connections.get(learner)
        if conn is not None:
            conn.disconnect()  # -> _onDisconnected: PySyncObj forgets the read-only node
            if self._connections.get(learner) is conn:
                del self._connections[learner]
        if learner in self._readonlyNodes:
            self._readonlyNodes.discard(learner)
            self._onReadonlyNodeDisconnected(learner)

    def is_learner(self, raft: str) -> bool:
        return raft in self._learners

    def _promote_learner(self, node: Any) -> None:
        """The add of a learner is applied (PySyncObj has just put it in its member
        set with fresh next and match indexes): the learner's connection becomes the
        member's as it is, so the new member counts from its next acknowledgement on,
        with no reconnect in between."""
        learner = self._learners.pop(node.id)
        self._learner_dialled.pop(node.id, None)
        for name in ("rl_id", "rl_client"):  # as the change entry has them
            if hasattr(node, name):
                setattr(learner, name, getattr(node, name))
        if learner in self._readonlyNodes:
            self._readonlyNodes.discard(learner)
            self._syncObj._SyncObj__readonlyNodes.discard(learner)  # stays connected
        if learner in self._connections:
            self._nodes.add(learner)
            self._nodeAddrToNode[learner.address] = learner
        else:  # never connected: the plain path
            super().addNode(learner)

    # ---------------------------------------- members of a newer configuration

    def _accept_guest(self, conn: Any, raft: str, member_id: str) -> None:
        """A member of a newer configuration dialled us (``newer_member``): take its
        connection as a guest's, so that we can vote for it and follow it as leader
        and so learn the newer configuration from its log."""
        for other, known in list(self._guests.items()):
            if other == raft or getattr(known, "rl_id", None) == member_id:
                self._drop_guest(other)  # one connection per member id, the newest
        if len(self._guests) >= MAX_GUESTS:
            refusals.warning(
                "peer connection refused: %d members of a newer configuration already "
                "connected (%s at %.80s)",
                MAX_GUESTS,
                member_id,
                raft,
            )
            self._refuse(conn)
            return
        guest = DialNode(raft, self.dial.get(raft, raft))
        guest.rl_id = member_id
        guest.rl_client = ""
        self._unknownConnections.discard(conn)
        self._connections[guest] = conn
        self._guests[raft] = guest
        # A guest that never sends what a guest may is closed like a silent stranger.
        self._guest_heard[raft] = self.guard.clock.monotonic()
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, guest))
        log.warning(
            "peer %s at %s is not in our member set but its certificate names it: taken "
            "as a member of a newer configuration until our log says so (or not)",
            member_id,
            raft,
        )

    def _promote_guest(self, node: Any) -> None:
        """Our log added a guest (PySyncObj has just put it in its member set): its
        connection becomes the member's as it is, connected."""
        guest = self._guests.pop(node.id)
        self._guest_heard.pop(node.id, None)
        for name in ("rl_id", "rl_client"):  # as the change entry has them
            if hasattr(node, name):
                setattr(guest, name, getattr(node, name))
        conn = self._connections.pop(guest, None)
        if conn is None or conn.state != CONNECTION_STATE.CONNECTED or self._shouldConnect(node):
            # Not connected, or it dialled us against the address rule (a reverse dial,
            # ``_dial_silent_members``): PySyncObj would later reconnect with that
            # incoming connection object, which never sends our address. Closed; we
            # dial it now, as the greater address does.
            if conn is not None:
                # Maybe from inside this very connection's message handler (the entry
                # that adds it): closed on the next tick, after the handler's reply.
                self._close_later.append(conn)
            self._add_dialled(node)
            return
        self._connections[guest] = conn
        self._nodes.add(guest)
        self._nodeAddrToNode[guest.address] = guest
        self._onNodeConnected(guest)

    def _drop_guests(self) -> None:
        """Close every guest connection (we lead now: a member of a configuration we
        do not know has nothing to do with our log, and PySyncObj's leader would index
        its per-member tables with it)."""
        for raft in list(self._guests):
            self._drop_guest(raft)

    def _drop_guest(self, raft: str) -> None:
        """Close guest ``raft``'s connection and forget it (nothing if no guest)."""
        guest = self._guests.pop(raft, None)
        self._guest_heard.pop(raft, None)
        if guest is None:
            return
        conn = self._connections.pop(guest, None)
        if conn is not None:
            conn.disconnect()

    def _stranded(self) -> bool:
        """Whether this node may take guests: it is no leader and has heard from no
        leader for longer than the longest election timeout (or never, since it
        started). A node that hears a leader of its own configuration learns every
        change from it and needs no guest, so a guest's certificate opens nothing on
        a healthy member: only on one cut off from its configuration (issue 37: the
        members it knows are gone, the new ones unknown to it)."""
        sync = self._syncObj
        if sync._isLeader():
            return False
        heard = self.guard.heard_ago()
        return heard is None or heard > sync.conf.raftMaxTimeout

    def _settle_guests(self) -> None:
        """Tick thread: guests go once we lead or follow a leader of our own
        configuration (it sends us every change), and one that has sent nothing a
        guest may for ``connectionTimeout`` is closed like a silent stranger."""
        if not self._guests:
            return
        sync = self._syncObj
        leader = sync._getLeader()
        if sync._isLeader() or (leader is not None and leader in self._nodes):
            self._drop_guests()
            return
        now = self.guard.clock.monotonic()
        limit = sync.conf.connectionTimeout
        for raft, heard in list(self._guest_heard.items()):
            if now - heard > limit:
                self._drop_guest(raft)

    def _dial_silent_members(self) -> None:
        """Tick thread, peer TLS only: dial the members above our address (the ones
        PySyncObj leaves to dial us) that have not been connected for
        ``REVERSE_DIAL_AFTER``, at most once per that time. Such a member may have
        missed the change that added us (it was down) and so never dials us: it takes
        our connection as a member of a newer configuration's (``_accept_guest``) and
        learns the member set from the log. A member that knows us refuses it (it dials
        us itself: ``_onIncomingMessageReceived``), so a slow or partitioned member
        costs one refused connection per period, nothing more."""
        if self._tls is None:
            return
        now = self.guard.clock.monotonic()
        for node in list(self._nodes):
            if (
                self._shouldConnect(node)
                or not isinstance(getattr(node, "rl_id", None), str)
                or node.id in self._dialled_us
            ):
                # We dial it; or it has dialled us since we started, so it knows us and
                # will again (a partition or its restart is no reason to go round it:
                # the chaos suite's isolate-follower saw the cut-off member raise its
                # term when the refused dial counted as a connection for a moment).
                self._silent_since.pop(node.id, None)
                continue
            conn = self._connections.get(node)
            if conn is not None and conn.state != CONNECTION_STATE.DISCONNECTED:
                self._silent_since.pop(node.id, None)
                continue
            since = self._silent_since.setdefault(node.id, now)
            if now - since < REVERSE_DIAL_AFTER:
                continue
            if now - self._reverse_dialled.get(node.id, float("-inf")) < REVERSE_DIAL_AFTER:
                continue
            first = node.id not in self._reverse_dialled or self._reverse_dialled[node.id] < since
            self._reverse_dialled[node.id] = now
            dial = self._connections[node] = self._outgoing(node)
            # Once per silent spell at INFO: a member that is down is dialled every
            # REVERSE_DIAL_AFTER until it is back.
            (log.info if first else log.debug)(
                "member %s at %s has not connected for %.0f s: dialling it (it may have "
                "missed the change that added us)",
                node.rl_id,
                node.address,
                now - since,
            )
            if not dial.connect(node.ip, node.port):
                dial.disconnect()  # failed at once (no route, unresolved): its socket goes

    def _dial_learners(self) -> None:
        """Leader, tick thread: (re)connect to the learners whose address is below
        ours (PySyncObj's rule: the greater address dials), at most once per
        ``connectionRetryTime``; a node that no longer leads drops its learners."""
        if not self._learners:
            return
        sync = self._syncObj
        if not sync._isLeader():
            for raft in list(self._learners):
                self.stop_learner(raft)
            return
        now = self.guard.clock.monotonic()
        for raft, learner in self._learners.items():
            conn = self._connections.get(learner)
            if conn is None or conn.state != CONNECTION_STATE.DISCONNECTED:
                continue
            if not self._shouldConnect(learner):
                continue  # it dials us: that object is an incoming one, never re-dialled
            if now - self._learner_dialled.get(raft, float("-inf")) < sync.conf.connectionRetryTime:
                continue
            self._learner_dialled[raft] = now
            conn.connect(learner.ip, learner.port)

    def _onNodeConnected(self, node: Any) -> None:
        if node.id in self._learners and node not in self._nodes:
            # Our outgoing connection to a learner: a read-only node for PySyncObj.
            self._readonlyNodes.add(node)
            self._onReadonlyNodeConnected(node)
            log.info("learner %s connected: streaming the log to it", node.id)
            return
        self._up.add(str(node.id))
        super()._onNodeConnected(node)

    def _accept_learner(self, conn: Any, raft: str) -> None:
        """A learner dialled us: take its connection as a read-only node's."""
        learner = self._learners[raft]
        old = self._connections.get(learner)
        if old is not None and old is not conn:
            old.disconnect()
        if learner in self._readonlyNodes:
            self._readonlyNodes.discard(learner)
            self._onReadonlyNodeDisconnected(learner)
        self._unknownConnections.discard(conn)
        self._connections[learner] = conn
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, learner))
        self._readonlyNodes.add(learner)
        self._onReadonlyNodeConnected(learner)
        log.info("learner %s connected: streaming the log to it", raft)

    def _onNewIncomingConnection(self, conn: Any) -> None:
        if len(self._unknownConnections) >= MAX_UNIDENTIFIED_PEERS:
            # Strangers holding connections open must not use up the file descriptors
            # the members need: beyond this many not-yet-identified ones, close.
            conn.disconnect()
            return
        self._unknown_since[conn] = self.guard.clock.monotonic()
        super()._onNewIncomingConnection(self._bound(conn))
        self._start_tls(conn, server_side=True)

    def _start_tls(self, conn: Any, server_side: bool) -> None:
        """Begin a connection's TLS with the current contexts (a reload's apply to
        new connections); nothing it receives is parsed before the handshake."""
        tls = self._tls
        context = None if tls is None else (tls.server if server_side else tls.client)
        conn.rl_start_tls(
            context,
            server_side,
            functools.partial(self._onTlsVerified, conn, server_side),
            self.max_peer_frame,
        )
        if tls is None:  # plain peers (a test build's baseline): nothing to verify
            self._onTlsVerified(conn, server_side, None)

    def _onTlsVerified(self, conn: Any, server_side: bool, session: TlsSession | None) -> None:
        """The handshake of ``conn`` completed: OpenSSL verified the peer's
        certificate against the CA file (and revocation list) the handshake began
        with. Check it against the current ones too (a reload may have come in
        between), then: an acceptor waits for the first frame (which member);
        a dialer checks that the certificate names the member it dialled, sends
        our address (PySyncObj's first frame) and counts the member connected."""
        ids: list[str] = []
        if session is not None:
            der = session.peer_der()
            why = "no certificate" if der is None else None
            if der is not None and self._tls is not None:
                why = self._tls.admits(der)
            if why is not None:
                refusals.warning("peer connection refused: %s", why)
                self._refuse(conn)
                return
            ids = session.peer_ids
        if server_side:
            self._verified[conn] = ids
            return
        node = self._connToNode(conn)
        expected = getattr(node, "rl_id", None)
        if node is None or not isinstance(expected, str):
            self._refuse(conn)
            return
        if session is not None and expected not in ids:
            refusals.warning(
                "peer connection refused: %s at %s presented a certificate for %s, not for %s",
                expected,
                node.address,
                ", ".join(ids) or "no member",
                expected,
            )
            self._refuse(conn)
            return
        self._unproven.pop(conn, None)
        conn.send(self._selfNode.address)  # PySyncObj's first frame: who dials
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        self._onNodeConnected(node)

    def _refuse(self, conn: Any) -> None:
        self._unproven.pop(conn, None)
        self._verified.pop(conn, None)
        self._unknownConnections.discard(conn)
        conn.disconnect()

    def reload_tls(self, tls: PeerTLS) -> int:
        """Tick thread: new connections use ``tls`` from now on, and every open peer
        connection whose certificate ``tls`` would not accept (revoked by the new
        revocation list, its CA no longer in the CA file, expired) is closed at once.
        Returns how many were closed."""
        self._tls = tls
        closed = 0
        conns = {*self._connections.values(), *self._unknownConnections}
        for conn in conns:
            session = getattr(conn, "_rl_tls", None)
            der = session.peer_der() if session is not None else None
            if der is None:
                continue  # not yet verified: checked against ``tls`` when it is
            why = tls.admits(der)
            if why is not None:
                node = self._connToNode(conn)
                log.warning(
                    "peer connection of %s closed after the reload: %s",
                    getattr(node, "rl_id", None) or "an unidentified peer",
                    why,
                )
                self._refuse(conn)
                closed += 1
        return closed

    def before_tick(self) -> None:
        """Tick thread, before each PySyncObj tick (``GroupSendSyncObj._onTick``),
        whose first step may start this node's election: a dropped vote request's term
        is taken before that (``_adopt_dropped_term``). At the end of the tick, with
        the other callbacks, a node with no event between its promise's end and its
        election's wake-up ran in the dropped term itself and split the vote. Then
        the election is held back unless a majority granted a pre-vote (prevote.py)."""
        self._adopt_dropped_term()
        if self.pre_vote:
            self.prevote.before_tick()

    def _onTick(self) -> None:
        super()._onTick()
        self._drop_stalled_dials()
        self._drop_silent_strangers()
        self._drop_unproven()
        self._settle_kept()
        self._settle_leaving()
        self._dial_learners()
        self._dial_silent_members()
        self._settle_guests()
        closing, self._close_later = self._close_later, []
        for conn in closing:
            conn.disconnect()
        server = self._server
        if self._ready and server is not None and server._TcpServer__state == SERVER_STATE.UNBINDED:
            # PySyncObj's listener unbinds itself on an accept error (EMFILE when the
            # process runs out of file descriptors) and never binds again: a peer
            # that restarts could then never reconnect. Bind again, once a second.
            now = self.guard.clock.monotonic()
            if now - self._last_rebind >= 1.0:
                self._last_rebind = now
                try:
                    server.bind()
                    log.warning("raft listener was unbound (accept failed); bound again")
                except OSError as exc:
                    log.warning("raft listener is unbound and cannot bind yet: %s", exc)

    def _drop_stalled_dials(self) -> None:
        """A dial nobody answers (a member gone from its address: a pod or container
        back at a new IP) stays CONNECTING until the kernel gives up on its SYN, about
        two minutes, and PySyncObj dials a node again only once its connection is
        DISCONNECTED: the name's new address (names.py) went unused that long, and the
        member with it. PySyncObj checks a connection's timeout only on its socket's
        events and sends, which an unanswered dial has none of (and ``BoundedTcpConnection``
        times out only awaited answers): a dial not connected within
        ``connectionTimeout`` is closed here, so the next one resolves the name again."""
        limit = self._syncObj.conf.connectionTimeout
        now = raft_clock()  # the clock of PySyncObj's lastReadTime, set at connect
        for conn in list(self._connections.values()):
            started = getattr(conn, "_TcpConnection__lastReadTime", now)
            if conn.state == CONNECTION_STATE.CONNECTING and now - started > limit:
                conn.disconnect()

    def _drop_silent_strangers(self) -> None:
        """PySyncObj checks a connection's timeout only when it has an event: a
        connection that never sends stays forever. Those that have not named a member
        within ``connectionTimeout`` are closed."""
        since = self._unknown_since
        if not since:
            return
        now = self.guard.clock.monotonic()
        limit = self._syncObj.conf.connectionTimeout
        for conn, opened in list(since.items()):
            if conn not in self._unknownConnections:
                del since[conn]
            elif now - opened > limit:
                del since[conn]
                self._unknownConnections.discard(conn)
                conn.disconnect()

    def _proven(self, node: Any) -> bool:
        """False while our connection to ``node`` waits for its signed hello reply."""
        conn = self._connections.get(node)
        return conn is None or conn not in self._unproven

    def _onOutgoingConnected(self, conn: Any) -> None:
        # Dialer, TCP connected. PySyncObj would send our address and count the node
        # connected at once (its send() needs only that); we start TLS instead and do
        # both once the handshake proved the acceptor is the member we dialled.
        self._unproven[conn] = self.guard.clock.monotonic()
        conn.setOnMessageReceivedCallback(functools.partial(self._onUnproven, conn))
        self._start_tls(conn, server_side=False)

    def _onUnproven(self, conn: Any, message: Any) -> None:
        """Dialer: a frame before the handshake proved the acceptor (cannot happen:
        no plaintext comes out of TLS before it). Closed, never handed on."""
        self._refuse(conn)

    def _onDisconnected(self, conn: Any) -> None:
        self._unproven.pop(conn, None)
        self._verified.pop(conn, None)
        for raft, guest in list(self._guests.items()):
            if self._connections.get(guest) is conn:
                # Not a member (nor a read-only node) of ours: forget it; if it led
                # us, run for election as when any leader's connection closes.
                del self._guests[raft]
                del self._connections[guest]
                self._guest_heard.pop(raft, None)
                self._leader_gone(guest)
                return
        super()._onDisconnected(conn)

    def _wake_at(self, delay: float) -> None:
        """Wake the tick thread ``delay`` seconds from now: it otherwise sleeps in its
        poll for up to ``autoTickPeriod`` (50 ms) past the election deadline when no
        message comes, and with the leader gone none does. Through PySyncObj's own
        pipe notifier (the one a proposal from another thread uses), from a one-shot
        timer thread; nothing happens if the node has stopped meanwhile."""
        notifier = getattr(self._syncObj, "_SyncObj__pipeNotifier", None)
        if notifier is None:
            return

        def wake() -> None:
            with contextlib.suppress(OSError, ValueError):  # pipe closed: node stopped
                notifier.notify()

        # One pending timer at most, however often a leader's connection flaps: a new
        # deadline is always earlier than the one before (``_leader_gone``), so the
        # old wake-up is no longer needed.
        if self._wake_timer is not None:
            self._wake_timer.cancel()
        timer = threading.Timer(delay + 0.001, wake)
        timer.daemon = True
        timer.start()
        self._wake_timer = timer

    def _onNodeDisconnected(self, node: Any) -> None:
        was_up = str(node.id) in self._up
        self._up.discard(str(node.id))
        super()._onNodeDisconnected(node)
        self._leader_gone(node, was_up)

    def _leader_gone(self, node: Any, was_up: bool = True) -> None:
        """A follower whose connection to its leader closed runs for election when its
        vote promise ends, plus its rank's slot (``early_election_delay``), instead of
        at its full random election timeout from the last heartbeat (0.7 s on average
        by default). A leader that dies (SIGKILL, crash) has its sockets closed by its
        kernel at once, so this is most failovers. Never before the promise ends: the
        old leader's lease relies on it, and ``refuse_vote`` would drop the vote
        requests anyway. A partition or a paused leader closes nothing and waits the
        usual timeout; a leader that is alive after all resets the deadline with its
        next heartbeat, as PySyncObj does.

        After a restart too: a node that has heard from no leader since it started
        (``heard_ago`` None) knows no leader, yet its open connection to the leader
        may be the one that closes (it restored its state from its own journal and
        counted as caught up before the first heartbeat named the leader). Without
        this it waited its random timeout while the other survivors ran in their
        slots, and could split the vote with them. Such a node takes the close of a
        member whose connection was up (``was_up``: not a failed dial) as its
        leader's and runs in its rank's slot counted without that member, as the
        other survivors do. If it was not the leader, the pre-vote fails (the others
        still hear the leader) and nothing changes. Tick thread."""
        sync = self._syncObj
        if sync._isLeader():
            return
        leader = sync._getLeader()
        if leader is None:
            if not was_up or self.guard.heard_ago() is not None:
                return
        elif str(leader.id) != str(node.id):
            return
        rank = election_rank(
            str(self._selfNode.id), [str(n.id) for n in sync.otherNodes], str(node.id)
        )
        delay = early_election_delay(self.guard.promise_left(), self.guard.promise, rank)
        # On PySyncObj's own clock: it compares the deadline with CLOCK_MONOTONIC_RAW,
        # not time.monotonic(). NTP slews CLOCK_MONOTONIC only, so the two drift apart
        # with uptime (0.26 s after 3 h on the CI VM kind), and a deadline on the wrong
        # one fired that much late (or was not taken at all, for looking later).
        deadline = raft_clock() + delay
        # PreVote keeps PySyncObj's deadline at NEVER between ticks and takes what is
        # written there at the next one (prevote.py): compare with the real deadline.
        prevote = getattr(self, "prevote", None) if self.pre_vote else None
        current = prevote.deadline() if prevote is not None else sync._SyncObj__raftElectionDeadline
        if deadline < current:
            sync._SyncObj__raftElectionDeadline = deadline
            self.guard.early_elections += 1
            self._wake_at(delay)
            log.info(
                "connection to leader %s closed: running for election in %.3f s (the "
                "vote promise's end plus the slot of rank %d)",
                node.id,
                delay,
                rank,
            )

    def _note_dropped_vote(self, term: Any) -> None:
        """A member's ``request_vote`` of ``term`` was dropped under our vote promise:
        remember the highest such term (``_adopt_dropped_term``). Tick thread."""
        if isinstance(term, int) and not isinstance(term, bool) and term > self._dropped_vote[0]:
            self._dropped_vote = (term, self.guard.clock.monotonic())

    def _adopt_dropped_term(self) -> None:
        """Once our vote promise has ended, take the term of a vote request we dropped
        under it, as PySyncObj takes any higher term it sees (its term, no vote, a
        follower, no leader). Tick thread; each tick.

        Why: the survivors of a dead leader run for election in rank order
        (``_leader_gone``). If the first one's request reaches a survivor whose
        promise still holds (it heard the leader's last message a little later; a
        loaded machine), that survivor drops it and later runs in the *same* term,
        in which the first has voted for itself: a split vote, and both wait a full
        random election timeout (a failover of ~1.1 s instead of ~0.45 s). Having
        taken the dropped term first, its own election is one term above the first
        one's, which the first (still a candidate) accepts. A term is only ever
        raised, and with no vote in it (we had not voted in a term above our own),
        so no vote is given twice. A dropped term older than twice the promise is
        forgotten: by then it is no news of this failover. Called by ``before_tick``."""
        term, when = self._dropped_vote
        if not term:
            return
        sync = self._syncObj
        guard = self.guard
        if term <= sync.raftCurrentTerm or guard.clock.monotonic() - when > 2 * guard.promise:
            self._dropped_vote = (0, 0.0)
            return
        if sync._isLeader() or guard.promise_left() > 0:
            return  # a leader never drops votes this way; under the promise, wait
        self._dropped_vote = (0, 0.0)
        log.info(
            "taking term %d of a vote request dropped under this node's vote promise "
            "(term %d until now), so that its own election does not split the vote",
            term,
            sync.raftCurrentTerm,
        )
        sync._SyncObj__setCurrentTerm(term, None)
        sync._SyncObj__setState(_RAFT_STATE.FOLLOWER)
        sync._SyncObj__raftLeader = None

    def _drop_unproven(self) -> None:
        """Close our outgoing connections whose acceptor has not proven itself within
        ``connectionTimeout``: PySyncObj times out only connections with traffic, and
        would never dial again while one stays open."""
        if not self._unproven:
            return
        now = self.guard.clock.monotonic()
        limit = self._syncObj.conf.connectionTimeout
        for conn, opened in list(self._unproven.items()):
            if now - opened > limit:
                refusals.warning("peer connection closed: no TLS handshake within %.1f s", limit)
                self._unproven.pop(conn, None)
                conn.disconnect()

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        """The first frame of an incoming connection, after its TLS handshake: the
        dialer's raft address. The connection is taken as that member only if the
        member's id is one its verified certificate names; a learner of this leader
        likewise. Anything else (a read-only node, a utility command such as
        ``status`` or ``transfer``, an address of no member, another member's
        address) closes the connection before PySyncObj attributes anything to a
        member."""
        ids = self._verified.pop(conn, None)
        if ids is None:  # no verified handshake: cannot happen (TLS gives nothing)
            self._refuse(conn)
            return
        node = None
        if isinstance(message, str):
            node = self._nodeAddrToNode.get(message) or self._learners.get(message)
        if node is None and self._tls is not None and self._stranded():
            me = self._selfNode
            ours = [NodeAddress(str(getattr(n, "rl_id", n.id)), str(n.id), "") for n in self._nodes]
            self_address = NodeAddress(str(getattr(me, "rl_id", me.id)), str(me.id), "")
            newer = newer_member(message, ids, ours, self_address, self._removed)
            if newer is not None:
                self._accept_guest(conn, message, newer)
                return
        if node is None:
            refusals.warning(
                "peer connection refused: its first frame names no member (%.80r)", message
            )
            self._refuse(conn)
            return
        member_id = getattr(node, "rl_id", None)
        if self._tls is not None and member_id not in ids:
            refusals.warning(
                "peer connection refused: it claims %s's address %s with a certificate for %s",
                member_id,
                message,
                ", ".join(ids) or "no member",
            )
            self._refuse(conn)
            return
        if (node in self._nodes or message in self._learners) and self._shouldConnect(node):
            # A member below our address dialled us (``_dial_silent_members``: it thinks
            # we do not know it). We do, and dial it ourselves: PySyncObj would take
            # this connection as the member's and later reconnect with it, an incoming
            # connection object that never sends our address.
            log.debug("peer %s dialled us; we dial it ourselves: closed", member_id)
            self._refuse(conn)
            return
        learner = message in self._learners and message not in self._nodeAddrToNode
        if learner and not self._syncObj._isLeader():  # a learner of this leader only
            self._refuse(conn)
            return
        if learner:
            self._accept_learner(conn, message)
            return
        self._dialled_us.add(str(node.id))
        super()._onIncomingMessageReceived(conn, message)

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        if node.id in self._leaving:
            # A removed member's late replies: PySyncObj's leader would index its
            # per-member tables with it (a KeyError on the tick thread).
            return
        if node.id in self._learners and node not in self._nodes:
            # A learner never takes part: only its acknowledgements of the log it is
            # streamed (its match index) are taken, and not for the leader lease (no
            # guard.on_reply). Its vote requests, term notices, anything else: dropped.
            if (
                isinstance(message, dict)
                and message.get("type") == "next_node_idx"
                and self._syncObj._isLeader()
                and node in self._readonlyNodes
            ):
                super()._onMessageReceived(node, message)
            return
        if node.id in self._guests and node not in self._nodes:
            # A member of a newer configuration (_accept_guest): we may vote for it
            # and take its leader's log, nothing else; as a leader, nothing.
            kind = message.get("type") if isinstance(message, dict) else None
            if self._syncObj._isLeader():
                self._drop_guests()
                return
            if kind not in GUEST_MESSAGE_TYPES:
                return
            self._guest_heard[node.id] = self.guard.clock.monotonic()
            if message.get("rl_bump"):
                # Our "your term is stale" notice skips the vote promise; we never
                # send a guest anything that would earn one.
                message = {k: v for k, v in message.items() if k != "rl_bump"}
        if isinstance(message, dict) and message.get("type") == "rl_removed":
            self._removal_notice(node, message)
            return
        if isinstance(message, dict) and message.get("type") in PRE_VOTE_TYPES:
            self.prevote.on_message(node, message)
            return
        if not isinstance(message, dict) or message.get("type") not in PEER_MESSAGE_TYPES:
            # Only the Raft messages we use: never apply_command (we do not forward
            # proposals) nor timeout_now (we never transfer leadership).
            kind = message.get("type") if isinstance(message, dict) else type(message).__name__
            log.warning(
                "peer %s sent a %.40r message: dropped", getattr(node, "rl_id", node.id), kind
            )
            return
        if isinstance(message, dict):
            kind = message.get("type")
            sync = self._syncObj
            if kind == "request_vote":
                if message.get("rl_bump"):
                    pass  # "your term is stale": always let PySyncObj see it
                elif sync._isLeader():
                    # Leader stickiness (CheckQuorum): while a majority acknowledges
                    # us, a candidate that cannot hear us must not depose us.
                    if self.guard.has_quorum():
                        return
                elif self.guard.refuse_vote():
                    self._note_dropped_vote(message.get("term"))
                    return
            elif kind == "append_entries":
                term = message.get("term")
                if isinstance(term, int):
                    if term < sync.raftCurrentTerm:
                        self._tell_stale_leader(node, sync.raftCurrentTerm)
                    self.guard.on_append_entries(
                        node.id, term, sync.raftCurrentTerm, message.get("rl_s")
                    )
                    correct = self.follower_log_correction
                    if (
                        correct
                        and term >= sync.raftCurrentTerm
                        and "prevLogIdx" in message
                        and message.get("transmission") in (None, "finish")
                    ):
                        plan = plan_append_entries(
                            sync._SyncObj__raftLog, sync.raftCommitIndex, message, self._conflict
                        )
                        self._conflict = plan.conflict
                        self._reply_next = plan.reply_next
                        self._note_rejection(node, term, plan)
                        try:
                            super()._onMessageReceived(node, plan.message)
                        finally:
                            self._reply_next = None
                        return
                    if correct and term >= sync.raftCurrentTerm and "prevLogIdx" not in message:
                        message = self._snapshot_message(sync, message)
            elif kind == "next_node_idx" and sync._isLeader():
                self.guard.on_reply(
                    node.id, message.get("rl_et"), message.get("rl_e"), message.get("rl_t")
                )
        super()._onMessageReceived(node, message)

    def _removal_notice(self, node: Any, message: dict[str, Any]) -> None:
        """A leader says our removal committed at ``index``. Only a leader sends it,
        and only after the commit, which no later leader undoes, over an authenticated
        member connection (frames of one connection cannot be replayed on another).
        We may have lost track of that leader meanwhile (our election timeout fires
        once it stops sending to us, and our term may then be above its), so neither
        our view of the leader nor the term decides."""
        index = message.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 1:
            log.warning("malformed removal notice from %s ignored", node.id)
            return
        # A static function bound by Replica (not a method of ours).
        callback: Any = inspect.getattr_static(self, "on_removed", None)
        if isinstance(callback, staticmethod):
            callback = callback.__func__
        if callback is not None:
            callback(index)

    def _note_rejection(self, node: Any, term: int, plan: AppendPlan) -> None:
        """Warn while this follower keeps rejecting the leader's log (finding 1 of
        jepsen-style/README.md was a follower stuck this way for tens of seconds)."""
        now = self.guard.clock.monotonic()
        if plan.accepted:
            if self._rejecting is not None and now - self._rejecting[0] >= REJECTING_WARN_AFTER:
                log.warning("taking the leader's log again after %.1f s", now - self._rejecting[0])
            self._rejecting = None
            return
        if self._rejecting is None:
            self._rejecting = (now, now)
        elif now - self._rejecting[1] >= REJECTING_WARN_AFTER:
            self._rejecting = (self._rejecting[0], now)
            log_ = self._syncObj._SyncObj__raftLog
            log.warning(
                "rejecting leader %s's log (term %d) for %.1f s: its prevLogIdx %s, our log "
                "%d..%d (last term %d), answering next %s",
                node.id,
                term,
                now - self._rejecting[0],
                plan.message.get("prevLogIdx"),
                log_[0][1],
                log_[-1][1],
                log_[-1][2],
                plan.reply_next,
            )

    def _snapshot_message(self, sync: Any, message: dict[str, Any]) -> dict[str, Any]:
        """An ``append_entries`` of the snapshot path (no ``prevLogIdx``: a chunk of
        the leader's dump, or ``serialized`` None while it has none ready).

        PySyncObj sets the follower's commit index to min(leader's, own log end) after
        any such message, though it verified none of the follower's entries: a deposed
        leader whose uncommitted tail the new leader cannot probe (it is behind the
        leader's compacted log start) would apply that tail, and answer its own
        clients' proposals in it with success. Such a message therefore commits
        nothing here (the installed snapshot itself is committed; later entries are
        committed by the messages that verify them).

        A dump that ends inside our log at an entry of the same term (a repeat sent
        after a stale rejection) is not installed (``snapshot_is_behind``): the
        message goes on with ``serialized`` None, and the leader, which already moved
        its next index past the dump, verifies our log with its next message."""
        out = dict(message)
        leader_commit = message.get("commit_index")
        if isinstance(leader_commit, int) and leader_commit > sync.raftCommitIndex:
            out["commit_index"] = sync.raftCommitIndex
        chunk = message.get("serialized")
        if isinstance(chunk, tuple | list) and len(chunk) == 3:
            data, is_first, is_last = chunk
            if is_first:
                self._snapshot_in = bytearray()
            if self._snapshot_in is not None and isinstance(data, bytes | bytearray):
                self._snapshot_in += data
            if is_last:
                received, self._snapshot_in = self._snapshot_in, None
                if received is not None and snapshot_is_behind(
                    sync._SyncObj__raftLog, bytes(received)
                ):
                    log.info("snapshot from the leader ends inside our log: not installed")
                    out["serialized"] = None
        return out

    def _tell_stale_leader(self, node: Any, term: int) -> None:
        """Answer an ``append_entries`` of an older term (PySyncObj ignores it
        silently) with our term, so a leader that cannot otherwise learn it steps down.
        This is how a node whose term grew while it was cut off rejoins: leaders and
        followers drop its vote requests, but not this notice. It carries an empty log
        position, so it never wins a vote. At most one per peer per heartbeat."""
        now = self.guard.clock.monotonic()
        if now - self._bumped.get(node.id, float("-inf")) < self.guard.promise / 4:
            return
        self._bumped[node.id] = now
        super().send(
            node,
            {
                "type": "request_vote",
                "term": term,
                "last_log_index": 0,
                "last_log_term": 0,
                "rl_bump": True,
            },
        )
