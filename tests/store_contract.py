"""The store contract, as tests. Every backend's test class inherits StoreContract and
provides a `store` fixture; backend files add only their quirks."""

from __future__ import annotations

import dataclasses
import random
import threading

import pytest
from contract_jobs import T0, job
from store_contract_cron import CronEventContract
from store_contract_fair import FairContract
from store_contract_forward import ForwardContract
from store_contract_operator import OperatorContract
from store_contract_output import OutputContract
from store_contract_parked import ParkedContract
from store_contract_progress import ProgressContract, StalledContract
from store_contract_rates import RatesContract
from store_contract_rules import RulesContract
from store_contract_workflows import WorkflowContract

from queickd.core.job import Outcome, State
from queickd.core.policy import claim
from queickd.core.retry import make_spec
from queickd.store.records import Minute


class StoreContract(CronEventContract, WorkflowContract, OutputContract, RulesContract, OperatorContract,
                    ParkedContract, ProgressContract, ForwardContract, StalledContract, RatesContract,
                    FairContract):
    @pytest.fixture
    def store(self):  # pragma: no cover - each backend overrides
        raise NotImplementedError

    # --- submit ---------------------------------------------------------------------------
    def test_submit_returns_one_answer_per_job_in_order(self, store):
        subs = store.submit([job(args=[i]) for i in range(5)], T0)
        assert [s.job_id for s in subs] == sorted(s.job_id for s in subs)
        assert len({s.job_id for s in subs}) == 5
        assert [store.get(s.job_id).args for s in subs] == [[i] for i in range(5)]

    def test_a_large_mixed_batch_keeps_every_job_its_id_order_and_the_counts(self, store):
        jobs = [job(args=[i]) if i % 3 else job() for i in range(600)] + [job(run_at=T0 + 60) for _ in range(77)]
        subs = store.submit(jobs, T0)
        ids = [s.job_id for s in subs]
        assert ids == sorted(set(ids)) and len(ids) == 677
        assert [store.get(i).args for i in ids[:600:50]] == [[i] if i % 3 else [] for i in range(0, 600, 50)]
        counts = store.counts()
        assert (counts[State.QUEUED], counts[State.SCHEDULED]) == (600, 77)

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

    def test_jobs_of_every_shape_in_one_batch_keep_their_fields(self, store):
        # Stores may insert a job whose other fields are at their defaults with fewer columns:
        # plain, grouped, keyed (arguments and keys), rated (a rate limit) and full rows side by side.
        rl = {"key": "r", "limit": 5, "per": 1.0}
        given = [job(), job(concurrency_group="g", concurrency_limit=2),
                 job(args=[1], kwargs={"x": 1}, key="k", idempotency_key="i1"),
                 job(rate_limit=rl), job(args=[4], idempotency_key="i4", rate_limit=rl),
                 job(args=[2], idempotency_key="i2", priority=4),
                 job(args=[3], idempotency_key="i3", run_at=T0 + 60)]
        subs = store.submit(given, T0)
        got = [store.get(s.job_id) for s in subs]
        fields = ("func", "args", "kwargs", "key", "idempotency_key", "priority", "run_at", "concurrency_group",
                  "concurrency_limit", "max_attempts", "rate_limit")
        assert [tuple(getattr(j, f) for f in fields) for j in got] == [
            tuple(getattr(g, f) for f in fields) for g in given]
        assert [j.state for j in got] == [State.QUEUED] * 6 + [State.SCHEDULED]
        assert (store.counts()[State.QUEUED], store.counts()[State.SCHEDULED]) == (6, 1)

    def test_a_large_batch_without_idempotency_keys_of_every_shape_keeps_their_fields(self, store):
        # A large batch may go another way (PostgreSQL: 64 jobs or more without idempotency
        # keys go by COPY, a COPY per shape). Every job's function is its own: a job given
        # another's id would show.
        kinds = [lambda i: job(), lambda i: job(concurrency_group="g", concurrency_limit=2, cost_units=1.5),
                 lambda i: job(args=[i], kwargs={"x": i}, key=f"k{i % 3}"),
                 lambda i: job(args=[i], priority=4, retry_on_network=True, pool="p"),
                 lambda i: job(args=[i], rate_limit={"key": f"r{i % 2}", "limit": 9, "per": 1.0}),
                 lambda i: job(run_at=T0 + 60 + i)]
        given = [dataclasses.replace(kinds[i % len(kinds)](i), func=f"m:f{i}") for i in range(100)]
        subs = store.submit(given, T0)
        got = [store.get(s.job_id) for s in subs]
        fields = ("func", "args", "kwargs", "key", "idempotency_key", "priority", "run_at", "concurrency_group",
                  "concurrency_limit", "cost_units", "max_attempts", "retry_on_network", "pool", "rate_limit")
        assert [tuple(getattr(j, f) for f in fields) for j in got] == [
            tuple(getattr(g, f) for f in fields) for g in given]
        assert [(j.created_at, j.attempts) for j in got] == [(T0, 0)] * 100
        assert [j.state for j in got] == [State.SCHEDULED if i % 6 == 5 else State.QUEUED for i in range(100)]
        assert (store.counts()[State.QUEUED], store.counts()[State.SCHEDULED]) == (84, 16)

    @pytest.mark.parametrize("n", [1, 70])  # 70: PostgreSQL's COPY path
    def test_a_zero_given_where_the_default_is_none_is_kept_as_zero(self, store, n):
        # A store may leave a job's columns at their defaults when its fields are: 0.0 and
        # 0 are values given, not the default None.
        given = [job(cost_units=0.0, timeout=0.0, output_kb=0) for _ in range(n)]
        got = [store.get(s.job_id) for s in store.submit(given, T0)]
        assert {(j.cost_units, j.timeout, j.output_kb) for j in got} == {(0.0, 0.0, 0)}

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
        claimed = store.claim_available(claim.Request.of(10, now=T0))
        assert [j.id for j in claimed] == [d.job_id, b.job_id, c.job_id, a.job_id]

    def test_claim_takes_jobs_with_and_without_a_group_in_one_queue_order(self, store):
        spec = [(1, None, 0), (0, "g", 3), (0, None, 5), (-1, "h", 1), (0, "g", 1), (1, "h", 0), (0, None, 1)]
        subs = store.submit([job(priority=p, run_at=T0 - ago, concurrency_group=g, concurrency_limit=9 if g else None)
                             for p, g, ago in spec], T0)  # (priority, group, seconds before T0)
        queue_order = sorted(range(len(spec)), key=lambda i: (spec[i][0], -spec[i][2], subs[i].job_id))
        claimed = [j.id for _ in spec for j in store.claim_available(claim.Request.of(1, now=T0))]
        assert claimed == [subs[i].job_id for i in queue_order]

    def test_a_claim_that_passes_over_held_keys_keeps_one_queue_order_across_groups(self, store):
        store.submit([job(key="k")], T0)
        store.claim_available(claim.Request.of(1, now=T0))  # k is held while its job runs: its queued jobs are passed over
        spec = [("k" if i % 3 == 0 else None, "g" if i % 2 else None, (i * 7) % 5, i % 4) for i in range(40)]
        subs = store.submit([job(key=k, concurrency_group=g, concurrency_limit=100 if g else None, priority=p,
                                 run_at=T0 - ago) for k, g, p, ago in spec], T0)
        free = sorted((i for i in range(len(spec)) if spec[i][0] is None),
                      key=lambda i: (spec[i][2], -spec[i][3], subs[i].job_id))
        assert [j.id for j in store.claim_available(claim.Request.of(len(spec), now=T0))] == [subs[i].job_id for i in free]

    def test_claim_respects_the_limit(self, store):
        store.submit([job() for _ in range(5)], T0)
        assert len(store.claim_available(claim.Request.of(2, now=T0))) == 2
        assert store.counts()[State.QUEUED] == 3

    def test_claim_marks_running_counts_the_attempt_and_sets_started_at(self, store):
        store.submit([job()], T0)
        (j,) = store.claim_available(claim.Request.of(1, now=T0 + 2))
        assert (j.state, j.attempts, j.started_at) == (State.RUNNING, 1, T0 + 2)
        assert store.get(j.id).state == State.RUNNING

    def test_claim_skips_jobs_scheduled_in_the_future(self, store):
        store.submit([job(run_at=T0 + 60)], T0)
        assert store.claim_available(claim.Request.of(5, now=T0 + 120)) == []

    def test_claim_of_an_empty_queue_returns_nothing(self, store):
        assert store.claim_available(claim.Request.of(4, now=T0)) == []

    def test_a_claimed_job_is_not_claimed_again(self, store):
        store.submit([job()], T0)
        assert len(store.claim_available(claim.Request.of(1, now=T0))) == 1
        assert store.claim_available(claim.Request.of(1, now=T0)) == []

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
        (j,) = store.claim_available(claim.Request.of(1, now=T0))
        assert store.finish_if_running([Outcome.succeeded(j.id, {"n": 1})], T0 + 1).changed == 1
        done = store.get(j.id)
        assert (done.state, done.result, done.finished_at) == (State.SUCCEEDED, {"n": 1}, T0 + 1)

    def test_finish_retry_reschedules_with_the_error(self, store):
        store.submit([job()], T0)
        (j,) = store.claim_available(claim.Request.of(1, now=T0))
        err = {"type": "ValueError", "message": "x"}
        store.finish_if_running([Outcome.retry_at(j.id, T0 + 30, err)], T0 + 1)
        again = store.get(j.id)
        assert (again.state, again.run_at, again.error, again.finished_at) == (State.SCHEDULED, T0 + 30, err, None)
        assert store.next_scheduled_at() == T0 + 30

    def test_finish_dead_and_waiting_network_are_recorded(self, store):
        store.submit([job(), job()], T0)
        a, b = store.claim_available(claim.Request.of(2, now=T0))
        err = {"type": "E", "message": "m"}
        store.finish_if_running([Outcome.dead(a.id, err), Outcome.waiting_network(b.id, err)], T0)
        assert store.get(a.id).state == State.DEAD
        assert store.get(b.id).state == State.WAITING_NETWORK

    def test_finish_ignores_jobs_that_are_not_running(self, store):
        (s,) = store.submit([job()], T0)
        assert store.finish_if_running([Outcome.succeeded(s.job_id, 1)], T0).changed == 0
        assert store.get(s.job_id).state == State.QUEUED

    def test_finish_of_an_unknown_job_changes_nothing(self, store):
        assert store.finish_if_running([Outcome.succeeded(999_999, None)], T0).changed == 0

    # --- orphans --------------------------------------------------------------------------
    def test_recover_orphans_requeues_running_jobs(self, store):
        store.submit([job(), job()], T0)
        claimed = store.claim_available(claim.Request.of(1, now=T0))
        rec = store.recover_orphans(3, T0)
        assert rec.requeued == [claimed[0].id] and rec.dead == []
        j = store.get(claimed[0].id)
        assert (j.state, j.orphaned, j.attempts) == (State.QUEUED, 1, 1)

    def test_recover_orphans_leaves_the_jobs_this_process_runs(self, store):
        store.submit([job(), job()], T0)
        old, mine = store.claim_available(claim.Request.of(2, now=T0))
        rec = store.recover_orphans(3, T0, running_here={mine.id})
        assert rec.requeued == [old.id] and rec.dead == []
        assert store.get(mine.id).state == State.RUNNING and store.get(mine.id).orphaned == 0

    def test_recover_orphans_gives_up_past_the_limit(self, store):
        store.submit([job()], T0)
        for _ in range(2):
            store.claim_available(claim.Request.of(1, now=T0))
            store.recover_orphans(2, T0)
        (j,) = store.claim_available(claim.Request.of(1, now=T0))
        rec = store.recover_orphans(2, T0)
        assert rec.dead == [j.id]
        dead = store.get(j.id)
        assert dead.state == State.DEAD and dead.error["type"] == "orphaned"

    # --- inspect --------------------------------------------------------------------------
    def test_get_of_an_unknown_job_returns_none(self, store):
        assert store.get(123_456) is None

    def test_list_jobs_is_newest_first_and_filters_by_state(self, store):
        subs = store.submit([job(), job(), job(run_at=T0 + 9)], T0)
        assert [j.id for j in store.list_jobs(None, 10)] == [s.job_id for s in reversed(subs)]
        assert [j.id for j in store.list_jobs(State.QUEUED, 1)] == [subs[1].job_id]

    def test_list_jobs_filters_by_function_key_and_pool(self, store):
        a, b, c, d = store.submit([job(func="m:g", key="k"), job(key="k", pool="gpu"), job(pool="gpu"),
                                   job(func="m:g", run_at=T0 + 9)], T0)
        ids = lambda **f: [j.id for j in store.list_jobs(None, 10, **f)]  # noqa: E731
        assert ids(func="m:g") == [d.job_id, a.job_id]
        assert ids(key="k") == [b.job_id, a.job_id]
        assert ids(pool="gpu") == [c.job_id, b.job_id]
        assert ids(func="m:f", key="k", pool="gpu") == [b.job_id]
        assert [j.id for j in store.list_jobs(State.QUEUED, 10, func="m:g")] == [a.job_id]

    # --- per-minute counters ----------------------------------------------------------------
    def test_add_minute_adds_counts_per_minute_and_member(self, store):
        from queickd.store.records import Minute

        store.add_minute(Minute(100, "a:1", 2, 1, 0.5))
        store.add_minute(Minute(100, "a:1", 1, 0, 0.25, depth=7))
        store.add_minute(Minute(100, "b:2", 0, 3, 1.0))
        store.add_minute(Minute(101, "a:1", 0, 0, 0.0, depth=4))
        assert store.minutes(100) == [Minute(100, "a:1", 3, 1, 0.75, 7), Minute(100, "b:2", 0, 3, 1.0, None),
                                      Minute(101, "a:1", 0, 0, 0.0, 4)]
        assert store.minutes(101) == [Minute(101, "a:1", 0, 0, 0.0, 4)]

    def test_a_minute_without_a_depth_keeps_the_depth_sampled(self, store):
        from queickd.store.records import Minute

        store.add_minute(Minute(100, "a:1", 0, 0, 0.0, depth=7))
        store.add_minute(Minute(100, "a:1", 1, 0, 0.5))
        assert store.minutes(0)[0].depth == 7

    def test_prune_minutes_deletes_the_older_rows(self, store):
        from queickd.store.records import Minute

        for minute in (98, 99, 100):
            store.add_minute(Minute(minute, "a:1", 1, 0, 0.1))
        assert store.prune_minutes(100) == 2 and [m.minute for m in store.minutes(0)] == [100]

    # --- network --------------------------------------------------------------------------
    def test_claim_while_the_network_is_down_passes_over_network_jobs(self, store):
        net, plain = store.submit([job(retry_on_network=True), job()], T0)
        assert [j.id for j in store.claim_available(claim.Request.of(5, network_up=False, now=T0))] == [plain.job_id]
        assert [j.id for j in store.claim_available(claim.Request.of(5, network_up=True, now=T0))] == [net.job_id]

    def test_park_for_network_moves_only_queued_network_jobs(self, store):
        net, plain, later = store.submit(
            [job(retry_on_network=True), job(), job(retry_on_network=True, run_at=T0 + 60)], T0)
        assert store.park_for_network(T0) == 1
        assert [store.get(s.job_id).state for s in (net, plain, later)] == [
            State.WAITING_NETWORK, State.QUEUED, State.SCHEDULED]
        assert [j.id for j in store.claim_available(claim.Request.of(5, now=T0))] == [plain.job_id]

    def test_release_network_waiting_requeues_in_enqueue_order(self, store):
        subs = store.submit([job(retry_on_network=True, run_at=T0 - i) for i in range(3)], T0)
        store.park_for_network(T0)
        assert store.release_network_waiting(T0 + 5) == 3
        claimed = store.claim_available(claim.Request.of(5, now=T0 + 5))
        assert [j.id for j in claimed] == [s.job_id for s in subs]
        assert {j.run_at for j in claimed} == {T0 + 5}

    def test_a_run_parked_for_the_network_gives_its_attempt_back(self, store):
        store.submit([job(retry_on_network=True)], T0)
        (j,) = store.claim_available(claim.Request.of(1, now=T0))
        store.finish_if_running([Outcome.waiting_network(j.id, {"type": "E", "message": ""})], T0)
        parked = store.get(j.id)
        assert (parked.state, parked.attempts) == (State.WAITING_NETWORK, 0)

    def test_claim_starts_what_the_selection_policy_picks(self, store):
        # The stores' claims (PostgreSQL's is an SQL function) must agree with claim.select
        # on what they read: keys, pauses, pools, the network, priorities, passed-over heads.
        self._fail(store, 3, func="m:bad")
        rnd = random.Random(13)
        store.submit([job(func=rnd.choice(["m:f", "m:g", "m:bad"]), key=rnd.choice([None, None, "a", "b", "c"]),
                          priority=rnd.choice([0, 0, 1, 5]), pool=rnd.choice(["default", "default", "other"]),
                          retry_on_network=rnd.random() < 0.2, run_at=T0 - rnd.randint(0, 5))
                      for _ in range(80)], T0)
        for limit, net, pools in [(3, True, None), (5, False, ["default"]), (4, True, ["other"]),
                                  (10, False, None), (2, True, ["default", "other"]), (50, True, None)] * 3:
            queued = sorted(store.list_jobs(State.QUEUED, 1000), key=lambda j: (j.priority, j.run_at, j.id))
            running = claim.Running.of([j.key for j in store.list_jobs(State.RUNNING, 1000)],
                                       [(p.kind, p.name) for p in store.pauses()])
            want = claim.select(queued, claim.Request.of(limit, net, pools), running)
            got = store.claim_available(claim.Request.of(limit, network_up=net, pools=pools, now=T0))
            assert [j.id for j in got] == want
            done = store.list_jobs(State.RUNNING, 1000)[::2]
            store.finish_if_running([Outcome.succeeded(j.id, None) for j in done], T0)

    # --- transaction ----------------------------------------------------------------------------
    def test_calls_inside_a_transaction_commit_together(self, store):
        (s,) = store.submit([job()], T0)
        (j,) = store.claim_available(claim.Request.of(1, now=T0))
        store.submit([job()], T0)
        with store.transaction(bookkeeping=True) as tx:
            tx.finish_if_running([Outcome.succeeded(j.id, 1)], T0)
            claimed = tx.claim_available(claim.Request.of(5, now=T0))
        assert store.get(s.job_id).state == State.SUCCEEDED
        assert [store.get(c.id).state for c in claimed] == [State.RUNNING]

    def test_a_bookkeeping_transaction_that_raises_halfway_leaves_nothing_behind(self, store):
        ran, a, b = store.submit([job("m:bad", key="k"), job(), job()], T0)
        store.claim_available(claim.Request.of(1, now=T0))
        with pytest.raises(RuntimeError), store.transaction(bookkeeping=True) as tx:
            tx.finish_if_running([Outcome.dead(ran.job_id, {"type": "E", "message": "m"})], T0, pause_after=1)
            assert len(tx.claim_available(claim.Request.of(5, now=T0))) == 2
            raise RuntimeError("the dispatcher failed before it could run them")
        assert store.counts()[State.QUEUED] == 2 and store.counts()[State.RUNNING] == 1
        assert store.get(ran.job_id).state == State.RUNNING and store.pauses() == []
        assert [j.id for j in store.claim_available(claim.Request.of(5, now=T0))] == [a.job_id, b.job_id]

    def test_a_large_submit_inside_a_transaction_commits_with_it_or_not_at_all(self, store):
        many = [job(args=[i]) for i in range(100)]  # PostgreSQL sends it by COPY, in the open transaction
        with pytest.raises(RuntimeError), store.transaction() as tx:
            tx.submit(many, T0)
            raise RuntimeError("failed after the submit")
        assert store.counts()[State.QUEUED] == 0
        with store.transaction() as tx:
            stored = tx.submit(many, T0)
        assert store.counts()[State.QUEUED] == 100
        assert [store.get(s.job_id).args for s in stored] == [[i] for i in range(100)]

    def test_a_read_from_another_thread_sees_only_what_was_committed(self, store):
        (a,) = store.submit([job()], T0)
        written, seen = threading.Event(), []

        def read() -> None:
            written.wait(10)
            seen.append(store.get(a.job_id).state)

        reader = threading.Thread(target=read)
        reader.start()
        with pytest.raises(RuntimeError), store.transaction(bookkeeping=True) as tx:
            assert [j.id for j in tx.claim_available(claim.Request.of(1, now=T0))] == [a.job_id]
            written.set()
            reader.join(0.2)  # a read that does not wait for the commit has seen `running` by now
            raise RuntimeError("rolled back: the claim never happened")
        reader.join(10)
        assert seen == [State.QUEUED]

    def test_a_transaction_that_raises_halfway_leaves_nothing_behind(self, store):
        (kept,) = store.submit([job(run_at=T0 + 60)], T0)
        with pytest.raises(RuntimeError), store.transaction() as tx:
            tx.submit([job(idempotency_key="once"), job(run_at=T0 + 30)], T0)
            assert len(tx.claim_available(claim.Request.of(5, now=T0))) == 1
            tx.add_minute(Minute(100, "a:1", 1, 0, 0.5))
            raise RuntimeError("failed after some store calls")
        assert store.counts() == {**dict.fromkeys(State.ALL, 0), State.SCHEDULED: 1}
        assert store.get(kept.job_id).state == State.SCHEDULED and store.next_scheduled_at() == T0 + 60
        assert store.minutes(0) == []
        assert not store.submit([job(idempotency_key="once")], T0)[0].duplicate
