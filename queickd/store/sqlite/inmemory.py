"""The SQLite store kept in this process's memory (`memory://`): for tests and benchmarks.

One private database on one connection, which every thread shares (a second connection to
":memory:" would open another, empty database). Nothing is written to a file and nothing
outlives the process; SQLiteFile leaves out what only a file needs (flush, checkpoint,
watch, lock, marker).
"""

from __future__ import annotations

import sqlite3
import threading

from . import schema as sqlite_schema

IN_MEMORY = ":memory:"  # the path SQLiteFile takes for a store kept in memory

_migrated_lock = threading.Lock()
_migrated: sqlite3.Connection | None = None  # an in-memory database at SCHEMA_VERSION, to copy


def copy_migrated(c: sqlite3.Connection) -> None:
    """Make the empty in-memory database of `c` a copy of one migrated once in this process:
    migrating from nothing runs every migration, a copy of its pages costs far less, and a
    test suite opens a memory store per test."""
    global _migrated
    with _migrated_lock:
        if _migrated is None:
            m = sqlite3.connect(IN_MEMORY, isolation_level=None, check_same_thread=False)
            sqlite_schema.migrate(m, IN_MEMORY)
            _migrated = m
        _migrated.backup(c)
