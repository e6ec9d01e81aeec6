"""Peer connections: mutual TLS under PySyncObj's framing, bounded buffers, and only
the Raft messages we use (docs/security.md, "Peers").

PySyncObj's peer protocol is pickle: whoever can send a frame to a Raft port runs code
in the node. So nothing a peer sends is parsed before it has proven, in a TLS 1.3
handshake with a certificate of the cluster CA, which member it is:

* ``BoundedTcpConnection`` runs a ``peer_tls.TlsSession`` on each connection: bytes
  received go into the session, plaintext comes out of it only once the handshake
  verified the peer's certificate; until then at most ``MAX_HANDSHAKE_BYTES`` are
  taken from the peer. Frames are PySyncObj's (a length, then a zlib stream of a
  pickle) inside the TLS records. A connection without a session is refused (fail
  closed; only a test build's plain peers, ``plain_ok``, go without).
* After the handshake, a frame whose length exceeds the configured limit
  (``max_peer_frame``) closes the connection as soon as its length is read, before
  its body is buffered; decompression stops at ``MAX_PEER_DECOMPRESSED``; the read
  loop stops at each whole frame, so one event never buffers more than a frame and
  one socket read.
* ``LeaseTransport`` (transport.py) takes a connection as member n2 only if the
  verified certificate names n2 and the first frame is n2's raft address, and then
  only the Raft messages of ``PEER_MESSAGE_TYPES``.

Threads: connections run on PySyncObj's tick thread.
"""

from __future__ import annotations

import errno
import logging
import pickle
import socket
import ssl
import struct
import time
import zlib
from collections.abc import Callable
from typing import Any, cast

from pysyncobj.monotonic import monotonic as pysyncobj_monotonic
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection

from ..config import DEFAULT_MAX_PEER_FRAME
from .peer_tls import MAX_HANDSHAKE_BYTES, TlsSession
from .safe_pickle import strict_loads

log = logging.getLogger("raftlease.replication")

#: The default longest peer frame (``max_peer_frame``; bytes of one frame's
#: plaintext). PySyncObj sends entries and snapshot chunks in batches of 64 KiB; one
#: entry is at most a client frame (``max_frame``) plus its stamps.
MAX_PEER_FRAME = DEFAULT_MAX_PEER_FRAME
#: Largest decompressed peer frame.
MAX_PEER_DECOMPRESSED = 128 << 20
#: The Raft messages members exchange that we accept (``apply_command`` is never used:
#: we do not forward proposals; ``timeout_now`` is PySyncObj's leadership transfer,
#: which we never start).
PEER_MESSAGE_TYPES = frozenset({"append_entries", "next_node_idx", "request_vote", "response_vote"})

#: Pickled peer messages shorter than this go out as a *stored* zlib stream (no
#: deflate): ``zlib.compress`` spends 18-24 µs setting up its window for a message of
#: a few hundred bytes (a lone acquire's append and its answers), more than the
#: pickling and the sealing together, to save ~100 bytes on loopback or a LAN.
#: Longer messages (batches, snapshot chunks) are still deflated, so frames stay
#: far below ``max_peer_frame``.
STORED_BELOW = 16 * 1024
# zlib header of a deflate stream with a 32 KiB window and no preset dictionary
# (RFC 1950: CMF 0x78, FLG 0x01, 0x7801 % 31 == 0); then one final stored block.
_ZLIB_STORED_HEAD = b"\x78\x01\x01"


#: The pickle protocol of our peer messages (PySyncObj uses 2; log commands are
#: sealed protocol-5 pickles, journal.py). In protocol 2 a ``bytes`` value (a log
#: entry's command) is pickled as latin-1 text: every byte >= 0x80 takes two, and
#: loading it calls ``_codecs.encode``. Protocol 4 (Python 3.4+) stores bytes as they
#: are.
PICKLE_PROTOCOL = 4

#: The largest plaintext of one TLS record (RFC 8446 5.1): what one read asks for.
_RECORD = 1 << 14
#: The one buffer every connection's reads go through (tick thread only).
_SCRATCH = bytearray(_RECORD)
#: A read buffer whose consumed head is longer than this is compacted.
_COMPACT_AT = 1 << 16


