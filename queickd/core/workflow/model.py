"""Workflow definitions: their model and their validation (at start, before anything is stored).

A definition is a name, an ordered list of steps and a budget. A step is a `task` (one job
called with the run's state), a `for_each` (one job per item of a list in the state) or a
`workflow` (a child run, inline). Steps carry the job fields any job takes, copied to their
jobs. This module owns what a valid definition is and its normal (wire) form; it does no
I/O, knows nothing of stores and never resolves a child named by reference (the service
does that before calling `parse`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from .. import fields
from ..protocol import MAX_ID, Code, QueueError, bad, normalize_func, parse_job, ranged

MAX_DEFINITION_BYTES = 64 * 1024
MAX_NAME = 200
MAX_DEPTH = 8  # child workflows inline in one another
KINDS = ("task", "for_each", "workflow")
MODES = ("all", "first_success", "quorum")
BUDGETS = ("max_transitions", "max_for_each_items", "max_state_bytes", "max_cost_units",
           "max_started_workflows")
# The budgets a run has when neither its definition nor the operator names them: what a Pi
# affords and a real workflow rarely meets. A self-jumping step, a state grown each pass or
# a runaway fan-out stops here rather than filling the store and the daemon's memory.
# max_cost_units has none: every job costs 1 unless it says otherwise, so the others bound it.
DEFAULT_BUDGET = {"max_transitions": 10_000, "max_for_each_items": 10_000, "max_state_bytes": 1024 * 1024,
                  "max_started_workflows": 100}
# Job fields a step may not set: the run decides them (args carry the state, the idempotency
# key is wf:RUN:STEP:ITEM[:LOOP]), or they make no sense for a step (an operator's run).
_RESERVED = frozenset({"func", "args", "kwargs", "idempotency_key", "run_at", "manual"})
JOB_WIRE = frozenset(fields.ENQUEUE_WIRE) - _RESERVED  # a step's job fields, generically
_STEP_KEYS = frozenset({"name", "kind", "func", "items", "result", "mode", "n", "workflow", "input",
                        "next", "_next", "on_failure"}) | JOB_WIRE


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    kind: str
    func: str | None = None  # task, for_each
    items: str | None = None  # for_each: the state key of the list
    result: str | None = None  # for_each, workflow: the state key of the result
    mode: str = "all"
    n: int = 1  # quorum
    workflow: Definition | None = None  # the child (inline)
    input: str | None = None  # workflow: the state key of the child's state; None: the whole state
    next: str | None = None  # the step after this one, unless the result names one
    on_failure: str = "fail"  # or "continue"
    job: dict[str, Any] = field(default_factory=dict)  # job fields (wire names) for its jobs

    @property
    def cost(self) -> int:
        """Its jobs' cost: their cost_units when a whole number, else 1."""
        v = self.job.get("cost_units")
        return v if isinstance(v, int) and v >= 0 else 1


@dataclass(frozen=True, slots=True)
class Definition:
    name: str
    steps: tuple[Step, ...]
    budget: dict[str, int]
    wire: dict[str, Any]  # the normal form, as stored and as a child carries it

    def index(self, name: str) -> int | None:
        return next((i for i, s in enumerate(self.steps) if s.name == name), None)


def _positive(name: str, v: Any) -> int:
    # A count or a size: one that fits a bigint, as the stores keep it.
    return ranged(name, v, 1, MAX_ID, integer=True, message=f"{name} must be a positive integer (at most {MAX_ID})")


def _name(what: str, v: Any) -> str:
    if not isinstance(v, str) or not v or len(v) > MAX_NAME:
        raise bad(f"{what} must be a non-empty string of at most {MAX_NAME} characters")
    return v


def parse_budget(v: Any) -> dict[str, int]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise bad("budget must be an object")
    unknown = set(v) - set(BUDGETS)
    if unknown:
        raise bad(f"unknown budget(s): {', '.join(sorted(unknown))} (budgets: {', '.join(BUDGETS)})")
    return {k: _positive(f"budget {k}", v[k]) for k in BUDGETS if k in v and v[k] is not None}


def check_ceiling(d: Any, ceiling: dict[str, int], depth: int = 0) -> None:
    """Refuse (not_allowed) a definition, or a child inline in it, that names a budget above
    the operator's (`ceiling`): a client may lower a budget, never raise it. Children named
    by reference are the operator's own and not looked at; what is malformed is left to
    `parse` to say."""
    if not isinstance(d, dict) or depth > MAX_DEPTH:
        return
    budget = d.get("budget")
    if isinstance(budget, dict):
        for k, limit in ceiling.items():
            v = budget.get(k)
            if type(v) is int and limit < v <= MAX_ID:  # out of range: parse's bad_request names it
                raise QueueError(Code.NOT_ALLOWED, f"workflow {d.get('name')!r}: budget {k} {v} is above "
                                 f"the operator's {limit} (a definition sent by a client may only lower it)")
    for s in d.get("steps") or ():
        if isinstance(s, dict):
            check_ceiling(s.get("workflow"), ceiling, depth + 1)


