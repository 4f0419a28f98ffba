"""Unit tests for core/policy/outbox.py: an event's job, the backoff, refused deliveries."""

from __future__ import annotations

from queickd.core.job import NewJob
from queickd.core.policy import outbox
from queickd.core.policy.admission import Refusal

NOW = 1_750_000_000.0
FULL = Refusal("queue_full", "the queue is full")


def test_the_backoff_doubles_from_one_second():
    assert [outbox.backoff(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_the_backoff_stops_growing_at_its_cap():
    assert outbox.backoff(30) == outbox.BACKOFF_MAX == 60.0


def test_an_event_becomes_a_job_due_now_idempotent_by_its_id():
    j = outbox.job_for("e1", NewJob(func="m:f", args=[1], run_at=0.0, idempotency_key="x"), NOW)
    assert (j.func, j.args, j.run_at, j.idempotency_key) == ("m:f", [1], NOW, "event:e1")


def test_a_refused_delivery_counts_the_attempt_and_waits_the_backoff():
    r = outbox.after_refusal(2, FULL, NOW, 5, lambda n: 10.0 * n)
    assert r == outbox.Refused(3, False, NOW + 30.0, "queue_full: the queue is full")


def test_the_last_refused_attempt_makes_a_dead_letter():
    r = outbox.after_refusal(4, FULL, NOW, 5)
    assert (r.attempts, r.dead, r.next_attempt_at) == (5, True, None)


def test_the_default_backoff_is_the_outbox_backoff():
    assert outbox.after_refusal(0, FULL, NOW, 5).next_attempt_at == NOW + 1.0


def test_a_new_event_with_no_pending_event_of_its_key_is_tried_at_once():
    assert outbox.accepted_at(NOW, None) is None


def test_a_new_event_waits_behind_the_latest_pending_event_of_its_key():
    assert outbox.accepted_at(NOW, NOW + 30) == NOW + 30
    assert outbox.accepted_at(NOW, NOW - 5) == NOW  # that one is due: tried after it, in the same pass


def test_a_refused_event_holds_its_key_until_its_next_attempt():
    order = outbox.KeyOrder()
    until = order.refused("k", outbox.after_refusal(0, FULL, NOW, 5))
    assert until == NOW + 1.0 and order.holds("k") and not order.holds("other") and not order.holds(None)


def test_a_dead_or_keyless_refused_event_holds_nothing():
    order = outbox.KeyOrder()
    assert order.refused("k", outbox.after_refusal(4, FULL, NOW, 5)) is None
    assert order.refused(None, outbox.after_refusal(0, FULL, NOW, 5)) is None
    assert not order.holds("k")
