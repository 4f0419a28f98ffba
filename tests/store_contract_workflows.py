"""The store contract for workflow runs (part of StoreContract: every store runs it).

Runs are driven here by a small loop that claims jobs, calls their functions in this
thread and finishes them through the store: the store's own finish advances each run."""

from __future__ import annotations

import importlib

from queickd.core import workflow as wf
from queickd.core.job import NewJob, Outcome, State
from queickd.core.policy.claim import Request
from queickd.run import context
from queickd.services.step_state import StepState

T0 = 1_700_000_000.0
S = "wfsteps:"


def definition(*steps, budget=None, name="wf"):
    return wf.parse({"name": name, "steps": list(steps), "budget": budget or {}})


def run(j):
    """A claimed step job's function called here: its outcome."""
    mod, fn = j.func.split(":")
    tokens = context.set_job(context.CurrentJob(j.id, j.attempts, None, j.idempotency_key))
    try:
        return Outcome.succeeded(j.id, getattr(importlib.import_module(mod), fn)(*j.args), j.workflow_run)
    except Exception as e:
        return Outcome.dead(j.id, {"type": type(e).__name__, "message": str(e)}, j.workflow_run)
    finally:
        context.reset_job(tokens)


def drive(store, now=T0, rounds=10_000, only=None):
    """Run every claimable job until none is left; `only(job)` False leaves a job running.
    A step job stored without its run's state gets it as the worker pool gives it (StepState)."""
    states = StepState(store)
    held = []
    for _ in range(rounds):
        jobs = store.claim_available(Request.of(50, now=now))
        if not jobs:
            break
        outcomes = []
        for j in jobs:
            if only is not None and not only(j):
                held.append(j)
                continue
            outcomes.append(run(states.complete(j)))
        with store.transaction(bookkeeping=True) as tx:
            tx.finish_if_running(outcomes, now)
    return held


THREE_STEPS = ({"name": "plan", "func": S + "plan"},
               {"name": "fan", "kind": "for_each", "items": "tasks", "func": S + "square", "result": "results"},
               {"name": "merge", "func": S + "total"})

# A step the engine raises on entering, once wfsteps.engine_fault() is installed: "plan"'s
# finish enters it, so that finish's transition raises.
FAULTY = ({"name": "plan", "func": S + "plan"}, {"name": "explode", "func": S + "noop"})


def faulty_engine(monkeypatch):
    import wfsteps

    wfsteps.engine_fault(monkeypatch.setattr)


