"""An online copy of an SQLite store (`queick db backup`), safe while the daemon runs.

Copying the file with cp is not safe: the last commits live in the -wal file beside it, and
a copy taken mid-write is torn. This uses SQLite's backup API from the standard library on
its own connection, inside one read transaction: the copy is the store as of the moment the
backup began (every job acknowledged before then is in it), WAL readers never block the
daemon's writer, and because the snapshot is held, the daemon's commits during the copy do
not restart it. Owns only reading the source and writing the target; never writes the
source, never touches the daemon's lock file.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable

from .sqlite_check import real_path

STEP_PAGES = 1024  # pages per backup step: 4 MiB with the default page size, one progress report


def sqlite_path(url: str) -> str:
    """The file an sqlite:/// URL names, symlinks resolved as the store resolves them (its
    lock and WAL are beside that file). Raises ValueError for any other store."""
    if not url.startswith("sqlite:///") or not url[len("sqlite:///"):]:
        raise ValueError(f"only an SQLite store (sqlite:///path) is backed up this way, not {url!r}; "
                         "for PostgreSQL use pg_dump")
    return real_path(url[len("sqlite:///"):])


def backup(source: str, target: str, progress: Callable[[int, int], None] | None = None,
           step_pages: int = STEP_PAGES) -> int:
    """Copy the SQLite database at `source` to the new file `target`; returns its pages.

    `progress(copied, total)` is called after each step. Raises FileNotFoundError if
    `source` does not exist (it is never created), FileExistsError if `target` does, and
    sqlite3.Error if the source cannot be read. The target appears whole or not at all
    (written beside it, synced, then renamed)."""
    if not os.path.isfile(source):
        raise FileNotFoundError(f"no SQLite store at {source}")
    if os.path.exists(target):
        raise FileExistsError(f"{target} exists; give a new path")
    partial = f"{target}.partial"
    # Job arguments may be private: the copy is readable by its owner only, as the store is
    # under the unit's UMask. An empty file is an empty database to SQLite.
    os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
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

            src.backup(dst, pages=step_pages, progress=step)
            ok = dst.execute("PRAGMA integrity_check").fetchone()[0]
            if ok != "ok":
                raise sqlite3.DatabaseError(f"the copy failed its integrity check: {ok}")
        finally:
            dst.close()
        src.execute("COMMIT")
    except BaseException:
        for leftover in (partial, f"{partial}-wal", f"{partial}-shm"):
            if os.path.exists(leftover):
                os.unlink(leftover)
        raise
    finally:
        src.close()
    fd = os.open(partial, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(partial, target)
    return total[0]
