"""Handing a node's freed heap memory back to the kernel (glibc's ``malloc_trim``).

Why: under steady load a node's Python objects stop growing within minutes (the
watch history reaches its cap), but glibc's main heap keeps growing with *free*
chunks: short-lived buffers (a 64 KiB socket read in PySyncObj, asyncio's 256 KiB
reads, msgpack frames) land between long-lived allocations (journal entries,
leases), so the freed space sits below the heap's top where glibc's automatic trim
cannot return it. Measured on 3-node soaks with no process restart (jepsen-style
README, *Issue 15: the heap*): glibc's free bytes rose ~0.2 MB a minute while its
allocated bytes stayed flat, and RSS rose with them (+2.3 to +3.6 % from minute 5 to
14); with ``malloc_trim(0)`` every 30 s RSS rose +0.7 to +1.1 % in the same run
shape. ``malloc_trim`` returns every whole free page of the heap (madvise), not only
its top; it holds the arena lock while it walks the heap: milliseconds at most at a
node's size (0.1-5 ms in the tests, the last one 40 MB of freed buffers;
``HeapTrimmer.last_seconds``, metric ``raftlease_heap_trim_seconds``).

musl has no ``malloc_trim``: the trimmer is then off and says so once. Under a
preloaded allocator (jemalloc, tcmalloc) glibc's trim finds its own heap nearly
empty and costs next to nothing.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("raftlease.node")


def _libc_function(name: str, argtypes: list[Any]) -> Any:
    """The C library's function ``name`` returning an int, with ``argtypes`` set, or
    None where the process has none (musl has no ``malloc_trim`` nor ``mallopt``)."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:  # pragma: no cover - every Linux process can dlopen itself
        return None
    func: Any = getattr(libc, name, None)
    if func is not None:
        func.argtypes = argtypes
        func.restype = ctypes.c_int
    return func


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``int malloc_trim(size_t pad)``, or None where the process has none."""
    trim: Callable[[int], int] | None = _libc_function("malloc_trim", [ctypes.c_size_t])
    return trim


#: ``mallopt``'s parameter number for the mmap threshold (glibc's malloc.h).
_M_MMAP_THRESHOLD = -3
#: Allocations of at least this many bytes get pages of their own (mmap), returned to
#: the kernel when freed.
MMAP_THRESHOLD = 1 << 20


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Pin glibc's mmap threshold at ``threshold`` bytes for this process; True if set.
    Call once at start-up, before the node loads its snapshot. Never raises; False
    where the C library has no ``mallopt`` (musl) or refuses the value.

    Why: glibc raises its threshold to the size of any mmapped block that is freed
    (up to 32 MiB), so after one big buffer has come and gone, the next ones of that
    size come from the heap, where freeing them rarely gives memory back. A restart
    decompresses the snapshot (~12 MiB of bytes for 100,000 leases) at least twice:
    measured on such a snapshot (the load alone, in one process), the peak over the
    process's start fell from 68.7 to 61 MiB and the RSS right after the load from
    +68.7 to +49 MiB with the threshold pinned. Buffers of a MiB or more are rare on
    the request path (snapshot transfers, backups), so the extra mmap/munmap pair
    costs nothing measurable there."""
    mallopt = _libc_function("mallopt", [ctypes.c_int, ctypes.c_int])
    return mallopt is not None and bool(mallopt(_M_MMAP_THRESHOLD, threshold))


class HeapTrimmer:
    """Calls ``malloc_trim(0)`` when asked (``trim``): on the node's event loop every
    ``heap_trim_interval`` seconds (``Node``), and, through instances of their own, on
    the tick thread before and while a snapshot is loaded (``Replica``'s
    ``restore_pause``; those trims are not counted in ``raftlease_heap_trims``). One
    instance is not thread-safe (one caller); never raises; does nothing where glibc's
    ``malloc_trim`` is missing (``available``)."""

    def __init__(self) -> None:
        self._func = _malloc_trim()
        #: Trims done, and what the last one took (seconds, this thread's clock).
        self.trims = 0
        self.last_seconds = 0.0

    @property
    def available(self) -> bool:
        return self._func is not None

    def trim(self) -> bool:
        """Return free heap pages to the kernel. Blocks the calling thread for as long
        as glibc walks the heap (and every other thread's malloc for as long); True
        if memory was returned."""
        if self._func is None:
            return False
        started = time.perf_counter()
        released = bool(self._func(0))
        self.last_seconds = time.perf_counter() - started
        self.trims += 1
        return released
