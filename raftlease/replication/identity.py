"""Per-node peer identity: an Ed25519 key per node, and the signed first frame that
binds an incoming peer connection to the member it claims to be (docs/security.md,
"Peers").

The cluster secret (peers.py) seals every frame, so only secret holders reach this
point; but every member holds the secret, so the secret alone cannot tell members
apart. Each node therefore has its own identity key (``peer_key_file``, default
``<data_dir>/peer.key``, created mode 0600 at first start, refused if others can read
it) and publishes its public key as ``<peer_keys_dir>/<id>.pub`` (default
``<data_dir>/../peers``, the parent that ``raftlease up`` and the test clusters share
with ``peer.secret``). The first frame a dialer sends, which PySyncObj makes its
member address, becomes a *hello*:

    ("rl_hello", 2, dialer address, dialer id, acceptor address, nonce, time, signature,
     exchange)

signed with the dialer's key over every field and over the acceptor's random
connection key from PySyncObj's key exchange (channel binding: a hello is valid on one
connection only). The acceptor (transport.py) checks that the member whose address is
claimed has that id and that its public key made the signature, that the hello is for
itself, recent (``HELLO_WINDOW``) and not seen before (a bounded nonce cache), before
PySyncObj attributes the connection to that member; otherwise it closes it.

The acceptor then proves who *it* is with a *hello reply*, the first frame it sends
after the key exchange:

    ("rl_hello_reply", 2, acceptor address, acceptor id, dialer id, nonce, time,
     signature, exchange)

signed with the acceptor's key (under another context string, so a hello can never
pass as a reply) over every field and over the *dialer's* random key from the key
exchange. The dialer takes nothing from the connection and sends nothing beyond its
hello until the reply verifies with the key of the member it dialled (same window,
nonce cache and key lookup as for a hello): an insider holding only the cluster
secret who binds a member's raft address is refused by the dialers.

A key per connection: ``exchange`` is an ephemeral X25519 public key (signed with the
rest). Both ends derive the connection's key from the shared secret, both public keys
and both random keys (``connection_key``) and drop their ephemeral private key; every
frame after the reply, both ways, is sealed with ``peers.ConnectionCipher`` (that key
and the cluster secret), so an insider holding only the secret who relays a running
connection opens and alters nothing after the hellos (transport.py switches the
connection's cipher at the exact frame).

Why not TLS: PySyncObj's poller drives plain non-blocking sockets itself (``recv`` /
``send`` and its own framing in tcp_connection.py); an ``ssl.SSLSocket`` there would
need its handshake and ``SSLWantRead``/``SSLWantWrite`` handled inside PySyncObj's read
and write paths, which we would have to replace wholesale. The handshake at our seam
keeps PySyncObj's framing unchanged.

Threads: ``HelloVerifier`` is used on PySyncObj's tick thread only; the rest are plain
functions (file I/O at start and on each incoming peer connection).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from ..errors import ConfigError

log = logging.getLogger("raftlease.replication")

HELLO = "rl_hello"
#: 2: the hello and the reply carry an ephemeral X25519 public key (``exchange``).
HELLO_VERSION = 2
#: Length of an X25519 public key (the hellos' ``exchange``).
EXCHANGE_BYTES = 32
#: A hello more than this many seconds from the acceptor's clock is refused.
HELLO_WINDOW = 60.0
#: Nonces of accepted hellos remembered (oldest forgotten first); a forgotten one
#: is older than the window by then in any realistic connection rate, and the
#: channel binding refuses it anyway.
NONCE_CACHE = 4096
NONCE_BYTES = 16
#: Node ids that may name a public key file.
_SAFE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_CONTEXT = b"raftlease peer hello v1\x00"
REPLY = "rl_hello_reply"
_REPLY_CONTEXT = b"raftlease peer hello reply v1\x00"


class HelloRefused(Exception):
    """A hello that does not authenticate the connection (the reason is the text)."""


def load_or_create_key(path: Path) -> Ed25519PrivateKey:
    """This node's identity key from ``path`` (PEM, PKCS#8); created (mode 0600,
    atomically) if the file does not exist. Raises ``ConfigError`` if it is readable
    by group or others, unreadable or not an Ed25519 key."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, pem)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # never replace a key that appeared meanwhile
            log.warning("created this node's peer identity key %s", path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the peer key {str(path)!r}: {exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"the peer key {str(path)!r} is readable by other users (mode "
            f"{stat.S_IMODE(mode):o}); run: chmod 600 {path}"
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"the peer key {str(path)!r} is not a PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"the peer key {str(path)!r} is not an Ed25519 key")
    return key


def public_hex(key: Ed25519PrivateKey) -> str:
    """The raw public key of ``key``, 64 hex digits."""
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw.hex()


def valid_public_hex(text: Any) -> bool:
    if not isinstance(text, str) or len(text) != 64:
        return False
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


def public_key_path(directory: Path, node_id: str) -> Path | None:
    """``<directory>/<node_id>.pub``, or None for an id that cannot be a file name."""
    if not _SAFE_ID.match(node_id):
        return None
    return directory / f"{node_id}.pub"


def write_public_key(directory: Path, node_id: str, pub: str) -> None:
    """Publish ``pub`` as ``node_id``'s public key in ``directory`` (made 0700),
    atomically; unchanged if it already says so. Raises ``ConfigError`` for an id
    that cannot be a file name, ``OSError`` if the directory cannot be written."""
    path = public_key_path(directory, node_id)
    if path is None:
        raise ConfigError(f"node id {node_id!r} cannot name a public key file")
    if read_public_key(directory, node_id) == pub:
        return
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, (pub + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_public_key(directory: Path, node_id: str) -> str | None:
    """``node_id``'s public key (hex) from ``directory``; None if there is no valid
    one (missing, unreadable or malformed file, or an unsafe id)."""
    path = public_key_path(directory, node_id)
    if path is None:
        return None
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if valid_public_hex(text) else None


def _signed_bytes(
    dialer: str,
    dialer_id: str,
    acceptor: str,
    nonce: bytes,
    stamp: float,
    binding: bytes,
    context: bytes = _CONTEXT,
    exchange: bytes = b"",
) -> bytes:
    parts = [p.encode() for p in (dialer, dialer_id, acceptor)] + [nonce, binding, exchange]
    body = b"".join(struct.pack(">I", len(p)) + p for p in parts)
    return context + body + struct.pack(">d", stamp)


def make_hello(
    key: Ed25519PrivateKey,
    dialer: str,
    dialer_id: str,
    acceptor: str,
    binding: bytes,
    now: float | None = None,
    nonce: bytes | None = None,
    exchange: bytes = b"",
) -> tuple[Any, ...]:
    """The first frame of a connection this node (``dialer``, raft address, id
    ``dialer_id``) dialled to ``acceptor`` (raft address). ``binding``: the random
    key the acceptor sent in PySyncObj's key exchange (b"" without encryption).
    ``exchange``: the dialer's ephemeral X25519 public key for this connection
    (``exchange_public``; signed too; b"" without encryption).
    ``now``/``nonce``: for tests; default the wall clock and fresh random bytes."""
    stamp = time.time() if now is None else now
    nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
    signed = _signed_bytes(dialer, dialer_id, acceptor, nonce, stamp, binding, _CONTEXT, exchange)
    signature = key.sign(signed)
    return (HELLO, HELLO_VERSION, dialer, dialer_id, acceptor, nonce, stamp, signature, exchange)


def make_reply(
    key: Ed25519PrivateKey,
    acceptor: str,
    acceptor_id: str,
    dialer_id: str,
    binding: bytes,
    now: float | None = None,
    nonce: bytes | None = None,
    exchange: bytes = b"",
) -> tuple[Any, ...]:
    """The acceptor's answer to a verified hello: this node (``acceptor``, raft
    address, id ``acceptor_id``) to the member ``dialer_id`` on the connection whose
    *dialer's* random key (PySyncObj's key exchange; b"" without encryption) is
    ``binding``. ``exchange``: the acceptor's ephemeral X25519 public key (signed).
    ``now``/``nonce``: for tests."""
    stamp = time.time() if now is None else now
    nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
    signed = _signed_bytes(
        acceptor, acceptor_id, dialer_id, nonce, stamp, binding, _REPLY_CONTEXT, exchange
    )
    signature = key.sign(signed)
    return (
        REPLY,
        HELLO_VERSION,
        acceptor,
        acceptor_id,
        dialer_id,
        nonce,
        stamp,
        signature,
        exchange,
    )


def exchange_public(private: X25519PrivateKey) -> bytes:
    """The raw public key (32 bytes) of an ephemeral X25519 key, for a hello."""
    return private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def connection_key(
    private: X25519PrivateKey,
    theirs: bytes,
    dialer_public: bytes,
    acceptor_public: bytes,
    dialer_rand: bytes,
    acceptor_rand: bytes,
) -> bytes:
    """The key of one peer connection (32 bytes), the same at both ends: BLAKE2b of
    the X25519 shared secret of ``private`` (our ephemeral key) and ``theirs`` (the
    other end's, from its signed hello), keyed by nothing secret but bound to both
    public keys and both random keys of PySyncObj's exchange on this connection. The
    cluster secret is mixed in per frame (``peers.ConnectionCipher``), so opening a
    frame needs both. The caller drops ``private`` afterwards (forward secrecy).
    Raises ``HelloRefused`` for a malformed or low-order public key."""
    if not (isinstance(theirs, bytes) and len(theirs) == EXCHANGE_BYTES):
        raise HelloRefused("hello without a key exchange")
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(theirs))
    except ValueError:  # an all-zero shared secret: a low-order point
        raise HelloRefused("hello with an unusable key exchange") from None
    parts = (shared, dialer_public, acceptor_public, dialer_rand, acceptor_rand)
    body = b"".join(struct.pack(">I", len(p)) + p for p in parts)
    return hashlib.blake2b(body, digest_size=32, person=b"raftlease-conn1").digest()


def _check_shape(what: str, nonce: Any, signature: Any, stamp: Any, exchange: Any) -> None:
    """The fields a hello and a hello reply (``what``) share are well formed. Raises
    ``HelloRefused``."""
    if not (isinstance(nonce, bytes) and len(nonce) == NONCE_BYTES):
        raise HelloRefused(f"malformed {what} nonce")
    if not (isinstance(signature, bytes) and len(signature) == 64):
        raise HelloRefused(f"malformed {what} signature")
    if isinstance(stamp, bool) or not isinstance(stamp, float | int):
        raise HelloRefused(f"malformed {what} time")
    if not (isinstance(exchange, bytes) and len(exchange) in (0, EXCHANGE_BYTES)):
        raise HelloRefused(f"malformed {what} key exchange")


class HelloVerifier:
    """The acceptor's check of hellos and the dialer's check of hello replies (tick
    thread only; one nonce cache for both).

    ``me``: this node's raft address. ``keys_for(address)``: the claimed member's id
    and its candidate public keys (hex), or None when ``address`` is no member."""

    def __init__(
        self,
        me: str,
        keys_for: Callable[[str], tuple[str, Iterable[str]] | None],
        window: float = HELLO_WINDOW,
        cache: int = NONCE_CACHE,
    ) -> None:
        self.me = me
        self.keys_for = keys_for
        self.window = window
        self.cache = cache
        self._seen: OrderedDict[bytes, float] = OrderedDict()

    def verify(self, message: Any, binding: bytes, now: float | None = None) -> str:
        """The member address ``message`` authenticates on a connection whose
        acceptor random key is ``binding``. Raises ``HelloRefused`` (reason as text)."""
        if not (isinstance(message, tuple) and len(message) == 9 and message[0] == HELLO):
            raise HelloRefused(f"first frame {message!r:.80} names no member in a signed hello")
        _, version, dialer, dialer_id, acceptor, nonce, stamp, signature, exchange = message
        if version != HELLO_VERSION:
            raise HelloRefused(f"hello version {version!r:.20}")
        if not all(isinstance(v, str) and len(v) <= 300 for v in (dialer, dialer_id, acceptor)):
            raise HelloRefused("malformed hello")
        _check_shape("hello", nonce, signature, stamp, exchange)
        if acceptor != self.me:
            raise HelloRefused(f"hello for {acceptor!r:.80}, not this node")
        clock = self._check_fresh("hello", stamp, nonce, now)
        member = self.keys_for(dialer)
        if member is None:
            raise HelloRefused(f"first frame names no member ({dialer!r:.80})")
        member_id, keys = member
        if dialer_id != member_id:
            raise HelloRefused(f"{dialer_id!r:.80} claims member {member_id!r}'s address")
        signed = _signed_bytes(
            dialer, dialer_id, acceptor, nonce, float(stamp), binding, _CONTEXT, exchange
        )
        self._check_signature("hello", member_id, keys, signature, signed, nonce, clock)
        return str(dialer)

    def verify_reply(
        self, message: Any, dialled: str, my_id: str, binding: bytes, now: float | None = None
    ) -> None:
        """Check the acceptor's reply on a connection this node dialled to member
        address ``dialled``, this node being ``my_id``, whose own random key (the
        dialer's) is ``binding``. Raises ``HelloRefused`` (reason as text) unless the
        reply names that member with its id, is for us, is recent, has a nonce not
        seen before and is signed by that member's key over this connection."""
        if not (isinstance(message, tuple) and len(message) == 9 and message[0] == REPLY):
            raise HelloRefused(
                f"{dialled!r:.80} answered {message!r:.80}, not a signed hello reply"
            )
        _, version, acceptor, acceptor_id, dialer_id, nonce, stamp, signature, exchange = message
        if version != HELLO_VERSION:
            raise HelloRefused(f"hello reply version {version!r:.20}")
        if not all(
            isinstance(v, str) and len(v) <= 300 for v in (acceptor, acceptor_id, dialer_id)
        ):
            raise HelloRefused("malformed hello reply")
        _check_shape("hello reply", nonce, signature, stamp, exchange)
        if acceptor != dialled:
            raise HelloRefused(f"hello reply from {acceptor!r:.80}, we dialled {dialled!r:.80}")
        if dialer_id != my_id:
            raise HelloRefused(f"hello reply for {dialer_id!r:.80}, not this node")
        clock = self._check_fresh("hello reply", stamp, nonce, now)
        member = self.keys_for(dialled)
        if member is None:
            raise HelloRefused(f"{dialled!r:.80} is no member")
        member_id, keys = member
        if acceptor_id != member_id:
            raise HelloRefused(f"{acceptor_id!r:.80} answered for member {member_id!r}")
        signed = _signed_bytes(
            acceptor, acceptor_id, dialer_id, nonce, float(stamp), binding, _REPLY_CONTEXT, exchange
        )
        self._check_signature("hello reply", member_id, keys, signature, signed, nonce, clock)

    def _check_fresh(self, what: str, stamp: float | int, nonce: bytes, now: float | None) -> float:
        """A hello (or reply, ``what``) within the time window whose nonce was not seen
        before; returns the clock it was judged by. Raises ``HelloRefused``."""
        clock = time.time() if now is None else now
        if not abs(clock - float(stamp)) <= self.window:
            raise HelloRefused(f"{what} time {float(stamp) - clock:+.0f} s from ours")
        if nonce in self._seen:
            raise HelloRefused(f"replayed {what} (nonce seen before)")
        return clock

    def _check_signature(
        self,
        what: str,
        member_id: str,
        keys: Iterable[str],
        signature: bytes,
        signed: bytes,
        nonce: bytes,
        clock: float,
    ) -> None:
        """``signature`` over ``signed`` verifies with one of the member's keys; only then
        is the nonce remembered. Raises ``HelloRefused``."""
        known = [k for k in keys if valid_public_hex(k)]
        if not known:
            raise HelloRefused(f"no public key known for member {member_id!r}")
        for pub in known:
            try:
                Ed25519PublicKey.from_public_bytes(bytes.fromhex(pub)).verify(signature, signed)
            except InvalidSignature:
                continue
            self._remember(nonce, clock)
            return
        raise HelloRefused(f"{what} not signed by member {member_id!r}'s key")

    def _remember(self, nonce: bytes, now: float) -> None:
        self._seen[nonce] = now
        while len(self._seen) > self.cache:
            self._seen.popitem(last=False)


class PeerIdentity:
    """What a node's transport needs: its key and id, and where members' public keys
    are. Immutable after construction; safe from any thread."""

    def __init__(self, key: Ed25519PrivateKey, node_id: str, keys_dir: Path) -> None:
        self.key = key
        self.node_id = node_id
        self.keys_dir = keys_dir
        self.public = public_hex(key)

    @classmethod
    def load(cls, key_path: Path, node_id: str, keys_dir: Path) -> PeerIdentity:
        """Load (or create) the key at ``key_path`` and publish its public key as
        ``<keys_dir>/<node_id>.pub``. Raises ``ConfigError``."""
        identity = cls(load_or_create_key(key_path), node_id, keys_dir)
        try:
            write_public_key(keys_dir, node_id, identity.public)
        except OSError as exc:
            raise ConfigError(
                f"cannot publish the peer public key in {str(keys_dir)!r}: {exc}"
            ) from None
        return identity
