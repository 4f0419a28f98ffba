"""The one range check for numbers a client (or a config file) gives: every numeric field
of the protocol, the sandbox limits and a workflow's budgets go through `in_range`.

JSON numbers arrive as Python ints of any size or as floats. An int too large for a float
(10**309) makes float(), math.isfinite() and float arithmetic raise OverflowError, so a
value is compared with its bounds first (comparing an int with a float is exact in Python
and never overflows) and converted only once it is known to fit. NaN fails every
comparison and so every range. Pure: no I/O.
"""

from __future__ import annotations

import sys
from typing import Any

MAX_FLOAT = sys.float_info.max  # a "finite number" is one from -MAX_FLOAT to MAX_FLOAT


def in_range(name: str, v: Any, lo: float = -MAX_FLOAT, hi: float = MAX_FLOAT, *, integer: bool = False,
             above: bool = False, message: str | None = None) -> Any:
    """`v` if it is a number (an int when `integer`; never a bool) from `lo` (exclusive
    when `above`) to `hi`: a float unless `integer`. ValueError naming `name` otherwise,
    with `message` (which should name it too) when given."""
    if (type(v) is int or (type(v) is float and not integer)) and (lo < v if above else lo <= v) and v <= hi:
        return v if integer else float(v)
    if message is None:
        kind = "an integer" if integer else "a number"
        if lo == -MAX_FLOAT and hi == MAX_FLOAT:
            message = f"{name} must be a finite number"
        elif above:
            message = f"{name} must be {kind} above {_show(lo)} and at most {_show(hi)}"
        else:
            message = f"{name} must be {kind} from {_show(lo)} to {_show(hi)}"
    raise ValueError(message)


def _show(x: float) -> str:
    return str(x) if type(x) is int else str(int(x)) if abs(x) < 1e16 and x == int(x) else f"{x:g}"
