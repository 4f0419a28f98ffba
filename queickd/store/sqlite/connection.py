"""The SQLite store's file: its connections, transactions, the daemon's lock and multi-row
inserts. Opening a file checks it first (check.py: a damaged one raises DamagedStoreError),
then applies its migrations (schema.py). This module runs no query of the store's own.

Every write in this process goes through one connection, under one Python lock taken before
BEGIN IMMEDIATE, so writers hand over at once instead of backing off in SQLite's sleeping
busy handler; busy_timeout still covers other processes. It commits at synchronous=NORMAL,
and a commit that must be durable (durability "full", the default: a Pi loses power) is
flushed after the write lock is released (flush.py). Readers use their own per-thread
connections and never block the writer.

A disk full at start does not stop the daemon: the file is opened read-only and immutable
(no -shm needed), reads are served, and every write raises DiskFullError until a write
finds space again; then each thread's connection is replaced on its next use. A database
file or WAL deleted or replaced under the daemon is noticed at the next commit (files.py):
what the WAL holds is saved, and every write after is refused until a restart. A store kept
in memory (inmemory.py) has one connection, which every thread shares, and no file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import itertools
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
from typing import Any

from ...settings import SQLITE_PAGE
from ..records import NotDurableError, StoreInUseError
from ..sql.transaction import SqlTransaction
from . import check as sqlite_check
from . import schema as sqlite_schema
from .checkpoint import BACKSTOP_PAGES, Checkpointer
from .files import FilesWatch
from .flush import WalFlusher
from .inmemory import IN_MEMORY, CommittedReads, copy_migrated
from .transactions import roll_back

log = logging.getLogger("queickd.store")

_ROWS_MAX = 256  # rows per INSERT statement; statements of 2**k rows, so few distinct ones
_ROOM = 1 << 20  # bytes free below which a write that fails is put down to a full disk
_RETRY_WRITABLE = 1.0  # seconds between attempts to open the file for writing again


class DiskFullError(sqlite3.OperationalError):
    """The disk holding the store is full: the store serves reads only, and this write was
    not made. The first write after space returns succeeds."""


class StoreFilesLostError(sqlite3.OperationalError):
    """The store's database file or WAL was deleted or replaced under the daemon: this
    write was not made, nor is any until the daemon is restarted."""


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use on the file system holding `path`."""
    st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    return st.f_bavail * st.f_frsize


def _into_wal(c: sqlite3.Connection, synchronous: str) -> None:
    """A new connection's settings. A new file gets small pages before WAL mode fixes its
    page size: a job changes a few rows on a few pages, each a whole frame in the WAL, so
    smaller pages write fewer bytes to a card per job."""
    c.execute(f"PRAGMA page_size={SQLITE_PAGE}")
    c.execute("PRAGMA journal_mode=WAL")
    c.execute(f"PRAGMA synchronous={synchronous}")
    c.execute("PRAGMA journal_size_limit=67108864")  # keep the WAL small on SD cards


