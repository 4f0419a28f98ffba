"""How many PostgreSQL connections a process holds, and that threads sharing one never mix
their statements: a process has three (its listener's, its bookkeeping one, one shared by
every other thread), whatever its number of threads; a statement from another thread waits
for a transaction in flight on the shared one instead of landing inside it."""

from __future__ import annotations

import socket
import threading

import pytest

from queickd.core.job import NewJob


def _connections_by_process(admin, url: str) -> dict[int, int]:
    """Backends of this test's database per queickd process (their application_name
    carries the process id)."""
    rows = admin.execute("SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
                         " AND pid <> pg_backend_pid()").fetchall()
    out: dict[int, int] = {}
    for (name,) in rows:
        parts = name.split("-")
        pid = next((int(p) for p in parts[1:] if p.isdigit()), None)
        if parts[0] == "queickd" and pid is not None:
            out[pid] = out.get(pid, 0) + 1
    return out


def test_a_busy_daemon_and_a_worker_hold_three_connections_each(pg, start_daemon, start_worker):
    url, admin = pg
    d = start_daemon(url, workers=4)
    w = start_worker(url, workers=4)
    done = threading.Barrier(9)

    def client() -> None:
        # Submits, waits and reads at once, from connections the daemon serves on its own threads.
        with d.client() as q:
            for _ in range(20):
                q.wait(q.enqueue("testjobs:noop"), 30)
                q.stats()
        done.wait(60)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    done.wait(60)
    for t in threads:
        t.join(60)
    held = _connections_by_process(admin, url)
    assert held.get(d.proc.pid) == 3, held
    assert held.get(w.pid) == 3, held


def test_a_read_from_another_thread_waits_for_an_open_transaction_instead_of_joining_it(pg_fresh_database):
    from queickd.store import open_store

    store = open_store(pg_fresh_database, "full")
    try:
        seen: list = []

        class UndoError(Exception):
            pass

        def reader(job_id: int) -> None:
            seen.append(store.get(job_id))

        with pytest.raises(UndoError):
            with store.transaction() as tx:
                job_id = tx.submit([NewJob(func="testjobs:noop", run_at=0.0)], 0.0)[0].job_id
                t = threading.Thread(target=reader, args=(job_id,))
                t.start()
                # Nothing to wait for: the reader blocks where no event can tell. In this time
                # it is queued behind the transaction (if not, it reads after and passes too).
                t.join(0.3)
                raise UndoError  # the submit is rolled back: a read inside it would have seen the job
        t.join(10)
        assert seen == [None]
    finally:
        store.close()


def test_every_connection_of_the_store_notices_a_dead_link_in_a_minute(pg_fresh_database):
    # A link dropped silently (a router rebooted) is found by keepalives while idle, and a
    # statement sent into it fails after 60 s unacknowledged, not after the kernel's ~15 min.
    from queickd.store import open_store

    store = open_store(pg_fresh_database, "full")
    try:
        store.counts()  # the shared connection opened
        with store.transaction(bookkeeping=True):
            pass  # the bookkeeping one too
        conns = [store._shared, store._bk, store.connect()]
        for c in conns:
            s = socket.fromfd(c.fileno(), socket.AF_INET, socket.SOCK_STREAM)  # a duplicate: closed alone
            try:
                assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
                assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 60_000
            finally:
                s.close()
        conns[-1].close()
    finally:
        store.close()
