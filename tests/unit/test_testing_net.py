"""``raftlease.testing.net``: the kernel's TCP tables as the tests read them."""

from __future__ import annotations

import os
import socket

import pytest

from raftlease.testing import wait_for
from raftlease.testing.net import ESTABLISHED, LISTEN, LOOPBACK, TcpSocket, tcp_sockets

pytestmark = pytest.mark.timeout(30)


def test_a_connection_and_its_unread_bytes_are_seen() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            with accepted:
                client.sendall(b"x" * 100)  # nobody reads them on the accepted side
                mine = client.getsockname()[1]

                def row() -> TcpSocket | None:
                    for sock in tcp_sockets():
                        if (sock.local_port, sock.remote_port) == (port, mine):
                            return sock if sock.rx_queue == 100 else None
                    return None

                found = wait_for(row, 10, "the accepted socket's 100 unread bytes")
                assert found.local_ip == LOOPBACK and found.state == ESTABLISHED
                listening = [s for s in tcp_sockets(os.getpid()) if s.local_port == port]
                assert any(s.state == LISTEN for s in listening)


def test_a_table_that_cannot_be_read_gives_no_rows() -> None:
    assert tcp_sockets(pid=2**22 + 12345) == []  # no such process
    assert tcp_sockets(tables=("no-such-table",)) == []
