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

A snapshot written by this build is handed to PySyncObj as a ``list`` of pieces of
that one map (``pack_snapshot``: at most ``CHUNK_BYTES`` each, the lazy entries last),
not one ``bytes``: ``unpack_chunks`` reads the pieces in order and drops each from the
list once read, so the ~12 MiB of packed bytes for 100,000 leases are given back while
the store is built instead of being held beside it to the end (the restart's peak
RSS; a piece of ``CHUNK_BYTES`` is above the node's pinned mmap threshold, so glibc
returns it to the kernel when it is freed). A dump written by an earlier build (one
``bytes``) is still read by ``unpack_snapshot``; joined, the pieces are such bytes.

Threads: none of its own; called on PySyncObj's tick thread (a snapshot loaded at
start or sent by the leader), and ``pack_snapshot`` in the forked child that writes
the dump.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any

import msgpack

#: The snapshot's entries unpacked lazily (the rest are small, or bounded): a
#: ``[key, capacity]`` row per key held (``restore`` keeps only those of capacity above
#: 1; 100,000 rows of fresh key strings otherwise, ~14 MiB) and a row per lease, in the
#: order ``pack_snapshot`` writes them, after all others: a stream is read once, front
#: to back, and ``restore`` reads the capacity rows before the leases
#: (core/snapshot.py).
LAZY_TAIL = ("capacity", "leases")
LAZY_KEYS = frozenset(LAZY_TAIL)

#: How this build writes a snapshot's state into PySyncObj's dump: 1, one msgpack
#: ``bytes`` (builds before 2026-12-07; still read); 2, ``pack_snapshot``'s pieces.
#: ``raftlease status`` shows it as ``formats.snapshot_container``: a build that
#: writes 2 must not send its snapshots to members that read only 1
#: (docs/membership.md, "Rolling upgrades").
SNAPSHOT_CONTAINER = 2

#: The size of a snapshot's pieces: 1 MiB, at the node's pinned mmap threshold
#: (``server/heap.py``'s ``MMAP_THRESHOLD``), so a freed piece goes back to the kernel
#: at once.
CHUNK_BYTES = 1 << 20

#: How many rows ``unpack_chunks``'s caller may be paused after (``pause``): the node
#: trims its heap there (server/heap.py), returning the pages that the growing maps'
#: former tables freed before the next ones are touched (~1 MiB off a restart's peak
#: with 100,000 leases; a trim takes a few ms).
PAUSE_ROWS = 10_000

#: How much the unpacker asks for at a time: its buffer holds about this much (its
#: default, 1 MiB, kept ~2 MiB of buffer and a 1 MiB copy beside the pieces).
READ_BYTES = 64 << 10


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


def pack_snapshot(plain: dict[str, Any]) -> list[bytes]:
    """``plain`` (``to_plain`` output) packed as one msgpack map, its ``LAZY_TAIL``
    entries last, cut into pieces of ``CHUNK_BYTES`` (the last one shorter; one empty
    piece never). Raises what ``msgpack.packb`` raises. Pure."""
    ordered = {key: value for key, value in plain.items() if key not in LAZY_KEYS}
    for key in LAZY_TAIL:
        ordered[key] = plain[key]
    blob: bytes = msgpack.packb(ordered, use_bin_type=True)
    return [blob[at : at + CHUNK_BYTES] for at in range(0, len(blob), CHUNK_BYTES)]