def with_defaults(spec: Definition, defaults: dict[str, int]) -> Definition:
    """`spec` with every budget it does not name set to the default, its children's too: the
    budgets a run keeps in its stored definition, whatever the operator changes later."""
    steps = tuple(dataclasses.replace(s, workflow=with_defaults(s.workflow, defaults)) if s.workflow else s
                  for s in spec.steps)
    budget = {k: v for k in BUDGETS if (v := spec.budget.get(k, defaults.get(k))) is not None}
    wire = {"name": spec.name, "steps": [_step_wire(s) for s in steps], "budget": budget}
    return Definition(spec.name, steps, budget, wire)


def _step(i: int, s: Any, depth: int) -> Step:
    if not isinstance(s, dict):
        raise bad(f"steps[{i}] must be an object")
    unknown = set(s) - _STEP_KEYS
    if unknown:
        raise bad(f"steps[{i}]: unknown field(s): {', '.join(sorted(unknown))}")
    name = _name(f"steps[{i}].name", s.get("name", f"step{i + 1}"))
    kind = s.get("kind", "workflow" if "workflow" in s else "for_each" if "items" in s else "task")
    if kind not in KINDS:
        raise bad(f"step {name}: unknown kind {kind!r} (kinds: {', '.join(KINDS)})")
    job = {k: s[k] for k in JOB_WIRE if k in s}
    if job:  # each field through the job's own check
        try:
            parse_job({"func": "m:f", **job}, 0.0)
        except QueueError as e:
            raise bad(f"step {name}: {e.message}") from None
    on_failure = s.get("on_failure", "fail")
    if on_failure not in ("fail", "continue"):
        raise bad(f"step {name}: on_failure must be 'fail' or 'continue'")
    nxt = s.get("next", s.get("_next"))
    if nxt is not None:
        _name(f"step {name}: next", nxt)
    out: dict[str, Any] = {"name": name, "kind": kind, "next": nxt, "on_failure": on_failure, "job": job}
    if kind in ("task", "for_each"):
        try:
            out["func"] = normalize_func(s.get("func"))
        except QueueError as e:
            raise bad(f"step {name}: {e.message}") from None
    if kind == "for_each":
        out["items"] = _name(f"step {name}: items", s.get("items"))
        out["result"] = _name(f"step {name}: result", s.get("result", name))
        mode = s.get("mode", "all")
        if mode not in MODES:
            raise bad(f"step {name}: unknown mode {mode!r} (modes: {', '.join(MODES)})")
        out["mode"] = mode
        if mode == "quorum":
            out["n"] = _positive(f"step {name}: n", s.get("n"))
    if kind == "workflow":
        child = s.get("workflow")
        if not isinstance(child, dict):
            raise bad(f"step {name}: workflow must be a definition (an object)")
        if depth >= MAX_DEPTH:
            raise bad(f"child workflows nest at most {MAX_DEPTH} deep")
        out["workflow"] = _parse(child, depth + 1)
        out["result"] = _name(f"step {name}: result", s.get("result", name))
        if s.get("input") is not None:
            out["input"] = _name(f"step {name}: input", s["input"])
    return Step(**out)


def _parse(d: Any, depth: int) -> Definition:
    if not isinstance(d, dict):
        raise bad("definition must be an object")
    unknown = set(d) - {"name", "steps", "budget"}
    if unknown:
        raise bad(f"definition: unknown field(s): {', '.join(sorted(unknown))}")
    name = _name("definition name", d.get("name"))
    steps = d.get("steps")
    if not isinstance(steps, list) or not steps:
        raise bad(f"workflow {name}: steps must be a non-empty array")
    parsed = tuple(_step(i, s, depth) for i, s in enumerate(steps))
    names = [s.name for s in parsed]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise bad(f"workflow {name}: duplicate step name(s): {', '.join(dup)}")
    for s in parsed:
        if s.next is not None and s.next not in names:
            raise bad(f"workflow {name}: step {s.name}: next names no step: {s.next!r}")
    budget = parse_budget(d.get("budget"))
    wire = {"name": name, "steps": [_step_wire(s) for s in parsed], "budget": budget}
    return Definition(name, parsed, budget, wire)


def _step_wire(s: Step) -> dict[str, Any]:
    out: dict[str, Any] = {"name": s.name, "kind": s.kind}
    for k in ("func", "items", "result", "input", "next"):
        v = getattr(s, k)
        if v is not None:
            out[k] = v
    if s.kind == "for_each":
        out["mode"] = s.mode
        if s.mode == "quorum":
            out["n"] = s.n
    if s.on_failure != "fail":
        out["on_failure"] = s.on_failure
    if s.workflow is not None:
        out["workflow"] = s.workflow.wire
    out.update(s.job)
    return out


def parse(d: Any) -> Definition:
    """Validate a definition (its wire form, children inline) or raise bad_request."""
    if isinstance(d, dict):
        size = len(json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode())
        if size > MAX_DEFINITION_BYTES:
            raise bad(f"definition is {size} bytes, over the {MAX_DEFINITION_BYTES}-byte limit")
    return _parse(d, 0)


_cache: dict[str, Definition] = {}


def from_stored(text: str) -> Definition:
    """The definition a run stored (valid: it was checked at start). Parsed once per text."""
    d = _cache.get(text)
    if d is None:
        if len(_cache) > 256:
            _cache.clear()
        d = _cache[text] = _parse(json.loads(text), 0)
    return d


def state_size(state: dict[str, Any]) -> int:
    """The bytes of the JSON-encoded state, as max_state_bytes counts them."""
    return len(json.dumps(state, separators=(",", ":"), ensure_ascii=False).encode())
