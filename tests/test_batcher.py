"""The group committer: who commits a request, in what order, and what stop() leaves."""

import threading

from store_contract import job

from queickd.core.job import Submitted
from queickd.core.protocol import QueueError
from queickd.services.batcher import SubmitBatcher
from queickd.store import open_store
from queickd.store.sqlite.inmemory import IN_MEMORY
from queickd.store.sqlite.store import SQLiteStore


class HeldStore(SQLiteStore):
    """A real memory store whose first commit waits until the test lets it go."""

    def __init__(self) -> None:
        super().__init__(IN_MEMORY)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.first = True

    def submit_requests(self, requests, now, admission):
        if self.first:
            self.first = False
            self.entered.set()
            assert self.release.wait(10)
        return super().submit_requests(requests, now, admission)


def test_a_lone_inline_request_is_committed_by_its_submitter_before_submit_returns():
    b = SubmitBatcher(open_store("memory://"))  # no committer thread started at all
    got = []
    b.submit([[job()]], lambda a: got.append((threading.get_ident(), a)), inline=True)
    assert len(got) == 1
    thread, answers = got[0]
    assert thread == threading.get_ident()
    assert isinstance(answers[0][0], Submitted)


def test_an_inline_request_never_overtakes_one_queued_before_it():
    store = HeldStore()
    b = SubmitBatcher(store)
    b.start()
    order, both = [], threading.Event()

    def done(name):
        def f(answers):
            order.append((name, answers[0][0].job_id))
            if len(order) == 2:
                both.set()
        return f

    b.submit([[job()]], done("queued"))
    assert store.entered.wait(10)  # the committer is writing "queued" and holds it there
    b.submit([[job()]], done("inline"), inline=True)
    assert order == []  # it waited its turn instead of committing beside the first
    store.release.set()
    assert both.wait(10)
    b.stop()
    assert [n for n, _ in order] == ["queued", "inline"]
    assert order[0][1] < order[1][1]


def test_stop_commits_what_was_queued_and_refuses_what_comes_after():
    store = HeldStore()
    b = SubmitBatcher(store)
    b.start()
    answers = []
    b.submit([[job()]], answers.append)
    assert store.entered.wait(10)
    b.submit([[job()]], answers.append)  # queued behind the held commit
    stopper = threading.Thread(target=b.stop)
    stopper.start()
    store.release.set()
    stopper.join(10)
    assert not stopper.is_alive()
    b.submit([[job()]], answers.append, inline=True)
    assert [type(a[0][0]) for a in answers[:2]] == [Submitted, Submitted]
    assert isinstance(answers[2], QueueError)


# --- a commit the disk fails to flush (SQLite, full durability) ---------------------------------
def _failing_disk(monkeypatch) -> None:
    """The first fdatasync fails with EIO (and so, as the flusher holds, does every flush after)."""
    import os

    fail = [OSError(5, "Input/output error")]
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if fail:
            raise fail.pop()
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)


def _stored(store) -> list[str]:
    import sqlite3

    with sqlite3.connect(store.path) as c:
        return [f for (f,) in c.execute("SELECT func FROM jobs ORDER BY id")]


def test_a_group_commit_whose_flush_fails_answers_each_may_have_been_stored_and_stores_each_once(
        tmp_path, monkeypatch):
    store = SQLiteStore(str(tmp_path / "q.db"), durability="full")
    _failing_disk(monkeypatch)
    answers: list = []
    SubmitBatcher(store)._commit([([[job(func="m:a")]], answers.append), ([[job(func="m:b")]], answers.append)])
    assert [a.maybe_committed for a in answers] == [True, True]  # never a plain refusal, never an ack
    assert _stored(store) == ["m:a", "m:b"]  # not committed a second time, one by one
    store.close()


class BadGroupOnce:
    """A store mixin: the first transaction (a group's) fails on a request's data, not for
    the store's trouble; the batcher then commits the requests one by one."""

    group_failed = False

    def submit_requests(self, requests, now, admission):
        if not self.group_failed:
            self.group_failed = True
            raise ValueError("a request the store cannot take")
        return super().submit_requests(requests, now, admission)


def test_a_request_committed_alone_after_its_group_failed_is_not_refused_when_its_flush_fails(
        tmp_path, monkeypatch):
    class BadDataOnce(BadGroupOnce, SQLiteStore):
        pass

    store = BadDataOnce(str(tmp_path / "q.db"), durability="full")
    _failing_disk(monkeypatch)
    answers: list = []
    SubmitBatcher(store)._commit([([[job(func="m:a")]], answers.append), ([[job(func="m:b")]], answers.append)])
    assert all(isinstance(a, QueueError) and a.maybe_committed for a in answers)  # committed, perhaps lost
    assert _stored(store) == ["m:a", "m:b"]
    store.close()


class LostAfterCommit(SQLiteStore):
    """A real store whose answer is lost after its commit took effect, as a PostgreSQL
    connection cut between COMMIT and its reply: the store's own unavailable error."""

    UNAVAILABLE = (ConnectionError,)

    def __init__(self, lose: int) -> None:
        super().__init__(IN_MEMORY)
        self.lose = lose  # answers still to lose

    def submit_requests(self, requests, now, admission):
        answers = super().submit_requests(requests, now, admission)
        if self.lose:
            self.lose -= 1
            raise ConnectionError("server closed the connection unexpectedly")
        return answers


def test_a_group_commit_whose_outcome_is_unknown_is_not_committed_again_one_by_one():
    store = LostAfterCommit(lose=1)
    answers: list = []
    SubmitBatcher(store)._commit([([[job(func="m:a")]], answers.append), ([[job(func="m:b")]], answers.append)])
    assert all(isinstance(a, QueueError) and a.maybe_committed for a in answers)
    assert sorted(j.func for j in store.list_jobs(None, 10)) == ["m:a", "m:b"]  # each once


def test_a_request_retried_alone_whose_store_is_unavailable_may_have_been_stored_not_refused():
    class BadGroupThenLost(BadGroupOnce, LostAfterCommit):
        pass

    store = BadGroupThenLost(lose=2)
    answers: list = []
    SubmitBatcher(store)._commit([([[job(func="m:a")]], answers.append), ([[job(func="m:b")]], answers.append)])
    assert [type(a) for a in answers] == [QueueError, QueueError]  # not a bad_request refusal
    assert all(a.code == "internal" and a.maybe_committed for a in answers)
