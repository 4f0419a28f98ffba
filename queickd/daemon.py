"""The daemon: the wiring of store, committer, scheduler, pool and server.

It wires and starts/stops; it decides nothing itself. What becomes of jobs waiting for
the network is services/network.py's, retention services/retention.py's, the fleet's
membership services/fleet.py's; the callbacks here only pass events between the parts.

Start order: recover orphans, then the pool, scheduler, committer, and last the server,
so nothing is accepted before it can be stored and run. Stop order is the reverse: stop
accepting and send the replies owed, commit what was accepted, stop the timers, let the
running jobs finish (bounded by stop_timeout), close the store.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from . import __version__, collector, heap
from .api.hooks import parse_hooks
from .api.server import Server
from .api.service import QueueService
from .api.tls import server_context
from .api.tokens import Tokens
from .core import protocol
from .core.job import NewJob, Outcome, State, Submitted
from .core.policy import outbox
from .core.policy.claim import Limits
from .run import isolate
from .run.loader import FunctionLoader
from .run.routing import make_runner
from .services import sdnotify
from .services.batcher import SubmitBatcher
from .services.budgets import BudgetsInForce
from .services.fleet import FleetMember
from .services.memory_gate import MemoryGate
from .services.netcheck import NetworkMonitor
from .services.network import NetworkParking
from .services.pool_config import PoolConfig, PoolHooks
from .services.pool_size import PoolSize, adaptive_size
from .services.progress import ProgressWriter
from .services.retention import Retention
from .services.scheduler import Scheduler
from .services.worker import WorkerPool
from .settings import EX_VERSION, Config
from .startcheck import validate
from .store import Store, open_store
from .store.fleetbase import FleetStore
from .store.records import EventState, Minute, Recovered
from .ui.metrics import Metrics

if TYPE_CHECKING:
    from .api.httpd import HttpServer

log = logging.getLogger("queickd.daemon")
FILES_WATCH = 1.0  # seconds between two looks at the store's files while commits come


def _contents(path: str | None) -> bytes | None:
    """The config file's bytes (None for none, or one that cannot be read now)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def pool_size(config: Config, clock: Callable[[], float] = time.time) -> PoolSize:
    """The pool's size: fixed (--workers) or adaptive between --min-workers and --max-workers."""
    return adaptive_size(config.workers, config.min_workers, config.max_workers, config.idle_grace, clock)


