"""WAL checkpoints of the SQLite store, made on a thread of their own: the writer commits
on while the WAL is copied into the database file, its own automatic checkpoint kept as a
backstop; no thread at all until a checkpoint is due."""

import os
import sqlite3
import struct
import subprocess
import sys
import threading

import pytest
from contract_jobs import T0, job

from queickd.core.job import Outcome
from queickd.core.policy.claim import Request
from queickd.store.sqlite import checkpoint as sqlite_checkpoint
from queickd.store.sqlite.checkpoint import BACKSTOP_PAGES, Checkpointer, frames_waiting
from queickd.store.sqlite.store import SQLiteStore


def _index(mx_frame: int, n_backfill: int) -> bytes:
    b = bytearray(136)
    struct.pack_into("=I", b, 16, mx_frame)
    struct.pack_into("=I", b, 96, n_backfill)
    return bytes(b)


@pytest.fixture
def store(tmp_path):
    s = SQLiteStore(str(tmp_path / "q.db"))
    yield s
    s.close()


def _churn(s: SQLiteStore, passes: int) -> None:
    """Passes as the worker pool makes them: finish one job, claim the next, one commit."""
    s.submit([job() for _ in range(passes + 1)], T0)
    running = s.claim_available(Request.of(1, now=T0))
    for _ in range(passes):
        with s.transaction(bookkeeping=True) as tx:
            tx.finish_if_running([Outcome.succeeded(j.id, None) for j in running], T0)
            running = tx.claim_available(Request.of(1, now=T0))


def _wal_restarts(db: str) -> int:
    """The WAL header's checkpoint sequence number: SQLite adds one each time the WAL starts over."""
    with open(db + "-wal", "rb") as f:
        return struct.unpack(">I", f.read(16)[12:16])[0]


def test_frames_waiting_are_the_last_frame_less_those_copied():
    assert frames_waiting(_index(1500, 400)) == 1100
    assert frames_waiting(_index(400, 400)) == 0


def test_an_index_not_yet_written_has_nothing_waiting():
    assert frames_waiting(b"") == 0
    assert frames_waiting(bytes(20)) == 0


