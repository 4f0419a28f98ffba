"""The daemon: the wiring of store, committer, scheduler, pool and server.

It wires and starts/stops; it decides nothing itself. The parts that run jobs are built as
a worker's are (services/assembly.py); what becomes of jobs waiting for the network is
services/network.py's, the periodic upkeep (orphans, retention, depth, ...) the services
of services/maintenance/, run at the scheduler's sweep; the fleet's membership
services/fleet.py's. The callbacks here only pass events between the parts.

Build order: each part after those it uses; the pool gets its hooks last, once the parts
they reach exist. Start order: recover orphans, then the pool, scheduler, committer, and
last the server, so nothing is accepted before it can be stored and run. Stop order is the
reverse: stop accepting and send the replies owed, commit what was accepted, stop the
timers, let the running jobs finish (bounded by stop_timeout), close the store.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from . import __version__, collector, heap
from .api.hooks import parse_hooks
from .api.server import Server
from .api.service import QueueService
from .api.tls import server_context
from .api.tokens import Tokens
from .core import protocol
from .core.job import Job, NewJob, Outcome, State, Submitted
from .core.policy import outbox
from .core.policy.claim import Limits
from .run.loader import FunctionLoader
from .services import assembly, sdnotify
from .services.alarm import Alarm
from .services.batcher import SubmitBatcher
from .services.fleet import FleetMember, on_window_open
from .services.maintenance.depth import DepthSample
from .services.maintenance.maintainer import Every, Maintainer
from .services.maintenance.orphans import OrphanRecovery
from .services.maintenance.retention import Retention
from .services.netcheck import NetworkMonitor
from .services.network import NetworkParking
from .services.pool_config import PoolHooks
from .services.scheduler import Scheduler
from .settings import EX_VERSION, Config
from .startcheck import validate
from .store import Store, open_store
from .store.contract.fleet import FleetStore
from .store.records import EventState
from .ui.metrics import Metrics

if TYPE_CHECKING:
    from .api.httpd import HttpServer
    from .services.forwarder.forwarder import Forwarder

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
        self._stop = threading.Event()
        self._stopped = False
        self.fleet: FleetMember | None = None  # with a shared store: registry, heartbeats, LISTEN
        self.forwarder: Forwarder | None = None  # with an [upstream]: sends its jobs there
        self.exit_status = 0
        # Called in order on SIGHUP (reload()), on the main thread: the loader's re-import
        # first; other parts that hold job code (a runner's zygote) add theirs.
        self.on_reload: list[Callable[[], None]] = []
        self._config_read = _contents(config.config)  # what reload() compares the file with

    def start(self) -> None:
        c = self.config
        tokens = Tokens(c.token_file, self.clock) if c.token_file is not None else None
        http_token = c.read_http_token()
        loader = FunctionLoader(c.app_dir, c.allow)
        hooks = parse_hooks(c.hooks)
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
            secrets = [c.token_file, c.http_token_file, c.tls_key,
                       *(spec.get("secret_file") for spec in c.hooks.values())]  # parse_hooks checked them
            self.parts = parts = assembly.build(store, loader, c, secrets=secrets, clock=self.clock)
        except BaseException:
            store.close()
            raise
        self.pool = pool = parts.pool
        self.on_reload[:0] = [loader.reload, parts.runner.reload]  # the job code first, then the rest
        self.metrics.sandbox = parts.runner.stats
        self.metrics.progress = parts.progress.stats
        self.metrics.liveness = parts.liveness.stats
        resources = replace(c.resources, limits=parts.budgets.limits)
        self.orphans = OrphanRecovery(store, pool, max_requeues=c.max_orphan_requeues, interval=c.sweep,
                                      clock=self.clock)
        self.orphans.recover()
        self.parking = NetworkParking.with_checker(store, c.ping_host, c.ping_interval, pool.wake, clock=self.clock)
        self.network = self.parking.monitor
        if c.keep_finished < c.idempotency_ttl:  # the key lives on its job's row
            log.warning("keep_finished (%.0f s) is shorter than idempotency_ttl (%.0f s): a finished job's "
                        "idempotency key is forgotten when the job is deleted, and a repeat then makes a "
                        "new job", c.keep_finished, c.idempotency_ttl)
        self.maintainer = Maintainer([
            self.orphans,
            Retention(store, c.keep_finished, interval=c.sweep, clock=self.clock),
            DepthSample(store, self.metrics.sample_depth, pool.member, interval=c.sweep, clock=self.clock),
            Every("parking", c.sweep, self.parking.on_sweep),
            *parts.maintenance(),
        ], tick=c.sweep)
        self.scheduler = scheduler = Scheduler(
            store, pool.wake, clock=self.clock, sweep=c.sweep, on_sweep=self.maintainer.run_due,
            timers={"events": self._deliver_events, "probes": self._probes_due, "set_aside": self._set_aside_due,
                    "files": self._watch_files})
        self.batcher = SubmitBatcher(store, self._on_committed, clock=self.clock, admission=c.admission,
                                     dispatch=pool)
        self.service = QueueService(store, self.batcher, loader, scheduler, pool,
                                    tokens=tokens, clock=self.clock, network=self.network,
                                    metrics=self.metrics, resources=resources,
                                    workflows=c.workflows, workflow_budget=c.workflow_budget)
        parts.budgets.on_change.append(self._budgets_changed)
        # Each time a rate key may start a job again (its window opens, its block ends): the
        # pool claims then. Every time is kept: several keys may wait at once.
        self.rate_alarm = Alarm(on_window_open(pool, store), clock=self.clock, name="queickd-rate-alarm")
        pool.report_to(PoolHooks(
            on_claimed=self._on_claimed, on_finished=self._on_finished, on_ran=self.metrics.on_ran,
            on_probe_at=partial(scheduler.wake_at, slot="probes"),
            on_deferred=partial(scheduler.wake_at, slot="set_aside"),
            on_rate_at=self.rate_alarm.at,
            network_checker=self.parking.checker, network_up=self.parking.network_up))
        for name in c.workflows:  # a declared workflow that could never start is a configuration error
            try:
                self.service.resolve_definition(None, name)
            except protocol.QueueError as e:
                store.close()
                raise ValueError(f"workflows.{name}: {e.message}") from None
        self.forwarder = assembly.forwarder(store, c.upstream, self.service.waiters.notify, clock=self.clock)
        if self.forwarder is not None:  # an edge daemon: the front door routes jobs upstream
            from .api.edge import Edge

            self.service.edge = Edge(self.forwarder)
        self.server = Server(self.service, c.bind, c.port, max_line=c.max_line,
                             accept_queick_clients=c.accept_queick_clients, max_connections=c.max_connections,
                             hello_timeout=c.hello_timeout, max_pending=c.max_pending,
                             tls=server_context(c.tls_cert, c.tls_key, c.tls_client_ca))
        if c.tls_cert is not None:
            self.server.reload_tls = partial(server_context, c.tls_cert, c.tls_key, c.tls_client_ca)
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
        if self.forwarder is not None:
            self.forwarder.start()
        if isinstance(store, FleetStore):  # shared with other workers: registry, heartbeats, LISTEN
            self.fleet = parts.join_fleet(store, "daemon", on_finished_ids=self._on_finished_elsewhere,
                                          on_scheduled=scheduler.wake_at, on_version_change=self._on_version_change,
                                          on_listening=self._waiters_look_again, on_beat=self._read_served_pools)
            self.fleet.start()
            store.publish_admission(c.admission)  # for jobs enqueued in applications' transactions
            self._read_served_pools()
        else:  # this daemon is its store's only worker
            self.service.served.set(c.pool if pool.claims else [])
        parts.start()
        scheduler.start()

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
        self.parts.runner.announce()

    def _read_served_pools(self) -> None:
        """The pools the registry's live workers serve, for the enqueue check's warning
        (the heartbeat's thread, and once at start)."""
        served = self.service.served
        try:
            if served.from_registry(self.store.workers()):  # type: ignore[union-attr]
                log.debug("pools served by live workers: %s", ", ".join(served.pools) or "none")
        except Exception as e:  # the warning waits for the next beat; nothing else does
            log.debug("could not read the worker registry: %s", e)

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
        """The timer of pause probes: a paused key or function lets one job through once its
        cooldown is over, so the pool claims; returns the next probe time still ahead. Armed
        by the pool for pauses begun here; the sweep finds those another host began."""
        self.pool.wake()
        return min((p.probe_at for p in self.store.pauses()  # type: ignore[union-attr]
                    if p.probe_at is not None and p.probe_at > now), default=None)

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

    def _on_committed(self, jobs: list[NewJob], submitted: list[Submitted]) -> None:
        self.metrics.on_committed(jobs, submitted)
        self.scheduler.wake_at(self.clock() + FILES_WATCH, "files")  # nothing if armed already
        self.parking.on_committed(jobs)
        if self.service.edge is not None:
            self.service.edge.committed(jobs, [not s.duplicate for s in submitted])
        later = [j.run_at for j, s in zip(jobs, submitted, strict=True) if s.state == State.SCHEDULED and not s.duplicate]
        if later:
            self.scheduler.wake_at(min(later))

    def _on_claimed(self, jobs: list[Job]) -> None:
        self.service.waiters.notify([j.id for j in jobs])

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
        self.pool.wake()  # the pool took them already (assembly)

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
                     self.rate_alarm.stop,
                     self.network.stop if self.network is not None else None,
                     self.forwarder.stop if self.forwarder is not None else None):
            if step is not None:
                try:
                    step()
                except Exception:
                    log.exception("error while stopping (%s); going on", step.__qualname__)
        finished = self.parts.stop(self.config.stop_timeout)
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
        """Start, serve until SIGTERM/SIGINT, stop. Returns what stop() returned."""
        signals = sdnotify.Signals()  # before start(): a SIGTERM meanwhile stops it once started
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: where is it stuck?
        self.start()
        collector.tune_for_server()  # set up: what it holds now lives as long as it does
        heap.return_large_blocks()  # a large state freed goes back to the system
        self.announce()
        sdnotify.notify("READY=1")
        sdnotify.start_watchdog(lambda: self.scheduler.alive, self._stop)
        signals.wait(self._stop, on_hup=self.reload)
        sdnotify.notify("STOPPING=1")
        return self.stop()
