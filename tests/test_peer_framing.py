"""Small peer frames go out as stored zlib streams (peers.zlib_frame): any zlib reader,
PySyncObj's own included, inflates them back, and frames from either side parse on
the other, so a cluster of mixed versions still talks."""

from __future__ import annotations

import os
import socket
import time
import zlib
from typing import Any

import pytest
from pysyncobj.poller import PollPoller
from pysyncobj.tcp_connection import TcpConnection

from raftlease.replication.peers import (
    MAX_PEER_DECOMPRESSED,
    STORED_BELOW,
    BoundedTcpConnection,
    zlib_frame,
)

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65, 4096, STORED_BELOW - 1, STORED_BELOW, 70_000])
def test_a_frame_inflates_back_with_any_zlib_reader(size: int) -> None:
    data = os.urandom(size)
    framed = zlib_frame(data)
    assert zlib.decompress(framed) == data  # PySyncObj's reader
    inflater = zlib.decompressobj()  # ours (peers.BoundedTcpConnection)
    assert inflater.decompress(framed, MAX_PEER_DECOMPRESSED) == data
    assert inflater.eof and not inflater.unconsumed_tail and not inflater.unused_data


def test_small_frames_are_stored_and_large_ones_deflated() -> None:
    small = b"a" * (STORED_BELOW - 1)
    assert len(zlib_frame(small)) == len(small) + 11  # header, block head, adler32
    large = b"a" * STORED_BELOW
    assert len(zlib_frame(large)) < 200  # deflated as PySyncObj does


def test_a_corrupted_stored_frame_is_refused_by_its_checksum() -> None:
    framed = bytearray(zlib_frame(b"append_entries"))
    framed[8] ^= 0x01
    with pytest.raises(zlib.error):
        zlib.decompress(bytes(framed))


def _pair(
    sender_class: type[Any], receiver_class: type[Any]
) -> tuple[Any, Any, list[Any], PollPoller]:
    left, right = socket.socketpair()
    left.setblocking(False)
    right.setblocking(False)
    poller = PollPoller()
    received: list[Any] = []
    sender = TcpConnection(poller, socket=left)
    receiver = TcpConnection(
        poller, socket=right, onMessageReceived=lambda message: received.append(message)
    )
    sender.__class__ = sender_class
    receiver.__class__ = receiver_class
    return sender, receiver, received, poller


@pytest.mark.parametrize(
    ("sender_class", "receiver_class"),
    [
        (BoundedTcpConnection, TcpConnection),
        (TcpConnection, BoundedTcpConnection),
        (BoundedTcpConnection, BoundedTcpConnection),
    ],
    ids=["ours-to-pysyncobj", "pysyncobj-to-ours", "ours-to-ours"],
)
def test_frames_parse_between_our_connections_and_pysyncobjs(
    sender_class: type[Any], receiver_class: type[Any]
) -> None:
    sender, receiver, received, poller = _pair(sender_class, receiver_class)
    messages = [
        {"type": "append_entries", "term": 3, "entries": [(b"x" * 300, 7, 3)]},
        {"type": "next_node_idx", "next_node_idx": 8, "success": True},
        {"type": "append_entries", "term": 3, "entries": [(os.urandom(40_000), 8, 3)]},
    ]
    try:
        for message in messages:
            sender.send(message)
        deadline = time.monotonic() + 10
        while len(received) < len(messages) and time.monotonic() < deadline:
            poller.poll(0.05)
        assert received == messages
    finally:
        sender.disconnect()
        receiver.disconnect()
