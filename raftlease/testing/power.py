"""A simulated power loss for test builds: cut a stopped node's files back to what
reached stable storage.

A node started with the ``record_synced`` hook keeps, beside each data file, a copy
of what its last sync made durable (``replication.durable.SyncRecorder``). After the
node's process is killed (SIGKILL: the page cache would still hold every write),
``cut_to_synced`` throws away everything the disk would not have had after a power
loss at that moment, and makes the node's next start see another boot (its run
marker, ``server.restart``), as a machine that lost power would.

Given a ``writeback`` random source, the cut also keeps some of what was written
after the last sync: each journal page that differs from the synced copy reaches the
"disk" with probability one half, as the kernel may have written any dirty page back
(in any order) before the power went. A record can then be torn: its first and last
pages on disk, a page between them not, or the header's page ahead of the records it
counts. The journal's checks at start (``replication.journal.whole_records``) must
find every such record; none of it was acknowledged, since every acknowledgement
waits for a sync.

The unit of a tear is a page (``PAGE``: the kernel's writeback writes whole pages) or,
with ``unit=SECTOR``, a 512-byte sector: a disk that loses power while it writes a
page may have written some of its sectors and not others (only a sector's write is
atomic on most disks), so any subset of the written sectors survives. Sector tears
put a record's length suffix and its command's end, or the header and the first
record, on different sides of a tear, shapes page tears cannot draw.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

#: The data files a node writes, and the temporary files PySyncObj and we write
#: before a rename (never synced under their own name: dropped).
DATA_FILES = ("raft.journal", "raft.journal.meta", "raft.dump")
TEMPORARIES = ("raft.dump.tmp", "raft.dump.1.tmp", "raft.journal.meta.tmp", "running.tmp")
SUFFIX = ".synced"


#: The unit of the kernel's writeback (and of a torn write here, by default).
PAGE = 4096
#: The unit of a disk's atomic write: a torn page keeps any subset of its sectors.
SECTOR = 512


def cut_to_synced(
    data_dir: Path, writeback: random.Random | None = None, unit: int = PAGE
) -> dict[str, Any]:
    """Replace each data file in ``data_dir`` by its synced copy (remove it when it
    was never synced) and mark a reboot. With ``writeback``, each journal ``unit``
    (``PAGE`` or ``SECTOR``) written since the last sync survives with probability
    one half (module docstring). Call only while the node is not running. Returns,
    per file, its size before and after, and for the journal with ``writeback`` how
    many unsynced units it kept (``unsynced_pages_kept``, in units of ``unit``) and
    the unit. Raises ``ValueError`` for another unit."""
    if unit not in (PAGE, SECTOR):
        raise ValueError(f"tear unit {unit}: expected {PAGE} or {SECTOR}")
    data_dir = Path(data_dir)
    cut: dict[str, Any] = {}
    for name in DATA_FILES:
        path, shadow = data_dir / name, data_dir / (name + SUFFIX)
        before = path.stat().st_size if path.exists() else None
        kept: int | None = None
        if shadow.exists():
            if writeback is not None and name == "raft.journal" and path.exists():
                kept = _written_back(path, shadow.read_bytes(), writeback, unit)
            else:
                shutil.copyfile(shadow, path)
        else:
            path.unlink(missing_ok=True)
        cut[name] = {"before": before, "after": path.stat().st_size if path.exists() else None}
        if kept is not None:
            cut[name]["unsynced_pages_kept"] = kept
            cut[name]["unit"] = unit
    for name in TEMPORARIES:
        (data_dir / name).unlink(missing_ok=True)
    marker = data_dir / "running"
    if marker.exists():
        # Another boot: the restarted node sees a machine crash, not a process crash.
        marker.write_text("simulated-power-loss\n")
    return cut


def _written_back(path: Path, synced: bytes, rng: random.Random, unit: int) -> int:
    """Write to ``path`` the synced bytes plus, ``unit`` by ``unit``, each unit the
    process wrote since (where ``path`` differs) with probability one half; the file
    keeps its grown length only if a unit past the synced length survived. Returns
    how many unsynced units survived."""
    written = path.read_bytes()
    disk = bytearray(synced.ljust(len(written), b"\0"))
    kept, end = 0, len(synced)
    for start in range(0, len(written), unit):
        page = written[start : start + unit]
        if page != disk[start : start + len(page)] and rng.random() < 0.5:
            disk[start : start + len(page)] = page
            kept += 1
            end = max(end, start + len(page))
    path.write_bytes(bytes(disk[:end]))
    return kept
