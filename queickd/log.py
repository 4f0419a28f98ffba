"""Logging to stderr in a form journald reads well.

Under systemd (JOURNAL_STREAM is set) each line starts with a syslog priority, `<6>`, and
carries no timestamp: the journal adds its own. Elsewhere lines carry a timestamp.
Identical lines repeated in a burst (asyncio's accept error when file descriptors run
out comes thousands of times a second) are collapsed: a few per window, then one line
saying how many were left out, so a flood cannot fill an SD card.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}
LEVELS = ("debug", "info", "warning", "error")


class _JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prio = _PRIORITY.get(record.levelno, 6)
        text = super().format(record)
        return "\n".join(f"<{prio}>{line}" for line in text.splitlines())


class RepeatFilter(logging.Filter):
    """Let at most `burst` identical lines (same logger, level and text) through per
    `window` seconds; the first one after that names how many were left out."""

    def __init__(self, burst: int = 5, window: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst, self.window, self.clock = burst, window, clock
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int, str], list[float | int]] = {}  # key → [window start, lines, left out]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            key = (record.name, record.levelno, record.getMessage())
        except Exception:
            return True  # a line that cannot be formatted is logging's own error to report
        now = self.clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or now - seen[0] >= self.window:
                left_out = int(seen[2]) if seen is not None else 0
                if len(self._seen) > 1000:  # forget old keys: bounded memory
                    self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.window}
                self._seen[key] = [now, 1, 0]
                if left_out:
                    record.msg = f"{record.getMessage()} [{left_out} identical line(s) left out before this]"
                    record.args = None
                return True
            seen[1] += 1
            if seen[1] <= self.burst:
                return True
            seen[2] += 1
            return False


def setup(level: str = "info", file: str | None = None) -> None:
    """Log to stderr and, with `file` (Queick's --log-filepath), append to that file too,
    timestamped. ValueError (a configuration error) if the file cannot be opened."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RepeatFilter())
    stamped = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(_JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(stamped)
    handlers: list[logging.Handler] = [handler]
    if file is not None:
        try:
            to_file = logging.FileHandler(file, encoding="utf-8")
        except OSError as e:
            raise ValueError(f"--log-filepath {file}: cannot open it for appending: {e}") from None
        to_file.addFilter(RepeatFilter())
        to_file.setFormatter(stamped)
        handlers.append(to_file)
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(level.upper())
