"""The front door's workflow operations (QueueService mixes them in): start, get, cancel,
list. Validation is core.workflow's and protocol.py's; here a definition named by
reference (a run started by name, a child step naming a workflow) is resolved from the
config file's, every step function is checked against the allowlist, and the pool is
woken for the new jobs. Blocking: called from the transports' threads.
"""

from __future__ import annotations

import copy
from typing import Any

from ..core import arguments, protocol
from ..core import workflow as wf
from ..core.protocol import Code, QueueError
from ..store.contract.workflows import Workflows


class WorkflowOps:
    """Mixed into QueueService, which gives it these:"""

    store: Workflows
    loader: Any
    pool: Any
    clock: Any
    workflows: dict[str, dict[str, Any]]
    workflow_budget: dict[str, int]
    run_waiters: Any

    def resolve_definition(self, definition: dict[str, Any] | None, name: str | None) -> wf.Definition:
        """The definition to run: given inline, or declared under that name; children named
        by a string are declared ones too. bad_request or not_found otherwise; not_allowed
        for a step function outside the allowlist, or a budget a client's definition asks
        above the operator's. Every budget the definition (or a child) does not name is the
        operator's: stored with the run, it holds whatever the operator changes later."""
        if definition is not None:
            wf.model.check_ceiling(definition, self.workflow_budget)
        else:
            if name not in self.workflows:
                raise QueueError(Code.NOT_FOUND, f"no workflow named {name!r} is declared")
            definition = {"name": name, **self.workflows[name]}
        d = self._inline(copy.deepcopy(definition), 0)
        spec = wf.parse(d)
        self._check_funcs(spec)
        return wf.model.with_defaults(spec, self.workflow_budget)

    def _inline(self, d: Any, depth: int) -> Any:
        if depth > wf.model.MAX_DEPTH or not isinstance(d, dict) or not isinstance(d.get("steps"), list):
            return d  # parse() says what is wrong with it
        for step in d["steps"]:
            if isinstance(step, dict) and isinstance(step.get("workflow"), str):
                ref = step["workflow"]
                if ref not in self.workflows:
                    raise QueueError(Code.BAD_REQUEST, f"step {step.get('name')}: no workflow named {ref!r}")
                step["workflow"] = {"name": ref, **copy.deepcopy(self.workflows[ref])}
            if isinstance(step, dict) and isinstance(step.get("workflow"), dict):
                self._inline(step["workflow"], depth + 1)
        return d

    def _check_funcs(self, spec: wf.Definition) -> None:
        for step in spec.steps:
            if step.func is not None:
                self.loader.check(step.func)
            if step.workflow is not None:
                self._check_funcs(step.workflow)

    def start_workflow(self, definition: dict[str, Any] | None, name: str | None, state: dict[str, Any],
                       idempotency_key: str | None = None) -> dict[str, Any]:
        spec = self.resolve_definition(definition, name)
        run, duplicate = self.store.workflow_start(spec, state, self.clock(), idempotency_key)
        self.pool.wake()
        reply = {"ok": True, "run_id": run.id, "state": run.status}
        if duplicate:
            reply["duplicate"] = True
        return reply

    def op_workflow_start(self, req: dict[str, Any]) -> dict[str, Any]:
        return self.start_workflow(*arguments.workflow_start(req))

    def _run(self, run_id: int) -> wf.RunRecord:
        run = self.store.workflow_get(run_id)
        if run is None:
            raise QueueError(Code.NOT_FOUND, f"no workflow run {run_id}")
        return run

    def workflow_state(self, run_id: int) -> str:
        """The run's state (running, succeeded, ...), or not_found: a cheap read."""
        return self._run(run_id).status

    def workflow_status(self, run_id: int) -> dict[str, Any]:
        run = self._run(run_id)
        out = run.to_dict()
        names = [s.name for s in run.spec.steps]
        steps: dict[int, list[dict[str, Any]]] = {}
        for j in self.store.workflow_jobs(run_id):
            steps.setdefault(j.workflow_step, []).append(
                {"job_id": j.id, "item": j.workflow_item, "loop": j.workflow_loop, "state": j.state,
                 "attempts": j.attempts})
        out["steps"] = [{"index": i, "name": n, "jobs": steps.get(i, [])} for i, n in enumerate(names)]
        out["children"] = [{"run_id": r.id, "name": r.name, "state": r.status}
                           for r in self.store.workflow_children(run)]
        return out

    def op_workflow_get(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "run": self.workflow_status(arguments.run_id(req))}

    def op_workflow_cancel(self, req: dict[str, Any]) -> dict[str, Any]:
        run_id = arguments.run_id(req)
        run = self.store.workflow_cancel(run_id, self.clock())
        if run is None:
            raise QueueError(Code.NOT_FOUND, f"no workflow run {run_id}")
        if run.status != wf.RunState.CANCELLED:
            raise QueueError(Code.CONFLICT, f"run {run_id} is {run.status} and cannot be cancelled")
        self.run_waiters.notify_all()
        return {"ok": True, "run": self.workflow_status(run_id)}

    def op_workflows(self, req: dict[str, Any]) -> dict[str, Any]:
        state = req.get("state")
        if state is not None and state not in wf.RunState.ALL:  # the run states are the workflow core's
            raise protocol.bad(f"state must be one of {', '.join(wf.RunState.ALL)}")
        runs = self.store.workflow_list(state, arguments.limit(req))
        return {"ok": True, "runs": [
            {"run_id": r.id, "name": r.name, "state": r.status, "step": r.to_dict()["step"], "root": r.root,
             "created_at": r.created_at, "finished_at": r.finished_at, "reason": r.reason} for r in runs]}
