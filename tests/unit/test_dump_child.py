"""The forked child that writes a dump closes the sockets it inherited
(``raftlease.replication.durable.close_inherited_sockets``).

Why it matters: with 100,000 leases the child writes for seconds. If the node is
SIGKILLed meanwhile and the child still held its copies of the node's sockets, the
followers would not see the leader's connections close (so no early election,
docs/design.md §9) and the node's ports would go on accepting connections that
nobody answers, instead of refusing them. Each test holds a listener, forks (or
lets the real dump writer fork) while the child is busy, closes the parent's copy
the way a killed parent's kernel would, and checks the port refuses.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.serializer import Serializer

from raftlease.replication.durable import DurableSerializer, close_inherited_sockets
from raftlease.testing import wait_for

pytestmark = pytest.mark.timeout(60)


def listener() -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock, int(sock.getsockname()[1])


def refuses(port: int) -> bool:
    """Does 127.0.0.1:``port`` refuse a connection (nobody holds the listener)?"""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2.0):
            return False
    except ConnectionRefusedError:
        return True


def with_busy_child(child_work: Callable[[], None]) -> bool:
    """Fork a child that runs ``child_work`` and then waits, close the parent's
    listener, and say whether the port refuses while the child lives."""
    sock, port = listener()
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(ready_r)
            os.close(done_w)
            child_work()
            os.write(ready_w, b"r")
            os.read(done_r, 1)  # until the parent has looked
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        assert os.read(ready_r, 1) == b"r"
        sock.close()  # what the kernel does to a killed parent's descriptors
        return refuses(port)
    finally:
        os.write(done_w, b"d")
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)


def test_a_child_that_closes_its_sockets_leaves_the_port_refusing() -> None:
    assert with_busy_child(close_inherited_sockets) is True


def test_a_child_that_keeps_them_keeps_the_port_accepting() -> None:
    # The control: without the call the child's copy keeps the listener open, so
    # the test above shows the call, not the kernel, closes it.
    assert with_busy_child(lambda: None) is False


def test_the_standard_streams_stay_even_when_they_are_sockets() -> None:
    """stderr a socket (systemd's journal stream): closing it would give its number
    to the dump file the child opens next, and a stray write to stderr would land
    in the dump."""
    here, there = socket.socketpair()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.dup2(here.fileno(), 2)
            close_inherited_sockets()
            kept = stat.S_ISSOCK(os.fstat(2).st_mode)
            gone = True
            try:
                os.fstat(here.fileno())
                gone = False
            except OSError:
                pass
            os.write(w, b"%d%d" % (kept, gone))
        finally:
            os._exit(0)
    os.close(w)
    try:
        answer = os.read(r, 2)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
        here.close()
        there.close()
    assert answer == b"11", "stderr kept and the other socket closed, in the child"


class SlowState:
    """Dump data whose pickling takes ``seconds`` (in the child, which pickles it)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __reduce__(self) -> tuple[Any, ...]:
        time.sleep(self.seconds)
        return (SlowState, (0.0,))


def test_the_dump_writer_closes_its_sockets_before_it_writes(tmp_path: Path) -> None:
    sock, port = listener()
    serializer = Serializer(str(tmp_path / "dump.bin"), 1024, True, None, None, None)
    serializer.__class__ = DurableSerializer
    serializer.serialize(SlowState(30.0), 7)  # forks; the child pickles for 30 s
    child = int(serializer._Serializer__pid)
    assert child > 0
    try:
        sock.close()
        # The child closes its copies when it starts (a moment after the fork); one
        # that kept them would keep the port accepting for its whole 30 s.
        wait_for(lambda: refuses(port) or None, 10, "the port to refuse")
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
