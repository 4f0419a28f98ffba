"""The queue: jobs submitted, claimed by a worker pool, finished. Every call here is one
transaction (or, made through a transaction's handle, runs in that one) unless its
docstring says otherwise; queue order is priority, then run_at, then id."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol

from ...core.job import Job, NewJob, Outcome, Submitted
from ...core.policy import claim
from ...core.policy.admission import NO_LIMITS, Admission, Refusal
from ..records import Finished, Recovered
from .backend import Backend


class Queue(Backend, Protocol):
    # --max-queued for the jobs a workflow's fan-out enqueues in a finish (None: no cap).
    queue_cap: int | None

    def submit_requests(
        self, requests: Sequence[Sequence[NewJob]], now: float, admission: Admission = NO_LIMITS
    ) -> list[list[Submitted] | Refusal]:
        """Insert the jobs of many requests in one transaction (group commit).

        Each request is admitted all or nothing by admission.plan (caps, manual conflicts,
        idempotency keys with their TTL); a refused request answers with its Refusal. A
        job whose run_at <= now is stored `queued`, a later one `scheduled`; a duplicate
        answers with the existing id and duplicate=True. Answers are in input order.
        """
        ...

    def submit(self, jobs: Sequence[NewJob], now: float) -> list[Submitted]:
        """One request, no limits: submit_requests([jobs], now)[0], or RefusedError."""
        ...

    def claim_available(self, request: claim.Request) -> list[Job]:
        """Atomically move up to `request.limit` `queued` jobs to `running`, in queue order,
        at `request.now`.

        Resource control (core/policy/claim.py): a grouped job whose group runs its
        concurrency_limit already, and a job over a budget in force, are passed over and
        hold nothing (a patient one, by `limits.patience`, reserves its budgets); exact
        across hosts on PostgreSQL. The budgets in force are `request.limits`' own, except
        in a store that keeps them (PostgreSQL: see Resources.adopt_budgets), which reads
        its own in the claim's transaction. At most claim.LOOK_AHEAD candidates past the
        jobs taken are read.

        Passed over (they keep waiting): a job whose key already has a running job (and
        every job of a key after the first one taken in this claim), a job whose key or
        function is paused, a job of a pool not in `request.pools` (None: every pool), a
        job in `request.exclude` (the claimer's memory gate sent it back a moment ago),
        and, with `request.network_up` False, a job that asked for network replay. A
        passed-over job at the head of its key holds the key: its key's later jobs wait
        behind it. Each claimed job's attempts grows by one and started_at becomes now.
        Returns the claimed jobs as they are after the claim, in queue order; [] when
        nothing is claimable.
        """
        ...

    def finish_if_running(self, outcomes: Sequence[Outcome], now: float, pause_after: int | None = None,
                          pause_cooldown: float | None = None) -> Finished:
        """Apply each outcome to its job only if that job is still `running`.

        Failure streaks are kept per key and per function (core/policy/pauses.py): a
        success resets them, a dead job grows them; with pause_after set, a streak reaching
        it pauses that key or function, with a probe `pause_cooldown` seconds later (None:
        no probe). A retry scheduled or parking for the network is neither. The probe of a
        pause (the one job a claim let through) resumes it by succeeding, and by failing
        pauses it again with a longer cooldown.

        succeeded/dead set finished_at; scheduled sets run_at; waiting_network gives back
        the attempt (a run that found no network does not count against max_attempts);
        result, error and output (the run's captured output, None for none) are stored as
        given, replacing the last run's. One transaction for the batch, outcomes applied in
        the order given.

        An outcome to succeeded or dead of a workflow step's job (outcome.workflow_run set)
        advances its run in the same transaction (store/workflows.py): the output recorded
        once per (run, step, item, loop), the next step's jobs inserted, the budget charged;
        a finish its run no longer waits for changes only the job. Jobs without a run cost
        one test of that field, nothing more. A run whose advance raises (a bug, or data
        whose problem shows only now) has what it wrote undone and ends `failed`, its reason
        naming the step and the error; the job's finish and the rest of the batch stand.
        """
        ...

    def set_progress_if_running(self, updates: Sequence[tuple[int, int, dict[str, Any]]]) -> int:
        """Store each (job id, attempt, progress) as the job's `progress`, where that job is
        still `running` its attempt `attempt`; anything else (finished, re-queued, run again)
        is left alone. One transaction, which a power cut may undo (bookkeeping). Returns
        how many jobs it changed."""
        ...

    def set_stalled(self, updates: Sequence[tuple[int, int, float | None]]) -> int:
        """Each (job id, attempt, stalled_at): a time marks that job stalled where it is still
        `running` that attempt (core/policy/liveness.py); None clears the mark of that attempt
        whatever its state. A progress write (set_progress_if_running) clears it too. One
        transaction (bookkeeping). Returns how many jobs it changed."""
        ...

    def release_unstarted(self, job_ids: list[int]) -> int:
        """Claimed jobs that were not started go back to `queued`, to their place in the
        queue and at the head of their key (their run_at unchanged), with the attempt the
        claim counted given back. One transaction. Returns how many were still running."""
        ...

    def release_unheld(self, held: Collection[int], now: float) -> int:
        """After a pass whose answer was lost (the store unreachable around its commit): jobs
        running under this process's claims that its pool does not hold go back to wait,
        their attempt given back, in one transaction. How many (0 where a failed
        transaction never commits)."""
        ...

    def watch_finish(self, job_id: int) -> None:
        """A client waits on this job here: its finish must be told to this process even
        when another host's worker ends it (a store whose finishes all happen here: nothing).
        Writes nothing."""
        ...

    def recover_orphans(self, max_requeues: int, now: float, running_here: Collection[int] = ()) -> Recovered:
        """Every `running` job but those of `running_here` (the jobs this process's workers
        hold, read with no claim under way) is an orphan (call only when no other worker of
        this store runs). A shared store (PostgreSQL) takes only the jobs whose worker
        stopped beating (or that no registered worker claimed), so there it is safe to call
        at any time.

        An orphan whose `orphaned` count is below max_requeues goes back to `queued` with
        that count grown by one; the others become `dead` with error type "orphaned". One
        transaction.
        """
        ...