def insert_rows(c: sqlite3.Connection, insert: tuple[str, int], rows: list[tuple]) -> None:
    """INSERT rows with multi-row VALUES statements (cheaper than executemany's step per
    row), in chunks of 2**k rows: few SQL texts, which the statement cache holds."""
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
    # Raised before a transaction begins, while the store serves reads only.
    NOT_WRITTEN: tuple[type[BaseException], ...] = (DiskFullError, StoreFilesLostError)

    def __init__(self, path: str, durability: str = "full", busy_timeout: float = 30.0) -> None:
        if durability not in ("full", "normal"):
            raise ValueError("durability must be 'full' or 'normal'")
        self.in_memory = path == IN_MEMORY  # memory:// (inmemory.py): one connection, no file
        self.url = "memory://" if self.in_memory else f"sqlite:///{path}"  # as given: what the user named
        self.path = path = sqlite_check.real_path(path)
        self.durability = durability
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        # Reentrant: memory://'s reads take it (inmemory.CommittedReads), one inside a transaction too.
        self._write_lock = threading.RLock()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._w: sqlite3.Connection | None = None  # see _writer
        # Durable commits are flushed apart from COMMIT; "normal" durability never flushes.
        on_disk = not self.in_memory
        self._flusher = WalFlusher(path) if durability == "full" and on_disk else None
        self._checkpointer = Checkpointer(path) if on_disk else None
        self._files = FilesWatch(path) if on_disk else None
        self._commits = self._commits_seen = 0  # commits made; of them, those watch_files saw
        self._lock_fd: int | None = None
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.read_only = False  # the disk was full: see _read_only_open
        self._gen = 0  # bumped when every thread must replace its connection
        self._mode_lock = threading.Lock()
        self._next_try = 0.0  # monotonic time of the next attempt to leave read-only mode
        if on_disk:
            sqlite_check.check_file(path)  # DamagedStoreError before SQLite touches the file
        try:
            self._open_writable()
        except sqlite3.OperationalError as e:
            self.close()
            if not on_disk or free_bytes(path) >= _ROOM:
                raise
            self._read_only_open(e)
        except BaseException:
            self.close()
            raise

    def _open_writable(self) -> None:
        """Check and migrate the file on this thread's connection, then write the marker.
        Leaves closing to the caller."""
        on_disk = not self.in_memory
        try:
            with self._write_lock:
                c = self._conn() if on_disk else self._writer()
                if on_disk:
                    sqlite_check.check_open(c, self.path)
                else:
                    copy_migrated(c)
                sqlite_schema.migrate(c, self.path)
                page = c.execute("PRAGMA page_size").fetchone()[0]
            if on_disk and page != SQLITE_PAGE:
                log.info("%s has pages of %d bytes (a new store's are %d): 'queick db vacuum' rewrites it, "
                         "with the daemon stopped, to write a card fewer bytes a job", self.path, page, SQLITE_PAGE)
        except sqlite3.DatabaseError as e:
            if isinstance(e, sqlite3.OperationalError):
                raise
            raise sqlite_check.DamagedStoreError(self.path, f"SQLite cannot read it: {e}") from None
        if on_disk:
            try:
                sqlite_check.write_marker(self.path)
            except OSError as e:  # written by the next start that has room
                log.warning("cannot write the store's marker %s: %s", sqlite_check.marker_path(self.path), e)

    def _read_only_open(self, cause: sqlite3.OperationalError) -> None:
        """Serve reads from a file that cannot be opened for writing for want of space.
        Immutable: SQLite then neither needs a -shm nor reads the -wal, so a -wal holding
        commits (a crash before) must not be left out: then the daemon cannot start."""
        wal = self.path + "-wal"
        if os.path.exists(wal) and os.path.getsize(wal) > 0:
            raise OSError(errno.ENOSPC, f"disk full: the disk holding {self.path} has no room, and {wal} "
                          f"holds commits not yet in the file ({cause}); free some space, then start again")
        self.read_only = True
        c = self._conn()
        try:
            sqlite_check.check_open(c, self.path)
            current = sqlite_schema.version(c)
        except BaseException:
            self.close()
            raise
        if current != sqlite_schema.SCHEMA_VERSION:
            self.close()
            raise OSError(errno.ENOSPC, f"disk full: {self.path} needs its schema upgraded (version {current} to "
                          f"{sqlite_schema.SCHEMA_VERSION}), which needs space; free some, then start again")
        log.warning("disk full: the disk holding %s has %d bytes free (%s); serving reads only, writes are "
                    "refused until space returns", self.path, free_bytes(self.path), cause)

    def _leave_read_only(self) -> None:
        """Called before each write while read-only: open for writing if there is room
        again, else raise DiskFullError."""
        with self._mode_lock:
            if not self.read_only:
                return
            free = free_bytes(self.path)
            if free >= _ROOM and time.monotonic() >= self._next_try:
                self._next_try = time.monotonic() + _RETRY_WRITABLE
                self.read_only = False
                self._gen += 1  # every thread's read-only connection is replaced
                try:
                    self._open_writable()
                except sqlite3.OperationalError as e:
                    self.read_only = True
                    self._gen += 1  # this thread's writable connection is replaced too
                    log.warning("disk space is back (%d bytes free) but the store still cannot be written: %s",
                                free, e)
                else:
                    log.warning("disk space is back (%d bytes free): writes to %s are accepted again",
                                free, self.path)
                    return
            raise DiskFullError(f"disk full: the disk holding {self.path} has {free} bytes free; queickd serves "
                                "reads only and nothing was written; free some space and try again")

    # --- connections ----------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection | CommittedReads:
        if self.in_memory:
            return CommittedReads(self._writer(), self._write_lock)
        c = getattr(self._local, "conn", None)
        if c is not None and self._local.gen != self._gen and c is not self._w:  # the store changed mode
            with self._all_lock:
                if c in self._all:
                    self._all.remove(c)
            with contextlib.suppress(sqlite3.Error):
                c.close()
            c = None
        if c is not None:
            return c
        if self._files is not None and self._files.lost is not None and self._w is not None:
            # A connection opened now may fail (disk I/O error: its WAL is gone) while the
            # writer's still reads; no write begins any more, so it serves reads for all.
            c = self._w
        else:
            if self.read_only:
                c = sqlite3.connect(f"file:{urllib.parse.quote(self.path)}?mode=ro&immutable=1", uri=True,
                                    isolation_level=None, check_same_thread=False)
            else:
                c = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                                    check_same_thread=False)
                _into_wal(c, self.durability.upper())
            with self._all_lock:
                self._all.append(c)
        self._local.conn, self._local.gen = c, self._gen
        return c

    def _writer(self) -> sqlite3.Connection:
        """The one connection that writes, shared by every thread under _write_lock: it
        keeps its page cache across transactions, which a commit on another connection
        would make it drop."""
        c = self._w  # made once, under _all_lock; read without it by every transaction
        if c is not None:
            return c
        with self._all_lock:
            c = self._w
            if c is None:
                c = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                                    check_same_thread=False)
                if not self.in_memory:
                    _into_wal(c, "NORMAL")
                if self._checkpointer is not None:  # checkpoints on a thread of their own; this one a backstop
                    c.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
                if self._flusher is not None:
                    self._flusher.reset()  # a new writer: the WAL may be a new file
                if self._files is not None:
                    self._files.reset()
                self._w = c
                self._all.append(c)
        return c

    def _write(self, bookkeeping: bool = False) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """One write transaction. `bookkeeping` transactions (claims, finishes, promotions)
        are not flushed to disk: a power cut can undo the last of them, and the only
        effect is that a job runs again (at-least-once). Everything else, acknowledged
        submits above all, is flushed at the store's durability before this returns,
        outside the write lock (claiming_transaction's: by the caller's flush()); the
        flush also makes every earlier bookkeeping commit durable."""
        return _Transaction(self, bookkeeping, False, False)

    def flush(self) -> None:
        """Make every commit made so far durable (at durability "full"; else nothing to
        do). One fdatasync serves every caller waiting meanwhile."""
        if self._flusher is not None:
            self._flusher.flush()

    def durability_said(self) -> str:
        if self.in_memory:
            return "not durable: a memory store ends with its process"
        return f"durability {self.durability}"

    def durability_lost(self) -> str | None:
        if self._files is not None and self._files.lost is not None:
            return f"{self._files.lost} under the running daemon; writes are refused"
        failed = self._flusher.failed if self._flusher is not None else None
        return None if failed is None else f"a flush of the WAL to disk failed: {failed}"

    def watch_files(self) -> bool:
        """Store.watch_files: a WAL deleted while nothing is written is noticed at the next
        look, not at the next commit (which may come after a crash), and what it holds is
        saved. Once no commit came since the last look, the WAL is copied into the database
        file: with nothing left in it to lose, no further look is wanted until commits come
        again (an idle daemon wakes for nothing)."""
        files = self._files
        if files is None or self.read_only or files.lost is not None:
            return False
        with self._write_lock:
            c = self._w
            if c is None:
                return False
            if files.check() is not None:
                with contextlib.suppress(NotDurableError):  # said loudly: writes are refused now
                    self._files_lost(c)
                return False
            if self._commits != self._commits_seen:
                self._commits_seen = self._commits
                return True
            try:
                _, frames, copied = c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            except sqlite3.Error:
                return True
            if frames != copied:  # a reader's snapshot held some back: look again
                return True
            log.debug("store files: the WAL is all in %s; looking again once commits come", self.path)
            return False

    def _files_lost(self, c: sqlite3.Connection) -> None:
        """After the commit that found the database file or WAL gone (under the write lock):
        save what can be saved, say so loudly, and refuse every write from now on. Raises
        NotDurableError if this commit may now be lost."""
        files = self._files
        assert files is not None and files.lost is not None
        saved = False
        if files.wal_only:
            # SQLite still has the deleted WAL open: a checkpoint copies its commits into
            # the database file and syncs it, so nothing acknowledged is lost.
            try:
                _, frames, copied = c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                saved = frames == copied
            except sqlite3.Error as e:
                log.error("could not checkpoint the deleted WAL into %s: %s", self.path, e)
        if saved:
            outcome = (f"every commit so far was copied into {self.path}, nothing is lost; "
                       "restart the daemon to accept writes again")
        elif files.wal_only:
            outcome = (f"commits not yet copied into {self.path} are only in the deleted file: stop the "
                       "daemon with SIGTERM, never SIGKILL (its last connection's close copies them), then "
                       "start it again")
        else:
            outcome = ("commits since are in a file no one will read after a restart: stop the daemon, put "
                       "the database file back (or a copy made by 'queick db backup'), then start it again")
        log.critical("STORE FILE LOST: %s while the daemon had it open; no write is accepted from now on "
                     "(enqueues are answered 'internal'); %s", files.lost, outcome)
        if not saved:
            raise NotDurableError(f"{files.lost} under the running daemon: this commit may be lost; {outcome}")

    def take_ownership(self) -> None:
        if self.in_memory:
            return  # one process is the whole store
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
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        except OSError:
            pass  # a full disk: the lock holds all the same, only the pid is not shown
        self._lock_fd = fd

    def transaction(self, bookkeeping: bool = False) -> contextlib.AbstractContextManager[SqlTransaction]:
        """Lifecycle.transaction: _write's transaction, entered as its handle."""
        return _Transaction(self, bookkeeping, False, True)

    def claiming_transaction(self) -> contextlib.AbstractContextManager[SqlTransaction]:
        """ClaimsInSubmit: transaction(), its flush left to the caller's flush()."""
        return _Transaction(self, False, True, True)

    def integrity_check(self) -> str:
        """'ok', or what SQLite's quick_check found wrong."""
        rows = self._conn().execute("PRAGMA quick_check").fetchall()
        return "\n".join(r[0] for r in rows)

    def close(self) -> None:
        if self.in_memory:
            return  # its connection is the database: a store used after close keeps its jobs
        checkpointer = self._checkpointer
        if checkpointer is not None:  # its thread before the connections: the last close checkpoints
            checkpointer.close()
            self._checkpointer = Checkpointer(self.path)  # a store used again checkpoints again
        with self._all_lock:
            for c in self._all:
                with contextlib.suppress(sqlite3.Error):
                    c.close()
            self._all.clear()
            self._w = None
        if checkpointer is not None:
            checkpointer.close_index()  # after every connection (Checkpointer's docstring)
        if self._flusher is not None:
            self._flusher.reset()
        self._local = threading.local()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the daemon's lock
            self._lock_fd = None


