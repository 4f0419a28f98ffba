"""The PostgreSQL store's submit path: ids in the order of the jobs, the count of the waiting
that admission reads (exact, or a recent one standing in), keyed submits without the submit
lock, and batches sent by COPY."""

from __future__ import annotations

import pytest
from helpers import run_together
from store_contract import T0, job

from queickd.core.job import State


def _fill_the_fleet_to(pg_url, n):
    """Another host's store adds n waiting jobs, unseen by pg_store's cached count."""
    from queickd.store.postgres.store import PostgresStore

    other = PostgresStore(pg_url)
    try:
        other.submit([job() for _ in range(n)], T0)
    finally:
        other.close()


def test_far_below_the_cap_a_count_younger_than_its_ttl_stands_in_for_an_exact_one(pg_url, pg_store):
    from queickd.core.policy.admission import Admission, Refusal

    cap = Admission(max_queued=10)
    pg_store.submit_requests([[job()]], T0, cap)  # counts exactly: nothing waits
    _fill_the_fleet_to(pg_url, 9)
    (answer,) = pg_store.submit_requests([[job()]], T0 + 0.5, cap)  # estimate: 0 + the 1 it added
    assert not isinstance(answer, Refusal)


def test_a_count_older_than_its_ttl_is_made_again(pg_url, pg_store):
    from queickd.core.policy.admission import Admission, Refusal

    cap = Admission(max_queued=10)
    pg_store.submit_requests([[job()]], T0, cap)
    _fill_the_fleet_to(pg_url, 9)
    (answer,) = pg_store.submit_requests([[job()]], T0 + 1.5, cap)
    assert isinstance(answer, Refusal) and answer.code == "queue_full"


def test_a_count_made_later_than_now_is_made_again(pg_url, pg_store):
    from queickd.core.policy.admission import Admission, Refusal

    cap = Admission(max_queued=10)
    pg_store.submit_requests([[job()]], T0, cap)
    _fill_the_fleet_to(pg_url, 9)
    (answer,) = pg_store.submit_requests([[job()]], T0 - 5, cap)  # the wall clock went back
    assert isinstance(answer, Refusal) and answer.code == "queue_full"


@pytest.fixture
def exact_counts(monkeypatch):
    """The exact counts of the waiting jobs the store makes (each one records a Counted)."""
    from queickd.store.postgres import submit as pgsubmit

    made = []
    monkeypatch.setattr(pgsubmit, "Counted", lambda *a, _real=pgsubmit.Counted: made.append(a) or _real(*a))
    return made


def test_near_the_cap_a_submit_counts_the_waiting_jobs_once(pg_url, pg_store, exact_counts):
    from queickd.core.policy.admission import Admission, Refusal

    _fill_the_fleet_to(pg_url, 95)
    (answer,) = pg_store.submit_requests([[job() for _ in range(6)]], T0, Admission(max_queued=100))
    assert isinstance(answer, Refusal) and answer.code == "queue_full"
    assert len(exact_counts) == 1  # planned twice (first without the lock), counted once


def test_near_the_cap_an_exact_count_bounds_the_submits_after_it_without_counting_again(
        pg_url, pg_store, exact_counts):
    from queickd.core.policy.admission import Admission, Refusal

    cap = Admission(max_queued=100)
    _fill_the_fleet_to(pg_url, 95)
    answers = [pg_store.submit_requests([[job()]], T0 + t, cap)[0] for t in (0, 0.25, 0.5, 0.75)]
    assert not any(isinstance(a, Refusal) for a in answers)
    assert len(exact_counts) == 1
    assert pg_store.counts()[State.QUEUED] == 99


def test_near_the_cap_the_bound_holds_what_another_host_added_since_the_count(pg_url, pg_store, exact_counts):
    from queickd.core.policy.admission import Admission, Refusal

    cap = Admission(max_queued=100)
    _fill_the_fleet_to(pg_url, 95)
    pg_store.submit_requests([[job()]], T0, cap)  # counts 95: 96 waiting
    _fill_the_fleet_to(pg_url, 3)  # 99
    (answer,) = pg_store.submit_requests([[job(), job()]], T0 + 0.5, cap)
    assert isinstance(answer, Refusal) and answer.code == "queue_full"
    assert len(exact_counts) == 2  # the bound (96 + 3) left no room for two: counted again
    (answer,) = pg_store.submit_requests([[job()]], T0 + 0.6, cap)
    assert not isinstance(answer, Refusal)


def test_a_bound_older_than_its_ttl_is_counted_again(pg_url, pg_store, exact_counts):
    from queickd.core.policy.admission import Admission
    from queickd.store.postgres.submit import _COUNT_TTL

    cap = Admission(max_queued=100)
    _fill_the_fleet_to(pg_url, 95)
    pg_store.submit_requests([[job()]], T0, cap)
    pg_store.submit_requests([[job()]], T0 + _COUNT_TTL + 0.5, cap)
    assert len(exact_counts) == 2


def test_a_lone_submit_keeps_its_cursor_for_the_next_one(pg_store):
    pg_store.submit([job()], T0)
    kept = pg_store._submitter.cursor
    pg_store.submit([job()], T0)
    assert kept is not None and pg_store._submitter.cursor is kept


@pytest.mark.parametrize("large", ["many rows", "large arguments"])
def test_a_large_submit_keeps_no_cursor_holding_its_parameters(pg_store, large):
    pg_store.submit([job()], T0)
    jobs = [job(idempotency_key=f"k{i}") for i in range(20)] if large == "many rows" else [job(args=["x" * 100_000])]
    pg_store.submit(jobs, T0)
    assert pg_store._submitter.cursor is None
    (s,) = pg_store.submit([job()], T0)  # and the next small one keeps one again
    assert pg_store._submitter.cursor is not None and pg_store.get(s.job_id).state == State.QUEUED


