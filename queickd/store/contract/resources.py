"""What jobs take: the functions' memory footprints (the memory-aware start) and the cost
budgets in force (resource control, core/policy/costs.py)."""

from __future__ import annotations

from typing import Protocol

from ...core.policy import claim
from ...core.policy.memory import Footprint
from ...core.policy.resources import BudgetChange
from .backend import Backend


class Resources(Backend, Protocol):
    # --- memory-aware start ---------------------------------------------------------------
    def footprints(self, funcs: list[str]) -> dict[str, Footprint]:
        """Each named function's expected peak memory and runtime, if it has a history."""
        ...

    def record_runs(self, runs: list[tuple[str, int | None, float, bool, bool]], now: float) -> None:
        """Fold runs (func, peak bytes or None, runtime, whether it was killed for its
        memory limit, whether the peak is an estimate) into the functions' footprints, in
        the order given, in one transaction."""
        ...

    # --- budgets --------------------------------------------------------------------------
    def budget_usage(self, pools: list[str], groups: list[str]) -> dict[tuple[str, str], tuple[float, int, float, int]]:
        """("pool" | "group", name) -> (running cost, running jobs, waiting cost, waiting
        jobs), for the named pools and groups that have any. For stats: may scan."""
        ...

    def waiting_over_budgets(self, limits: claim.Limits) -> list[tuple[int, str, str | None, float | None]]:
        """(id, pool, group, cost_units) of the waiting jobs that cost more than the least
        budget of `limits`, in id order (costs.never_fit says which exceed their own). A
        diagnostic run once per change of the budgets, never on a claim: may scan."""
        ...

    def adopt_budgets(self, limits: claim.Limits) -> list[BudgetChange]:
        """A process started with budgets makes them the ones in force: a store shared by
        several claimers (PostgreSQL) replaces the budgets it holds with exactly those of
        `limits` and tells the others, in one transaction; returns what changed ([]: it held
        them already). A store of one daemon keeps none (its config is the truth): [],
        nothing written."""
        ...

    def budgets_in_force(self, limits: claim.Limits) -> claim.Limits:
        """`limits` with the budgets every claim applies in place of its own (its patience
        kept): the store's on PostgreSQL, `limits` itself elsewhere. One small read."""
        ...
