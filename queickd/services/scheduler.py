"""The scheduler: moves due jobs to `queued` and fires cron ticks. It never runs jobs.

It keeps one `sched` event per timer slot, whatever the queue depth: the earliest run_at
of a scheduled job, the earliest cron tick (both read from the store, so delayed jobs cost
no memory here), the slots the daemon adds (the event outbox's next delivery, ...), and a
safety sweep that re-reads them all in case a wake-up was lost or the wall clock jumped.
Between events the thread waits; an idle daemon wakes once per sweep.

`clock` is the wall clock (run_at and cron ticks are wall times), `monotonic` paces the
sweep, and `delay` waits (tests pass fake ones and never sleep). The sweep comes every
`sweep` seconds of monotonic time, so a jump of the wall clock either way is caught up; a
sweep that finds it stepped back (NTP correcting a clock that ran fast) moves crons whose
next tick the fast clock pushed ahead back to their next tick after now.

An error in a callback or in the store is logged and the scheduler goes on; the next sweep
re-reads everything. wake_at() and stop() may be called from any thread; everything else
runs on the thread that runs run() (start() makes one).
"""

from __future__ import annotations

import logging
import math
import sched
import threading
import time
from collections.abc import Callable
from typing import Protocol

from ..core.cron import LATEST, Every, parse_schedule
from ..settings import DEFAULT_SWEEP
from ..store import CronRecord
from ..store.contract.schedule import Schedule

log = logging.getLogger("queickd.scheduler")

# Seconds the wall clock may fall behind the monotonic one between two sweeps before it
# counts as stepped back (NTP slewing drifts by far less).
STEP_TOLERANCE = 1.0


class Delay(Protocol):
    """How the scheduler waits: sched's delayfunc, plus a way to cut the wait short."""

    def wait(self, seconds: float) -> None:
        """Block for up to `seconds` (> 0), or less once interrupt() was called. An
        interrupt that comes while nobody waits makes the next wait return at once."""
        ...

    def interrupt(self) -> None:
        """End the current or next wait now. Called from any thread."""
        ...


