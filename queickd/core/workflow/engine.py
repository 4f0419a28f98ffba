"""The transition of a workflow run: pure functions from (the run's record, what happened)
to a plan the store applies in the transaction that recorded what happened.

What happened is a step's item finishing (a job reaching succeeded or dead, or a child run
reaching its final state), a new run beginning, or an operator's cancel; `Plan` says what
follows. A finish that names a step the run has left (moved on, cancelled, stopped by its
budget) gets no plan: it is stale.

Nothing here does I/O or reads a clock: `now` is given; what the store knows beyond the
run's record (the outputs already recorded for a step, the run's ancestors) comes through
`Lookups`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..job import NewJob
from ..protocol import parse_job
from .model import BUDGETS, Definition, Step, from_stored, state_size


class RunState:
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    BUDGET_EXCEEDED = "budget_exceeded"
    CANCELLED = "cancelled"
    ALL = (RUNNING, SUCCEEDED, FAILED, BUDGET_EXCEEDED, CANCELLED)


# A task step's job carries the run's state up to this size (JSON bytes); a larger one is
# read back as the job starts (services/step_state.py): cheaper than storing it each time.
INLINE_STATE_BYTES = 4096
USAGE_KEYS = tuple(b.removeprefix("max_") for b in BUDGETS)  # what a run has used of each budget
_LIMIT_OF = dict(zip(USAGE_KEYS, BUDGETS, strict=True))


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A workflow run as stored. `definition` is its JSON text (children inline)."""

    id: int
    name: str
    definition: str
    status: str
    state: dict[str, Any]
    step: int = 0  # the current step's index
    loop: int = 0  # how many times the current step was entered before this time
    visits: dict[str, int] = field(default_factory=dict)  # step index (text) -> times entered
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_KEYS, 0))
    progress: dict[str, int] = field(default_factory=dict)  # the current fan-out: total, ok, failed
    reason: dict[str, Any] | None = None  # why it failed or was stopped
    parent: dict[str, int] | None = None  # run, step, item, loop of the step that started it
    root: int | None = None  # the topmost run (None: this is one)
    idempotency_key: str | None = None
    created_at: float = 0.0
    finished_at: float | None = None

    @property
    def spec(self) -> Definition:
        return from_stored(self.definition)

    def meta(self) -> dict[str, Any]:
        """What a store keeps in one JSON column besides its own columns."""
        return {"loop": self.loop, "visits": self.visits, "usage": self.usage, "progress": self.progress,
                "reason": self.reason, "parent": self.parent}

    def to_dict(self) -> dict[str, Any]:
        """The wire form of a run's status (workflow_get/workflow_wait), jobs not included."""
        spec = self.spec
        step = spec.steps[self.step] if self.step < len(spec.steps) else None
        return {
            "run_id": self.id, "name": self.name, "state": self.status, "data": self.state,
            "state_bytes": state_size(self.state), "step": step.name if step else None,
            "step_index": self.step, "loop": self.loop, "progress": self.progress, "reason": self.reason,
            "budget": {k: {"limit": spec.budget.get(_LIMIT_OF[k]), "used": self.usage.get(k, 0)}
                       for k in USAGE_KEYS},
            "parent": self.parent, "root": self.root, "created_at": self.created_at,
            "finished_at": self.finished_at, "definition": json.loads(self.definition),
        }


@dataclass(frozen=True, slots=True)
class StepDone:
    """One item of a step finished: a job (succeeded or dead) or a child run (final)."""

    run: int
    step: int
    item: int
    loop: int
    ok: bool
    value: Any = None  # the job's result, or the child's final state
    error: Any = None  # the job's error, or the child's state and reason
    job_id: int | None = None


@dataclass(frozen=True, slots=True)
class Output:
    step: int
    item: int
    loop: int
    ok: bool
    value: Any
    job_id: int | None


@dataclass(frozen=True, slots=True)
class Lookups:
    """What the store reads for a plan. outputs(step, loop): [(item, ok, value)] recorded so
    far for the run's step (read only when a fan-out completes). ancestors(): the run's
    parent, its parent, ... (read only when a child is started). room(): the jobs the queue
    takes before --max-queued, None for no cap (read only as a fan-out enqueues items)."""

    outputs: Callable[[int, int], list[tuple[int, bool, Any]]]
    ancestors: Callable[[], list[RunRecord]]
    room: Callable[[], int | None] = lambda: None


NO_LOOKUPS = Lookups(lambda step, loop: [], lambda: [])


