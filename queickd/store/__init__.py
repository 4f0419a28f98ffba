"""Stores behind one contract (contract.Store): memory://, sqlite:///path (default), postgresql://."""

from __future__ import annotations

from ..settings import DEFAULT_URL
from .contract import Store
from .records import CronRecord, Recovered

__all__ = ["CronRecord", "Recovered", "Store", "DEFAULT_URL", "open_store"]


def open_store(url: str = DEFAULT_URL, durability: str = "full") -> Store:
    """Open the store a URL names. Raises ValueError for a URL no backend takes.

    sqlite:///relative/path and sqlite:////absolute/path follow SQLAlchemy's spelling.
    """
    if url.startswith("memory://"):
        from .sqlite.inmemory import IN_MEMORY
        from .sqlite.store import SQLiteStore

        return SQLiteStore(IN_MEMORY)
    if url.startswith("sqlite://"):
        from .sqlite.store import SQLiteStore

        path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
        if not path:
            raise ValueError(f"an SQLite store URL needs a path: sqlite:///queue.db, not {url!r}")
        return SQLiteStore(path, durability=durability)
    if url.startswith(("postgresql://", "postgres://")):
        from .postgres.store import PostgresStore

        return PostgresStore(url)
    raise ValueError(f"unknown store URL {url!r}: use memory://, sqlite:///path or postgresql://")
