"""The parts that run jobs, a daemon's and a `queick worker`'s alike, built once and in
order: the budgets in force, the memory gate, the runner, the progress writer, the liveness
watch and the pool;
then, on a shared store, the fleet membership, and the maintenance both run.

Each caller opens its store and makes its loader first (a daemon checks its hooks with it
before opening anything), builds these, adds its own parts, and last gives the pool its
hooks (WorkerPool.report_to) once the parts they reach exist. Nothing here reaches a part
built after it: what follows a part subscribes to it (BudgetsInForce.on_change) or is
handed to it whole."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import heap
from ..core import sandbox
from ..core.policy.claim import Limits
from ..run import isolate
from ..run.base import Runner
from ..run.loader import FunctionLoader
from ..run.routing import make_runner
from ..settings import Config, WorkerConfig
from ..store import Store
from ..store.contract.fleet import FleetStore
from .budgets import BudgetsInForce
from .fleet import FleetMember
from .liveness import LivenessWatch
from .maintenance.maintainer import Every, Service
from .memory_gate import MemoryGate
from .pool_config import PoolConfig
from .pool_size import adaptive_size
from .progress import ProgressWriter
from .worker import WorkerPool

if TYPE_CHECKING:
    from .forwarder.forwarder import Forwarder

log = logging.getLogger("queickd.assembly")


@dataclass
class JobParts:
    """What runs jobs in this process, and how the parts start and stop together."""

    store: Store
    config: Config | WorkerConfig
    loader: FunctionLoader
    budgets: BudgetsInForce
    memory: MemoryGate
    runner: Runner
    progress: ProgressWriter
    liveness: LivenessWatch
    pool: WorkerPool
    clock: Callable[[], float]

    def join_fleet(self, store: FleetStore, kind: str, **hooks: Callable) -> FleetMember:
        """This process's membership of its shared store's fleet (not started): registry,
        heartbeats, orphans of gone members, LISTEN; a change of the budgets in force is
        read again. `hooks` are FleetMember's own (on_finished_ids, on_version_change, ...)."""
        c = self.config
        return FleetMember(store, self.pool, kind=kind, heartbeat=c.heartbeat, sweep=c.sweep,
                           max_orphan_requeues=c.max_orphan_requeues, on_budgets=self.budgets.refresh,
                           clock=self.clock, **hooks)

    def maintenance(self) -> list[Service]:
        """The maintenance every process that runs jobs needs, each at the sweep's interval:
        the minute counts an idle pool's passes do not write, and the memory a run's large
        state left free in malloc's heaps given back to the system."""
        sweep = self.config.sweep
        return [Every("minute_counts", sweep, self.pool.flush_counts), Every("heap_trim", sweep, heap.trim)]

    def reload(self) -> None:
        """SIGHUP: the job code, re-imported by the loader and by the runner's processes."""
        self.loader.reload()
        self.runner.reload()

    def start(self) -> None:
        self.runner.start()
        self.pool.start()

    def stop(self, timeout: float) -> bool:
        """Stop claiming, wait up to `timeout` s for running jobs (True if all ended), stop
        the runner and write the progress still held."""
        finished = self.pool.stop(timeout)
        self.runner.stop()
        self.liveness.stop()
        self.progress.stop()
        return finished

    def _budgets_changed(self, limits: Limits) -> None:
        self.pool.limits = limits


def build(store: Store, loader: FunctionLoader, config: Config | WorkerConfig, *,
          secrets: Iterable[str | None] = (), clock: Callable[[], float] = time.time) -> JobParts:
    """Build the parts, none started. `secrets`: files process jobs must not see besides
    the store's. OSError when the budgets in force cannot be read."""
    budgets = BudgetsInForce(store, config.resources.limits)
    try:
        limits = budgets.adopt()
    except store.UNAVAILABLE as e:
        raise OSError(f"cannot read the budgets in force in {store.url}: {e}") from e
    memory = MemoryGate(store, reserve_mb=config.memory_reserve, max_rss_mb=config.max_rss, root=config.memory_root)
    hidden = isolate.hidden_paths(config.store, [*secrets, config.config], [loader.app_dir, tempfile.gettempdir()])
    runner = make_runner(loader, sandbox.settings(config), config.sandbox_env, measure=memory.measures_run,
                         hidden=hidden, namespaces=config.job_namespaces != "off", user=config.job_user)
    progress = ProgressWriter(store)  # what jobs say of their progress, in batches
    watch = LivenessWatch(store, runner)  # which runs with a stalled_after are stalled
    runner.liveness = watch
    runner.report_progress_to(watch.sink(progress.offer))
    pool = WorkerPool(
        store, loader,
        PoolConfig(config.workers, pools=list(config.pool), pause_after=config.pause_after,
                   pause_cooldown=config.pause_cooldown, limits=limits, async_jobs=config.async_jobs),
        clock=clock, runner=runner, memory=memory,
        size=adaptive_size(config.workers, config.min_workers, config.max_workers, config.idle_grace, clock))
    pool.progress = progress
    parts = JobParts(store, config, loader, budgets, memory, runner, progress, watch, pool, clock)
    budgets.on_change.append(parts._budgets_changed)
    return parts


def forwarder(store: Store, upstream: dict, on_settled: Callable[[list[int]], None], *,
              clock: Callable[[], float] = time.time) -> Forwarder | None:
    """An edge daemon's forwarder (not started) for its `[upstream]` section; None without
    one. ValueError for a section that does not parse."""
    from .forwarder.forwarder import Forwarder
    from .forwarder.settings import parse

    settings = parse(upstream)
    if settings is None:
        return None
    return Forwarder(store, settings, clock=clock, on_settled=on_settled)
