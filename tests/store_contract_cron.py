"""The store contract for crons and events (part of StoreContract: every store runs it):
crons saved, listed, due and fired once per tick, a tick folded into a run still waiting,
and events delivered at once, later from the outbox, or as dead letters retried."""

from __future__ import annotations

from contract_jobs import T0, job

from queickd.core.job import Outcome, State
from queickd.core.policy.admission import Admission
from queickd.core.policy.claim import Request
from queickd.store import CronRecord
from queickd.store.records import NewEvent


class CronEventContract:
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
        fire = store.cron_fire_if_due("c", T0 + 60, T0 + 120, T0 + 61)
        assert fire.outcome == "fired"
        j = store.get(fire.submitted.job_id)
        assert (j.func, j.args, j.cron, j.state) == ("m:tick", [1], "c", State.QUEUED)
        (c,) = store.cron_list()
        assert (c.next_run_at, c.last_fired_at) == (T0 + 120, T0 + 60)

    def test_cron_fire_of_a_tick_already_fired_does_nothing(self, store):
        store.cron_save(self._cron("c", T0 + 60))
        assert store.cron_fire_if_due("c", T0 + 60, T0 + 120, T0 + 61) is not None
        assert store.cron_fire_if_due("c", T0 + 60, T0 + 120, T0 + 61) is None
        assert store.counts()[State.QUEUED] == 1

    def test_cron_move_if_moves_only_the_tick_it_read(self, store):
        store.cron_save(self._cron("c", T0 + 3600))
        assert store.cron_move_if("c", T0 + 3600, T0 + 60)
        assert not store.cron_move_if("c", T0 + 3600, T0 + 120)  # moved (or fired) since
        assert not store.cron_move_if("gone", T0 + 3600, T0 + 60)
        (c,) = store.cron_list()
        assert (c.next_run_at, c.template.func, c.last_fired_at) == (T0 + 60, "m:tick", None)

    # --- cron folding ---------------------------------------------------------------------
    def test_a_tick_while_a_run_waits_is_folded_into_it(self, store):
        store.cron_save(self._cron("c", T0 + 60))
        assert store.cron_fire_if_due("c", T0 + 60, T0 + 120, T0 + 60).outcome == "fired"
        fold = store.cron_fire_if_due("c", T0 + 120, T0 + 180, T0 + 120)
        assert fold.outcome == "folded" and fold.submitted is None
        assert store.cron_list()[0].folded == 1 and store.counts()[State.QUEUED] == 1

    def test_a_run_records_the_last_tick_folded_into_it(self, store):
        store.cron_save(self._cron("c", T0 + 60))
        fired = store.cron_fire_if_due("c", T0 + 60, T0 + 120, T0 + 60).submitted
        assert store.get(fired.job_id).cron_until is None
        store.cron_fire_if_due("c", T0 + 120, T0 + 180, T0 + 120)
        store.cron_fire_if_due("c", T0 + 180, T0 + 240, T0 + 180)
        (run,) = store.claim_available(Request.of(5, now=T0 + 180))
        assert (run.id, run.cron_until) == (fired.job_id, T0 + 180)
        assert store.get(fired.job_id).cron_until == T0 + 180

    def test_a_tick_after_its_run_was_claimed_is_not_recorded_on_it(self, store):
        store.cron_save(self._cron("c", T0 + 60))
        first = store.cron_fire_if_due("c", T0 + 60, T0 + 120, T0 + 60).submitted
        store.claim_available(Request.of(1, now=T0 + 60))
        second = store.cron_fire_if_due("c", T0 + 120, T0 + 180, T0 + 120).submitted
        store.cron_fire_if_due("c", T0 + 180, T0 + 240, T0 + 180)
        assert (store.get(first.job_id).cron_until, store.get(second.job_id).cron_until) == (None, T0 + 180)

    def test_a_tick_while_the_previous_run_is_running_queues_one_run(self, store):
        store.cron_save(self._cron("c", T0 + 60))
        store.cron_fire_if_due("c", T0 + 60, T0 + 120, T0 + 60)
        store.claim_available(Request.of(1, now=T0 + 60))
        assert store.cron_fire_if_due("c", T0 + 120, T0 + 180, T0 + 120).outcome == "fired"
        assert store.cron_fire_if_due("c", T0 + 180, T0 + 240, T0 + 180).outcome == "folded"
        assert store.counts()[State.QUEUED] == 1 and store.counts()[State.RUNNING] == 1

    # --- events ---------------------------------------------------------------------------
    def _event(self, event_id, key="k"):
        return NewEvent(event_id, job(func="m:tap", args=[event_id], key=key))

    def test_an_event_with_room_becomes_a_job_at_once(self, store):
        acc = store.accept_event(self._event("e1"), T0, Admission())
        assert (acc.state, acc.duplicate) == ("delivered", False)
        j = store.get(acc.job_id)
        assert (j.func, j.args, j.idempotency_key) == ("m:tap", ["e1"], "event:e1")

    def test_a_repeated_event_id_is_a_duplicate(self, store):
        first = store.accept_event(self._event("e1"), T0, Admission())
        again = store.accept_event(self._event("e1"), T0, Admission())
        assert again.duplicate and again.job_id == first.job_id
        assert store.counts()[State.QUEUED] == 1

    def test_a_delivered_event_is_forgotten_once_its_job_is_pruned_and_not_before(self, store):
        done = store.accept_event(self._event("e1", key=None), T0, Admission())
        store.accept_event(self._event("e2", key=None), T0, Admission())  # its job still waits
        (j,) = store.claim_available(Request.of(1, now=T0))
        assert j.id == done.job_id
        with store.transaction(bookkeeping=True) as tx:
            tx.finish_if_running([Outcome.succeeded(j.id, None)], T0 + 1)
        assert store.prune_events(T0 + 10, 10) == 0  # its job is still there
        assert store.prune_finished(T0 + 10, 10) == 1
        assert store.prune_events(T0, 10) == 0  # not accepted before that time
        assert store.prune_events(T0 + 10, 10) == 1
        assert [e.event_id for e in store.list_events(None, 10)] == ["e2"]
        again = store.accept_event(self._event("e1", key=None), T0 + 20, Admission())
        assert not again.duplicate and again.job_id != done.job_id  # forgotten with its job

    def test_a_pending_event_is_not_pruned_with_the_delivered(self, store):
        full = Admission(max_queued_per_key=1)
        store.submit([job(key="k")], T0)
        assert store.accept_event(self._event("e1"), T0, full).state == "pending"
        assert store.prune_events(T0 + 10, 10) == 0

    def test_an_event_without_room_waits_in_the_outbox_and_is_delivered_later(self, store):
        full = Admission(max_queued_per_key=1)
        (first,) = store.submit([job(key="k")], T0)
        acc = store.accept_event(self._event("e1"), T0, full)
        assert (acc.state, acc.job_id) == ("pending", None)
        assert store.next_event_at() == T0
        backoff = lambda n: 2.0 ** n  # noqa: E731
        assert [a.state for a in store.deliver_events(T0, full, 5, backoff)] == ["pending"]
        assert store.next_event_at() == T0 + 2
        assert store.deliver_events(T0 + 1, full, 5, backoff) == []  # not due yet
        store.claim_available(Request.of(1, now=T0))
        store.finish_if_running([Outcome.succeeded(first.job_id, None)], T0)
        (done,) = store.deliver_events(T0 + 2, full, 5, backoff)
        assert done.state == "delivered" and store.get(done.job_id).args == ["e1"]
        assert store.next_event_at() is None

    def test_an_undeliverable_event_becomes_a_dead_letter_then_can_be_retried(self, store):
        full = Admission(max_queued=0)
        store.accept_event(self._event("e1"), T0, full)
        for t in range(3):
            store.deliver_events(T0 + 100 * t, full, 3, lambda n: 1.0)
        (ev,) = store.list_events("dead", 10)
        assert ev.attempts == 3 and "queue_full" in ev.last_error
        assert store.retry_event("e1", T0 + 500).state == "pending"
        (done,) = store.deliver_events(T0 + 500, Admission(), 3, lambda n: 1.0)
        assert done.state == "delivered"

    def test_an_event_waits_behind_a_pending_event_of_its_key_even_with_room(self, store):
        store.accept_event(self._event("e1"), T0, Admission(max_queued=0))
        acc = store.accept_event(self._event("e2"), T0 + 1, Admission())
        assert (acc.state, acc.job_id) == ("pending", None) and store.counts()[State.QUEUED] == 0
        first, second = store.deliver_events(T0 + 1, Admission(), 5, lambda n: 1.0)
        assert (first.event_id, second.event_id) == ("e1", "e2") and first.job_id < second.job_id
        assert store.get(first.job_id).args == ["e1"] and store.get(second.job_id).args == ["e2"]

    def test_an_event_of_another_key_does_not_wait(self, store):
        store.accept_event(self._event("e1"), T0, Admission(max_queued=0))
        assert store.accept_event(self._event("o1", key="other"), T0 + 1, Admission()).state == "delivered"

    def test_a_refused_event_holds_the_later_events_of_its_key_for_its_backoff(self, store):
        full = Admission(max_queued=0)
        for event_id, key in (("e1", "k"), ("e2", "k"), ("o1", "other")):
            store.accept_event(self._event(event_id, key=key), T0, full)
        out = store.deliver_events(T0, full, 5, lambda n: 10.0)
        assert [(a.event_id, a.state) for a in out] == [("e1", "pending"), ("o1", "pending")]
        held = {e.event_id: e for e in store.list_events("pending", 10)}["e2"]
        assert (held.attempts, held.next_attempt_at) == (0, T0 + 10)  # not tried: no attempt spent
        assert store.next_event_at() == T0 + 10
        assert [a.event_id for a in store.deliver_events(T0 + 10, Admission(), 5, lambda n: 10.0)] == ["e1", "e2", "o1"]

    def test_an_event_that_becomes_a_dead_letter_no_longer_holds_its_key(self, store):
        full = Admission(max_queued=0)
        store.accept_event(self._event("e1"), T0, full)
        store.accept_event(self._event("e2"), T0, full)
        out = store.deliver_events(T0, full, 1, lambda n: 1.0)
        assert [(a.event_id, a.state) for a in out] == [("e1", "dead"), ("e2", "dead")]
        assert store.accept_event(self._event("e3"), T0 + 1, Admission()).state == "delivered"

    def _delivered(self, store, now):
        out = store.deliver_events(now, Admission(), 5, lambda n: 1.0)
        return [a.event_id for a in sorted((a for a in out if a.state == "delivered"), key=lambda a: a.job_id)]

    def test_a_keys_events_keep_the_order_accepted_when_the_clock_steps_back_between_them(self, store):
        store.accept_event(self._event("A"), T0 + 10, Admission(max_queued=0))
        assert store.accept_event(self._event("B"), T0 + 5, Admission()).state == "pending"  # behind A
        assert self._delivered(store, T0 + 20) == ["A", "B"]

    def test_a_keys_events_accepted_at_the_same_instant_keep_the_order_accepted(self, store):
        store.accept_event(self._event("z-first"), T0, Admission(max_queued=0))
        store.accept_event(self._event("a-second"), T0, Admission())
        assert self._delivered(store, T0 + 1) == ["z-first", "a-second"]

    def test_a_retried_dead_event_goes_before_the_later_events_of_its_key(self, store):
        full = Admission(max_queued=0)
        store.accept_event(self._event("A"), T0, full)
        store.deliver_events(T0, full, 1, lambda n: 5.0)  # A: a dead letter
        store.accept_event(self._event("B"), T0 + 1, full)
        store.deliver_events(T0 + 1, full, 5, lambda n: 5.0)  # B refused: due at T0 + 6
        store.retry_event("A", T0 + 100)  # by hand, long after: B is overdue by then
        assert self._delivered(store, T0 + 100) == ["A", "B"]

    def test_dead_events_retried_together_go_before_the_later_events_of_their_keys(self, store):
        full = Admission(max_queued=0)
        store.accept_event(self._event("A"), T0, full)
        store.deliver_events(T0, full, 1, lambda n: 5.0)
        store.accept_event(self._event("B"), T0 + 1, full)
        store.deliver_events(T0 + 1, full, 5, lambda n: 5.0)
        store.retry_all_dead(T0 + 100)
        assert self._delivered(store, T0 + 100) == ["A", "B"]

    def test_oldest_pending_event_at_is_when_the_oldest_pending_event_was_created(self, store):
        assert store.oldest_pending_event_at() is None
        full = Admission(max_queued=0)
        store.accept_event(self._event("e1"), T0, full)
        store.accept_event(self._event("e2"), T0 + 5, full)
        assert store.oldest_pending_event_at() == T0
        store.deliver_events(T0 + 10, full, 1, lambda n: 1.0)  # both dead: no longer pending
        assert store.oldest_pending_event_at() is None
        store.accept_event(self._event("e3"), T0 + 20, Admission())  # delivered at once
        assert store.oldest_pending_event_at() is None

    def test_a_cron_without_a_key_serializes_its_runs_under_its_own_name(self, store):
        store.cron_save(self._cron("c", T0 + 60))
        fire = store.cron_fire_if_due("c", T0 + 60, T0 + 120, T0 + 60)
        assert store.get(fire.submitted.job_id).key == "cron:c"
