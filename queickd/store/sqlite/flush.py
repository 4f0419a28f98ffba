"""Durability of the SQLite store's commits, apart from the commits themselves.

The writing connection commits at synchronous=NORMAL (COMMIT writes the WAL, no fsync). A
commit that must survive a power cut (every acknowledged submit) is then made durable by
`WalFlusher.flush`: one fdatasync of the WAL, outside the write lock, so other writers go
on meanwhile. The WAL is written in order, so one fdatasync covers every commit written
before it began: concurrent callers share it (group commit), and it covers the bookkeeping
commits (claims, finishes) before it too. A commit is visible before it is durable: a power
cut in between undoes a submit nobody was told of (its client sends it again) and perhaps a
run of its job (at-least-once). A checkpoint fsyncs what it copies into the database file.

The WAL is kept open from the first flush until reset() (SQLite neither deletes nor replaces
it while the writing connection is open); a WAL made anew also has its directory synced.

A failed fdatasync fails every flush after it (NotDurableError) until the store is opened
anew: Linux reports a writeback error once and may drop the pages it could not write, so a
later fdatasync that succeeds proves nothing about them. Every write is then answered "may
have been stored", never "stored".
"""

from __future__ import annotations

import logging
import os
import threading

from ..records import NotDurableError

log = logging.getLogger("queickd.store")


class WalFlusher:
    """One fdatasync of `path`-wal for every commit counted by `written()` before it."""

    def __init__(self, path: str) -> None:
        self._wal = path + "-wal"
        self._cond = threading.Condition(threading.Lock())
        self._written = 0  # commits written so far
        self._durable = 0  # of those, how many a finished fdatasync covers
        self._flushing = False
        self._dir_synced: tuple[int, int] | None = None  # (st_dev, st_ino) of the WAL whose entry is on disk
        self._fd: int | None = None  # the WAL, open from the first flush until reset()
        self.failed: OSError | None = None  # the fdatasync that failed: every flush fails since

    def written(self) -> None:
        """Count a commit; call it after COMMIT returned, before the write lock is released."""
        with self._cond:
            self._written += 1

    def flush(self) -> None:
        """Return once every commit counted before this call is on disk. A flush already
        under way may not cover them (it began before they were written): then the next
        one does, begun by whichever waiter finds none under way. NotDurableError if that
        fdatasync, or any before it, failed (see the module's docstring): to every caller
        waiting, and to every later one."""
        with self._cond:
            want = self._written
            while self._durable < want:
                if self.failed is not None:
                    raise NotDurableError(
                        f"a flush of {self._wal} failed ({self.failed}): no commit since can be "
                        "promised to be on disk; check the disk and restart the daemon") from self.failed
                if self._flushing:
                    self._cond.wait()
                    continue
                self._flushing = True
                upto = self._written
                error: OSError | None = None
                self._cond.release()
                try:
                    self._sync()
                except OSError as e:
                    error = e
                finally:
                    self._cond.acquire()
                    self._flushing = False
                    self._cond.notify_all()
                if error is not None:
                    self.failed = error
                    log.error("cannot flush %s to disk (%s): from now on no write is acknowledged as "
                              "stored; check the disk and restart the daemon", self._wal, error)
                    continue  # raised above, to this caller as to every other
                self._durable = max(self._durable, upto)

    def reset(self) -> None:
        """Close the file kept open: call it when the writing connection is closed or
        replaced (the WAL may then be deleted and made anew). Waits for a flush under way."""
        with self._cond:
            while self._flushing:
                self._cond.wait()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            # A WAL made anew may get the inode number of the one deleted: sync its entry.
            self._dir_synced = None

    def _sync(self) -> None:
        if self._fd is None:  # the writer has committed: its WAL exists while it is open
            self._fd = self._open_wal()
        os.fdatasync(self._fd)

    def _open_wal(self) -> int:
        fd = os.open(self._wal, os.O_RDONLY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != self._dir_synced:
                fsync_path(os.path.dirname(os.path.abspath(self._wal)))
                self._dir_synced = (st.st_dev, st.st_ino)
        except BaseException:
            os.close(fd)
            raise
        return fd


def fsync_path(path: str) -> None:
    """fsync the file or the directory (its entries: files made or renamed in it) at `path`."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