@dataclass(slots=True)
class Plan:
    """What the store applies: the run's new record (state merged, current step, loop
    counters, usage charged, final state and its reason), and what else follows."""

    run: RunRecord
    output: Output | None = None  # to record under (run, step index, item, loop)
    jobs: list[NewJob] = field(default_factory=list)
    child: RunRecord | None = None  # to insert (id 0: the store gives it one), then begin()
    ancestors: list[RunRecord] = field(default_factory=list)  # charged for the child
    discard: bool = False  # cancel the run's waiting jobs (its step ended early, or the run did)
    ended: bool = False  # the run reached a final state now (its parent, if any, advances)


def step_key(run: int, step: int, item: int, loop: int) -> str:
    """The idempotency key of a step's job, handed to the step's function."""
    return f"wf:{run}:{step}:{item}" + (f":{loop}" if loop else "")


# --- ending --------------------------------------------------------------------------------
def _end(run: RunRecord, status: str, now: float, reason: dict[str, Any] | None = None,
         **changes: Any) -> RunRecord:
    return dataclasses.replace(run, status=status, reason=reason, finished_at=now, progress={}, **changes)


def _over(run: RunRecord, usage_key: str, used: int, now: float, **changes: Any) -> RunRecord:
    limit = run.spec.budget[_LIMIT_OF[usage_key]]
    usage = {**run.usage, usage_key: used}
    reason = {"budget": _LIMIT_OF[usage_key], "limit": limit, "usage": used,
              "message": f"{_LIMIT_OF[usage_key]} {limit} exceeded (would be {used})"}
    return _end(run, RunState.BUDGET_EXCEEDED, now, reason, usage=usage, **changes)


def _exceeds(run: RunRecord, usage_key: str, used: int) -> bool:
    limit = run.spec.budget.get(_LIMIT_OF[usage_key])
    return limit is not None and used > limit


def _failed(run: RunRecord, now: float, message: str, step: Step | None = None, **extra: Any) -> Plan:
    reason = {"message": message, **extra}
    if step is not None:
        reason["step"] = step.name
    return Plan(_end(run, RunState.FAILED, now, reason), discard=True, ended=True)


# --- entering a step -----------------------------------------------------------------------
def _job(run: RunRecord, step: Step, index: int, item: int, loop: int, args: list, now: float) -> NewJob:
    job = parse_job({**step.job, "func": step.func, "args": args,
                     "idempotency_key": step_key(run.id, index, item, loop)}, now)
    return dataclasses.replace(job, workflow_run=run.id, workflow_step=index, workflow_item=item,
                               workflow_loop=loop)


def _enter(run: RunRecord, index: int, now: float, lookups: Lookups) -> Plan:
    """Enter step `index`, and every step after it that completes as it is entered (a
    for_each over an empty list), in a loop rather than by recursion: a definition may
    hold hundreds of such steps in a row. More steps passed through than the definition
    has means a step came round again with the state that left it empty: it would loop
    for ever."""
    spec = run.spec
    hops = 0  # steps passed through in this transition without starting anything
    while True:
        if index >= len(spec.steps):
            return Plan(_end(run, RunState.SUCCEEDED, now, step=len(spec.steps), loop=0), ended=True)
        step = spec.steps[index]
        if hops > len(spec.steps):
            return _failed(run, now, f"step {step.name} comes round again without any job run in between "
                           "(for_each steps over empty lists, looping): the run would never end", step)
        transitions = run.usage.get("transitions", 0) + 1
        if _exceeds(run, "transitions", transitions):
            return Plan(_over(run, "transitions", transitions, now, step=index), discard=True, ended=True)
        loop = run.visits.get(str(index), 0)
        usage = {**run.usage, "transitions": transitions}
        run = dataclasses.replace(run, step=index, loop=loop, visits={**run.visits, str(index): loop + 1},
                                  usage=usage, progress={})
        if step.kind == "task":
            # A large state is not stored in the job (INLINE_STATE_BYTES): None stands for it.
            inline = run.usage.get("state_bytes", 0) <= INLINE_STATE_BYTES
            return _start_jobs(run, step, index, loop, [[run.state] if inline else [None]], now)
        if step.kind != "for_each":
            return _start_child(run, step, index, loop, now, lookups)
        items = run.state.get(step.items)  # type: ignore[arg-type]
        if not isinstance(items, list):
            return _failed(run, now, f"items {step.items!r} is not a list in the state", step)
        if _exceeds(run, "for_each_items", len(items)):
            return Plan(_over(run, "for_each_items", len(items), now), discard=True, ended=True)
        run = dataclasses.replace(run, usage={**run.usage, "for_each_items": max(
            len(items), run.usage.get("for_each_items", 0))})
        if items:
            # [item, None]: the state takes the None's place as each item starts, not stored per item.
            room = lookups.room()
            if room is None or len(items) <= room:
                return _start_jobs(run, step, index, loop, [[item, None] for item in items], now)
            if room <= 0:
                return _queue_full(run, step, now)
            # Paced: what fits under the cap now, the rest as the items drain (_top_up).
            return _start_jobs(run, step, index, loop, [[item, None] for item in items[:room]], now,
                               total=len(items))
        # Nothing to wait for: the step completes with no results, and the next is entered.
        merged = _merge(run, step, index, {**run.state, step.result: []}, None, now)
        if isinstance(merged, Plan):
            return merged
        run, index = merged
        hops += 1


