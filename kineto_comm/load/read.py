"""A trace file's bytes: read whole into reused memory (a rank file of a few pieces), or in
blocks, gzip inflated on the way (isal where installed). The decoder (pieces.py) takes them.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

try:  # isal's gzip inflate is ~2-3x faster than zlib's; optional.
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover - depends on the platform
    _zlib = zlib  # type: ignore[assignment]


_READ_BYTES = 4 * 1024 * 1024


_Whole = bytearray | mmap.mmap


class _Buffer:
    """Memory that the whole rank files of a batch are read into, one after the other.

    A new buffer per file is zeroed and faulted in again: the read buffers were a quarter
    of a small job's page faults (bench/README.md, twenty-sixth session). This one is an
    anonymous mapping, resized to each file (no zeroing of pages already in place). It is
    used again only when nothing refers to it any more (no table, closure or exception
    still reads the previous file's bytes) and nothing holds a view of it (resize refuses
    then); else the next file gets a new one."""

    def __init__(self) -> None:
        self.map: mmap.mmap | None = None

    def take(self, size: int) -> _Whole:
        """A writable buffer of `size` (> 0) bytes, its contents undefined."""
        if not _PRIVATE:
            return bytearray(size)
        held = self.map
        # Its references when free: self.map, `held` and getrefcount's argument.
        if held is not None and hasattr(sys, "getrefcount") and sys.getrefcount(held) == 3:
            try:
                held.resize(size)
                return held
            except (BufferError, OSError, ValueError, SystemError):
                pass  # a view of it is alive, or this platform cannot resize it
        # Private: a shared anonymous map is a fixed-size memory file, and touching it past
        # that size after growing it is a bus error.
        self.map = mmap.mmap(-1, size, flags=_PRIVATE)
        if _HUGE is not None:
            # In 2 MB pages where the system allows: reading a 10 MB file into it costs
            # ~400-900 page faults instead of ~2,450 (bench/README.md, twenty-seventh
            # session).
            with contextlib.suppress(OSError):
                self.map.madvise(_HUGE)
        return self.map


# Private anonymous memory (POSIX); elsewhere whole files are read into new bytearrays.
_PRIVATE = (mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) if hasattr(mmap, "MAP_ANONYMOUS") else 0
_HUGE = getattr(mmap, "MADV_HUGEPAGE", None)


def _read_blocks(
    path: Path, whole_below: int = _READ_BYTES, buffer: _Buffer | None = None
) -> Iterator[bytes | _Whole]:
    """Yield the file's (decompressed) bytes in blocks; a truncated gzip stream just ends.
    A plain file of at most `whole_below` bytes comes whole, read straight into place (the
    reader adopts it as its buffer: no copy): into `buffer` when given, else into a new
    bytearray; bigger ones in blocks."""
    with open(path, "rb") as fh:
        head = fh.read(2)
        fh.seek(0)
        if head != b"\x1f\x8b":
            size = os.fstat(fh.fileno()).st_size
            if 0 < size <= whole_below:
                whole: _Whole = bytearray(size) if buffer is None else buffer.take(size)
                got = fh.readinto(whole)
                if got < size:  # cut short since fstat: what was read
                    if isinstance(whole, bytearray):
                        del whole[got:]
                    else:
                        whole = bytearray(whole[:got])
                yield whole
            while block := fh.read(_READ_BYTES):  # the rest (all of a bigger file)
                yield block
            return
        inflater = _zlib.decompressobj(31)
        data = b""
        while True:
            if not data:
                data = fh.read(_READ_BYTES // 8)
                if not data:
                    break
            try:
                out = inflater.decompress(data, _READ_BYTES)
            except Exception as exc:  # corrupt deflate data
                raise _Corrupt(f"gzip data is corrupt ({exc})") from exc
            data = inflater.unconsumed_tail
            if out:
                yield out
            if inflater.eof:
                data = inflater.unused_data  # a concatenated gzip member may follow
                if not data:
                    data = fh.read(_READ_BYTES // 8)
                    if not data:
                        break
                inflater = _zlib.decompressobj(31)
        tail = inflater.flush()
        if tail:
            yield tail


class _Corrupt(Exception):
    """Damaged data (not a cut-off end): the file is rejected, whatever was read before it,
    so that the answer does not depend on the piece size (a file read whole has nothing to
    keep from before the damage)."""
