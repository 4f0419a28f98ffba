"""Whether the SQLite store's files are still the ones the daemon has open.

SQLite does not notice a WAL deleted under a running daemon (`rm queue.db-wal`): it goes on
writing commits into the deleted file, which a restart never reads, so everything since the
last checkpoint is lost at the next crash. A database file deleted or replaced is worse.

`FilesWatch.check` runs after each commit of the writing connection, under the write lock:
one stat() of each file, compared with their (device, inode) at that connection's first
commit (SQLite holds both open, so the inodes cannot be reused meanwhile). It never opens
either file: closing a descriptor would drop SQLite's POSIX locks on it (checkpoint.py).
"""

from __future__ import annotations

import os

_Identity = tuple[int, int]  # (st_dev, st_ino)


class FilesWatch:
    def __init__(self, path: str) -> None:
        self.path = path
        self.wal = path + "-wal"
        self._known: tuple[_Identity, _Identity] | None = None
        self.lost: str | None = None  # what happened, once noticed: it stays noticed
        self.wal_only = False  # only the WAL went: the database file is still the one open

    def reset(self) -> None:
        """A new writing connection: the files it opens are the ones to hold to."""
        self._known = None

    def check(self) -> str | None:
        """None while both files are the ones first seen; else what happened (also kept in
        `lost`), the first time it is seen."""
        if self.lost is not None:
            return None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self._lose(self.path, "was deleted")
        try:
            wal = os.stat(self.wal)
        except FileNotFoundError:
            return self._lose(self.wal, "was deleted")
        now = ((st.st_dev, st.st_ino), (wal.st_dev, wal.st_ino))
        if self._known is None:
            self._known = now
        elif now != self._known:
            return self._lose(self.path if now[0] != self._known[0] else self.wal, "was replaced by another file")
        return None

    def _lose(self, file: str, what: str) -> str:
        self.lost = f"{file} {what}"
        self.wal_only = file == self.wal
        return self.lost
