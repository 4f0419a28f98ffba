"""What a worker pool is built with: its settings (PoolConfig: named defaults, checked when
made) and where it tells what happens (PoolHooks: each hook does nothing unless given).

The hooks are the pool's only way out to the parts built after it (the scheduler, the
clients' waiters, the network checker): an assembly builds the pool, then those parts,
then hands the pool its hooks with `WorkerPool.report_to`, before starting it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core.job import Job, Outcome
from ..core.policy.claim import NO_LIMITS, Limits
from ..settings import DEFAULT_WORKERS


@dataclass(frozen=True)
class PoolConfig:
    workers: int = DEFAULT_WORKERS  # worker threads of a fixed size (an adaptive PoolSize sets its own)
    pools: list[str] | None = None  # the worker pools whose jobs it runs; None: every pool
    pause_after: int | None = None  # failures in a row that pause a key or function; None or 0: never
    pause_cooldown: float | None = None  # seconds from a pause to its probe; None: until resumed
    limits: Limits = NO_LIMITS  # the budgets in force at start (BudgetsInForce swaps the pool's later)
    async_jobs: int = 0  # held jobs that may run on the runner's event loop besides the threads

    def __post_init__(self) -> None:
        if self.workers < 0 or self.async_jobs < 0:
            raise ValueError("workers and async_jobs must be 0 or more")


@dataclass(frozen=True)
class PoolHooks:
    """Called from the pool's threads (a pass's, a worker's); none may block for long."""

    on_claimed: Callable[[list[Job]], None] = lambda jobs: None  # jobs claimed, once committed
    on_finished: Callable[[list[Outcome]], None] = lambda outcomes: None  # outcomes stored
    on_ran: Callable[[Job, Outcome, float], None] | None = None  # (job, outcome, seconds): metrics
    on_probe_at: Callable[[float], None] = lambda t: None  # a pause's probe is due then: wake the pool
    on_deferred: Callable[[float], None] = lambda t: None  # a job set aside for memory may start then
    on_rate_at: Callable[[float], None] = lambda t: None  # a rate key may start a job then
    network_checker: Callable[[], bool] = lambda: False  # is a checker there to release parked jobs?
    network_up: Callable[[], bool] = lambda: True  # may jobs that need the network start now?


DEFAULT_CONFIG = PoolConfig()
NO_HOOKS = PoolHooks()  # a pool that tells nobody (tests, a pool whose hooks come later)
