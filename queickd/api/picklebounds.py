"""The bounds a Queick 1.2.1 request's pickle must keep, checked before and after it loads.

A pickle that names no global can still be a resource bomb: a 7-byte BINBYTES claiming
gigabytes makes the unpickler allocate them before it reads a byte; a memo index in the
millions grows the memo to fit; a few hundred bytes of DUP/BINGET reuse of one list in
nested lists load cheaply but expand exponentially once walked (json.dumps); deep
EMPTY_LIST/APPEND nesting breaks every recursive walk later. So:

- `scan(data, limit)` walks the opcodes without building anything: every declared length
  (strings, bytes, frames, longs) within `limit` and the bytes at hand, memo indices dense
  (a PUT at most one past the last, a GET only of what was put). It says when more bytes
  are needed, and stops at the first opcode naming a global (the unpickler refuses those,
  naming them, before anything after it is read).
- `check_expanded(value, max_bytes, max_depth)` walks what loaded as a tree (shared
  references counted each time they appear, as JSON would write them) within a budget:
  never more work than `max_bytes`, whatever the pickle claims.

Pure functions of bytes and values: no I/O, no logging, never unpickles anything itself.
"""

from __future__ import annotations

import pickletools
import struct
from typing import Any

MAX_DEPTH = 64  # containers inside containers: far beyond any Queick client's arguments

_LENGTH_PREFIX = {  # pickletools' arg.n for a counted argument → (prefix bytes, struct format)
    pickletools.TAKEN_FROM_ARGUMENT1: (1, "<B"),
    pickletools.TAKEN_FROM_ARGUMENT4: (4, "<i"),
    pickletools.TAKEN_FROM_ARGUMENT4U: (4, "<I"),
    pickletools.TAKEN_FROM_ARGUMENT8U: (8, "<Q"),
}
_GLOBALS = frozenset({"GLOBAL", "INST", "STACK_GLOBAL"})
_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})


class PickleBoundsError(ValueError):
    """The pickle (or what it loads to) is over a bound; the message says which."""


def scan(data: bytes, limit: int) -> bool:
    """True when `data` holds a whole pickle within the bounds (or one that reaches a
    global: the unpickler refuses it), False when more bytes are needed. Raises
    PickleBoundsError for what no amount of further bytes would make acceptable."""
    pos, end, memo = 0, len(data), 0
    while pos < end:
        op = pickletools.code2op.get(chr(data[pos]))
        if op is None:
            raise PickleBoundsError(f"unknown pickle opcode {data[pos]:#04x} at byte {pos}")
        pos += 1
        if op.name in _GLOBALS:
            return True
        arg, index = op.arg, None
        if arg is None:
            pass
        elif arg.n >= 0:
            if pos + arg.n > end:
                return False
            raw = data[pos:pos + arg.n]
            pos += arg.n
            if op.name == "FRAME" and struct.unpack("<Q", raw)[0] > limit:
                raise PickleBoundsError(f"a frame of {struct.unpack('<Q', raw)[0]} bytes, over the "
                                        f"{limit}-byte limit")
            if op.name in ("BINPUT", "BINGET", "LONG_BINPUT", "LONG_BINGET"):
                index = int.from_bytes(raw, "little")
        elif arg.n == pickletools.UP_TO_NEWLINE:
            lines = 2 if op.name in _GLOBALS else 1
            stop = pos
            for _ in range(lines):
                stop = data.find(b"\n", stop) + 1
                if stop == 0:
                    if end - pos > limit:
                        raise PickleBoundsError(f"a line of over {limit} bytes")
                    return False
            if op.name in ("PUT", "GET"):
                try:
                    index = int(data[pos:stop - 1])
                except ValueError:
                    raise PickleBoundsError(f"a memo index that is not a number at byte {pos}") from None
            pos = stop
        else:
            size, fmt = _LENGTH_PREFIX[arg.n]
            if pos + size > end:
                return False
            (n,) = struct.unpack(fmt, data[pos:pos + size])
            if n < 0 or n > limit:
                raise PickleBoundsError(f"{op.name} declares {n} bytes, over the {limit}-byte limit")
            pos += size
            if pos + n > end:
                return False
            pos += n
        if op.name == "MEMOIZE":
            memo += 1
        elif op.name in _PUTS:
            if index is None or index > memo:  # the pickler numbers its memo 0, 1, 2, ...
                raise PickleBoundsError(f"memo index {index} is not the next one ({memo})")
            memo = max(memo, index + 1)
        elif op.name in _GETS and (index is None or index >= memo):
            raise PickleBoundsError(f"memo index {index} was never put")
        if op.name == "STOP":
            return True
    return False


def check_expanded(value: Any, max_bytes: int, max_depth: int = MAX_DEPTH) -> None:
    """Raise PickleBoundsError if `value`, written out as JSON (a shared object each time it
    appears), would be over about `max_bytes` or nest deeper than `max_depth`. The walk
    stops as soon as a bound is passed, so it costs at most ~max_bytes steps."""
    budget = max_bytes
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str | bytes | bytearray):
            budget -= len(v) + 3
        elif isinstance(v, list | tuple | set | frozenset):
            if depth >= max_depth:
                raise PickleBoundsError(f"nested deeper than {max_depth}")
            budget -= 2 + len(v)
            stack.extend((x, depth + 1) for x in v)
        elif isinstance(v, dict):
            if depth >= max_depth:
                raise PickleBoundsError(f"nested deeper than {max_depth}")
            budget -= 2 + 2 * len(v)
            for k, x in v.items():
                stack.append((k, depth + 1))
                stack.append((x, depth + 1))
        elif isinstance(v, int) and not isinstance(v, bool):
            budget -= 1 + v.bit_length() // 3  # ~ decimal digits
        else:
            budget -= 8  # a float, None, a bool
        if budget < 0:
            raise PickleBoundsError(f"over {max_bytes} bytes once its shared parts are written out")
