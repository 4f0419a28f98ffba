"""Resource control in every store: concurrency groups, cost budgets, patience, skip-not-block,
and the claim's bounded look-ahead (core/policy/claim.py applied by memory, SQLite, PostgreSQL)."""

from __future__ import annotations

import random
import threading

import pytest
from store_contract import T0, job

from queickd.core.job import Outcome, State
from queickd.core.policy import claim
from queickd.core.policy.claim import LOOK_AHEAD, Limits


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "memory":
        from queickd.store import open_store

        s = open_store("memory://")
    elif request.param == "sqlite":
        from queickd.store.sqlite.store import SQLiteStore

        s = SQLiteStore(str(tmp_path / "q.db"))
    else:
        from queickd.store.postgres.store import PostgresStore

        s = PostgresStore(request.getfixturevalue("pg_url"))
    yield s
    s.close()


def grouped(group, limit, **kw):
    return job(**grouped_kw(group, limit), **kw)


def grouped_kw(group, limit):
    return {"concurrency_group": group, "concurrency_limit": limit}


def in_force(store, limits):
    """The budgets of `limits` in force: what a daemon started with them does (PostgreSQL
    keeps them in the store; the others take each claim's)."""
    store.adopt_budgets(limits)
    return limits


def test_a_group_runs_at_most_its_limit_at_once(store):
    store.submit([grouped("api", 2) for _ in range(5)], T0)
    assert len(store.claim_available(claim.Request.of(10, now=T0))) == 2
    assert store.claim_available(claim.Request.of(10, now=T0)) == []


def test_a_full_group_does_not_hold_back_jobs_of_another_group_or_none(store):
    subs = store.submit([grouped("api", 1), grouped("api", 1), grouped("db", 1), job()], T0)
    got = [j.id for j in store.claim_available(claim.Request.of(10, now=T0))]
    assert got == [subs[0].job_id, subs[2].job_id, subs[3].job_id]


def test_a_finished_job_frees_its_group_slot(store):
    store.submit([grouped("api", 1) for _ in range(2)], T0)
    (a,) = store.claim_available(claim.Request.of(5, now=T0))
    assert store.claim_available(claim.Request.of(5, now=T0)) == []
    store.finish_if_running([Outcome(a.id, State.SUCCEEDED)], T0 + 1)
    assert len(store.claim_available(claim.Request.of(5, now=T0 + 1))) == 1


def test_an_orphan_recovered_frees_its_group_slot(store):
    store.submit([grouped("api", 1) for _ in range(2)], T0)
    (a,) = store.claim_available(claim.Request.of(5, now=T0))
    store.recover_orphans(3, T0 + 1)  # nothing registered as its worker: it is an orphan
    (again,) = store.claim_available(claim.Request.of(5, now=T0 + 1))
    assert again.id == a.id  # back at the head of the queue, and the slot is free for it


def test_a_pool_budget_holds_the_running_cost(store):
    store.submit([job(cost_units=5), job(cost_units=5), job(cost_units=5)], T0)
    limits = in_force(store, Limits(pools={"default": 12}))
    assert len(store.claim_available(claim.Request.of(10, limits=limits, now=T0))) == 2
    assert store.claim_available(claim.Request.of(10, limits=limits, now=T0)) == []


def test_a_job_over_the_budget_is_passed_over_for_a_cheaper_one(store):
    subs = store.submit([job(cost_units=8), job(cost_units=8), job(cost_units=2)], T0)
    got = [j.id for j in store.claim_available(claim.Request.of(10, limits=in_force(store, Limits(pools={"default": 12})), now=T0))]
    assert got == [subs[0].job_id, subs[2].job_id]


def test_a_group_budget_counts_only_its_group(store):
    limits = in_force(store, Limits(groups={"openai": 3}))
    subs = store.submit([grouped("openai", 10, cost_units=2), grouped("openai", 10, cost_units=2),
                         job(cost_units=50)], T0)
    got = [j.id for j in store.claim_available(claim.Request.of(10, limits=limits, now=T0))]
    assert got == [subs[0].job_id, subs[2].job_id]


def test_a_patient_job_reserves_its_budget_from_younger_ones(store):
    limits = in_force(store, Limits(pools={"default": 12}, patience=30))
    store.submit([job(cost_units=6)], T0)
    store.claim_available(claim.Request.of(1, limits=limits, now=T0))  # 6 of 12 run
    heavy, light = store.submit([job(cost_units=10), job(cost_units=1)], T0)
    # Not patient yet: the cheap one starts past it.
    assert [j.id for j in store.claim_available(claim.Request.of(5, limits=limits, now=T0 + 10))] == [light.job_id]
    store.submit([job(cost_units=1, run_at=T0 + 20)], T0 + 20)
    # Waited 30 s: it holds the budget, the younger cheap one waits behind it.
    assert store.claim_available(claim.Request.of(5, limits=limits, now=T0 + 31)) == []


def test_a_claim_with_budgets_reads_a_bounded_look_ahead(store):
    limits = in_force(store, Limits(pools={"default": 5}))
    store.submit([job(cost_units=9) for _ in range(LOOK_AHEAD + 64)] + [job()], T0)
    assert store.claim_available(claim.Request.of(1, limits=limits, now=T0)) == []  # the cheap job is past the look-ahead


def test_any_number_of_jobs_of_a_full_group_do_not_hold_back_a_job_behind_them(store):
    store.submit([grouped("api", 1)], T0)
    store.claim_available(claim.Request.of(1, now=T0))  # api is full
    store.submit([grouped("api", 1) for _ in range(LOOK_AHEAD + 64)], T0)
    (plain,) = store.submit([job()], T0)
    # The SQL stores leave full groups out of what they read.
    assert [j.id for j in store.claim_available(claim.Request.of(1, now=T0))] == [plain.job_id]


