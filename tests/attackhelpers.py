"""What an attack cost a daemon under test: its memory (from /proc), and how long a
bystander client's enqueue took while it went on."""

from __future__ import annotations

import struct
import time

from helpers import DaemonProcess

from queickd import JobQueue


def rss_mb(daemon: DaemonProcess, field: str = "VmRSS") -> float:
    """The daemon's resident memory now (VmRSS) or at its peak so far (VmHWM), in MB."""
    with open(f"/proc/{daemon.proc.pid}/status") as f:  # type: ignore[union-attr]
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc status")


def bystander_enqueue_seconds(daemon: DaemonProcess, timeout: float = 30.0) -> float:
    """Seconds a fresh client takes to connect, say hello and have one job stored."""
    t0 = time.monotonic()
    with JobQueue("127.0.0.1", daemon.port, timeout=timeout, connect_timeout=timeout) as q:
        q.enqueue("testjobs:noop")  # writes nothing: the daemon's working directory stays clean
    return time.monotonic() - t0


# --- pickles that name no global and still cost memory or time (protocol 2+ opcodes) -------
def _request_around(args_ops: bytes) -> bytes:
    """{'func_name': 'webjobs.record', 'args': <args_ops>} as protocol-2 opcodes."""
    def s(text: str) -> bytes:
        b = text.encode()
        return b"X" + struct.pack("<I", len(b)) + b
    return b"\x80\x02}(" + s("func_name") + s("webjobs.record") + s("args") + args_ops + b"u."


# None put in memo slot 100,663,296 (LONG_BINPUT): the unpickler grows its memo to fit, ~800 MB.
BIG_ALLOCATION = b"\x80\x02Nr\x00\x00\x00\x06"


def shared_reference_bomb(levels: int = 12, fanout: int = 4) -> bytes:
    """Each level a list holding `fanout` references to the level below (BINGET of its
    memo entry): a few hundred bytes that are fanout**levels strings once written out."""
    ops = b"X\x04\x00\x00\x00boom" + b"q\x00" + b"0"  # level 0 in memo 0, popped
    for i in range(1, levels + 1):  # EMPTY_LIST MARK BINGET*fanout APPENDS BINPUT POP
        ops += b"](" + (b"h" + bytes([i - 1])) * fanout + b"e" + b"q" + bytes([i]) + b"0"
    return _request_around(ops + b"h" + bytes([levels]))


def deep_nesting_bomb(depth: int = 30_000) -> bytes:
    """[[[...]]] `depth` deep: EMPTY_LIST pushed depth times, then APPENDed inward."""
    return _request_around(b"]" * depth + b"a" * (depth - 1))
