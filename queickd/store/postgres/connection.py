"""The PostgreSQL store's connections and transactions: three per process, however many
threads it has; the base of PostgresStore, which runs its statements on them.

- the fleet listener's (services/fleet.py: LISTEN, a connection of its own from connect());
- the bookkeeping one: the pool's passes (claims and finishes, one transaction each) and
  the heartbeat, under _bk_lock, with synchronous_commit off;
- one shared by every other thread: a thread leases it for a transaction (or a submit),
  and reads go through _Reads, one statement at a time, which waits for a lease in
  flight, so no statement ever lands inside another thread's transaction.
A transaction is its connection, passed explicitly (transaction() yields a handle that
holds it): no call joins one by being made on the same thread, and a call made on the
store inside a transaction's block waits for that transaction's lock like any other.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

try:
    import psycopg
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ValueError("the PostgreSQL store needs psycopg 3: pip install 'queickd[postgres]'") from e

from ..sql.transaction import SqlTransaction

# Every connection's TCP settings (libpq's; ignored on a Unix socket): keepalives find an idle
# connection the network dropped silently, tcp_user_timeout one whose sent bytes go
# unacknowledged (a statement sent into a dead link would otherwise wait some 15 minutes on
# the kernel's retransmissions, holding the lock every other thread's writes wait for).
# Neither ends a long statement the server is still running.
TCP_SETTINGS: dict[str, int] = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                                "keepalives_count": 3, "tcp_user_timeout": 60_000}


# The text a statement's parameters may hold for its cursor to be kept for the next one
# (the submit's insert, the worker's pass): a cursor holds its last parameters until its
# next statement, and keeping one saves looking up its parameters' dumpers again.
KEPT_CURSOR_BYTES = 65536


class PgConnections:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._all: list[psycopg.Connection] = []
        self._all_lock = threading.Lock()
        self._bk: psycopg.Connection | None = None  # bookkeeping (claims, finishes), under _bk_lock
        self._bk_lock = threading.Lock()
        self._bk_backend: tuple[int, Any] | None = None  # its server process: (pid, backend_start)
        # Server processes of bookkeeping connections that broke: each may still be running
        # what was sent on it (a pass whose answer never came), under _bk_lock.
        self._lost: list[tuple[int, Any]] = []
        self._shared: psycopg.Connection | None = None  # every other thread's, under _shared_lock
        self._shared_lock = threading.Lock()
        self._reads = _Reads(self)
        self._limits: tuple[float, float] | None = None  # (heartbeat, window) once registered

    def connect(self, **options: Any) -> psycopg.Connection:
        """A new autocommit connection to this store's database (the caller closes it);
        options are libpq's (application_name=...), over TCP_SETTINGS."""
        # pg_stat_activity then says which process holds each connection, and for what.
        options.setdefault("application_name", f"queickd-{os.getpid()}")
        return psycopg.connect(self._dsn, autocommit=True, connect_timeout=10, **{**TCP_SETTINGS, **options})

    def _conn(self) -> _Reads:
        """What a read outside any transaction goes to: the shared connection, one statement
        at a time (_Reads: execute() only)."""
        return self._reads

    def _open(self, application: str) -> psycopg.Connection:
        c = self.connect(application_name=f"queickd-{os.getpid()}-{application}")
        with self._all_lock:
            self._all = [x for x in self._all if not x.closed]
            self._all.append(c)
        return c

    def set_session_limits(self, heartbeat: float, window: float) -> None:
        """A registered member's limits on its own sessions, so no stall holds the fleet or
        silences its beats: a transaction left open for `window` (this process stopped
        between two statements, holding locks every claimer may need) is ended by the
        server, as its jobs are taken for orphans then anyway; and a bookkeeping statement
        waits at most `heartbeat` for a lock (the beat shares that connection: a pass stuck
        behind another process's lock would keep this one from beating and lose its jobs)."""
        self._limits = (heartbeat, window)
        with self._bk_lock:
            if self._bk is not None and not (self._bk.closed or self._bk.broken):
                self._limit_session(self._bk, bookkeeping=True)
        with self._lease() as c:
            self._limit_session(c, bookkeeping=False)

    def _limit_session(self, c: psycopg.Connection, bookkeeping: bool) -> None:
        if self._limits is None:
            return
        heartbeat, window = self._limits
        sql = f"SET idle_in_transaction_session_timeout = {max(1, round(window * 1000))}"
        if bookkeeping:
            sql += f"; SET lock_timeout = {max(1, round(heartbeat * 1000))}"
        c.execute(sql)

    def _shared_conn(self) -> psycopg.Connection:
        """The shared connection (reopened if it dropped); only under a lease."""
        c = self._shared
        if c is None or c.closed or c.broken:
            c = self._shared = self._open("shared")
            self._limit_session(c, bookkeeping=False)
        return c

    def _bookkeeping_conn(self) -> psycopg.Connection:
        c = self._bk
        if c is None or c.closed or c.broken:
            self._note_lost()
            c = self._open("bookkeeping")
            self._limit_session(c, bookkeeping=True)
            c.execute("SET synchronous_commit = off")
            self._bk_backend = c.execute(
                "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()").fetchone()
            self._bk = c
        return c

    def _note_lost(self) -> None:
        c = self._bk
        if c is not None and (c.closed or c.broken) and self._bk_backend is not None:
            self._lost.append(self._bk_backend)
            self._bk_backend = None

    def _end_lost_backends(self, timeout: float = 10.0) -> None:
        """The server processes of bookkeeping connections that broke are ended, and waited
        for until gone: a statement sent on one may still run (waiting for a lock) and
        commit after its client saw the connection fail. After this, what it did is final."""
        with self._bk_lock:
            self._note_lost()
            lost = list(self._lost)
        for pid, started in lost:
            deadline = time.monotonic() + timeout
            while self._reads.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                      " WHERE pid = %s AND backend_start = %s", (pid, started)).fetchone():
                if time.monotonic() > deadline:
                    raise psycopg.OperationalError(f"the server process {pid} of a lost connection does not end")
                time.sleep(0.02)  # it exits at its next interrupt check: no event to wait on
            with self._bk_lock:
                self._lost.remove((pid, started))

    def _shared_lost(self) -> bool:
        """The shared connection was found lost (its next lease opens a new one)."""
        c = self._shared
        return c is not None and (c.closed or c.broken)

    @contextlib.contextmanager
    def _lease(self) -> Iterator[psycopg.Connection]:
        """The shared connection for the caller alone until the block ends."""
        with self._shared_lock:
            yield self._shared_conn()

    @contextlib.contextmanager
    def _write(self, bookkeeping: bool = False) -> Iterator[psycopg.Connection]:
        """One transaction, on the shared connection or (`bookkeeping`) on the bookkeeping
        one, whose session has synchronous_commit off: a server crash may undo the last of
        its commits (a pass's), and the only effect is that a job runs again (at-least-once);
        acked submits, on the other connections, always wait for the WAL flush."""
        if bookkeeping:
            with self._bk_lock:
                c = self._bookkeeping_conn()
                with c.transaction():
                    yield c
            return
        with self._lease() as c, c.transaction():
            yield c

    @contextlib.contextmanager
    def transaction(self, bookkeeping: bool = False) -> Iterator[SqlTransaction]:
        """Lifecycle.transaction: _write's transaction and a handle on its connection."""
        with self._write(bookkeeping) as c:
            yield SqlTransaction(self, c)

    def durability_said(self) -> str:
        # --durability is SQLite's; here the server decides when a commit is on disk (the
        # bookkeeping session's own `off` aside, see _write()).
        try:
            (value,) = self._reads.execute("SHOW synchronous_commit").fetchone()
        except psycopg.Error as e:  # the start goes on; the next statement tries the server again
            return f"durability: the server's synchronous_commit (unread: {str(e).strip() or type(e).__name__})"
        return f"durability: the server's synchronous_commit = {value}"

    def close(self) -> None:
        with self._all_lock:
            for c in self._all:
                with contextlib.suppress(Exception):
                    c.close()
            self._all.clear()


class _Reads:
    """The shared connection for reads outside a transaction: each statement waits for
    the lease in flight and runs alone. Results are read in full by execute() (client-side
    cursors), so the cursor it returns is read after the lease is let go."""

    __slots__ = ("_store",)

    def __init__(self, store: PgConnections) -> None:
        self._store = store

    def execute(self, query: Any, params: Any = None) -> psycopg.Cursor:
        with self._store._lease() as c:
            try:
                return c.execute(query, params)
            except psycopg.OperationalError:
                # A connection lost while idle (a server restart, a failover, a terminated
                # backend) is found out by the next statement sent on it: a read is sent
                # again once on a new connection rather than failing its caller (a client's
                # `wait` answered `internal`). Only reads: a write may have been applied.
                if not c.broken or not isinstance(query, str) or not query.lstrip().upper().startswith("SELECT"):
                    raise
            return self._store._shared_conn().execute(query, params)
