"""The store contract for a run's captured output (part of StoreContract: every store runs
it). The output comes with the outcome (Outcome.output) and is the job's `output` until
its next finish; a thread run's outcome has none."""

from __future__ import annotations

from queickd.core.job import NewJob, Outcome, State
from queickd.core.policy.claim import Request
from queickd.run.watch import MAX_STORED_OUTPUT

T0 = 1_700_000_000.0
ERR = {"type": "ValueError", "message": "no"}
# As the process runner stores a cut output: its first bytes (some of them not ASCII,
# several lines), then the marker.
LONG = ("é ligne\n" * (MAX_STORED_OUTPUT // 10))[:MAX_STORED_OUTPUT // 2] + "\n[… 200000 bytes in all; the first 65536 kept]"


def _running(store, n: int = 1):
    store.submit([NewJob("m:f", run_at=T0) for _ in range(n)], T0)
    return store.claim_available(Request.of(n, now=T0))


class OutputContract:
    def test_a_new_job_has_no_output(self, store):
        (s,) = store.submit([NewJob("m:f", run_at=T0)], T0)
        assert store.get(s.job_id).output is None

    def test_finish_succeeded_stores_the_runs_output(self, store):
        (j,) = _running(store)
        store.finish_if_running([Outcome.succeeded(j.id, 1, output="to stdout\n")], T0 + 1)
        done = store.get(j.id)
        assert (done.state, done.result, done.output) == (State.SUCCEEDED, 1, "to stdout\n")

    def test_a_long_output_is_stored_as_given(self, store):
        (j,) = _running(store)
        store.finish_if_running([Outcome.succeeded(j.id, None, output=LONG)], T0 + 1)
        assert store.get(j.id).output == LONG

    def test_each_failure_stores_its_output_beside_its_error(self, store):
        a, b, c = _running(store, 3)
        store.finish_if_running([Outcome.retry_at(a.id, T0 + 30, ERR, "a out"), Outcome.dead(b.id, ERR, output="b out"),
                                 Outcome.waiting_network(c.id, ERR, "c out")], T0 + 1)
        assert [(store.get(j.id).output, store.get(j.id).error) for j in (a, b, c)] == [
            ("a out", ERR), ("b out", ERR), ("c out", ERR)]

    def test_a_success_finished_with_a_failure_keeps_its_own_output(self, store):
        a, b = _running(store, 2)
        store.finish_if_running([Outcome.succeeded(a.id, None, output="ok out"), Outcome.dead(b.id, ERR, output="bad out")],
                                T0 + 1)
        assert (store.get(a.id).output, store.get(b.id).output) == ("ok out", "bad out")

    def test_the_next_runs_finish_replaces_the_output_even_with_none(self, store):
        (j,) = _running(store)
        store.finish_if_running([Outcome.retry_at(j.id, T0, ERR, "first run")], T0)
        store.promote_due(T0 + 1)
        (again,) = store.claim_available(Request.of(1, now=T0 + 1))
        assert again.output == "first run"  # while it runs, the job shows its last run's
        store.finish_if_running([Outcome.succeeded(j.id, 2)], T0 + 2)  # a run that wrote nothing
        assert (store.get(j.id).state, store.get(j.id).output) == (State.SUCCEEDED, None)

    def test_a_finish_that_does_not_apply_leaves_the_output_alone(self, store):
        (j,) = _running(store)
        store.finish_if_running([Outcome.succeeded(j.id, None, output="kept")], T0 + 1)
        assert store.finish_if_running([Outcome.dead(j.id, ERR, output="late")], T0 + 2).changed == 0
        assert store.get(j.id).output == "kept"

    def test_a_purged_job_takes_its_output_with_it(self, store):
        a, b = _running(store, 2)
        store.finish_if_running([Outcome.dead(a.id, ERR, output="dead out"),
                                 Outcome.succeeded(b.id, None, output="ok out")], T0)
        assert store.purge([State.DEAD], T0 + 1, 100) == 1 and store.prune_finished(T0 + 1, 100) == 1
        assert store.get(a.id) is None and store.get(b.id) is None
