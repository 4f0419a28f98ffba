"""The SQLite store's file: its connections, transactions, the daemon's lock and multi-row
inserts. Opening a file applies its migrations (sqlite_schema.py).

WAL journal; synchronous FULL by default (a Pi loses power), NORMAL on request. Every
write in this process goes through one connection, under one Python lock taken before
BEGIN IMMEDIATE, so writers hand over at once instead of backing off in SQLite's sleeping
busy handler; busy_timeout still covers other processes (the CLI, a second daemon by
mistake). Readers use their own per-thread connections and never block writers. Opening
checks the file first (sqlite_check.py): a damaged one raises DamagedStoreError.
This module runs no query of the store's own; sqlite.py does.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import itertools
import os
import sqlite3
import threading
from collections.abc import Iterator

from . import sqlite_check, sqlite_schema
from .base import StoreInUseError

_ROWS_MAX = 256  # rows per INSERT statement; statements of 2**k rows, so few distinct ones
_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}


def insert_rows(c: sqlite3.Connection, insert: tuple[str, int], rows: list[tuple]) -> None:
    """INSERT rows with multi-row VALUES statements: one statement step for many rows costs
    less than half of executemany's step per row. Chunks of 2**k rows (at most _ROWS_MAX)
    keep the SQL texts few, so the connection's statement cache holds them all."""
    # Older SQLite builds allow 999 parameters per statement, newer ones 32,766.
    fits = min(_ROWS_MAX, c.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // insert[1])
    largest = 1 << (fits.bit_length() - 1)
    i, n = 0, len(rows)
    while i < n:
        size = min(largest, 1 << ((n - i).bit_length() - 1))
        c.execute(_values_sql(insert, size), list(itertools.chain.from_iterable(rows[i:i + size])))
        i += size


@functools.cache
def _values_sql(insert: tuple[str, int], rows: int) -> str:
    head, width = insert
    return head + ",".join(["(" + ",".join("?" * width) + ")"] * rows)


class SQLiteFile:
    """Connections to one SQLite file; the base of SQLiteStore."""

    # A full or failing disk, a lock held too long: the file's trouble, not a call's data.
    UNAVAILABLE: tuple[type[BaseException], ...] = (sqlite3.OperationalError,)

    def __init__(self, path: str, durability: str = "full", busy_timeout: float = 30.0) -> None:
        if durability not in _SYNCHRONOUS:
            raise ValueError("durability must be 'full' or 'normal'")
        self.path = path
        self.url = f"sqlite:///{path}"
        self.durability = durability
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._w: sqlite3.Connection | None = None  # see _writer
        self._w_sync: str | None = None  # its PRAGMA synchronous, changed under _write_lock
        self._lock_fd: int | None = None
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        on_disk = path != ":memory:"
        if on_disk:
            sqlite_check.check_file(path)  # DamagedStoreError before SQLite touches the file
        try:
            with self._write_lock:
                c = self._conn()
                if on_disk:
                    sqlite_check.check_open(c, path)
                sqlite_schema.migrate(c, path)
        except sqlite3.DatabaseError as e:
            self.close()
            if isinstance(e, sqlite3.OperationalError):
                raise
            raise sqlite_check.DamagedStoreError(path, f"SQLite cannot read it: {e}") from None
        except BaseException:
            self.close()
            raise
        if on_disk:
            sqlite_check.write_marker(path)

    # --- connections ----------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = sqlite3.connect(
                self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
            )
            c.execute("PRAGMA journal_mode=WAL")
            c.execute(f"PRAGMA synchronous={_SYNCHRONOUS[self.durability]}")
            c.execute("PRAGMA journal_size_limit=67108864")  # keep the WAL small on SD cards
            self._local.conn = c
            with self._all_lock:
                self._all.append(c)
        return c

    def _writer(self) -> sqlite3.Connection:
        """The one connection that writes, shared by every thread under _write_lock. One
        connection keeps its page cache across transactions; with one per thread, each
        commit made the other connections drop theirs and read the pages back (a dozen
        pread calls per job). Its synchronous level follows each transaction's needs."""
        if self.path == ":memory:":  # a second connection would be another, empty database
            return self._conn()
        with self._all_lock:
            c = self._w
            if c is None:
                c = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                                    check_same_thread=False)
                c.execute("PRAGMA journal_mode=WAL")
                c.execute("PRAGMA journal_size_limit=67108864")  # keep the WAL small on SD cards
                self._w = c
                self._all.append(c)
        return c

    @contextlib.contextmanager
    def _write(self, bookkeeping: bool = False) -> Iterator[sqlite3.Connection]:
        """One write transaction. `bookkeeping` transactions (claims, finishes, promotions)
        commit without their own fsync in WAL (synchronous=NORMAL): a power cut can undo
        the last of them, and the only effect is that a job runs again (at-least-once).
        Everything else, acknowledged submits above all, commits at the store's
        durability; its fsync also makes every earlier bookkeeping commit durable."""
        inside = getattr(self._local, "batch_conn", None)
        if inside is not None:  # inside batch(): its transaction is ours
            yield inside
            return
        c = self._writer()
        with self._write_lock:
            sync = "NORMAL" if bookkeeping else _SYNCHRONOUS[self.durability]
            if self._w_sync != sync:  # a statement without I/O, only when the level changes
                c.execute(f"PRAGMA synchronous={sync}")
                self._w_sync = sync
            c.execute("BEGIN IMMEDIATE")
            try:
                yield c
                c.execute("COMMIT")
            except BaseException:
                # SQLite may already have rolled back (disk full, I/O error); never leave the
                # connection inside a transaction, and never hide the first error.
                if c.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        c.execute("ROLLBACK")
                raise

    def take_ownership(self) -> None:
        # An advisory lock beside the database, held for the daemon's life; the kernel
        # drops it when the process dies, kill -9 included, so no stale lock survives.
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise StoreInUseError(f"{self.path} is already served by a daemon (pid {holder}); "
                                  "one store, one daemon") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    @contextlib.contextmanager
    def batch(self, bookkeeping: bool = False) -> Iterator[None]:
        if getattr(self._local, "batch_conn", None) is not None:
            yield
            return
        with self._write(bookkeeping) as c:
            self._local.batch_conn = c
            try:
                yield
            finally:
                self._local.batch_conn = None

    def integrity_check(self) -> str:
        """'ok', or what SQLite's quick_check found wrong."""
        rows = self._conn().execute("PRAGMA quick_check").fetchall()
        return "\n".join(r[0] for r in rows)

    def close(self) -> None:
        with self._all_lock:
            for c in self._all:
                with contextlib.suppress(sqlite3.Error):
                    c.close()
            self._all.clear()
            self._w, self._w_sync = None, None
        self._local = threading.local()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the daemon's lock
            self._lock_fd = None
