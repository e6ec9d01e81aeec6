"""Small peer frames go out as stored zlib streams (peers.zlib_frame): any zlib reader,
PySyncObj's own included, inflates them back. (The frames travel inside TLS between
our connections: tests/unit/test_peer_tls.py.)"""

from __future__ import annotations

import os
import zlib

import pytest

from raftlease.replication.peers import (
    MAX_PEER_DECOMPRESSED,
    STORED_BELOW,
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