def _start_jobs(run: RunRecord, step: Step, index: int, loop: int, argss: list[list], now: float,
                total: int | None = None) -> Plan:
    """The step's jobs, its cost charged for all `total` items (default: these)."""
    total = len(argss) if total is None else total
    cost = run.usage.get("cost_units", 0) + step.cost * total
    if _exceeds(run, "cost_units", cost):
        return Plan(_over(run, "cost_units", cost, now), discard=True, ended=True)
    progress = {"total": total, "ok": 0, "failed": 0}
    if total > len(argss):  # paced: these enqueued so far, and how many at once
        progress.update(queued=len(argss), window=len(argss))
    run = dataclasses.replace(run, usage={**run.usage, "cost_units": cost}, progress=progress)
    return Plan(run, jobs=[_job(run, step, index, i, loop, args, now) for i, args in enumerate(argss)])


def _queue_full(run: RunRecord, step: Step, now: float) -> Plan:
    """A fan-out none of whose items is waiting, and the queue at --max-queued: the run
    ends (it would wait for nothing), as an enqueue would be refused."""
    return _failed(run, now, f"step {step.name}: the queue holds its limit of waiting jobs (--max-queued); "
                   "the fan-out's items could not be enqueued", step, code="queue_full")


def _top_up_due(progress: dict[str, int]) -> bool:
    """A paced fan-out enqueues more once half of what it last enqueued has finished: the
    state (the list) is read once per half window, not once per item."""
    queued = progress.get("queued")
    if queued is None or queued >= progress.get("total", 0):
        return False
    return queued - progress.get("ok", 0) - progress.get("failed", 0) <= progress.get("window", 1) // 2


def _top_up(run: RunRecord, step: Step, done: StepDone, now: float, lookups: Lookups) -> Plan:
    """More of a paced fan-out's items, as many as the queue takes (none: it waits for the
    next finish, or, with nothing of it left waiting, the run ends queue_full)."""
    p = run.progress
    queued, total = p["queued"], p["total"]
    room = lookups.room()
    n = total - queued if room is None else min(total - queued, room)
    if n <= 0:
        if queued - p.get("ok", 0) - p.get("failed", 0) <= 0:
            return _queue_full(run, step, now)
        return Plan(run)
    items = run.state[step.items]  # type: ignore[index]
    jobs = [_job(run, step, done.step, queued + i, done.loop, [item, None], now)
            for i, item in enumerate(items[queued:queued + n])]
    return Plan(dataclasses.replace(run, progress={**p, "queued": queued + n, "window": max(n, p.get("window", 1))}),
                jobs=jobs)


def _start_child(run: RunRecord, step: Step, index: int, loop: int, now: float, lookups: Lookups) -> Plan:
    started = run.usage.get("started_workflows", 0) + 1
    if _exceeds(run, "started_workflows", started):
        return Plan(_over(run, "started_workflows", started, now), discard=True, ended=True)
    # Every ancestor counts its descendants' children too: the first one past its own limit
    # stops there (the store then cancels what runs under it).
    charged = []
    for a in lookups.ancestors():
        n = a.usage.get("started_workflows", 0) + 1
        if a.status != RunState.RUNNING:
            break
        if _exceeds(a, "started_workflows", n):
            charged.append(_over(a, "started_workflows", n, now))
            break
        charged.append(dataclasses.replace(a, usage={**a.usage, "started_workflows": n}))
    run = dataclasses.replace(run, usage={**run.usage, "started_workflows": started},
                              progress={"total": 1, "ok": 0, "failed": 0})
    source = run.state if step.input is None else run.state.get(step.input)
    if not isinstance(source, dict):
        return _failed(run, now, f"input {step.input!r} is not an object in the state", step)
    child_def = step.workflow
    assert child_def is not None
    child = RunRecord(
        id=0, name=child_def.name, definition=json.dumps(child_def.wire, separators=(",", ":")),
        status=RunState.RUNNING, state=dict(source),
        parent={"run": run.id, "step": index, "item": 0, "loop": loop},
        root=run.root if run.root is not None else run.id, created_at=now)
    return Plan(run, child=child, ancestors=charged)


