"""The store contract: every backend (memory, SQLite, PostgreSQL) implements `Store`.

Rules that hold for every method unless its docstring says otherwise:
- Each call is one transaction: it happens entirely or not at all, and when it returns
  the change is as durable as the backend promises (SQLite: on disk per --durability;
  memory: until the process exits). batch() makes several calls one transaction.
- Methods are safe to call from any thread, concurrently.
- Order among waiting jobs is priority (smaller first), then run_at, then id (insertion).
- Times are unix seconds (wall clock) and are passed in by the caller (`now`), so tests
  control time and stores never read the clock for decisions. One exception: PostgreSQL
  judges a worker's heartbeats by the database's clock, the one clock its hosts share.
Backends stay thin: retry policies, backoff, cron arithmetic and serialisation of results
live in the core, and admission is a plan made by core/policy that the store applies;
a store records what it is told, atomically.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ..core.job import Job, NewJob, Outcome, Submitted
from ..core.policy import claim
from ..core.policy.admission import NO_LIMITS, Admission, Refusal
from ..core.policy.memory import Footprint
from ..core.policy.resources import BudgetChange
from ..core.workflow import Definition, RunRecord
from .records import (
    CronFire,
    CronRecord,
    Event,
    EventAccepted,
    Finished,
    Minute,
    NewEvent,
    Pause,
    Recovered,
)


class Store(Protocol):
    url: str
    # The exceptions by which the store says it is itself in trouble (a lost connection, a
    # full or failing disk), never the data a call carried; the next call may succeed.
    UNAVAILABLE: tuple[type[BaseException], ...]
    # Those of UNAVAILABLE raised before anything was written (SQLite's full disk): the
    # call surely had no effect, so its caller is told so, not "it may have been stored".
    NOT_WRITTEN: tuple[type[BaseException], ...]
    # --max-queued for the jobs a workflow's fan-out enqueues in a finish (None: no cap).
    queue_cap: int | None

    # --- ownership --------------------------------------------------------------------
    def take_ownership(self) -> None:
        """Called by a daemon before it recovers orphans: make sure no other daemon serves
        this store, or raise StoreInUseError. Held until close(). A no-op where that cannot
        happen (memory) or is handled otherwise (PostgreSQL: workers beat hearts)."""
        ...

    # --- transactions -----------------------------------------------------------------
    def batch(self, bookkeeping: bool = False, defer_flush: bool = False) -> AbstractContextManager[None]:
        """Store calls made on this thread inside the block form one transaction, committed
        at its end, or rolled back if the block raises (every store, memory included: it
        leaves nothing behind). A batch opened inside another joins it. Writers on other
        threads may wait until it ends (SQLite and memory: all of them; PostgreSQL, with
        bookkeeping: the other bookkeeping batches), so keep the block short.

        With bookkeeping True, the commit may skip its own flush to disk (SQLite:
        synchronous=NORMAL in WAL; PostgreSQL: synchronous_commit off): use it only for
        changes whose loss in a power cut means a job runs again, never for acknowledging
        a submit.

        With defer_flush True, the commit may be visible (to claims, to readers) before it
        is durable: the caller calls flush() before acknowledging anything it wrote. It
        lets a job claimed with its submit start while the disk flushes (SQLite)."""
        ...

    def flush(self) -> None:
        """Return once every commit made so far is durable (after batch(defer_flush=True)).
        Stores whose commits are durable when they return do nothing."""
        ...

    def durability_said(self) -> str:
        """What an acknowledged write's durability is, as the start log says it (SQLite: its
        --durability; PostgreSQL: the server's synchronous_commit; memory: none). May read
        the store."""
        ...

    def durability_lost(self) -> str | None:
        """Why no write can be promised durable any more (a flush to disk failed: every
        write since is answered "may have been stored"; a store file was deleted under the
        daemon: every write since is refused), or None. Lasts until reopened."""
        ...

    def watch_files(self) -> bool:
        """Look at the store's files between commits (a daemon's timer): one deleted or
        replaced is noticed as at a commit. Whether to look again (False: nothing to watch,
        or already noticed)."""
        ...

    # --- submit -----------------------------------------------------------------------
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

    # --- schedule ---------------------------------------------------------------------
    def promote_due(self, now: float) -> int:
        """Move every `scheduled` job with run_at <= now to `queued`. Returns how many."""
        ...

    def next_scheduled_at(self) -> float | None:
        """Non-destructively read the earliest run_at among `scheduled` jobs, or None."""
        ...

    # --- claim ------------------------------------------------------------------------
    def claim_available(self, request: claim.Request) -> list[Job]:
        """Atomically move up to `request.limit` `queued` jobs to `running`, in queue order,
        at `request.now`.

        Resource control (core/policy/claim.py): a grouped job whose group runs its
        concurrency_limit already, and a job over a budget in force, are passed over and
        hold nothing (a patient one, by `limits.patience`, reserves its budgets); exact
        across hosts on PostgreSQL. The budgets in force are `request.limits`' own, except
        in a store that keeps them (PostgreSQL: see adopt_budgets), which reads
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

    # --- network ----------------------------------------------------------------------
    def park_for_network(self, now: float) -> int:
        """Move every `queued` job with retry_on_network to `waiting_network`. Returns how many."""
        ...

    def release_network_waiting(self, now: float) -> int:
        """Move every `waiting_network` job to `queued` with run_at = now, so they run in
        the order they were first enqueued (within priority). Returns how many."""
        ...

    # --- finish -----------------------------------------------------------------------
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
        given, replacing the last run's. One transaction for the batch.

        An outcome to succeeded or dead of a workflow step's job (outcome.workflow_run set)
        advances its run in the same transaction (store/workflows.py): the output recorded
        once per (run, step, item, loop), the next step's jobs inserted, the budget charged;
        a finish its run no longer waits for changes only the job. Jobs without a run cost
        one test of that field, nothing more. A run whose advance raises (a bug, or data
        whose problem shows only now) has what it wrote undone and ends `failed`, its reason
        naming the step and the error; the job's finish and the rest of the batch stand.
        """
        ...

    def release_unheld(self, held: Collection[int], now: float) -> int:
        """After a pass whose answer was lost (the store unreachable around its commit): jobs
        running under this process's claims that its pool does not hold go back to wait,
        their attempt given back. How many (0 where a failed transaction never commits)."""
        ...

    def watch_finish(self, job_id: int) -> None:
        """A client waits on this job here: its finish must be told to this process even
        when another host's worker ends it (a store whose finishes all happen here: nothing)."""
        ...

    # --- workflows --------------------------------------------------------------------
    def workflow_start(self, spec: Definition, state: dict[str, Any], now: float,
                       idempotency_key: str | None = None) -> tuple[RunRecord, bool]:
        """Store a new run and begin it, in one transaction: its first step's jobs (or child
        run) inserted, or its final state at once (a budget passed, items not a list).
        With a known idempotency key: the existing run and True, nothing written."""
        ...

    def workflow_get(self, run_id: int) -> RunRecord | None: ...

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

    # --- pools ------------------------------------------------------------------------
    def set_pool(self, kind: str, name: str, pool: str) -> int:
        """An operator's move to another pool: kind 'job' (name: its id; only while it
        waits), 'key' (its waiting jobs) or 'cron' (its template and its waiting runs).
        Returns how many jobs and crons moved."""
        ...

    def waiting_by_pool(self) -> dict[str, int]:
        """Waiting jobs (scheduled, queued, waiting_network) per pool; pools with none
        are absent."""
        ...

    # --- memory-aware start ---------------------------------------------------------------
    def footprints(self, funcs: list[str]) -> dict[str, Footprint]:
        """Each named function's expected peak memory and runtime, if it has a history."""
        ...

    def record_runs(self, runs: list[tuple[str, int | None, float, bool, bool]], now: float) -> None:
        """Fold runs (func, peak bytes or None, runtime, whether it was killed for its
        memory limit, whether the peak is an estimate) into the functions' footprints."""
        ...

    def release_unstarted(self, job_ids: list[int]) -> int:
        """Claimed jobs that were not started go back to `queued`, to their place in the
        queue and at the head of their key (their run_at unchanged), with the attempt the
        claim counted given back. Returns how many were still running."""
        ...

    def set_progress_if_running(self, updates: Sequence[tuple[int, int, dict[str, Any]]]) -> int:
        """Store each (job id, attempt, progress) as the job's `progress`, where that job is
        still `running` its attempt `attempt`; anything else (finished, re-queued, run again)
        is left alone. One transaction, which a power cut may undo (bookkeeping). Returns
        how many jobs it changed."""
        ...

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
        `limits` and tells the others; returns what changed ([]: it held them already). A
        store of one daemon keeps none (its config is the truth): [], nothing written."""
        ...

    def budgets_in_force(self, limits: claim.Limits) -> claim.Limits:
        """`limits` with the budgets every claim applies in place of its own (its patience
        kept): the store's on PostgreSQL, `limits` itself elsewhere. One small read."""
        ...

    # --- pauses -----------------------------------------------------------------------
    def pauses(self) -> list[Pause]: ...

    def resume(self, kind: str, name: str) -> bool:
        """Lift a pause and reset its streak. True if it was paused."""
        ...

    def recover_orphans(self, max_requeues: int, now: float, running_here: Collection[int] = ()) -> Recovered:
        """Every `running` job but those of `running_here` (the jobs this process's workers
        hold, read with no claim under way) is an orphan (call only when no other worker of
        this store runs). A shared store (PostgreSQL) takes only the jobs whose worker
        stopped beating (or that no registered worker claimed), so there it is safe to call
        at any time.

        An orphan whose `orphaned` count is below max_requeues goes back to `queued` with
        that count grown by one; the others become `dead` with error type "orphaned".
        """
        ...

    # --- operator actions -------------------------------------------------------------
    def cancel(self, job_id: int, now: float) -> Job | None:
        """Cancel a job that is scheduled, queued or waiting_network. Returns the job as
        it is after the call (unchanged if it was in another state), None if unknown."""
        ...

    def retry_dead(self, job_id: int, now: float) -> Job | None:
        """Move a `dead` job back to `queued` with a fresh attempt budget. Returns the job
        as it is after the call (unchanged if it was not dead), None if unknown."""
        ...

    def retry_all_dead(self, now: float) -> int:
        """retry_dead for every dead job and every dead event. Returns how many."""
        ...

    def purge(self, states: Sequence[str], finished_before: float, limit: int) -> int:
        """Delete up to `limit` jobs in these (final) states that finished before the
        time, oldest first; for `dead`, dead events created before it too. Returns how many."""
        ...

    # --- inspect ----------------------------------------------------------------------
    def get(self, job_id: int) -> Job | None: ...

    def list_jobs(self, state: str | None, limit: int, *, func: str | None = None, key: str | None = None,
                  pool: str | None = None) -> list[Job]:
        """Jobs, newest first, optionally of one state, function, serial key and pool (each
        filter given narrows the list)."""
        ...

    def cancel_running(self, job_id: int, now: float) -> Job | None:
        """An operator's cancel of a running job: `cancelled` at once (finished_at = now),
        so the outcome its run reports later changes nothing (finish_if_running applies
        only to running jobs). Its key is free at once. Returns the job as it is after
        (still in its state if it was not running); None if there is no such job."""
        ...

    def cancel_waiting(self, state: str, now: float, *, func: str | None = None, key: str | None = None,
                       pool: str | None = None) -> list[int]:
        """Cancel every job in `state` (scheduled, queued or waiting_network) matching the
        filters given, in one transaction. Returns their ids."""
        ...

    def pause(self, kind: str, name: str, now: float) -> bool:
        """An operator's pause of a key, function or pool ("key", "func", "pool"): no probe,
        it lasts until resume(); over a breaker's pause, it takes its probe away. True if
        it was not paused before."""
        ...

    def counts(self) -> dict[str, int]:
        """Number of jobs in each state (every state present, zero included)."""
        ...

    def prune_finished(self, finished_before: float, limit: int) -> int:
        """Delete up to `limit` succeeded or cancelled jobs finished before the time."""
        ...

    def prune_events(self, created_before: float, limit: int) -> int:
        """Delete up to `limit` delivered outbox events accepted before the time whose job
        is gone (deleted by retention or a purge): their event_id is forgotten with it, as a
        job's idempotency key is. Pending and dead events stay. Returns how many."""
        ...

    # --- per-minute counters (the history and the fleet's counts) ------------------------
    def add_minute(self, m: Minute) -> None:
        """Add a member's counts to its row of that minute (made if new); a depth given
        replaces the row's. Joins an enclosing batch (the pool writes it with a finish)."""
        ...

    def minutes(self, since: int) -> list[Minute]:
        """Every member's rows from minute `since` on, by minute then member."""
        ...

    def prune_minutes(self, before: int) -> int:
        """Delete the rows of minutes before `before`; returns how many."""
        ...

    def waiting_by_key(self, limit: int) -> list[tuple[str, int, float]]:
        """(key, waiting jobs, oldest run_at) for the keys with the most waiting jobs."""
        ...

    def oldest_queued_at(self) -> float | None:
        """Non-destructively read the earliest run_at among `queued` jobs (how long the
        longest-waiting due job has waited, for monitoring), or None when none is queued.
        Served by the queued-jobs index; cheap enough to call on every scrape."""
        ...

    # --- cron -------------------------------------------------------------------------
    def cron_save(self, cron: CronRecord) -> CronRecord:
        """Create or replace the cron of that name. Returns what is stored."""
        ...

    def cron_list(self) -> list[CronRecord]: ...

    def cron_delete(self, name: str) -> bool: ...

    def crons_due(self, now: float) -> list[CronRecord]:
        """Crons whose next_run_at <= now."""
        ...

    def next_cron_at(self) -> float | None: ...

    def cron_move_if(self, name: str, tick: float, new_tick: float) -> bool:
        """Set the cron's next_run_at to new_tick if it still equals `tick` (a firing or a
        new registration since it was read wins). Whether it moved."""
        ...

    def cron_fire_if_due(self, name: str, tick: float, next_tick: float, now: float) -> CronFire | None:
        """If the cron's next_run_at still equals `tick`, in one transaction: set next_run_at
        to next_tick and last_fired_at to tick, and either submit one job from its template
        (idempotency key `cron:NAME:TICK`, so a tick never runs twice; serial key the
        template's or `cron:NAME`, so runs of one cron never overlap) or, when a job of
        this cron is already waiting, fold the tick into it (folded grows by one; the job's
        cron_until becomes the tick, which the run reads as queickd.cron_last_tick()).
        Otherwise (not due any more, or unknown) None."""
        ...

    # --- events (the outbox) ----------------------------------------------------------
    def accept_event(self, event: NewEvent, now: float, admission: Admission) -> EventAccepted:
        """Store the event unless its id is known (then: duplicate), and deliver it at once
        if admission lets its job in; otherwise it stays pending, next attempt at now. An
        event whose serial key has a pending event is not tried now: it waits behind them
        (outbox.accepted_at)."""
        ...

    def deliver_events(self, now: float, admission: Admission, max_attempts: int,
                       backoff: Any, limit: int = 500) -> list[EventAccepted]:
        """Try the pending events that are due, by next attempt, then in the order accepted:
        each becomes a job (idempotency key `event:ID`) if admitted; else its attempts grow
        and its next try is now + backoff(attempts), or, at max_attempts, it is dead with the
        refusal. A refused event holds its key's later events as long (outbox.KeyOrder):
        they are not tried, and no attempt of theirs is counted."""
        ...

    def next_event_at(self) -> float | None: ...

    def oldest_pending_event_at(self) -> float | None:
        """Non-destructively read when the oldest `pending` outbox event was created, or
        None when none is pending (for monitoring)."""
        ...

    def event_counts(self) -> dict[str, int]:
        """Events by state: pending, delivered, dead (every state present)."""
        ...

    def list_events(self, state: str | None, limit: int) -> list[Event]: ...

    def retry_event(self, event_id: str, now: float) -> Event | None:
        """A dead event back to pending, due now, attempts reset. None if unknown."""
        ...

    def close(self) -> None: ...
