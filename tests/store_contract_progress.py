"""The store contract for a running job's progress (part of StoreContract: every store runs
it). set_progress_if_running stores what the job said while it runs its attempt; a job no
longer running that attempt is left alone."""

from __future__ import annotations

from queickd.core.job import NewJob, Outcome, State
from queickd.core.policy.claim import Request

T0 = 1_700_000_000.0
ERR = {"type": "ValueError", "message": "no"}


def _p(done, total=None, note=None, at=T0, attempt=1):
    return {"done": done, "total": total, "note": note, "at": at, "attempt": attempt}


def _running(store, n: int = 1):
    store.submit([NewJob("m:f", run_at=T0) for _ in range(n)], T0)
    return store.claim_available(Request.of(n, now=T0))


class ProgressContract:
    def test_a_new_job_has_no_progress(self, store):
        (j,) = _running(store)
        assert store.get(j.id).progress is None

    def test_progress_of_a_running_job_is_stored_and_read_back(self, store):
        a, b = _running(store, 2)
        changed = store.set_progress_if_running([(a.id, 1, _p(3, 10, "step é")), (b.id, 1, _p(0.5))])
        assert changed == 2
        assert store.get(a.id).progress == _p(3, 10, "step é")
        assert store.get(b.id).progress == _p(0.5)
        assert store.get(a.id).state == State.RUNNING

    def test_the_latest_progress_replaces_the_last(self, store):
        (j,) = _running(store)
        store.set_progress_if_running([(j.id, 1, _p(1, 10))])
        store.set_progress_if_running([(j.id, 1, _p(2, 10, at=T0 + 1))])
        assert store.get(j.id).progress == _p(2, 10, at=T0 + 1)

    def test_progress_of_a_job_no_longer_running_is_not_written(self, store):
        a, b = _running(store, 2)
        store.set_progress_if_running([(a.id, 1, _p(1, 2))])
        store.finish_if_running([Outcome.succeeded(a.id, None), Outcome.dead(b.id, ERR)], T0 + 1)
        assert store.set_progress_if_running([(a.id, 1, _p(2, 2)), (b.id, 1, _p(5))]) == 0
        assert (store.get(a.id).progress, store.get(b.id).progress) == (_p(1, 2), None)

    def test_progress_of_an_earlier_attempt_is_not_written(self, store):
        (j,) = _running(store)
        store.finish_if_running([Outcome.retry_at(j.id, T0, ERR)], T0)
        store.promote_due(T0 + 1)
        (again,) = store.claim_available(Request.of(1, now=T0 + 1))
        assert again.attempts == 2
        assert store.set_progress_if_running([(j.id, 1, _p(9))]) == 0  # the first run's, late
        assert store.set_progress_if_running([(j.id, 2, _p(1, attempt=2))]) == 1
        assert store.get(j.id).progress == _p(1, attempt=2)

    def test_progress_of_an_unknown_job_changes_nothing(self, store):
        assert store.set_progress_if_running([(424242, 1, _p(1))]) == 0
        assert store.set_progress_if_running([]) == 0


class StalledContract:
    """set_stalled marks a running attempt stalled and clears that attempt's mark; progress
    clears it too; count_stalled counts the running jobs marked."""

    def test_a_mark_on_a_running_job_is_stored_and_counted(self, store):
        a, b = _running(store, 2)
        assert store.set_stalled([(a.id, 1, T0 + 5)]) == 1
        assert (store.get(a.id).stalled_at, store.get(b.id).stalled_at) == (T0 + 5, None)
        assert store.count_stalled() == 1

    def test_a_clear_removes_the_mark(self, store):
        (j,) = _running(store)
        store.set_stalled([(j.id, 1, T0 + 5)])
        assert store.set_stalled([(j.id, 1, None)]) == 1
        assert store.get(j.id).stalled_at is None and store.count_stalled() == 0

    def test_progress_clears_the_mark(self, store):
        (j,) = _running(store)
        store.set_stalled([(j.id, 1, T0 + 5)])
        store.set_progress_if_running([(j.id, 1, _p(1))])
        assert store.get(j.id).stalled_at is None

    def test_no_mark_on_a_job_no_longer_running_that_attempt(self, store):
        (j,) = _running(store)
        store.finish_if_running([Outcome.retry_at(j.id, T0, ERR)], T0)
        assert store.set_stalled([(j.id, 1, T0 + 5)]) == 0
        store.promote_due(T0 + 1)
        store.claim_available(Request.of(1, now=T0 + 1))
        assert store.set_stalled([(j.id, 1, T0 + 5)]) == 0  # the first run's, late
        assert store.get(j.id).stalled_at is None

    def test_a_clear_after_the_run_was_stored_still_clears_its_mark(self, store):
        (j,) = _running(store)
        store.set_stalled([(j.id, 1, T0 + 5)])
        store.finish_if_running([Outcome.dead(j.id, ERR)], T0 + 6)
        assert store.count_stalled() == 0  # only running jobs count
        assert store.set_stalled([(j.id, 1, None)]) == 1
        assert store.get(j.id).stalled_at is None
