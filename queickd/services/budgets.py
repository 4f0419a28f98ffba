"""The cost budgets in force in this process, for what reads them outside a claim: the
enqueue-time refusal of a job that can never fit, and the pool's claims where the store
takes them from the caller (SQLite, memory).

On a store of one daemon, they are its config's. On PostgreSQL they are the store's, the
same for every daemon and `queick worker`: `adopt()` at start writes this process's there
if it was started with any (loudly when they replace others), and reads them either way;
`refresh()` reads them again when another process wrote them (its NOTIFY 'b', and each
reconnection of the listener). Claims never wait for this copy: each reads the store's.

Each time it logs the waiting jobs that cost more than a whole budget in force: accepted
under a higher one, they can never start until an operator cancels them or raises it.

Thread-safety: `adopt()` runs once at start; `refresh()` from the listener thread; `limits`
is read from any thread (a reference swapped whole, never changed in place).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..core.policy.claim import Limits
from ..core.policy.costs import never_fit
from ..core.policy.resources import budget_changes, describe_budgets
from ..store.contract.resources import Resources

log = logging.getLogger("queickd.budgets")


class BudgetsInForce:
    def __init__(self, store: Resources, configured: Limits) -> None:
        self.store = store
        self.configured = configured  # this process's config: budgets (if any) and patience
        # Told (the budgets now in force) from the listener thread, in order; the parts that
        # follow the budgets add theirs once built.
        self.on_change: list[Callable[[Limits], None]] = []
        self.limits = configured

    def adopt(self) -> Limits:
        """At start: this process's budgets, if it was started with any, made the ones in
        force; then the ones in force, whoever wrote them. Logged either way."""
        configured = self.configured
        if configured.any:
            changes = self.store.adopt_budgets(configured)
            if changes and any(c.old is not None for c in changes):
                # Another process's budgets are being overruled: every claimer follows now.
                log.warning("budgets: this process's config replaces the budgets in force on %s: %s",
                            self.store.url, "; ".join(map(str, changes)))
            elif changes:
                log.info("budgets: in force on %s from this process's config: %s", self.store.url,
                         describe_budgets(configured))
        self.limits = self.store.budgets_in_force(configured)
        if self.limits.any and not configured.any:
            log.info("budgets: in force on %s (not set here): %s", self.store.url, describe_budgets(self.limits))
        self._report_misfits(self.limits)
        return self.limits

    def refresh(self) -> None:
        """Read the budgets in force again; tell on_change if they differ."""
        new = self.store.budgets_in_force(self.configured)
        old, self.limits = self.limits, new
        changes = budget_changes(old, new)
        if changes:
            differs = self.configured.any and budget_changes(self.configured, new)
            mine = " (this process's config differs: it writes its own again when it restarts)" if differs else ""
            log.warning("budgets: another process changed the budgets in force: %s%s",
                        "; ".join(map(str, changes)), mine)
            for tell in self.on_change:
                tell(new)
            self._report_misfits(new)

    def _report_misfits(self, limits: Limits) -> None:
        """Log, by budget, the waiting jobs that cost more than its whole limit."""
        if not limits.any:
            return
        try:
            misfits = never_fit(limits, self.store.waiting_over_budgets(limits))
        except Exception as e:  # a diagnostic: never a reason not to start or follow the change
            log.warning("budgets: could not look for waiting jobs over a whole budget: %s", e)
            return
        for m in misfits:
            log.warning("budgets: %s", m)
