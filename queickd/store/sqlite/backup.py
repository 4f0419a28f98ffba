"""An online copy of an SQLite store (`queick db backup`), safe while the daemon runs.

A cp of the file may be torn, and misses the last commits (in the -wal beside it). This
uses SQLite's backup API inside one read transaction: the copy is the store as of the
moment the backup began, and the daemon's commits meanwhile neither wait for it nor restart
it. The copy is written to PATH.partial under an exclusive flock: a second backup to the
same path is refused, and a PATH.partial left by a killed one (no lock on it) is replaced.
Never writes the source, nor the daemon's lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Callable

from .check import real_path

STEP_PAGES = 1024  # pages per backup step, one progress report: 1 MiB of a new store's 1 KiB pages


def sqlite_path(url: str, done: str = "backed up") -> str:
    """The file an sqlite:/// URL names, symlinks resolved as the store resolves them (its
    lock and WAL are beside that file). Raises ValueError for any other store, saying what
    is `done` only to SQLite files."""
    if not url.startswith("sqlite:///") or not url[len("sqlite:///"):]:
        raise ValueError(f"only an SQLite store (sqlite:///path) is {done} this way, not {url!r}"
                         + ("; for PostgreSQL use pg_dump" if done == "backed up" else ""))
    return real_path(url[len("sqlite:///"):])


def _remove_beside(partial: str) -> None:
    """Any journal, WAL or shared memory SQLite left beside the partial copy."""
    for side in ("-journal", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial + side)


def _claim(partial: str, note: Callable[[str], None]) -> int:
    """An open descriptor of `partial`, empty, under an exclusive flock held until the copy
    is renamed or removed. A partial no backup holds (its backup was killed) is replaced,
    with a note; one that another backup holds raises FileExistsError."""
    while True:
        stale = False
        try:
            # Job arguments may be private: the copy is readable by its owner only, as the
            # store is under the unit's UMask. An empty file is an empty database to SQLite.
            fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            try:
                fd = os.open(partial, os.O_RDWR | os.O_NOFOLLOW)
            except FileNotFoundError:
                continue  # renamed or removed by its backup meanwhile
            stale = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FileExistsError(f"{partial} is being written by another backup; wait for it "
                                  "or give another path") from None
        try:
            named = os.path.samestat(os.fstat(fd), os.stat(partial, follow_symlinks=False))
        except FileNotFoundError:
            named = False
        if not named:  # its backup finished (renamed it) between our open and our lock
            os.close(fd)
            continue
        if stale:
            os.ftruncate(fd, 0)
            _remove_beside(partial)  # a hot journal would be rolled back into the new copy
            note(f"replaced {partial}, left by a backup that did not finish")
        return fd


def backup(source: str, target: str, progress: Callable[[int, int], None] | None = None,
           note: Callable[[str], None] | None = None) -> int:
    """Copy the SQLite database at `source` to the new file `target`; returns its pages.

    `progress(copied, total)` is called after each step, `note(text)` when a partial copy a
    killed backup left is replaced. Raises FileNotFoundError if `source` does not exist (it
    is never created), FileExistsError if `target` does or another backup to it is running,
    and sqlite3.Error if the source cannot be read. The target appears whole or not at all
    (written beside it, synced, then renamed)."""
    if not os.path.isfile(source):
        raise FileNotFoundError(f"no SQLite store at {source}")
    if os.path.exists(target):
        raise FileExistsError(f"{target} exists; give a new path")
    partial = f"{target}.partial"
    fd = _claim(partial, note or (lambda text: None))
    try:
        if os.path.exists(target):  # renamed there by a backup that finished meanwhile
            raise FileExistsError(f"{target} exists; give a new path")
        pages = _copy(source, partial, progress)
        os.fsync(fd)
        os.replace(partial, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)  # still ours: the lock is held until the descriptor closes
        _remove_beside(partial)
        raise
    finally:
        os.close(fd)
    return pages


def _copy(source: str, partial: str, progress: Callable[[int, int], None] | None) -> int:
    src = sqlite3.connect(source, isolation_level=None)
    try:
        src.execute("PRAGMA query_only=ON")  # this connection never writes the daemon's store
        src.execute("BEGIN")
        src.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the snapshot starts here
        dst = sqlite3.connect(partial)
        try:
            total = [0]

            def step(status: int, remaining: int, pages: int) -> None:
                total[0] = pages
                if progress is not None:
                    progress(pages - remaining, pages)

            src.backup(dst, pages=STEP_PAGES, progress=step)
            ok = dst.execute("PRAGMA integrity_check").fetchone()[0]
            if ok != "ok":
                raise sqlite3.DatabaseError(f"the copy failed its integrity check: {ok}")
        finally:
            dst.close()
        src.execute("COMMIT")
    finally:
        src.close()
    return total[0]
