"""The store contract, as tests. Every backend's test class inherits StoreContract and
provides a `store` fixture; backend files add only their quirks."""

from __future__ import annotations

import threading

import pytest

from queickd.job import NewJob, Outcome, State
from queickd.retry import make_spec
from queickd.store import CronRecord

T0 = 1_700_000_000.0


def job(func: str = "m:f", **kw) -> NewJob:
    kw.setdefault("run_at", T0)
    return NewJob(func=func, **kw)


class StoreContract:
    @pytest.fixture
    def store(self):  # pragma: no cover - each backend overrides
        raise NotImplementedError

    # --- submit ---------------------------------------------------------------------------
    def test_submit_returns_one_answer_per_job_in_order(self, store):
        subs = store.submit([job(args=[i]) for i in range(5)], T0)
        assert [s.job_id for s in subs] == sorted(s.job_id for s in subs)
        assert len({s.job_id for s in subs}) == 5
        assert [store.get(s.job_id).args for s in subs] == [[i] for i in range(5)]

    def test_submit_stores_due_jobs_queued_and_later_jobs_scheduled(self, store):
        due, later = store.submit([job(run_at=T0), job(run_at=T0 + 10)], T0)
        assert (due.state, later.state) == (State.QUEUED, State.SCHEDULED)
        assert store.get(later.job_id).run_at == T0 + 10

    def test_submit_keeps_every_field(self, store):
        spec = make_spec("linear_increasing", 5, 60, 4)
        (s,) = store.submit([job(args=[1, "a"], kwargs={"x": [1]}, priority=3, retry=spec,
                                 retry_on_network=True, key="k", idempotency_key="i")], T0)
        j = store.get(s.job_id)
        assert (j.func, j.args, j.kwargs, j.priority, j.retry, j.retry_on_network, j.key,
                j.idempotency_key, j.max_attempts, j.attempts, j.created_at) == (
            "m:f", [1, "a"], {"x": [1]}, 3, spec, True, "k", "i", 4, 0, T0)

    def test_idempotency_key_returns_the_first_job(self, store):
        (first,) = store.submit([job(idempotency_key="once")], T0)
        (again,) = store.submit([job(idempotency_key="once", args=[2])], T0 + 1)
        assert (again.job_id, again.duplicate) == (first.job_id, True)
        assert store.get(first.job_id).args == []
        assert store.counts()[State.QUEUED] == 1

    def test_idempotency_key_repeated_within_one_batch_stores_one_job(self, store):
        a, b, c = store.submit([job(idempotency_key="x"), job(idempotency_key="x"), job()], T0)
        assert b.job_id == a.job_id and b.duplicate and not a.duplicate
        assert c.job_id != a.job_id
        assert store.counts()[State.QUEUED] == 2

    def test_concurrent_submits_never_share_an_id(self, store):
        ids: list[int] = []
        lock = threading.Lock()

        def submit():
            for _ in range(20):
                subs = store.submit([job() for _ in range(10)], T0)
                with lock:
                    ids.extend(s.job_id for s in subs)

        threads = [threading.Thread(target=submit) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(ids) == len(set(ids)) == 800

    # --- claim ----------------------------------------------------------------------------
    def test_claim_takes_priority_then_run_at_then_insertion_order(self, store):
        a, b, c, d = store.submit(
            [job(priority=1), job(run_at=T0 - 5), job(run_at=T0 - 5), job(priority=-1)], T0)
        claimed = store.claim_available(10, T0)
        assert [j.id for j in claimed] == [d.job_id, b.job_id, c.job_id, a.job_id]

    def test_claim_respects_the_limit(self, store):
        store.submit([job() for _ in range(5)], T0)
        assert len(store.claim_available(2, T0)) == 2
        assert store.counts()[State.QUEUED] == 3

    def test_claim_marks_running_counts_the_attempt_and_sets_started_at(self, store):
        store.submit([job()], T0)
        (j,) = store.claim_available(1, T0 + 2)
        assert (j.state, j.attempts, j.started_at) == (State.RUNNING, 1, T0 + 2)
        assert store.get(j.id).state == State.RUNNING

    def test_claim_skips_jobs_scheduled_in_the_future(self, store):
        store.submit([job(run_at=T0 + 60)], T0)
        assert store.claim_available(5, T0 + 120) == []

    def test_claim_of_an_empty_queue_returns_nothing(self, store):
        assert store.claim_available(4, T0) == []

    def test_a_claimed_job_is_not_claimed_again(self, store):
        store.submit([job()], T0)
        assert len(store.claim_available(1, T0)) == 1
        assert store.claim_available(1, T0) == []

    # --- schedule -------------------------------------------------------------------------
    def test_promote_due_queues_only_jobs_whose_time_has_come(self, store):
        soon, late = store.submit([job(run_at=T0 + 5), job(run_at=T0 + 50)], T0)
        assert store.next_scheduled_at() == T0 + 5
        assert store.promote_due(T0 + 5) == 1
        assert store.get(soon.job_id).state == State.QUEUED
        assert store.get(late.job_id).state == State.SCHEDULED
        assert store.next_scheduled_at() == T0 + 50

    def test_next_scheduled_at_is_none_without_scheduled_jobs(self, store):
        store.submit([job()], T0)
        assert store.next_scheduled_at() is None

    # --- finish ---------------------------------------------------------------------------
    def test_finish_succeeded_stores_the_result(self, store):
        store.submit([job()], T0)
        (j,) = store.claim_available(1, T0)
        assert store.finish_if_running([Outcome.succeeded(j.id, {"n": 1})], T0 + 1) == 1
        done = store.get(j.id)
        assert (done.state, done.result, done.finished_at) == (State.SUCCEEDED, {"n": 1}, T0 + 1)

    def test_finish_retry_reschedules_with_the_error(self, store):
        store.submit([job()], T0)
        (j,) = store.claim_available(1, T0)
        err = {"type": "ValueError", "message": "x"}
        store.finish_if_running([Outcome.retry_at(j.id, T0 + 30, err)], T0 + 1)
        again = store.get(j.id)
        assert (again.state, again.run_at, again.error, again.finished_at) == (State.SCHEDULED, T0 + 30, err, None)
        assert store.next_scheduled_at() == T0 + 30

    def test_finish_dead_and_waiting_network_are_recorded(self, store):
        store.submit([job(), job()], T0)
        a, b = store.claim_available(2, T0)
        err = {"type": "E", "message": "m"}
        store.finish_if_running([Outcome.dead(a.id, err), Outcome.waiting_network(b.id, err)], T0)
        assert store.get(a.id).state == State.DEAD
        assert store.get(b.id).state == State.WAITING_NETWORK

    def test_finish_ignores_jobs_that_are_not_running(self, store):
        (s,) = store.submit([job()], T0)
        assert store.finish_if_running([Outcome.succeeded(s.job_id, 1)], T0) == 0
        assert store.get(s.job_id).state == State.QUEUED

    def test_finish_of_an_unknown_job_changes_nothing(self, store):
        assert store.finish_if_running([Outcome.succeeded(999_999, None)], T0) == 0

    # --- orphans --------------------------------------------------------------------------
    def test_recover_orphans_requeues_running_jobs(self, store):
        store.submit([job(), job()], T0)
        claimed = store.claim_available(1, T0)
        rec = store.recover_orphans(3, T0)
        assert rec.requeued == [claimed[0].id] and rec.dead == []
        j = store.get(claimed[0].id)
        assert (j.state, j.orphaned, j.attempts) == (State.QUEUED, 1, 1)

    def test_recover_orphans_gives_up_past_the_limit(self, store):
        store.submit([job()], T0)
        for _ in range(2):
            store.claim_available(1, T0)
            store.recover_orphans(2, T0)
        (j,) = store.claim_available(1, T0)
        rec = store.recover_orphans(2, T0)
        assert rec.dead == [j.id]
        dead = store.get(j.id)
        assert dead.state == State.DEAD and dead.error["type"] == "orphaned"

    # --- operator actions -----------------------------------------------------------------
    @pytest.mark.parametrize("run_at", [T0, T0 + 60])
    def test_cancel_applies_to_waiting_jobs(self, store, run_at):
        (s,) = store.submit([job(run_at=run_at)], T0)
        assert store.cancel(s.job_id, T0).state == State.CANCELLED
        assert store.claim_available(1, T0 + 120) == []

    def test_cancel_leaves_a_running_job_alone(self, store):
        store.submit([job()], T0)
        (j,) = store.claim_available(1, T0)
        assert store.cancel(j.id, T0).state == State.RUNNING

    def test_cancel_of_an_unknown_job_returns_none(self, store):
        assert store.cancel(424242, T0) is None

    def test_retry_dead_requeues_with_a_fresh_budget(self, store):
        store.submit([job()], T0)
        (j,) = store.claim_available(1, T0)
        store.finish_if_running([Outcome.dead(j.id, {"type": "E", "message": ""})], T0)
        again = store.retry_dead(j.id, T0 + 5)
        assert (again.state, again.attempts, again.run_at) == (State.QUEUED, 0, T0 + 5)
        assert [c.id for c in store.claim_available(1, T0 + 5)] == [j.id]

    def test_retry_dead_leaves_other_states_alone(self, store):
        (s,) = store.submit([job()], T0)
        assert store.retry_dead(s.job_id, T0).state == State.QUEUED
        assert store.retry_dead(777_777, T0) is None

    # --- inspect --------------------------------------------------------------------------
    def test_get_of_an_unknown_job_returns_none(self, store):
        assert store.get(123_456) is None

    def test_list_jobs_is_newest_first_and_filters_by_state(self, store):
        subs = store.submit([job(), job(), job(run_at=T0 + 9)], T0)
        assert [j.id for j in store.list_jobs(None, 10)] == [s.job_id for s in reversed(subs)]
        assert [j.id for j in store.list_jobs(State.QUEUED, 1)] == [subs[1].job_id]

    def test_counts_cover_every_state(self, store):
        store.submit([job(), job(run_at=T0 + 5)], T0)
        counts = store.counts()
        assert set(counts) == set(State.ALL)
        assert counts[State.QUEUED] == 1 and counts[State.SCHEDULED] == 1 and counts[State.DEAD] == 0

    # --- cron -----------------------------------------------------------------------------
    def _cron(self, name="c", next_run_at=T0 + 60):
        return CronRecord(name, {"every": 60.0, "start_at": T0}, job(func="m:tick", args=[1]),
                          next_run_at, None, T0)

    def test_cron_save_list_and_delete(self, store):
        store.cron_save(self._cron("b"))
        store.cron_save(self._cron("a"))
        assert [c.name for c in store.cron_list()] == ["a", "b"]
        assert store.cron_list()[0].template.func == "m:tick"
        assert store.cron_delete("a") and not store.cron_delete("a")
        assert [c.name for c in store.cron_list()] == ["b"]

    def test_cron_save_replaces_by_name(self, store):
        store.cron_save(self._cron("a", T0 + 60))
        store.cron_save(self._cron("a", T0 + 120))
        assert [c.next_run_at for c in store.cron_list()] == [T0 + 120]

    def test_crons_due_and_next_cron_at(self, store):
        store.cron_save(self._cron("soon", T0 + 10))
        store.cron_save(self._cron("late", T0 + 100))
        assert store.next_cron_at() == T0 + 10
        assert [c.name for c in store.crons_due(T0 + 10)] == ["soon"]

    def test_cron_fire_submits_one_job_and_advances(self, store):
        store.cron_save(self._cron("c", T0 + 60))
        sub = store.cron_fire_if_due("c", T0 + 60, T0 + 120, T0 + 61)
        j = store.get(sub.job_id)
        assert (j.func, j.args, j.cron, j.state) == ("m:tick", [1], "c", State.QUEUED)
        (c,) = store.cron_list()
        assert (c.next_run_at, c.last_fired_at) == (T0 + 120, T0 + 60)

    def test_cron_fire_of_a_tick_already_fired_does_nothing(self, store):
        store.cron_save(self._cron("c", T0 + 60))
        assert store.cron_fire_if_due("c", T0 + 60, T0 + 120, T0 + 61) is not None
        assert store.cron_fire_if_due("c", T0 + 60, T0 + 120, T0 + 61) is None
        assert store.counts()[State.QUEUED] == 1

    # --- network --------------------------------------------------------------------------
    def test_claim_while_the_network_is_down_passes_over_network_jobs(self, store):
        net, plain = store.submit([job(retry_on_network=True), job()], T0)
        assert [j.id for j in store.claim_available(5, T0, network_up=False)] == [plain.job_id]
        assert [j.id for j in store.claim_available(5, T0, network_up=True)] == [net.job_id]

    def test_park_for_network_moves_only_queued_network_jobs(self, store):
        net, plain, later = store.submit(
            [job(retry_on_network=True), job(), job(retry_on_network=True, run_at=T0 + 60)], T0)
        assert store.park_for_network(T0) == 1
        assert [store.get(s.job_id).state for s in (net, plain, later)] == [
            State.WAITING_NETWORK, State.QUEUED, State.SCHEDULED]
        assert [j.id for j in store.claim_available(5, T0)] == [plain.job_id]

    def test_release_network_waiting_requeues_in_enqueue_order(self, store):
        subs = store.submit([job(retry_on_network=True, run_at=T0 - i) for i in range(3)], T0)
        store.park_for_network(T0)
        assert store.release_network_waiting(T0 + 5) == 3
        claimed = store.claim_available(5, T0 + 5)
        assert [j.id for j in claimed] == [s.job_id for s in subs]
        assert {j.run_at for j in claimed} == {T0 + 5}

    def test_a_run_parked_for_the_network_gives_its_attempt_back(self, store):
        store.submit([job(retry_on_network=True)], T0)
        (j,) = store.claim_available(1, T0)
        store.finish_if_running([Outcome.waiting_network(j.id, {"type": "E", "message": ""})], T0)
        parked = store.get(j.id)
        assert (parked.state, parked.attempts) == (State.WAITING_NETWORK, 0)
