"""The pure workflow core: definitions' validation and the transition, driven with plain data."""

from __future__ import annotations

import dataclasses

import pytest

from queickd.core import workflow as wf
from queickd.core.protocol import QueueError
from queickd.core.workflow import engine

T0 = 1_700_000_000.0


def started(*steps, state=None, budget=None):
    spec = wf.parse({"name": "w", "steps": list(steps), "budget": budget or {}})
    run = dataclasses.replace(wf.new_run(spec, state or {}, T0), id=7)
    return wf.begin(run, T0)


@pytest.mark.parametrize("definition, message", [
    ({"name": "w", "steps": [{"name": "a", "kind": "map", "func": "m:f"}]}, "unknown kind"),
    ({"name": "w", "steps": [{"name": "a", "func": "m:f"}, {"name": "a", "func": "m:g"}]}, "duplicate step"),
    ({"name": "w", "steps": [{"name": "a", "func": "m:f", "_next": "nowhere"}]}, "names no step"),
    ({"name": "w", "steps": [{"name": "a", "func": "m:f"}], "budget": {"max_transitions": 0}}, "positive integer"),
    ({"name": "w", "steps": [{"name": "a", "func": "m:f"}], "budget": {"max_transitions": "5"}}, "positive integer"),
    ({"name": "w", "steps": [{"name": "a", "func": "m:f", "priority": "high"}]}, "priority"),
    ({"name": "w", "steps": [{"name": "a", "func": "m:f", "args": [1]}]}, "unknown field"),
    ({"name": "w", "steps": []}, "non-empty"),
    ({"name": "w", "steps": [{"name": "a", "func": "m:f", "x": "y" * 70_000}]}, "65536-byte limit"),
])
def test_a_bad_definition_is_a_bad_request(definition, message):
    with pytest.raises(QueueError, match=message) as e:
        wf.parse(definition)
    assert e.value.code == "bad_request"


def test_a_task_step_over_the_inline_size_stores_its_job_without_the_state():
    plan = started({"name": "a", "func": "m:f"}, state={"pad": "x" * engine.INLINE_STATE_BYTES})
    (job,) = plan.jobs
    assert job.args == [None]


def test_a_fan_out_stores_each_items_job_without_the_state():
    plan = started({"name": "f", "kind": "for_each", "items": "xs", "func": "m:g"}, state={"xs": [1, 2]})
    assert [j.args for j in plan.jobs] == [[1, None], [2, None]]


def test_a_task_step_gets_one_job_with_the_state_and_its_key():
    plan = started({"name": "a", "func": "m:f", "priority": 3}, state={"x": 1})
    (job,) = plan.jobs
    assert (job.func, job.args, job.priority, job.idempotency_key) == ("m:f", [{"x": 1}], 3, "wf:7:0:0")
    assert (job.workflow_run, job.workflow_step, job.workflow_item, job.workflow_loop) == (7, 0, 0, 0)


def test_a_finish_of_another_loop_of_the_step_is_stale():
    plan = started({"name": "a", "func": "m:f"})
    assert wf.transition(plan.run, wf.StepDone(7, 0, 0, 1, True, {}), T0) is None


def test_a_result_merges_into_the_state_and_the_next_step_starts():
    plan = started({"name": "a", "func": "m:f"}, {"name": "b", "func": "m:g"}, state={"x": 1, "y": 2})
    nxt = wf.transition(plan.run, wf.StepDone(7, 0, 0, 0, True, {"y": 3, "z": 4}), T0)
    assert nxt.run.state == {"x": 1, "y": 3, "z": 4} and nxt.run.step == 1
    assert nxt.jobs[0].func == "m:g" and nxt.output.value == {"y": 3, "z": 4}


def test_a_finish_that_could_not_be_applied_fails_the_run_naming_the_step_and_the_error():
    plan = started({"name": "a", "func": "m:f"}, {"name": "b", "func": "m:g"})
    error = {"type": "RecursionError", "message": "too deep"}
    nxt = wf.broken(plan.run, wf.StepDone(7, 0, 0, 0, True, {}), T0, error)
    assert (nxt.run.status, nxt.run.reason["step"], nxt.run.reason["error"]) == (wf.RunState.FAILED, "a", error)
    assert "RecursionError: too deep" in nxt.run.reason["message"]
    assert (nxt.discard, nxt.ended, nxt.output, nxt.jobs) == (True, True, None, [])


def test_a_stale_finish_that_could_not_be_applied_changes_nothing():
    plan = started({"name": "a", "func": "m:f"})
    assert wf.broken(plan.run, wf.StepDone(7, 0, 0, 1, True, {}), T0, {"type": "E", "message": "m"}) is None


def test_next_naming_no_step_at_run_time_fails_the_run_with_the_reason():
    plan = started({"name": "a", "func": "m:f"})
    nxt = wf.transition(plan.run, wf.StepDone(7, 0, 0, 0, True, {"_next": "zz"}), T0)
    assert nxt.run.status == wf.RunState.FAILED and "names no step" in nxt.run.reason["message"]


