"""The store contract for what a claim may leave unread (part of StoreContract: every store
runs it): jobs of pools the claimer does not serve, each in a group of its own, and the
jobs of full groups change nothing of what it starts, nor of its order: priority, then
insertion, group limits, keys across pools, pauses."""

from __future__ import annotations

from contract_jobs import T0, job

from queickd.core.job import Outcome
from queickd.core.policy.claim import Request


def _parked(store, n: int = 30) -> list[int]:
    """n jobs in a pool nobody serves here, each in a group of its own."""
    return [s.job_id for s in store.submit([job(pool="unserved", concurrency_group=f"parked-{i}")
                                            for i in range(n)], T0)]


def _fill(store, group: str = "full") -> int:
    """A group of limit 1 whose slot a running job holds; returns that job's id."""
    (sub,) = store.submit([job(concurrency_group=group, concurrency_limit=1)], T0)
    assert [j.id for j in store.claim_available(Request.of(1, pools=["default"], now=T0))] == [sub.job_id]
    return sub.job_id


def _ids(store, limit: int, pools: list[str] | None = ["default"]) -> list[int]:  # noqa: B006 - not mutated
    return [j.id for j in store.claim_available(Request.of(limit, pools=pools, now=T0))]


class ParkedContract:
    def test_jobs_behind_a_full_groups_waiting_job_of_higher_priority_start_in_queue_order(self, store):
        _parked(store)
        _fill(store)
        (waiting,) = store.submit([job(concurrency_group="full", concurrency_limit=1, priority=-10)], T0)
        subs = store.submit([job(priority=p) for p in (5, 0, 5, 0)], T0)
        assert _ids(store, 3) == [subs[1].job_id, subs[3].job_id, subs[0].job_id]
        assert _ids(store, 3) == [subs[2].job_id]
        assert waiting.job_id not in _ids(store, 3)

    def test_a_full_groups_waiting_job_starts_once_its_running_job_finishes(self, store):
        _parked(store)
        running = _fill(store)
        (waiting,) = store.submit([job(concurrency_group="full", concurrency_limit=1, priority=-10)], T0)
        (plain,) = store.submit([job()], T0)
        assert _ids(store, 5) == [plain.job_id]
        store.finish_if_running([Outcome.succeeded(running, None)], T0)
        assert _ids(store, 5) == [waiting.job_id]

    def test_other_groups_start_up_to_their_limits_while_one_is_full(self, store):
        _parked(store)
        _fill(store)
        store.submit([job(concurrency_group="full", concurrency_limit=1, priority=-10)], T0)
        a = store.submit([job(concurrency_group="a", concurrency_limit=2) for _ in range(3)], T0)
        b = store.submit([job(concurrency_group="b", concurrency_limit=1) for _ in range(2)], T0)
        assert _ids(store, 10) == [a[0].job_id, a[1].job_id, b[0].job_id]

    def test_an_unserved_pools_jobs_start_when_a_claim_serves_it(self, store):
        parked = _parked(store, 5)
        _fill(store)
        assert _ids(store, 10) == []
        assert _ids(store, 10, ["unserved"]) == parked
        assert _ids(store, 10, None) == []

    def test_a_keys_head_in_an_unserved_pool_holds_its_later_jobs_in_a_served_one(self, store):
        _parked(store)
        head, behind = store.submit([job(key="k", pool="unserved", priority=-1), job(key="k")], T0)
        (plain,) = store.submit([job()], T0)
        assert _ids(store, 5) == [plain.job_id]
        assert _ids(store, 1, ["unserved"]) == [head.job_id]
        store.finish_if_running([Outcome.succeeded(head.job_id, None)], T0)
        assert _ids(store, 5) == [behind.job_id]

    def test_a_keys_head_in_an_unserved_pool_holds_its_key_past_a_full_group(self, store):
        _parked(store)
        _fill(store)
        store.submit([job(concurrency_group="full", concurrency_limit=1, priority=-10)], T0)
        store.submit([job(key="k", pool="unserved")], T0)
        (behind,) = store.submit([job(key="k", concurrency_group="g")], T0)
        (plain,) = store.submit([job()], T0)
        assert _ids(store, 5) == [plain.job_id]
        assert behind.job_id not in _ids(store, 5)

    def test_a_paused_function_among_parked_jobs_holds_only_its_own_jobs(self, store):
        _parked(store)
        _fill(store)
        store.pause("func", "m:paused", T0)
        store.submit([job(func="m:paused", priority=-5)], T0)
        (plain,) = store.submit([job()], T0)
        assert _ids(store, 5) == [plain.job_id]

    def test_jobs_behind_more_full_groups_jobs_than_the_last_claim_met_start_in_queue_order(self, store):
        _parked(store)
        _fill(store)
        store.submit([job(concurrency_group="full", concurrency_limit=1, priority=-10)], T0)
        plain = [s.job_id for s in store.submit([job() for _ in range(6)], T0)]
        assert _ids(store, 2) == plain[:2]
        assert _ids(store, 2) == plain[2:4]  # the claim after one that met the full group
        store.submit([job(concurrency_group="full", concurrency_limit=1, priority=-10) for _ in range(40)], T0)
        assert _ids(store, 2) == plain[4:]

    def test_a_full_groups_waiting_job_holds_its_key_on_every_claim(self, store):
        _parked(store)
        _fill(store)
        store.submit([job(concurrency_group="full", concurrency_limit=1, priority=-10, key="k")], T0)
        behind, plain = store.submit([job(key="k"), job()], T0)
        assert _ids(store, 5) == [plain.job_id]
        (later,) = store.submit([job()], T0)
        assert _ids(store, 5) == [later.job_id]  # the claim after one that met the full group
        assert behind.job_id not in _ids(store, 5)

    def test_a_group_that_fills_between_claims_is_passed_over(self, store):
        _parked(store)
        _fill(store)
        store.submit([job(concurrency_group="full", concurrency_limit=1, priority=-10)], T0)
        (first,) = store.submit([job()], T0)
        assert _ids(store, 5) == [first.job_id]
        g = store.submit([job(concurrency_group="g", concurrency_limit=1, priority=-5) for _ in range(2)], T0)
        plain = [s.job_id for s in store.submit([job(), job()], T0)]
        assert _ids(store, 5) == [g[0].job_id, *plain]
        (later,) = store.submit([job()], T0)
        assert _ids(store, 5) == [later.job_id]
