"""Linux's TCP socket tables (``/proc/net/tcp`` and ``tcp6``), read for tests and the
chaos harness: which connections exist between which ports, whose received bytes
nobody has read yet, which sockets a process holds. Linux only; a table that cannot be
read gives no rows."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

#: TCP states as the tables write them (include/net/tcp_states.h).
ESTABLISHED, LISTEN = "01", "0A"
#: 127.0.0.1 as /proc/net/tcp writes it (hex, host byte order on x86).
LOOPBACK = "0100007F"


@dataclass(frozen=True, slots=True)
class TcpSocket:
    """One row: addresses in the table's hex, ports as ints, ``state`` as the
    table's hex (``ESTABLISHED``, ``LISTEN``), ``rx_queue`` the bytes received and
    not yet read, ``inode`` the socket's (``socket:[inode]`` in /proc/PID/fd)."""

    local_ip: str
    local_port: int
    remote_ip: str
    remote_port: int
    state: str
    rx_queue: int
    inode: str


def tcp_sockets(pid: int | None = None, tables: tuple[str, ...] = ("tcp",)) -> list[TcpSocket]:
    """The rows of ``/proc/net/<table>`` for each of ``tables``, or of
    ``/proc/<pid>/net/<table>`` (that process's network namespace). Never raises:
    a table that is gone (the process exited) or malformed rows are skipped."""
    base = Path("/proc/net") if pid is None else Path(f"/proc/{pid}/net")
    rows: list[TcpSocket] = []
    for table in tables:
        with contextlib.suppress(OSError):
            for line in (base / table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) < 10:
                    continue
                try:
                    local_ip, _, local_port = fields[1].rpartition(":")
                    remote_ip, _, remote_port = fields[2].rpartition(":")
                    rows.append(
                        TcpSocket(
                            local_ip,
                            int(local_port, 16),
                            remote_ip,
                            int(remote_port, 16),
                            fields[3],
                            int(fields[4].partition(":")[2], 16),
                            fields[9],
                        )
                    )
                except ValueError:
                    continue
    return rows
