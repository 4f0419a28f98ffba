"""Per-function job defaults and budgets, from the config file, and the enqueue-time check
that a job can ever start under them.

- `[functions."module:func"]`: defaults for that function's jobs, by wire name (any field a
  job template keeps, e.g. concurrency_group, concurrency_limit, cost_units); a job's own
  value wins. Each value goes through the protocol's check for its field. Its isolation,
  limits and credentials (sandbox.FUNCTION_KEYS) are the sandbox's, applied when it runs.
- `[budgets.pools]` / `[budgets.groups]`: name -> cost units (claim.Limits). On SQLite (and
  in memory) the daemon's config is the truth; on PostgreSQL the store holds the budgets in
  force for every claimer, and `budget_changes` says what a config with budgets changes there.
- `admit(job)`: a job whose cost exceeds its pool's or its group's whole budget, or whose
  concurrency_limit disagrees with its function's configured one, could never start or
  would break its group's limit: refused (bad_request, naming the budget).
Pure: reads no file (the config module does), no clock, no store.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

from .. import fields, protocol, sandbox
from ..job import NewJob
from . import fair
from .claim import NO_LIMITS, Limits

BUDGET_KINDS = ("pools", "groups")
# Wire names a function's defaults may set: what a job template keeps, less what names the
# job itself (its function, its arguments).
DEFAULTABLE = frozenset(fields.TEMPLATE_WIRE - {"func", "args", "kwargs"})


@dataclass(frozen=True, slots=True)
class Resources:
    defaults: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # func -> {field: value}
    limits: Limits = NO_LIMITS
    # Is there anything to apply? (Without, enqueue skips apply().) Kept, not computed: it
    # is asked once per request.
    active: bool = dataclasses.field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "active", bool(self.defaults) or self.limits.any)

    def apply(self, job: NewJob) -> NewJob:
        """The job with its function's defaults for the fields it left at theirs, checked."""
        d = self.defaults.get(job.func)
        if d:
            own = {k: v for k, v in d.items() if getattr(job, k) == fields.BY_NAME[k].fresh_default()}
            if own:
                job = dataclasses.replace(job, **own)
        self.admit(job, d or {})
        return job

    def admit(self, job: NewJob, d: dict[str, Any]) -> None:
        limit = d.get("concurrency_limit")
        if limit is not None and job.concurrency_limit not in (None, limit):
            raise protocol.bad(f"concurrency_limit {job.concurrency_limit} disagrees with the limit"
                               f" configured for {job.func} ({limit})")
        units = 1.0 if job.cost_units is None else job.cost_units
        budget = self.limits.pools.get(job.pool)  # looked up one by one: this runs for every job
        if budget is not None and units > budget:
            _never_fits(units, "pools", job.pool, budget)
        group = job.concurrency_group
        budget = None if group is None else self.limits.groups.get(group)
        if budget is not None and units > budget:
            _never_fits(units, "groups", group, budget)


def _never_fits(units: float, kind: str, name: str, budget: float) -> None:
    raise protocol.bad(f"cost_units {units:g} exceeds the whole budget of {kind[:-1]} {name!r}"
                       f" ({budget:g}, budgets.{kind}): it could never start")


class BudgetChange(NamedTuple):
    """One budget that replacing a set of budgets by another changes."""

    kind: str  # "pool" | "group"
    name: str
    old: float | None  # None: it had no budget
    new: float | None  # None: it has none any more

    def __str__(self) -> str:
        def units(v: float | None) -> str:
            return "none" if v is None else f"{v:g}"
        return f"{self.kind} {self.name!r} {units(self.old)} -> {units(self.new)}"


def budget_changes(old: Limits, new: Limits) -> list[BudgetChange]:
    """What replacing the budgets of `old` by those of `new` changes, by kind then name
    (patience is each process's own: not compared)."""
    out = []
    for kind, before, after in (("pool", old.pools, new.pools), ("group", old.groups, new.groups)):
        for name in sorted(before.keys() | after.keys()):
            if before.get(name) != after.get(name):
                out.append(BudgetChange(kind, name, before.get(name), after.get(name)))
    return out


def describe_budgets(limits: Limits) -> str:
    """The budgets in one line, for logs: "pool 'default' 3, group 'api' 2" (or "none")."""
    parts = [f"{kind} {name!r} {units:g}" for kind, table in (("pool", limits.pools), ("group", limits.groups))
             for name, units in sorted(table.items())]
    return ", ".join(parts) or "none"


def budget_view(limits: Limits, usage: dict[tuple[str, str], tuple[float, int, float, int]]
                ) -> list[dict[str, Any]]:
    """Each budget with what runs against it and what waits for it (stats, metrics, views)."""
    out = []
    for kind, table in (("pool", limits.pools), ("group", limits.groups)):
        for name, limit in sorted(table.items()):
            rc, rn, wc, wn = usage.get((kind, name), (0.0, 0, 0.0, 0))
            out.append({"kind": kind, "name": name, "limit": limit, "running": rc, "running_jobs": rn,
                        "waiting": wc, "waiting_jobs": wn})
    return out


def parse(functions: dict[str, Any], budgets: dict[str, Any], patience: float,
          fair_shares: dict[str, Any] | None = None) -> Resources:
    """The config file's tables -> Resources. ValueError naming the table and field."""
    defaults: dict[str, dict[str, Any]] = {}
    for func, table in functions.items():
        where = f"functions.{func}"
        try:
            name = protocol.normalize_func(func)
        except protocol.QueueError:
            raise ValueError(f"{where}: a function is 'module:function'") from None
        if not isinstance(table, dict):
            raise ValueError(f"{where} must be a table")
        unknown = table.keys() - DEFAULTABLE - sandbox.FUNCTION_KEYS
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: "
                             f"{', '.join(sorted(DEFAULTABLE | sandbox.FUNCTION_KEYS))})")
        checked = {}
        for k, v in table.items():
            if k in sandbox.FUNCTION_KEYS:  # where it runs and its limits: decided at run time (sandbox.py)
                continue
            try:
                checked[fields.BY_WIRE[k].name] = protocol.check_field(k, v)
            except protocol.QueueError as e:
                raise ValueError(f"{where}: {e.message}") from None
        defaults[name] = checked
    unknown = budgets.keys() - set(BUDGET_KINDS)
    if unknown:
        raise ValueError(f"budgets: unknown kind(s) {', '.join(sorted(unknown))} (budgets are"
                         " [budgets.pools] and [budgets.groups])")
    out: dict[str, dict[str, float]] = {}
    for kind in BUDGET_KINDS:
        table = budgets.get(kind, {})
        if not isinstance(table, dict):
            raise ValueError(f"budgets.{kind} must be a table of name = cost units")
        for name, v in table.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 or v == float("inf"):
                raise ValueError(f"budgets.{kind}.{name} must be a number of cost units greater than 0")
            if kind == "groups" and len(name.encode()) > protocol.MAX_KEY_LEN:
                raise ValueError(f"budgets.groups: group name over {protocol.MAX_KEY_LEN} bytes")
        out[kind] = {str(n): float(v) for n, v in table.items()}
    if not patience >= 0:
        raise ValueError("budget_patience must not be negative")
    weights = fair.check_weights(fair_shares or {})
    return Resources(defaults, Limits(out["pools"], out["groups"], float(patience), weights))


NO_RESOURCES = Resources()
