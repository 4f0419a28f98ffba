"""The scheduler: moves due jobs to `queued` and fires cron ticks. It never runs jobs.

It keeps one `sched` event per timer slot, whatever the queue depth: the earliest run_at
of a scheduled job, the earliest cron tick (both read from the store, so delayed jobs cost
no memory here), any slots the daemon adds (the event outbox's next delivery), and one
safety sweep (default 60 s) that re-reads them all in case a wake-up was lost or the wall
clock jumped (a Pi without a clock battery jumps at boot). Between events the thread
sleeps; an idle daemon wakes once per sweep.

wake_at() may be called from any thread; everything else runs on the scheduler thread.
"""

from __future__ import annotations

import logging
import sched
import threading
import time
from collections.abc import Callable

from ..core.cron import parse_schedule
from ..store import Store

log = logging.getLogger("queickd.scheduler")


class Scheduler:
    def __init__(
        self,
        store: Store,
        on_queued: Callable[[], None],
        *,
        clock: Callable[[], float] = time.time,
        sweep: float = 60.0,
        on_sweep: Callable[[], None] = lambda: None,
        timers: dict[str, Callable[[float], float | None]] | None = None,
    ) -> None:
        self.store = store
        self._on_queued = on_queued
        self._clock = clock
        self._sweep = sweep
        self._on_sweep = on_sweep
        # More timer slots: name -> action(now) that does its work and returns when it
        # wants to run next (None: not until woken or the next sweep).
        self._extra = dict(timers or {})
        # Set by wake_at()/stop() so a sleeping delay re-reads the head of the queue.
        self._wake = threading.Event()
        self._sched = sched.scheduler(clock, self._delay)
        self._lock = threading.Lock()  # guards the two timer slots below
        self._timers: dict[str, sched.Event] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.last_fired_at: float | None = None  # wall time of the last promotion or cron fire

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="queickd-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Idempotent; safe before start()."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def wake_at(self, t: float, slot: str = "jobs") -> None:
        """Make sure the scheduler looks again at time t (a job or cron tick is due then)."""
        with self._lock:
            current = self._timers.get(slot)
            if current is not None and current.time <= t:
                return
            if current is not None:
                try:
                    self._sched.cancel(current)
                except ValueError:
                    pass  # it is running right now; it re-arms itself from the store
            action = {"jobs": self._promote, "crons": self._fire_crons}.get(slot, self._run_extra)
            self._timers[slot] = self._sched.enterabs(t, 0, action, argument=(slot,))
        self._wake.set()

    # --- scheduler thread -------------------------------------------------------------------
    def _delay(self, seconds: float) -> None:
        if seconds > 0 and not self._stopping:
            self._wake.wait(min(seconds, self._sweep))
            self._wake.clear()
        if self._stopping:
            raise _Stopped

    def _run(self) -> None:
        self._sweep_now()
        try:
            self._sched.run()
        except _Stopped:
            pass
        except Exception:  # pragma: no cover - a bug; the health view shows alive=False
            log.exception("scheduler stopped by an error")
            raise

    def _disarm(self, slot: str) -> None:
        with self._lock:
            ev = self._timers.get(slot)
            if ev is not None and ev.time <= self._clock():
                del self._timers[slot]

    def _promote(self, slot: str = "jobs") -> None:
        self._disarm(slot)
        now = self._clock()
        try:
            n = self.store.promote_due(now)
            nxt = self.store.next_scheduled_at()
        except Exception:
            log.exception("store error while promoting due jobs; next sweep retries")
            return
        if n:
            self.last_fired_at = now
            log.debug("%d due job(s) queued", n)
            self._on_queued()
        if nxt is not None:
            self.wake_at(nxt, "jobs")

    def _fire_crons(self, slot: str = "crons") -> None:
        self._disarm(slot)
        now = self._clock()
        try:
            for cron in self.store.crons_due(now):
                tick = cron.next_run_at
                # Ticks missed while the daemon was down run once: the next tick is the
                # first one after now, not the one after the missed tick.
                next_tick = parse_schedule(cron.schedule).next_after(max(tick, now))
                fire = self.store.cron_fire_if_due(cron.name, tick, next_tick, now)
                if fire is None:
                    continue
                self.last_fired_at = now
                if fire.outcome == "folded":
                    log.info("cron %s: its previous run is still waiting; tick folded into it", cron.name)
                    continue
                late = now - tick
                log.info(
                    "cron %s fired job %d%s", cron.name, fire.submitted.job_id,  # type: ignore[union-attr]
                    f" (tick missed by {late:.0f} s)" if late > 60 else "",
                )
                self._on_queued()
            nxt = self.store.next_cron_at()
        except Exception:
            log.exception("store error while firing crons; next sweep retries")
            return
        if nxt is not None:
            self.wake_at(nxt, "crons")

    def _run_extra(self, slot: str) -> None:
        self._disarm(slot)
        try:
            nxt = self._extra[slot](self._clock())
        except Exception:
            log.exception("error in the %s timer; next sweep retries", slot)
            return
        if nxt is not None:
            self.wake_at(nxt, slot)

    def _sweep_now(self) -> None:
        self._promote()
        self._fire_crons()
        for slot in self._extra:
            self._run_extra(slot)
        try:
            self._on_sweep()
        except Exception:
            log.exception("error in a sweep hook")
        self._on_queued()  # safety: a lost wake-up costs at most one sweep
        log.debug("swept; next sweep in %.0f s", self._sweep)
        self._sched.enter(self._sweep, 1, self._sweep_now)


class _Stopped(Exception):  # noqa: N818 - a signal, not an error
    """Raised inside sched.run() to leave it when the scheduler stops."""