def test_a_keys_head_waiting_in_a_full_group_holds_its_key_for_the_jobs_behind_it(store):
    store.submit([grouped("api", 1)], T0)
    assert len(store.claim_available(claim.Request.of(1, now=T0))) == 1  # the group's one slot is taken
    # Behind a backlog of the full group longer than any first page a store reads.
    store.submit([grouped("api", 1) for _ in range(40)] + [grouped("api", 1, key="k"), job(key="k"), job()], T0)
    got = store.claim_available(claim.Request.of(10, now=T0 + 2))
    # The key's second job must not overtake its head: only the plain job starts.
    assert [(j.key, j.concurrency_group) for j in got] == [(None, None)]


def test_a_claim_past_full_groups_starts_what_the_selection_policy_picks(store):
    # Read by group past the full ones (SQLite, PostgreSQL), the candidates are still
    # offered in queue order: other groups', ungrouped ones, keys, pools, priorities.
    rnd = random.Random(7)
    groups = [f"g{i}" for i in range(6)]
    limits = [(g, 1 + i % 2) for i, g in enumerate(groups)]  # every job of a group says the same limit
    store.submit([grouped(g, n) for g, n in limits[:4] for _ in range(n)], T0)
    store.claim_available(claim.Request.of(100, now=T0))  # g0..g3 full
    store.submit([job(priority=rnd.choice([0, 0, 1]), run_at=T0 - rnd.choice([0, 0, 1, 2]),
                      pool=rnd.choice(["default", "default", "other"]),
                      **(grouped_kw(*rnd.choice(limits)) if rnd.random() < 0.7
                         else {"key": rnd.choice([None, None, "a", "b"])}))
                  for _ in range(150)], T0)
    for limit, pools in [(3, None), (1, ["default"]), (4, ["other"]), (40, None)] * 2:
        queued = sorted(store.list_jobs(State.QUEUED, 1000), key=lambda j: (j.priority, j.run_at, j.id))
        running = claim.Running.of_jobs([(j.key, j.concurrency_group, None, j.concurrency_limit, j.pool, j.cost_units)
                                         for j in store.list_jobs(State.RUNNING, 1000)])
        want = claim.select(queued, claim.Request.of(limit, True, pools), running)
        assert [j.id for j in store.claim_available(claim.Request.of(limit, pools=pools, now=T0))] == want
        done = [j for j in store.list_jobs(State.RUNNING, 1000) if j.concurrency_group not in groups[:4]]
        store.finish_if_running([Outcome(j.id, State.SUCCEEDED) for j in done[::2]], T0)


def test_a_group_full_at_one_claim_and_free_at_the_next_starts_its_next_job(store):
    first, second = store.submit([grouped("api", 1), grouped("api", 1)], T0)
    (plain,) = store.submit([job()], T0)
    assert [j.id for j in store.claim_available(claim.Request.of(5, now=T0))] == [first.job_id, plain.job_id]
    assert store.claim_available(claim.Request.of(5, now=T0)) == []  # api is full
    store.finish_if_running([Outcome(first.job_id, State.SUCCEEDED)], T0 + 1)
    assert [j.id for j in store.claim_available(claim.Request.of(5, now=T0 + 1))] == [second.job_id]


def test_claims_with_groups_and_budgets_start_what_the_selection_policy_picks(store):
    # Mostly with room (the SQLite store's fast path, claim.plain), at times binding (the
    # selection): either way what the policy picks, claim after claim.
    rnd = random.Random(5)
    groups = [(f"g{i}", 1 + i % 3) for i in range(4)]
    limits = in_force(store, Limits(pools={"default": 9.0}, groups={"g0": 2.0, "g1": 4.0}, patience=5))
    now = T0
    for _ in range(12):
        store.submit([job(cost_units=rnd.choice([None, 0.5, 1.0, 2.0]), run_at=now - rnd.choice([0, 0, 10]),
                          key=rnd.choice([None] * 9 + ["k"]), **(grouped_kw(*rnd.choice(groups)) if rnd.random() < 0.8
                                                                 else {}))
                      for _ in range(rnd.randint(1, 6))], now)
        limit = rnd.randint(1, 5)
        queued = sorted(store.list_jobs(State.QUEUED, 1000), key=lambda j: (j.priority, j.run_at, j.id))
        running = claim.Running.of_jobs([(j.key, j.concurrency_group, None, j.concurrency_limit, j.pool, j.cost_units)
                                         for j in store.list_jobs(State.RUNNING, 1000)])
        want = claim.select(queued, claim.Request.of(limit, True, None, limits, now), running)
        assert [j.id for j in store.claim_available(claim.Request.of(limit, limits=limits, now=now))] == want
        done = store.list_jobs(State.RUNNING, 1000)
        store.finish_if_running([Outcome(j.id, State.SUCCEEDED) for j in done if rnd.random() < 0.6], now)
        now += 1


def test_concurrent_postgres_claimers_never_exceed_a_group_limit(pg_url):
    from queickd.store.postgres.store import PostgresStore

    store = PostgresStore(pg_url)
    store.submit([grouped("api", 3) for _ in range(40)], T0)
    others = [PostgresStore(store._dsn, migrate=False) for _ in range(4)]
    start, lock, claimed = threading.Barrier(4), threading.Lock(), []

    def take(s):
        start.wait()
        for _ in range(10):
            got = s.claim_available(claim.Request.of(3, now=T0))
            with lock:
                claimed.extend(got)

    threads = [threading.Thread(target=take, args=(s,)) for s in others]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert len(claimed) == 3
        assert sorted(j.id for j in claimed) == sorted({j.id for j in claimed})
    finally:
        for s in others:
            s.close()
        store.close()
