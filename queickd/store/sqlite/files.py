"""Whether the SQLite store's files are still the ones the daemon has open.

SQLite keeps its database file and its WAL open; a WAL deleted under a running daemon
(an operator's `rm queue.db-wal`, a cleanup script) is not noticed by SQLite: it goes on
writing commits into the deleted file, whose frames a restart never reads. Everything
acknowledged since the last checkpoint is then lost at the next crash or SIGKILL. A
database file deleted or replaced (a backup moved over it) is the same mistake, worse.

`FilesWatch.check` runs after each commit of the writing connection (a group of submits
is one commit): one stat() of each file, compared with the identity (device, inode) they
had at the first commit of that connection. While the connection is open SQLite holds
both files, so their inode numbers cannot be reused by new files. Never opens a
descriptor on either file: closing one would drop SQLite's POSIX locks on it
(checkpoint.py). No I/O besides stat; called under the store's write lock.
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
