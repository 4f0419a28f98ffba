"""Network parking and retention, the policies the daemon used to hold, on a real store
with an injected clock (the checker's state is set as its reader thread would set it, or,
where a checker misbehaves, comes from a real one)."""

from __future__ import annotations

import os
import signal
import threading

from helpers import Listener
from store_contract import T0, job

from queickd.core.job import Outcome, State
from queickd.core.policy.admission import Admission
from queickd.core.policy.claim import Request
from queickd.services.maintenance.retention import Retention
from queickd.services.netcheck import NetworkMonitor
from queickd.services.network import NetworkParking
from queickd.store import open_store
from queickd.store.records import NewEvent
from queickd.store.sqlite.store import SQLiteStore


def _monitor(up: bool | None) -> NetworkMonitor:
    m = NetworkMonitor("127.0.0.1:9", 1.0, lambda up: None, clock=lambda: T0)  # never started
    m.up = up
    return m


def _parking(store: SQLiteStore, up: bool | None = None, checker: bool = True):
    woken = threading.Event()
    return NetworkParking(store, _monitor(up) if checker else None, woken.set, clock=lambda: T0), woken


def _net_job(store: SQLiteStore) -> int:
    return store.submit([job(retry_on_network=True)], T0)[0].job_id


def test_without_a_checker_network_jobs_may_start():
    parking, _ = _parking(open_store("memory://"), checker=False)
    assert (parking.checker(), parking.network_up()) == (False, True)


def test_with_a_checker_that_has_not_spoken_network_jobs_wait():
    parking, _ = _parking(open_store("memory://"), up=None)
    assert (parking.checker(), parking.network_up()) == (True, False)


def test_a_commit_while_the_network_is_down_parks_the_jobs_that_need_it():
    store = open_store("memory://")
    parking, _ = _parking(store, up=False)
    new = job(retry_on_network=True)
    job_id = store.submit([new], T0)[0].job_id
    parking.on_committed([new])
    assert store.get(job_id).state == State.WAITING_NETWORK


def test_a_commit_without_a_checker_parks_nothing():
    store = open_store("memory://")
    parking, _ = _parking(store, checker=False)
    new = job(retry_on_network=True)
    job_id = store.submit([new], T0)[0].job_id
    parking.on_committed([new])
    assert store.get(job_id).state == State.QUEUED


def test_the_network_going_down_parks_and_coming_back_releases_and_wakes_the_pool():
    store = open_store("memory://")
    parking, woken = _parking(store, up=True)
    job_id = _net_job(store)
    parking.on_change(False)
    assert store.get(job_id).state == State.WAITING_NETWORK and not woken.is_set()
    parking.on_change(True)
    assert store.get(job_id).state == State.QUEUED and woken.is_set()


def test_the_sweep_releases_a_job_parked_while_the_checker_says_up():
    store = open_store("memory://")
    parking, _ = _parking(store, up=True)
    job_id = _net_job(store)
    store.park_for_network(T0)  # parked by its own failure, say
    parking.on_sweep()
    assert store.get(job_id).state == State.QUEUED


def test_parked_jobs_are_released_when_the_network_returns_behind_a_hung_checker():
    # A real checker probes a real listener; SIGSTOP hangs it while the network is down.
    store, net, woken = open_store("memory://"), Listener(), threading.Event()
    changes: dict[bool, threading.Event] = {True: threading.Event(), False: threading.Event()}

    def on_change(up: bool) -> None:
        parking.on_change(up)
        changes[up].set()
    monitor = NetworkMonitor(f"127.0.0.1:{net.port}", 0.1, on_change, heartbeat=0.1, hung_after=1.0, backoff=(0.1,))
    parking = NetworkParking(store, monitor, woken.set, clock=lambda: T0)
    try:
        monitor.start()
        assert changes[True].wait(20)
        changes[True].clear()
        net.close()
        assert changes[False].wait(20)
        new = job(retry_on_network=True)
        job_id = store.submit([new], T0)[0].job_id
        parking.on_committed([new])
        assert store.get(job_id).state == State.WAITING_NETWORK
        os.kill(monitor.pid, signal.SIGSTOP)
        net.open()
        assert changes[True].wait(30), monitor.snapshot()
        assert store.get(job_id).state == State.QUEUED and woken.is_set()
    finally:
        monitor.stop()
        net.close()


def _finished(store: SQLiteStore, outcome, at: float) -> int:
    job_id = store.submit([job()], at)[0].job_id
    store.claim_available(Request.of(1, now=at))
    store.finish_if_running([outcome(job_id)], at)
    return job_id


def test_retention_prunes_finished_jobs_older_than_keep_finished():
    store = open_store("memory://")
    old = _finished(store, lambda i: Outcome.succeeded(i, None), T0)
    recent = _finished(store, lambda i: Outcome.succeeded(i, None), T0 + 50)
    assert Retention(store, 100.0, clock=lambda: T0 + 120).prune() == 1
    assert store.get(old) is None and store.get(recent) is not None


def test_retention_forgets_the_delivered_events_whose_jobs_it_pruned():
    store = open_store("memory://")
    acc = store.accept_event(NewEvent("tap-1", job()), T0, Admission())
    store.claim_available(Request.of(1, now=T0))
    store.finish_if_running([Outcome.succeeded(acc.job_id, None)], T0)
    assert Retention(store, 100.0, clock=lambda: T0 + 120).prune() == 1
    assert store.list_events(None, 10) == []


def test_retention_keeps_dead_jobs():
    store = open_store("memory://")
    dead = _finished(store, lambda i: Outcome.dead(i, {"type": "E", "message": "x"}), T0)
    assert Retention(store, 0.0, clock=lambda: T0 + 1000).prune() == 0
    assert store.get(dead).state == State.DEAD
