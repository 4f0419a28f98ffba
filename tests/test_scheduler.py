"""The Scheduler driven by a fake clock and a fake delay on the test's own thread: no
sleeping, no real time (except the one test of the real delay, which waits on events)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from queickd.core.cron import LATEST
from queickd.core.job import NewJob, Outcome, State
from queickd.core.policy.claim import Request
from queickd.services.scheduler import Scheduler
from queickd.store import CronRecord, open_store

T0 = 1_700_000_000.0


class FakeTime:
    """A wall clock, a monotonic clock and a delay for one Scheduler. Each wait runs the
    test's next step; then it ends where that step left the clock if the step interrupted
    it (wake_at, stop), or at its full length of monotonic time otherwise. With no step
    left, the wait stops the scheduler. As with an Event, an interrupt while nobody waits
    makes the next wait return at once. step_wall() moves the wall clock alone."""

    def __init__(self, now: float = T0) -> None:
        self.now = now
        self.waits: list[float] = []  # the length of each wait that really waited
        self.steps: list[Callable[[], object]] = []
        self.scheduler: Scheduler | None = None
        self._interrupted = False
        self._stepped = 0.0  # how far the wall clock was stepped away from the monotonic one

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now - self._stepped

    def step_wall(self, seconds: float) -> None:
        self.now += seconds
        self._stepped += seconds

    def wait(self, seconds: float) -> None:
        if self._interrupted:
            self._interrupted = False
            return
        self.waits.append(seconds)
        end = self.monotonic() + seconds
        (self.steps.pop(0) if self.steps else self.scheduler.stop)()
        if self._interrupted:
            self._interrupted = False
        else:
            self.now += end - self.monotonic()

    def interrupt(self) -> None:
        self._interrupted = True


def make(*steps: Callable[[], object], store=None, **kw) -> tuple[Scheduler, FakeTime, list[float], object]:
    """A scheduler on a memory store; the list holds the clock at each on_queued call."""
    store = store if store is not None else open_store("memory://")
    ft = FakeTime()
    queued: list[float] = []
    kw.setdefault("sweep", 600.0)
    sch = Scheduler(store, kw.pop("on_queued", lambda: queued.append(ft.now)), clock=ft,
                    monotonic=ft.monotonic, delay=ft, **kw)
    ft.scheduler = sch
    ft.steps = list(steps)
    return sch, ft, queued, store


def cron(every: float = 60.0, first: float = T0 + 60) -> CronRecord:
    return CronRecord("c", {"every": every, "start_at": first}, NewJob(func="m:tick", run_at=first), first, None, T0)


def test_a_due_job_is_promoted_when_the_clock_passes_its_run_at():
    seen = []
    sch, ft, queued, store = make(lambda: seen.append(store.get(sub.job_id).state))
    (sub,) = store.submit([NewJob(func="m:f", run_at=T0 + 30)], T0)
    sch.run()
    assert seen == [State.SCHEDULED]  # while the scheduler waited for it
    assert ft.waits[0] == 30
    assert store.get(sub.job_id).state == State.QUEUED
    assert sch.last_fired_at == T0 + 30 and T0 + 30 in queued


def test_an_earlier_wake_at_rearms_the_timer():
    def enqueue_sooner():
        ft.now = T0 + 2
        early.append(store.submit([NewJob(func="m:f", run_at=T0 + 10)], ft.now)[0])
        sch.wake_at(T0 + 10)

    early: list = []
    sch, ft, queued, store = make(enqueue_sooner, lambda: None, lambda: None)
    (late,) = store.submit([NewJob(func="m:f", run_at=T0 + 100)], T0)
    sch.run()
    assert ft.waits[:3] == [100, 8, 90]  # cut short at T0 + 2, then to the new job, then the old
    assert queued[1:] == [T0 + 10, T0 + 100]
    assert store.get(early[0].job_id).state == store.get(late.job_id).state == State.QUEUED


def test_a_later_wake_at_keeps_the_earlier_timer():
    sch, ft, queued, store = make(lambda: sch.wake_at(T0 + 50))
    store.submit([NewJob(func="m:f", run_at=T0 + 30)], T0)
    sch.run()
    assert ft.waits[:2] == [30, 570]  # the job, then the next sweep: nothing armed at T0 + 50


def test_a_wait_is_never_longer_than_one_sweep():
    sch, ft, queued, store = make(lambda: None, lambda: None, sweep=60.0)
    store.submit([NewJob(func="m:f", run_at=T0 + 1000)], T0)
    sch.run()
    assert ft.waits == [60, 60, 60]


def test_each_cron_tick_fires_one_job():
    def run_what_is_queued():  # the pool's part, so that no run is waiting at the next tick
        for j in store.claim_available(Request.of(10, now=ft.now)):
            store.finish_if_running([Outcome.succeeded(j.id, None)], ft.now)
        sch.wake_at(ft.now, "crons")  # a second look at the same tick fires nothing more

    sch, ft, queued, store = make(lambda: None, lambda: None, lambda: None, on_queued=run_what_is_queued)
    store.cron_save(cron())
    sch.run()
    runs = [j for j in store.list_jobs(None, 100) if j.cron == "c"]
    assert sorted(j.created_at for j in runs) == [T0 + 60, T0 + 120, T0 + 180]
    assert store.cron_list()[0].folded == 0


def test_a_tick_while_the_previous_run_waits_folds_into_it():
    sch, ft, queued, store = make(lambda: None, lambda: None, lambda: None)
    store.cron_save(cron())
    sch.run()
    assert len(store.list_jobs(State.QUEUED, 100)) == 1
    (c,) = store.cron_list()
    assert (c.folded, c.next_run_at, sch.last_fired_at) == (2, T0 + 240, T0 + 180)


def test_a_timer_slot_runs_when_due_and_again_when_it_asks():
    calls = []

    def deliver(now: float) -> float | None:
        calls.append(now)
        return now + 15 if len(calls) < 3 else None

    sch, ft, queued, store = make(lambda: sch.wake_at(T0 + 5, "events"), lambda: None, lambda: None,
                                  timers={"events": deliver})
    sch.run()
    assert calls == [T0, T0 + 5, T0 + 20]  # the first sweep, woken, asked for


def test_the_safety_sweep_runs_at_its_interval():
    sweeps = []
    sch, ft, queued, store = make(lambda: None, lambda: None, sweep=60.0, on_sweep=lambda: sweeps.append(ft.now))
    sch.run()
    assert sweeps == [T0, T0 + 60, T0 + 120]
    assert queued == sweeps  # each sweep wakes the pool, in case a wake-up was lost
    assert ft.waits == [60, 60, 60]


def test_stop_is_idempotent_and_safe_before_start():
    sweeps = []
    sch, ft, queued, store = make(on_sweep=lambda: sweeps.append(ft.now))
    sch.stop()
    sch.stop()
    sch.run()  # returns at once: stopped before it began
    sch.start()
    sch.stop()
    assert (sweeps, ft.waits, sch.alive) == ([], [], False)


def test_stop_cuts_a_real_wait_short():
    swept = threading.Event()
    sch = Scheduler(open_store("memory://"), lambda: None, sweep=3600.0, on_sweep=swept.set)
    sch.start()
    assert swept.wait(5)  # it has begun, and waits (or is about to) for an hour
    sch.stop()  # joins for at most 5 s: only an interrupted wait ends in time
    sch.stop()
    assert not sch.alive


def test_an_error_in_on_queued_does_not_stop_the_scheduler():
    def on_queued():
        queued.append(ft.now)
        if len(queued) == 1:
            raise RuntimeError("the pool is in trouble")

    queued: list[float] = []
    sch, ft, _, store = make(lambda: None, lambda: None, on_queued=on_queued)
    a, b = store.submit([NewJob(func="m:f", run_at=T0 + 10), NewJob(func="m:f", run_at=T0 + 20)], T0)
    sch.run()  # the first call (the first sweep's) raised
    assert queued == [T0, T0 + 10, T0 + 20]
    assert store.get(b.job_id).state == State.QUEUED


def test_an_error_in_a_timer_or_the_sweep_hook_does_not_stop_the_scheduler():
    def boom(*_):
        raise RuntimeError("a bug in a hook")

    sch, ft, queued, store = make(lambda: None, lambda: None, sweep=60.0, on_sweep=boom, timers={"events": boom})
    (sub,) = store.submit([NewJob(func="m:f", run_at=T0 + 90)], T0)
    sch.run()
    assert ft.waits == [60, 30, 30]  # sweep, the job, sweep: every timer kept going
    assert store.get(sub.job_id).state == State.QUEUED


# --- the wall clock stepped back (NTP correcting a clock that ran an hour fast) -----------------
def begun_cron(every: float, start_at: float) -> CronRecord:
    """A cron that last fired at its tick before T0 + every, its next tick."""
    return CronRecord("c", {"every": every, "start_at": start_at}, NewJob(func="m:tick", run_at=start_at),
                      T0 + every, T0, start_at)


def test_a_backward_step_of_the_wall_clock_does_not_delay_the_next_sweep():
    sweeps = []
    sch, ft, queued, store = make(lambda: ft.step_wall(-3600), lambda: None, sweep=60.0,
                                  on_sweep=lambda: sweeps.append(ft.now))
    sch.run()
    assert sweeps == [T0, T0 - 3540, T0 - 3480]  # every 60 s, though the old next sweep was T0 + 60
    assert ft.waits == [60, 60, 60]


def test_after_a_backward_step_a_crons_next_tick_is_moved_back_to_its_next_tick_after_now():
    seen = []
    sch, ft, queued, store = make(lambda: ft.step_wall(-3600), lambda: seen.append(store.cron_list()[0].next_run_at),
                                  sweep=60.0)
    store.cron_save(begun_cron(100.0, T0 - 10_000))
    sch.run()
    assert seen == [T0 - 3500]  # was T0 + 100: the first tick after the sweep at T0 - 3540


def test_after_a_backward_step_a_moved_cron_fires_at_its_new_tick():
    sch, ft, queued, store = make(lambda: ft.step_wall(-3600), lambda: None, lambda: None, sweep=60.0)
    store.cron_save(begun_cron(100.0, T0 - 10_000))
    sch.run()
    assert [j.created_at for j in store.list_jobs(None, 100) if j.cron == "c"] == [T0 - 3500]
    assert ft.waits[:2] == [60, 40]  # its timer was re-armed at once, not at the next sweep


def test_after_a_backward_step_a_begun_interval_cron_keeps_its_interval_not_its_start_time():
    seen = []
    sch, ft, queued, store = make(lambda: ft.step_wall(-3600), lambda: seen.append(store.cron_list()[0].next_run_at),
                                  sweep=60.0)
    store.cron_save(begun_cron(100.0, T0 - 50))  # started by the fast clock, fired once
    sch.run()
    assert seen == [T0 - 3450]  # its start time, T0 - 50, is an hour ahead of the clock now


def test_after_a_backward_step_a_begun_interval_cron_goes_on_firing_every_interval():
    seen = []
    sch, ft, queued, store = make(lambda: ft.step_wall(-3600), lambda: None, lambda: None,
                                  lambda: seen.append(store.cron_list()[0].next_run_at), sweep=60.0)
    store.cron_save(begun_cron(100.0, T0 - 50))
    sch.run()
    assert [j.created_at for j in store.list_jobs(None, 100) if j.cron == "c"] == [T0 - 3450]
    assert seen == [T0 - 3350]  # the tick after the one it fired, not its start time again


def test_a_backward_step_is_logged_once_with_its_size_and_the_crons_moved(caplog):
    sch, ft, queued, store = make(lambda: ft.step_wall(-3600), lambda: None, sweep=60.0)
    store.cron_save(begun_cron(100.0, T0 - 10_000))
    with caplog.at_level(logging.WARNING, logger="queickd.scheduler"):
        sch.run()
    assert [r.getMessage() for r in caplog.records] == [
        "the wall clock stepped back 3600 s; 1 cron(s) moved back to their next tick"
        " (delayed jobs and retries keep their wall times)"]


def never_firing_cron(tick: float) -> CronRecord:
    """A cron for 30 February, as a store written before such expressions were refused holds."""
    return CronRecord("a-feb30", {"cron": "0 0 30 2 *"}, NewJob(func="m:never", run_at=tick), tick, None, T0)


def test_a_cron_whose_schedule_never_fires_again_does_not_hold_up_the_others():
    sch, ft, queued, store = make(lambda: None, lambda: None)
    store.cron_save(never_firing_cron(T0 + 30))
    store.cron_save(cron())
    sch.run()
    assert sorted(j.created_at for j in store.list_jobs(None, 100) if j.cron == "c") == [T0 + 60]


def test_a_cron_whose_schedule_never_fires_again_is_parked_at_the_end_of_time_and_logged(caplog):
    sch, ft, queued, store = make(lambda: None)
    store.cron_save(never_firing_cron(T0 + 30))
    with caplog.at_level(logging.ERROR, logger="queickd.scheduler"):
        sch.run()
    assert [(c.name, c.next_run_at) for c in store.cron_list()] == [("a-feb30", LATEST)]
    assert [j for j in store.list_jobs(None, 100) if j.cron == "a-feb30"] == []
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "cron a-feb30" in msg and "never fires" in msg and "queick cron delete a-feb30" in msg


def test_after_a_backward_step_a_cron_that_never_fires_does_not_keep_the_others_ahead():
    seen = []
    sch, ft, queued, store = make(lambda: ft.step_wall(-3600), lambda: seen.append(store.cron_list()[1].next_run_at),
                                  sweep=60.0)
    store.cron_save(never_firing_cron(T0 + 100))
    store.cron_save(begun_cron(100.0, T0 - 10_000))
    sch.run()
    assert seen == [T0 - 3500]
