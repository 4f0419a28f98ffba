"""The Python client's workflow builder: `JobQueue.workflow(name)` returns one.

    run_id = (q.workflow("research_run").then(plan).for_each("tasks", research, "results")
              .then(merge).budget(max_transitions=20, max_cost_units=40).start(state={...}))

Each method adds a step or sets the budget and returns the builder; start() sends
`workflow_start`. A step function is a callable (a top-level function of an importable
module) or "module:func"; any job field (retry, key, pool, priority, ...) is a keyword of
the step. Builds plain JSON only; validation is the daemon's. Not thread-safe (build one
per thread); no standard-library import beyond what the client uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .clientops import workflow_start

FuncLike = Callable[..., Any] | str


class WorkflowBuilder:
    def __init__(self, queue: Any, name: str, func_name: Callable[[FuncLike], str]) -> None:
        self._q = queue
        self.name = name
        self._func_name = func_name  # the client's: a callable as "module:func"
        self.steps: list[dict[str, Any]] = []
        self._budget: dict[str, int] = {}

    def _name(self, given: str | None, func: FuncLike | None, kind: str) -> str:
        base = given or (func.rsplit(":", 1)[-1].rsplit(".", 1)[-1] if isinstance(func, str)
                         else getattr(func, "__name__", kind))
        if given is not None:
            return given
        taken = {s["name"] for s in self.steps}
        name, n = base, 1
        while name in taken:  # the same function twice: plan, plan_2, ...
            n += 1
            name = f"{base}_{n}"
        return name

    def _add(self, step: dict[str, Any], fields: dict[str, Any]) -> WorkflowBuilder:
        if "retry" in fields and hasattr(fields["retry"], "to_dict"):
            fields["retry"] = fields["retry"].to_dict()
        self.steps.append({**step, **{k: v for k, v in fields.items() if v is not None}})
        return self

    def then(self, func: FuncLike, *, name: str | None = None, next: str | None = None,
             on_failure: str | None = None, **job_fields: Any) -> WorkflowBuilder:
        """A task step: func(state) returns an object merged into the state (`_next` in it
        names the step to run next)."""
        return self._add({"name": self._name(name, func, "task"), "kind": "task", "func": self._func_name(func),
                          "next": next, "on_failure": on_failure}, job_fields)

    def for_each(self, items: str, func: FuncLike, result: str | None = None, *, name: str | None = None,
                 mode: str | None = None, n: int | None = None, on_failure: str | None = None,
                 **job_fields: Any) -> WorkflowBuilder:
        """A fan-out: func(item, state) for each item of the state's list `items`; the results,
        in item order, go to the state key `result` (default: the step's name)."""
        name = self._name(name, func, "for_each")
        return self._add({"name": name, "kind": "for_each", "items": items, "func": self._func_name(func),
                          "result": result, "mode": mode, "n": n, "on_failure": on_failure}, job_fields)

    def child(self, workflow: WorkflowBuilder | dict[str, Any] | str, result: str | None = None, *,
              name: str | None = None, input: str | None = None, on_failure: str | None = None) -> WorkflowBuilder:
        """A child workflow (a builder, a definition, or the name of a declared one) started
        with the state (or the object under `input`); its final state goes to `result`."""
        d = workflow.definition() if isinstance(workflow, WorkflowBuilder) else workflow
        child_name = d if isinstance(d, str) else d.get("name", "workflow")
        return self._add({"name": name or self._name(None, child_name, "workflow"), "kind": "workflow",
                          "workflow": d, "result": result, "input": input, "on_failure": on_failure}, {})

    def budget(self, **limits: int) -> WorkflowBuilder:
        """max_transitions, max_for_each_items, max_state_bytes, max_cost_units, max_started_workflows."""
        self._budget.update(limits)
        return self

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "steps": [{k: v for k, v in s.items() if v is not None} for s in self.steps],
                "budget": self._budget}

    def start(self, state: dict[str, Any] | None = None, idempotency_key: str | None = None) -> Any:
        """Start a run; returns its id (from an AsyncJobQueue's builder: a coroutine to await
        for it). With no steps, starts the workflow of this name that the daemon's config
        file declares."""
        return self._q._run(workflow_start(self.definition() if self.steps else None, self.name, state,
                                           idempotency_key))
