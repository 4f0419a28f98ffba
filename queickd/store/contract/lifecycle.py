"""The store as a resource: who serves it, its transactions, its durability, its close."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

from .backend import Backend
from .transaction import Transaction


class Lifecycle(Backend, Protocol):
    def take_ownership(self) -> None:
        """Called by a daemon before it recovers orphans: make sure no other daemon serves
        this store, or raise StoreInUseError. Held until close(). A no-op where that cannot
        happen (memory) or is handled otherwise (PostgreSQL: workers beat hearts)."""
        ...

    def transaction(self, bookkeeping: bool = False) -> AbstractContextManager[Transaction]:
        """One transaction, open for the block: `with store.transaction() as tx:`, the calls
        made through `tx` (transaction.Transaction: the calls that may share one) run in it;
        it commits at the block's end, or rolls back if the block raises (it leaves nothing
        behind). Calls made on the store itself, and another transaction, stay transactions
        of their own, which may wait for this one to end (SQLite: any write; PostgreSQL: any
        call on the connection this one holds): inside the block, call the store through
        `tx` only. Writers on other threads may wait until it ends (SQLite: all of them;
        PostgreSQL, with bookkeeping: the other bookkeeping transactions), so keep the block
        short. `tx` is not to be used after it.

        With bookkeeping True, the commit may skip its own flush to disk (SQLite:
        synchronous=NORMAL in WAL; PostgreSQL: synchronous_commit off): use it only for
        changes whose loss in a power cut means a job runs again, never for acknowledging
        a submit."""
        ...

    def flush(self) -> None:
        """Return once every commit made so far is durable (after a ClaimsInSubmit store's
        claiming_transaction). Stores whose commits are durable when they return do nothing."""
        ...

    def durability_said(self) -> str:
        """What an acknowledged write's durability is, as the start log says it (SQLite: its
        --durability; PostgreSQL: the server's synchronous_commit; memory: none). May read
        the store."""
        ...

    def durability_lost(self) -> str | None:
        """Why no write can be promised durable any more (a flush to disk failed: every
        write since is answered "may have been stored"; a store file was deleted under the
        daemon: every write since is refused), or None. Lasts until reopened."""
        ...

    def watch_files(self) -> bool:
        """Look at the store's files between commits (a daemon's timer): one deleted or
        replaced is noticed as at a commit. Whether to look again (False: nothing to watch,
        or already noticed)."""
        ...

    def close(self) -> None:
        """Release the store's connections and files (and the ownership taken). No call
        after it."""
        ...
