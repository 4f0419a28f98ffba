"""The store contract for an edge daemon's jobs for its upstream (part of StoreContract):
held jobs are stored, never claimed, read oldest first, and change state as forwarding
says."""

from __future__ import annotations

import pytest

from queickd.core.job import NewJob, State
from queickd.core.policy.claim import Request
from queickd.core.policy.forward import forward_key

T0 = 1_700_000_000.0


def _held(store, n: int = 1, **kw):
    return [s.job_id for s in store.submit([NewJob("app:punch", args=[i], held=True, **kw) for i in range(n)], T0)]


class ForwardContract:
    def test_a_held_job_is_stored_held_and_never_claimed(self, store):
        (a,) = _held(store)
        assert store.get(a).state == State.HELD
        assert store.claim_available(Request.of(10, now=T0 + 1)) == []
        assert store.counts()[State.HELD] == 1

    def test_a_held_job_with_a_later_run_at_is_held_too(self, store):
        (a,) = _held(store, run_at=T0 + 60)
        assert store.get(a).state == State.HELD

    def test_held_jobs_are_read_oldest_first_from_after(self, store):
        ids = _held(store, 5)
        assert [j.id for j in store.held_jobs(3)] == ids[:3]
        assert [j.id for j in store.held_jobs(10, after=ids[2])] == ids[3:]

    def test_the_backlog_counts_held_jobs_their_bytes_and_the_oldest(self, store):
        assert store.held_backlog() == (0, 0, None)
        _held(store, 3)
        n, size, oldest = store.held_backlog()
        assert (n, oldest) == (3, T0)
        assert size >= 3 * len("app:punch")

    def test_a_cancelled_held_job_is_never_read_as_held(self, store):
        a, b = _held(store, 2)
        assert store.cancel(a, T0 + 1).state == State.CANCELLED
        assert [j.id for j in store.held_jobs(10)] == [b]
        assert store.mark_forwarded([(a, 9)]) == 0

    def test_a_forwarded_job_keeps_its_upstream_id_and_leaves_the_held(self, store):
        a, b = _held(store, 2)
        assert store.mark_forwarded([(a, 700)]) == 1
        assert (store.get(a).state, store.get(a).upstream_id) == (State.FORWARDED, 700)
        assert [j.id for j in store.held_jobs(10)] == [b]
        assert store.forwarded_jobs(10) == [(a, 700)]
        assert store.mark_forwarded([(a, 701)]) == 0  # no longer held

    def test_marking_a_batch_counts_only_the_jobs_still_held(self, store):
        a, b, c = _held(store, 3)
        store.cancel(b, T0 + 1)
        assert store.mark_forwarded([(a, 1), (b, 2), (c, 3)]) == 2  # the forwarder cancels b upstream

    def test_a_refused_held_job_is_dead_with_the_reason(self, store):
        (a,) = _held(store)
        err = {"type": "not_allowed", "message": "no such function upstream"}
        assert store.refuse_held(a, err, T0 + 1)
        job = store.get(a)
        assert (job.state, job.error, job.finished_at) == (State.DEAD, err, T0 + 1)

    def test_a_forwarded_job_settles_in_its_upstream_final_state(self, store):
        a, b = _held(store, 2)
        store.mark_forwarded([(a, 1), (b, 2)])
        assert store.settle_forwarded(a, State.SUCCEEDED, {"ok": 1}, None, T0 + 5)
        assert store.settle_forwarded(b, State.DEAD, None, {"type": "ValueError", "message": "x"}, T0 + 6)
        assert (store.get(a).state, store.get(a).result) == (State.SUCCEEDED, {"ok": 1})
        assert store.get(b).error["type"] == "ValueError"
        assert not store.settle_forwarded(a, State.DEAD, None, None, T0 + 7)  # settled already

    def test_a_forwarded_job_settles_only_in_a_final_state(self, store):
        (a,) = _held(store)
        store.mark_forwarded([(a, 1)])
        with pytest.raises(ValueError):
            store.settle_forwarded(a, State.RUNNING, None, None, None)

    def test_a_forward_key_outlives_the_idempotency_ttl(self, store):
        from queickd.core.policy.admission import Admission

        key = forward_key("edge-1", 5, T0)
        first = store.submit_requests([[NewJob("app:punch", idempotency_key=key)]], T0, Admission(None, None, 10.0))
        again = store.submit_requests([[NewJob("app:punch", idempotency_key=key)]], T0 + 3600,
                                      Admission(None, None, 10.0))
        assert again[0][0].duplicate and again[0][0].job_id == first[0][0].job_id