def test_the_ids_a_submit_returns_follow_the_order_of_its_jobs(pg_store):
    subs = pg_store.submit([job(args=[i]) for i in range(50)], T0)
    assert [pg_store.get(s.job_id).args for s in subs] == [[i] for i in range(50)]
    assert sorted(s.job_id for s in subs) == [s.job_id for s in subs]


def test_a_submit_the_database_refuses_leaves_the_store_usable(pg_store):
    import psycopg

    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        pg_store.submit([job(priority=2**40)], T0)  # the column is an integer
    (s,) = pg_store.submit([job()], T0)
    assert pg_store.get(s.job_id).state == State.QUEUED


def test_a_keyed_submit_is_stored_without_waiting_for_the_submit_lock(pg_url, pg_store):
    # The client gives every enqueue a key (so a resend is safe): its submit must stay one
    # statement, not a locked transaction that looks the key up first.
    import psycopg

    from queickd.store.postgres.submit import SUBMIT_LOCK

    with psycopg.connect(pg_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (SUBMIT_LOCK,))  # held until the end
        stored = []
        run_together(lambda: stored.extend(pg_store.submit([job(idempotency_key="fresh")], T0)), timeout=10)
        holder.rollback()
    assert not stored[0].duplicate
    assert pg_store.get(stored[0].job_id).idempotency_key == "fresh"


def test_a_request_with_a_held_key_stores_its_new_jobs_once_and_names_the_held_one(pg_store):
    (held,) = pg_store.submit([job(idempotency_key="held")], T0)
    new, again = pg_store.submit([job(idempotency_key="new"), job(idempotency_key="held")], T0 + 1)
    assert (again.job_id, again.duplicate) == (held.job_id, True)
    assert not new.duplicate and new.job_id != held.job_id
    assert pg_store.counts()[State.QUEUED] == 2


def _copied_batch(n: int = 100) -> list:
    from queickd.store.postgres.submit import _COPY_FROM

    assert n >= _COPY_FROM  # sent by COPY, not as one INSERT
    return [job(args=[i, "x"], priority=i % 3, retry=None) for i in range(n)]


def test_a_batch_sent_by_copy_is_stored_in_its_order_with_its_fields(pg_store):
    batch = _copied_batch() + [job(run_at=T0 + 60, kwargs={"k": "v"}, pool="later")] * 64
    stored = pg_store.submit(batch, T0)
    ids = [s.job_id for s in stored]
    assert ids == sorted(ids) and len(set(ids)) == len(batch)
    assert [s.state for s in stored] == [State.QUEUED] * 100 + [State.SCHEDULED] * 64
    first, last = pg_store.get(ids[0]), pg_store.get(ids[-1])
    assert (first.args, first.priority, first.state) == ([0, "x"], 0, State.QUEUED)
    assert (last.kwargs, last.pool, last.run_at, last.state) == ({"k": "v"}, "later", T0 + 60, State.SCHEDULED)


def test_a_batch_sent_by_copy_is_stored_all_or_nothing(pg_store):
    import psycopg

    bad = job(func="m:f\x00")  # PostgreSQL's text cannot hold a NUL: the server refuses the row
    with pytest.raises(psycopg.Error):
        pg_store.submit([*_copied_batch(), bad], T0)
    assert pg_store.counts().get(State.QUEUED, 0) == 0
    assert len(pg_store.submit(_copied_batch(), T0)) == 100  # the connection is usable after


def test_a_batch_sent_by_copy_wakes_the_pools_of_its_queued_jobs_at_commit(pg_store):
    import psycopg

    listener = psycopg.connect(pg_store._dsn, autocommit=True)
    listener.execute("LISTEN queickd_queued")
    pg_store.submit([*_copied_batch(), job(pool="gpu"), job(pool="later", run_at=T0 + 60)], T0)
    assert sorted(n.payload for n in listener.notifies(timeout=1, stop_after=2)) == ["q:default", "q:gpu"]
    assert list(listener.notifies(timeout=0.2)) == []  # the scheduled job's pool is not woken
    listener.close()


@pytest.mark.parametrize("why", ["a cap counted exactly", "an operator's manual run"])
def test_a_batch_that_admission_reads_for_is_sent_by_copy_too(pg_store, monkeypatch, why):
    from queickd.core.policy.admission import NO_LIMITS, Admission
    from queickd.store.postgres.submit import Submitter

    statements = []  # the one-statement inserts made; the spy calls through
    monkeypatch.setattr(Submitter, "_insert",
                        lambda self, *a, _real=Submitter._insert, **k: statements.append(1) or _real(self, *a, **k))
    batch = _copied_batch()
    admission = Admission(max_queued=10_000)  # a fresh store counts the waiting exactly
    if why == "an operator's manual run":
        pg_store.pause("func", "m:f", T0)
        batch.append(job(manual=True))  # it resumes its function's pause, under the submit lock
        admission = NO_LIMITS  # nothing else to read
    (stored,) = pg_store.submit_requests([batch], T0, admission)
    assert statements == []
    ids = [s.job_id for s in stored]
    assert ids == sorted(ids) and len(set(ids)) == len(batch)
    if why == "an operator's manual run":
        assert pg_store.pauses() == []
    assert pg_store.counts()[State.QUEUED] == len(batch)
