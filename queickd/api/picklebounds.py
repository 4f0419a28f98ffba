"""The bounds a Queick 1.2.1 request's pickle must keep, checked before and after it loads.

A pickle that names no global can still be a resource bomb: a 7-byte BINBYTES claiming
gigabytes makes the unpickler allocate them before it reads a byte; a memo index in the
millions grows the memo to fit; DUP/BINGET reuse of one list in nested lists loads cheaply
but expands exponentially once walked (json.dumps); deep nesting breaks every recursive
walk later. Hashing costs too, in C holding the GIL: a dict key that is a tuple built of
itself twice over through the memo, 60 levels deep, hashes 2**60 tuples (tuple hashes are
not cached), and a set of ints that all hash alike takes quadratic time. So `PickleScan`
walks the opcodes as the bytes come, building nothing: declared lengths within the limit,
memo indices dense, plain data only (no sets: JSON has none), and the type of every value
on the stack and in the memo, so that a dict key is only ever a str, an int of 32 bits, a
bool or None (cheap hashes that cannot be made to collide). `check_expanded` bounds what
loaded, as JSON would write it out. Pure: no I/O, no logging, never unpickles anything.
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
_OPCODES = {ord(op.code): op for op in pickletools.opcodes}
_GLOBALS = frozenset({"GLOBAL", "INST", "STACK_GLOBAL"})
_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_MEMO_OPS = _PUTS | _GETS

# The type of a value on the stack or in the memo, one byte each. Ints of BININT* fit in 32
# bits, so no two hash alike (LONG*'s can be made to, modulo 2**61 - 1); str hashes are
# salted per process. Those, bools and None are the dict keys accepted.
_STR, _INT, _BOOL, _NONE, _LONG, _FLOAT, _BYTES, _LIST, _TUPLE, _DICT = b"sibnLfylte"
_KEYS = frozenset({_STR, _INT, _BOOL, _NONE})
_TYPE_NAMES = {_STR: "str", _INT: "int", _BOOL: "bool", _NONE: "None", _LONG: "int over 32 bits", _FLOAT: "float",
               _BYTES: "bytes", _LIST: "list", _TUPLE: "tuple", _DICT: "dict"}
_PUSHES = {  # opcode → the type of the value it pushes, building nothing from the stack
    "INT": _LONG, "BININT": _INT, "BININT1": _INT, "BININT2": _INT,  # INT is any size ("I01" a bool)
    "LONG": _LONG, "LONG1": _LONG, "LONG4": _LONG,
    "STRING": _STR, "BINSTRING": _STR, "SHORT_BINSTRING": _STR,  # loaded as str (ASCII)
    "UNICODE": _STR, "SHORT_BINUNICODE": _STR, "BINUNICODE": _STR, "BINUNICODE8": _STR,
    "BINBYTES": _BYTES, "SHORT_BINBYTES": _BYTES, "BINBYTES8": _BYTES, "BYTEARRAY8": _BYTES,
    "NONE": _NONE, "NEWTRUE": _BOOL, "NEWFALSE": _BOOL, "FLOAT": _FLOAT, "BINFLOAT": _FLOAT,
    "EMPTY_LIST": _LIST, "EMPTY_TUPLE": _TUPLE, "EMPTY_DICT": _DICT,
}
_TUPLE_N = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_FROM_MARK = {"TUPLE": _TUPLE, "LIST": _LIST, "DICT": _DICT}  # build from the items since MARK
_NEEDS_NOTHING = frozenset({"PROTO", "FRAME"})


class PickleBoundsError(ValueError):
    """The pickle (or what it loads to) is over a bound; the message says which."""


class PickleScan:
    """One pickle's opcodes, scanned as its bytes are fed: each opcode once, so the whole
    scan costs time linear in the pickle however its bytes are split (an opcode whose
    argument is not whole yet is looked at again, cheaply, when more comes)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()  # every byte fed so far: what the unpickler is to load
        self.wanted = 1  # how many bytes `data` must hold before the scan can go on
        self.done = False  # a STOP or a global was reached
        self._pos = 0  # where the next opcode starts
        self._stack = bytearray()  # the type of each value on the unpickler's stack
        self._marks: list[int] = []  # the stack's length at each open MARK
        self._memo = bytearray()  # the type of each memo entry

    def feed(self, chunk: bytes) -> bool:
        """Add `chunk` and scan on. True once the pickle is whole (or reaches a global),
        False while more bytes are needed; PickleBoundsError for what no further bytes
        would make acceptable."""
        self.data += chunk
        if not self.done and len(self.data) >= self.wanted:
            self.done = self._run()
        return self.done

    def _run(self) -> bool:
        data, end = self.data, len(self.data)
        while self._pos < end:
            at = self._pos
            op = _OPCODES.get(data[at])
            if op is None:
                raise PickleBoundsError(f"unknown pickle opcode {data[at]:#04x} at byte {at}")
            got = self._argument(op, at + 1, end)
            if got is None:
                return False
            self._pos, index = got
            if op.name in _GLOBALS:
                return True
            if op.name == "STOP":
                self._pop(1, at)
                return True
            self._apply(op.name, index, at)
        self.wanted = end + 1
        return False

    def _argument(self, op: pickletools.OpcodeInfo, pos: int, end: int) -> tuple[int, int | None] | None:
        """(where the next opcode starts, the memo index if op has one), or None with
        `wanted` set when the argument is not whole yet."""
        arg, data = op.arg, self.data
        if arg is None:
            return pos, None
        if arg.n >= 0:
            if pos + arg.n > end:
                self.wanted = pos + arg.n
                return None
            raw = bytes(data[pos:pos + arg.n])
            if op.name == "FRAME" and (frame := struct.unpack("<Q", raw)[0]) > self.limit:
                raise PickleBoundsError(f"a frame of {frame} bytes, over the {self.limit}-byte limit")
            index = int.from_bytes(raw, "little") if op.name in _MEMO_OPS else None
            return pos + arg.n, index
        if arg.n == pickletools.UP_TO_NEWLINE:
            stop = pos
            for _ in range(2 if op.name in _GLOBALS else 1):  # a module and a name
                stop = data.find(b"\n", stop) + 1
                if stop == 0:
                    if end - pos > self.limit:
                        raise PickleBoundsError(f"a line of over {self.limit} bytes")
                    self.wanted = end + 1
                    return None
            if op.name not in ("PUT", "GET"):
                return stop, None
            try:
                return stop, int(data[pos:stop - 1])
            except ValueError:
                raise PickleBoundsError(f"a memo index that is not a number at byte {pos}") from None
        size, fmt = _LENGTH_PREFIX[arg.n]
        if pos + size > end:
            self.wanted = pos + size
            return None
        (n,) = struct.unpack_from(fmt, data, pos)
        if n < 0 or n > self.limit:
            raise PickleBoundsError(f"{op.name} declares {n} bytes, over the {self.limit}-byte limit")
        if pos + size + n > end:
            self.wanted = pos + size + n
            return None
        return pos + size + n, None

    def _apply(self, name: str, index: int | None, at: int) -> None:
        """What opcode `name` does to the types on the stack and in the memo."""
        stack = self._stack
        pushed = _PUSHES.get(name)
        if pushed is not None:
            stack.append(pushed)
        elif name in _TUPLE_N:
            self._pop(_TUPLE_N[name], at)
            stack.append(_TUPLE)
        elif name == "MARK":
            if len(self._marks) > MAX_DEPTH:  # each open MARK is a container being built
                raise PickleBoundsError(f"nested deeper than {MAX_DEPTH}")
            self._marks.append(len(stack))
        elif name in _FROM_MARK:
            items = self._pop_mark(at)
            if name == "DICT":
                self._check_keys(items, at)
            stack.append(_FROM_MARK[name])
        elif name in ("APPEND", "APPENDS"):
            self._pop(1, at) if name == "APPEND" else self._pop_mark(at)
            self._top(_LIST, name, at)
        elif name in ("SETITEM", "SETITEMS"):
            self._check_keys(self._pop(2, at) if name == "SETITEM" else self._pop_mark(at), at)
            self._top(_DICT, name, at)
        elif name == "POP":
            if self._marks and self._marks[-1] == len(stack):
                self._marks.pop()  # as the unpickler does: POP right after MARK drops the mark
            else:
                self._pop(1, at)
        elif name == "POP_MARK":
            self._pop_mark(at)
        elif name == "DUP":
            stack += self._pop(1, at) * 2
        elif name in _PUTS or name == "MEMOIZE":
            self._put(len(self._memo) if index is None else index, at)
        elif name in _GETS:
            if index is None or index >= len(self._memo):
                raise PickleBoundsError(f"memo index {index} was never put")
            stack.append(self._memo[index])
        elif name not in _NEEDS_NOTHING:
            why = "sets are refused: JSON has none" if "SET" in name or name == "ADDITEMS" else "not plain data"
            raise PickleBoundsError(f"opcode {name} at byte {at}: {why}")

    def _fence(self) -> int:
        return self._marks[-1] if self._marks else 0  # nothing below the last MARK may be popped

    def _pop(self, n: int, at: int) -> bytearray:
        stack = self._stack
        if len(stack) - n < self._fence():
            raise PickleBoundsError(f"stack underflow at byte {at}")
        items = stack[len(stack) - n:]
        del stack[len(stack) - n:]
        return items

    def _pop_mark(self, at: int) -> bytearray:
        if not self._marks:
            raise PickleBoundsError(f"no MARK before byte {at}")
        mark = self._marks.pop()
        items = self._stack[mark:]
        del self._stack[mark:]
        return items

    def _top(self, kind: int, name: str, at: int) -> None:
        if len(self._stack) <= self._fence() or self._stack[-1] != kind:
            raise PickleBoundsError(f"{name} at byte {at} not onto a {_TYPE_NAMES[kind]}")

    def _check_keys(self, items: bytearray, at: int) -> None:
        if len(items) % 2:
            raise PickleBoundsError(f"a dict item without its value at byte {at}")
        for key in items[::2]:
            if key not in _KEYS:
                raise PickleBoundsError(f"a dict key of type {_TYPE_NAMES[key]} at byte {at}: keys may be "
                                        "strings, ints of 32 bits, bools or None")

    def _put(self, index: int, at: int) -> None:
        memo = self._memo
        if index < 0 or index > len(memo):  # the pickler numbers its memo 0, 1, 2, ...
            raise PickleBoundsError(f"memo index {index} is not the next one ({len(memo)})")
        (kind,) = self._pop(1, at)
        self._stack.append(kind)
        if index == len(memo):
            memo.append(kind)
        else:
            memo[index] = kind


def check_expanded(value: Any, max_bytes: int) -> None:
    """Raise PickleBoundsError if `value`, written out as JSON (a shared object each time it
    appears), would be over about `max_bytes` or nest deeper than MAX_DEPTH. The walk
    stops as soon as a bound is passed, so it costs at most ~max_bytes steps."""
    budget = max_bytes
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str | bytes | bytearray):
            budget -= len(v) + 3
        elif isinstance(v, list | tuple | set | frozenset | dict):
            if depth >= MAX_DEPTH:
                raise PickleBoundsError(f"nested deeper than {MAX_DEPTH}")
            items = [x for item in v.items() for x in item] if isinstance(v, dict) else v
            budget -= 2 + len(items)
            stack.extend((x, depth + 1) for x in items)
        elif isinstance(v, int) and not isinstance(v, bool):
            budget -= 1 + v.bit_length() // 3  # ~ decimal digits
        else:
            budget -= 8  # a float, None, a bool
        if budget < 0:
            raise PickleBoundsError(f"over {max_bytes} bytes once its shared parts are written out")
