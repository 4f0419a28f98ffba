"""The liveness watch on an injected clock (services/liveness.py): when a watched run is
marked, unmarked, killed and cleared, with a recording store and runner in place of the
real ones; and the pure rule it applies (core/policy/liveness.py)."""

from __future__ import annotations

import pytest

from queickd.core.job import Job
from queickd.core.policy import liveness
from queickd.services.liveness import LivenessWatch

WALL = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Store:
    def __init__(self) -> None:
        self.writes: list[list[tuple[int, int, float | None]]] = []

    def set_stalled(self, updates):
        self.writes.append(list(updates))
        return len(updates)


class Runner:
    def __init__(self) -> None:
        self.cpu: dict[int, float] = {}
        self.stalled: list[tuple[int, str]] = []

    def stall(self, job_id, message):
        self.stalled.append((job_id, message))
        return True

    def cpu_time(self, job_id):
        return self.cpu.get(job_id)


def _job(job_id=1, stalled_after=10.0, on_stall=None, stalled_at=None, attempts=1):
    return Job(job_id, "m:f", [], {}, "running", 0, 0.0, 0.0, attempts, 1, None, False, None, None, None, 0,
               None, None, None, None, None, stalled_after=stalled_after, on_stall=on_stall, stalled_at=stalled_at)


@pytest.fixture
def watch():
    clock, store, runner = Clock(), Store(), Runner()
    w = LivenessWatch(store, runner, clock=clock, wall=lambda: WALL, thread=False)
    w.clock, w.fake_store, w.fake_runner = clock, store, runner
    return w


def _said(w, job_id=1):
    w.sink(lambda *a: None)(job_id, 1, 1, None, None, WALL)


def test_a_quiet_run_is_not_marked_before_stalled_after(watch):
    watch.began(_job(), False)
    watch.clock.now += 9.99
    watch.tick()
    assert watch.fake_store.writes == []


def test_a_quiet_run_is_marked_at_stalled_after(watch):
    watch.began(_job(), False)
    watch.clock.now += 10
    watch.tick()
    assert watch.fake_store.writes == [[(1, 1, WALL)]]
    assert watch.stats()["stalls"] == {"mark": 1, "kill": 0}
    assert watch.fake_runner.stalled == []


def test_progress_puts_the_mark_off_by_stalled_after(watch):
    watch.began(_job(), False)
    watch.clock.now += 8
    _said(watch)
    watch.clock.now += 9
    watch.tick()
    assert watch.fake_store.writes == []
    watch.clock.now += 1
    watch.tick()
    assert watch.fake_store.writes == [[(1, 1, WALL)]]


def test_a_marked_run_is_marked_once_however_long_it_stays_quiet(watch):
    watch.began(_job(), False)
    for _ in range(5):
        watch.clock.now += 10
        watch.tick()
    assert watch.fake_store.writes == [[(1, 1, WALL)]]


def test_progress_after_the_mark_leaves_the_clear_to_the_progress_write(watch):
    watch.began(_job(), False)
    watch.clock.now += 10
    watch.tick()
    _said(watch)
    assert watch.stats()["stalled"] == 0
    watch.ended(_job())
    watch.tick()
    assert watch.fake_store.writes == [[(1, 1, WALL)]]  # no clear of its own: the progress write's


def test_the_end_of_a_marked_run_clears_its_mark(watch):
    watch.began(_job(attempts=3), False)
    watch.clock.now += 10
    watch.tick()
    watch.ended(_job(attempts=3))
    watch.tick()
    assert watch.fake_store.writes == [[(1, 3, WALL)], [(1, 3, None)]]


def test_a_mark_left_by_a_run_that_never_ended_is_cleared_as_the_next_run_begins(watch):
    watch.began(_job(stalled_at=WALL - 60), False)
    watch.tick()
    assert watch.fake_store.writes == [[(1, 1, None)]]


def test_on_stall_kill_stops_the_run_through_the_runner(watch):
    watch.began(_job(on_stall="kill"), True)
    watch.clock.now += 10
    watch.tick()
    ((job_id, message),) = watch.fake_runner.stalled
    assert job_id == 1 and "no progress and used no CPU time for 10 s" in message
    assert watch.stats()["stalls"] == {"mark": 0, "kill": 1}


def test_a_report_while_the_mark_is_written_takes_it_back_and_spares_the_kill(watch):
    watch.began(_job(on_stall="kill"), False)
    writes = watch.fake_store.writes

    def set_stalled(updates):
        writes.append(list(updates))
        if len(writes) == 1:
            _said(watch)  # the job reports just as its mark goes to the store
        return len(updates)

    watch.fake_store.set_stalled = set_stalled
    watch.clock.now += 10
    watch.tick()
    assert writes == [[(1, 1, WALL)], [(1, 1, None)]]
    assert watch.fake_runner.stalled == [] and watch.stats()["stalls"] == {"mark": 0, "kill": 0}


def test_cpu_time_keeps_a_process_run_alive(watch):
    watch.began(_job(on_stall="kill"), True)
    for used in (0.5, 1.0, 1.5):
        watch.fake_runner.cpu[1] = used
        watch.clock.now += 10
        watch.tick()
    assert watch.fake_store.writes == [] and watch.fake_runner.stalled == []


def test_cpu_time_does_not_keep_a_thread_run_alive(watch):
    watch.began(_job(), False)
    watch.fake_runner.cpu[1] = 5.0
    watch.clock.now += 10
    watch.tick()
    assert watch.fake_store.writes == [[(1, 1, WALL)]]


def test_a_process_run_that_uses_cpu_again_is_unmarked(watch):
    watch.began(_job(), True)
    watch.clock.now += 10
    watch.tick()
    watch.fake_runner.cpu[1] = 2.0
    watch.clock.now += 10
    watch.tick()
    assert watch.fake_store.writes == [[(1, 1, WALL)], [(1, 1, None)]]


def test_the_rule_stalled_at_stalled_after_and_cpu_growth_counts_from_one_tick():
    assert liveness.stalled(0.0, 1.0, 0.99) is False
    assert liveness.stalled(0.0, 1.0, 1.0) is True
    assert liveness.cpu_alive(None, 5.0) is False
    assert liveness.cpu_alive(1.0, 1.0) is False
    assert liveness.cpu_alive(1.0, 1.01) is True
