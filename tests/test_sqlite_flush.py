"""Durable commits of the SQLite store: flushed apart from COMMIT (one fdatasync of the WAL,
outside the write lock, shared by whoever waits meanwhile), bookkeeping never flushed, and
a job claimed with its submit started before the ack, which waits for the flush."""

import os
import sqlite3
import threading
import time

import pytest
from store_contract import T0, job

from queickd.core.policy.claim import Request
from queickd.store.records import NotDurableError
from queickd.store.sqlite.store import SQLiteStore


class Disk:
    """os.fdatasync and os.fsync as the store calls them, recorded (what file, and how many
    jobs another connection saw committed at that moment); an fdatasync is held while
    `hold` is clear."""

    def __init__(self, monkeypatch, db: str) -> None:
        self.db = db
        self.calls: list[tuple[str, str, int]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Semaphore(0)
        real_fdatasync, real_fsync = os.fdatasync, os.fsync
        monkeypatch.setattr(os, "fdatasync", lambda fd: self._call("fdatasync", fd, real_fdatasync))
        monkeypatch.setattr(os, "fsync", lambda fd: self._call("fsync", fd, real_fsync))

    def _call(self, kind: str, fd: int, real) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        seen = -1
        if os.path.isfile(path):
            with sqlite3.connect(self.db) as c:
                seen = c.execute("SELECT count(*) FROM jobs").fetchone()[0]
        self.calls.append((kind, path, seen))
        if kind == "fdatasync":
            self.entered.release()
            assert self.hold.wait(10)
        real(fd)

    def wal_flushes(self) -> list[int]:
        return [seen for kind, path, seen in self.calls if kind == "fdatasync" and path.endswith("-wal")]


@pytest.fixture
def store(tmp_path, monkeypatch):
    db = str(tmp_path / "q.db")
    s = SQLiteStore(db, durability="full")
    disk = Disk(monkeypatch, db)  # after opening: the migrations' own commits are SQLite's
    yield s, disk
    disk.hold.set()
    s.close()


def test_a_submit_returns_after_a_flush_of_the_wal_that_holds_it(store):
    s, disk = store
    s.submit([job()], T0)
    assert disk.wal_flushes() == [1]  # one fdatasync of the WAL, once the job was committed
    s.submit([job()], T0)
    assert disk.wal_flushes() == [1, 2]


def test_claims_and_finishes_are_not_flushed(store):
    s, disk = store
    s.submit([job()], T0)
    before = list(disk.calls)
    s.claim_available(Request.of(1, now=T0))
    assert disk.calls == before


def test_a_new_wal_file_gets_its_directory_entry_flushed_once(store):
    s, disk = store
    s.submit([job()], T0)
    s.submit([job()], T0)
    dirs = [path for kind, path, _ in disk.calls if kind == "fsync" and os.path.isdir(path)]
    assert dirs == [os.path.dirname(disk.db)]


def test_other_writers_go_on_while_a_commit_is_flushed(store):
    s, disk = store
    disk.hold.clear()
    submitted = threading.Thread(target=s.submit, args=([job()], T0))
    submitted.start()
    assert disk.entered.acquire(timeout=10)  # the submit has committed and is flushing
    claimed = s.claim_available(Request.of(1, now=T0))  # a write transaction, not stuck behind the flush
    assert [j.state for j in claimed] == ["running"]
    assert submitted.is_alive()  # and the submit still waits for its flush
    disk.hold.set()
    submitted.join(10)
    assert not submitted.is_alive()


def test_commits_made_during_a_flush_share_the_next_one(store):
    s, disk = store
    disk.hold.clear()
    first = threading.Thread(target=s.submit, args=([job()], T0))
    first.start()
    assert disk.entered.acquire(timeout=10)  # flushing the first commit only
    later = [threading.Thread(target=s.submit, args=([job()], T0)) for _ in range(3)]
    for t in later:
        t.start()
    deadline = time.monotonic() + 10
    while s.counts()["queued"] < 4:  # all three committed, waiting for a flush that covers them
        assert time.monotonic() < deadline
        time.sleep(0.005)
    disk.hold.set()
    for t in [first, *later]:
        t.join(10)
    assert disk.wal_flushes() == [1, 4]  # one more fdatasync for the three, not three


def test_a_failed_flush_fails_its_submit_and_every_later_one_as_maybe_stored(store, monkeypatch):
    s, disk = store
    fail = [OSError(5, "Input/output error")]
    real = os.fdatasync
    tried: list[int] = []

    def flaky(fd: int) -> None:
        tried.append(fd)
        if fail:
            raise fail.pop()
        real(fd)

    monkeypatch.setattr(os, "fdatasync", flaky)
    for _ in range(2):  # a later fdatasync that succeeds would prove nothing about the lost pages
        with pytest.raises(NotDurableError, match="Input/output") as e:
            s.submit([job()], T0)
        assert e.value.maybe_committed
    assert len(tried) == 1
    assert s.counts()["queued"] == 2  # committed, visible: each was answered "may have been stored"


def test_a_commit_waiting_for_a_flush_that_fails_is_not_told_it_is_durable(store, monkeypatch):
    s, disk = store
    entered, go = threading.Event(), threading.Event()

    def failing(fd: int) -> None:
        entered.set()
        assert go.wait(10)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            s.submit([job()], T0)
        except BaseException as e:
            errors.append(e)

    first = threading.Thread(target=submit)
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=submit)  # commits during the flush, then waits for it
    second.start()
    deadline = time.monotonic() + 10
    while s.counts()["queued"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    go.set()
    first.join(10)
    second.join(10)
    assert [type(e) for e in errors] == [NotDurableError, NotDurableError]


def test_the_wal_is_opened_once_not_for_every_flush(store, monkeypatch):
    s, disk = store
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **kw: opened.append(str(path)) or real_open(path, *a, **kw))
    for _ in range(5):
        s.submit([job()], T0)
    assert len(disk.wal_flushes()) == 5
    assert [p for p in opened if p.endswith("-wal")] == [disk.db + "-wal"]