# --- a step's item finished ------------------------------------------------------------------
def current(run: RunRecord, done: StepDone) -> bool:
    """Whether `done` is for the step and loop the run is at (else the finish is stale)."""
    return run.status == RunState.RUNNING and run.step == done.step and run.loop == done.loop


def transition(run: RunRecord, done: StepDone, now: float, lookups: Lookups = NO_LOOKUPS) -> Plan | None:
    """The plan for one finished item of the run's current step; None when the finish is
    stale (the run is not running, or is at another step or another loop of it)."""
    if not current(run, done):
        return None
    step = run.spec.steps[done.step]
    out = Output(done.step, done.item, done.loop, done.ok, done.value if done.ok else done.error, done.job_id)
    plan = _task_done(run, step, done, now, lookups) if step.kind == "task" else \
        _item_done(run, step, done, now, lookups)
    plan.output = out
    return plan


def _next_index(run: RunRecord, step: Step, index: int, asked: Any) -> int | str:
    target = asked if asked is not None else step.next
    if target is None:
        return index + 1
    i = run.spec.index(target) if isinstance(target, str) else None
    return f"_next names no step: {target!r}" if i is None else i


def _merge(run: RunRecord, step: Step, index: int, state: dict[str, Any], asked: Any,
           now: float) -> Plan | tuple[RunRecord, int]:
    """The step's state merged into the run and the next step chosen: (run, its index), or
    the plan that ends the run here (over its state budget, a `_next` naming no step)."""
    size = state_size(state)
    if _exceeds(run, "state_bytes", size):
        return Plan(_over(run, "state_bytes", size, now), discard=True, ended=True)
    nxt = _next_index(run, step, index, asked)
    run = dataclasses.replace(run, state=state, usage={**run.usage, "state_bytes": size}, progress={})
    if isinstance(nxt, str):
        return _failed(run, now, nxt, step)
    return run, nxt


def _merge_and_go(run: RunRecord, step: Step, index: int, state: dict[str, Any], asked: Any, now: float,
                  lookups: Lookups) -> Plan:
    merged = _merge(run, step, index, state, asked, now)
    return merged if isinstance(merged, Plan) else _enter(*merged, now, lookups)


def _task_done(run: RunRecord, step: Step, done: StepDone, now: float, lookups: Lookups) -> Plan:
    if not done.ok:
        if step.on_failure == "continue":
            return _merge_and_go(run, step, done.step, run.state, None, now, lookups)
        return _failed(run, now, f"step {step.name} failed", step, error=done.error)
    value = {} if done.value is None else done.value
    if not isinstance(value, dict):
        return _failed(run, now, f"step {step.name} returned {type(value).__name__}, not an object", step)
    value = dict(value)
    asked = value.pop("_next", None)
    return _merge_and_go(run, step, done.step, {**run.state, **value}, asked, now, lookups)


def _counted(run: RunRecord, step: Step, done: StepDone) -> tuple[dict[str, int], int, int, int, int]:
    """The step's progress with `done` counted: (progress, total, ok, failed, successes needed)."""
    p = dict(run.progress)
    p["ok" if done.ok else "failed"] = p.get("ok" if done.ok else "failed", 0) + 1
    total, ok, failed = p.get("total", 1), p.get("ok", 0), p.get("failed", 0)
    return p, total, ok, failed, {"all": total, "first_success": 1, "quorum": step.n}[step.mode]


def needs_state(run: RunRecord, done: StepDone) -> bool:
    """Whether the transition of `done` may read or change the run's state: not for a
    fan-out's item that leaves its step waiting for more (nor a stale finish). A store may
    then hand the transition the run without its state: a fan-out's items cost the same
    whatever the size of the list fanned out."""
    if not current(run, done):
        return False
    step = run.spec.steps[done.step]
    if step.kind != "for_each":
        return True
    p, total, ok, failed, need = _counted(run, step, done)
    return bool(failed) or ok >= need or ok + failed >= total or _top_up_due(p)


