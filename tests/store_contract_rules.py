"""The store contract for the run-queue rules (part of StoreContract: every store runs it):
serial keys, admission (caps, conflicts, idempotency), pauses and their probes, pauses by
hand, what a claim with groups and budgets reads past, and a random walk of claims, each
held to core/policy/claim.py's choice."""

from __future__ import annotations

import dataclasses
import random
import threading

import pytest
from contract_jobs import T0, job

from queickd.core.job import Outcome, State
from queickd.core.policy import claim, rates
from queickd.core.policy.admission import Admission, Refusal
from queickd.core.policy.claim import LOOK_AHEAD, Limits, Request
from queickd.store.contract.capabilities import PassInOneCall
from queickd.store.records import RefusedError

# A key's jobs agree on their limit and window (the stores judge a key full by its last
# started job's: rates.RateLimits.full).
_RATES = ({"key": "r1", "limit": 1, "per": 2.0}, {"key": "r2", "limit": 2, "per": 5.0})


def _random_job(rnd: random.Random, now: float):
    group = rnd.choice(["g0", "g1"]) if rnd.random() < 0.1 else None  # of pool "other" only
    return job(func=rnd.choice(["m:f", "m:g", "m:f", "m:bad"]), key=rnd.choice([None, None, None, "a", "b", "c"]),
               priority=rnd.choice([0, 0, 1, 5]), pool="other" if group else rnd.choice(["default", "default", "other"]),
               retry_on_network=rnd.random() < 0.2, run_at=now - rnd.randint(0, 5),
               concurrency_group=group, concurrency_limit=rnd.choice([1, 2]) if group else None,
               rate_limit=rnd.choice(_RATES) if rnd.random() < 0.15 else None)


def _probes_last(queued: list, running: claim.Running, request: claim.Request) -> list[int]:
    """What a claim that takes due probes after its other jobs, when room is left, starts
    (PostgreSQL's fast path, claim_sql.CLAIM): the selection's choice with no probe due,
    then the selection's choice of the rest for the room left, with those jobs running."""
    first = claim.select(queued, request, dataclasses.replace(running, probes=frozenset()))
    if len(first) >= request.limit or not running.probes:
        return first
    taken = set(first)
    keys = running.keys | {c.key for c in queued if c.id in taken and c.key is not None}
    rest = claim.select([c for c in queued if c.id not in taken],
                        dataclasses.replace(request, limit=request.limit - len(first)),
                        dataclasses.replace(running, keys=keys))
    order = {c.id: i for i, c in enumerate(queued)}
    return sorted(first + rest, key=order.__getitem__)


