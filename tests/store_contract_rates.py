"""The store contract for rate limits (part of StoreContract: every store runs it): at most
`limit` starts of a rate key per window of `per` seconds, on every claim path, without a
rate-limited job holding back the jobs behind it, with the time its key may start next
known to the claimer, and a key tightened by a run its service refused."""

from __future__ import annotations

import threading

from contract_jobs import T0, job
from helpers import run_together

from queickd.core.job import Outcome, State
from queickd.core.policy.claim import Request


def rated(key: str = "k", limit: int = 1, per: float = 10.0, **kw):
    return job(rate_limit={"key": key, "limit": limit, "per": per}, **kw)


def _ids(jobs) -> list[int]:
    return [j.id for j in jobs]


class RatesContract:
    def test_a_rate_key_starts_at_most_its_limit_per_window(self, store):
        subs = store.submit([rated(limit=2) for _ in range(5)], T0)
        assert _ids(store.claim_available(Request.of(10, now=T0))) == [s.job_id for s in subs[:2]]
        assert store.claim_available(Request.of(10, now=T0 + 9.9)) == []
        assert _ids(store.claim_available(Request.of(10, now=T0 + 10))) == [s.job_id for s in subs[2:4]]

    def test_starts_claimed_while_a_key_is_far_from_its_limit_count_toward_it(self, store):
        subs = store.submit([rated(limit=7) for _ in range(9)] + [job()], T0)
        for i in range(3):  # each claim leaves the key below its limit
            assert _ids(store.claim_available(Request.of(2, now=T0 + i))) == [s.job_id for s in subs[2 * i:2 * i + 2]]
        assert _ids(store.claim_available(Request.of(2, now=T0 + 3))) == [subs[6].job_id, subs[9].job_id]
        assert store.claim_available(Request.of(2, now=T0 + 9.9)) == []
        assert _ids(store.claim_available(Request.of(5, now=T0 + 10))) == [s.job_id for s in subs[7:9]]

    def test_starts_that_left_the_window_make_room_once_the_key_nears_its_limit(self, store):
        # Kept: 3 starts, the limit, of which two left the window; read, they make room for two.
        subs = store.submit([rated(limit=3) for _ in range(5)], T0)
        assert len(store.claim_available(Request.of(2, now=T0))) == 2
        assert len(store.claim_available(Request.of(1, now=T0 + 11))) == 1
        assert _ids(store.claim_available(Request.of(10, now=T0 + 12))) == [s.job_id for s in subs[3:]]

    def test_the_window_slides_from_each_start(self, store):
        subs = store.submit([rated(limit=2) for _ in range(4)], T0)
        store.claim_available(Request.of(1, now=T0))
        store.claim_available(Request.of(1, now=T0 + 6))
        assert store.claim_available(Request.of(10, now=T0 + 9)) == []
        assert _ids(store.claim_available(Request.of(10, now=T0 + 10))) == [subs[2].job_id]
        assert store.claim_available(Request.of(10, now=T0 + 15.5)) == []
        assert _ids(store.claim_available(Request.of(10, now=T0 + 16))) == [subs[3].job_id]

    def test_a_claim_that_fills_a_rate_keys_window_says_when_it_opens(self, store):
        # The claimer's timer. The claims after it may leave the key's jobs unread (the
        # PostgreSQL fast path) until then.
        store.submit([rated(limit=1, per=2.5) for _ in range(2)], T0)
        assert store.claim_available(Request.of(10, now=T0)).rate_at == T0 + 2.5

    def test_a_claim_that_fills_a_window_by_its_count_times_it_from_the_oldest_start(self, store):
        # The key keeps one start (T0) of its limit of two; the claim at T0 + 5 adds the
        # second and meets no job of the key after it: the window opens at T0 + 10, when
        # the start at T0 leaves it, not at T0 + 15.
        store.submit([rated(limit=2) for _ in range(2)], T0)
        store.claim_available(Request.of(1, now=T0))
        got = store.claim_available(Request.of(2, now=T0 + 5))
        assert len(got) == 1
        assert got.rate_at == T0 + 10, (got.rate_at, T0)

    def test_a_job_with_a_lower_limit_than_its_keys_row_starts_once_the_window_opens(self, store):
        # The key's row says limit 10 (its last started jobs') and keeps 3 starts, from T0;
        # a job of the key with limit 3 waits. At T0 + 11 those starts left its window.
        store.submit([rated(limit=10) for _ in range(3)], T0)
        assert len(store.claim_available(Request.of(3, now=T0))) == 3
        (low,) = store.submit([rated(limit=3)], T0 + 1)
        assert store.claim_available(Request.of(1, now=T0 + 5)) == []
        assert _ids(store.claim_available(Request.of(1, now=T0 + 11))) == [low.job_id]

    def test_a_claim_that_fills_a_new_key_takes_the_jobs_behind_its_backlog(self, store):
        # No head-of-line blocking within one claim: the key fills after two, and the
        # claim's room goes to the jobs behind its backlog.
        subs = store.submit([rated(limit=2) for _ in range(4)] + [job(), job()], T0)
        got = _ids(store.claim_available(Request.of(4, now=T0)))
        assert got == [subs[0].job_id, subs[1].job_id, subs[4].job_id, subs[5].job_id], (got, [s.job_id for s in subs])

    def test_a_claim_that_fills_no_window_sets_no_timer(self, store):
        store.submit([rated(limit=3, per=2.5), job()], T0)
        assert store.claim_available(Request.of(10, now=T0)).rate_at is None

    def test_a_rate_limited_job_does_not_hold_back_the_jobs_behind_it(self, store):
        first, held, other_key, plain = store.submit(
            [rated(), rated(), rated(key="other"), job()], T0)
        assert _ids(store.claim_available(Request.of(10, now=T0))) == [first.job_id, other_key.job_id,
                                                                       plain.job_id]
        store.submit([job()], T0)
        assert held.job_id not in _ids(store.claim_available(Request.of(10, now=T0 + 1)))

    def test_a_rate_keys_jobs_start_in_queue_order(self, store):
        subs = store.submit([rated(priority=p) for p in (5, 0, 1)], T0)
        starts = [_ids(store.claim_available(Request.of(10, now=T0 + 10 * i))) for i in range(3)]
        assert starts == [[subs[1].job_id], [subs[2].job_id], [subs[0].job_id]]

    def test_keys_count_apart(self, store):
        a, b = store.submit([rated(key="a"), rated(key="b")], T0)
        assert _ids(store.claim_available(Request.of(10, now=T0))) == [a.job_id, b.job_id]

    def test_a_run_told_to_wait_blocks_its_key_and_keeps_its_place_and_attempt(self, store):
        told, later = store.submit([rated(limit=100, per=1.0), rated(limit=100, per=1.0)], T0)
        (ran,) = store.claim_available(Request.of(1, now=T0))
        err = {"type": "RateLimited", "message": "429"}
        store.finish_if_running([Outcome.rate_limited(ran.id, T0 + 30, err)], T0 + 1, pause_after=1)
        back = store.get(told.job_id)
        assert (back.state, back.attempts, back.run_at) == (State.QUEUED, 0, T0)
        assert store.claim_available(Request.of(10, now=T0 + 29)) == []
        assert store.pauses() == []  # blameless: no streak, no pause
        assert _ids(store.claim_available(Request.of(10, now=T0 + 30))) == [told.job_id, later.job_id]

    def test_a_later_block_is_not_shortened_by_an_earlier_one(self, store):
        a, b = store.submit([rated(limit=100), rated(limit=100)], T0)
        ran = store.claim_available(Request.of(2, now=T0))
        err = {"type": "RateLimited", "message": "429"}
        store.finish_if_running([Outcome.rate_limited(ran[0].id, T0 + 60, err)], T0)
        store.finish_if_running([Outcome.rate_limited(ran[1].id, T0 + 5, err)], T0)
        assert store.claim_available(Request.of(10, now=T0 + 59)) == []
        assert len(store.claim_available(Request.of(10, now=T0 + 60))) == 2

    def test_operators_see_each_keys_limit_use_and_next_start(self, store):
        store.submit([rated(key="slack", limit=2, per=10.0) for _ in range(3)], T0)
        store.claim_available(Request.of(10, now=T0))
        (k,) = store.rate_keys(T0 + 1)
        assert (k.key, k.limit, k.per, k.used, k.next_start, k.blocked_until) == ("slack", 2, 10.0, 2, T0 + 10, None)

    def test_a_rate_key_is_pruned_once_its_window_is_empty_and_not_before(self, store):
        store.submit([rated(key="used", limit=2, per=10.0), rated(key="busy", limit=2, per=10.0)], T0)
        store.claim_available(Request.of(1, now=T0))  # "used" starts at T0
        store.claim_available(Request.of(1, now=T0 + 5))  # "busy" at T0 + 5
        assert store.prune_rate_keys(T0 + 9.9) == 0
        assert store.prune_rate_keys(T0 + 10) == 1
        assert [k.key for k in store.rate_keys(T0 + 10)] == ["busy"]

    def test_a_blocked_rate_key_is_not_pruned_before_its_block_ends(self, store):
        (s,) = store.submit([rated(key="told", limit=100, per=1.0)], T0)
        (ran,) = store.claim_available(Request.of(1, now=T0))
        store.finish_if_running([Outcome.rate_limited(ran.id, T0 + 60, {"type": "RateLimited", "message": "429"})],
                                T0 + 1)
        assert store.prune_rate_keys(T0 + 30) == 0
        assert store.prune_rate_keys(T0 + 60) == 1

    def test_concurrent_claims_start_no_more_than_a_keys_limit(self, store):
        store.submit([rated(limit=5, per=1000.0) for _ in range(40)] + [job() for _ in range(20)], T0)
        started, lock = [], threading.Lock()

        def claim():
            for _ in range(15):
                got = store.claim_available(Request.of(2, now=T0))
                with lock:
                    started.extend(got)

        run_together(*[claim] * 4)
        assert sum(j.rate_limit is not None for j in started) == 5
        assert sum(j.rate_limit is None for j in started) == 20

    def test_a_job_of_a_full_rate_key_still_holds_its_serial_key(self, store):
        store.submit([rated(limit=1, per=100.0)], T0)
        store.claim_available(Request.of(1, now=T0))  # the rate key's window is full
        rl = {"key": "k", "limit": 1, "per": 100.0}
        held, behind, free = store.submit([job(key="s", rate_limit=rl), job(key="s"), job()], T0)
        assert _ids(store.claim_available(Request.of(10, now=T0 + 1))) == [free.job_id]
        assert _ids(store.claim_available(Request.of(10, now=T0 + 100))) == [held.job_id]
        assert store.get(behind.job_id).state == State.QUEUED

    def test_claims_behind_a_full_keys_backlog_take_the_jobs_after_it_and_none_of_it_until_it_opens(self, store):
        subs = store.submit([rated() for _ in range(3)] + [job() for _ in range(3)], T0)
        assert _ids(store.claim_available(Request.of(1, now=T0))) == [subs[0].job_id]  # fills the key
        assert _ids(store.claim_available(Request.of(1, now=T0 + 1))) == [subs[3].job_id]
        assert _ids(store.claim_available(Request.of(5, now=T0 + 2))) == [s.job_id for s in subs[4:]]
        assert store.claim_available(Request.of(5, now=T0 + 9.9)) == []
        assert _ids(store.claim_available(Request.of(5, now=T0 + 10))) == [subs[1].job_id]

    def test_jobs_of_other_keys_enqueued_behind_a_full_keys_backlog_start_at_the_next_claim(self, store):
        # The other keys sort before and after the full one.
        subs = store.submit([rated(key="m") for _ in range(3)] + [job()], T0)
        assert _ids(store.claim_available(Request.of(2, now=T0))) == [subs[0].job_id, subs[3].job_id]
        before, after = store.submit([rated(key="a"), rated(key="z")], T0 + 1)
        assert _ids(store.claim_available(Request.of(1, now=T0 + 1))) == [before.job_id]
        assert _ids(store.claim_available(Request.of(1, now=T0 + 2))) == [after.job_id]

    def test_claims_behind_a_full_keys_backlog_leave_its_serial_key_held_and_a_paused_function_paused(self, store):
        subs = store.submit([rated() for _ in range(2)] + [job()], T0)
        assert _ids(store.claim_available(Request.of(2, now=T0))) == [subs[0].job_id, subs[2].job_id]
        rl = {"key": "k", "limit": 1, "per": 10.0}
        held, behind, free = store.submit([job(key="s", rate_limit=rl), job(key="s"), job(func="m:g")], T0 + 1)
        store.pause("func", "m:g", T0 + 1)
        assert store.claim_available(Request.of(5, now=T0 + 2)) == []
        assert store.resume("func", "m:g")
        assert _ids(store.claim_available(Request.of(5, now=T0 + 3))) == [free.job_id]
        assert store.get(behind.job_id).state == State.QUEUED
