"""Calls handed to an event loop by other threads, many for one wake-up.

`loop.call_soon_threadsafe` writes to the loop's wake-up pipe on every call: a system call
in the calling thread, and a read and a pass of the loop in its own. The committer answers
every submitter of a commit one after the other: through an Inbox the first answer wakes
the loop and the others ride along with it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any


class Inbox:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._calls: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._woken = False  # a drain is scheduled and has not yet taken the calls

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run fn(*args) on the loop's thread soon, in the order calls were made. Any thread;
        raises RuntimeError once the loop is closed, as call_soon_threadsafe does."""
        with self._lock:
            self._calls.append((fn, args))
            if self._woken:
                return
            self._woken = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except BaseException:
            with self._lock:
                self._woken = False
            raise

    def _drain(self) -> None:
        with self._lock:
            calls, self._calls = self._calls, deque()
            self._woken = False
        for fn, args in calls:
            fn(*args)
