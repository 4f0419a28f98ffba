"""Is an SQLite store's file fit to serve? The checks made before a daemon opens it, and the
marker beside it that remembers a store was created there.

A queue must never start empty, or on a broken file, without saying so: a 0-byte file opens
as a new, empty database, and garbage in the middle of the file stays hidden until a read
reaches it. So check_file() compares the file with its marker `PATH.id` (written when the
store is first opened, never removed by queickd) and reads the header; check_open() runs
PRAGMA quick_check (every page, without integrity_check's slower index cross-checks) and
makes sure a store that existed still holds its schema. Each problem raises
DamagedStoreError, saying what was found and how to recover. Never writes nor repairs the
database file (salvage.py copies what is still readable into a new file).
"""

from __future__ import annotations

import datetime
import os
import sqlite3

from ...settings import SQLITE_PAGE_SIZES
from . import schema as sqlite_schema
from .flush import fsync_path

HEADER = b"SQLite format 3\x00"
_SHOWN = 3  # lines of quick_check's findings quoted in the message


class DamagedStoreError(Exception):
    """The store's file is damaged, or gone while its marker says a store existed. The
    daemon refuses to start on it (exit 78): restarting cannot mend it."""

    def __init__(self, path: str, found: str) -> None:
        self.path = path
        self.found = found
        super().__init__(
            f"the SQLite store {path} is damaged: {found}. It was left as it is. To recover, stop "
            f"anything using it, then run 'queick db check --store sqlite:///{path}' to see what is wrong "
            f"and 'queick db recover --store sqlite:///{path} --to NEW.db' to copy every readable job "
            "into a new file (or restore a backup made with 'queick db backup'); then start the daemon "
            "on the new file. To start a new, empty store here on purpose, move the file away and remove "
            f"{marker_path(path)}.")


def real_path(path: str) -> str:
    """The file SQLite opens for `path`, every symlink resolved. SQLite names its -wal and
    -shm files after the file a link points to; queickd's own side files (.lock, .id) and
    its reads of -wal and -shm must use that name too, or a store opened through a link
    flushes a WAL that is not there (every durable submit failing after its commit) and two
    daemons given the link and its target lock two different files."""
    return path if path in ("", ":memory:") else os.path.realpath(path)


def marker_path(path: str) -> str:
    return path + ".id"


def read_marker(path: str) -> str | None:
    """What the marker says (when the store was created), or None if there is none."""
    try:
        with open(marker_path(path), encoding="utf-8", errors="replace") as f:
            return f.read().strip() or "a store was created here"
    except FileNotFoundError:
        return None


def write_marker(path: str) -> None:
    """Write the marker unless it is there. Whole or not at all (a new file renamed into
    place, then the directory synced). Raises OSError (a full disk, a read-only directory)."""
    marker = marker_path(path)
    if os.path.exists(marker):
        return
    created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    partial = f"{marker}.partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, f"queickd SQLite store {os.path.basename(path)}, created {created}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(partial, marker)
    fsync_path(os.path.dirname(os.path.abspath(path)))


def _size(path: str) -> int | None:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return None


def check_file(path: str) -> bool:
    """The checks that need no SQLite: raise DamagedStoreError, else return whether the
    file is new (missing or empty, with no marker and no WAL: a store is created)."""
    size, marker = _size(path), read_marker(path)
    wal, shm = _size(path + "-wal"), _size(path + "-shm")
    if not size:
        if marker is not None:
            state = "it is missing" if size is None else "the file is empty (0 bytes)"
            raise DamagedStoreError(path, f"{state}, but {marker_path(path)} says a store existed "
                                          f"({marker}): its jobs are gone from this file")
        if wal or shm is not None:
            raise DamagedStoreError(path, f"{path}-wal or -shm is there but the database file is "
                                          f"{'missing' if size is None else 'empty'}: the last commits "
                                          "may be in the WAL, without the file they belong to")
        return True
    if hot_journal(path):
        # A write in rollback-journal mode was cut short (`queick db vacuum` killed, say):
        # the file may be half rewritten, and SQLite puts it back from the journal when it
        # next opens it for writing. The checks after opening judge what it put back.
        return False
    with open(path, "rb") as f:
        head = f.read(100)
    if len(head) < 100 or not head.startswith(HEADER):
        raise DamagedStoreError(path, "its first bytes are not an SQLite header (overwritten or not a "
                                      "database)")
    page = page_size(head)
    pages, counter, valid_for = (int.from_bytes(head[i:i + 4], "big") for i in (28, 24, 92))
    if page not in SQLITE_PAGE_SIZES:
        raise DamagedStoreError(path, f"its header gives an impossible page size ({page})")
    # Without a WAL the header's page count is the file's size (a WAL may hold a checkpoint
    # in progress, which SQLite completes itself).
    if not wal and counter == valid_for and pages and size < pages * page:
        raise DamagedStoreError(path, f"it is truncated: {size} bytes, but its header says "
                                      f"{pages} pages of {page} bytes ({pages * page} bytes)")
    return False


def page_size(head: bytes) -> int:
    """The page size a database header records."""
    size = int.from_bytes(head[16:18], "big")
    return 65536 if size == 1 else size


def hot_journal(path: str) -> bool:
    """Whether a rollback journal with content is beside the file: a write cut short, which
    SQLite rolls back at the next open for writing (and which a read-only open cannot)."""
    return bool(_size(path + "-journal"))


def check_open(c: sqlite3.Connection, path: str) -> None:
    """The checks on an open connection: PRAGMA quick_check, and the schema of a store that
    existed. Raises DamagedStoreError, also for SQLite's own 'not a database' or
    'malformed' errors."""
    try:
        try:
            found = [r[0] for r in c.execute("PRAGMA quick_check")]
        except sqlite3.DatabaseError as e:
            if isinstance(e, sqlite3.OperationalError):
                raise
            found = [str(e)]
        if found != ["ok"]:
            lines = "\n".join(found).splitlines()
            raise DamagedStoreError(path, "PRAGMA quick_check found: " + "; ".join(
                line.strip() for line in lines[:_SHOWN] if line.strip()) +
                (f" (and {len(lines) - _SHOWN} more)" if len(lines) > _SHOWN else ""))
        marker = read_marker(path)
        if marker is not None and sqlite_schema.version(c) == 0:
            raise DamagedStoreError(path, f"it holds no queickd schema, but {marker_path(path)} says a "
                                          f"store existed ({marker}): its jobs are gone from this file")
    except sqlite3.DatabaseError as e:
        if isinstance(e, sqlite3.OperationalError):
            raise  # locked, a full or failing disk: not damage to the file
        raise DamagedStoreError(path, f"SQLite cannot read it: {e}") from None
