"""No job is lost: concurrency, kill -9, graceful stop, orphans, cron catch-up."""

import functools
import threading
import time
from collections import Counter

import pytest
from helpers import DaemonProcess, read_lines, run_together

from queickd.core.job import NewJob, State
from queickd.store import CronRecord
from queickd.store.sqlite.store import SQLiteStore


def test_pipelined_enqueues_from_many_connections_each_run_once(daemon, tmp_path):
    out = tmp_path / "ran.txt"
    per_conn, conns = 1500, 4
    acked: list[list[int]] = [[] for _ in range(conns)]

    def send(n: int) -> None:
        with daemon.client() as q:
            jobs = [q.job("testjobs:append", (str(out), f"{n}-{i}")) for i in range(per_conn)]
            acked[n] = q.enqueue_pipelined(jobs)

    run_together(*(functools.partial(send, n) for n in range(conns)))
    ids = [i for a in acked for i in a]
    assert len(set(ids)) == per_conn * conns
    with daemon.client() as q:
        q.wait(max(ids), 60)
        for job_id in ids:
            assert q.wait(job_id, 60)["state"] == State.SUCCEEDED
        stats = q.stats()
    ran = Counter(read_lines(out))
    assert len(ran) == per_conn * conns and set(ran.values()) == {1}
    assert stats["commits"] < stats["enqueued"]  # group commit shared transactions


def test_every_acknowledged_job_survives_kill_9(tmp_path):
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    out = tmp_path / "ran.txt"
    d = DaemonProcess(url).start()
    acked: list[tuple[int, str]] = []
    lock = threading.Lock()
    enough = threading.Event()

    def producer(n: int) -> None:
        try:
            with d.client() as q:
                for i in range(100_000):
                    token = f"{n}-{i}"
                    job_id = q.enqueue("testjobs:append", args=(str(out), token))
                    with lock:
                        acked.append((job_id, token))
                        if len(acked) >= 1500:
                            enough.set()
        except (ConnectionError, OSError):
            pass  # the daemon died under us: everything acked before that must survive

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    assert enough.wait(60)
    d.kill()  # SIGKILL while enqueues and jobs are in flight
    for t in threads:
        t.join(30)
    with lock:
        survivors = list(acked)

    d2 = DaemonProcess(url).start()
    try:
        with d2.client() as q:
            states = Counter(q.wait(job_id, 120)["state"] for job_id, _ in survivors)
        assert states == {State.SUCCEEDED: len(survivors)}
        ran = Counter(read_lines(out))
        missing = [t for _, t in survivors if t not in ran]
        assert missing == [], f"{len(missing)} acknowledged jobs never ran"
        # Only jobs that were running at the kill may have run twice (at-least-once).
        assert sum(1 for c in ran.values() if c > 1) <= d.workers
    finally:
        d2.close()


def test_sigterm_lets_the_running_job_finish_and_keeps_queued_jobs(start_daemon, gate, tmp_path):
    d = start_daemon(None, workers=1)
    with d.client() as q:
        running = q.enqueue("testjobs:gate", args=(gate.port, "slow"))
        assert gate.arrival() == "slow"
        waiting = [q.enqueue("testjobs:noop") for _ in range(3)]
    d.proc.send_signal(15)
    d.wait_for_line("stopping")
    gate.release_all("done")
    assert d.proc.wait(30) == 0
    store = SQLiteStore(str(tmp_path / "queue.db"))
    job = store.get(running)
    assert (job.state, job.result) == (State.SUCCEEDED, "done")
    assert [store.get(i).state for i in waiting] == [State.QUEUED] * 3
    store.close()


def test_sigterm_gives_up_on_a_stuck_job_after_stop_timeout(start_daemon, gate, tmp_path):
    d = start_daemon(None, "--stop-timeout", "0.5", workers=1)
    with d.client() as q:
        stuck = q.enqueue("testjobs:gate", args=(gate.port, "stuck"))
        assert gate.arrival() == "stuck"
    assert d.terminate() == 0
    store = SQLiteStore(str(tmp_path / "queue.db"))
    assert store.get(stuck).state == State.RUNNING  # recovered as an orphan on next start
    store.close()


def test_a_job_left_running_by_a_crash_is_requeued_on_start(tmp_path, gate):
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    d = DaemonProcess(url, workers=1).start()
    with d.client() as q:
        job_id = q.enqueue("testjobs:gate", args=(gate.port, "first"))
    assert gate.arrival() == "first"
    d.kill()
    gate.release_all()
    d2 = DaemonProcess(url, workers=1).start()
    try:
        d2.wait_for_line("1 re-queued")
        assert gate.arrival() == "first"  # it runs again
        gate.release_all("second run")
        with d2.client() as q:
            job = q.wait(job_id, 30)
        assert (job["state"], job["result"], job["attempts"], job["orphaned"]) == (
            State.SUCCEEDED, "second run", 2, 1)
    finally:
        d2.close()


def test_a_job_orphaned_too_often_is_dead(tmp_path, gate):
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    for _ in range(2):  # --max-orphan-requeues 1: the second crash gives up
        d = DaemonProcess(url, "--max-orphan-requeues", "1", workers=1).start()
        with d.client() as q:
            if not q.jobs():
                job_id = q.enqueue("testjobs:gate", args=(gate.port, "x"))
        gate.arrival()
        d.kill()
        gate.release_all()
    d = DaemonProcess(url, "--max-orphan-requeues", "1", workers=1).start()
    try:
        with d.client() as q:
            job = q.get(job_id)
        assert job["state"] == State.DEAD and job["error"]["type"] == "orphaned"
    finally:
        d.close()


def _store_with_overdue_cron(path, minutes_overdue: int) -> float:
    store = SQLiteStore(str(path))
    now = time.time()
    tick = now - minutes_overdue * 60
    store.cron_save(CronRecord("every-minute", {"every": 60.0, "start_at": tick},
                               NewJob("testjobs:noop"), tick, None, tick))
    store.close()
    return tick


def test_ticks_missed_while_down_run_once_on_start(tmp_path):
    path = tmp_path / "queue.db"
    missed = _store_with_overdue_cron(path, minutes_overdue=10)
    d = DaemonProcess(f"sqlite:///{path}").start()
    try:
        d.wait_for_line("cron every-minute fired job")
        with d.client() as q:
            fired = [j for j in q.jobs() if j["cron"] == "every-minute"]
            (cron,) = q.crons()
        assert len(fired) == 1
        assert fired[0]["idempotency_key"] == f"cron:every-minute:{missed!r}"
        assert cron["last_fired_at"] == missed and cron["next_run_at"] > time.time()
    finally:
        d.close()


def test_a_fired_tick_is_not_fired_again_after_restart(tmp_path):
    path = tmp_path / "queue.db"
    _store_with_overdue_cron(path, minutes_overdue=3)
    for first_run in (True, False):
        d = DaemonProcess(f"sqlite:///{path}").start()
        d.wait_for_line("cron every-minute fired job" if first_run else "swept")
        assert d.terminate() == 0
    store = SQLiteStore(str(path))
    assert sum(1 for j in store.list_jobs(None, 100) if j.cron == "every-minute") == 1
    store.close()


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_both_durability_levels_serve_jobs(start_daemon, durability):
    d = start_daemon(None, "--durability", durability)
    with d.client() as q:
        assert q.wait(q.enqueue("testjobs:noop"), 20)["state"] == State.SUCCEEDED
