"""Durable workflows, the pure part: definitions (model.py) and run transitions
(transition.py). No I/O; the stores apply the plans (store/workflows.py)."""

from .engine import (
    Lookups,
    Output,
    Plan,
    RunRecord,
    RunState,
    StepDone,
    begin,
    cancel,
    child_done,
    new_run,
    step_key,
    transition,
)
from .model import Definition, Step, parse, state_size

__all__ = ["Definition", "Lookups", "Output", "Plan", "RunRecord", "RunState", "Step", "StepDone", "begin",
           "cancel", "child_done", "new_run", "parse", "state_size", "step_key", "transition"]
