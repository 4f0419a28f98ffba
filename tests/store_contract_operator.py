"""The store contract for what operators do and what retention keeps (part of StoreContract:
every store runs it): cancels of waiting and running jobs, dead letters sent back or purged,
the counts operators read, and pools moved or served."""

from __future__ import annotations

import pytest
from contract_jobs import T0, job

from queickd.core.job import Outcome, State
from queickd.core.policy.admission import Admission, Refusal
from queickd.core.policy.claim import Request


class OperatorContract:
    # --- operator actions -----------------------------------------------------------------
    @pytest.mark.parametrize("run_at", [T0, T0 + 60])
    def test_cancel_applies_to_waiting_jobs(self, store, run_at):
        (s,) = store.submit([job(run_at=run_at)], T0)
        assert store.cancel(s.job_id, T0).state == State.CANCELLED
        assert store.claim_available(Request.of(1, now=T0 + 120)) == []

    def test_cancel_leaves_a_running_job_alone(self, store):
        store.submit([job()], T0)
        (j,) = store.claim_available(Request.of(1, now=T0))
        assert store.cancel(j.id, T0).state == State.RUNNING

    def test_cancel_of_an_unknown_job_returns_none(self, store):
        assert store.cancel(424242, T0) is None

    def test_retry_dead_requeues_with_a_fresh_budget(self, store):
        store.submit([job()], T0)
        (j,) = store.claim_available(Request.of(1, now=T0))
        store.finish_if_running([Outcome.dead(j.id, {"type": "E", "message": ""})], T0)
        again = store.retry_dead(j.id, T0 + 5)
        assert (again.state, again.attempts, again.run_at) == (State.QUEUED, 0, T0 + 5)
        assert [c.id for c in store.claim_available(Request.of(1, now=T0 + 5))] == [j.id]

    def test_retry_dead_leaves_other_states_alone(self, store):
        (s,) = store.submit([job()], T0)
        assert store.retry_dead(s.job_id, T0).state == State.QUEUED
        assert store.retry_dead(777_777, T0) is None

    # --- operator cancels -------------------------------------------------------------------
    def test_cancel_running_cancels_at_once_and_its_late_outcome_changes_nothing(self, store):
        store.submit([job(key="k"), job(key="k")], T0)
        (running,) = store.claim_available(Request.of(5, now=T0))
        cancelled = store.cancel_running(running.id, T0 + 1)
        assert (cancelled.state, cancelled.finished_at) == (State.CANCELLED, T0 + 1)
        assert store.finish_if_running([Outcome.succeeded(running.id, 1)], T0 + 2).changed == 0
        assert store.get(running.id).state == State.CANCELLED
        assert len(store.claim_available(Request.of(5, now=T0 + 2))) == 1  # its key is free

    def test_cancel_running_leaves_a_job_that_is_not_running(self, store):
        (s,) = store.submit([job()], T0)
        assert store.cancel_running(s.job_id, T0).state == State.QUEUED
        assert store.cancel_running(987_654, T0) is None

    def test_cancel_waiting_cancels_the_matching_jobs_of_one_state(self, store):
        a, b, c, d = store.submit([job(func="m:g"), job(func="m:g", pool="gpu"), job(), job(func="m:g", run_at=T0 + 9)],
                                  T0)
        assert sorted(store.cancel_waiting(State.QUEUED, T0, func="m:g")) == [a.job_id, b.job_id]
        assert [store.get(i).state for i in (a.job_id, b.job_id, c.job_id, d.job_id)] == [
            State.CANCELLED, State.CANCELLED, State.QUEUED, State.SCHEDULED]
        assert store.counts()[State.CANCELLED] == 2 and store.counts()[State.QUEUED] == 1

    def test_counts_cover_every_state(self, store):
        store.submit([job(), job(run_at=T0 + 5)], T0)
        counts = store.counts()
        assert set(counts) == set(State.ALL)
        assert counts[State.QUEUED] == 1 and counts[State.SCHEDULED] == 1 and counts[State.DEAD] == 0

    def test_oldest_queued_at_is_the_earliest_run_at_among_queued_jobs_only(self, store):
        assert store.oldest_queued_at() is None
        store.submit([job(run_at=T0 - 30, priority=9), job(run_at=T0 - 10, priority=0),
                      job(run_at=T0 + 60)], T0)  # the scheduled one is not waiting for a worker
        assert store.oldest_queued_at() == T0 - 30  # by run_at, whatever the priority
        (first,) = store.claim_available(Request.of(1, now=T0))
        assert first.run_at == T0 - 10  # priority 0 ran first; the oldest waits on
        assert store.oldest_queued_at() == T0 - 30
        store.claim_available(Request.of(1, now=T0))
        assert store.oldest_queued_at() is None

    # --- dead letters and retention -------------------------------------------------------
    def _dead(self, store, n):
        store.submit([job() for _ in range(n)], T0)
        jobs = store.claim_available(Request.of(n, now=T0))
        store.finish_if_running([Outcome.dead(j.id, {"type": "E", "message": ""}) for j in jobs], T0)
        return jobs

    def test_retry_all_dead_requeues_every_dead_job(self, store):
        self._dead(store, 3)
        assert store.retry_all_dead(T0 + 1) == 3
        assert store.counts()[State.QUEUED] == 3 and store.counts()[State.DEAD] == 0

    @pytest.mark.parametrize("replay", ["one", "all"])
    def test_a_replayed_dead_job_counts_against_the_cap(self, store, replay):
        cap = Admission(max_queued=10)
        (dead,) = self._dead(store, 1)
        store.submit([job() for _ in range(8)], T0)
        (answer,) = store.submit_requests([[job()]], T0 + 0.1, cap)  # 9 waiting
        assert not isinstance(answer, Refusal)
        if replay == "one":
            store.retry_dead(dead.id, T0 + 0.2)  # 10 waiting
        else:
            store.retry_all_dead(T0 + 0.2)
        # Within 10 % of the cap, a shared store bounds the waiting from its last count:
        (answer,) = store.submit_requests([[job()]], T0 + 0.5, cap)
        assert isinstance(answer, Refusal) and answer.code == "queue_full"

    def test_purge_removes_dead_jobs_finished_before_the_cutoff(self, store):
        self._dead(store, 2)
        assert store.purge([State.DEAD], T0, 100) == 0
        assert store.purge([State.DEAD], T0 + 1, 100) == 2
        assert store.counts()[State.DEAD] == 0 and store.list_jobs(State.DEAD, 10) == []

    def test_prune_finished_removes_old_succeeded_jobs_in_batches(self, store):
        store.submit([job() for _ in range(5)], T0)
        jobs = store.claim_available(Request.of(5, now=T0))
        store.finish_if_running([Outcome.succeeded(j.id, None) for j in jobs], T0)
        self._dead(store, 1)
        assert store.prune_finished(T0 + 1, 3) == 3
        assert store.prune_finished(T0 + 1, 3) == 2
        assert store.counts()[State.SUCCEEDED] == 0 and store.counts()[State.DEAD] == 1

    def test_waiting_by_key_lists_the_busiest_keys(self, store):
        store.submit([job(key="a"), job(key="b", run_at=T0 - 5), job(key="b"), job()], T0)
        assert store.waiting_by_key(10) == [("b", 2, T0 - 5), ("a", 1, T0)]

    # --- pools ----------------------------------------------------------------------------
    def test_a_job_without_a_pool_is_in_the_default_pool(self, store):
        (s,) = store.submit([job()], T0)
        assert store.get(s.job_id).pool == "default"

    def test_claim_serves_only_the_given_pools(self, store):
        gpu, plain = store.submit([job(pool="gpu"), job()], T0)
        assert [j.id for j in store.claim_available(Request.of(5, pools=["default"], now=T0))] == [plain.job_id]
        assert store.claim_available(Request.of(5, pools=["other"], now=T0)) == []
        (j,) = store.claim_available(Request.of(5, pools=["gpu", "other"], now=T0))
        assert (j.id, j.pool) == (gpu.job_id, "gpu")

    def test_a_claim_passes_over_the_jobs_it_sets_aside_and_their_keys_wait_behind_them(self, store):
        head, later, other = store.submit([job(key="k"), job(key="k"), job()], T0)
        claimed = store.claim_available(Request.of(5, exclude=[head.job_id], now=T0))
        assert [j.id for j in claimed] == [other.job_id]
        assert [j.id for j in store.claim_available(Request.of(5, now=T0))] == [head.job_id]

    def test_a_claimed_job_released_unstarted_waits_where_it_waited_its_attempt_given_back(self, store):
        head, later = store.submit([job(key="k"), job(key="k")], T0)
        (j,) = store.claim_available(Request.of(1, now=T0))
        assert store.release_unstarted([j.id]) == 1
        back = store.get(head.job_id)
        assert (back.state, back.attempts, back.started_at, back.run_at) == (State.QUEUED, 0, None, T0)
        assert [c.id for c in store.claim_available(Request.of(5, now=T0 + 1))] == [head.job_id]  # still the key's head
        assert store.release_unstarted([later.job_id]) == 0  # not running: nothing to give back

    def test_a_key_head_waiting_for_another_pool_holds_its_key(self, store):
        head, later = store.submit([job(key="k", pool="gpu"), job(key="k")], T0)
        assert store.claim_available(Request.of(5, pools=["default"], now=T0)) == []
        assert [j.id for j in store.claim_available(Request.of(5, pools=["gpu"], now=T0))] == [head.job_id]

    def test_set_pool_moves_a_keys_waiting_jobs_only(self, store):
        a, b, other = store.submit([job(key="k"), job(key="k"), job(key="x")], T0)
        store.claim_available(Request.of(1, now=T0))  # a runs: it stays where it is
        assert store.set_pool("key", "k", "gpu") == 1
        assert [store.get(s.job_id).pool for s in (a, b, other)] == ["default", "gpu", "default"]
        assert store.waiting_by_pool() == {"gpu": 1, "default": 1}

    def test_set_pool_of_a_cron_moves_its_template(self, store):
        store.cron_save(self._cron("c", T0 + 60))
        assert store.set_pool("cron", "c", "gpu") == 1
        fire = store.cron_fire_if_due("c", T0 + 60, T0 + 120, T0 + 60)
        assert store.get(fire.submitted.job_id).pool == "gpu"

    def test_a_claim_for_no_pool_at_all_takes_nothing(self, store):
        store.submit([job()], T0)
        assert store.claim_available(Request.of(5, pools=[], now=T0)) == []