def test_the_wal_index_is_read_where_sqlite_writes_it(tmp_path):
    db = str(tmp_path / "t.db")
    c = sqlite3.connect(db, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA wal_autocheckpoint=0")
    c.execute("CREATE TABLE t (x)")
    for _ in range(5):
        c.execute("INSERT INTO t VALUES (randomblob(5000))")
    f = open(db + "-shm", "rb")  # closed after the connection: a close drops this process's locks on it
    index = f.read(100)
    _, in_wal, copied = c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert in_wal > 5 and copied == in_wal
    assert frames_waiting(index) == in_wal  # nothing was copied before this checkpoint
    c.close()
    f.close()


def test_the_writer_checkpoints_only_as_a_backstop(store):
    _churn(store, 1)
    assert store._writer().execute("PRAGMA wal_autocheckpoint").fetchone()[0] == BACKSTOP_PAGES


def test_no_thread_runs_until_a_checkpoint_is_due(store):
    _churn(store, 20)
    assert store._checkpointer.checkpoints == 0
    assert store._checkpointer._thread is None


def test_a_thread_checkpoints_once_enough_frames_wait(store, monkeypatch):
    monkeypatch.setattr(store._checkpointer, "_target", 50)
    _churn(store, 200)
    assert store._checkpointer.wait_attempts(1, timeout=10)
    assert store._checkpointer.copying >= 1  # a checkpoint of the thread copied frames into the file
    assert store._checkpointer.failures == 0
    c = sqlite3.connect(store.path)
    assert c.execute("SELECT count(*) FROM jobs WHERE state = 'succeeded'").fetchone()[0] == 200
    c.close()


def test_the_wal_starts_over_at_the_backstop_while_the_thread_checkpoints(store, monkeypatch):
    monkeypatch.setattr(sqlite_checkpoint, "LOOK_EVERY", 4)
    monkeypatch.setattr(store._checkpointer, "_target", 40)
    store._writer().execute("PRAGMA wal_autocheckpoint=160")  # a backstop of 4 targets, scaled down
    restarts = _wal_restarts(store.path)
    _churn(store, 1500)  # some 9,000 frames written
    # The WAL started over again and again (a statement of the thread left open would hold
    # a snapshot: it never would). Its size is its longest run between two restarts: the
    # backstop, plus what the writer committed while a checkpoint of the thread kept its
    # own from copying, which grows with the machine's commit rate (1,000-1,900 frames at
    # 13,000 commits/s).
    assert _wal_restarts(store.path) - restarts >= 5
    assert os.path.getsize(store.path + "-wal") // (4096 + 24) < 3000
    assert store._checkpointer.copying >= 1


def test_closing_the_store_stops_the_thread_and_keeps_every_commit(tmp_path, monkeypatch):
    db = str(tmp_path / "q.db")
    s = SQLiteStore(db)
    monkeypatch.setattr(s._checkpointer, "_target", 50)
    _churn(s, 200)
    assert s._checkpointer.wait_attempts(1, timeout=10)
    thread = s._checkpointer._thread
    s.close()
    assert not thread.is_alive()
    again = SQLiteStore(db)
    try:
        assert again.counts()["succeeded"] == 200
        assert again.integrity_check() == "ok"
    finally:
        again.close()


def test_a_failing_checkpoint_is_counted_warned_of_once_and_the_thread_goes_on(tmp_path, caplog):
    ck = Checkpointer(str(tmp_path / "missing-dir" / "q.db"), target=0)
    ck._waiting = lambda: 1  # type: ignore[method-assign]
    for _ in range(sqlite_checkpoint.LOOK_EVERY):
        ck.committed()
    assert ck.wait_attempts(1, timeout=10) and ck.failures == 1
    for _ in range(sqlite_checkpoint.LOOK_EVERY):
        ck.committed()
    assert ck.wait_attempts(2, timeout=10) and ck.failures == 2
    ck.close()
    warnings = [r for r in caplog.records if "background WAL checkpoints" in r.getMessage()]
    assert len(warnings) == 1


def test_no_thread_to_be_had_fails_no_commit(tmp_path, monkeypatch):
    def refuse(self):
        raise RuntimeError("can't start new thread")

    ck = Checkpointer(str(tmp_path / "q.db"), target=0)
    ck._waiting = lambda: 1  # type: ignore[method-assign]
    monkeypatch.setattr(threading.Thread, "start", refuse)
    for _ in range(sqlite_checkpoint.LOOK_EVERY):
        ck.committed()  # raises nothing: the commit it follows stands
    assert ck._thread is None and ck.failures == 1
    ck.close()


# Another process sees this one holding the WAL index by its read lock on byte 128 (SQLite's
# "DMS" lock); were it dropped, that process would rebuild the index under the daemon.
_PROBE_DMS = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 128)
except OSError:
    print("held")
else:
    print("free")
"""


def test_looking_at_the_wal_index_keeps_this_processs_locks_on_it(store):
    _churn(store, 4 * sqlite_checkpoint.LOOK_EVERY)  # several looks
    assert store._checkpointer._index is not None
    probe = subprocess.run([sys.executable, "-c", _PROBE_DMS, store.path + "-shm"], capture_output=True,
                           text=True, timeout=30)
    assert probe.stdout.strip() == "held", probe.stderr


def test_a_wal_index_made_anew_is_the_one_read(tmp_path):
    db = str(tmp_path / "t.db")

    def writer(rows: int) -> sqlite3.Connection:
        c = sqlite3.connect(db, isolation_level=None)
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("PRAGMA wal_autocheckpoint=0")
        c.execute("CREATE TABLE IF NOT EXISTS t (x)")
        for _ in range(rows):
            c.execute("INSERT INTO t VALUES (randomblob(5000))")
        return c

    ck = Checkpointer(db)
    first = writer(3)
    before = ck._waiting()
    first.close()  # the last connection: SQLite checkpoints, deletes the WAL and its index
    assert not os.path.exists(db + "-shm")
    second = writer(12)
    assert ck._waiting() > before  # the new index, not the one deleted
    second.close()
    ck.close()
