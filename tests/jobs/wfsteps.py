"""Step functions for the workflow tests: top-level, importable, deterministic."""

from __future__ import annotations

import os
import time

from queickd import workflow_key


def plan(state):
    n = state.get("n", 10)
    return {"tasks": list(range(n)), "planned": True}


FAULTY_STEP = "explode"


def engine_fault(setattr_=setattr):
    """Make the workflow engine raise as it enters a step named FAULTY_STEP, as a bug in it
    would: a transition that raises at run time. `setattr_` is pytest's monkeypatch.setattr
    in process (undone after the test), plain setattr in a daemon that a test then stops."""
    from queickd.core.workflow import engine

    enter = engine._enter

    def faulty(run, index, *args, **kwargs):
        if index < len(run.spec.steps) and run.spec.steps[index].name == FAULTY_STEP:
            raise RuntimeError(f"an engine fault injected at step {FAULTY_STEP}")
        return enter(run, index, *args, **kwargs)

    setattr_(engine, "_enter", faulty)


def held_plan_with_a_faulty_engine(state):
    """held_plan() in a daemon's own process (a thread runner), having broken its engine
    for steps named FAULTY_STEP first: user code in the daemon's process can do that."""
    from queickd.core.workflow import engine

    if getattr(engine._enter, "__name__", "") != "faulty":
        engine_fault()
    return held_plan(state)


def square(item, state):
    return item * item


def times_factor(item, state):
    """An item's result from the run's state, which its job does not store."""
    return item * state["factor"]


def held_plan(state):
    """plan(), once the test's Gate lets it go (see helpers.Gate)."""
    from testjobs import gate

    gate(state["port"], state["token"])
    return plan(state)


def total(state):
    return {"total": sum(state["results"])}


def count_up(state):
    c = state.get("count", 0) + 1
    return {"count": c, "_next": "count"} if c < state.get("until", 1000) else {"count": c}


def grow(state):
    return {"blob": state.get("blob", "") + "x" * 1000}


def noop(state):
    return None


def noop_item(item, state):
    return None


def fail(state):
    raise ValueError("this step fails")


def odd_fails(item, state):
    if item % 2:
        raise ValueError(f"item {item} fails")
    return item


def not_an_object(state):
    return [1, 2]


def key_of_my_job(state):
    return {"key": workflow_key()}


def record_key(item, state):
    """Appends its key and pid to a file (a side effect an at-least-once step would guard
    by its key), working for state["hold"] seconds first."""
    time.sleep(state.get("hold", 0))  # the work itself, so that kills land mid-run
    with open(os.path.join(state["dir"], "keys.log"), "a", encoding="utf-8") as f:
        f.write(f"{workflow_key()} {os.getpid()}\n")
    return item * 2


def mark(state):
    return {"marks": state.get("marks", 0) + 1}


def gated(item, state):
    """Holds until the test's Gate lets it go (see helpers.Gate)."""
    from testjobs import gate

    return gate(state["port"], str(item))


def grow_by(state):
    """Adds a key of state["by"] bytes to the state and comes round again, for ever (a
    result holds at most 64 KiB: the state grows by a new key each pass)."""
    n = state.get("n", 0)
    return {f"blob{n}": "x" * state["by"], "n": n + 1, "_next": "grow_by"}


def big_item(item, state):
    """An item's result of state["by"] bytes."""
    return "x" * state["by"]


def again(state):
    """Back to the fan-out until state["passes"] have run."""
    n = state.get("n", 0) + 1
    return {"n": n, "_next": "fan"} if n < state["passes"] else {"n": n, "fan": None}