class EventDelay:
    """The real delay: waits on an Event with a timeout (no polling)."""

    def __init__(self) -> None:
        # Set by interrupt() (wake_at, stop); cleared after a wait, never before one, so
        # a wake-up that comes between reading the head of the queue and waiting is kept.
        self._wake = threading.Event()

    def wait(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def interrupt(self) -> None:
        self._wake.set()


class Scheduler:
    def __init__(
        self,
        store: Schedule,
        on_queued: Callable[[], None],
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        delay: Delay | None = None,
        sweep: float = DEFAULT_SWEEP,
        on_sweep: Callable[[], None] = lambda: None,
        timers: dict[str, Callable[[float], float | None]] | None = None,
    ) -> None:
        self.store = store
        self._on_queued = on_queued
        self._clock = clock
        self._monotonic = monotonic
        self._sweep = sweep
        self._sweep_event: sched.Event | None = None
        self._sweep_due = 0.0  # monotonic time of the next sweep
        self._last_sweep: tuple[float, float] | None = None  # (wall, monotonic) then
        self._on_sweep = on_sweep
        # The timer slots, the scheduler's own and the daemon's: name -> action(now) that
        # does its work and returns when it wants to run next (None: not until woken or the
        # next sweep).
        self._slots: dict[str, Callable[[float], float | None]] = {
            "jobs": self._promote, "crons": self._fire_crons, **(timers or {})}
        # Interrupted by wake_at()/stop() so a waiting run() re-reads the head of the queue.
        self._waiter: Delay = delay if delay is not None else EventDelay()
        self._sched = sched.scheduler(clock, self._delay)
        self._lock = threading.Lock()  # guards _timers (wake_at comes from any thread)
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
        self._thread = threading.Thread(target=self.run, name="queickd-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Idempotent; safe before start() (run() then returns at once)."""
        self._stopping = True
        self._waiter.interrupt()
        if self._thread is not None and self._thread is not threading.current_thread():
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
            self._timers[slot] = self._sched.enterabs(t, 0, self._run_slot, argument=(slot,))
        self._waiter.interrupt()

    def run(self) -> None:
        """Sweep once, then run the timers on the calling thread until stop()."""
        if self._stopping:
            return
        try:
            self._sweep_now()
            self._sched.run()
        except _Stopped:
            pass
        except Exception:  # pragma: no cover - a bug; the health view shows alive=False
            log.exception("scheduler stopped by an error")
            raise

    def run_due(self) -> None:
        """Queue the jobs due by the clock and fire the crons due, in the calling thread: for
        a scheduler whose thread never starts (the immediate queue's, which calls this each
        time its clock moves). Errors are logged, as on the thread."""
        self._run_slot("jobs")
        self._run_slot("crons")

    # --- scheduler thread -------------------------------------------------------------------
    def _delay(self, seconds: float) -> None:
        # sched calls this with 0 after each event, to let other threads in: no wait then.
        # No wait outlasts the sweep's monotonic due time, which a wall clock stepped back
        # cannot push away.
        left = self._sweep_due - self._monotonic()
        if seconds > 0 and left > 0 and not self._stopping:
            self._waiter.wait(min(seconds, left))
        if self._stopping:
            raise _Stopped
        if self._monotonic() >= self._sweep_due:
            self._sweep_soon()

    def _sweep_soon(self) -> None:
        """Bring the sweep to now if its wall time still lies ahead (the clock stepped back)."""
        now, ev = self._clock(), self._sweep_event
        if ev is not None and ev.time <= now:
            return
        if ev is not None:
            try:
                self._sched.cancel(ev)
            except ValueError:
                pass  # not queued: queue it anyway, the scheduler must keep its sweep
        self._sweep_event = self._sched.enterabs(now, 1, self._sweep_now)

    def _queued(self) -> None:
        try:
            self._on_queued()
        except Exception:
            log.exception("error in the on_queued hook")

    def _run_slot(self, slot: str) -> None:
        with self._lock:  # disarmed: a wake_at() from its action arms it again
            ev = self._timers.get(slot)
            if ev is not None and ev.time <= self._clock():
                del self._timers[slot]
        try:
            nxt = self._slots[slot](self._clock())
        except Exception:
            log.exception("error in the %s timer; next sweep retries", slot)
            return
        if nxt is not None:
            self.wake_at(nxt, slot)

    def _promote(self, now: float) -> float | None:
        n, nxt = self.store.promote_due(now), self.store.next_scheduled_at()
        if n:
            self.last_fired_at = now
            log.debug("%d due job(s) queued", n)
            self._queued()
        return nxt

    def _fire_crons(self, now: float) -> float | None:
        for cron in self.store.crons_due(now):
            tick = cron.next_run_at
            # Ticks missed while the daemon was down run once: the next tick is the first
            # one after now, not the one after the missed tick.
            next_tick = self._tick_after(cron, max(tick, now))
            if next_tick is None:
                continue
            fire = self.store.cron_fire_if_due(cron.name, tick, next_tick, now)
            if fire is None:
                continue
            self.last_fired_at = now
            if fire.outcome == "folded":
                log.info("cron %s: its previous run is still waiting; tick folded into it", cron.name)
                continue
            late = now - tick
            log.info("cron %s fired job %d%s", cron.name, fire.submitted.job_id,  # type: ignore[union-attr]
                     f" (tick missed by {late:.0f} s)" if late > 60 else "")
            self._queued()
        return self.store.next_cron_at()

    def _tick_after(self, cron: CronRecord, now: float) -> float | None:
        """The cron's next tick, or None for a cron whose schedule gives none (a store written
        before such schedules were refused may hold one): it is parked at the end of time, so
        that it neither holds up the crons behind it nor comes due again at once."""
        try:
            return tick_after(cron, now)
        except ValueError as e:
            if cron.next_run_at < LATEST and self.store.cron_move_if(cron.name, cron.next_run_at, LATEST):
                log.error("cron %s is stopped: %s; it stays listed until 'queick cron delete %s'",
                          cron.name, e, cron.name)
            return None

    def _check_wall_clock(self) -> None:
        """Compare how far both clocks went since the last sweep: less on the wall clock
        means it stepped back."""
        wall, mono = self._clock(), self._monotonic()
        if self._last_sweep is not None:
            step = (mono - self._last_sweep[1]) - (wall - self._last_sweep[0])
            if step > STEP_TOLERANCE and not self._crons_back(wall, step):
                return  # a store error: the next sweep measures from the same point again
        self._last_sweep = (wall, mono)

    def _crons_back(self, now: float, step: float) -> bool:
        """The wall clock stepped back: crons whose next tick lies beyond their next tick
        after now wait no longer than that. False on a store error."""
        moved = 0
        try:
            for cron in self.store.cron_list():
                tick = self._tick_after(cron, now)
                if tick is None:
                    continue
                # Compare-and-set: a tick fired or a cron registered meanwhile wins.
                if cron.next_run_at > tick and self.store.cron_move_if(cron.name, cron.next_run_at, tick):
                    moved += 1
        except Exception:
            log.exception("store error while moving crons back; next sweep retries")
            return False
        log.warning("the wall clock stepped back %.0f s; %d cron(s) moved back to their next tick"
                    " (delayed jobs and retries keep their wall times)", step, moved)
        return True

    def _sweep_now(self) -> None:
        # Armed first, so nothing below can leave the scheduler without its next sweep.
        self._sweep_event = self._sched.enter(self._sweep, 1, self._sweep_now)
        self._sweep_due = self._monotonic() + self._sweep
        self._check_wall_clock()  # before the crons fire, so that moved ones re-arm their timer
        for slot in self._slots:  # jobs and crons first
            self._run_slot(slot)
        try:
            self._on_sweep()
        except Exception:
            log.exception("error in a sweep hook")
        self._queued()  # safety: a lost wake-up costs at most one sweep
        log.debug("swept; next sweep in %.0f s", self._sweep)


def tick_after(cron: CronRecord, now: float) -> float:
    """The cron's first tick after now, also on a wall clock that stepped back."""
    s = parse_schedule(cron.schedule)
    if isinstance(s, Every) and cron.last_fired_at is not None and now < s.start_at:
        # It has begun, so its start time is past in real time though the clock now reads
        # earlier: its ticks go on every interval from here, not from the start time again.
        s = Every(s.interval, s.start_at + math.floor((now - s.start_at) / s.interval) * s.interval)
    return s.next_after(now)


class _Stopped(Exception):  # noqa: N818 - a signal, not an error
    """Raised inside sched.run() to leave it when the scheduler stops."""
