"""Peer authentication and bounded peer frames (docs/security.md, "Peers").

PySyncObj's peer protocol is pickle: whoever can send a frame to a Raft port runs code
in the node. Every peer connection is therefore authenticated before PySyncObj
unpickles anything:

* The cluster shares a secret (``peer_secret_file``; created by the first node that
  starts without one, mode 0600). PySyncObj's encryption path (``SyncObjConf.password``)
  is on, with our ``PeerCipher`` (AES-GCM, a key per frame) in place of its Fernet: every
  frame's tag is verified *before* it is decompressed and unpickled, and both ends prove
  they hold the key in PySyncObj's random-key exchange before the connection counts. A
  stranger's frame fails the tag check and the connection is closed.
* ``BoundedTcpConnection`` refuses a frame longer than ``MAX_PEER_FRAME`` (or with a
  negative length) and a read buffer beyond ``MAX_PEER_BUFFER`` before anything is
  decrypted, and bounds decompression to ``MAX_PEER_DECOMPRESSED``, so even a peer
  cannot make a node buffer without end.
* ``LeaseTransport`` (transport.py) then accepts only what we use: the first frame must
  be a configured member's signed hello (identity.py; no read-only nodes, no utility
  commands such as ``status`` or ``transfer``), and only the Raft messages of
  ``PEER_MESSAGE_TYPES``.

What this does not give: identity per node. Every member holds the same secret; which
member a connection is, is proven by the signed first frame of identity.py. After the
hellos, ``ConnectionCipher`` seals with a key agreed for that connection alone and
the secret together, so the secret alone opens no later frame.

Rolling rotation (docs/security.md, "Rotating the peer secret"): the secret file holds
one secret per line; the first seals, every one opens. Each frame names the key that
sealed it by a 4-byte key id derived from that secret, so opening costs one lookup and
one AES-GCM try, never a trial of every key. ``PeerCipher.rekey`` (``SIGHUP``) swaps
the keys under every open connection at once (PySyncObj gives all connections the one
cipher object).

Threads: connections run on PySyncObj's tick thread; the secrets are read at start and
at each ``SIGHUP`` (event loop), which swaps them in without a lock (``PeerCipher``).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import pickle
import secrets
import socket
import stat
import struct
import zlib
from pathlib import Path
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pysyncobj.monotonic import monotonic as pysyncobj_monotonic
from pysyncobj.tcp_connection import TcpConnection

from ..errors import ConfigError

log = logging.getLogger("raftlease.replication")

#: Longest peer frame accepted (bytes on the wire, before decryption). PySyncObj
#: sends entries and snapshot chunks in batches of 64 KiB; one entry is at most a
#: client frame (``max_frame``) plus its batch.
MAX_PEER_FRAME = 32 << 20
#: Most bytes buffered for one peer connection before frames are parsed.
MAX_PEER_BUFFER = 2 * MAX_PEER_FRAME + 4
#: Largest decompressed peer frame.
MAX_PEER_DECOMPRESSED = 128 << 20
#: The Raft messages members exchange that we accept (``apply_command`` is never used:
#: we do not forward proposals; ``timeout_now`` is PySyncObj's leadership transfer,
#: which we never start).
PEER_MESSAGE_TYPES = frozenset({"append_entries", "next_node_idx", "request_vote", "response_vote"})

SECRET_BYTES = 32

#: Pickled peer messages shorter than this go out as a *stored* zlib stream (no
#: deflate): ``zlib.compress`` spends 18-24 µs setting up its window for a message of
#: a few hundred bytes (a lone acquire's append and its answers), more than the
#: pickling and the sealing together, to save ~100 bytes on loopback or a LAN.
#: Longer messages (batches, snapshot chunks) are still deflated, so frames stay
#: far below ``MAX_PEER_FRAME``.
STORED_BELOW = 16 * 1024
# zlib header of a deflate stream with a 32 KiB window and no preset dictionary
# (RFC 1950: CMF 0x78, FLG 0x01, 0x7801 % 31 == 0); then one final stored block.
_ZLIB_STORED_HEAD = b"\x78\x01\x01"


#: The pickle protocol of our peer messages (PySyncObj uses 2; log commands are
#: sealed protocol-5 pickles, journal.py). In protocol 2 a ``bytes`` value (a log
#: entry's command) is pickled as latin-1 text: every byte >= 0x80 takes two, and
#: loading it calls ``_codecs.encode``. Protocol 4 (Python 3.4+) stores bytes as they
#: are; ``pickle.loads`` reads every protocol, so members of either kind read each
#: other's messages.
PICKLE_PROTOCOL = 4


def zlib_frame(data: bytes) -> bytes:
    """``data`` as a zlib stream any zlib reader (PySyncObj's or ours) inflates back:
    one stored deflate block (RFC 1951 3.2.4) below ``STORED_BELOW`` bytes, else
    PySyncObj's ``zlib.compress(data, 3)``."""
    n = len(data)
    if n >= STORED_BELOW:
        return zlib.compress(data, 3)
    return (
        _ZLIB_STORED_HEAD
        + struct.pack("<HH", n, n ^ 0xFFFF)
        + data
        + struct.pack(">I", zlib.adler32(data))
    )


#: Most secrets one secret file may hold (the sealing one and those still accepted).
MAX_SECRETS = 4


def load_or_create_secret(path: Path) -> str:
    """The cluster's peer secret file's text from ``path`` (``load_secrets``); the
    file is created (one random secret, mode 0600) if it does not exist, atomically,
    so nodes starting together share one. Raises ``ConfigError`` as
    ``load_secrets``."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, (secrets.token_hex(SECRET_BYTES) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # fails if another node created it first: use theirs
            log.warning("created the cluster's peer secret %s: every member needs this file", path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    return load_secrets(path)


def load_secrets(path: Path) -> str:
    """The peer secret file at ``path``, never created: its secrets, one per line
    (blank lines and surrounding white space dropped), joined by newlines. The first
    seals frames; the others are accepted too, during a rotation. Blocks on the
    file read. Raises ``ConfigError`` if the file is missing, unreadable, readable by
    group or others, or its secrets are not valid (``parse_secrets``)."""
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the peer secret {str(path)!r}: {exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"the peer secret {str(path)!r} is readable by other users (mode "
            f"{stat.S_IMODE(mode):o}); run: chmod 600 {path}"
        )
    try:
        found = parse_secrets(text)
    except ConfigError as exc:
        raise ConfigError(f"the peer secret {str(path)!r}: {exc}") from None
    return "\n".join(found)


def parse_secrets(text: str) -> tuple[str, ...]:
    """The secrets of a peer secret file's text, one per non-blank line, the sealing
    one first. Raises ``ConfigError`` (naming no secret) unless there are 1 to
    ``MAX_SECRETS`` of them, each at least 32 characters, with distinct key ids."""
    found: list[str] = []
    for line in text.splitlines():
        secret = line.strip()
        if secret and secret not in found:
            found.append(secret)
    if not found:
        raise ConfigError("must hold at least 32 characters (it holds no secret)")
    if len(found) > MAX_SECRETS:
        raise ConfigError(
            f"holds {len(found)} secrets; at most {MAX_SECRETS} (the sealing one first, "
            "then those still accepted)"
        )
    for n, secret in enumerate(found, start=1):
        if len(secret) < 32:
            raise ConfigError(f"must hold at least 32 characters (line {n} of its secrets)")
    ids = [key_id(_frame_key(secret)) for secret in found]
    if len(set(ids)) != len(ids):  # 1 in 2**32 per pair: make another secret
        raise ConfigError("two of its secrets have the same key id; replace one")
    return tuple(found)


def _frame_key(secret: str) -> bytes:
    """The key the per-frame keys are derived from (BLAKE2b of the secret)."""
    return hashlib.blake2b(secret.encode(), digest_size=32, person=b"raftlease-peer1").digest()


def key_id(key: bytes) -> bytes:
    """The 4-byte id frames carry to name the secret that sealed them: a hash of the
    secret's frame key under its own label, so it reveals nothing the sealed frames
    do not (it appears in log lines, as hex). Never a secret."""
    return hashlib.blake2b(key, digest_size=4, person=b"raftlease-kid1").digest()


class UnacceptedKey(ValueError):
    """A peer frame sealed with a key this node does not accept (a stranger's, or a
    secret dropped by a rotation). Its message names only the frame's key id."""


class PeerCipher:
    """Authenticated encryption of peer frames, in place of PySyncObj's Fernet (which
    costs ~70 us per frame round trip here; this costs a few): AES-128-GCM under a key
    derived per frame from a cluster secret and 16 random bytes (BLAKE2b keyed with
    the secret), so no nonce is ever reused whatever the number of frames. The frame's
    time stamp and key id are authenticated as associated data. Same interface as the
    Fernet object PySyncObj uses (``encrypt_at_time``, ``extract_timestamp``,
    ``decrypt``); our transport installs it before PySyncObj makes any connection.

    ``secret``: the secret file's text, one secret per line (``parse_secrets``): the
    first seals, each opens. A frame names its secret by key id, so opening looks
    the key up once: a frame of a secret not held is refused (``UnacceptedKey``)
    before any decryption.

    Token: time stamp (8 bytes, big endian) | key id (4) | salt (16) | ciphertext
    and tag.

    Threads: any; ``rekey`` replaces the accepted keys, then the sealing key, each in
    one assignment that a frame reads once, so a frame is sealed (or opened) wholly
    with the old key (keys) or the new.
    Raises ``ConfigError`` (constructor, ``rekey``) for a text ``parse_secrets``
    refuses."""

    _NONCE = bytes(12)

    def __init__(self, secret: str) -> None:
        self.rekey(secret)

    def rekey(self, secret: str) -> None:
        """Seal with the first secret of ``secret`` from now on, and open frames of
        any of its secrets only (the keys of every connection change at once).
        Raises ``ConfigError`` and changes nothing if ``secret`` is not valid."""
        keys = [_frame_key(s) for s in parse_secrets(secret)]
        # Two attributes, each read once per frame: sealing and opening are each
        # wholly old or wholly new (they never depend on one another).
        self._accepted = {key_id(k): k for k in keys}
        self._seal = (key_id(keys[0]), keys[0])

    @property
    def key_ids(self) -> tuple[str, tuple[str, ...]]:
        """The sealing key's id and every accepted key's id (sealing one first), hex."""
        return self._seal[0].hex(), tuple(k.hex() for k in self._accepted)

    # The per-frame key is inlined in both paths (no helper call): this runs for
    # every peer frame on the tick thread.
    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        kid, key = self._seal
        head = struct.pack(">Q", current_time) + kid
        salt = os.urandom(16)
        cipher = AESGCM(hashlib.blake2b(salt, key=key, digest_size=16).digest())
        return head + salt + cipher.encrypt(self._NONCE, data, head)

    def extract_timestamp(self, token: bytes) -> int:
        if len(token) < 44:  # time stamp, key id, salt, tag
            raise ValueError("peer frame too short")
        stamp: int = struct.unpack(">Q", token[:8])[0]
        return stamp

    def decrypt(self, token: bytes) -> bytes:
        """The frame's plaintext; raises ``UnacceptedKey`` if its key id is not one
        of the accepted secrets', ``cryptography.exceptions.InvalidTag`` (or
        ``ValueError``) unless it was sealed with that secret, unchanged."""
        if len(token) < 44:
            raise ValueError("peer frame too short")
        key = self._accepted.get(token[8:12])
        if key is None:
            raise UnacceptedKey(f"sealed with key id {token[8:12].hex()}, not accepted here")
        cipher = AESGCM(hashlib.blake2b(token[12:28], key=key, digest_size=16).digest())
        plain: bytes = cipher.decrypt(self._NONCE, token[28:], token[:12])
        return plain


class ConnectionCipher:
    """The cipher of one peer connection after its signed hellos (transport.py): as
    ``PeerCipher``, but each frame's key is derived from the cluster secret's frame
    key *and* the connection key agreed in the hellos (identity.connection_key), so
    neither the cluster secret alone (an insider on the path) nor another
    connection's key opens it. The frame names the cluster secret's key id as
    ``PeerCipher`` does, and the cluster cipher's keys are read at every frame: a
    rotation (``PeerCipher.rekey``) applies under every connection at once, and a
    frame of a secret no longer accepted is refused with ``UnacceptedKey``.

    Per-frame cost: that of ``PeerCipher`` plus one dict lookup (the combined key is
    computed once per cluster key). Threads: the tick thread (one connection's);
    reads the cluster cipher's keys as ``PeerCipher`` does. Raises as
    ``PeerCipher.decrypt``."""

    _NONCE = bytes(12)

    def __init__(self, cluster: PeerCipher, key: bytes) -> None:
        self._cluster = cluster
        self._key = key
        self._combined: dict[bytes, bytes] = {}  # cluster frame key -> ours

    def _for(self, cluster_key: bytes) -> bytes:
        combined = self._combined.get(cluster_key)
        if combined is None:
            combined = hashlib.blake2b(
                self._key, key=cluster_key, digest_size=32, person=b"raftlease-conn1"
            ).digest()
            if len(self._combined) >= 2 * MAX_SECRETS:  # keys dropped by rotations
                self._combined.clear()
            self._combined[cluster_key] = combined
        return combined

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        kid, key = self._cluster._seal
        head = struct.pack(">Q", current_time) + kid
        salt = os.urandom(16)
        cipher = AESGCM(hashlib.blake2b(salt, key=self._for(key), digest_size=16).digest())
        return head + salt + cipher.encrypt(self._NONCE, data, head)

    def extract_timestamp(self, token: bytes) -> int:
        return self._cluster.extract_timestamp(token)

    def decrypt(self, token: bytes) -> bytes:
        if len(token) < 44:
            raise ValueError("peer frame too short")
        key = self._cluster._accepted.get(token[8:12])
        if key is None:
            raise UnacceptedKey(f"sealed with key id {token[8:12].hex()}, not accepted here")
        cipher = AESGCM(hashlib.blake2b(token[12:28], key=self._for(key), digest_size=16).digest())
        plain: bytes = cipher.decrypt(self._NONCE, token[28:], token[:12])
        return plain


#: Peer messages a member answers: the sender then awaits data on the connection.
AWAITS_ANSWER = frozenset({"append_entries", "request_vote"})


class BoundedTcpConnection(TcpConnection):  # type: ignore[misc]
    """PySyncObj's peer connection with bounded frames and buffers and cheaper small
    frames, and a dead-peer timeout that spares idle connections. Installed on each
    connection object by changing its class (transport.py); the read path and
    ``send`` mirror PySyncObj's (tests/test_pysyncobj_contract.py). Tick thread only."""

    #: When a message that awaits an answer (``AWAITS_ANSWER``) was first sent after
    #: the last read; None while nothing is awaited. A class default: connections
    #: become this class after PySyncObj built them.
    _rl_awaiting: float | None = None

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
        super().disconnect()

    def send(self, message: Any) -> None:
        # PySyncObj's send with two changes: a small message is framed as a stored
        # zlib stream instead of deflated (``zlib_frame``), and pickled with
        # ``PICKLE_PROTOCOL``, not 2. A reader inflates either framing and loads any
        # protocol, so mixed versions interoperate.
        kind = message.get("type") if isinstance(message, dict) else None
        if self._rl_awaiting is None and kind in AWAITS_ANSWER:
            self._rl_awaiting = pysyncobj_monotonic()
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        data = zlib_frame(pickle.dumps(message, PICKLE_PROTOCOL))
        if self.encryptor:
            data = self.encryptor.encrypt_at_time(data, int(pysyncobj_monotonic()))
        self._TcpConnection__writeBuffer += struct.pack("i", len(data)) + data
        self._TcpConnection__trySendBuffer()

    def _TcpConnection__processRead(self) -> bool:
        sock: socket.socket = self._TcpConnection__socket
        try:
            incoming = sock.recv(self._TcpConnection__recvBufferSize)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.disconnect()
            return False
        if not incoming:
            self.disconnect()
            return False
        self._rl_awaiting = None  # heard from: nothing is awaited any more
        buffer: bytes = getattr(self, "_TcpConnection__readBuffer") + incoming  # noqa: B009
        if len(buffer) > MAX_PEER_BUFFER:
            log.warning("peer connection buffered over %d bytes: closed", MAX_PEER_BUFFER)
            self.disconnect()
            return False
        self._TcpConnection__readBuffer = buffer
        return True

    def _TcpConnection__processParseMessage(self) -> Any:
        buffer: bytes = self._TcpConnection__readBuffer
        if len(buffer) < 4:
            return None
        (length,) = struct.unpack("i", buffer[:4])
        if not 0 < length <= MAX_PEER_FRAME:
            log.warning("peer frame of %d bytes refused: closed", length)
            self.disconnect()
            return None
        if len(buffer) - 4 < length:
            return None
        data = buffer[4 : 4 + length]
        try:
            if self.encryptor:
                stamp = self.encryptor.extract_timestamp(data)
                if stamp < getattr(self, "recvLastTimestamp"):  # noqa: B009
                    raise ValueError("frame older than the last one")
                self.recvLastTimestamp = stamp
                data = self.encryptor.decrypt(data)  # the HMAC is checked here
            inflater = zlib.decompressobj()
            plain = inflater.decompress(data, MAX_PEER_DECOMPRESSED)
            if inflater.unconsumed_tail:
                raise ValueError("frame decompresses beyond the limit")
            message = pysyncobj_pickle.loads(plain)
            if self.recvRandKey:
                rand_key, message = message
                if rand_key != self.recvRandKey:
                    raise ValueError("frame of another connection")
        except UnacceptedKey as exc:  # a stranger's, or a secret dropped by a rotation
            log.warning("unauthenticated peer frame (%s): closed", exc)
            self.disconnect()
            return None
        except Exception as exc:
            log.warning("unauthenticated or malformed peer frame (%s): closed", type(exc).__name__)
            self.disconnect()
            return None
        self._TcpConnection__readBuffer = buffer[4 + length :]
        return message
