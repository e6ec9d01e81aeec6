"""``raftlease.server.heap``: the trim hands freed heap pages back to the kernel, which
glibc's own trim does not do for free space below the heap's top (what made a node's
RSS creep in the no-restart soak, jepsen-style/README.md *Issue 15: the heap*)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from raftlease.server.heap import HeapTrimmer

# Run in a fresh interpreter: its main thread allocates from glibc's main heap, as a
# node's event loop does (inside pytest, plugins' threads can move allocations to
# other arenas, which glibc trims on free).
SCENARIO = """
import gc, json
from raftlease.server.heap import HeapTrimmer

def rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])

trimmer = HeapTrimmer()
start = rss()
# 40 MB of 100 KB buffers (below glibc's mmap threshold: on the heap), each followed
# by a 20 KB buffer that stays (too big for the heap's earlier holes, so it comes
# after the 100 KB one): the freed space is never at the heap's top.
big, kept = [], []
for _ in range(400):
    buffer = bytearray(100_000)
    buffer[::4096] = b"x" * len(buffer[::4096])  # resident, whatever calloc did
    big.append(buffer)
    kept.append(bytearray(20_000))
del buffer
full = rss()
del big
gc.collect()
freed = rss()
released = trimmer.trim()
print(json.dumps({"start": start, "full": full, "freed": freed, "trimmed": rss(),
                  "released": released, "seconds": trimmer.last_seconds,
                  "available": trimmer.available}))
"""


@pytest.mark.timeout(60)
def test_trim_returns_free_pages_that_free_alone_keeps() -> None:
    if not HeapTrimmer().available:  # pragma: no cover - CI runs glibc
        pytest.skip("this C library has no malloc_trim")
    out = subprocess.run(
        [sys.executable, "-c", SCENARIO], capture_output=True, text=True, timeout=50, check=True
    )
    kib = json.loads(out.stdout)
    assert kib["full"] - kib["start"] > 35_000, kib  # the 40 MB were touched
    assert kib["freed"] - kib["start"] > 30_000, kib  # free alone keeps them resident
    assert kib["released"] is True
    # The trim gave them back: what stays is the 8 MB kept, and some slack.
    assert kib["trimmed"] - kib["start"] < 20_000, kib
    assert 0 <= kib["seconds"] < 1.0


def test_without_malloc_trim_it_is_off() -> None:
    trimmer = HeapTrimmer()
    trimmer._func = None
    assert not trimmer.available
    assert trimmer.trim() is False and trimmer.trims == 0
