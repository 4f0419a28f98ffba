"""The store contract for fair shares (part of StoreContract: every store runs it): a claim
takes jobs round-robin across the fair keys with work waiting in a pool, weighted, priority
ordering within a key, the jobs without a fair key sharing as one key, and every other rule
holding as in queue order."""

from __future__ import annotations

import random
import threading

from contract_jobs import T0, job
from helpers import run_together
from store_contract_rules import store_picture

from queickd.core.job import Outcome, State
from queickd.core.policy import claim, fair, rates
from queickd.core.policy.claim import Limits, Request


def fair_job(tenant: str, **kw):
    return job(fair_by=tenant, **kw)


def _claim_one_by_one(store, n: int, limits: Limits = claim.NO_LIMITS, start: float = T0) -> list:
    """n claims of one job each (a worker of one slot), the jobs they started."""
    out = []
    for i in range(n):
        out += store.claim_available(Request.of(1, now=start + i, limits=limits))
    return out


def _random_job(rnd: random.Random, now: float):
    group = rnd.choice(["g0", "g1"]) if rnd.random() < 0.1 else None
    return job(func=rnd.choice(["m:f", "m:g"]), key=rnd.choice([None, None, None, "a", "b"]),
               priority=rnd.choice([0, 0, 1, 5]), pool=rnd.choice(["default", "default", "other"]),
               retry_on_network=rnd.random() < 0.1, run_at=now - rnd.randint(0, 5),
               concurrency_group=group, concurrency_limit=rnd.choice([1, 2]) if group else None,
               rate_limit={"key": "r", "limit": 1, "per": 3.0} if rnd.random() < 0.1 else None,
               fair_by=rnd.choice([None, "t1", "t2", "t2", "t3"]))


