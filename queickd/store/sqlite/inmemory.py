"""The SQLite store kept in this process's memory (`memory://`): for tests and benchmarks.

One private database on one connection, which every thread shares (a second connection to
":memory:" would open another, empty database). Nothing is written to a file and nothing
outlives the process; SQLiteFile leaves out what only a file needs (flush, checkpoint,
watch, lock, marker).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

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


class CommittedReads:
    """memory://'s reading connection: the writer's own, each statement run whole under the
    write lock. Without the lock a read on another thread, on the one connection, sees a
    transaction's writes before it commits (and those it then rolls back): a run's status
    written before its state, a claim that never happened. With it, a read sees what a
    file's reader sees: the last commit."""

    __slots__ = ("_c", "_lock")

    def __init__(self, c: sqlite3.Connection, lock: AbstractContextManager[Any]) -> None:
        self._c, self._lock = c, lock

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Rows:
        with self._lock:
            cur = self._c.execute(sql, params)
            return Rows(cur.fetchall(), cur.rowcount)


class Rows:
    """A statement's rows, read whole: what the store's reads use of a cursor."""

    __slots__ = ("_rows", "_next", "rowcount")

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows, self._next, self.rowcount = rows, 0, rowcount

    def fetchone(self) -> Any:
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    def fetchall(self) -> list[Any]:
        rest, self._next = self._rows[self._next:], len(self._rows)
        return rest

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())
