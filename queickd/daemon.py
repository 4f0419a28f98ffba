"""The daemon: its settings, and the wiring of store, committer, scheduler, pool and server.

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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from . import __version__
from .api.connection import DEFAULT_HELLO_TIMEOUT, DEFAULT_MAX_PENDING
from .api.hooks import parse_hooks
from .api.httpd import HttpServer, parse_address
from .api.server import DEFAULT_HOST, DEFAULT_MAX_CONNECTIONS, Server
from .api.service import QueueService
from .core import protocol, sandbox
from .core.job import DEFAULT_POOL, NewJob, Outcome, State, Submitted
from .core.policy import outbox
from .core.policy.admission import Admission
from .core.policy.claim import Limits
from .core.policy.resources import Resources
from .core.policy.resources import parse as parse_resources
from .run.loader import FunctionLoader
from .run.routing import make_runner
from .services import sdnotify
from .services.batcher import SubmitBatcher
from .services.budgets import BudgetsInForce
from .services.fleet import DEFAULT_HEARTBEAT, EX_VERSION, FleetMember
from .services.memory_gate import DEFAULT_RESERVE_MB, MemoryGate
from .services.netcheck import DEFAULT_INTERVAL, NetworkMonitor, parse_target
from .services.network import NetworkParking
from .services.pool_size import DEFAULT_IDLE_GRACE, PoolSize, adaptive_size
from .services.retention import Retention
from .services.scheduler import Scheduler
from .services.worker import DEFAULT_SWEEP, DEFAULT_WORKERS, WorkerPool
from .store import DEFAULT_URL, Store, open_store
from .store.base import FleetStore
from .store.records import EventState, Minute
from .ui.metrics import Metrics

log = logging.getLogger("queickd.daemon")



@dataclass
class Config:
    """Every daemon setting with its default; the CLI builds its flags from these."""

    store: str = DEFAULT_URL
    durability: str = "full"
    bind: str = DEFAULT_HOST
    port: int = protocol.DEFAULT_PORT
    workers: int = DEFAULT_WORKERS
    app_dir: str = "."
    allow: list[str] = field(default_factory=list)
    token_file: str | None = None
    stop_timeout: float = 30.0
    max_orphan_requeues: int = 3
    sweep: float = DEFAULT_SWEEP
    max_line: int = protocol.MAX_LINE
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # TCP connections at once (lowered to fit RLIMIT_NOFILE)
    hello_timeout: float = DEFAULT_HELLO_TIMEOUT  # seconds to send a first line / authenticate
    max_pending: int = DEFAULT_MAX_PENDING  # replies owed per connection before reading pauses
    ping_host: str | None = None
    ping_interval: float = DEFAULT_INTERVAL
    max_queued: int = 1_000_000
    max_queued_per_key: int = 100
    idempotency_ttl: float = 24 * 3600.0
    event_max_attempts: int = 10
    pause_after: int = 5  # 0: no auto-pause
    pause_cooldown: float = 300.0  # seconds from a pause to its probe (doubling on each trip)
    keep_finished: float = 7 * 24 * 3600.0
    http: str | None = None  # HOST:PORT of the HTTP listener (webhooks, metrics, status page)
    http_token_file: str | None = None  # bearer token of the HTTP read endpoints
    accept_queick_clients: bool = False
    hooks: dict = field(default_factory=dict)  # [hooks.NAME] tables of the config file
    workflows: dict = field(default_factory=dict)  # [workflows.NAME] tables: definitions started by name
    pool: list[str] = field(default_factory=lambda: [DEFAULT_POOL])  # worker pools its workers serve
    heartbeat: float = DEFAULT_HEARTBEAT  # seconds between beats in a shared (PostgreSQL) store
    # [functions."module:func"]: a function's job defaults (core/policy/resources.py) and its
    # isolation, limits and credentials (core/sandbox.py)
    functions: dict = field(default_factory=dict)
    budgets: dict = field(default_factory=dict)  # [budgets.pools] and [budgets.groups]
    budget_patience: float = 30.0  # seconds before a job over its budget reserves it
    memory_reserve: float = DEFAULT_RESERVE_MB  # MB kept free by the memory-aware start
    max_rss: float | None = None  # MB this process may grow to, jobs included
    memory_root: str = "/"  # where /proc and /sys/fs/cgroup are read (tests point it elsewhere)
    min_workers: int | None = None  # adaptive pool bounds (None: --workers, a fixed size)
    max_workers: int | None = None
    idle_grace: float = DEFAULT_IDLE_GRACE  # seconds the queue is quiet before the pool shrinks
    isolation: str = sandbox.THREAD  # where jobs run unless they or their function say otherwise
    timeout: float | None = None  # limits for every job (each one sends jobs to processes)
    memory_mb: int | None = None
    output_kb: int | None = None
    sandbox_env: list[str] = field(default_factory=list)  # variables passed on to process jobs

    @property
    def sandbox_settings(self) -> sandbox.Defaults:
        return sandbox.settings(self)

    @property
    def admission(self) -> Admission:
        return Admission(self.max_queued, self.max_queued_per_key, self.idempotency_ttl)

    def pool_size(self, clock: Callable[[], float] = time.time) -> PoolSize:
        return adaptive_size(self.workers, self.min_workers, self.max_workers, self.idle_grace, clock)

    @property
    def resources(self) -> Resources:
        return parse_resources(self.functions, self.budgets, self.budget_patience)
    def validate(self) -> None:
        if self.durability not in ("full", "normal"):
            raise ValueError("durability must be 'full' or 'normal'")
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be 0-65535")
        if self.workers < 0:
            raise ValueError("workers must be 0 or more")
        if not os.path.isdir(self.app_dir):
            raise ValueError(f"app directory {self.app_dir!r} does not exist")
        if self.stop_timeout < 0 or self.sweep <= 0 or self.max_orphan_requeues < 0:
            raise ValueError("stop_timeout, sweep and max_orphan_requeues must not be negative")
        if min(self.max_queued, self.max_queued_per_key, self.event_max_attempts) < 1:
            raise ValueError("max_queued, max_queued_per_key and event_max_attempts must be at least 1")
        if self.pause_after < 0 or not self.pause_cooldown > 0:
            raise ValueError("pause_after must not be negative (0: off), pause_cooldown must be positive")
        if min(self.max_connections, self.max_pending) < 1 or not self.hello_timeout > 0:
            raise ValueError("max_connections and max_pending must be at least 1; hello_timeout must be positive")
        if not self.pool or not all(self.pool) or not self.heartbeat > 0:
            raise ValueError("give at least one non-empty pool; heartbeat must be positive")
        if self.memory_reserve < 0 or (self.max_rss is not None and not self.max_rss > 0):
            raise ValueError("memory_reserve must not be negative, max_rss must be positive")
        if self.idempotency_ttl < 0 or self.keep_finished < 0:
            raise ValueError("idempotency_ttl and keep_finished must not be negative")
        if self.accept_queick_clients and self.token_file is not None:
            # A Queick 1.2.1 client has no way to send a token: its requests would go past it.
            raise ValueError("--accept-queick-clients cannot be combined with --token-file: Queick "
                             "1.2.1 clients cannot present a token; run a separate daemon for them, "
                             "on loopback, or move them to protocol v1")
        if self.http is not None:
            parse_address(self.http)
        parse_hooks(self.hooks)
        self.resources  # noqa: B018 - raises ValueError naming a bad table or field
        self.pool_size()
        sandbox.settings(self)
        if self.ping_host is not None:
            parse_target(self.ping_host)
            if not self.ping_interval > 0:
                raise ValueError("ping_interval must be positive")

    def read_token(self) -> str | None:
        return _read_secret(self.token_file)

    def read_http_token(self) -> str | None:
        return _read_secret(self.http_token_file)


def _read_secret(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:  # a missing token file does not appear by restarting: EX_CONFIG
        raise ValueError(f"cannot read token file {path}: {e.strerror or e}") from None
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


class Daemon:
    def __init__(self, config: Config, clock: Callable[[], float] = time.time) -> None:
        config.validate()
        self.config = config
        self.clock = clock
        self.store: Store | None = None
        self.server: Server | None = None
        self.http: HttpServer | None = None
        self.metrics = Metrics(clock)
        self.network: NetworkMonitor | None = None
        self._stop = threading.Event()
        self._stopped = False
        self._wakeup_w: int | None = None
        self.fleet: FleetMember | None = None  # with a shared store: registry, heartbeats, LISTEN
        self.exit_status = 0
        # Called in order on SIGHUP (reload()), on the main thread: the loader's re-import
        # first; other parts that hold job code (a runner's zygote) add theirs.
        self.on_reload: list[Callable[[], None]] = []

    def start(self) -> None:
        c = self.config
        token = c.read_token()
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
        self.runner = make_runner(loader, c.sandbox_settings, c.sandbox_env, measure=memory.measures_run)
        self.on_reload.append(self.runner.reload)  # process jobs re-import the app too
        self.metrics.sandbox = self.runner.stats
        self.parking = NetworkParking(store, self.network, lambda: self.pool.wake(), clock=self.clock)
        self.retention = Retention(store, c.keep_finished, clock=self.clock)
        self.pool = WorkerPool(store, loader, c.workers, clock=self.clock, sweep=c.sweep,
                               network_checker=lambda: self.parking.checker,
                               network_up=self.parking.network_up,
                               on_finished=self._on_finished,
                               on_claimed=lambda jobs: self.service.waiters.notify([j.id for j in jobs]),
                               pause_after=c.pause_after, pause_cooldown=c.pause_cooldown,
                               on_probe_at=lambda t: self.scheduler.wake_at(t, "probes"),
                               on_ran=self.metrics.on_ran, pools=list(c.pool),
                               limits=resources.limits,
                               memory=memory,
                               on_deferred=lambda run_at: self.scheduler.wake_at(run_at),
                               size=c.pool_size(self.clock), runner=self.runner)
        self.scheduler = Scheduler(store, self.pool.wake, clock=self.clock, sweep=c.sweep,
                                   on_sweep=self._on_sweep, timers={"events": self._deliver_events,
                                                                    "probes": self._probes_due})
        self.batcher = SubmitBatcher(store, self._on_committed, clock=self.clock, admission=c.admission,
                                     dispatch=self.pool)
        self.service = QueueService(store, self.batcher, loader, self.scheduler, self.pool,
                                    token=token, clock=self.clock, network=self.network,
                                    metrics=self.metrics, resources=resources,
                                    workflows=c.workflows)
        for name in c.workflows:  # a declared workflow that could never start is a configuration error
            try:
                self.service.resolve_definition(None, name)
            except protocol.QueueError as e:
                store.close()
                raise ValueError(f"workflows.{name}: {e.message}") from None
        self.server = Server(self.service, c.bind, c.port, max_line=c.max_line,
                             accept_queick_clients=c.accept_queick_clients, max_connections=c.max_connections,
                             hello_timeout=c.hello_timeout, max_pending=c.max_pending)
        if c.http is not None:
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
                                     on_listening=self._waiters_look_again, clock=self.clock)
            self.fleet.start()
        self.runner.start()
        self.pool.start()
        self.scheduler.start()
        host, port = self.server.address  # type: ignore[misc]
        if self.http is not None:
            log.info("HTTP endpoint http://%s:%d/ (%d webhook(s))", *self.http.address,  # type: ignore[misc]
                     len(self.http.hooks))
        log.info(
            "queickd %s listening on %s:%d (store %s, durability %s, %d workers)",
            __version__, host, port, store.url, c.durability, c.workers,
        )
        self.runner.announce()

    def _recover_orphans(self) -> None:
        """At start; while the store cannot be written (a full disk), again at each sweep."""
        store = self.store
        try:
            recovered = store.recover_orphans(self.config.max_orphan_requeues, self.clock())  # type: ignore[union-attr]
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
        nxt = self._probes_due(self.clock())  # pauses begun by other hosts of a shared store
        if nxt is not None:
            self.scheduler.wake_at(nxt, "probes")

    def _on_committed(self, jobs: list[NewJob], submitted: list[Submitted]) -> None:
        self.metrics.on_committed(jobs, submitted)
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
        log.info("SIGHUP: reloading job code")
        for cb in list(self.on_reload):
            try:
                cb()
            except Exception:
                log.exception("reload: %s failed; going on", getattr(cb, "__qualname__", cb))

    def request_stop(self, *_: object) -> None:
        """Ask run_forever() to stop, from any thread."""
        self._stop.set()
        if self._wakeup_w is not None:
            try:
                os.write(self._wakeup_w, bytes([signal.SIGTERM]))
            except OSError:
                pass  # the pipe is full: a stop is already on its way

    def stop(self) -> bool:
        """Graceful stop. True if every running job finished within stop_timeout."""
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
        if self.fleet is not None:
            self.fleet.stop()
        if finished:
            self.store.close()
            log.info("stopped")
        else:
            log.warning("%d job(s) still running at the stop timeout; they will be recovered "
                        "as orphans on the next start", self.pool.busy)
        return finished

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
