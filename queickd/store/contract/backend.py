"""What every role of a store carries: its URL and the exceptions by which it says it is
itself in trouble."""

from __future__ import annotations

from typing import Protocol


class Backend(Protocol):
    url: str
    # The exceptions by which the store says it is itself in trouble (a lost connection, a
    # full or failing disk), never the data a call carried; the next call may succeed.
    UNAVAILABLE: tuple[type[BaseException], ...]
    # Those of UNAVAILABLE raised before anything was written (SQLite's full disk): the
    # call surely had no effect, so its caller is told so, not "it may have been stored".
    NOT_WRITTEN: tuple[type[BaseException], ...]
