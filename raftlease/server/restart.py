"""How the last run of a node ended, for the wait after an unclean stop with
``durability = "none"`` (docs/design.md, "Durability").

A node keeps a marker file, ``<data_dir>/running``, holding the kernel's boot id
while it runs, written durably at start and removed at a clean stop. At the next
start: no marker means a clean stop; a marker with this boot's id means the process
died but the machine did not (the page cache, and with it every write, survived); a
marker with another boot's id means the machine went down with the process: with
``durability = "none"`` its journal may have lost acknowledged writes.

Blocking file I/O: call from the event loop only at start and stop.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path

MARKER = "running"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class LastStop(enum.Enum):
    CLEAN = "clean"
    #: The process died, the machine did not: nothing written was lost.
    PROCESS_CRASH = "process-crash"
    #: The machine went down (power loss, kernel crash) or the boot is unknown.
    MACHINE_CRASH = "machine-crash"


def boot_id() -> str:
    """This boot's id, or "unknown" where the kernel does not say."""
    try:
        return BOOT_ID.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mark_running(data_dir: Path) -> LastStop:
    """Record that the node runs (durably) and say how its previous run ended.
    Raises ``OSError`` if the data directory is not writable."""
    marker = data_dir / MARKER
    try:
        previous: str | None = marker.read_text().strip()
    except FileNotFoundError:
        previous = None
    current = boot_id()
    tmp = marker.with_name(MARKER + ".tmp")
    with open(tmp, "w") as f:
        f.write(current + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, marker)
    _fsync_dir(data_dir)
    if previous is None:
        return LastStop.CLEAN
    if previous == current and current != "unknown":
        return LastStop.PROCESS_CRASH
    return LastStop.MACHINE_CRASH


def mark_stopped(data_dir: Path) -> None:
    """Record a clean stop (after the replica closed its journal)."""
    (data_dir / MARKER).unlink(missing_ok=True)
    _fsync_dir(data_dir)