class FairContract:
    def test_every_claim_of_a_random_walk_with_fair_keys_starts_what_fair_shares_pick(self, store):
        # The same jobs offered to the store's claim and to core/policy/fair.py's reference
        # (the standings read from the store before each claim): keys, groups, rate limits,
        # pauses, pools, the network, priorities, weights, with fair keys and without.
        rnd, now = random.Random(54), T0
        weights = {"t1": 2.0, "t3": 0.5}
        windows: dict = {}
        for step in range(150):
            now += rnd.choice([0, 1, 3])
            if rnd.random() < 0.5:
                store.submit([_random_job(rnd, now) for _ in range(rnd.randint(1, 6))], now)
            if rnd.random() < 0.05:
                store.pause(*rnd.choice([("func", "m:g"), ("key", "b")]), now)
            elif rnd.random() < 0.1 and store.pauses():
                store.resume(*rnd.choice(sorted((p.kind, p.name) for p in store.pauses())))
            queued, running = store_picture(store, now, windows)
            pools = rnd.choice([None, ["default"], ["default", "other"]])
            request = claim.Request.of(rnd.randint(1, 5), rnd.random() < 0.8, pools,
                                       Limits(fair=weights), now=now)
            if not any(c.fair_by is not None and (pools is None or c.pool in pools) for c in queued):
                continue  # the claim of the rules' contract (store_contract_rules.py)
            standings = {(k.pool, k.key): (k.vtime, k.last_start) for k in store.fair_keys(10_000)}
            want = fair.select(queued, request, running, standings, weights)
            got = store.claim_available(request)
            order = {c.id: i for i, c in enumerate(queued)}
            assert [j.id for j in got] == sorted(want, key=order.__getitem__), (step, want)
            log = rates.RateLimits(windows, now)
            for j in got:
                log.started(j)
            windows = log.windows
            store.finish_if_running([Outcome.succeeded(j.id, None) for j in store.list_jobs(State.RUNNING, 10_000)
                                     if rnd.random() < 0.5], now)


    def test_a_newly_waiting_key_starts_within_one_turn_of_a_backlog(self, store):
        store.submit([fair_job("a") for _ in range(200)], T0)
        _claim_one_by_one(store, 3)
        (b,) = store.submit([fair_job("b")], T0 + 10)
        started = _claim_one_by_one(store, 2, start=T0 + 20)
        assert b.job_id in [j.id for j in started]

    def test_keys_take_turns_while_both_have_work(self, store):
        store.submit([fair_job("a") for _ in range(6)] + [fair_job("b") for _ in range(6)], T0)
        tenants = [j.fair_by for j in _claim_one_by_one(store, 6)]
        assert sorted(tenants[0:2]) == sorted(tenants[2:4]) == sorted(tenants[4:6]) == ["a", "b"]

    def test_weights_share_starts_in_proportion(self, store):
        store.submit([fair_job("a") for _ in range(30)] + [fair_job("b") for _ in range(30)], T0)
        tenants = [j.fair_by for j in _claim_one_by_one(store, 30, Limits(fair={"a": 2.0}))]
        assert (tenants.count("a"), tenants.count("b")) == (20, 10)

    def test_one_claim_of_many_jobs_interleaves_the_keys(self, store):
        store.submit([fair_job("a") for _ in range(10)] + [fair_job("b") for _ in range(10)], T0)
        tenants = [j.fair_by for j in store.claim_available(Request.of(6, now=T0))]
        assert sorted(tenants) == ["a", "a", "a", "b", "b", "b"]

    def test_priority_orders_jobs_within_a_key(self, store):
        low, high, mid = store.submit([fair_job("a", priority=p) for p in (5, 0, 1)], T0)
        started = _claim_one_by_one(store, 3)
        assert [j.id for j in started] == [high.job_id, mid.job_id, low.job_id]

    def test_jobs_without_a_fair_key_share_as_one_key(self, store):
        store.submit([fair_job("a") for _ in range(5)] + [job() for _ in range(5)], T0)
        tenants = [j.fair_by for j in _claim_one_by_one(store, 4)]
        assert sorted(tenants, key=str) == sorted(["a", "a", None, None], key=str)

    def test_a_serial_key_keeps_its_order_across_fair_keys(self, store):
        first, second = store.submit([fair_job("a", key="k"), fair_job("b", key="k")], T0)
        store.submit([fair_job("b") for _ in range(3)], T0)  # b comes first by name only after a
        started = store.claim_available(Request.of(10, now=T0))
        ids = [j.id for j in started]
        assert first.job_id in ids and second.job_id not in ids

    def test_a_concurrency_group_holds_with_fair_keys(self, store):
        store.submit([fair_job(t, concurrency_group="g", concurrency_limit=1) for t in "abab"], T0)
        assert len(store.claim_available(Request.of(10, now=T0))) == 1
        assert store.claim_available(Request.of(10, now=T0 + 1)) == []

    def test_a_held_head_does_not_hold_its_fair_key(self, store):
        # a's first job waits for its group: the next job of a starts in its place.
        store.submit([fair_job("x", concurrency_group="g")], T0)
        store.claim_available(Request.of(1, now=T0))
        held, free = store.submit([fair_job("a", concurrency_group="g"), fair_job("a")], T0 + 1)
        assert [j.id for j in store.claim_available(Request.of(5, now=T0 + 2))] == [free.job_id]

    def test_pools_not_served_are_not_claimed(self, store):
        store.submit([fair_job("a", pool="other"), fair_job("a")], T0)
        started = store.claim_available(Request.of(5, now=T0, pools=["default"]))
        assert [j.pool for j in started] == ["default"]

    def test_a_cancelled_backlog_stops_counting(self, store):
        subs = store.submit([fair_job("a") for _ in range(3)], T0)
        for s in subs:
            store.cancel(s.job_id, T0)
        assert store.claim_available(Request.of(5, now=T0)) == []
        (b,) = store.submit([job()], T0)
        assert [j.id for j in store.claim_available(Request.of(5, now=T0))] == [b.job_id]

    def test_concurrent_claims_start_each_job_once(self, store):
        store.submit([fair_job(t) for t in "abcd" for _ in range(15)], T0)
        started, lock = [], threading.Lock()

        def claim():
            for _ in range(10):
                got = store.claim_available(Request.of(2, now=T0))
                with lock:
                    started.extend(j.id for j in got)

        run_together(claim, claim, claim)
        assert len(started) == len(set(started)) == 60

    def test_enqueues_of_several_keys_and_claims_at_once_all_go_through_and_count_right(self, store):
        # Each enqueue names its keys in another order than the other's and than the claims
        # start them: counting may not take their locks in conflicting orders.
        def enqueue(keys):
            for _ in range(15):
                store.submit([fair_job(k) for k in keys], T0)

        def claim():
            for _ in range(15):
                got = store.claim_available(Request.of(3, now=T0))
                store.finish_if_running([Outcome.succeeded(j.id, None) for j in got], T0)

        run_together(lambda: enqueue("abcd"), lambda: enqueue("dcba"), claim, claim)
        queued = store.list_jobs(State.QUEUED, 10_000)
        waiting = {k.key: k.waiting for k in store.fair_keys(100) if k.key}
        assert waiting == {k: n for k in "abcd" if (n := sum(j.fair_by == k for j in queued))}