class WorkflowContract:
    def test_workflow_a_three_step_run_with_a_fan_out_of_ten_ends_with_the_expected_state(self, store):
        run, dup = store.workflow_start(definition(*THREE_STEPS), {"n": 10}, T0)
        assert (run.status, dup) == (wf.RunState.RUNNING, False)
        drive(store)
        run = store.workflow_get(run.id)
        assert run.status == wf.RunState.SUCCEEDED
        assert run.state == {"n": 10, "tasks": list(range(10)), "planned": True,
                             "results": [i * i for i in range(10)], "total": 285}
        assert run.usage["transitions"] == 3 and run.usage["cost_units"] == 12

    def test_workflow_a_fan_out_stores_each_item_job_without_the_run_state(self, store):
        big = "x" * 20_000
        d = definition({"name": "fan", "kind": "for_each", "items": "xs", "func": S + "square"})
        run, _ = store.workflow_start(d, {"xs": [1, 2, 3], "big": big}, T0)
        assert sorted(j.args for j in store.workflow_jobs(run.id)) == [[1, None], [2, None], [3, None]]

    def test_workflow_a_fan_out_item_is_called_with_the_run_state_read_once_for_all_items(self, store):
        d = definition({"name": "fan", "kind": "for_each", "items": "xs", "func": S + "square"})
        store.workflow_start(d, {"xs": [1, 2, 3], "big": "x" * 20_000}, T0)
        fanout = StepState(store)
        called = [fanout.complete(j).args for j in store.claim_available(Request.of(10, now=T0))]
        rest = {"big": "x" * 20_000}  # the list fanned out left out: each item has its own
        assert sorted(called, key=lambda a: a[0]) == [[1, rest], [2, rest], [3, rest]]
        assert fanout.reads == 1

    def test_workflow_each_step_output_is_recorded_once_per_step_item_and_loop(self, store):
        run, _ = store.workflow_start(definition(*THREE_STEPS), {"n": 4}, T0)
        drive(store)
        keys = [(o["step"], o["item"], o["loop"]) for o in store.workflow_outputs(run.id)]
        assert keys == [(0, 0, 0), (1, 0, 0), (1, 1, 0), (1, 2, 0), (1, 3, 0), (2, 0, 0)]

    def test_workflow_a_stale_finish_changes_nothing(self, store):
        run, _ = store.workflow_start(definition({"name": "a", "func": S + "mark"}), {}, T0)
        held = drive(store, only=lambda j: False)
        assert len(held) == 1
        store.workflow_cancel(run.id, T0)
        store.finish_if_running([Outcome.succeeded(held[0].id, {"marks": 5}, run.id)], T0)
        after = store.workflow_get(run.id)
        assert (after.status, after.state, store.workflow_outputs(run.id)) == (wf.RunState.CANCELLED, {}, [])

    def test_workflow_a_loop_with_next_stops_at_max_transitions_naming_it(self, store):
        d = definition({"name": "count", "func": S + "count_up"}, budget={"max_transitions": 5})
        run, _ = store.workflow_start(d, {}, T0)
        drive(store)
        run = store.workflow_get(run.id)
        assert run.status == wf.RunState.BUDGET_EXCEEDED
        assert (run.reason["budget"], run.reason["limit"], run.reason["usage"]) == ("max_transitions", 5, 6)
        assert run.state["count"] == 5
        assert [o["loop"] for o in store.workflow_outputs(run.id)] == [0, 1, 2, 3, 4]

    def test_workflow_a_fan_out_over_thirteen_items_with_a_limit_of_twelve_starts_no_item(self, store):
        d = definition({"name": "fan", "kind": "for_each", "items": "xs", "func": S + "square"},
                       budget={"max_for_each_items": 12})
        run, _ = store.workflow_start(d, {"xs": list(range(13))}, T0)
        assert run.status == wf.RunState.BUDGET_EXCEEDED
        assert (run.reason["budget"], run.reason["usage"]) == ("max_for_each_items", 13)
        assert store.workflow_jobs(run.id) == []

    def test_workflow_a_merged_state_over_max_state_bytes_stops_the_run(self, store):
        d = definition({"name": "g1", "func": S + "grow"}, {"name": "g2", "func": S + "grow"},
                       {"name": "g3", "func": S + "grow"}, budget={"max_state_bytes": 2500})
        run, _ = store.workflow_start(d, {}, T0)
        drive(store)
        run = store.workflow_get(run.id)
        assert (run.status, run.reason["budget"], run.step) == (wf.RunState.BUDGET_EXCEEDED, "max_state_bytes", 2)

    def test_workflow_cost_units_summed_over_steps_and_items_stop_the_run(self, store):
        d = definition({"name": "a", "func": S + "noop"},
                       {"name": "fan", "kind": "for_each", "items": "xs", "func": S + "noop_item"},
                       {"name": "b", "func": S + "noop"}, budget={"max_cost_units": 4})
        run, _ = store.workflow_start(d, {"xs": [1, 2, 3]}, T0)
        drive(store)
        run = store.workflow_get(run.id)
        assert (run.status, run.reason["budget"], run.reason["usage"]) == (
            wf.RunState.BUDGET_EXCEEDED, "max_cost_units", 5)
        assert len(store.workflow_jobs(run.id)) == 4

    def test_workflow_child_runs_count_grandchildren_against_max_started_workflows(self, store):
        grandchild = {"name": "gc", "steps": [{"name": "m", "func": S + "mark"}]}
        child = {"name": "c", "steps": [{"name": "m", "func": S + "mark"}, {"name": "gc", "workflow": grandchild}]}
        d = definition({"name": "c1", "workflow": child}, {"name": "c2", "workflow": child},
                       budget={"max_started_workflows": 3})
        run, _ = store.workflow_start(d, {}, T0)
        drive(store)
        run = store.workflow_get(run.id)
        # c1 and its grandchild are 2; c2 is 3; c2's grandchild would be 4
        assert (run.status, run.reason["budget"], run.reason["usage"]) == (
            wf.RunState.BUDGET_EXCEEDED, "max_started_workflows", 4)
        assert run.state["c1"] == {"marks": 1, "gc": {"marks": 2}}
        kids = [r for r in store.workflow_list(None, 100) if r.root == run.id]
        assert sorted(r.status for r in kids) == ["cancelled", "succeeded", "succeeded"]
        assert [c.name for c in store.workflow_children(run)] == ["c", "c"]

    def test_workflow_first_success_finishes_at_the_first_success_and_discards_the_rest(self, store):
        d = definition({"name": "any", "kind": "for_each", "items": "xs", "func": S + "odd_fails",
                        "mode": "first_success", "result": "found"})
        run, _ = store.workflow_start(d, {"xs": [1, 3, 4, 6, 8]}, T0)
        drive(store, only=lambda j: j.args[0] != 6)  # 6 still running when 4 succeeds
        run = store.workflow_get(run.id)
        assert (run.status, run.state["found"]) == (wf.RunState.SUCCEEDED, 4)
        states = {j.args[0]: j.state for j in store.workflow_jobs(run.id)}
        assert states[8] in (State.CANCELLED, State.SUCCEEDED) and states[6] == State.RUNNING

    def test_workflow_quorum_finishes_when_n_items_succeed(self, store):
        d = definition({"name": "q", "kind": "for_each", "items": "xs", "func": S + "odd_fails",
                        "mode": "quorum", "n": 2, "result": "got"})
        run, _ = store.workflow_start(d, {"xs": [0, 1, 2, 4, 6]}, T0)
        drive(store)
        run = store.workflow_get(run.id)
        assert run.status == wf.RunState.SUCCEEDED and len(run.state["got"]) == 2

    def test_workflow_a_failed_step_fails_the_run_naming_the_step(self, store):
        run, _ = store.workflow_start(definition({"name": "boom", "func": S + "fail"}), {}, T0)
        drive(store)
        run = store.workflow_get(run.id)
        assert (run.status, run.reason["step"]) == (wf.RunState.FAILED, "boom")

    def test_workflow_items_that_are_not_a_list_fail_the_run_with_the_reason(self, store):
        d = definition({"name": "fan", "kind": "for_each", "items": "xs", "func": S + "square"})
        run, _ = store.workflow_start(d, {"xs": "nope"}, T0)
        assert run.status == wf.RunState.FAILED and "not a list" in run.reason["message"]

    def test_workflow_start_with_a_known_idempotency_key_answers_the_same_run(self, store):
        a, _ = store.workflow_start(definition(*THREE_STEPS), {}, T0, idempotency_key="k1")
        b, dup = store.workflow_start(definition(*THREE_STEPS), {}, T0, idempotency_key="k1")
        assert (b.id, dup) == (a.id, True)

    def test_workflow_step_jobs_carry_the_key_wf_run_step_item_loop(self, store):
        d = definition({"name": "k", "func": S + "key_of_my_job"})
        run, _ = store.workflow_start(d, {}, T0)
        drive(store)
        assert store.workflow_get(run.id).state["key"] == f"wf:{run.id}:0:0"

    def test_workflow_counts_show_runs_by_state_and_budget_stops_by_budget(self, store):
        store.workflow_start(definition({"name": "fan", "kind": "for_each", "items": "xs", "func": S + "square"},
                                        budget={"max_for_each_items": 1}), {"xs": [1, 2]}, T0)
        store.workflow_start(definition(*THREE_STEPS), {}, T0)
        c = store.workflow_counts()
        assert (c["runs"]["budget_exceeded"], c["runs"]["running"], c["budget_stops"]) == (
            1, 1, {"max_for_each_items": 1})

    def test_workflow_a_step_job_orphaned_too_often_fails_its_run_naming_the_step(self, store):
        run, _ = store.workflow_start(definition({"name": "lost", "func": S + "mark"}), {}, T0)
        for _ in range(2):
            assert store.claim_available(Request.of(10, now=T0))
            store.recover_orphans(1, T0)
        run = store.workflow_get(run.id)
        assert (run.status, run.reason["step"], run.reason["error"]["type"]) == (
            wf.RunState.FAILED, "lost", "orphaned")

    def test_workflow_an_operator_cancelling_a_step_job_fails_the_run_naming_the_step(self, store):
        run, _ = store.workflow_start(definition({"name": "wait", "func": S + "mark"}), {}, T0)
        (job,) = store.workflow_jobs(run.id)
        assert store.cancel(job.id, T0).state == State.CANCELLED
        run = store.workflow_get(run.id)
        assert (run.status, run.reason["step"], run.reason["error"]["type"]) == (
            wf.RunState.FAILED, "wait", "cancelled")

    def test_workflow_an_operator_cancelling_a_running_step_job_fails_the_run_naming_the_step(self, store):
        run, _ = store.workflow_start(definition({"name": "long", "func": S + "mark"}), {}, T0)
        (job,) = drive(store, only=lambda j: False)
        assert store.cancel_running(job.id, T0).state == State.CANCELLED
        after = store.workflow_get(run.id)
        assert (after.status, after.reason["step"], after.reason["error"]["type"]) == (
            wf.RunState.FAILED, "long", "cancelled")
        with store.transaction(bookkeeping=True) as tx:  # the function returns after all: discarded
            assert tx.finish_if_running([Outcome.succeeded(job.id, {"marks": 1}, run.id)], T0).changed == 0
        assert store.workflow_get(run.id).status == wf.RunState.FAILED

    def test_workflow_a_bulk_cancel_of_waiting_step_jobs_fails_each_of_their_runs(self, store):
        runs = [store.workflow_start(definition({"name": "wait", "func": S + "mark"}), {}, T0)[0] for _ in range(2)]
        (plain,) = (s.job_id for s in store.submit([NewJob(S + "mark", [], {}, 0, T0)], T0))
        cancelled = store.cancel_waiting(State.QUEUED, T0, func=S + "mark")
        assert sorted(cancelled) == sorted([plain] + [store.workflow_jobs(r.id)[0].id for r in runs])
        for r in runs:
            after = store.workflow_get(r.id)
            assert (after.status, after.reason["step"], after.reason["error"]["type"]) == (
                wf.RunState.FAILED, "wait", "cancelled")

    def test_workflow_a_middle_run_stopped_by_its_budget_ends_its_parents_step(self, store):
        # The grandchild starting a child takes the middle run past its budget: the middle
        # run stops, and the root, waiting on it, fails with it instead of waiting forever.
        leaf = {"name": "leaf", "steps": [{"name": "t", "func": S + "mark"}]}
        lower = {"name": "lower", "steps": [{"name": "leaf", "workflow": leaf}]}
        middle = {"name": "middle", "steps": [{"name": "lower", "workflow": lower}],
                  "budget": {"max_started_workflows": 1}}
        root, _ = store.workflow_start(definition({"name": "middle", "workflow": middle}), {}, T0)
        drive(store)
        (mid,) = store.workflow_children(store.workflow_get(root.id))
        assert (mid.status, mid.reason["budget"]) == (wf.RunState.BUDGET_EXCEEDED, "max_started_workflows")
        root = store.workflow_get(root.id)
        assert (root.status, root.reason["step"], root.reason["error"]["state"]) == (
            wf.RunState.FAILED, "middle", wf.RunState.BUDGET_EXCEEDED)
        assert not [r for r in store.workflow_list(None, 10) if r.status == wf.RunState.RUNNING]

    def test_workflow_a_finish_whose_transition_raises_fails_its_run_and_not_the_rest_of_the_batch(
            self, store, monkeypatch):
        faulty_engine(monkeypatch)
        good = [store.workflow_start(definition(*THREE_STEPS), {"n": 3}, T0)[0] for _ in range(2)]
        bad, _ = store.workflow_start(definition(*FAULTY), {"n": 0}, T0)
        jobs = store.claim_available(Request.of(10, now=T0))
        assert len(jobs) == 3
        with store.transaction(bookkeeping=True) as tx:
            assert tx.finish_if_running([run(j) for j in jobs], T0).changed == 3
        failed = store.workflow_get(bad.id)
        assert (failed.status, failed.reason["step"], failed.reason["error"]["type"]) == (
            wf.RunState.FAILED, "plan", "RuntimeError")
        assert [j.state for j in store.workflow_jobs(bad.id)] == [State.SUCCEEDED]
        assert [store.workflow_get(r.id).step for r in good] == [1, 1]
        drive(store)
        assert [(store.workflow_get(r.id).status, store.workflow_get(r.id).state["total"]) for r in good] == [
            (wf.RunState.SUCCEEDED, 5)] * 2

    def test_workflow_a_child_whose_transition_raises_fails_and_its_parent_step_fails_with_it(
            self, store, monkeypatch):
        faulty_engine(monkeypatch)
        parent, _ = store.workflow_start(definition({"name": "kid", "workflow": {"name": "c", "steps": list(FAULTY)}}),
                                         {"n": 0}, T0)
        drive(store)
        parent = store.workflow_get(parent.id)
        (child,) = store.workflow_children(parent)
        assert (child.status, child.reason["step"]) == (wf.RunState.FAILED, "plan")
        assert (parent.status, parent.reason["step"], parent.reason["error"]["state"]) == (
            wf.RunState.FAILED, "kid", wf.RunState.FAILED)

    def test_workflow_what_a_transition_wrote_before_it_raised_is_undone_and_its_run_fails(
            self, store, monkeypatch):
        # plan's finish records its output, moves the run on and inserts the child, whose
        # begin then raises: none of it may stay.
        faulty_engine(monkeypatch)
        kid = {"name": "kid", "workflow": {"name": "c", "steps": list(FAULTY[1:])}}
        run, _ = store.workflow_start(definition(FAULTY[0], kid), {"n": 0}, T0)
        drive(store)
        run = store.workflow_get(run.id)
        assert (run.status, run.step, run.reason["step"]) == (wf.RunState.FAILED, 0, "plan")
        assert (store.workflow_children(run), store.workflow_outputs(run.id)) == ([], [])
        assert [r.id for r in store.workflow_list(None, 10)] == [run.id]

    def test_workflow_a_fan_out_waits_under_the_queue_cap_and_completes(self, store):
        store.queue_cap = 10  # --max-queued
        fan = definition({"name": "fan", "kind": "for_each", "items": "xs", "func": S + "square"})
        started, _ = store.workflow_start(fan, {"xs": list(range(45))}, T0)
        states, most = StepState(store), 0
        while True:
            most = max(most, sum(store.counts()[s] for s in State.PENDING))
            jobs = store.claim_available(Request.of(3, now=T0))
            if not jobs:
                break
            with store.transaction(bookkeeping=True) as tx:
                tx.finish_if_running([run(states.complete(j)) for j in jobs], T0)
        done = store.workflow_get(started.id)
        assert (done.status, done.state["fan"]) == (wf.RunState.SUCCEEDED, [x * x for x in range(45)])
        assert most == 10  # enqueued as room came, never past the cap

    def test_workflow_a_fan_out_with_no_room_and_nothing_of_it_waiting_ends_queue_full(self, store):
        store.queue_cap = 3
        store.submit([NewJob(func=S + "noop", run_at=T0) for _ in range(3)], T0)
        fan = definition({"name": "fan", "kind": "for_each", "items": "xs", "func": S + "square"})
        started, _ = store.workflow_start(fan, {"xs": [1, 2]}, T0)
        assert (started.status, started.reason["code"]) == (wf.RunState.FAILED, "queue_full")
        assert store.workflow_jobs(started.id) == []
