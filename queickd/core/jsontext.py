"""JSON text as queickd writes and reads it: compact, non-ASCII kept, and one call into
CPython's C encoder or scanner per value.

`json.dumps` with options builds a JSONEncoder per call, and `JSONEncoder.encode` and
`JSONDecoder.decode` wrap the C code in Python layers (an encoder object made per call,
a regular expression matched for whitespace on each side): most of what a small value
costs to encode and decode, paid per request line, reply and stored job. The
output and the errors are the standard library's: a text that the scanner alone does not
take whole (surrounding whitespace, extra data, no JSON at all) goes through `decode`,
which accepts it or says what is wrong.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from json import encoder as _encoder_module
from typing import Any

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)  # its default() and the fallback
_make_encoder = _encoder_module.c_make_encoder  # None without the C accelerator
_encode_str = _encoder_module.encode_basestring  # non-ASCII kept (ensure_ascii=False)
_per_thread = threading.local()


def _thread_encoder() -> tuple[Callable[[Any, int], Any], dict]:
    marks: dict = {}
    enc = _make_encoder(marks, _ENCODER.default, _encode_str, None, ":", ",", False, False, True)
    _per_thread.encoder = enc, marks
    return enc, marks


def dumps(value: Any) -> str:
    """`json.dumps(value, separators=(",", ":"), ensure_ascii=False)`."""
    if _make_encoder is None:
        return _ENCODER.encode(value)
    # One C encoder per thread, not per call as json makes it. Its circular-reference marks
    # are empty again after every encoding that ends well; one that raises may leave some.
    try:
        enc, marks = _per_thread.encoder
    except AttributeError:
        enc, marks = _thread_encoder()
    try:
        return "".join(enc(value, 0))
    except BaseException:
        marks.clear()
        raise


def loader(decoder: json.JSONDecoder) -> Callable[[str], Any]:
    """`decoder.decode`, calling its C scanner alone for a text that is one JSON value with
    nothing around it."""
    scan = decoder.scan_once
    decode = decoder.decode

    def loads(text: str) -> Any:
        try:
            value, end = scan(text, 0)
        except StopIteration:  # no value starts at 0: whitespace first, or not JSON
            return decode(text)
        return value if end == len(text) else decode(text)

    return loads


_plain_loads = loader(json.JSONDecoder())


def loads(s: str | bytes | bytearray) -> Any:
    """`json.loads(s)`: a str by the scanner alone, anything else (bytes, a str starting
    with a byte-order mark, which json refuses by name) as json.loads takes it."""
    if type(s) is str and not s.startswith("\ufeff"):
        return _plain_loads(s)
    return json.loads(s)


class _Unfit(str):
    """A number literal no field can hold (1e309, NaN, Infinity, an int past Python's
    digit limit), kept as its text by the decoder that finds where it was."""


def _unfit_int(text: str) -> int | _Unfit:
    try:
        return int(text)
    except ValueError:
        return _Unfit(text)


def _unfit_float(text: str) -> float | _Unfit:
    v = float(text)
    return v if math.isfinite(v) else _Unfit(text)


_LOCATING = json.JSONDecoder(parse_float=_unfit_float, parse_int=_unfit_int, parse_constant=_Unfit)


def unfit_number(text: str) -> tuple[str, str] | None:
    """(the path, as "jobs[0].cost_units", and the literal, shortened) of the first number in
    the JSON `text` that no number field can hold, or None if there is none or `text` is
    not JSON for another reason. For the error path only: it decodes `text` again."""
    try:
        obj = _LOCATING.decode(text)
    except (ValueError, RecursionError):
        return None
    todo: list[tuple[str, Any]] = [("", obj)]
    while todo:
        path, v = todo.pop()
        if type(v) is _Unfit:
            return path, v if len(v) <= 24 else f"{v[:12]}... ({len(v)} characters)"
        if type(v) is dict:
            todo.extend((f"{path}.{k}" if path else k, x) for k, x in reversed(v.items()))
        elif type(v) is list:
            todo.extend((f"{path}[{i}]", x) for i, x in reversed(list(enumerate(v))))
    return None
