"""Durable workflows, the pure part: definitions (model.py) and run transitions
(engine.py). No I/O; the stores apply the plans (store/workflows.py)."""

from .engine import (
    Lookups,
    Output,
    Plan,
    RunRecord,
    RunState,
    StepDone,
    begin,
    broken,
    cancel,
    child_done,
    current,
    new_run,
    step_key,
    transition,
)
from .model import Definition, Step, parse, state_size

__all__ = ["Definition", "Lookups", "Output", "Plan", "RunRecord", "RunState", "Step", "StepDone", "begin",
           "broken", "cancel", "child_done", "current", "new_run", "parse", "state_size", "step_key", "transition"]
