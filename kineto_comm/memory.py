"""Give memory freed by Python back to the operating system.

Decoding a trace creates and frees millions of small Python objects. glibc keeps the freed
heap for reuse, but what comes next is mostly Polars work, which allocates through its own
allocator and cannot reuse it, so without this the freed heap stays in the peak RSS.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable


def _trimmer() -> Callable[[], None]:
    if not sys.platform.startswith("linux"):
        return lambda: None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to do
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0) and None


release_free_memory = _trimmer()
release_free_memory.__doc__ = "Return the heap memory glibc keeps after frees (Linux only)."