class _ChunkReader:
    """A file-like ``read`` over a list of pieces that takes each piece out of the
    list as it starts reading it: once the unpacker has copied a piece, nothing holds
    it any more and it is freed. The list is emptied as the snapshot is read."""

    __slots__ = ("_at", "_chunks", "_current", "total")

    def __init__(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            if not isinstance(chunk, bytes):
                raise ValueError(f"a snapshot piece is {type(chunk).__name__}, not bytes")
        #: The pieces' bytes in all: where the map must end.
        self.total = sum(len(chunk) for chunk in chunks)
        chunks.reverse()  # taken from the end: O(1) each
        self._chunks = chunks
        self._current = b""
        self._at = 0

    def read(self, size: int) -> bytes:
        """At most ``size`` bytes (the unpacker's ``read_size``); b"" at the end."""
        while self._at >= len(self._current):
            if not self._chunks:
                self._current = b""
                return b""
            self._current = self._chunks.pop()
            self._at = 0
        piece = self._current[self._at : self._at + size]
        self._at += len(piece)
        return piece


class _SnapshotStream:
    """The part of a streamed snapshot after its eager entries: the ``LAZY_TAIL``
    arrays, each walked once, in that order, then the end of the stream."""

    def __init__(
        self,
        unpacker: msgpack.Unpacker,
        total: int,
        first_key: str,
        pause: Callable[[], object] | None,
    ) -> None:
        self._unpacker = unpacker
        self._total = total
        self._pause = pause
        self._key_read: str | None = first_key  # read while looking for the eager end
        self._next = 0  # index in LAZY_TAIL of the array to walk next

    def rows(self, key: str) -> Iterator[Any]:
        """The rows of the array ``key``. Raises ``ValueError`` if it is not the next
        one in the stream (walked twice, or out of order) or the stream does not
        match the layout ``pack_snapshot`` writes, and what ``msgpack`` raises for
        bytes that are not msgpack."""
        if self._next >= len(LAZY_TAIL) or LAZY_TAIL[self._next] != key:
            raise ValueError(f"the snapshot's {key!r} rows read out of order or twice")
        self._next += 1
        unpacker = self._unpacker
        found = self._key_read if self._key_read is not None else unpacker.unpack()
        self._key_read = None
        if found != key:
            raise ValueError(f"snapshot entry {found!r} where {key!r} was expected")
        pause = self._pause
        for index in range(unpacker.read_array_header()):
            if pause is not None and index % PAUSE_ROWS == PAUSE_ROWS - 1:
                pause()
            yield unpacker.unpack()
        if self._next == len(LAZY_TAIL) and unpacker.tell() != self._total:
            # Anything after the map, whole or cut short, as unpackb would refuse it.
            raise ValueError(f"{self._total - unpacker.tell()} bytes after the snapshot's map")


class StreamedRows:
    """One ``LAZY_TAIL`` array of a streamed snapshot: iterable once, and only after
    the arrays before it (``_SnapshotStream.rows``)."""

    __slots__ = ("_key", "_stream")

    def __init__(self, stream: _SnapshotStream, key: str) -> None:
        self._stream = stream
        self._key = key

    def __iter__(self) -> Iterator[Any]:
        return self._stream.rows(self._key)


def unpack_chunks(chunks: list[bytes], pause: Callable[[], object] | None = None) -> dict[str, Any]:
    """The snapshot map that ``pack_snapshot`` cut into ``chunks``, its eager entries
    unpacked and its ``LAZY_TAIL`` entries as ``StreamedRows``, read from the pieces as
    they are walked. Consumes ``chunks``: the list is emptied as it is read, each
    piece freed once copied. ``pause``: called (on the walking thread) before every
    ``PAUSE_ROWS``-th row of each array; what it raises goes to the walker. Raises
    ``ValueError`` if a piece is not bytes or the map is not laid out as
    ``pack_snapshot`` writes it (here, or while the rows are walked), and what
    ``msgpack`` raises for bytes that are not msgpack."""
    if not isinstance(chunks, list):
        raise ValueError(f"snapshot pieces in a {type(chunks).__name__}, not a list")
    reader = _ChunkReader(chunks)
    unpacker = msgpack.Unpacker(reader, raw=False, strict_map_key=False, read_size=READ_BYTES)
    size = unpacker.read_map_header()
    out: dict[str, Any] = {}
    for index in range(size):
        key = unpacker.unpack()
        if key in LAZY_KEYS:
            if key != LAZY_TAIL[0] or size - index != len(LAZY_TAIL):
                raise ValueError(f"snapshot entry {key!r} is not where this layout has it")
            stream = _SnapshotStream(unpacker, reader.total, key, pause)
            for lazy in LAZY_TAIL:
                out[lazy] = StreamedRows(stream, lazy)
            return out
        out[key] = unpacker.unpack()
    raise ValueError("the snapshot has no lease rows")