class Daemon:
    def __init__(self, config: Config, clock: Callable[[], float] = time.time) -> None:
        validate(config)
        self.config = config
        self.clock = clock
        self.store: Store | None = None
        self.server: Server | None = None
        self.http: HttpServer | None = None
        self.metrics = Metrics(clock)
        self.network: NetworkMonitor | None = None
        self.progress: ProgressWriter | None = None
        self._stop = threading.Event()
        self._stopped = False
        self._wakeup_w: int | None = None
        self.fleet: FleetMember | None = None  # with a shared store: registry, heartbeats, LISTEN
        self.exit_status = 0
        # Called in order on SIGHUP (reload()), on the main thread: the loader's re-import
        # first; other parts that hold job code (a runner's zygote) add theirs.
        self.on_reload: list[Callable[[], None]] = []
        self._config_read = _contents(config.config)  # what reload() compares the file with

    def start(self) -> None:
        c = self.config
        tokens = Tokens(c.token_file, self.clock) if c.token_file is not None else None
        http_token = c.read_http_token()
        self.loader = loader = FunctionLoader(c.app_dir, c.allow)
        self.on_reload.insert(0, loader.reload)
        hooks = parse_hooks(c.hooks)
        resources = c.resources
        for hook in hooks.values():
            try:
                if hook.workflow is None:
                    loader.check(hook.func)  # a hook that could never run is a configuration error
                elif hook.workflow not in c.workflows:
                    raise ValueError(f"hooks.{hook.name}: no workflow named {hook.workflow!r} is declared")
            except protocol.QueueError as e:
                raise ValueError(f"hooks.{hook.name}: {e.message}") from None
        self.store = store = open_store(c.store, c.durability)
        store.queue_cap = c.max_queued  # a paced fan-out's items wait under it like any enqueue
        try:
            store.take_ownership()
        except BaseException:
            store.close()
            raise
        # The budgets in force: this config's on SQLite; on PostgreSQL the store's, which this
        # config replaces if it names any.
        self.budgets = BudgetsInForce(store, resources.limits, on_change=self._budgets_changed)
        try:
            resources = replace(resources, limits=self.budgets.adopt())
        except store.UNAVAILABLE as e:
            store.close()
            raise OSError(f"cannot read the budgets in force in {store.url}: {e}") from e
        self._orphans_recovered = False
        self._recover_orphans()
        if c.ping_host is not None:
            self.network = NetworkMonitor(c.ping_host, c.ping_interval, lambda up: self.parking.on_change(up),
                                          clock=self.clock)
        memory = MemoryGate(store, reserve_mb=c.memory_reserve, max_rss_mb=c.max_rss, root=c.memory_root)
        secrets = [c.token_file, c.http_token_file, c.config, c.tls_key,
                   *(spec.get("secret_file") for spec in c.hooks.values())]  # parse_hooks checked them
        hidden = isolate.hidden_paths(c.store, secrets, [loader.app_dir, tempfile.gettempdir()])
        self.runner = make_runner(loader, c.sandbox_settings, c.sandbox_env, measure=memory.measures_run,
                                  hidden=hidden, namespaces=c.job_namespaces != "off", user=c.job_user)
        self.on_reload.append(self.runner.reload)  # process jobs re-import the app too
        self.metrics.sandbox = self.runner.stats
        self.progress = ProgressWriter(store)  # what jobs say of their progress, in batches
        self.runner.report_progress_to(self.progress.offer)
        self.metrics.progress = self.progress.stats
        self.parking = NetworkParking(store, self.network, lambda: self.pool.wake(), clock=self.clock)
        self.retention = Retention(store, c.keep_finished, clock=self.clock)
        if c.keep_finished < c.idempotency_ttl:  # the key lives on its job's row
            log.warning("keep_finished (%.0f s) is shorter than idempotency_ttl (%.0f s): a finished job's "
                        "idempotency key is forgotten when the job is deleted, and a repeat then makes a "
                        "new job", c.keep_finished, c.idempotency_ttl)
        self.pool = WorkerPool(
            store, loader,
            PoolConfig(c.workers, pools=list(c.pool), pause_after=c.pause_after, pause_cooldown=c.pause_cooldown,
                       limits=resources.limits, async_jobs=c.async_jobs),
            PoolHooks(network_checker=lambda: self.parking.checker, network_up=self.parking.network_up,
                      on_finished=self._on_finished,
                      on_claimed=lambda jobs: self.service.waiters.notify([j.id for j in jobs]),
                      on_probe_at=lambda t: self.scheduler.wake_at(t, "probes"), on_ran=self.metrics.on_ran,
                      on_deferred=lambda at: self.scheduler.wake_at(at, "set_aside")),
            clock=self.clock, memory=memory, size=pool_size(c, self.clock), runner=self.runner)
        self.pool.progress = self.progress
        self.scheduler = Scheduler(store, self.pool.wake, clock=self.clock, sweep=c.sweep,
                                   on_sweep=self._on_sweep, timers={"events": self._deliver_events,
                                                                    "probes": self._probes_due,
                                                                    "set_aside": self._set_aside_due,
                                                                    "files": self._watch_files})
        self.batcher = SubmitBatcher(store, self._on_committed, clock=self.clock, admission=c.admission,
                                     dispatch=self.pool)
        self.service = QueueService(store, self.batcher, loader, self.scheduler, self.pool,
                                    tokens=tokens, clock=self.clock, network=self.network,
                                    metrics=self.metrics, resources=resources,
                                    workflows=c.workflows, workflow_budget=c.workflow_budget)
        for name in c.workflows:  # a declared workflow that could never start is a configuration error
            try:
                self.service.resolve_definition(None, name)
            except protocol.QueueError as e:
                store.close()
                raise ValueError(f"workflows.{name}: {e.message}") from None
        self.server = Server(self.service, c.bind, c.port, max_line=c.max_line,
                             accept_queick_clients=c.accept_queick_clients, max_connections=c.max_connections,
                             hello_timeout=c.hello_timeout, max_pending=c.max_pending,
                             tls=server_context(c.tls_cert, c.tls_key, c.tls_client_ca))
        if c.tls_cert is not None:
            self.server.reload_tls = lambda: server_context(c.tls_cert, c.tls_key, c.tls_client_ca)
        self.on_reload.append(self.server.reload_access)  # a renewed certificate, a revoked token
        if c.http is not None:
            # http.server and the status page (a sixth of the daemon's imports) only for a
            # daemon that serves HTTP.
            from .api.httpd import HttpServer, parse_address

            self.http = HttpServer(self.service, self.metrics, hooks, *parse_address(c.http), token=http_token)
        elif hooks:
            log.warning("%d webhook(s) declared but no --http listener: they cannot be reached", len(hooks))
        # Bind before anything can run: a daemon that cannot serve its port must not have
        # started jobs on its way out.
        self.batcher.start()
        try:
            self.server.start()
            if self.http is not None:
                self.http.start()
        except BaseException:
            self.server.stop()
            self.batcher.stop()
            store.close()
            raise
        if self.network is not None:
            self.network.start()
        if isinstance(store, FleetStore):  # shared with other workers: registry, heartbeats, LISTEN
            self.fleet = FleetMember(store, self.pool, kind="daemon", heartbeat=c.heartbeat, sweep=c.sweep,
                                     max_orphan_requeues=c.max_orphan_requeues,
                                     on_finished_ids=self._on_finished_elsewhere,
                                     on_scheduled=lambda run_at: self.scheduler.wake_at(run_at),
                                     on_version_change=self._on_version_change,
                                     on_budgets=self.budgets.refresh,
                                     on_listening=self._waiters_look_again,
                                     on_beat=self._read_served_pools, clock=self.clock)
            self.fleet.start()
            self._read_served_pools()
        else:  # this daemon is its store's only worker
            self.service.served.set(c.pool if self.pool.claims else [])
        self.runner.start()
        self.pool.start()
        self.scheduler.start()

    def announce(self) -> None:
        """Log the addresses served: the line that says the daemon is ready (scripts, tests
        and the bench wait for it), so it comes once the process is fully set up."""
        store = self.store
        assert store is not None
        host, port = self.server.address  # type: ignore[misc]
        if self.http is not None:
            log.info("HTTP endpoint http://%s:%d/ (%d webhook(s))", *self.http.address,  # type: ignore[misc]
                     len(self.http.hooks))
        log.info(
            "queickd %s listening on %s:%d (store %s, %s, %s)",
            __version__, host, port, store.url, store.durability_said(), self.pool.size_said(),
        )
        self.runner.announce()

    def _read_served_pools(self) -> None:
        """The pools the registry's live workers serve, for the enqueue check's warning
        (the heartbeat's thread, and once at start)."""
        served = self.service.served
        try:
            if served.from_registry(self.store.workers()):  # type: ignore[union-attr]
                log.debug("pools served by live workers: %s", ", ".join(served.pools) or "none")
        except Exception as e:  # the warning waits for the next beat; nothing else does
            log.debug("could not read the worker registry: %s", e)

    def _recover_orphans(self) -> None:
        """At start; while the store cannot be written (a full disk), again at each sweep."""
        store = self.store
        pool: WorkerPool | None = getattr(self, "pool", None)

        def recover(running_here: frozenset[int]) -> Recovered:
            return store.recover_orphans(self.config.max_orphan_requeues, self.clock(), running_here)  # type: ignore[union-attr]

        try:
            # Once the pool has started (a recovery put off by a full disk), the jobs it
            # claimed meanwhile are running here: they are not the previous run's.
            recovered = recover(frozenset()) if pool is None else pool.with_held(recover)
        except store.UNAVAILABLE as e:  # type: ignore[union-attr]
            log.warning("cannot recover jobs left running by a previous run yet (%s); trying again at "
                        "each sweep", e)
            return
        self._orphans_recovered = True
        if recovered.requeued or recovered.dead:
            log.warning(
                "recovered jobs left running by a previous run: %d re-queued, %d dead (orphaned)",
                len(recovered.requeued), len(recovered.dead),
            )

    def _on_version_change(self, reason: str) -> None:
        log.error("stopping: %s", reason)
        self.exit_status = EX_VERSION
        self.request_stop()

    def _deliver_events(self, now: float) -> float | None:
        """The outbox timer: deliver the events that are due; returns the next due time."""
        results = self.store.deliver_events(  # type: ignore[union-attr]
            now, self.config.admission, self.config.event_max_attempts, outbox.backoff)
        if any(r.state == EventState.DELIVERED for r in results):
            self.pool.wake()
        for r in results:
            if r.state == EventState.DELIVERED:
                log.info("event %s delivered from the outbox as job %d", r.event_id, r.job_id)
            elif r.state == EventState.DEAD:
                log.warning("event %s could not be delivered after %d attempts; it is a dead letter "
                            "('queick dead', 'queick retry --event')", r.event_id, self.config.event_max_attempts)
        return self.store.next_event_at()  # type: ignore[union-attr]

    def _set_aside_due(self, now: float) -> float | None:
        """The timer of the jobs the pool set aside for want of memory: one may be claimed
        again, so the pool looks; returns when the next one may."""
        self.pool.wake()
        return self.pool.next_set_aside_at(now)

    def _watch_files(self, now: float) -> float | None:
        """The store files' timer, armed by commits: a WAL deleted while the daemon is idle
        is noticed within a second (its commits saved), not at the next enqueue, which may
        come after a crash. It stops once the store has nothing left to lose."""
        return now + FILES_WATCH if self.store.watch_files() else None  # type: ignore[union-attr]

    def _probes_due(self, now: float) -> float | None:
        """The probe timer: a pause's probe time has come, so the pool claims (and lets the
        probe through); returns the next probe time still ahead."""
        self.pool.wake()
        return min((p.probe_at for p in self.store.pauses()  # type: ignore[union-attr]
                    if p.probe_at is not None and p.probe_at > now), default=None)

    def _on_sweep(self) -> None:
        if not self._orphans_recovered:
            self._recover_orphans()
        self.retention.prune()
        counts = self.store.counts()  # type: ignore[union-attr]
        depth = sum(counts[s] for s in State.PENDING)
        self.metrics.sample_depth(depth)
        # The depth kept in the store too, with the runs: the chart survives a restart.
        self.store.add_minute(Minute(int(self.clock() // 60), self.pool.member, 0, 0, 0.0, depth))  # type: ignore[union-attr]
        self.pool.flush_counts()
        self.parking.on_sweep()
        heap.trim()  # what a run's large state left free in the heaps goes back to the system
        nxt = self._probes_due(self.clock())  # pauses begun by other hosts of a shared store
        if nxt is not None:
            self.scheduler.wake_at(nxt, "probes")

    def _on_committed(self, jobs: list[NewJob], submitted: list[Submitted]) -> None:
        self.metrics.on_committed(jobs, submitted)
        self.scheduler.wake_at(self.clock() + FILES_WATCH, "files")  # nothing if armed already
        self.parking.on_committed(jobs)
        later = [j.run_at for j, s in zip(jobs, submitted, strict=True) if s.state == State.SCHEDULED and not s.duplicate]
        if later:
            self.scheduler.wake_at(min(later))

    def _on_finished(self, outcomes: list[Outcome]) -> None:
        retries = [o.run_at for o in outcomes if o.state == State.SCHEDULED and o.run_at is not None]
        if retries:
            self.scheduler.wake_at(min(retries))
        self.service.waiters.notify([o.job_id for o in outcomes])
        if any(o.workflow_run is not None for o in outcomes):
            self.service.run_waiters.notify_all()

    def _budgets_changed(self, limits: Limits) -> None:
        """Another process wrote the budgets in force (listener thread): enqueue checks and
        claims take the new ones (on PostgreSQL claims read them themselves anyway)."""
        self.service.resources = replace(self.service.resources, limits=limits)
        self.pool.limits = limits
        self.pool.wake()

    def _waiters_look_again(self) -> None:
        """The listener (re)connected: a finish told while it was away was missed, so every
        client waiting on a job or a run reads its state again."""
        self.service.waiters.notify_all()
        self.service.run_waiters.notify_all()

    def _on_finished_elsewhere(self, job_ids: list[int]) -> None:
        """Jobs another host finished (PostgreSQL NOTIFY): their waiters, and the run
        waiters, since any of them may be a workflow step (each re-reads its run)."""
        self.service.waiters.notify(job_ids)
        self.service.run_waiters.notify_all()

    def reload(self) -> None:
        """SIGHUP (`systemctl reload queickd`): run the on_reload callbacks; one that fails is
        logged and the others still run. Jobs running now finish with the code they have."""
        log.info("SIGHUP: reloading job code, the token file and the TLS certificate")
        for cb in list(self.on_reload):
            try:
                cb()
            except Exception:
                log.exception("reload: %s failed; going on", getattr(cb, "__qualname__", cb))
        # The settings (function tables, hooks, budgets, flags) were merged with the
        # environment and the command line at start and wired into every part: a reload
        # re-imports job code only, and an edited file would silently not be in force.
        if self.config.config is not None and _contents(self.config.config) != self._config_read:
            log.warning("reload: %s changed since the daemon started; SIGHUP reloads job code, the token file "
                        "and the TLS certificate only; the file's settings take effect when the daemon restarts (systemctl restart queickd)",
                        self.config.config)

    def request_stop(self, *_: object) -> None:
        """Ask run_forever() to stop, from any thread."""
        self._stop.set()
        if self._wakeup_w is not None:
            try:
                os.write(self._wakeup_w, bytes([signal.SIGTERM]))
            except OSError:
                pass  # the pipe is full: a stop is already on its way

    def stop(self) -> bool:
        """Graceful stop. True if every running job finished within stop_timeout; False also
        when the call of a job cancelled while it ran has not returned (the stop does not
        wait for it: the caller exits without waiting for its thread)."""
        if self._stopped or self.store is None:
            return True
        self._stopped = True
        self.pool.stop_claiming()
        log.info("stopping: no new requests or claims; waiting up to %.0f s for running jobs",
                 self.config.stop_timeout)
        # Each step runs even if an earlier one failed: a stuck connection must not keep
        # accepted jobs from being committed or running jobs from finishing.
        for step in (self.http.stop if self.http is not None else None, self.server.stop, self.batcher.stop, self.scheduler.stop,  # type: ignore[union-attr]
                     self.network.stop if self.network is not None else None):
            if step is not None:
                try:
                    step()
                except Exception:
                    log.exception("error while stopping (%s); going on", step.__qualname__)
        finished = self.pool.stop(self.config.stop_timeout)
        self.runner.stop()
        if self.progress is not None:
            self.progress.stop()
        if self.fleet is not None:
            self.fleet.stop()
        # Read once: a call that returns now changes neither what the store holds nor the exit.
        cancelled = self.pool.cancelled_running
        if cancelled:
            log.warning("%d cancelled job(s) still in their call at exit (a thread job blocked in a call "
                        "Python cannot interrupt); they stay cancelled, and the exit ends their threads",
                        cancelled)
        if finished:
            self.store.close()
            log.info("stopped")
        else:
            log.warning("%d job(s) still running at the stop timeout; they stay running in the store and "
                        "are recovered as orphans on the next start", self.pool.running_in_store)
        return finished and not cancelled

    def run_forever(self) -> bool:
        """Start, serve until SIGTERM/SIGINT, stop. Returns what stop() returned.

        The kernel may hand a signal to any of our threads, and CPython then only flags it
        for the main thread: a main thread blocked in a lock would never notice. So the
        main thread blocks reading a pipe that the C-level handler writes to from whatever
        thread received the signal (signal.set_wakeup_fd): no polling, no lost SIGTERM."""
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._wakeup_w = w
        signal.set_wakeup_fd(w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: None)  # the byte in the pipe is what counts
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: where is it stuck?
        self.start()
        collector.tune_for_server()  # set up: what it holds now lives as long as it does
        heap.return_large_blocks()  # a large state freed goes back to the system
        self.announce()
        sdnotify.notify("READY=1")
        sdnotify.start_watchdog(lambda: self.scheduler.alive, self._stop)
        while not self._stop.is_set():
            received = os.read(r, 64)
            if signal.SIGTERM in received or signal.SIGINT in received:
                self._stop.set()
            elif signal.SIGHUP in received:
                self.reload()
        sdnotify.notify("STOPPING=1")
        return self.stop()
