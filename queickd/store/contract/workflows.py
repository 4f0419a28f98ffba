"""Workflow runs (core/workflow): started, read, cancelled; a run advances in the
transaction of the finish of its step's job (Queue.finish_if_running)."""

from __future__ import annotations

from typing import Any, Protocol

from ...core.job import Job
from ...core.workflow import Definition, RunRecord
from .backend import Backend


class Workflows(Backend, Protocol):
    def workflow_start(self, spec: Definition, state: dict[str, Any], now: float,
                       idempotency_key: str | None = None) -> tuple[RunRecord, bool]:
        """Store a new run and begin it, in one transaction: its first step's jobs (or child
        run) inserted, or its final state at once (a budget passed, items not a list).
        With a known idempotency key: the existing run and True, nothing written."""
        ...

    def workflow_get(self, run_id: int) -> RunRecord | None:
        """The run as it is now, or None if unknown."""
        ...

    def workflow_jobs(self, run_id: int) -> list[Job]:
        """The run's step jobs, in id order (its children's are theirs)."""
        ...

    def workflow_outputs(self, run_id: int) -> list[dict[str, Any]]:
        """The run's recorded step outputs (step, item, loop, ok, value, job_id), in that order."""
        ...

    def workflow_list(self, state: str | None, limit: int) -> list[RunRecord]:
        """Runs, newest first, optionally of one state (RunState)."""
        ...

    def workflow_children(self, run: RunRecord) -> list[RunRecord]:
        """The runs its steps started, in id order."""
        ...

    def workflow_cancel(self, run_id: int, now: float) -> RunRecord | None:
        """Cancel a running run in one transaction: its waiting jobs cancelled, its running
        ones left to finish (stale), its running descendants cancelled, its parent advanced.
        Returns the run as it is after the call (unchanged if it had ended), None if unknown."""
        ...

    def workflow_counts(self) -> dict[str, Any]:
        """{"runs": runs by state (every state present), "budget_stops": {budget: runs}}."""
        ...