class RulesContract:
    # Whether a claim on the store's fast path (no group that could start a job waiting in
    # a pool served) takes due probes after its other jobs: PostgreSQL's SQL claim does.
    PROBES_AFTER_THE_REST = False

    # --- serial keys ----------------------------------------------------------------------
    def test_claim_takes_one_job_per_key_in_enqueue_order(self, store):
        a1, b1, a2, free = store.submit([job(key="a"), job(key="b"), job(key="a"), job()], T0)
        claimed = store.claim_available(Request.of(10, now=T0))
        assert [j.id for j in claimed] == [a1.job_id, b1.job_id, free.job_id]
        assert store.get(a2.job_id).state == State.QUEUED

    def test_a_key_with_a_running_job_waits_until_it_finishes(self, store):
        first, second = store.submit([job(key="k"), job(key="k")], T0)
        store.claim_available(Request.of(1, now=T0))
        assert store.claim_available(Request.of(5, now=T0)) == []
        store.finish_if_running([Outcome.succeeded(first.job_id, None)], T0)
        assert [j.id for j in store.claim_available(Request.of(5, now=T0))] == [second.job_id]

    # --- admission ------------------------------------------------------------------------
    def test_a_key_past_its_waiting_cap_is_refused_queue_full(self, store):
        limits = Admission(max_queued_per_key=2)
        answers = store.submit_requests([[job(key="k")], [job(key="k")], [job(key="k")], [job(key="x")]],
                                        T0, limits)
        assert [isinstance(a, Refusal) for a in answers] == [False, False, True, False]
        assert answers[2].code == "queue_full" and answers[2].retry_after > 0
        assert store.counts()[State.QUEUED] == 3

    def test_the_overall_cap_counts_every_waiting_job(self, store):
        store.submit([job(), job(run_at=T0 + 60)], T0)
        (refused,) = store.submit_requests([[job()]], T0, Admission(max_queued=2))
        assert isinstance(refused, Refusal) and refused.code == "queue_full"
        store.claim_available(Request.of(1, now=T0))  # a running job is no longer waiting
        (ok,) = store.submit_requests([[job()]], T0, Admission(max_queued=2))
        assert not isinstance(ok, Refusal)

    def test_a_resent_idempotency_key_does_not_count_against_the_cap(self, store):
        limits = Admission(max_queued=10)
        store.submit_requests([[job(idempotency_key="sent"), *[job() for _ in range(4)]]], T0, limits)
        (again,) = store.submit_requests([[job(idempotency_key="sent"), *[job() for _ in range(5)]]], T0, limits)
        assert not isinstance(again, Refusal) and again[0].duplicate
        assert store.counts()[State.QUEUED] == 10

    def test_a_request_over_the_cap_is_refused_whole(self, store):
        (answer,) = store.submit_requests([[job(key="k"), job(key="k"), job(key="k")]], T0,
                                          Admission(max_queued_per_key=2))
        assert isinstance(answer, Refusal)
        assert store.counts()[State.QUEUED] == 0

    def test_a_manual_job_for_a_busy_key_is_a_conflict_naming_that_job(self, store):
        (waiting,) = store.submit([job(key="k")], T0)
        (answer,) = store.submit_requests([[job(key="k", manual=True)]], T0)
        assert answer.code == "conflict" and answer.job_id == waiting.job_id
        with pytest.raises(RefusedError):
            store.submit([job(key="k", manual=True)], T0)
        (ok,) = store.submit_requests([[job(key="other", manual=True)]], T0)
        assert not isinstance(ok, Refusal)

    def test_an_idempotency_key_past_its_ttl_names_a_new_job(self, store):
        (first,) = store.submit([job(idempotency_key="k")], T0)
        (dup,) = store.submit_requests([[job(idempotency_key="k")]], T0 + 10, Admission(idempotency_ttl=60))
        assert dup[0].job_id == first.job_id and dup[0].duplicate
        (fresh,) = store.submit_requests([[job(idempotency_key="k")]], T0 + 61, Admission(idempotency_ttl=60))
        assert fresh[0].job_id != first.job_id and not fresh[0].duplicate
        assert store.get(first.job_id).idempotency_key is None

    def test_concurrent_duplicate_enqueues_get_one_id(self, store):
        ids, lock = [], threading.Lock()

        def send():
            for _ in range(25):
                (sub,) = store.submit([job(idempotency_key="same")], T0)
                with lock:
                    ids.append(sub.job_id)

        threads = [threading.Thread(target=send) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(ids)) == 1 and store.counts()[State.QUEUED] == 1

    # --- pauses ---------------------------------------------------------------------------
    def _fail(self, store, n, **kw):
        for _ in range(n):
            (s,) = store.submit([job(**kw)], T0)
            (j,) = store.claim_available(Request.of(1, now=T0))
            fin = store.finish_if_running([Outcome.dead(j.id, {"type": "E", "message": "no"})], T0, pause_after=3)
        return fin

    def test_consecutive_failures_pause_the_function_and_the_key(self, store):
        fin = self._fail(store, 3, key="k")
        assert {(p.kind, p.name) for p in fin.paused} == {("key", "k"), ("func", "m:f")}
        assert {(p.kind, p.name, p.failures) for p in store.pauses()} == {("key", "k", 3), ("func", "m:f", 3)}
        assert store.pauses()[0].last_error == {"type": "E", "message": "no"}

    def test_paused_jobs_keep_waiting_until_resumed(self, store):
        self._fail(store, 3, func="m:bad")
        (waiting,) = store.submit([job(func="m:bad")], T0)
        (other,) = store.submit([job(func="m:good")], T0)
        assert [j.id for j in store.claim_available(Request.of(5, now=T0))] == [other.job_id]
        assert store.resume("func", "m:bad") and not store.resume("func", "m:bad")
        assert [j.id for j in store.claim_available(Request.of(5, now=T0))] == [waiting.job_id]

    def test_a_success_resets_the_failure_streak(self, store):
        self._fail(store, 2)
        (s,) = store.submit([job()], T0)
        (j,) = store.claim_available(Request.of(1, now=T0))
        store.finish_if_running([Outcome.succeeded(j.id, None)], T0, pause_after=3)
        assert self._fail(store, 2).paused == [] and store.pauses() == []

    def test_a_manual_run_resumes_its_key(self, store):
        self._fail(store, 3, key="k")
        store.submit([job(key="k", manual=True)], T0)
        assert ("key", "k") not in {(p.kind, p.name) for p in store.pauses()}

    def _four_running(self, store, **kw):
        store.submit([job(**kw) for _ in range(4)], T0)
        jobs = store.claim_available(Request.of(4, now=T0))
        err = {"type": "E", "message": "no"}
        store.finish_if_running([Outcome.dead(j.id, err) for j in jobs[:3]], T0, pause_after=3)
        return jobs[3]

    def test_further_failures_of_a_paused_target_keep_its_first_pause_time(self, store):
        last = self._four_running(store)
        fin = store.finish_if_running([Outcome.dead(last.id, {"type": "F", "message": "4th"})], T0 + 5,
                                      pause_after=3)
        assert fin.paused == []  # paused already: not a new pause
        (p,) = store.pauses()
        assert (p.paused_at, p.failures, p.last_error) == (T0, 4, {"type": "F", "message": "4th"})

    def test_a_success_ends_the_streak_but_not_the_pause(self, store):
        last = self._four_running(store)
        store.finish_if_running([Outcome.succeeded(last.id, None)], T0 + 5, pause_after=3)
        assert [(p.kind, p.name, p.failures) for p in store.pauses()] == [("func", "m:f", 3)]

    def test_a_run_parked_for_the_network_does_not_extend_a_streak(self, store):
        self._fail(store, 2)
        store.submit([job()], T0)
        (j,) = store.claim_available(Request.of(1, now=T0))
        store.finish_if_running([Outcome.waiting_network(j.id, {"type": "N", "message": ""})], T0, pause_after=3)
        assert store.pauses() == []

    def test_failures_finished_together_count_one_by_one(self, store):
        store.submit([job(key="k"), job()], T0)
        a, b = store.claim_available(Request.of(2, now=T0))
        err = {"type": "E", "message": "no"}
        fin = store.finish_if_running([Outcome.dead(a.id, err), Outcome.dead(b.id, err)], T0, pause_after=2)
        assert [(p.kind, p.name, p.failures) for p in fin.paused] == [("func", "m:f", 2)]
        assert [(p.kind, p.name, p.failures) for p in store.pauses()] == [("func", "m:f", 2)]

    def test_failures_finished_together_past_a_pause_they_begin_count_on_it(self, store):
        store.submit([job() for _ in range(3)], T0)
        err = {"type": "E", "message": "no"}
        fin = store.finish_if_running([Outcome.dead(j.id, err) for j in store.claim_available(Request.of(3, now=T0))], T0,
                                      pause_after=2, pause_cooldown=60.0)
        assert [(p.kind, p.name, p.failures) for p in fin.paused] == [("func", "m:f", 2)]
        assert [(p.kind, p.name, p.failures, p.trips) for p in store.pauses()] == [("func", "m:f", 3, 1)]

    # --- the breaker: a pause lets one probe through after its cooldown ---------------------
    def _trip(self, store, cooldown=60.0, **waiting):
        """m:bad paused at T0 by 3 dead jobs, with its probe at T0 + cooldown; 3 more wait
        (with the fields `waiting`)."""
        store.submit([job(func="m:bad") for _ in range(3)], T0)
        ran = store.claim_available(Request.of(3, now=T0))
        fin = store.finish_if_running([Outcome.dead(j.id, {"type": "E", "message": "no"}) for j in ran], T0,
                                      pause_after=3, pause_cooldown=cooldown)
        return fin, [s.job_id for s in store.submit([job(func="m:bad", **waiting) for _ in range(3)], T0)]

    def test_a_pause_with_a_cooldown_shows_its_probe_time(self, store):
        fin, _ = self._trip(store)
        assert [(p.name, p.probe_at, p.trips) for p in fin.paused] == [("m:bad", T0 + 60, 1)]
        assert fin.next_probe == T0 + 60
        assert [(p.probe_at, p.trips, p.probe_job) for p in store.pauses()] == [(T0 + 60, 1, None)]

    def test_a_pause_lets_no_job_through_before_its_probe_time(self, store):
        self._trip(store)
        assert store.claim_available(Request.of(5, now=T0 + 59)) == []

    def test_a_pause_lets_exactly_one_probe_through_at_its_probe_time(self, store):
        _, waiting = self._trip(store)
        assert [j.id for j in store.claim_available(Request.of(5, now=T0 + 60))] == waiting[:1]
        assert store.claim_available(Request.of(5, now=T0 + 61)) == []  # the probe runs: no second one
        assert store.pauses()[0].probe_job == waiting[0]

    def test_a_pause_lets_exactly_one_probe_of_grouped_jobs_through(self, store):
        # Grouped jobs go through the selection (PostgreSQL's SQL claim leaves them out).
        _, waiting = self._trip(store, concurrency_group="g", concurrency_limit=5)
        assert [j.id for j in store.claim_available(Request.of(5, now=T0 + 60))] == waiting[:1]
        assert store.claim_available(Request.of(5, now=T0 + 61)) == []
        assert store.pauses()[0].probe_job == waiting[0]

    def test_the_probes_success_resumes_the_pause(self, store):
        _, waiting = self._trip(store)
        (probe,) = store.claim_available(Request.of(5, now=T0 + 60))
        store.finish_if_running([Outcome.succeeded(probe.id, None)], T0 + 61, pause_after=3, pause_cooldown=60.0)
        assert store.pauses() == []
        assert [j.id for j in store.claim_available(Request.of(5, now=T0 + 62))] == waiting[1:]

    def test_the_probes_failure_pauses_again_with_a_longer_cooldown(self, store):
        self._trip(store)
        (probe,) = store.claim_available(Request.of(5, now=T0 + 60))
        fin = store.finish_if_running([Outcome.dead(probe.id, {"type": "E", "message": "again"})], T0 + 61,
                                      pause_after=3, pause_cooldown=60.0)
        assert fin.paused == [] and fin.next_probe == T0 + 61 + 120
        (p,) = store.pauses()
        assert (p.paused_at, p.probe_at, p.trips, p.probe_job, p.failures) == (T0, T0 + 181, 2, None, 4)
        assert store.claim_available(Request.of(5, now=T0 + 180)) == [] and len(store.claim_available(Request.of(5, now=T0 + 181))) == 1

    def test_a_probe_that_stopped_running_lets_another_through(self, store):
        _, waiting = self._trip(store)
        (probe,) = store.claim_available(Request.of(5, now=T0 + 60))
        store.finish_if_running([Outcome.waiting_network(probe.id, {"type": "N", "message": ""})], T0 + 61,
                                pause_after=3, pause_cooldown=60.0)  # parked: not a probe's answer
        assert [j.id for j in store.claim_available(Request.of(5, now=T0 + 62))] == waiting[1:2]

    def test_a_scheduled_retry_does_not_count_toward_a_pause(self, store):
        store.submit([job() for _ in range(3)], T0)
        ran = store.claim_available(Request.of(3, now=T0))
        fin = store.finish_if_running([Outcome.retry_at(j.id, T0 + 9, {"type": "E", "message": "no"}) for j in ran],
                                      T0, pause_after=1, pause_cooldown=60.0)
        assert fin.paused == [] and store.pauses() == []

    # --- pauses by hand -----------------------------------------------------------------
    def test_a_pause_by_hand_holds_a_function_with_no_probe_until_resumed(self, store):
        assert store.pause("func", "m:f", T0) and not store.pause("func", "m:f", T0 + 1)
        (waiting,) = store.submit([job()], T0)
        assert store.claim_available(Request.of(5, now=T0 + 10 ** 6)) == []
        assert [(p.kind, p.name, p.paused_at, p.probe_at, p.trips) for p in store.pauses()] == [
            ("func", "m:f", T0, None, 0)]
        assert store.resume("func", "m:f")
        assert [j.id for j in store.claim_available(Request.of(5, now=T0))] == [waiting.job_id]

    def test_a_pause_by_hand_takes_the_probe_away_from_a_breakers_pause(self, store):
        self._trip(store)
        store.pause("func", "m:bad", T0 + 1)
        assert store.claim_available(Request.of(5, now=T0 + 60)) == [] and store.pauses()[0].probe_at is None

    def test_a_paused_pool_starts_none_of_its_jobs(self, store):
        store.pause("pool", "gpu", T0)
        (other,) = store.submit([job(pool="gpu"), job()], T0)[1:]
        assert [j.id for j in store.claim_available(Request.of(5, now=T0))] == [other.job_id]

    def test_a_paused_pool_starts_none_of_its_grouped_jobs(self, store):
        store.pause("pool", "gpu", T0)
        (other,) = store.submit([job(pool="gpu", concurrency_group="g", concurrency_limit=2),
                                 job(concurrency_group="g", concurrency_limit=2)], T0)[1:]
        assert [j.id for j in store.claim_available(Request.of(5, now=T0))] == [other.job_id]

    # --- concurrency groups and cost budgets: what a claim reads past ---------------------
    def test_a_backlog_of_a_group_whose_budget_is_used_up_does_not_hold_back_a_job_behind_it(self, store):
        limits = Limits(groups={"openai": 1})
        store.adopt_budgets(limits)  # in force (PostgreSQL keeps them; the others take the claim's)
        store.submit([job(concurrency_group="openai", concurrency_limit=100)], T0)
        assert len(store.claim_available(Request.of(1, limits=limits, now=T0))) == 1  # the budget is used up
        store.submit([job(concurrency_group="openai", concurrency_limit=100) for _ in range(LOOK_AHEAD + 64)], T0)
        (plain,) = store.submit([job()], T0)
        assert [j.id for j in store.claim_available(Request.of(1, limits=limits, now=T0))] == [plain.job_id]

    def test_a_backlog_of_a_pool_whose_budget_is_used_up_does_not_hold_back_a_job_behind_it(self, store):
        limits = Limits(pools={"gpu": 1})
        store.adopt_budgets(limits)
        store.submit([job(pool="gpu")], T0)
        assert len(store.claim_available(Request.of(1, pools=["default", "gpu"], limits=limits, now=T0))) == 1
        store.submit([job(pool="gpu") for _ in range(LOOK_AHEAD + 64)], T0)
        (plain,) = store.submit([job()], T0)
        assert [j.id for j in store.claim_available(Request.of(1, pools=["default", "gpu"], limits=limits, now=T0))] == [plain.job_id]

    def test_a_job_over_a_lowered_budget_does_not_hold_back_the_younger_jobs_of_its_pool(self, store):
        store.adopt_budgets(Limits(pools={"default": 4}))
        (big,) = store.submit([job(cost_units=3)], T0)  # accepted under a budget of 4
        lowered = Limits(pools={"default": 2}, patience=1)
        store.adopt_budgets(lowered)
        small = store.submit([job(cost_units=1, run_at=T0 + 5) for _ in range(3)], T0 + 5)
        # Long past its patience, it never fits 2: it holds nothing, two cheap ones start.
        got = [j.id for j in store.claim_available(Request.of(5, limits=lowered, now=T0 + 60))]
        assert got == [s.job_id for s in small[:2]]
        assert store.get(big.job_id).state == State.QUEUED

    def test_waiting_jobs_over_a_whole_budget_are_found_for_the_log(self, store):
        from queickd.core.policy.costs import never_fit

        over, _, other = store.submit([job(cost_units=3), job(cost_units=1.5), job(pool="b", cost_units=9)], T0)
        limits = Limits(pools={"default": 2})
        found = never_fit(limits, store.waiting_over_budgets(limits))
        assert [(m.kind, m.name, m.job_ids) for m in found] == [("pool", "default", [over.job_id])]

    def test_a_group_runs_no_job_past_the_lowest_limit_of_its_running_jobs(self, store):
        store.submit([job(concurrency_group="g", concurrency_limit=1)], T0)
        assert len(store.claim_available(Request.of(5, now=T0))) == 1
        store.submit([job(concurrency_group="g", concurrency_limit=3) for _ in range(3)], T0)
        assert store.claim_available(Request.of(5, now=T0)) == []

    def test_a_job_claimed_with_a_lower_limit_caps_its_group_in_the_same_claim(self, store):
        first, *_ = store.submit([job(concurrency_group="g", concurrency_limit=1)]
                                 + [job(concurrency_group="g", concurrency_limit=3) for _ in range(2)], T0)
        assert [j.id for j in store.claim_available(Request.of(5, now=T0))] == [first.job_id]

    # --- every claim as claim.select decides: a random walk ---------------------------------
    def test_every_claim_of_a_random_walk_starts_what_the_selection_policy_picks(self, store):
        # The same job sets offered to the store's claim and to core/policy/claim.py: keys,
        # pauses (by hand and by failures, with their probes), pools, the network,
        # priorities, groups full or not; PostgreSQL's claim and pass are SQL functions.
        rnd, now = random.Random(26), T0
        windows: dict = {}  # the rate keys' windows, from the starts the store made
        for step in range(200):
            now += rnd.choice([0, 0, 1, 3])
            if rnd.random() < 0.5:
                store.submit([_random_job(rnd, now) for _ in range(rnd.randint(1, 5))], now)
            if rnd.random() < 0.05:
                store.pause(*rnd.choice([("func", "m:g"), ("key", "b"), ("pool", "other")]), now)
            elif rnd.random() < 0.08 and store.pauses():
                store.resume(*rnd.choice(sorted((p.kind, p.name) for p in store.pauses())))
            queued, running = store_picture(store, now, windows)
            pools = rnd.choice([None, ["default"], ["other"], ["default", "other"]])
            request = claim.Request.of(rnd.randint(1, 6), rnd.random() < 0.8, pools, now=now)
            # The fast path's claim unless a group that could start a job waits in a pool
            # served (claim_sql.OPEN_GROUP_WAITS; every pool: any grouped job).
            full = claim.Selection(request, running).out_groups
            fast = not any(c.concurrency_group is not None and (pools is None or (
                c.pool in pools and c.concurrency_group not in full)) for c in queued) and not any(
                c.rate_limit is not None and (pools is None or c.pool in pools) for c in queued)
            want = (_probes_last(queued, running, request) if self.PROBES_AFTER_THE_REST and fast
                    else claim.select(queued, request, running))
            heads = [c for c in queued if pools is None or c.pool in pools][:request.limit]
            plain = claim.plain(heads, request, bool(store.pauses()), running)
            assert plain is None or plain == claim.select(queued, request, running), step
            in_one = rnd.random() < 0.5  # by a pass (finish_and_claim) with nothing to finish
            got = store.finish_and_claim([], now, request.limit, request.network_up, pools) if (
                in_one and isinstance(store, PassInOneCall)) else None
            if got is None:
                got = store.claim_available(Request.of(request.limit, request.network_up, pools, now=now))
            assert [j.id for j in got] == want, step
            log = rates.RateLimits(windows, now)
            for j in got:
                log.started(j)
            windows = log.windows
            err = {"type": "E", "message": "no"}
            store.finish_if_running([Outcome.dead(j.id, err) if rnd.random() < (0.7 if j.func == "m:bad" else 0.1)
                                     else Outcome.succeeded(j.id, None)
                                     for j in store.list_jobs(State.RUNNING, 10_000) if rnd.random() < 0.5],
                                    now, pause_after=2, pause_cooldown=4.0)


def store_picture(store, now: float, windows: dict) -> tuple[list, claim.Running]:
    """What a claim at `now` meets, read back from the store for the pure policy: the queued
    jobs in queue order, and what runs (keys, groups, pools, costs, pauses and due probes),
    with the rate keys' `windows` as the test has followed them."""
    queued = sorted(store.list_jobs(State.QUEUED, 10_000), key=lambda j: (j.priority, j.run_at, j.id))
    ran = store.list_jobs(State.RUNNING, 10_000)
    pauses = store.pauses()
    running = claim.Running.of_jobs(
        [(j.key, j.concurrency_group, None, j.concurrency_limit, j.pool, j.cost_units) for j in ran],
        [(p.kind, p.name) for p in pauses],
        [(p.kind, p.name) for p in pauses if p.probe_at is not None and p.probe_at <= now
         and p.probe_job not in {j.id for j in ran}])
    running.rates = windows
    return queued, running
