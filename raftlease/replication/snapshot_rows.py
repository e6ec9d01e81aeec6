"""Unpacking a node's packed snapshot with its lease rows read one at a time.

A snapshot (``core.snapshot.to_plain``, msgpack) is one map whose ``leases`` entry
holds a row per live lease. ``msgpack.unpackb`` builds every row at once: for
100,000 leases ~70 MiB of lists, strings and ints on top of the store being built
from them, and the allocator kept much of it once they were freed (a node restarted
from such a snapshot went from ~95 to 150 MiB, peak 163). ``unpack_snapshot`` unpacks
everything else as ``unpackb`` would and gives ``leases`` (and the per-key
``capacity`` rows) as ``PackedRows``: an
iterable that unpacks the rows from the packed bytes as it is walked, so restoring
holds one row at a time. What ``core.snapshot.restore`` reads from it is the same
(the same options, the same objects row by row).

Threads: none of its own; called on PySyncObj's tick thread (a snapshot loaded at
start or sent by the leader).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import msgpack

#: The snapshot's entries unpacked lazily (the rest are small, or bounded): a row per
#: lease, and a ``[key, capacity]`` row per key held (``restore`` keeps only those of
#: capacity above 1; 100,000 rows of fresh key strings otherwise, ~14 MiB).
LAZY_KEYS = frozenset({"leases", "capacity"})


class PackedRows:
    """The ``count`` items of a msgpack array that starts at ``offset`` (after its
    header) in ``blob``, unpacked afresh each time it is iterated. Raises what
    ``msgpack`` raises for bytes that are not msgpack."""

    __slots__ = ("_blob", "_count", "_offset")

    def __init__(self, blob: bytes, offset: int, count: int) -> None:
        self._blob = blob
        self._offset = offset
        self._count = count

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Any]:
        stream = io.BytesIO(self._blob)  # shares the bytes (copied only if written)
        stream.seek(self._offset)
        unpacker = msgpack.Unpacker(stream, raw=False, strict_map_key=False)
        for _ in range(self._count):
            yield unpacker.unpack()


def unpack_snapshot(blob: bytes) -> dict[str, Any]:
    """``msgpack.unpackb(blob, raw=False, strict_map_key=False)`` for a snapshot map,
    with the entries named in ``LAZY_KEYS`` as ``PackedRows``. Raises ``ValueError``
    if ``blob`` is not one msgpack map, those entries are not arrays, or bytes follow
    the map, and ``msgpack.OutOfData`` if it is cut short."""
    stream = io.BytesIO(blob)
    unpacker = msgpack.Unpacker(stream, raw=False, strict_map_key=False)
    out: dict[str, Any] = {}
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        if key in LAZY_KEYS:
            count = unpacker.read_array_header()
            offset = unpacker.tell()
            for _ in range(count):
                unpacker.skip()
            out[key] = PackedRows(blob, offset, count)
        else:
            out[key] = unpacker.unpack()
    if unpacker.tell() != len(blob):
        raise ValueError(f"{len(blob) - unpacker.tell()} bytes after the snapshot's map")
    return out
