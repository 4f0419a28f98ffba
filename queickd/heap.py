"""The C heap (glibc's malloc), set for a long-running server process (the daemon, an
external worker): large blocks go back to the system when they are freed.

A block at or above malloc's mmap threshold is mapped on its own and unmapped when freed.
glibc raises that threshold (up to 32 MiB) to the size of each such block freed, so once a
workflow run's state of a few MB has been freed, later states of that size are carved out
of the heaps instead, one per thread that touched them, and a heap gives back little of
what it holds: the daemon stays as large as its largest states made it after their runs
end. A fixed threshold stops the raising: every block of MMAP_THRESHOLD or more
is its own mapping, returned whole on free. What smaller blocks leave free inside the
heaps is handed back by `trim()`, which the daemon's safety sweep calls. Nothing here where
the C library is not glibc (mallopt, malloc_trim missing): the process then runs with its
allocator's defaults.
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
    every heap, and inside them, not only at their top). A few ms for a heap of a few
    hundred MB; call it now and then (the safety sweep), never per job."""
    global _trim
    if _trim is None:
        _trim = _libc_function("malloc_trim") or (lambda pad: 0)
        _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
    _trim(0)


_trim: Any = None
