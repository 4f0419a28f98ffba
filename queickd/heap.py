"""The C heap (glibc's malloc), set for a long-running server process (the daemon, an
external worker): large blocks go back to the system when they are freed.

glibc raises malloc's mmap threshold to the size of each mapped block freed, so once a
workflow run's large state has been freed, later states of that size are carved out of the
per-thread heaps, which give back little: the daemon would stay as large as its largest
states made it. A fixed threshold keeps every block of MMAP_THRESHOLD or more its own
mapping, returned whole on free; `trim()`, which the safety sweep calls, hands back what
smaller blocks leave free. Where the C library is not glibc, the allocator keeps its defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from typing import Any

log = logging.getLogger("queickd")

MMAP_THRESHOLD = 256 * 1024  # bytes: a block this large or larger is mapped on its own
_M_MMAP_THRESHOLD = -3  # malloc.h


def _libc_function(name: str) -> Any:
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or None), name)
    except (OSError, AttributeError):
        return None


def return_large_blocks() -> bool:
    """Fix malloc's mmap threshold (see the module's doc). True if it was set."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
        log.debug("mallopt(M_MMAP_THRESHOLD) refused; the C heap keeps its defaults")
        return False
    return True


def trim() -> None:
    """Give the pages malloc's heaps hold free back to the system (glibc's malloc_trim:
    every heap, and inside them, not only at their top). Call it now and then (the safety
    sweep), never per job."""
    global _trim
    if _trim is None:
        _trim = _libc_function("malloc_trim") or (lambda pad: 0)
        _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
    _trim(0)


_trim: Any = None
