"""An enqueue's plan (clientops.enqueue), driven step by step as both clients drive it: what
it sends, when it sends it again, when it pauses and when it gives up. Plans do no I/O, so
these run the real plan with the replies and errors a connection would hand it."""

from __future__ import annotations

from typing import Any

import pytest

from queickd import clientops
from queickd.clientops import Pause
from queickd.clientwire import RequestLostError
from queickd.core.protocol import QueueError


def _plan(block: bool = False, block_timeout: float = 60.0, **options: Any) -> Any:
    return clientops.enqueue("testjobs:noop", (), block, block_timeout, options)


def _refused(code: str, maybe_committed: bool = False, retry_after: float | None = None) -> QueueError:
    reply: dict[str, Any] = {"ok": False, "error": {"code": code, "message": "no", "maybe_committed": maybe_committed}}
    if retry_after is not None:
        reply["retry_after"] = retry_after
    return QueueError.from_reply(reply)


def _returned(plan: Any, reply: dict[str, Any]) -> Any:
    with pytest.raises(StopIteration) as done:
        plan.send(reply)
    return done.value.value


def test_an_enqueue_sends_one_request_with_an_automatic_key_and_returns_the_job_id():
    plan = _plan()
    req = plan.send(None)
    assert req["op"] == "enqueue" and req["func"] == "testjobs:noop"
    assert req["idempotency_key"].startswith("auto:")
    assert _returned(plan, {"ok": True, "job_id": 7}) == 7


def test_a_lost_enqueue_is_resent_twice_with_its_key_after_growing_pauses_then_raises():
    plan = _plan()
    req = plan.send(None)
    lost = RequestLostError("cut")
    assert plan.throw(lost) == Pause(0.5)
    assert plan.send(None) is req
    assert plan.throw(lost) == Pause(1.0)
    assert plan.send(None) is req
    with pytest.raises(RequestLostError):
        plan.throw(lost)


def test_a_lost_enqueue_resent_returns_the_job_the_daemon_answers_with():
    plan = _plan(idempotency_key="order-17")
    req = plan.send(None)
    assert req["idempotency_key"] == "order-17"
    plan.throw(RequestLostError("cut"))
    assert plan.send(None) is req
    assert _returned(plan, {"ok": True, "job_id": 3}) == 3


def test_a_refusal_that_may_have_committed_is_resent_one_that_did_not_is_raised_at_once():
    plan = _plan()
    plan.send(None)
    assert plan.throw(_refused("internal", maybe_committed=True)) == Pause(0.5)
    plan.send(None)
    with pytest.raises(QueueError) as e:
        plan.throw(_refused("bad_request"))
    assert e.value.code == "bad_request"


def test_queue_full_is_raised_unless_blocking():
    plan = _plan()
    plan.send(None)
    with pytest.raises(QueueError) as e:
        plan.throw(_refused("queue_full", retry_after=0.25))
    assert e.value.code == "queue_full"


def test_a_blocking_enqueue_pauses_as_long_as_queue_full_asks_and_sends_again():
    plan = _plan(block=True)
    req = plan.send(None)
    assert plan.throw(_refused("queue_full", retry_after=0.25)) == Pause(0.25)
    assert plan.send(None) is req
    assert _returned(plan, {"ok": True, "job_id": 9}) == 9


def test_a_blocking_enqueue_gets_its_resends_anew_after_a_queue_full_pause():
    plan = _plan(block=True)
    plan.send(None)
    lost = RequestLostError("cut")
    assert [plan.throw(lost), plan.send(None)][0] == Pause(0.5)
    assert [plan.throw(lost), plan.send(None)][0] == Pause(1.0)
    assert [plan.throw(_refused("queue_full", retry_after=0.25)), plan.send(None)][0] == Pause(0.25)
    assert plan.throw(lost) == Pause(0.5)


def test_a_blocking_enqueue_raises_queue_full_once_its_pause_would_pass_block_timeout():
    plan = _plan(block=True, block_timeout=1.0)
    plan.send(None)
    with pytest.raises(QueueError) as e:
        plan.throw(_refused("queue_full", retry_after=5.0))
    assert e.value.code == "queue_full"
