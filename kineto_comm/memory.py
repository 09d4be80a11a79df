"""Give memory freed by Python back to the operating system.

Decoding a trace with msgspec (the path for pieces the compiled scanner does not take, or
for everything where it is not built) creates and frees millions of small Python objects.
glibc keeps the freed heap for reuse, but what comes next is mostly Polars work, which
allocates through its own allocator and cannot reuse it, so without this the freed heap stays
in the peak RSS.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any


def _malloc_trim() -> Any:
    """glibc's malloc_trim, or None (another OS, or a libc without it such as musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_free_memory() -> None:
    """Return the heap memory glibc keeps after frees (a no-op where that does not apply)."""
    if _TRIM is not None:
        _TRIM(0)
