"""Cost budgets, the claim's rule about cost units (claim.py applies it with the others).

- `Limits`: the budgets in force and the patience of a job over one.
- `CostBudgets`: the cost units running in a job's pool and in its group, plus its own,
  stay within each budget; a job over one is passed over and holds nothing, unless it has
  waited `Limits.patience` seconds: then it reserves the budgets it does not fit, and
  younger jobs of that pool or group stop starting until it has started.
- A budget that what runs has used up (`used_up`) has room for no job: the claim passes
  its jobs over without reading them, as it does the jobs of a full group, so a backlog of
  them does not fill the claim's look-ahead (claim.Selection.left_out). Such a job holds
  nothing: the budget frees only when a running job ends, and it is read again then.
- A job whose cost exceeds a budget's whole limit (the budget was lowered after the job
  was accepted) can never start: it holds nothing either (a budget it reserved would stay
  held for good), and `never_fit` names such jobs for the log.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

# Budgets are compared with this slack: the same units added up in another order may
# differ by their rounding.
BUDGET_EPS = 1e-9


def cost(c: Any) -> float:
    """A job's cost units (1 when it names none)."""
    return 1.0 if c.cost_units is None else c.cost_units


@dataclass(frozen=True, slots=True)
class Limits:
    """The budgets in force (`[budgets.pools]`, `[budgets.groups]`: name -> cost units; the
    config file's, or on PostgreSQL the store's, the same for every claimer) and how long a
    job over a budget waits before it reserves it (each process's own)."""

    pools: dict[str, float] = dataclasses.field(default_factory=dict)
    groups: dict[str, float] = dataclasses.field(default_factory=dict)
    patience: float = 30.0
    # Fair keys' weights (`[fair_shares]`: fair.py), each process's own like patience; they
    # order what a claim offers, they budget nothing.
    fair: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def any(self) -> bool:
        return bool(self.pools or self.groups)


NO_LIMITS = Limits()


def used_up(running: dict[str, float], budgets: dict[str, float]) -> frozenset[str]:
    """The pools (or groups) whose running cost leaves no room in their budget: within
    BUDGET_EPS of it, so no job of a meaningful cost fits (one of 2e-9 units or less is
    held too)."""
    return frozenset(n for n, used in running.items()
                     if (b := budgets.get(n)) is not None and used >= b - BUDGET_EPS)


class CostBudgets:
    """The rule (see the module): a job (a claim.Candidate) starts only within its pool's and
    its group's budgets."""

    __slots__ = ("limits", "now", "pool_cost", "group_cost", "reserved", "_over")

    def __init__(self, limits: Limits, pool_cost: dict[str, float], group_cost: dict[str, float],
                 now: float) -> None:
        self.limits, self.now = limits, now
        self.pool_cost = dict(pool_cost)  # what runs, and what this claim starts
        self.group_cost = dict(group_cost)
        self.reserved: set[tuple[str, str]] = set()  # ("pool" | "group", name) held by a patient job
        self._over: tuple[int, list[tuple[str, str]]] | None = None  # the last job over a budget

    def _budgets(self, c: Any) -> list[tuple[str, str, float, float]]:
        out = []
        b = self.limits.pools.get(c.pool)
        if b is not None:
            out.append(("pool", c.pool, b, self.pool_cost.get(c.pool, 0.0)))
        g = c.concurrency_group
        if g is not None:
            b = self.limits.groups.get(g)
            if b is not None:
                out.append(("group", g, b, self.group_cost.get(g, 0.0)))
        return out

    def admits(self, c: Any) -> bool:
        units = cost(c)
        over, ok, never = [], True, False
        for kind, name, budget, used in self._budgets(c):
            if (kind, name) in self.reserved:
                ok = False
            elif used + units > budget + BUDGET_EPS:
                over.append((kind, name))
                ok = False
                never = never or units > budget + BUDGET_EPS
        # A job that can never start reserves nothing: what it held would be held for good.
        self._over = (c.id, over) if over and not never else None
        return ok

    def started(self, c: Any) -> None:
        units = cost(c)
        if c.pool in self.limits.pools:
            self.pool_cost[c.pool] = self.pool_cost.get(c.pool, 0.0) + units
        g = c.concurrency_group
        if g is not None and g in self.limits.groups:
            self.group_cost[g] = self.group_cost.get(g, 0.0) + units

    def passed(self, c: Any) -> None:
        over, self._over = self._over, None
        if over is not None and over[0] == c.id and self.now - c.run_at >= self.limits.patience:
            self.reserved.update(over[1])  # waited long enough: what it needs is kept for it


class Misfit(NamedTuple):
    """Waiting jobs whose cost exceeds one budget's whole limit: they can never start."""

    kind: str  # "pool" | "group"
    name: str
    budget: float
    job_ids: list[int]
    most: float  # the highest cost among them

    def __str__(self) -> str:
        ids = ", ".join(map(str, self.job_ids[:10])) + (", ..." if len(self.job_ids) > 10 else "")
        return (f"{len(self.job_ids)} waiting job(s) cost more than the whole budget of {self.kind} {self.name!r}"
                f" ({self.budget:g}) and can never start (ids {ids}): cancel them, or raise the budget"
                f" (budgets.{self.kind}s.{self.name} >= {self.most:g})")


def never_fit(limits: Limits, jobs: Iterable[tuple[int, str, str | None, float | None]]) -> list[Misfit]:
    """Of waiting jobs (id, pool, group, cost_units), those over a whole budget of
    `limits`, by budget (kind, then name), each budget's jobs in the order given."""
    found: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for job_id, pool, group, units in jobs:
        units = 1.0 if units is None else units
        for kind, name, table in (("pool", pool, limits.pools), ("group", group, limits.groups)):
            b = None if name is None else table.get(name)
            if b is not None and units > b + BUDGET_EPS:
                found.setdefault((kind, name), []).append((job_id, units))  # type: ignore[arg-type]
    return [Misfit(kind, name, (limits.pools if kind == "pool" else limits.groups)[name],
                   [i for i, _ in found[kind, name]], max(u for _, u in found[kind, name]))
            for kind, name in sorted(found)]
