"""A simulated power loss for test builds: cut a stopped node's files back to what
reached stable storage.

A node started with the ``record_synced`` hook keeps, beside each data file, a copy
of what its last sync made durable (``replication.durable.SyncRecorder``). After the
node's process is killed (SIGKILL: the page cache would still hold every write),
``cut_to_synced`` throws away everything the disk would not have had after a power
loss at that moment, and makes the node's next start see another boot (its run
marker, ``server.restart``), as a machine that lost power would.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

#: The data files a node writes, and the temporary files PySyncObj and we write
#: before a rename (never synced under their own name: dropped).
DATA_FILES = ("raft.journal", "raft.journal.meta", "raft.dump")
TEMPORARIES = ("raft.dump.tmp", "raft.dump.1.tmp", "raft.journal.meta.tmp", "running.tmp")
SUFFIX = ".synced"


def cut_to_synced(data_dir: Path) -> dict[str, Any]:
    """Replace each data file in ``data_dir`` by its synced copy (remove it when it
    was never synced) and mark a reboot. Call only while the node is not running.
    Returns, per file, its size before and after."""
    data_dir = Path(data_dir)
    cut: dict[str, Any] = {}
    for name in DATA_FILES:
        path, shadow = data_dir / name, data_dir / (name + SUFFIX)
        before = path.stat().st_size if path.exists() else None
        if shadow.exists():
            shutil.copyfile(shadow, path)
        else:
            path.unlink(missing_ok=True)
        cut[name] = {"before": before, "after": path.stat().st_size if path.exists() else None}
    for name in TEMPORARIES:
        (data_dir / name).unlink(missing_ok=True)
    marker = data_dir / "running"
    if marker.exists():
        # Another boot: the restarted node sees a machine crash, not a process crash.
        marker.write_text("simulated-power-loss\n")
    return cut
