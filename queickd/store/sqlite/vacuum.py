"""`queick db vacuum`: an SQLite store rewritten in place, without its free pages and with
the page size a new store gets (settings.SQLITE_PAGE), which a store of an earlier release
cannot get otherwise: WAL mode fixes a file's page size, and a backup copies pages as they are.

SQLite's VACUUM, in rollback-journal mode for its duration (the only mode in which the page
size can change): a crash or a power cut midway leaves the store as it was, put back from
the journal when the file is next opened. The store is checked as a daemon's start checks
it, before (a damaged one is refused) and after. The caller makes sure no daemon serves it.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass

from ...settings import SQLITE_PAGE, SQLITE_PAGE_SIZES
from . import check as sqlite_check
from .connection import free_bytes


class NotEnoughRoomError(OSError):
    """The disk lacks the room VACUUM needs: the old pages in its journal, the new file."""


@dataclass
class Vacuumed:
    """What `vacuum` did: page sizes and the file's bytes before and after, its jobs."""

    page_before: int
    page_after: int
    bytes_before: int
    bytes_after: int
    jobs: int


def vacuum(path: str, page_size: int = SQLITE_PAGE) -> Vacuumed:
    """Rewrite the store at `path` with pages of `page_size` bytes. Raises FileNotFoundError
    where there is no store, DamagedStoreError for a damaged one, NotEnoughRoomError, and
    sqlite3.OperationalError while another process has it open."""
    if page_size not in SQLITE_PAGE_SIZES:
        raise ValueError(f"SQLite pages are a power of two from 512 to 65536 bytes, not {page_size}")
    if sqlite_check.check_file(path):
        raise FileNotFoundError(f"no SQLite store at {path}")
    before = _bytes(path)
    need, free = 2 * before, free_bytes(path)  # the journal holds the old pages, a temporary file the new
    if free < need:
        raise NotEnoughRoomError(f"vacuum needs about {need / 1e6:.1f} MB free beside {path} (twice the "
                                 f"store), and the disk has {free / 1e6:.1f} MB")
    c = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        sqlite_check.check_open(c, path)
        page_before = c.execute("PRAGMA page_size").fetchone()[0]
        jobs = c.execute("SELECT count(*) FROM jobs").fetchone()[0]
        # Leaving WAL mode checkpoints the WAL into the file; SQLite refuses while another
        # connection is open, and then answers with the mode it stays in.
        if c.execute("PRAGMA journal_mode=DELETE").fetchone()[0] != "delete":
            raise sqlite3.OperationalError(f"another process has {path} open; stop it first")
        c.execute("PRAGMA synchronous=FULL")  # the journal on disk before the file is rewritten
        c.execute(f"PRAGMA page_size={page_size}")
        c.execute("VACUUM")
        c.execute("PRAGMA journal_mode=WAL")
        found = c.execute("PRAGMA quick_check").fetchone()[0]
        if found != "ok":
            raise sqlite3.DatabaseError(f"the store failed its check after the vacuum: {found}")
        page_after = c.execute("PRAGMA page_size").fetchone()[0]
    finally:
        c.close()
    return Vacuumed(page_before, page_after, before, _bytes(path), jobs)


def _bytes(path: str) -> int:
    """The store's size on disk: the file and its WAL."""
    wal = path + "-wal"
    return os.path.getsize(path) + (os.path.getsize(wal) if os.path.exists(wal) else 0)
