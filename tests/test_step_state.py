"""A step job's run state is added as the job starts (services/step_state.py), not stored
in each fan-out item's job, nor in a task's when it is large: what the job is called with,
and when that cannot be read."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from queickd.core import workflow as wf
from queickd.core.job import State
from queickd.core.policy.claim import Request
from queickd.core.workflow import engine
from queickd.run.loader import FunctionLoader
from queickd.run.thread import ThreadRunner
from queickd.services.job_run import run_job
from queickd.services.step_state import StepState
from queickd.store import open_store

JOBS = str(Path(__file__).parent / "jobs")
T0 = 1_700_000_000.0
FAN = wf.parse({"name": "fan", "steps": [{"name": "f", "kind": "for_each", "items": "xs", "func": "wfsteps:square"}]})


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'q.db'}")
    yield s
    s.close()


def items(store, state):
    store.workflow_start(FAN, state, T0)
    return sorted(store.claim_available(Request.of(50, now=T0)), key=lambda j: j.args[0])


def run(job, arguments):
    outcome, _, _ = run_job(ThreadRunner(FunctionLoader(JOBS)), job, lambda: T0, lambda: False,
                            arguments=arguments)
    return outcome


def test_an_item_changing_its_state_leaves_the_next_items_state_as_it_was(store):
    first, second = items(store, {"xs": [1, 2], "seen": []})
    fanout = StepState(store)
    fanout.complete(first).args[1]["seen"].append("changed by item 1")
    assert fanout.complete(second).args[1] == {"seen": []}


def test_an_item_stored_with_its_state_runs_as_stored(store):
    (item,) = items(store, {"xs": [5]})
    old_style = dataclasses.replace(item, args=[5, {"from": "the job"}])  # as stored before
    fanout = StepState(store)
    assert fanout.complete(old_style) is old_style
    assert fanout.reads == 0


def test_an_item_gets_the_state_without_the_list_fanned_out(store):
    first, second = items(store, {"xs": [1, 2], "factor": 3})
    assert [StepState(store).complete(j).args for j in (first, second)] == [[1, {"factor": 3}], [2, {"factor": 3}]]


def test_a_task_steps_job_is_called_as_stored(store):
    chain = wf.parse({"name": "chain", "steps": [{"name": "a", "func": "wfsteps:noop"}]})
    store.workflow_start(chain, {"x": 1}, T0)
    (step,) = store.claim_available(Request.of(1, now=T0))
    fanout = StepState(store)
    assert fanout.complete(step) is step and step.args == [{"x": 1}]
    assert fanout.reads == 0


def test_a_task_step_over_the_inline_size_gets_the_state_its_job_does_not_store(store):
    chain = wf.parse({"name": "chain", "steps": [{"name": "a", "func": "wfsteps:noop"}]})
    state = {"pad": "x" * (engine.INLINE_STATE_BYTES + 1)}
    store.workflow_start(chain, state, T0)
    (step,) = store.claim_available(Request.of(1, now=T0))
    assert step.args == [None]
    assert StepState(store).complete(step).args == [state]


def test_a_plain_job_is_called_as_stored(store):
    (plain,) = store.submit([__import__("store_contract").job("wfsteps:noop")], T0) and store.claim_available(Request.of(1, now=T0))
    assert StepState(store).complete(plain) is plain


def test_an_item_started_after_its_fan_out_ended_gets_the_runs_state_as_it_is_then(store):
    anyone = wf.parse({"name": "any", "steps": [{"name": "f", "kind": "for_each", "items": "xs",
                                                 "func": "wfsteps:square", "mode": "first_success",
                                                 "result": "found"}]})
    store.workflow_start(anyone, {"xs": [4, 6]}, T0)
    first, second = sorted(store.claim_available(Request.of(2, now=T0)), key=lambda j: j.args[0])
    with store.transaction(bookkeeping=True) as tx:
        tx.finish_if_running([run(first, StepState(store).complete)], T0)
    assert StepState(store).complete(second).args == [6, {"found": 16}]


def test_an_item_runs_with_its_run_state_through_run_job(store):
    (item,) = items(store, {"xs": [7]})
    outcome = run(item, StepState(store).complete)
    assert (outcome.state, outcome.result) == (State.SUCCEEDED, 49)


def test_an_item_whose_run_is_gone_fails_for_good_without_running(store):
    (item,) = items(store, {"xs": [7]})
    orphan = dataclasses.replace(item, workflow_run=item.workflow_run + 1000)
    outcome = run(orphan, StepState(store).complete)
    assert outcome.state == State.DEAD
    assert outcome.error["type"] == "run_gone"


def test_an_item_whose_run_cannot_be_read_is_retried_at_no_cost_of_an_attempt(store, tmp_path):
    (item,) = items(store, {"xs": [7]})
    with sqlite3.connect(tmp_path / "q.db") as damage:  # every read of a run now raises
        damage.execute("DROP TABLE workflow_runs")
    outcome = run(item, StepState(store).complete)
    assert outcome.state == State.SCHEDULED
    assert outcome.error["type"] == "store_unavailable"
    assert outcome.blameless


def test_items_started_together_wait_for_one_read_of_their_run(store, monkeypatch):
    import threading
    import types

    from queickd.services import step_state

    first, *others = items(store, {"xs": [1, 2, 3, 4]})
    waiting = threading.Condition()
    waiters = [0]

    class CountedEvent(threading.Event):  # how many threads wait for the read under way
        def wait(self, timeout=None):
            with waiting:
                waiters[0] += 1
                waiting.notify_all()
            return super().wait(timeout)

    monkeypatch.setattr(step_state, "threading", types.SimpleNamespace(Event=CountedEvent, Lock=threading.Lock))
    entered, release = threading.Event(), threading.Event()

    class HeldFirstRead:  # the store, with its first read held until the others have come
        def workflow_get(self, run_id):
            if not entered.is_set():
                entered.set()
                release.wait(10)
            return store.workflow_get(run_id)

    fanout = StepState(HeldFirstRead())
    got = {}
    threads = [threading.Thread(target=lambda j=j: got.setdefault(j.id, fanout.complete(j))) for j in [first, *others]]
    threads[0].start()
    assert entered.wait(10)
    for t in threads[1:]:
        t.start()
    with waiting:
        all_waited = waiting.wait_for(lambda: waiters[0] == len(others), timeout=10)
    release.set()
    for t in threads:
        t.join(10)
    assert all_waited and fanout.reads == 1
    assert [got[j.id].args for j in [first, *others]] == [[x, {}] for x in (1, 2, 3, 4)]
