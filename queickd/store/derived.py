"""What every backend derives from the primitives it implements (the contract is
contract.Store): the defaults a store keeps unless it has a better way."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ..core.job import NewJob, State, Submitted
from ..core.policy import claim
from ..core.policy.admission import Refusal
from ..core.policy.resources import BudgetChange
from .records import RefusedError


def accepted(answer: list[Submitted] | Refusal) -> list[Submitted]:
    """A request's answer as Queue.submit gives it: the jobs, or RefusedError."""
    if isinstance(answer, Refusal):
        raise RefusedError(answer)
    return answer


class StoreBase:
    """What every backend derives from the primitives it implements."""

    # Errors that say the store itself is in trouble (a lost connection, a failing disk),
    # never the data a call carried: retried as they are, never blamed on a job.
    UNAVAILABLE: tuple[type[BaseException], ...] = ()
    NOT_WRITTEN: tuple[type[BaseException], ...] = ()  # see contract.Backend.NOT_WRITTEN
    # --max-queued, for what the store enqueues on its own: a paced fan-out's items
    # (core/workflow/engine.py). None: no cap (a process that does not know it).
    queue_cap: int | None = None

    def flush(self) -> None:
        pass  # a commit of this store is durable (or never will be: memory) when it returns

    def durability_lost(self) -> str | None:
        return None

    def watch_files(self) -> bool:
        return False  # no file of its own that could be deleted under it

    def submit(self, jobs: Sequence[NewJob], now: float) -> list[Submitted]:
        return accepted(self.submit_requests([jobs], now)[0])  # type: ignore[attr-defined]

    def prune_finished(self, finished_before: float, limit: int) -> int:
        return self.purge((State.SUCCEEDED, State.CANCELLED), finished_before, limit)  # type: ignore[attr-defined]

    def adopt_budgets(self, limits: claim.Limits) -> list[BudgetChange]:
        return []  # one daemon's store: its config is the truth, nothing to keep

    def release_unheld(self, held: Collection[int], now: float) -> int:
        return 0  # a pass that raised here did not commit: nothing it claimed is left running

    def watch_finish(self, job_id: int) -> None:
        pass  # every finish of this store happens in this process, which wakes its waiters

    def budgets_in_force(self, limits: claim.Limits) -> claim.Limits:
        return limits