def zlib_frame(data: bytes) -> bytes:
    """``data`` as a zlib stream any zlib reader inflates back: one stored deflate
    block (RFC 1951 3.2.4) below ``STORED_BELOW`` bytes, else PySyncObj's
    ``zlib.compress(data, 3)``."""
    n = len(data)
    if n >= STORED_BELOW:
        return zlib.compress(data, 3)
    return (
        _ZLIB_STORED_HEAD
        + struct.pack("<HH", n, n ^ 0xFFFF)
        + data
        + struct.pack(">I", zlib.adler32(data))
    )


class RefusalLog:
    """Rate-limited warnings about refused peer connections: a stranger looping on
    the Raft port must not fill the disk with log lines. At most ``burst`` lines
    per ``period`` seconds; the next line after a quiet spell says how many were
    left out. Tick thread (a lock-free counter is enough there)."""

    def __init__(self, burst: int = 20, period: float = 10.0) -> None:
        self.burst = burst
        self.period = period
        self._window = float("-inf")
        self._count = 0
        self._dropped = 0

    def warning(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._window >= self.period:
            if self._dropped:
                log.warning(
                    "%d more refused peer connections were not logged in the last %.0f s",
                    self._dropped,
                    self.period,
                )
            self._window, self._count, self._dropped = now, 0, 0
        if self._count >= self.burst:
            self._dropped += 1
            return
        self._count += 1
        log.warning(message, *args)


refusals = RefusalLog()


#: Peer messages a member answers: the sender then awaits data on the connection.
AWAITS_ANSWER = frozenset({"append_entries", "request_vote"})


class BoundedTcpConnection(TcpConnection):  # type: ignore[misc]
    """PySyncObj's peer connection with TLS (``rl_start_tls``), bounded frames and
    buffers, cheaper small frames, and a dead-peer timeout that spares idle
    connections. Installed on each connection object by changing its class
    (transport.py); ``send``, the read path and the parser replace PySyncObj's
    (tests/fitness/test_pysyncobj_contract.py pins the names they replace). Tick thread only.

    Class defaults: connections become this class after PySyncObj built them."""

    #: When a message that awaits an answer (``AWAITS_ANSWER``) was first sent after
    #: the last read; None while nothing is awaited.
    _rl_awaiting: float | None = None
    #: The TLS session of the current connection (None: not started, or closed).
    _rl_tls: TlsSession | None = None
    #: Plaintext received and not yet parsed (from ``_rl_pos`` on).
    _rl_plain: bytearray | None = None
    _rl_pos: int = 0
    #: The longest frame accepted (``max_peer_frame``), set by the transport.
    _rl_limit: int = MAX_PEER_FRAME
    #: Test build only (plain peers): no TLS on this connection.
    _rl_plain_ok: bool = False
    #: Called once the handshake verified the peer (transport.py).
    _rl_on_verified: Callable[[TlsSession], None] | None = None

    # ------------------------------------------------------------------ TLS

    def rl_start_tls(
        self,
        context: ssl.SSLContext | None,
        server_side: bool,
        on_verified: Callable[[TlsSession], None],
        limit: int,
    ) -> None:
        """Begin this connection's TLS (a new session per TCP connection: an
        outgoing connection object is reused for each redial). ``context`` None:
        plain peers (a test build's baseline only). A dialer sends its ClientHello
        at once; ``on_verified`` runs when the handshake completed."""
        self._rl_plain = bytearray()
        self._rl_pos = 0
        self._rl_limit = limit
        if context is None:
            self._rl_tls = None
            self._rl_plain_ok = True
            self._rl_on_verified = None
            return
        self._rl_plain_ok = False
        self._rl_tls = TlsSession(context, server_side)
        self._rl_on_verified = on_verified
        if not server_side:
            self._rl_handshake(self._rl_tls)

    def _rl_handshake(self, tls: TlsSession) -> bool:
        """Advance the handshake; False if the connection was closed."""
        try:
            tls.obj.do_handshake()
        except ssl.SSLWantReadError:
            return self._rl_flush(tls)
        except (ssl.SSLError, OSError) as exc:
            self._rl_flush(tls)  # our alert, if any, tells the peer why
            refusals.warning("peer connection refused: TLS handshake failed (%s)", _tls_reason(exc))
            self.disconnect()
            return False
        tls.finish_handshake()
        if not self._rl_flush(tls):
            return False
        callback = self._rl_on_verified
        self._rl_on_verified = None
        if callback is not None:
            callback(tls)
        if self.state == CONNECTION_STATE.DISCONNECTED or self._rl_tls is not tls:
            return False
        if tls.pending:
            pending = bytes(tls.pending)
            tls.pending.clear()
            return self._rl_write(tls, pending)
        return True

    def _rl_write(self, tls: TlsSession, data: bytes) -> bool:
        try:
            tls.obj.write(data)
        except (ssl.SSLError, OSError) as exc:
            refusals.warning("peer connection closed: TLS write failed (%s)", _tls_reason(exc))
            self.disconnect()
            return False
        return self._rl_flush(tls)

    def _rl_flush(self, tls: TlsSession) -> bool:
        """Send what OpenSSL produced; False if the connection was closed."""
        data = tls.outgoing.read()
        if data:
            self._rl_send_raw(data)
        return bool(self.state != CONNECTION_STATE.DISCONNECTED)

    def _rl_send_raw(self, data: bytes) -> None:
        self._TcpConnection__writeBuffer += data
        self._TcpConnection__trySendBuffer()
        fileno = self._TcpConnection__fileno
        if self._TcpConnection__writeBuffer and fileno is not None:
            # PySyncObj re-arms the write event only from a write event: a rest left
            # by a full socket buffer would otherwise wait for our next send.
            self._TcpConnection__poller.subscribe(
                fileno,
                self._TcpConnection__processConnection,
                POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR,
            )

    # --------------------------------------------------------------- timeouts

    def _TcpConnection__processConnectionTimeout(self) -> None:
        # PySyncObj closes a connection on which nothing was read for ``timeout``,
        # checked at each send and at each socket event before reading it. Two
        # followers send each other nothing while their leader lives, so the first
        # vote request of an election met a connection idle for longer than that:
        # the sender's check closed it at the send, or the receiver's before reading
        # the request, and the request was lost (a split vote or a full election
        # timeout: 1.2-1.8 s failovers). Here only silence while an answer is
        # awaited, for ``timeout``, means a dead peer (the leader's heartbeats keep
        # that true of its followers); an idle connection's peer is left to TCP
        # keep-alive, which PySyncObj sets on every peer socket.
        awaiting = self._rl_awaiting
        if awaiting is None:
            return
        now = pysyncobj_monotonic()
        limit = self._TcpConnection__timeout
        if now - awaiting > limit and now - self._TcpConnection__lastReadTime > limit:
            self.disconnect()

    def disconnect(self) -> None:
        self._rl_awaiting = None  # a connection made again awaits nothing yet
        self._rl_tls = None
        self._rl_plain = None
        self._rl_pos = 0
        self._rl_on_verified = None
        super().disconnect()

    # ------------------------------------------------------------------ send

    def send(self, message: Any) -> None:
        # PySyncObj's framing (a length, a zlib stream of a pickle), pickled with
        # ``PICKLE_PROTOCOL``, small messages as a stored zlib stream
        # (``zlib_frame``), written into the TLS session.
        kind = message.get("type") if isinstance(message, dict) else None
        if self._rl_awaiting is None and kind in AWAITS_ANSWER:
            self._rl_awaiting = pysyncobj_monotonic()
        data = zlib_frame(pickle.dumps(message, PICKLE_PROTOCOL))
        frame = struct.pack("i", len(data)) + data
        tls = self._rl_tls
        if tls is None:
            if self._rl_plain_ok:
                self._rl_send_raw(frame)
            return  # no session (closed, or not yet connected): nothing may leave
        if not tls.done:
            tls.pending += frame
            return
        # _rl_write inlined: this runs for every peer frame on the tick thread.
        try:
            tls.obj.write(frame)
        except (ssl.SSLError, OSError) as exc:
            refusals.warning("peer connection closed: TLS write failed (%s)", _tls_reason(exc))
            self.disconnect()
            return
        self._rl_send_raw(tls.outgoing.read())

    # ------------------------------------------------------------------ read

    def _TcpConnection__processRead(self) -> bool:
        sock: socket.socket | None = self._TcpConnection__socket
        if sock is None:
            return False
        try:
            incoming = sock.recv(self._TcpConnection__recvBufferSize)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False
        # (PySyncObj also asks SO_ERROR here: a failed socket raises from recv or
        # reads as closed, so that system call per read is left out.)
        if not incoming:
            self.disconnect()
            return False
        self._rl_awaiting = None  # heard from: nothing is awaited any more
        plain = self._rl_plain
        tls = self._rl_tls
        if tls is None:
            if not self._rl_plain_ok or plain is None:
                refusals.warning("peer connection refused: no TLS session on it")
                self.disconnect()
                return False
            plain += incoming
            return self._rl_want_more()
        if not tls.done:
            tls.received += len(incoming)
            if tls.received > MAX_HANDSHAKE_BYTES:
                refusals.warning(
                    "peer connection refused: over %d bytes before its TLS handshake completed",
                    MAX_HANDSHAKE_BYTES,
                )
                self.disconnect()
                return False
            tls.incoming.write(incoming)
            if not self._rl_handshake(tls):
                return False
            if not tls.done:
                return True  # more of the handshake may be waiting in the socket
        else:
            tls.incoming.write(incoming)
        return self._rl_decrypt(tls) and self._rl_want_more()

    def _rl_decrypt(self, tls: TlsSession) -> bool:
        """Move every whole record's plaintext into the read buffer; False if the
        connection was closed (the peer's close_notify, an alert, a bad record).

        Each ``SSLObject`` call releases the GIL (``pending()`` too), and every release
        lets the node's event-loop thread take it while this tick waits to get it
        back: so one ``read`` per record, into a reused buffer, and no ``pending()``.
        A read of a whole record's plaintext (at most ``_RECORD``) that leaves no
        ciphertext in the memory buffer has emptied OpenSSL: no call (and no
        ``SSLWantReadError``) is needed to learn it."""
        plain = self._rl_plain
        if plain is None:
            return False
        read, incoming, scratch = tls.obj.read, tls.incoming, _SCRATCH
        while True:
            try:
                # With a buffer, read() fills it and returns the count (typeshed
                # knows only the bytes-returning form).
                count = cast(int, read(_RECORD, scratch))
            except ssl.SSLWantReadError:
                return True
            except (ssl.SSLError, OSError) as exc:
                if not isinstance(exc, ssl.SSLZeroReturnError):
                    refusals.warning("peer connection closed: %s", _tls_reason(exc))
                self.disconnect()
                return False
            if not count:
                self.disconnect()
                return False
            with memoryview(scratch) as view:
                plain += view[:count]
            if count < _RECORD and not incoming.pending:
                return True

    def _rl_want_more(self) -> bool:
        """After a read: close at once if the next frame's length exceeds the limit
        (before its body is buffered), and stop reading once a whole frame is here
        (the poller is level-triggered: what is left in the socket comes next)."""
        plain = self._rl_plain
        if plain is None:
            return False
        pos = self._rl_pos
        available = len(plain) - pos
        if available < 4:
            return True
        (length,) = struct.unpack_from("i", plain, pos)
        if not 0 < length <= self._rl_limit:
            log.warning(
                "peer frame of %d bytes refused (max_peer_frame %d): closed", length, self._rl_limit
            )
            self.disconnect()
            return False
        return bool(available < 4 + length)

    def _TcpConnection__processParseMessage(self) -> Any:
        plain = self._rl_plain
        if plain is None:
            return None
        pos = self._rl_pos
        if len(plain) - pos < 4:
            return None
        (length,) = struct.unpack_from("i", plain, pos)
        if not 0 < length <= self._rl_limit:
            log.warning(
                "peer frame of %d bytes refused (max_peer_frame %d): closed", length, self._rl_limit
            )
            self.disconnect()
            return None
        end = pos + 4 + length
        if len(plain) < end:
            return None
        try:
            inflater = zlib.decompressobj()
            with memoryview(plain) as view:
                data = inflater.decompress(view[pos + 4 : end], MAX_PEER_DECOMPRESSED)
            if inflater.unconsumed_tail:
                raise ValueError("frame decompresses beyond the limit")
            # Never PySyncObj's plain pickle.loads: any holder of a certificate of the
            # cluster CA (a client's too) gets its first frame this far, and a pickle
            # may name any callable. Builtin values only (safe_pickle.strict_loads).
            message = strict_loads(data)
        except Exception as exc:
            log.warning("malformed peer frame (%s): closed", type(exc).__name__)
            self.disconnect()
            return None
        if end == len(plain):
            plain.clear()
            end = 0
        elif end > _COMPACT_AT and end * 2 > len(plain):
            del plain[:end]  # drop the parsed head without copying it per frame
            end = 0
        self._rl_pos = end
        return message


def _tls_reason(exc: BaseException) -> str:
    """A short reason for a TLS failure (OpenSSL's reason code, else the text)."""
    reason = getattr(exc, "reason", None)
    verify = getattr(exc, "verify_message", None)
    if verify:
        return f"{reason or type(exc).__name__}: {verify}"
    return str(reason or exc or type(exc).__name__)
