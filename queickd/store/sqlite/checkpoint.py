"""Checkpoints of the SQLite store's WAL, made on a thread of their own.

SQLite checkpoints (copies the WAL into the database file, with an fsync of each) inside
the COMMIT that takes the WAL past `wal_autocheckpoint` pages, with the store's write lock
held, and every submit waits behind it. Here a thread with a connection of its own makes
PASSIVE checkpoints instead (never waiting for, nor blocking, the writer) once
TARGET_FRAMES frames wait. The writer's own checkpoint stays at BACKSTOP_PAGES: under
steady writes a PASSIVE checkpoint never quite catches up, and only a WAL copied to its
last frame starts over; it also bounds the WAL should this thread fall behind.

How many frames wait is read from the WAL index (the -shm: mxFrame and nBackfill, at
offsets https://www.sqlite.org/walformat.html documents) every LOOK_EVERY commits, by the
committing thread, which alone wakes the thread: an idle daemon wakes for nothing.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import struct
import threading

log = logging.getLogger("queickd.store")

TARGET_FRAMES = 1000  # WAL frames copied by one checkpoint: SQLite's own default
BACKSTOP_PAGES = 4 * TARGET_FRAMES  # the writer's wal_autocheckpoint while this thread runs
LOOK_EVERY = 16  # commits between two looks at the WAL index
_MX_FRAME, _N_BACKFILL = 16, 96  # byte offsets in the WAL index: u32s in the host's byte order
_U32 = struct.Struct("=I")


def frames_waiting(index: bytes) -> int:
    """Frames of the WAL not yet copied into the database, from the WAL index's first bytes."""
    if len(index) < _N_BACKFILL + 4:
        return 0  # no index yet
    return max(0, _U32.unpack_from(index, _MX_FRAME)[0] - _U32.unpack_from(index, _N_BACKFILL)[0])


class Checkpointer:
    """PASSIVE checkpoints of `path` on a thread started by the first one due.

    The WAL index is read through a descriptor kept open while SQLite has the file open:
    SQLite locks the index with POSIX (fcntl) locks, and closing any descriptor of a file
    drops every lock this process holds on it (another process, `queick db backup` say,
    would then rebuild the index under the daemon and checkpoint past its readers). It is
    replaced once SQLite has deleted the file (with its last connection), and closed by
    close_index() once every connection of the store is."""

    def __init__(self, path: str, target: int = TARGET_FRAMES) -> None:
        self._path = path
        self._target = target
        self._commits = 0  # counted so far, under the store's write lock
        self._index: int | None = None  # the -shm file, opened at the first look
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._warned = False
        self.checkpoints = 0  # made by this thread
        self.copying = 0  # of those, the checkpoints that ran (not busy) and found frames copied
        self.failures = 0
        self._attempted = threading.Condition()  # notified after each attempt of the thread

    def wait_attempts(self, n: int, timeout: float) -> bool:
        """Whether the thread has made `n` checkpoint attempts (made or failed) within
        `timeout` seconds: for whoever must know a checkpoint was tried (tests)."""
        with self._attempted:
            return self._attempted.wait_for(lambda: self.checkpoints + self.failures >= n, timeout)

    def committed(self) -> None:
        """Count a commit; every LOOK_EVERY, wake the thread if enough frames wait. Called
        under the store's write lock, after COMMIT: it never raises."""
        self._commits += 1
        if self._commits % LOOK_EVERY or self._closed or self._wake.is_set():
            return
        if self._waiting() >= self._target and self._started():
            self._wake.set()

    def _started(self) -> bool:
        if self._thread is None:
            thread = threading.Thread(target=self._run, name="queickd-checkpoint", daemon=True)
            try:
                thread.start()
            except RuntimeError as e:  # no thread to be had: SQLite's own checkpoint stands in
                self._warn(f"cannot start its thread ({e})")
                return False
            self._thread = thread
        return True

    def _waiting(self) -> int:
        try:
            fd = self._index
            if fd is not None and os.fstat(fd).st_nlink == 0:
                # Deleted by SQLite with its last connection: no connection holds a lock
                # on that file any more, so closing it drops none.
                os.close(fd)
                fd = self._index = None
            if fd is None:
                fd = self._index = os.open(self._path + "-shm", os.O_RDONLY | os.O_CLOEXEC)
            return frames_waiting(os.pread(fd, _N_BACKFILL + 4, 0))
        except OSError:  # no index (yet): the writer's own checkpoint stands in
            return 0

    def close(self) -> None:
        """Stop the thread, after the checkpoint it is making, if any."""
        self._closed = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def close_index(self) -> None:
        """Close the WAL index's descriptor: only once every connection to the store is
        closed (see the class's docstring). POSIX locks belong to the process, not to a
        store: a second store open on the same file in this process would lose SQLite's
        locks on the index here. One store per file per process, as the daemon has."""
        if self._index is not None:
            os.close(self._index)
            self._index = None

    def _warn(self, what: str) -> None:
        self.failures += 1
        if not self._warned:  # once: the writer's own checkpoint keeps the WAL bounded
            self._warned = True
            log.warning("background WAL checkpoints of %s: %s; SQLite checkpoints on commit instead",
                        self._path, what)

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._wake.wait()
                if self._closed:
                    return
                try:
                    if conn is None:
                        conn = sqlite3.connect(self._path, isolation_level=None, timeout=0)
                        conn.execute("PRAGMA synchronous=NORMAL")  # an fsync of the WAL before, the file after
                    # fetchall: a statement left unfinished would hold a read lock, and the
                    # WAL could not start over.
                    (_, _, copied), = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.checkpoints += 1
                    if copied > 0:  # -1: busy, another checkpoint (the writer's) was running
                        self.copying += 1
                except Exception as e:  # noqa: BLE001 - the thread must go on; the writer's checkpoint is the backstop
                    self._warn(f"a checkpoint failed ({e})")
                    if conn is not None:
                        conn.close()
                        conn = None
                self._wake.clear()  # after the checkpoint: looks made meanwhile found it under way
                with self._attempted:  # after the clear: a look made once this is known wakes us again
                    self._attempted.notify_all()
                if self._closed:  # close() sets it before waking us: its wake, cleared here, is not lost
                    return
        finally:
            if conn is not None:
                conn.close()
