"""`queick worker`: an external worker that pulls jobs of its pools from PostgreSQL.

It opens no port: it needs only to reach the database (and to import the job modules).
Start-up refuses, with exit status EX_VERSION, when the database was migrated by another
queickd version (a worker never migrates); the refusal is recorded in the worker registry
so `queick stats` shows it. A database with no queickd schema yet is, like one that
cannot be reached, a state another host's start ends (a daemon or `queick db migrate`
creates the schema): one line says so and how to set it up, and the exit status (1) lets
systemd try again. The budgets it claims under are the database's (services/budgets.py):
with --config naming [budgets], its own replace them. SIGTERM stops claiming, lets running
jobs finish (bounded by --stop-timeout), then deregisters.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from .. import __version__, collector, heap
from ..run.cgroup_v1 import pid_alive
from ..run.loader import FunctionLoader
from ..settings import EX_VERSION, WorkerConfig
from ..startcheck import validate
from ..store.contract.fleet import FleetStore
from . import assembly, sdnotify
from .alarm import Alarm
from .fleet import on_window_open
from .maintenance.maintainer import Maintainer
from .pool_config import PoolHooks

log = logging.getLogger("queickd.workerproc")


def run(config: WorkerConfig) -> int:
    """Run until SIGTERM/SIGINT (0) or a version change of the database (EX_VERSION)."""
    from ..store.postgres.store import PostgresStore

    validate(config)
    store = PostgresStore(config.store, migrate=False)
    store.queue_cap = config.max_queued  # a paced fan-out's items wait under it (core/workflow/engine.py)
    try:
        refused = _refusal(store, config)
        if refused is not None:
            return refused
        stop = threading.Event()
        status = {"code": 0}

        def version_changed(reason: str) -> None:
            log.error("stopping: %s; exiting with status %d once running jobs finish", reason, EX_VERSION)
            status["code"] = EX_VERSION
            stop.set()

        parts = assembly.build(store, FunctionLoader(config.app_dir, config.allow), config)
        pool = parts.pool
        # A pause begun here is probed after its cooldown, and a job set aside for want of
        # memory may start after its wait: the pool wakes then, not at its next sweep (the
        # daemon's scheduler does this for a daemon's pool).
        def wake_pool() -> None:
            pool.wake()
            nxt = pool.next_set_aside_at(time.time())
            if nxt is not None:  # another job set aside waits longer
                alarm.at(nxt)

        alarm = Alarm(wake_pool, name="queickd-pool-alarm")
        rate_alarm = Alarm(on_window_open(pool, store), name="queickd-rate-alarm")
        pool.report_to(PoolHooks(on_probe_at=alarm.at, on_deferred=alarm.at, on_rate_at=rate_alarm.at))
        maintainer = Maintainer(parts.maintenance(), tick=config.sweep)
        member = parts.join_fleet(store, "worker", on_version_change=version_changed, on_sweep=maintainer.run_due)
        member.start()
        parts.start()
        pool.wake()
        collector.tune_for_server()  # set up: what it holds now lives as long as it does
        heap.return_large_blocks()  # a large state freed goes back to the system
        log.info("queickd %s worker serving pool(s) %s with %s (%s, heartbeat %.1f s, pid %d)",
                 __version__, ",".join(config.pool), pool.size_said(), store.durability_said(), config.heartbeat,
                 os.getpid())
        parts.runner.announce()
        sdnotify.Signals().wait(stop, on_hup=parts.reload)
        pool.stop_claiming()
        log.info("stopping: no new claims; waiting up to %.0f s for running jobs", config.stop_timeout)
        finished = parts.stop(config.stop_timeout)
        alarm.stop()
        rate_alarm.stop()
        member.stop()
        log.info("stopped" if finished else "stopped with jobs still running (re-queued by the fleet)")
        return status["code"]
    finally:
        store.close()


class SchemaMissingError(OSError):
    """The database has no queickd schema yet. An OSError, as an unreachable database is:
    a worker host may boot before the host that sets the database up, and systemd's
    restart (exit status 1) then gets it going once the schema is there."""


def _refusal(store: FleetStore, config: WorkerConfig) -> int | None:
    """None if this worker may claim from the store; else EX_VERSION, with one line in the
    log saying what is wrong and what to do (a worker never migrates). SchemaMissingError
    for a database no queickd has set up yet."""
    from ..store.postgres.schema import SCHEMA_VERSION, VersionMismatchError, parse_version

    version, schema = store.versions()
    if version is None:  # nobody migrated it yet (or the wrong URL: the line says to check)
        raise SchemaMissingError(f"{store.url} has no queickd schema: run 'queick db migrate --store {store.url}' "
                         "(or start a queickd daemon on it) first, or check --store")
    try:
        store.check_version()
        return None
    except VersionMismatchError as e:
        reason = str(e)
    newer = schema > SCHEMA_VERSION or parse_version(version) > parse_version(__version__)
    fix = (f"install queickd {version} on this host" if newer else
           f"run 'queick db migrate' with queickd {__version__}, or install queickd {version} here")
    log.error("refusing to claim jobs: %s: %s; exiting with status %d", reason, fix, EX_VERSION)
    try:  # so `queick stats` shows the refusal; a schema of another version may not take the record
        store.register_worker("worker", config.pool, config.workers, config.heartbeat, refused=reason)
    except Exception as e:
        log.debug("could not record the refusal in the worker registry: %s", e)
    return EX_VERSION


def beating_here(store: FleetStore, pools: Sequence[str] | None) -> tuple[dict[str, Any] | None, str]:
    """(The registry record of a worker process of this host that serves `pools` (None:
    any), runs here and beats, or None; this host's name). Beats: its last beat is within
    3 heartbeats, the fleet's own test (a worker past it has its jobs re-queued by the
    others). What `queick worker --check`, a container's healthcheck, asks."""
    host = socket.gethostname()
    for w in store.workers():
        # Its pid runs here too: the record of a worker killed with SIGKILL stays alive for 3 heartbeats.
        if (w["kind"] == "worker" and w["host"] == host and w["alive"] and pid_alive(w["pid"])
                and (not pools or set(pools) <= set(w["pools"]))):
            return w, host
    return None, host