def _item_done(run: RunRecord, step: Step, done: StepDone, now: float, lookups: Lookups) -> Plan:
    p, total, ok, failed, need = _counted(run, step, done)
    run = dataclasses.replace(run, progress=p)
    if step.kind == "workflow":
        value = done.value if done.ok else None
        if not done.ok and step.on_failure != "continue":
            return _failed(run, now, f"step {step.name}: child workflow ended {done.error.get('state')}"
                           if isinstance(done.error, dict) else f"step {step.name} failed", step,
                           error=done.error)
        return _complete(run, step, done.step, value, now, lookups)
    if step.mode == "all" and failed and step.on_failure != "continue":
        return _failed(run, now, f"step {step.name}: item {done.item} failed", step, error=done.error)
    if step.mode != "all" and total - failed < need and step.on_failure != "continue":
        # too few items left to succeed: no need to wait for them
        return _failed(run, now, f"step {step.name}: {ok} of {total} items succeeded, {need} needed", step)
    if ok >= need or ok + failed == total:
        if ok < need and step.mode != "all" and step.on_failure != "continue":
            return _failed(run, now, f"step {step.name}: {ok} of {total} items succeeded, {need} needed", step)
        recorded = sorted([*lookups.outputs(done.step, done.loop), (done.item, done.ok, done.value)])
        if step.mode == "all":
            results = [v if good else None for _, good, v in recorded]
        else:
            results = [v for _, good, v in recorded if good]
            if step.mode == "first_success":
                results = results[0] if results else None
        plan = _complete(run, step, done.step, results, now, lookups)
        plan.discard = plan.discard or ok + failed < total  # the items still to run are dropped
        return plan
    if _top_up_due(p):
        return _top_up(run, step, done, now, lookups)
    return Plan(run)


def _complete(run: RunRecord, step: Step, index: int, result: Any, now: float, lookups: Lookups) -> Plan:
    return _merge_and_go(run, step, index, {**run.state, step.result: result}, None, now, lookups)


def broken(run: RunRecord, done: StepDone, now: float, error: dict[str, Any]) -> Plan | None:
    """The plan when working out or applying `done` raised `error` ({type, message}): a bug,
    or data whose problem shows only now (a state that cannot be encoded, a definition this
    version cannot read). The run fails, naming the step whose item finished, and what runs
    under it stops. The item's output is not recorded: it may be what failed. None when
    the finish is stale."""
    if not current(run, done):
        return None
    try:
        name = run.spec.steps[done.step].name
    except Exception:  # the definition itself may be what failed
        name = f"#{done.step}"
    reason = {"message": f"step {name}: its finish could not be applied: {error['type']}: {error['message']}",
              "step": name, "error": error}
    return Plan(_end(run, RunState.FAILED, now, reason), discard=True, ended=True)


# --- a new run, a cancel ------------------------------------------------------------------
def new_run(spec: Definition, state: dict[str, Any], now: float, idempotency_key: str | None = None) -> RunRecord:
    """A run's record before it is stored (id 0) and begun."""
    return RunRecord(id=0, name=spec.name, definition=json.dumps(spec.wire, separators=(",", ":")),
                     status=RunState.RUNNING, state=dict(state), idempotency_key=idempotency_key,
                     created_at=now)


def begin(run: RunRecord, now: float, lookups: Lookups = NO_LOOKUPS) -> Plan:
    """The plan of a stored new run (its id given): its state checked, its first step entered."""
    size = state_size(run.state)
    if _exceeds(run, "state_bytes", size):
        return Plan(_over(run, "state_bytes", size, now), ended=True)
    run = dataclasses.replace(run, usage={**run.usage, "state_bytes": size})
    return _enter(run, 0, now, lookups)


def cancel(run: RunRecord, now: float, why: str = "cancelled by an operator") -> Plan | None:
    """Cancel a running run (None if it has ended): its waiting jobs dropped, its children too."""
    if run.status != RunState.RUNNING:
        return None
    return Plan(_end(run, RunState.CANCELLED, now, {"message": why}), discard=True, ended=True)


def child_done(child: RunRecord) -> StepDone | None:
    """What a child's end means to its parent's step (None for a run without a parent)."""
    if child.parent is None:
        return None
    p = child.parent
    ok = child.status == RunState.SUCCEEDED
    return StepDone(p["run"], p["step"], p["item"], p["loop"], ok,
                    child.state if ok else None, None if ok else {"state": child.status, "reason": child.reason})
