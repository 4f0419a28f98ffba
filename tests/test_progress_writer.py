"""The progress writer (services/progress.py) against a real SQLite store: a run's last
value reaches its finished job even when the writer's thread was writing it as the run
ended."""

from __future__ import annotations

import threading

from queickd.core.job import NewJob, Outcome
from queickd.core.policy.claim import Request
from queickd.services.progress import ProgressWriter, record
from queickd.store import open_store

T0 = 1_700_000_000.0


class HeldWrites:
    """The store, with the writer thread's writes held at a gate: `entered` is set when one
    has begun, and it goes on once `release` is set."""

    def __init__(self, store) -> None:
        self.store = store
        self.entered = threading.Event()
        self.release = threading.Event()

    def set_progress_if_running(self, updates):
        self.entered.set()
        assert self.release.wait(30)
        return self.store.set_progress_if_running(updates)


def test_a_value_being_written_as_the_run_ends_is_taken_with_its_outcome(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'q.db'}")
    try:
        store.submit([NewJob("m:f", run_at=T0)], T0)
        (job,) = store.claim_available(Request.of(1, now=T0))
        held = HeldWrites(store)
        writer = ProgressWriter(held)
        writer.offer(job.id, 1, 3, 3, "last", T0)  # the run's last value: its thread writes it
        assert held.entered.wait(30)
        assert writer.waiting([job.id])  # the one-call pass would write no progress
        taken = writer.take([job.id])  # the run ended: the pool's pass takes what it said
        assert taken == [(job.id, 1, record(1, 3, 3, "last", T0))]
        store.set_progress_if_running(taken)  # the pass's transaction: before the outcome
        store.finish_if_running([Outcome.succeeded(job.id, None)], T0 + 1)
        held.release.set()  # the thread's write lands after the outcome: it changes nothing
        writer.stop()
        assert store.get(job.id).progress == record(1, 3, 3, "last", T0)
    finally:
        store.close()
