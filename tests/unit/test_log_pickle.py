"""Peer messages are pickled with protocol 4 (replication/peers.py, ``PICKLE_PROTOCOL``)
and log commands are sealed protocol-5 pickles (replication/journal.py, "Sealed
commands"), not PySyncObj's protocol 2, which stores bytes as latin-1 text (every byte
>= 0x80 takes two). A node still loads a journal written by earlier versions
(protocol-2 and unsealed protocol-4 commands), and one holding every kind.

The unit half of these tests (no process); the integration half is
tests/integration/test_log_pickle.py."""

from __future__ import annotations

import pickle
import socket
import struct
import zlib

import pytest
from pysyncobj.poller import PollPoller
from pysyncobj.tcp_connection import TcpConnection

from raftlease.replication.peers import PICKLE_PROTOCOL, BoundedTcpConnection

pytestmark = pytest.mark.timeout(120)


def test_peer_messages_are_pickled_with_protocol_4() -> None:
    left, right = socket.socketpair()
    left.setblocking(False)
    try:
        sender = TcpConnection(PollPoller(), socket=left)
        sender.__class__ = BoundedTcpConnection
        # Plain mode (a test build's baseline): the frame as it goes inside TLS.
        sender.rl_start_tls(None, False, lambda session: None, 1 << 20)
        message = {"type": "append_entries", "entries": [(b"\x00\xa7\xff", 5, 1)]}
        sender.send(message)
        right.settimeout(10)
        head = right.recv(4)
        (length,) = struct.unpack("i", head)
        data = b""
        while len(data) < length:
            data += right.recv(length - len(data))
        plain = zlib.decompress(data)
        assert plain[:2] == bytes([0x80, PICKLE_PROTOCOL])
        assert b"\x00\xa7\xff" in plain  # bytes as they are, not latin-1 text
        assert pickle.loads(plain) == message
    finally:
        left.close()
        right.close()
