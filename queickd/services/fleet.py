"""Membership of a fleet on one PostgreSQL database: wake-ups, heartbeats, orphan sweeps.

A process that runs jobs from a shared store (a daemon, or an external `queick worker`)
registers in the store's worker registry, then keeps two threads of its own, apart from
the threads that run jobs, so a long or CPU-bound job never silences them:
- the listener holds a connection that LISTENs; a notification wakes the worker pool (only
  a pool that claims hears of new jobs), or, for finished jobs, the clients waiting on
  them (only a daemon's listener hears of the finishes that free nothing), or, for budgets
  written by another process, their reader. The connection is watched: when it drops,
  the listener reconnects and at once wakes the pool for a sweep (and reads the budgets
  again), so a lost NOTIFY costs at most one sweep interval, never a stuck job.
- the heartbeat beats every `heartbeat` seconds and, in the same transaction, re-queues the
  running jobs of workers that missed three beats (safe to run in every process at once);
  it wakes the pool once per `sweep` as a safety net, and notices a database migrated to
  another version.
Nothing here imports psycopg at module import time; it is used only with a store that is a
FleetStore (store/contract/fleet.py: PostgreSQL).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..core.policy.forward import Backoff
from ..settings import DEFAULT_HEARTBEAT, DEFAULT_MAX_ORPHAN_REQUEUES, DEFAULT_SWEEP
from ..store.contract.fleet import FleetStore
from ..store.contract.inspect import Inspect
from .worker import WorkerPool

log = logging.getLogger("queickd.fleet")

FORGET_AFTER = 24 * 3600.0  # records of gone workers stay visible in stats this long


class Listener:
    """LISTEN on the store's channels in a thread of its own; reconnects when dropped.
    `queued`: also on the channel of jobs made claimable (for a pool that claims);
    `finished`: also on the channel of finishes that free nothing (for waiting clients)."""

    def __init__(self, store: FleetStore, on_notify: Callable[[str], None], on_reconnect: Callable[[], None],
                 *, poll: float = 2.0, queued: bool = True, finished: bool = True) -> None:
        self.store = store
        self._queued = queued
        self._finished = finished
        self._on_notify = on_notify
        self._on_reconnect = on_reconnect
        self._poll = poll  # how often the thread checks for stop(); no query is sent
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.connected = threading.Event()  # set while LISTENing

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="queickd-listener", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Idempotent; safe before start()."""
        self._stopping.set()
        if self._thread is not None:
            # It notices within `poll` seconds; nothing waits on its leaving (it holds no
            # job and its connection dies with the process), so a stop does not wait long.
            self._thread.join(0.2)

    def _run(self) -> None:
        from ..store.postgres.channels import CHANNEL, FINISHED_CHANNEL, QUEUED_CHANNEL

        channels = [CHANNEL] + [QUEUED_CHANNEL] * self._queued + [FINISHED_CHANNEL] * self._finished
        backoff = Backoff(first=0.5, most=30.0)
        first = True
        while not self._stopping.is_set():
            try:
                # With keepalives (store.connect's): a connection the network silently dropped is noticed too.
                conn = self.store.connect(application_name=f"queickd-listener-{os.getpid()}")
            except Exception as e:
                delay = backoff.failed()
                log.warning("listener: cannot connect (%s); trying again in %.1f s", e, delay)
                self._stopping.wait(delay)
                continue
            try:
                conn.execute("; ".join(f"LISTEN {ch}" for ch in channels))
                self.connected.set()
                if first:
                    log.debug("listener: listening on channel(s) %s", ", ".join(channels))
                else:
                    log.warning("listener: reconnected; sweeping for work that a lost notification announced")
                backoff.succeeded()
                self._on_reconnect()  # whatever was announced while we were away
                while not self._stopping.is_set():
                    for n in conn.notifies(timeout=self._poll):
                        self._on_notify(n.payload)
            except Exception as e:
                if not self._stopping.is_set():
                    log.warning("listener: connection lost (%s); reconnecting", e)
                first = False
            finally:
                self.connected.clear()
                try:
                    conn.close()
                except Exception:
                    pass


