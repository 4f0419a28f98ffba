"""A write transaction on one SQLite connection, with the error handling every writer of the
file shares (the store's connections and the schema's migration)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator


@contextlib.contextmanager
def immediate(c: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction (BEGIN IMMEDIATE ... COMMIT). On any error it is rolled back:
    SQLite may already have rolled back (disk full, I/O error), so the connection is never
    left inside a transaction, and the first error is never hidden."""
    c.execute("BEGIN IMMEDIATE")
    try:
        yield c
        c.execute("COMMIT")
    except BaseException:
        roll_back(c)
        raise


def roll_back(c: sqlite3.Connection) -> None:
    """After an error in a transaction: leave none open, hiding no error of the caller's."""
    if c.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            c.execute("ROLLBACK")
