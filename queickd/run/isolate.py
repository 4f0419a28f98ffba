"""What keeps a process job from the daemon, beyond its cgroups and rlimits: the daemon
and the zygote made non-dumpable (PR_SET_DUMPABLE 0), so that a process of the same user
can neither read their /proc files (environ, mem, fds) nor ptrace them.

Called once in the daemon (any thread, before job code can run) and once in the zygote.
Never raises: a mechanism the kernel refuses is reported as not in force, with why.
"""

from __future__ import annotations

import ctypes
import os

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3

_libc: list = []


def _prctl(option: int, value: int = 0) -> int:
    """prctl(2)'s result, or -1 when it cannot be called here."""
    try:
        if not _libc:
            _libc.append(ctypes.CDLL(None, use_errno=True))
        return int(_libc[0].prctl(option, value, 0, 0, 0))
    except (OSError, AttributeError):
        return -1


def not_dumpable() -> str | None:
    """Make this process non-dumpable: its /proc files become root's and ptrace(2) of it
    needs CAP_SYS_PTRACE, so a job of the same user cannot read its environment, memory
    or descriptors. None when in force, else why not. Children forked from it inherit
    it; a child that execs a program loses it (the program's own process, not this one)."""
    if _prctl(PR_SET_DUMPABLE, 0) != 0 or _prctl(PR_GET_DUMPABLE) != 0:
        return f"prctl(PR_SET_DUMPABLE) failed: {os.strerror(ctypes.get_errno()) or 'not available'}"
    return None
