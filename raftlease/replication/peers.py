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
member a connection is, is proven by the signed first frame of identity.py.

Threads: connections run on PySyncObj's tick thread; the secret is read at start.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import secrets
import socket
import stat
import struct
import zlib
from pathlib import Path
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
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


def load_or_create_secret(path: Path) -> str:
    """The cluster's peer secret from ``path``; created (random, mode 0600) if the file
    does not exist, atomically, so nodes starting together share one. Raises
    ``ConfigError`` if the file is readable by others, empty or unreadable."""
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
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the peer secret {str(path)!r}: {exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"the peer secret {str(path)!r} is readable by other users (mode "
            f"{stat.S_IMODE(mode):o}); run: chmod 600 {path}"
        )
    if len(text) < 32:
        raise ConfigError(f"the peer secret {str(path)!r} must hold at least 32 characters")
    return text


class PeerCipher:
    """Authenticated encryption of peer frames, in place of PySyncObj's Fernet (which
    costs ~70 us per frame round trip here; this costs a few): AES-128-GCM under a key
    derived per frame from the cluster secret and 16 random bytes (BLAKE2b keyed with
    the secret), so no nonce is ever reused whatever the number of frames. The frame's
    time stamp is authenticated as associated data. Same interface as the Fernet
    object PySyncObj uses (``encrypt_at_time``, ``extract_timestamp``, ``decrypt``);
    our transport installs it before PySyncObj makes any connection.

    Token: time stamp (8 bytes, big endian) | salt (16) | ciphertext and tag."""

    _NONCE = bytes(12)

    def __init__(self, secret: str) -> None:
        self._key = hashlib.blake2b(
            secret.encode(), digest_size=32, person=b"raftlease-peer1"
        ).digest()

    def _cipher(self, salt: bytes) -> AESGCM:
        return AESGCM(hashlib.blake2b(salt, key=self._key, digest_size=16).digest())

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        stamp = struct.pack(">Q", current_time)
        salt = os.urandom(16)
        return stamp + salt + self._cipher(salt).encrypt(self._NONCE, data, stamp)

    def extract_timestamp(self, token: bytes) -> int:
        if len(token) < 8 + 16 + 16:
            raise ValueError("peer frame too short")
        stamp: int = struct.unpack(">Q", token[:8])[0]
        return stamp

    def decrypt(self, token: bytes) -> bytes:
        """The frame's plaintext; raises ``cryptography.exceptions.InvalidTag`` (or
        ``ValueError``) unless it was made with the cluster secret, unchanged."""
        if len(token) < 8 + 16 + 16:
            raise ValueError("peer frame too short")
        stamp, salt = token[:8], token[8:24]
        plain: bytes = self._cipher(salt).decrypt(self._NONCE, token[24:], stamp)
        return plain


class BoundedTcpConnection(TcpConnection):  # type: ignore[misc]
    """PySyncObj's peer connection with bounded frames and buffers. Installed on
    each connection object by changing its class (transport.py); only the read path
    differs, and it mirrors PySyncObj's (tests/test_pysyncobj_contract.py)."""

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
        except Exception as exc:
            log.warning("unauthenticated or malformed peer frame (%s): closed", type(exc).__name__)
            self.disconnect()
            return None
        self._TcpConnection__readBuffer = buffer[4 + length :]
        return message