class FleetMember:
    """Registers a process's WorkerPool in the store's registry and keeps it beating and
    listening. start() once the pool exists; stop() after the pool has stopped."""

    def __init__(self, store: FleetStore, pool: WorkerPool, *, kind: str, heartbeat: float = DEFAULT_HEARTBEAT,
                 sweep: float = DEFAULT_SWEEP, max_orphan_requeues: int = DEFAULT_MAX_ORPHAN_REQUEUES,
                 on_finished_ids: Callable[[list[int]], None] | None = None,
                 on_scheduled: Callable[[float], None] = lambda run_at: None,
                 on_version_change: Callable[[str], None] = lambda reason: None,
                 on_budgets: Callable[[], None] = lambda: None,
                 on_listening: Callable[[], None] = lambda: None,
                 on_beat: Callable[[], None] = lambda: None,
                 on_sweep: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.pool = pool
        self.kind = kind
        self.heartbeat_interval = heartbeat
        self.sweep = sweep
        self.max_orphan_requeues = max_orphan_requeues
        self._on_finished_ids = on_finished_ids
        self._on_scheduled = on_scheduled
        self._on_version_change = on_version_change
        self._on_budgets = on_budgets  # the budgets in force may have changed: read them again
        # Listening (again): clients waiting on jobs look again, for a finish told while away.
        self._on_listening = on_listening
        self._on_beat = on_beat  # after each beat written, in the heartbeat's thread
        self._on_sweep = on_sweep  # at each sweep, in the heartbeat's thread: a worker's maintenance
        self._clock = clock
        # Without clients waiting on jobs (an external worker) it need not hear of every finish,
        # and a pool that never claims (a daemon of no workers) need not hear of new jobs.
        self.listener = Listener(store, self._notified, self._reconnected, queued=pool.claims,
                                 finished=on_finished_ids is not None)
        self._stopping = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def _register(self) -> None:
        pools = self.pool.pools if self.pool.pools is not None else ["*"]
        self.store.register_worker(self.kind, pools, self.pool.workers, self.heartbeat_interval)

    def start(self) -> None:
        self._register()
        self.listener.start()
        self._heartbeat = threading.Thread(target=self._beat, name="queickd-heartbeat", daemon=True)
        self._heartbeat.start()

    def stop(self) -> None:
        """Stop listening and beating, then deregister. Jobs still running (past the stop
        timeout) are left to the orphan sweep of the other members, and said so."""
        self.listener.stop()
        self._stopping.set()
        if self._heartbeat is not None:
            self._heartbeat.join(10.0)
        try:
            held = self.store.deregister_worker()
        except Exception:
            log.exception("could not deregister; the other workers will take this one for gone "
                          "after 3 missed heartbeats")
            return
        if held:
            log.warning("deregistered with %d job(s) still running; they are orphans now and will be "
                        "re-queued by the next sweep of any worker", held)

    def _beat(self) -> None:
        """The heartbeat's thread: beats, sweeps orphans and wakes the pool for its safety
        sweep (then calls on_sweep), apart from the threads that run jobs."""
        from ..store.postgres.schema import SCHEMA_VERSION
        from ..version import __version__

        next_sweep = time.monotonic() + self.sweep
        reported = False
        while not self._stopping.wait(self.heartbeat_interval):
            try:
                b = self.store.beat(self.max_orphan_requeues, self._clock())  # and the orphan sweep
                version, schema = b.version, b.schema
                if not b.found:
                    log.warning("heartbeat: this worker's record was gone (it stalled for longer than "
                                "3 heartbeats and its jobs were re-queued); registering again")
                    self._register()
                if (version, schema) != (__version__, SCHEMA_VERSION) and not reported:
                    # Said once; the beats go on, so the jobs still running here while the
                    # process stops are not taken for orphans and run twice.
                    reported = True
                    self._on_version_change(f"the database is now at queickd {version} (schema {schema}); "
                                            f"this is {__version__} (schema {SCHEMA_VERSION})")
                self._on_beat()
                rec = b.recovered
                if rec is not None and (rec.requeued or rec.dead):
                    log.warning("jobs of workers that stopped beating: %d re-queued, %d dead (orphaned)",
                                len(rec.requeued), len(rec.dead))
                    self.pool.wake()
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + self.sweep
                    self.store.forget_gone_workers(FORGET_AFTER)
                    self.pool.wake()  # safety sweep: a lost wake-up costs at most this long
                    self._on_sweep()
            except Exception:
                log.exception("heartbeat: store error; trying again at the next beat")

    def _reconnected(self) -> None:
        """Listening (again): what a lost notification announced is looked at now."""
        self.pool.wake()
        self._refresh_budgets()
        self._on_listening()

    def _refresh_budgets(self) -> None:
        try:
            self._on_budgets()
        except Exception as e:  # the listener lives on; the next notification or reconnection reads them
            log.warning("could not read the budgets in force (%s); the claims read them anyway", e)

    def _notified(self, payload: str) -> None:
        kind, _, rest = payload.partition(":")
        if kind == "q":
            if self.pool.pools is None or rest in self.pool.pools:
                self.pool.wake()
        elif kind in ("f", "fk", "s"):
            if kind == "fk":
                self.pool.wake()  # a finished job freed a key, a group slot or budget: what waited may run
            try:
                if kind == "s":
                    self._on_scheduled(float(rest))
                elif self._on_finished_ids is not None:
                    self._on_finished_ids([int(i) for i in rest.split(",") if i])
            except ValueError:
                log.warning("listener: unreadable notification %r", payload[:80])
        elif kind == "b":  # another process wrote the budgets in force
            self._refresh_budgets()
            self.pool.wake()
        else:
            self.pool.wake()


def pools_view(store: Inspect, own_pools: list[str] | None, own_slots: int,
               registry: list[dict[str, Any]] | None = None) -> dict[str, dict[str, int]]:
    """Per pool: waiting jobs and live worker slots (from the worker registry of a shared
    store where given, else this daemon's own workers). A pool with waiting jobs and 0
    workers is stuck until someone serves it."""
    waiting = store.waiting_by_pool()
    slots: dict[str, int] = {}
    if registry is not None:
        for w in registry:
            if w["alive"]:
                for p in w["pools"]:
                    slots[p] = slots.get(p, 0) + w["slots"]
    else:
        for p in own_pools or ["*"]:
            slots[p] = slots.get(p, 0) + own_slots
    names = sorted(set(waiting) | {p for p in slots if p != "*"})
    everything = slots.get("*", 0)
    return {p: {"waiting": waiting.get(p, 0), "workers": slots.get(p, 0) + everything} for p in names}


def on_window_open(pool: WorkerPool, store: object) -> Callable[[], None]:
    """The action of a rate key's timer (its window opens, its block ends): the pool passes;
    on a fleet's store, if every slot of it is busy, every claimer is woken, since only the
    claim that filled the key holds its timer and another process may have room."""

    def opened() -> None:
        pool.wake()
        if isinstance(store, FleetStore) and not pool.has_room():
            try:
                store.wake_claimers()
            except Exception as e:  # their next wake-up claims it; the timer's work is done here
                log.warning("could not wake the fleet's claimers for a rate key's window: %s", e)

    return opened