class _Transaction(SqlTransaction):
    """SQLiteFile's write transaction (see _write), which is also its handle when entered
    from transaction() (`handle`). Under the write lock: BEGIN IMMEDIATE, the body, COMMIT,
    or on any error a rollback (transactions.roll_back). A class, not nested generators:
    every pass and every commit of submits enters one, and those would cost more than its
    BEGIN and COMMIT."""

    __slots__ = ("bookkeeping", "defer_flush", "handle")

    def __init__(self, file: SQLiteFile, bookkeeping: bool, defer_flush: bool, handle: bool) -> None:
        self.store = file  # the SQLiteStore whose SQLiteFile this is
        self.bookkeeping = bookkeeping
        self.defer_flush = defer_flush
        self.handle = handle

    def __enter__(self) -> Any:
        f: SQLiteFile = self.store
        if f.read_only:
            f._leave_read_only()  # DiskFullError while there is no room
        if f._files is not None and f._files.lost is not None:
            raise StoreFilesLostError(f"{f._files.lost} under the running daemon; nothing was written and no "
                                      "write is accepted until the daemon is restarted (see its log)")
        c = self.conn = f._writer()
        f._write_lock.acquire()
        try:
            c.execute("BEGIN IMMEDIATE")
        except BaseException:
            f._write_lock.release()
            raise
        return self if self.handle else c

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        f: SQLiteFile = self.store
        c = self.conn
        try:
            if kind is None:
                try:
                    c.execute("COMMIT")
                except BaseException:
                    roll_back(c)
                    raise
                if f._flusher is not None:
                    f._flusher.written()
                if f._checkpointer is not None:
                    f._checkpointer.committed()
                f._commits += 1
                # Checked for the commits a client is told of (a group of submits is one);
                # bookkeeping (claims, finishes) is not, and what it wrote is saved all the same.
                if f._files is not None and not self.bookkeeping and f._files.check() is not None:
                    f._files_lost(c)
            else:
                roll_back(c)
        finally:
            f._write_lock.release()
        if kind is None and not (self.bookkeeping or self.defer_flush):
            f.flush()