def test_a_loop_past_max_transitions_names_the_budget_its_limit_and_the_usage():
    plan = started({"name": "a", "func": "m:f"}, budget={"max_transitions": 2})
    plan = wf.transition(plan.run, wf.StepDone(7, 0, 0, 0, True, {"_next": "a"}), T0)
    assert plan.run.loop == 1 and plan.jobs[0].idempotency_key == "wf:7:0:0:1"
    plan = wf.transition(plan.run, wf.StepDone(7, 0, 0, 1, True, {"_next": "a"}), T0)
    assert plan.run.status == wf.RunState.BUDGET_EXCEEDED and plan.jobs == [] and plan.discard
    assert {k: plan.run.reason[k] for k in ("budget", "limit", "usage")} == {
        "budget": "max_transitions", "limit": 2, "usage": 3}


def test_fan_outs_over_empty_lists_that_loop_fail_the_run_naming_the_step():
    plan = started({"name": "a", "func": "m:f"},
                   {"name": "f", "kind": "for_each", "items": "xs", "func": "m:g", "result": "xs", "next": "g"},
                   {"name": "g", "kind": "for_each", "items": "xs", "func": "m:g", "result": "xs", "next": "f"})
    nxt = wf.transition(plan.run, wf.StepDone(7, 0, 0, 0, True, {"xs": []}), T0)
    assert nxt.run.status == wf.RunState.FAILED and nxt.jobs == []
    assert "without any job run in between" in nxt.run.reason["message"] and nxt.run.reason["step"] in ("f", "g")


def test_a_fan_out_over_an_empty_list_that_moves_on_is_no_loop():
    plan = started({"name": "f", "kind": "for_each", "items": "xs", "func": "m:g", "result": "r"},
                   {"name": "b", "func": "m:f"}, state={"xs": []})
    assert plan.run.status == wf.RunState.RUNNING and plan.run.state["r"] == [] and plan.jobs[0].func == "m:f"


def test_five_hundred_fan_outs_over_empty_lists_in_a_row_are_entered_in_one_transition():
    fans = [{"name": f"f{i}", "kind": "for_each", "items": "xs", "func": "m:g", "result": "xs"} for i in range(500)]
    plan = started({"name": "a", "func": "m:f"}, *fans, {"name": "z", "func": "m:z"})
    nxt = wf.transition(plan.run, wf.StepDone(7, 0, 0, 0, True, {"xs": []}), T0)
    assert (nxt.run.status, nxt.run.step, [j.func for j in nxt.jobs]) == (wf.RunState.RUNNING, 501, ["m:z"])
    assert nxt.run.usage["transitions"] == 502 and nxt.run.visits["500"] == 1


def test_a_fan_out_over_its_item_limit_starts_no_job():
    plan = started({"name": "f", "kind": "for_each", "items": "xs", "func": "m:f"}, state={"xs": [1] * 13},
                   budget={"max_for_each_items": 12})
    assert plan.jobs == [] and plan.run.reason["budget"] == "max_for_each_items"


def test_a_state_over_max_state_bytes_at_start_stops_the_run():
    plan = started({"name": "a", "func": "m:f"}, state={"x": "y" * 100}, budget={"max_state_bytes": 50})
    assert plan.run.status == wf.RunState.BUDGET_EXCEEDED and plan.jobs == []


def test_an_all_fan_out_completes_with_results_in_item_order():
    plan = started({"name": "f", "kind": "for_each", "items": "xs", "func": "m:f", "result": "r"},
                   state={"xs": [5, 6, 7]})
    run = plan.run
    recorded = []
    for item in (2, 0):
        p = wf.transition(run, wf.StepDone(7, 0, item, 0, True, item * 10), T0,
                          wf.Lookups(lambda s, lp: list(recorded), lambda: []))
        recorded.append((item, True, item * 10))
        run = p.run
        assert p.run.status == wf.RunState.RUNNING and p.run.progress["ok"] == len(recorded)
    p = wf.transition(run, wf.StepDone(7, 0, 1, 0, True, 10), T0, wf.Lookups(lambda s, lp: list(recorded),
                                                                              lambda: []))
    assert p.run.status == wf.RunState.SUCCEEDED and p.run.state["r"] == [0, 10, 20]


def test_a_cost_budget_counts_every_job_a_step_would_start():
    plan = started({"name": "f", "kind": "for_each", "items": "xs", "func": "m:f"}, state={"xs": [1, 2, 3]},
                   budget={"max_cost_units": 2})
    assert plan.jobs == [] and (plan.run.reason["budget"], plan.run.reason["usage"]) == ("max_cost_units", 3)


def test_a_quorum_that_can_no_longer_be_reached_fails_without_waiting_for_the_rest():
    plan = started({"name": "q", "kind": "for_each", "items": "xs", "func": "m:f", "mode": "quorum", "n": 3},
                   state={"xs": [1, 2, 3, 4]})
    p = wf.transition(plan.run, wf.StepDone(7, 0, 0, 0, False, error={"type": "E"}), T0)
    assert p.run.status == wf.RunState.RUNNING
    p = wf.transition(p.run, wf.StepDone(7, 0, 1, 0, False, error={"type": "E"}), T0)
    assert p.run.status == wf.RunState.FAILED and p.discard and "3 needed" in p.run.reason["message"]
